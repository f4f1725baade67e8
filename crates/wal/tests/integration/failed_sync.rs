//! A failed fdatasync (EIO) poisons the log, and the process stops. Linux marks the pages of a
//! failed writeback clean: the next process on the same machine reads the new bytes from the
//! page cache, the disk keeps the old ones, and no later fdatasync writes them (`FaultFs`
//! models exactly that). So the poisoned log leaves a marker, and the next open rewrites and
//! syncs every segment from what it read before it trusts them.
//!
//! Method: a `FaultFs` disk; the failure, a restart of the process (the page cache kept),
//! then a machine crash (only durable bytes kept), and the log read back each time. Without
//! the rewrite, the first scenario finds a hole before records synced later (simulator seed
//! 319: "valid entries follow the bad one") and the second a cut branch back in the log
//! (seed 62767).

use crate::common;

use common::{DIR, open, payload, read_all};
use wal::Durability;
use wal::Term;
use wal::fs::FaultFs;

/// What the process that fail-stopped leaves, read back by a restart on the same machine.
fn restart(fs: &FaultFs) -> (wal::Wal, wal::RecoveryReport) {
    let dyn_fs: std::sync::Arc<dyn wal::fs::FileSystem> = std::sync::Arc::new(fs.clone());
    wal::Wal::open(dyn_fs, std::path::Path::new(DIR), common::small_config()).unwrap()
}

/// The machine crashes: the disk keeps only its durable bytes.
fn crash_and_restart(fs: &FaultFs) -> (wal::Wal, wal::RecoveryReport) {
    fs.crash_now();
    fs.reboot(None);
    restart(fs)
}

#[test]
fn entries_read_back_after_a_failed_sync_survive_a_later_machine_crash() {
    let fs = FaultFs::new();
    let wal = open(&fs).unwrap();
    for i in 1..=4 {
        wal.append_next(Term(1), &payload(i, 0), Durability::Fsync)
            .unwrap();
    }
    fs.fail_next_sync();
    assert!(
        wal.append_next(Term(1), &payload(5, 0), Durability::Fsync)
            .is_err(),
        "the fdatasync failure reaches the appender"
    );
    drop(wal);

    // The next process reads entry 5 from the page cache, and goes on.
    let (wal, report) = restart(&fs);
    assert!(report.rewritten_after_failed_sync);
    assert_eq!(read_all(&wal).len(), 5);
    for i in 6..=8 {
        wal.append_next(Term(1), &payload(i, 0), Durability::Fsync)
            .unwrap();
    }
    drop(wal);

    let (wal, report) = crash_and_restart(&fs);
    assert!(!report.rewritten_after_failed_sync, "the marker is gone");
    let entries = read_all(&wal);
    assert_eq!(
        entries.len(),
        8,
        "every entry read back and synced since survives"
    );
    for (k, (index, _, data)) in entries.iter().enumerate() {
        assert_eq!(*index, k as u64 + 1);
        assert_eq!(data, &payload(*index, 0));
    }
}

#[test]
fn a_cut_read_back_after_its_failed_sync_stays_cut_after_a_machine_crash() {
    let fs = FaultFs::new();
    let wal = open(&fs).unwrap();
    for i in 1..=10 {
        wal.append_next(Term(1), &payload(i, 0), Durability::Fsync)
            .unwrap();
    }
    fs.fail_next_sync();
    assert!(wal.truncate_suffix(wal::Index(6)).is_err());
    drop(wal);

    // The next process reads the cut log from the page cache: the cut zeroes the tail from
    // its end backwards, one window and one fdatasync at a time, so it read a prefix of the
    // old log, without the window the failed fdatasync had zeroed.
    let (wal, report) = restart(&fs);
    assert!(report.rewritten_after_failed_sync);
    let seen = read_all(&wal).len();
    assert!((5..10).contains(&seen), "read back {seen} entries");
    drop(wal);

    let (wal, _) = crash_and_restart(&fs);
    assert_eq!(
        read_all(&wal).len(),
        seen,
        "entries cut before the crash came back: a branch the node had left is in its log"
    );
}

#[test]
fn an_open_without_a_failed_sync_rewrites_nothing() {
    let fs = FaultFs::new();
    let wal = open(&fs).unwrap();
    wal.append_next(Term(1), &payload(1, 0), Durability::Fsync)
        .unwrap();
    drop(wal);
    let (_, report) = restart(&fs);
    assert!(!report.rewritten_after_failed_sync);
}
