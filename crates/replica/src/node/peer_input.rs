//! What a peer may send raft. raft-rs trusts its peers: a message no correct peer sends can
//! panic it (an append after an index past the log with an entry term of 0, an empty
//! proposal, a snapshot whose membership cannot be restored) or be taken for one of its own
//! (any message of term 0, which can set the term back to 0). Such messages are dropped and
//! counted ([`ReplicaStats::bad_frames`]) before raft sees them; a snapshot's state is checked
//! before raft accepts it, not after. A leadership transfer that reaches a node that no longer
//! leads is a correct peer's (it may not know yet) and is ignored, uncounted: raft-rs would
//! forward it on and panic.

use super::*;

impl<F: Fabric> Replica<F> {
    /// Why a raft message from a peer (outside a snapshot frame) is dropped, if it is. Only
    /// the messages that travel between nodes are taken, each where it can be meant.
    pub(super) fn refuse_raft_message(&self, m: &Message) -> Option<&'static str> {
        use MessageType::*;
        // Proposals made ahead of raft are stepped before any received frame is handled, so
        // raft's log holds every entry a follower can answer for.
        debug_assert!(
            !self.deferred.has_queued(),
            "deferred proposals not stepped"
        );
        let r = &self.raw.raft;
        if m.term == 0 {
            // raft-rs steps a message of term 0 as a local one.
            return Some("a message of term 0");
        }
        match m.get_msg_type() {
            MsgAppend => {
                if m.index > 0 && m.log_term == 0 {
                    // raft-rs gives every index past the log term 0: the append would match.
                    return Some("an append after an entry of term 0");
                }
                if m.index == u64::MAX || m.entries.iter().any(|e| e.term == 0) {
                    return Some("an append with an entry of term 0 or no index after it");
                }
            }
            MsgAppendResponse => {
                if m.index == u64::MAX || m.reject_hint == u64::MAX {
                    return Some("an append response at the last possible index");
                }
                if r.state == StateRole::Leader
                    && m.term == r.term
                    && !m.reject
                    && m.index > r.raft_log.last_index()
                {
                    return Some("an append response past the leader's log");
                }
            }
            MsgHeartbeat
            | MsgHeartbeatResponse
            | MsgRequestVote
            | MsgRequestVoteResponse
            | MsgRequestPreVote
            | MsgRequestPreVoteResponse => {}
            // A follower hands its leader a transfer it was asked for; a node that no longer
            // leads would hand it on with its term set, on which raft-rs panics. Not a
            // peer's fault (it may not know yet): see `ignore_raft_message`.
            MsgTransferLeader | MsgTimeoutNow => {}
            MsgSnapshot => return Some("a snapshot outside a snapshot frame"),
            // Proposals and reads are made on the leader here, never forwarded; the rest
            // are raft's own (MsgHup, MsgBeat, MsgUnreachable, ...).
            _ => return Some("a message raft keeps inside a node"),
        }
        None
    }

    /// Whether a correct peer's raft message is ignored: a leadership transfer that reached a
    /// node that no longer leads (raft-rs would forward it with its term set, and panic).
    pub(super) fn ignore_raft_message(&self, m: &Message) -> bool {
        m.get_msg_type() == MessageType::MsgTransferLeader
            && self.raw.raft.state != StateRole::Leader
    }

    /// Why a snapshot from a peer is dropped, if it is: raft-rs panics on a membership it
    /// cannot restore, and the node would fail stop on a state it cannot install.
    pub(super) fn refuse_snapshot(&self, m: &Message, snap: &Snapshot) -> Option<&'static str> {
        let meta = snap.get_metadata();
        if m.term == 0 || meta.term == 0 || meta.index == 0 || meta.index == u64::MAX {
            return Some("a snapshot of term 0 or index 0 or the last possible index");
        }
        if !restorable(meta.get_conf_state()) {
            return Some("a snapshot whose membership cannot be restored");
        }
        // What `install_snapshot` reads of it: the log position and the session table.
        let sound = snapshot_lsn(snap).is_some_and(|lsn| lsn % 8 == 0)
            && CheckpointData::decode(&snap.data)
                .and_then(|d| d.session_table())
                .is_ok();
        if !sound {
            return Some("a snapshot whose state does not decode");
        }
        None
    }
}

/// Whether raft-rs restores `cs` without an error and to an equal membership: the steps of
/// its `confchange::restore` (not exported), on a scratch tracker.
fn restorable(cs: &ConfState) -> bool {
    use raft::prelude::ConfChangeType::{AddLearnerNode, AddNode, RemoveNode};
    let single = raft_proto::new_conf_change_single;
    let mut tracker = raft::ProgressTracker::new(1);
    let mut incoming: Vec<_> = cs
        .voters_outgoing
        .iter()
        .map(|&id| single(id, RemoveNode))
        .collect();
    incoming.extend(cs.voters.iter().map(|&id| single(id, AddNode)));
    incoming.extend(cs.learners.iter().map(|&id| single(id, AddLearnerNode)));
    incoming.extend(
        cs.learners_next
            .iter()
            .map(|&id| single(id, AddLearnerNode)),
    );
    let applied = if cs.voters_outgoing.is_empty() {
        incoming.iter().try_for_each(|cc| {
            let (cfg, changes) = raft::Changer::new(&tracker).simple(std::slice::from_ref(cc))?;
            tracker.apply_conf(cfg, changes, 1);
            Ok::<(), raft::Error>(())
        })
    } else {
        cs.voters_outgoing
            .iter()
            .try_for_each(|&id| {
                let (cfg, changes) = raft::Changer::new(&tracker).simple(&[single(id, AddNode)])?;
                tracker.apply_conf(cfg, changes, 1);
                Ok::<(), raft::Error>(())
            })
            .and_then(|()| {
                let (cfg, changes) =
                    raft::Changer::new(&tracker).enter_joint(cs.auto_leave, &incoming)?;
                tracker.apply_conf(cfg, changes, 1);
                Ok(())
            })
    };
    applied.is_ok() && raft_proto::conf_state_eq(cs, &tracker.conf().to_conf_state())
}

#[cfg(test)]
mod tests {
    use super::*;
    use raft::prelude::ConfChangeType::{AddLearnerNode, AddNode};

    fn cs(
        voters: &[u64],
        learners: &[u64],
        outgoing: &[u64],
        next: &[u64],
        auto: bool,
    ) -> ConfState {
        let mut c = ConfState::default();
        c.voters = voters.to_vec();
        c.learners = learners.to_vec();
        c.voters_outgoing = outgoing.to_vec();
        c.learners_next = next.to_vec();
        c.auto_leave = auto;
        c
    }

    /// Memberships raft-rs makes pass (a joiner sent a checkpoint as a learner, and a joint
    /// one that raft-rs's own changer built); broken ones do not (each made raft-rs panic).
    #[test]
    fn memberships_raft_makes_pass_and_broken_ones_do_not() {
        assert!(restorable(&cs(&[1, 2, 3], &[], &[], &[], false)));
        assert!(restorable(&cs(&[3, 1, 2], &[], &[], &[], false)));
        assert!(restorable(&cs(&[1, 2, 3], &[4], &[], &[], false)));
        let single = raft_proto::new_conf_change_single;
        let mut t = raft::ProgressTracker::new(1);
        for id in [1, 2, 3] {
            let (cfg, changes) = raft::Changer::new(&t)
                .simple(&[single(id, AddNode)])
                .unwrap();
            t.apply_conf(cfg, changes, 1);
        }
        let (cfg, changes) = raft::Changer::new(&t)
            .enter_joint(true, &[single(4, AddNode), single(3, AddLearnerNode)])
            .unwrap();
        t.apply_conf(cfg, changes, 1);
        let joint = t.conf().to_conf_state();
        assert!(!joint.voters_outgoing.is_empty() && !joint.learners_next.is_empty());
        assert!(restorable(&joint), "{joint:?}");

        assert!(
            !restorable(&cs(&[1, 2, 3], &[], &[], &[], true)),
            "auto_leave, not joint"
        );
        assert!(
            !restorable(&cs(&[1, 2], &[2], &[], &[], false)),
            "a voter and a learner"
        );
        assert!(!restorable(&cs(&[], &[1], &[], &[], false)), "no voters");
        assert!(
            !restorable(&cs(&[1, 2], &[], &[], &[3], false)),
            "learners_next, not joint"
        );
    }
}
