//! Reading entries back, and the log's positions.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::error::WalError;
use crate::format::{self, DecodeError, HEADER_BYTES};
use crate::{Index, Lsn, Position, Term};

use super::state::{Exclusive, State};
use super::{Entry, Wal};

impl Wal {
    /// Reads entry `index` into `payload` (resized to fit; reuse it to avoid allocation) and
    /// verifies it. Reads use positioned reads: zero-copy `mmap` of a file needs `unsafe`,
    /// which this crate does not have.
    pub fn read(&self, index: Index, payload: &mut Vec<u8>) -> Result<Entry, WalError> {
        let mut st = self.lock();
        loop {
            if st.exclusive == Some(Exclusive::Cut) {
                // The entry may be half zeroed by the cut: wait for its outcome.
                st = self.wait(st);
                continue;
            }
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
            let segment = st
                .segment_for(loc.lsn)
                .expect("every entry lies in a segment");
            if loc.lsn >= st.buf_start {
                // The write buffer is this process's memory, and a record is placed in it
                // only once checked (`persist_from`) or encoded here (`append`): its checksum
                // is not computed again on the way to raft.
                let at = (loc.lsn - st.buf_start) as usize;
                let decoded = format::decode_verified(&st.buf[at..st.buf_len], entry.lsn, block)
                    .map_err(|source| WalError::ReadCorrupt {
                        segment: segment.first_lsn(),
                        lsn: entry.lsn,
                        index,
                        source,
                    })?;
                payload.clear();
                payload.extend_from_slice(decoded.payload);
                return Ok(entry);
            }
            // The segment outlives the lock for the file read below.
            let segment = Arc::clone(segment);
            let corrupt = |source| WalError::ReadCorrupt {
                segment: segment.first_lsn(),
                lsn: entry.lsn,
                index,
                source,
            };
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
            if self.config.unchecked_reads && payload.len() >= HEADER_BYTES {
                // The mutation: the header's length, no check of anything.
                let mut h = [0; HEADER_BYTES];
                h.copy_from_slice(&payload[..HEADER_BYTES]);
                let claimed = format::RawHeader::read(&h).claimed_len as usize;
                let len = claimed.min(payload.len() - HEADER_BYTES);
                payload.copy_within(HEADER_BYTES..HEADER_BYTES + len, 0);
                payload.truncate(len);
                return Ok(entry);
            }
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
        self.term_and_first(index).0
    }

    /// [`Wal::term`] of `index` and the first index held, read under one lock.
    pub fn term_and_first(&self, index: Index) -> (Option<Term>, Index) {
        let st = self.lock();
        (Self::term_in(&st, index), st.first_index)
    }

    fn term_in(st: &State, index: Index) -> Option<Term> {
        if index.0 + 1 == st.first_index.0 {
            return Some(st.prev_term);
        }
        let offset = index.0.checked_sub(st.first_index.0)?;
        st.locs.get(offset as usize).map(|loc| loc.term)
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

    /// End of the log (buffered entries included) and its last entry; a ring that feeds this
    /// log starts here.
    pub fn position(&self) -> Position {
        self.lock().last
    }

    /// First index held.
    pub fn first_index(&self) -> Index {
        Index(self.first_index.load(Ordering::Acquire))
    }

    /// Last index held (buffered entries included).
    pub fn last_index(&self) -> Index {
        Index(self.last_index.load(Ordering::Acquire))
    }

    /// Everything before this Lsn is durable.
    pub fn durable_lsn(&self) -> Lsn {
        Lsn(self.lock().durable)
    }
}
