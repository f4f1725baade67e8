//! A prefix truncation up to a checkpoint keeps the segment holding the checkpoint's entry:
//! the entries after it may be uncommitted (a deposed leader's) and cut later, and the log
//! must then go on right after the checkpoint's entry, at the Lsn every other replica gave the
//! next entry. With that segment deleted the log could only go on at the next segment's start
//! (simulator seed 1765: Lsn agreement broken between two replicas).

use crate::common;

use common::{open, payload, read_all};
use wal::{Durability, Index, Term};

#[test]
fn cutting_every_entry_after_a_checkpoint_goes_on_right_after_it() {
    let fs = wal::fs::FaultFs::new();
    let wal = open(&fs).unwrap();
    // 150 B payloads: one 184 B record per 256 B block, 8 per 2 KiB segment; a small 9th
    // entry ends before its block does, so padding lies between it and the next segment.
    for i in 1..=8 {
        wal.append_next(Term(1), &[i as u8; 150], Durability::Fsync)
            .unwrap();
    }
    let ninth = wal
        .append_next(Term(1), &payload(9, 0)[..10], Durability::Fsync)
        .unwrap();
    let after_ninth = wal.position();
    assert!(after_ninth.lsn.0 < 2048);
    // Entries 10 and on (term 1) open the second segment; they are never committed.
    for i in 10..=12 {
        wal.append_next(Term(1), &[i as u8; 150], Durability::Fsync)
            .unwrap();
    }
    assert!(wal.position_after(Index(10)).unwrap().lsn.0 > 2048);
    // A checkpoint at 9 deletes entries up to 9, whole segments only.
    let first = wal.truncate_prefix(Index(10)).unwrap();
    assert!(
        first.0 <= 9,
        "the segment holding entry 9 (the checkpoint's) stays: the log starts at {first:?}"
    );
    // The new leader's entry 10 (term 2) replaces the old 10..12.
    wal.truncate_suffix(Index(10)).unwrap();
    assert_eq!(
        wal.position(),
        after_ninth,
        "the log goes on right after entry 9"
    );
    let ten = wal
        .append_next(Term(2), b"the new leader's", Durability::Fsync)
        .unwrap();
    // Another replica that got entries 1..=9 and then the new leader's 10.
    let other_fs = wal::fs::FaultFs::new();
    let other = open(&other_fs).unwrap();
    for i in 1..=8 {
        other
            .append_next(Term(1), &[i as u8; 150], Durability::Fsync)
            .unwrap();
    }
    other
        .append_next(Term(1), &payload(9, 0)[..10], Durability::Fsync)
        .unwrap();
    let theirs = other
        .append_next(Term(2), b"the new leader's", Durability::Fsync)
        .unwrap();
    assert_eq!(ten.lsn, theirs.lsn, "entry 10 after {ninth:?}");
    wal.close().unwrap();
    drop(wal);
    let wal = open(&fs).unwrap();
    assert_eq!(read_all(&wal).last().unwrap().2, b"the new leader's");
}
