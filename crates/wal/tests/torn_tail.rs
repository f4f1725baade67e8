//! Torn tail: the last entry is cut short (a partial write at a crash) or has a bad crc at the
//! very end of the log. Recovery cuts it, keeps the cut bytes in a `.broken` file, reports it,
//! and the log continues from the last good entry.

mod common;

use common::{DIR, open, payload, read_all, small_config};
use std::path::Path;
use std::sync::Arc;
use wal::fs::{FaultFs, FileSystem};
use wal::{Durability, Term, Wal};

const DATA_OFFSET: u64 = 4096;

#[test]
fn partial_last_entry_is_cut_and_kept_in_a_broken_file() {
    let fs = FaultFs::new();
    let wal = open(&fs).unwrap();
    for i in 1..=4 {
        wal.append_next(Term(1), &payload(i, 0), Durability::Fsync)
            .unwrap();
    }
    let last = wal.position();
    let entry = wal
        .append_next(Term(1), &[0xAB; 100], Durability::Fsync)
        .unwrap();
    wal.close().unwrap();
    drop(wal);
    // Tear the last entry: keep its header and the first 20 payload bytes, zero the rest.
    let segment = Path::new(DIR).join("00000000000000000000.wal");
    let cut_from = DATA_OFFSET + entry.lsn.0 + 52;
    fs.corrupt(&segment, cut_from, &[0; 80]);

    let dyn_fs: Arc<dyn FileSystem> = Arc::new(fs.clone());
    let (wal, report) = Wal::open(dyn_fs, Path::new(DIR), small_config()).unwrap();
    let (lsn, bytes, path) = report.torn_tail.expect("the torn tail is reported");
    assert_eq!(lsn, entry.lsn);
    assert!(bytes >= 52, "the cut covers the torn record");
    let broken = fs.read_file(&path).expect("the .broken file exists");
    assert_eq!(&broken[32..52], &[0xAB; 20], "the cut bytes are kept");
    assert_eq!(wal.position(), last);
    assert_eq!(read_all(&wal).len(), 4);
    // The next entry continues right after the last good one (it fits the block the cut
    // entry had to skip) and survives another recovery.
    let again = wal
        .append_next(Term(2), b"again", Durability::Fsync)
        .unwrap();
    assert_eq!(again.lsn, last.lsn);
    wal.close().unwrap();
    drop(wal);
    let (wal, report) = Wal::open(Arc::new(fs.clone()), Path::new(DIR), small_config()).unwrap();
    assert_eq!(report.torn_tail, None);
    assert_eq!(read_all(&wal).last().unwrap().2, b"again");
}

#[test]
fn bad_crc_on_the_last_entry_is_a_torn_tail() {
    let fs = FaultFs::new();
    let wal = open(&fs).unwrap();
    for i in 1..=3 {
        wal.append_next(Term(1), &payload(i, 0), Durability::Fsync)
            .unwrap();
    }
    let last = wal
        .append_next(Term(1), &[5; 40], Durability::Fsync)
        .unwrap();
    wal.close().unwrap();
    drop(wal);
    let segment = Path::new(DIR).join("00000000000000000000.wal");
    fs.corrupt(&segment, DATA_OFFSET + last.lsn.0 + 40, &[6]);
    let wal = open(&fs).unwrap();
    assert_eq!(wal.last_index().0, 3);
    assert!(
        fs.names(Path::new(DIR))
            .iter()
            .any(|n| n.ends_with(".broken"))
    );
}
