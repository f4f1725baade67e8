//! Replication core: raft-rs over the fabric, the one-sided data path, fencing and durability.
//!
//! # Data path
//!
//! 1. The leader proposes an entry to raft-rs; when raft hands it back in a `Ready`, the
//!    entry is encoded into the leader's registered ring at its Lsn.
//! 2. For each follower whose latest response showed its log ending exactly where the leader
//!    will write (the *fast-path invariant*, tracked as `fast_end`), the leader RDMA-writes the
//!    new byte range of its ring into the follower's ring at the same Lsns, then sends an
//!    append descriptor (the MsgAppend fields, no payload) on the same connection.
//! 3. The follower receives the descriptor only after the bytes are placed (send after write),
//!    validates every record (bounds, crc32c, index chain, term) with
//!    [`wal::Producer::accept_written`], checks the indexes and terms against the descriptor,
//!    and steps raft with the entries. It persists per [`Durability`] and answers with its real
//!    last index, ring end and ring head ([`wire::RingInfo`]).
//! 4. Anything else (probing, conflicts, a follower behind the leader's ring, a new member)
//!    takes the slow path: the raft message with its payload over send/recv; the follower
//!    truncates and appends with its own CPU.
//!
//! # Fencing
//!
//! A follower grants remote write on its ring only to the connection of its current term's
//! leader. When it sees a higher term it revokes every grant *before* stepping the message,
//! and grants the new leader's connection after. A deposed leader's writes complete with
//! `RemoteAccess`, counted in [`ReplicaStats::fenced_writes`].
//!
//! # Durability
//!
//! Under [`Durability::Memory`] an append is acknowledged once a majority validated it in its
//! ring, before any fdatasync. The ring is then a shared-memory (tmpfs) file, with a second
//! file mirroring its published end, and ring space is released only once the segment files
//! are fdatasynced: a crash of the process (of every node's at once, even) loses nothing,
//! because [`Replica::open`] recovers the ring's published records that the segment files lack
//! (`docs/FORMAT.md` section 9). A machine crash loses tmpfs: the node comes back recovering
//! ([`recovering`]) and does not vote until it has caught up, so the others hold the entries
//! unless a majority of machines crash together (then the cluster stalls).
//!
//! Under [`Durability::Replicated`] the storage is `Memory`'s, but the leader counts a
//! follower as holding an append once its RDMA Write into the follower's ring completes, on
//! the connection the follower granted for the current term: no follower CPU is on the commit
//! path. A follower takes every record placed in its ring into its log before it votes,
//! campaigns or steps a higher term, and at its next start after a crash of its process
//! (ARCHITECTURE.md, "NIC-acknowledged commit", has the argument).
//!
//! # Checkpoints
//!
//! [`Replica::checkpoint`] records the application's state at an index and deletes the
//! entries it covers. A follower that needs deleted entries receives it as a raft snapshot
//! (chunks over send/recv), restarts its log right after it at the leader's log position, and
//! catches up from there; readers behind it get [`ReplicaError::Compacted`].

#![deny(unsafe_code)]
// reason: raft-rs message types are generated protobuf structs with hidden cache fields, so
// building them with struct literals is not possible; assignment after default() is the idiom.
#![allow(clippy::field_reassign_with_default)]

pub mod log;
pub mod logging;
mod mutation;
pub mod node;
pub mod reads;
pub mod recovering;
pub mod retention;
pub mod sessions;
pub mod sim;
pub mod storage;
pub mod wire;

use std::path::PathBuf;

pub use log::{
    AppendHandle, CheckpointPause, Log, LogOptions, MAX_TICK, PollMode, ReadHandle, Subscription,
};
pub use node::{
    COMPLETION_STATUSES, Checkpoint, Committed, PeerStatus, Replica, ReplicaStats, Role, Status,
    Ticket,
};
pub use reads::ReadTicket;

/// When a replica counts an entry as held, and so when a majority's count acknowledges an
/// append. ARCHITECTURE.md's durability table says what each one survives, and which test
/// proves it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Durability {
    /// A replica holds an entry once it is fdatasync'ed in its segment files: commit after a
    /// majority's fdatasync. Survives anything the disks survive, power loss of all included.
    /// Pick it when an acknowledged write must survive the loss of every machine's power.
    #[default]
    Fsync,
    /// A replica holds an entry once its CPU validated it in its ring, which is shared memory
    /// (tmpfs) that outlives the process; the segment files follow in the background. Survives
    /// a crash of every process and a machine crash of a minority.
    Memory,
    /// As `Memory` for what it survives, but the leader counts a follower as holding an entry
    /// as soon as the RDMA Write that placed it in the follower's ring completes on the
    /// connection that follower granted for the current term: no follower CPU is on the
    /// commit path (Mu's commit). The follower's CPU validates and persists later, and takes
    /// every record placed in its ring into its log before it votes, campaigns or steps a
    /// higher term. Pick it for the lowest commit latency when three machines do not lose
    /// power together.
    Replicated,
}

impl Durability {
    /// The ring is the copy of record of what is not yet in the segment files: shared memory
    /// that a crash of the process keeps, released only once the files are fdatasync'ed.
    pub fn ring_in_shared_memory(self) -> bool {
        matches!(self, Durability::Memory | Durability::Replicated)
    }

    /// A leader counts a completed RDMA Write as its follower's acknowledgement.
    pub fn commits_on_nic_ack(self) -> bool {
        self == Durability::Replicated
    }

    /// What the wal must achieve before this replica counts an entry as held.
    pub fn wal(self) -> wal::Durability {
        match self {
            Durability::Fsync => wal::Durability::Fsync,
            Durability::Memory | Durability::Replicated => wal::Durability::Memory,
        }
    }

    /// The name used in configuration files and on command lines.
    pub fn name(self) -> &'static str {
        match self {
            Durability::Fsync => "fsync",
            Durability::Memory => "memory",
            Durability::Replicated => "replicated",
        }
    }
}

impl std::str::FromStr for Durability {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "fsync" => Ok(Durability::Fsync),
            "memory" => Ok(Durability::Memory),
            "replicated" => Ok(Durability::Replicated),
            other => Err(format!(
                "unknown durability {other:?}: expected \"fsync\", \"memory\" or \"replicated\""
            )),
        }
    }
}

impl std::fmt::Display for Durability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Configuration of one replica.
#[derive(Clone, Debug)]
pub struct ReplicaConfig {
    /// This node's id (non-zero).
    pub id: u64,
    /// The initial voters, this node included, used only when the data dir is new.
    pub voters: Vec<u64>,
    /// Used only when the data dir is new: the caller asserts that this start creates a
    /// member of a new cluster, one in which no member ever voted, so the node votes at once.
    /// Off (the default, and the only way `rdmalog-server` starts), a node on a new data dir
    /// is unproven until every other voter has told it its term, because a member whose data
    /// dir was emptied or replaced looks the same ([`recovering::Unproven`]). Never set it
    /// for a node that ran before: it may vote twice in a term, or vote away entries it
    /// acknowledged.
    pub new_cluster: bool,
    /// Cluster id: frames and segments of another cluster are refused.
    pub cluster_id: u64,
    /// What an acknowledged append survives.
    pub durability: Durability,
    /// Ticks without a leader before an election.
    pub election_tick: usize,
    /// Ticks between heartbeats.
    pub heartbeat_tick: usize,
    /// Randomized election timeout range `[min, max)`; `None` uses raft-rs's default
    /// (`election_tick .. 2 × election_tick`). The simulator pins it to width 1.
    pub election_window: Option<(usize, usize)>,
    /// Ring size in bytes: a power of two, a multiple of `block_bytes`.
    pub ring_bytes: u64,
    /// Placement block: every replica of a log must use the same value.
    pub block_bytes: u64,
    /// Segment file data size.
    pub segment_bytes: u64,
    /// Largest application payload.
    pub max_entry_bytes: usize,
    /// Where segments and the raft state live.
    pub data_dir: PathBuf,
    /// Under [`Durability::Memory`] and [`Durability::Replicated`], the tmpfs directory of the
    /// ring's shared-memory files (see [`ReplicaConfig::ring_file`]), so that a crash of this
    /// process loses no entry it acknowledged. Default `/dev/shm`. Unused under `Fsync`.
    pub ring_dir: PathBuf,
    /// raft-rs `max_size_per_msg`: bounds one append message.
    pub max_size_per_msg: u64,
    /// raft-rs `max_inflight_msgs`: appends in flight per follower.
    pub max_inflight_msgs: usize,
    /// Whether the leader tells followers about every commit at once (raft-rs's default), with
    /// a round of empty appends and their acknowledgements. Off (the default here), followers
    /// learn the commit index with the next append or heartbeat (within `heartbeat_tick`
    /// ticks): a commit then costs a third fewer messages (12 to 8 per commit of three
    /// replicas in the simulator) and 38 % fewer instructions, and what the leader
    /// acknowledges, and when, is unchanged. Only followers' readers (`subscribe`, `read`) see
    /// new entries later when the log is idle. Membership changes are always broadcast.
    pub broadcast_commit: bool,
    /// Ticks between reconnect attempts to a peer whose connection is down.
    pub reconnect_ticks: u64,
    /// Largest application state a checkpoint may carry, and a follower accepts in a
    /// snapshot (default 64 MiB; at most 1 GiB). A snapshot travels in chunks through the
    /// send queue and is held in memory while it is sent or received.
    pub max_snapshot_bytes: u64,
    /// Test-only: a rule to break on purpose, so the simulator's mutation check can prove its
    /// checkers fail. Always [`Mutation::None`] outside that test.
    #[doc(hidden)]
    pub mutation: Mutation,
}

/// Test-only: a protocol rule broken on purpose (see [`ReplicaConfig::mutation`]).
#[doc(hidden)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mutation {
    /// Every rule holds.
    #[default]
    None,
    /// Acknowledge appends whose fdatasync did nothing (the wal's file system lies about
    /// syncing): an acked entry does not survive a power loss.
    AckWithoutFsync,
    /// Never revoke remote write: a deposed leader keeps its grant.
    SkipRevoke,
    /// Under `Durability::Memory`, keep the ring in anonymous memory, as if there were no
    /// shared-memory ring: a process crash loses what the segment files lack.
    PrivateRing,
    /// Under `Durability::Memory`, come back from a start that lost the shared-memory ring as
    /// a normal voter (no recovering guard): the node may vote away entries it acknowledged.
    NoRecoveringGuard,
    /// A node whose data dir is new votes at once, as at the cluster's first start (no term
    /// query, see [`crate::recovering::Unproven`]): a member restarted on an emptied data dir
    /// may vote twice in a term, or vote away entries it acknowledged.
    TrustNewDataDir,
    /// An unproven node steps raft messages (appends, heartbeats, snapshots) as a follower
    /// would: with its term gone back, it acknowledges a deposed leader's appends.
    UnprovenSteps,
    /// Under `Durability::Memory`, a follower acknowledges a fast append's entries although
    /// their ring records failed their checks (length, crc32c, index chain, term).
    AckBeforeCrc,
    /// A follower installing a snapshot restarts its log at its own stream position instead
    /// of the leader's Lsn after the snapshot.
    SnapshotOwnLsn,
    /// Reads of stored records skip their check (`WalConfig::unchecked_reads`): a record
    /// whose bytes rotted on disk is served as data.
    UncheckedReads,
    /// Under `Durability::Replicated`, a new leader takes every follower to hold its whole
    /// log and writes to it at once, counting the completions before any response of its
    /// term showed that the follower granted it: a write on a grant the follower gave for an
    /// earlier term counts as its acknowledgement in this one.
    NicAckBeforeGrant,
    /// A conditional append checks its expected end against the commit index instead of the
    /// log's last index, forgetting entries ordered but not committed yet: it can commit
    /// somewhere other than right after the end it expected.
    ConditionOnCommit,
    /// A leader checks a session append against its applied entries only, forgetting those
    /// in its log that are not applied yet: a client's retry is appended a second time.
    DedupCommittedOnly,
    /// A leader answers a linearizable read (ReadIndex) from its own commit index at once,
    /// without a majority confirming that it still leads: a deposed leader serves stale reads.
    ReadWithoutQuorum,
    /// Under `Durability::Replicated`, a follower never takes the records its leader placed
    /// in its ring without a descriptor: it may vote without entries the leader counted.
    NoPlacedTake,
    /// A follower cutting a conflicting suffix whose previous entry its ring already released
    /// rewinds to the start of the cut record instead of the end of the previous entry
    /// (issue 13, defect 6): padding between the two is lost, and every later entry sits at
    /// another Lsn than the leader's.
    RewindToCutRecord,
    /// The leader re-opens the fast path on any response that shows a follower holding
    /// exactly what it answers, even while an append sent after it is still unanswered
    /// (issue 13, defect 7): a fast write aimed at that end can land over records the
    /// in-flight append placed.
    ReopenFastPathEarly,
    /// A node whose shared-memory ring was lost (a machine crash) clamps its persisted commit
    /// index into the log it reads back, as if that log were a prefix of the one the index
    /// covered: it may call entries of a branch it had cut committed.
    TrustLogAfterLostRing,
    /// A leader merges a follower's appends of one `Ready` into one message without checking
    /// that the second continues the first (`node::send::coalesce`): a follower gets entries
    /// that do not follow each other as one append.
    MergeDisjointAppends,
    /// Under `Durability::Replicated`, a caller's pass takes any unstepped write completion
    /// as the quorum for its ticket, whatever index the write reached and whoever else holds
    /// it (the check of `Replica::nic_quorum_reaches` removed): an append can resolve while
    /// its entry is on the leader alone.
    NicQuorumAnyIndex,
    /// A linearizable read starts from raft's commit index without first stepping the write
    /// completions that already resolved a caller's ticket: a read that began after a caller
    /// learned of its commit can miss it.
    ReadBeforeNicAcks,
    /// Under `Durability::Replicated`, a leader proposes ahead of raft while it transfers its
    /// leadership (raft-rs then drops the proposal), and forgets a proposal raft did not take
    /// instead of failing stop (`node::direct`): entries already on the wire and possibly
    /// acknowledged are not in raft's log, and raft gives their index to other entries.
    DeferredUnchecked,
    /// A leader sends raft-rs's batched appends as raft-rs made them (`node::send::repair_batched`
    /// skipped): entries batched onto an empty append keep that append's index.
    UnrepairedRaftBatches,
    /// raft's storage keeps the entries it already holds in memory when raft hands over
    /// entries from a lower index (a conflicting suffix replaced) or the wal is cut, and
    /// serves them without checking the wal's term: raft may read back entries this node's
    /// log no longer holds.
    StaleEntryCache,
    /// A restart folds into the session table the entries from the log's first on, although
    /// the table loaded from the checkpoint already covers those up to the checkpoint's index
    /// (the wal keeps the segment that holds it): sessions whose opens are replayed are reset,
    /// others expire than on the other replicas, and entries count as committed twice.
    SessionsFromLogStart,
    /// A ticket resolves as superseded when this node's log holds another entry at its index
    /// (or none), committed or not: a new leader's entry that replaced it here may never
    /// commit, and the ticket's own entry may yet commit through another node.
    SupersededUncommitted,
    /// A snapshot install (and the start that finishes one a stop interrupted) restarts the
    /// log at the snapshot before it stores the snapshot's membership: a stop in between
    /// leaves a log that reads as a finished install, and the node keeps the membership from
    /// before the snapshot.
    MembershipAfterLogRestart,
    /// A restart applies again the membership changes its stored membership already holds,
    /// going back to older memberships until it reaches the latest again.
    ReplayAppliedConfChanges,
    /// A follower cuts its wal (a conflicting suffix, `Replica::truncate_from`) or restarts
    /// it (a snapshot install) before it lowers its ring's published end: a crash between
    /// the two leaves the published end past the wal's over records the ring no longer
    /// holds, and the node comes back recovering although it lost nothing (simulator seed
    /// 501055).
    CutWalBeforeRing,
    /// A node stores a membership change it applies with the commit index it had stored
    /// before (which may lag the change): a restart takes the change for uncommitted. (It went
    /// back to the configuration before it, counting a node already removed, until a restart
    /// stopped applying again the changes its stored membership holds.)
    ConfChangeCommitLags,
    /// A leader that applies its own removal from the voters goes on leading (raft-rs's
    /// untested branch), instead of stepping down.
    RemovedLeaderLeads,
    /// Under `Durability::Replicated`, a clean close (`Replica::close`, SIGTERM's path)
    /// neither fences the ring nor takes what the leader placed past its end, and removes the
    /// ring's files although the ring is still open to remote writes: records the leader
    /// counted as this node's acknowledgements go with them.
    CloseWithoutFence,
    /// A tick steps the proposals that wait and the write completions' responses outside the
    /// wrapper that turns raft-rs's panic on a failed read into a fail-stop: an injected read
    /// error panics the process instead of failing the replica stop.
    TickOutsideFailStop,
    /// A `Durability::Replicated` follower leaves unsent every accepting answer to its leader,
    /// not only the ones to descriptors whose entries the leader counted on its write's
    /// completion (`Replica::answer_quietly`): a leader that closed its fast path to it never
    /// hears that it caught up.
    QuietEveryAnswer,
    /// A caller's pass (`Replica::process_until_resolved`) stops at the events that resolve
    /// its ticket on any node, not only on a leader of the ticket's term: a deposed leader's
    /// ticket resolves (superseded) at the new leader's append, which moves raft's commit
    /// index over entries still in raft's unstable log, and the pass stops before the `Ready`
    /// that writes them and cuts the old suffix from the wal, so the log reads the superseded
    /// entry as committed.
    DeposedCallerStopsEarly,
    /// Not a rule of the replica's: the simulator's in-process fabric lets a connection be
    /// used as soon as it is up, before its owner polled its `Connected`
    /// (`fabric::sim::SimConfig::use_before_announced`). The replica ignores it.
    UseConnectionBeforeAnnounced,
}

impl ReplicaConfig {
    /// A configuration with sane defaults for a 3-node cluster.
    pub fn new(id: u64, voters: Vec<u64>, cluster_id: u64, data_dir: PathBuf) -> Self {
        ReplicaConfig {
            id,
            voters,
            new_cluster: false,
            cluster_id,
            durability: Durability::Fsync,
            election_tick: 10,
            heartbeat_tick: 2,
            election_window: None,
            ring_bytes: 8 << 20,
            block_bytes: 256 << 10,
            segment_bytes: 64 << 20,
            max_entry_bytes: 64 << 10,
            data_dir,
            ring_dir: PathBuf::from("/dev/shm"),
            max_size_per_msg: 48 << 10,
            max_inflight_msgs: 64,
            broadcast_commit: false,
            reconnect_ticks: 5,
            max_snapshot_bytes: 64 << 20,
            mutation: Mutation::None,
        }
    }

    /// The ring's shared-memory file under [`Durability::Memory`]:
    /// `<ring_dir>/rdmalog-<cluster id, 16 hex digits>-n<id>-<crc32c of the data dir's
    /// absolute path, 8 hex digits>.ring`, and beside it the same name ending in `.tail` (the
    /// ring's published end). One data dir, one ring: two nodes on one machine never share
    /// one, and a node restarted on the same data dir finds its own.
    pub fn ring_file(&self) -> PathBuf {
        let dir = std::fs::canonicalize(&self.data_dir).unwrap_or_else(|_| self.data_dir.clone());
        let tag = crc32c::crc32c(dir.as_os_str().as_encoded_bytes());
        self.ring_dir.join(format!(
            "rdmalog-{:016x}-n{}-{tag:08x}.ring",
            self.cluster_id, self.id
        ))
    }

    /// Checks the configuration, naming the bad field. [`Replica::open`] runs it, and raft-rs's
    /// and the wal's own checks, before it writes anything to the data dir.
    pub fn validate(&self) -> Result<(), ReplicaError> {
        let bad =
            |field: &'static str, why: String| Err(ReplicaError::Config { field, reason: why });
        if self.id == 0 {
            return bad("id", "node ids start at 1".into());
        }
        if !self.voters.is_empty() && !self.voters.contains(&self.id) {
            return bad(
                "voters",
                format!(
                    "the initial voters {:?} do not include this node {}",
                    self.voters, self.id
                ),
            );
        }
        let mut voters = self.voters.clone();
        voters.sort_unstable();
        voters.dedup();
        if voters.len() != self.voters.len() || voters.first() == Some(&0) {
            // A voter listed twice would count twice towards a quorum.
            return bad(
                "voters",
                format!(
                    "{:?} lists a node twice or node 0 (ids start at 1)",
                    self.voters
                ),
            );
        }
        if voters.len() > MAX_MEMBERS {
            return bad("voters", format!("at most {MAX_MEMBERS} voters"));
        }
        if self.heartbeat_tick == 0 || self.election_tick <= self.heartbeat_tick {
            return bad(
                "election_tick",
                "must be greater than heartbeat_tick, which must be positive".into(),
            );
        }
        if !self.block_bytes.is_power_of_two()
            || !(wal::format::MIN_BLOCK_BYTES..=wal::format::MAX_BLOCK_BYTES)
                .contains(&self.block_bytes)
        {
            return bad(
                "block_bytes",
                "must be a power of two in 64 B ..= 64 MiB".into(),
            );
        }
        if !self.ring_bytes.is_power_of_two()
            || self.ring_bytes < 2 * self.block_bytes
            || self.ring_bytes < 4096
            || self.ring_bytes > wal::ring::MAX_RING_BYTES
        {
            return bad(
                "ring_bytes",
                "must be a power of two of 4 KiB ..= 64 GiB holding at least two blocks".into(),
            );
        }
        // The wal batches up to a segment (at most 4 MiB) at a time; a batch of a single block
        // cannot take the padding a record moved to the next block leaves, and an append then
        // spins forever.
        if self.segment_bytes < 2 * self.block_bytes
            || self.segment_bytes % self.block_bytes != 0
            || self.segment_bytes > wal::MAX_SEGMENT_DATA_BYTES
        {
            return bad(
                "segment_bytes",
                format!(
                    "must be a multiple of the block of {} bytes, at least two blocks and at \
                     most 1 TiB",
                    self.block_bytes
                ),
            );
        }
        if self
            .max_snapshot_bytes
            .checked_add(crate::sessions::MAX_CHECKPOINT_OVERHEAD)
            .is_none_or(|b| b > crate::storage::MAX_SNAPSHOT_FILE_BYTES)
        {
            return bad("max_snapshot_bytes", "must be below 1 GiB".into());
        }
        let max = wal::format::max_payload(self.block_bytes)
            .saturating_sub(crate::storage::MAX_ENTRY_OVERHEAD);
        if self.max_entry_bytes == 0 || self.max_entry_bytes > max {
            return bad(
                "max_entry_bytes",
                format!("must be 1..={max} for a {}-byte block", self.block_bytes),
            );
        }
        if self.max_entry_bytes + 4096 > wire::MAX_BODY_BYTES / 2 {
            return bad(
                "max_entry_bytes",
                "an entry must fit a slow-path message with room to spare".into(),
            );
        }
        if self
            .max_size_per_msg
            .saturating_add((self.max_entry_bytes + 4096) as u64)
            > wire::MAX_BODY_BYTES as u64
        {
            return bad(
                "max_size_per_msg",
                "one append message must fit the fabric's message limit".into(),
            );
        }
        if !(1..=MAX_INFLIGHT_MSGS).contains(&self.max_inflight_msgs) {
            // raft-rs allocates a window this long per follower.
            return bad(
                "max_inflight_msgs",
                format!("must be 1..={MAX_INFLIGHT_MSGS}"),
            );
        }
        Ok(())
    }
}

/// Most voters a membership may hold (each list of the state file stores at most so many),
/// far above any real cluster.
pub const MAX_MEMBERS: usize = 1024;

/// Most appends in flight per follower ([`ReplicaConfig::max_inflight_msgs`]).
pub const MAX_INFLIGHT_MSGS: usize = 1 << 16;

/// Errors of the replica, each a sentence a caller can act on.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReplicaError {
    /// A configuration field is invalid.
    #[error("invalid replica configuration: {field}: {reason}")]
    Config {
        /// The field.
        field: &'static str,
        /// Why.
        reason: String,
    },
    /// This node is not the leader; retry at the hinted leader.
    #[error("this node is not the leader (leader hint: {leader_hint:?})")]
    NotLeader {
        /// The leader this node believes in, if any.
        leader_hint: Option<u64>,
    },
    /// The payload exceeds the limit.
    #[error("a {len}-byte entry exceeds the {max}-byte limit")]
    TooLarge {
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// raft-rs dropped the proposal (leadership change, uncommitted limit); retry.
    #[error("the proposal was dropped by raft ({0}); retry it")]
    Dropped(String),
    /// The entry at the proposal's index was compacted (checkpointed) after a change of leader,
    /// so whether it was this proposal or another leader's cannot be told; it may be in the log.
    #[error(
        "index {index} was checkpointed after a change of leader: whether it holds this proposal cannot be told; it may be in the log"
    )]
    OutcomeUnknown {
        /// The index it had.
        index: u64,
    },
    /// The entry at the proposal's index was replaced by another leader's; it is not in the log.
    /// Decided by the commit index only: the committed entry there is another, or a committed
    /// entry of a later term lies below it (this node's log holding another entry there proves
    /// nothing until that entry commits).
    #[error("the proposal at index {index} was superseded by a new leader; retry it")]
    Superseded {
        /// The index it had.
        index: u64,
    },
    /// The session an append names does not exist: it expired (the cluster keeps the
    /// [`sessions::SESSION_CAPACITY`] most recently used) or was never opened. Entries sent
    /// with it before may be in the log; open a new session for new entries.
    #[error(
        "session {session} is unknown: it expired (the cluster keeps the {} most recently used) or was never opened; entries sent with it before may be in the log, open a new session for new ones",
        sessions::SESSION_CAPACITY
    )]
    UnknownSession {
        /// The session.
        session: u64,
    },
    /// An append in a session skips numbers: `expected` is the session's next one. Nothing
    /// was appended; send the missing entries first.
    #[error(
        "entry number {got} of session {session} skips ahead: its next number is {expected}; nothing was appended"
    )]
    SessionSequence {
        /// The session.
        session: u64,
        /// Its next sequence number.
        expected: u64,
        /// The number the append started at.
        got: u64,
    },
    /// A retried entry of a session is in the log, but so long ago that its index is no
    /// longer remembered ([`sessions::SESSION_RUNS`] runs per session).
    #[error(
        "entry number {seq} of session {session} is already in the log, too far back to tell its index; it was not appended again"
    )]
    SessionTooOld {
        /// The session.
        session: u64,
        /// The entry's number.
        seq: u64,
    },
    /// The log failed durably (fsync error, corruption) and refuses further work.
    #[error("the replica is poisoned and refuses further work: {0}")]
    Poisoned(String),
    /// Storage failed.
    #[error("storage failed: {0}")]
    Wal(#[from] wal::WalError),
    /// The fabric refused a call.
    #[error("fabric call failed: {0}")]
    Fabric(#[from] fabric::FabricError),
    /// raft-rs returned an error.
    #[error("raft failed: {0}")]
    Raft(#[from] raft::Error),
    /// The wait timed out; the entry may still commit later.
    #[error("timed out waiting for index {index} to commit; it may still commit")]
    Timeout {
        /// The index it had.
        index: u64,
    },
    /// A conditional append found the log ending elsewhere than expected: nothing was
    /// proposed.
    #[error(
        "the log ends at index {last}, not at {expected}: the conditional append was not proposed"
    )]
    ConditionFailed {
        /// Where the append expected the log to end.
        expected: u64,
        /// Where it ended.
        last: u64,
    },
    /// A linearizable read was not confirmed by a majority in time: nothing was read (a
    /// majority may be unreachable); it is safe to retry.
    #[error(
        "no majority confirmed this leader within {waited_ms} ms, so a linearizable read cannot be served; nothing was read: retry"
    )]
    ReadTimeout {
        /// How long it waited.
        waited_ms: u64,
    },
    /// The log was closed.
    #[error("the log is closed")]
    Closed,
    /// A membership change was refused.
    #[error("membership change refused: {0}")]
    Membership(String),
    /// A membership change is in the leader's log and not applied yet (or this leader has not
    /// yet applied the log it was elected with): raft takes one change at a time. Retry once
    /// it has applied; nothing was proposed.
    #[error(
        "a membership change is still being applied (raft takes one at a time); retry when it has"
    )]
    MembershipPending,
    /// This node is recovering from a start that lost entries it may have acknowledged, and
    /// refuses what would make it vote or campaign; the reason says what it waits for.
    #[error("{0}")]
    Recovering(String),
    /// A checkpoint cannot be taken as asked; the reason says what to do.
    #[error("checkpoint refused: {0}")]
    Checkpoint(String),
    /// The entries from `index` on that a reader asked for were truncated after a checkpoint:
    /// restore the application from [`Replica::latest_checkpoint`] (which covers up to
    /// `checkpoint_index`), then read on from `checkpoint_index + 1`.
    #[error(
        "entry {index} was truncated after checkpoint {checkpoint_index}: restore from the checkpoint and continue from {}", checkpoint_index + 1
    )]
    Compacted {
        /// The first index asked for.
        index: u64,
        /// The index the latest checkpoint covers.
        checkpoint_index: u64,
    },
}

impl ReplicaError {
    /// Why the replica stops, for [`ReplicaError::Poisoned`] to carry: the cause alone of an
    /// error that is already a poisoning (so that the message does not say it twice), else
    /// the error's sentence.
    pub fn poison_cause(&self) -> String {
        match self {
            ReplicaError::Poisoned(why) => why.clone(),
            e => e.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A segment of one block made every append that moves a record to the next block spin
    /// forever in the wal (the batch cannot take the padding): refused at validation.
    #[test]
    fn a_segment_of_one_block_is_refused() {
        let mut cfg = ReplicaConfig::new(1, vec![1], 7, PathBuf::from("/d"));
        cfg.segment_bytes = cfg.block_bytes;
        match cfg.validate() {
            Err(ReplicaError::Config { field, .. }) => assert_eq!(field, "segment_bytes"),
            other => panic!("expected a segment_bytes error, got {other:?}"),
        }
        cfg.segment_bytes = 2 * cfg.block_bytes;
        cfg.validate().unwrap();
    }
}
