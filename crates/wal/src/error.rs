//! The crate's one error type.

use std::io;
use std::path::PathBuf;

use crate::format::DecodeError;
use crate::{Index, Lsn, Term};

/// Everything that can fail in the wal crate, one variant per failing operation, each with the
/// segment (its first Lsn), Lsn or index involved.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WalError {
    /// The configuration breaks a documented limit.
    #[error("the wal configuration is invalid: {reason}")]
    Config {
        /// Which rule it breaks.
        reason: &'static str,
    },
    /// Listing or creating the log directory failed.
    #[error("could not open the log directory {dir}")]
    OpenDir {
        /// The directory.
        dir: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// A segment file's header is unreadable or belongs to another log.
    #[error("segment {path} has an invalid header")]
    SegmentHeader {
        /// The segment file.
        path: PathBuf,
        /// What is wrong with it.
        #[source]
        source: DecodeError,
    },
    /// A segment belongs to another cluster, or uses another block size than configured.
    #[error("segment {path} does not match this log's configuration: {reason}")]
    SegmentMismatch {
        /// The segment file.
        path: PathBuf,
        /// Which field differs.
        reason: &'static str,
    },
    /// Creating (and preallocating) a new segment failed; nothing of it remains.
    #[error("could not create the segment starting at {segment}")]
    SegmentCreate {
        /// First Lsn of the segment.
        segment: Lsn,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// Reading a segment failed.
    #[error("could not read the segment starting at {segment} at {lsn}")]
    SegmentRead {
        /// First Lsn of the segment.
        segment: Lsn,
        /// Where the read started.
        lsn: Lsn,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// Writing entries to a segment failed; the entries from `lsn` on were discarded from the
    /// log and may be appended again.
    #[error(
        "could not write the segment starting at {segment} at {lsn}; entries from there on were discarded"
    )]
    SegmentWrite {
        /// First Lsn of the segment.
        segment: Lsn,
        /// First Lsn that was discarded.
        lsn: Lsn,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// The disk is full. Entries from `lsn` on were discarded, nothing of them is committed,
    /// and appends work again once space is freed.
    #[error(
        "the disk is full while writing the segment starting at {segment}; entries from {lsn} on were discarded"
    )]
    NoSpace {
        /// First Lsn of the segment being written or created.
        segment: Lsn,
        /// First Lsn that was discarded.
        lsn: Lsn,
        /// The I/O error (ENOSPC).
        #[source]
        source: io::Error,
    },
    /// An fdatasync or directory fsync failed. The log is poisoned: the kernel may have dropped
    /// the dirty pages, so nothing after the last successful sync can be trusted, and every
    /// later append fails with [`WalError::Poisoned`]. Reopen the log to recover.
    #[error(
        "fsync of the segment starting at {segment} failed while making {lsn} durable; the log is now poisoned"
    )]
    Sync {
        /// First Lsn of the segment (or of the segment whose directory entry was synced).
        segment: Lsn,
        /// The Lsn being made durable.
        lsn: Lsn,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// An earlier fsync failed, so the log refuses appends, syncs and truncations.
    #[error("the log is poisoned since an fsync failed at {lsn}; reopen it to recover")]
    Poisoned {
        /// The Lsn that the failed sync was making durable.
        lsn: Lsn,
        /// The original error's kind.
        #[source]
        source: io::Error,
    },
    /// An entry is larger than the block size or the hard maximum allows.
    #[error("an entry of {len} bytes exceeds the maximum of {max} bytes")]
    EntryTooLarge {
        /// Payload bytes.
        len: usize,
        /// Largest payload allowed.
        max: usize,
    },
    /// An appended entry does not continue the index chain.
    #[error("cannot append {index} with {term} after {last_index} with {last_term}")]
    OutOfOrder {
        /// Index offered.
        index: Index,
        /// Term offered.
        term: Term,
        /// Last index in the log.
        last_index: Index,
        /// Last term in the log.
        last_term: Term,
    },
    /// The ring has no room for the record; the consumer must release space first.
    #[error("the ring has {free_bytes} free bytes but the record at {lsn} needs {needed_bytes}")]
    RingFull {
        /// Where the record would go.
        lsn: Lsn,
        /// Bytes the record (and any padding before it) needs.
        needed_bytes: u64,
        /// Free bytes.
        free_bytes: u64,
    },
    /// A range written into the ring by someone else (an RDMA Write) is not valid; nothing of
    /// it was accepted.
    #[error("the bytes written into the ring at {lsn} after {index} are invalid")]
    RemoteRange {
        /// Where the invalid record starts.
        lsn: Lsn,
        /// The last valid index before it.
        index: Index,
        /// What is wrong.
        #[source]
        source: DecodeError,
    },
    /// A range handed to the ring or the log is outside what it holds.
    #[error("the range from {start} to {end} is outside the held range {held_start} to {held_end}")]
    Range {
        /// Start of the range asked for.
        start: Lsn,
        /// End of the range asked for.
        end: Lsn,
        /// Start of what is held.
        held_start: Lsn,
        /// End of what is held.
        held_end: Lsn,
    },
    /// A bad record is followed by valid ones beyond the last unsynced window: this is not a
    /// torn write but corruption of bytes that were once durable. Nothing was truncated.
    #[error(
        "mid-log corruption in the segment starting at {segment} at {lsn} after {index}: valid entries follow the bad one"
    )]
    Corrupt {
        /// First Lsn of the segment.
        segment: Lsn,
        /// Where the bad record starts.
        lsn: Lsn,
        /// The last valid index before it.
        index: Index,
        /// What is wrong with the bad record.
        #[source]
        source: DecodeError,
    },
    /// An entry read back from a segment does not verify.
    #[error(
        "the entry {index} read at {lsn} from the segment starting at {segment} does not verify"
    )]
    ReadCorrupt {
        /// First Lsn of the segment.
        segment: Lsn,
        /// Where the record sits.
        lsn: Lsn,
        /// The index asked for.
        index: Index,
        /// What is wrong.
        #[source]
        source: DecodeError,
    },
    /// The index is not in the log (below its first or above its last index).
    #[error("{index} is not in the log, which holds {first} to {last}")]
    NotFound {
        /// The index asked for.
        index: Index,
        /// First index held.
        first: Index,
        /// Last index held.
        last: Index,
    },
    /// Saving the cut bytes of a torn tail, or cutting them, failed.
    #[error("could not cut the torn tail of the segment starting at {segment} at {lsn}")]
    Recover {
        /// First Lsn of the segment.
        segment: Lsn,
        /// Where the cut starts.
        lsn: Lsn,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// A suffix truncation or a restart moved the log's end back while this call was under
    /// way, after it had staged records at the old end: what it staged past `end` is gone and
    /// was not acknowledged. Persist again from the log's new end.
    #[error(
        "a suffix truncation or restart moved the log's end to {end} while this call was under way; nothing it staged past that was kept"
    )]
    CutDuringCall {
        /// The log's end after the cut.
        end: Lsn,
    },
    /// The segment files leave a hole in the log's Lsn range that no interrupted prefix
    /// truncation or restart explains (no truncation marker covers it): a segment file was
    /// deleted, lost or not restored. Recovery refuses to open the log and deletes nothing,
    /// because the log from `end` on would otherwise be served without the entries before it.
    #[error(
        "the segment files in {dir} leave a gap: nothing holds {start} to {end}, between {before} and {after}, and no interrupted prefix truncation explains it, so the entries there are missing; nothing was deleted. Restore the missing segment file; otherwise remove this node from the cluster on the leader (rdmalog members remove), delete the data directory and add the node back as a new member (or restart it on the emptied directory under its old id: it then waits for every other voter's term before it votes, and catches up from the leader)"
    )]
    SegmentGap {
        /// The log directory.
        dir: PathBuf,
        /// The first missing Lsn.
        start: Lsn,
        /// The first Lsn held again.
        end: Lsn,
        /// The file before the gap: a segment, or the truncation marker that says the log
        /// continues at `start`.
        before: String,
        /// The segment file after the gap.
        after: String,
    },
    /// A truncation marker says an interrupted prefix truncation keeps the log from `keep`,
    /// but no segment from there on exists. Recovery refuses to open the log and deletes
    /// nothing.
    #[error(
        "{path} records an interrupted prefix truncation that keeps the log from {keep}, but no segment file from there on exists; nothing was deleted. Restore the missing segment files; otherwise remove this node from the cluster on the leader (rdmalog members remove), delete the data directory and add the node back as a new member (or restart it on the emptied directory under its old id: it then waits for every other voter's term before it votes, and catches up from the leader)"
    )]
    TruncationKeepMissing {
        /// The marker file.
        path: PathBuf,
        /// The first Lsn the truncation keeps.
        keep: Lsn,
    },
    /// The truncation marker is not one this code wrote.
    #[error("the truncation marker {path} is invalid; nothing was deleted")]
    TruncationMarker {
        /// The marker file.
        path: PathBuf,
        /// What is wrong with it.
        #[source]
        source: DecodeError,
    },
    /// Reading the truncation marker failed.
    #[error("could not read the truncation marker {path}")]
    TruncationMarkerRead {
        /// The marker file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// Deleting segments for a prefix or suffix truncation failed.
    #[error("could not truncate the log at {index} (segment starting at {segment})")]
    Truncate {
        /// The truncation point.
        index: Index,
        /// The segment being removed or cut.
        segment: Lsn,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
}

impl WalError {
    /// Whether the error is ENOSPC.
    pub(crate) fn is_no_space(source: &io::Error) -> bool {
        source.kind() == io::ErrorKind::StorageFull
            || source.raw_os_error() == Some(rustix::io::Errno::NOSPC.raw_os_error())
    }
}
