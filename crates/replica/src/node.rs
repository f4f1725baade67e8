//! One replica: raft-rs driven over a [`Fabric`], with the ring, the wal and fencing.
//!
//! The replica is driven from outside: [`Replica::tick`] advances raft's logical clock and
//! [`Replica::process`] polls the fabric and handles every `Ready` in raft-rs's required
//! order (messages, entries, committed entries, HardState, persisted messages, advance). The
//! in-process simulator drives it from one thread; a production node drives it from its poller
//! thread. It never blocks except in the fsync that [`Durability::Fsync`] asks for.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use fabric::{ConnState, Event, Fabric, LocalRegion, NodeId, RemoteRegion, WcOp, WcStatus};
use protobuf::Message as _;
use raft::prelude::{
    ConfChange, ConfChangeType, ConfChangeV2, ConfState, Entry, EntryType, HardState, Message,
    MessageType, Snapshot,
};
use raft::{RawNode, SnapshotStatus, StateRole};
use wal::fs::FileSystem;
use wal::{Consumer, Index, Lsn, Position, Producer, RingConfig, RingMemory, Term, Wal, WalConfig};

use crate::reads::{ReadTicket, Reads};
use crate::recovering::Recovering;
use crate::sessions::{Applied, Pending, Sessions};
use crate::storage::{
    CheckpointData, ConfHistory, Guard, PayloadKind, SnapshotFile, StateFile, StoredState,
    TAG_NORMAL, TAG_SESSION_OPEN, WalStorage, payload_kind, payload_of, session_payload,
    snapshot_lsn,
};
use crate::wire::{self, Body, Frame, RingInfo, SNAPSHOT_CHUNK_BYTES, WireSnapshotMeta};
use crate::{ReplicaConfig, ReplicaError};
use fast::{FastPeer, Inflight};

/// Marks a step of the entries `first..=last` on their way through this replica, for the
/// per-step latency breakdown (`rdmalog-bench embedded --steps`): a `tracing` event at target
/// `rdmalog::step`, level TRACE, which costs one relaxed load where no subscriber wants it.
/// The steps: `ready` (raft handed the entries over; the leader put them in its ring),
/// `sent` / `sent_slow` (an append left for a follower), `received` (a follower took a fast
/// append's descriptor), `persisted` (in the wal at the configured durability), `answered`
/// (a follower's append response left), `acked` / `nic_acked` (the leader counted a
/// follower's response or write completion), `committed` (the commit index reached `last`).
macro_rules! step {
    ($node:expr, $step:literal, $first:expr, $last:expr) => {
        tracing::trace!(
            target: "rdmalog::step",
            node = $node,
            step = $step,
            first = $first,
            last = $last
        )
    };
}
pub(crate) use step;

mod fast;
mod open;
mod send;

/// How many fabric events one poll takes (the array is allocated once).
const POLL_BATCH: usize = 64;

/// How many reconnect periods the higher id of a pair waits, with the connection down, before
/// it connects itself (the lower id normally does, every period).
const HIGHER_ID_CONNECT_PERIODS: u64 = 4;

/// Encoded frames queued per peer while it has no send credits. raft-rs retransmits what is
/// dropped past this bound, so the bound only limits memory.
const MAX_OUTBOX: usize = 1024;

/// A proposal's place in the log: it is committed when the commit index reaches `index` and
/// the entry there still has `term`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ticket {
    /// Index the entry was given.
    pub index: u64,
    /// Term it was proposed in.
    pub term: u64,
}

/// What a committed index holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Committed {
    /// An application entry of `term`.
    Application {
        /// Its term.
        term: u64,
    },
    /// raft's own entry (a new leader's no-op, a membership change).
    Internal {
        /// Its term.
        term: u64,
    },
}

/// The latest checkpoint: the application's state after applying every entry up to and
/// including `index` (empty when the log was truncated with
/// [`Replica::truncate_prefix`], which records no state).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Checkpoint {
    /// The last entry the state covers.
    pub index: u64,
    /// Its term.
    pub term: u64,
    /// The application's state.
    pub state: Vec<u8>,
}

/// A snapshot's data being received in chunks.
#[derive(Debug)]
struct SnapshotRx {
    from: u64,
    index: u64,
    term: u64,
    total: u64,
    data: Vec<u8>,
}

/// This node's role.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Leader of `term`.
    Leader,
    /// Following (or waiting for) a leader.
    Follower,
    /// Campaigning.
    Candidate,
}

/// Counters of what the replica did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReplicaStats {
    /// Leader: appends sent by RDMA Write plus descriptor.
    pub fast_appends: u64,
    /// Leader: bytes RDMA-written into followers' rings.
    pub fast_bytes: u64,
    /// Leader: appends sent with their payload over send/recv.
    pub slow_appends: u64,
    /// Leader: writes that completed RemoteAccess because a follower revoked us (fenced).
    pub fenced_writes: u64,
    /// Follower: descriptors whose ring bytes or position did not check out.
    pub fast_rejected: u64,
    /// Follower, outside `Durability::Replicated`: descriptors of its granted leader of this
    /// term whose write started below the end of the records it had already accepted. The
    /// leader wrote over records this follower holds, which its fast-path rule forbids (a
    /// torn or corrupted write there would damage an accepted record): the simulator fails a
    /// seed on any.
    pub fast_overwrites: u64,
    /// Frames that failed to decode or came from the wrong peer (connection dropped).
    pub bad_frames: u64,
    /// Messages dropped because a peer's outbox was full.
    pub dropped_messages: u64,
    /// Connection attempts after the first.
    pub reconnects: u64,
    /// Grants of remote write on our ring.
    pub grants: u64,
    /// Revocations of remote write on our ring.
    pub revokes: u64,
    /// Vote, pre-vote and timeout-now requests dropped while recovering (see
    /// [`Status::recovering`]).
    pub refused_while_recovering: u64,
    /// Heartbeats whose commit index lay beyond this node's log (it lost entries the leader
    /// counted): stepped with the commit index clamped to the log.
    pub clamped_heartbeats: u64,
    /// Leader: followers found holding fewer entries than raft counted as theirs (they lost
    /// entries); probed again from what they hold.
    pub followers_rewound: u64,
    /// Appends that found the ring full: it was persisted and released, unpinning the RDMA
    /// writes still reading from it.
    pub ring_full: u64,
    /// Entries recovered at open from the shared-memory ring a crashed process left
    /// (`Durability::Memory`): accepted, possibly acknowledged, not yet in the segment files.
    pub recovered_from_ring: u64,
    /// Leader: snapshots sent to followers behind the first entry held.
    pub snapshots_sent: u64,
    /// Follower: snapshots installed.
    pub snapshots_installed: u64,
    /// Follower: snapshot chunks dropped (out of order, from another sender, or larger than
    /// `max_snapshot_bytes`); the leader sends the snapshot again.
    pub snapshot_chunks_dropped: u64,
    /// Work completions by status: success, remote access (fenced), retry exceeded (dead
    /// peer), RNR retry exceeded, flushed (connection broke first).
    pub completions: [u64; 5],
    /// The wal's group-commit flushes (writes and fdatasync) since open.
    pub fsyncs: u64,
    /// Their total time, in ns.
    pub fsync_total_ns: u64,
    /// The longest, in ns.
    pub fsync_max_ns: u64,
    /// Leader, `Durability::Replicated`: appends counted as a follower's when the RDMA Write
    /// that placed them completed.
    pub nic_acks: u64,
    /// Follower, `Durability::Replicated`: entries taken from the ring as the leader placed
    /// them, before (or without) their descriptor.
    pub placed_taken: u64,
    /// Leader: session appends answered with the ticket of the copy already in the log
    /// (a client's retry), instead of being appended again.
    pub session_duplicates_refused: u64,
    /// Committed session entries whose sequence number was already applied: the log holds an
    /// entry twice. The leader's check makes this impossible; the simulator fails a seed
    /// that shows one.
    pub session_duplicates_applied: u64,
}

/// The labels of [`ReplicaStats::completions`], in order.
pub const COMPLETION_STATUSES: [&str; 5] = [
    "success",
    "remote_access",
    "retry_exceeded",
    "rnr_retry_exceeded",
    "flushed",
];

/// A snapshot of the replica's state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    /// This node.
    pub id: u64,
    /// Its role.
    pub role: Role,
    /// Current term.
    pub term: u64,
    /// The leader it knows, if any.
    pub leader: Option<u64>,
    /// Commit index.
    pub commit: u64,
    /// Applied index.
    pub applied: u64,
    /// Last index of the log.
    pub last_index: u64,
    /// First index still held.
    pub first_index: u64,
    /// Bytes of the log's stream held, from the first entry's record to the end (segment
    /// preallocation and headers not counted).
    pub log_bytes: u64,
    /// Bytes of the ring in use.
    pub ring_used_bytes: u64,
    /// Ring capacity.
    pub ring_capacity_bytes: u64,
    /// Voters.
    pub voters: Vec<u64>,
    /// Counters.
    pub stats: ReplicaStats,
    /// One entry per peer: its connection and whether the fast path is open to it.
    pub peers: Vec<PeerStatus>,
    /// `Some(why)` while this node is recovering from a start that lost entries it may have
    /// acknowledged: it does not vote or campaign, and the sentence says what it waits for.
    pub recovering: Option<String>,
    /// `Some(why)` once the replica stopped working (a storage error poisoned it, or its
    /// driver thread panicked): it refuses all further work and should be restarted.
    pub failure: Option<String>,
}

/// What a replica knows about one peer's connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerStatus {
    /// The peer.
    pub id: u64,
    /// Its connection's state.
    pub conn: ConnState,
    /// Whether the peer advertised a ring we can write into.
    pub has_ring: bool,
    /// Whether the fast-path invariant currently holds for it (leader only).
    pub fast_path: bool,
    /// The highest index known replicated to it (leader only; 0 otherwise).
    pub matched: u64,
}

#[derive(Clone, Copy, Debug)]
struct RingEntry {
    index: Index,
    term: Term,
    start: Lsn,
    end: Lsn,
}

impl RingEntry {
    /// The entry of a record the ring checked at `start`.
    #[inline]
    fn checked(start: Lsn, d: &wal::format::Decoded<'_>) -> RingEntry {
        RingEntry {
            index: d.header.index,
            term: d.header.term,
            start,
            end: Lsn(start.0 + d.record_len),
        }
    }
}

#[derive(Debug, Default)]
struct Peer {
    remote: Option<RemoteRegion>,
    /// The leader's fast-path state for this peer's connection.
    fast: FastPeer,
    ring_head: u64,
    last_connect_tick: Option<u64>,
    /// Tick since which the connection has been down, as the higher id of the pair sees it.
    down_since: Option<u64>,
    outbox: VecDeque<Vec<u8>>,
}

/// The ring's memory: allocated by the fabric (so the RDMA back-end can register it), seen
/// by the wal as plain words. Under `Durability::Memory` both parts are shared memory that
/// outlives the process: the ring, and a page whose first word mirrors its published end.
#[derive(Debug)]
struct FabricRing {
    ring: Arc<dyn fabric::Memory>,
    tail: Option<Arc<dyn fabric::Memory>>,
}

impl RingMemory for FabricRing {
    fn words(&self) -> &[std::sync::atomic::AtomicU64] {
        self.ring.words()
    }

    fn tail_mirror(&self) -> Option<&std::sync::atomic::AtomicU64> {
        self.tail.as_ref().map(|t| &t.words()[0])
    }
}

/// The ring as `Replica::open` sets it up.
struct OpenRing {
    fabric_memory: Arc<dyn fabric::Memory>,
    memory: Arc<dyn RingMemory>,
    producer: Producer,
    consumer: Consumer,
}

/// What `Replica::open` found of the ring a previous process of its data dir used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LeftRing {
    /// No ring (a first start, a clean close, a machine crash), or a private ring.
    Missing,
    /// A ring that must not be taken over (a new data dir, a snapshot install to finish).
    Ignored,
    /// Taken over, with this many entries the segment files lacked.
    Recovered(u64),
    /// A ring whose records past the segment files fail their checks.
    Corrupt,
}

/// What a driver pass that found nothing to do saw: every input of raft-rs's `has_ready` that
/// can change without a `Ready` being handled (its queues, its soft and hard state, the
/// committed, persisted and applied indices), and ours: the term made durable, the granted
/// connection, whether an outbox is queued. While they stay the same, the rest of a pass would
/// do nothing either (no `Ready`, the fencing and the fast paths' epoch unchanged, nothing to
/// flush), so `process` returns after its poll when the poll brought nothing, and skips the
/// rest when the events it brought changed none of them (a send's completion, a write's under
/// `Memory`): an idle pass is a poll and this comparison, not `has_ready` and a connection
/// look-up. Anything that changes one of them (a tick, a proposal, a step, a read) makes the
/// next pass a full one; a `Ready` clears the mark, and debug builds (every test and simulator
/// seed) check each skip against `has_ready`. A connection's state is not here: its change
/// arrives as an event, and `Connected` runs the fencing itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Quiet {
    msgs: usize,
    read_states: usize,
    unstable: usize,
    snapshot: bool,
    term: u64,
    vote: u64,
    commit: u64,
    leader: u64,
    role: StateRole,
    persisted: u64,
    applied: u64,
    durable_term: u64,
    granted: Option<u64>,
    outboxes_queued: bool,
}

impl Quiet {
    fn of<F: Fabric>(r: &Replica<F>) -> Quiet {
        let raft = &r.raw.raft;
        let log = &raft.raft_log;
        Quiet {
            msgs: raft.msgs.len(),
            read_states: raft.read_states.len(),
            unstable: log.unstable.entries.len(),
            snapshot: log.unstable.snapshot.is_some(),
            term: raft.term,
            vote: raft.vote,
            commit: log.committed,
            leader: raft.leader_id,
            role: raft.state,
            persisted: log.persisted,
            applied: log.applied,
            durable_term: r.persisted_hs.term,
            granted: r.granted,
            outboxes_queued: r.outboxes_queued,
        }
    }
}

/// One replica of the log.
pub struct Replica<F: Fabric> {
    cfg: ReplicaConfig,
    raw: RawNode<WalStorage>,
    fabric: F,
    wal: Arc<Wal>,
    state_file: StateFile,
    snapshot_file: SnapshotFile,
    /// The membership as of each index since the latest checkpoint, so a checkpoint records
    /// the membership as of its own index.
    conf_history: ConfHistory,
    snapshot_rx: Option<SnapshotRx>,
    persisted_hs: HardState,
    memory: Arc<dyn RingMemory>,
    /// Under `Durability::Memory`: the ring's shared-memory file and its tail file.
    ring_files: Option<(std::path::PathBuf, std::path::PathBuf)>,
    producer: Producer,
    consumer: Consumer,
    ring_local: LocalRegion,
    ring_entries: VecDeque<RingEntry>,
    /// Follower: highest index whose ring bytes were accepted from the leader's write.
    fast_accepted_to: u64,
    peers: BTreeMap<u64, Peer>,
    writes_in_flight: Inflight,
    next_wr_id: u64,
    granted: Option<u64>,
    ticks: u64,
    applied: u64,
    /// The client sessions as of `applied` ([`crate::sessions`]).
    sessions: Sessions,
    /// Leader: the sessions' entries in its log past `applied`.
    pending_sessions: Pending,
    stats: ReplicaStats,
    poisoned: Option<String>,
    events: Vec<Event>,
    /// The (term, leader?) the peers' fast-path state belongs to.
    fast_epoch: (u64, bool),
    /// `Some` while recovering from lost acknowledgements (see [`crate::recovering`]).
    recovering: Option<Recovering>,
    work: u64,
    /// Whether some peer's outbox may hold frames: set when one is queued, recomputed by
    /// `flush_outboxes`, so that a pass with nothing queued does not walk the peers.
    outboxes_queued: bool,
    /// Set by a pass that ended with nothing to do: what it saw. A later pass that polls no
    /// event and finds the same returns at once ([`Quiet`]).
    quiet: Option<Quiet>,
    encode_buf: Vec<u8>,
    scratch: Vec<u8>,
    /// Linearizable reads in flight (raft's ReadIndex).
    reads: Reads,
}

impl<F: Fabric> std::fmt::Debug for Replica<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replica")
            .field("status", &self.status())
            .finish_non_exhaustive()
    }
}

/// The voters a membership change records for after itself (see
/// [`Replica::change_membership`]); `None` for a change that records none.
fn voters_after(cc: &ConfChange) -> Option<Vec<u64>> {
    let ctx = &cc.context[..];
    if ctx.is_empty() || ctx.len() % 8 != 0 {
        return None;
    }
    Some(
        ctx.chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect(),
    )
}

/// Whether an append's entries are consecutive from the index after `m.index`, with terms
/// that never fall and never exceed the message's.
fn entries_follow(m: &Message) -> bool {
    let mut prev = (m.index, m.log_term);
    for e in m.entries.iter() {
        if e.index != prev.0 + 1 || e.term < prev.1 || e.term > m.term {
            return false;
        }
        prev = (e.index, e.term);
    }
    true
}

/// Every node of a configuration: voters, then learners.
fn members_of(cs: &ConfState) -> Vec<u64> {
    cs.voters
        .iter()
        .chain(cs.learners.iter())
        .copied()
        .collect()
}

/// Persists the ring's published records that the wal lacks: from the producer's private copy
/// of them, which already passed its checks (one checksum per record where it was made or
/// received, none on the way to the segment files), or, where that copy does not reach back to
/// the wal's end (after a rewind or a fresh ring), from the shared memory with every record
/// checked again. Then forgets the copy of what the wal now holds.
fn persist_ring(
    wal: &Wal,
    producer: &mut wal::Producer,
    consumer: &wal::Consumer,
    durability: wal::Durability,
) -> Result<wal::Position, wal::WalError> {
    let (start, end) = (wal.position().lsn, producer.position().lsn);
    let verified = producer.verified();
    let done = if verified.covers(start, end) {
        wal.persist_from(&verified, end, durability)?
    } else {
        wal.persist_from(consumer, end, durability)?
    };
    producer.forget_verified(done.lsn);
    Ok(done)
}

fn poison_msg(what: &str, e: impl std::fmt::Display) -> String {
    format!("{what}: {e}")
}

impl<F: Fabric> Replica<F> {
    /// Leaves recovery once the commit index covers an entry of a term above the lost one
    /// (see [`crate::recovering`]), durably.
    fn leave_recovery_if_caught_up(&mut self) -> Result<(), ReplicaError> {
        let Some(r) = self.recovering else {
            return Ok(());
        };
        let log = &self.raw.raft.raft_log;
        let commit = log.committed;
        let commit_term = log.term(commit).unwrap_or(0);
        if !r.caught_up(commit_term) {
            return Ok(());
        }
        self.store_guard(Guard {
            recovering_above_term: None,
            ..self.state_file.guard()
        })?;
        self.recovering = None;
        tracing::info!(
            node = self.cfg.id,
            commit,
            commit_term,
            lost_term = r.lost_term,
            "caught up after lost acknowledgements: this node votes again"
        );
        Ok(())
    }

    /// This node's id.
    pub fn id(&self) -> u64 {
        self.cfg.id
    }

    /// Advances raft's logical clock by one tick and retries broken connections. A recovering
    /// node's election timer does not run: it must not campaign.
    pub fn tick(&mut self) {
        self.ticks += 1;
        if self.recovering.is_none() && self.poisoned.is_none() {
            // A failed read fails the replica stop; the next `process` reports it.
            let _ = self.fail_stop_on_read_error(|r| {
                r.raw.tick();
                Ok(())
            });
        }
        self.maintain_connections();
    }

    /// Starts an election now (tests and operators); refused while recovering.
    pub fn campaign(&mut self) -> Result<(), ReplicaError> {
        if let Some(r) = self.recovering {
            return Err(ReplicaError::Recovering(
                r.reason(self.leader(), self.commit_index()),
            ));
        }
        self.fail_stop_on_read_error(|r| Ok(r.raw.campaign()?))
    }

    /// Proposes `data`; the returned ticket resolves through [`Replica::ticket_status`].
    pub fn propose(&mut self, data: &[u8]) -> Result<Ticket, ReplicaError> {
        self.fail_stop_on_read_error(|r| r.propose_inner(data))
    }

    fn propose_inner(&mut self, data: &[u8]) -> Result<Ticket, ReplicaError> {
        self.check_proposal(&[data])?;
        let before = self.raw.raft.raft_log.last_index();
        let mut v = Vec::with_capacity(data.len() + 1);
        v.push(TAG_NORMAL);
        v.extend_from_slice(data);
        self.raw
            .propose(Vec::new(), v)
            .map_err(|e| ReplicaError::Dropped(e.to_string()))?;
        let after = self.raw.raft.raft_log.last_index();
        if after != before + 1 {
            return Err(ReplicaError::Dropped(
                "raft did not append the proposal".into(),
            ));
        }
        Ok(Ticket {
            index: after,
            term: self.raw.raft.term,
        })
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

    /// Where this node's log ends now: its last index, committed or not.
    pub fn last_index(&self) -> u64 {
        self.raw.raft.raft_log.last_index()
    }

    /// Refuses a proposal of `items` that cannot be made here: poisoned, an item over the
    /// size limit, not the leader.
    fn check_proposal(&self, items: &[&[u8]]) -> Result<(), ReplicaError> {
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

    fn propose_batch_inner(
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
                self.raw.raft.raft_log.last_index()
            };
            if last != expected {
                return Err(ReplicaError::ConditionFailed { expected, last });
            }
        }
        let payloads = items
            .iter()
            .map(|data| {
                let mut v = Vec::with_capacity(data.len() + 1);
                v.push(TAG_NORMAL);
                v.extend_from_slice(data);
                v
            })
            .collect();
        self.propose_payloads(payloads)
    }

    /// Steps stored payloads into raft as one proposal: consecutive indexes for all, or none
    /// in the log and an error.
    fn propose_payloads(&mut self, payloads: Vec<Vec<u8>>) -> Result<Vec<Ticket>, ReplicaError> {
        if payloads.is_empty() {
            return Ok(Vec::new());
        }
        let n = payloads.len() as u64;
        let entries: Vec<Entry> = payloads
            .into_iter()
            .map(|v| {
                let mut e = Entry::default();
                e.data = v.into();
                e
            })
            .collect();
        let mut m = Message::default();
        m.set_msg_type(MessageType::MsgPropose);
        m.from = self.cfg.id;
        m.set_entries(entries.into());
        let before = self.raw.raft.raft_log.last_index();
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
        let term = self.raw.raft.term;
        Ok((before + 1..=after)
            .map(|index| Ticket { index, term })
            .collect())
    }

    /// Proposes the opening of a client session (see [`crate::sessions`]); once the ticket
    /// resolves, its index is the session's id, known to every replica.
    pub fn open_session(&mut self) -> Result<Ticket, ReplicaError> {
        self.fail_stop_on_read_error(|r| {
            r.check_proposal(&[])?;
            r.refresh_pending_sessions()?;
            let t = r.propose_payloads(vec![vec![TAG_SESSION_OPEN]])?[0];
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

    fn propose_in_session_inner(
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
                fresh.push(session_payload(session, seq, data));
            } else {
                return Err(ReplicaError::SessionSequence {
                    session,
                    expected: last_seq + 1,
                    got: seq,
                });
            }
        }
        self.stats.session_duplicates_refused += tickets.len() as u64;
        let first_fresh = last_seq + 1;
        let proposed = self.propose_payloads(fresh)?;
        let q = self.pending_sessions.entries.entry(session).or_default();
        for (k, t) in proposed.iter().enumerate() {
            q.push_back((first_fresh + k as u64, t.index, t.term));
        }
        tickets.extend(proposed);
        Ok(tickets)
    }

    /// The ticket of committed entry `index`, which resolves to it.
    fn committed_ticket(&self, index: u64) -> Ticket {
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
    fn refresh_pending_sessions(&mut self) -> Result<(), ReplicaError> {
        let term = self.raw.raft.term;
        if self.pending_sessions.term == term {
            return Ok(());
        }
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
        // decides. No term look-up (the example's leader asks ~19 times per commit).
        if self.raw.raft.state == StateRole::Leader
            && self.raw.raft.term == t.term
            && t.index <= log.last_index()
            && t.index > log.committed
        {
            debug_assert_eq!(log.term(t.index).ok(), Some(t.term));
            return None;
        }
        let (last_compacted, prefix_term) = self.raw.store().prefix();
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
        match log.term(t.index) {
            Ok(term) if term == t.term => (log.committed >= t.index).then_some(Ok(t.index)),
            Ok(_) => Some(Err(ReplicaError::Superseded { index: t.index })),
            // Not in the log any more: truncated away after a conflict.
            Err(_) if t.index > log.last_index() => {
                Some(Err(ReplicaError::Superseded { index: t.index }))
            }
            Err(_) => (log.committed >= t.index).then_some(Ok(t.index)),
        }
    }

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
    /// the cluster had committed when this was called. `NotLeader` on any other node.
    pub fn read_index(&mut self) -> Result<ReadTicket, ReplicaError> {
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
    /// before a majority confirmed it.
    pub fn read_status(&mut self, t: ReadTicket) -> Option<Result<u64, ReplicaError>> {
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

    /// Whether this leader has committed an entry of its own term (raft-rs drops ReadIndex
    /// requests until it has).
    fn committed_in_own_term(&self) -> bool {
        let log = &self.raw.raft.raft_log;
        log.term(log.committed).ok() == Some(self.raw.raft.term)
    }

    /// Hands waiting reads to raft once this leader committed in its term; drops them when it
    /// no longer leads (their tickets then resolve `NotLeader`).
    fn issue_waiting_reads(&mut self) {
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

    /// Asks raft to hand leadership to `to`.
    pub fn transfer_leader(&mut self, to: u64) {
        let _ = self.fail_stop_on_read_error(|r| {
            r.raw.transfer_leader(to);
            Ok(())
        });
    }

    /// Proposes adding (`add = true`) or removing a voter; it takes effect when committed.
    pub fn change_membership(&mut self, node: u64, add: bool) -> Result<Ticket, ReplicaError> {
        self.fail_stop_on_read_error(|r| r.change_membership_inner(node, add))
    }

    fn change_membership_inner(&mut self, node: u64, add: bool) -> Result<Ticket, ReplicaError> {
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
        let mut after_change: Vec<u64> = self.raw.raft.prs().conf().voters().ids().iter().collect();
        after_change.retain(|&v| v != node);
        if add {
            after_change.push(node);
        }
        after_change.sort_unstable();
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
        if after != before + 1 {
            return Err(ReplicaError::Membership(
                "raft refused the change (one is already pending)".into(),
            ));
        }
        Ok(Ticket {
            index: after,
            term: self.raw.raft.term,
        })
    }

    /// Deletes entries below `index` after the application checkpointed them elsewhere,
    /// recording a checkpoint without state at `index - 1` (clamped to the applied index) so
    /// that a follower behind the cut can still be caught up: it gets a snapshot with an empty
    /// state (see [`Replica::checkpoint`] to ship the application's state with it). Returns
    /// the new first index (whole segments are deleted, so it may be lower than `index`).
    pub fn truncate_prefix(&mut self, index: u64) -> Result<u64, ReplicaError> {
        let upto = index.min(self.applied + 1);
        if upto <= 1 {
            return Ok(self.wal.first_index().0);
        }
        self.checkpoint(upto - 1, &[])
    }

    /// Records a checkpoint: `state` is the application's state after applying every entry up
    /// to and including `index`, which must be applied. It is stored durably, then entries up
    /// to `index` are deleted (whole segments). A follower that needs deleted entries is sent
    /// the checkpoint as a raft snapshot, in chunks over send/recv, and installs it; its
    /// application restores from [`Replica::latest_checkpoint`] when a read reports
    /// [`ReplicaError::Compacted`]. Refused (with the reason) when `index` is not applied yet,
    /// when `state` exceeds `max_snapshot_bytes`, or when a membership change was applied
    /// after `index` (checkpoint at that change or later). An `index` at or below the latest
    /// checkpoint changes nothing. Returns the new first index.
    pub fn checkpoint(&mut self, index: u64, state: &[u8]) -> Result<u64, ReplicaError> {
        if let Some(p) = &self.poisoned {
            return Err(ReplicaError::Poisoned(p.clone()));
        }
        let refuse = |why: String| Err(ReplicaError::Checkpoint(why));
        if state.len() as u64 > self.cfg.max_snapshot_bytes {
            return refuse(format!(
                "a state of {} bytes exceeds max_snapshot_bytes ({})",
                state.len(),
                self.cfg.max_snapshot_bytes
            ));
        }
        if index > self.applied {
            return refuse(format!(
                "entry {index} is not applied yet (applied up to {}); checkpoint only what the application applied",
                self.applied
            ));
        }
        let latest = self
            .raw
            .store()
            .latest_snapshot()
            .map_or(0, |s| s.get_metadata().index);
        if index == 0 || index <= latest {
            return Ok(self.wal.first_index().0);
        }
        let Some(conf) = self.conf_history.at(index).cloned() else {
            return refuse(format!(
                "the membership as of index {index} is no longer known (it is kept from index {} on); checkpoint at {} or later",
                self.conf_history.base_index, self.conf_history.base_index
            ));
        };
        let Some(pos) = self.wal.position_after(Index(index)) else {
            return refuse(format!(
                "entry {index} is no longer in the log (it starts at {})",
                self.wal.first_index().0
            ));
        };
        let mut sessions = Vec::new();
        let table = self.sessions_at(index, latest)?;
        if !table.is_empty() {
            table.encode(&mut sessions);
        }
        let mut snap = Snapshot::default();
        let meta = snap.mut_metadata();
        meta.index = index;
        meta.term = pos.last_term.0;
        *meta.mut_conf_state() = conf;
        snap.data = CheckpointData {
            lsn: pos.lsn.0,
            sessions: &sessions,
            state,
        }
        .encode()
        .into();
        self.snapshot_file
            .store(&snap)
            .map_err(|e| ReplicaError::Poisoned(poison_msg("cannot store the checkpoint", e)))?;
        self.raw.mut_store().set_snapshot(snap);
        let first = self.wal.truncate_prefix(Index(index + 1))?;
        let prefix_term = self
            .wal
            .position_after(Index(first.0 - 1))
            .map_or(pos.last_term.0, |p| p.last_term.0);
        self.raw.mut_store().set_prefix(first.0, prefix_term);
        self.raw.mut_store().forget_below(first.0);
        self.conf_history.compact(index);
        self.store_state()?;
        Ok(first.0)
    }

    /// The session table as of applied entry `index`: the latest checkpoint's (at
    /// `latest`), with the entries after it applied again from the log.
    fn sessions_at(&self, index: u64, latest: u64) -> Result<Sessions, ReplicaError> {
        if index == self.applied {
            return Ok(self.sessions.clone());
        }
        let mut t = match self.raw.store().latest_snapshot() {
            Some(snap) => CheckpointData::decode(&snap.data)
                .and_then(|d| d.session_table())
                .map_err(ReplicaError::Checkpoint)?,
            None => Sessions::default(),
        };
        let mut buf = Vec::new();
        for i in (latest + 1).max(self.wal.first_index().0)..=index {
            self.wal.read(Index(i), &mut buf)?;
            match payload_kind(&buf) {
                PayloadKind::SessionOpen => t.open(i),
                PayloadKind::Application {
                    session: Some((id, seq)),
                    ..
                } => {
                    t.apply(i, id, seq);
                }
                _ => {}
            }
        }
        Ok(t)
    }

    /// The client sessions as of the applied index.
    pub fn sessions(&self) -> &Sessions {
        &self.sessions
    }

    /// Where the record of entry `index` starts in the log's stream (the end, past the last).
    fn stream_start_of(&self, index: u64) -> u64 {
        self.wal
            .position_after(Index(index - 1))
            .map_or(self.wal.position().lsn.0, |p| p.lsn.0)
    }

    /// Bytes of the log's stream from the first entry held to the end.
    fn log_bytes(&self) -> u64 {
        let first = self.wal.first_index().0.max(1);
        self.wal.position().lsn.0 - self.stream_start_of(first)
    }

    /// The first index from which the log holds at most `max_bytes` of its stream (one past
    /// the last when even the last entry is larger).
    pub fn first_within_bytes(&self, max_bytes: u64) -> u64 {
        let end = self.wal.position().lsn.0;
        let (mut lo, mut hi) = (self.wal.first_index().0.max(1), self.wal.last_index().0 + 1);
        // The bytes from `i` on fall as `i` grows: find the first `i` within the limit.
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if end - self.stream_start_of(mid) <= max_bytes {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        lo
    }

    /// What a retention policy looks at ([`crate::retention`]): the log's bounds, the applied
    /// index, and each segment's first index with its file's last write (`None` where the
    /// file system cannot tell, as in the simulator).
    pub fn retention_view(&self) -> crate::retention::Held {
        crate::retention::Held {
            first: self.wal.first_index().0.max(1),
            last: self.wal.last_index().0,
            applied: self.applied,
            segments: self
                .wal
                .segment_starts()
                .into_iter()
                .map(|(index, lsn)| {
                    let path = self.cfg.data_dir.join(Wal::segment_file_name(lsn));
                    let written = std::fs::metadata(path).and_then(|m| m.modified()).ok();
                    (index.0, written)
                })
                .collect(),
        }
    }

    /// The first index the log holds.
    pub fn first_index(&self) -> u64 {
        self.wal.first_index().0
    }

    /// The latest checkpoint, taken here or installed from the leader.
    pub fn latest_checkpoint(&self) -> Option<Checkpoint> {
        let snap = self.raw.store().latest_snapshot()?;
        let meta = snap.get_metadata();
        Some(Checkpoint {
            index: meta.index,
            term: meta.term,
            state: CheckpointData::decode(&snap.data)
                .map(|d| d.state.to_vec())
                .unwrap_or_default(),
        })
    }

    /// The replica's state.
    pub fn status(&self) -> Status {
        let r = &self.raw.raft;
        Status {
            id: self.cfg.id,
            role: match r.state {
                StateRole::Leader => Role::Leader,
                StateRole::Candidate | StateRole::PreCandidate => Role::Candidate,
                StateRole::Follower => Role::Follower,
            },
            term: r.term,
            leader: self.leader(),
            commit: r.raft_log.committed,
            applied: self.applied,
            last_index: r.raft_log.last_index(),
            first_index: self.wal.first_index().0,
            log_bytes: self.log_bytes(),
            ring_used_bytes: self.producer.position().lsn.0 - self.consumer.head().0,
            ring_capacity_bytes: self.cfg.ring_bytes,
            voters: {
                let mut v: Vec<u64> = self.raw.raft.prs().conf().voters().ids().iter().collect();
                v.sort_unstable();
                v
            },
            stats: {
                let (n, total, max) = self.wal.sync_stats();
                ReplicaStats {
                    fsyncs: n,
                    fsync_total_ns: total.as_nanos() as u64,
                    fsync_max_ns: max.as_nanos() as u64,
                    ..self.stats
                }
            },
            peers: self
                .peers
                .iter()
                .map(|(&id, p)| PeerStatus {
                    id,
                    conn: self.fabric.conn_state(NodeId(id)),
                    has_ring: p.remote.is_some(),
                    fast_path: p.fast.end().is_some(),
                    matched: self.raw.raft.prs().get(id).map_or(0, |pr| pr.matched),
                })
                .collect(),
            recovering: self
                .recovering
                .map(|rec| rec.reason(self.leader(), r.raft_log.committed)),
            failure: self.poisoned.clone(),
        }
    }

    /// Counters.
    pub fn stats(&self) -> ReplicaStats {
        self.stats
    }

    /// Checks that every record the ring still holds for an accepted entry decodes, with the
    /// index, term and extent it was accepted with. A write that landed over accepted bytes
    /// (a stale leader's that the fencing missed) shows up here, even when the segment files
    /// already hold a good copy: under `Memory` a later recovery would read the ring. The
    /// simulator's checkers call it after every step.
    pub fn verify_ring(&mut self) -> Result<(), String> {
        let head = self.consumer.head().0;
        for k in 0..self.ring_entries.len() {
            let r = self.ring_entries[k];
            if r.start.0 < head {
                continue;
            }
            match self.consumer.next_entry(r.start) {
                Ok(Some((lsn, d)))
                    if lsn == r.start
                        && d.header.index == r.index
                        && d.header.term == r.term
                        && lsn.0 + d.record_len == r.end.0 => {}
                Ok(Some((lsn, d))) => {
                    return Err(format!(
                        "the ring record of entry {} (term {}) at lsn {} now reads as entry {} term {} at lsn {}",
                        r.index, r.term, r.start, d.header.index.0, d.header.term.0, lsn.0
                    ));
                }
                Ok(None) => {
                    return Err(format!(
                        "the ring no longer holds entry {} (term {}) at lsn {}",
                        r.index, r.term, r.start
                    ));
                }
                Err(e) => {
                    return Err(format!(
                        "the ring record of entry {} (term {}) at lsn {} is corrupt: {e}",
                        r.index, r.term, r.start
                    ));
                }
            }
        }
        Ok(())
    }

    /// The fabric endpoint (tests inspect it).
    pub fn fabric(&self) -> &F {
        &self.fabric
    }

    /// Flushes and closes the log.
    pub fn close(mut self) -> Result<(), ReplicaError> {
        self.flush()
    }

    /// Drops the replica as `kill -9` would drop its process: nothing buffered is written or
    /// synced on the way out. Crash tests use it; see `SimCluster::kill`.
    pub fn abandon(self) {
        self.wal.abandon();
    }

    /// Makes everything appended durable and closes the wal for writing. Under
    /// `Durability::Memory` it then removes the ring's shared-memory files, once the segment
    /// files hold everything the ring does: a clean close leaves nothing to recover, frees the
    /// memory, and lets the next start use another ring size.
    pub fn flush(&mut self) -> Result<(), ReplicaError> {
        self.wal.close()?;
        if let Some((ring, tail)) = self.ring_files.take() {
            let ring_end = self.producer.position().lsn;
            let durable = self.wal.durable_lsn();
            if ring_end > durable {
                // Not expected after a successful close; keep what recovery would need.
                tracing::warn!(
                    node = self.cfg.id,
                    ring_end = ring_end.0,
                    durable = durable.0,
                    ring = %ring.display(),
                    "the ring holds entries past the durable end of the log; keeping its files"
                );
            } else {
                let mut removed = true;
                for path in [&tail, &ring] {
                    if let Err(e) = self.fabric.free_persistent(path) {
                        removed = false;
                        tracing::warn!(node = self.cfg.id, error = %e, "cannot remove a shared-memory ring file");
                    }
                }
                // The segment files hold everything: the next start has nothing to lose.
                if removed {
                    self.store_guard(Guard {
                        ring_in_use: false,
                        ..self.state_file.guard()
                    })?;
                }
            }
        }
        Ok(())
    }

    /// The commit index.
    pub fn commit_index(&self) -> u64 {
        self.raw.raft.raft_log.committed
    }

    /// A counter that changes whenever the replica did work (events, readies); the driver
    /// uses it to decide whether to spin or rest.
    pub fn work_counter(&self) -> u64 {
        self.work
    }

    /// Handles a pending `Ready` without polling the fabric first: what a leader paused in the
    /// middle of its loop does when it wakes up, before it reads its inbox. The simulator uses
    /// it to model a deposed leader that keeps writing.
    pub fn process_ready_only(&mut self) -> Result<(), ReplicaError> {
        self.fail_stop_on_read_error(|r| r.process_ready_only_inner())
    }

    fn process_ready_only_inner(&mut self) -> Result<(), ReplicaError> {
        if let Some(p) = &self.poisoned {
            return Err(ReplicaError::Poisoned(p.clone()));
        }
        if self.raw.has_ready() {
            if let Err(e) = self.handle_ready() {
                self.poisoned = Some(e.to_string());
                return Err(e);
            }
        }
        Ok(())
    }

    /// Polls the fabric and handles every `Ready` until there is nothing left to do.
    pub fn process(&mut self) -> Result<(), ReplicaError> {
        if let Some(p) = &self.poisoned {
            return Err(ReplicaError::Poisoned(p.clone()));
        }
        let n = self.fabric.poll(&mut self.events);
        if n == 0 && self.still_quiet() {
            return Ok(());
        }
        self.fail_stop_on_read_error(|r| r.process_inner(n))
    }

    /// Runs `f`, turning raft-rs's panic on a failed read of the log (it panics on any storage
    /// error it does not expect) into a poisoned replica that names the failed read. Any other
    /// panic is a bug and goes on unwinding.
    fn fail_stop_on_read_error<T>(
        &mut self,
        f: impl FnOnce(&mut Self) -> Result<T, ReplicaError>,
    ) -> Result<T, ReplicaError> {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(self))) {
            Ok(r) => r,
            Err(panic) => match self.raw.store().read_error() {
                Some(why) => {
                    tracing::error!(node = self.cfg.id, error = %why, "a read of the log failed: the replica stops (fail-stop)");
                    let why = poison_msg("a read of the log failed", why);
                    self.poisoned.get_or_insert(why.clone());
                    Err(ReplicaError::Poisoned(why))
                }
                None => std::panic::resume_unwind(panic),
            },
        }
    }

    /// Whether nothing a pass looks at changed since the last pass that found nothing to do
    /// ([`Quiet`]). Debug builds check that raft then has no `Ready`.
    #[inline]
    fn still_quiet(&self) -> bool {
        let quiet = self.quiet.is_some() && self.quiet == Some(Quiet::of(self));
        debug_assert!(
            !quiet || !self.raw.has_ready(),
            "a quiet pass would skip a Ready"
        );
        quiet
    }

    /// The driver loop, with the first poll's `n` events already in `self.events`.
    fn process_inner(&mut self, mut n: usize) -> Result<(), ReplicaError> {
        loop {
            self.work += n as u64;
            for i in 0..n {
                let e = self.events[i];
                if let Err(err) = self.handle_event(e) {
                    self.poisoned.get_or_insert_with(|| err.to_string());
                    return Err(err);
                }
            }
            if n > 0 && self.still_quiet() {
                // Events that changed nothing the rest of a pass looks at (a send's or, under
                // Memory, a write's completion): poll again.
                n = self.fabric.poll(&mut self.events);
                if n == 0 {
                    return Ok(());
                }
                continue;
            }
            // Grant the new leader's connection before our answers to it leave in the Ready
            // below, so its first fast write does not race the grant.
            self.update_fencing();
            self.forget_stale_fast_paths();
            let ready = self.raw.has_ready();
            if ready {
                self.work += 1;
                if let Err(e) = self
                    .handle_ready()
                    .and_then(|()| self.leave_recovery_if_caught_up())
                {
                    if self.poisoned.is_none() {
                        self.poisoned = Some(e.to_string());
                    }
                    return Err(e);
                }
            }
            if ready {
                // The Ready may have changed the role, the leader or the durable term. Without
                // one nothing the grant depends on has changed since the call above.
                self.update_fencing();
                self.issue_waiting_reads();
            }
            self.flush_outboxes();
            if n == 0 && !ready {
                self.quiet = (!self.outboxes_queued).then(|| Quiet::of(self));
                return Ok(());
            }
            n = self.fabric.poll(&mut self.events);
        }
    }

    fn maintain_connections(&mut self) {
        let me = self.cfg.id;
        let every = self.cfg.reconnect_ticks;
        let ticks = self.ticks;
        for (&id, p) in self.peers.iter_mut() {
            if self.fabric.conn_state(NodeId(id)) != ConnState::Down {
                p.down_since = None;
                continue;
            }
            // One connection per pair: the lower id connects, the higher one accepts. But the
            // lower one may not know the higher one yet (a node that has not applied the entry
            // that added it), so the higher one connects too once the connection has stayed
            // down for several reconnect periods; the wait keeps the two from colliding in the
            // common case.
            if me > id {
                let since = *p.down_since.get_or_insert(ticks);
                if ticks < since + HIGHER_ID_CONNECT_PERIODS * every {
                    continue;
                }
                p.down_since = Some(ticks);
                self.stats.reconnects += 1;
                let _ = self.fabric.connect(NodeId(id));
                continue;
            }
            if p.last_connect_tick.is_some_and(|t| ticks < t + every) {
                continue;
            }
            if p.last_connect_tick.is_some() {
                self.stats.reconnects += 1;
            }
            p.last_connect_tick = Some(ticks);
            let _ = self.fabric.connect(NodeId(id));
        }
    }

    fn handle_event(&mut self, e: Event) -> Result<(), ReplicaError> {
        if let Event::Completion(c) = &e {
            self.stats.completions[match c.status {
                WcStatus::Success => 0,
                WcStatus::RemoteAccess => 1,
                WcStatus::RetryExceeded => 2,
                WcStatus::RnrRetryExceeded => 3,
                // Flushed, and any status a later fabric adds (the enum is non-exhaustive).
                _ => 4,
            }] += 1;
        }
        match e {
            Event::Completion(c) => match c.op {
                WcOp::Recv => {
                    let peer = c.peer;
                    let decoded = match self.fabric.recv_message(peer, c.wr_id) {
                        Ok(bytes) => wire::decode_frame(self.cfg.cluster_id, bytes),
                        Err(_) => return Ok(()),
                    };
                    let _ = self.fabric.repost_recv(peer, c.wr_id);
                    match decoded {
                        Ok(frame) => self.handle_frame(peer.0, frame)?,
                        Err(_) => self.reject_peer(peer.0),
                    }
                }
                WcOp::Write => self.on_write_completion(c.wr_id, c.status),
                WcOp::Send => {}
            },
            Event::Connected { peer, remote } => {
                // A node that joins learns its peers from who connects to it (it has no
                // membership yet); raft ignores messages from non-members.
                let p = self.peers.entry(peer.0).or_default();
                p.remote = remote;
                p.fast.reset();
                p.ring_head = 0;
                // A new connection starts without remote write: grant again if it is the leader's.
                if self.granted == Some(peer.0) {
                    self.granted = None;
                }
                self.update_fencing();
            }
            Event::Disconnected { peer, .. } => {
                if self
                    .snapshot_rx
                    .as_ref()
                    .is_some_and(|rx| rx.from == peer.0)
                {
                    self.snapshot_rx = None;
                }
                if let Some(p) = self.peers.get_mut(&peer.0) {
                    p.fast.reset();
                    p.outbox.clear();
                }
                if self.granted == Some(peer.0) {
                    self.granted = None;
                }
                self.writes_in_flight.forget_peer(peer.0);
                self.raw.report_unreachable(peer.0);
            }
        }
        Ok(())
    }

    /// Drops a connection that sent something we cannot trust.
    fn reject_peer(&mut self, peer: u64) {
        self.stats.bad_frames += 1;
        self.fabric.disconnect(NodeId(peer));
    }

    fn handle_frame(&mut self, peer: u64, frame: Frame) -> Result<(), ReplicaError> {
        match frame {
            Frame::Raft { msg: m, ring } => {
                if m.from != peer || m.to != self.cfg.id {
                    self.reject_peer(peer);
                    return Ok(());
                }
                if m.term > self.raw.raft.term && m.get_msg_type() != MessageType::MsgRequestPreVote
                {
                    // Mu's order: revoke first; grant only after raft has the new term. A
                    // pre-vote never changes the term, so it does not disturb the leader's path.
                    self.fence_ring();
                }
                if let Some(r) = ring {
                    self.on_ring_info(peer, &m, r);
                }
                if m.get_msg_type() == MessageType::MsgAppendResponse && !m.reject {
                    step!(self.cfg.id, "acked", m.index, m.index);
                }
                self.step(m);
            }
            Frame::FastAppend {
                msg: m,
                lsn_start,
                lsn_end,
            } => {
                if m.from != peer
                    || m.to != self.cfg.id
                    || m.get_msg_type() != MessageType::MsgAppend
                {
                    self.reject_peer(peer);
                    return Ok(());
                }
                if let (Some(a), Some(b)) = (m.entries.first(), m.entries.last()) {
                    step!(self.cfg.id, "received", a.index, b.index);
                }
                self.on_fast_append(peer, m, lsn_start, lsn_end)?;
            }
            Frame::SnapshotChunk {
                index,
                term,
                offset,
                total,
                data,
            } => self.on_snapshot_chunk(peer, index, term, offset, total, data),
            Frame::Snapshot { msg: mut m, meta } => {
                let lists = [
                    &meta.voters,
                    &meta.learners,
                    &meta.voters_outgoing,
                    &meta.learners_next,
                ];
                if m.from != peer
                    || m.to != self.cfg.id
                    || m.get_msg_type() != MessageType::MsgSnapshot
                    || lists.iter().any(|l| l.len() > wire::MAX_MEMBERS)
                {
                    self.reject_peer(peer);
                    return Ok(());
                }
                let rx = self.snapshot_rx.take().filter(|rx| {
                    rx.from == peer
                        && rx.index == meta.index
                        && rx.term == meta.term
                        && rx.total == meta.data_len
                        && rx.data.len() as u64 == rx.total
                });
                let Some(rx) = rx else {
                    // Chunks went missing: raft's next probe finds the follower behind and
                    // the leader sends the snapshot again.
                    self.stats.snapshot_chunks_dropped += 1;
                    return Ok(());
                };
                let mut snap = Snapshot::default();
                let md = snap.mut_metadata();
                md.index = meta.index;
                md.term = meta.term;
                let cs = md.mut_conf_state();
                cs.voters = meta.voters;
                cs.learners = meta.learners;
                cs.voters_outgoing = meta.voters_outgoing;
                cs.learners_next = meta.learners_next;
                cs.auto_leave = meta.auto_leave;
                snap.data = rx.data.into();
                m.set_snapshot(snap);
                if m.term > self.raw.raft.term {
                    self.fence_ring();
                }
                self.step(m);
            }
        }
        Ok(())
    }

    fn on_snapshot_chunk(
        &mut self,
        peer: u64,
        index: u64,
        term: u64,
        offset: u64,
        total: u64,
        data: Vec<u8>,
    ) {
        if total > self.cfg.max_snapshot_bytes + crate::sessions::MAX_CHECKPOINT_OVERHEAD {
            if offset == 0 {
                tracing::warn!(
                    node = self.cfg.id,
                    from = peer,
                    total,
                    max = self.cfg.max_snapshot_bytes,
                    "refusing a snapshot larger than max_snapshot_bytes: raise it on this node to catch up"
                );
            }
            self.snapshot_rx = None;
            self.stats.snapshot_chunks_dropped += 1;
            return;
        }
        if offset == 0 {
            self.snapshot_rx = Some(SnapshotRx {
                from: peer,
                index,
                term,
                total,
                data: Vec::with_capacity(total as usize),
            });
        }
        let fits = self.snapshot_rx.as_ref().is_some_and(|rx| {
            rx.from == peer
                && rx.index == index
                && rx.term == term
                && rx.total == total
                && rx.data.len() as u64 == offset
                && offset + data.len() as u64 <= total
        });
        match (&mut self.snapshot_rx, fits) {
            (Some(rx), true) => rx.data.extend_from_slice(&data),
            _ => {
                self.snapshot_rx = None;
                self.stats.snapshot_chunks_dropped += 1;
            }
        }
    }

    fn step(&mut self, mut m: Message) {
        let t = m.get_msg_type();
        if self.recovering.is_some() && Recovering::refuses(t) {
            self.stats.refused_while_recovering += 1;
            return;
        }
        let log = &self.raw.raft.raft_log;
        match t {
            // A leader counts what this node acknowledged; if this node lost some of it (a
            // record cut at recovery, a lost ring), the leader's heartbeat carries a commit
            // index beyond the log, on which raft-rs panics. What the log holds is a prefix of
            // what was acknowledged, so committing up to its end is what the leader meant.
            MessageType::MsgHeartbeat if m.commit > log.last_index() => {
                m.commit = log.last_index();
                self.stats.clamped_heartbeats += 1;
            }
            // raft-rs trusts an append's entries to follow its index; entries that do not
            // could conflict with committed ones, on which it panics.
            MessageType::MsgAppend if !entries_follow(&m) => {
                self.stats.bad_frames += 1;
                return;
            }
            _ => {}
        }
        // raft-rs rejects messages from unknown peers or stale terms; both are normal during
        // membership changes and elections, so they are not errors of ours.
        let _ = self.raw.step(m);
    }

    fn handle_ready(&mut self) -> Result<(), ReplicaError> {
        self.quiet = None;
        let mut rd = self.raw.ready();
        self.reads.confirm(rd.take_read_states());
        if !rd.snapshot().is_empty() {
            let snap = rd.snapshot().clone();
            self.install_snapshot(&snap)?;
        }
        let entries = rd.take_entries();
        // The leader's entries must be in the ring before its messages go out: the fast path
        // writes them from there.
        self.write_entries_to_ring(&entries)?;
        let range = entries
            .first()
            .zip(entries.last())
            .map(|(a, b)| (a.index, b.index));
        if let Some((first, last)) = range {
            step!(self.cfg.id, "ready", first, last);
        }
        self.send_all(rd.take_messages());
        let committed = rd.take_committed_entries();
        self.apply(committed)?;
        if let Some((first, last)) = range {
            self.persist()?;
            step!(self.cfg.id, "persisted", first, last);
            self.raw.mut_store().remember(entries);
        }
        if let Some(hs) = rd.hs() {
            step!(self.cfg.id, "committed", hs.commit, hs.commit);
            self.store_hard_state(hs.clone())?;
        }
        // A new term is durable now: grant its leader before our answers to it leave.
        self.update_fencing();
        self.send_all(rd.take_persisted_messages());
        let mut light = self.raw.advance(rd);
        if let Some(commit) = light.commit_index() {
            step!(self.cfg.id, "committed", commit, commit);
        }
        self.send_all(light.take_messages());
        let committed = light.take_committed_entries();
        self.apply(committed)?;
        self.raw.advance_apply();
        self.raw.mut_store().forget_applied(self.applied);
        self.release_ring()?;
        Ok(())
    }

    /// Installs a snapshot raft accepted from the leader (this node's log does not hold its
    /// last entry): the snapshot is stored durably first, then the log restarts empty right
    /// after it (`Replica::open` finishes the job if this process stops in between), then the
    /// ring, raft's storage and the membership follow.
    fn install_snapshot(&mut self, snap: &Snapshot) -> Result<(), ReplicaError> {
        let meta = snap.get_metadata();
        let lsn = snapshot_lsn(snap).filter(|l| l % 8 == 0).ok_or_else(|| {
            ReplicaError::Poisoned("a snapshot without a valid log position".into())
        })?;
        let sessions = CheckpointData::decode(&snap.data)
            .and_then(|d| d.session_table())
            .map_err(|e| ReplicaError::Poisoned(format!("a snapshot's session table: {e}")))?;
        self.snapshot_file
            .store(snap)
            .map_err(|e| ReplicaError::Poisoned(poison_msg("cannot store a snapshot", e)))?;
        let lsn = if self.cfg.mutation == crate::Mutation::SnapshotOwnLsn {
            // The mutation: go on from this node's own stream position, not the leader's.
            self.producer.position().lsn.0
        } else {
            lsn
        };
        let start = Position {
            lsn: Lsn(lsn),
            last_index: Index(meta.index),
            last_term: Term(meta.term),
        };
        if self.cfg.durability.commits_on_nic_ack() {
            // The ring starts over: close it (the next grant clears and opens the new one).
            self.fence_ring();
        }
        let ring_cfg = RingConfig {
            capacity_bytes: self.cfg.ring_bytes,
            block_bytes: self.cfg.block_bytes,
        };
        // The ring lets go of its records before the wal does, as in a cut
        // (`Replica::truncate_from`): a crash inside the restart may leave the old log, an
        // empty one, or the new one, and the ring must claim nothing past any of them (the
        // next open then takes nothing from it instead of reading its records past an
        // emptied wal as corrupt and coming back recovering).
        if self.cfg.mutation != crate::Mutation::CutWalBeforeRing {
            wal::clear_published(self.memory.as_ref());
        }
        self.wal.restart_at(start)?;
        self.raw.mut_store().forget_all();
        let (p, c) = wal::ring(self.memory.clone(), ring_cfg, start)?;
        self.producer = p;
        self.consumer = c;
        self.ring_entries.clear();
        self.writes_in_flight = Inflight::default();
        self.fast_accepted_to = meta.index;
        let cs = meta.get_conf_state().clone();
        let mut hs = self.raw.store().hard_state().clone();
        hs.commit = hs.commit.max(meta.index);
        self.conf_history = ConfHistory::new(meta.index, cs.clone());
        self.state_file
            .store(&hs, &cs, &self.conf_history)
            .map_err(|e| ReplicaError::Poisoned(poison_msg("cannot persist the membership", e)))?;
        let store = self.raw.mut_store();
        store.set_prefix(meta.index + 1, meta.term);
        store.set_conf_state(cs.clone());
        store.set_hard_state(hs);
        store.set_snapshot(snap.clone());
        self.applied = meta.index;
        self.sessions = sessions;
        self.pending_sessions = Pending::default();
        self.sync_peers(&members_of(&cs));
        self.stats.snapshots_installed += 1;
        tracing::info!(
            node = self.cfg.id,
            index = meta.index,
            term = meta.term,
            state_bytes = CheckpointData::decode(&snap.data).map_or(0, |d| d.state.len()),
            "installed a snapshot from the leader"
        );
        Ok(())
    }

    fn store_hard_state(&mut self, hs: HardState) -> Result<(), ReplicaError> {
        // Term and vote must be durable before any message that depends on them leaves; the
        // commit index is re-learned after a restart, so it alone does not cost an fsync.
        let changed = hs.term != self.persisted_hs.term || hs.vote != self.persisted_hs.vote;
        self.raw.mut_store().set_hard_state(hs.clone());
        if changed {
            let cs = self.raw.store().conf_state().clone();
            self.state_file
                .store(&hs, &cs, &self.conf_history)
                .map_err(|e| {
                    ReplicaError::Poisoned(poison_msg("cannot persist the raft state", e))
                })?;
            self.persisted_hs = hs;
        }
        Ok(())
    }

    fn write_entries_to_ring(&mut self, entries: &[Entry]) -> Result<(), ReplicaError> {
        for e in entries {
            let pos = self.producer.position();
            if e.index <= pos.last_index.0 {
                let same = e.index <= self.fast_accepted_to
                    && self
                        .ring_entry(e.index)
                        .is_some_and(|(_, r)| r.term.0 == e.term);
                if same {
                    continue;
                }
                self.truncate_from(e.index)?;
            }
            let mut scratch = std::mem::take(&mut self.scratch);
            let payload = payload_of(e, &mut scratch);
            let result = self.producer.append(Index(e.index), Term(e.term), payload);
            let result = match result {
                Err(wal::WalError::RingFull { .. }) => {
                    self.stats.ring_full += 1;
                    // Persist what the ring holds and release it, even bytes that RDMA writes
                    // still in flight read from: a write whose source is overwritten delivers
                    // garbage, which the follower's checksum rejects, and that follower falls
                    // back to the slow path. Pinning is an optimisation, never a reason to stall.
                    self.persist()?;
                    if self.cfg.durability.ring_in_shared_memory() {
                        self.sync_wal()?;
                    }
                    self.unpin_writes();
                    self.release_ring()?;
                    self.producer.append(Index(e.index), Term(e.term), payload)
                }
                other => other,
            };
            self.scratch = scratch;
            let lsn = result?;
            self.ring_entries.push_back(RingEntry {
                index: Index(e.index),
                term: Term(e.term),
                start: lsn,
                end: self.producer.position().lsn,
            });
        }
        Ok(())
    }

    /// The ring's record of entry `index` and its position in `ring_entries`. The entries are
    /// consecutive, so this is arithmetic; the scan is a fallback that never runs while they
    /// are (the ring holds up to half a ring of unsynced entries under `Memory`, so a scan per
    /// append showed up in the commit cost).
    fn ring_entry(&self, index: u64) -> Option<(usize, RingEntry)> {
        let front = self.ring_entries.front()?.index.0;
        let k = index.checked_sub(front)? as usize;
        match self.ring_entries.get(k) {
            Some(r) if r.index.0 == index => Some((k, *r)),
            _ => self
                .ring_entries
                .iter()
                .position(|r| r.index.0 == index)
                .map(|k| (k, self.ring_entries[k])),
        }
    }

    /// Removes entries from `index` on (a raft conflict), in the ring and durably in the wal.
    ///
    /// The ring goes back first, then the wal. After a process crash the next open checks
    /// the ring's records from the wal's end up to the ring's published end; records the
    /// ring already handed to the wal are gone from it (its free part is zeroed or written
    /// over). Cut the wal first and a crash (or a failed fdatasync of the cut) between the
    /// two leaves a published end past the wal's new end over bytes the ring no longer
    /// holds: the node reads its own intact ring as corrupt and comes back recovering,
    /// which with a second node down stalls the cluster (simulator seed 501055,
    /// `Durability::Replicated`). Rewound first, every crash point leaves a published end
    /// at or below the wal's end: the wal's old suffix, or the cut, and a prefix either way.
    fn truncate_from(&mut self, index: u64) -> Result<(), ReplicaError> {
        // Under Replicated the cut records must not be taken back as placed ones: close the
        // ring first; the next grant clears its free part before it opens it again.
        if self.cfg.durability.commits_on_nic_ack() {
            self.fence_ring();
        }
        let wal_first = self.cfg.mutation == crate::Mutation::CutWalBeforeRing;
        if wal_first && index <= self.wal.last_index().0 {
            self.wal.truncate_suffix(Index(index))?;
        }
        self.rewind_ring_before(index)?;
        if !wal_first && index <= self.wal.last_index().0 {
            self.wal.truncate_suffix(Index(index))?;
        }
        self.raw.mut_store().forget_from(index);
        self.ring_entries.retain(|r| r.index.0 < index);
        self.fast_accepted_to = self.fast_accepted_to.min(index - 1);
        Ok(())
    }

    /// Moves the ring's end to right after entry `index - 1` ([`Replica::truncate_from`]).
    fn rewind_ring_before(&mut self, index: u64) -> Result<(), ReplicaError> {
        let prev = self.ring_entry(index - 1).map(|(_, r)| r);
        let cut = (self.cfg.mutation == crate::Mutation::RewindToCutRecord)
            .then(|| self.ring_entry(index).map(|(_, r)| r.start.0))
            .flatten();
        // The log goes on right after entry `index - 1`: the end of its ring record, or, once
        // the ring released it, its end in the wal. Never the start of the cut record:
        // padding may lie between the two, and the leader places the next entry right after
        // `index - 1`, so a follower rewound past the padding would hold every later entry at
        // other Lsns than the leader's (and refuse every fast append).
        let (after, in_ring) = match prev {
            Some(p) => (
                Position {
                    lsn: p.end,
                    last_index: p.index,
                    last_term: p.term,
                },
                true,
            ),
            None => {
                let Some(after) = self.wal.position_after(Index(index - 1)) else {
                    return Err(ReplicaError::Poisoned(format!(
                        "cannot cut the log at entry {index}: neither the ring nor the wal holds entry {} (the wal holds {}..={})",
                        index - 1,
                        self.wal.first_index().0,
                        self.wal.last_index().0
                    )));
                };
                let head = self.consumer.head().0;
                let at = match cut {
                    Some(c) if c >= head => Lsn(c),
                    _ => after.lsn,
                };
                (Position { lsn: at, ..after }, at.0 >= head)
            }
        };
        if in_ring {
            self.producer.rewind(after)?;
        } else {
            // The cut is below the ring's window: start a fresh ring where the log goes on.
            let ring_cfg = RingConfig {
                capacity_bytes: self.cfg.ring_bytes,
                block_bytes: self.cfg.block_bytes,
            };
            let (p, c) = wal::ring(self.memory.clone(), ring_cfg, after)?;
            self.producer = p;
            self.consumer = c;
        }
        Ok(())
    }

    fn persist(&mut self) -> Result<(), ReplicaError> {
        let end = self.producer.position().lsn;
        if end > self.wal.position().lsn {
            persist_ring(
                &self.wal,
                &mut self.producer,
                &self.consumer,
                self.cfg.durability.wal(),
            )
            .map_err(|e| ReplicaError::Poisoned(poison_msg("cannot persist the log", e)))?;
        }
        // Under Memory the ring keeps what is not yet fdatasynced (see `release_ring`): sync
        // once half of it waits, so the ring never fills with bytes it may not release.
        if self.cfg.durability.ring_in_shared_memory()
            && end.0.saturating_sub(self.wal.durable_lsn().0) > self.cfg.ring_bytes / 2
        {
            self.sync_wal()?;
        }
        Ok(())
    }

    fn sync_wal(&mut self) -> Result<(), ReplicaError> {
        self.wal
            .sync()
            .map_err(|e| ReplicaError::Poisoned(poison_msg("cannot sync the log", e)))?;
        Ok(())
    }

    fn release_ring(&mut self) -> Result<(), ReplicaError> {
        // Under Memory the ring is the copy of record until the segment files are synced:
        // after a crash of this process, recovery takes from it what the files lack.
        let persisted = if self.cfg.durability.ring_in_shared_memory() {
            self.wal.durable_lsn().0
        } else {
            self.wal.position().lsn.0
        };
        let pinned = self
            .writes_in_flight
            .pinned_from()
            .map_or(u64::MAX, |l| l.0);
        let up_to = persisted.min(pinned).min(self.producer.position().lsn.0);
        if up_to > self.consumer.head().0 {
            self.consumer.release(Lsn(up_to))?;
            while self.ring_entries.front().is_some_and(|r| r.end.0 <= up_to) {
                self.ring_entries.pop_front();
            }
        }
        Ok(())
    }

    fn apply(&mut self, entries: Vec<Entry>) -> Result<(), ReplicaError> {
        for e in entries {
            if e.index <= self.applied {
                continue;
            }
            match e.get_entry_type() {
                EntryType::EntryNormal => match payload_kind(&e.data) {
                    PayloadKind::SessionOpen => self.sessions.open(e.index),
                    PayloadKind::Application {
                        session: Some((id, seq)),
                        ..
                    } => {
                        if let Applied::Duplicate { first } = self.sessions.apply(e.index, id, seq)
                        {
                            self.stats.session_duplicates_applied += 1;
                            tracing::error!(
                                node = self.cfg.id,
                                index = e.index,
                                session = id,
                                seq,
                                ?first,
                                "a session entry is in the committed log twice"
                            );
                        }
                    }
                    _ => {}
                },
                EntryType::EntryConfChange => {
                    let cc = ConfChange::parse_from_bytes(&e.data)
                        .map_err(|err| ReplicaError::Membership(err.to_string()))?;
                    let knows_members = !self.raw.raft.prs().conf().voters().ids().is_empty();
                    match voters_after(&cc) {
                        // A joining node knows no members: adopt the voters the change
                        // records, one simple change at a time, instead of applying the change
                        // to an empty membership (which made a joiner a cluster of itself, or
                        // failed with "removed all voters").
                        Some(voters) if !knows_members => {
                            for v in voters {
                                let mut add = ConfChange::default();
                                add.set_change_type(ConfChangeType::AddNode);
                                add.node_id = v;
                                self.apply_conf_change(&add)?;
                            }
                        }
                        _ => self.apply_conf_change(&cc)?,
                    }
                }
                EntryType::EntryConfChangeV2 => {
                    let cc = ConfChangeV2::parse_from_bytes(&e.data)
                        .map_err(|err| ReplicaError::Membership(err.to_string()))?;
                    self.apply_conf_change(&cc)?;
                }
            }
            if e.get_entry_type() != EntryType::EntryNormal {
                let cs = self.raw.store().conf_state().clone();
                self.conf_history.record(e.index, cs);
                self.store_state()?;
            }
            self.applied = e.index;
        }
        self.pending_sessions.applied(self.applied);
        Ok(())
    }

    fn apply_conf_change(&mut self, cc: &impl raft_proto::ConfChangeI) -> Result<(), ReplicaError> {
        let cs = self.raw.apply_conf_change(cc)?;
        let members = members_of(&cs);
        self.raw.mut_store().set_conf_state(cs);
        self.sync_peers(&members);
        Ok(())
    }

    /// Persists the raft state with a new amnesia guard.
    fn store_guard(&mut self, guard: Guard) -> Result<(), ReplicaError> {
        let hs = self.raw.store().hard_state().clone();
        let cs = self.raw.store().conf_state().clone();
        self.state_file
            .store_guard(guard, &hs, &cs, &self.conf_history)
            .map_err(|e| ReplicaError::Poisoned(poison_msg("cannot persist the raft state", e)))
    }

    /// Persists the hard state, the membership and its history.
    fn store_state(&mut self) -> Result<(), ReplicaError> {
        let hs = self.raw.store().hard_state().clone();
        let cs = self.raw.store().conf_state().clone();
        self.state_file
            .store(&hs, &cs, &self.conf_history)
            .map_err(|e| ReplicaError::Poisoned(poison_msg("cannot persist the membership", e)))
    }

    /// Keeps a peer entry (and a connection) for every member, and none for non-members.
    fn sync_peers(&mut self, members: &[u64]) {
        for id in members {
            if *id != self.cfg.id {
                self.peers.entry(*id).or_default();
            }
        }
        let gone: Vec<u64> = self
            .peers
            .keys()
            .filter(|id| !members.contains(id))
            .copied()
            .collect();
        for id in gone {
            self.peers.remove(&id);
            self.fabric.disconnect(NodeId(id));
        }
        self.maintain_connections();
    }

    fn ring_info(&self) -> RingInfo {
        let pos = self.producer.position();
        RingInfo {
            last_index: pos.last_index.0,
            last_term: pos.last_term.0,
            ring_end: pos.lsn.0,
            ring_head: self.consumer.head().0,
            persisted_index: self.wal.last_index().0,
        }
    }

    fn revoke(&mut self) {
        if self.cfg.mutation == crate::Mutation::SkipRevoke {
            return;
        }
        if let Some(g) = self.granted.take() {
            if self.fabric.set_remote_write(NodeId(g), false).is_err() {
                // A grant we cannot revoke must not outlive this call: drop the connection,
                // which takes the QP (and its access) down with it.
                self.fabric.disconnect(NodeId(g));
            }
            self.stats.revokes += 1;
        }
    }

    /// Grants remote write to the current term's leader's connection only; revokes first.
    /// Under Replicated only once the term is durable: a completed write counts as this
    /// node's acknowledgement, and every acknowledgement must be given in a term this node
    /// made durable first (the recovering guard rests on it, see [`crate::recovering`]).
    fn update_fencing(&mut self) {
        let r = &self.raw.raft;
        let durable = !self.cfg.durability.commits_on_nic_ack() || self.persisted_hs.term == r.term;
        let want = (r.state == StateRole::Follower
            && r.leader_id != 0
            && r.leader_id != self.cfg.id
            && durable)
            .then_some(r.leader_id)
            .filter(|l| self.fabric.conn_state(NodeId(*l)) == ConnState::Up);
        if want == self.granted {
            // A grant that went with its connection (a disconnect) leaves the ring open:
            // take what was placed now, before this node campaigns or votes without it.
            if want.is_none() && self.producer.open_to_remote() {
                self.fence_ring();
            }
            return;
        }
        self.fence_ring();
        if let Some(l) = want {
            self.open_ring_to_writes();
            if self.fabric.set_remote_write(NodeId(l), true).is_ok() {
                self.granted = Some(l);
                self.stats.grants += 1;
            }
        }
    }
}
