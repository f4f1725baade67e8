//! Rotation crash: fill a segment so the next batch rotates, then cut the power between each
//! step of the rotation (write old tail, fdatasync old, create `.tmp`, preallocate, write
//! header, fdatasync, rename, directory fsync, write new data, fdatasync new). After each
//! reboot exactly one consistent tail must result: no `.tmp` left, contiguous segments, the
//! acknowledged prefix intact, and appends continue into a single next segment.

use crate::common;

use common::{DIR, open, payload, read_all};
use std::path::Path;
use wal::fs::FaultFs;
use wal::{Durability, Term};

#[test]
fn crash_between_each_rotation_step_leaves_one_consistent_tail() {
    // Find how many operations it takes to reach the last entry before rotation.
    let prepare = |fs: &FaultFs| -> u64 {
        let wal = open(fs).unwrap();
        let mut acked = 0;
        while wal.segment_count() == 1 && wal.position().lsn.0 < 2048 - 200 {
            acked = wal
                .append_next(Term(1), &payload(acked + 1, 0), Durability::Fsync)
                .unwrap()
                .index
                .0;
        }
        std::mem::forget(wal); // a crash follows: no close
        acked
    };
    let probe = FaultFs::new();
    let before = prepare(&probe);
    let base_ops = probe.ops();
    // Rotation steps come next: the following appends cross the 2 KiB segment end.
    for step in 1..=14 {
        let fs = FaultFs::new();
        let acked_before = prepare(&fs);
        assert_eq!(acked_before, before);
        assert_eq!(fs.ops(), base_ops);
        fs.crash_at_op(base_ops + step);
        let mut acked = acked_before;
        {
            let wal = open(&fs).unwrap();
            for i in acked_before + 1..acked_before + 6 {
                match wal.append_next(Term(1), &payload(i, 0), Durability::Fsync) {
                    Ok(_) => acked = i,
                    Err(_) => break,
                }
            }
            std::mem::forget(wal);
        }
        fs.reboot(None);
        let names = fs.names(Path::new(DIR));
        let wal = open(&fs).unwrap_or_else(|e| panic!("step {step}: {e}"));
        let names_after = fs.names(Path::new(DIR));
        assert!(
            names_after.iter().all(|n| !n.ends_with(".tmp")),
            "step {step}: {names:?}"
        );
        let entries = read_all(&wal);
        assert!(
            entries.len() as u64 >= acked,
            "step {step}: lost acknowledged entries"
        );
        for (index, _, bytes) in &entries {
            assert_eq!(*bytes, payload(*index, 0));
        }
        // Append across the boundary again; the result is one chain of segments.
        for _ in 0..6 {
            let next = wal.last_index().0 + 1;
            wal.append_next(Term(1), &payload(next, 0), Durability::Fsync)
                .unwrap();
        }
        let segments = wal.segment_count();
        wal.close().unwrap();
        drop(wal);
        let wal = open(&fs).unwrap();
        assert_eq!(wal.segment_count(), segments, "step {step}");
        assert_eq!(read_all(&wal).len() as u64, wal.last_index().0);
        let segment_files = fs
            .names(Path::new(DIR))
            .iter()
            .filter(|n| n.ends_with(".wal"))
            .count();
        assert_eq!(
            segment_files, segments,
            "step {step}: exactly the segments of the log exist"
        );
    }
}
