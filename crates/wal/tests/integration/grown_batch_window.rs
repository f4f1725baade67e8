//! Scenario: a log reopened with a larger `max_batch_bytes` than its last segment records as
//! its unsynced window. Batches of the new size wrote more unsynced bytes than recovery
//! allows for: a power cut that tore one made valid entries follow a bad one inside what
//! recovery takes for the last window, which reads as mid-log corruption, and the log refused
//! to open (16 of 16 tear seeds; found by a review helper). A reopened log now writes with
//! the smaller of the configured size and its last segment's window.

use std::path::Path;
use std::sync::Arc;

use crate::common::{DIR, payload};
use wal::fs::{FaultFs, FileSystem};
use wal::{Durability, Term, Wal, WalConfig, WalError};

fn config(batch: u64) -> WalConfig {
    WalConfig {
        cluster_id: 7,
        block_bytes: 256,
        segment_data_bytes: 8192,
        max_batch_bytes: batch,
        ..WalConfig::default()
    }
}

/// Four entries with a `first_batch`-byte batch, a reopen with 4096, 3.5 KiB of appends (one
/// batch, if the reopen writes with 4096) and a power cut (`seed` picks the torn sectors),
/// and the open after it.
fn grow_then_tear(first_batch: u64, seed: u64) -> Result<(), WalError> {
    let fs = FaultFs::new();
    let dynfs: Arc<dyn FileSystem> = Arc::new(fs.clone());
    let (wal, _) = Wal::open(dynfs.clone(), Path::new(DIR), config(first_batch)).unwrap();
    for i in 1..=4 {
        wal.append_next(Term(1), &payload(i, 0), Durability::Fsync)
            .unwrap();
    }
    wal.close().unwrap();
    drop(wal);
    let (wal, _) = Wal::open(dynfs.clone(), Path::new(DIR), config(4096)).unwrap();
    for _ in 0..14 {
        wal.append_next(Term(1), &[0x5A; 150], Durability::Memory)
            .unwrap();
    }
    // A power cut a few operations on: at the grown batch's fdatasync (with its one write and
    // the zeroing ahead in the page cache only); once batches keep to the smaller window,
    // somewhere among their writes and syncs.
    fs.crash_at_op(fs.ops() + 3);
    let _ = wal.sync();
    wal.abandon();
    drop(wal);
    fs.reboot(Some(seed));
    Wal::open(dynfs, Path::new(DIR), config(4096)).map(|_| ())
}

#[test]
fn a_batch_torn_after_the_batch_size_grew_is_a_torn_tail() {
    let mut refused = Vec::new();
    for seed in 1..=16u64 {
        let s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x5EED;
        if let Err(e) = grow_then_tear(512, s) {
            refused.push((seed, e.to_string()));
        }
        // The same size throughout: the control.
        assert!(
            grow_then_tear(4096, s).is_ok(),
            "seed {seed} without growth"
        );
    }
    assert!(
        refused.is_empty(),
        "{} of 16 crashes left a log that does not open: {refused:#?}",
        refused.len()
    );
}
