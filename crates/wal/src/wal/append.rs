//! Appending: entries encoded into the write buffer, and records persisted from a ring.
//!
//! Both paths stage records into `State::buf` under the mutex, following the placement rule
//! (padding up to a block end when a record does not fit), and then wait for the durability
//! asked for through group commit. Neither allocates. Neither stages while a suffix
//! truncation or a restart runs (see the `truncate` module).

use std::sync::MutexGuard;

use crate::error::WalError;
use crate::format::{self, ChainCheck, HEADER_BYTES, RawHeader, RecordKind};
use crate::ring::RecordSource;
use crate::{Durability, Index, Lsn, Position, Term};

use super::state::{Exclusive, Loc, State};
use super::{Entry, Wal};

impl Wal {
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
            st.not_discarded_since(generation)?;
            if st.exclusive == Some(Exclusive::Cut) {
                // The log's end is about to move: staging at it now would lose the entry
                // (see the `truncate` module).
                st = self.wait(st);
                continue;
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
    pub(super) fn staged(
        &self,
        state: &mut State,
        start: u64,
        record: u64,
        index: Index,
        term: Term,
    ) {
        let end = start + record;
        state.buf_len = (end - state.buf_start) as usize;
        state.locs.push_back(Loc {
            lsn: start,
            term,
            record_len: record as u32,
        });
        self.set_last(
            state,
            Position {
                lsn: Lsn(end),
                last_index: index,
                last_term: term,
            },
        );
        if state.buf_len as u64 >= self.config.max_batch_bytes / 2 {
            if let Some(gatherer) = &state.gatherer {
                gatherer.unpark();
            }
        }
    }

    /// The buffer is full: wait for the running flush (or exclusive operation), or flush it
    /// ourselves.
    pub(super) fn make_room<'a>(
        &'a self,
        st: MutexGuard<'a, State>,
    ) -> Result<MutexGuard<'a, State>, WalError> {
        if st.flushing || st.exclusive.is_some() {
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

    /// Persists the records of a ring from the log's end up to `end` (a follower's accepted
    /// range, or a leader's own appends), checking every record (bounds, Lsn tag, index chain,
    /// and, unless `source` holds a private copy of records that already passed it, crc32c)
    /// on the way, and returns when `durability` is reached. `source` is the ring's
    /// [`Consumer`](crate::Consumer), or its producer's [`Verified`](crate::Verified) copy.
    pub fn persist_from<S: RecordSource + ?Sized>(
        &self,
        consumer: &S,
        end: Lsn,
        durability: Durability,
    ) -> Result<Position, WalError> {
        let block = self.config.block_bytes;
        let decode: Decode = if consumer.verified() {
            format::decode_verified
        } else {
            format::decode_record
        };
        if consumer.block_bytes() != block {
            return Err(WalError::Config {
                reason: "the ring's block size differs from the log's",
            });
        }
        let mut st = self.lock();
        let generation = st.generation;
        let cuts = st.cuts;
        let mut staged = false;
        loop {
            st.usable()?;
            st.not_discarded_since(generation)?;
            if st.exclusive == Some(Exclusive::Cut) {
                st = self.wait(st);
                continue;
            }
            if staged && st.cuts != cuts {
                // What this call staged may be gone, and the ring's records no longer
                // continue the log where it now ends.
                return Err(WalError::CutDuringCall { end: st.last.lsn });
            }
            if st.last.lsn >= end {
                break;
            }
            let last = st.last;
            if let Some(view) = consumer.view(last.lsn, end) {
                // A private copy that already passed its checks, contiguous: one copy of
                // as much of it as the buffer takes, then the records staged in place.
                let state = &mut *st;
                let at = (last.lsn.0 - state.buf_start) as usize;
                let n = view.len().min(state.buf.len() - at);
                state.buf[at..at + n].copy_from_slice(&view[..n]);
                let copied_end = last.lsn.0 + n as u64;
                if self.stage_copied(state, copied_end, end, consumer)? {
                    staged = true;
                } else {
                    st = self.make_room(st)?;
                }
                continue;
            }
            let mut header = [0u8; HEADER_BYTES];
            let Some((pos, record_end)) = next_record(last.lsn.0, end, block, consumer, |at| {
                consumer.copy_range(Lsn(at), &mut header)?;
                Ok(Some(header))
            })?
            else {
                unreachable!("a header the source holds is always read");
            };
            if record_end - st.buf_start > st.buf.len() as u64 {
                st = self.make_room(st)?;
                continue;
            }
            let state = &mut *st;
            let (from, to) = (
                (pos - state.buf_start) as usize,
                (record_end - state.buf_start) as usize,
            );
            consumer.copy_range(Lsn(pos), &mut state.buf[from..to])?;
            self.stage_record(state, pos, record_end, decode)?;
            staged = true;
        }
        let position = st.last;
        match durability {
            Durability::Memory => Ok(position),
            _ => self
                .wait_durable(st, position.lsn.0, generation)
                .map(|_| position),
        }
    }

    /// [`Wal::persist_from`]'s walk over records already copied into the buffer up to stream
    /// position `copied_end` (from a verified source): stages every whole record before
    /// `copied_end` and `end`, with the same checks and the same padding as the record-by-record
    /// path, the checksum excepted. Returns whether it staged any record (none: the next one
    /// does not fit in the buffer).
    fn stage_copied<S: RecordSource + ?Sized>(
        &self,
        state: &mut State,
        copied_end: u64,
        end: Lsn,
        source: &S,
    ) -> Result<bool, WalError> {
        let block = self.config.block_bytes;
        let mut any = false;
        while state.last.lsn < end {
            let buf_start = state.buf_start;
            let buf = &state.buf;
            let next = next_record(state.last.lsn.0, end, block, source, |at| {
                let from = (at - buf_start) as usize;
                Ok((at + HEADER_BYTES as u64 <= copied_end)
                    .then(|| buf[from..from + HEADER_BYTES].try_into().expect("a header")))
            })?;
            match next {
                Some((pos, record_end)) if record_end <= copied_end => {
                    self.stage_record(state, pos, record_end, format::decode_verified)?;
                    any = true;
                }
                _ => return Ok(any),
            }
        }
        Ok(any)
    }

    /// Stages the record whose bytes lie in the buffer at stream positions `[pos,
    /// record_end)`, right after the log's end or after a gap (the wal's own padding goes over
    /// it): checked by `decode` (bounds, Lsn tag, and the checksum unless the source was
    /// verified) and by the index chain.
    fn stage_record(
        &self,
        state: &mut State,
        pos: u64,
        record_end: u64,
        decode: Decode,
    ) -> Result<(), WalError> {
        let last = state.last;
        let at = (last.lsn.0 - state.buf_start) as usize;
        let from = (pos - state.buf_start) as usize;
        let to = (record_end - state.buf_start) as usize;
        format::encode_padding(
            &mut state.buf[at..from],
            last.lsn,
            (last.last_index, last.last_term),
        );
        let invalid = |source| WalError::RemoteRange {
            lsn: Lsn(pos),
            index: last.last_index,
            source,
        };
        let decoded =
            decode(&state.buf[from..to], Lsn(pos), self.config.block_bytes).map_err(invalid)?;
        let header = decoded.header;
        let mut chain = ChainCheck {
            last_index: last.last_index,
            last_term: last.last_term,
        };
        chain.advance(&header).map_err(invalid)?;
        self.staged(state, pos, decoded.record_len, header.index, header.term);
        Ok(())
    }
}

/// How [`Wal::persist_from`] checks a record: [`format::decode_record`] or, for a verified
/// source, [`format::decode_verified`].
type Decode = for<'a> fn(&'a [u8], Lsn, u64) -> Result<format::Decoded<'a>, format::DecodeError>;

/// From the log's end `pos`, skips padding and implicit gaps (each header read by
/// `header_at`) up to the next record that is not padding, and returns its start and its end,
/// bounded by its block and by `end`. `Ok(None)`: `header_at` has no header there yet. A
/// header that would reach past `end` is a range error naming what `source` holds.
fn next_record<S: RecordSource + ?Sized>(
    mut pos: u64,
    end: Lsn,
    block: u64,
    source: &S,
    mut header_at: impl FnMut(u64) -> Result<Option<[u8; HEADER_BYTES]>, WalError>,
) -> Result<Option<(u64, u64)>, WalError> {
    let header = loop {
        let rest = format::block_rest(pos, block);
        if rest >= HEADER_BYTES as u64 {
            if pos + HEADER_BYTES as u64 > end.0 {
                let (held_start, held_end) = source.held();
                return Err(WalError::Range {
                    start: Lsn(pos),
                    end,
                    held_start,
                    held_end,
                });
            }
            let Some(bytes) = header_at(pos)? else {
                return Ok(None);
            };
            let header = RawHeader::read(&bytes);
            if header.kind() != Some(RecordKind::Padding) {
                break header;
            }
        }
        pos += rest;
    };
    let claimed = header.claimed_len as usize;
    let record = format::record_bytes(claimed.min(format::max_payload(block))) as u64;
    let record_end = (pos + record)
        .min(pos + format::block_rest(pos, block))
        .min(end.0);
    Ok(Some((pos, record_end)))
}
