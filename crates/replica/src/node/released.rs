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
    /// The log's terms from its first index on, as runs: each run's first index and term
    /// (`None`: the read of that index's term failed, a run of one), in order; the last run
    /// ends at `last_index`.
    runs: Vec<(u64, Option<u64>)>,
    last_index: u64,
    /// The term this node led at the close, if it led.
    leader_term: Option<u64>,
    leader_hint: Option<u64>,
    /// Up to where the entries of the term this node led count as committed on the write
    /// completions of a majority (`Durability::Replicated`), past raft's commit index: what a
    /// caller was told, or what the completions reached at the close: (term, index).
    nic_promised: (u64, u64),
    /// Confirmed linearizable reads, by context: their read index.
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
            // Confirmed above the commit index here: pending, as the replica said.
            return (index <= self.committed).then_some(Ok(index));
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
        let k = self.runs.partition_point(|&(first, _)| first <= i);
        self.runs[k - 1].1.ok_or(())
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
        let mut first = prefix.0 + 1;
        while first <= last_index {
            let Ok(term) = log.term(first) else {
                // A failed read is that index's answer only; the next one starts a run.
                runs.push((first, None));
                first += 1;
                continue;
            };
            // The last index of `term`'s run: the highest in [first, last_index] whose term
            // is at most `term` (a failed read counts as past it, and gets its own run).
            let last = last_where(first, last_index, |i| log.term(i).is_ok_and(|m| m <= term));
            runs.push((first, Some(term)));
            first = last + 1;
        }
        let committed = log.committed;
        let leads = raft.state == StateRole::Leader;
        // A caller's pass may have stopped at the write completions that made a quorum,
        // before raft stepped them: the tickets they cover resolve `Ok` on the replica,
        // asked or not.
        let mut nic_promised = self.nic_promised.get();
        if leads && self.nic_quorum_reaches(Index(committed + 1)) {
            // Up to the last entry proposed here, raft's log or ahead of it.
            let reached = last_where(committed + 1, self.last_index(), |i| {
                self.nic_quorum_reaches(Index(i))
            });
            if nic_promised.0 != raft.term || nic_promised.1 < reached {
                nic_promised = (raft.term, reached);
            }
        }
        Released {
            committed,
            prefix,
            runs,
            last_index,
            leader_term: leads.then_some(raft.term),
            leader_hint: self.leader(),
            nic_promised,
            reads: self.reads.resolved().collect(),
            mutation: self.cfg.mutation,
        }
    }
}

/// The highest `i` in `[lo, hi]` for which `holds` is true, given that it holds at `lo` and,
/// past some index, at none.
fn last_where(mut lo: u64, mut hi: u64, holds: impl Fn(u64) -> bool) -> u64 {
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if holds(mid) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    lo
}
