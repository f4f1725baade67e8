//! Linearizable reads: raft's ReadIndex, kept apart from the replica's write path.
//!
//! A read asks the leader for a *read index*: its commit index when the read arrived, confirmed
//! by a heartbeat round that a majority answered in the leader's term (raft-rs,
//! `ReadOnlyOption::Safe`). Once the local commit index reaches it, every entry the cluster had
//! committed before the read started is readable here, so a read of the local log from then on
//! is linearizable. A deposed leader cannot confirm: its heartbeat round meets the new term,
//! it steps down, and the read fails `NotLeader` instead of answering from a stale log.
//!
//! raft-rs drops a read that reaches a leader which has not yet committed an entry of its own
//! term; such reads wait here and are issued once it has.

use std::collections::BTreeMap;

use raft::ReadState;

/// A linearizable read in flight: resolves through [`crate::Replica::read_status`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ReadTicket {
    /// Its context in raft's ReadIndex request.
    pub(crate) ctx: u64,
    /// The term of the leader it was asked of.
    pub term: u64,
}

/// Most resolved reads kept for callers that have not asked yet; older ones are dropped (their
/// callers see `NotLeader` only if leadership changed, else keep waiting until their timeout).
const MAX_RESOLVED: usize = 1 << 16;

/// The reads of one replica.
#[derive(Debug, Default)]
pub(crate) struct Reads {
    next_ctx: u64,
    /// Asked before this leader committed an entry of its term: not yet handed to raft.
    waiting: Vec<u64>,
    /// Confirmed by a majority: context to read index.
    resolved: BTreeMap<u64, u64>,
    /// Reads confirmed so far (wakes waiters when it moves).
    confirmed: u64,
}

impl Reads {
    /// A new read by a leader of `term`; its context for raft.
    pub(crate) fn start(&mut self, term: u64) -> (ReadTicket, Vec<u8>) {
        self.next_ctx += 1;
        let t = ReadTicket {
            ctx: self.next_ctx,
            term,
        };
        (t, t.ctx.to_le_bytes().to_vec())
    }

    /// Keeps `t` until the leader has committed an entry of its term.
    pub(crate) fn wait(&mut self, t: ReadTicket) {
        self.waiting.push(t.ctx);
    }

    /// Whether reads wait for the leader's first commit in its term.
    pub(crate) fn any_waiting(&self) -> bool {
        !self.waiting.is_empty()
    }

    /// The waiting reads' contexts, to hand to raft now.
    pub(crate) fn take_waiting(&mut self) -> Vec<Vec<u8>> {
        self.waiting
            .drain(..)
            .map(|c| c.to_le_bytes().to_vec())
            .collect()
    }

    /// Leadership was lost: reads not yet handed to raft never will be.
    pub(crate) fn drop_waiting(&mut self) {
        self.waiting.clear();
    }

    /// Records reads raft confirmed (contexts it did not get from us are ignored).
    pub(crate) fn confirm(&mut self, states: Vec<ReadState>) {
        for s in states {
            let Ok(ctx) = <[u8; 8]>::try_from(s.request_ctx.as_slice()) else {
                continue;
            };
            self.confirm_at(u64::from_le_bytes(ctx), s.index);
        }
    }

    /// Records read `ctx` as confirmed at `index`.
    pub(crate) fn confirm_at(&mut self, ctx: u64, index: u64) {
        if ctx == 0 || ctx > self.next_ctx {
            return;
        }
        self.resolved.insert(ctx, index);
        self.confirmed += 1;
        while self.resolved.len() > MAX_RESOLVED {
            self.resolved.pop_first();
        }
    }

    /// Every confirmed read still remembered: (context, read index).
    pub(crate) fn resolved(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.resolved.iter().map(|(&ctx, &index)| (ctx, index))
    }

    /// The read index of `t` once confirmed.
    pub(crate) fn index_of(&self, t: ReadTicket) -> Option<u64> {
        self.resolved.get(&t.ctx).copied()
    }

    /// Forgets `t` (answered, or its caller gave up).
    pub(crate) fn forget(&mut self, t: ReadTicket) {
        self.resolved.remove(&t.ctx);
        self.waiting.retain(|&c| c != t.ctx);
    }

    /// Reads confirmed so far.
    pub(crate) fn confirmed(&self) -> u64 {
        self.confirmed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_resolves_by_its_context_only() {
        let mut r = Reads::default();
        let (a, ctx_a) = r.start(3);
        let (b, _) = r.start(3);
        assert_eq!(r.index_of(a), None);
        r.confirm(vec![
            ReadState {
                index: 10,
                request_ctx: ctx_a,
            },
            // Not ours: ignored.
            ReadState {
                index: 99,
                request_ctx: 77u64.to_le_bytes().to_vec(),
            },
            ReadState {
                index: 99,
                request_ctx: vec![1, 2],
            },
        ]);
        assert_eq!(r.index_of(a), Some(10));
        assert_eq!(r.index_of(b), None);
        assert_eq!(r.confirmed(), 1);
        r.forget(a);
        assert_eq!(r.index_of(a), None);
        r.wait(b);
        assert_eq!(r.take_waiting(), vec![b.ctx.to_le_bytes().to_vec()]);
        assert!(r.take_waiting().is_empty());
    }
}
