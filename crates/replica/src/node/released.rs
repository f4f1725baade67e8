//! What a closed log's handles may still ask once the replica itself is gone: how each
//! append's ticket and each linearizable read resolved. [`crate::Log::close`] (and a `Log`
//! dropped without it) takes this view and drops the replica, so its fabric (the peer port, the
//! links, the queue pairs and registered memory), its raft state and its ring mapping go at
//! the close, not when the last handle or subscription of the log is dropped.

use std::collections::BTreeMap;

use super::propose::settled_status;
use super::*;

/// The state a closed replica's tickets and reads resolve from (see the module doc).
#[derive(Debug, Default)]
pub struct Released {
    committed: u64,
    /// The last compacted index and its term.
    prefix: (u64, u64),
    /// The log's terms from its first index on, as runs: each run's first index and term, in
    /// order; the last run ends at `last_index`.
    runs: Vec<(u64, u64)>,
    last_index: u64,
    /// Terms are known up to here: a read of a term failed past it.
    known_to: u64,
    /// The term this node led at the close, if it led.
    leader_term: Option<u64>,
    leader_hint: Option<u64>,
    /// A ticket of the term this node led that a caller was told committed on its write
    /// completions (`Durability::Replicated`): (term, index).
    nic_promised: (u64, u64),
    /// Linearizable reads confirmed at or below the commit index, by context.
    reads: BTreeMap<u64, u64>,
    mutation: crate::Mutation,
}

impl Released {
    /// The ticket's outcome as [`Replica::ticket_status`] said it at the close; `None` for
    /// one still pending then (it never resolves now).
    pub fn ticket_status(&self, t: Ticket) -> Option<Result<u64, ReplicaError>> {
        if self.leader_term == Some(t.term)
            && self.nic_promised.0 == t.term
            && t.index <= self.nic_promised.1
        {
            return Some(Ok(t.index));
        }
        settled_status(
            t,
            self.committed,
            self.prefix,
            |i| self.term(i),
            self.mutation,
        )
    }

    /// The read's outcome as [`Replica::read_status`] said it at the close; `None` for one
    /// still pending then.
    pub fn read_status(&self, t: ReadTicket) -> Option<Result<u64, ReplicaError>> {
        if let Some(&index) = self.reads.get(&t.ctx) {
            return Some(Ok(index));
        }
        if self.leader_term != Some(t.term) {
            return Some(Err(ReplicaError::NotLeader {
                leader_hint: self.leader_hint,
            }));
        }
        None
    }

    /// Raft's term at index `i`, as `RaftLog::term` answers it: 0 past the log and below
    /// its first index, the prefix's term at the last compacted index.
    fn term(&self, i: u64) -> Result<u64, ()> {
        if i == self.prefix.0 {
            return Ok(self.prefix.1);
        }
        if i < self.prefix.0 || i > self.last_index {
            return Ok(0);
        }
        if i > self.known_to {
            return Err(());
        }
        let k = self.runs.partition_point(|&(first, _)| first <= i);
        Ok(self.runs[k - 1].1)
    }
}

impl<F: Fabric> Replica<F> {
    /// What this replica's tickets and reads resolved to, to answer them once it is gone
    /// (see [`Released`]). Reads each term boundary of the log once (terms never fall along
    /// a log, so a binary search finds where each term's run ends).
    pub fn released(&self) -> Released {
        let log = &self.raw.raft.raft_log;
        let raft = &self.raw.raft;
        let prefix = self.raw.store().prefix();
        let last_index = log.last_index();
        let mut runs = Vec::new();
        let mut known_to = last_index;
        let mut first = prefix.0 + 1;
        while first <= last_index {
            let Ok(term) = log.term(first) else {
                known_to = first - 1;
                break;
            };
            // The last index of `term`'s run: the highest in [first, last_index] whose term
            // is at most `term` (a failed read counts as past it).
            let (mut lo, mut hi) = (first, last_index);
            while lo < hi {
                let mid = lo + (hi - lo).div_ceil(2);
                if log.term(mid).is_ok_and(|m| m <= term) {
                    lo = mid;
                } else {
                    hi = mid - 1;
                }
            }
            runs.push((first, term));
            first = lo + 1;
        }
        let committed = log.committed;
        let reads = self
            .reads
            .resolved()
            .filter(|&(_, index)| index <= committed)
            .collect();
        let leads = raft.state == StateRole::Leader;
        Released {
            committed,
            prefix,
            runs,
            last_index,
            known_to,
            leader_term: leads.then_some(raft.term),
            leader_hint: self.leader(),
            nic_promised: self.nic_promised.get(),
            reads,
            mutation: self.cfg.mutation,
        }
    }
}
