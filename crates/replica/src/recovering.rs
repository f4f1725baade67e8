//! The amnesia guard: what a node does after a start that lost entries it may have
//! acknowledged (ARCHITECTURE.md, "Recovering after a machine crash"; docs/FORMAT.md,
//! section 10).
//!
//! Under `Durability::Memory` a follower acknowledges an entry once it is in its shared-memory
//! ring, before any fdatasync. A machine crash (or a ring moved aside) takes those entries
//! with it, while the node's term and vote survive on disk. Voting as if nothing happened
//! breaks raft's quorum intersection: the entries may be committed on a majority that counted
//! this node, and this node plus the ones that never had them can elect a leader without
//! them.
//!
//! The protocol:
//! 1. Before a process uses a shared-memory ring it writes `ring_in_use` into the raft-state
//!    file (fdatasync); only a clean close that left the segment files holding everything
//!    clears it. A start that finds the mark and no ring knows it lost state.
//! 2. Every acknowledgement this node may have lost was given in a term at or below its
//!    persisted term `t` (raft-state is durable before any message of a term leaves). The
//!    node records `recovering_above_term = t` and moves its own term to `t + 1` with no vote,
//!    in the same durable write. The higher term makes a leader of `t` step down on the
//!    node's first answer, so no leader of `t` (the only one that could still count this
//!    node's lost acknowledgements) goes on leading.
//! 3. While recovering the node never votes (vote and pre-vote requests are dropped), never
//!    campaigns (its election timer does not run, `MsgTimeoutNow` is dropped, and
//!    [`crate::Replica::campaign`] refuses), and appends and acknowledges only what a leader
//!    of a term above `t` sends it: acknowledgements of entries it really holds, which are
//!    safe to count.
//! 4. It leaves recovery once its commit index covers an entry of a term above `t`. That
//!    entry was proposed by a leader of a term above `t`, elected without this node's vote;
//!    the intersection of that election's quorum with the quorum of any entry committed with
//!    this node's lost acknowledgement puts the entry in that leader's log, below its first
//!    entry of its own term, and so below this node's commit index. Everything this node may
//!    have acknowledged and that is or will be committed is then in its log.
//!
//! A recovering node with no leader to learn from waits, and says so in its status: when a
//! majority of voters lost their rings at once, acknowledged entries may be gone from every
//! copy, and the cluster stalls rather than serve a log without them.
//!
//! A whole data dir lost (emptied, or replaced by a new disk) takes the term and vote too, so
//! a start on a new data dir cannot tell a member that lost everything from the cluster's
//! first start. Such a node starts [`Unproven`]: it neither votes nor campaigns (as in 3), steps
//! no raft message at all (its term went back: it would acknowledge a deposed leader), and
//! asks every other voter of the newest membership it hears of for its current term. Every vote or
//! acknowledgement this node gave that counted (an election won, an entry committed) was
//! counted by a quorum whose other members made that term durable first, and terms only
//! grow; so once all of them answered, their highest term `t` bounds every term this node may
//! have voted or acknowledged in (unless a majority lost their data dirs: beyond what any
//! copy can restore). `t = 0` (its own term 0 too) means no member ever voted: a first start, and the node is a
//! normal voter. Otherwise it goes on as in 2, recovering above `t`, with its own term moved
//! to `t + 1` in one durable write. The flag is durable from the data dir's first write, so
//! a crash while unproven comes back unproven.

use std::collections::BTreeMap;

use raft::prelude::{HardState, MessageType};

use crate::storage::Guard;

/// Step 2 of the protocol, on the state about to be written: moves `hs` past `lost_term` (term
/// `lost_term + 1`, no vote) and returns `guard` recording it; both go in one durable write.
pub fn move_past(hs: &mut HardState, lost_term: u64, guard: Guard) -> Guard {
    hs.term = lost_term + 1;
    hs.vote = 0;
    Guard {
        recovering_above_term: Some(lost_term),
        ..guard
    }
}

/// The state of a node recovering from lost acknowledgements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Recovering {
    /// Every acknowledgement this node may have lost was given at or below this term.
    pub lost_term: u64,
    /// What this process found at its start.
    pub cause: LostRing,
}

/// Why a node is recovering, as the process that runs it saw at its start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LostRing {
    /// The shared-memory ring it used was gone: a machine crash, or the file moved aside.
    Missing,
    /// Its ring held records past the segment files that failed their checks (torn or
    /// damaged memory): the records were not taken.
    Corrupt,
    /// An earlier process of this data dir found one of the above; this one started while the
    /// node was still recovering (the state file records the term, not the cause).
    Earlier,
    /// The data dir was new at this node's start, and other voters answered terms above 0: it
    /// may be a member whose data dir was emptied or replaced (see [`Unproven`]).
    NewDataDir,
}

impl LostRing {
    fn says(self) -> &'static str {
        match self {
            LostRing::Missing => {
                "the shared-memory ring it used before was gone (a machine crash, or the file was moved aside)"
            }
            LostRing::Corrupt => {
                "the shared-memory ring it used before held records past its segment files that failed their checks (torn or damaged memory), and they were not taken"
            }
            LostRing::Earlier => {
                "an earlier start of this data dir found that it had lost state (its shared-memory ring, or the whole data dir), and this process started while the node was still recovering"
            }
            LostRing::NewDataDir => {
                "its data dir was new at its start while other voters had terms above 0 (the data dir of a member that was emptied or replaced, or a member that started after the others had elected)"
            }
        }
    }
}

impl Recovering {
    /// Whether a recovering node must drop a message of type `t` rather than step it: the
    /// requests that would make it vote or campaign.
    pub fn refuses(t: MessageType) -> bool {
        matches!(
            t,
            MessageType::MsgRequestVote
                | MessageType::MsgRequestPreVote
                | MessageType::MsgTimeoutNow
                | MessageType::MsgHup
        )
    }

    /// Whether the node has caught up: `commit_term` is the term of the entry at its commit
    /// index.
    pub fn caught_up(&self, commit_term: u64) -> bool {
        commit_term > self.lost_term
    }

    /// Why the node does not vote yet and what it waits for, as a sentence for `status`.
    pub fn reason(&self, leader: Option<u64>, commit: u64) -> String {
        let waiting = match leader {
            Some(l) => format!(
                "catching up from leader {l} (commit index {commit}); it rejoins once it has committed an entry of a term above {}",
                self.lost_term
            ),
            None => format!(
                "waiting for a leader of a term above {} to learn from; if a majority of voters lost their rings together, acknowledged entries may be gone from every copy and the cluster stays stalled",
                self.lost_term
            ),
        };
        format!(
            "recovering: {}, so this node may have lost entries it acknowledged in term {} or earlier; it does not vote or campaign until it has caught up; {waiting}",
            self.cause.says(),
            self.lost_term
        )
    }
}

/// A node whose data dir was new at its start, until every other voter of the newest
/// membership it knows of has told it its term (see the module's documentation). That
/// membership is the configured one until an answer reports a newer one: each answer carries
/// the membership its sender applied and the log index it is as of, and the newest wins (a
/// stale configuration, or one the cluster changed since, is left behind as soon as one current
/// member answers). The log the node replays is not used: it passes through older memberships,
/// and one in which the node was alone would leave nobody to wait for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unproven {
    me: u64,
    /// The membership waited for: the index it is as of (0: the configured one) and its voters.
    wait: (u64, Vec<u64>),
    /// Every node that answered, with the highest term it answered.
    answered: BTreeMap<u64, u64>,
}

/// What the answers of every other voter decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proven {
    /// Every other voter, and this node, are at term 0: no member ever voted, this is the
    /// cluster's first start.
    FirstStart,
    /// The highest term answered (or this node's own, if higher): this node may have voted or
    /// acknowledged in any term up to it.
    Above(u64),
}

impl Unproven {
    /// Node `me` with `voters` as its configured membership; `None` when it is the only voter
    /// (nothing to ask; a single node that lost its data dir lost the whole log anyway).
    pub fn new(me: u64, voters: &[u64]) -> Option<Self> {
        voters.iter().any(|&v| v != me).then(|| Unproven {
            me,
            wait: (0, voters.to_vec()),
            answered: BTreeMap::new(),
        })
    }

    /// The voters that have not answered yet.
    pub fn waiting_for(&self) -> impl Iterator<Item = u64> + '_ {
        self.wait
            .1
            .iter()
            .copied()
            .filter(|&v| v != self.me && !self.answered.contains_key(&v))
    }

    /// The other voters of the membership waited for, answered or not.
    pub fn others(&self) -> impl Iterator<Item = u64> + '_ {
        self.wait.1.iter().copied().filter(|&v| v != self.me)
    }

    /// Whether `peer` has answered.
    pub fn answered(&self, peer: u64) -> bool {
        self.answered.contains_key(&peer)
    }

    /// Records `peer`'s answer: its term, and the membership it applied, as of `conf_as_of`.
    /// Any node's answer counts (every answer was given after this node lost its data dir);
    /// a newer membership replaces the one waited for.
    pub fn answer(&mut self, peer: u64, term: u64, conf_as_of: u64, voters: &[u64]) {
        let t = self.answered.entry(peer).or_insert(term);
        *t = (*t).max(term);
        if conf_as_of > self.wait.0 && !voters.is_empty() {
            self.wait = (conf_as_of, voters.to_vec());
        }
    }

    /// The verdict once every other voter has answered; `own_term` is this node's current
    /// term (a leader's message may have raised it meanwhile).
    pub fn verdict(&self, own_term: u64) -> Option<Proven> {
        if self.waiting_for().next().is_some() {
            return None;
        }
        let top = self
            .answered
            .values()
            .copied()
            .max()
            .unwrap_or(0)
            .max(own_term);
        Some(match top {
            0 => Proven::FirstStart,
            t => Proven::Above(t),
        })
    }

    /// Why the node does not vote yet, as a sentence for `status`.
    pub fn reason(&self) -> String {
        let waiting: Vec<String> = self.waiting_for().map(|v| v.to_string()).collect();
        format!(
            "unproven: this node's data dir was new at its start, which cannot be told from a member whose data dir was emptied or replaced; it does not vote or campaign until every other voter has told it its term (waiting for {}): all at term 0 means the cluster's first start, else it rejoins recovering above the highest term",
            waiting.join(", ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_only_what_would_make_it_vote_or_campaign() {
        for t in [
            MessageType::MsgRequestVote,
            MessageType::MsgRequestPreVote,
            MessageType::MsgTimeoutNow,
        ] {
            assert!(Recovering::refuses(t), "{t:?}");
        }
        for t in [
            MessageType::MsgAppend,
            MessageType::MsgHeartbeat,
            MessageType::MsgSnapshot,
            MessageType::MsgRequestVoteResponse,
        ] {
            assert!(!Recovering::refuses(t), "{t:?}");
        }
    }

    #[test]
    fn caught_up_needs_a_commit_of_a_later_term() {
        let r = Recovering {
            lost_term: 4,
            cause: LostRing::Missing,
        };
        assert!(!r.caught_up(3));
        assert!(!r.caught_up(4));
        assert!(r.caught_up(5));
        assert!(r.reason(None, 0).contains("waiting for a leader"));
        assert!(r.reason(Some(2), 9).contains("leader 2"));
    }

    #[test]
    fn the_reason_names_what_the_start_found() {
        let with = |cause| {
            Recovering {
                lost_term: 7,
                cause,
            }
            .reason(None, 0)
        };
        assert!(with(LostRing::Missing).contains("was gone (a machine crash"));
        assert!(with(LostRing::Corrupt).contains("failed their checks"));
        assert!(with(LostRing::Earlier).contains("an earlier start"));
        assert!(with(LostRing::NewDataDir).contains("emptied or replaced"));
        for c in [
            LostRing::Missing,
            LostRing::Corrupt,
            LostRing::Earlier,
            LostRing::NewDataDir,
        ] {
            assert!(with(c).contains("in term 7 or earlier"), "{c:?}");
        }
    }

    #[test]
    fn unproven_waits_for_every_other_voter_and_takes_the_highest_term() {
        assert_eq!(Unproven::new(1, &[1]), None);
        let mut u = Unproven::new(2, &[1, 2, 3]).unwrap();
        assert_eq!(u.waiting_for().collect::<Vec<_>>(), vec![1, 3]);
        assert!(u.reason().contains("waiting for 1, 3"));
        u.answer(1, 5, 0, &[1, 2, 3]);
        assert_eq!(u.verdict(0), None);
        // A node outside the membership counts toward the bound, not the wait; a lower second
        // answer keeps the higher.
        u.answer(4, 9, 0, &[1, 2, 3]);
        u.answer(1, 0, 0, &[1, 2, 3]);
        assert_eq!(u.verdict(0), None);
        u.answer(3, 2, 0, &[1, 2, 3]);
        assert_eq!(u.verdict(0), Some(Proven::Above(9)));
        let mut first = Unproven::new(1, &[1, 2, 3]).unwrap();
        first.answer(2, 0, 0, &[1, 2, 3]);
        first.answer(3, 0, 0, &[1, 2, 3]);
        assert_eq!(first.verdict(0), Some(Proven::FirstStart));
        // Its own term above 0 means some leader or candidate reached it: not a first start.
        assert_eq!(first.verdict(1), Some(Proven::Above(1)));
    }

    #[test]
    fn unproven_waits_for_the_newest_membership_an_answer_reports() {
        // Configured with 1, 2, 3; the cluster has since removed 1 and 2 and added 4 and 5.
        let mut u = Unproven::new(3, &[1, 2, 3]).unwrap();
        u.answer(4, 7, 40, &[3, 4, 5]);
        assert_eq!(u.waiting_for().collect::<Vec<_>>(), vec![5]);
        // An older membership (a lagging node's) does not replace the newer one.
        u.answer(2, 3, 10, &[2, 3]);
        assert_eq!(u.waiting_for().collect::<Vec<_>>(), vec![5]);
        u.answer(5, 6, 40, &[3, 4, 5]);
        assert_eq!(u.verdict(0), Some(Proven::Above(7)));
    }
}
