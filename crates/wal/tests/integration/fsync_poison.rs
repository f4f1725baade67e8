//! A failed fdatasync poisons the log: the failing append returns `WalError::Sync`, and every
//! later append, sync and truncation fails with `WalError::Poisoned`. Reopening recovers the
//! durable prefix.

use crate::common;

use common::{open, payload, read_all};
use wal::fs::FaultFs;
use wal::{Durability, Index, Term, WalError};

#[test]
fn eio_on_fsync_poisons_every_later_append() {
    let fs = FaultFs::new();
    let wal = open(&fs).unwrap();
    for i in 1..=3 {
        wal.append_next(Term(1), &payload(i, 0), Durability::Fsync)
            .unwrap();
    }
    fs.fail_next_sync();
    let err = wal
        .append_next(Term(1), b"lost", Durability::Fsync)
        .unwrap_err();
    assert!(matches!(err, WalError::Sync { .. }), "{err}");
    assert!(err.to_string().contains("poisoned"), "{err}");
    for _ in 0..2 {
        let err = wal
            .append_next(Term(1), b"refused", Durability::Memory)
            .unwrap_err();
        assert!(matches!(err, WalError::Poisoned { .. }), "{err}");
    }
    assert!(matches!(wal.sync(), Err(WalError::Poisoned { .. })));
    assert!(matches!(
        wal.truncate_suffix(Index(2)),
        Err(WalError::Poisoned { .. })
    ));
    assert!(matches!(wal.close(), Err(WalError::Poisoned { .. })));
    drop(wal);

    fs.reboot(None);
    let wal = open(&fs).unwrap();
    let entries = read_all(&wal);
    assert_eq!(entries.len(), 3, "only the durable prefix survives");
    wal.append_next(Term(1), b"fresh", Durability::Fsync)
        .unwrap();
}
