//! A power cut in the middle of recovery's own repairs: the next open redoes them (docs/FORMAT.md,
//! section 5, case 10). The crash tests elsewhere cut the power during a workload, never during
//! `Wal::open`; here the log opened has a torn last record, whose repair writes a `.broken`
//! file, zeroes the torn bytes and syncs, and the power is cut at each of those mutating
//! operations in turn (keeping only durable bytes, and in a second pass, with eight tear
//! seeds per point, keeping some unsynced sectors too; the pass asserts some were kept).
//!
//! Method: for every operation `k` of the uninterrupted open, a fresh disk with the same torn
//! tail, a power cut at `k`, a reboot, and an open that must succeed with the four good entries
//! and nothing else; an entry appended then must survive one more reopen.

use crate::common;

use common::{cut_points, open, read_all, write_torn_tail};
use wal::fs::FaultFs;
use wal::{Durability, Term};

/// The torn log, and its four good entries.
fn torn() -> (FaultFs, Vec<(u64, u64, Vec<u8>)>) {
    let fs = FaultFs::new();
    let good = write_torn_tail(&fs).good;
    (fs, good)
}

fn each_crash_point(tear: bool) {
    let repair_ops = {
        let (fs, good) = torn();
        let before = fs.ops();
        let wal = open(&fs).unwrap();
        assert_eq!(read_all(&wal), good);
        fs.ops() - before
    };
    assert!(
        repair_ops >= 2,
        "the repair writes ({repair_ops} operations)"
    );
    let (mut interrupted, mut kept) = (0usize, 0);
    let points = cut_points(repair_ops, tear);
    for &(k, seed) in &points {
        let (fs, good) = torn();
        fs.crash_at_op(fs.ops() + k);
        // The interrupted open fails (the cut falls inside it).
        interrupted += usize::from(open(&fs).is_err());
        fs.reboot(seed);
        kept += fs.unsynced_sectors_kept();
        let wal = open(&fs)
            .unwrap_or_else(|e| panic!("power cut at op {k} of the repair: reopen failed: {e}"));
        assert_eq!(
            read_all(&wal),
            good,
            "power cut at op {k} of the repair: other entries than the four good ones"
        );
        let next = wal
            .append_next(Term(2), b"after the repair", Durability::Fsync)
            .unwrap();
        assert_eq!(next.index.0, 5);
        wal.close().unwrap();
        drop(wal);
        let wal = open(&fs).unwrap();
        let entries = read_all(&wal);
        assert_eq!(entries.len(), 5, "power cut at op {k}");
        assert_eq!(entries[4].2, b"after the repair");
    }
    eprintln!(
        "{repair_ops} operations in the repair; {interrupted} opens cut short; {kept} unsynced \
         sectors kept by tears"
    );
    assert!(
        !tear || kept > 0,
        "no reboot tore anything: the pass equals the one without"
    );
    assert_eq!(
        interrupted,
        points.len(),
        "every cut point falls inside the open"
    );
}

#[test]
fn a_power_cut_during_the_repair_of_a_torn_tail_is_repaired_at_the_next_open() {
    each_crash_point(false);
}

#[test]
fn a_power_cut_during_the_repair_tearing_unsynced_sectors_is_repaired_too() {
    each_crash_point(true);
}
