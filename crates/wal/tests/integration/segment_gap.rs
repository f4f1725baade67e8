//! A gap in the segment files (defect 11): a segment deleted from the middle of a stopped
//! node's log is corruption, and `Wal::open` refuses it without deleting anything; the gaps an
//! interrupted prefix truncation or restart can leave are its truncation marker's, and
//! recovery finishes them.
//!
//! Method: logs on `FaultFs` with the small geometry (2 KiB segments). The missing segment is
//! removed by hand. An interrupted truncation is produced two ways: by cutting the power at
//! every file-system operation of a real `truncate_prefix` or `restart_at` in turn, and, for
//! the removals reaching the disk in another order than they were made (which `FaultFs`, whose
//! directory fsync is all or nothing, cannot produce), by writing the marker and removing a
//! later doomed segment but not an earlier one.

use crate::common;

use std::path::Path;
use std::sync::Arc;

use common::{DIR, open, payload, read_all, small_config};
use wal::format::{self, TruncationKind, TruncationMarker};
use wal::fs::{FaultFs, FileSystem};
use wal::{Durability, Index, Lsn, Position, Term, Wal, WalError};

const ENTRIES: u64 = 80;

fn dir() -> &'static Path {
    Path::new(DIR)
}

/// Appends entries `1..=ENTRIES` and closes the log.
fn build(fs: &FaultFs) {
    let wal = open(fs).unwrap();
    for i in 1..=ENTRIES {
        wal.append_next(Term(1), &payload(i, 0), Durability::Fsync)
            .unwrap();
    }
    wal.close().unwrap();
}

/// The segment file names, in Lsn order.
fn segments(fs: &FaultFs) -> Vec<String> {
    let mut names: Vec<String> = fs
        .names(dir())
        .into_iter()
        .filter(|n| n.ends_with(".wal"))
        .collect();
    names.sort();
    names
}

/// Every file with its bytes.
fn files(fs: &FaultFs) -> Vec<(String, Vec<u8>)> {
    let mut names = fs.names(dir());
    names.sort();
    names
        .into_iter()
        .map(|n| {
            let bytes = fs.read_file(&dir().join(&n)).unwrap();
            (n, bytes)
        })
        .collect()
}

fn first_lsn(name: &str) -> u64 {
    name.trim_end_matches(".wal").parse().unwrap()
}

#[test]
fn a_segment_missing_from_the_middle_refuses_open_and_deletes_nothing() {
    let fs = FaultFs::new();
    build(&fs);
    let names = segments(&fs);
    assert!(names.len() >= 5, "{names:?}");
    fs.remove(&dir().join(&names[2])).unwrap();
    // A leftover of an unfinished rotation, which recovery would otherwise delete too.
    fs.create(&dir().join("99999999999999999999.wal.tmp"))
        .unwrap();
    let before = files(&fs);

    let Err(error) = open(&fs) else {
        panic!("a log with a hole opened (and deleted the segments before it)");
    };
    assert!(
        matches!(
            &error,
            WalError::SegmentGap { start, end, before, after, .. }
                if start.0 == first_lsn(&names[2])
                    && end.0 == first_lsn(&names[3])
                    && *before == names[1]
                    && *after == names[3]
        ),
        "{error:?}"
    );
    let message = error.to_string();
    for needle in [
        "nothing was deleted",
        "Restore the missing segment file",
        "remove this node from the cluster on the leader",
    ] {
        assert!(message.contains(needle), "{needle:?} in {message}");
    }
    assert_eq!(files(&fs), before, "recovery deleted nothing");
    // It stays refused, and putting the file back is the cure.
    assert!(open(&fs).is_err());
}

#[test]
fn an_out_of_order_interrupted_prefix_truncation_is_finished_at_open() {
    let fs = FaultFs::new();
    build(&fs);
    let names = segments(&fs);
    assert!(names.len() >= 5, "{names:?}");
    // truncate_prefix dooms segments 0..3 and keeps 3 on; of its removals, made between
    // two directory fsyncs, only segment 1's reached the disk before the crash.
    let marker = TruncationMarker {
        kind: TruncationKind::Prefix,
        keep_lsn: Lsn(first_lsn(&names[3])),
    };
    let file = fs
        .create(&dir().join(format::TRUNCATION_MARKER_NAME))
        .unwrap();
    file.write_all_at(&marker.encode(), 0).unwrap();
    file.sync_data().unwrap();
    fs.remove(&dir().join(&names[1])).unwrap();
    fs.sync_dir(dir()).unwrap();

    let fs_dyn: Arc<dyn FileSystem> = Arc::new(fs.clone());
    let (wal, report) = Wal::open(fs_dyn, dir(), small_config()).unwrap();
    assert_eq!(
        report.removed,
        vec![
            names[0].clone(),
            names[2].clone(),
            format::TRUNCATION_MARKER_NAME.to_owned()
        ]
    );
    assert_eq!(segments(&fs), names[3..].to_vec());
    assert!(
        !fs.names(dir())
            .contains(&format::TRUNCATION_MARKER_NAME.to_owned())
    );
    let first = wal.first_index();
    assert!(first > Index(1));
    assert_eq!(wal.last_index(), Index(ENTRIES));
    for (index, _, bytes) in read_all(&wal) {
        assert_eq!(bytes, payload(index, 0));
    }
}

#[test]
fn an_invalid_truncation_marker_refuses_open_and_is_corruption() {
    let fs = FaultFs::new();
    build(&fs);
    let names = segments(&fs);
    let marker = TruncationMarker {
        kind: TruncationKind::Prefix,
        keep_lsn: Lsn(first_lsn(&names[2])),
    };
    let mut bytes = marker.encode();
    bytes[20] ^= 1; // keep_lsn, so the crc fails
    let file = fs
        .create(&dir().join(format::TRUNCATION_MARKER_NAME))
        .unwrap();
    file.write_all_at(&bytes, 0).unwrap();
    fs.remove(&dir().join(&names[0])).unwrap();
    let before = files(&fs);

    let Err(error) = open(&fs) else {
        panic!("a log with an invalid marker opened");
    };
    assert!(
        matches!(error, WalError::TruncationMarker { .. }),
        "{error:?}"
    );
    assert_eq!(files(&fs), before, "recovery deleted nothing");
    let report = wal::inspect::check(&fs, dir()).unwrap();
    let corruption = report.corruption.expect("the marker is corruption");
    assert_eq!(corruption.file, format::TRUNCATION_MARKER_NAME);
    assert!(
        corruption.what.contains("truncation marker is invalid"),
        "{}",
        corruption.what
    );
}

/// Cuts the power at every file-system operation of `operation` on a fresh log in turn,
/// reboots keeping only durable state, reopens, and hands the reopened log to `check`.
fn crash_at_every_operation(operation: impl Fn(&Wal), check: impl Fn(u64, &Wal)) {
    let ops = {
        let fs = FaultFs::new();
        build(&fs);
        let wal = open(&fs).unwrap();
        let before = fs.ops();
        operation(&wal);
        fs.ops() - before
    };
    assert!(
        ops >= 6,
        "the operation writes a marker and removes segments ({ops} ops)"
    );
    for crash_at in 1..=ops {
        let fs = FaultFs::new();
        build(&fs);
        let wal = open(&fs).unwrap();
        fs.crash_at_op(fs.ops() + crash_at);
        operation(&wal);
        assert!(fs.is_crashed(), "the power went at op {crash_at}");
        drop(wal);
        fs.reboot(None);
        let wal = open(&fs)
            .unwrap_or_else(|e| panic!("crash at op {crash_at} of {ops}: reopen failed: {e}"));
        assert!(
            !fs.names(dir())
                .iter()
                .any(|n| n.starts_with(format::TRUNCATION_MARKER_NAME)),
            "crash at op {crash_at}: recovery removed the marker"
        );
        check(crash_at, &wal);
        // A second recovery finds the same log.
        let (first, last) = (wal.first_index(), wal.last_index());
        wal.close().unwrap();
        drop(wal);
        let again = open(&fs).unwrap();
        assert_eq!((again.first_index(), again.last_index()), (first, last));
    }
}

#[test]
fn a_prefix_truncation_cut_short_at_any_operation_is_finished_or_not_begun() {
    let checkpoint = Index(60);
    let finished_first = {
        let fs = FaultFs::new();
        build(&fs);
        open(&fs).unwrap().truncate_prefix(checkpoint).unwrap()
    };
    assert!(finished_first > Index(20), "several segments go");
    crash_at_every_operation(
        |wal| {
            let _ = wal.truncate_prefix(checkpoint);
        },
        |crash_at, wal| {
            let first = wal.first_index();
            assert!(
                first == Index(1) || first == finished_first,
                "crash at op {crash_at}: the log starts at {first:?}, neither before nor after \
                 the truncation"
            );
            assert_eq!(wal.last_index(), Index(ENTRIES), "crash at op {crash_at}");
            for (index, _, bytes) in read_all(wal) {
                assert_eq!(bytes, payload(index, 0), "crash at op {crash_at}");
            }
        },
    );
}

#[test]
fn a_restart_cut_short_at_any_operation_leaves_the_old_log_or_none() {
    let start = Position {
        lsn: Lsn(64 << 10),
        last_index: Index(500),
        last_term: Term(3),
    };
    crash_at_every_operation(
        |wal| {
            let _ = wal.restart_at(start);
        },
        |crash_at, wal| {
            let entries = read_all(wal);
            let old = entries.len() as u64 == ENTRIES && wal.first_index() == Index(1);
            let empty = entries.is_empty();
            let restarted = empty && wal.position() == start;
            assert!(
                old || empty || restarted,
                "crash at op {crash_at}: {} entries from {:?}, a mix",
                entries.len(),
                wal.first_index()
            );
        },
    );
}
