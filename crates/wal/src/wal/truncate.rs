//! The exclusive operations: suffix truncation (a raft conflict), restart (a snapshot
//! install) and prefix truncation (a checkpoint).
//!
//! One runs at a time. Each first claims the log (`State::exclusive`), so that no new sync
//! leader starts, then waits for the flush in progress to end, and does its I/O with the log
//! marked busy (`State::flushing`); when it ends it wakes every waiter.
//!
//! A suffix truncation or a restart moves the log's end ([`Exclusive::Cut`]). An entry staged
//! at the old end while one runs would be dropped by it after its append returned, or
//! acknowledged under `Fsync` when a later batch of the same epoch completed without it. So
//! from the claim on, appends, `persist_from` and reads wait until the cut is done; the cut
//! first flushes what was staged before the claim (those appends may already have returned),
//! and then finds the buffer empty and every waiter served. An append is therefore wholly
//! before a cut or wholly after it. A prefix truncation ([`Exclusive::Prefix`]) deletes only
//! segments before the tail, so appends go on staging into the buffer while it runs and only
//! wait for durability.

use std::io;
use std::sync::{Arc, MutexGuard};

use crate::error::WalError;
use crate::format::{self, SegmentHeader, TruncationKind, TruncationMarker};
use crate::marker;
use crate::segment::{self, Segment};
use crate::{Index, Lsn, Position};

use super::Wal;
use super::group_commit::zero_range;
use super::state::{Exclusive, Failure, State};

impl Wal {
    /// Claims the log for an exclusive operation of `kind`: waits for any other one to end,
    /// stops new sync leaders, waits for the flush in progress, and for a cut flushes what
    /// is staged; returns with the log marked busy.
    fn exclusive(&self, kind: Exclusive) -> Result<MutexGuard<'_, State>, WalError> {
        let mut st = self.lock();
        loop {
            st.usable()?;
            if st.exclusive.is_none() {
                break;
            }
            st = self.wait(st);
        }
        st.exclusive = Some(kind);
        // A gathering leader stops waiting for appenders that a cut holds back anyway.
        if let Some(gatherer) = &st.gatherer {
            gatherer.unpark();
        }
        loop {
            if let Err(error) = st.usable() {
                self.give_up_claim(st);
                return Err(error);
            }
            if st.flushing {
                st = self.wait(st);
                continue;
            }
            if kind == Exclusive::Cut && st.buf_len > 0 {
                // Staged before the claim: make it durable, as the cut expects everything
                // before its cut point to be.
                st = match self.flush(st, false) {
                    Ok(st) => st,
                    Err(error) => {
                        self.give_up_claim(self.lock());
                        return Err(error);
                    }
                };
                continue;
            }
            if kind == Exclusive::Cut {
                debug_assert_eq!(st.durable, st.last.lsn.0, "a cut starts with all durable");
                debug_assert_eq!(st.buf_start, st.durable);
            }
            st.flushing = true;
            return Ok(st);
        }
    }

    /// Ends an exclusive operation: the log is free for flushes, appends and the next
    /// exclusive operation, and every waiter re-checks its state.
    fn end_exclusive(&self, mut st: MutexGuard<'_, State>) {
        debug_assert!(st.flushing && st.exclusive.is_some());
        st.flushing = false;
        self.give_up_claim(st);
    }

    /// Drops the claim of an exclusive operation that did not start its I/O (the log became
    /// unusable, or its flush failed); `flushing` then belongs to whoever set it.
    fn give_up_claim(&self, mut st: MutexGuard<'_, State>) {
        st.exclusive = None;
        Self::wake_all(&mut st);
        self.changed.notify_all();
    }

    /// Removes every entry with index `from` or higher (a raft conflict). Returns once the cut
    /// is durable, so no later append can be followed, after a crash, by the removed entries.
    /// Segments past the cut are deleted last-first with a directory fsync each, then the cut
    /// segment is zeroed from the end backwards one window at a time with an fdatasync each,
    /// so every crash point leaves a prefix of the old log. A failure poisons the log.
    ///
    /// Appends, [`Wal::persist_from`] and reads that come while it runs wait until it is done:
    /// an append is wholly before the cut (and removed by it if its index is `from` or
    /// higher) or wholly after it.
    pub fn truncate_suffix(&self, from: Index) -> Result<(), WalError> {
        let st = self.exclusive(Exclusive::Cut)?;
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
                debug_assert_eq!(st.buf_len, 0, "nothing is staged while a cut runs");
                debug_assert_eq!(st.last.lsn.0, old_end, "nor does the log end move");
                st.segments.truncate(kept);
                st.locs.truncate(n);
                let last = st.cut_locs(cut);
                self.set_last(&mut st, last);
                debug_assert_eq!(st.last.lsn.0, cut);
                st.durable = cut;
                st.buf_start = cut;
                st.buf_len = 0;
                st.cuts += 1;
                self.end_exclusive(st);
                Ok(())
            }
            Err((segment, error)) => {
                self.poison(&mut st, Failure::new(segment, Lsn(cut), &error));
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
    /// covers more than its log holds uses it. A truncation marker is written, the old
    /// segments are deleted, and the marker is removed, each step durable, before the new
    /// segment is created; so a crash leaves the old log (with or without the marker, and then
    /// recovery finishes deleting it) or an empty directory, never a mix. The caller records
    /// the snapshot durably first and calls this again after such a crash. A failure poisons
    /// the log.
    ///
    /// Like [`Wal::truncate_suffix`], it makes appends, `persist_from` and reads that come
    /// while it runs wait until it is done.
    pub fn restart_at(&self, start: Position) -> Result<(), WalError> {
        if start.lsn.0 % 8 != 0 {
            return Err(WalError::Config {
                reason: "a log must start at an 8-aligned lsn",
            });
        }
        let st = self.exclusive(Exclusive::Cut)?;
        let old_end = st.last.lsn.0;
        let doomed: Vec<Arc<Segment>> = st.segments.iter().cloned().collect();
        drop(st);
        let block = self.config.block_bytes;
        let aligned = start.lsn.0 - start.lsn.0 % block;
        let result = (|| {
            // As in `truncate_prefix`: the marker makes the gaps that the removals may leave
            // after a crash this restart's, and it goes before the new segment exists.
            let marker = doomed.last().map(|last| TruncationMarker {
                kind: TruncationKind::Restart,
                keep_lsn: last.end_lsn(),
            });
            if let Some(marker) = marker {
                marker::write(&*self.fs, &self.dir, marker).map_err(|e| (start.lsn, e))?;
            }
            for segment in doomed.iter().rev() {
                self.fs
                    .remove(&segment.path)
                    .map_err(|e| (segment.first_lsn(), e))?;
            }
            self.fs.sync_dir(&self.dir).map_err(|e| (start.lsn, e))?;
            if marker.is_some() {
                marker::remove(&*self.fs, &self.dir).map_err(|e| (start.lsn, e))?;
            }
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
                debug_assert_eq!(st.buf_len, 0, "nothing is staged while a cut runs");
                debug_assert_eq!(st.last.lsn.0, old_end, "nor does the log end move");
                st.segments.clear();
                st.segments.push_back(Arc::new(segment));
                st.locs.clear();
                st.start = start.lsn.0;
                self.set_first_index(&mut st, Index(start.last_index.0 + 1));
                st.prev_term = start.last_term;
                self.set_last(&mut st, start);
                st.durable = start.lsn.0;
                st.buf_start = start.lsn.0;
                st.buf_len = 0;
                st.cuts += 1;
                self.end_exclusive(st);
                Ok(())
            }
            Err((segment, error)) => {
                self.poison(&mut st, Failure::new(segment, start.lsn, &error));
                self.end_exclusive(st);
                Err(WalError::SegmentCreate {
                    segment,
                    source: error,
                })
            }
        }
    }

    /// Deletes whole segments all of whose entries have an index below `checkpoint - 1`
    /// (entries covered by a snapshot), oldest first, between a durable truncation marker and
    /// its durable removal, so that recovery finishes an interrupted truncation and can tell
    /// its leftovers from a lost segment. The segment holding `checkpoint - 1` and the last
    /// segment stay: the entries from `checkpoint` on may still be cut (uncommitted ones of a
    /// deposed leader), and the log must then go on right after `checkpoint - 1`, at the Lsn
    /// every other replica placed the next entry at, which only its record tells (simulator
    /// seed 1765). A failure poisons the log.
    /// Returns the new first index. Appends go on while it runs; those that wait for
    /// durability are served once it is done.
    pub fn truncate_prefix(&self, checkpoint: Index) -> Result<Index, WalError> {
        let st = self.exclusive(Exclusive::Prefix)?;
        let removable = st
            .segments
            .iter()
            .zip(st.segments.iter().skip(1))
            .take_while(|(_, next)| next.header.first_index < checkpoint)
            .count();
        let doomed: Vec<Arc<Segment>> = st.segments.iter().take(removable).cloned().collect();
        // The last segment always stays, so there is a first segment kept.
        let keep_lsn = st.segments[removable].first_lsn();
        drop(st);
        let mut removed = 0;
        let mut failure = None;
        if !doomed.is_empty() {
            // First the marker: removals made between two directory fsyncs may reach the disk
            // in any order, and only the marker tells recovery that the gap they leave is
            // this truncation's rather than a lost segment.
            let marker = TruncationMarker {
                kind: TruncationKind::Prefix,
                keep_lsn,
            };
            if let Err(error) = marker::write(&*self.fs, &self.dir, marker) {
                failure = Some((doomed[0].first_lsn(), error));
            }
        }
        if failure.is_none() {
            for segment in &doomed {
                if let Err(error) = self.fs.remove(&segment.path) {
                    failure = Some((segment.first_lsn(), error));
                    break;
                }
                removed += 1;
            }
        }
        if failure.is_none() && removed > 0 {
            // The marker goes only once every removal is durable.
            if let Err(error) = self
                .fs
                .sync_dir(&self.dir)
                .and_then(|()| marker::remove(&*self.fs, &self.dir))
            {
                failure = Some((doomed[0].first_lsn(), error));
            }
        }
        let mut st = self.lock();
        // Segments removed from the directory are gone from the log whether or not the
        // directory fsync worked: the marker makes recovery finish the truncation. A failure
        // poisons the log, even one before any removal: the marker may exist, and it must not
        // outlive this truncation.
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
        self.set_first_index(&mut st, first.first_index);
        st.prev_term = first.prev_term;
        let first_index = st.first_index;
        if let Some((segment, error)) = failure {
            self.poison(&mut st, Failure::new(segment, segment, &error));
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
}
