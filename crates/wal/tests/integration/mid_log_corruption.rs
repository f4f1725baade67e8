//! Mid-log corruption: a bad entry followed by valid ones further than one unsynced window
//! (one batch) away cannot be a torn write. Recovery refuses with `WalError::Corrupt`, names
//! the segment, Lsn and last good index, and truncates nothing.

use crate::common;

use common::{DIR, open, payload};
use std::path::Path;
use wal::fs::FaultFs;
use wal::{Durability, Term, WalError};

#[test]
fn bad_entry_followed_by_valid_ones_is_a_typed_error_and_nothing_is_cut() {
    let fs = FaultFs::new();
    let wal = open(&fs).unwrap();
    let mut entries = Vec::new();
    for i in 1..=40 {
        entries.push(
            wal.append_next(Term(1), &payload(i, 0), Durability::Fsync)
                .unwrap(),
        );
    }
    wal.close().unwrap();
    drop(wal);
    let victim = entries[2];
    let segment = Path::new(DIR).join("00000000000000000000.wal");
    let before = fs.read_file(&segment).unwrap();
    fs.corrupt(
        &segment,
        4096 + victim.lsn.0 + 33,
        &[before[(4096 + victim.lsn.0 + 33) as usize] ^ 0xFF],
    );
    let after_corruption = fs.read_file(&segment).unwrap();

    let err = open(&fs).unwrap_err();
    match &err {
        WalError::Corrupt { lsn, index, .. } => {
            assert_eq!(*lsn, victim.lsn);
            assert_eq!(index.0, 2);
        }
        other => panic!("expected Corrupt, got {other}"),
    }
    assert!(err.to_string().contains("mid-log corruption"), "{err}");
    assert!(
        std::error::Error::source(&err).is_some(),
        "the decode error is the source"
    );
    assert_eq!(
        fs.read_file(&segment).unwrap(),
        after_corruption,
        "nothing was truncated"
    );
    assert!(
        !fs.names(Path::new(DIR))
            .iter()
            .any(|n| n.ends_with(".broken"))
    );
}
