//! ENOSPC: when a new segment cannot be preallocated, the append fails with
//! `WalError::NoSpace`, nothing of the failed batch is committed (not in memory, not after a
//! crash), and appends resume once space is freed.

use crate::common;

use common::{open, payload, read_all};
use wal::fs::FaultFs;
use wal::{Durability, Term, WalError};

#[test]
fn full_disk_fails_cleanly_and_appends_resume_when_space_frees() {
    let fs = FaultFs::new();
    let wal = open(&fs).unwrap();
    // Leave no room for a second segment.
    fs.set_space_limit(Some(fs.used_bytes() + 1000));
    let mut acked = 0;
    let err = loop {
        match wal.append_next(Term(1), &payload(acked + 1, 0), Durability::Fsync) {
            Ok(entry) => acked = entry.index.0,
            Err(err) => break err,
        }
    };
    assert!(matches!(err, WalError::NoSpace { .. }), "{err}");
    assert!(err.to_string().contains("disk is full"), "{err}");
    assert_eq!(
        wal.last_index().0,
        acked,
        "the failed entry is not in the log"
    );
    assert_eq!(read_all(&wal).len() as u64, acked);

    // Still full: fails again, still cleanly.
    assert!(matches!(
        wal.append_next(Term(1), &payload(acked + 1, 0), Durability::Fsync),
        Err(WalError::NoSpace { .. })
    ));
    assert_eq!(wal.last_index().0, acked);

    // Space frees: appends resume at the same index.
    fs.set_space_limit(None);
    let entry = wal
        .append_next(Term(1), &payload(acked + 1, 0), Durability::Fsync)
        .unwrap();
    assert_eq!(entry.index.0, acked + 1);
    assert_eq!(wal.segment_count(), 2);

    // After a crash nothing half-committed appears either.
    fs.crash_now();
    drop(wal);
    fs.reboot(None);
    let wal = open(&fs).unwrap();
    let entries = read_all(&wal);
    assert_eq!(entries.len() as u64, acked + 1);
    for (index, _, bytes) in entries {
        assert_eq!(bytes, payload(index, 0));
    }
}
