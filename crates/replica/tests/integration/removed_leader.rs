//! Scenario: a leader removes itself from the voters. Once it applies the change it steps
//! down (raft-rs would keep it leading with no progress of its own, and panic at the next
//! response it steps: simulator seed 10,500,953 of `--durability fsync`, where a removed node
//! won an election before it applied its own removal); the two voters left elect a leader
//! among them and go on committing. With `Mutation::RemovedLeaderLeads` the removed node
//! still leads after applying the change.

use fabric::sim::SimConfig;
use replica::sim::SimCluster;
use replica::{Mutation, ReplicaConfig, Role};

/// Removes the leader from a three-node cluster and runs until it applied the change: the
/// cluster, the removed node, and the removed node's role then.
fn remove_the_leader(mutation: Mutation) -> (SimCluster, u64, Role) {
    let mut c = SimCluster::new(3, 23, SimConfig::default(), |cfg: &mut ReplicaConfig| {
        cfg.mutation = mutation;
    })
    .unwrap();
    let leader = c.elect().unwrap();
    for i in 0..5u32 {
        c.append(&i.to_le_bytes()).unwrap();
    }
    let t = c.node(leader).change_membership(leader, false).unwrap();
    // Step by hand until the leader applied its removal, before any tick can move things on.
    let mut applied = false;
    for _ in 0..10_000 {
        c.net.step();
        c.process_all().unwrap();
        if c.node(leader).status().applied >= t.index {
            applied = true;
            break;
        }
    }
    assert!(applied, "the leader never applied its removal");
    assert!(!c.node(leader).status().voters.contains(&leader));
    let role = c.node(leader).status().role;
    (c, leader, role)
}

#[test]
fn a_leader_that_applies_its_own_removal_steps_down() {
    let (mut c, gone, role) = remove_the_leader(Mutation::None);
    assert_ne!(role, Role::Leader, "the removed node still leads");
    // The others elect a leader of their own and commit without the removed node.
    let ok = c
        .run_until(10_000_000_000, |c| c.leader().is_some_and(|l| l != gone))
        .unwrap();
    assert!(ok, "no voter of the new configuration took over");
    let leader = c.leader().unwrap();
    let t = c.node(leader).propose(b"after the removal").unwrap();
    assert_eq!(c.wait(leader, t).unwrap(), t.index);
    assert_eq!(c.node(leader).status().voters.len(), 2);
}

/// The control: without the step-down the removed node goes on leading.
#[test]
fn without_the_step_down_the_removed_leader_leads_on() {
    let (_, _, role) = remove_the_leader(Mutation::RemovedLeaderLeads);
    assert_eq!(role, Role::Leader);
}
