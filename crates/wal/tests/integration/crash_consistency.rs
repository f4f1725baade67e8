//! Crash consistency: run a workload on the fault-injecting file system, cut the power at
//! every mutating file-system operation in turn (every write, fdatasync, creation, rename and
//! directory fsync), reboot keeping only durable bytes (and, in a second pass, a random half
//! of the unsynced sectors), reopen, and check that the recovered log is a prefix of what was
//! attempted that contains every entry acknowledged under `Durability::Fsync`.

use crate::common;

use common::{open, payload, read_all};
use wal::fs::FaultFs;
use wal::{Durability, Term};

const ENTRIES: u64 = 40;

/// Runs the workload until the first error; returns the entries acknowledged as durable.
fn workload(fs: &FaultFs) -> u64 {
    let Ok(wal) = open(fs) else { return 0 };
    let mut acked = 0;
    for i in 1..=ENTRIES {
        // Mix durabilities: every third entry is a Memory append that a later Fsync covers.
        let durability = if i % 3 == 0 {
            Durability::Memory
        } else {
            Durability::Fsync
        };
        match wal.append_next(Term(1 + i / 10), &payload(i, 0), durability) {
            Ok(entry) => {
                assert_eq!(entry.index.0, i);
                if durability == Durability::Fsync {
                    acked = i;
                }
            }
            Err(_) => break,
        }
    }
    if !fs.is_crashed() {
        let _ = wal.close();
    }
    acked
}

fn check(tear: Option<u64>) {
    let total_ops = {
        let fs = FaultFs::new();
        workload(&fs);
        fs.ops()
    };
    assert!(
        total_ops > 50,
        "the workload exercises many operations ({total_ops})"
    );
    for crash_at in 1..=total_ops {
        let fs = FaultFs::new();
        fs.crash_at_op(crash_at);
        let acked = workload(&fs);
        fs.reboot(tear.map(|seed| seed ^ crash_at));
        let wal =
            open(&fs).unwrap_or_else(|e| panic!("crash at op {crash_at}: reopen failed: {e}"));
        let entries = read_all(&wal);
        assert!(
            entries.len() as u64 >= acked,
            "crash at op {crash_at}: lost acknowledged entries ({} < {acked})",
            entries.len()
        );
        for (index, term, bytes) in &entries {
            assert_eq!(*term, 1 + index / 10, "crash at op {crash_at}");
            assert_eq!(
                *bytes,
                payload(*index, 0),
                "crash at op {crash_at}: entry {index} differs"
            );
        }
        // The log keeps working after recovery, and a second recovery finds the same log.
        let next = wal.last_index().0 + 1;
        wal.append_next(Term(100), b"after", Durability::Fsync)
            .expect("append after recovery");
        wal.close().unwrap();
        drop(wal);
        let again = open(&fs).unwrap();
        assert_eq!(again.last_index().0, next);
    }
}

#[test]
fn crash_at_every_operation_keeps_a_prefix_with_every_acknowledged_entry() {
    check(None);
}

#[test]
fn torn_unsynced_sectors_never_break_recovery() {
    check(Some(0x9e37_79b9_7f4a_7c15));
}
