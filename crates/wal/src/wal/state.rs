//! The state behind the log's mutex, and the bookkeeping of write and sync failures.

use std::collections::VecDeque;
use std::io;
use std::sync::Arc;
use std::thread::Thread;
use std::time::Duration;

use crate::error::WalError;
use crate::segment::Segment;
use crate::{Index, Lsn, Position, Term};

/// A thread parked until the batch `epoch` is durable (see the `group_commit` module's notes).
#[derive(Debug)]
pub(super) struct Waiter {
    pub(super) ticket: u64,
    pub(super) epoch: u64,
    pub(super) thread: Thread,
}

/// Where an entry is, in the in-memory index of the log (`State::locs`).
#[derive(Clone, Copy, Debug)]
pub(super) struct Loc {
    pub(super) lsn: u64,
    pub(super) term: Term,
    pub(super) record_len: u32,
}

/// Everything the mutex guards.
#[derive(Debug)]
pub(super) struct State {
    pub(super) first_index: Index,
    pub(super) prev_term: Term,
    pub(super) locs: VecDeque<Loc>,
    /// Where the log's records begin (the position after entry `first_index - 1`): the first
    /// segment's first Lsn, or past its leading start record after `Wal::restart_at`.
    pub(super) start: u64,
    /// End of the stream (buffered entries included) and the last entry.
    pub(super) last: Position,
    /// Write buffer: stream bytes `[buf_start, buf_start + buf_len)`; its length is fixed.
    pub(super) buf: Vec<u8>,
    pub(super) buf_start: u64,
    pub(super) buf_len: usize,
    /// The other buffer; `None` while a sync leader writes it.
    pub(super) spare: Option<Vec<u8>>,
    pub(super) segments: VecDeque<Arc<Segment>>,
    /// Everything before this is written and fdatasynced.
    pub(super) durable: u64,
    /// A sync leader (or an exclusive operation) is doing I/O, or a leader is gathering a
    /// batch.
    pub(super) flushing: bool,
    /// The exclusive operation that runs or waits for the flush in progress to end, if any.
    /// While it is set no sync leader starts (the operation flushes itself), and while it is
    /// [`Exclusive::Cut`] nothing is staged (see the `truncate` module).
    pub(super) exclusive: Option<Exclusive>,
    /// Suffix truncations and restarts that changed the log since open: a call that staged
    /// records before one of them cannot go on from where it was.
    pub(super) cuts: u64,
    /// Epoch of the batch accumulating in `buf`; the batch a leader writes is `batch_epoch - 1`.
    pub(super) batch_epoch: u64,
    /// The last batch that was written and fdatasynced.
    pub(super) completed_epoch: u64,
    /// Parked durability waiters, each removed (and unparked) by whoever wakes it.
    pub(super) waiters: Vec<Waiter>,
    pub(super) next_ticket: u64,
    /// Registered waiters whose entries are in `buf` (epoch `batch_epoch`).
    pub(super) batch_waiters: usize,
    /// How many appenders waited when the last batch completed: the population an adaptive
    /// leader waits for.
    pub(super) expected_waiters: usize,
    /// How long the last batch's writes and fdatasync took.
    pub(super) last_sync: Duration,
    /// Total and longest time of the batches' writes and fdatasyncs since open.
    pub(super) sync_total: Duration,
    pub(super) sync_max: Duration,
    /// A leader gathering a batch, unparked when the expected waiters are in.
    pub(super) gatherer: Option<Thread>,
    /// An appender found no room in `buf`: a gathering leader stops waiting.
    pub(super) buf_full: bool,
    /// Scratch list of the threads a completed batch wakes, reused so waking does not
    /// allocate.
    pub(super) wake_list: Vec<Thread>,
    /// Scratch list of the segments a batch touches, reused so a flush does not allocate.
    pub(super) batch_segments: Vec<Arc<Segment>>,
    /// Bumped whenever buffered entries are discarded after a write failure.
    pub(super) generation: u64,
    /// Why entries were last discarded: (segment, lsn, kind, raw os error, was ENOSPC).
    pub(super) discarded: Option<Failure>,
    pub(super) poisoned: Option<Failure>,
    pub(super) closed: bool,
}

/// A write or sync failure, kept so that later calls can report it (an `io::Error` is not
/// `Clone`).
#[derive(Clone, Copy, Debug)]
pub(super) struct Failure {
    pub(super) segment: Lsn,
    pub(super) lsn: Lsn,
    pub(super) kind: io::ErrorKind,
    pub(super) raw: Option<i32>,
    pub(super) no_space: bool,
}

impl Failure {
    pub(super) fn new(segment: Lsn, lsn: Lsn, error: &io::Error) -> Self {
        Self {
            segment,
            lsn,
            kind: error.kind(),
            raw: error.raw_os_error(),
            no_space: WalError::is_no_space(error),
        }
    }

    pub(super) fn io_error(&self) -> io::Error {
        match self.raw {
            Some(raw) => io::Error::from_raw_os_error(raw),
            None => io::Error::from(self.kind),
        }
    }

    pub(super) fn discard_error(&self) -> WalError {
        if self.no_space {
            WalError::NoSpace {
                segment: self.segment,
                lsn: self.lsn,
                source: self.io_error(),
            }
        } else {
            WalError::SegmentWrite {
                segment: self.segment,
                lsn: self.lsn,
                source: self.io_error(),
            }
        }
    }
}

/// An exclusive operation of the `truncate` module.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Exclusive {
    /// `truncate_suffix` or `restart_at`: they move the log's end, so appends and reads wait
    /// until they are done.
    Cut,
    /// `truncate_prefix`: it deletes only segments before the log's tail, so appends go on
    /// staging entries into the buffer, and wait only for durability.
    Prefix,
}

/// How a flush failed.
pub(super) enum FlushError {
    /// Writing failed; the batch was discarded (and zeroed where it reached the page cache).
    Discard(Failure),
    /// A sync failed, or zeroing failed: poison.
    Poison(Failure),
}

impl State {
    pub(super) fn usable(&self) -> Result<(), WalError> {
        if let Some(failure) = &self.poisoned {
            return Err(WalError::Poisoned {
                lsn: failure.lsn,
                source: failure.io_error(),
            });
        }
        if self.closed {
            return Err(WalError::Config {
                reason: "the log is closed",
            });
        }
        Ok(())
    }

    /// Fails if entries were discarded after a write failure since generation `generation`
    /// (an appender's entries of that generation are then gone).
    pub(super) fn not_discarded_since(&self, generation: u64) -> Result<(), WalError> {
        if self.generation == generation {
            return Ok(());
        }
        Err(self.discarded.map_or(
            WalError::Config {
                reason: "entries were discarded",
            },
            |f| f.discard_error(),
        ))
    }

    pub(super) fn last_index(&self) -> Index {
        self.last.last_index
    }

    /// The last entry strictly before stream position `lsn`.
    pub(super) fn last_before(&self, lsn: u64) -> (Index, Term) {
        let n = self.locs.partition_point(|loc| loc.lsn < lsn);
        if n == 0 {
            (Index(self.first_index.0 - 1), self.prev_term)
        } else {
            (
                Index(self.first_index.0 + n as u64 - 1),
                self.locs[n - 1].term,
            )
        }
    }

    /// Forgets entries from stream position `lsn` on, and returns where the log then ends
    /// (for [`Wal::set_last`](super::Wal)).
    pub(super) fn cut_locs(&mut self, lsn: u64) -> Position {
        let n = self.locs.partition_point(|loc| loc.lsn < lsn);
        self.locs.truncate(n);
        let (last_index, last_term) = self.last_before(lsn);
        let end = self
            .locs
            .back()
            .map_or(self.start, |loc| loc.lsn + u64::from(loc.record_len));
        Position {
            lsn: Lsn(end),
            last_index,
            last_term,
        }
    }

    pub(super) fn segment_for(&self, lsn: u64) -> Option<&Arc<Segment>> {
        let n = self
            .segments
            .partition_point(|segment| segment.first_lsn().0 <= lsn);
        n.checked_sub(1).map(|i| &self.segments[i])
    }
}
