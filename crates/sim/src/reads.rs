//! Linearizable reads by the simulator's clients ([`crate::Options::reads`]), and the check
//! of each answer.
//!
//! A client starts a read (`Replica::read_index`) on the node it takes for the leader, now and
//! then, and half the times it learns that one of its appends committed, on the node that
//! told it, at most [`MAX_READS_IN_FLIGHT`] at once. With callers driving their own waits,
//! half the callers (within that bound) start their read the moment their ticket resolves,
//! inside the pass, before anything else runs on the node (a busy caller reading its own
//! write: under `Durability::Replicated` raft's commit index may still lag the ticket it
//! resolved). It then polls
//! `Replica::read_status`. When the read is answered at index `r`, the client reads its log
//! there, and the checker requires (PROTOCOL.md 6.6: "every entry committed anywhere before
//! the read arrived"):
//! - `r` is at least the highest index any node had committed when the read began, and at
//!   least the index of every append acknowledged before it began;
//! - the answering node's committed entry at that acknowledged index is the acknowledged
//!   append (unless its log no longer holds it).
//!
//! A read the node refuses (`NotLeader`), one whose node crashed, and one unanswered past the
//! client's timeout (forgotten with `Replica::forget_read`) end without a check: a client
//! that gets no answer learns nothing. After the faults stop, one linearizable read must be
//! answered, and is checked the same way (liveness of reads), in every seed family.

use replica::{Committed, ReadTicket};

use crate::check::{Outcome, Violation};
use crate::{CLIENT_TIMEOUT_NS, Run};

/// Chance per step that a client starts a read of its own, in ppm.
const READ_PPM: u64 = 100_000;

/// Reads in flight at most (those callers begin inside a pass included).
pub(crate) const MAX_READS_IN_FLIGHT: usize = 4;

/// A client's linearizable read in flight.
#[derive(Clone, Debug)]
pub(crate) struct ReadOp {
    node: u64,
    /// The node's incarnation: a ticket means nothing to a later one.
    incarnation: u64,
    ticket: ReadTicket,
    invoked_ns: u64,
    /// The highest index any node had committed when the read began.
    committed_before: u64,
    /// The append acknowledged before the read began at the highest index: that index and
    /// its attempt in the history.
    acked_before: Option<(u64, usize)>,
}

/// How a read ended.
enum ReadEnd {
    Answered(u64),
    Refused,
    Lost,
}

impl Run {
    /// Starts and resolves clients' reads for this step (with [`crate::Options::reads`]): a
    /// read after every other acknowledgement of this step, on the node that gave it, and now
    /// and then one on the node a client takes for the leader.
    pub(crate) fn drive_reads(&mut self, start_new: bool) -> Result<(), Violation> {
        let acked_on = std::mem::take(&mut self.acked_on);
        if !self.options.reads {
            return Ok(());
        }
        if start_new {
            for node in acked_on {
                if self.reads_in_flight() < MAX_READS_IN_FLIGHT && self.read_rng.below(2) == 0 {
                    self.start_read(node);
                }
            }
            if self.reads_in_flight() < MAX_READS_IN_FLIGHT
                && self.read_rng.below(1_000_000) < READ_PPM
            {
                let live = self.live();
                if !live.is_empty() {
                    let asked = live[self.read_rng.below(live.len() as u64) as usize];
                    let target = self.told_leader(asked, &live);
                    self.start_read(target);
                }
            }
        }
        self.resolve_reads()
    }

    /// Reads in flight: tracked ones, those callers will begin when their ticket resolves,
    /// and those they began in the pass just run.
    pub(crate) fn reads_in_flight(&self) -> usize {
        self.reads.len() + self.c.read_on_resolve.len() + self.c.reads_on_resolve.len()
    }

    /// Starts a linearizable read on `node`; a refusal ends it at once.
    fn start_read(&mut self, node: u64) -> Option<ReadTicket> {
        if self.c.paused.contains(&node) {
            return None; // its process is stopped: the request waits in the socket, unread
        }
        let committed_before = self.c.max_commit();
        let r = self.c.nodes.get_mut(&node).and_then(Option::as_mut)?;
        match r.read_index() {
            Ok(ticket) => {
                self.track_read(node, ticket, self.c.net.now(), committed_before, None);
                Some(ticket)
            }
            Err(_) => {
                self.summary.reads_refused += 1;
                None
            }
        }
    }

    /// Tracks read `ticket`, begun on `node` at `invoked_ns`, with what it must cover: the
    /// highest index a node had committed before it began (`committed_before`, or the
    /// checker's view if that is higher), and the highest index of an append acknowledged
    /// before (clients' acknowledgements so far, and `own`, one the reading caller itself was
    /// just told of, with its attempt).
    fn track_read(
        &mut self,
        node: u64,
        ticket: ReadTicket,
        invoked_ns: u64,
        committed_before: u64,
        own: Option<(u64, usize)>,
    ) {
        let acked_before = self
            .history
            .iter()
            .enumerate()
            .filter_map(|(k, a)| match a.outcome {
                Outcome::Acked { index, .. } => Some((index, k)),
                _ => None,
            })
            .chain(own)
            .max();
        self.summary.reads_started += 1;
        self.reads.push(ReadOp {
            node,
            incarnation: self.incarnations.get(&node).copied().unwrap_or(0),
            ticket,
            invoked_ns,
            committed_before: committed_before.max(self.checker.max_committed()),
            acked_before,
        });
    }

    /// Tracks the reads that callers driving their own waits started the moment their tickets
    /// resolved, inside the step just run (`SimCluster::read_on_resolve`). Runs before the
    /// step's check, so the checker's view is still from before they began.
    pub(crate) fn take_reads_on_resolve(&mut self) {
        for begun in std::mem::take(&mut self.c.reads_on_resolve) {
            let ticket = match begun.read {
                Ok(t) => t,
                Err(_) => {
                    self.summary.reads_refused += 1;
                    continue;
                }
            };
            let incarnation = self.incarnations.get(&begun.node).copied().unwrap_or(0);
            let Some(r) = self.c.nodes.get(&begun.node).and_then(Option::as_ref) else {
                continue; // the node died in the same step: the read is lost with it
            };
            let own = match r.ticket_status(begun.resolved) {
                Some(Ok(index)) => self
                    .history
                    .iter()
                    .rposition(|a| {
                        a.node == begun.node
                            && a.incarnation == incarnation
                            && a.ticket == Some(begun.resolved)
                    })
                    .map(|k| (index, k)),
                _ => None,
            };
            self.track_read(begun.node, ticket, begun.at_ns, begun.committed_before, own);
        }
    }

    /// Polls every read in flight; checks the answered ones.
    fn resolve_reads(&mut self) -> Result<(), Violation> {
        let now = self.now();
        let mut k = 0;
        while k < self.reads.len() {
            let end = self.read_end(k, now);
            let Some(end) = end else {
                k += 1;
                continue;
            };
            let read = self.reads.swap_remove(k);
            match end {
                ReadEnd::Answered(index) => {
                    self.summary.reads_answered += 1;
                    self.event(format!("read on node {} answered at {index}", read.node));
                    self.check_read(&read, index)?;
                }
                ReadEnd::Refused => self.summary.reads_refused += 1,
                ReadEnd::Lost => {}
            }
        }
        Ok(())
    }

    /// How read `k` ended, if it did.
    fn read_end(&mut self, k: usize, now: u64) -> Option<ReadEnd> {
        let read = &self.reads[k];
        if self.incarnations.get(&read.node).copied().unwrap_or(0) != read.incarnation {
            return Some(ReadEnd::Lost);
        }
        if self.c.paused.contains(&read.node) {
            return None;
        }
        let (ticket, timed_out) = (read.ticket, now >= read.invoked_ns + CLIENT_TIMEOUT_NS);
        let Some(r) = self.c.nodes.get_mut(&read.node).and_then(Option::as_mut) else {
            return Some(ReadEnd::Lost);
        };
        match r.read_status(ticket) {
            Some(Ok(index)) => Some(ReadEnd::Answered(index)),
            Some(Err(_)) => Some(ReadEnd::Refused),
            None if timed_out => {
                r.forget_read(ticket);
                Some(ReadEnd::Lost)
            }
            None => None,
        }
    }

    /// Checks read `read`, answered at `index`, against what was committed and acknowledged
    /// before it began, and reads the answering node's log where it must hold the
    /// acknowledged append.
    fn check_read(&mut self, read: &ReadOp, index: u64) -> Result<(), Violation> {
        let node = read.node;
        if index < read.committed_before {
            return Err(format!(
                "linearizable reads: node {node} answered a read begun at {:.3} ms at read \
                 index {index}, below index {} that a node had committed before it began",
                read.invoked_ns as f64 / 1e6,
                read.committed_before
            ));
        }
        let Some((acked, attempt)) = read.acked_before else {
            return Ok(());
        };
        if index < acked {
            return Err(format!(
                "linearizable reads: node {node} answered a read begun at {:.3} ms at read \
                 index {index}, below index {acked} of an append acknowledged before it began",
                read.invoked_ns as f64 / 1e6
            ));
        }
        let Some(r) = self.c.nodes.get(&node).and_then(Option::as_ref) else {
            return Ok(());
        };
        let mut out = Vec::new();
        let got = match r.read(acked, &mut out) {
            // A disk that fails the read (an armed failure, rot) gives the client an error,
            // not other bytes; the checkers see to the disk.
            Err(_) => return Ok(()),
            Ok(got) => got,
        };
        let a = &self.history[attempt];
        let matches = |out: &[u8]| match a.key {
            // A session's retry may be answered with an earlier copy's index.
            Some(key) => self
                .history
                .iter()
                .any(|b| b.key == Some(key) && b.payload == out),
            None => a.payload == out,
        };
        match got {
            Some(Committed::Application { .. }) if matches(&out) => Ok(()),
            None if acked < r.status().first_index => Ok(()),
            other => Err(format!(
                "linearizable reads: node {node} answered a read at {index}, but its log \
                 holds {} at index {acked}, where an append ({}) was acknowledged before the \
                 read began",
                match other {
                    Some(Committed::Application { .. }) => "another application entry",
                    Some(Committed::Internal { .. }) => "an internal entry",
                    None => "nothing committed",
                },
                String::from_utf8_lossy(&a.payload[..a.payload.len().min(16)])
            )),
        }
    }

    /// Liveness of reads, after the faults stopped and every append finished: a
    /// linearizable read on the leader is answered within `bound` (virtual ns), and checked.
    pub(crate) fn final_read(&mut self, bound: u64) -> Result<(), Violation> {
        // The read in flight: its node and ticket (kept in `self.reads` like any other).
        let mut pending = None;
        while self.now() < bound {
            if pending.is_none() {
                pending = self
                    .leader()
                    .and_then(|l| self.start_read(l).map(|t| (l, t)));
            }
            self.step()?;
            // A node that fail-stopped meanwhile (an EIO armed before) restarts.
            for id in self.down.clone() {
                self.restart(id)?;
            }
            let Some((node, ticket)) = pending else {
                continue;
            };
            let k = self
                .reads
                .iter()
                .position(|r| r.ticket == ticket && r.node == node)
                .expect("started reads are kept until they end");
            let Some(end) = self.read_end(k, self.now()) else {
                continue;
            };
            let read = self.reads.swap_remove(k);
            match end {
                ReadEnd::Answered(index) => {
                    self.summary.reads_answered += 1;
                    self.event(format!("the read after the repair answered at {index}"));
                    return self.check_read(&read, index);
                }
                // Its node stopped leading or died: ask the leader again.
                ReadEnd::Refused => {
                    self.summary.reads_refused += 1;
                    pending = None;
                }
                ReadEnd::Lost => pending = None,
            }
        }
        Err(format!(
            "liveness: no linearizable read was answered within {} election timeouts after \
             the faults stopped; leader {:?}; nodes: {}",
            crate::LIVENESS_ELECTION_TIMEOUTS,
            self.leader(),
            self.describe_nodes()
        ))
    }
}
