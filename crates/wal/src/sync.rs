//! Atomics used by the ring, swapped for loom's under `cfg(loom)` so the loom test can model
//! check the producer/consumer protocol.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU64, Ordering, fence};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU64, Ordering, fence};
