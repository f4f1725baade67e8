//! A write that fails after part of it reached the file (EIO after a short write): nothing of
//! the failed batch is acknowledged, and the part written is zeroed and synced, so none of its
//! records comes back, neither to a process that restarts on the same machine (the page cache
//! kept) nor after a machine crash; appends work again at the same index (docs/FORMAT.md,
//! section 4, "Write failure", and section 5, case 8).
//!
//! Method: a `FaultFs` disk whose next write stops with EIO after its first three records of
//! a batch of six. Without the zeroing (`undo` in the wal's group commit) the restarted log
//! reads those three records back as entries of the log: the test fails (tried).

use std::path::Path;
use std::sync::Arc;

use crate::common;

use common::{DIR, open, read_all, small_config};
use wal::format::record_bytes;
use wal::fs::{FaultFs, FileSystem};
use wal::{Durability, Term, WalError};

/// 32 bytes of payload: a 64-byte record, four to a 256-byte block, no padding.
fn entry(index: u64, generation: u8) -> Vec<u8> {
    (0..32u8)
        .map(|i| {
            i.wrapping_add(index as u8 * 7)
                .wrapping_add(generation * 100)
        })
        .collect()
}

fn reopen(fs: &FaultFs) -> wal::Wal {
    let dyn_fs: Arc<dyn FileSystem> = Arc::new(fs.clone());
    wal::Wal::open(dyn_fs, Path::new(DIR), small_config())
        .unwrap()
        .0
}

fn expect(wal: &wal::Wal, entries: &[(u64, u8)], when: &str) {
    let got: Vec<(u64, Vec<u8>)> = read_all(wal).into_iter().map(|(i, _, b)| (i, b)).collect();
    let want: Vec<(u64, Vec<u8>)> = entries.iter().map(|&(i, g)| (i, entry(i, g))).collect();
    assert_eq!(
        got, want,
        "{when}: the log holds other entries than acknowledged"
    );
}

#[test]
fn a_batch_whose_write_failed_midway_never_comes_back() {
    assert_eq!(record_bytes(32), 64);
    let fs = FaultFs::new();
    let wal = open(&fs).unwrap();
    for i in 1..=2 {
        wal.append_next(Term(1), &entry(i, 0), Durability::Fsync)
            .unwrap();
    }
    // Six entries buffered, written as one batch by the sync; the write stops after three of
    // them reached the file.
    for i in 3..=8 {
        wal.append_next(Term(1), &entry(i, 0), Durability::Memory)
            .unwrap();
    }
    fs.fail_next_write(3 * record_bytes(32));
    let err = wal.sync().expect_err("the batch's write failed");
    assert!(matches!(err, WalError::SegmentWrite { .. }), "{err}");
    assert_eq!(wal.last_index().0, 2, "the failed batch is not in the log");
    expect(&wal, &[(1, 0), (2, 0)], "after the failure");

    // Appends work again, at the same index, with other bytes.
    wal.append_next(Term(1), &entry(3, 1), Durability::Fsync)
        .unwrap();
    expect(&wal, &[(1, 0), (2, 0), (3, 1)], "after the next append");
    drop(wal);

    // A process restarting on the same machine reads the page cache: entries 4 and 5 of the
    // failed batch were written there and must not be back.
    let wal = reopen(&fs);
    expect(&wal, &[(1, 0), (2, 0), (3, 1)], "after a restart");
    drop(wal);

    // Nor after a machine crash (the disk keeps what was synced).
    fs.crash_now();
    fs.reboot(None);
    let wal = reopen(&fs);
    expect(&wal, &[(1, 0), (2, 0), (3, 1)], "after a machine crash");
}

#[test]
fn a_batch_whose_write_failed_midway_is_not_back_after_a_restart_without_another_append() {
    let fs = FaultFs::new();
    let wal = open(&fs).unwrap();
    wal.append_next(Term(1), &entry(1, 0), Durability::Fsync)
        .unwrap();
    for i in 2..=7 {
        wal.append_next(Term(1), &entry(i, 0), Durability::Memory)
            .unwrap();
    }
    fs.fail_next_write(3 * record_bytes(32));
    wal.sync().expect_err("the batch's write failed");
    drop(wal);
    let wal = reopen(&fs);
    expect(&wal, &[(1, 0)], "after a restart");
    drop(wal);
    fs.crash_now();
    fs.reboot(None);
    let wal = reopen(&fs);
    expect(&wal, &[(1, 0)], "after a machine crash");
}
