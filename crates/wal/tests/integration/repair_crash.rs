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

/// A torn tail that spans two segments (the last record of one and the first of the next are
/// torn): the repair saves both segments' bytes in one `.broken` file, removes the later
/// segment, then zeroes the earlier one's tail. A power cut after the removal makes the next
/// open repair again with only the earlier segment's bytes left; the `.broken` file it finds
/// must keep everything the first repair saved (it used to be created anew, shorter).
#[test]
fn a_power_cut_during_a_repair_across_segments_keeps_every_saved_byte() {
    use std::path::Path;

    /// Entries 1-8 fill the first 2 KiB segment, 9-16 the second, 17 opens the third; the
    /// 16th and 17th are torn. Returns the disk and the torn record's Lsn.
    fn torn_across_segments() -> (FaultFs, u64) {
        let fs = FaultFs::new();
        let wal = open(&fs).unwrap();
        let mut lsns = Vec::new();
        for i in 1..=17u8 {
            let e = wal
                .append_next(Term(1), &[i; 150], Durability::Fsync)
                .unwrap();
            lsns.push(e.lsn.0);
        }
        wal.close().unwrap();
        drop(wal);
        assert_eq!((lsns[15] / 2048, lsns[16] / 2048), (1, 2), "{lsns:?}");
        let data = wal::format::SEGMENT_DATA_OFFSET;
        let second = Path::new(common::DIR).join(format!("{:020}.wal", 2048));
        let third = Path::new(common::DIR).join(format!("{:020}.wal", 4096));
        fs.corrupt(&second, data + (lsns[15] - 2048) + 40, &[0xEE]);
        fs.corrupt(&third, data + (lsns[16] - 4096) + 40, &[0xEE]);
        (fs, lsns[15])
    }
    let broken_of = |fs: &FaultFs, at: u64| {
        fs.read_file(&Path::new(common::DIR).join(format!("{at:020}.broken")))
    };

    let (saved, repair_ops) = {
        let (fs, at) = torn_across_segments();
        let before = fs.ops();
        let wal = open(&fs).unwrap();
        assert_eq!(wal.last_index().0, 15);
        let saved = broken_of(&fs, at).expect("the repair saved the torn bytes");
        assert!(
            saved.len() > 2048 - (at - 2048) as usize,
            "both segments' bytes: {}",
            saved.len()
        );
        (saved, fs.ops() - before)
    };
    for k in 1..=repair_ops {
        let (fs, at) = torn_across_segments();
        fs.crash_at_op(fs.ops() + k);
        let _ = open(&fs);
        fs.reboot(None);
        let wal = open(&fs).unwrap_or_else(|e| panic!("power cut at op {k}: reopen failed: {e}"));
        assert_eq!(wal.last_index().0, 15, "power cut at op {k}");
        if let Some(kept) = broken_of(&fs, at) {
            assert!(
                kept.len() >= saved.len() && kept[..saved.len()] == saved[..],
                "power cut at op {k} of the repair: the .broken file keeps {} of the {} bytes saved",
                kept.len(),
                saved.len()
            );
        }
        let names = fs.names(Path::new(common::DIR));
        assert!(
            names.iter().any(|n| n.ends_with(".broken")),
            "power cut at op {k}: no .broken file: {names:?}"
        );
    }
}
