//! The deterministic simulator (issue 6): a whole cluster of real replicas, each with a real
//! wal on a fault-injecting disk ([`wal::fs::FaultFs`]), on the in-process fabric
//! ([`fabric::sim`]), in one thread on a virtual clock, driven by one seed.
//!
//! # Method
//!
//! [`run`] builds a 3- or 5-node [`replica::sim::SimCluster`] from the seed, draws the fault
//! rates from the seed ([`FaultRates::draw`]), and then steps the cluster one raft tick
//! (10 ms of virtual time) at a time. Before each step it may inject faults (connection breaks,
//! link delays, symmetric and one-directional partitions and their healing, crashes with torn
//! RDMA writes, restarts with torn unsynced disk tails, pauses whose deposed leader wakes and
//! writes before it reads, fsync EIO, ENOSPC, leader transfers, membership changes) and client
//! appends with retries. After each step the [`check::Checker`] checks every live node. When
//! the fault phase ends, every fault is repaired and the run must reach a quiet, fully
//! replicated state within a bounded number of election timeouts (liveness).
//!
//! Everything random comes from the seed: the driver's generator, the fabric's, the disks'
//! tear seeds and the election windows. A run is a pure function of its seed and
//! [`Options`], so any failure replays exactly with the one-line command it prints.

#![deny(unsafe_code)]

pub mod check;
mod episodes;
pub mod family;
pub mod rates;
mod reads;

use std::collections::{BTreeMap, BTreeSet};

use fabric::NodeId;
use fabric::sim::{SimConfig, SplitMix64};
use replica::sim::SimCluster;
use replica::{Durability, Mutation, ReplicaError, Role};

pub use check::{Attempt, Checker, Outcome, Violation};
pub use family::{
    FamilyRun, catches_in_every_mode, expect_caught_in_every_mode, expect_family_holds, run_family,
};
pub use rates::FaultRates;

/// Virtual nanoseconds per step: one raft tick.
pub const STEP_NS: u64 = 10_000_000;

/// How long a client waits for an attempt before it gives up and retries (virtual ns). A few
/// election timeouts: an attempt outlives a leader change.
pub const CLIENT_TIMEOUT_NS: u64 = 1_500_000_000;

/// How many attempts a client makes at one append before it gives up on it.
pub const MAX_ATTEMPTS: u32 = 6;

/// Concurrent client appends in flight at most.
pub const MAX_IN_FLIGHT: usize = 4;

/// Election timeouts allowed for the cluster to finish all work once faults stop. A node's
/// election timeout is 10 to ~13 ticks here; reconnecting after a partition, a pre-vote, a vote
/// and catching up take a few each, and a crashed node's restart one more.
pub const LIVENESS_ELECTION_TIMEOUTS: u64 = 30;

/// Virtual time after which the removal of a lost node that is still a voter is proposed
/// again (the first proposal may have died with its leader).
const REMOVAL_RETRY_NS: u64 = 20 * STEP_NS;
/// A [`Fault::ReadEio`] fails one of the node's next this many reads.
const READ_EIO_SPREAD: u64 = 16;

/// What one run does.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// Virtual time of the fault phase.
    pub fault_ns: u64,
    /// Client appends started at most (attempts are not counted).
    pub max_appends: u64,
    /// Force the cluster size (3 or 5); `None` draws it from the seed.
    pub nodes: Option<u64>,
    /// Override the drawn fault rates.
    pub rates: Option<FaultRates>,
    /// The test-only rule to break.
    pub mutation: Mutation,
    /// Force the durability mode; `None` draws it from the seed (half the seeds each).
    pub durability: Option<Durability>,
    /// Make a third of single appends conditional (`propose_batch_if`, expecting the log to
    /// end where the proposing node's log ends, or one entry earlier), for the seed family of
    /// `tests/conditional.rs`. Off by default, so the CI seeds' runs stay as they were.
    pub conditional: bool,
    /// Append through client sessions ([`replica::sessions`]): [`SESSION_CLIENTS`] clients
    /// each open a session and number their appends; a retry resends the same number, on
    /// whichever node it takes for the leader, and an op never gives up. The history checker
    /// then also requires every (session, number) at most once in the committed log. For
    /// the seed family of `tests/sessions.rs`; off by default.
    pub sessions: bool,
    /// Let half the seeds kill processes in the middle of a disk operation
    /// ([`Fault::KillMidOp`]); on by default. A seed found before that fault existed replays
    /// its old schedule with it off (`tests/mutation.rs`, seed 1088).
    pub kill_mid_op: bool,
    /// With [`Options::callers_drive`], draw the deposed-leader episode (`episodes`,
    /// [`Fault::DeposedWhileWaiting`]); on by default. A seed of the family found before the
    /// episode existed replays its old schedule with it off (`tests/regressions.rs`, seeds
    /// 9,601,360, 9,800,079 and 10,700,044).
    pub deposed_episodes: bool,
    /// Clients drive their own waits (`PollMode::Busy`): after each attempt, the node it went
    /// to runs its passes with `Replica::process_until_resolved` on the attempt's (last)
    /// ticket until it resolves, so the rest of the pass that commits it (raft's `Ready`, the
    /// apply, the answers) runs one pass later. The seed family of `tests/callers_drive.rs`;
    /// off by default, so the CI seeds' runs stay as they were.
    pub callers_drive: bool,
    /// Clients also read through raft's ReadIndex (`Replica::read_index`), and every answer is
    /// checked against what was committed and acknowledged before the read began (see
    /// `reads`). The seed family of `tests/reads.rs`; off by default, so the CI seeds' runs
    /// stay as they were.
    pub reads: bool,
    /// Half the process kills are clean stops instead (`Replica::close`, what SIGTERM does:
    /// [`Fault::Stop`]), and `Replicated` episodes end with their stalled followers stopped
    /// and restarted rather than woken, so a close must keep what the leader placed in their
    /// rings. The seed family of `tests/clean_stops.rs`; off by default, so the CI seeds'
    /// runs stay as they were.
    pub clean_stops: bool,
    /// Half the restarts of a crashed machine come back on a new, empty disk under the node's
    /// old id ([`Fault::DataDirReplaced`]: its data dir emptied or replaced), while no other
    /// node is unproven or recovering and the membership is the one the nodes were configured
    /// with. The seed family of `tests/replaced_data_dirs.rs`; off by default, so the CI
    /// seeds' runs stay as they were.
    pub wipes: bool,
    /// With [`Options::wipes`], also draw the episode of a deposed leader that wakes beside
    /// a node restarted on a new disk ([`Fault::WokenBesideNewDisk`]); on by default. The
    /// family's regression seed found before the episode existed replays its old schedule
    /// with it off.
    pub wipe_episodes: bool,
    /// Draws, in five-voter clusters, the episode of an old leader whose entry a new leader
    /// replaced on it only ([`Fault::ReplacedOnOldLeader`]): the entry may still commit
    /// through a follower that holds it, so the old leader's ticket must not say it was
    /// superseded. Its seeds run five voters. The seed family of `tests/stale_tickets.rs`;
    /// off by default, so the CI seeds' runs stay as they were.
    pub stale_tickets: bool,
    /// Draws the episode of a snapshot install stopped at its write of the membership
    /// ([`Fault::InstallStopped`]): a follower is down while a node is added and the leader
    /// checkpoints past the follower's log; it restarts, is sent the checkpoint, and the
    /// write of the snapshot's membership fails. Its seeds run with small segments, so a
    /// checkpoint deletes some. The seed family of `tests/stopped_installs.rs`; off by
    /// default, so the CI seeds' runs stay as they were.
    pub stopped_installs: bool,
    /// Three of four removals of a voter remove the leader itself (an operator retiring the node
    /// that leads; [`Fault::RemoveLeader`]): once it applies its own removal it must step
    /// down, and the voters left elect a leader among themselves. The seed family of
    /// `tests/self_removals.rs`; off by default, so the CI seeds' runs stay as they were.
    pub self_removals: bool,
    /// A read failure ([`Fault::ReadEio`]) takes the node's next read, as before reads were
    /// drawn from the next few; off by default. Seeds found before replay their old schedule
    /// with it on (`tests/mutation.rs`, seed 9,800,079).
    pub next_read_eio: bool,
}

/// How many seeds a seed family's test runs: `SIM_SEEDS` if set, else `default`.
pub fn seeds_from_env(default: u64) -> u64 {
    std::env::var("SIM_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Clients with a session each, when [`Options::sessions`] is on.
pub const SESSION_CLIENTS: usize = 3;

impl Default for Options {
    fn default() -> Self {
        Options {
            fault_ns: 3_000_000_000,
            max_appends: 100,
            nodes: None,
            rates: None,
            mutation: Mutation::None,
            durability: None,
            conditional: false,
            sessions: false,
            kill_mid_op: true,
            deposed_episodes: true,
            callers_drive: false,
            reads: false,
            clean_stops: false,
            wipes: false,
            wipe_episodes: true,
            stale_tickets: false,
            stopped_installs: false,
            self_removals: false,
            next_read_eio: false,
        }
    }
}

/// Fault kinds, for the summary.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fault {
    /// A node's machine crashed: process memory and shared memory (the `Memory` ring) lost,
    /// the disk keeps only durable bytes.
    Crash,
    /// A node's process was killed (kill -9): shared memory and the page cache survive.
    ProcessKill,
    /// A node's process was stopped cleanly (`Replica::close`, SIGTERM's path), then counts
    /// as killed: it restarts from what the close left.
    Stop,
    /// A node restarted after a kill, from the disk and shared memory its process left.
    RestartKilled,
    /// Every node lost power at once.
    PowerLossAll,
    /// A crash tore the node's in-flight RDMA writes.
    TornRdmaWrite,
    /// A crashed node restarted with a torn unsynced disk tail.
    RestartTorn,
    /// A symmetric partition.
    PartitionSymmetric,
    /// A one-directional partition.
    PartitionAsymmetric,
    /// All partitions healed.
    Heal,
    /// A connection broke.
    BreakConnection,
    /// A link got extra delay.
    Delay,
    /// A node paused.
    Pause,
    /// A paused leader woke and wrote before reading its inbox.
    DeposedLeaderWrites,
    /// An fdatasync failed with EIO.
    FsyncEio,
    /// A disk filled up.
    Enospc,
    /// A node fail-stopped on a storage error.
    FailStop,
    /// Leadership transfer.
    LeaderTransfer,
    /// A voter was added.
    AddVoter,
    /// A voter was removed.
    RemoveVoter,
    /// A node checkpointed its applied state and deleted the entries it covers.
    Checkpoint,
    /// A node's disk loses power in the middle of one of its next writes (an interrupted
    /// checkpoint, snapshot install, truncation or append); the node then restarts from what
    /// was durable.
    PowerCutMidOp,
    /// One of a node's next few reads of its disk fails with EIO (the next one with
    /// [`Options::next_read_eio`]).
    ReadEio,
    /// A byte of a record stored on a node's disk rots (Fsync seeds): reads of it must fail
    /// its check, and the node must refuse to start on it.
    RecordRot,
    /// A read of a rotten record was refused by its check (the checker's or the node's).
    RotDetected,
    /// A node refused to start on a rotten record; the operator removes it and adds a fresh
    /// node in its place (ops/GUIDE.md).
    DiskReplaced,
    /// A crashed machine restarted under its old id on a new, empty disk (its data dir
    /// emptied or replaced; [`Options::wipes`]).
    DataDirReplaced,
    /// Replicated seeds: a follower's CPU stalled while its NIC acknowledged, with the leader
    /// cut off from everyone else, then the leader was killed (see `episodes`).
    StalledFollowerQuorum,
    /// Replicated seeds: a follower slept through two elections that took the leadership
    /// away and back, then the re-elected leader was cut off from all but it and killed.
    SleptThroughReelection,
    /// A node's process is killed in the middle of one of its next disk operations (a cut,
    /// a snapshot install, a checkpoint, an append): its machine stays up, so the page cache
    /// and the shared-memory ring keep everything written before. A crash between any two
    /// steps of a multi-step change.
    KillMidOp,
    /// Callers drive ([`Options::callers_drive`]): a leader with a caller waiting on its
    /// append is cut off until another node leads and commits past its log, then its links
    /// heal while the caller still waits (see `episodes`).
    DeposedWhileWaiting,
    /// The cut-off leader of a [`Fault::DeposedWhileWaiting`] episode healed while its caller
    /// still waited, after another node had committed past its log.
    DeposedHealed,
    /// With [`Options::wipes`]: a leader slept cut off while the others elected and
    /// committed past its log; then the one that does not lead restarted on a new disk, the
    /// new leader was cut off, and the old leader woke with a link to the new disk's node
    /// only (see `episodes`; counted at the wake).
    WokenBesideNewDisk,
    /// With [`Options::stale_tickets`]: a leader's entry reached one follower only; the
    /// other three elected a leader whose first entry replaced it on the old leader only;
    /// that leader died and the follower holding the entry was elected (see `episodes`;
    /// counted at the replacement).
    ReplacedOnOldLeader,
    /// With [`Options::stopped_installs`]: a follower that missed a membership change and a
    /// checkpoint restarted, and its snapshot install failed at the write of the membership
    /// (see `episodes`; counted when the install failed).
    InstallStopped,
    /// With [`Options::self_removals`]: a leader was asked to remove itself from the voters.
    RemoveLeader,
}

/// What a run did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// The seed.
    pub seed: u64,
    /// Nodes at the start.
    pub nodes: u64,
    /// The durability mode the seed ran.
    pub durability: Durability,
    /// Faults injected, per kind.
    pub faults: BTreeMap<Fault, u64>,
    /// Client attempts made.
    pub attempts: u64,
    /// Attempts acknowledged.
    pub acked: u64,
    /// Highest committed index.
    pub committed: u64,
    /// Writes the fabric refused (fenced or stale).
    pub writes_refused: u64,
    /// Writes the fabric tore.
    pub writes_torn: u64,
    /// Appends that found a ring full (summed over the nodes alive at the end).
    pub ring_full: u64,
    /// Snapshots installed by followers (summed over the nodes alive at the end).
    pub snapshots_installed: u64,
    /// `Durability::Replicated`: appends a leader counted on its write's completion,
    /// entries followers took from their rings without a descriptor, and the followers'
    /// answers to descriptors left unsent because the leader had counted them (summed over
    /// the nodes alive at the end).
    pub nic_acks: u64,
    pub placed_taken: u64,
    pub answers_skipped: u64,
    /// [`Options::callers_drive`]: passes that stopped at the events that resolved the
    /// waiting caller's ticket (summed over the nodes alive at the end).
    pub passes_stopped_at_commit: u64,
    /// [`Options::callers_drive`]: committed entries read right after a caller's pass and
    /// checked against the committed log (`replica::sim::CallerRead`).
    pub caller_reads: u64,
    /// `Durability::Replicated`: proposals a leader wrote into the rings ahead of raft
    /// (summed over the nodes alive at the end).
    pub direct_proposals: u64,
    /// Proposals a leader queued for its next pass, which stepped them into raft as one
    /// (summed over the nodes alive at the end).
    pub queued_proposals: u64,
    /// Linearizable reads started (accepted by a leader), answered and checked, and refused
    /// (`NotLeader` at once or later).
    pub reads_started: u64,
    pub reads_answered: u64,
    pub reads_refused: u64,
    /// Virtual time the run took, ns.
    pub virtual_ns: u64,
    /// A hash of the run's event trace (same seed, same trace).
    pub trace_hash: u64,
}

/// A failed run: what broke and how to replay it.
#[derive(Clone, Debug)]
pub struct Failure {
    /// The seed.
    pub seed: u64,
    /// The fault rates it ran with.
    pub rates: FaultRates,
    /// The durability mode it ran.
    pub durability: Durability,
    /// The fabric's timing and NIC behaviours it ran with.
    pub fabric: SimConfig,
    /// The options it ran with (the replay line repeats them).
    pub options: Options,
    /// What went wrong.
    pub violation: Violation,
    /// Virtual time of the failure.
    pub at_ns: u64,
    /// The last events before the failure.
    pub trace_tail: Vec<String>,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "seed {} failed at {} ms of virtual time: {}",
            self.seed,
            self.at_ns / 1_000_000,
            self.violation
        )?;
        writeln!(
            f,
            "durability: {:?}; NIC reads write sources at delivery: {}; tears writes at revoke: {}; \
             corrupts writes: {} ppm",
            self.durability,
            self.fabric.read_source_at_delivery,
            self.fabric.tear_writes_at_revoke,
            self.fabric.corrupt_write_ppm
        )?;
        writeln!(f, "fault rates: {}", self.rates)?;
        writeln!(f, "last events:")?;
        for line in &self.trace_tail {
            writeln!(f, "  {line}")?;
        }
        write!(
            f,
            "replay: cargo run -p sim --release -- --seed {}{} --verbose",
            self.seed,
            replay_flags(&self.options)
        )
    }
}

/// The command-line names of the mutations the simulator takes (`--mutation`).
pub const MUTATIONS: &[(&str, Mutation)] = &[
    ("ack-without-fsync", Mutation::AckWithoutFsync),
    ("skip-revoke", Mutation::SkipRevoke),
    ("private-ring", Mutation::PrivateRing),
    ("no-recovering-guard", Mutation::NoRecoveringGuard),
    ("trust-new-data-dir", Mutation::TrustNewDataDir),
    ("unproven-steps", Mutation::UnprovenSteps),
    ("ack-before-crc", Mutation::AckBeforeCrc),
    ("snapshot-own-lsn", Mutation::SnapshotOwnLsn),
    ("unchecked-reads", Mutation::UncheckedReads),
    ("nic-ack-before-grant", Mutation::NicAckBeforeGrant),
    ("nic-quorum-any-index", Mutation::NicQuorumAnyIndex),
    ("deferred-unchecked", Mutation::DeferredUnchecked),
    ("no-placed-take", Mutation::NoPlacedTake),
    ("rewind-to-cut-record", Mutation::RewindToCutRecord),
    ("reopen-fast-path-early", Mutation::ReopenFastPathEarly),
    ("merge-disjoint-appends", Mutation::MergeDisjointAppends),
    ("stale-entry-cache", Mutation::StaleEntryCache),
    ("sessions-from-log-start", Mutation::SessionsFromLogStart),
    ("superseded-uncommitted", Mutation::SupersededUncommitted),
    (
        "membership-after-log-restart",
        Mutation::MembershipAfterLogRestart,
    ),
    (
        "replay-applied-conf-changes",
        Mutation::ReplayAppliedConfChanges,
    ),
    ("unrepaired-raft-batches", Mutation::UnrepairedRaftBatches),
    ("trust-log-after-lost-ring", Mutation::TrustLogAfterLostRing),
    ("cut-wal-before-ring", Mutation::CutWalBeforeRing),
    ("conf-change-commit-lags", Mutation::ConfChangeCommitLags),
    ("removed-leader-leads", Mutation::RemovedLeaderLeads),
    ("tick-outside-fail-stop", Mutation::TickOutsideFailStop),
    ("quiet-every-answer", Mutation::QuietEveryAnswer),
    (
        "use-connection-before-announced",
        Mutation::UseConnectionBeforeAnnounced,
    ),
    ("condition-on-commit", Mutation::ConditionOnCommit),
    ("dedup-committed-only", Mutation::DedupCommittedOnly),
    ("read-without-quorum", Mutation::ReadWithoutQuorum),
    ("read-before-nic-acks", Mutation::ReadBeforeNicAcks),
    ("close-without-fence", Mutation::CloseWithoutFence),
    (
        "deposed-caller-stops-early",
        Mutation::DeposedCallerStopsEarly,
    ),
];

/// The flags of `rdmalog-sim` that select `options` (beside the seed), so that a failure's
/// replay line runs the same schedule. Options the command line cannot set (forced fault
/// rates or cluster size, from tests) are named in words.
fn replay_flags(o: &Options) -> String {
    let d = Options::default();
    let mut out = String::new();
    if o.fault_ns != d.fault_ns {
        out += &format!(" --fault-ms {}", o.fault_ns / 1_000_000);
    }
    if o.max_appends != d.max_appends {
        out += &format!(" --appends {}", o.max_appends);
    }
    if o.mutation != Mutation::None {
        match MUTATIONS.iter().find(|(_, m)| *m == o.mutation) {
            Some((name, _)) => out += &format!(" --mutation {name}"),
            None => out += &format!(" (mutation {:?}, set by a test)", o.mutation),
        }
    }
    if let Some(durability) = o.durability {
        out += &format!(" --durability {durability}");
    }
    for (on, flag) in [
        (o.conditional, " --conditional"),
        (o.sessions, " --sessions"),
        (o.callers_drive, " --callers-drive"),
        (o.reads, " --reads"),
        (o.clean_stops, " --clean-stops"),
        (o.wipes, " --wipes"),
        (o.wipes && !o.wipe_episodes, " --no-wipe-episodes"),
        (o.stale_tickets, " --stale-tickets"),
        (o.stopped_installs, " --stopped-installs"),
        (o.self_removals, " --self-removals"),
        (o.next_read_eio, " --next-read-eio"),
        (!o.kill_mid_op, " --no-kill-mid-op"),
        (
            o.callers_drive && !o.deposed_episodes,
            " --no-deposed-episodes",
        ),
    ] {
        if on {
            out += flag;
        }
    }
    if o.nodes.is_some() || o.rates.is_some() {
        out += " (with the cluster size or fault rates a test forced)";
    }
    out
}

struct ClientOp {
    attempts: Vec<usize>,
    done: bool,
    next_try_ns: u64,
    /// With sessions: the client and the op's sequence number in its session.
    key: Option<(usize, u64)>,
}

/// A client of [`Options::sessions`].
#[derive(Default)]
struct SessionClient {
    /// Its session, once opened.
    session: Option<u64>,
    /// The open in flight: node, its incarnation, ticket, when.
    opening: Option<(u64, u64, replica::Ticket, u64)>,
    /// The next op's sequence number.
    next_seq: u64,
    next_try_ns: u64,
}

struct Run {
    seed: u64,
    rng: SplitMix64,
    rates: FaultRates,
    c: SimCluster,
    checker: Checker,
    history: Vec<Attempt>,
    ops: Vec<ClientOp>,
    summary: Summary,
    /// Nodes that left the cluster for good (removed voters).
    retired: BTreeSet<u64>,
    /// The latest membership change each killed node had applied (`Status::conf_index`).
    conf_at_kill: BTreeMap<u64, u64>,
    /// Crashed nodes waiting for a restart.
    down: BTreeSet<u64>,
    /// The nodes of `down` whose process was killed (or fail-stopped) while their machine
    /// stayed up: they restart from what the process left, shared memory included.
    killed: BTreeSet<u64>,
    /// Nodes the checker skipped at some step (a dead disk, a read failure armed for them).
    ever_skipped: BTreeSet<u64>,
    /// Disks with a space limit on.
    full_disks: BTreeSet<u64>,
    next_node: u64,
    /// Crashes and restarts per node: a ticket belongs to one process.
    incarnations: BTreeMap<u64, u64>,
    /// Nodes whose removal a leader proposed.
    removed: BTreeSet<u64>,
    /// The seed's second generator: rot decisions, so seeds without rot run as before.
    rot_rng: SplitMix64,
    /// The seed's generator for kills in the middle of a disk operation, so seeds run as
    /// before until their first such kill.
    kill_op_rng: SplitMix64,
    /// Per node, the Lsns of records whose stored bytes rotted.
    rotted: BTreeMap<u64, BTreeSet<u64>>,
    /// Nodes that refused to start on a rotten record, waiting for the operator's removal.
    lost: BTreeSet<u64>,
    /// Nodes restarted on a new disk ([`Fault::DataDirReplaced`]) that may not have caught up
    /// yet: down, unproven or recovering.
    wiped: BTreeSet<u64>,
    /// Fresh nodes added in place of lost ones.
    replaced: u64,
    /// When the removal of each lost node was last proposed (virtual ns).
    removal_asked: BTreeMap<u64, u64>,
    trace: std::collections::VecDeque<String>,
    verbose: bool,
    options: Options,
    /// The multi-step fault in progress, if any (Replicated seeds; see `episodes`).
    episode: Option<episodes::Episode>,
    /// The seed's third generator: episode decisions, so seeds without episodes run as before.
    episode_rng: SplitMix64,
    /// The seed's fourth generator: the decisions of the episodes of
    /// [`Options::callers_drive`], so that seeds without them run as before.
    callers_episode_rng: SplitMix64,
    /// The seed's generator for the episodes of [`Options::wipes`].
    wipes_episode_rng: SplitMix64,
    /// The seed's generator for the episodes of [`Options::stale_tickets`].
    stale_episode_rng: SplitMix64,
    /// The seed's generator for the episodes of [`Options::stopped_installs`].
    install_episode_rng: SplitMix64,
    /// The seed's generator for the choices of [`Options::self_removals`].
    self_removal_rng: SplitMix64,
    /// The seed's generator for which of a node's next reads a [`Fault::ReadEio`] fails.
    read_eio_rng: SplitMix64,
    /// The clients of [`Options::sessions`].
    clients: Vec<SessionClient>,
    /// The nodes that acknowledged a client's append in this step's `drive_clients`, in
    /// order (a client of [`Options::reads`] may read on one at once).
    acked_on: Vec<u64>,
    /// Linearizable reads in flight.
    reads: Vec<reads::ReadOp>,
    /// The seed's generator for reads, so seeds without reads run as before.
    read_rng: SplitMix64,
}

fn mix(h: u64, v: u64) -> u64 {
    (h ^ v)
        .wrapping_mul(0x100_0000_01b3)
        .rotate_left(29)
        .wrapping_add(0x9E37_79B9_7F4A_7C15)
}

impl Run {
    fn now(&self) -> u64 {
        self.c.net.now()
    }

    fn event(&mut self, what: String) {
        let mut h = self.summary.trace_hash;
        h = mix(h, self.now());
        for b in what.bytes() {
            h = mix(h, u64::from(b));
        }
        self.summary.trace_hash = h;
        if self.verbose {
            eprintln!("{:>8.3} ms  {what}", self.now() as f64 / 1e6);
        }
        if self.trace.len() == 40 {
            self.trace.pop_front();
        }
        let line = format!("{:>8.3} ms  {what}", self.now() as f64 / 1e6);
        self.trace.push_back(line);
    }

    fn fault(&mut self, kind: Fault, what: String) {
        *self.summary.faults.entry(kind).or_default() += 1;
        self.event(what);
    }

    fn chance(&mut self, ppm: u64) -> bool {
        self.rng.below(1_000_000) < ppm
    }

    fn pick<T: Copy>(&mut self, v: &[T]) -> Option<T> {
        (!v.is_empty()).then(|| v[self.rng.below(v.len() as u64) as usize])
    }

    /// Where a client sends after asking live node `asked` for the leader: the leader it
    /// names if that one is live too, else `asked` itself (a client knows no more than any
    /// node tells it).
    fn told_leader(&mut self, asked: u64, live: &[u64]) -> u64 {
        let hint = self.c.node(asked).leader();
        hint.filter(|h| live.contains(h)).unwrap_or(asked)
    }

    /// Nodes that are members in the cluster's eyes (not retired), up or down.
    fn members(&self) -> Vec<u64> {
        self.c
            .nodes
            .keys()
            .copied()
            .filter(|id| !self.retired.contains(id))
            .collect()
    }

    fn live(&self) -> Vec<u64> {
        self.c
            .nodes
            .iter()
            .filter(|(id, r)| r.is_some() && !self.retired.contains(id))
            .map(|(id, _)| *id)
            .collect()
    }

    /// The nodes a client sends to: the live ones, and once the faults stopped (`settled`)
    /// only those a live node counts as voters. A real client learns the members from
    /// `Status` and redirects; a joiner whose addition never committed (raft dropped it) is
    /// no address of its, and seven of them made a client that asked at random miss the
    /// two members for 27 tries (seed 70,500,186 of `--conditional`, liveness).
    fn client_targets(&self, settled: bool) -> Vec<u64> {
        let live = self.live();
        if !settled {
            return live;
        }
        let voters: BTreeSet<u64> = live
            .iter()
            .filter_map(|n| self.c.nodes.get(n).and_then(Option::as_ref))
            .flat_map(|r| r.status().voters)
            .collect();
        let members: Vec<u64> = live
            .iter()
            .copied()
            .filter(|id| voters.contains(id))
            .collect();
        if members.is_empty() { live } else { members }
    }

    fn leader(&self) -> Option<u64> {
        self.c
            .nodes
            .iter()
            .filter(|(id, _)| !self.c.paused.contains(id))
            .filter_map(|(_, r)| r.as_ref())
            .map(|r| r.status())
            .filter(|s| s.role == Role::Leader)
            .map(|s| (s.term, s.id))
            .max()
            .map(|(_, id)| id)
    }

    /// The status of node `id`, if its process runs.
    fn status_of(&self, id: u64) -> Option<replica::Status> {
        self.c
            .nodes
            .get(&id)
            .and_then(Option::as_ref)
            .map(|r| r.status())
    }

    fn crash(&mut self, id: u64, tear_writes: bool) {
        if tear_writes {
            let torn = self.c.net.crash_tearing_writes(NodeId(id));
            if torn > 0 {
                self.fault(
                    Fault::TornRdmaWrite,
                    format!("node {id} crashes mid-write: {torn} writes torn"),
                );
            }
        }
        self.c.crash(id);
        self.checker.node_restarted(id);
        self.down.insert(id);
        self.killed.remove(&id);
        *self.incarnations.entry(id).or_default() += 1;
        self.fault(Fault::Crash, format!("node {id}'s machine crashes"));
    }

    /// Kills node `id`'s process; its machine (page cache, shared memory) stays up.
    fn kill(&mut self, id: u64) {
        self.end_process(id, false);
    }

    /// Stops node `id`'s process cleanly (`Replica::close`); from then on it is a killed
    /// node, restarting from what the close left on its disk and in its shared memory. A
    /// close that fails (a disk error) leaves what a kill would.
    fn stop(&mut self, id: u64) {
        self.end_process(id, true);
    }

    fn end_process(&mut self, id: u64, clean: bool) {
        // A replica that failed stop, or whose process already died at a disk operation
        // (it may not have noticed), may have applied a change or a checkpoint it could not
        // store: only a working one's are known durable.
        let dead_on_disk = self.c.disks[&id].is_down();
        let working = match self
            .c
            .nodes
            .get(&id)
            .and_then(Option::as_ref)
            .map(|r| r.status())
        {
            Some(s) if s.failure.is_none() && !dead_on_disk => {
                self.conf_at_kill.insert(id, s.conf_index);
                true
            }
            _ => {
                self.conf_at_kill.remove(&id);
                false
            }
        };
        // A replica that failed stop, or whose process died at a disk operation, has
        // nothing left to close: it goes as a killed one.
        let closed = if clean && working {
            Some(self.c.stop(id))
        } else {
            self.c.kill(id);
            None
        };
        self.checker.node_restarted(id);
        self.down.insert(id);
        self.killed.insert(id);
        *self.incarnations.entry(id).or_default() += 1;
        match closed {
            None => self.fault(Fault::ProcessKill, format!("node {id}'s process is killed")),
            Some(r) => {
                let how = r.map_or_else(|e| format!("its close failed: {e}"), |()| "closed".into());
                self.fault(
                    Fault::Stop,
                    format!("node {id}'s process is stopped cleanly ({how})"),
                );
            }
        }
    }

    /// Nodes that lost entries they may have acknowledged and have not caught up yet: like
    /// crashed ones, they count against the minority that may be down at once.
    fn recovering(&self) -> usize {
        self.c
            .nodes
            .values()
            .flatten()
            .filter(|r| r.status().recovering.is_some())
            .count()
    }

    fn restart(&mut self, id: u64) -> Result<(), Violation> {
        if self.lost.contains(&id) {
            return Ok(());
        }
        if self.full_disks.remove(&id) {
            self.c.disks[&id].set_space_limit(None);
        }
        if self.killed.contains(&id) && self.c.disks[&id].is_crashed() {
            // The disk's power cut came after the kill: the machine is down too.
            self.killed.remove(&id);
            self.c.net.crash(NodeId(id));
        }
        if self.killed.contains(&id) {
            match self.c.restart_killed(id) {
                Ok(()) => {}
                Err(e) if self.refused_on_rot(id, &e) => {
                    self.lose_disk(id, &e);
                    return Ok(());
                }
                Err(e) if self.c.disks[&id].is_crashed() => {
                    self.killed.remove(&id);
                    self.c.net.crash(NodeId(id));
                    self.fault(
                        Fault::FailStop,
                        format!("node {id}'s power fails while it starts: {e}"),
                    );
                    return Ok(());
                }
                // A storage fault armed before the kill hits the new process's first
                // fdatasync: it fails to start, as a real one would, and tries again later.
                Err(e @ (ReplicaError::Wal(_) | ReplicaError::Poisoned(_))) => {
                    self.fault(
                        Fault::FailStop,
                        format!("node {id} fails to start after a kill: {e}"),
                    );
                    return Ok(());
                }
                Err(e) => return Err(format!("node {id} cannot restart after a kill: {e}")),
            }
            self.killed.remove(&id);
            self.down.remove(&id);
            self.checker.node_restarted(id);
            *self.incarnations.entry(id).or_default() += 1;
            self.fault(
                Fault::RestartKilled,
                format!("node {id} restarts after a kill"),
            );
            // A membership change it applied must come back committed, or the node counts
            // the members before it again (a removed one, perhaps shut down already).
            if let Some(conf) = self.conf_at_kill.remove(&id) {
                let s = self.c.node(id).status();
                if s.recovering.is_none() && s.commit < conf {
                    return Err(format!(
                        "membership: node {id} restarted after a kill with commit {} below the \
                         membership change at {conf} it had applied (voters now {:?})",
                        s.commit, s.voters
                    ));
                }
            }
            return Ok(());
        }
        if self.options.wipes && self.rng.below(2) == 0 && self.may_wipe(id) {
            return self.restart_on_new_disk(id);
        }
        let tear = self.rng.next_u64();
        match self.c.restart_torn(id, Some(tear)) {
            Ok(()) => {}
            Err(e) if self.refused_on_rot(id, &e) => {
                self.lose_disk(id, &e);
                return Ok(());
            }
            Err(e) => return Err(format!("node {id} cannot restart from its disk: {e}")),
        }
        self.down.remove(&id);
        self.checker.node_restarted(id);
        *self.incarnations.entry(id).or_default() += 1;
        self.fault(
            Fault::RestartTorn,
            format!("node {id} restarts (tear {tear:#x})"),
        );
        Ok(())
    }

    /// Restarts crashed node `id` on a new, empty disk under its old id.
    fn restart_on_new_disk(&mut self, id: u64) -> Result<(), Violation> {
        self.c
            .restart_on_new_disk(id)
            .map_err(|e| format!("node {id} cannot start on a new disk: {e}"))?;
        self.wiped.insert(id);
        self.down.remove(&id);
        self.checker.node_restarted(id);
        *self.incarnations.entry(id).or_default() += 1;
        self.fault(
            Fault::DataDirReplaced,
            format!("node {id} restarts on a new, empty disk under its old id"),
        );
        Ok(())
    }

    /// Whether crashed node `id` may come back on an empty disk: it was configured as one of
    /// the voters (a joiner is configured with none and is trusted as new, see
    /// ARCHITECTURE.md), every live node still counts it a voter (the membership may have
    /// changed otherwise: the node is configured with the first one, and must learn the
    /// current one from the answers), no removal is in flight, and no node is unproven or
    /// recovering, nor down since it came back on a new disk (two data dirs lost of three is
    /// a majority's loss, which no guard can undo).
    fn may_wipe(&mut self, id: u64) -> bool {
        let caught_up = |r: &Option<replica::Replica<_>>| {
            r.as_ref().is_some_and(|r| r.status().recovering.is_none())
        };
        let nodes = &self.c.nodes;
        self.wiped.retain(|w| !nodes.get(w).is_some_and(caught_up));
        let configured = &self.c.configs[&id].voters;
        self.wiped.is_empty()
            && configured.contains(&id)
            && self.lost.is_empty()
            && self.removed.is_empty()
            && self.c.nodes.values().flatten().all(|r| {
                let s = r.status();
                s.recovering.is_none() && s.voters.contains(&id)
            })
    }

    fn inject_faults(&mut self) -> Result<(), Violation> {
        let r = self.rates;
        let live = self.live();
        let members = self.members();
        let pairs = |a: &[u64]| -> Vec<(u64, u64)> {
            a.iter()
                .flat_map(|&x| a.iter().filter(move |&&y| y != x).map(move |&y| (x, y)))
                .collect()
        };
        // Never take down more than a minority at once, or nothing can happen until restarts.
        // Under Memory a machine crash makes a node recovering until it caught up: a majority
        // of those is the documented stall (acknowledged entries may be gone), not a fault the
        // cluster survives, so recovering nodes count as down for machine crashes.
        let max_down = ((members.len() as u64 - 1) / 2).max(1);
        let memory = self
            .c
            .configs
            .values()
            .next()
            .is_some_and(|c| c.durability.ring_in_shared_memory());
        let (unavailable, max_unavailable) = if memory {
            // Every configuration a live node holds must keep a majority that can vote: count
            // the voters any of them lists that are down, recovering or retired (removed by
            // the driver while another node still counts them), against the smallest of
            // those configurations (a node added but never made a voter is a member to the
            // driver, not to the quorum).
            let configs: Vec<Vec<u64>> = self
                .c
                .nodes
                .values()
                .flatten()
                .map(|r| r.status().voters)
                .filter(|v| !v.is_empty())
                .collect();
            let smallest = configs
                .iter()
                .map(|v| v.len() as u64)
                .min()
                .unwrap_or(members.len() as u64);
            let listed: BTreeSet<u64> = configs.into_iter().flatten().collect();
            // A removal in flight shrinks the configuration once it commits: count the nodes
            // being removed as gone already, and the smallest configuration without them.
            let leaving = listed.iter().filter(|id| self.removed.contains(id)).count() as u64;
            let smallest = smallest.saturating_sub(leaving).max(1);
            let out = listed
                .iter()
                .filter(|id| {
                    self.down.contains(id)
                        || self.retired.contains(id)
                        || self.removed.contains(id)
                        || self
                            .c
                            .nodes
                            .get(id)
                            .and_then(Option::as_ref)
                            .is_some_and(|r| r.status().recovering.is_some())
                })
                .count() as u64;
            (out, ((smallest - 1) / 2).max(1))
        } else {
            (self.down.len() as u64, max_down)
        };
        if self.chance(r.kill_ppm) && (self.down.len() as u64) < max_down {
            if let Some(id) = self.pick(&live) {
                if self.options.clean_stops && self.rng.below(2) == 0 {
                    self.stop(id);
                } else {
                    self.kill(id);
                }
            }
        }
        if self.chance(r.crash_ppm) && unavailable < max_unavailable {
            let tear = self.chance(r.torn_write_ppm);
            // A torn write needs writes in flight: crash the leader right after it
            // proposed and posted its writes, before they land.
            let target = if tear {
                self.leader().filter(|_| self.rng.below(4) != 0)
            } else {
                None
            };
            match target {
                Some(l) => {
                    self.start_op_on(l);
                    let failed = self.c.node(l).process().is_err();
                    if failed {
                        self.c.kill(l);
                        self.c
                            .failed
                            .insert(l, "failed while posting writes".into());
                    } else {
                        self.crash(l, true);
                    }
                }
                None => {
                    let live = self.live();
                    if let Some(id) = self.pick(&live) {
                        self.crash(id, tear);
                    }
                }
            }
        }
        if self.chance(r.power_loss_ppm) && !live.is_empty() {
            for id in self.live() {
                self.crash(id, false);
            }
            self.fault(Fault::PowerLossAll, "every node loses power".into());
            for id in self.down.clone() {
                self.restart(id)?;
            }
        }
        if !self.down.is_empty() && self.chance(r.restart_ppm) {
            let down: Vec<u64> = self.down.iter().copied().collect();
            if let Some(id) = self.pick(&down) {
                self.restart(id)?;
            }
        }
        if self.chance(r.partition_ppm) && members.len() >= 2 {
            let asym = self.rng.below(2) == 1;
            if asym {
                if let Some((a, b)) = self.pick(&pairs(&members)) {
                    self.c.net.set_link(NodeId(a), NodeId(b), false);
                    self.fault(
                        Fault::PartitionAsymmetric,
                        format!("link {a} -> {b} blocked"),
                    );
                }
            } else {
                // Cut a random non-empty proper subset from the rest, both ways.
                let mut side = BTreeSet::new();
                while side.is_empty() || side.len() == members.len() {
                    side = members
                        .iter()
                        .copied()
                        .filter(|_| self.rng.below(2) == 1)
                        .collect();
                }
                for &a in &side {
                    for &b in members.iter().filter(|b| !side.contains(b)) {
                        self.c.net.set_link(NodeId(a), NodeId(b), false);
                        self.c.net.set_link(NodeId(b), NodeId(a), false);
                    }
                }
                self.fault(
                    Fault::PartitionSymmetric,
                    format!("partition {side:?} from the rest"),
                );
            }
        }
        if self.chance(r.heal_ppm) {
            self.heal_links();
        }
        if self.chance(r.break_ppm) {
            if let Some((a, b)) = self.pick(&pairs(&live)) {
                self.c.net.break_connection(NodeId(a), NodeId(b));
                self.fault(Fault::BreakConnection, format!("connection {a}-{b} breaks"));
            }
        }
        if self.chance(r.delay_ppm) {
            if let Some((a, b)) = self.pick(&pairs(&members)) {
                let ns = match self.rng.below(3) {
                    0 => 0,
                    1 => self.rng.below(2_000_000),
                    _ => self.rng.below(80_000_000),
                };
                self.c.net.set_extra_delay(NodeId(a), NodeId(b), ns);
                self.fault(Fault::Delay, format!("link {a} -> {b} delayed {ns} ns"));
            }
        }
        if self.chance(r.pause_ppm) && self.c.paused.len() < 2 {
            // Most often the leader: that is the interesting case (a deposed leader).
            let target = if self.rng.below(4) != 0 {
                self.leader()
            } else {
                self.pick(&live)
            };
            if let Some(id) = target {
                self.c.paused.insert(id);
                self.fault(Fault::Pause, format!("node {id} pauses"));
            }
        }
        if !self.c.paused.is_empty() && self.chance(r.resume_ppm) {
            let paused: Vec<u64> = self.c.paused.iter().copied().collect();
            if let Some(id) = self.pick(&paused) {
                self.resume(id)?;
            }
        }
        if self.chance(r.eio_ppm) {
            if let Some(id) = self.pick(&live) {
                self.c.disks[&id].fail_next_sync();
                self.fault(Fault::FsyncEio, format!("node {id}'s next fdatasync fails"));
            }
        }
        if self.chance(r.enospc_ppm) {
            if let Some(id) = self.pick(&live) {
                let disk = &self.c.disks[&id];
                let limit = disk.used_bytes() + self.rng.below(256 << 10);
                disk.set_space_limit(Some(limit));
                self.full_disks.insert(id);
                self.fault(
                    Fault::Enospc,
                    format!("node {id}'s disk fills at {limit} bytes"),
                );
            }
        }
        if self.chance(r.transfer_ppm) {
            if let Some(l) = self.leader() {
                let voters = self.c.node(l).status().voters;
                let others: Vec<u64> = voters.into_iter().filter(|&v| v != l).collect();
                if let Some(to) = self.pick(&others) {
                    self.c.node(l).transfer_leader(to);
                    self.fault(
                        Fault::LeaderTransfer,
                        format!("leader {l} transfers to {to}"),
                    );
                }
            }
        }
        if self.chance(r.membership_ppm) {
            self.change_membership()?;
        }
        if self.chance(r.checkpoint_ppm) {
            let live = self.live();
            if let Some(id) = self.pick(&live) {
                self.checkpoint(id);
            }
        }
        if self.chance(r.read_eio_ppm) {
            let live = self.live();
            if let Some(id) = self.pick(&live) {
                // Which read: the next one, or one of the next few, so that the failure lands
                // in every code path that reads, not only in the one that reads first.
                let skip = if self.options.next_read_eio {
                    0
                } else {
                    self.read_eio_rng.below(READ_EIO_SPREAD)
                };
                self.c.disks[&id].fail_read_after(skip);
                self.fault(
                    Fault::ReadEio,
                    format!("node {id}'s disk read after {skip} more fails"),
                );
            }
        }
        if self.rot_rng.below(1_000_000) < self.rates.rot_ppm {
            self.rot();
        }
        if self.kill_op_rng.below(1_000_000) < self.rates.kill_mid_op_ppm
            && (self.down.len() as u64) < max_down
        {
            let live = self.live();
            if !live.is_empty() {
                let id = live[self.kill_op_rng.below(live.len() as u64) as usize];
                let disk = &self.c.disks[&id];
                let at = disk.ops() + 1 + self.kill_op_rng.below(40);
                disk.kill_at_op(at);
                self.fault(
                    Fault::KillMidOp,
                    format!("node {id}'s process is killed at its disk operation {at}"),
                );
            }
        }
        // A power cut of one machine mid-write, under Fsync only: under Memory it is a machine
        // crash that cannot be timed against the recovering nodes' count.
        if !memory && self.chance(r.power_cut_ppm) {
            let live = self.live();
            if let Some(id) = self.pick(&live) {
                let disk = &self.c.disks[&id];
                let at = disk.ops() + 1 + self.rng.below(40);
                disk.crash_at_op(at);
                self.fault(
                    Fault::PowerCutMidOp,
                    format!("node {id}'s power fails at its disk operation {at}"),
                );
            }
        }
        Ok(())
    }

    /// Checkpoints node `id` at its applied index, with the application state the checker
    /// recomputes ([`check::node_app_state`]).
    fn checkpoint(&mut self, id: u64) {
        let r = self
            .c
            .nodes
            .get_mut(&id)
            .and_then(Option::as_mut)
            .expect("a live node");
        let index = r.status().applied;
        // The application's state, which it keeps in memory: its reads are not the node's.
        let state = self.c.disks[&id].without_read_faults(|| check::node_app_state(r, index));
        let Some(state) = state else {
            return;
        };
        match r.checkpoint(index, &state) {
            Ok(first) => self.fault(
                Fault::Checkpoint,
                format!("node {id} checkpoints at {index}; its log now starts at {first}"),
            ),
            Err(e) => self.event(format!("node {id} cannot checkpoint at {index}: {e}")),
        }
    }

    fn describe_nodes(&self) -> String {
        let mut out = String::new();
        for (id, r) in &self.c.nodes {
            let state = match r {
                Some(r) => {
                    let s = r.status();
                    let conns: Vec<String> = self
                        .c
                        .nodes
                        .keys()
                        .filter(|p| *p != id)
                        .map(|p| {
                            use fabric::Fabric as _;
                            format!("{p}:{:?}", r.fabric().conn_state(NodeId(*p)))
                        })
                        .collect();
                    format!(
                        "{:?} term {} commit {} applied {} first {} last {} voters {:?} leader {:?} \
                         conns {conns:?} matched {:?}{}{} stats {:?}",
                        s.role,
                        s.term,
                        s.commit,
                        s.applied,
                        s.first_index,
                        s.last_index,
                        s.voters,
                        s.leader,
                        s.peers
                            .iter()
                            .map(|p| (p.id, p.matched))
                            .collect::<Vec<_>>(),
                        s.recovering.map(|w| format!(" ({w})")).unwrap_or_default(),
                        s.failure
                            .map(|w| format!(" (failed: {w})"))
                            .unwrap_or_default(),
                        s.stats
                    )
                }
                None if self.retired.contains(id) => "retired".into(),
                None => "down".into(),
            };
            out.push_str(&format!("[{id}: {state}] "));
        }
        out
    }

    fn heal_links(&mut self) {
        let ids: Vec<u64> = self.c.nodes.keys().copied().collect();
        for &a in &ids {
            for &b in &ids {
                if a != b {
                    self.c.net.set_link(NodeId(a), NodeId(b), true);
                }
            }
        }
        self.fault(Fault::Heal, "all links heal".into());
    }

    fn resume(&mut self, id: u64) -> Result<(), Violation> {
        self.c.paused.remove(&id);
        let Some(r) = self.c.nodes.get_mut(&id).and_then(Option::as_mut) else {
            return Ok(());
        };
        if r.status().role == Role::Leader {
            // The client's request queued while it slept is the first thing it does: it
            // proposes and writes at its stale positions before it reads its inbox.
            self.start_op_on(id);
            let r = self.c.node(id);
            if let Err(e) = r.process_ready_only() {
                self.c.kill(id);
                self.c.failed.insert(id, e.to_string());
            }
            self.fault(
                Fault::DeposedLeaderWrites,
                format!("node {id} wakes as a leader and writes before reading"),
            );
        } else {
            self.event(format!("node {id} resumes"));
        }
        Ok(())
    }

    /// Starts a client append on node `id` at once.
    fn start_op_on(&mut self, id: u64) {
        let op = self.new_ops(1);
        if self.can_attempt(op) {
            self.attempt(op, id);
        }
    }

    /// Adds `k` client ops, returning the first one's number. With sessions they belong to
    /// one client, with consecutive sequence numbers.
    fn new_ops(&mut self, k: usize) -> usize {
        let first = self.ops.len();
        let client = self.options.sessions.then_some(first % SESSION_CLIENTS);
        for _ in 0..k {
            let key = client.map(|c| {
                let cl = &mut self.clients[c];
                cl.next_seq += 1;
                (c, cl.next_seq)
            });
            self.ops.push(ClientOp {
                attempts: Vec::new(),
                done: false,
                next_try_ns: self.now(),
                key,
            });
        }
        first
    }

    /// Whether op `op` can be attempted: with sessions, once its client's session is open.
    fn can_attempt(&self, op: usize) -> bool {
        self.ops[op]
            .key
            .is_none_or(|(c, _)| self.clients[c].session.is_some())
    }

    /// After the faults stop, a session's client sends its numbers in order: op `op` waits
    /// while a lower number of its session is not in a log yet (no pending ticket), for which
    /// the leader would refuse it ("skips ahead"). During the faults the clients pipeline
    /// their numbers, so the refusal and the retries are exercised; the liveness bound is for
    /// a client that does not refuse itself (seed 10,700,044 of `--callers-drive
    /// --sessions` missed it by retrying numbers that skipped ahead, every one refused).
    fn waits_for_an_earlier_number(&self, op: usize) -> bool {
        let Some((c, seq)) = self.ops[op].key else {
            return false;
        };
        self.ops.iter().any(|o| {
            matches!(o.key, Some((c2, s2)) if c2 == c && s2 < seq)
                && !o.done
                && !o.attempts.last().is_some_and(|&k| {
                    let a = &self.history[k];
                    a.outcome == Outcome::Pending && a.ticket.is_some()
                })
        })
    }

    /// With sessions: opens each client's session, retrying until one commits.
    fn drive_sessions(&mut self, settled: bool) {
        let now = self.now();
        for c in 0..self.clients.len() {
            if self.clients[c].session.is_some() {
                continue;
            }
            if let Some((node, inc, t, at)) = self.clients[c].opening {
                let same = self.incarnations.get(&node).copied().unwrap_or(0) == inc;
                let status = match self.c.nodes.get(&node).and_then(Option::as_ref) {
                    Some(r) if same && !self.c.paused.contains(&node) => r.ticket_status(t),
                    Some(_) if same => None,
                    _ => Some(Err(ReplicaError::Closed)),
                };
                match status {
                    Some(Ok(index)) => {
                        self.clients[c].session = Some(index);
                        self.clients[c].opening = None;
                        self.event(format!("client {c} opened session {index}"));
                        continue;
                    }
                    None if now < at + CLIENT_TIMEOUT_NS => continue,
                    _ => {
                        self.clients[c].opening = None;
                        self.clients[c].next_try_ns = now + STEP_NS * (1 + self.rng.below(10));
                    }
                }
            }
            if now < self.clients[c].next_try_ns {
                continue;
            }
            let live = self.client_targets(settled);
            let Some(asked) = self.pick(&live) else {
                continue;
            };
            let target = self.told_leader(asked, &live);
            let inc = self.incarnations.get(&target).copied().unwrap_or(0);
            match self.c.nodes.get_mut(&target).and_then(Option::as_mut) {
                Some(r) => match r.open_session() {
                    Ok(t) => self.clients[c].opening = Some((target, inc, t, now)),
                    Err(_) => {
                        self.clients[c].next_try_ns = now + STEP_NS * (1 + self.rng.below(10))
                    }
                },
                None => self.clients[c].next_try_ns = now + STEP_NS,
            }
        }
    }

    /// Rots one byte of a committed record on a live node's disk: a record with more than
    /// one unsynced window of committed records after it, so that recovery must call it
    /// corruption (docs/FORMAT.md, crash case 9). From then on every read of it must fail its
    /// check (the checker tolerates exactly that, and compares anything served), and the
    /// node must refuse to start on it.
    fn rot(&mut self) {
        // A node that refuses to start on rot is gone until the operator replaced it: one at
        // a time, as with any machine lost for good, so a majority always remains.
        let pending = self
            .rotted
            .keys()
            .filter(|id| !self.retired.contains(id))
            .count();
        // Nor while a removal of the driver's is in flight.
        let removing = self.removed.iter().any(|id| !self.retired.contains(id));
        if pending > 0 || removing || self.replaced < self.lost.len() as u64 {
            return;
        }
        // And only while every voter holds the whole committed log: a rot before a fresh
        // node caught up would lose a second copy of the data, more than a majority survives.
        let Some(l) = self.leader() else {
            return;
        };
        let s = self.c.node(l).status();
        let caught_up = s.voters.iter().all(|&v| {
            self.c
                .nodes
                .get(&v)
                .and_then(Option::as_ref)
                .is_some_and(|r| r.status().commit >= s.commit)
        });
        if !caught_up || s.voters.len() < 3 {
            return;
        }
        let live: Vec<u64> = self
            .live()
            .into_iter()
            .filter(|id| !self.c.paused.contains(id) && !self.c.disks[id].is_down())
            .collect();
        if live.is_empty() {
            return;
        }
        let id = live[self.rot_rng.below(live.len() as u64) as usize];
        let dir = self.c.configs[&id].data_dir.clone();
        let r = self
            .c
            .nodes
            .get_mut(&id)
            .and_then(Option::as_mut)
            .expect("a live node");
        let s = r.status();
        let first = s.first_index.max(1);
        if s.commit < first {
            return;
        }
        let mut buf = Vec::new();
        let k = first + self.rot_rng.below(s.commit - first + 1);
        let picked = self.c.disks[&id].without_read_faults(|| r.read_persisted_at(k, &mut buf));
        let Ok(Some((_, lsn))) = picked else {
            return;
        };
        if buf.is_empty() {
            return;
        }
        // Only in a segment with two newer ones: the next one is sealed (synced when the
        // wal moved on) and a whole segment long, which is the wal's unsynced window here
        // (`max_batch_bytes`), so valid records lie more than a window beyond the rot even
        // after a torn restart, and recovery must call it corruption, not a torn tail.
        let disk = self.c.disks[&id].clone();
        let mut segments: Vec<(u64, String)> = disk
            .names(&dir)
            .into_iter()
            .filter_map(|n| Some((n.strip_suffix(".wal")?.parse::<u64>().ok()?, n)))
            .collect();
        segments.sort();
        let Some(at) = segments.iter().rposition(|(f, _)| *f <= lsn) else {
            return;
        };
        if at + 2 >= segments.len() {
            return;
        }
        let (seg_first, name) = segments.swap_remove(at);
        let path = dir.join(name);
        let offset = wal::format::SEGMENT_DATA_OFFSET
            + (lsn - seg_first)
            + wal::format::HEADER_BYTES as u64
            + self.rot_rng.below(buf.len() as u64);
        let Some(byte) = disk
            .read_file(&path)
            .and_then(|d| d.get(offset as usize).copied())
        else {
            return;
        };
        disk.corrupt(&path, offset, &[byte ^ (1 << self.rot_rng.below(8))]);
        self.rotted.entry(id).or_default().insert(lsn);
        self.checker.rotted.insert((id, k));
        self.fault(
            Fault::RecordRot,
            format!("a stored byte of node {id}'s committed entry {k} rots (Lsn {lsn})"),
        );
    }

    /// Whether `e`, from starting node `id`, is its recovery refusing a record that rotted.
    fn refused_on_rot(&self, id: u64, e: &ReplicaError) -> bool {
        match e {
            ReplicaError::Wal(wal::WalError::Corrupt { lsn, .. }) => {
                self.rotted.get(&id).is_some_and(|l| l.contains(&lsn.0))
            }
            _ => false,
        }
    }

    /// A node refused to start on a rotten record (detected, never served). The operator's
    /// way out (ops/GUIDE.md): remove it from the cluster and add a fresh node in its place.
    /// It stays in `down` until its removal commits, so the fault budget counts it.
    fn lose_disk(&mut self, id: u64, e: &ReplicaError) {
        self.lost.insert(id);
        self.killed.remove(&id);
        self.fault(
            Fault::DiskReplaced,
            format!(
                "node {id} refuses to start ({e}); the operator removes it and adds a fresh node"
            ),
        );
    }

    /// Proposes the removal of lost nodes (again, while a proposal was lost to a leader
    /// change), and adds a fresh node for each lost one that left.
    fn replace_lost(&mut self) {
        let Some(l) = self.leader() else {
            return;
        };
        let now = self.now();
        let voters = self.c.node(l).status().voters;
        for id in self.lost.clone() {
            let due = self
                .removal_asked
                .get(&id)
                .is_none_or(|&at| now >= at + REMOVAL_RETRY_NS);
            if !voters.contains(&id) || !due {
                continue;
            }
            if self.c.node(l).change_membership(id, false).is_ok() {
                self.removed.insert(id);
                self.removal_asked.insert(id, now);
                self.fault(
                    Fault::RemoveVoter,
                    format!("leader {l} removes node {id}, whose disk is lost"),
                );
                return;
            }
        }
        let gone = self
            .lost
            .iter()
            .filter(|id| self.retired.contains(id))
            .count() as u64;
        if gone > self.replaced && self.lost.iter().all(|id| self.retired.contains(id)) {
            let id = self.next_node;
            if self.c.add_node(id).is_err() {
                return;
            }
            self.next_node += 1;
            match self.c.node(l).change_membership(id, true) {
                Ok(_) => {
                    self.replaced += 1;
                    self.fault(
                        Fault::AddVoter,
                        format!("leader {l} adds node {id} in place of a lost one"),
                    );
                }
                Err(e) => {
                    // The empty node stays a non-voting member; the next try adds another.
                    self.event(format!("leader {l} cannot add node {id}: {e}"));
                }
            }
        }
    }

    fn change_membership(&mut self) -> Result<(), Violation> {
        // No changes of the driver's own while a rotten node is still a member: it is about
        // to be lost for good, and a removal in flight beside it would leave the
        // configuration without a majority (seeds 43139, 88155).
        if self.rotted.keys().any(|id| !self.retired.contains(id)) {
            return Ok(());
        }
        let Some(l) = self.leader() else {
            return Ok(());
        };
        let voters = self.c.node(l).status().voters;
        if voters.len() <= 3 || (voters.len() < 5 && self.rng.below(2) == 0) {
            let id = self.next_node;
            self.next_node += 1;
            self.c
                .add_node(id)
                .map_err(|e| format!("cannot add node {id}: {e}"))?;
            match self.c.node(l).change_membership(id, true) {
                Ok(_) => self.fault(Fault::AddVoter, format!("leader {l} adds node {id}")),
                Err(e) => self.event(format!("leader {l} cannot add node {id}: {e}")),
            }
        } else {
            // Under Memory a node that lost its ring does not vote until it caught up; a
            // removal while one is down or recovering can leave them a majority of the
            // smaller configuration, the documented stall. Fsync nodes restart with their
            // state and vote at once.
            let memory = self
                .c
                .configs
                .values()
                .next()
                .is_some_and(|c| c.durability.ring_in_shared_memory());
            if memory && (!self.down.is_empty() || self.recovering() > 0) {
                return Ok(());
            }
            if self.options.self_removals && self.self_removal_rng.below(4) != 0 {
                match self.c.node(l).change_membership(l, false) {
                    Ok(_) => {
                        self.removed.insert(l);
                        self.fault(Fault::RemoveLeader, format!("leader {l} removes itself"))
                    }
                    Err(e) => self.event(format!("leader {l} cannot remove itself: {e}")),
                }
                return Ok(());
            }
            let others: Vec<u64> = voters.into_iter().filter(|&v| v != l).collect();
            if let Some(gone) = self.pick(&others) {
                match self.c.node(l).change_membership(gone, false) {
                    Ok(_) => {
                        self.removed.insert(gone);
                        self.fault(
                            Fault::RemoveVoter,
                            format!("leader {l} removes node {gone}"),
                        )
                    }
                    Err(e) => self.event(format!("leader {l} cannot remove node {gone}: {e}")),
                }
            }
        }
        Ok(())
    }

    /// Retires nodes that every live node's configuration has dropped (and the leader has
    /// committed everything it holds): they shut down.
    fn retire_removed(&mut self) {
        let Some(l) = self.leader() else {
            return;
        };
        let s = self.c.node(l).status();
        if s.commit < s.last_index {
            return;
        }
        let voters: BTreeSet<u64> = s.voters.iter().copied().collect();
        // Never the leader itself: a leader that removed itself ([`Options::self_removals`])
        // is retired once it stepped down and another leads.
        let mut gone: Vec<u64> = self
            .members()
            .into_iter()
            .filter(|&id| id != l && !voters.contains(&id) && self.removed.contains(&id))
            .collect();
        if gone.is_empty() {
            return;
        }
        // Every live node's configuration, not the leader's alone: a node that has not
        // applied the removal still needs the removed one's vote, and with one more node lost
        // (a machine crash that makes it recovering) it could never elect (seed 9,950,157 of
        // `--conditional`, and 8,000,412 of `--durability replicated`, stalled so).
        let configs: Vec<(u64, Vec<u64>)> = self
            .c
            .nodes
            .iter()
            .filter(|(id, _)| !self.retired.contains(id))
            .filter_map(|(&id, r)| r.as_ref().map(|r| (id, r.status().voters)))
            .collect();
        gone.retain(|id| {
            configs
                .iter()
                .all(|(other, v)| other == id || !v.contains(id))
        });
        for id in gone {
            if self.c.nodes[&id].is_some() {
                self.c.crash(id);
            }
            self.down.remove(&id);
            self.retired.insert(id);
            self.event(format!("node {id} leaves the cluster"));
        }
    }

    /// The payload of op `op`'s next attempt: unique, of mixed sizes that move ring positions
    /// around block and wrap boundaries.
    fn payload_for(&mut self, op: usize) -> Vec<u8> {
        let mut payload = format!("op{op}.{}", self.ops[op].attempts.len()).into_bytes();
        let pad = match self.rng.below(4) {
            0 => 0,
            1 => self.rng.below(200),
            2 => self.rng.below(3_000),
            _ => self.rng.below(7_000),
        };
        payload.push(b'/');
        payload.extend((0..pad).map(|i| b'a' + ((i + self.seed) % 26) as u8));
        payload
    }

    fn attempt(&mut self, op: usize, node: u64) {
        self.attempt_batch(&[op], node);
    }

    /// Attempts ops `ops` on `node` as one `propose_batch`: all of them get tickets, or all
    /// fail. Each then resolves on its own (a new leader may keep a prefix of the batch).
    fn attempt_batch(&mut self, ops: &[usize], node: u64) {
        let payloads: Vec<Vec<u8>> = ops.iter().map(|&op| self.payload_for(op)).collect();
        let now = self.now();
        let condition = (self.options.conditional && ops.len() == 1 && self.rng.below(3) == 0)
            .then(|| self.rng.below(4) == 0);
        let mut expected_last = None;
        let key = self.ops[ops[0]].key.map(|(c, seq)| {
            let session = self.clients[c]
                .session
                .expect("attempted once the session is open");
            (session, seq)
        });
        let result = match self.c.nodes.get_mut(&node).and_then(Option::as_mut) {
            Some(r) if key.is_some() => {
                let (session, seq) = key.expect("checked");
                let refs: Vec<&[u8]> = payloads.iter().map(|p| &p[..]).collect();
                r.propose_in_session(session, seq, &refs)
            }
            Some(r) if condition.is_some() => {
                let behind = u64::from(condition == Some(true));
                let e = r.last_index().saturating_sub(behind);
                expected_last = Some(e);
                r.propose_batch_if(&[&payloads[0]], e)
            }
            Some(r) if ops.len() == 1 => r.propose(&payloads[0]).map(|t| vec![t]),
            Some(r) => {
                let refs: Vec<&[u8]> = payloads.iter().map(|p| &p[..]).collect();
                r.propose_batch(&refs)
            }
            None => Err(ReplicaError::Closed),
        };
        if let (true, Ok(tickets)) = (self.options.callers_drive, &result) {
            if let Some(&last) = tickets.last() {
                self.c.waiting.insert(node, last);
                if self.options.reads
                    && self.read_rng.below(2) == 0
                    && self.reads_in_flight() < reads::MAX_READS_IN_FLIGHT
                {
                    self.c.read_on_resolve.insert(node);
                } else {
                    self.c.read_on_resolve.remove(&node);
                }
            }
        }
        let incarnation = self.incarnations.get(&node).copied().unwrap_or(0);
        // The node knows the session's number is in the log, too far back to tell its index:
        // the entry is there once (the checker holds the key to being in the committed log,
        // once), and the client, as a real one does, reports it and moves on. Retrying it, the client never finished, and
        // its later numbers waited behind it (seed 60,000,796 of `--sessions`).
        let in_log = match result {
            Err(ReplicaError::SessionTooOld { seq, .. }) => Some(seq),
            _ => None,
        };
        for (j, (&op, payload)) in ops.iter().zip(payloads).enumerate() {
            let reported = in_log.is_some() && in_log == key.map(|(_, first)| first + j as u64);
            let (ticket, outcome) = match &result {
                Ok(tickets) => (Some(tickets[j]), Outcome::Pending),
                Err(_) if reported => (None, Outcome::InLog),
                Err(_) => (None, Outcome::Failed),
            };
            let k = self.history.len();
            self.history.push(Attempt {
                payload,
                node,
                incarnation,
                ticket,
                invoked_ns: now,
                outcome,
                expected_last,
                key: key.map(|(session, seq)| (session, seq + j as u64)),
            });
            self.ops[op].attempts.push(k);
            self.summary.attempts += 1;
            self.ops[op].next_try_ns = now + STEP_NS * (1 + self.rng.below(20));
            if reported {
                self.ops[op].done = true;
                self.event(format!(
                    "op {op} is in the log already, too far back for its index"
                ));
            }
        }
    }

    fn drive_clients(&mut self, start_new: bool) {
        if self.options.sessions {
            self.drive_sessions(!start_new);
        }
        let now = self.now();
        if start_new
            && (self.ops.len() as u64) < self.options.max_appends
            && self.ops.iter().filter(|o| !o.done).count() < MAX_IN_FLIGHT
            && self.chance(self.rates.append_ppm)
        {
            // A quarter of new appends come as a batch of 2 to 24 entries (`append_batch`),
            // proposed together on the node the client takes for the leader; a burst of them
            // fills a small ring.
            let k = if self.rng.below(4) == 0 {
                2 + self.rng.below(23) as usize
            } else {
                1
            };
            let first = self.new_ops(k);
            if k > 1 && self.can_attempt(first) {
                let live = self.live();
                if let Some(asked) = self.pick(&live) {
                    let target = self.told_leader(asked, &live);
                    let ops: Vec<usize> = (first..first + k).collect();
                    self.attempt_batch(&ops, target);
                }
            }
        }
        for op in 0..self.ops.len() {
            if self.ops[op].done {
                continue;
            }
            // Resolve the latest attempt.
            if let Some(&k) = self.ops[op].attempts.last() {
                let a = &self.history[k];
                if a.outcome == Outcome::Pending {
                    let ticket = a.ticket.expect("pending attempts have tickets");
                    let a_node = a.node;
                    let same_process =
                        self.incarnations.get(&a.node).copied().unwrap_or(0) == a.incarnation;
                    let status = match self.c.nodes.get(&a.node).and_then(Option::as_ref) {
                        // The process that gave the ticket is gone: the outcome is unknown.
                        _ if !same_process => Some(Err(ReplicaError::Closed)),
                        Some(r) if !self.c.paused.contains(&a.node) => r.ticket_status(ticket),
                        Some(_) => None,
                        None => Some(Err(ReplicaError::Closed)),
                    };
                    let outcome = match status {
                        None if now >= a.invoked_ns + CLIENT_TIMEOUT_NS => Outcome::Unknown,
                        None => continue,
                        Some(Ok(index)) => Outcome::Acked { index, at_ns: now },
                        Some(Err(ReplicaError::Superseded { .. })) => Outcome::Failed,
                        Some(Err(_)) => Outcome::Unknown,
                    };
                    self.history[k].outcome = outcome;
                    if self.c.waiting.get(&a_node) == Some(&ticket) {
                        // The caller stops waiting: its node's passes run in full again.
                        self.c.waiting.remove(&a_node);
                    }
                    if let Outcome::Acked { index, .. } = outcome {
                        self.summary.acked += 1;
                        self.acked_on.push(a_node);
                        self.ops[op].done = true;
                        self.event(format!("op {op} acked at index {index}"));
                        continue;
                    }
                    self.ops[op].next_try_ns = now + STEP_NS * (1 + self.rng.below(10));
                }
            }
            // After the faults stop the client keeps trying until the liveness bound. A
            // session's client never gives up: a number it dropped would block the next ones.
            if start_new
                && !self.options.sessions
                && self.ops[op].attempts.len() as u32 >= MAX_ATTEMPTS
            {
                self.ops[op].done = true;
                continue;
            }
            if now < self.ops[op].next_try_ns || !self.can_attempt(op) {
                continue;
            }
            if !start_new && self.waits_for_an_earlier_number(op) {
                continue;
            }
            // A client knows no more than any node tells it: ask a random live node for the
            // leader, and fall back to a random node.
            let live = self.client_targets(!start_new);
            let Some(asked) = self.pick(&live) else {
                continue;
            };
            let target = self.told_leader(asked, &live);
            self.attempt(op, target);
        }
    }

    fn step(&mut self) -> Result<(), Violation> {
        self.c
            .run_for(STEP_NS)
            .map_err(|e| format!("the cluster failed outside fail-stop: {e}"))?;
        self.take_reads_on_resolve();
        for (id, why) in std::mem::take(&mut self.c.failed) {
            self.checker.node_restarted(id);
            *self.incarnations.entry(id).or_default() += 1;
            if !self.retired.contains(&id) {
                self.down.insert(id);
                if self.c.disks[&id].is_crashed() {
                    // The power cut took the machine: shared memory too, and the restart
                    // reboots the disk.
                    self.c.net.crash(NodeId(id));
                } else {
                    self.killed.insert(id);
                }
            }
            self.fault(Fault::FailStop, format!("node {id} fail-stops: {why}"));
        }
        self.check()?;
        for read in std::mem::take(&mut self.c.caller_reads) {
            self.summary.caller_reads += 1;
            self.checker.check_caller_read(read)?;
        }
        Ok(())
    }

    fn check(&mut self) -> Result<(), Violation> {
        let mut skipped = BTreeSet::new();
        for (&id, r) in self.c.nodes.iter_mut() {
            // A machine whose power just failed (a power cut mid-operation), or a process
            // killed mid-operation, is dead, whether it noticed yet or not: its disk answers
            // nothing; it is checked next step. A read failure armed for the node is held
            // back while the checker reads (it must reach the node, not the checker).
            let disk = &self.c.disks[&id];
            if disk.is_down() {
                skipped.insert(id);
                continue;
            }
            if let Some(r) = r {
                r.verify_ring()
                    .map_err(|e| format!("ring integrity: node {id}: {e}"))?;
                let overwrites = r.stats().fast_overwrites;
                if overwrites > 0 {
                    return Err(format!(
                        "ring integrity: node {id}: its leader wrote over records it had \
                         accepted ({overwrites} descriptors)"
                    ));
                }
                // The simulated network corrupts RDMA Writes, never Sends: every frame a node
                // refuses (undecodable, from the wrong peer, an append whose entries do not
                // follow its index) was sent malformed by a correct node.
                let refused = r.stats().bad_frames;
                if refused > 0 {
                    return Err(format!(
                        "well-formed messages: node {id} refused {refused} frames a correct \
                         peer sent it"
                    ));
                }
                let checker = &mut self.checker;
                disk.without_read_faults(|| {
                    checker.check_node(id, r)?;
                    checker.check_checkpoint(id, r)
                })?;
            }
        }
        // An ack from a node the checker skipped (this step, or the step it acked in, before
        // that node died) may name an index no node has reported committed yet: it is checked
        // once some node's commit covers it, and by the history check at the end in any case.
        // Likewise an index that every node which could have shown it was skipped at, while
        // the others moved past it (a node restarted from a later checkpoint starts above
        // it): while no node the checker reads this step holds it committed, and the checker
        // never read it, it is left to a later step and to the history check at the end
        // (simulator seed 2697, when the checker still skipped a node whose read failure was
        // armed: the only copy was a leader whose failure never fired, because it served
        // everything from its ring; a node whose disk is down is skipped alike).
        let seen = self.checker.max_committed();
        let readable: Vec<(u64, u64)> = self
            .c
            .nodes
            .iter()
            .filter(|(id, _)| !skipped.contains(id))
            .filter_map(|(_, r)| r.as_ref().map(|r| r.status()))
            .map(|s| (s.first_index, s.commit))
            .collect();
        for a in &self.history {
            let unseen = matches!(a.outcome, Outcome::Acked { index, .. } if index > seen);
            if unseen && (skipped.contains(&a.node) || self.ever_skipped.contains(&a.node)) {
                continue;
            }
            if let Outcome::Acked { index, .. } = a.outcome {
                let unread = !self.checker.has_committed(index)
                    && !readable.iter().any(|&(f, c)| f <= index && index <= c);
                if unread && !self.ever_skipped.is_empty() {
                    continue;
                }
            }
            self.checker.check_ack(a)?;
        }
        self.ever_skipped.extend(skipped);
        Ok(())
    }

    /// Repairs every fault: heal links, clear delays, wake and restart everyone, lift disk
    /// limits.
    fn repair(&mut self) -> Result<(), Violation> {
        self.end_episode_at_repair()?;
        self.heal_links();
        let ids: Vec<u64> = self.c.nodes.keys().copied().collect();
        for &a in &ids {
            for &b in &ids {
                if a != b {
                    self.c.net.set_extra_delay(NodeId(a), NodeId(b), 0);
                }
            }
        }
        let paused: Vec<u64> = self.c.paused.iter().copied().collect();
        for id in paused {
            self.resume(id)?;
        }
        for id in self.full_disks.clone() {
            self.c.disks[&id].set_space_limit(None);
        }
        self.full_disks.clear();
        // A read failure no read took yet would keep its node out of the checkers' sight.
        for disk in self.c.disks.values() {
            disk.clear_read_failure();
        }
        for id in self.down.clone() {
            self.restart(id)?;
        }
        Ok(())
    }

    /// Whether all work is done: every client op finished, every read in flight ended
    /// (answered and checked, refused, or timed out: none leaves the run unchecked), the live
    /// voters agree on a commit index covering every acknowledged append, and a fresh append
    /// went through.
    fn quiet(&mut self) -> bool {
        if self.ops.iter().any(|o| !o.done)
            || !self.reads.is_empty()
            || !self.c.failed.is_empty()
            || !self.down.is_empty()
        {
            return false;
        }
        let Some(l) = self.leader() else {
            return false;
        };
        let s = self.c.node(l).status();
        if s.commit < s.last_index {
            return false;
        }
        s.voters.iter().all(|v| {
            self.c
                .nodes
                .get(v)
                .and_then(Option::as_ref)
                .is_some_and(|r| r.status().commit == s.commit)
        })
    }
}

/// A seed that caught a mutation, and how.
#[derive(Clone, Debug)]
pub struct Catch {
    /// The seed.
    pub seed: u64,
    /// Its failure with the mutation on.
    pub failure: Box<Failure>,
}

/// For the mutation tests: the first of `seeds` that fails with `options` (a mutation on),
/// once the same seed with the same options but no mutation has passed, so that the catch is
/// the mutation's and not some other failure of that seed. `Err` holds the failure of that
/// run without the mutation.
pub fn first_catch(
    options: Options,
    seeds: impl IntoIterator<Item = u64>,
) -> Result<Option<Catch>, Box<Failure>> {
    let Some(catch) = seeds.into_iter().find_map(|seed| {
        run(seed, options, false)
            .err()
            .map(|failure| Catch { seed, failure })
    }) else {
        return Ok(None);
    };
    let unmutated = Options {
        mutation: Mutation::None,
        ..options
    };
    run(catch.seed, unmutated, false)?;
    Ok(Some(catch))
}

/// Runs one seed with `options`; `verbose` prints every event to stderr.
pub fn run(seed: u64, options: Options, verbose: bool) -> Result<Summary, Box<Failure>> {
    let mut rng = SplitMix64::new(seed ^ 0x5157_0bad_cafe_f00d);
    let drawn = FaultRates::draw(&mut rng);
    let drawn_nodes = if rng.below(3) == 0 { 5 } else { 3 };
    // The family of stale tickets needs five voters: two hold an entry the other three lack.
    let nodes = options.nodes.unwrap_or(if options.stale_tickets {
        5
    } else {
        drawn_nodes
    });
    let rates = options.rates.unwrap_or_else(|| {
        let mut r = drawn;
        r.draw_late(&mut rng);
        r
    });
    let mutation = options.mutation;
    // Drawn after everything older seeds drew, so they keep their rates and size.
    let drawn_durability = if rng.below(2) == 0 {
        Durability::Fsync
    } else {
        Durability::Memory
    };
    // Half the Memory seeds commit on NIC acknowledgements instead, from a generator of
    // their own, so every other draw of a seed stays what it was.
    let drawn_durability = if drawn_durability == Durability::Memory
        && SplitMix64::new(seed ^ 0x0a1c_4ac4_0000_0001).below(2) == 0
    {
        Durability::Replicated
    } else {
        drawn_durability
    };
    let durability = options.durability.unwrap_or(drawn_durability);
    // The NIC's behaviours, drawn after the durability: half the seeds read a write's source
    // bytes when it lands (so a ring slot reused under an in-flight write sends what was
    // written since), half tear the writes on the wire when a follower revokes their sender.
    let fabric = SimConfig {
        read_source_at_delivery: rng.below(2) == 0,
        tear_writes_at_revoke: rng.below(2) == 0,
        // Half the seeds flip a byte in 1 write in 50: the receivers' record checks must
        // refuse every one of them.
        corrupt_write_ppm: if rng.below(2) == 0 { 20_000 } else { 0 },
        use_before_announced: options.mutation == Mutation::UseConnectionBeforeAnnounced,
        ..SimConfig::default()
    };
    // Replicated counts a completed write as placed intact: RoCE's ICRC (InfiniBand's CRCs)
    // drops a corrupted packet and the NIC retransmits it, so a successful completion never
    // carries flipped bytes. A NIC that flips them and reports success is outside the fault
    // model of that mode (docs say so); the other two check every record before they ack.
    let fabric = if durability == Durability::Replicated {
        SimConfig {
            corrupt_write_ppm: 0,
            ..fabric
        }
    } else {
        fabric
    };
    let mut rates = rates;
    if durability.ring_in_shared_memory() && options.rates.is_none() {
        // Every machine losing power at once takes every Memory ring: the documented loss
        // (and stall), not a fault this mode survives. Process kills of every node are.
        rates.power_loss_ppm = 0;
    }
    // Rot, from a second generator: under Fsync, half the seeds let stored bytes rot, and
    // those get 16 KiB blocks and segments of two blocks, whose unsynced window (one segment)
    // is small enough that a rotten record has valid ones beyond it, so recovery can tell rot
    // from a torn tail (docs/FORMAT.md, crash case 9: within the last window it cannot).
    let mut rot_rng = SplitMix64::new(seed ^ 0x0d15_c0de_b17e_5eed);
    // Not with wipes: a node that refuses to start on rot while another's data dir is new
    // is two data dirs lost of three, which no guard can undo.
    let rots = durability == Durability::Fsync
        && options.rates.is_none()
        && !options.wipes
        && rot_rng.below(2) == 0;
    if rots {
        rates.rot_ppm = 5_000 + rot_rng.below(15_001);
    }
    // Kills in the middle of a disk operation, from a third generator: half the seeds.
    let mut kill_op_rng = SplitMix64::new(seed ^ 0x6b11_1ed0_0d15_c0de);
    if options.kill_mid_op && options.rates.is_none() && kill_op_rng.below(2) == 0 {
        rates.kill_mid_op_ppm = 1 + kill_op_rng.below(6_000);
    }
    let (block_bytes, segment_bytes) = if rots || options.stopped_installs {
        (16 << 10, 32 << 10)
    } else {
        (64 << 10, 512 << 10)
    };
    let fail = |v: Violation, at_ns: u64, trace: Vec<String>| {
        Box::new(Failure {
            seed,
            rates,
            durability,
            fabric,
            options,
            violation: v,
            at_ns,
            trace_tail: trace,
        })
    };
    // Small rings and segments: wrap-around, ring-full and segment rotation happen within a
    // short run; a third of the seeds get a ring of two blocks, which a burst fills, so the
    // ring-full path (persist, release, unpin in-flight writes) runs often.
    let ring_bytes = [1 << 20, 256 << 10, 128 << 10][rng.below(3) as usize];
    let mut c = SimCluster::new(nodes, seed, fabric, |cfg| {
        cfg.ring_bytes = ring_bytes;
        cfg.block_bytes = block_bytes;
        cfg.segment_bytes = segment_bytes;
        cfg.max_entry_bytes = 8 << 10;
        cfg.mutation = mutation;
        cfg.durability = durability;
    })
    .map_err(|e| fail(format!("cannot build the cluster: {e}"), 0, Vec::new()))?;
    c.fail_stop = true;
    let mut run = Run {
        seed,
        rng,
        rates,
        c,
        checker: Checker::new(),
        history: Vec::new(),
        ops: Vec::new(),
        clients: (0..SESSION_CLIENTS)
            .map(|_| SessionClient::default())
            .collect(),
        summary: Summary {
            seed,
            nodes,
            durability,
            ..Summary::default()
        },
        retired: BTreeSet::new(),
        conf_at_kill: BTreeMap::new(),
        down: BTreeSet::new(),
        killed: BTreeSet::new(),
        ever_skipped: BTreeSet::new(),
        full_disks: BTreeSet::new(),
        next_node: nodes + 1,
        trace: Default::default(),
        verbose,
        options,
        removed: BTreeSet::new(),
        incarnations: BTreeMap::new(),
        rot_rng,
        kill_op_rng,
        rotted: BTreeMap::new(),
        lost: BTreeSet::new(),
        wiped: BTreeSet::new(),
        replaced: 0,
        removal_asked: BTreeMap::new(),
        episode: None,
        episode_rng: SplitMix64::new(seed ^ 0x0e91_50de_0000_0002),
        callers_episode_rng: SplitMix64::new(seed ^ 0x0e91_50de_0000_0003),
        wipes_episode_rng: SplitMix64::new(seed ^ 0x0e91_50de_0000_0004),
        stale_episode_rng: SplitMix64::new(seed ^ 0x0e91_50de_0000_0005),
        install_episode_rng: SplitMix64::new(seed ^ 0x0e91_50de_0000_0006),
        self_removal_rng: SplitMix64::new(seed ^ 0x0e91_50de_0000_0007),
        read_eio_rng: SplitMix64::new(seed ^ 0x0e91_50de_0000_0008),
        acked_on: Vec::new(),
        reads: Vec::new(),
        read_rng: SplitMix64::new(seed ^ 0x4ead_1de0_0000_0003),
    };
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run.drive()))
        .unwrap_or_else(|panic| {
            let what = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_else(|| "a panic without a message".into());
            Err(format!("panic: {what}"))
        });
    let at = run.now();
    match result {
        Ok(()) => {
            if run.checker.rot_detected > 0 {
                *run.summary.faults.entry(Fault::RotDetected).or_default() +=
                    run.checker.rot_detected;
            }
            let s = run.c.net.stats();
            run.summary.writes_refused = s.writes_refused;
            run.summary.writes_torn = s.writes_torn;
            run.summary.ring_full = run
                .c
                .nodes
                .values()
                .flatten()
                .map(|r| r.stats().ring_full)
                .sum();
            let alive = || run.c.nodes.values().flatten();
            run.summary.nic_acks = alive().map(|r| r.stats().nic_acks).sum();
            run.summary.placed_taken = alive().map(|r| r.stats().placed_taken).sum();
            run.summary.answers_skipped = alive().map(|r| r.stats().answers_skipped).sum();
            run.summary.passes_stopped_at_commit =
                alive().map(|r| r.stats().passes_stopped_at_commit).sum();
            run.summary.direct_proposals = alive().map(|r| r.stats().direct_proposals).sum();
            run.summary.queued_proposals = alive().map(|r| r.stats().queued_proposals).sum();
            run.summary.snapshots_installed = run
                .c
                .nodes
                .values()
                .flatten()
                .map(|r| r.stats().snapshots_installed)
                .sum();
            run.summary.committed = run.checker.max_committed();
            run.summary.virtual_ns = at;
            Ok(run.summary)
        }
        Err(v) => Err(fail(v, at, run.trace.into_iter().collect())),
    }
}

impl Run {
    fn drive(&mut self) -> Result<(), Violation> {
        let fault_end = self.now() + self.options.fault_ns;
        while self.now() < fault_end {
            if !self.run_episode()? {
                self.inject_faults()?;
            }
            self.drive_clients(true);
            self.drive_reads(true)?;
            self.step()?;
            self.retire_removed();
            self.replace_lost();
        }
        // Liveness: once every fault is repaired and the whole cluster is connected, all
        // pending work finishes within a bounded number of election timeouts.
        self.event("faults stop".into());
        self.repair()?;
        let election_ns = self
            .c
            .configs
            .values()
            .next()
            .map_or(10, |c| c.election_tick) as u64
            * self.c.tick_ns;
        let bound = self.now() + LIVENESS_ELECTION_TIMEOUTS * election_ns;
        // One more append must go through after the repair.
        let last = self.new_ops(1);
        loop {
            self.drive_clients(false);
            self.drive_reads(false)?;
            if self.quiet() {
                break;
            }
            if self.now() >= bound {
                return Err(format!(
                    "liveness: {} client appends and {} reads still unfinished, leader {:?}, \
                     {} election timeouts after the faults stopped; nodes: {}",
                    self.ops.iter().filter(|o| !o.done).count(),
                    self.reads.len(),
                    self.leader(),
                    LIVENESS_ELECTION_TIMEOUTS,
                    self.describe_nodes()
                ));
            }
            self.step()?;
            self.retire_removed();
            self.replace_lost();
            // A node that fail-stopped during the repair (an EIO armed before) restarts.
            for id in self.down.clone() {
                self.restart(id)?;
            }
        }
        let acked_last = self.ops[last]
            .attempts
            .iter()
            .any(|&k| matches!(self.history[k].outcome, Outcome::Acked { .. }));
        if !acked_last {
            return Err("liveness: the append made after the repair was never acknowledged".into());
        }
        // One linearizable read too, with a bound of its own.
        self.final_read(self.now() + LIVENESS_ELECTION_TIMEOUTS * election_ns)?;
        self.checker.check_history(&self.history)
    }
}
