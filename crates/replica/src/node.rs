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
use crate::recovering::{LostRing, Recovering};
use crate::sessions::{Applied, Pending, Sessions};
use crate::storage::{
    CheckpointData, ConfHistory, Guard, PayloadArena, PayloadKind, SnapshotFile, StateFile,
    StoredState, TAG_NORMAL, TAG_SESSION_OPEN, WalStorage, payload_kind, payload_of,
    session_header, snapshot_lsn,
};
use crate::wire::{self, Body, Frame, RingInfo, SNAPSHOT_CHUNK_BYTES, WireSnapshotMeta};
use crate::{ReplicaConfig, ReplicaError};
use direct::Deferred;
use fast::{FastPeer, Inflight, NicAck};
pub use released::Released;

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

mod checkpoint;
pub(crate) use checkpoint::Plan;
mod direct;
mod fast;
mod identity;
mod open;
mod peer_input;
mod propose;
mod read;
mod ready;
mod released;
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
    /// Checkpoints planned again because another one came while the log was read for them
    /// ([`crate::Log`] reads without the replica's lock).
    pub checkpoints_replanned: u64,
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
    /// Follower, `Durability::Replicated`: append responses not sent, because they answered
    /// a descriptor whose entries the leader already counted when its write completed (see
    /// `Replica::answer_quietly`).
    pub answers_skipped: u64,
    /// Passes of [`Replica::process_until_resolved`] that stopped at the events that
    /// resolved the caller's ticket, leaving the rest to the next pass.
    pub passes_stopped_at_commit: u64,
    /// Leader, `Durability::Replicated`: proposals written into the rings ahead of raft
    /// (`node::direct`).
    pub direct_proposals: u64,
    /// Leader: raft's appends not sent because the entries went out ahead of raft.
    pub direct_appends_skipped: u64,
    /// Leader: proposals queued for the next pass, which steps all of them into raft as one
    /// (`node::direct`).
    pub queued_proposals: u64,
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
    /// The index of the latest membership change this node applied since its latest
    /// checkpoint (0: none; a checkpoint holds the membership as of its own index). A restart
    /// after a kill comes back with a commit index at least this high, so the change is
    /// applied again, not forgotten.
    pub conf_index: u64,
    /// The index the membership this node counts with is as of: its latest change
    /// (`conf_index`), or else the checkpoint or snapshot it came with.
    pub conf_as_of: u64,
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
    /// The first Lsn the follower still holds in its ring, as it last reported: the leader
    /// never writes past it plus the ring's capacity.
    ring_head: Lsn,
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
    /// Leader: proposals made ahead of raft ([`direct`]), stepped into it before anything
    /// else reaches it.
    deferred: Deferred,
    /// Leader: the highest index put into the ring ahead of raft (raft's `Ready` finds those
    /// entries there already).
    direct_ring_to: u64,
    /// Scratch for [`direct`]: the followers a proposal is written to ahead of raft.
    direct_targets: Vec<u64>,
    peers: BTreeMap<u64, Peer>,
    writes_in_flight: Inflight,
    /// Leader, `Replicated`: write completions that count a follower as holding entries, not
    /// yet stepped into raft as its append responses. A caller's pass
    /// ([`Replica::process_until_resolved`]) resolves its ticket from them
    /// ([`Replica::nic_quorum_reaches`]) and leaves their steps to the next pass, which makes
    /// them first; every other pass steps each at its event.
    acks_unstepped: Vec<NicAck>,
    /// Whether the pass running now is a caller's (set at the start of every pass; only a
    /// pass handles events): its write completions queue their responses in
    /// `acks_unstepped` instead of stepping them at once.
    defer_nic_acks: bool,
    /// Scratch for [`Replica::nic_quorum_reaches`]: the voters holding an index.
    quorum_scratch: std::cell::RefCell<std::collections::HashSet<u64, fxhash::FxBuildHasher>>,
    /// (term, index): the highest ticket resolved from unstepped completions, which raft's
    /// commit index must reach once it steps them (asserted when it does).
    nic_promised: std::cell::Cell<(u64, u64)>,
    /// Its last answer: ((work counter, unstepped completions, term, index), reaches).
    #[allow(clippy::type_complexity)]
    quorum_memo: std::cell::Cell<Option<((u64, usize, u64, u64), bool)>>,
    next_wr_id: u64,
    granted: Option<u64>,
    ticks: u64,
    applied: u64,
    /// The client sessions as of `applied` ([`crate::sessions`]), or as of
    /// `sessions_through` while that is higher.
    sessions: Sessions,
    /// The last index `sessions` accounts for when it was loaded from a checkpoint: a restart
    /// applies again the entries from the log's first on (the wal keeps the segment that
    /// holds the checkpoint's index), and those up to here are in the table already.
    sessions_through: u64,
    /// Leader: the sessions' entries in its log past `applied`.
    pending_sessions: Pending,
    stats: ReplicaStats,
    poisoned: Option<String>,
    events: Vec<Event>,
    /// The (term, leader?) the peers' fast-path state belongs to.
    fast_epoch: (u64, bool),
    /// `Some` while recovering from lost acknowledgements (see [`crate::recovering`]).
    recovering: Option<Recovering>,
    /// `Some` while this node's data dir was new and not every other voter has told it its
    /// term (see [`crate::recovering::Unproven`]).
    unproven: Option<crate::recovering::Unproven>,
    work: u64,
    /// Whether some peer's outbox may hold frames: set when one is queued, recomputed by
    /// `flush_outboxes`, so that a pass with nothing queued does not walk the peers.
    outboxes_queued: bool,
    /// Set by a pass that ended with nothing to do: what it saw. A later pass that polls no
    /// event and finds the same returns at once ([`Quiet`]).
    quiet: Option<Quiet>,
    encode_buf: Vec<u8>,
    /// Where proposed and accepted entries' payloads are cut from ([`PayloadArena`]).
    arena: PayloadArena,
    /// The entries a follower takes as placed, before raft's log copies them (kept empty).
    placed_scratch: Vec<Entry>,
    /// Follower: the ring head of the last ring info sent to our leader (its flow control's
    /// view of our free room; see [`Replica::answer_quietly`]).
    ring_head_reported: Lsn,
    /// [`send::coalesce`]'s merged sizes, kept between `Ready`s.
    coalesce_sizes: Vec<u64>,
    scratch: Vec<u8>,
    /// Linearizable reads in flight (raft's ReadIndex).
    reads: Reads,
    /// The data dir, taken for this replica alone (`FileSystem::lock_dir`) until a clean
    /// [`Replica::flush`] (after which it writes nothing) or until it drops; the last field,
    /// so that it is let go after the wal and the ring are.
    dir_lock: Option<wal::fs::DirLock>,
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
        if Some(e.index) != prev.0.checked_add(1) || e.term < prev.1 || e.term > m.term {
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
    /// or unproven node's election timer does not run: it must not campaign. An unproven node
    /// asks the voters that have not answered for their terms again.
    pub fn tick(&mut self) {
        self.ticks += 1;
        if self.poisoned.is_none() && self.cfg.mutation == crate::Mutation::TickOutsideFailStop {
            self.step_deferred();
            self.step_nic_acks();
        }
        if self.poisoned.is_none() {
            // A failed read fails the replica stop; the next `process` reports it. Stepping
            // the proposals that wait and the write completions' responses reads the log too
            // (raft's appends): they go inside (simulator seed 9,800,079 of `--callers-drive
            // --conditional` panicked on a read error there).
            let _ = self.fail_stop_on_read_error(|r| {
                // Raft's quorum check counts a follower active by its responses.
                r.step_deferred();
                r.step_nic_acks();
                if !r.holds_back_votes() {
                    r.raw.tick();
                }
                Ok(())
            });
        }
        self.maintain_connections();
        self.ask_terms(None);
    }

    /// Starts an election now (tests and operators); refused while recovering or unproven.
    pub fn campaign(&mut self) -> Result<(), ReplicaError> {
        if let Some(why) = self.held_back_because() {
            return Err(ReplicaError::Recovering(why));
        }
        self.fail_stop_on_read_error(|r| {
            r.step_deferred();
            Ok(r.raw.campaign()?)
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
            last_index: self.last_index(),
            first_index: self.wal.first_index().0,
            log_bytes: self.log_bytes(),
            ring_used_bytes: self.producer.position().lsn.0 - self.consumer.head().0,
            ring_capacity_bytes: self.cfg.ring_bytes,
            voters: self.voters(),
            conf_index: self.conf_history.last_change().unwrap_or(0),
            conf_as_of: self.conf_history.as_of(),
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
            recovering: self.held_back_because(),
            failure: self.poisoned.clone(),
        }
    }

    /// The voters of the membership raft counts with (both halves of a joint one), sorted.
    fn voters(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self.raw.raft.prs().conf().voters().ids().iter().collect();
        v.sort_unstable();
        v
    }

    /// Why this node does not vote or campaign, if it does not: unproven, or recovering.
    fn held_back_because(&self) -> Option<String> {
        if let Some(u) = &self.unproven {
            return Some(u.reason());
        }
        self.recovering
            .map(|rec| rec.reason(self.leader(), self.raw.raft.raft_log.committed))
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
    /// memory, and lets the next start use another ring size. A failure poisons the replica
    /// (the durability of what it held is unknown): the ring's files stay, and the next start
    /// recovers from them.
    pub fn flush(&mut self) -> Result<(), ReplicaError> {
        if let Err(e) = self.flush_inner() {
            let why = match e {
                ReplicaError::Poisoned(why) => why,
                e => poison_msg("cannot close the log", e),
            };
            self.poisoned.get_or_insert_with(|| why.clone());
        }
        // A replica poisoned before (a failed checkpoint on a caller's thread, say) closed its
        // wal too, and says why it had stopped.
        match &self.poisoned {
            Some(why) => Err(ReplicaError::Poisoned(why.clone())),
            None => Ok(()),
        }
    }

    fn flush_inner(&mut self) -> Result<(), ReplicaError> {
        // Proposals made ahead of raft may already be acknowledged, the leader counted by its
        // ring: raft takes them and the wal persists them before it closes.
        if !self.deferred.is_empty() && self.poisoned.is_none() {
            self.fail_stop_on_read_error(|r| {
                r.step_deferred();
                r.process_ready_only_inner()
            })?;
        }
        // Under Replicated, records our leader placed in the ring past its end are ours
        // already: the leader counted them when its writes completed. The ring is fenced
        // (nothing more lands), they are taken as before a vote, and the wal persists them
        // before it closes. A ring still open to writes (a poisoned replica) keeps its files
        // and `ring_in_use`, so the next open takes them, as after a kill.
        if self.cfg.durability.commits_on_nic_ack()
            && self.poisoned.is_none()
            && self.cfg.mutation != crate::Mutation::CloseWithoutFence
        {
            self.fail_stop_on_read_error(|r| {
                r.settle_readies()?;
                r.fence_ring();
                r.settle_readies()
            })?;
        }
        self.wal.close()?;
        let closed = self.close_ring_files();
        // Closed for writing: another open of the data dir may go on, even while handles of
        // this replica's log live on (they answer `Closed`).
        self.dir_lock = None;
        closed
    }

    /// Under `Durability::Memory`, removes the ring's files once the segment files hold
    /// everything the ring does (after the wal closed).
    fn close_ring_files(&mut self) -> Result<(), ReplicaError> {
        if let Some((ring, tail)) = self.ring_files.take() {
            let ring_end = self.producer.position().lsn;
            let durable = self.wal.durable_lsn();
            if self.producer.open_to_remote()
                && self.cfg.mutation != crate::Mutation::CloseWithoutFence
            {
                // Records placed past the published end may be acknowledged: the next open
                // takes them (a replica that failed stop before it could fence).
                tracing::warn!(
                    node = self.cfg.id,
                    ring = %ring.display(),
                    "the ring is still open to remote writes; keeping its files"
                );
            } else if ring_end > durable {
                // Not expected after a successful close; keep what recovery would need.
                tracing::warn!(
                    node = self.cfg.id,
                    ring_end = ring_end.0,
                    durable = durable.0,
                    ring = %ring.display(),
                    "the ring holds entries past the durable end of the log; keeping its files"
                );
            } else {
                // The segment files hold everything: the next start has nothing to lose. The
                // mark goes first: a kill between the two steps then leaves ring files the
                // next open reads as usual. The other order left the mark over a removed ring,
                // and the next start came back recovering from a loss that never happened (a
                // majority stopped so, say by a shutdown timeout's SIGKILL, stalled the
                // cluster for good: the `--clean-stops` seed family, seed 30001609).
                self.store_guard(Guard {
                    ring_in_use: false,
                    ..self.state_file.guard()
                })?;
                for path in [&tail, &ring] {
                    if let Err(e) = self.fabric.free_persistent(path) {
                        tracing::warn!(node = self.cfg.id, error = %e, "cannot remove a shared-memory ring file");
                    }
                }
            }
        }
        Ok(())
    }

    /// The commit index.
    /// Why the replica stopped working, once it did (a storage error or a failed device
    /// poisoned it): it refuses all further work and should be restarted.
    pub fn poisoned(&self) -> Option<&str> {
        self.poisoned.as_deref()
    }

    /// This replica's commit index.
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

    /// Handles `Ready`s until raft has none (a bounded number: each persists what the one
    /// before left), without polling the fabric.
    fn settle_readies(&mut self) -> Result<(), ReplicaError> {
        for _ in 0..8 {
            if !self.raw.has_ready() {
                break;
            }
            self.process_ready_only_inner()?;
        }
        Ok(())
    }

    fn process_ready_only_inner(&mut self) -> Result<(), ReplicaError> {
        if let Some(p) = &self.poisoned {
            return Err(ReplicaError::Poisoned(p.clone()));
        }
        self.step_deferred();
        if self.raw.has_ready() {
            if let Err(e) = self.handle_ready() {
                self.poisoned = Some(e.poison_cause());
                return Err(e);
            }
        }
        Ok(())
    }

    /// Polls the fabric and handles every `Ready` until there is nothing left to do.
    pub fn process(&mut self) -> Result<(), ReplicaError> {
        self.pass_until(false, |_| false)
    }

    /// A pass of [`Replica::process`] for a caller that waits on `t` and drives the replica
    /// itself (`PollMode::Busy`): it returns as soon as a batch of events resolves the
    /// ticket (a full pass if it was resolved already), and leaves the rest of the pass
    /// (raft's `Ready`, the apply, the answers it sends) to the next one. The commit index
    /// that resolves it is raft's own, moved by the step of the event that made it (an
    /// append response, or under `Replicated` the write completion that stands for one), so
    /// the caller learns of its commit at that event instead of after the bookkeeping behind
    /// it. Until the next pass runs, committed entries may wait to be applied and followers
    /// to hear of the commit.
    pub fn process_until_resolved(&mut self, t: Ticket) -> Result<(), ReplicaError> {
        // A ticket resolved before the pass stops nothing: the pass runs in full, so that a
        // caller late to stop waiting does not hold back the work behind every event batch.
        if self.ticket_status(t).is_some() {
            return self.process();
        }
        // Only a leader of the ticket's term stops early: there raft's commit index never
        // passes what its log holds. A deposed leader's ticket resolves (superseded) at the
        // new leader's append, which moves the commit index over entries still in raft's
        // unstable log, while the wal still holds the old suffix until this pass's `Ready`
        // cuts it: stopping there let `read` (and the subscriptions it wakes) return the
        // superseded entry as committed, and fail on the committed ones after it.
        let any_node = self.cfg.mutation == crate::Mutation::DeposedCallerStopsEarly;
        self.pass_until(true, move |r| {
            (any_node || (r.raw.raft.state == StateRole::Leader && r.raw.raft.term == t.term))
                && r.ticket_status(t).is_some()
        })
    }

    /// A pass that stops after a batch of events once `stop` holds. It returns at once if
    /// the poll brought nothing and nothing changed since the last pass that found nothing to
    /// do ([`Quiet`]). Inlined into each caller, so that [`Replica::process`]'s constant
    /// `false` compiles away.
    ///
    /// `stops` says whether `stop` can ever hold (a caller's pass): an ordinary pass steps each
    /// write completion's append response at its event.
    #[inline(always)]
    fn pass_until(
        &mut self,
        stops: bool,
        stop: impl Fn(&Self) -> bool,
    ) -> Result<(), ReplicaError> {
        if let Some(p) = &self.poisoned {
            return Err(ReplicaError::Poisoned(p.clone()));
        }
        let n = self.fabric.poll(&mut self.events);
        // Proposals made ahead of raft wait for an ordinary pass; a caller's pass leaves them
        // to it unless something needs raft ([`direct`]). Queued proposals need any pass.
        if n == 0 && !self.deferred_waits(stops) && self.still_quiet() {
            return Ok(());
        }
        self.fail_stop_on_read_error(|r| r.process_inner(n, stops, stop))
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

    /// Whether proposals raft has not heard of need this pass: any of them an ordinary pass,
    /// queued ones a caller's too ([`direct`]).
    #[inline]
    fn deferred_waits(&self, stops: bool) -> bool {
        if stops {
            self.deferred.has_queued()
        } else {
            !self.deferred.is_empty()
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

    /// The driver loop, with the first poll's `n` events already in `self.events`. It stops
    /// after a batch of events once `resolved` holds ([`Replica::pass_until`]).
    #[inline(never)]
    fn process_inner(
        &mut self,
        mut n: usize,
        stops: bool,
        resolved: impl Fn(&Self) -> bool,
    ) -> Result<(), ReplicaError> {
        // Proposals made ahead of raft and responses a caller's pass left unstepped come
        // before anything newer. A caller's pass leaves proposals made ahead of raft to the
        // first event that needs raft, and its completions' responses unstepped until it
        // decides to stop.
        if !stops || self.deferred.has_queued() {
            self.step_deferred();
        }
        self.step_nic_acks();
        self.defer_nic_acks = stops;
        loop {
            self.work += n as u64;
            for i in 0..n {
                let e = self.events[i];
                if let Err(err) = self.handle_event(e) {
                    self.defer_nic_acks = false;
                    self.poisoned.get_or_insert_with(|| err.poison_cause());
                    return Err(err);
                }
            }
            if n > 0 && resolved(self) {
                // The rest of this pass is the next one's, which runs in full even if its
                // poll brings nothing (no quiet mark), and first steps the responses of the
                // write completions that resolved the ticket (raft's commit index then
                // reaches it).
                self.defer_nic_acks = false;
                self.quiet = None;
                self.stats.passes_stopped_at_commit += 1;
                return Ok(());
            }
            self.step_nic_acks();
            if n > 0 && !self.deferred_waits(stops) && self.still_quiet() {
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
                        self.poisoned = Some(e.poison_cause());
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
        // Everything but a write's or a send's completion may reach raft: it first takes the
        // proposals made ahead of it.
        if !matches!(e, Event::Completion(c) if matches!(c.op, WcOp::Write | WcOp::Send)) {
            self.step_deferred();
        }
        match e {
            Event::Failed => {
                // The device failed under the fabric: nothing more completes or arrives. A
                // node left up would be useless; stop for the supervisor to restart it.
                let why = self
                    .fabric
                    .failure()
                    .unwrap_or_else(|| "no reason given".into());
                tracing::error!(node = self.cfg.id, error = %why, "the fabric failed: the replica stops (fail-stop)");
                return Err(ReplicaError::Poisoned(format!(
                    "the fabric failed for good ({why}); the node must be restarted"
                )));
            }
            Event::Completion(c) => match c.op {
                WcOp::Recv => {
                    let peer = c.peer;
                    let decoded = match self.fabric.recv_message(peer, c.wr_id) {
                        Ok(bytes) => wire::decode_frame(self.cfg.cluster_id, bytes),
                        Err(_) => return Ok(()),
                    };
                    let _ = self.fabric.repost_recv(peer, c.wr_id);
                    self.take_frame(peer.0, decoded)?;
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
                p.ring_head = Lsn(0);
                // A new connection starts without remote write: grant again if it is the leader's.
                if self.granted == Some(peer.0) {
                    self.granted = None;
                }
                self.update_fencing();
                self.ask_terms(Some(peer.0));
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

    /// Test-only: handles `frame` as if peer `from` had sent it, as a received message is
    /// (decoded, checked, stepped); the effects show at the next pass.
    #[doc(hidden)]
    pub fn receive_for_test(&mut self, from: u64, frame: &[u8]) -> Result<(), ReplicaError> {
        self.step_deferred();
        let decoded = wire::decode_frame(self.cfg.cluster_id, frame);
        self.take_frame(from, decoded)
    }

    /// A received frame from `peer`, as decoded: handled, or its connection dropped.
    fn take_frame(
        &mut self,
        peer: u64,
        decoded: Result<Frame, wire::WireError>,
    ) -> Result<(), ReplicaError> {
        match decoded {
            Ok(frame) => self.handle_frame(peer, frame),
            Err(_) => {
                self.reject_peer(peer);
                Ok(())
            }
        }
    }

    /// Drops a raft message from `peer` that no correct peer sends (see `node::peer_input`).
    fn drop_peer_message(&mut self, peer: u64, m: &Message, why: &'static str) {
        self.stats.bad_frames += 1;
        tracing::warn!(
            node = self.cfg.id,
            from = peer,
            msg_type = ?m.get_msg_type(),
            term = m.term,
            index = m.index,
            "dropped {why}"
        );
    }

    /// Drops a connection that sent something we cannot trust.
    fn reject_peer(&mut self, peer: u64) {
        self.stats.bad_frames += 1;
        self.fabric.disconnect(NodeId(peer));
    }

    fn handle_frame(&mut self, peer: u64, frame: Frame) -> Result<(), ReplicaError> {
        if self.unproven.is_some()
            && !matches!(frame, Frame::TermQuery | Frame::TermAnswer { .. })
            && self.cfg.mutation != crate::Mutation::UnprovenSteps
        {
            // An unproven node steps no raft message: its term may be below one it had, so it
            // would acknowledge a deposed leader's appends that its lost data dir refused, and
            // that leader could count it to commit over an entry committed without it
            // (simulator seed 1,920 of `--wipes`).
            self.stats.refused_while_recovering += 1;
            return Ok(());
        }
        match frame {
            Frame::Raft { msg: m, ring } => {
                if m.from != peer || m.to != self.cfg.id {
                    self.reject_peer(peer);
                    return Ok(());
                }
                if let Some(why) = self.refuse_raft_message(&m) {
                    self.drop_peer_message(peer, &m, why);
                    return Ok(());
                }
                if self.ignore_raft_message(&m) {
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
                if let Some(why) = self.refuse_raft_message(&m) {
                    self.drop_peer_message(peer, &m, why);
                    return Ok(());
                }
                // Under Replicated the records were received when `take_placed` took them
                // (it marks them); the descriptor names only the batch's last entry.
                if let (Some(a), Some(b), false) = (
                    m.entries.first(),
                    m.entries.last(),
                    self.cfg.durability.commits_on_nic_ack(),
                ) {
                    step!(self.cfg.id, "received", a.index, b.index);
                }
                self.on_fast_append(peer, m, Lsn(lsn_start), Lsn(lsn_end))?;
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
                if let Some(why) = self.refuse_snapshot(&m, &snap) {
                    self.drop_peer_message(peer, &m, why);
                    return Ok(());
                }
                m.set_snapshot(snap);
                if m.term > self.raw.raft.term {
                    self.fence_ring();
                }
                self.step(m);
            }
            Frame::TermQuery => self.answer_term_query(peer),
            Frame::TermAnswer {
                term,
                conf_as_of,
                voters,
            } => {
                // No correct node is at the last term (its successor would overflow), and a
                // membership has at most `MAX_MEMBERS` voters.
                if term == u64::MAX || voters.len() > wire::MAX_MEMBERS {
                    self.reject_peer(peer);
                    return Ok(());
                }
                self.on_term_answer(peer, term, conf_as_of, &voters)?;
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
        if self.holds_back_votes() && Recovering::refuses(t) {
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
