//! Episodes: faults that take several steps, drawn only for `Durability::Replicated` seeds,
//! where a follower's NIC acknowledges what its CPU has not seen. Each sets up the one
//! situation where a rule of that mode matters, lets the cluster commit through it, then ends
//! it with the leader killed and everything else healed, so the next election must find
//! every acknowledged entry:
//!
//! - [`Episode::Stalled`]: a follower's CPU stalls (paused) while its NIC keeps acknowledging,
//!   and the leader is cut off from every other node: appends commit on that NIC alone, with
//!   their descriptors stuck behind exhausted send credits. The stalled follower must take
//!   what was placed in its ring before it votes (mutation `no-placed-take`).
//! - [`Episode::Reelection`]: a follower sleeps through two elections that hand the
//!   leadership away and back, so its NIC still holds the grant it gave in the first term;
//!   then the re-elected leader is cut off from everyone but it. A leader must not count a
//!   write on a grant given for an earlier term (mutation `nic-ack-before-grant`).
//!
//! - [`Episode::Deposed`] (seeds of [`crate::Options::callers_drive`], any durability): a
//!   leader with a caller waiting on its append (driving its own passes) is cut off from
//!   every other member until another node leads and has committed past the cut-off node's
//!   log; then its links heal while the caller still waits. The new leader's append that
//!   replaces the old suffix also moves the commit index over it, in one step: the caller's
//!   pass there must not stop before the `Ready` that writes the new entries and cuts the old
//!   ones (mutation `deposed-caller-stops-early`), or the log reads a superseded entry as
//!   committed, which the read right after the caller's pass sees (the checker's read at
//!   the end of the step comes after the next full pass mended the wal).
//!
//! - [`Episode::WokenBesideNewDisk`] (seeds of [`crate::Options::wipes`], any durability,
//!   three voters): a leader sleeps cut off from every other member until another node leads
//!   and has committed past its log; then the member that does not lead restarts on a new
//!   disk under its old id, the new leader is cut off from everyone, and the old leader wakes
//!   with a link to the new disk's node only, with clients writing to it. The node on the new
//!   disk has lost its term: it must step no raft message until every voter has told it
//!   theirs (mutation `unproven-steps`), or it acknowledges the deposed leader's appends and
//!   that leader commits over the entries the others committed without it.
//!
//! - [`Episode::StaleTicket`] (seeds of [`crate::Options::stale_tickets`], five voters): a
//!   leader A's appends reach one follower X only; the other three elect a leader W whose
//!   first entry replaces A's on A only (W is cut off from the two others at once), then W
//!   dies and X, holding A's entries, is elected by the two others and commits them. While
//!   W's entry stood in A's log at their indexes, A's clients asked for their tickets: only
//!   the commit index may say an entry was superseded (mutation `superseded-uncommitted`, or
//!   a client told "not committed" finds its entry committed).
//!
//! - [`Episode::StoppedInstall`] (seeds of [`crate::Options::stopped_installs`]): a
//!   follower is killed, the leader adds a node and checkpoints past the follower's log
//!   (small segments, so whole segments go); the follower restarts, is sent the checkpoint,
//!   and the write of the snapshot's membership fails (EIO). Its next start must finish the
//!   install with the snapshot's membership (mutation `membership-after-log-restart`: the log
//!   restarted at the snapshot first, so the next start took the install for finished and
//!   kept the membership from before it).
//!
//! With [`crate::Options::clean_stops`] an episode ends with its stalled followers stopped
//! cleanly and restarted instead of woken: the close must keep what their NICs acknowledged
//! (mutation `close-without-fence`).
//!
//! While an episode runs no other fault is drawn, so it plays out as designed.

use fabric::NodeId;
use replica::Role;

use crate::{Fault, Run, STEP_NS, Violation};

/// An episode in progress.
#[derive(Clone, Debug)]
pub(crate) enum Episode {
    /// The `stalled` followers (as many as make a majority with the leader) are paused and
    /// `leader` cut off from all but them, until `until_ns`.
    Stalled {
        leader: u64,
        stalled: Vec<u64>,
        until_ns: u64,
    },
    /// The `stalled` followers are paused while the leadership goes from `leader` to `other`
    /// and back.
    Reelection {
        leader: u64,
        stalled: Vec<u64>,
        other: u64,
        /// `leader`'s term when it started.
        term: u64,
        phase: Phase,
        /// When the current phase gives up (or, for `Phase::Cut`, ends).
        until_ns: u64,
    },
    /// `leader` (of `term`) is cut off from every other member with a caller waiting on it
    /// until another node leads and has committed past `leader`'s log (`healed: false`);
    /// then its links are healed until the caller stops waiting (`healed: true`).
    Deposed {
        leader: u64,
        term: u64,
        healed: bool,
        /// When the current phase gives up.
        until_ns: u64,
    },
    /// `leader` (of `term`) sleeps cut off from every other member until another node leads
    /// and has committed past its log (`woken: None`); then the other follower restarts on a
    /// new disk, the new leader is cut off, and `leader` wakes linked to the new disk's node
    /// only (`woken: Some(it)`), until `until_ns`.
    WokenBesideNewDisk {
        leader: u64,
        term: u64,
        woken: Option<u64>,
        /// When the current phase gives up (or, once woken, ends).
        until_ns: u64,
    },
    /// See the module doc and [`Install`].
    StoppedInstall(Install),
    /// See the module doc and [`Stale`].
    StaleTicket(Stale),
}

/// [`Episode::StaleTicket`]: `leader` (A) of `term`, the follower `x`, the first index only A
/// and X hold, the new leader, and the phase.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Stale {
    leader: u64,
    term: u64,
    x: u64,
    first_stale: u64,
    winner: u64,
    phase: StalePhase,
    /// When the current phase gives up.
    until_ns: u64,
}

/// The phases of [`Episode::StaleTicket`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StalePhase {
    /// A's appends go to X only (A's messages to the three others are held on the wire, the
    /// links staying up, so theirs to A still arrive): waiting until X holds A's last entry
    /// and A has one past the others'.
    Reach,
    /// X is cut off from A too; waiting for one of the three to lead.
    Elect,
    /// The new leader `winner` is cut off from the two others; waiting until its entry
    /// replaced A's at `first_stale` on A.
    Replace,
    /// The new leader is killed and A cut off; X and the two others are linked again:
    /// waiting for X to lead and commit past `first_stale`.
    Recommit,
}

/// [`Episode::StoppedInstall`]: the `follower` killed while `leader` added `added` and
/// checkpointed past the follower's last index `last`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Install {
    leader: u64,
    follower: u64,
    added: u64,
    last: u64,
    phase: InstallPhase,
    /// When the current phase gives up.
    until_ns: u64,
}

/// The phases of [`Episode::StoppedInstall`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum InstallPhase {
    /// The follower is down; waiting until the added node counts and the leader has applied
    /// past the change, then checkpointing until its log starts past the follower's.
    Grow,
    /// The follower restarted with the membership write armed to fail: waiting for the
    /// install (and its fail-stop).
    Install,
}

/// The phases of [`Episode::Reelection`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Waiting for `other` to lead.
    Away,
    /// Waiting for `leader` to lead again, in a later term.
    Back,
    /// `leader` leads again, cut off from all but the sleeping follower.
    Cut,
}

/// Chance per step that an episode starts, in Replicated seeds.
const EPISODE_PPM: u64 = 15_000;

/// Chance per step that an [`Episode::Deposed`] starts, in seeds where callers drive.
const DEPOSED_PPM: u64 = 4_000;

/// Chance per step that an [`Episode::WokenBesideNewDisk`] starts, in seeds with wipes.
const WOKEN_PPM: u64 = 4_000;

/// Chance per step that an [`Episode::StoppedInstall`] starts, in seeds of stopped installs.
const INSTALL_PPM: u64 = 8_000;

/// Chance per step that an [`Episode::StaleTicket`] starts, in seeds of stale tickets.
const STALE_PPM: u64 = 6_000;

/// Delay between the three nodes that elect the new leader in [`Episode::StaleTicket`], so
/// that its first entry is still on the wire to the two others when it is cut off from them.
const STALE_ELECTORS_DELAY_NS: u64 = 30_000_000;

/// How long [`Episode::StaleTicket`] holds A's messages to the three others: for good (the
/// episode breaks those connections when it ends). Dropping them instead would fail A's side
/// of each connection at its first credit return, and the new leader's entry could not reach
/// A.
const HELD_NS: u64 = 1_000 * 1_000_000_000;

/// How long a phase that waits for an election may take before the episode is abandoned.
const ELECTION_WAIT_NS: u64 = 60 * STEP_NS;

impl Run {
    /// Advances the episode in progress, or perhaps starts one. Returns whether one is in
    /// progress (then no other fault is drawn this step).
    pub(crate) fn run_episode(&mut self) -> Result<bool, Violation> {
        match self.episode {
            None => {
                if self.summary.durability == replica::Durability::Replicated
                    && self.episode_rng.below(1_000_000) < EPISODE_PPM
                {
                    self.start_episode();
                } else if self.options.callers_drive
                    && self.options.deposed_episodes
                    && self.callers_episode_rng.below(1_000_000) < DEPOSED_PPM
                {
                    self.start_deposed();
                } else if self.options.wipes
                    && self.options.wipe_episodes
                    && self.wipes_episode_rng.below(1_000_000) < WOKEN_PPM
                {
                    self.start_woken_beside_new_disk();
                } else if self.options.stale_tickets
                    && self.stale_episode_rng.below(1_000_000) < STALE_PPM
                {
                    self.start_stale_ticket();
                } else if self.options.stopped_installs
                    && self.install_episode_rng.below(1_000_000) < INSTALL_PPM
                {
                    self.start_stopped_install()?;
                }
                Ok(self.episode.is_some())
            }
            Some(ref e) => {
                let e = e.clone();
                self.advance_episode(e)?;
                Ok(true)
            }
        }
    }

    /// The leader an episode may start on: one leads, and everyone is up and awake, so the
    /// episode's faults are the only ones.
    fn episode_leader(&self) -> Option<u64> {
        if !self.down.is_empty() || !self.c.paused.is_empty() || self.recovering() > 0 {
            return None;
        }
        self.leader()
    }

    fn start_episode(&mut self) {
        let Some(leader) = self.episode_leader() else {
            return;
        };
        let voters = self.c.node(leader).status().voters;
        let others: Vec<u64> = voters.into_iter().filter(|&v| v != leader).collect();
        if others.len() < 2 || others.iter().any(|v| !self.live().contains(v)) {
            return;
        }
        // Followers that make a majority with the leader stall; one of the others is where
        // the leadership goes and comes back from.
        let k = self.episode_rng.below(others.len() as u64) as usize;
        let n = others.len() + 1;
        let stalled: Vec<u64> = (0..(n - 1) / 2)
            .map(|j| others[(k + j) % others.len()])
            .collect();
        let other = others[(k + stalled.len()) % others.len()];
        for &f in &stalled {
            self.c.paused.insert(f);
        }
        if self.episode_rng.below(2) == 0 {
            self.cut_off_but(leader, &stalled);
            // Long enough, often, for the leader to use up its send credits to the stalled
            // followers (they repost no receive buffers), so descriptors wait in its outbox
            // while the writes before them land and complete.
            let until_ns = self.now() + (3 + self.episode_rng.below(28)) * STEP_NS;
            self.fault(
                Fault::StalledFollowerQuorum,
                format!(
                    "the CPUs of {stalled:?} stall while their NICs acknowledge; leader \
                     {leader} is cut off from every other node"
                ),
            );
            self.episode = Some(Episode::Stalled {
                leader,
                stalled,
                until_ns,
            });
        } else {
            let term = self.c.node(leader).status().term;
            self.c.node(leader).transfer_leader(other);
            self.fault(
                Fault::SleptThroughReelection,
                format!(
                    "{stalled:?} sleep while leader {leader} (term {term}) hands over to \
                     {other} and back"
                ),
            );
            self.episode = Some(Episode::Reelection {
                leader,
                stalled,
                other,
                term,
                phase: Phase::Away,
                until_ns: self.now() + ELECTION_WAIT_NS,
            });
        }
    }

    /// Starts an [`Episode::Deposed`] on the leader, if every node is up and awake.
    fn start_deposed(&mut self) {
        let Some(leader) = self.episode_leader() else {
            return;
        };
        let term = self.c.node(leader).status().term;
        self.cut_off_but(leader, &[]);
        self.fault(
            Fault::DeposedWhileWaiting,
            format!(
                "leader {leader} (term {term}) is cut off with a caller waiting on it, until \
                 another node commits past its log"
            ),
        );
        self.episode = Some(Episode::Deposed {
            leader,
            term,
            healed: false,
            until_ns: self.now() + ELECTION_WAIT_NS,
        });
        self.load(leader);
    }

    /// [`Episode::Deposed`]: while cut off, the old leader takes appends until it steps
    /// down (its caller waits on the last) and the new leader takes appends until its commit
    /// index passes the old leader's log; then the links heal, and the episode ends when the
    /// old leader's caller stops waiting, or when a phase runs out of time.
    fn advance_deposed(
        &mut self,
        leader: u64,
        term: u64,
        healed: bool,
        until_ns: u64,
    ) -> Result<(), Violation> {
        let now = self.now();
        let Some(old) = self.status_of(leader) else {
            self.episode = None;
            self.heal_links();
            return Ok(());
        };
        if healed {
            if now >= until_ns || !self.c.waiting.contains_key(&leader) {
                self.episode = None;
            }
            return Ok(());
        }
        if old.role == Role::Leader {
            self.load(leader);
        }
        match self.new_leader(leader, term) {
            Some((_, commit))
                if commit > old.last_index && self.c.waiting.contains_key(&leader) =>
            {
                self.heal_links();
                self.fault(
                    Fault::DeposedHealed,
                    format!(
                        "a new leader committed {commit}, past node {leader}'s last index \
                         {}; its links heal while its caller waits",
                        old.last_index
                    ),
                );
                if let Some(Episode::Deposed {
                    healed, until_ns, ..
                }) = &mut self.episode
                {
                    *healed = true;
                    *until_ns = now + ELECTION_WAIT_NS;
                }
            }
            Some((l, _)) if now < until_ns => self.load(l),
            _ if now < until_ns => {}
            // No new leader in time, or the caller stopped waiting: give up.
            _ => {
                self.episode = None;
                self.heal_links();
            }
        }
        Ok(())
    }

    /// Starts an [`Episode::WokenBesideNewDisk`] on the leader of three voters, if every node
    /// is up and awake and either follower may restart on a new disk.
    fn start_woken_beside_new_disk(&mut self) {
        let Some(leader) = self.episode_leader() else {
            return;
        };
        let voters = self.c.node(leader).status().voters;
        if voters.len() != 3
            || self.c.nodes.len() != 3
            || !voters
                .iter()
                .filter(|&&v| v != leader)
                .all(|&v| self.may_wipe(v))
        {
            return;
        }
        let term = self.c.node(leader).status().term;
        self.c.paused.insert(leader);
        self.cut_off_but(leader, &[]);
        self.event(format!(
            "leader {leader} (term {term}) sleeps, cut off, until another node commits past \
             its log"
        ));
        self.episode = Some(Episode::WokenBesideNewDisk {
            leader,
            term,
            woken: None,
            until_ns: self.now() + ELECTION_WAIT_NS,
        });
    }

    /// [`Episode::WokenBesideNewDisk`]: while `leader` sleeps, the new leader takes appends
    /// until its commit index passes `leader`'s log; then the other follower restarts on a
    /// new disk, the new leader is cut off and `leader` wakes beside the new disk's node,
    /// taking appends until the episode ends with every link healed.
    fn advance_woken_beside_new_disk(
        &mut self,
        leader: u64,
        term: u64,
        woken: Option<u64>,
        until_ns: u64,
    ) -> Result<(), Violation> {
        let now = self.now();
        if woken.is_some() {
            if now >= until_ns || !self.live().contains(&leader) {
                self.episode = None;
                self.heal_links();
            } else {
                self.load(leader);
            }
            return Ok(());
        }
        let old_last = self.status_of(leader).map(|s| s.last_index);
        match (old_last, self.new_leader(leader, term)) {
            (Some(last), Some((l, commit))) if commit > last => {
                let wiped = self
                    .members()
                    .into_iter()
                    .find(|&m| m != leader && m != l)
                    .filter(|&m| self.live().contains(&m) && self.may_wipe(m));
                let Some(wiped) = wiped else {
                    return self.give_up_woken(leader);
                };
                self.event(format!(
                    "node {l} leads and committed {commit}, past node {leader}'s last index \
                     {last}"
                ));
                self.crash(wiped, false);
                self.restart_on_new_disk(wiped)?;
                self.cut_off_but(l, &[]);
                for (a, b) in [(leader, wiped), (wiped, leader)] {
                    self.c.net.set_link(NodeId(a), NodeId(b), true);
                }
                self.fault(
                    Fault::WokenBesideNewDisk,
                    format!(
                        "node {l} is cut off; node {leader} wakes with a link to node {wiped} \
                         only"
                    ),
                );
                self.episode = Some(Episode::WokenBesideNewDisk {
                    leader,
                    term,
                    woken: Some(wiped),
                    until_ns: now + (5 + self.wipes_episode_rng.below(26)) * STEP_NS,
                });
                self.resume(leader)?;
            }
            (Some(_), Some((l, _))) if now < until_ns => self.load(l),
            (Some(_), _) if now < until_ns => {}
            // No new leader in time, or the sleeping leader is gone: give up.
            _ => self.give_up_woken(leader)?,
        }
        Ok(())
    }

    /// Abandons an [`Episode::WokenBesideNewDisk`] before its wake: heals every link and
    /// wakes the sleeping leader.
    fn give_up_woken(&mut self, leader: u64) -> Result<(), Violation> {
        self.episode = None;
        self.heal_links();
        if self.c.paused.contains(&leader) {
            self.resume(leader)?;
        }
        Ok(())
    }

    /// Starts an [`Episode::StaleTicket`] on the leader of five voters, if every node is up
    /// and awake: A's messages to every follower but X are held on the wire from now on
    /// (theirs to it still arrive, until A's operations on those connections time out), X is
    /// cut off from the three others, and a client appends on A.
    fn start_stale_ticket(&mut self) {
        let Some(a) = self.episode_leader() else {
            return;
        };
        let s = self.c.node(a).status();
        if s.voters.len() != 5 || self.c.nodes.len() != 5 {
            return;
        }
        let others: Vec<u64> = s.voters.iter().copied().filter(|&v| v != a).collect();
        let x = others[self.stale_episode_rng.below(others.len() as u64) as usize];
        for &o in others.iter().filter(|&&o| o != x) {
            self.c.net.set_extra_delay(NodeId(a), NodeId(o), HELD_NS);
            self.c.net.set_link(NodeId(x), NodeId(o), false);
            self.c.net.set_link(NodeId(o), NodeId(x), false);
        }
        self.event(format!(
            "leader {a} (term {}) reaches follower {x} only; {x} is cut off from the others",
            s.term
        ));
        self.episode = Some(Episode::StaleTicket(Stale {
            leader: a,
            term: s.term,
            x,
            first_stale: 0,
            winner: 0,
            phase: StalePhase::Reach,
            until_ns: self.now() + 10 * STEP_NS,
        }));
        self.load(a);
    }

    /// [`Episode::StaleTicket`], one step (see [`StalePhase`]).
    fn advance_stale_ticket(&mut self, mut st: Stale) -> Result<(), Violation> {
        let Stale {
            leader: a,
            term,
            x,
            ref mut first_stale,
            ref mut winner,
            ref mut phase,
            ref mut until_ns,
        } = st;
        let now = self.now();
        let electors: Vec<u64> = self
            .members()
            .into_iter()
            .filter(|&m| m != a && m != x)
            .collect();
        let next = match *phase {
            StalePhase::Reach => {
                let (Some(sa), Some(sx)) = (self.status_of(a), self.status_of(x)) else {
                    return self.end_stale_ticket(a, &electors);
                };
                let others_last = electors
                    .iter()
                    .filter_map(|&o| self.status_of(o))
                    .map(|s| s.last_index)
                    .max()
                    .unwrap_or(0);
                if sa.last_index > others_last && sx.last_index >= sa.last_index {
                    *first_stale = others_last + 1;
                    self.cut_off_but(x, &[]);
                    for &i in &electors {
                        for &j in electors.iter().filter(|&&j| j != i) {
                            self.c.net.set_extra_delay(
                                NodeId(i),
                                NodeId(j),
                                STALE_ELECTORS_DELAY_NS,
                            );
                        }
                    }
                    self.event(format!(
                        "node {x} holds node {a}'s entries from {} to {}, which the others \
                         lack; it is cut off from {a} too",
                        *first_stale, sa.last_index
                    ));
                    Some((StalePhase::Elect, now + ELECTION_WAIT_NS))
                } else {
                    None
                }
            }
            StalePhase::Elect => {
                let w = electors.iter().copied().find(|&o| {
                    self.status_of(o)
                        .is_some_and(|s| s.role == Role::Leader && s.term > term)
                });
                match w {
                    Some(w) => {
                        *winner = w;
                        for &o in electors.iter().filter(|&&o| o != w) {
                            self.c.net.set_link(NodeId(w), NodeId(o), false);
                            self.c.net.set_link(NodeId(o), NodeId(w), false);
                        }
                        self.event(format!(
                            "node {w} leads; it is cut off from the two others at once"
                        ));
                        Some((StalePhase::Replace, now + 20 * STEP_NS))
                    }
                    None => None,
                }
            }
            StalePhase::Replace => {
                let replaced = self
                    .c
                    .nodes
                    .get(&a)
                    .and_then(Option::as_ref)
                    .is_some_and(|r| {
                        self.c.disks[&a].without_read_faults(|| r.persisted_term(*first_stale))
                            != Some(term)
                    });
                if replaced {
                    let w = *winner;
                    self.fault(
                        Fault::ReplacedOnOldLeader,
                        format!(
                            "node {w}'s entry replaced node {a}'s at {} on {a} only; {w} dies, \
                             {a} is cut off, {x} rejoins the two others",
                            *first_stale
                        ),
                    );
                    if self.live().contains(&w) {
                        self.kill(w);
                    }
                    self.cut_off_but(a, &[]);
                    for &o in electors.iter().filter(|&&o| o != w) {
                        self.c.net.set_link(NodeId(x), NodeId(o), true);
                        self.c.net.set_link(NodeId(o), NodeId(x), true);
                    }
                    self.clear_delays(&electors);
                    Some((StalePhase::Recommit, now + ELECTION_WAIT_NS))
                } else {
                    None
                }
            }
            StalePhase::Recommit => {
                let done = self
                    .status_of(x)
                    .is_some_and(|s| s.role == Role::Leader && s.commit >= *first_stale);
                if done {
                    self.event(format!(
                        "node {x} leads and committed past {}",
                        *first_stale
                    ));
                    return self.end_stale_ticket(a, &electors);
                }
                None
            }
        };
        match next {
            Some((p, until)) => {
                *phase = p;
                *until_ns = until;
                self.episode = Some(Episode::StaleTicket(st));
            }
            // The step it waited for did not come in time: give up.
            None if now >= *until_ns => return self.end_stale_ticket(a, &electors),
            None => {
                if *phase == StalePhase::Reach {
                    self.load(a);
                }
            }
        }
        Ok(())
    }

    /// Ends an [`Episode::StaleTicket`]: every link heals, the electors' delays go, and A's
    /// connections to them break, with what A's messages held on them.
    fn end_stale_ticket(&mut self, a: u64, electors: &[u64]) -> Result<(), Violation> {
        self.episode = None;
        self.clear_delays(electors);
        for &o in electors {
            self.c.net.set_extra_delay(NodeId(a), NodeId(o), 0);
            self.c.net.break_connection_and_wires(NodeId(a), NodeId(o));
        }
        self.heal_links();
        Ok(())
    }

    /// Starts an [`Episode::StoppedInstall`], if every node is up and awake, the leader counts
    /// fewer than five voters, and no other membership change, removal or lost disk is in the
    /// way: kills a follower and has the leader add a node.
    fn start_stopped_install(&mut self) -> Result<(), Violation> {
        let Some(l) = self.episode_leader() else {
            return Ok(());
        };
        let s = self.c.node(l).status();
        if s.voters.len() >= 5
            || s.commit < s.last_index
            || !self.removed.is_empty()
            || !self.lost.is_empty()
            || self.rotted.keys().any(|id| !self.retired.contains(id))
        {
            return Ok(());
        }
        let followers: Vec<u64> = s.voters.iter().copied().filter(|&v| v != l).collect();
        let f = followers[self.install_episode_rng.below(followers.len() as u64) as usize];
        let last = self.c.node(f).status().last_index;
        self.kill(f);
        let added = self.next_node;
        self.next_node += 1;
        self.c
            .add_node(added)
            .map_err(|e| format!("cannot add node {added}: {e}"))?;
        if let Err(e) = self.c.node(l).change_membership(added, true) {
            self.event(format!("leader {l} cannot add node {added}: {e}"));
            return self.restart(f);
        }
        self.fault(
            Fault::AddVoter,
            format!("leader {l} adds node {added} while follower {f} (last index {last}) is down"),
        );
        self.episode = Some(Episode::StoppedInstall(Install {
            leader: l,
            follower: f,
            added,
            last,
            phase: InstallPhase::Grow,
            until_ns: self.now() + ELECTION_WAIT_NS,
        }));
        Ok(())
    }

    /// [`Episode::StoppedInstall`], one step (see [`InstallPhase`]).
    fn advance_stopped_install(&mut self, i: Install) -> Result<(), Violation> {
        let Install {
            leader,
            follower,
            added,
            last,
            phase,
            until_ns,
        } = i;
        let now = self.now();
        let status = self.status_of(leader);
        match phase {
            InstallPhase::Grow => {
                let Some(s) = status.filter(|s| s.role == Role::Leader) else {
                    return self.end_stopped_install(follower);
                };
                if s.voters.contains(&added) && s.applied > s.conf_index {
                    self.checkpoint(leader);
                    let first = self.c.node(leader).first_index();
                    if first > last + 1 {
                        self.restart(follower)?;
                        if self.c.nodes.get(&follower).is_some_and(Option::is_some) {
                            self.c.disks[&follower].fail_next_sync_of("raft-state.tmp");
                            self.event(format!(
                                "node {follower} restarts behind node {leader}'s log (first \
                                 index {first}); its next write of raft-state fails"
                            ));
                            self.episode = Some(Episode::StoppedInstall(Install {
                                phase: InstallPhase::Install,
                                until_ns: now + ELECTION_WAIT_NS,
                                ..i
                            }));
                            return Ok(());
                        }
                        return self.end_stopped_install(follower);
                    }
                }
                if now >= until_ns {
                    return self.end_stopped_install(follower);
                }
                self.load(leader);
            }
            InstallPhase::Install => {
                if self.down.contains(&follower) {
                    self.fault(
                        Fault::InstallStopped,
                        format!("node {follower} stopped inside its snapshot install"),
                    );
                    return self.end_stopped_install(follower);
                }
                if now >= until_ns {
                    self.episode = None;
                }
            }
        }
        Ok(())
    }

    /// Ends an [`Episode::StoppedInstall`]: the follower restarts if it is down.
    fn end_stopped_install(&mut self, follower: u64) -> Result<(), Violation> {
        self.episode = None;
        if self.down.contains(&follower) {
            self.restart(follower)?;
        }
        Ok(())
    }

    /// When the faults stop: an [`Episode::StaleTicket`] still in progress breaks A's
    /// connections that hold its messages (the repair heals the links and clears the delays,
    /// but a wire stays FIFO behind what it holds). The other episodes need nothing beyond
    /// the repair.
    pub(crate) fn end_episode_at_repair(&mut self) -> Result<(), Violation> {
        match self.episode.take() {
            Some(Episode::StaleTicket(Stale { leader, x, .. })) => {
                let electors: Vec<u64> = self
                    .members()
                    .into_iter()
                    .filter(|&m| m != leader && m != x)
                    .collect();
                self.end_stale_ticket(leader, &electors)
            }
            _ => Ok(()),
        }
    }

    /// Removes the extra delays between `nodes`.
    fn clear_delays(&mut self, nodes: &[u64]) {
        for &i in nodes {
            for &j in nodes.iter().filter(|&&j| j != i) {
                self.c.net.set_extra_delay(NodeId(i), NodeId(j), 0);
            }
        }
    }

    fn advance_episode(&mut self, e: Episode) -> Result<(), Violation> {
        let now = self.now();
        match e {
            Episode::StaleTicket(st) => return self.advance_stale_ticket(st),
            Episode::StoppedInstall(i) => return self.advance_stopped_install(i),
            Episode::WokenBesideNewDisk {
                leader,
                term,
                woken,
                until_ns,
            } => return self.advance_woken_beside_new_disk(leader, term, woken, until_ns),
            Episode::Deposed {
                leader,
                term,
                healed,
                until_ns,
            } => return self.advance_deposed(leader, term, healed, until_ns),
            Episode::Stalled {
                leader,
                stalled,
                until_ns,
            } => {
                if now >= until_ns {
                    self.end_episode(Some(leader), &stalled)?;
                } else {
                    self.load(leader);
                }
            }
            Episode::Reelection {
                leader,
                stalled,
                other,
                term,
                phase,
                until_ns,
            } => {
                let leads = |run: &Self, id: u64| {
                    run.status_of(id)
                        .is_some_and(|s| s.role == Role::Leader && s.term > term)
                };
                let next = match phase {
                    Phase::Away if leads(self, other) => {
                        self.c.node(other).transfer_leader(leader);
                        self.event(format!("node {other} leads; it hands back to {leader}"));
                        Some((Phase::Back, now + ELECTION_WAIT_NS))
                    }
                    Phase::Back if leads(self, leader) => {
                        self.cut_off_but(leader, &stalled);
                        self.event(format!(
                            "node {leader} leads again; it is cut off from all but the \
                             sleeping {stalled:?}"
                        ));
                        Some((Phase::Cut, now + (2 + self.episode_rng.below(9)) * STEP_NS))
                    }
                    _ if now < until_ns => {
                        if phase == Phase::Cut {
                            self.load(leader);
                        }
                        None
                    }
                    Phase::Cut => return self.end_episode(Some(leader), &stalled),
                    // An election that did not happen in time: give up.
                    _ => return self.end_episode(None, &stalled),
                };
                if let Some((next_phase, next_until)) = next {
                    if let Some(Episode::Reelection {
                        phase, until_ns, ..
                    }) = &mut self.episode
                    {
                        *phase = next_phase;
                        *until_ns = next_until;
                    }
                }
            }
        }
        Ok(())
    }

    /// Ends the episode: kills `kill` (its leader), heals every link, wakes the followers.
    fn end_episode(&mut self, kill: Option<u64>, stalled: &[u64]) -> Result<(), Violation> {
        self.episode = None;
        if let Some(l) = kill.filter(|l| self.live().contains(l)) {
            self.kill(l);
        }
        self.heal_links();
        for &f in stalled {
            if self.options.clean_stops && self.live().contains(&f) {
                // Stopped cleanly while its NIC held what the leader counted: the close
                // must take it (mutation `close-without-fence`).
                self.stop(f);
                self.restart(f)?;
            } else if self.c.paused.contains(&f) {
                self.resume(f)?;
            }
        }
        Ok(())
    }

    /// Client load on the episode's leader: a new append every step, whatever the clients'
    /// earlier attempts wait for.
    fn load(&mut self, leader: u64) {
        if self.live().contains(&leader) {
            self.start_op_on(leader);
        }
    }

    /// The node leading a term above `term` other than `old`, if one does, and its commit
    /// index.
    fn new_leader(&self, old: u64, term: u64) -> Option<(u64, u64)> {
        let l = self.leader().filter(|&l| l != old)?;
        let s = self.status_of(l)?;
        (s.term > term).then_some((l, s.commit))
    }

    /// Blocks every link between `node` and the other members, both ways, except those of
    /// `but`.
    fn cut_off_but(&mut self, node: u64, but: &[u64]) {
        for m in self.members() {
            if m != node && !but.contains(&m) {
                self.c.net.set_link(NodeId(node), NodeId(m), false);
                self.c.net.set_link(NodeId(m), NodeId(node), false);
            }
        }
    }
}
