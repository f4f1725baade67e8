//! The checkers. They run after every step of the simulation and see the cluster only through
//! the replicas' public state and their logs as persisted, never through the driver's intent.
//!
//! Safety:
//! - **Election safety:** at most one node is ever leader of a given term.
//! - **Log matching:** two persisted entries with the same index and term have the same bytes,
//!   on every node and at every time, and start at the same Lsn (the fast path writes at the
//!   leader's Lsns). This is also the fencing check: a deposed leader's write
//!   that changed a follower's accepted log, or a torn write that was accepted, shows up as an
//!   `(index, term)` with two different payloads.
//! - **State machine safety:** the committed prefixes of all nodes agree byte for byte, and an
//!   index once committed on any node never holds anything else anywhere.
//! - **Durability:** an acknowledged append is in the committed log at its index, forever.
//! - **Monotonicity:** per incarnation of a node, its commit and applied indexes never go back,
//!   and it never applies past its commit index.
//! - **Membership:** the voters after a change are the same on every node, a node that applied
//!   past a change never counts with one before it, and no node leads a membership that does
//!   not count it (a leader that applied its own removal steps down).
//! - **Well-formed messages:** no node refuses a frame (undecodable, from the wrong peer, an
//!   append whose entries do not follow its index): the simulated network corrupts RDMA
//!   Writes, never Sends, so every such frame was a correct peer's mistake. Checked by the
//!   driver beside ring integrity (`stats().bad_frames`).
//! - **Linearizability** of the client's appends against a sequential log, with the committed
//!   log as the witness order: see [`Checker::check_history`].
//!
//! Liveness is checked by the driver (it bounds the time to finish after the faults stop).

use std::collections::{BTreeMap, BTreeSet};

use replica::{Replica, Role};

/// What went wrong, as a sentence.
pub type Violation = String;

/// One client attempt at an append: an operation of the history.
#[derive(Clone, Debug)]
pub struct Attempt {
    /// Its unique payload.
    pub payload: Vec<u8>,
    /// Node it was proposed on.
    pub node: u64,
    /// That node's incarnation (a ticket means nothing to a later one).
    pub incarnation: u64,
    /// Its ticket, when the proposal was accepted.
    pub ticket: Option<replica::Ticket>,
    /// Virtual time of the invocation.
    pub invoked_ns: u64,
    /// How it ended, if it did.
    pub outcome: Outcome,
    /// A conditional append's expected end of the log: if it is in the log at all, it must be
    /// right after that index.
    pub expected_last: Option<u64>,
    /// An append in a session: its session and sequence number. A retry resends the same
    /// key with a new payload, and may be answered with the index of an earlier attempt's
    /// copy: the committed entry there must carry the key, and no key may be committed twice.
    pub key: Option<(u64, u64)>,
}

/// How a client attempt ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Still waiting.
    Pending,
    /// Acknowledged as committed at this index, at this virtual time.
    Acked {
        /// Index.
        index: u64,
        /// Time of the acknowledgement.
        at_ns: u64,
    },
    /// Definitely not in the log: refused at propose time, or superseded by another leader.
    Failed,
    /// Not appended again, its session's number being in the log already, too far back for
    /// its index (`SessionTooOld`): the committed log must hold the key.
    InLog,
    /// Unknown: the node crashed or the client gave up; it may or may not commit.
    Unknown,
}

#[derive(Debug, Default)]
struct NodeView {
    commit: u64,
    applied: u64,
    /// Committed entries already compared against the global committed log.
    committed_checked: u64,
    /// The terms of the persisted entries already checked, index `i` at `terms[i - 1]`.
    terms: Vec<u64>,
    /// Where the next re-read of the committed prefix starts (see [`RECHECK_PER_STEP`]).
    recheck_from: u64,
}

/// Committed entries each node reads again after every step, cycling through its committed
/// prefix: an entry is compared not only when a node first reports it committed but again
/// and again, so bytes that change under it later (a stale write, rot) show up.
const RECHECK_PER_STEP: u64 = 8;

/// The checker's state across the whole run.
#[derive(Debug, Default)]
pub struct Checker {
    leaders: BTreeMap<u64, u64>,
    /// The committed log: index → (term, raw payload with raft's tag byte).
    committed: BTreeMap<u64, (u64, Vec<u8>)>,
    /// Log matching: (index, term) → crc32c of the raw payload, its length, and the Lsn its
    /// record starts at (the same on every replica: the fast path writes at the leader's
    /// Lsns, so a follower whose Lsns drifted would take garbage for entries).
    accepted: BTreeMap<(u64, u64), (u32, usize, u64, u64)>,
    views: BTreeMap<u64, NodeView>,
    /// Checkpoints already compared, per node: (node, index).
    checkpoints_checked: BTreeSet<(u64, u64)>,
    /// Session agreement: index → crc32c of the session table as of it (encoded), and the
    /// node that first showed it.
    session_tables: BTreeMap<u64, (u32, u64)>,
    /// Membership: the index of each change a node showed applied (`Status::conf_index`),
    /// with the voters after it and the node.
    memberships: BTreeMap<u64, (Vec<u64>, u64)>,
    /// (node, index) of entries whose stored bytes rotted: a read of one may fail its check
    /// (that is the detection), never return other bytes.
    pub rotted: BTreeSet<(u64, u64)>,
    /// Reads of rotten entries that their check refused.
    pub rot_detected: u64,
    buf: Vec<u8>,
}

/// The simulated application's state after applying entries `1..=index`: a crc32c over each
/// entry's index and raw payload, in order (4 bytes, little-endian). A checkpoint carries it,
/// so a snapshot that does not cover exactly the entries it claims shows up.
fn fold_state(crc: u32, index: u64, raw: &[u8]) -> u32 {
    let crc = crc32c::crc32c_append(crc, &index.to_le_bytes());
    crc32c::crc32c_append(crc, raw)
}

/// The application state node `r` computes for `index` from its latest checkpoint and its
/// own log; `None` when the log does not hold what it needs.
pub fn node_app_state<F: fabric::Fabric>(r: &Replica<F>, index: u64) -> Option<Vec<u8>> {
    let (mut at, mut crc) = match r.latest_checkpoint() {
        Some(cp) if cp.index > index => return None,
        Some(cp) => (
            cp.index,
            u32::from_le_bytes(cp.state.get(..4)?.try_into().ok()?),
        ),
        None => (0, 0),
    };
    let mut buf = Vec::new();
    while at < index {
        at += 1;
        r.read_persisted(at, &mut buf).ok()??;
        crc = fold_state(crc, at, &buf);
    }
    Some(crc.to_le_bytes().to_vec())
}

/// raft's tag byte of an application entry (see `replica::storage`).
const TAG_NORMAL: u8 = 1;

impl Checker {
    /// A checker that has seen nothing.
    pub fn new() -> Self {
        Self::default()
    }

    /// Forgets node `id`'s incarnation (it crashed): its indexes may start lower after a
    /// restart.
    pub fn node_restarted(&mut self, id: u64) {
        self.views.remove(&id);
    }

    /// Checks one live node after a step.
    pub fn check_node<F: fabric::Fabric>(
        &mut self,
        id: u64,
        r: &Replica<F>,
    ) -> Result<(), Violation> {
        let s = r.status();
        if s.role == Role::Leader {
            match self.leaders.insert(s.term, id) {
                Some(other) if other != id => {
                    return Err(format!(
                        "election safety: nodes {other} and {id} were both leader of term {}",
                        s.term
                    ));
                }
                _ => {}
            }
        }
        let v = self.views.entry(id).or_default();
        if s.commit < v.commit {
            return Err(format!(
                "monotonicity: node {id}'s commit index went back from {} to {}",
                v.commit, s.commit
            ));
        }
        if s.applied < v.applied {
            return Err(format!(
                "monotonicity: node {id}'s applied index went back from {} to {}",
                v.applied, s.applied
            ));
        }
        if s.applied > s.commit {
            return Err(format!(
                "node {id} applied index {} beyond its commit index {}",
                s.applied, s.commit
            ));
        }
        v.commit = s.commit;
        v.applied = s.applied;

        // Membership: the voters after a change are the same on every node, and a node that
        // applied past a change counts with it (or a later one), never with one before it.
        if s.conf_index > 0 {
            match self.memberships.get(&s.conf_index) {
                Some((voters, other)) if *voters != s.voters => {
                    return Err(format!(
                        "membership agreement: node {id} counts voters {:?} after the change at \
                         {}, node {other} counted {voters:?}",
                        s.voters, s.conf_index
                    ));
                }
                Some(_) => {}
                None => {
                    self.memberships
                        .insert(s.conf_index, (s.voters.clone(), id));
                }
            }
        }
        // A leader that applied its own removal steps down (raft's rule; raft-rs leaves it
        // leading a configuration that no longer counts it, and panics at its next commit).
        if s.role == Role::Leader && !s.voters.is_empty() && !s.voters.contains(&id) {
            return Err(format!(
                "membership: node {id} leads term {} under a membership that does not count \
                 it: {:?} (the change at {})",
                s.term, s.voters, s.conf_index
            ));
        }
        if let Some((&later, (_, other))) = (s.applied > s.conf_as_of)
            .then(|| self.memberships.range(s.conf_as_of + 1..=s.applied).next())
            .flatten()
        {
            return Err(format!(
                "membership: node {id} applied up to {} past the change at {later} (node \
                 {other} showed it), but counts with the membership as of index {}: {:?}",
                s.applied, s.conf_as_of, s.voters
            ));
        }

        // Exactly-once: the session table is a function of the committed log, the same on
        // every replica as of the same index, and no entry of a session is folded in twice.
        let twice = r.stats().session_duplicates_applied;
        if twice > 0 {
            return Err(format!(
                "exactly-once: node {id} folded {twice} session entries into its table whose \
                 numbers it already held"
            ));
        }
        self.buf.clear();
        r.sessions().encode(&mut self.buf);
        let table = crc32c::crc32c(&self.buf);
        let at = r.sessions_index();
        match self.session_tables.get(&at) {
            Some(&(seen, other)) if seen != table => {
                return Err(format!(
                    "session agreement: node {id}'s session table as of index {at} differs \
                     from node {other}'s ({} sessions here)",
                    r.sessions().len()
                ));
            }
            Some(_) => {}
            None => {
                self.session_tables.insert(at, (table, id));
            }
        }

        // Log matching over the persisted log: walk back over a truncated suffix, then check
        // the new entries.
        let last = r.persisted_last_index();
        v.terms.truncate(last as usize);
        while let Some(&t) = v.terms.last() {
            let i = v.terms.len() as u64;
            if r.persisted_term(i) == Some(t) {
                break;
            }
            v.terms.pop();
        }
        let first = s.first_index.max(1);
        if (v.terms.len() as u64) < first - 1 {
            v.terms.resize(first as usize - 1, 0);
        }
        for i in v.terms.len() as u64 + 1..=last {
            let (term, lsn) = r
                .read_persisted_at(i, &mut self.buf)
                .map_err(|e| format!("node {id} cannot read its persisted entry {i}: {e}"))?
                .ok_or_else(|| format!("node {id} lost persisted entry {i} below {last}"))?;
            let crc = (crc32c::crc32c(&self.buf), self.buf.len(), lsn, id);
            match self.accepted.get(&(i, term)) {
                Some(&seen) if (seen.0, seen.1) != (crc.0, crc.1) => {
                    return Err(format!(
                        "log matching: node {id} holds a different entry at index {i} term \
                         {term} than another node did (crc {:#x}/{} bytes vs {:#x}/{} bytes)",
                        crc.0, crc.1, seen.0, seen.1
                    ));
                }
                Some(&seen) if seen.2 != lsn => {
                    return Err(format!(
                        "lsn agreement: node {id} holds entry {i} (term {term}) at lsn {lsn}, \
                         node {} held it at lsn {}",
                        seen.3, seen.2
                    ));
                }
                Some(_) => {}
                None => {
                    self.accepted.insert((i, term), crc);
                }
            }
            v.terms.push(term);
        }

        // The committed prefix agrees byte for byte with what any node ever committed.
        let from = v.committed_checked.max(first - 1);
        for i in from + 1..=s.commit {
            let term = r
                .read_persisted(i, &mut self.buf)
                .map_err(|e| format!("node {id} cannot read committed entry {i}: {e}"))?
                .ok_or_else(|| {
                    format!(
                        "node {id} has commit index {} but does not hold entry {i}",
                        s.commit
                    )
                })?;
            match self.committed.get(&i) {
                Some((t, bytes)) if *t != term || *bytes != self.buf => {
                    return Err(format!(
                        "state machine safety: node {id} committed term {term} ({} bytes) at \
                         index {i}, where term {t} ({} bytes) was committed before",
                        self.buf.len(),
                        bytes.len()
                    ));
                }
                Some(_) => {}
                None => {
                    self.committed.insert(i, (term, self.buf.clone()));
                }
            }
        }
        v.committed_checked = s.commit.max(v.committed_checked);

        // Re-read a few committed entries, cycling through the prefix.
        if s.commit >= first {
            let mut i = v.recheck_from.clamp(first, s.commit);
            for _ in 0..RECHECK_PER_STEP.min(s.commit - first + 1) {
                let term = match r.read_persisted(i, &mut self.buf) {
                    Err(replica::ReplicaError::Wal(wal::WalError::ReadCorrupt { .. }))
                        if self.rotted.contains(&(id, i)) =>
                    {
                        self.rot_detected += 1;
                        None
                    }
                    r => {
                        r.map_err(|e| format!("node {id} cannot read committed entry {i}: {e}"))?
                    }
                };
                if let (Some(term), Some((t, bytes))) = (term, self.committed.get(&i)) {
                    if term != *t || *bytes != self.buf {
                        return Err(format!(
                            "durability: node {id}'s committed entry {i} changed: it now reads \
                             term {term} ({} bytes), where term {t} ({} bytes) was committed",
                            self.buf.len(),
                            bytes.len()
                        ));
                    }
                }
                i = if i >= s.commit { first } else { i + 1 };
            }
            v.recheck_from = i;
        }
        Ok(())
    }

    /// Snapshot safety: node `id`'s latest checkpoint (taken there, or installed from a
    /// leader's snapshot) holds the application state of exactly the committed entries up to
    /// its index, as recomputed from the committed log the checker saw.
    pub fn check_checkpoint<F: fabric::Fabric>(
        &mut self,
        id: u64,
        r: &Replica<F>,
    ) -> Result<(), Violation> {
        let Some(cp) = r.latest_checkpoint() else {
            return Ok(());
        };
        if cp.state.is_empty() || !self.checkpoints_checked.insert((id, cp.index)) {
            return Ok(());
        }
        let mut crc = 0;
        for i in 1..=cp.index {
            match self.committed.get(&i) {
                Some((_, raw)) => crc = fold_state(crc, i, raw),
                // Committed and compacted before any check saw it: nothing to compare with.
                None => return Ok(()),
            }
        }
        if cp.state[..] != crc.to_le_bytes() {
            return Err(format!(
                "snapshot safety: node {id}'s checkpoint at index {} (term {}) holds another \
                 state than the committed log up to that index",
                cp.index, cp.term
            ));
        }
        Ok(())
    }

    /// Checks what node `id`'s log read at committed `index` right after a caller's pass
    /// ([`replica::sim::CallerRead`]): what a woken waiter (`Log::read`, a subscription, the
    /// server) would read then must be the committed entry, held by the log.
    pub fn check_caller_read(&mut self, read: replica::sim::CallerRead) -> Result<(), Violation> {
        let replica::sim::CallerRead { node, index, read } = read;
        let (term, bytes) = match read {
            Ok(Some(entry)) => entry,
            Ok(None) => {
                return Err(format!(
                    "caller's pass: right after it, node {node}'s commit index covers {index}, \
                     which its log does not hold (a read there fails)"
                ));
            }
            Err(replica::ReplicaError::Wal(wal::WalError::ReadCorrupt { .. }))
                if self.rotted.contains(&(node, index)) =>
            {
                self.rot_detected += 1;
                return Ok(());
            }
            Err(e) => {
                return Err(format!(
                    "caller's pass: right after it, node {node} cannot read committed entry \
                     {index}: {e}"
                ));
            }
        };
        match self.committed.get(&index) {
            Some((t, b)) if *t != term || *b != bytes => Err(format!(
                "caller's pass: right after it, node {node}'s log reads term {term} ({} \
                 bytes) at committed index {index}, where term {t} ({} bytes) was committed",
                bytes.len(),
                b.len()
            )),
            Some(_) => Ok(()),
            None => {
                self.committed.insert(index, (term, bytes));
                Ok(())
            }
        }
    }

    /// Checks that an acknowledged append is in the committed log at its index.
    pub fn check_ack(&self, a: &Attempt) -> Result<(), Violation> {
        let Outcome::Acked { index, .. } = a.outcome else {
            return Ok(());
        };
        match self.committed.get(&index) {
            Some((_, bytes)) if a.key.is_some() && application(bytes).1 == a.key => Ok(()),
            Some((_, bytes))
                if a.key.is_none()
                    && bytes.first() == Some(&TAG_NORMAL)
                    && bytes[1..] == a.payload[..] =>
            {
                Ok(())
            }
            Some(_) => Err(format!(
                "durability: the append acknowledged at index {index} ({}) is not what the \
                 committed log holds there",
                String::from_utf8_lossy(&a.payload[..a.payload.len().min(16)])
            )),
            None => Err(format!(
                "durability: the append acknowledged at index {index} is in no node's \
                 committed log"
            )),
        }
    }

    /// Whether the checker has read the committed entry at `index` from some node.
    pub fn has_committed(&self, index: u64) -> bool {
        self.committed.contains_key(&index)
    }

    /// The highest committed index any node reached.
    pub fn max_committed(&self) -> u64 {
        self.committed.keys().next_back().copied().unwrap_or(0)
    }

    /// Linearizability of the appends, with the committed log as the witness linearization
    /// (the Wing–Gong–Lowe search is trivial here because a log fixes the order):
    /// - every acknowledged attempt is in the committed log at the index it was told;
    /// - no attempt is in the log twice, and nothing is in the log that no client invoked;
    /// - an attempt that failed definitely is not in the log;
    /// - real-time order: if `a` was acknowledged before `b` was invoked and `b` is in the
    ///   log, `a`'s index is below `b`'s.
    pub fn check_history(&self, history: &[Attempt]) -> Result<(), Violation> {
        let mut by_payload: BTreeMap<&[u8], usize> = BTreeMap::new();
        for (k, a) in history.iter().enumerate() {
            if by_payload.insert(&a.payload, k).is_some() {
                return Err("harness bug: two attempts share a payload".into());
            }
        }
        let mut position: BTreeMap<usize, u64> = BTreeMap::new();
        let mut key_position: BTreeMap<(u64, u64), u64> = BTreeMap::new();
        for (&index, (_, bytes)) in &self.committed {
            let (payload, key) = application(bytes);
            let Some(payload) = payload else {
                continue;
            };
            if let Some(key) = key
                && let Some(other) = key_position.insert(key, index)
            {
                return Err(format!(
                    "exactly-once: session {} entry {} is in the committed log twice, at {other} \
                     and {index}",
                    key.0, key.1
                ));
            }
            let Some(&k) = by_payload.get(payload) else {
                return Err(format!(
                    "linearizability: index {index} holds an entry no client invoked"
                ));
            };
            if let Some(other) = position.insert(k, index) {
                return Err(format!(
                    "linearizability: one append is in the log twice, at {other} and {index}"
                ));
            }
        }
        for (k, a) in history.iter().enumerate() {
            match a.outcome {
                Outcome::Acked { index, .. }
                    if a.key.is_some()
                        && a.key.and_then(|key| key_position.get(&key).copied()) != Some(index) =>
                {
                    return Err(format!(
                        "exactly-once: an append of session {} entry {} acknowledged at index \
                         {index} is at {:?} in the committed log",
                        a.key.unwrap_or_default().0,
                        a.key.unwrap_or_default().1,
                        a.key.and_then(|key| key_position.get(&key).copied())
                    ));
                }
                Outcome::Acked { index, .. }
                    if a.key.is_none() && position.get(&k) != Some(&index) =>
                {
                    return Err(format!(
                        "linearizability: an append acknowledged at index {index} is at {:?} \
                         in the committed log",
                        position.get(&k)
                    ));
                }
                _ if a
                    .expected_last
                    .is_some_and(|e| position.get(&k).is_some_and(|&p| p != e + 1)) =>
                {
                    return Err(format!(
                        "linearizability: an append conditional on the log ending at {} is \
                         committed at index {}",
                        a.expected_last.unwrap_or(0),
                        position[&k]
                    ));
                }
                Outcome::InLog if a.key.is_some_and(|key| !key_position.contains_key(&key)) => {
                    let key = a.key.unwrap_or_default();
                    return Err(format!(
                        "exactly-once: session {} entry {} was answered as in the log already                          (too old to append again) and is not in the committed log",
                        key.0, key.1
                    ));
                }
                Outcome::Failed if position.contains_key(&k) => {
                    return Err(format!(
                        "linearizability: an append reported as failed (proposed on node {}, \
                         ticket {:?}) is committed at index {}",
                        a.node, a.ticket, position[&k]
                    ));
                }
                _ => {}
            }
        }
        // Real-time order: sort the acknowledged ones by ack time; each logged attempt must
        // come after every attempt acknowledged before it was invoked.
        let mut acks: Vec<(u64, u64)> = history
            .iter()
            .filter_map(|a| match a.outcome {
                Outcome::Acked { index, at_ns } => Some((at_ns, index)),
                _ => None,
            })
            .collect();
        acks.sort_unstable();
        let mut prefix_max = Vec::with_capacity(acks.len());
        let mut m = 0;
        for &(_, index) in &acks {
            m = m.max(index);
            prefix_max.push(m);
        }
        for (&k, &index) in &position {
            let invoked = history[k].invoked_ns;
            let before = acks.partition_point(|&(at, _)| at < invoked);
            if before > 0 && prefix_max[before - 1] >= index {
                return Err(format!(
                    "linearizability: the append at index {index}, invoked at {invoked} ns, \
                     is ordered before index {} that was acknowledged earlier",
                    prefix_max[before - 1]
                ));
            }
        }
        Ok(())
    }

    /// Nodes whose views exist (live incarnations seen).
    pub fn seen_nodes(&self) -> BTreeSet<u64> {
        self.views.keys().copied().collect()
    }
}

/// An application entry's own bytes and session key, from its stored payload; no bytes for
/// raft's own entries and session openings.
fn application(bytes: &[u8]) -> (Option<&[u8]>, Option<(u64, u64)>) {
    match replica::storage::payload_kind(bytes) {
        replica::storage::PayloadKind::Application { skip, session } => {
            (Some(&bytes[skip..]), session)
        }
        _ => (None, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An attempt answered `SessionTooOld` (in the log already) passes only when the committed
    /// log holds its session's key: the checker can fail on a replica that answered so for a
    /// number it never appended.
    #[test]
    fn an_entry_answered_as_in_the_log_must_be_there() {
        let attempt = |key: (u64, u64)| Attempt {
            payload: format!("attempt {key:?}").into_bytes(),
            node: 1,
            incarnation: 0,
            ticket: None,
            invoked_ns: 0,
            outcome: Outcome::InLog,
            expected_last: None,
            key: Some(key),
        };
        // The first try of (7, 3) committed at 12 without its client hearing of it.
        let first = Attempt {
            payload: b"the committed copy".to_vec(),
            outcome: Outcome::Unknown,
            ..attempt((7, 3))
        };
        let mut c = Checker::new();
        let mut raw = replica::storage::session_header(7, 3).to_vec();
        raw.extend_from_slice(&first.payload);
        c.committed.insert(12, (1, raw));
        assert_eq!(c.check_history(&[first.clone(), attempt((7, 3))]), Ok(()));
        let e = c.check_history(&[first, attempt((7, 4))]).unwrap_err();
        assert!(e.contains("session 7 entry 4"), "{e}");
    }
}
