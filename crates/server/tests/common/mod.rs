//! Helpers shared by the server test binaries.

pub mod servers;
