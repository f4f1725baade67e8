//! Group commit: sync leaders, waiters, and writing and fdatasyncing a batch.
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

use std::io;
use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};
use std::time::{Duration, Instant};

use crate::error::WalError;
use crate::format::SegmentHeader;
use crate::segment::{self, Segment};
use crate::{Index, Lsn, Position, Term};

use super::Wal;
use super::state::{Failure, FlushError, State, Waiter};

/// Longest adaptive gathering pause (when `max_batch_delay` is zero): 2 ms, a slow disk's
/// fsync, so that a mis-estimated population costs at most that much latency once.
const MAX_GATHER: Duration = Duration::from_millis(2);
/// How far past a batch the segment is zeroed in one step (see `zero_ahead`): 1 MiB, so the
/// journal commit of an extent conversion comes once per MiB of log rather than once per
/// 4 KiB block, while one step costs about a millisecond of extra writing.
const ZERO_AHEAD_BYTES: u64 = 1 << 20;

impl Wal {
    /// Waits until `target` is durable, leading flushes when nobody else does.
    ///
    /// A waiter whose entries are in a batch that is being written, or whose batch already
    /// has a leader, parks itself until the leader that completes its batch unparks it; it
    /// then returns without touching the mutex. Only one waiter of the next batch is woken
    /// to lead it, so a completed flush wakes no thread in vain.
    pub(super) fn wait_durable<'a>(
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
            st.not_discarded_since(generation)?;
            // Not durable and no flush running means `buf_start == durable`, so the target
            // is in `buf`; while a leader writes, `[durable, buf_start)` is its batch.
            let epoch = if target <= st.buf_start {
                st.batch_epoch - 1
            } else {
                st.batch_epoch
            };
            // While an exclusive operation holds the log it flushes, or wakes us when done.
            if !st.flushing && st.exclusive.is_none() {
                debug_assert_eq!(epoch, st.batch_epoch);
                // Not durable, and nothing staged to make it so: a cut removed the target
                // before it was durable. A cut flushes what was staged before it and lets
                // nothing be staged while it runs, so this cannot happen; were it to, a
                // flush of nothing would never reach the target.
                debug_assert!(st.buf_len > 0, "a wait for {target} with nothing staged");
                if st.buf_len == 0 {
                    return Err(WalError::CutDuringCall { end: st.last.lsn });
                }
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
    pub(super) fn wake_all(st: &mut State) {
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
            if enough || st.buf_full || st.exclusive.is_some() || st.buf_len as u64 >= half {
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
    pub(super) fn flush<'a>(
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
                let last = st.cut_locs(start);
                self.set_last(&mut st, last);
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
                self.poison(&mut st, failure);
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
    pub(super) fn undo_segment(&self, segment: Arc<Segment>, failure: FlushError) -> FlushError {
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

pub(super) fn zero_range(segment: &Segment, start: u64, end: u64) -> io::Result<()> {
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
