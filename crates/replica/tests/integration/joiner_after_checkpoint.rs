//! Scenario: a node added after the leader's latest checkpoint, whose log no longer starts at
//! 1, catches up from that checkpoint. The checkpoint records the membership as of its index,
//! which lacks the new node, and raft-rs refuses to restore a snapshot whose membership lacks
//! the receiver: before the fix the new node was sent the snapshot forever and never joined
//! (found by simulator seed 524). The leader now sends it as a learner of the snapshot's
//! membership; it becomes a voter when it replays the entry that added it.
//!
//! Method: a 3-node `SimCluster` with small segments; the leader checkpoints (deleting whole
//! segments), then adds node 4 with `change_membership`; node 4 must commit the whole log
//! and count as a voter.

use fabric::sim::SimConfig;
use replica::ReplicaConfig;
use replica::sim::SimCluster;

#[test]
fn a_node_added_after_a_checkpoint_catches_up_from_it() {
    let mut c = SimCluster::new(3, 51, SimConfig::default(), |cfg: &mut ReplicaConfig| {
        cfg.segment_bytes = 512 << 10;
    })
    .unwrap();
    let leader = c.elect().unwrap();
    for i in 0..200u32 {
        c.append(&[i as u8; 3000]).unwrap();
    }
    let applied = c.node(leader).status().applied;
    let first = c.node(leader).checkpoint(applied, b"state").unwrap();
    assert!(
        first > 1,
        "the checkpoint must delete segments, or this test proves nothing"
    );
    c.add_node(4).unwrap();
    let t = c.node(leader).change_membership(4, true).unwrap();
    c.wait(leader, t).unwrap();
    let last = c.append(b"after").unwrap();
    let joined = c
        .run_until(30_000_000_000, |c| c.node(4).status().commit >= last)
        .unwrap();
    let s = c.node(4).status();
    assert!(joined, "node 4 never caught up: {s:?}");
    assert_eq!(s.stats.snapshots_installed, 1);
    assert!(
        s.voters.contains(&4),
        "node 4 is not a voter: {:?}",
        s.voters
    );
    assert_eq!(c.node(4).latest_checkpoint().unwrap().state, b"state");
}
