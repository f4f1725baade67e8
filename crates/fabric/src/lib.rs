//! The transport trait with verbs semantics, with an in-process back-end and an RDMA back-end.
//!
//! Not built yet: see ARCHITECTURE.md for the plan and the open issues for the work.

#![deny(unsafe_code)]
