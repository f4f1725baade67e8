//! The durable log: segment files, group commit, truncation and recovery.
//!
//! # Group commit
//!
//! Appenders encode records into one preallocated write buffer under a mutex (no allocation).
//! The buffer is batch number `batch_epoch`. An appender that needs durability becomes the
//! *sync leader* if no flush is running: it may first *gather* (below), then swaps the buffer
//! for the spare one, releases the mutex, writes the batch with positioned writes (rotating
//! segments as needed), fdatasyncs every segment it touched, and records the batch's epoch as
//! completed. Every other appender that needs durability registers itself as a waiter on the
//! epoch holding its entries and parks. A completing leader unparks exactly the waiters its
//! batch covered, plus one waiter of the next batch to lead it, and does so after releasing
//! the mutex; a woken waiter sees the completed epoch in an atomic and returns without taking
//! the mutex. So a completed batch wakes no thread in vain (no thundering herd) and no woken
//! thread queues on the mutex of the thread that woke it.
//!
//! *Gathering.* A leader that flushes right away would take only the appenders that arrived
//! while the previous batch was being written, while those the previous batch released are
//! still on their way back; each batch then holds about half of the appenders. With
//! `max_batch_delay` zero the leader instead waits until as many appenders wait on its batch
//! as waited when the previous batch completed, but never longer than the previous batch's
//! write and sync took (at most `MAX_GATHER`): a lone appender never waits, and a population
//! that shrank costs one bounded pause. A non-zero `max_batch_delay` is a fixed pause instead.
//! Both stop early once the buffer is half full or an appender finds it full.
//!
//! *Zeroing ahead.* Segments are preallocated with fallocate(2), which leaves unwritten
//! extents; the first write into such a block makes the next fdatasync commit the file
//! system's journal too. A leader therefore zeroes 1 MiB ahead of the log's end whenever a
//! batch passes the zeroed mark, so most fdatasyncs flush data only.
//!
//! A batch is bounded by `max_batch_bytes` (the buffer size). Bytes written but not yet synced
//! therefore never exceed one batch, which is the *window* recovery uses to tell a torn write
//! from corruption (the zeroes written ahead are not records and read as the unwritten extents
//! did).
//!
//! # Failure rules
//!
//! * A failed fdatasync or directory fsync poisons the log: every later append, sync and
//!   truncation fails with [`WalError::Poisoned`] (after fsyncgate, a retried fsync can
//!   succeed without the data).
//! * A failed write or segment creation (ENOSPC included) discards every entry not yet on
//!   disk, zeroes whatever part of the batch reached the page cache, and leaves the log as it
//!   was before the batch; appends work again once the cause is gone.

use std::collections::VecDeque;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::Thread;
use std::time::{Duration, Instant};

use crate::error::WalError;
use crate::format::{
    self, ChainCheck, DecodeError, HEADER_BYTES, MAX_BLOCK_BYTES, MIN_BLOCK_BYTES, RecordKind,
    SEGMENT_DATA_OFFSET, SEGMENT_HEADER_BYTES, SegmentHeader,
};
use crate::fs::FileSystem;
use crate::ring::Consumer;
use crate::segment::{self, BROKEN_SUFFIX, Segment, TEMP_SUFFIX};
use crate::{Durability, Index, Lsn, Position, Term};

/// Largest segment data area: 1 TiB, the bound the segment header decoder enforces.
pub const MAX_SEGMENT_DATA_BYTES: u64 = 1 << 40;
/// Largest write buffer (and unsynced window): 1 GiB, because the window is stored as a `u32`
/// in the segment header and two buffers of this size are allocated at open.
pub const MAX_BATCH_BYTES: u64 = 1 << 30;
/// Entries whose locations are preallocated at open, so that the first appends do not grow
/// the index; 64 Ki entries is 1.5 MiB of index.
const INITIAL_INDEX_CAPACITY: usize = 1 << 16;
/// Durability waiters whose slots are preallocated at open, so that registering a waiter does
/// not allocate; more concurrent waiters than this grow the list once.
const INITIAL_WAITER_CAPACITY: usize = 1024;
/// Longest adaptive gathering pause (when `max_batch_delay` is zero): 2 ms, a slow disk's
/// fsync, so that a mis-estimated population costs at most that much latency once.
const MAX_GATHER: Duration = Duration::from_millis(2);
/// How far past a batch the segment is zeroed in one step (see `zero_ahead`): 1 MiB, so the
/// journal commit of an extent conversion comes once per MiB of log rather than once per
/// 4 KiB block, while one step costs about a millisecond of extra writing.
const ZERO_AHEAD_BYTES: u64 = 1 << 20;

/// Configuration of a log. Limits are checked by [`Wal::open`].
#[derive(Clone, Debug)]
pub struct WalConfig {
    /// Cluster id written into every segment; segments of another cluster are refused.
    pub cluster_id: u64,
    /// Block size of the placement rule (a power of two in 64 B ..= 64 MiB). It bounds an
    /// entry and must be the same on every replica and in every ring of this log.
    pub block_bytes: u64,
    /// Data bytes per segment file, a multiple of `block_bytes`, at most 1 TiB.
    pub segment_data_bytes: u64,
    /// Write-buffer size: bounds a batch and the bytes written but not yet synced. At least
    /// one block, at most one segment and 1 GiB.
    pub max_batch_bytes: u64,
    /// How long a sync leader waits for more appenders before writing (until the buffer is
    /// half full). Zero means *adaptive*: the leader waits only while appenders that waited
    /// on the previous batch have not yet come back, and never longer than the previous
    /// batch's fsync took (at most 2 ms); a lone appender never waits.
    pub max_batch_delay: Duration,
    /// Where an empty log starts (the Lsn must be block-aligned).
    pub start: Position,
}

impl Default for WalConfig {
    fn default() -> Self {
        Self {
            cluster_id: 0,
            block_bytes: 1 << 20,
            segment_data_bytes: 64 << 20,
            max_batch_bytes: 4 << 20,
            max_batch_delay: Duration::ZERO,
            start: Position::default(),
        }
    }
}

impl WalConfig {
    fn validate(&self) -> Result<(), WalError> {
        let block = self.block_bytes;
        if !block.is_power_of_two() || !(MIN_BLOCK_BYTES..=MAX_BLOCK_BYTES).contains(&block) {
            return Err(WalError::Config {
                reason: "block_bytes must be a power of two in 64 B ..= 64 MiB",
            });
        }
        if self.segment_data_bytes == 0
            || self.segment_data_bytes % block != 0
            || self.segment_data_bytes > MAX_SEGMENT_DATA_BYTES
        {
            return Err(WalError::Config {
                reason: "segment_data_bytes must be a non-zero multiple of block_bytes, at most 1 TiB",
            });
        }
        if self.max_batch_bytes < block
            || self.max_batch_bytes > self.segment_data_bytes
            || self.max_batch_bytes > MAX_BATCH_BYTES
        {
            return Err(WalError::Config {
                reason: "max_batch_bytes must be at least one block and at most one segment and 1 GiB",
            });
        }
        if self.start.lsn.0 % block != 0 {
            return Err(WalError::Config {
                reason: "the start lsn must be block-aligned",
            });
        }
        Ok(())
    }
}

/// Where an entry is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Its index.
    pub index: Index,
    /// Its term.
    pub term: Term,
    /// Where its record starts.
    pub lsn: Lsn,
}

/// What [`Wal::open`] found and repaired.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Segment files in the log after recovery.
    pub segments: usize,
    /// End of the recovered log.
    pub position: Position,
    /// First index held.
    pub first_index: Index,
    /// Where a torn tail was cut, how many bytes were cut, and the file that keeps them.
    pub torn_tail: Option<(Lsn, u64, PathBuf)>,
    /// Leftover files removed: unfinished rotations (`.tmp`) and segments before a gap left by
    /// an interrupted prefix truncation.
    pub removed: Vec<String>,
}

/// A replicated log's durable store. `Wal` is `Sync`: share it with `Arc` among appenders.
#[derive(Debug)]
pub struct Wal {
    fs: Arc<dyn FileSystem>,
    dir: PathBuf,
    config: WalConfig,
    window_bytes: u64,
    state: Mutex<State>,
    changed: Condvar,
    /// Mirror of `State::completed_epoch`, read by parked waiters without the mutex.
    completed_epoch: AtomicU64,
    /// Mirror of `State::generation`, read with `completed_epoch`: an epoch that completes
    /// after a discard does not cover the discarded entries of an older generation.
    generation: AtomicU64,
}

/// A thread parked until the batch `epoch` is durable (see the module's group commit notes).
#[derive(Debug)]
struct Waiter {
    ticket: u64,
    epoch: u64,
    thread: Thread,
}

#[derive(Clone, Copy, Debug)]
struct Loc {
    lsn: u64,
    term: Term,
    record_len: u32,
}

#[derive(Debug)]
struct State {
    first_index: Index,
    prev_term: Term,
    locs: VecDeque<Loc>,
    /// Where the log's records begin (the position after entry `first_index - 1`): the first
    /// segment's first Lsn, or past its leading start record after `Wal::restart_at`.
    start: u64,
    /// End of the stream (buffered entries included) and the last entry.
    last: Position,
    /// Write buffer: stream bytes `[buf_start, buf_start + buf_len)`; its length is fixed.
    buf: Vec<u8>,
    buf_start: u64,
    buf_len: usize,
    /// The other buffer; `None` while a sync leader writes it.
    spare: Option<Vec<u8>>,
    segments: VecDeque<Arc<Segment>>,
    /// Everything before this is written and fdatasynced.
    durable: u64,
    /// A sync leader (or a truncation) is doing I/O, or a leader is gathering a batch.
    flushing: bool,
    /// Epoch of the batch accumulating in `buf`; the batch a leader writes is `batch_epoch - 1`.
    batch_epoch: u64,
    /// The last batch that was written and fdatasynced.
    completed_epoch: u64,
    /// Parked durability waiters, each removed (and unparked) by whoever wakes it.
    waiters: Vec<Waiter>,
    next_ticket: u64,
    /// Registered waiters whose entries are in `buf` (epoch `batch_epoch`).
    batch_waiters: usize,
    /// How many appenders waited when the last batch completed: the population an adaptive
    /// leader waits for.
    expected_waiters: usize,
    /// How long the last batch's writes and fdatasync took.
    last_sync: Duration,
    /// Total and longest time of the batches' writes and fdatasyncs since open.
    sync_total: Duration,
    sync_max: Duration,
    /// A leader gathering a batch, unparked when the expected waiters are in.
    gatherer: Option<Thread>,
    /// An appender found no room in `buf`: a gathering leader stops waiting.
    buf_full: bool,
    /// Scratch list of the threads a completed batch wakes, reused so waking does not
    /// allocate.
    wake_list: Vec<Thread>,
    /// Scratch list of the segments a batch touches, reused so a flush does not allocate.
    batch_segments: Vec<Arc<Segment>>,
    /// Bumped whenever buffered entries are discarded after a write failure.
    generation: u64,
    /// Why entries were last discarded: (segment, lsn, kind, raw os error, was ENOSPC).
    discarded: Option<Failure>,
    poisoned: Option<Failure>,
    closed: bool,
}

#[derive(Clone, Copy, Debug)]
struct Failure {
    segment: Lsn,
    lsn: Lsn,
    kind: io::ErrorKind,
    raw: Option<i32>,
    no_space: bool,
}

impl Failure {
    fn new(segment: Lsn, lsn: Lsn, error: &io::Error) -> Self {
        Self {
            segment,
            lsn,
            kind: error.kind(),
            raw: error.raw_os_error(),
            no_space: WalError::is_no_space(error),
        }
    }

    fn io_error(&self) -> io::Error {
        match self.raw {
            Some(raw) => io::Error::from_raw_os_error(raw),
            None => io::Error::from(self.kind),
        }
    }

    fn discard_error(&self) -> WalError {
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

enum FlushError {
    /// Writing failed; the batch was discarded (and zeroed where it reached the page cache).
    Discard(Failure),
    /// A sync failed, or zeroing failed: poison.
    Poison(Failure),
}

impl State {
    fn usable(&self) -> Result<(), WalError> {
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

    fn last_index(&self) -> Index {
        self.last.last_index
    }

    /// The last entry strictly before stream position `lsn`.
    fn last_before(&self, lsn: u64) -> (Index, Term) {
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

    /// Forgets entries from stream position `lsn` on.
    fn cut_locs(&mut self, lsn: u64) {
        let n = self.locs.partition_point(|loc| loc.lsn < lsn);
        self.locs.truncate(n);
        let (last_index, last_term) = self.last_before(lsn);
        let end = self
            .locs
            .back()
            .map_or(self.start, |loc| loc.lsn + u64::from(loc.record_len));
        self.last = Position {
            lsn: Lsn(end),
            last_index,
            last_term,
        };
    }

    fn segment_for(&self, lsn: u64) -> Option<&Arc<Segment>> {
        let n = self
            .segments
            .partition_point(|segment| segment.first_lsn().0 <= lsn);
        n.checked_sub(1).map(|i| &self.segments[i])
    }
}

impl Wal {
    /// Opens (or creates) the log in `dir` and recovers it: removes unfinished rotations,
    /// checks every segment header, scans every record (length, crc32c, Lsn tag, index chain),
    /// cuts a torn tail (keeping the cut bytes in a `.broken` file) and refuses mid-log
    /// corruption with [`WalError::Corrupt`].
    pub fn open(
        fs: Arc<dyn FileSystem>,
        dir: &Path,
        config: WalConfig,
    ) -> Result<(Self, RecoveryReport), WalError> {
        config.validate()?;
        let recovered = recover(&*fs, dir, &config)?;
        let mut report = recovered.report;
        report.segments = recovered.segments.len();
        let first = &recovered.segments[0].header;
        let state = State {
            first_index: first.first_index,
            prev_term: first.prev_term,
            locs: recovered.locs,
            start: recovered.start,
            last: recovered.position,
            buf: vec![0; config.max_batch_bytes as usize],
            buf_start: recovered.position.lsn.0,
            buf_len: 0,
            spare: Some(vec![0; config.max_batch_bytes as usize]),
            segments: recovered.segments,
            durable: recovered.position.lsn.0,
            flushing: false,
            batch_epoch: 1,
            completed_epoch: 0,
            waiters: Vec::with_capacity(INITIAL_WAITER_CAPACITY),
            next_ticket: 0,
            batch_waiters: 0,
            expected_waiters: 0,
            last_sync: Duration::ZERO,
            sync_total: Duration::ZERO,
            sync_max: Duration::ZERO,
            gatherer: None,
            buf_full: false,
            wake_list: Vec::with_capacity(INITIAL_WAITER_CAPACITY),
            batch_segments: Vec::with_capacity(4),
            generation: 0,
            discarded: None,
            poisoned: None,
            closed: false,
        };
        report.position = state.last;
        report.first_index = state.first_index;
        let wal = Self {
            fs,
            dir: dir.to_owned(),
            window_bytes: config.max_batch_bytes,
            config,
            state: Mutex::new(state),
            changed: Condvar::new(),
            completed_epoch: AtomicU64::new(0),
            generation: AtomicU64::new(0),
        };
        Ok((wal, report))
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn wait<'a>(&self, guard: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        self.changed
            .wait(guard)
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Appends an entry with the next index. See [`Wal::append`].
    pub fn append_next(
        &self,
        term: Term,
        payload: &[u8],
        durability: Durability,
    ) -> Result<Entry, WalError> {
        self.append_inner(None, term, payload, durability)
    }

    /// Appends an entry; `index` must be the last index plus one and `term` not lower than
    /// the last term. Returns when `durability` is reached. Does not allocate.
    pub fn append(
        &self,
        index: Index,
        term: Term,
        payload: &[u8],
        durability: Durability,
    ) -> Result<Entry, WalError> {
        self.append_inner(Some(index), term, payload, durability)
    }

    fn append_inner(
        &self,
        index: Option<Index>,
        term: Term,
        payload: &[u8],
        durability: Durability,
    ) -> Result<Entry, WalError> {
        let max = format::max_payload(self.config.block_bytes);
        if payload.len() > max {
            return Err(WalError::EntryTooLarge {
                len: payload.len(),
                max,
            });
        }
        let record = format::record_bytes(payload.len()) as u64;
        let mut st = self.lock();
        let generation = st.generation;
        let entry = loop {
            st.usable()?;
            if st.generation != generation {
                return Err(st.discarded.map_or(
                    WalError::Config {
                        reason: "entries were discarded",
                    },
                    |f| f.discard_error(),
                ));
            }
            let last = st.last;
            let index = index.unwrap_or(Index(last.last_index.0 + 1));
            if index.0 != last.last_index.0 + 1 || term < last.last_term {
                return Err(WalError::OutOfOrder {
                    index,
                    term,
                    last_index: last.last_index,
                    last_term: last.last_term,
                });
            }
            let start = format::place(last.lsn.0, record, self.config.block_bytes);
            let end = start + record;
            if end - st.buf_start > st.buf.len() as u64 {
                st = self.make_room(st)?;
                continue;
            }
            let at = (last.lsn.0 - st.buf_start) as usize;
            let from = (start - st.buf_start) as usize;
            let state = &mut *st;
            format::encode_padding(
                &mut state.buf[at..from],
                last.lsn,
                (last.last_index, last.last_term),
            );
            format::encode_entry(
                &mut state.buf[from..from + record as usize],
                Lsn(start),
                index,
                term,
                payload,
            );
            self.staged(state, start, record, index, term);
            break Entry {
                index,
                term,
                lsn: Lsn(start),
            };
        };
        match durability {
            Durability::Memory => Ok(entry),
            _ => self
                .wait_durable(st, entry.lsn.0 + record, generation)
                .map(|_| entry),
        }
    }

    /// Bookkeeping after a record was encoded into the buffer at `start`.
    fn staged(&self, state: &mut State, start: u64, record: u64, index: Index, term: Term) {
        let end = start + record;
        state.buf_len = (end - state.buf_start) as usize;
        state.locs.push_back(Loc {
            lsn: start,
            term,
            record_len: record as u32,
        });
        state.last = Position {
            lsn: Lsn(end),
            last_index: index,
            last_term: term,
        };
        if state.buf_len as u64 >= self.config.max_batch_bytes / 2 {
            if let Some(gatherer) = &state.gatherer {
                gatherer.unpark();
            }
        }
    }

    /// The buffer is full: wait for the running flush, or flush it ourselves.
    fn make_room<'a>(
        &'a self,
        st: MutexGuard<'a, State>,
    ) -> Result<MutexGuard<'a, State>, WalError> {
        if st.flushing {
            // A gathering leader would otherwise wait out its pause with a full buffer.
            let mut st = st;
            if let Some(gatherer) = &st.gatherer {
                gatherer.unpark();
                st.buf_full = true;
            }
            Ok(self.wait(st))
        } else {
            self.flush(st, false)
        }
    }

    /// Persists the records of `consumer`'s ring from the log's end up to `end` (a follower's
    /// accepted range, or a leader's own appends), re-checking every record (bounds, crc32c,
    /// Lsn tag, index chain) on the way, and returns when `durability` is reached.
    pub fn persist_from(
        &self,
        consumer: &Consumer,
        end: Lsn,
        durability: Durability,
    ) -> Result<Position, WalError> {
        let block = self.config.block_bytes;
        if consumer.block_bytes() != block {
            return Err(WalError::Config {
                reason: "the ring's block size differs from the log's",
            });
        }
        let mut st = self.lock();
        let generation = st.generation;
        while st.last.lsn < end {
            st.usable()?;
            if st.generation != generation {
                return Err(st.discarded.map_or(
                    WalError::Config {
                        reason: "entries were discarded",
                    },
                    |f| f.discard_error(),
                ));
            }
            let last = st.last;
            let mut pos = last.lsn.0;
            // Skip padding and implicit gaps up to the next entry.
            let mut header = [0u8; HEADER_BYTES];
            loop {
                let rest = format::block_rest(pos, block);
                if rest >= HEADER_BYTES as u64 {
                    if pos + HEADER_BYTES as u64 > end.0 {
                        return Err(WalError::Range {
                            start: Lsn(pos),
                            end,
                            held_start: consumer.head(),
                            held_end: consumer.tail(),
                        });
                    }
                    consumer.copy_range(Lsn(pos), &mut header)?;
                    if header[29] != RecordKind::Padding as u8 {
                        break;
                    }
                }
                pos += rest;
            }
            let claimed = u32::from_le_bytes([header[4], header[5], header[6], header[7]]) as usize;
            let record = format::record_bytes(claimed.min(format::max_payload(block))) as u64;
            let record_end = (pos + record)
                .min(pos + format::block_rest(pos, block))
                .min(end.0);
            if record_end - st.buf_start > st.buf.len() as u64 {
                st = self.make_room(st)?;
                continue;
            }
            let at = (last.lsn.0 - st.buf_start) as usize;
            let from = (pos - st.buf_start) as usize;
            let to = (record_end - st.buf_start) as usize;
            let state = &mut *st;
            format::encode_padding(
                &mut state.buf[at..from],
                last.lsn,
                (last.last_index, last.last_term),
            );
            consumer.copy_range(Lsn(pos), &mut state.buf[from..to])?;
            let invalid = |source| WalError::RemoteRange {
                lsn: Lsn(pos),
                index: last.last_index,
                source,
            };
            let decoded =
                format::decode_record(&state.buf[from..to], Lsn(pos), block).map_err(invalid)?;
            let header = decoded.header;
            let mut chain = ChainCheck {
                last_index: last.last_index,
                last_term: last.last_term,
            };
            chain.advance(&header).map_err(invalid)?;
            self.staged(state, pos, decoded.record_len, header.index, header.term);
        }
        let position = st.last;
        match durability {
            Durability::Memory => Ok(position),
            _ => self
                .wait_durable(st, position.lsn.0, generation)
                .map(|_| position),
        }
    }

    /// Waits until `target` is durable, leading flushes when nobody else does.
    ///
    /// A waiter whose entries are in a batch that is being written, or whose batch already
    /// has a leader, parks itself until the leader that completes its batch unparks it; it
    /// then returns without touching the mutex. Only one waiter of the next batch is woken
    /// to lead it, so a completed flush wakes no thread in vain.
    fn wait_durable<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        target: u64,
        generation: u64,
    ) -> Result<(), WalError> {
        loop {
            if st.durable >= target {
                return Ok(());
            }
            st.usable()?;
            if st.generation != generation {
                return Err(st.discarded.map_or(
                    WalError::Config {
                        reason: "entries were discarded",
                    },
                    |f| f.discard_error(),
                ));
            }
            // Not durable and no flush running means `buf_start == durable`, so the target
            // is in `buf`; while a leader writes, `[durable, buf_start)` is its batch.
            let epoch = if target <= st.buf_start {
                st.batch_epoch - 1
            } else {
                st.batch_epoch
            };
            if !st.flushing {
                debug_assert_eq!(epoch, st.batch_epoch);
                st = self.flush(st, true)?;
                continue;
            }
            let ticket = st.next_ticket;
            st.next_ticket += 1;
            st.waiters.push(Waiter {
                ticket,
                epoch,
                thread: std::thread::current(),
            });
            if epoch == st.batch_epoch {
                st.batch_waiters += 1;
                if st.batch_waiters + 1 >= st.expected_waiters {
                    if let Some(gatherer) = &st.gatherer {
                        gatherer.unpark();
                    }
                }
            }
            drop(st);
            loop {
                std::thread::park();
                if self.completed_epoch.load(Ordering::Acquire) >= epoch
                    && self.generation.load(Ordering::Acquire) == generation
                {
                    return Ok(());
                }
                st = self.lock();
                if st.waiters.iter().all(|w| w.ticket != ticket) {
                    // Woken on purpose: to lead the next batch, or after a failure.
                    break;
                }
                // A spurious wake-up: still registered, park again.
                drop(st);
            }
        }
    }

    /// Unparks every waiter (they re-check the log's state): after a failure, or when an
    /// exclusive operation ends.
    fn wake_all(st: &mut State) {
        for waiter in st.waiters.drain(..) {
            waiter.thread.unpark();
        }
        st.batch_waiters = 0;
    }

    /// Unparks the waiters of every completed batch, and one waiter of the next batch to lead
    /// it. The unparking happens after the mutex is released, so that a woken thread does
    /// not block at once on the mutex its waker holds; the list of threads to wake is
    /// preallocated and handed back, so this allocates nothing.
    fn wake_completed<'a>(&'a self, mut st: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        let done = st.completed_epoch;
        st.expected_waiters = st.waiters.len() + 1;
        let state = &mut *st;
        let wake = &mut state.wake_list;
        // Another completion may hold the list right now; then wake under the mutex rather
        // than grow a new list.
        let direct = wake.capacity() == 0;
        state.waiters.retain(|waiter| {
            let covered = waiter.epoch <= done;
            if covered && direct {
                waiter.thread.unpark();
            } else if covered {
                wake.push(waiter.thread.clone());
            }
            !covered
        });
        if !state.waiters.is_empty() {
            let leader = state.waiters.swap_remove(0);
            debug_assert_eq!(leader.epoch, state.batch_epoch);
            state.batch_waiters = state.batch_waiters.saturating_sub(1);
            if direct {
                leader.thread.unpark();
            } else {
                state.wake_list.push(leader.thread);
            }
        }
        if st.wake_list.is_empty() {
            return st;
        }
        let mut wake = std::mem::take(&mut st.wake_list);
        drop(st);
        for thread in wake.drain(..) {
            thread.unpark();
        }
        let mut st = self.lock();
        st.wake_list = wake;
        st
    }

    /// A leader that may wait gathers more appenders before it writes: for `max_batch_delay`
    /// (or until the buffer is half full), or, when that is zero, until as many appenders
    /// wait on this batch as waited when the last batch completed, for at most the last
    /// batch's sync time.
    fn gather<'a>(&'a self, mut st: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        let half = self.config.max_batch_bytes / 2;
        let delay = self.config.max_batch_delay;
        let adaptive = delay.is_zero();
        let wait = if adaptive {
            st.last_sync.min(MAX_GATHER)
        } else {
            delay
        };
        if wait.is_zero() {
            return st;
        }
        let deadline = Instant::now() + wait;
        loop {
            let enough = if adaptive {
                st.batch_waiters + 1 >= st.expected_waiters
            } else {
                false
            };
            if enough || st.buf_full || st.buf_len as u64 >= half {
                break;
            }
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            st.gatherer = Some(std::thread::current());
            drop(st);
            std::thread::park_timeout(deadline - now);
            st = self.lock();
            st.gatherer = None;
        }
        st
    }

    /// Becomes the sync leader: writes and fdatasyncs the current buffer. A leader that
    /// waits for its own entries (`gather`) may first wait for more appenders.
    fn flush<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        gather: bool,
    ) -> Result<MutexGuard<'a, State>, WalError> {
        debug_assert!(!st.flushing);
        st.flushing = true;
        if gather {
            st = self.gather(st);
        }
        let start = st.buf_start;
        let len = st.buf_len;
        let end = start + len as u64;
        let epoch = st.batch_epoch;
        st.batch_epoch += 1;
        st.batch_waiters = 0;
        st.buf_full = false;
        let spare = st
            .spare
            .take()
            .expect("only the flushing thread takes the spare buffer");
        let batch = std::mem::replace(&mut st.buf, spare);
        st.buf_start = end;
        st.buf_len = 0;
        // Usually one segment, two when the batch crosses into the next one. The list is
        // reused, so a flush allocates nothing.
        let mut existing = std::mem::take(&mut st.batch_segments);
        existing.clear();
        existing.extend(
            st.segments
                .iter()
                .filter(|s| s.end_lsn().0 > start)
                .cloned(),
        );
        let last_end = st
            .segments
            .back()
            .expect("a log always has a segment")
            .end_lsn()
            .0;
        let rotation = (last_end < end).then(|| {
            let (index, term) = st.last_before(last_end);
            (Index(index.0 + 1), term)
        });
        drop(st);

        let started = Instant::now();
        let result = self.write_batch(&batch[..len], start, &existing, rotation);
        let took = started.elapsed();
        existing.clear();

        let mut st = self.lock();
        st.batch_segments = existing;
        st.spare = Some(batch);
        st.flushing = false;
        self.changed.notify_all();
        match result {
            Ok(created) => {
                st.segments.extend(created);
                st.durable = end;
                st.completed_epoch = epoch;
                st.last_sync = took;
                st.sync_total += took;
                st.sync_max = st.sync_max.max(took);
                self.completed_epoch.store(epoch, Ordering::Release);
                Ok(self.wake_completed(st))
            }
            Err(FlushError::Discard(failure)) => {
                // Everything from `start` on is gone: the batch and what was buffered since.
                st.buf_start = start;
                st.buf_len = 0;
                st.cut_locs(start);
                st.generation += 1;
                self.generation.store(st.generation, Ordering::Release);
                st.discarded = Some(failure);
                Self::wake_all(&mut st);
                tracing::warn!(
                    lsn = start,
                    "wal: discarded unwritten entries after a write failure"
                );
                Err(failure.discard_error())
            }
            Err(FlushError::Poison(failure)) => {
                st.poisoned = Some(failure);
                Self::wake_all(&mut st);
                tracing::error!(
                    lsn = failure.lsn.0,
                    "wal: fsync failed, the log is poisoned"
                );
                Err(WalError::Sync {
                    segment: failure.segment,
                    lsn: failure.lsn,
                    source: failure.io_error(),
                })
            }
        }
    }

    /// Writes `bytes` (stream `[start, start + len)`) to the `existing` segments that cover it
    /// and, if the batch runs past the last one, to a new segment (`rotation` gives its first
    /// index and previous term), then fdatasyncs every segment it touched, oldest first.
    /// Returns the created segment.
    fn write_batch(
        &self,
        bytes: &[u8],
        start: u64,
        existing: &[Arc<Segment>],
        rotation: Option<(Index, Term)>,
    ) -> Result<Option<Arc<Segment>>, FlushError> {
        let end = start + bytes.len() as u64;
        let mut pos = start;
        for segment in existing {
            let hi = segment.end_lsn().0.min(end);
            if pos >= hi {
                continue;
            }
            let piece = &bytes[(pos - start) as usize..(hi - start) as usize];
            if let Err(error) = segment
                .file
                .write_all_at(piece, segment.offset(Lsn(pos)))
                .and_then(|()| zero_ahead(segment, hi))
            {
                return Err(self.undo(
                    existing,
                    start,
                    hi,
                    Failure::new(segment.first_lsn(), Lsn(start), &error),
                ));
            }
            pos = hi;
        }
        // The old segments' bytes become durable before a new segment exists, so a crash
        // during rotation leaves one consistent tail.
        for segment in existing
            .iter()
            .filter(|s| s.end_lsn().0 > start && s.first_lsn().0 < end)
        {
            if let Err(error) = segment.file.sync_data() {
                return Err(FlushError::Poison(Failure::new(
                    segment.first_lsn(),
                    Lsn(start),
                    &error,
                )));
            }
        }
        let Some((first_index, prev_term)) = rotation.filter(|_| pos < end) else {
            debug_assert_eq!(pos, end);
            return Ok(None);
        };
        let header = SegmentHeader {
            block_bytes: self.config.block_bytes as u32,
            cluster_id: self.config.cluster_id,
            first_index,
            first_lsn: Lsn(pos),
            prev_term,
            data_bytes: self.config.segment_data_bytes,
            window_bytes: self.window_bytes as u32,
        };
        let segment = match segment::create_segment(&*self.fs, &self.dir, header) {
            Ok(segment) => Arc::new(segment),
            Err(error) => {
                return Err(self.undo(
                    existing,
                    start,
                    pos,
                    Failure::new(Lsn(pos), Lsn(start), &error),
                ));
            }
        };
        if let Err(error) = segment
            .file
            .write_all_at(&bytes[(pos - start) as usize..], segment.offset(Lsn(pos)))
            .and_then(|()| zero_ahead(&segment, end))
        {
            let failure = self.undo(
                existing,
                start,
                pos,
                Failure::new(segment.first_lsn(), Lsn(start), &error),
            );
            return Err(self.undo_segment(segment, failure));
        }
        if let Err(error) = segment.file.sync_data() {
            return Err(FlushError::Poison(Failure::new(
                segment.first_lsn(),
                Lsn(pos),
                &error,
            )));
        }
        Ok(Some(segment))
    }

    /// A write failed: zero what may have reached the page cache in `[start, written)` of the
    /// `segments`, so no stale record survives past the log's end. The zeroes are synced too:
    /// part of the batch may already be durable (old segments are synced before a rotation),
    /// and a failed append must not reappear after a crash.
    fn undo(
        &self,
        segments: &[Arc<Segment>],
        start: u64,
        written: u64,
        failure: Failure,
    ) -> FlushError {
        for segment in segments {
            let lo = start.max(segment.first_lsn().0);
            let hi = written.min(segment.end_lsn().0);
            if lo < hi
                && zero_range(segment, lo, hi)
                    .and_then(|()| segment.file.sync_data())
                    .is_err()
            {
                return FlushError::Poison(failure);
            }
        }
        FlushError::Discard(failure)
    }

    /// Removes a segment created by a batch that then failed.
    fn undo_segment(&self, segment: Arc<Segment>, failure: FlushError) -> FlushError {
        let removed = self
            .fs
            .remove(&segment.path)
            .and_then(|()| self.fs.sync_dir(&self.dir));
        match (failure, removed) {
            (FlushError::Discard(f), Err(_)) => FlushError::Poison(f),
            (failure, _) => failure,
        }
    }

    /// Makes every appended entry durable.
    pub fn sync(&self) -> Result<Position, WalError> {
        let st = self.lock();
        let position = st.last;
        let generation = st.generation;
        self.wait_durable(st, position.lsn.0, generation)
            .map(|()| position)
    }

    /// Waits until no flush runs, then marks the log busy for exclusive I/O.
    fn exclusive(&self) -> Result<MutexGuard<'_, State>, WalError> {
        let mut st = self.lock();
        loop {
            st.usable()?;
            if !st.flushing {
                if st.buf_len > 0 {
                    st = self.flush(st, false)?;
                    continue;
                }
                st.flushing = true;
                return Ok(st);
            }
            st = self.wait(st);
        }
    }

    fn end_exclusive(&self, mut st: MutexGuard<'_, State>) {
        st.flushing = false;
        Self::wake_all(&mut st);
        self.changed.notify_all();
    }

    /// Removes every entry with index `from` or higher (a raft conflict). Returns once the cut
    /// is durable, so no later append can be followed, after a crash, by the removed entries.
    /// Segments past the cut are deleted last-first with a directory fsync each, then the cut
    /// segment is zeroed from the end backwards one window at a time with an fdatasync each,
    /// so every crash point leaves a prefix of the old log. A failure poisons the log.
    pub fn truncate_suffix(&self, from: Index) -> Result<(), WalError> {
        let st = self.exclusive()?;
        if from > st.last_index() {
            self.end_exclusive(st);
            return Ok(());
        }
        if from < st.first_index {
            let (first, last) = (st.first_index, st.last_index());
            self.end_exclusive(st);
            return Err(WalError::NotFound {
                index: from,
                first,
                last,
            });
        }
        let n = (from.0 - st.first_index.0) as usize;
        let cut = if n == 0 {
            st.start
        } else {
            let loc = st.locs[n - 1];
            loc.lsn + u64::from(loc.record_len)
        };
        let old_end = st.last.lsn.0;
        let segments: Vec<Arc<Segment>> = st.segments.iter().cloned().collect();
        drop(st);

        let result = self.cut_segments(&segments, cut, old_end, from);

        let mut st = self.lock();
        match result {
            Ok(kept) => {
                st.segments.truncate(kept);
                st.locs.truncate(n);
                st.cut_locs(cut);
                debug_assert_eq!(st.last.lsn.0, cut);
                st.durable = cut;
                st.buf_start = cut;
                st.buf_len = 0;
                self.end_exclusive(st);
                Ok(())
            }
            Err((segment, error)) => {
                st.poisoned = Some(Failure::new(segment, Lsn(cut), &error));
                self.end_exclusive(st);
                Err(WalError::Truncate {
                    index: from,
                    segment,
                    source: error,
                })
            }
        }
    }

    fn cut_segments(
        &self,
        segments: &[Arc<Segment>],
        cut: u64,
        old_end: u64,
        from: Index,
    ) -> Result<usize, (Lsn, io::Error)> {
        let _ = from;
        // Keep the first segment always, and every segment that starts before the cut.
        let kept = segments
            .iter()
            .skip(1)
            .take_while(|s| s.first_lsn().0 < cut)
            .count()
            + 1;
        for segment in segments[kept..].iter().rev() {
            self.fs
                .remove(&segment.path)
                .map_err(|e| (segment.first_lsn(), e))?;
            self.fs
                .sync_dir(&self.dir)
                .map_err(|e| (segment.first_lsn(), e))?;
        }
        let segment = &segments[kept - 1];
        let stop = old_end.min(segment.end_lsn().0);
        let mut hi = stop;
        while hi > cut {
            let lo = hi.saturating_sub(self.window_bytes).max(cut);
            zero_range(segment, lo, hi).map_err(|e| (segment.first_lsn(), e))?;
            segment
                .file
                .sync_data()
                .map_err(|e| (segment.first_lsn(), e))?;
            hi = lo;
        }
        Ok(kept)
    }

    /// Discards the whole log and starts it again, empty, at `start`: the first entry appended
    /// next is `start.last_index + 1` at `start.lsn`. A follower installing a snapshot that
    /// covers more than its log holds uses it. Old segments are deleted (with a directory
    /// fsync) before the new one is created, so a crash in between leaves an empty directory,
    /// never a mix; the caller records the snapshot durably first and calls this again after
    /// such a crash. A failure poisons the log.
    pub fn restart_at(&self, start: Position) -> Result<(), WalError> {
        if start.lsn.0 % 8 != 0 {
            return Err(WalError::Config {
                reason: "a log must start at an 8-aligned lsn",
            });
        }
        let st = self.exclusive()?;
        let doomed: Vec<Arc<Segment>> = st.segments.iter().cloned().collect();
        drop(st);
        let block = self.config.block_bytes;
        let aligned = start.lsn.0 - start.lsn.0 % block;
        let result = (|| {
            for segment in doomed.iter().rev() {
                self.fs
                    .remove(&segment.path)
                    .map_err(|e| (segment.first_lsn(), e))?;
            }
            self.fs.sync_dir(&self.dir).map_err(|e| (start.lsn, e))?;
            let header = SegmentHeader {
                block_bytes: self.config.block_bytes as u32,
                cluster_id: self.config.cluster_id,
                first_index: Index(start.last_index.0 + 1),
                first_lsn: Lsn(aligned),
                prev_term: start.last_term,
                data_bytes: self.config.segment_data_bytes,
                window_bytes: self.config.max_batch_bytes as u32,
            };
            // Segments start on a block boundary; a log that continues mid-block begins with
            // a start record over the gap, written before the segment is renamed into place.
            let gap = start.lsn.0 - aligned;
            let lead_in = (gap > 0).then(|| {
                format::start_header(Lsn(aligned), gap, (start.last_index, start.last_term))
            });
            segment::create_segment_with(
                &*self.fs,
                &self.dir,
                header,
                lead_in.as_ref().map(|h| &h[..]),
            )
            .map_err(|e| (start.lsn, e))
        })();
        let mut st = self.lock();
        match result {
            Ok(segment) => {
                st.segments.clear();
                st.segments.push_back(Arc::new(segment));
                st.locs.clear();
                st.start = start.lsn.0;
                st.first_index = Index(start.last_index.0 + 1);
                st.prev_term = start.last_term;
                st.last = start;
                st.durable = start.lsn.0;
                st.buf_start = start.lsn.0;
                st.buf_len = 0;
                self.end_exclusive(st);
                Ok(())
            }
            Err((segment, error)) => {
                st.poisoned = Some(Failure::new(segment, start.lsn, &error));
                self.end_exclusive(st);
                Err(WalError::SegmentCreate {
                    segment,
                    source: error,
                })
            }
        }
    }

    /// The log position right after entry `index` (where entry `index + 1` goes), if the log
    /// holds `index` or it is the entry just before the first one held.
    pub fn position_after(&self, index: Index) -> Option<Position> {
        let st = self.lock();
        if index.0 + 1 == st.first_index.0 {
            return Some(Position {
                lsn: Lsn(st.start),
                last_index: index,
                last_term: st.prev_term,
            });
        }
        if index < st.first_index || index > st.last_index() {
            return None;
        }
        let loc = st.locs[(index.0 - st.first_index.0) as usize];
        Some(Position {
            lsn: Lsn(loc.lsn + u64::from(loc.record_len)),
            last_index: index,
            last_term: loc.term,
        })
    }

    /// Deletes whole segments all of whose entries have an index below `checkpoint` (entries
    /// covered by a snapshot). The segment holding `checkpoint` and the last segment stay.
    /// Returns the new first index.
    pub fn truncate_prefix(&self, checkpoint: Index) -> Result<Index, WalError> {
        let st = self.exclusive()?;
        let removable = st
            .segments
            .iter()
            .zip(st.segments.iter().skip(1))
            .take_while(|(_, next)| next.header.first_index <= checkpoint)
            .count();
        let doomed: Vec<Arc<Segment>> = st.segments.iter().take(removable).cloned().collect();
        drop(st);
        let mut removed = 0;
        let mut failure = None;
        for segment in &doomed {
            if let Err(error) = self.fs.remove(&segment.path) {
                failure = Some((segment.first_lsn(), error));
                break;
            }
            removed += 1;
        }
        if failure.is_none() && removed > 0 {
            if let Err(error) = self.fs.sync_dir(&self.dir) {
                failure = Some((doomed[0].first_lsn(), error));
            }
        }
        let mut st = self.lock();
        // Segments removed from the directory are gone from the log whether or not the
        // directory fsync worked (recovery drops segments before a gap anyway).
        for _ in 0..removed {
            st.segments.pop_front();
        }
        let first = st.segments[0].header;
        let dropped = (first.first_index.0 - st.first_index.0) as usize;
        let held = st.locs.len();
        st.locs.drain(..dropped.min(held));
        if removed > 0 {
            st.start = first.first_lsn.0;
        }
        st.first_index = first.first_index;
        st.prev_term = first.prev_term;
        let first_index = st.first_index;
        if let Some((segment, error)) = failure {
            st.poisoned = Some(Failure::new(segment, segment, &error));
            self.end_exclusive(st);
            return Err(WalError::Truncate {
                index: checkpoint,
                segment,
                source: error,
            });
        }
        self.end_exclusive(st);
        Ok(first_index)
    }

    /// Reads entry `index` into `payload` (resized to fit; reuse it to avoid allocation) and
    /// verifies it. Reads use positioned reads: zero-copy `mmap` of a file needs `unsafe`,
    /// which this crate does not have.
    pub fn read(&self, index: Index, payload: &mut Vec<u8>) -> Result<Entry, WalError> {
        let mut st = self.lock();
        loop {
            if index < st.first_index || index > st.last_index() {
                return Err(WalError::NotFound {
                    index,
                    first: st.first_index,
                    last: st.last_index(),
                });
            }
            let loc = st.locs[(index.0 - st.first_index.0) as usize];
            let entry = Entry {
                index,
                term: loc.term,
                lsn: Lsn(loc.lsn),
            };
            let block = self.config.block_bytes;
            let segment = Arc::clone(
                st.segment_for(loc.lsn)
                    .expect("every entry lies in a segment"),
            );
            let corrupt = |source| WalError::ReadCorrupt {
                segment: segment.first_lsn(),
                lsn: entry.lsn,
                index,
                source,
            };
            if loc.lsn >= st.buf_start {
                let at = (loc.lsn - st.buf_start) as usize;
                let decoded = format::decode_record(&st.buf[at..st.buf_len], entry.lsn, block)
                    .map_err(corrupt)?;
                payload.clear();
                payload.extend_from_slice(decoded.payload);
                return Ok(entry);
            }
            if loc.lsn >= st.durable {
                // In the batch a sync leader is writing right now.
                st = self.wait(st);
                continue;
            }
            drop(st);
            payload.resize(loc.record_len as usize, 0);
            segment
                .file
                .read_exact_at(payload, segment.offset(entry.lsn))
                .map_err(|source| WalError::SegmentRead {
                    segment: segment.first_lsn(),
                    lsn: entry.lsn,
                    source,
                })?;
            let decoded = format::decode_record(payload, entry.lsn, block).map_err(corrupt)?;
            if decoded.header.index != index || decoded.header.term != entry.term {
                return Err(corrupt(DecodeError::IndexGap {
                    expected: index.0,
                    found: decoded.header.index.0,
                }));
            }
            let len = decoded.payload.len();
            payload.copy_within(HEADER_BYTES..HEADER_BYTES + len, 0);
            payload.truncate(len);
            return Ok(entry);
        }
    }

    /// The term of entry `index`, or of the entry just before the first one held.
    pub fn term(&self, index: Index) -> Option<Term> {
        let st = self.lock();
        if index.0 + 1 == st.first_index.0 {
            return Some(st.prev_term);
        }
        let offset = index.0.checked_sub(st.first_index.0)?;
        st.locs.get(offset as usize).map(|loc| loc.term)
    }

    /// End of the log (buffered entries included) and its last entry; a ring that feeds this
    /// log starts here.
    pub fn position(&self) -> Position {
        self.lock().last
    }

    /// First index held.
    pub fn first_index(&self) -> Index {
        self.lock().first_index
    }

    /// Last index held (buffered entries included).
    pub fn last_index(&self) -> Index {
        self.lock().last_index()
    }

    /// Everything before this Lsn is durable.
    pub fn durable_lsn(&self) -> Lsn {
        Lsn(self.lock().durable)
    }

    /// Batches written and fdatasynced since open (group commit's fsync count); the number
    /// of durable appends divided by this is the mean batch size.
    pub fn batch_count(&self) -> u64 {
        self.completed_epoch.load(Ordering::Acquire)
    }

    /// Group-commit flushes since open: (count, total time, longest), each a batch's writes
    /// and its fdatasync.
    pub fn sync_stats(&self) -> (u64, Duration, Duration) {
        let st = self.lock();
        (self.batch_count(), st.sync_total, st.sync_max)
    }

    /// Number of segment files.
    pub fn segment_count(&self) -> usize {
        self.lock().segments.len()
    }

    /// The configuration in force.
    pub fn config(&self) -> &WalConfig {
        &self.config
    }

    /// Makes everything durable and closes the log. Later calls fail. Prefer this to `Drop`,
    /// which can only log a failure.
    pub fn close(&self) -> Result<(), WalError> {
        let result = self.sync().map(|_| ());
        self.lock().closed = true;
        result
    }

    /// Closes the log as `kill -9` would: what is buffered and not yet written is dropped,
    /// and nothing more is written or synced (not even by `Drop`). Crash tests use it to
    /// model a process crash in-process; later calls fail.
    pub fn abandon(&self) {
        self.lock().closed = true;
    }
}

impl Drop for Wal {
    fn drop(&mut self) {
        let st = self.lock();
        // While unwinding, a panic may have left a flush half done; closing could wait on it
        // forever, so only log.
        let open = !st.closed
            && st.poisoned.is_none()
            && st.durable < st.last.lsn.0
            && !std::thread::panicking();
        drop(st);
        if open {
            if let Err(error) = self.close() {
                tracing::warn!(%error, "wal: dropped without close(), and the final sync failed");
            }
        }
    }
}

/// Writes zeroes over `[lsn, lsn + ZERO_AHEAD_BYTES)` of `segment` (clipped to its end) when a
/// write up to `end` reaches past what was zeroed before. A preallocated file is made of
/// unwritten extents, and an fdatasync after the first write into such a block must also
/// commit the file system's journal (the extent becomes written): that doubled the cost of a
/// group commit whose batch reached a new 4 KiB block every time. Zeroing ahead in large
/// steps converts the extents once per step, so most fdatasyncs flush data only. Zeroes past
/// the log's end read exactly as the unwritten extents did, so recovery is unchanged.
fn zero_ahead(segment: &Segment, end: u64) -> io::Result<()> {
    let zeroed = segment.zeroed_to.load(Ordering::Relaxed);
    if end <= zeroed {
        return Ok(());
    }
    let to = (end + ZERO_AHEAD_BYTES).min(segment.end_lsn().0);
    zero_range(segment, end, to)?;
    segment.zeroed_to.store(to, Ordering::Relaxed);
    Ok(())
}

fn zero_range(segment: &Segment, start: u64, end: u64) -> io::Result<()> {
    /// Zeroes are written from one static 64 KiB buffer (in .bss, no allocation).
    static ZEROES: [u8; 64 << 10] = [0; 64 << 10];
    let mut pos = start;
    while pos < end {
        let len = (end - pos).min(ZEROES.len() as u64);
        segment
            .file
            .write_all_at(&ZEROES[..len as usize], segment.offset(Lsn(pos)))?;
        pos += len;
    }
    Ok(())
}

struct Recovered {
    /// Where the log's records begin: the first segment's first Lsn, or the end of its
    /// leading start record.
    start: u64,
    segments: VecDeque<Arc<Segment>>,
    locs: VecDeque<Loc>,
    position: Position,
    report: RecoveryReport,
}

fn recover(fs: &dyn FileSystem, dir: &Path, config: &WalConfig) -> Result<Recovered, WalError> {
    let open_dir = |source| WalError::OpenDir {
        dir: dir.to_owned(),
        source,
    };
    fs.create_dir_all(dir).map_err(open_dir)?;
    let mut names = fs.list(dir).map_err(open_dir)?;
    names.sort();
    let mut report = RecoveryReport::default();
    let mut firsts = Vec::new();
    for name in &names {
        if name.ends_with(TEMP_SUFFIX) {
            fs.remove(&dir.join(name)).map_err(open_dir)?;
            report.removed.push(name.clone());
        } else if let Some(lsn) = segment::parse_segment_name(name) {
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
    // Segments before a gap are leftovers of an interrupted prefix truncation.
    if let Some(keep_from) = (1..segments.len())
        .rev()
        .find(|&i| segments[i - 1].end_lsn() != segments[i].first_lsn())
    {
        for segment in segments.drain(..keep_from) {
            fs.remove(&segment.path).map_err(open_dir)?;
            report
                .removed
                .push(segment::segment_name(segment.first_lsn()));
        }
    }
    if !report.removed.is_empty() {
        fs.sync_dir(dir).map_err(open_dir)?;
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
    scan(fs, dir, segments, window, report)
}

/// Reads a segment's data area (missing bytes read as zero).
fn load(segment: &Segment, buf: &mut Vec<u8>) -> Result<(), WalError> {
    let data = segment.header.data_bytes as usize;
    buf.clear();
    buf.resize(data, 0);
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
        })
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
            load(segment, &mut data)?;
            let base = segment.first_lsn().0;
            let from = if k == i { bad_at } else { base };
            for pos in (from..segment.end_lsn().0).step_by(8) {
                let off = (pos - base) as usize;
                if data[off..off + 8] == [0; 8] {
                    continue;
                }
                last_nonzero_end = pos + 8;
                if pos > bad_at && format::block_rest(pos, block) >= HEADER_BYTES as u64 {
                    if let Ok(decoded) = format::decode_record(&data[off..], Lsn(pos), block) {
                        last_valid_end = Some(pos + decoded.record_len);
                    }
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
    Ok(Recovered {
        start: log_start,
        segments,
        locs,
        position,
        report,
    })
}

/// Cuts `[bad_at, cut_end)`: saves the bytes to `LSN.broken`, deletes later segments
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
    let path = dir.join(format!("{:020}{BROKEN_SUFFIX}", bad_at));
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
