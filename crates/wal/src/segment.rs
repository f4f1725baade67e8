//! One preallocated segment file: naming, creation (with the rotation protocol) and I/O.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use crate::Lsn;
use crate::format::{SEGMENT_DATA_OFFSET, SegmentHeader};
use crate::fs::{FileSystem, WalFile};

/// Suffix of a segment file. Names are the first Lsn, zero-padded to 20 decimal digits (the
/// width of `u64::MAX`), so that lexical order is Lsn order.
pub(crate) const SEGMENT_SUFFIX: &str = ".wal";
/// Suffix of a segment being created; such files are never part of the log and recovery
/// deletes them.
pub(crate) const TEMP_SUFFIX: &str = ".tmp";
/// Suffix of the file that keeps the bytes cut from a torn tail.
pub(crate) const BROKEN_SUFFIX: &str = ".broken";

#[derive(Debug)]
pub(crate) struct Segment {
    pub(crate) header: SegmentHeader,
    pub(crate) path: PathBuf,
    pub(crate) file: Arc<dyn WalFile>,
    /// Stream position up to which the data area holds written bytes (records or zeroes)
    /// rather than preallocated, unwritten extents. Only a sync leader or an exclusive
    /// operation moves it, so relaxed ordering is enough; it only ever grows.
    pub(crate) zeroed_to: AtomicU64,
}

impl Segment {
    pub(crate) fn new(header: SegmentHeader, path: PathBuf, file: Arc<dyn WalFile>) -> Self {
        let zeroed_to = AtomicU64::new(header.first_lsn.0);
        Self {
            header,
            path,
            file,
            zeroed_to,
        }
    }

    pub(crate) fn first_lsn(&self) -> Lsn {
        self.header.first_lsn
    }

    /// One past the last data byte this segment can hold.
    pub(crate) fn end_lsn(&self) -> Lsn {
        Lsn(self.header.first_lsn.0 + self.header.data_bytes)
    }

    /// File offset of stream position `lsn`, which must be inside this segment.
    pub(crate) fn offset(&self, lsn: Lsn) -> u64 {
        debug_assert!(lsn >= self.first_lsn() && lsn <= self.end_lsn());
        SEGMENT_DATA_OFFSET + (lsn.0 - self.header.first_lsn.0)
    }
}

pub(crate) fn segment_name(first_lsn: Lsn) -> String {
    format!("{:020}{SEGMENT_SUFFIX}", first_lsn.0)
}

pub(crate) fn parse_segment_name(name: &str) -> Option<Lsn> {
    let digits = name.strip_suffix(SEGMENT_SUFFIX)?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok().map(Lsn)
}

/// Creates a segment with the rotation protocol: create `NAME.tmp`, preallocate, write the
/// header, fdatasync the file, rename it to `NAME`, fsync the directory. A crash at any step
/// leaves either no segment (a `.tmp` file recovery deletes) or a complete, durable one.
/// On failure the temporary file is removed (best effort) and nothing of the segment remains
/// visible.
pub(crate) fn create_segment(
    fs: &dyn FileSystem,
    dir: &Path,
    header: SegmentHeader,
) -> io::Result<Segment> {
    create_segment_with(fs, dir, header, None)
}

/// As [`create_segment`], with `lead_in` bytes (a start record) at the start of the data area,
/// written and synced before the segment is renamed into place.
pub(crate) fn create_segment_with(
    fs: &dyn FileSystem,
    dir: &Path,
    header: SegmentHeader,
    lead_in: Option<&[u8]>,
) -> io::Result<Segment> {
    let name = segment_name(header.first_lsn);
    let temp = dir.join(format!("{name}{TEMP_SUFFIX}"));
    let path = dir.join(&name);
    let result = (|| {
        let file = fs.create(&temp)?;
        file.allocate(SEGMENT_DATA_OFFSET + header.data_bytes)?;
        file.write_all_at(&header.encode(), 0)?;
        if let Some(bytes) = lead_in {
            file.write_all_at(bytes, SEGMENT_DATA_OFFSET)?;
        }
        file.sync_data()?;
        fs.rename(&temp, &path)?;
        fs.sync_dir(dir)?;
        Ok(file)
    })();
    match result {
        Ok(file) => Ok(Segment::new(header, path, file)),
        Err(error) => {
            let _ = fs.remove(&temp);
            Err(error)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_zero_padded_and_parse_back() {
        assert_eq!(segment_name(Lsn(4096)), "00000000000000004096.wal");
        assert_eq!(
            parse_segment_name("00000000000000004096.wal"),
            Some(Lsn(4096))
        );
        assert_eq!(parse_segment_name("4096.wal"), None);
        assert_eq!(parse_segment_name("00000000000000004096.wal.tmp"), None);
        assert_eq!(segment_name(Lsn(u64::MAX)).len(), 24);
    }
}
