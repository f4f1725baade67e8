//! `Wal::restart_at`: a follower that installs a snapshot beyond its log throws the log away
//! and starts again, empty, at the snapshot's end; `position_after` gives that end on the
//! node that made the snapshot.

use crate::common;

use common::{DIR, open, payload, small_config};
use std::path::Path;
use std::sync::Arc;
use wal::fs::{FaultFs, FileSystem};
use wal::{Durability, Index, Lsn, Position, Term, Wal};

#[test]
fn the_log_restarts_empty_at_a_snapshot_end_and_survives_a_reopen() {
    let fs = FaultFs::new();
    let wal = open(&fs).unwrap();
    for i in 1..=10 {
        wal.append_next(Term(2), &payload(i, 0), Durability::Fsync)
            .unwrap();
    }
    let after5 = wal.position_after(Index(5)).unwrap();
    let e6 = wal.read(Index(6), &mut Vec::new()).unwrap();
    assert_eq!((after5.last_index, after5.last_term), (Index(5), Term(2)));
    assert!(
        after5.lsn <= e6.lsn,
        "entry 6 starts at or after the end of entry 5"
    );
    assert_eq!(wal.position_after(Index(10)), Some(wal.position()));
    assert_eq!(wal.position_after(Index(11)), None);
    assert_eq!(
        wal.position_after(Index(0)).map(|p| p.lsn),
        Some(Lsn(0)),
        "the entry before the first one is the log's start"
    );

    let start = Position {
        // Mid-block, as a snapshot's end usually is: the new segment starts at the block
        // boundary below with a start record over the gap.
        lsn: Lsn((1 << 20) + 72),
        last_index: Index(500),
        last_term: Term(7),
    };
    wal.restart_at(start).unwrap();
    assert_eq!(wal.position(), start);
    assert_eq!(wal.first_index(), Index(501));
    assert!(
        wal.read(Index(6), &mut Vec::new()).is_err(),
        "the old log is gone"
    );
    let e = wal
        .append_next(Term(7), b"after the snapshot", Durability::Fsync)
        .unwrap();
    assert_eq!((e.index, e.lsn), (Index(501), Lsn((1 << 20) + 72)));
    assert!(
        wal.append(Index(503), Term(7), b"gap", Durability::Fsync)
            .is_err()
    );
    wal.close().unwrap();
    drop(wal);

    fs.crash_now();
    fs.reboot(None);
    let dyn_fs: Arc<dyn FileSystem> = Arc::new(fs.clone());
    let (wal, report) = Wal::open(dyn_fs, Path::new(DIR), small_config()).unwrap();
    assert_eq!(report.segments, 1, "only the new segment is left");
    assert_eq!(wal.first_index(), Index(501));
    assert_eq!(wal.last_index(), Index(501));
    let mut buf = Vec::new();
    wal.read(Index(501), &mut buf).unwrap();
    assert_eq!(buf, b"after the snapshot");
    assert_eq!(
        wal.position_after(Index(500)),
        Some(Position {
            lsn: Lsn((1 << 20) + 72),
            last_index: Index(500),
            last_term: Term(7),
        })
    );
    assert_eq!(
        wal.read(Index(501), &mut buf).unwrap().lsn,
        Lsn((1 << 20) + 72)
    );
    // Emptied again down to the start, the log still begins past the start record.
    wal.truncate_suffix(Index(501)).unwrap();
    assert_eq!(wal.position().lsn, Lsn((1 << 20) + 72));
    drop(wal);
    let dyn_fs: Arc<dyn FileSystem> = Arc::new(fs.clone());
    let (wal, _) = Wal::open(dyn_fs, Path::new(DIR), small_config()).unwrap();
    assert_eq!(wal.position().lsn, Lsn((1 << 20) + 72));
    assert_eq!(wal.last_index(), Index(500));
}
