//! Regression (simulator seed 62767, `Durability::Replicated`, found by the 100,000-seed run of
//! issue 13): a node whose machine crashed came back reporting as committed entries of a branch
//! its log had cut long before.
//!
//! How: a follower X held uncommitted entries of an old leader, durably in its segment files.
//! A new leader's appends conflicted with them; X's cut failed at its fdatasync (EIO), so X
//! fail-stopped with the cut in its page cache but not on disk. X restarted (its machine up, so
//! it read the cut log), caught up and persisted a commit index covering the new leader's
//! entries at those indexes (they lived in its shared-memory ring). Then X's machine crashed:
//! the ring was gone and the disk held the old branch again. Open clamped the persisted commit
//! into the log it found and so called the old branch committed.
//!
//! Two fixes, each tested on its own. The wal now leaves a marker when an fdatasync fails,
//! and the next open rewrites every segment from what it reads (`wal/tests/integration/failed_sync.rs`),
//! so the cut becomes durable. And a log read back after a lost ring is not known to be a
//! prefix of what the commit index covered, so open clamps the commit to the last applied
//! checkpoint and lets the leader teach it again (the node is recovering anyway). This test
//! removes the marker, as a disk that also failed to create it would, to prove the clamp.
//!
//! Method: 5 nodes, `Durability::Memory`, on the in-process fabric. The steps above, each
//! checked; at the end every entry X calls committed must equal the cluster's. With the clamp
//! removed (`Mutation::TrustLogAfterLostRing`) it does not.

use fabric::sim::SimConfig;
use replica::sim::SimCluster;
use replica::{Durability, Mutation, ReplicaConfig};
use wal::fs::FileSystem;

use crate::stale_suffix::{SECOND_NS, StaleSuffix, isolate, stale_suffix_on_a_follower};

#[test]
fn a_machine_crash_after_a_failed_cut_does_not_commit_the_cut_branch() {
    if let Some(wrong) = scenario(Mutation::None) {
        panic!("{wrong}");
    }
}

#[test]
fn trusting_the_log_after_a_lost_ring_is_caught() {
    let wrong = scenario(Mutation::TrustLogAfterLostRing);
    assert!(
        wrong.is_some(),
        "with the commit clamped into the log read back, X still agreed with the cluster: \
         the scenario shows nothing"
    );
}

/// Runs the steps; returns the first entry X calls committed with other bytes than the
/// cluster's, if any.
fn scenario(mutation: Mutation) -> Option<String> {
    let mut c = SimCluster::new(5, 62767, SimConfig::default(), |cfg: &mut ReplicaConfig| {
        cfg.durability = Durability::Memory;
        cfg.mutation = mutation;
        // Nothing reaches the segment files on its own within the run.
        cfg.segment_bytes = 64 << 20;
        cfg.ring_bytes = 8 << 20;
    })
    .unwrap();
    c.fail_stop = true;
    let StaleSuffix {
        x,
        rest,
        first_stale,
        stale_term,
    } = stale_suffix_on_a_follower(&mut c);

    // X rejoins; its cut of the stale entries fails at the fdatasync of its segment file: it
    // fail-stops.
    c.disks[&x].fail_next_sync_of(".wal");
    isolate(&mut c, x, &rest, true);
    let failed = c
        .run_until(10 * SECOND_NS, |c| c.failed.contains_key(&x))
        .unwrap();
    assert!(failed, "X's cut did not fail");
    c.failed.clear();
    // The wal left its sync-failure marker, so the next open would rewrite the segments and
    // make the cut durable (`wal/tests/integration/failed_sync.rs`). Take it away, as a disk that failed
    // its creation too would: the commit clamp below must hold on its own.
    let marker = c.configs[&x]
        .data_dir
        .join(wal::format::SYNC_FAILED_MARKER_NAME);
    c.disks[&x]
        .remove(&marker)
        .expect("the poisoned wal left its sync-failure marker");
    // Its machine is up: it restarts on the cut log of its page cache and catches up.
    c.restart_killed(x).unwrap();
    let l2 = c.leader().unwrap();
    let target = c.node(l2).status().commit;
    let ok = c
        .run_until(10 * SECOND_NS, |c| c.node(x).status().commit >= target)
        .unwrap();
    assert!(ok, "X did not catch up");
    // A new term makes X persist its hard state, commit index included.
    let next = rest.iter().copied().find(|&i| i != l2).unwrap();
    c.node(l2).transfer_leader(next);
    let ok = c
        .run_until(10 * SECOND_NS, |c| {
            c.leader() == Some(next) && c.node(x).status().term == c.node(next).status().term
        })
        .unwrap();
    assert!(ok, "no new term");
    c.append(b"after the transfer").unwrap();

    // X's machine crashes: its ring is gone, and its disk holds the stale branch again.
    c.crash(x);
    c.restart(x).unwrap();
    assert_eq!(
        c.node(x).persisted_term(first_stale),
        Some(stale_term),
        "the crash did not bring the stale branch back: this test shows nothing"
    );
    let truth: std::collections::BTreeMap<u64, Vec<u8>> =
        c.committed_log(next).unwrap().into_iter().collect();
    let wrong = |c: &mut SimCluster| {
        c.committed_log(x)
            .unwrap()
            .into_iter()
            .find(|(index, data)| truth.get(index) != Some(data))
            .map(|(index, _)| {
                format!("X calls entry {index} committed, with other bytes than the cluster's")
            })
    };
    if let Some(w) = wrong(&mut c) {
        return Some(w);
    }
    // And it catches up to the cluster's log.
    let ok = c
        .run_until(20 * SECOND_NS, |c| {
            c.node(x).status().commit >= *truth.keys().last().unwrap()
        })
        .unwrap();
    assert!(ok, "X did not catch up after its machine crash");
    wrong(&mut c)
}
