//! The wal crate's host integration tests, one module per scenario file, in one test binary:
//! one link and one build of what they share instead of one per file. Lab tests (`lab_*.rs`)
//! and host-driven boots (`host_*.rs`) stay binaries of their own, as `ops/test` runs them
//! by name.

mod allocations;
mod common;
mod concurrent_truncation;
mod crash_consistency;
mod decode_fuzz;
mod enospc;
mod failed_sync;
mod failed_write;
mod foreign_segments;
mod fsync_poison;
mod group_commit;
mod grown_batch_window;
mod inspect;
mod mid_log_corruption;
mod model;
mod repair_crash;
mod replicate_through_ring;
mod restart_at;
mod rotation_crash;
mod segment_gap;
mod suffix_cut_crash;
mod torn_tail;
mod truncate_prefix_keeps_the_checkpoint_entry;
mod unsynced_window;
mod verified_copy;
