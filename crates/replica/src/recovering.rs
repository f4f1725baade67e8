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

use raft::prelude::MessageType;

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
                "an earlier start of this data dir found its shared-memory ring gone or failing its checks, and this process started while the node was still recovering"
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
        for c in [LostRing::Missing, LostRing::Corrupt, LostRing::Earlier] {
            assert!(with(c).contains("in term 7 or earlier"), "{c:?}");
        }
    }
}
