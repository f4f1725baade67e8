//! The client side of `rdmalog-node`'s driver port: a harness that starts one node process per
//! lab host, drives a pipelined append workload through the leader, injects faults, and checks
//! the result. The lab cluster tests (`tests/lab_cluster.rs`) and the README's demo
//! (`rdmalog-demo`) are built on it.

#![deny(unsafe_code)]

pub mod harness;
pub mod netns;
