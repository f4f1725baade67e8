//! Offline inspection of a log directory, for `rdmalog dump` and `rdmalog check`.
//!
//! [`check`] walks every segment read-only, the way recovery does (docs/FORMAT.md, section 5),
//! and verifies every record: the header checks, the crc32c, the Lsn tag, the index chain
//! within and across segments, each segment header (magic, version, crc, ranges), its
//! agreement with the file name, and the cluster id and block size against the first segment.
//! It never writes, deletes or repairs anything; where recovery would change the directory,
//! the report says what it would do instead.
//!
//! At the first record that does not verify, it looks past it as recovery does: a valid record
//! that ends more than one unsynced window (`window_bytes`) after the bad one means the bad one
//! was once durable, which is **corruption** ([`CheckReport::corruption`]); otherwise, if any
//! non-zero byte follows, it is a **torn tail** that recovery would cut and keep in a `.broken`
//! file ([`CheckReport::torn_tail`]); otherwise the log simply ends there. A segment header
//! that recovery would refuse is corruption too.
//!
//! So is a hole in the segments' Lsn ranges that no interrupted truncation explains (a
//! segment file deleted or lost from the middle of the log): recovery refuses such a log, and
//! the report names the missing Lsn range and the files around it. Only a truncation marker
//! (`wal-truncation`, docs/FORMAT.md, section 3) dooms segments: those before its kept Lsn
//! are leftovers that recovery deletes ([`CheckReport::doomed`]).
//!
//! Segment data is read one block at a time (records never cross a block), so memory stays at
//! one block (at most 64 MiB, 1 MiB by default) whatever the segment size.
//!
//! A directory that exists but holds no segment file gives an empty, clean report (recovery
//! would start a new log there); [`summary`] says so. A directory that cannot be listed (it
//! does not exist, or is not a directory) is [`WalError::OpenDir`].
//!
//! Files are opened through [`FileSystem::open`], which opens for reading and writing, so the
//! caller needs write permission on the segment files even though nothing is written. Run it
//! on a stopped node: a running one may be mid-batch, which reads as a torn tail.

use std::fmt;
use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;

use crate::error::WalError;
use crate::format::{
    self, ChainCheck, DecodeError, EntryHeader, HEADER_BYTES, RecordKind, SEGMENT_DATA_OFFSET,
    SEGMENT_HEADER_BYTES, SYNC_FAILED_MARKER_NAME, SegmentHeader, TRUNCATION_MARKER_NAME,
};
use crate::fs::{FileSystem, WalFile};
use crate::marker::{self, Hole};
use crate::segment::{self, BROKEN_SUFFIX, TEMP_SUFFIX};
use crate::{Index, Lsn, Term};

/// One segment file of the log, as found by [`check`] or [`dump`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentInfo {
    /// The file name (`<first lsn, 20 digits>.wal`).
    pub name: String,
    /// Lsn of the first data byte, from the header.
    pub first_lsn: Lsn,
    /// Index of the first entry the segment holds (or would hold), from the header.
    pub first_index: Index,
    /// Term of the entry before `first_index`, from the header.
    pub prev_term: Term,
    /// Valid entries found in the segment (up to the first invalid record of the log).
    pub entries: u64,
    /// Index of the last valid entry in the segment, if it holds any.
    pub last_index: Option<Index>,
    /// Bytes of the data area up to the end of the last valid record in the segment (entry,
    /// padding or start record).
    pub bytes_used: u64,
    /// Size of the data area, from the header.
    pub data_bytes: u64,
}

/// Where and why a log stops verifying.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Corruption {
    /// The segment file name.
    pub file: String,
    /// Byte offset in that file: the bad record's start, or the bad segment header field.
    pub file_offset: u64,
    /// Stream position of the bad record (for a bad segment header: the segment's first Lsn,
    /// from its name).
    pub lsn: Lsn,
    /// Index of the last entry that verified before it (for a bad first segment header, whose
    /// chain start is unknown: 0).
    pub last_good_index: Index,
    /// What is wrong, in words.
    pub what: String,
}

impl fmt::Display for Corruption {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} at byte {} ({}): {}; last good index {}",
            self.file, self.file_offset, self.lsn, self.what, self.last_good_index.0
        )
    }
}

/// What [`check`] or [`dump`] found in a log directory.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CheckReport {
    /// The segments of the log, in Lsn order, whose headers could be decoded (including those
    /// after the first invalid record, which hold no counted entries).
    pub segments: Vec<SegmentInfo>,
    /// Every other file in the directory with its size in bytes, by name: `raft-state`,
    /// `snapshot`, `*.tmp`, `*.broken`, `wal-truncation`, the segments it dooms and segment
    /// files whose header cannot be decoded. Entries that cannot be opened as files (a
    /// subdirectory such as `lost+found`) are left out.
    pub other_files: Vec<(String, u64)>,
    /// Segment files that an interrupted prefix truncation or restart doomed, by name: those
    /// before the Lsn that its marker (`wal-truncation`) keeps. Recovery deletes them; they
    /// are listed in `other_files` too.
    pub doomed: Vec<String>,
    /// Valid entries in the log, up to the first invalid record.
    pub entries: u64,
    /// Index of the first valid entry, if there is one.
    pub first_index: Option<Index>,
    /// Index of the last valid entry, if there is one.
    pub last_index: Option<Index>,
    /// The first corruption: a bad record followed by valid records beyond the unsynced
    /// window, a segment header that recovery refuses, a hole in the segments' Lsn ranges
    /// that no interrupted truncation explains, or an invalid truncation marker. Recovery
    /// would fail on this log.
    pub corruption: Option<Corruption>,
    /// A bad record with nothing valid beyond the unsynced window after it: recovery would cut
    /// it (and everything after it) and keep the bytes in a `.broken` file.
    pub torn_tail: Option<Corruption>,
}

/// Walks every segment in `dir` read-only and verifies every record (header checks, crc32c,
/// Lsn tag, index chain across segments, segment header and name agreement, cluster id/block
/// size consistency between segments). Never writes or repairs anything.
///
/// Data problems are reported in the [`CheckReport`]; an error means the directory or a
/// segment could not be read at all.
pub fn check(fs: &dyn FileSystem, dir: &Path) -> Result<CheckReport, WalError> {
    walk(fs, dir, &mut |_, _, _, _| {})
}

/// Calls `each(index, term, lsn, payload)` for every valid entry in order (stops at the first
/// invalid record), and returns the same report as [`check`].
pub fn dump(
    fs: &dyn FileSystem,
    dir: &Path,
    mut each: impl FnMut(Index, Term, Lsn, &[u8]),
) -> Result<CheckReport, WalError> {
    walk(fs, dir, &mut each)
}

/// A short multi-line text for the CLI: a table of the segments, the other files, the totals
/// and the verdict.
pub fn summary(report: &CheckReport) -> String {
    let mut out = String::new();
    if report.segments.is_empty() {
        out.push_str("no segment files: the log is empty (or this is not a data directory)\n");
    } else {
        let mut rows = vec![[
            "segment".to_owned(),
            "first lsn".to_owned(),
            "first index".to_owned(),
            "prev term".to_owned(),
            "entries".to_owned(),
            "last index".to_owned(),
            "used bytes".to_owned(),
            "data bytes".to_owned(),
        ]];
        for s in &report.segments {
            rows.push([
                s.name.clone(),
                s.first_lsn.0.to_string(),
                s.first_index.0.to_string(),
                s.prev_term.0.to_string(),
                s.entries.to_string(),
                s.last_index
                    .map_or_else(|| "-".to_owned(), |i| i.0.to_string()),
                s.bytes_used.to_string(),
                s.data_bytes.to_string(),
            ]);
        }
        let mut widths = [0usize; 8];
        for row in &rows {
            for (width, cell) in widths.iter_mut().zip(row) {
                *width = (*width).max(cell.len());
            }
        }
        for row in &rows {
            let mut line = format!("{:<w$}", row[0], w = widths[0]);
            for (cell, width) in row.iter().zip(widths).skip(1) {
                let _ = write!(line, "  {cell:>width$}");
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
    }
    if !report.other_files.is_empty() {
        out.push_str("other files:\n");
        for (name, size) in &report.other_files {
            let _ = write!(out, "  {name}: {size} bytes");
            if let Some(note) = other_file_note(name, report) {
                let _ = write!(out, " ({note})");
            }
            out.push('\n');
        }
    }
    let _ = write!(
        out,
        "{} segment{}, {} entr{}",
        report.segments.len(),
        if report.segments.len() == 1 { "" } else { "s" },
        report.entries,
        if report.entries == 1 { "y" } else { "ies" },
    );
    if let (Some(first), Some(last)) = (report.first_index, report.last_index) {
        let _ = write!(out, ", index {} ..= {}", first.0, last.0);
    }
    out.push('\n');
    if let Some(torn) = &report.torn_tail {
        let _ = writeln!(out, "torn tail: {torn}");
    }
    match &report.corruption {
        Some(corruption) => {
            let _ = writeln!(out, "CORRUPT: {corruption}");
        }
        None if report.torn_tail.is_some() => {
            out.push_str("ok, except for the torn tail, which recovery cuts at the next open\n");
        }
        None => out.push_str("ok: every record verifies\n"),
    }
    out
}

fn other_file_note(name: &str, report: &CheckReport) -> Option<&'static str> {
    if name.ends_with(TEMP_SUFFIX) {
        Some("unfinished; recovery deletes it")
    } else if name.ends_with(BROKEN_SUFFIX) {
        Some("bytes cut from a torn tail")
    } else if name == TRUNCATION_MARKER_NAME {
        Some("a prefix truncation or restart was interrupted; recovery finishes it")
    } else if name == SYNC_FAILED_MARKER_NAME {
        Some(
            "an fdatasync of the log failed; the next open rewrites and syncs every segment \
             before it trusts them",
        )
    } else if report.doomed.iter().any(|d| d == name) {
        Some(
            "doomed by the interrupted truncation that wal-truncation records; recovery \
             deletes it",
        )
    } else if segment::parse_segment_name(name).is_some() {
        Some("its segment header is invalid")
    } else {
        None
    }
}

/// The per-entry callback of [`dump`]: index, term, Lsn, payload.
type EachEntry<'a> = dyn FnMut(Index, Term, Lsn, &[u8]) + 'a;

/// A segment file as listed, before its header is trusted.
#[derive(Debug)]
struct Listed {
    name: String,
    /// First Lsn, from the name.
    named_lsn: Lsn,
    file: Arc<dyn WalFile>,
    /// File size in bytes; data past it reads as zero, as in recovery.
    size: u64,
    /// The decoded header, if it decodes.
    header: Option<SegmentHeader>,
    /// The first problem with the header: (file offset, what).
    problem: Option<(u64, String)>,
}

/// Where the record walk stopped.
#[derive(Debug)]
enum Stop {
    /// A record at `lsn` of walked segment `seg` does not verify.
    Record { seg: usize, lsn: u64, what: String },
    /// Walked segment `seg`'s header does not continue the chain.
    Chain {
        seg: usize,
        offset: u64,
        what: String,
    },
}

/// What follows a bad record.
#[derive(Debug)]
enum Beyond {
    /// Only zeros: the log ends at the bad record.
    Nothing,
    /// Non-zero bytes, but no valid record beyond the window: recovery cuts up to `cut_end`.
    Torn { cut_end: u64 },
    /// A valid record at `lsn`, ending beyond the window after the bad one.
    Valid { lsn: u64 },
}

fn walk(
    fs: &dyn FileSystem,
    dir: &Path,
    each: &mut EachEntry<'_>,
) -> Result<CheckReport, WalError> {
    let mut names = fs.list(dir).map_err(|source| WalError::OpenDir {
        dir: dir.to_owned(),
        source,
    })?;
    names.sort();
    let mut report = CheckReport::default();
    let mut listed = Vec::new();
    for name in names {
        let path = dir.join(&name);
        match segment::parse_segment_name(&name) {
            Some(named_lsn) => {
                let read_error = |source| WalError::SegmentRead {
                    segment: named_lsn,
                    lsn: named_lsn,
                    source,
                };
                let file = fs.open_read_only(&path).map_err(read_error)?;
                let size = file.size_bytes().map_err(read_error)?;
                let mut bytes = [0u8; SEGMENT_HEADER_BYTES];
                let have = size.min(SEGMENT_HEADER_BYTES as u64) as usize;
                file.read_exact_at(&mut bytes[..have], 0)
                    .map_err(read_error)?;
                let (header, problem) = match SegmentHeader::decode(&bytes[..have]) {
                    Ok(header) => (Some(header), None),
                    Err(error) => (None, Some((0, format!("invalid segment header: {error}")))),
                };
                listed.push(Listed {
                    name,
                    named_lsn,
                    file,
                    size,
                    header,
                    problem,
                });
            }
            None => {
                // Not part of the log; a subdirectory (lost+found) does not open as a file.
                if let Ok(size) = fs.open_read_only(&path).and_then(|file| file.size_bytes()) {
                    report.other_files.push((name, size));
                }
            }
        }
    }

    // Header checks that need no chain: name agreement, and the same cluster and block size
    // as the first segment.
    let reference = listed.iter().find_map(|l| l.header);
    for l in &mut listed {
        let (Some(header), Some(reference)) = (l.header, reference) else {
            continue;
        };
        l.problem = if header.first_lsn != l.named_lsn {
            Some((
                format::SEGMENT_FIRST_LSN_OFFSET as u64,
                format!(
                    "the segment header's first lsn {} differs from the file name",
                    header.first_lsn.0
                ),
            ))
        } else if header.cluster_id != reference.cluster_id {
            Some((
                format::SEGMENT_CLUSTER_ID_OFFSET as u64,
                format!(
                    "the segment header's cluster id {} differs from the first segment's {}",
                    header.cluster_id, reference.cluster_id
                ),
            ))
        } else if header.block_bytes != reference.block_bytes {
            Some((
                format::SEGMENT_BLOCK_BYTES_OFFSET as u64,
                format!(
                    "the segment header's block size {} differs from the first segment's {}",
                    header.block_bytes, reference.block_bytes
                ),
            ))
        } else {
            None
        };
    }
    let first_bad = listed.iter().position(|l| l.problem.is_some());

    // Only a truncation marker dooms segments; any other hole in the Lsn ranges is
    // corruption (docs/FORMAT.md, section 5, step 1). The layout is that of the segments
    // before the first bad header, which recovery refuses anyway. An invalid marker dooms
    // nothing, and is reported before the holes its segments then leave.
    let has_marker = report
        .other_files
        .iter()
        .any(|(n, _)| n == TRUNCATION_MARKER_NAME);
    let (marker, marker_problem) = if has_marker {
        match marker::read(fs, dir, true) {
            Ok(marker) => (Some(marker), None),
            Err(WalError::TruncationMarker { source, .. }) => (None, Some(source)),
            Err(error) => return Err(error),
        }
    } else {
        (None, None)
    };
    let sound = first_bad.unwrap_or(listed.len());
    let ranges: Vec<(u64, u64)> = listed[..sound]
        .iter()
        .filter_map(|l| l.header)
        .map(|h| (h.first_lsn.0, h.first_lsn.0 + h.data_bytes))
        .collect();
    let layout = marker::layout(&ranges, marker);
    let keep_from = layout.doomed;
    let kept = listed.split_off(keep_from);
    for leftover in listed {
        report.doomed.push(leftover.name.clone());
        report.other_files.push((leftover.name, leftover.size));
    }
    for l in &kept {
        match l.header {
            Some(header) => report.segments.push(SegmentInfo {
                name: l.name.clone(),
                first_lsn: header.first_lsn,
                first_index: header.first_index,
                prev_term: header.prev_term,
                entries: 0,
                last_index: None,
                bytes_used: 0,
                data_bytes: header.data_bytes,
            }),
            None => report.other_files.push((l.name.clone(), l.size)),
        }
    }
    report.other_files.sort();

    // The record walk covers the segments before the first hole and the first bad header;
    // they all have sound headers, and walked segment `i` is `report.segments[i]`.
    let hole_at = match layout.hole {
        Some(Hole::Gap { next, .. } | Hole::Overlap { next }) => next,
        Some(Hole::KeepMissing { .. }) => keep_from,
        None => sound,
    };
    let walked_len = hole_at.min(sound) - keep_from;
    let walked: Vec<(&Listed, SegmentHeader)> = kept[..walked_len]
        .iter()
        .filter_map(|l| l.header.map(|h| (l, h)))
        .collect();
    // The chain starts before the first kept segment (the first walked one, if any).
    let mut chain = match kept.first().and_then(|l| l.header) {
        Some(h) => ChainCheck {
            last_index: Index(h.first_index.0.wrapping_sub(1)),
            last_term: h.prev_term,
        },
        None => ChainCheck {
            last_index: Index(0),
            last_term: Term(0),
        },
    };
    let mut buf = Vec::new();
    let stop = walk_records(&walked, &mut chain, &mut report, &mut buf, each)?;

    match stop {
        Some(Stop::Chain { seg, offset, what }) => {
            let (l, header) = walked[seg];
            report.corruption = Some(Corruption {
                file: l.name.clone(),
                file_offset: offset,
                lsn: header.first_lsn,
                last_good_index: chain.last_index,
                what,
            });
        }
        Some(Stop::Record { seg, lsn, what }) => {
            let window = walked
                .iter()
                .map(|(_, h)| u64::from(h.window_bytes))
                .max()
                .unwrap_or(0);
            let (l, header) = walked[seg];
            let at = |what| Corruption {
                file: l.name.clone(),
                file_offset: SEGMENT_DATA_OFFSET + (lsn - header.first_lsn.0),
                lsn: Lsn(lsn),
                last_good_index: chain.last_index,
                what,
            };
            match look_past(&walked[seg..], lsn, window, &mut buf)? {
                Beyond::Nothing => {}
                Beyond::Torn { cut_end } => {
                    report.torn_tail = Some(at(format!(
                        "{what}; nothing valid follows beyond the {window}-byte unsynced window, so \
                         recovery would cut {} bytes as a torn tail",
                        cut_end - lsn
                    )));
                }
                Beyond::Valid { lsn: valid } => {
                    report.corruption = Some(at(format!(
                        "{what}; a valid record follows at lsn {valid}, beyond the {window}-byte \
                         unsynced window, so this is not a torn write"
                    )));
                }
            }
        }
        None => {}
    }
    if report.corruption.is_none() {
        if let Some(source) = marker_problem {
            report.corruption = Some(Corruption {
                file: TRUNCATION_MARKER_NAME.to_owned(),
                file_offset: 0,
                lsn: Lsn(0),
                last_good_index: chain.last_index,
                what: format!(
                    "the truncation marker is invalid ({source}), so recovery cannot tell which \
                     segments an interrupted truncation doomed, and refuses to open the log"
                ),
            });
        }
    }
    if report.corruption.is_none() {
        if let Some(hole) = layout.hole {
            report.corruption = Some(hole_corruption(hole, &kept, keep_from, chain.last_index));
        }
    }
    if report.corruption.is_none() {
        if let Some(bad) = first_bad {
            let l = &kept[bad - keep_from];
            let (offset, what) = l.problem.clone().unwrap_or_default();
            report.corruption = Some(Corruption {
                file: l.name.clone(),
                file_offset: offset,
                lsn: l.named_lsn,
                last_good_index: chain.last_index,
                what,
            });
        }
    }
    Ok(report)
}

/// Describes a hole in the segments' Lsn ranges as recovery sees it: `kept` are the listed
/// segments from index `keep_from` of the layout on.
fn hole_corruption(hole: Hole, kept: &[Listed], keep_from: usize, last_good: Index) -> Corruption {
    const REFUSED: &str = "recovery refuses to open the log and deletes nothing; restore the \
                           missing file, or else remove the node from the cluster, delete its \
                           data directory and add it back as a new member (or restart it on the \
                           emptied directory under its old id: it then waits for every other \
                           voter's term before it votes, and catches up from the leader)";
    let header = |i: usize| {
        kept[i - keep_from]
            .header
            .expect("only sound headers are laid out")
    };
    match hole {
        Hole::Gap {
            next,
            start,
            end,
            after_marker,
        } => {
            let before = if after_marker {
                format!(
                    "{TRUNCATION_MARKER_NAME} (an interrupted prefix truncation that keeps the \
                     log from lsn {start})"
                )
            } else {
                kept[next - 1 - keep_from].name.clone()
            };
            let data_bytes = if after_marker {
                header(next).data_bytes
            } else {
                header(next - 1).data_bytes
            };
            let after = &kept[next - keep_from].name;
            Corruption {
                file: after.clone(),
                file_offset: format::SEGMENT_FIRST_LSN_OFFSET as u64,
                lsn: Lsn(start),
                last_good_index: last_good,
                what: format!(
                    "nothing holds lsn {start} to {end}: segment files are missing between \
                     {before} and {after} (by the segment size, {}), and no interrupted prefix \
                     truncation explains the gap; {REFUSED}",
                    marker::missing_names(start, end, data_bytes)
                ),
            }
        }
        Hole::Overlap { next } => {
            let previous = header(next - 1);
            Corruption {
                file: kept[next - keep_from].name.clone(),
                file_offset: format::SEGMENT_FIRST_LSN_OFFSET as u64,
                lsn: header(next).first_lsn,
                last_good_index: last_good,
                what: format!(
                    "the segment starts before {}, the previous segment, ends at lsn {}; {REFUSED}",
                    kept[next - 1 - keep_from].name,
                    previous.first_lsn.0 + previous.data_bytes
                ),
            }
        }
        Hole::KeepMissing { keep } => Corruption {
            file: TRUNCATION_MARKER_NAME.to_owned(),
            file_offset: 0,
            lsn: Lsn(keep),
            last_good_index: last_good,
            what: format!(
                "an interrupted prefix truncation keeps the log from lsn {keep}, but no segment \
                 file from there on exists; {REFUSED}"
            ),
        },
    }
}

/// Verifies the records of `walked` in order, feeding every valid entry to `each` and the
/// counts into `report`, until the first record or segment header that does not verify.
fn walk_records(
    walked: &[(&Listed, SegmentHeader)],
    chain: &mut ChainCheck,
    report: &mut CheckReport,
    buf: &mut Vec<u8>,
    each: &mut EachEntry<'_>,
) -> Result<Option<Stop>, WalError> {
    for (seg, &(l, header)) in walked.iter().enumerate() {
        if seg > 0 {
            let expected = chain.last_index.0.wrapping_add(1);
            if header.first_index.0 != expected {
                return Ok(Some(Stop::Chain {
                    seg,
                    offset: format::SEGMENT_FIRST_INDEX_OFFSET as u64,
                    what: format!(
                        "the segment header's first index {} does not continue the previous \
                         segment, whose last entry is index {}",
                        header.first_index.0, chain.last_index.0
                    ),
                }));
            }
            if header.prev_term != chain.last_term {
                return Ok(Some(Stop::Chain {
                    seg,
                    offset: format::SEGMENT_PREV_TERM_OFFSET as u64,
                    what: format!(
                        "the segment header's previous term {} differs from the term {} of the \
                         previous segment's last entry",
                        header.prev_term.0, chain.last_term.0
                    ),
                }));
            }
        }
        let block = u64::from(header.block_bytes);
        let base = header.first_lsn.0;
        let end = base + header.data_bytes;
        let mut block_start = base;
        while block_start < end {
            read_block(l, header, block_start, buf)?;
            let block_end = block_start + block;
            let mut pos = block_start;
            // Fewer than a header's bytes before the block end are skipped implicitly.
            while block_end - pos >= HEADER_BYTES as u64 {
                let bytes = &buf[(pos - block_start) as usize..];
                let decoded = match verify(bytes, pos, block, chain, seg == 0 && pos == base) {
                    Ok(decoded) => decoded,
                    Err(what) => {
                        return Ok(Some(Stop::Record {
                            seg,
                            lsn: pos,
                            what,
                        }));
                    }
                };
                if decoded.header.kind == RecordKind::Entry {
                    let index = decoded.header.index;
                    each(index, decoded.header.term, Lsn(pos), decoded.payload);
                    let info = &mut report.segments[seg];
                    info.entries += 1;
                    info.last_index = Some(index);
                    report.entries += 1;
                    report.first_index.get_or_insert(index);
                    report.last_index = Some(index);
                }
                pos += decoded.record_len;
                report.segments[seg].bytes_used = pos - base;
            }
            block_start = block_end;
        }
    }
    Ok(None)
}

/// Checks the record at `pos` as recovery does: decoding (bounds, header, Lsn tag, crc32c),
/// the index chain, and that a start record is the log's very first record. On failure,
/// describes what is wrong.
fn verify<'a>(
    bytes: &'a [u8],
    pos: u64,
    block: u64,
    chain: &mut ChainCheck,
    first_of_log: bool,
) -> Result<format::Decoded<'a>, String> {
    let describe = |error: DecodeError| match error {
        DecodeError::Empty => {
            "the record header is all zero (no record was written here)".to_owned()
        }
        error => format!("{}: {error}", claimed(bytes)),
    };
    let decoded = format::decode_record(bytes, Lsn(pos), block).map_err(describe)?;
    if decoded.header.kind == RecordKind::Start && !first_of_log {
        return Err(format!(
            "{}: a start record is valid only as the first record of the first segment",
            claimed(bytes)
        ));
    }
    chain.advance(&decoded.header).map_err(describe)?;
    Ok(decoded)
}

/// What the header at the start of `bytes` claims to be, for messages.
fn claimed(bytes: &[u8]) -> String {
    let mut head = [0u8; HEADER_BYTES];
    let Some(src) = bytes.get(..HEADER_BYTES) else {
        return "a truncated record".to_owned();
    };
    head.copy_from_slice(src);
    match EntryHeader::decode(&head, u64::MAX) {
        Ok(h) => {
            let kind = match h.kind {
                RecordKind::Entry => "entry",
                RecordKind::Padding => "padding",
                RecordKind::Start => "start",
            };
            format!(
                "{kind} record claiming index {}, term {}, {} payload bytes",
                h.index.0, h.term.0, h.payload_len
            )
        }
        Err(_) => "an unreadable record header".to_owned(),
    }
}

/// Reads the block at stream position `block_start` of a segment into `buf` (one block long);
/// bytes past the end of the file read as zero, as in recovery. Returns how many bytes came
/// from the file.
fn read_block(
    l: &Listed,
    header: SegmentHeader,
    block_start: u64,
    buf: &mut Vec<u8>,
) -> Result<usize, WalError> {
    let block = u64::from(header.block_bytes);
    let offset = SEGMENT_DATA_OFFSET + (block_start - header.first_lsn.0);
    let have = l.size.saturating_sub(offset).min(block) as usize;
    buf.resize(block as usize, 0);
    buf[have..].fill(0);
    l.file
        .read_exact_at(&mut buf[..have], offset)
        .map_err(|source| WalError::SegmentRead {
            segment: header.first_lsn,
            lsn: Lsn(block_start),
            source,
        })?;
    Ok(have)
}

/// Looks past the bad record at `bad_at` (in `walked[0]`) to the end of the last segment, as
/// recovery does: at every 8-byte position for non-zero bytes and valid records.
fn look_past(
    walked: &[(&Listed, SegmentHeader)],
    bad_at: u64,
    window: u64,
    buf: &mut Vec<u8>,
) -> Result<Beyond, WalError> {
    let mut last_valid = None;
    let mut last_nonzero_end = bad_at;
    for &(l, header) in walked {
        let block = u64::from(header.block_bytes);
        let base = header.first_lsn.0;
        let end = base + header.data_bytes;
        let mut block_start = if bad_at >= base {
            bad_at - (bad_at - base) % block
        } else {
            base
        };
        while block_start < end {
            let have = read_block(l, header, block_start, buf)?;
            let block_end = block_start + block;
            // Most of what follows the end of a log is zeros (preallocated or zeroed ahead).
            if have == 0 || buf.iter().all(|&b| b == 0) {
                block_start = block_end;
                continue;
            }
            let from = bad_at.max(block_start);
            for pos in (from..block_end).step_by(8) {
                let off = (pos - block_start) as usize;
                if buf[off..off + 8] == [0; 8] {
                    continue;
                }
                last_nonzero_end = pos + 8;
                if pos > bad_at && block_end - pos >= HEADER_BYTES as u64 {
                    if let Ok(decoded) = format::decode_record(&buf[off..], Lsn(pos), block) {
                        last_valid = Some((pos, pos + decoded.record_len));
                        // Every valid record found from here on ends beyond the window too,
                        // so recovery's verdict is already certain.
                        if pos - bad_at >= window {
                            return Ok(Beyond::Valid { lsn: pos });
                        }
                    }
                }
            }
            block_start = block_end;
        }
    }
    if let Some((lsn, valid_end)) = last_valid {
        if valid_end - bad_at > window {
            return Ok(Beyond::Valid { lsn });
        }
    }
    let cut_end = last_valid.map_or(0, |(_, end)| end).max(last_nonzero_end);
    Ok(if cut_end > bad_at {
        Beyond::Torn { cut_end }
    } else {
        Beyond::Nothing
    })
}
