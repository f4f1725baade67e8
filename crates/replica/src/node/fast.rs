//! The fast path: a leader writes a follower's entries straight into its ring with one-sided
//! RDMA Writes, then sends a `FastAppend` descriptor behind them on the same connection; the
//! follower validates the bytes it finds there and steps raft as if the append had carried
//! them. Everything else (a probe, a rejected append, a follower behind) takes the slow path:
//! a raft message with its entries.
//!
//! The leader's side is a [`FastPeer`] per connection and the [`Inflight`] writes; the
//! follower's side answers each descriptor with its entries or a [`FastReject`] that names
//! the cause.

use std::collections::VecDeque;
use std::fmt;

use fabric::{ConnState, Fabric, NodeId, WcStatus, WriteRequest};
use raft::StateRole;
use raft::prelude::{Message, MessageType};
use wal::{Index, Lsn, Term};

use super::{MAX_OUTBOX, Replica, RingEntry};
use crate::storage::entry_from_payload_in;
use crate::wire::{self, RingInfo};
use crate::{Mutation, ReplicaError};

/// The most entries' room a follower keeps between takes of placed records (a larger take,
/// rare, gives its vector back to the allocator).
const PLACED_SCRATCH_KEPT: usize = 1024;

/// Where a follower's log ends as far as the leader may write after it: `index` is its last
/// entry (our match for it), `lsn` where its next record goes in its ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct FastEnd {
    pub(super) index: Index,
    pub(super) lsn: Lsn,
}

/// The leader's fast-path state for one peer, valid for one connection in one term.
#[derive(Debug, Default)]
pub(super) struct FastPeer {
    /// The fast-path invariant: `Some` only while this peer's latest response showed its log
    /// ending exactly at `end.index` (our match for it), plus what we have written after it
    /// on this connection since.
    end: Option<FastEnd>,
    /// The highest index sent to this peer on this connection in this term, by either path.
    /// A response re-opens the fast path only when it shows the peer holding at least this
    /// much: an append still in flight could otherwise land after a fast write aimed at the
    /// end the response reported, and the write would go over records the peer accepted
    /// from it.
    sent_to: Index,
    /// The highest index written to this peer on this connection ahead of raft
    /// ([`Replica::propose_direct`]), while no failure or slow append closed the fast path
    /// since: raft's own appends of those entries are already on the wire and are not sent
    /// again ([`Replica::drop_direct_sent`]).
    direct_to: Index,
}

impl FastPeer {
    /// Where the next fast write to this peer goes, if the invariant holds.
    pub(super) fn end(&self) -> Option<FastEnd> {
        self.end
    }

    /// Leaves the fast path until a response re-opens it (a failed write, a slow append).
    /// What was written ahead of raft may not have arrived: raft's appends go out again.
    pub(super) fn close(&mut self) {
        self.end = None;
        self.direct_to = Index(0);
    }

    /// The highest index written to this peer ahead of raft and not known lost since.
    pub(super) fn direct_to(&self) -> Index {
        self.direct_to
    }

    /// Records a fast write ahead of raft up to `index`.
    pub(super) fn wrote_direct(&mut self, index: Index) {
        self.direct_to = self.direct_to.max(index);
    }

    /// A new connection, term or role: nothing was sent on it yet.
    pub(super) fn reset(&mut self) {
        *self = FastPeer::default();
    }

    /// Records that an append (or a snapshot) up to `index` went to this peer.
    pub(super) fn sent(&mut self, index: Index) {
        self.sent_to = self.sent_to.max(index);
    }

    /// Records a fast write that leaves the peer's log ending at `end`.
    fn wrote(&mut self, end: FastEnd) {
        self.end = Some(end);
    }

    /// The highest index sent to this peer on this connection in this term.
    pub(super) fn sent_to(&self) -> Index {
        self.sent_to
    }

    /// An append response of the current term: `reject`, the index it answers (`acked`),
    /// and the follower's log and ring end as its ring info reports them.
    /// `guard_sent` is false only under the test-only [`Mutation::ReopenFastPathEarly`].
    pub(super) fn on_response(
        &mut self,
        reject: bool,
        acked: Index,
        last_index: Index,
        ring_end: Lsn,
        guard_sent: bool,
    ) {
        if reject {
            self.close();
        } else if last_index == acked {
            // Only when nothing we sent lies beyond the end it reports (our own fast appends
            // after it, or a slow append it has not answered yet): raft may send the next
            // append from this very index again, and a write aimed there would go over
            // records that append placed (issue 13, defect 7; simulator seed 53809).
            if last_index >= self.sent_to || !guard_sent {
                self.end = Some(FastEnd {
                    index: last_index,
                    lsn: ring_end,
                });
            }
        } else if self.end.is_some_and(|e| e.index < last_index) {
            // The follower holds entries we did not write: never write over them.
            self.close();
        }
    }
}

/// A write completion that counts a follower as holding entries up to `index`, as its append
/// response in `term` (see [`Replica::acks_unstepped`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct NicAck {
    pub(super) peer: u64,
    pub(super) index: Index,
    pub(super) term: Term,
}

/// A signaled RDMA Write still in flight: which peer it goes to, and the Lsn it starts at
/// (our ring may not be reused from there until it completes); the term it was posted in,
/// and, on the last write of an append, the append's last index: under
/// `Durability::Replicated` its completion is the peer's acknowledgement of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct InflightWrite {
    pub(super) peer: u64,
    pub(super) lsn: Lsn,
    pub(super) term: Term,
    pub(super) last: Option<Index>,
}

/// The leader's in-flight fast writes, by work-request id, in id order. Ids are handed out in
/// increasing order and complete mostly in it, so a short ordered queue beats a map: an
/// insert is a push, a completion usually takes the front.
#[derive(Debug, Default)]
pub(super) struct Inflight(VecDeque<(u64, InflightWrite)>);

impl Inflight {
    fn insert(&mut self, wr_id: u64, w: InflightWrite) {
        match self.0.back() {
            Some(&(last, _)) if last >= wr_id => {
                // Not in order after all: keep the queue sorted (one entry per id).
                match self.0.binary_search_by_key(&wr_id, |&(id, _)| id) {
                    Ok(i) => self.0[i].1 = w,
                    Err(i) => self.0.insert(i, (wr_id, w)),
                }
            }
            _ => self.0.push_back((wr_id, w)),
        }
    }

    /// The write a completion belongs to.
    fn complete(&mut self, wr_id: u64) -> Option<InflightWrite> {
        if self.0.front().is_some_and(|&(id, _)| id == wr_id) {
            return self.0.pop_front().map(|(_, w)| w);
        }
        let i = self.0.binary_search_by_key(&wr_id, |&(id, _)| id).ok()?;
        self.0.remove(i).map(|(_, w)| w)
    }

    /// Whether no write is in flight.
    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Forgets the writes to `peer` (its connection is gone, so they never complete).
    pub(super) fn forget_peer(&mut self, peer: u64) {
        self.0.retain(|(_, w)| w.peer != peer);
    }

    /// Forgets every write, returning them.
    pub(super) fn take_all(&mut self) -> Vec<InflightWrite> {
        std::mem::take(&mut self.0)
            .into_iter()
            .map(|(_, w)| w)
            .collect()
    }

    /// The lowest Lsn an in-flight write still reads from.
    pub(super) fn pinned_from(&self) -> Option<Lsn> {
        self.0.iter().map(|(_, w)| w.lsn).min()
    }
}

#[cfg(test)]
mod inflight_tests {
    use super::*;

    fn write(peer: u64, lsn: u64) -> InflightWrite {
        InflightWrite {
            peer,
            lsn: Lsn(lsn),
            term: Term(1),
            last: None,
        }
    }

    #[test]
    fn completions_find_their_write_in_any_order() {
        let mut f = Inflight::default();
        for id in [1, 2, 3, 5, 4] {
            f.insert(id, write(id % 2, id * 8));
        }
        f.insert(3, write(7, 99));
        assert_eq!(f.pinned_from(), Some(Lsn(8)));
        assert_eq!(f.complete(3), Some(write(7, 99)));
        assert_eq!(f.complete(3), None);
        assert_eq!(f.complete(1), Some(write(1, 8)));
        assert_eq!(f.complete(9), None);
        assert_eq!(f.pinned_from(), Some(Lsn(16)));
        f.forget_peer(0);
        assert_eq!(f.take_all(), vec![write(1, 40)]);
        assert_eq!(f.pinned_from(), None);
    }
}

/// Why a follower refused a fast append. It then answers as if the append had carried no
/// entries (raft acks the prefix it has or rejects with a hint), and the leader falls back to
/// the slow path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum FastReject {
    /// Not from the leader of our term on the connection we granted.
    NotGranted,
    /// The descriptor does not continue our log (its previous index or term differs).
    LogEnd,
    /// The descriptor's first byte is not where our ring ends.
    RingPosition { ours: Lsn, descriptor: Lsn },
    /// No entries, or an empty byte range.
    Empty,
    /// The bytes failed the ring's checks (crc, index chain, term).
    Records(String),
    /// The records end at another index than the descriptor's last entry.
    LastIndex { records: Index, descriptor: Index },
    /// A record the descriptor names is not in the ring.
    MissingRecord { lsn: Lsn },
    /// A record's header differs from the descriptor's entry.
    Header {
        index: Index,
        term: Term,
        want_index: Index,
        want_term: Term,
    },
    /// A record's payload is not an entry.
    Payload(String),
}

impl FastReject {
    /// Whether the ring's records were read (and the producer moved) before the refusal.
    fn looked_at_the_bytes(&self) -> bool {
        !matches!(
            self,
            FastReject::NotGranted
                | FastReject::LogEnd
                | FastReject::RingPosition { .. }
                | FastReject::Empty
        )
    }
}

impl fmt::Display for FastReject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FastReject::NotGranted => {
                write!(
                    f,
                    "not from the leader of our term on its granted connection"
                )
            }
            FastReject::LogEnd => write!(f, "does not continue our log"),
            FastReject::RingPosition { ours, descriptor } => {
                write!(f, "starts at {descriptor}, our ring ends at {ours}")
            }
            FastReject::Empty => write!(f, "carries no entries"),
            FastReject::Records(e) => write!(f, "records fail their checks: {e}"),
            FastReject::LastIndex {
                records,
                descriptor,
            } => write!(
                f,
                "records end at {records}, the descriptor at {descriptor}"
            ),
            FastReject::MissingRecord { lsn } => write!(f, "no record at {lsn}"),
            FastReject::Header {
                index,
                term,
                want_index,
                want_term,
            } => write!(
                f,
                "record of {index} {term} where the descriptor has {want_index} {want_term}"
            ),
            FastReject::Payload(e) => write!(f, "a record's payload is not an entry: {e}"),
        }
    }
}

impl<F: Fabric> Replica<F> {
    /// A leader's fast-path state belongs to its term: after any change of term or role it
    /// is dropped, so a re-elected former leader never writes from a stale end.
    pub(super) fn forget_stale_fast_paths(&mut self) {
        let now = (self.raw.raft.term, self.raw.raft.state == StateRole::Leader);
        if now != self.fast_epoch {
            self.fast_epoch = now;
            for p in self.peers.values_mut() {
                p.fast.reset();
            }
            if self.cfg.mutation == Mutation::NicAckBeforeGrant && now.1 {
                // The mutation: a new leader takes every follower to hold its whole log and
                // writes from there at once, on whatever grant the follower's connection
                // still has, before any response of its term showed one.
                let pos = self.producer.position();
                let end = FastEnd {
                    index: pos.last_index,
                    lsn: pos.lsn,
                };
                for p in self.peers.values_mut() {
                    p.fast.wrote(end);
                }
            }
        }
    }

    /// Leader: a follower's ring info, riding on its raft message.
    pub(super) fn on_ring_info(&mut self, peer: u64, m: &Message, r: RingInfo) {
        if self.raw.raft.state != StateRole::Leader {
            return;
        }
        let Some(p) = self.peers.get_mut(&peer) else {
            return;
        };
        p.ring_head = Lsn(r.ring_head);
        if m.term != self.raw.raft.term {
            return;
        }
        // raft-rs never lowers what it counts as a follower's: one that lost entries (a
        // record cut at recovery, a lost ring) would never be sent them again. Count only
        // what it holds, and probe it from there.
        // Under Replicated the leader counts its writes as the follower's when they
        // complete, so a response that left before the follower took them shows less than
        // raft counts: that is lag, not loss, while something sent on this connection is
        // still unanswered. A follower that lost entries comes back on a new connection.
        let lagging = self.cfg.durability.commits_on_nic_ack()
            && !m.reject
            && Index(r.last_index) < p.fast.sent_to();
        if let Some(pr) = self.raw.raft.mut_prs().get_mut(peer) {
            if r.last_index < pr.matched && !lagging {
                pr.matched = r.last_index;
                pr.become_probe();
                self.stats.followers_rewound += 1;
                p.fast.close();
                self.raw.raft.send_append(peer);
                return;
            }
        }
        if m.get_msg_type() == MessageType::MsgAppendResponse {
            let guard_sent = self.cfg.mutation != Mutation::ReopenFastPathEarly;
            p.fast.on_response(
                m.reject,
                Index(m.index),
                Index(r.last_index),
                Lsn(r.ring_end),
                guard_sent,
            );
        }
    }

    /// Follower: a leader's descriptor of entries it wrote into our ring.
    pub(super) fn on_fast_append(
        &mut self,
        peer: u64,
        mut m: Message,
        lsn_start: Lsn,
        lsn_end: Lsn,
    ) -> Result<(), ReplicaError> {
        if m.term > self.raw.raft.term {
            self.fence_ring();
        }
        if !self.cfg.durability.commits_on_nic_ack()
            && m.term == self.raw.raft.term
            && self.granted == Some(peer)
            && lsn_start < self.producer.position().lsn
        {
            // Under Replicated the records of an earlier write may already have been taken
            // as placed, so this holds only for the other modes.
            tracing::warn!(
                peer,
                lsn_start = lsn_start.0,
                tail = self.producer.position().lsn.0,
                "the leader wrote over records this follower had accepted"
            );
            self.stats.fast_overwrites += 1;
        }
        if self.cfg.durability.commits_on_nic_ack() {
            // The leader counted these bytes when its write completed: take them whatever
            // the descriptor says, then answer for what the log holds.
            self.take_placed();
            if self.holds_descriptor(&m) {
                let last = Index(m.entries.last().expect("held: not empty").index);
                let leader = m.from;
                let queued = self.raw.raft.msgs.len();
                self.step(m);
                self.answer_quietly(leader, last, queued);
                return Ok(());
            }
        }
        let pos = self.producer.position();
        let checked = self
            .check_fast_descriptor(peer, &m, lsn_start, lsn_end)
            .and_then(|()| self.accept_fast(&mut m, lsn_end));
        let why = match checked {
            Ok(()) => {
                self.step(m);
                return Ok(());
            }
            Err(why) => why,
        };
        if why.looked_at_the_bytes() {
            if self.cfg.mutation == Mutation::AckBeforeCrc
                && self.cfg.durability.ring_in_shared_memory()
            {
                // The mutation: take what the descriptor claims without the bytes that
                // failed their checks, and acknowledge it.
                self.producer.rewind(pos)?;
                self.step(m);
                return Ok(());
            }
            self.producer.rewind(pos)?;
        }
        tracing::debug!(peer, index = m.index, %why, "fast append refused");
        self.stats.fast_rejected += 1;
        if m.term < self.raw.raft.term {
            return Ok(()); // a stale leader's descriptor: ignore it.
        }
        // Let raft answer as if the append carried no entries: it acks the prefix it has or
        // rejects with a hint, and the leader falls back to the slow path.
        m.set_entries(Vec::new().into());
        self.step(m);
        Ok(())
    }

    /// What a descriptor must satisfy before its bytes are looked at.
    fn check_fast_descriptor(
        &self,
        peer: u64,
        m: &Message,
        lsn_start: Lsn,
        lsn_end: Lsn,
    ) -> Result<(), FastReject> {
        let r = &self.raw.raft;
        if m.term != r.term
            || r.state != StateRole::Follower
            || r.leader_id != peer
            || self.granted != Some(peer)
        {
            return Err(FastReject::NotGranted);
        }
        let log = &r.raft_log;
        if log.last_index() != m.index || log.term(m.index).ok() != Some(m.log_term) {
            return Err(FastReject::LogEnd);
        }
        let pos = self.producer.position();
        if pos.lsn != lsn_start || pos.last_index.0 != m.index {
            return Err(FastReject::RingPosition {
                ours: pos.lsn,
                descriptor: lsn_start,
            });
        }
        if m.entries.is_empty() || lsn_end <= lsn_start {
            return Err(FastReject::Empty);
        }
        Ok(())
    }

    /// Validates the leader's bytes and builds raft's entries from them, in place of the
    /// descriptor's (which name each entry's index and term, without payload): raft steps
    /// the message with the vector its decode made, and no other is allocated. On an error
    /// some of the descriptor's entries may already be replaced.
    fn accept_fast(&mut self, m: &mut Message, lsn_end: Lsn) -> Result<(), FastReject> {
        let kept = self.ring_entries.len();
        let r = self.accept_fast_inner(m, lsn_end);
        if r.is_err() {
            self.ring_entries.truncate(kept);
        }
        r
    }

    fn accept_fast_inner(&mut self, m: &mut Message, lsn_end: Lsn) -> Result<(), FastReject> {
        let before = self.producer.position();
        // The entries are built from the copy the ring's checks just verified (one read and
        // one checksum per record on this side); the first mismatch with the descriptor is
        // reported after the records' own checks, as a reader of them one by one would.
        let named = m.entries.len();
        let mut built = 0;
        let mut mismatch = None;
        let mut pos = before.lsn;
        let ring_entries = &mut self.ring_entries;
        let arena = &mut self.arena;
        let after = self
            .producer
            .accept_written_each(lsn_end, |lsn, d| {
                let Some(want) = m.entries.get_mut(built).filter(|_| mismatch.is_none()) else {
                    return;
                };
                let (index, term) = (d.header.index.0, d.header.term.0);
                if index != want.index || term != want.term {
                    mismatch = Some(FastReject::Header {
                        index: d.header.index,
                        term: d.header.term,
                        want_index: Index(want.index),
                        want_term: Term(want.term),
                    });
                    return;
                }
                match entry_from_payload_in(arena, index, term, d.payload) {
                    Ok(entry) => {
                        *want = entry;
                        built += 1;
                    }
                    Err(e) => {
                        mismatch = Some(FastReject::Payload(e));
                        return;
                    }
                }
                let entry = RingEntry::checked(lsn, d);
                ring_entries.push_back(entry);
                pos = entry.end;
            })
            .map_err(|e| FastReject::Records(e.to_string()))?;
        let want_last = Index(m.entries.last().map_or(0, |e| e.index));
        if after.last_index != want_last {
            return Err(FastReject::LastIndex {
                records: after.last_index,
                descriptor: want_last,
            });
        }
        if let Some(reject) = mismatch {
            return Err(reject);
        }
        if built < named {
            return Err(FastReject::MissingRecord { lsn: pos });
        }
        self.fast_accepted_to = want_last.0;
        Ok(())
    }

    /// Follower, Replicated: whether the log already holds every entry a descriptor names
    /// (taken from the ring before the descriptor arrived), from its own leader in our term.
    /// raft then matches the descriptor's entries against the log without their payloads
    /// and answers with their last index.
    fn holds_descriptor(&self, m: &Message) -> bool {
        let r = &self.raw.raft;
        m.term == r.term
            && r.state == StateRole::Follower
            && r.leader_id == m.from
            && !m.entries.is_empty()
            && r.raft_log.term(m.index).ok() == Some(m.log_term)
            && m.entries
                .iter()
                .all(|e| r.raft_log.term(e.index).ok() == Some(e.term))
    }

    /// Follower, Replicated: drops raft's answer to a descriptor this node held, when it says
    /// only what the leader already counted. The leader stepped that very response when the
    /// write that placed the entries completed (a descriptor arrives behind its write on the
    /// same reliable connection, so the write had landed); sending it too would cost both
    /// sides a message, a decode and a raft step per append for nothing. Raft tolerates lost
    /// messages, so this can cost liveness at most, never safety, and it does not: if the
    /// write's completion failed instead, the leader's raft still counts the follower behind,
    /// its next append or heartbeat goes by the slow path, and the answer to that is sent.
    /// A refusal, or an answer to anything but a held descriptor, always goes.
    ///
    /// The answer also carries our ring head, the leader's flow control: it is sent anyway
    /// once the head moved a quarter of the ring since the last report, so the leader's view
    /// of our free room never lags more than that (a stale view is only ever too small: the
    /// leader then sends by the slow path, whose answer reports the head).
    ///
    /// `queued` is how many messages raft held before it stepped the descriptor: only the
    /// one that step added is looked at.
    fn answer_quietly(&mut self, leader: u64, last: Index, queued: usize) {
        let moved = self
            .consumer
            .head()
            .0
            .saturating_sub(self.ring_head_reported.0);
        if moved >= self.cfg.ring_bytes / 4 {
            return;
        }
        let r = &mut self.raw.raft;
        let only_counted = r.msgs.len() == queued + 1
            && r.msgs.last().is_some_and(|a| {
                a.get_msg_type() == MessageType::MsgAppendResponse
                    && a.to == leader
                    && a.term == r.term
                    && !a.reject
                    && a.index == last.0
            });
        if only_counted {
            r.msgs.pop();
            self.stats.answers_skipped += 1;
        }
    }

    /// Follower, Replicated: takes into raft's log every record our leader placed in the ring
    /// past its end (valid, continuing the chain, of no term above ours), as if an append had
    /// carried them. The leader counted them as ours when its writes completed, so they must
    /// be in the log before this node votes, campaigns or steps a higher term: the grant is
    /// revoked first ([`Replica::fence_ring`]), then this runs. Only the ring opened at the
    /// last grant is read ([`Replica::open_ring_to_writes`] cleared it first), so nothing but
    /// that grant's leader's records can be taken.
    pub(super) fn take_placed(&mut self) {
        if !self.cfg.durability.commits_on_nic_ack()
            || !self.producer.open_to_remote()
            || self.cfg.mutation == Mutation::NoPlacedTake
        {
            return;
        }
        let pos = self.producer.position();
        let log = &self.raw.raft.raft_log;
        // An append raft took is not in the ring until the next Ready: nothing the leader
        // counted lies past it (it writes only after the end a response reported, and a
        // slow append closes its fast path), and records after it would not chain.
        if pos.last_index.0 != log.last_index() {
            return;
        }
        // Raft's entries come from the very copy the checks saw, as the other modes' do: no
        // second read of the ring, no second checksum.
        // raft's log clones what it appends: the vector is ours and kept for the next take.
        let mut entries = std::mem::take(&mut self.placed_scratch);
        entries.clear();
        let mut good = pos;
        let mut not_entry = false;
        let ring_entries = &mut self.ring_entries;
        let arena = &mut self.arena;
        let (_, n) = self
            .producer
            .accept_placed_each(Term(self.raw.raft.term), |lsn, d| {
                if not_entry {
                    return;
                }
                let Ok(e) =
                    entry_from_payload_in(arena, d.header.index.0, d.header.term.0, d.payload)
                else {
                    not_entry = true;
                    return;
                };
                entries.push(e);
                let entry = RingEntry::checked(lsn, d);
                ring_entries.push_back(entry);
                good = wal::Position {
                    lsn: entry.end,
                    last_index: entry.index,
                    last_term: entry.term,
                };
            });
        if n > 0 && not_entry {
            // A checked record whose payload is not an entry: the log ends before it.
            let _ = self.producer.rewind(good);
        }
        if let (Some(first), Some(last)) = (entries.first(), entries.last()) {
            // A descriptor names only its batch's last entry: the follower saw the batch here.
            super::step!(self.cfg.id, "received", first.index, last.index);
            let last = last.index;
            self.raw.raft.raft_log.append(&entries);
            self.fast_accepted_to = last;
            self.stats.placed_taken += entries.len() as u64;
        }
        entries.clear();
        if entries.capacity() <= PLACED_SCRATCH_KEPT {
            self.placed_scratch = entries;
        }
    }

    /// Follower: ends remote write on our ring (the grant's connection is revoked, or gone),
    /// then, under Replicated, takes what the leader placed and marks the ring closed, so a
    /// crash of this process from here on takes nothing past the published end.
    pub(super) fn fence_ring(&mut self) {
        self.revoke();
        if self.producer.open_to_remote() && self.granted.is_none() {
            self.take_placed();
            self.producer.set_open_to_remote(false);
        }
    }

    /// Follower, Replicated: before a grant to `leader`, takes what an earlier connection of
    /// the same grant placed, clears the ring's free part (so no record of another log, and
    /// no bytes of an earlier grant, can pass for this leader's), and marks the ring open in
    /// its tail file for recovery after a crash of this process.
    pub(super) fn open_ring_to_writes(&mut self) {
        if !self.cfg.durability.commits_on_nic_ack() {
            return;
        }
        if self.producer.open_to_remote() {
            self.take_placed();
        }
        self.producer.clear_free();
        self.producer.set_open_to_remote(true);
    }

    /// Leader: sends `m` (a non-empty append) by the fast path if the invariant holds for its
    /// peer; `false` means nothing was sent and the caller takes the slow path. `ahead`: the
    /// entries are written ahead of raft ([`crate::node::direct`]), which will not send them
    /// again on this connection.
    pub(super) fn try_fast_append(&mut self, m: &Message, ahead: bool) -> bool {
        let to = m.to;
        let peer = NodeId(to);
        let Some(p) = self.peers.get(&to) else {
            return false;
        };
        let (Some(remote), Some(fast_end)) = (p.remote, p.fast.end()) else {
            return false;
        };
        // Writes need no send credits: with none left (or frames already queued) the bytes go
        // out now and the descriptor waits in the outbox. It is posted later on the same
        // connection, so it still arrives after the bytes are visible.
        if fast_end.index.0 != m.index
            || p.outbox.len() >= MAX_OUTBOX
            || self.fabric.conn_state(peer) != ConnState::Up
        {
            return false;
        }
        // Our ring must hold every entry of the message, with the same terms, contiguous from
        // the follower's end.
        let first = m.entries[0].index;
        let Some((k, _)) = self.ring_entry(first) else {
            return false;
        };
        let mut last_end = 0;
        for (j, e) in m.entries.iter().enumerate() {
            match self.ring_entries.get(k + j) {
                Some(r) if r.index.0 == e.index && r.term.0 == e.term => last_end = r.end.0,
                _ => return false,
            }
        }
        let start = fast_end.lsn.0;
        let first_start = self.ring_entries[k].start.0;
        let prev_end_ok = k == 0 || self.ring_entries[k - 1].end.0 == start;
        if start < self.consumer.head().0 || start > first_start || !prev_end_ok {
            return false;
        }
        let end = last_end;
        // Flow control: never past the follower's head plus its capacity.
        if end.saturating_sub(p.ring_head.0) > remote.len_bytes {
            return false;
        }
        let cap_local = self.cfg.ring_bytes;
        let cap_remote = remote.len_bytes;
        let mut pos = start;
        while pos < end {
            let loff = pos % cap_local;
            let roff = pos % cap_remote;
            let n = (end - pos).min(cap_local - loff).min(cap_remote - roff);
            let wr_id = self.next_wr_id;
            self.next_wr_id += 1;
            let wr = WriteRequest {
                wr_id,
                local: self.ring_local,
                local_offset: loff,
                remote,
                remote_offset: roff,
                len_bytes: n,
                signaled: true,
            };
            if self.fabric.post_write(peer, wr).is_err() {
                if let Some(p) = self.peers.get_mut(&to) {
                    p.fast.close();
                }
                return false;
            }
            pos += n;
            let last = (pos == end).then(|| Index(m.entries.last().expect("non-empty").index));
            self.writes_in_flight.insert(
                wr_id,
                InflightWrite {
                    peer: to,
                    lsn: Lsn(pos - n),
                    term: Term(m.term),
                    last,
                },
            );
        }
        let cluster_id = self.cfg.cluster_id;
        if self.cfg.durability.commits_on_nic_ack() {
            // The follower takes the records from its ring before the descriptor arrives
            // (`take_placed`); the descriptor only asks it to answer for them. It names the
            // batch's last entry and the one before: a log holding both with these terms
            // holds the whole batch (Log Matching), so a descriptor costs the same at any
            // batch size, to encode, to decode and to step.
            self.send_frame(to, |buf| {
                wire::encode_fast_append_last(cluster_id, m, start, end, buf)
            });
        } else {
            self.send_frame(to, |buf| {
                wire::encode_fast_append(cluster_id, m, start, end, buf)
            });
        }
        let last = m.entries.last().expect("non-empty").index;
        if let Some(p) = self.peers.get_mut(&to) {
            p.fast.wrote(FastEnd {
                index: Index(last),
                lsn: Lsn(end),
            });
            if ahead {
                p.fast.sent(Index(last));
                p.fast.wrote_direct(Index(last));
            }
        }
        self.stats.fast_appends += 1;
        self.stats.fast_bytes += end - start;
        true
    }

    /// Leader: a fast write completed. A failed one (fenced, retries exceeded, flushed)
    /// closes its peer's fast path.
    pub(super) fn on_write_completion(&mut self, wr_id: u64, status: WcStatus) {
        let write = self.writes_in_flight.complete(wr_id);
        if status == WcStatus::Success {
            if let Some(w) = write {
                self.on_placed(w);
            }
            return;
        }
        // Raft re-sends what the failed write carried: it must know of the proposals made
        // ahead of it first.
        self.step_deferred();
        if status == WcStatus::RemoteAccess {
            self.stats.fenced_writes += 1;
        }
        if let Some(p) = write.and_then(|w| self.peers.get_mut(&w.peer)) {
            p.fast.close();
        }
    }

    /// Leader, Replicated: the last write of an append completed, so the follower's NIC
    /// placed its entries in the follower's ring. If the write went out in this term, as
    /// leader, on a fast path that a response of this term opened (the follower granted this
    /// connection after it made this term durable, and revokes before it leaves it), count
    /// the follower as holding them: raft gets the append response the follower's CPU would
    /// have sent. A write unpinned before it completed never gets here (its source bytes may
    /// have been reused), nor one whose connection went down.
    fn on_placed(&mut self, w: InflightWrite) {
        let r = &self.raw.raft;
        let Some(last) = w.last else {
            return;
        };
        if !self.cfg.durability.commits_on_nic_ack() || r.state != StateRole::Leader {
            return;
        }
        if w.term.0 != r.term && self.cfg.mutation != Mutation::NicAckBeforeGrant {
            return;
        }
        let ack = NicAck {
            peer: w.peer,
            index: last,
            term: Term(r.term),
        };
        self.stats.nic_acks += 1;
        super::step!(self.cfg.id, "nic_acked", last.0, last.0);
        self.acks_unstepped.push(ack);
        if !self.defer_nic_acks {
            self.step_nic_acks();
        }
    }

    /// Steps the write completions' append responses into raft (see
    /// [`Replica::acks_unstepped`]), in the order they came, and checks that raft's commit
    /// index then reaches every ticket [`Replica::nic_quorum_reaches`] resolved.
    #[inline(always)]
    pub(super) fn step_nic_acks(&mut self) {
        if !self.acks_unstepped.is_empty() {
            self.step_nic_acks_now();
        }
    }

    #[inline(never)]
    fn step_nic_acks_now(&mut self) {
        // Raft's log must hold what the responses acknowledge.
        self.step_deferred();
        let mut acks = std::mem::take(&mut self.acks_unstepped);
        for a in acks.drain(..) {
            let mut ack = Message::default();
            ack.set_msg_type(MessageType::MsgAppendResponse);
            ack.from = a.peer;
            ack.to = self.cfg.id;
            ack.term = a.term.0;
            ack.index = a.index.0;
            let _ = self.raw.step(ack);
        }
        // Keep the buffer: no allocation per completion.
        self.acks_unstepped = acks;
    }

    /// Checks, once raft has stepped every write completion and proposal made ahead of it
    /// and persisted its own entries (the end of a `Ready`), that its commit index reaches
    /// every ticket [`Replica::nic_quorum_reaches`] resolved. Always on (a load and a
    /// compare per `Ready`): a caller told of a commit that raft does not make is the one
    /// thing this path must never do, and the simulator's release runs check it too. A panic
    /// here fail-stops the replica.
    pub(super) fn check_nic_promises(&self) {
        if !self.acks_unstepped.is_empty() || !self.deferred.is_empty() {
            return;
        }
        let r = &self.raw.raft;
        let (term, promised) = self.nic_promised.get();
        assert!(
            r.term != term || r.state != StateRole::Leader || r.raft_log.committed >= promised,
            "a ticket at {promised} resolved from write completions that raft, stepping them, \
             did not commit (commit {})",
            r.raft_log.committed
        );
    }

    /// Whether the unstepped write completions, once stepped, commit `index` (an entry of
    /// the term this node leads): the voters whose matched index reaches it, counting them,
    /// are a quorum by raft-rs's rule (a majority of the voters; in a joint configuration
    /// raft-rs's own `has_quorum`, and debug builds check the majority against it). Terms
    /// never fall along the log and a leader's log holds no term above its own, so every
    /// index from `index` on is of this term and raft-rs's term condition holds with no
    /// look-up.
    pub(super) fn nic_quorum_reaches(&self, index: Index) -> bool {
        let r = &self.raw.raft;
        if self.acks_unstepped.is_empty() || r.state != StateRole::Leader {
            return false;
        }
        if self.cfg.mutation == crate::Mutation::NicQuorumAnyIndex {
            return true;
        }
        // A membership change in raft's log past `applied` (at an election raft takes every
        // entry it holds for one) may apply at the next `Ready` before raft counts this leader
        // for an entry proposed ahead of it, and raft then counts with the new configuration,
        // in which the holders counted here may be no quorum: until it applies, tickets wait
        // for raft's commit (`a_membership_change_between_a_resolution_and_raft_does_not_stop_the_leader`).
        if r.pending_conf_index > self.applied {
            return false;
        }
        // A waiter asks again and again between events: remember the last answer until an
        // event (the work counter), a new completion or a new term can change it.
        let key = (self.work, self.acks_unstepped.len(), r.term, index.0);
        if let Some((k, reaches)) = self.quorum_memo.get()
            && k == key
        {
            return reaches;
        }
        // The leader holds what its ring holds of its term: raft counts it at its next
        // `Ready`, which persists from there ([`crate::node::direct`]).
        let holds = |id: u64| {
            r.prs().get(id).is_some_and(|pr| pr.matched >= index.0)
                || (id == self.cfg.id
                    && self
                        .ring_entry(index.0)
                        .is_some_and(|(_, e)| e.term.0 == r.term))
                || self
                    .acks_unstepped
                    .iter()
                    .any(|a| a.peer == id && a.term.0 == r.term && a.index >= index)
        };
        // The configuration raft counts with is the one this node stored with it (both change
        // together: at a conf change's apply, and a leader restores no snapshot). Outside a
        // joint configuration a quorum is a majority of its voters.
        let cs = self.raw.store().conf_state();
        let reaches = if cs.voters_outgoing.is_empty() {
            let holding = cs.voters.iter().filter(|&&id| holds(id)).count();
            holding > cs.voters.len() / 2
        } else {
            self.has_quorum_of(&holds)
        };
        debug_assert_eq!(
            reaches,
            self.has_quorum_of(&holds),
            "the stored configuration disagrees with raft's"
        );
        self.quorum_memo.set(Some((key, reaches)));
        reaches
    }

    /// Whether the nodes for which `holds` is true are a quorum by raft-rs's own rule
    /// (`ProgressTracker::has_quorum`, both halves of a joint configuration).
    fn has_quorum_of(&self, holds: &impl Fn(u64) -> bool) -> bool {
        let r = &self.raw.raft;
        let mut holding = self.quorum_scratch.borrow_mut();
        holding.clear();
        holding.extend(r.prs().iter().map(|(&id, _)| id).filter(|&id| holds(id)));
        r.prs().has_quorum(&holding)
    }

    /// Stops in-flight writes from pinning ring space; their peers leave the fast path until
    /// their next response re-establishes it.
    pub(super) fn unpin_writes(&mut self) {
        for w in self.writes_in_flight.take_all() {
            if let Some(p) = self.peers.get_mut(&w.peer) {
                p.fast.close();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open_at(index: u64, lsn: u64) -> FastPeer {
        let mut p = FastPeer::default();
        p.sent(Index(index));
        p.on_response(false, Index(index), Index(index), Lsn(lsn), true);
        assert_eq!(
            p.end(),
            Some(FastEnd {
                index: Index(index),
                lsn: Lsn(lsn)
            })
        );
        p
    }

    #[test]
    fn a_response_opens_the_fast_path_at_the_end_it_reports() {
        let p = open_at(10, 4096);
        assert_eq!(
            p.end(),
            Some(FastEnd {
                index: Index(10),
                lsn: Lsn(4096)
            })
        );
    }

    #[test]
    fn a_response_behind_what_was_sent_does_not_reopen_it() {
        // An append up to 12 is in flight; a response showing the log at 10 must not aim the
        // next write at 10's end, where that append's records will land.
        let mut p = FastPeer::default();
        p.sent(Index(12));
        p.on_response(false, Index(10), Index(10), Lsn(4096), true);
        assert_eq!(p.end(), None);
        p.on_response(false, Index(12), Index(12), Lsn(5000), true);
        assert_eq!(p.end().map(|e| e.index), Some(Index(12)));
    }

    #[test]
    fn a_reject_closes_it_and_so_does_a_follower_holding_more() {
        let mut p = open_at(10, 4096);
        p.on_response(true, Index(10), Index(10), Lsn(4096), true);
        assert_eq!(p.end(), None);

        let mut p = open_at(10, 4096);
        // The follower answers an older append while holding entries we did not write.
        p.on_response(false, Index(8), Index(11), Lsn(4500), true);
        assert_eq!(p.end(), None);

        let mut p = open_at(10, 4096);
        p.wrote(FastEnd {
            index: Index(14),
            lsn: Lsn(6000),
        });
        // An ack of an earlier append that our writes already went past keeps the end.
        p.on_response(false, Index(9), Index(12), Lsn(5000), true);
        assert_eq!(p.end().map(|e| e.index), Some(Index(14)));
    }

    #[test]
    fn a_reset_forgets_what_was_sent() {
        let mut p = open_at(10, 4096);
        p.sent(Index(20));
        p.reset();
        assert_eq!(p.end(), None);
        p.on_response(false, Index(5), Index(5), Lsn(100), true);
        assert_eq!(
            p.end().map(|e| e.index),
            Some(Index(5)),
            "a new term starts from scratch"
        );
    }

    #[test]
    fn inflight_writes_pin_from_their_lowest_lsn_until_completed_or_forgotten() {
        let w = |peer, lsn| InflightWrite {
            peer,
            lsn: Lsn(lsn),
            term: Term(1),
            last: None,
        };
        let mut f = Inflight::default();
        assert_eq!(f.pinned_from(), None);
        f.insert(1, w(2, 300));
        f.insert(2, w(3, 100));
        f.insert(3, w(2, 500));
        assert_eq!(f.pinned_from(), Some(Lsn(100)));
        assert_eq!(f.complete(2), Some(w(3, 100)));
        assert_eq!(f.complete(2), None);
        assert_eq!(f.pinned_from(), Some(Lsn(300)));
        f.forget_peer(2);
        assert_eq!(f.pinned_from(), None);
        f.insert(4, w(3, 700));
        assert_eq!(f.take_all(), vec![w(3, 700)]);
        assert_eq!(f.pinned_from(), None);
    }

    #[test]
    fn rejects_name_their_cause() {
        let r = FastReject::RingPosition {
            ours: Lsn(10),
            descriptor: Lsn(20),
        };
        assert_eq!(r.to_string(), "starts at lsn 20, our ring ends at lsn 10");
        assert!(
            FastReject::Header {
                index: Index(5),
                term: Term(2),
                want_index: Index(5),
                want_term: Term(3)
            }
            .to_string()
            .contains("term 3")
        );
    }
}
