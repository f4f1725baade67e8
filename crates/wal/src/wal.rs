//! The durable log: segment files, group commit, truncation and recovery.
//!
//! One file per concern, all of them `impl Wal` blocks over the `State` behind one mutex:
//!
//! * `append`: encoding entries, and records persisted from a ring, into the write buffer.
//! * `group_commit`: sync leaders, gathering, parked waiters, writing and fdatasyncing a
//!   batch, zeroing ahead (its module doc describes the protocol).
//! * `truncate`: the exclusive operations: suffix truncation, restart, prefix truncation.
//! * `read`: reading entries back, and the log's positions.
//! * `recovery`: what [`Wal::open`] does to the directory before the log is used.
//! * `state`: the mutex-protected state they share, and the failure bookkeeping.
//!
//! # Failure rules
//!
//! * A failed fdatasync or directory fsync poisons the log: every later append, sync and
//!   truncation fails with [`WalError::Poisoned`] (after fsyncgate, a retried fsync can
//!   succeed without the data).
//! * A failed write or segment creation (ENOSPC included) discards every entry not yet on
//!   disk, zeroes whatever part of the batch reached the page cache, and leaves the log as it
//!   was before the batch; appends work again once the cause is gone.

mod append;
mod group_commit;
mod read;
mod recovery;
mod state;
mod truncate;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use crate::error::WalError;
use crate::format::{MAX_BLOCK_BYTES, MIN_BLOCK_BYTES};
use crate::fs::FileSystem;
use crate::{Index, Lsn, Position, Term};

use recovery::recover;
use state::State;

/// Largest segment data area: 1 TiB, the bound the segment header decoder enforces.
pub const MAX_SEGMENT_DATA_BYTES: u64 = 1 << 40;
/// Largest write buffer (and unsynced window): 1 GiB, because the window is stored as a `u32`
/// in the segment header and two buffers of this size are allocated at open.
pub const MAX_BATCH_BYTES: u64 = 1 << 30;
/// Durability waiters whose slots are preallocated at open, so that registering a waiter does
/// not allocate; more concurrent waiters than this grow the list once.
const INITIAL_WAITER_CAPACITY: usize = 1024;

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
    /// one block, at most one segment and 1 GiB. A segment records it (its unsynced window,
    /// which recovery relies on to tell a torn tail from corruption), so a reopened log
    /// writes with the smaller of this and its last segment's window: a larger value takes
    /// effect on a new log.
    pub max_batch_bytes: u64,
    /// How long a sync leader waits for more appenders before writing (until the buffer is
    /// half full). Zero means *adaptive*: the leader waits only while appenders that waited
    /// on the previous batch have not yet come back, and never longer than the previous
    /// batch's fsync took (at most 2 ms); a lone appender never waits.
    pub max_batch_delay: Duration,
    /// Where an empty log starts (the Lsn must be block-aligned).
    pub start: Position,
    /// Test-only mutation (`rdmalog-sim --mutation unchecked-reads`): reads of stored records
    /// skip their check and return the stored payload as it is, so a rotten record is served
    /// as data. The simulator must catch it. Never set it.
    #[doc(hidden)]
    pub unchecked_reads: bool,
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
            unchecked_reads: false,
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
    /// Leftover files removed: unfinished rotations (`.tmp`), and the segments that an
    /// interrupted prefix truncation or restart doomed, followed by its truncation marker
    /// (`wal-truncation`).
    pub removed: Vec<String>,
    /// The previous process left the sync-failure marker (`wal-sync-failed`): an fdatasync
    /// of the log had failed, so every segment was rewritten from what this open read and
    /// fdatasynced before the log was trusted.
    pub rewritten_after_failed_sync: bool,
}

/// A replicated log's durable store. `Wal` is `Sync`: share it with `Arc` among appenders.
/// Appends that overlap a suffix truncation or a restart wait for it, so each is wholly
/// before or after it.
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
    /// Mirror of `State::first_index`, stored under the mutex wherever it changes: raft asks
    /// for the first index on every pass, and a read of it needs no lock.
    first_index: AtomicU64,
    /// Mirror of `State::last.last_index`, likewise (raft and waiters ask for it many times
    /// per commit); stored only by [`Wal::set_last`].
    last_index: AtomicU64,
}

impl Wal {
    /// Opens (or creates) the log in `dir` and recovers it: checks every segment header,
    /// refuses a gap between segments that no interrupted truncation explains with
    /// [`WalError::SegmentGap`], removes unfinished rotations and finishes an interrupted
    /// prefix truncation or restart, scans every record (length, crc32c, Lsn tag, index
    /// chain), cuts a torn tail (keeping the cut bytes in a `.broken` file) and refuses mid-log
    /// corruption with [`WalError::Corrupt`]. Nothing is deleted before every segment header
    /// and the segments' layout check out.
    pub fn open(
        fs: Arc<dyn FileSystem>,
        dir: &Path,
        config: WalConfig,
    ) -> Result<(Self, RecoveryReport), WalError> {
        config.validate()?;
        let recovered = recover(&*fs, dir, &config)?;
        // Batches larger than the window the last segment records would write more unsynced
        // bytes than recovery allows for: a crash that tore one read as mid-log corruption,
        // and the log refused to open.
        let mut config = config;
        let last_window = recovered
            .segments
            .back()
            .map_or(config.max_batch_bytes, |s| u64::from(s.header.window_bytes));
        if last_window < config.max_batch_bytes && last_window >= config.block_bytes {
            tracing::info!(
                configured = config.max_batch_bytes,
                window = last_window,
                "the log's last segment records a smaller unsynced window; batches keep to it"
            );
            config.max_batch_bytes = last_window;
        }
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
            exclusive: None,
            cuts: 0,
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
            first_index: AtomicU64::new(report.first_index.0),
            last_index: AtomicU64::new(report.position.last_index.0),
        };
        Ok((wal, report))
    }

    /// Poisons the log after a failed write or fdatasync, and leaves the sync-failure marker:
    /// the page cache may now hold bytes the disk never got (and never will: Linux marks the
    /// pages of a failed writeback clean), and whoever opens the log next reads them. The next
    /// open rewrites every segment from what it reads, then removes the marker
    /// (docs/FORMAT.md, section 5, step 6).
    fn poison(&self, st: &mut State, failure: state::Failure) {
        st.poisoned = Some(failure);
        crate::marker::record_sync_failure(&*self.fs, &self.dir);
    }

    /// The one place the first index changes, so that its lock-free mirror cannot be
    /// forgotten.
    fn set_first_index(&self, st: &mut State, first: Index) {
        st.first_index = first;
        self.first_index.store(first.0, Ordering::Release);
    }

    /// The one place the log's end changes, for the same reason.
    fn set_last(&self, st: &mut State, last: Position) {
        st.last = last;
        self.last_index.store(last.last_index.0, Ordering::Release);
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

    /// Each segment's first index and first Lsn, oldest first: what a prefix truncation
    /// deletes, segment by segment. A segment's file is named by its Lsn (`docs/FORMAT.md`
    /// section 3).
    pub fn segment_starts(&self) -> Vec<(Index, Lsn)> {
        self.lock()
            .segments
            .iter()
            .map(|s| (s.header.first_index, s.first_lsn()))
            .collect()
    }

    /// The file name of the segment that starts at `first_lsn`.
    pub fn segment_file_name(first_lsn: Lsn) -> String {
        crate::segment::segment_name(first_lsn)
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
