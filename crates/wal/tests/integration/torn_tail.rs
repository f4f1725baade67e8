//! Torn tail: the last entry is cut short (a partial write at a crash) or has a bad crc at the
//! very end of the log. Recovery cuts it, keeps the cut bytes in a `.broken` file, reports it,
//! and the log continues from the last good entry.

use crate::common;

use common::{DIR, TornTail, open, payload, read_all, small_config, write_torn_tail};
use std::path::Path;
use std::sync::Arc;
use wal::fs::{FaultFs, FileSystem};
use wal::{Durability, Term, Wal};

const DATA_OFFSET: u64 = 4096;

#[test]
fn partial_last_entry_is_cut_and_kept_in_a_broken_file() {
    let fs = FaultFs::new();
    let TornTail { last, torn, .. } = write_torn_tail(&fs);

    let dyn_fs: Arc<dyn FileSystem> = Arc::new(fs.clone());
    let (wal, report) = Wal::open(dyn_fs, Path::new(DIR), small_config()).unwrap();
    let (lsn, bytes, path) = report.torn_tail.expect("the torn tail is reported");
    assert_eq!(lsn, torn);
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

/// A torn restart can lose the only record of a segment the log had just moved to; the log
/// then goes on in the previous segment's padding. The emptied segment must not survive with
/// its header: its first entry would come later than the header says, the next open would
/// refuse the log, and a prefix truncation by that header would keep entries whose records it
/// deleted (a panic in `read`; simulator seed 627).
#[test]
fn a_torn_first_record_of_a_new_segment_leaves_no_stale_segment() {
    let fs = FaultFs::new();
    let wal = open(&fs).unwrap();
    // 150 B payloads: one 184 B record per 256 B block, 8 per 2 KiB segment.
    for i in 1..=8 {
        wal.append_next(Term(1), &[i as u8; 150], Durability::Fsync)
            .unwrap();
    }
    let ninth = wal
        .append_next(Term(1), &[9; 150], Durability::Fsync)
        .unwrap();
    assert_eq!(ninth.lsn.0, 2048, "entry 9 opens the second segment");
    wal.close().unwrap();
    drop(wal);
    let second = Path::new(DIR).join("00000000000000002048.wal");
    fs.corrupt(&second, DATA_OFFSET + 40, &[0xEE]);

    let wal = open(&fs).unwrap();
    assert_eq!(wal.last_index().0, 8);
    assert!(
        !fs.names(Path::new(DIR))
            .contains(&"00000000000000002048.wal".to_string()),
        "the segment left without an entry is gone: {:?}",
        fs.names(Path::new(DIR))
    );
    // A small entry fits in the first segment's padding; the next ones open a new segment.
    let small = wal
        .append_next(Term(2), b"fits the padding", Durability::Fsync)
        .unwrap();
    assert!(small.lsn.0 < 2048, "{small:?}");
    for i in 10..=12 {
        wal.append_next(Term(2), &[i as u8; 150], Durability::Fsync)
            .unwrap();
    }
    let all = read_all(&wal);
    assert_eq!(all.len(), 12);
    assert_eq!(all[8].2, b"fits the padding");
    // A prefix truncation by the new segment's header keeps exactly what it still holds.
    let first = wal.truncate_prefix(wal::Index(11)).unwrap();
    let kept = read_all(&wal);
    assert_eq!(kept.first().map(|e| e.0), Some(first.0));
    assert_eq!(kept.last().map(|e| e.0), Some(12));
    wal.close().unwrap();
    drop(wal);
    let wal = open(&fs).unwrap();
    assert_eq!(read_all(&wal), kept, "the log reopens as it was");
}
