//! Atomics used by the ring, swapped for loom's under `cfg(loom)` so the loom test can model
//! check the producer/consumer protocol.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU64, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicU64, Ordering};
