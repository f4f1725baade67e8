//! The Soft-RoCE lab.
#![deny(unsafe_code)]
