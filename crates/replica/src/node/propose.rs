//! Proposals and their tickets: single entries, batches (conditional or not), session
//! entries, membership changes and leader transfer, and how a ticket resolves.

use bytes::Bytes;

use super::*;

impl<F: Fabric> Replica<F> {
    /// Proposes `data`; the returned ticket resolves through [`Replica::ticket_status`].
    pub fn propose(&mut self, data: &[u8]) -> Result<Ticket, ReplicaError> {
        self.fail_stop_on_read_error(|r| r.propose_inner(data))
    }

    pub(super) fn propose_inner(&mut self, data: &[u8]) -> Result<Ticket, ReplicaError> {
        self.check_proposal(&[data])?;
        let entry = entry_of(self.arena.copy(&[&[TAG_NORMAL], data]));
        // Where it would be queued anyway, it joins the queue without a vector of its own.
        let entry = if self.declines_direct() {
            match self.queue_one(entry) {
                Ok(tickets) => return Ok(tickets.first()),
                Err(entry) => entry,
            }
        } else {
            entry
        };
        Ok(self.propose_entries(vec![entry])?.first())
    }

    /// Proposes `items` as one raft proposal: they get consecutive indexes, or none of them
    /// is in the log and the error says why (an entry over the size limit, not the leader,
    /// raft's uncommitted limit). Returns one ticket per item, in order.
    pub fn propose_batch(&mut self, items: &[&[u8]]) -> Result<Vec<Ticket>, ReplicaError> {
        self.fail_stop_on_read_error(|r| r.propose_batch_inner(items, None))
    }

    /// [`Replica::propose_batch`] on a condition: only if this leader's log ends at
    /// `expected_last` (its last index, committed or not, raft's own entries included) at the
    /// moment the batch is ordered, so that the batch, if it commits, commits right after it.
    /// Otherwise nothing is proposed and [`ReplicaError::ConditionFailed`] names the actual end.
    pub fn propose_batch_if(
        &mut self,
        items: &[&[u8]],
        expected_last: u64,
    ) -> Result<Vec<Ticket>, ReplicaError> {
        self.fail_stop_on_read_error(|r| r.propose_batch_inner(items, Some(expected_last)))
    }

    /// Where this node's log ends now: its last index, committed or not (proposals made
    /// ahead of raft included).
    pub fn last_index(&self) -> u64 {
        self.raw.raft.raft_log.last_index() + self.deferred.len()
    }

    /// Refuses a proposal of `items` that cannot be made here: poisoned, an item over the
    /// size limit, not the leader.
    pub(super) fn check_proposal(&self, items: &[&[u8]]) -> Result<(), ReplicaError> {
        if let Some(p) = &self.poisoned {
            return Err(ReplicaError::Poisoned(p.clone()));
        }
        if let Some(data) = items.iter().find(|d| d.len() > self.cfg.max_entry_bytes) {
            return Err(ReplicaError::TooLarge {
                len: data.len(),
                max: self.cfg.max_entry_bytes,
            });
        }
        if self.raw.raft.state != StateRole::Leader {
            return Err(ReplicaError::NotLeader {
                leader_hint: self.leader(),
            });
        }
        Ok(())
    }

    pub(super) fn propose_batch_inner(
        &mut self,
        items: &[&[u8]],
        expected_last: Option<u64>,
    ) -> Result<Vec<Ticket>, ReplicaError> {
        self.check_proposal(items)?;
        if let Some(expected) = expected_last {
            let last = if self.cfg.mutation == crate::Mutation::ConditionOnCommit {
                // Test-only: forgets the entries ordered but not yet committed.
                self.raw.raft.raft_log.committed
            } else {
                self.last_index()
            };
            if last != expected {
                return Err(ReplicaError::ConditionFailed { expected, last });
            }
        }
        let mut entries = Vec::with_capacity(items.len());
        for data in items {
            entries.push(entry_of(self.arena.copy(&[&[TAG_NORMAL], data])));
        }
        Ok(self.propose_entries(entries)?.collect())
    }

    /// Steps new entries into raft as one proposal: consecutive indexes for all, or none in
    /// the log and an error.
    pub(super) fn propose_entries(&mut self, entries: Vec<Entry>) -> Result<Tickets, ReplicaError> {
        let bytes: usize = entries.iter().map(|e| e.data.len()).sum();
        let entries = match self.propose_direct(entries, bytes) {
            Ok(tickets) => return Ok(tickets),
            Err(entries) => entries,
        };
        let entries = match self.queue_proposal(entries, bytes) {
            Ok(tickets) => return Ok(tickets),
            Err(entries) => entries,
        };
        self.step_deferred();
        let before = self.raw.raft.raft_log.last_index();
        let term = self.raw.raft.term;
        let n = entries.len() as u64;
        if n == 0 {
            return Ok(Tickets {
                first: before + 1,
                last: before,
                term,
            });
        }
        let mut m = Message::default();
        m.set_msg_type(MessageType::MsgPropose);
        m.from = self.cfg.id;
        m.set_entries(entries.into());
        // raft-rs appends a proposal's entries together or not at all (its uncommitted-size
        // check covers the whole message).
        self.raw
            .raft
            .step(m)
            .map_err(|e| ReplicaError::Dropped(e.to_string()))?;
        let after = self.raw.raft.raft_log.last_index();
        assert!(
            after == before || after == before + n,
            "raft appended part of a proposal: {before} -> {after} for {n} entries"
        );
        if after == before {
            return Err(ReplicaError::Dropped(
                "raft did not append the proposal".into(),
            ));
        }
        Ok(Tickets {
            first: before + 1,
            last: after,
            term,
        })
    }

    /// Proposes the opening of a client session (see [`crate::sessions`]); once the ticket
    /// resolves, its index is the session's id, known to every replica.
    pub fn open_session(&mut self) -> Result<Ticket, ReplicaError> {
        self.fail_stop_on_read_error(|r| {
            r.check_proposal(&[])?;
            r.refresh_pending_sessions()?;
            let t = r
                .propose_entries(vec![entry_of(Bytes::from_static(&[TAG_SESSION_OPEN]))])?
                .first();
            r.pending_sessions.opened.insert(t.index);
            Ok(t)
        })
    }

    /// Proposes `items` as numbers `first_seq`, `first_seq + 1`, ... of session `session`,
    /// exactly once (see [`crate::sessions`]): a number the log already holds (committed or
    /// not) is not proposed again, and its ticket is the copy's; the rest are proposed as one
    /// raft proposal. One ticket per item, in order. Refused with `UnknownSession` (expired or
    /// never opened), `SessionSequence` (a number past the session's next one: send the
    /// missing ones first) or `SessionTooOld` (a number so old its index is forgotten).
    pub fn propose_in_session(
        &mut self,
        session: u64,
        first_seq: u64,
        items: &[&[u8]],
    ) -> Result<Vec<Ticket>, ReplicaError> {
        self.fail_stop_on_read_error(|r| r.propose_in_session_inner(session, first_seq, items))
    }

    pub(super) fn propose_in_session_inner(
        &mut self,
        session: u64,
        first_seq: u64,
        items: &[&[u8]],
    ) -> Result<Vec<Ticket>, ReplicaError> {
        self.check_proposal(items)?;
        if first_seq == 0 {
            return Err(ReplicaError::SessionSequence {
                session,
                expected: 1,
                got: 0,
            });
        }
        self.refresh_pending_sessions()?;
        let committed_only = self.cfg.mutation == crate::Mutation::DedupCommittedOnly;
        let applied = self.sessions.get(session);
        let pending = if committed_only {
            None
        } else {
            self.pending_sessions.entries.get(&session)
        };
        let known = applied.is_some()
            || (!committed_only && self.pending_sessions.opened.contains(&session));
        if !known {
            return Err(ReplicaError::UnknownSession { session });
        }
        let last_seq = pending
            .and_then(|q| q.back().map(|&(seq, _, _)| seq))
            .unwrap_or(0)
            .max(applied.map_or(0, |s| s.last_seq));
        let mut tickets = Vec::with_capacity(items.len());
        let mut fresh = Vec::new();
        for (j, data) in items.iter().enumerate() {
            let seq = first_seq + j as u64;
            if seq <= last_seq {
                let held = pending
                    .and_then(|q| q.iter().find(|&&(s, _, _)| s == seq))
                    .map(|&(_, index, term)| Ticket { index, term });
                let ticket = match held {
                    Some(t) => t,
                    None => match applied.and_then(|s| s.index_of(seq)) {
                        Some(index) => self.committed_ticket(index),
                        None => return Err(ReplicaError::SessionTooOld { session, seq }),
                    },
                };
                tickets.push(ticket);
            } else if seq == last_seq + 1 + fresh.len() as u64 {
                fresh.push(entry_of(
                    self.arena.copy(&[&session_header(session, seq), data]),
                ));
            } else {
                return Err(ReplicaError::SessionSequence {
                    session,
                    expected: last_seq + 1,
                    got: seq,
                });
            }
        }
        // The opens in this leader's log past `applied` may expire the session before the new
        // entries are applied: they would then be ordinary entries, acknowledged as in the
        // session, and a resend of one would find the session unknown.
        if !fresh.is_empty()
            && !committed_only
            && !self.pending_sessions.survives(&self.sessions, session)
        {
            return Err(ReplicaError::UnknownSession { session });
        }
        self.stats.session_duplicates_refused += tickets.len() as u64;
        let first_fresh = last_seq + 1;
        let proposed: Vec<Ticket> = self.propose_entries(fresh)?.collect();
        let q = self.pending_sessions.entries.entry(session).or_default();
        for (k, t) in proposed.iter().enumerate() {
            q.push_back((first_fresh + k as u64, t.index, t.term));
        }
        tickets.extend(proposed);
        Ok(tickets)
    }

    /// The ticket of committed entry `index`, which resolves to it.
    pub(super) fn committed_ticket(&self, index: u64) -> Ticket {
        let term = match self.raw.raft.raft_log.term(index) {
            Ok(t) if t > 0 => t,
            // Compacted: `ticket_status` decides by the term of the last compacted entry.
            _ => self.raw.store().prefix().1,
        };
        Ticket { index, term }
    }

    /// Rebuilds the view of the sessions' entries past `applied` when this leader's term
    /// began since it was built: a new leader's log may hold entries of earlier terms that it
    /// has not applied, and they count as much as its own.
    pub(super) fn refresh_pending_sessions(&mut self) -> Result<(), ReplicaError> {
        let term = self.raw.raft.term;
        if self.pending_sessions.term == term {
            return Ok(());
        }
        self.step_deferred();
        let mut p = Pending {
            term,
            ..Pending::default()
        };
        let last = self.raw.raft.raft_log.last_index();
        if last > self.applied {
            let entries = self.raw.raft.raft_log.entries(
                self.applied + 1,
                None,
                raft::GetEntriesContext::empty(false),
            )?;
            for e in entries {
                match payload_kind(&e.data) {
                    PayloadKind::SessionOpen => {
                        p.opened.insert(e.index);
                    }
                    PayloadKind::Application {
                        session: Some((id, seq)),
                        ..
                    } => p
                        .entries
                        .entry(id)
                        .or_default()
                        .push_back((seq, e.index, e.term)),
                    _ => {}
                }
            }
        }
        self.pending_sessions = p;
        Ok(())
    }

    /// `None` while pending; `Some(Ok(index))` once committed; `Some(Err(..))` if another
    /// leader's entry took its place, or (rarely) when the entry was compacted after a change
    /// of term and whether it was this one cannot be told any more.
    pub fn ticket_status(&self, t: Ticket) -> Option<Result<u64, ReplicaError>> {
        let log = &self.raw.raft.raft_log;
        // The common case, a waiter asking on the leader that proposed it: a leader never
        // cuts or replaces entries of its own term, so while this node still leads the
        // ticket's term the entry is in its log as proposed, and only the commit index
        // decides. No look-up in the log at all (its last index or a term may take the
        // wal's lock), pending or committed: a waiter asks many times per commit. Only this
        // node minted tickets of a term it leads (a node leads a term at most once, and wins
        // it in the incarnation that voted for itself), so the entry is in its log.
        if self.raw.raft.state == StateRole::Leader && self.raw.raft.term == t.term {
            debug_assert!(
                t.index <= self.last_index(),
                "a ticket this leader never gave"
            );
            debug_assert!(
                t.index <= log.committed
                    || t.index > log.last_index()
                    || log.term(t.index).ok() == Some(t.term),
                "the leader's own entry was replaced"
            );
            if t.index <= log.committed {
                return Some(Ok(t.index));
            }
            // Under `Replicated` a caller's pass resolves at the write completion that makes
            // the quorum, before raft steps it (the next pass does, and checks that raft's
            // commit index then reaches what was resolved here).
            if self.nic_quorum_reaches(Index(t.index)) {
                let (term, index) = self.nic_promised.get();
                if term != t.term || index < t.index {
                    self.nic_promised.set((t.term, t.index));
                }
                return Some(Ok(t.index));
            }
            return None;
        }
        settled_status(
            t,
            log.committed,
            self.raw.store().prefix(),
            |i| log.term(i),
            self.cfg.mutation,
        )
    }

    /// Asks raft to hand leadership to `to`.
    pub fn transfer_leader(&mut self, to: u64) {
        let _ = self.fail_stop_on_read_error(|r| {
            r.step_deferred();
            r.raw.transfer_leader(to);
            Ok(())
        });
    }

    /// Proposes adding (`add = true`) or removing a voter; it takes effect when committed.
    pub fn change_membership(&mut self, node: u64, add: bool) -> Result<Ticket, ReplicaError> {
        self.fail_stop_on_read_error(|r| r.change_membership_inner(node, add))
    }

    pub(super) fn change_membership_inner(
        &mut self,
        node: u64,
        add: bool,
    ) -> Result<Ticket, ReplicaError> {
        if self.raw.raft.state != StateRole::Leader {
            return Err(ReplicaError::NotLeader {
                leader_hint: self.leader(),
            });
        }
        let mut cc = ConfChange::default();
        cc.set_change_type(if add {
            ConfChangeType::AddNode
        } else {
            ConfChangeType::RemoveNode
        });
        cc.node_id = node;
        // The voters after the change travel in the entry, so that a node that joins with no
        // membership (it replays the log from the start, and the bootstrap voters are not in
        // the log) can adopt the real membership instead of applying the change to an empty
        // one. Only one change is pending at a time (raft refuses a second), so the current
        // configuration plus this change is exact.
        let mut after_change = self.voters();
        after_change.retain(|&v| v != node);
        if add {
            after_change.push(node);
        }
        after_change.sort_unstable();
        if node == 0 {
            return Err(ReplicaError::Membership("node ids start at 1".into()));
        }
        if after_change.is_empty() {
            // raft-rs would commit it and then fail to apply it ("removed all voters"), on
            // every restart again.
            return Err(ReplicaError::Membership(format!(
                "node {node} is the last voter: add another before removing it"
            )));
        }
        if after_change.len() > crate::MAX_MEMBERS {
            return Err(ReplicaError::Membership(format!(
                "at most {} voters",
                crate::MAX_MEMBERS
            )));
        }
        // raft-rs does not refuse a second change: it appends an empty entry in its place,
        // which commits, and the change was reported made although it never was (a
        // `members remove` followed at once by a `members add` kept the removed node a voter).
        if self.raw.raft.has_pending_conf() {
            return Err(ReplicaError::MembershipPending);
        }
        self.step_deferred();
        cc.context = after_change
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect::<Vec<u8>>()
            .into();
        let before = self.raw.raft.raft_log.last_index();
        self.raw
            .propose_conf_change(Vec::new(), cc)
            .map_err(|e| ReplicaError::Membership(e.to_string()))?;
        let after = self.raw.raft.raft_log.last_index();
        if after != before + 1 || self.raw.raft.pending_conf_index != after {
            return Err(ReplicaError::Membership(
                "raft did not take the change (it appended none, or an empty entry in its place)"
                    .into(),
            ));
        }
        Ok(Ticket {
            index: after,
            term: self.raw.raft.term,
        })
    }
}

/// The tickets of one proposal: indexes `first..=last` in `term` (none if `last < first`).
pub(super) struct Tickets {
    pub(super) first: u64,
    pub(super) last: u64,
    pub(super) term: u64,
}

impl Tickets {
    /// The first entry's ticket (a proposal that returned `Ok` holds at least one).
    fn first(&self) -> Ticket {
        debug_assert!(self.first <= self.last);
        Ticket {
            index: self.first,
            term: self.term,
        }
    }
}

impl Iterator for Tickets {
    type Item = Ticket;

    fn next(&mut self) -> Option<Ticket> {
        (self.first <= self.last).then(|| {
            self.first += 1;
            Ticket {
                index: self.first - 1,
                term: self.term,
            }
        })
    }
}

/// An application entry (raft's `EntryNormal`) holding `data`.
fn entry_of(data: Bytes) -> Entry {
    let mut e = Entry::default();
    e.data = data;
    e
}

/// How ticket `t` resolved, from what the log holds below and at the commit index, for a
/// node that does not lead `t`'s term (or no longer runs: [`super::Released`]): `prefix` is
/// the last compacted index and its term, `term` raft's term at an index (0 past the log).
pub(crate) fn settled_status<E>(
    t: Ticket,
    committed: u64,
    prefix: (u64, u64),
    term: impl Fn(u64) -> Result<u64, E>,
    mutation: crate::Mutation,
) -> Option<Result<u64, ReplicaError>> {
    let (last_compacted, prefix_term) = prefix;
    if t.index <= last_compacted {
        // Compacted: committed, but raft-rs reports term 0 below its first index, so
        // decide by the term of the last compacted entry. Terms never fall
        // along the log, and a log holding term `t` at `first - 1` holds the term-`t`
        // leader's entries (ours) before it; above `t` is unknown.
        return Some(match prefix_term.cmp(&t.term) {
            std::cmp::Ordering::Equal => Ok(t.index),
            std::cmp::Ordering::Less => Err(ReplicaError::Superseded { index: t.index }),
            std::cmp::Ordering::Greater => Err(ReplicaError::OutcomeUnknown { index: t.index }),
        });
    }
    // Only what is committed decides. This node's log holding another entry at the
    // ticket's index, or none, is no proof: a new leader's entry that replaced it here
    // may never commit, and a node that still holds the ticket's entry may yet be
    // elected and commit it (five voters: the old leader and one follower hold it, a
    // new leader elected by the other three replaces it on the old leader only, then
    // dies; the follower wins the next term).
    if t.index <= committed {
        return match term(t.index) {
            Ok(term) if term == t.term => Some(Ok(t.index)),
            // raft-rs says 0 below a snapshot it holds and this node has not installed
            // yet: the install's prefix decides, in the compacted branch above.
            Ok(0) => None,
            Ok(_) => Some(Err(ReplicaError::Superseded { index: t.index })),
            Err(_) => Some(Err(ReplicaError::OutcomeUnknown { index: t.index })),
        };
    }
    // Past the commit index: the committed entry there is in every later leader's log,
    // and terms never fall along a log, so if it is of a later term than the ticket's,
    // no log that can commit anything holds the ticket's entry after it.
    if mutation == crate::Mutation::SupersededUncommitted {
        return match term(t.index) {
            Ok(term) if term == t.term => None,
            _ => Some(Err(ReplicaError::Superseded { index: t.index })),
        };
    }
    match term(committed) {
        Ok(term) if term > t.term => Some(Err(ReplicaError::Superseded { index: t.index })),
        _ => None,
    }
}
