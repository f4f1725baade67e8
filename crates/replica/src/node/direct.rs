//! Proposals ahead of raft (`Durability::Replicated`, the path Mu takes): the leader gives a
//! proposal the index raft will give it, writes it into its ring and posts the RDMA Writes
//! that place it in its followers' rings, all before raft-rs hears of it. A caller's ticket
//! then resolves at the write completions that make a quorum, the leader counting itself by
//! its own ring ([`Replica::nic_quorum_reaches`]), so raft-rs's proposal step, its `Ready` and
//! the leader's own persist leave the commit's critical path.
//!
//! The proposal waits in [`Deferred`] until the next thing that needs raft: an ordinary pass,
//! a tick, a received message, a step of write completions, a read, any other proposal or
//! change. Raft then appends it where the ring already holds it, and the appends it makes for
//! it are recognised as already on the wire ([`Replica::drop_direct_sent`]).
//!
//! A proposal that cannot go ahead of raft (another durability, writes in flight, a follower
//! not on the fast path) is queued in [`Deferred`] too, in any durability, if raft will take
//! it: written nowhere yet, it waits for the next pass (a caller's too), which steps every
//! proposal made since into raft as one, so a burst of proposals between two passes costs
//! raft one proposal step and one append per follower ([`Replica::queue_proposal`]). Its
//! ticket's index and term are the ones raft gives it, by the same argument as below.
//!
//! What makes it safe:
//! - raft-rs appends the proposal at exactly the index and term given: nothing else enters
//!   raft's log first (every path that steps raft steps the deferred entries before), and the
//!   leader proposes ahead of raft only when raft will take the proposal (it leads, transfers
//!   no leadership, is a member, and the uncommitted size stays within raft's limit). The step
//!   asserts it (fail-stop: the entries are already on the wire, and another entry at their
//!   index would make two logs that agree on an index and term but not on the data).
//! - the leader counts itself as holding an entry once its own ring holds it in its term:
//!   under `Replicated` the ring is where every replica's copy is held (a follower counts once
//!   its NIC placed the bytes there), and raft counts the leader at its next `Ready`, which
//!   persists from that ring. Raft's commit index must then reach every ticket so resolved
//!   (asserted at the end of that `Ready`).
//! - a follower is written to ahead of raft only where raft would send the entries next (it
//!   replicates to it, its next index is the proposal's) and the fast path holds at exactly
//!   the end before them: the same checks as any fast append.

use raft::ProgressState;
use raft::prelude::{Entry, Message, MessageType};
use wal::{Index, Term};

use super::propose::Tickets;
use super::{Replica, RingEntry};
use crate::Mutation;
use crate::storage::payload_of;
use fabric::Fabric;
use raft::StateRole;

/// Proposals raft has not heard of yet: entries with their index and term set, consecutive
/// from raft's last index on. First those written ahead of raft (already in the ring and on
/// the wire), then those queued for the next pass (in neither).
#[derive(Debug, Default)]
pub(super) struct Deferred {
    entries: Vec<Entry>,
    /// Their payloads' bytes, as raft-rs counts an uncommitted proposal's size.
    bytes: usize,
    /// How many of the last entries are queued, not written ahead.
    queued: usize,
}

impl Deferred {
    pub(super) fn len(&self) -> u64 {
        self.entries.len() as u64
    }

    pub(super) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether some entries wait for a pass to step them into raft before they go anywhere
    /// (a caller's pass steps them; the entries written ahead of raft may wait longer).
    pub(super) fn has_queued(&self) -> bool {
        self.queued > 0
    }

    fn push_one(&mut self, entry: Entry, bytes: usize) {
        self.queued += 1;
        self.bytes += bytes;
        self.entries.push(entry);
    }

    fn push(&mut self, entries: Vec<Entry>, bytes: usize, queued: bool) {
        if queued {
            self.queued += entries.len();
        }
        self.bytes += bytes;
        if self.entries.is_empty() {
            self.entries = entries;
        } else {
            self.entries.extend(entries);
        }
    }
}

/// raft-rs's `max_uncommitted_size` for a replica with a ring of `ring_bytes`.
pub(super) fn max_uncommitted_bytes(ring_bytes: u64) -> u64 {
    (ring_bytes / 2).max(1 << 20)
}

impl<F: Fabric> Replica<F> {
    /// Proposes `entries` ahead of raft if this leader can ([`crate::node::direct`]); gives
    /// them back untouched if not, for raft's own path.
    /// `bytes`: the entries' payload bytes, as raft-rs counts them.
    pub(super) fn propose_direct(
        &mut self,
        mut entries: Vec<Entry>,
        bytes: usize,
    ) -> Result<Tickets, Vec<Entry>> {
        // With writes in flight the leader is pipelining: raft's path batches what waits into
        // one write and one descriptor per follower, where this path spends them per proposal
        // (measured: 19,400 instructions per entry at 64 in flight against 12,000). Ahead of
        // raft is for the latency of an append that finds the pipeline empty.
        if self.declines_direct() || entries.is_empty() {
            return Err(entries);
        }
        self.forget_stale_fast_paths();
        let r = &self.raw.raft;
        let last_before = r.raft_log.last_index() + self.deferred.len();
        // The ring holds everything raft's log does (a `Ready` not handled yet may hold more),
        // and nothing is queued.
        if !self.raft_takes(bytes) || self.producer.position().last_index.0 != last_before {
            return Err(entries);
        }
        let cs = self.raw.store().conf_state();
        if !cs.voters_outgoing.is_empty() || !cs.voters.contains(&self.cfg.id) {
            return Err(entries);
        }
        let first = last_before + 1;
        let term = r.term;
        let raft_next = r.raft_log.last_index() + 1;
        // The followers raft would send these entries to next (it sent them everything its
        // log holds; the proposals still deferred went to them ahead of raft too), on a fast
        // path that ends right before them; with the leader, they must be a quorum, or the
        // commit would wait for raft's own appends to the others.
        let mut targets = std::mem::take(&mut self.direct_targets);
        targets.clear();
        for &id in &cs.voters {
            if id == self.cfg.id {
                continue;
            }
            let ready = r.prs().get(id).is_some_and(|pr| {
                pr.state == ProgressState::Replicate && pr.next_idx == raft_next && !pr.is_paused()
            }) && self.peers.get(&id).is_some_and(|p| {
                p.remote.is_some() && p.fast.end().is_some_and(|e| e.index.0 == last_before)
            });
            if ready {
                targets.push(id);
            }
        }
        // With the leader, a majority of the voters (twice their number above the voters').
        // A leader alone commits at its own `Ready`: nothing to wait for on a NIC, and a
        // caller's pass that sees no event would leave the proposal to the next tick.
        if targets.is_empty() || 2 * (targets.len() + 1) <= cs.voters.len() {
            self.direct_targets = targets;
            return Err(entries);
        }
        // The ring ends where raft's log (and the proposals waiting) do: its last record's term
        // is the previous entry's, with no look-up in the wal.
        let prev_term = match self.ring_entries.back() {
            Some(e) if e.index.0 == last_before => e.term.0,
            _ => match r.raft_log.term(last_before) {
                Ok(t) => t,
                Err(_) => {
                    self.direct_targets = targets;
                    return Err(entries);
                }
            },
        };
        let commit = r.raft_log.committed;
        // Into our ring first: the writes read from it.
        let start = self.producer.position();
        let ring_len = self.ring_entries.len();
        let mut scratch = std::mem::take(&mut self.scratch);
        let mut wrote = Ok(());
        for (k, e) in entries.iter_mut().enumerate() {
            e.index = first + k as u64;
            e.term = term;
            match self
                .producer
                .append(Index(e.index), Term(term), payload_of(e, &mut scratch))
            {
                Ok(lsn) => self.ring_entries.push_back(RingEntry {
                    index: Index(e.index),
                    term: Term(term),
                    start: lsn,
                    end: self.producer.position().lsn,
                }),
                Err(err) => {
                    wrote = Err(err);
                    break;
                }
            }
        }
        self.scratch = scratch;
        if wrote.is_err() {
            // The ring is full (or refused): take back what went in, and let raft's path
            // (which persists and releases the ring first) take the proposal.
            self.ring_entries.truncate(ring_len);
            if self.producer.rewind(start).is_err() {
                self.poisoned
                    .get_or_insert_with(|| "cannot rewind the ring after a refused append".into());
            }
            for e in entries.iter_mut() {
                e.index = 0;
                e.term = 0;
            }
            self.direct_targets = targets;
            return Err(entries);
        }
        let last = first + entries.len() as u64 - 1;
        self.direct_ring_to = self.direct_ring_to.max(last);
        let mut m = Message::default();
        m.set_msg_type(MessageType::MsgAppend);
        m.from = self.cfg.id;
        m.term = term;
        m.index = last_before;
        m.log_term = prev_term;
        m.commit = commit;
        m.set_entries(entries.into());
        for &id in &targets {
            m.to = id;
            if self.try_fast_append(&m, true) {
                super::step!(self.cfg.id, "sent", first, last);
            }
        }
        self.direct_targets = targets;
        let entries = m.take_entries().into_vec();
        self.deferred.push(entries, bytes, false);
        self.stats.direct_proposals += 1;
        Ok(Tickets { first, last, term })
    }

    /// Whether raft-rs will take the proposals deferred so far and `bytes` more, stepped as
    /// one proposal: its own rules (`Raft::step`, `append_entry`) as they will stand then,
    /// nothing reaching raft before. The uncommitted-size rule is raft-rs's, except that its
    /// "one proposal may always go in" holds only for the first deferred one, so that deferring
    /// never lets more in than raft-rs would proposal by proposal.
    fn raft_takes(&self, bytes: usize) -> bool {
        let r = &self.raw.raft;
        let total = self.deferred.bytes + bytes;
        let max = max_uncommitted_bytes(self.cfg.ring_bytes) as usize;
        let uncommitted = r.uncommitted_size();
        r.state == StateRole::Leader
            && (r.lead_transferee.is_none() || self.cfg.mutation == Mutation::DeferredUnchecked)
            && r.prs().get(self.cfg.id).is_some()
            && (total == 0
                || total + uncommitted <= max
                || (uncommitted == 0 && self.deferred.is_empty()))
    }

    /// Queues `entries` for the next pass, which steps them into raft with every other
    /// proposal made since, as one (one append per follower, one `Ready`, for a burst of
    /// proposals between two passes), if raft will take them then; gives them back if not,
    /// for raft to refuse now with its reason. `bytes` as for [`Replica::propose_direct`].
    pub(super) fn queue_proposal(
        &mut self,
        mut entries: Vec<Entry>,
        bytes: usize,
    ) -> Result<Tickets, Vec<Entry>> {
        if entries.is_empty() || !self.raft_takes(bytes) {
            return Err(entries);
        }
        let (first, term) = self.next_deferred();
        for (k, e) in entries.iter_mut().enumerate() {
            e.index = first + k as u64;
            e.term = term;
        }
        let last = first + entries.len() as u64 - 1;
        self.deferred.push(entries, bytes, true);
        self.stats.queued_proposals += 1;
        Ok(Tickets { first, last, term })
    }

    /// [`Replica::queue_proposal`] of one entry, which joins the queue's own vector: a
    /// pipelining caller's single proposals allocate nothing here.
    pub(super) fn queue_one(&mut self, mut entry: Entry) -> Result<Tickets, Entry> {
        let bytes = entry.data.len();
        if !self.raft_takes(bytes) {
            return Err(entry);
        }
        let (index, term) = self.next_deferred();
        entry.index = index;
        entry.term = term;
        self.deferred.push_one(entry, bytes);
        self.stats.queued_proposals += 1;
        Ok(Tickets {
            first: index,
            last: index,
            term,
        })
    }

    /// The index and term the next deferred entry gets: right after raft's log and what is
    /// deferred already, in raft's term.
    fn next_deferred(&self) -> (u64, u64) {
        let r = &self.raw.raft;
        (r.raft_log.last_index() + self.deferred.len() + 1, r.term)
    }

    /// Whether [`Replica::propose_direct`] turns any proposal down now: another durability,
    /// or writes in flight (the leader is pipelining; raft's path batches what waits).
    pub(super) fn declines_direct(&self) -> bool {
        !self.cfg.durability.commits_on_nic_ack() || !self.writes_in_flight.is_empty()
    }

    /// Steps the proposals made ahead of raft into it, as one proposal, before anything else
    /// reaches raft.
    #[inline(always)]
    pub(super) fn step_deferred(&mut self) {
        if !self.deferred.is_empty() {
            self.step_deferred_now();
        }
    }

    #[inline(never)]
    fn step_deferred_now(&mut self) {
        let entries = std::mem::take(&mut self.deferred.entries);
        self.deferred.bytes = 0;
        self.deferred.queued = 0;
        let first = entries[0].index;
        let last = entries[entries.len() - 1].index;
        let term = entries[0].term;
        let r = &self.raw.raft;
        let at = (r.term, r.state, r.raft_log.last_index());
        let mut m = Message::default();
        m.set_msg_type(MessageType::MsgPropose);
        m.from = self.cfg.id;
        m.set_entries(entries.into());
        let stepped = self.raw.raft.step(m);
        let r = &self.raw.raft;
        let taken = stepped.is_ok()
            && r.raft_log.last_index() == last
            && r.raft_log.term(last).ok() == Some(term);
        if taken || self.cfg.mutation == Mutation::DeferredUnchecked {
            return;
        }
        // The entries are on the wire at their index and term: another entry there would make
        // two logs that agree on both and differ in the data. Fail-stop.
        panic!(
            "raft did not append entries {first}..={last} of term {term} proposed ahead of it \
             where they were given (term {}, role {:?}, last index {} before, {:?})",
            at.0, at.1, at.2, stepped
        );
    }

    /// Leader: drops from an append to `m.to` the entries already written to it ahead of raft
    /// on this connection; `false` if none is left to send.
    pub(super) fn drop_direct_sent(&mut self, m: &mut Message) -> bool {
        let Some(p) = self.peers.get(&m.to) else {
            return true;
        };
        let done = p.fast.direct_to().0;
        let (Some(a), Some(b)) = (m.entries.first(), m.entries.last()) else {
            return true;
        };
        if done < a.index {
            return true;
        }
        if b.index <= done {
            self.stats.direct_appends_skipped += 1;
            return false;
        }
        // raft-rs answers term 0 for an index compacted away: send the message as it is.
        let log_term = match self.raw.raft.raft_log.term(done) {
            Ok(t) if t != 0 || done == 0 => t,
            _ => return true,
        };
        let sent = (done + 1 - a.index) as usize;
        let mut rest = m.take_entries().into_vec();
        rest.drain(..sent);
        m.set_entries(rest.into());
        m.index = done;
        m.log_term = log_term;
        true
    }
}
