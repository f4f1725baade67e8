//! Benchmark harness: criterion suites and the lab latency/throughput harness.
//!
//! Not built yet: see ARCHITECTURE.md for the plan and the open issues for the work.

#![deny(unsafe_code)]
