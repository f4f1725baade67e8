//! Scenario (issue 14): under `Replicated`, a leader whose pipeline is empty proposes ahead of
//! raft (`node::direct`): the entry goes into its ring and the writes into its followers'
//! rings before raft-rs hears of it, and a caller's pass resolves the ticket at the write
//! completion that makes the quorum, the leader counted by its own ring. Raft takes the entry
//! at the index it was given in the next ordinary pass, and its own appends of it are not sent
//! again. Where raft would not take a proposal (a leadership transfer in progress), or the
//! durability is not `Replicated`, the proposal takes raft's path.

use fabric::sim::SimConfig;
use replica::sim::SimCluster;
use replica::{Committed, Durability, Mutation, ReplicaConfig, Ticket};

use crate::caller_driven_pass::{cluster_with, drive_until_resolved};

fn cluster(durability: Durability) -> (SimCluster, u64) {
    cluster_with(durability, Mutation::None)
}

/// Drives the leader's caller passes for `t` ([`drive_until_resolved`]): whether `t` committed.
fn resolves(c: &mut SimCluster, leader: u64, t: Ticket) -> bool {
    match drive_until_resolved(c, leader, t) {
        Some(r) => {
            assert_eq!(r.unwrap(), t.index);
            true
        }
        None => false,
    }
}

#[test]
fn a_proposal_ahead_of_raft_commits_at_its_index_and_is_sent_once() {
    let (mut c, leader) = cluster(Durability::Replicated);
    let before = c.node(leader).status();
    let t = c.node(leader).propose(b"ahead of raft").unwrap();
    let s = c.node(leader).status();
    assert_eq!(s.stats.direct_proposals, before.stats.direct_proposals + 1);
    assert_eq!(
        t.index,
        before.last_index + 1,
        "the index raft will give it"
    );
    assert_eq!(s.last_index, t.index, "the log's end counts it");
    assert_eq!(
        s.stats.fast_appends,
        before.stats.fast_appends + 2,
        "written to both followers at once"
    );

    assert!(resolves(&mut c, leader, t), "never resolved");
    let s = c.node(leader).status();
    assert!(
        s.commit < t.index,
        "resolved at the completion, before raft stepped it (commit {})",
        s.commit
    );

    // The next ordinary pass steps it into raft, which commits it there (asserted inside the
    // replica) and does not send its own appends of it.
    c.node(leader).process().unwrap();
    let s = c.node(leader).status();
    assert!(s.commit >= t.index, "{s:?}");
    assert_eq!(s.stats.slow_appends, before.stats.slow_appends);
    assert!(
        s.stats.direct_appends_skipped >= 1,
        "raft's own appends of it were sent again: {:?}",
        s.stats
    );
    let learned = c
        .run_until(1_000_000_000, |c| {
            (1..=3).all(|id| c.node(id).status().applied >= t.index)
        })
        .unwrap();
    assert!(learned, "every node applied it");
    for id in 1..=3 {
        let mut out = Vec::new();
        let got = c.node(id).read(t.index, &mut out).unwrap();
        assert_eq!(
            got,
            Some(Committed::Application { term: t.term }),
            "node {id}"
        );
        assert_eq!(out, b"ahead of raft", "node {id}");
    }
    let after = c.node(leader).status().stats;
    assert_eq!(
        after.fast_appends,
        before.stats.fast_appends + 2,
        "sent once to each follower"
    );
}

/// Proposes on the leader right after it starts handing its leadership over: whether the
/// proposal was refused, and whether it went ahead of raft.
fn propose_during_a_transfer(mutation: Mutation) -> (bool, bool) {
    let (mut c, leader) = cluster_with(Durability::Replicated, mutation);
    let other = (1..=3).find(|&i| i != leader).unwrap();
    c.node(leader).transfer_leader(other);
    let before = c.node(leader).status().stats.direct_proposals;
    let refused = c.node(leader).propose(b"during a transfer").is_err();
    let ahead = c.node(leader).status().stats.direct_proposals > before;
    (refused, ahead)
}

/// raft-rs drops proposals while a transfer is in progress: the proposal is refused, never
/// written ahead of raft (where raft would not take it at its index).
#[test]
fn a_leader_transferring_its_leadership_proposes_through_raft() {
    assert_eq!(propose_during_a_transfer(Mutation::None), (true, false));
}

/// The control: with the check removed (`Mutation::DeferredUnchecked`) the proposal goes
/// ahead of raft and is accepted, though raft will drop it.
#[test]
fn without_the_check_a_proposal_goes_ahead_of_a_transfer() {
    assert_eq!(
        propose_during_a_transfer(Mutation::DeferredUnchecked),
        (false, true)
    );
}

#[test]
fn other_durabilities_never_propose_ahead_of_raft() {
    for d in [Durability::Memory, Durability::Fsync] {
        let (mut c, leader) = cluster(d);
        let t = c.node(leader).propose(b"through raft").unwrap();
        assert_eq!(c.node(leader).status().stats.direct_proposals, 0, "{d}");
        assert!(resolves(&mut c, leader, t), "{d}: never resolved");
    }
}

/// A leader alone has no write to wait for: its proposal takes raft's path, and a caller's
/// passes commit it with no tick (ahead of raft, a caller's pass that sees no event would
/// leave it to the next tick).
#[test]
fn a_leader_alone_proposes_through_raft() {
    let mut c = SimCluster::new(1, 7, SimConfig::default(), |cfg: &mut ReplicaConfig| {
        cfg.durability = Durability::Replicated;
    })
    .unwrap();
    let leader = c.elect().unwrap();
    let t = c.node(leader).propose(b"alone").unwrap();
    assert_eq!(c.node(leader).status().stats.direct_proposals, 0);
    let resolved = (0..10).any(|_| {
        c.node(leader).process_until_resolved(t).unwrap();
        c.node(leader).ticket_status(t).is_some()
    });
    assert!(resolved, "a caller's passes did not commit it");
    assert_eq!(c.node(leader).ticket_status(t).unwrap().unwrap(), t.index);
}

/// A membership change in raft's log, not yet applied, when an append goes ahead of raft and
/// a caller's pass resolves it at its write completions: the leader counted itself by its ring
/// under the configuration before the change, and raft, which counts the leader only at its
/// next `Ready`, applied the change first and counted under the new one, where the same
/// holders are no quorum. The leader's check of its promises then stopped it: a fail-stop on a
/// legal schedule (a membership change under load, callers driving their own waits). While a
/// change in raft's log is not applied, a ticket now waits for raft's commit.
#[test]
fn a_membership_change_between_a_resolution_and_raft_does_not_stop_the_leader() {
    use fabric::NodeId;
    let (mut c, leader) = cluster(Durability::Replicated);
    let followers: Vec<u64> = (1..=3).filter(|&i| i != leader).collect();
    c.add_node(4).unwrap();
    let tc = c.node(leader).change_membership(4, true).unwrap();
    c.node(leader).process().unwrap();
    // Both followers take the change's writes; both completions reach the leader in one batch
    // of a caller's pass, which resolves the change and stops before raft steps them.
    for _ in 0..50 {
        c.net.step();
        for &f in &followers {
            c.node(f).process().unwrap();
        }
    }
    // (Without the rule that pass resolved the change and stopped before raft stepped the
    // completions, the change in its log unapplied; with it, the change's ticket waits for
    // raft's commit, and the pass applies it.)
    c.node(leader).process_until_resolved(tc).unwrap();
    assert_eq!(
        c.node(leader).ticket_status(tc).map(Result::unwrap),
        Some(tc.index)
    );
    let before = c.node(leader).status().stats.direct_proposals;
    let t = c.node(leader).propose(b"x").unwrap();
    assert_eq!(
        c.node(leader).status().stats.direct_proposals,
        before + 1,
        "ahead of raft"
    );
    // One follower's write of it never completes.
    let cut = followers[1];
    c.net.set_link(NodeId(leader), NodeId(cut), false);
    c.net.set_link(NodeId(cut), NodeId(leader), false);
    // Its write into the other follower completes before the leader's next pass, a caller's.
    for _ in 0..50 {
        c.net.step();
        c.node(followers[0]).process().unwrap();
    }
    c.node(leader).process_until_resolved(t).unwrap();
    // Neither the old configuration's quorum (this leader by its ring, one follower) nor
    // the new one's holds it (it panicked at the next pass when it resolved here).
    let early = c.node(leader).ticket_status(t);
    assert!(
        early.is_none(),
        "resolved under a configuration about to change"
    );
    c.node(leader).process().unwrap();
    c.net.set_link(NodeId(leader), NodeId(cut), true);
    c.net.set_link(NodeId(cut), NodeId(leader), true);
    assert_eq!(c.wait(leader, t).unwrap(), t.index);
    assert!(c.node(leader).status().commit >= t.index);
}
