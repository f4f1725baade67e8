//! Scenario (issue 13, section 1): under `Durability::Memory` a follower acknowledges entries
//! once they are in its shared-memory ring. A machine crash takes the ring (tmpfs) while the
//! node's term and vote survive on disk. The node must come back *recovering*: it does not
//! vote or campaign until it has caught up from a leader, so the others cannot elect a leader
//! without the entries it lost.
//!
//! Method: a 3-node `SimCluster` with Memory durability and segment files large enough that
//! nothing is fdatasynced on its own. Node C is cut off while A (leader) and B commit entries,
//! so those entries exist only in A's and B's rings. Then B's machine crashes
//! (`SimCluster::crash`: shared memory and unsynced disk bytes lost) and restarts. The cases:
//! - A is killed (kill -9) after B restarts: B and C must not elect a leader; once A restarts,
//!   every acknowledged entry is committed on all three, and B has left recovery;
//! - A stays leader: B must not panic (A's heartbeats carry a commit beyond B's log) and
//!   rejoins once caught up;
//! - with the guard removed (`Mutation::NoRecoveringGuard`) the first case loses
//!   acknowledged entries, so the test can tell;
//! - a machine crash of a majority (A and B): the cluster stalls, visibly, and never serves a
//!   log without the entries;
//! - a ring that rots while its process is down (killed, not crashed) is unrecoverable: the
//!   node starts without it, recovering, instead of refusing to start; the status names each
//!   cause (a ring gone, a ring that failed its checks, a restart while still recovering);
//! - a clean stop, and a kill that keeps the ring, do not make a node recovering.

use fabric::NodeId;
use fabric::sim::SimConfig;
use replica::sim::SimCluster;
use replica::{Durability, Mutation, ReplicaConfig, Role};

use crate::three_nodes::{
    Acked, SECOND_NS, append, assert_all_hold, cut, elects_without, held_back, restart_and_rejoin,
};

fn cluster(seed: u64, mutation: Mutation) -> SimCluster {
    SimCluster::new(3, seed, SimConfig::default(), |cfg: &mut ReplicaConfig| {
        cfg.durability = Durability::Memory;
        cfg.mutation = mutation;
        // Nothing reaches the segment files' durable bytes within the run.
        cfg.segment_bytes = 64 << 20;
        cfg.ring_bytes = 8 << 20;
    })
    .unwrap()
}

/// A (leader) and B commit entries that C, cut off, does not have; then B's machine crashes
/// and restarts. Returns (a, b, c) and the acknowledged entries.
fn lose_b_ring(c: &mut SimCluster) -> ((u64, u64, u64), Acked) {
    let a = c.elect().unwrap();
    let mut acked = append(c, 0, 20);
    let b = (1..=3).find(|&id| id != a).unwrap();
    let cc = (1..=3).find(|&id| id != a && id != b).unwrap();
    cut(c, cc, false);
    acked.extend(append(c, 20, 30));
    let b_last = c.node(b).status().last_index;
    assert!(b_last >= acked.last().unwrap().0, "B holds what was acked");
    c.crash(b);
    c.restart(b).unwrap();
    let s = c.node(b).status();
    assert!(
        s.last_index < acked.last().unwrap().0,
        "B's machine crash should have lost its ring's entries (last index {}), or this test \
         proves nothing",
        s.last_index
    );
    let guarded = c.configs[&b].mutation != Mutation::NoRecoveringGuard;
    assert_eq!(
        s.recovering.is_some(),
        guarded,
        "B lost its ring and must come back recovering (unless the guard is removed): {s:?}"
    );
    cut(c, cc, true);
    ((a, b, cc), acked)
}

#[test]
fn a_node_that_lost_its_ring_does_not_let_the_others_elect_without_its_entries() {
    let mut c = cluster(21, Mutation::None);
    let ((a, b, _), acked) = lose_b_ring(&mut c);
    // B does not vote, so C alone cannot elect anyone: the cluster waits for A.
    assert!(
        !elects_without(&mut c, a),
        "a leader was elected without A's entries"
    );
    let why = held_back(&mut c, b);
    assert!(why.contains("waiting for a leader"), "{why}");
    // The status names what B's start found: its ring gone, not a ring that failed checks.
    assert!(why.contains("was gone (a machine crash"), "{why}");
    restart_and_rejoin(&mut c, a, b, &acked);
    // B votes again: with C down, A and B elect a leader.
    let cc = (1..=3).find(|&id| id != a && id != b).unwrap();
    c.kill(cc);
    c.kill(c.leader().unwrap());
    for id in 1..=3 {
        if c.nodes[&id].is_none() && id != cc {
            c.restart_killed(id).unwrap();
        }
    }
    c.elect().unwrap();
    c.restart_killed(cc).unwrap();
    assert_all_hold(&mut c, &acked);
}

#[test]
fn a_node_that_lost_its_ring_follows_the_same_leader_without_panicking() {
    let mut c = cluster(22, Mutation::None);
    let ((_, b, _), mut acked) = lose_b_ring(&mut c);
    // The old leader steps down on B's first answer (B moved past its term); a new term's
    // leader brings B back.
    let ok = c
        .run_until(20 * SECOND_NS, |c| {
            c.leader().is_some() && c.node(b).status().recovering.is_none()
        })
        .unwrap();
    assert!(ok, "B did not rejoin: {:?}", c.node(b).status());
    acked.extend(append(&mut c, 50, 10));
    assert_all_hold(&mut c, &acked);
    assert_ne!(c.node(b).status().role, Role::Leader);
}

#[test]
fn without_the_recovering_guard_the_same_crash_loses_acknowledged_entries() {
    let mut c = cluster(21, Mutation::NoRecoveringGuard);
    let ((a, b, _), acked) = lose_b_ring(&mut c);
    assert!(
        elects_without(&mut c, a),
        "B and C should elect a leader when B votes as if nothing happened"
    );
    let leader = c.leader().unwrap();
    assert_ne!(leader, a);
    let last = acked.last().unwrap().0;
    let held = c
        .node(b)
        .status()
        .last_index
        .max(c.node(leader).status().last_index);
    // The new leader's log ends below the acknowledged entries or holds other ones there.
    let mut buf = Vec::new();
    let same = (held >= last)
        && acked.iter().all(|(i, d)| {
            matches!(
                c.node(leader).read_persisted(*i, &mut buf),
                Ok(Some(_)) if buf.get(1..) == Some(&d[..])
            )
        });
    assert!(
        !same,
        "the mutation should lose acknowledged entries, or the guard test proves nothing"
    );
}

#[test]
fn a_machine_crash_of_a_majority_stalls_the_cluster_visibly() {
    let mut c = cluster(23, Mutation::None);
    let ((a, b, cc), acked) = lose_b_ring(&mut c);
    c.crash(a);
    c.restart(a).unwrap();
    let elected = c
        .run_until(20 * SECOND_NS, |c| c.leader().is_some())
        .unwrap();
    assert!(
        !elected,
        "a leader was elected although a majority lost entries they acknowledged"
    );
    for id in [a, b] {
        let why = c.node(id).status().recovering;
        assert!(
            why.as_deref()
                .is_some_and(|w| w.contains("waiting for a leader")),
            "node {id}: {why:?}"
        );
    }
    assert!(c.node(cc).status().recovering.is_none());
    // Nothing was served as committed past what C holds.
    let last = acked.last().unwrap().0;
    assert!((1..=3).all(|id| c.node(id).status().commit < last));
}

#[test]
fn a_clean_stop_and_start_does_not_recover() {
    let mut c = cluster(24, Mutation::None);
    c.elect().unwrap();
    let acked = append(&mut c, 0, 20);
    for id in 1..=3 {
        c.stop(id).unwrap();
    }
    for id in 1..=3 {
        c.restart_killed(id).unwrap();
        assert_eq!(c.node(id).status().recovering, None, "node {id}");
    }
    c.elect().unwrap();
    assert_all_hold(&mut c, &acked);
}

#[test]
fn a_process_crash_keeps_the_ring_and_does_not_recover() {
    let mut c = cluster(25, Mutation::None);
    c.elect().unwrap();
    let acked = append(&mut c, 0, 20);
    for id in 1..=3 {
        c.kill(id);
    }
    for id in 1..=3 {
        c.restart_killed(id).unwrap();
        assert_eq!(c.node(id).status().recovering, None, "node {id}");
    }
    c.elect().unwrap();
    assert_all_hold(&mut c, &acked);
}

#[test]
fn a_ring_that_rots_while_its_process_is_down_makes_the_node_recovering() {
    let mut c = cluster(26, Mutation::None);
    let leader = c.elect().unwrap();
    let mut acked = append(&mut c, 0, 40);
    let b = (1..=3).find(|&id| id != leader).unwrap();
    c.kill(b);
    let ring = c.configs[&b].ring_file();
    let bytes = c.configs[&b].ring_bytes as usize;
    assert!(c.net.corrupt_shm(NodeId(b), &ring, 0, bytes, 0xA5));
    c.restart_killed(b).unwrap();
    let s = c.node(b).status();
    assert_eq!(s.stats.recovered_from_ring, 0);
    let why = s.recovering.clone().unwrap_or_else(|| {
        panic!(
            "a corrupt ring must make the node recovering (if its segment files held \
             everything, this test proves nothing): {s:?}"
        )
    });
    assert!(why.contains("failed their checks"), "{why}");
    // Killed again before it caught up (its process only: the ring it has now is kept), B
    // is still recovering, and says the cause was found by an earlier start.
    c.kill(b);
    c.restart_killed(b).unwrap();
    let why = c.node(b).status().recovering.expect("B still recovering");
    assert!(why.contains("an earlier start"), "{why}");
    let ok = c
        .run_until(20 * SECOND_NS, |c| {
            c.leader().is_some() && c.node(b).status().recovering.is_none()
        })
        .unwrap();
    assert!(ok, "B did not rejoin: {:?}", c.node(b).status());
    acked.extend(append(&mut c, 40, 5));
    assert_all_hold(&mut c, &acked);
}
