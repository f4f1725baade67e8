//! Helpers shared by the cluster test binaries.

pub mod cluster_scenarios;
