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
use replica::sim::SimCluster;
use replica::{Mutation, ReplicaConfig};

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

/// A follower that falls behind a checkpoint and a membership change installs the snapshot;
/// its write of the new membership fails (or the node stops) right then. It restarted its
/// log at the snapshot before it stored the membership, so the next start found the log
/// holding the snapshot, took the install for finished, and went on with the membership from
/// before: it counted the removed node and ignored the added one, for good (elected by the
/// removed node and itself, it could commit on a minority of the real membership). The
/// membership is now stored first: a stop anywhere in the install leaves the log without the
/// snapshot, and the next start finishes the install.
#[test]
fn a_stop_inside_a_snapshot_install_keeps_the_snapshots_membership() {
    let (voters, want) = voters_after_a_stop_inside_an_install(Mutation::None);
    assert_eq!(voters, want);
}

/// The control: with the log restarted before the membership is stored
/// (`Mutation::MembershipAfterLogRestart`), the same stop leaves the node counting the removed
/// node and not the added one.
#[test]
fn with_the_membership_stored_last_a_stop_inside_an_install_keeps_the_old_one() {
    let (voters, want) = voters_after_a_stop_inside_an_install(Mutation::MembershipAfterLogRestart);
    assert_ne!(voters, want);
}

/// The start after such a stop finishes the install (the log does not hold the snapshot);
/// its own write of the membership fails too. It restarted the log at the snapshot before
/// that write, so the start after it found the log holding the snapshot and went on with the
/// membership from before, for good (simulator seed 1,539 of `--stopped-installs
/// --durability fsync`, where a power cut hit the start). It now stores the membership first.
/// (The mutation `membership-after-log-restart` flips both orders, so its first stop already
/// loses the membership: `with_the_membership_stored_last_...` above is the control; this
/// test fails on the commit before the start's fix.)
#[test]
fn a_start_that_stops_while_it_finishes_an_install_keeps_the_snapshots_membership() {
    let (voters, want) = voters_after_stops_inside_an_install(Mutation::None, 2);
    assert_eq!(voters, want);
}

/// [`a_stop_inside_a_snapshot_install_keeps_the_snapshots_membership`]'s schedule: the
/// follower's voters once it caught up after the stop, and the cluster's.
fn voters_after_a_stop_inside_an_install(mutation: Mutation) -> (Vec<u64>, Vec<u64>) {
    voters_after_stops_inside_an_install(mutation, 1)
}

/// The schedule of the tests above: the follower's write of the snapshot's membership fails
/// `stops` times, the first inside the install, the others inside the start that finishes
/// it; returns the follower's voters once it caught up, and the cluster's.
fn voters_after_stops_inside_an_install(mutation: Mutation, stops: usize) -> (Vec<u64>, Vec<u64>) {
    let mut c = SimCluster::new(3, 52, SimConfig::default(), |cfg: &mut ReplicaConfig| {
        cfg.segment_bytes = 512 << 10;
        cfg.mutation = mutation;
    })
    .unwrap();
    c.fail_stop = true;
    let leader = c.elect().unwrap();
    let mut others = (1..=3).filter(|&i| i != leader);
    let (f, g) = (others.next().unwrap(), others.next().unwrap());
    c.kill(f);
    c.add_node(4).unwrap();
    let t = c.node(leader).change_membership(4, true).unwrap();
    c.wait(leader, t).unwrap();
    c.run_for(200_000_000).unwrap();
    let t = c.node(leader).change_membership(g, false).unwrap();
    c.wait(leader, t).unwrap();
    for i in 0..200u32 {
        c.append(&[i as u8; 3000]).unwrap();
    }
    let applied = c.node(leader).status().applied;
    assert!(c.node(leader).checkpoint(applied, b"state").unwrap() > t.index);
    c.restart_killed(f).unwrap();
    c.disks[&f].fail_next_sync_of("raft-state.tmp");
    let failed = c
        .run_until(30_000_000_000, |c| c.failed.contains_key(&f))
        .unwrap();
    assert!(failed, "the install's write did not fail");
    c.failed.clear();
    for _ in 1..stops {
        c.disks[&f].fail_next_sync_of("raft-state.tmp");
        let e = c
            .restart_killed(f)
            .expect_err("the start finishing the install should fail at its write");
        assert!(e.to_string().contains("raft-state"), "{e}");
    }
    c.restart_killed(f).unwrap();
    let last = c.append(b"after").unwrap();
    let ok = c
        .run_until(30_000_000_000, |c| c.node(f).status().commit >= last)
        .unwrap();
    assert!(ok, "f never caught up");
    let mut want = vec![leader, f, 4];
    want.sort_unstable();
    (c.node(f).status().voters, want)
}
