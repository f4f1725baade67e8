//! The fabric crate's host integration tests, one module per scenario file, in one test binary:
//! one link and one build of what they share instead of one per file. Lab tests (`lab_*.rs`)
//! and host-driven boots (`host_*.rs`) stay binaries of their own, as `ops/test` runs them
//! by name.

mod common;
mod credits_and_determinism;
mod dead_peer;
mod fencing;
mod tcp_fabric;
mod unannounced_connection;
mod write_then_send_ordering;
