//! Recovery: what [`Wal::open`](super::Wal::open) does to the directory before the log is
//! used (docs/FORMAT.md, section 5).

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::WalError;
use crate::format::{
    self, ChainCheck, DecodeError, HEADER_BYTES, RecordKind, SEGMENT_DATA_OFFSET,
    SEGMENT_HEADER_BYTES, SYNC_FAILED_MARKER_NAME, SegmentHeader, TRUNCATION_MARKER_NAME,
};
use crate::fs::FileSystem;
use crate::marker::{self, Hole};
use crate::segment::{self, BROKEN_SUFFIX, Segment, TEMP_SUFFIX};
use crate::{Index, Lsn, Position};

use super::group_commit::zero_range;
use super::state::Loc;
use super::{RecoveryReport, WalConfig};

/// Entries whose locations are preallocated at open, so that the first appends do not grow
/// the index; 64 Ki entries is 1.5 MiB of index.
const INITIAL_INDEX_CAPACITY: usize = 1 << 16;

/// Bytes past a bad record that the torn-tail check tests for zero at once (a multiple of
/// the 8-byte word it otherwise steps by).
const ZERO_RUN: u64 = 4096;

pub(super) struct Recovered {
    /// Where the log's records begin: the first segment's first Lsn, or the end of its
    /// leading start record.
    pub(super) start: u64,
    pub(super) segments: VecDeque<Arc<Segment>>,
    pub(super) locs: VecDeque<Loc>,
    pub(super) position: Position,
    pub(super) report: RecoveryReport,
}

pub(super) fn recover(
    fs: &dyn FileSystem,
    dir: &Path,
    config: &WalConfig,
) -> Result<Recovered, WalError> {
    let open_dir = |source| WalError::OpenDir {
        dir: dir.to_owned(),
        source,
    };
    fs.create_dir_all(dir).map_err(open_dir)?;
    let mut names = fs.list(dir).map_err(open_dir)?;
    names.sort();
    let mut temps = Vec::new();
    let mut firsts = Vec::new();
    let mut has_marker = false;
    let mut sync_failed = false;
    for name in names {
        if name.ends_with(TEMP_SUFFIX) {
            temps.push(name);
        } else if name == SYNC_FAILED_MARKER_NAME {
            sync_failed = true;
        } else if name == TRUNCATION_MARKER_NAME {
            has_marker = true;
        } else if let Some(lsn) = segment::parse_segment_name(&name) {
            firsts.push(lsn);
        }
    }
    let mut segments = VecDeque::new();
    for first in firsts {
        let path = dir.join(segment::segment_name(first));
        let file = fs.open(&path).map_err(open_dir)?;
        let mut bytes = [0u8; SEGMENT_HEADER_BYTES];
        file.read_exact_at(&mut bytes, 0)
            .map_err(|source| WalError::SegmentRead {
                segment: first,
                lsn: first,
                source,
            })?;
        let header = SegmentHeader::decode(&bytes).map_err(|source| WalError::SegmentHeader {
            path: path.clone(),
            source,
        })?;
        let mismatch = |reason| WalError::SegmentMismatch {
            path: path.clone(),
            reason,
        };
        if header.first_lsn != first {
            return Err(mismatch(
                "the header's first lsn differs from the file name",
            ));
        }
        if header.cluster_id != config.cluster_id {
            return Err(mismatch("the cluster id differs"));
        }
        if u64::from(header.block_bytes) != config.block_bytes {
            return Err(mismatch("the block size differs"));
        }
        segments.push_back(Arc::new(Segment::new(header, path, file)));
    }
    // Segments are deleted before a gap only when a truncation marker dooms them; any other
    // hole refuses the log before anything is deleted (docs/FORMAT.md, section 5, step 1).
    let marker = if has_marker {
        Some(marker::read(fs, dir, false)?)
    } else {
        None
    };
    let ranges: Vec<(u64, u64)> = segments
        .iter()
        .map(|s| (s.first_lsn().0, s.end_lsn().0))
        .collect();
    let layout = marker::layout(&ranges, marker);
    if let Some(hole) = layout.hole {
        return Err(hole_error(dir, &segments, hole));
    }

    let mut report = RecoveryReport::default();
    for name in temps {
        fs.remove(&dir.join(&name)).map_err(open_dir)?;
        report.removed.push(name);
    }
    for segment in segments.drain(..layout.doomed) {
        fs.remove(&segment.path).map_err(open_dir)?;
        report
            .removed
            .push(segment::segment_name(segment.first_lsn()));
    }
    if !report.removed.is_empty() {
        fs.sync_dir(dir).map_err(open_dir)?;
    }
    if marker.is_some() {
        // Only once the deletions it records are durable: a crash before this finishes them
        // again.
        marker::remove(fs, dir).map_err(open_dir)?;
        report.removed.push(TRUNCATION_MARKER_NAME.to_owned());
        tracing::warn!(
            removed = ?report.removed,
            "wal: finished an interrupted prefix truncation or restart"
        );
    }
    if segments.is_empty() {
        let header = SegmentHeader {
            block_bytes: config.block_bytes as u32,
            cluster_id: config.cluster_id,
            first_index: Index(config.start.last_index.0 + 1),
            first_lsn: config.start.lsn,
            prev_term: config.start.last_term,
            data_bytes: config.segment_data_bytes,
            window_bytes: config.max_batch_bytes as u32,
        };
        let segment =
            segment::create_segment(fs, dir, header).map_err(|source| WalError::SegmentCreate {
                segment: config.start.lsn,
                source,
            })?;
        segments.push_back(Arc::new(segment));
    }
    let window = segments
        .iter()
        .map(|s| u64::from(s.header.window_bytes))
        .max()
        .unwrap_or(config.max_batch_bytes);
    let mut recovered = scan(fs, dir, segments, window, report)?;
    if sync_failed {
        rewrite_after_failed_sync(fs, dir, &recovered.segments)?;
        recovered.report.rewritten_after_failed_sync = true;
    }
    Ok(recovered)
}

/// After a failed fdatasync of the log (the previous process left the sync-failure marker),
/// the page cache this open read may hold bytes the disk never got: appended records, or the
/// zeros of a cut whose old records are still on the disk. Linux marked those pages clean, so
/// no fdatasync would write them; a write does. So every segment is read whole and written
/// back, then fdatasynced, before the marker goes: from here on the disk holds what recovery
/// read, and a machine crash cannot bring back a cut branch or leave a hole before records
/// synced later (simulator seeds 319 and 62767, `wal/tests/integration/failed_sync.rs`).
fn rewrite_after_failed_sync(
    fs: &dyn FileSystem,
    dir: &Path,
    segments: &VecDeque<Arc<Segment>>,
) -> Result<(), WalError> {
    let mut bytes = Vec::new();
    for segment in segments {
        let fail = |source| WalError::SegmentRead {
            segment: segment.first_lsn(),
            lsn: segment.first_lsn(),
            source,
        };
        let len = segment.file.size_bytes().map_err(fail)? as usize;
        bytes.resize(len, 0);
        segment.file.read_exact_at(&mut bytes, 0).map_err(fail)?;
        segment.file.write_all_at(&bytes, 0).map_err(fail)?;
        segment.file.sync_data().map_err(fail)?;
    }
    let open_dir = |source| WalError::OpenDir {
        dir: dir.to_owned(),
        source,
    };
    fs.sync_dir(dir).map_err(open_dir)?;
    marker::clear_sync_failure(fs, dir).map_err(open_dir)?;
    tracing::warn!(
        dir = %dir.display(),
        segments = segments.len(),
        "wal: an fdatasync of this log failed before; every segment was rewritten and synced \
         from what recovery read"
    );
    Ok(())
}

/// The error for a hole in the segments that nothing explains.
fn hole_error(dir: &Path, segments: &VecDeque<Arc<Segment>>, hole: Hole) -> WalError {
    let name = |i: usize| segment::segment_name(segments[i].first_lsn());
    match hole {
        Hole::Gap {
            next,
            start,
            end,
            after_marker,
        } => WalError::SegmentGap {
            dir: dir.to_owned(),
            start: Lsn(start),
            end: Lsn(end),
            before: if after_marker {
                TRUNCATION_MARKER_NAME.to_owned()
            } else {
                name(next - 1)
            },
            after: name(next),
        },
        Hole::Overlap { next } => WalError::SegmentMismatch {
            path: segments[next].path.clone(),
            reason: "it starts before the previous segment ends",
        },
        Hole::KeepMissing { keep } => WalError::TruncationKeepMissing {
            path: dir.join(TRUNCATION_MARKER_NAME),
            keep: Lsn(keep),
        },
    }
}

/// Reads a segment's data area (missing bytes read as zero).
///
/// Writes each byte of `buf` once: a buffer of another size is replaced by a zeroed
/// allocation (for a segment-sized one the allocator maps pages the kernel zeroed, with no
/// memset), and a reused one gets only its bytes past the file's end zeroed. Under the lab's
/// TCG a memset of a 64 MiB segment before reading it over cost about a second per open.
fn load(segment: &Segment, buf: &mut Vec<u8>) -> Result<(), WalError> {
    let data = segment.header.data_bytes as usize;
    if buf.len() != data {
        *buf = vec![0; data];
    }
    let len = segment
        .file
        .size_bytes()
        .map_err(|source| WalError::SegmentRead {
            segment: segment.first_lsn(),
            lsn: segment.first_lsn(),
            source,
        })?;
    let have = (len.saturating_sub(SEGMENT_DATA_OFFSET) as usize).min(data);
    segment
        .file
        .read_exact_at(&mut buf[..have], SEGMENT_DATA_OFFSET)
        .map_err(|source| WalError::SegmentRead {
            segment: segment.first_lsn(),
            lsn: segment.first_lsn(),
            source,
        })?;
    buf[have..].fill(0);
    Ok(())
}

fn scan(
    fs: &dyn FileSystem,
    dir: &Path,
    mut segments: VecDeque<Arc<Segment>>,
    window: u64,
    mut report: RecoveryReport,
) -> Result<Recovered, WalError> {
    let first = segments[0].header;
    let block = u64::from(first.block_bytes);
    let mut chain = ChainCheck {
        last_index: Index(first.first_index.0 - 1),
        last_term: first.prev_term,
    };
    let mut locs = VecDeque::with_capacity(INITIAL_INDEX_CAPACITY);
    let mut entry_end = first.first_lsn.0;
    let mut log_start = first.first_lsn.0;
    let mut data = Vec::new();
    let mut bad: Option<(usize, u64, DecodeError)> = None;
    'segments: for (i, segment) in segments.iter().enumerate() {
        if i > 0
            && (segment.header.first_index.0 != chain.last_index.0 + 1
                || segment.header.prev_term != chain.last_term)
        {
            return Err(WalError::SegmentMismatch {
                path: segment.path.clone(),
                reason: "its first index does not continue the previous segment",
            });
        }
        load(segment, &mut data)?;
        let base = segment.first_lsn().0;
        let mut pos = base;
        let end = segment.end_lsn().0;
        while pos < end {
            let rest = format::block_rest(pos, block);
            if rest < HEADER_BYTES as u64 {
                pos += rest;
                continue;
            }
            let bytes = &data[(pos - base) as usize..];
            let checked = format::decode_record(bytes, Lsn(pos), block).and_then(|decoded| {
                chain.advance(&decoded.header)?;
                Ok(decoded)
            });
            let checked = checked.and_then(|decoded| {
                if decoded.header.kind == RecordKind::Start && (i > 0 || pos != base) {
                    return Err(DecodeError::Kind {
                        found: RecordKind::Start as u8,
                    });
                }
                Ok(decoded)
            });
            match checked {
                Ok(decoded) => {
                    if decoded.header.kind == RecordKind::Start {
                        entry_end = pos + decoded.record_len;
                        log_start = entry_end;
                    }
                    if decoded.header.kind == RecordKind::Entry {
                        locs.push_back(Loc {
                            lsn: pos,
                            term: decoded.header.term,
                            record_len: decoded.record_len as u32,
                        });
                        entry_end = pos + decoded.record_len;
                    }
                    pos += decoded.record_len;
                }
                Err(error) => {
                    bad = Some((i, pos, error));
                    break 'segments;
                }
            }
        }
    }
    let position = Position {
        lsn: Lsn(entry_end),
        last_index: chain.last_index,
        last_term: chain.last_term,
    };
    if let Some((i, bad_at, error)) = bad {
        // Look past the bad record: valid records beyond the unsynced window mean corruption;
        // anything else is a torn tail.
        let mut last_valid_end = None;
        let mut last_nonzero_end = bad_at;
        for (k, segment) in segments.iter().enumerate().skip(i) {
            // `data` still holds segment `i`, where the scan above stopped.
            if k > i {
                load(segment, &mut data)?;
            }
            let base = segment.first_lsn().0;
            let from = if k == i { bad_at } else { base };
            let end = segment.end_lsn().0;
            let mut pos = from;
            while pos < end {
                // A preallocated segment is mostly zeros past its last record: skip 4 KiB of
                // them at once (an OR over the run, which vectorises) before looking word by
                // word. The words visited, and what is found, are the same.
                let run_end = (pos + ZERO_RUN).min(end);
                let run = &data[(pos - base) as usize..(run_end - base) as usize];
                if run.iter().fold(0u8, |acc, &b| acc | b) == 0 {
                    pos = run_end;
                    continue;
                }
                while pos < run_end {
                    let off = (pos - base) as usize;
                    if data[off..off + 8] != [0; 8] {
                        last_nonzero_end = pos + 8;
                        if pos > bad_at && format::block_rest(pos, block) >= HEADER_BYTES as u64 {
                            if let Ok(decoded) =
                                format::decode_record(&data[off..], Lsn(pos), block)
                            {
                                last_valid_end = Some(pos + decoded.record_len);
                            }
                        }
                    }
                    pos += 8;
                }
            }
        }
        if let Some(valid_end) = last_valid_end {
            if valid_end - bad_at > window {
                return Err(WalError::Corrupt {
                    segment: segments[i].first_lsn(),
                    lsn: Lsn(bad_at),
                    index: chain.last_index,
                    source: error,
                });
            }
        }
        let cut_end = last_valid_end.unwrap_or(0).max(last_nonzero_end);
        if cut_end > bad_at {
            let path = repair(fs, dir, &mut segments, i, bad_at, cut_end, &mut data)?;
            report.torn_tail = Some((Lsn(bad_at), cut_end - bad_at, path));
            tracing::warn!(lsn = bad_at, bytes = cut_end - bad_at, %error, "wal: cut a torn tail");
        }
    }
    drop_empty_tail_segments(fs, dir, &mut segments, entry_end)?;
    Ok(Recovered {
        start: log_start,
        segments,
        locs,
        position,
        report,
    })
}

/// Deletes the segments that start beyond `entry_end`, the end of the last entry recovered
/// (last-first, each with a directory fsync): they hold no entry, only a header naming the
/// index the next entry was to have. Kept, that header would lie: the log goes on at
/// `entry_end`, in the padding of the segment before them, so their first entry would come
/// later than their header says, and a prefix truncation by their header would keep entries
/// whose records it deleted (simulator seed 627: a torn restart lost the first record of a new
/// segment, and the next entry fit in the previous one). The next rotation makes them again.
fn drop_empty_tail_segments(
    fs: &dyn FileSystem,
    dir: &Path,
    segments: &mut VecDeque<Arc<Segment>>,
    entry_end: u64,
) -> Result<(), WalError> {
    while segments.len() > 1 && segments.back().is_some_and(|s| s.first_lsn().0 > entry_end) {
        let last = segments.pop_back().expect("len checked");
        let fail = |source| WalError::Recover {
            segment: last.first_lsn(),
            lsn: Lsn(entry_end),
            source,
        };
        fs.remove(&last.path).map_err(fail)?;
        fs.sync_dir(dir).map_err(fail)?;
        tracing::info!(
            segment = last.first_lsn().0,
            entry_end,
            "wal: removed a segment that holds no entry after recovery"
        );
    }
    Ok(())
}

/// Cuts `[bad_at, cut_end)`: saves the bytes to `LSN.broken` (`LSN.N.broken` when an earlier
/// repair's file is there), deletes later segments
/// (last-first, each with a directory fsync) and zeroes the rest of segment `i`.
fn repair(
    fs: &dyn FileSystem,
    dir: &Path,
    segments: &mut VecDeque<Arc<Segment>>,
    i: usize,
    bad_at: u64,
    cut_end: u64,
    data: &mut Vec<u8>,
) -> Result<PathBuf, WalError> {
    let segment_lsn = segments[i].first_lsn();
    let fail = |source| WalError::Recover {
        segment: segment_lsn,
        lsn: Lsn(bad_at),
        source,
    };
    // Never over an earlier repair's file: a power cut after that repair removed the later
    // segments leaves fewer bytes to save at the same position, and a later tear may land
    // there again. The first free of `LSN.broken`, `LSN.1.broken`, ...
    let taken = fs.list(dir).map_err(fail)?;
    let path = (0u32..)
        .map(|n| match n {
            0 => format!("{bad_at:020}{BROKEN_SUFFIX}"),
            n => format!("{bad_at:020}.{n}{BROKEN_SUFFIX}"),
        })
        .find(|name| !taken.contains(name))
        .map(|name| dir.join(name))
        .expect("a free name");
    let broken = fs.create(&path).map_err(fail)?;
    let mut written = 0u64;
    for segment in segments.iter().skip(i) {
        let lo = bad_at.max(segment.first_lsn().0);
        let hi = cut_end.min(segment.end_lsn().0);
        if lo >= hi {
            continue;
        }
        load(segment, data)?;
        let base = segment.first_lsn().0;
        broken
            .write_all_at(&data[(lo - base) as usize..(hi - base) as usize], written)
            .map_err(fail)?;
        written += hi - lo;
    }
    broken.sync_data().map_err(fail)?;
    fs.sync_dir(dir).map_err(fail)?;
    while segments.len() > i + 1 {
        let last = segments.pop_back().expect("len checked");
        fs.remove(&last.path).map_err(fail)?;
        fs.sync_dir(dir).map_err(fail)?;
    }
    let segment = &segments[i];
    let hi = cut_end.min(segment.end_lsn().0);
    zero_range(segment, bad_at, hi).map_err(fail)?;
    segment.file.sync_data().map_err(fail)?;
    Ok(path)
}
