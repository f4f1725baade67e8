//! The log's storage: entry format, registered ring memory, segment files, group commit and
//! crash recovery.
//!
//! The log is one logical byte stream. Every record sits at a byte position ([`Lsn`]) that is
//! the same on every replica with the same prefix, so a leader can RDMA-Write a range of its
//! ring into a follower's ring at the same positions. The byte layout is in `docs/FORMAT.md`.
//!
//! * [`format`]: the record header, the segment header and the placement rule (a record never
//!   crosses a block boundary, so neither the ring nor a segment ever splits one).
//! * [`ring`]: a power-of-two window over the tail of the stream in plain memory
//!   ([`RingMemory`]) that other crates register; separate [`Producer`] and [`Consumer`]
//!   handles; validation of bytes that a remote peer wrote.
//! * [`Wal`]: preallocated segment files, group commit, truncation and recovery.
//! * [`fs`]: the file-system trait in front of the disk, a real implementation and a
//!   fault-injecting one for crash tests.
//!
//! Invariants, phrased as absences: this crate never touches RDMA, a transport or raft; it holds
//! no `unsafe`; the append path allocates nothing per append (`tests/integration/allocations.rs`,
//! under `Fsync` and `Memory`).

#![deny(unsafe_code)]

pub mod error;
pub mod format;
pub mod fs;
pub mod inspect;
mod marker;
pub mod ring;
mod segment;
mod sync;
mod wal;

pub use error::WalError;
pub use format::{DecodeError, EntryHeader, RecordKind};
pub use ring::{
    AnonymousMemory, Consumer, Producer, RecordSource, RingConfig, RingMemory, Verified,
    clear_published, open_to_remote, published_tail, ring, ring_recovering,
};
pub use wal::{Entry, MAX_SEGMENT_DATA_BYTES, RecoveryReport, Wal, WalConfig};

use std::fmt;

/// A byte position in the log's logical stream. Monotonically increasing; never reused except
/// after a suffix truncation (a raft conflict) cuts the stream back.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Lsn(pub u64);

/// A raft log index. The first entry of an empty log has index 1.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Index(pub u64);

/// A raft term.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Term(pub u64);

impl fmt::Display for Lsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "lsn {}", self.0)
    }
}

impl fmt::Display for Index {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "index {}", self.0)
    }
}

impl fmt::Display for Term {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "term {}", self.0)
    }
}

/// The end of a log prefix: where the next record goes and what the last entry was. Used to
/// start a ring or an empty log, and to check the index chain of the next entry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Position {
    /// The byte position where the next record starts.
    pub lsn: Lsn,
    /// The index of the last entry before `lsn` (0 for an empty log).
    pub last_index: Index,
    /// The term of the last entry before `lsn` (0 for an empty log).
    pub last_term: Term,
}

/// What an append has achieved when it returns. Each variant is a promise; none is weaker
/// than documented.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Durability {
    /// The entry is in this process's memory (the ring or the log's write buffer) and has an
    /// index and an Lsn. It survives nothing: a process crash or a later write error
    /// (`WalError::NoSpace`) may drop it, and `Wal::last_index` then tells where the log ends.
    /// It reaches the disk, with an fdatasync, when the write buffer fills, at the next
    /// `Fsync` append, at `Wal::sync`, or at `Wal::close`.
    Memory,
    /// The entry, every entry before it, and the directory entry of its segment file have
    /// been made durable with fdatasync/fsync, which returned success. It survives a process
    /// crash and a power loss, assuming the disk honours cache flushes (see docs/FORMAT.md).
    /// The default: the strongest promise.
    #[default]
    Fsync,
}
