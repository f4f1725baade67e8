//! Offline inspection (`wal::inspect`, behind `rdmalog dump` and `rdmalog check`): a clean log
//! checks clean and dumps every entry; a flipped byte mid-log is corruption at its exact file
//! offset and Lsn; a torn last record is a torn tail, not corruption; header and chain
//! problems are corruption, and so is a segment missing from the middle; the leftovers an
//! interrupted truncation's marker dooms are not; the verdict agrees with what
//! recovery then does; and nothing is ever written.

use crate::common;

use common::{DIR, open, payload, small_config};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use wal::format::{self, SegmentHeader};
use wal::fs::{FaultFs, FileSystem, StdFs};
use wal::inspect::{self, CheckReport};
use wal::{Durability, Entry, Index, Lsn, Position, Term, Wal, WalError};

const DATA_OFFSET: u64 = 4096;

fn dir() -> &'static Path {
    Path::new(DIR)
}

fn term_of(index: u64) -> u64 {
    1 + index / 15
}

/// Appends entries `1..=count` (terms rising every 15 entries) and closes the log.
fn build(fs: &FaultFs, count: u64) -> Vec<Entry> {
    let wal = open(fs).unwrap();
    let entries = (1..=count)
        .map(|i| {
            wal.append_next(Term(term_of(i)), &payload(i, 0), Durability::Fsync)
                .unwrap()
        })
        .collect();
    wal.close().unwrap();
    entries
}

/// Every file of `dir` with its bytes, to prove that inspection wrote nothing.
fn snapshot(fs: &FaultFs) -> Vec<(String, Vec<u8>)> {
    let mut names = fs.names(dir());
    names.sort();
    names
        .into_iter()
        .map(|name| {
            let bytes = fs.read_file(&dir().join(&name)).unwrap();
            (name, bytes)
        })
        .collect()
}

fn check(fs: &FaultFs) -> CheckReport {
    let before = snapshot(fs);
    let report = inspect::check(fs, dir()).unwrap();
    assert_eq!(snapshot(fs), before, "check wrote nothing");
    report
}

/// An entry as dump reports it: index, term, lsn, payload.
type Dumped = (u64, u64, u64, Vec<u8>);

fn dump(fs: &FaultFs) -> (CheckReport, Vec<Dumped>) {
    let mut seen = Vec::new();
    let report = inspect::dump(fs, dir(), |index, term, lsn, payload| {
        seen.push((index.0, term.0, lsn.0, payload.to_vec()));
    })
    .unwrap();
    (report, seen)
}

/// The segment file holding `lsn`, and `lsn`'s byte offset in it.
fn locate(report: &CheckReport, lsn: Lsn) -> (String, u64) {
    let segment = report
        .segments
        .iter()
        .find(|s| s.first_lsn <= lsn && lsn.0 < s.first_lsn.0 + s.data_bytes)
        .expect("a segment holds the lsn");
    (
        segment.name.clone(),
        DATA_OFFSET + lsn.0 - segment.first_lsn.0,
    )
}

#[test]
fn a_clean_multi_segment_log_checks_clean_and_dumps_every_entry_in_order() {
    let fs = FaultFs::new();
    let entries = build(&fs, 60);
    let report = check(&fs);
    assert_eq!(report.corruption, None);
    assert_eq!(report.torn_tail, None);
    assert_eq!(report.entries, 60);
    assert_eq!(report.first_index, Some(Index(1)));
    assert_eq!(report.last_index, Some(Index(60)));
    assert!(report.other_files.is_empty(), "{:?}", report.other_files);

    // The segments are the directory's .wal files in Lsn order, contiguous, chained, and
    // their entry counts add up.
    let mut names = fs.names(dir());
    names.sort();
    let listed: Vec<&str> = report.segments.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(listed, names);
    assert!(report.segments.len() >= 3, "the log spans several segments");
    assert_eq!(report.segments[0].first_index, Index(1));
    assert_eq!(report.segments[0].prev_term, Term(0));
    for pair in report.segments.windows(2) {
        assert_eq!(
            pair[0].first_lsn.0 + pair[0].data_bytes,
            pair[1].first_lsn.0
        );
        assert_eq!(
            pair[0].last_index.map(|i| i.0 + 1),
            Some(pair[1].first_index.0)
        );
        assert_eq!(pair[1].prev_term, Term(term_of(pair[1].first_index.0 - 1)));
    }
    for s in &report.segments {
        assert_eq!(s.name, format!("{:020}.wal", s.first_lsn.0));
        assert_eq!(s.data_bytes, small_config().segment_data_bytes);
        assert!(s.bytes_used <= s.data_bytes);
        assert!(s.entries > 0);
    }
    assert_eq!(report.segments.iter().map(|s| s.entries).sum::<u64>(), 60);
    assert_eq!(report.segments.last().unwrap().last_index, Some(Index(60)));
    let last = report.segments.last().unwrap();
    let end = entries.last().unwrap().lsn.0 + format::record_bytes(payload(60, 0).len()) as u64;
    assert_eq!(last.bytes_used, end - last.first_lsn.0);

    // dump sees every entry, in order, with its index, term, lsn and payload.
    let (dumped_report, seen) = dump(&fs);
    assert_eq!(dumped_report, report);
    let expected: Vec<Dumped> = entries
        .iter()
        .map(|e| (e.index.0, e.term.0, e.lsn.0, payload(e.index.0, 0)))
        .collect();
    assert_eq!(seen, expected);

    let text = inspect::summary(&report);
    assert!(text.contains("60 entries, index 1 ..= 60"), "{text}");
    assert!(text.contains("ok: every record verifies"), "{text}");
    for s in &report.segments {
        assert!(text.contains(&s.name), "{text}");
    }
}

#[test]
fn a_flipped_payload_byte_mid_log_is_corruption_at_its_exact_position() {
    let fs = FaultFs::new();
    let entries = build(&fs, 40);
    let clean = check(&fs);
    let victim = entries[19]; // index 20, in a middle segment
    assert_eq!(victim.index, Index(20));
    let (file, offset) = locate(&clean, victim.lsn);
    assert_ne!(
        file, clean.segments[0].name,
        "the victim is not in the first segment"
    );
    assert_ne!(file, clean.segments.last().unwrap().name, "nor in the last");
    let path = dir().join(&file);
    let byte = fs.read_file(&path).unwrap()[(offset + 40) as usize];
    fs.corrupt(&path, offset + 40, &[byte ^ 0x01]);

    let report = check(&fs);
    assert_eq!(report.torn_tail, None);
    let corruption = report.corruption.clone().expect("the flip is found");
    assert_eq!(corruption.file, file);
    assert_eq!(corruption.file_offset, offset);
    assert_eq!(corruption.lsn, victim.lsn);
    assert_eq!(corruption.last_good_index, Index(19));
    assert!(corruption.what.contains("crc32c"), "{}", corruption.what);
    assert!(corruption.what.contains("index 20"), "{}", corruption.what);
    let line = corruption.to_string();
    let head = format!(
        "{file} at byte {offset} (lsn {}): entry record claiming index 20, term {}, {} payload \
         bytes: the crc32c is 0x",
        victim.lsn.0,
        term_of(20),
        payload(20, 0).len(),
    );
    assert!(line.starts_with(&head), "{line}");
    assert!(!line.contains('\n'), "one line: {line}");
    assert!(
        corruption.to_string().ends_with("; last good index 19"),
        "{corruption}"
    );
    assert_eq!(report.entries, 19);
    assert_eq!(report.last_index, Some(Index(19)));
    let holder = report.segments.iter().position(|s| s.name == file).unwrap();
    assert!(
        report.segments[holder + 1..].iter().all(|s| s.entries == 0),
        "nothing after the corruption is counted"
    );
    assert!(inspect::summary(&report).contains("CORRUPT: "));

    let (_, seen) = dump(&fs);
    let indexes: Vec<u64> = seen.iter().map(|e| e.0).collect();
    assert_eq!(
        indexes,
        (1..=19).collect::<Vec<_>>(),
        "dump stops before it"
    );

    // Recovery agrees: it refuses the log at the same place.
    match open(&fs).unwrap_err() {
        WalError::Corrupt { lsn, index, .. } => {
            assert_eq!((lsn, index), (victim.lsn, Index(19)));
        }
        other => panic!("expected Corrupt, got {other}"),
    }
}

#[test]
fn a_torn_last_record_is_a_torn_tail_not_corruption() {
    let fs = FaultFs::new();
    let entries = build(&fs, 4);
    let wal = open(&fs).unwrap();
    let torn = wal
        .append_next(Term(1), &[0xAB; 100], Durability::Fsync)
        .unwrap();
    wal.close().unwrap();
    drop(wal);
    let clean = check(&fs);
    let (file, offset) = locate(&clean, torn.lsn);
    // Keep the header and 20 payload bytes of the last entry, as a crash mid-write would.
    fs.corrupt(&dir().join(&file), offset + 52, &[0; 80]);

    let report = check(&fs);
    assert_eq!(report.corruption, None, "a torn tail is not corruption");
    let tail = report.torn_tail.clone().expect("the torn tail is reported");
    assert_eq!(tail.file, file);
    assert_eq!(tail.file_offset, offset);
    assert_eq!(tail.lsn, torn.lsn);
    assert_eq!(tail.last_good_index, Index(4));
    assert!(tail.what.contains("torn tail"), "{}", tail.what);
    assert_eq!(report.entries, 4);
    assert_eq!(report.last_index, Some(Index(4)));
    let (_, seen) = dump(&fs);
    assert_eq!(seen.len(), 4);
    assert_eq!(seen.last().unwrap().2, entries[3].lsn.0);
    assert!(
        !fs.names(dir()).iter().any(|n| n.ends_with(".broken")),
        "check cuts nothing"
    );
    let text = inspect::summary(&report);
    assert!(text.contains("torn tail: "), "{text}");
    assert!(!text.contains("CORRUPT"), "{text}");

    // Recovery agrees: it cuts exactly there, and afterwards the log checks clean.
    let dyn_fs: Arc<dyn FileSystem> = Arc::new(fs.clone());
    let (wal, recovered) = Wal::open(dyn_fs, dir(), small_config()).unwrap();
    assert_eq!(recovered.torn_tail.map(|t| t.0), Some(torn.lsn));
    drop(wal);
    let after = check(&fs);
    assert_eq!((after.corruption, after.torn_tail), (None, None));
    assert_eq!(after.last_index, Some(Index(4)));
    assert!(
        after
            .other_files
            .iter()
            .any(|(n, _)| n.ends_with(".broken"))
    );
}

#[test]
fn a_log_restarted_mid_block_starts_with_a_start_record_and_checks_clean() {
    let fs = FaultFs::new();
    let wal = open(&fs).unwrap();
    for i in 1..=10 {
        wal.append_next(Term(2), &payload(i, 0), Durability::Fsync)
            .unwrap();
    }
    let start = Position {
        lsn: Lsn((1 << 20) + 72),
        last_index: Index(500),
        last_term: Term(7),
    };
    wal.restart_at(start).unwrap();
    let entries: Vec<Entry> = (501..=530)
        .map(|i| {
            wal.append_next(Term(7), &payload(i, 0), Durability::Fsync)
                .unwrap()
        })
        .collect();
    wal.close().unwrap();
    drop(wal);

    let report = check(&fs);
    assert_eq!(
        (report.corruption.clone(), report.torn_tail.clone()),
        (None, None)
    );
    assert_eq!(report.entries, 30);
    assert_eq!(report.first_index, Some(Index(501)));
    assert_eq!(report.last_index, Some(Index(530)));
    assert!(report.segments.len() >= 2);
    let first = &report.segments[0];
    assert_eq!(first.name, format!("{:020}.wal", 1u64 << 20));
    assert_eq!(first.first_lsn, Lsn(1 << 20));
    assert_eq!((first.first_index, first.prev_term), (Index(501), Term(7)));
    let (_, seen) = dump(&fs);
    assert_eq!(seen[0].0, 501);
    assert_eq!(
        seen[0].2,
        (1 << 20) + 72,
        "the first entry follows the start record"
    );
    let lsns: Vec<u64> = entries.iter().map(|e| e.lsn.0).collect();
    assert_eq!(seen.iter().map(|e| e.2).collect::<Vec<_>>(), lsns);
}

#[test]
fn a_start_record_anywhere_but_the_log_start_is_corruption() {
    let fs = FaultFs::new();
    let entries = build(&fs, 30);
    let clean = check(&fs);
    // Replace entry 10 by a start record of the same length: valid on its own, but misplaced.
    let victim = entries[9];
    let len = format::record_bytes(payload(10, 0).len()) as u64;
    let (file, offset) = locate(&clean, victim.lsn);
    let header = format::start_header(victim.lsn, len, (Index(9), Term(term_of(9))));
    fs.corrupt(&dir().join(&file), offset, &header);

    let report = check(&fs);
    let corruption = report
        .corruption
        .expect("a misplaced start record is corruption");
    assert_eq!((corruption.file, corruption.file_offset), (file, offset));
    assert_eq!(corruption.lsn, victim.lsn);
    assert_eq!(corruption.last_good_index, Index(9));
    assert!(
        corruption.what.contains("start record"),
        "{}",
        corruption.what
    );
    assert!(matches!(
        open(&fs).unwrap_err(),
        WalError::Corrupt { lsn, .. } if lsn == victim.lsn
    ));
}

#[test]
fn a_bad_segment_header_is_corruption_at_that_file() {
    let fs = FaultFs::new();
    build(&fs, 40);
    let clean = check(&fs);
    let second = &clean.segments[1];
    let path = dir().join(&second.name);
    let byte = fs.read_file(&path).unwrap()[16];
    fs.corrupt(&path, 16, &[byte ^ 0x40]); // the cluster id, so the header crc fails

    let report = check(&fs);
    let corruption = report.corruption.clone().expect("the bad header is found");
    assert_eq!(corruption.file, second.name);
    assert_eq!(corruption.file_offset, 0);
    assert_eq!(corruption.lsn, second.first_lsn);
    assert_eq!(
        corruption.last_good_index,
        clean.segments[0].last_index.unwrap()
    );
    assert!(
        corruption.what.contains("invalid segment header"),
        "{}",
        corruption.what
    );
    assert_eq!(
        report.entries, clean.segments[0].entries,
        "only the first is walked"
    );
    assert!(
        report.other_files.iter().any(|(n, _)| *n == second.name),
        "an undecodable segment is listed among the other files"
    );
    let text = inspect::summary(&report);
    assert!(text.contains("its segment header is invalid"), "{text}");
    assert!(matches!(
        open(&fs).unwrap_err(),
        WalError::SegmentHeader { .. }
    ));
}

#[test]
fn a_segment_header_that_breaks_the_chain_is_corruption_at_its_field() {
    let fs = FaultFs::new();
    build(&fs, 40);
    let clean = check(&fs);
    let third = &clean.segments[2];
    let path = dir().join(&third.name);
    let mut header = SegmentHeader::decode(&fs.read_file(&path).unwrap()[..64]).unwrap();
    header.first_index = Index(header.first_index.0 + 1);
    fs.corrupt(&path, 0, &header.encode());

    let report = check(&fs);
    let corruption = report.corruption.expect("the chain break is found");
    assert_eq!(corruption.file, third.name);
    assert_eq!(corruption.file_offset, 24, "the first_index field");
    assert_eq!(corruption.lsn, third.first_lsn);
    assert_eq!(
        corruption.last_good_index,
        clean.segments[1].last_index.unwrap()
    );
    assert_eq!(report.torn_tail, None);
    assert!(matches!(
        open(&fs).unwrap_err(),
        WalError::SegmentMismatch { .. }
    ));
}

#[test]
fn a_segment_missing_from_the_middle_is_corruption_naming_the_hole() {
    let fs = FaultFs::new();
    build(&fs, 60);
    let clean = check(&fs);
    assert!(clean.segments.len() >= 4);
    // Defect 11: deleted by hand (or lost), not by a truncation: no marker says so.
    let gone = &clean.segments[1];
    fs.remove(&dir().join(&gone.name)).unwrap();

    let report = check(&fs);
    let corruption = report.corruption.clone().expect("the hole is corruption");
    assert_eq!(
        corruption.file, clean.segments[2].name,
        "named at the file after it"
    );
    assert_eq!(corruption.lsn, gone.first_lsn, "from the first missing lsn");
    assert_eq!(
        corruption.last_good_index,
        clean.segments[0].last_index.unwrap()
    );
    let range = format!(
        "nothing holds lsn {} to {}",
        gone.first_lsn.0, clean.segments[2].first_lsn.0
    );
    for needle in [
        range.as_str(),
        gone.name.as_str(),
        clean.segments[0].name.as_str(),
        "no interrupted prefix truncation explains",
        "restore the missing file",
        "add it back as a new member",
    ] {
        assert!(
            corruption.what.contains(needle),
            "{needle:?} in {}",
            corruption.what
        );
    }
    assert_eq!(report.torn_tail, None);
    assert!(report.doomed.is_empty() && report.other_files.is_empty());
    assert_eq!(
        report.entries, clean.segments[0].entries,
        "only the run before the hole is walked"
    );
    assert_eq!(
        report.segments.len(),
        clean.segments.len() - 1,
        "the rest is still listed"
    );
    let text = inspect::summary(&report);
    assert!(text.contains("CORRUPT"), "{text}");
    assert!(!text.contains("leftover"), "{text}");
}

#[test]
fn segments_a_truncation_marker_dooms_are_leftovers_not_corruption() {
    let fs = FaultFs::new();
    build(&fs, 60);
    let clean = check(&fs);
    assert!(clean.segments.len() >= 4);
    // An interrupted prefix truncation that keeps the log from segment 2: its marker is
    // durable, and of its removals only segment 1's reached the disk.
    let marker = format::TruncationMarker {
        kind: format::TruncationKind::Prefix,
        keep_lsn: clean.segments[2].first_lsn,
    };
    let file = fs
        .create(&dir().join(format::TRUNCATION_MARKER_NAME))
        .unwrap();
    file.write_all_at(&marker.encode(), 0).unwrap();
    file.sync_data().unwrap();
    fs.remove(&dir().join(&clean.segments[1].name)).unwrap();
    fs.sync_dir(dir()).unwrap();

    let report = check(&fs);
    assert_eq!(
        (report.corruption.clone(), report.torn_tail.clone()),
        (None, None)
    );
    assert_eq!(report.segments, clean.segments[2..].to_vec());
    assert_eq!(report.doomed, vec![clean.segments[0].name.clone()]);
    assert_eq!(
        report.other_files,
        vec![
            (clean.segments[0].name.clone(), DATA_OFFSET + 2048),
            (format::TRUNCATION_MARKER_NAME.to_owned(), 32),
        ]
    );
    assert_eq!(report.first_index, Some(clean.segments[2].first_index));
    assert_eq!(report.last_index, Some(Index(60)));
    let text = inspect::summary(&report);
    assert!(
        text.contains("doomed by the interrupted truncation"),
        "{text}"
    );
    assert!(text.contains("recovery finishes it"), "{text}");

    // The kept segment itself missing as well: a hole the marker does not explain.
    let fs2 = FaultFs::new();
    build(&fs2, 60);
    let file = fs2
        .create(&dir().join(format::TRUNCATION_MARKER_NAME))
        .unwrap();
    file.write_all_at(&marker.encode(), 0).unwrap();
    fs2.remove(&dir().join(&clean.segments[2].name)).unwrap();
    let corruption = check(&fs2).corruption.expect("the kept segment is missing");
    assert_eq!(corruption.lsn, clean.segments[2].first_lsn);
    assert!(
        corruption
            .what
            .contains("wal-truncation (an interrupted prefix truncation"),
        "{}",
        corruption.what
    );

    let dyn_fs: Arc<dyn FileSystem> = Arc::new(fs.clone());
    let (wal, recovered) = Wal::open(dyn_fs, dir(), small_config()).unwrap();
    assert_eq!(
        recovered.removed,
        vec![
            clean.segments[0].name.clone(),
            format::TRUNCATION_MARKER_NAME.to_owned()
        ]
    );
    assert_eq!(wal.first_index(), clean.segments[2].first_index);
}

#[test]
fn the_verdict_agrees_with_recovery_after_every_torn_crash() {
    let workload = |fs: &FaultFs| {
        let Ok(wal) = open(fs) else { return };
        for i in 1..=30 {
            // Batches of several entries, so that a crash can tear one in the middle.
            let durability = if i % 4 == 0 {
                Durability::Fsync
            } else {
                Durability::Memory
            };
            if wal
                .append_next(Term(term_of(i)), &payload(i, 0), durability)
                .is_err()
            {
                break;
            }
        }
        if !fs.is_crashed() {
            let _ = wal.close();
        }
    };
    let total_ops = {
        let fs = FaultFs::new();
        workload(&fs);
        fs.ops()
    };
    let mut torn_seen = 0;
    for (crash_at, seed) in (1..=total_ops).flat_map(|op| (0..4).map(move |seed| (op, seed))) {
        let fs = FaultFs::new();
        fs.crash_at_op(crash_at);
        workload(&fs);
        // The tear generator's first draws depend on the seed's low bits: mix them well.
        fs.reboot(Some(
            (crash_at * 4 + seed).wrapping_mul(0x9e37_79b9_7f4a_7c15),
        ));
        let report = check(&fs);
        assert_eq!(
            report.corruption, None,
            "crash at op {crash_at}: a crash is not corruption"
        );
        let (_, seen) = dump(&fs);
        let dyn_fs: Arc<dyn FileSystem> = Arc::new(fs.clone());
        let (wal, recovered) = Wal::open(dyn_fs, dir(), small_config())
            .unwrap_or_else(|e| panic!("crash at op {crash_at}: {e}"));
        assert_eq!(
            report.torn_tail.as_ref().map(|t| t.lsn),
            recovered.torn_tail.as_ref().map(|t| t.0),
            "crash at op {crash_at}: check and recovery see the same torn tail"
        );
        if let (Some(tail), Some((_, cut, _))) = (&report.torn_tail, &recovered.torn_tail) {
            assert!(
                tail.what.contains(&format!("would cut {cut} bytes")),
                "crash at op {crash_at}: the same cut: {tail} vs {cut} bytes"
            );
            torn_seen += 1;
        }
        assert_eq!(
            report.last_index.map_or(0, |i| i.0),
            wal.last_index().0,
            "crash at op {crash_at}"
        );
        assert_eq!(seen.len() as u64, report.entries);
        for (index, term, _, bytes) in &seen {
            assert_eq!((*term, bytes), (term_of(*index), &payload(*index, 0)));
        }
    }
    assert!(
        torn_seen > 0,
        "some crash of the {} tore a record",
        total_ops * 4
    );
}

#[test]
fn an_empty_directory_is_an_empty_clean_report_and_a_missing_one_an_error() {
    let fs = FaultFs::new();
    let report = check(&fs);
    assert_eq!(report, CheckReport::default());
    assert!(inspect::summary(&report).contains("no segment files"));

    let tmp = tempfile::tempdir().unwrap();
    assert_eq!(
        inspect::check(&StdFs, tmp.path()).unwrap(),
        CheckReport::default()
    );
    let missing = tmp.path().join("nope");
    match inspect::check(&StdFs, &missing).unwrap_err() {
        WalError::OpenDir { dir, .. } => assert_eq!(dir, missing),
        other => panic!("expected OpenDir, got {other}"),
    }
    let file = tmp.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    assert!(matches!(
        inspect::dump(&StdFs, &file, |_, _, _, _| {}),
        Err(WalError::OpenDir { .. })
    ));
}

#[test]
fn a_real_directory_is_checked_through_std_fs() {
    let tmp = tempfile::tempdir().unwrap();
    let path: PathBuf = tmp.path().join("data");
    let fs: Arc<dyn FileSystem> = Arc::new(StdFs);
    let (wal, _) = Wal::open(fs, &path, small_config()).unwrap();
    let entries: Vec<Entry> = (1..=40)
        .map(|i| {
            wal.append_next(Term(term_of(i)), &payload(i, 0), Durability::Fsync)
                .unwrap()
        })
        .collect();
    wal.close().unwrap();
    drop(wal);
    std::fs::write(path.join("raft-state"), [1u8; 100]).unwrap();
    std::fs::write(path.join("snapshot"), [2u8; 37]).unwrap();
    std::fs::create_dir(path.join("lost+found")).unwrap();

    let report = inspect::check(&StdFs, &path).unwrap();
    assert_eq!(
        (report.corruption.clone(), report.torn_tail.clone()),
        (None, None)
    );
    assert_eq!(report.entries, 40);
    assert_eq!(report.last_index, Some(Index(40)));
    assert!(report.segments.len() >= 3);
    assert_eq!(
        report.other_files,
        vec![("raft-state".to_owned(), 100), ("snapshot".to_owned(), 37)]
    );
    let mut seen = Vec::new();
    inspect::dump(&StdFs, &path, |index, _, lsn, payload| {
        seen.push((index, lsn, payload.to_vec()));
    })
    .unwrap();
    let expected: Vec<(Index, Lsn, Vec<u8>)> = entries
        .iter()
        .map(|e| (e.index, e.lsn, payload(e.index.0, 0)))
        .collect();
    assert_eq!(seen, expected);
    let text = inspect::summary(&report);
    assert!(text.contains("raft-state: 100 bytes"), "{text}");

    // Flip one payload byte of entry 12 on disk.
    let victim = entries[11];
    let (file, offset) = locate(&report, victim.lsn);
    let segment = path.join(&file);
    let mut bytes = std::fs::read(&segment).unwrap();
    bytes[offset as usize + 32] ^= 0x80;
    std::fs::write(&segment, &bytes).unwrap();
    let report = inspect::check(&StdFs, &path).unwrap();
    let corruption = report.corruption.expect("the flip is found on disk");
    assert_eq!((corruption.file, corruption.file_offset), (file, offset));
    assert_eq!(corruption.lsn, victim.lsn);
    assert_eq!(corruption.last_good_index, Index(11));
    assert_eq!(
        std::fs::read(&segment).unwrap(),
        bytes,
        "nothing was written"
    );
}

/// A file system that lets through only what inspection may do: list and open read-only.
#[derive(Debug)]
struct ReadOnlyFs;

impl FileSystem for ReadOnlyFs {
    fn create_dir_all(&self, dir: &Path) -> std::io::Result<()> {
        panic!("inspection created {}", dir.display())
    }
    fn list(&self, dir: &Path) -> std::io::Result<Vec<String>> {
        StdFs.list(dir)
    }
    fn open(&self, path: &Path) -> std::io::Result<Arc<dyn wal::fs::WalFile>> {
        panic!("inspection opened {} for writing", path.display())
    }
    fn open_read_only(&self, path: &Path) -> std::io::Result<Arc<dyn wal::fs::WalFile>> {
        StdFs.open_read_only(path)
    }
    fn create(&self, path: &Path) -> std::io::Result<Arc<dyn wal::fs::WalFile>> {
        panic!("inspection created {}", path.display())
    }
    fn rename(&self, from: &Path, _: &Path) -> std::io::Result<()> {
        panic!("inspection renamed {}", from.display())
    }
    fn remove(&self, path: &Path) -> std::io::Result<()> {
        panic!("inspection removed {}", path.display())
    }
    fn sync_dir(&self, dir: &Path) -> std::io::Result<()> {
        panic!("inspection synced {}", dir.display())
    }
}

/// `rdmalog check` and `dump` must work on files the operator may only read (another user's
/// data dir, a read-only mount): every file is opened read-only, and such a handle cannot write.
#[test]
fn inspection_opens_every_file_read_only() {
    let tmp = tempfile::tempdir().unwrap();
    let path: PathBuf = tmp.path().join("data");
    let fs: Arc<dyn FileSystem> = Arc::new(StdFs);
    let (wal, _) = Wal::open(fs, &path, small_config()).unwrap();
    for i in 1..=30 {
        wal.append_next(Term(term_of(i)), &payload(i, 0), Durability::Fsync)
            .unwrap();
    }
    wal.close().unwrap();
    drop(wal);
    std::fs::write(path.join("raft-state"), [1u8; 10]).unwrap();

    let report = inspect::check(&ReadOnlyFs, &path).unwrap();
    assert_eq!(report.entries, 30);
    assert_eq!(report.corruption, None);
    let mut n = 0;
    inspect::dump(&ReadOnlyFs, &path, |_, _, _, _| n += 1).unwrap();
    assert_eq!(n, 30);

    let segment = &report.segments[0].name;
    let file = StdFs.open_read_only(&path.join(segment)).unwrap();
    let err = file.write_all_at(b"x", 0).unwrap_err();
    assert_eq!(
        err.raw_os_error(),
        Some(9),
        "a read-only handle refuses writes (EBADF): {err}"
    );
}
