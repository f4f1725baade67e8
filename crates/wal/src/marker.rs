//! The truncation marker file: written (atomically, and durably) before a prefix truncation or
//! a restart deletes its first segment, removed once every deletion is durable. Its layout is
//! [`TruncationMarker`]; docs/FORMAT.md, sections 3, 5 and 6, has the protocol and the crash
//! cases.
//!
//! A segment file can go missing in two ways: the directory removals of an interrupted prefix
//! truncation or restart reached the disk in another order than they were made (they are made
//! between two directory fsyncs), or something outside the log deleted or lost it. Only the
//! marker tells the two apart, so recovery deletes segments before a gap only when a marker
//! says they are doomed, and refuses any other gap as corruption.

use std::io;
use std::path::Path;

use crate::error::WalError;
use crate::format::{
    DecodeError, SYNC_FAILED_MARKER_NAME, TRUNCATION_MARKER_BYTES, TRUNCATION_MARKER_NAME,
    TruncationKind, TruncationMarker,
};
use crate::fs::FileSystem;
use crate::segment::TEMP_SUFFIX;

/// Writes `marker` with the rotation protocol: `wal-truncation.tmp`, its bytes, fdatasync,
/// rename to `wal-truncation`, directory fsync. Once it returns, a crash leaves the marker; a
/// failure part way leaves it or not, and the caller must then poison the log (a marker that
/// may exist must not outlive the truncation it records).
pub(crate) fn write(fs: &dyn FileSystem, dir: &Path, marker: TruncationMarker) -> io::Result<()> {
    let temp = dir.join(format!("{TRUNCATION_MARKER_NAME}{TEMP_SUFFIX}"));
    let path = dir.join(TRUNCATION_MARKER_NAME);
    let result = (|| {
        let file = fs.create(&temp)?;
        file.write_all_at(&marker.encode(), 0)?;
        file.sync_data()?;
        fs.rename(&temp, &path)?;
        fs.sync_dir(dir)
    })();
    if result.is_err() {
        let _ = fs.remove(&temp);
    }
    result
}

/// Leaves the sync-failure marker ([`SYNC_FAILED_MARKER_NAME`]) durably: an empty file,
/// fdatasynced, and the directory fsynced. Best effort: the log is already poisoned, and a
/// disk that fails this too is beyond what the next open can repair (the error is logged).
pub(crate) fn record_sync_failure(fs: &dyn FileSystem, dir: &Path) {
    let result = (|| {
        let file = fs.create(&dir.join(SYNC_FAILED_MARKER_NAME))?;
        file.sync_data()?;
        fs.sync_dir(dir)
    })();
    if let Err(e) = result {
        tracing::error!(
            dir = %dir.display(),
            error = %e,
            "wal: cannot record that an fdatasync failed; if the machine crashes before the \
             next open of this log, bytes it read back may be missing from the disk"
        );
    }
}

/// Removes the sync-failure marker and makes the removal durable.
pub(crate) fn clear_sync_failure(fs: &dyn FileSystem, dir: &Path) -> io::Result<()> {
    fs.remove(&dir.join(SYNC_FAILED_MARKER_NAME))?;
    fs.sync_dir(dir)
}

/// Removes the marker and makes the removal durable.
pub(crate) fn remove(fs: &dyn FileSystem, dir: &Path) -> io::Result<()> {
    fs.remove(&dir.join(TRUNCATION_MARKER_NAME))?;
    fs.sync_dir(dir)
}

/// Reads and verifies the marker in `dir` (which lists one), through a read-only handle when
/// `read_only` (for `inspect`).
pub(crate) fn read(
    fs: &dyn FileSystem,
    dir: &Path,
    read_only: bool,
) -> Result<TruncationMarker, WalError> {
    let path = dir.join(TRUNCATION_MARKER_NAME);
    let read_error = |source| WalError::TruncationMarkerRead {
        path: path.clone(),
        source,
    };
    let file = if read_only {
        fs.open_read_only(&path)
    } else {
        fs.open(&path)
    }
    .map_err(read_error)?;
    let size = file.size_bytes().map_err(read_error)?;
    if size != TRUNCATION_MARKER_BYTES as u64 {
        return Err(WalError::TruncationMarker {
            path,
            source: DecodeError::MarkerField { field: "length" },
        });
    }
    let mut bytes = [0u8; TRUNCATION_MARKER_BYTES];
    file.read_exact_at(&mut bytes, 0).map_err(read_error)?;
    TruncationMarker::decode(&bytes).map_err(|source| WalError::TruncationMarker { path, source })
}

/// What a directory's segments are, measured against its truncation marker (if any): how
/// many of them, from the first, the marker dooms, and the first hole among the others.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Layout {
    /// The first `doomed` segments lie before the marker's `keep_lsn`: the interrupted
    /// truncation deletes them.
    pub(crate) doomed: usize,
    /// The first place where the kept segments do not continue each other, if any.
    pub(crate) hole: Option<Hole>,
}

/// A place where the segments kept do not form one contiguous run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Hole {
    /// Nothing holds `[start, end)`, right before segment `next` (an index into the ranges).
    /// `after_marker`: the hole lies between the marker's `keep_lsn` and the first segment
    /// kept, rather than between two segments.
    Gap {
        next: usize,
        start: u64,
        end: u64,
        after_marker: bool,
    },
    /// Segment `next` starts before the previous one ends.
    Overlap { next: usize },
    /// A prefix truncation keeps the log from `keep`, but no segment from there on exists.
    KeepMissing { keep: u64 },
}

/// The rule of recovery and `inspect` (docs/FORMAT.md, section 5, step 1): `ranges` are the
/// segments' `[first_lsn, end_lsn)` in Lsn order. Segments before the marker's `keep_lsn` are
/// doomed; for a prefix truncation the first segment kept starts exactly at `keep_lsn`; the
/// kept segments continue each other. Anything else is a hole that nothing explains.
pub(crate) fn layout(ranges: &[(u64, u64)], marker: Option<TruncationMarker>) -> Layout {
    debug_assert!(
        ranges.windows(2).all(|w| w[0].0 < w[1].0),
        "sorted by first lsn"
    );
    let doomed = marker.map_or(0, |m| ranges.partition_point(|r| r.0 < m.keep_lsn.0));
    let kept = &ranges[doomed..];
    let hole = match marker {
        Some(m) if m.kind == TruncationKind::Prefix => match kept.first() {
            None => Some(Hole::KeepMissing { keep: m.keep_lsn.0 }),
            Some(&(first, _)) if first != m.keep_lsn.0 => Some(Hole::Gap {
                next: doomed,
                start: m.keep_lsn.0,
                end: first,
                after_marker: true,
            }),
            Some(_) => None,
        },
        _ => None,
    };
    let hole = hole.or_else(|| {
        kept.windows(2).enumerate().find_map(|(i, w)| {
            let ((_, end), (first, _)) = (w[0], w[1]);
            let next = doomed + i + 1;
            match end.cmp(&first) {
                std::cmp::Ordering::Equal => None,
                std::cmp::Ordering::Less => Some(Hole::Gap {
                    next,
                    start: end,
                    end: first,
                    after_marker: false,
                }),
                std::cmp::Ordering::Greater => Some(Hole::Overlap { next }),
            }
        })
    });
    Layout { doomed, hole }
}

/// The names the segment files in `[start, end)` would have if each held `data_bytes`, for
/// messages: at most four, then how many more.
pub(crate) fn missing_names(start: u64, end: u64, data_bytes: u64) -> String {
    let firsts: Vec<u64> = (0..)
        .map(|i| start + i * data_bytes.max(1))
        .take_while(|&lsn| lsn < end)
        .take(5)
        .collect();
    let mut names: Vec<String> = firsts
        .iter()
        .take(4)
        .map(|&lsn| crate::segment::segment_name(crate::Lsn(lsn)))
        .collect();
    if firsts.len() > 4 {
        let total = (end - start).div_ceil(data_bytes.max(1));
        names.push(format!("{} more", total - 4));
    }
    names.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Lsn;

    const SEGMENTS: [(u64, u64); 4] = [(0, 100), (100, 200), (200, 300), (300, 400)];

    fn prefix(keep: u64) -> Option<TruncationMarker> {
        Some(TruncationMarker {
            kind: TruncationKind::Prefix,
            keep_lsn: Lsn(keep),
        })
    }

    #[test]
    fn contiguous_segments_without_a_marker_are_the_log() {
        assert_eq!(
            layout(&SEGMENTS, None),
            Layout {
                doomed: 0,
                hole: None
            }
        );
        assert_eq!(layout(&[], None).hole, None);
    }

    #[test]
    fn a_gap_without_a_marker_is_a_hole_even_where_a_truncation_could_have_left_it() {
        let ranges = [SEGMENTS[0], SEGMENTS[2], SEGMENTS[3]];
        assert_eq!(
            layout(&ranges, None),
            Layout {
                doomed: 0,
                hole: Some(Hole::Gap {
                    next: 1,
                    start: 100,
                    end: 200,
                    after_marker: false
                })
            }
        );
    }

    #[test]
    fn a_prefix_marker_dooms_what_lies_before_it_in_any_subset() {
        // Removals made in order 0, 1, 2 reached the disk as 1 only.
        let ranges = [SEGMENTS[0], SEGMENTS[2], SEGMENTS[3]];
        assert_eq!(
            layout(&ranges, prefix(300)),
            Layout {
                doomed: 2,
                hole: None
            }
        );
        assert_eq!(layout(&SEGMENTS, prefix(300)).doomed, 3);
        assert_eq!(layout(&SEGMENTS[3..], prefix(300)).doomed, 0);
    }

    #[test]
    fn a_prefix_marker_needs_its_kept_segment_and_a_contiguous_rest() {
        assert_eq!(
            layout(&[SEGMENTS[0], SEGMENTS[3]], prefix(200)).hole,
            Some(Hole::Gap {
                next: 1,
                start: 200,
                end: 300,
                after_marker: true
            })
        );
        assert_eq!(
            layout(&[SEGMENTS[0]], prefix(200)).hole,
            Some(Hole::KeepMissing { keep: 200 })
        );
        assert_eq!(
            layout(&[SEGMENTS[1], SEGMENTS[3]], prefix(100)).hole,
            Some(Hole::Gap {
                next: 1,
                start: 200,
                end: 300,
                after_marker: false
            })
        );
    }

    #[test]
    fn a_restart_marker_dooms_every_old_segment_and_needs_none_kept() {
        let restart = Some(TruncationMarker {
            kind: TruncationKind::Restart,
            keep_lsn: Lsn(400),
        });
        assert_eq!(
            layout(&[SEGMENTS[1], SEGMENTS[3]], restart),
            Layout {
                doomed: 2,
                hole: None
            }
        );
    }

    #[test]
    fn overlapping_segments_are_a_hole_too() {
        assert_eq!(
            layout(&[(0, 200), (100, 300)], None).hole,
            Some(Hole::Overlap { next: 1 })
        );
    }

    #[test]
    fn missing_names_assume_the_previous_segment_size() {
        assert_eq!(missing_names(2048, 4096, 2048), "00000000000000002048.wal");
        assert_eq!(
            missing_names(0, 14, 2),
            "00000000000000000000.wal, 00000000000000000002.wal, 00000000000000000004.wal, \
             00000000000000000006.wal, 3 more"
        );
    }
}
