//! Reading the log: committed entries, what this node persisted, and linearizable reads
//! through raft's ReadIndex.

use super::*;

impl<F: Fabric> Replica<F> {
    /// Reads committed entry `index`. Application entries come back as
    /// [`Committed::Application`] with their payload in `out`; raft's own entries (no-ops,
    /// membership changes) as [`Committed::Internal`]. `None` when the index is not committed
    /// or no longer held.
    pub fn read(&self, index: u64, out: &mut Vec<u8>) -> Result<Option<Committed>, ReplicaError> {
        if index > self.raw.raft.raft_log.committed
            || index < self.wal.first_index().0
            || index == 0
        {
            return Ok(None);
        }
        out.clear();
        let e = self.wal.read(Index(index), out)?;
        match payload_kind(out) {
            PayloadKind::Application { skip, .. } => {
                out.drain(..skip);
                Ok(Some(Committed::Application { term: e.term.0 }))
            }
            PayloadKind::SessionOpen | PayloadKind::Internal => {
                out.clear();
                Ok(Some(Committed::Internal { term: e.term.0 }))
            }
        }
    }

    /// Reads entry `index` of the log as persisted, committed or not: its term, with the raw
    /// payload (raft's tag byte first) in `out`. `None` when the log does not hold it. The
    /// simulator's checkers compare these bytes across nodes (log matching).
    pub fn read_persisted(
        &self,
        index: u64,
        out: &mut Vec<u8>,
    ) -> Result<Option<u64>, ReplicaError> {
        if index == 0 || index < self.wal.first_index().0 || index > self.wal.last_index().0 {
            return Ok(None);
        }
        out.clear();
        let e = self.wal.read(Index(index), out)?;
        Ok(Some(e.term.0))
    }

    /// Reads entry `index` of the log as persisted, like [`Replica::read_persisted`], and
    /// returns its term and the Lsn its record starts at. The simulator checks that an entry
    /// has the same Lsn on every replica (the fast path writes at the leader's Lsns).
    pub fn read_persisted_at(
        &self,
        index: u64,
        out: &mut Vec<u8>,
    ) -> Result<Option<(u64, u64)>, ReplicaError> {
        if index == 0 || index < self.wal.first_index().0 || index > self.wal.last_index().0 {
            return Ok(None);
        }
        out.clear();
        let e = self.wal.read(Index(index), out)?;
        Ok(Some((e.term.0, e.lsn.0)))
    }

    /// The term of entry `index` as persisted, if the log holds it.
    pub fn persisted_term(&self, index: u64) -> Option<u64> {
        self.wal.term(Index(index)).map(|t| t.0)
    }

    /// The last index the log holds as persisted.
    pub fn persisted_last_index(&self) -> u64 {
        self.wal.last_index().0
    }

    /// The leader this node knows of.
    pub fn leader(&self) -> Option<u64> {
        match self.raw.raft.leader_id {
            0 => None,
            l => Some(l),
        }
    }

    /// Starts a linearizable read on the leader (raft's ReadIndex, see [`crate::reads`]): the
    /// ticket resolves through [`Replica::read_status`] to an index at or above every entry
    /// the cluster had committed when this was called. `NotLeader` on any other node;
    /// `Poisoned` once the replica stopped (a failed read of the log here stops it too, as
    /// in a pass: raft-rs panics on it).
    pub fn read_index(&mut self) -> Result<ReadTicket, ReplicaError> {
        if let Some(p) = &self.poisoned {
            return Err(ReplicaError::Poisoned(p.clone()));
        }
        self.fail_stop_on_read_error(|r| r.read_index_inner())
    }

    fn read_index_inner(&mut self) -> Result<ReadTicket, ReplicaError> {
        // A caller may already know of a commit whose write completions raft has not stepped
        // yet: step them, so that the read index covers it.
        if self.cfg.mutation != crate::Mutation::ReadBeforeNicAcks {
            self.catch_up_with_nic_promises()?;
        }
        if self.raw.raft.state != StateRole::Leader {
            return Err(ReplicaError::NotLeader {
                leader_hint: self.leader(),
            });
        }
        let (t, ctx) = self.reads.start(self.raw.raft.term);
        if self.cfg.mutation == crate::Mutation::ReadWithoutQuorum {
            // Test-only: answer from this node's own commit index, as if it surely led.
            self.reads
                .confirm_at(t.ctx, self.raw.raft.raft_log.committed);
        } else if self.committed_in_own_term() {
            self.raw.read_index(ctx);
        } else {
            self.reads.wait(t);
        }
        Ok(t)
    }

    /// `None` while read `t` is unconfirmed, or confirmed above this node's commit index;
    /// `Some(Ok(index))` once a read of the committed log here is linearizable for it (then
    /// the ticket is spent); `Some(Err(NotLeader))` if this node stopped leading `t`'s term
    /// before a majority confirmed it; `Some(Err(Poisoned))` once the replica stopped.
    pub fn read_status(&mut self, t: ReadTicket) -> Option<Result<u64, ReplicaError>> {
        if let Some(p) = &self.poisoned {
            // A stopped replica confirms nothing more; the caller must not wait for it.
            let e = ReplicaError::Poisoned(p.clone());
            self.reads.forget(t);
            return Some(Err(e));
        }
        if let Some(index) = self.reads.index_of(t) {
            if self.commit_index() < index {
                return None;
            }
            self.reads.forget(t);
            return Some(Ok(index));
        }
        if self.raw.raft.state != StateRole::Leader || self.raw.raft.term != t.term {
            self.reads.forget(t);
            return Some(Err(ReplicaError::NotLeader {
                leader_hint: self.leader(),
            }));
        }
        None
    }

    /// Forgets read `t` (its caller gave up on it).
    pub fn forget_read(&mut self, t: ReadTicket) {
        self.reads.forget(t);
    }

    /// Linearizable reads confirmed so far: a waiter's cue to look again.
    pub fn reads_confirmed(&self) -> u64 {
        self.reads.confirmed()
    }

    /// Steps the proposals made ahead of raft and the unstepped write completions, and if a
    /// ticket resolved from them lies past raft's commit index still (raft counts the leader
    /// only once its `Ready` persisted the entries), handles that `Ready`: raft's commit
    /// index then covers every commit a caller was told of.
    pub(super) fn catch_up_with_nic_promises(&mut self) -> Result<(), ReplicaError> {
        self.step_deferred();
        self.step_nic_acks();
        let r = &self.raw.raft;
        let (term, promised) = self.nic_promised.get();
        if r.state == StateRole::Leader && r.term == term && r.raft_log.committed < promised {
            self.process_ready_only_inner()?;
        }
        Ok(())
    }

    /// Whether this leader has committed an entry of its own term (raft-rs drops ReadIndex
    /// requests until it has).
    pub(super) fn committed_in_own_term(&self) -> bool {
        let log = &self.raw.raft.raft_log;
        log.term(log.committed).ok() == Some(self.raw.raft.term)
    }

    /// Hands waiting reads to raft once this leader committed in its term; drops them when it
    /// no longer leads (their tickets then resolve `NotLeader`).
    pub(super) fn issue_waiting_reads(&mut self) {
        if !self.reads.any_waiting() {
            return; // the common case, on every Ready: no term look-up
        }
        if self.raw.raft.state != StateRole::Leader {
            self.reads.drop_waiting();
        } else if self.committed_in_own_term() {
            for ctx in self.reads.take_waiting() {
                self.raw.read_index(ctx);
            }
        }
    }
}
