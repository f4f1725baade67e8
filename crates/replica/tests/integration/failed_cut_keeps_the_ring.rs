//! Regression (simulator seed 501055, `Durability::Replicated`): a follower whose cut of a
//! conflicting suffix failed came back recovering, as if its machine had crashed, although
//! only its process had stopped and its shared-memory ring was intact. With a second node
//! down at the same time (a machine crash there), two of three voters refused to vote and the
//! cluster never elected a leader again.
//!
//! How: the follower X held a stale suffix in its segment files, past the part of the log its
//! ring still held (the ring had handed it to the wal and cleared its free part at a grant).
//! A new leader's append conflicted; X cut its wal first, and the fdatasync of the cut failed,
//! so X fail-stopped before it rewound its ring. The ring's published end still claimed the
//! cut records; the next open checked the ring from the wal's new end up to it, found zeroes,
//! called the ring corrupt and came back recovering.
//!
//! The fix (`Replica::truncate_from`): the ring goes back before the wal is cut, so at every
//! crash point its published end is at or below the wal's end. This test makes the cut fail
//! and checks that X restarts as a voter holding everything the cluster committed. With the
//! old order (`Mutation::CutWalBeforeRing`) X restarts recovering.
//!
//! A snapshot install restarts the wal (its segments deleted, then a new one made) and had
//! the same order: a crash with the segments gone and the ring's published end untouched made
//! the next open read the ring as corrupt. The ring is now emptied first; the second scenario
//! makes the restart fail and checks the same.
//!
//! Method: 5 nodes (so that a leader without X's stale suffix can be elected), on the
//! in-process fabric, `Durability::Replicated`; and 3 nodes for the snapshot install.

use fabric::sim::SimConfig;
use replica::sim::SimCluster;
use replica::{Durability, Mutation, ReplicaConfig};

use crate::stale_suffix::{SECOND_NS, StaleSuffix, isolate, stale_suffix_on_a_follower};

#[test]
fn a_failed_cut_leaves_a_ring_the_next_open_takes_over() {
    if let Some(wrong) = scenario(Mutation::None) {
        panic!("{wrong}");
    }
}

#[test]
fn cutting_the_wal_before_the_ring_is_caught() {
    let wrong = scenario(Mutation::CutWalBeforeRing);
    let wrong = wrong.expect(
        "with the wal cut before the ring, X still restarted as a voter: the scenario shows nothing",
    );
    // The intended failure: X's intact ring read as corrupt, not some other way back.
    assert!(wrong.contains("failed their checks"), "{wrong}");
}

#[test]
fn a_failed_snapshot_install_leaves_a_ring_the_next_open_takes_over() {
    if let Some(wrong) = install_scenario(Mutation::None) {
        panic!("{wrong}");
    }
}

#[test]
fn restarting_the_wal_before_emptying_the_ring_is_caught() {
    let wrong = install_scenario(Mutation::CutWalBeforeRing);
    let wrong = wrong.expect(
        "with the wal restarted before the ring was emptied, X still restarted as a voter: \
         the scenario shows nothing",
    );
    assert!(wrong.contains("failed their checks"), "{wrong}");
}

/// Runs the steps; returns what went wrong with X after its failed cut, if anything.
fn scenario(mutation: Mutation) -> Option<String> {
    let mut c = SimCluster::new(
        5,
        501055,
        SimConfig::default(),
        |cfg: &mut ReplicaConfig| {
            cfg.durability = Durability::Replicated;
            cfg.mutation = mutation;
            cfg.ring_bytes = 8 << 20;
        },
    )
    .unwrap();
    c.fail_stop = true;
    let StaleSuffix { x, rest, .. } = stale_suffix_on_a_follower(&mut c);

    // X rejoins; its cut of the stale entries fails at the fdatasync of its segment file: it
    // fail-stops, its machine up and its ring intact.
    c.disks[&x].fail_next_sync_of(".wal");
    isolate(&mut c, x, &rest, true);
    let failed = c
        .run_until(10 * SECOND_NS, |c| c.failed.contains_key(&x))
        .unwrap();
    assert!(failed, "X's cut did not fail");
    c.failed.clear();
    c.restart_killed(x).unwrap();
    if let Some(why) = c.node(x).status().recovering {
        return Some(format!(
            "X lost nothing (only its process stopped) and came back recovering: {why}"
        ));
    }
    let l = c.leader().unwrap();
    let target = c.node(l).status().commit;
    let ok = c
        .run_until(10 * SECOND_NS, |c| c.node(x).status().commit >= target)
        .unwrap();
    if !ok {
        return Some("X did not catch up after its failed cut".into());
    }
    let truth: std::collections::BTreeMap<u64, Vec<u8>> =
        c.committed_log(l).unwrap().into_iter().collect();
    c.committed_log(x)
        .unwrap()
        .into_iter()
        .find(|(index, data)| truth.get(index) != Some(data))
        .map(|(index, _)| {
            format!("X calls entry {index} committed, with other bytes than the cluster's")
        })
}

/// X holds more than a ring's worth of log; its process is down while the others append as
/// much again and checkpoint past everything it holds; back, it is
/// sent the checkpoint, and the restart of its wal fails after the old segments are deleted
/// (the new segment's fdatasync). Returns what went wrong with X after that, if anything.
fn install_scenario(mutation: Mutation) -> Option<String> {
    let mut c = SimCluster::new(
        3,
        501056,
        SimConfig::default(),
        |cfg: &mut ReplicaConfig| {
            cfg.durability = Durability::Replicated;
            cfg.mutation = mutation;
            // Small segments, so that a checkpoint really deletes entries, and a ring smaller
            // than X's log (below).
            cfg.segment_bytes = 512 << 10;
            cfg.ring_bytes = 1 << 20;
        },
    )
    .unwrap();
    c.fail_stop = true;
    let l = c.elect().unwrap();
    let x = (1..=3).find(|&i| i != l).unwrap();
    // X's log grows past its ring's size, so its ring's published end is more than a ring
    // away from the start of an emptied wal.
    let payload = vec![7u8; 3000];
    for _ in 0..600 {
        c.append(&payload).unwrap();
    }
    let at = c.node(l).status().commit;
    let ok = c
        .run_until(5 * SECOND_NS, |c| c.node(x).status().last_index >= at)
        .unwrap();
    assert!(ok, "X did not receive the first entries");
    c.kill(x);
    for _ in 0..600 {
        c.append(&payload).unwrap();
    }
    let l = c.leader().unwrap();
    let at = c.node(l).status().commit;
    let ok = c
        .run_until(5 * SECOND_NS, |c| {
            (1..=3)
                .filter(|&i| i != x)
                .all(|i| c.node(i).status().applied >= at)
        })
        .unwrap();
    assert!(ok, "the live nodes did not apply everything");
    for id in (1..=3).filter(|&id| id != x) {
        let first = c.node(id).checkpoint(at, b"state").unwrap();
        assert!(
            first > 2,
            "node {id}: nothing was truncated: first {first}, at {at}, {:?}",
            c.node(id).status()
        );
    }
    // X comes back (its ring intact) and is sent the checkpoint; the new segment of its
    // restarted wal fails its fdatasync, after the old ones are gone.
    c.restart_killed(x).unwrap();
    c.disks[&x].fail_next_sync_of(".wal.tmp");
    let failed = c
        .run_until(10 * SECOND_NS, |c| c.failed.contains_key(&x))
        .unwrap();
    if !failed {
        panic!("X's install did not fail: {:?}", c.node(x).status());
    }
    let why = c.failed.remove(&x).unwrap();
    assert!(
        why.contains("segment"),
        "X failed, but not at its wal's restart: {why}"
    );
    c.restart_killed(x).unwrap();
    if let Some(why) = c.node(x).status().recovering {
        return Some(format!(
            "X lost nothing (only its process stopped) and came back recovering: {why}"
        ));
    }
    let l = c.leader().unwrap();
    c.append(b"after").unwrap();
    let target = c.node(l).status().commit;
    let ok = c
        .run_until(30 * SECOND_NS, |c| c.node(x).status().commit >= target)
        .unwrap();
    if !ok {
        return Some("X did not catch up after its failed install".into());
    }
    let x_first = c.node(x).status().first_index;
    let truth: std::collections::BTreeMap<u64, Vec<u8>> =
        c.committed_log(l).unwrap().into_iter().collect();
    c.committed_log(x)
        .unwrap()
        .into_iter()
        .filter(|(index, _)| *index >= x_first)
        .find(|(index, data)| truth.get(index) != Some(data))
        .map(|(index, _)| {
            format!("X calls entry {index} committed, with other bytes than the cluster's")
        })
}
