//! A power cut in the middle of a suffix truncation (docs/FORMAT.md, section 5, case 5):
//! recovery finds a prefix of the old log that holds the kept entries; repeating the
//! truncation (as raft does) and appending then gives a log with no entry of the cut suffix.
//!
//! Method: a log of 40 entries over several 2 KiB segments, cut from index 10, with the power
//! cut at each mutating operation of the cut in turn (deleting segments, zeroing and syncing
//! windows), keeping only durable bytes and in a second pass, with eight tear seeds per point,
//! keeping some unsynced sectors too (the pass asserts some were kept).

use crate::common;

use common::{cut_points, open, payload, read_all};
use wal::fs::FaultFs;
use wal::{Durability, Index, Term};

const ENTRIES: u64 = 40;
const CUT: u64 = 10;

fn written() -> (FaultFs, Vec<(u64, u64, Vec<u8>)>) {
    let fs = FaultFs::new();
    let wal = open(&fs).unwrap();
    for i in 1..=ENTRIES {
        wal.append_next(Term(1), &payload(i, 0), Durability::Fsync)
            .unwrap();
    }
    let entries = read_all(&wal);
    assert!(wal.segment_count() >= 3, "the cut spans segments");
    wal.close().unwrap();
    (fs, entries)
}

fn each_crash_point(tear: bool) {
    let cut_ops = {
        let (fs, _) = written();
        let wal = open(&fs).unwrap();
        let before = fs.ops();
        wal.truncate_suffix(Index(CUT)).unwrap();
        fs.ops() - before
    };
    assert!(cut_ops >= 3, "the cut writes ({cut_ops} operations)");
    eprintln!("{cut_ops} operations in the cut");
    let mut torn = 0;
    for (k, seed) in cut_points(cut_ops, tear) {
        let (fs, old) = written();
        let wal = open(&fs).unwrap();
        fs.crash_at_op(fs.ops() + k);
        assert!(
            wal.truncate_suffix(Index(CUT)).is_err(),
            "op {k}: the cut did not fail at the power cut"
        );
        drop(wal);
        fs.reboot(seed);
        torn += fs.unsynced_sectors_kept();
        let wal =
            open(&fs).unwrap_or_else(|e| panic!("power cut at op {k} of the cut: reopen: {e}"));
        let got = read_all(&wal);
        assert!(
            got.len() as u64 >= CUT - 1 && old.starts_with(&got),
            "power cut at op {k} of the cut: {} entries, not a prefix of the old log holding \
             the kept ones",
            got.len()
        );
        // Raft repeats the cut, then appends at the cut index.
        if wal.last_index().0 >= CUT {
            wal.truncate_suffix(Index(CUT)).unwrap();
        }
        wal.append_next(Term(2), b"the new branch", Durability::Fsync)
            .unwrap();
        wal.close().unwrap();
        drop(wal);
        let wal = open(&fs).unwrap();
        let got = read_all(&wal);
        assert_eq!(got.len() as u64, CUT, "power cut at op {k}");
        assert_eq!(&got[..CUT as usize - 1], &old[..CUT as usize - 1]);
        assert_eq!(got[CUT as usize - 1].2, b"the new branch");
    }
    eprintln!("{torn} unsynced sectors kept by tears");
    assert!(
        !tear || torn > 0,
        "no reboot tore anything: the pass equals the one without"
    );
}

#[test]
fn a_power_cut_during_a_suffix_truncation_leaves_a_prefix_holding_the_kept_entries() {
    each_crash_point(false);
}

/// Once the cut returned, it is durable: a power cut right after it brings back exactly the
/// kept entries, none of the cut suffix.
#[test]
fn a_power_cut_right_after_a_suffix_truncation_keeps_exactly_the_kept_entries() {
    for tear in [None, Some(0x5EED)] {
        let (fs, old) = written();
        let wal = open(&fs).unwrap();
        wal.truncate_suffix(Index(CUT)).unwrap();
        fs.crash_now();
        drop(wal);
        fs.reboot(tear);
        let wal = open(&fs).unwrap();
        assert_eq!(read_all(&wal), old[..CUT as usize - 1], "tear {tear:?}");
    }
}

#[test]
fn a_power_cut_during_a_suffix_truncation_tearing_unsynced_sectors_too() {
    each_crash_point(true);
}
