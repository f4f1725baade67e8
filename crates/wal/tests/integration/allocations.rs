//! The crate doc's "the append path allocates nothing per append", counted: on a real disk
//! (a temporary directory through `StdFs`), the allocations the appending thread makes over
//! 50 and over 250 appends of 64 B and of 4 KiB, after 50 to warm up, are the same, under
//! `Fsync` (each append writes and fdatasyncs its batch on this thread: group commit with one
//! appender) and under `Memory`. No segment rotates meanwhile (rotation opens a file: per
//! segment, not per append). `allocation_counter` counts this thread only.

use std::sync::Arc;

use allocation_counter::measure;
use wal::fs::StdFs;
use wal::{Durability, Term, Wal, WalConfig};

#[test]
fn appending_allocates_nothing_per_append() {
    for durability in [Durability::Fsync, Durability::Memory] {
        for size in [64usize, 4096] {
            let dir = tempfile::tempdir().unwrap();
            let (wal, _) = Wal::open(Arc::new(StdFs), dir.path(), WalConfig::default()).unwrap();
            let payload = vec![0x5Au8; size];
            let appends = |n: usize| {
                measure(|| {
                    for _ in 0..n {
                        wal.append_next(Term(1), &payload, durability).unwrap();
                    }
                })
                .count_total
            };
            appends(50);
            let few = appends(50);
            let many = appends(250);
            assert_eq!(
                many.saturating_sub(few),
                0,
                "{durability:?}, {size} B: {few} allocations in 50 appends, {many} in 250"
            );
            assert_eq!(
                wal.segment_count(),
                1,
                "a segment rotated: the count shows nothing"
            );
            wal.close().unwrap();
        }
    }
}
