//! Scenario: a follower is down while the others checkpoint and truncate their logs, so the
//! entries it needs are gone. The leader sends the checkpoint as a raft snapshot (data in
//! chunks over send/recv, then the MsgSnapshot with its metadata); the follower installs it,
//! restarts its log right after it at the same log position as the leader, and is caught up
//! the ordinary way, fast path included. Also: a follower that stopped halfway through an
//! install finishes it at open, checkpoints that would record a wrong state are refused, and
//! a checkpoint below a membership change records the membership as of its own index.

use fabric::sim::SimConfig;
use replica::sim::SimCluster;
use replica::storage::SnapshotFile;
use replica::{ReplicaConfig, ReplicaError};
use std::path::Path;
use std::sync::Arc;
use wal::fs::FileSystem;

fn cluster(seed: u64) -> SimCluster {
    SimCluster::new(3, seed, SimConfig::default(), |cfg: &mut ReplicaConfig| {
        // Small segments, so that a checkpoint really deletes entries.
        cfg.segment_bytes = 512 << 10;
    })
    .unwrap()
}

fn payload(i: u64) -> Vec<u8> {
    (0..3000 + (i % 7) as usize * 100)
        .map(|k| (i as usize + k) as u8)
        .collect()
}

/// The application's state in these tests: a digest of every payload applied so far.
fn state_of(log: &[(u64, Vec<u8>)], upto: u64) -> Vec<u8> {
    let mut crc = 0u32;
    for (i, d) in log.iter().filter(|(i, _)| *i <= upto) {
        crc = crc32c::crc32c_append(crc, &i.to_le_bytes());
        crc = crc32c::crc32c_append(crc, d);
    }
    format!("state through {upto}: {crc:08x}").into_bytes()
}

/// Crashes a follower, appends `n` entries; then the live nodes checkpoint at their applied
/// index with the application state and truncate. Returns (down, leader, checkpoint index,
/// state).
fn checkpoint_while_down(c: &mut SimCluster, n: u64) -> (u64, u64, u64, Vec<u8>) {
    let leader = c.elect().unwrap();
    c.append(b"before").unwrap();
    let down = (1..=3).find(|&id| id != leader).unwrap();
    c.crash(down);
    for i in 0..n {
        c.append(&payload(i)).unwrap();
    }
    c.run_for(100_000_000).unwrap();
    let leader = c.leader().unwrap();
    let log = c.committed_log(leader).unwrap();
    let at = log.last().unwrap().0;
    let state = state_of(&log, at);
    for id in (1..=3).filter(|&id| id != down) {
        let first = c.node(id).checkpoint(at, &state).unwrap();
        assert!(
            first > 2,
            "node {id}: nothing was truncated (first index {first})"
        );
    }
    (down, leader, at, state)
}

#[test]
fn a_follower_behind_the_checkpoint_is_caught_up_by_a_snapshot() {
    let mut c = cluster(5);
    let (down, leader, at, state) = checkpoint_while_down(&mut c, 300);
    c.restart(down).unwrap();
    let commit = c.node(leader).status().commit;
    let caught = c
        .run_until(30_000_000_000, |c| c.node(down).status().commit >= commit)
        .unwrap();
    assert!(
        caught,
        "the follower was not caught up: {:?}",
        c.node(down).status()
    );
    let f = c.node(down).stats();
    assert_eq!(f.snapshots_installed, 1, "{f:?}");
    assert!(c.node(leader).stats().snapshots_sent >= 1);
    let cp = c.node(down).latest_checkpoint().unwrap();
    assert_eq!(
        (cp.index, &cp.state),
        (at, &state),
        "the follower has the leader's state"
    );
    assert_eq!(c.node(down).first_index(), at + 1);
    let mut buf = Vec::new();
    assert!(
        c.node(down).read(at, &mut buf).unwrap().is_none(),
        "below the snapshot: gone"
    );

    // The follower's log continues at the leader's log positions: with the other follower
    // down, every commit needs it, and the leader reaches it over the one-sided fast path.
    let other = (1..=3).find(|&id| id != leader && id != down).unwrap();
    c.crash(other);
    let fast_before = c.node(leader).stats().fast_appends;
    for i in 0..50 {
        c.append(&payload(1000 + i)).unwrap();
    }
    let fast = c.node(leader).stats().fast_appends - fast_before;
    assert!(
        fast >= 45,
        "only {fast} of 50 appends took the fast path to the follower"
    );
    // Followers learn the commit index with the next append or heartbeat.
    let commit = c.node(leader).status().commit;
    assert!(
        c.run_until(1_000_000_000, |c| c.node(down).status().commit >= commit)
            .unwrap(),
        "the follower never learned commit {commit}"
    );
    let want = c.committed_log(leader).unwrap();
    let got = c.committed_log(down).unwrap();
    assert_eq!(
        got,
        want.into_iter()
            .filter(|(i, _)| *i > at)
            .collect::<Vec<_>>()
    );

    // A restart keeps the checkpoint and the log that follows it.
    c.crash(down);
    c.restart(down).unwrap();
    assert_eq!(c.node(down).latest_checkpoint().unwrap().state, state);
    c.restart(other).unwrap();
    c.append(b"after").unwrap();
    c.run_for(200_000_000).unwrap();
    let l = c.leader().unwrap();
    assert_eq!(
        c.committed_log(down).unwrap().last(),
        c.committed_log(l).unwrap().last()
    );
}

#[test]
fn a_follower_stopped_halfway_through_an_install_finishes_it_at_open() {
    let mut c = cluster(6);
    let (down, leader, at, state) = checkpoint_while_down(&mut c, 300);
    // The crash point between storing the snapshot and restarting the log: the snapshot file
    // is there (durably), the log is still the old, short one.
    let snap = c
        .node(leader)
        .latest_checkpoint()
        .map(|cp| (cp.index, cp.term))
        .unwrap();
    let fs: Arc<dyn FileSystem> = c.disks[&down].clone();
    let raw = {
        // Copy the leader's snapshot file byte for byte into the follower's data dir.
        let leader_fs = c.disks[&leader].clone();
        leader_fs
            .read_file(&Path::new(&format!("/node{leader}")).join("snapshot"))
            .unwrap()
    };
    c.disks[&down].reboot(None);
    let f = fs
        .create(&Path::new(&format!("/node{down}")).join("snapshot"))
        .unwrap();
    f.write_all_at(&raw, 0).unwrap();
    f.sync_data().unwrap();
    fs.sync_dir(Path::new(&format!("/node{down}"))).unwrap();
    let loaded = SnapshotFile::new(fs.clone(), Path::new(&format!("/node{down}")))
        .load()
        .unwrap()
        .unwrap();
    assert_eq!(loaded.get_metadata().index, snap.0);

    c.restart(down).unwrap();
    assert_eq!(
        c.node(down).first_index(),
        at + 1,
        "open restarted the log after the snapshot"
    );
    assert_eq!(c.node(down).latest_checkpoint().unwrap().state, state);
    c.append(b"after").unwrap();
    let commit = c.node(leader).status().commit;
    let caught = c
        .run_until(30_000_000_000, |c| c.node(down).status().commit >= commit)
        .unwrap();
    assert!(caught, "{:?}", c.node(down).status());
    assert_eq!(
        c.node(down).stats().snapshots_installed,
        0,
        "no second install was needed"
    );
}

#[test]
fn checkpoints_that_would_record_a_wrong_state_are_refused() {
    let mut c = cluster(7);
    let leader = c.elect().unwrap();
    for i in 0..20 {
        c.append(&payload(i)).unwrap();
    }
    c.run_for(100_000_000).unwrap();
    let applied = c.node(leader).status().commit;
    let e = c.node(leader).checkpoint(applied + 5, b"s").unwrap_err();
    assert!(matches!(e, ReplicaError::Checkpoint(_)), "{e}");
    assert!(e.to_string().contains("not applied yet"), "{e}");
    let big = vec![0u8; (64 << 20) + 1];
    let e = c.node(leader).checkpoint(applied, &big).unwrap_err();
    assert!(e.to_string().contains("max_snapshot_bytes"), "{e}");
    // A membership change after the checkpoint index: the checkpoint records the membership
    // as of its own index (three voters), not the current one (four).
    c.add_node(4).unwrap();
    let t = c.node(leader).change_membership(4, true).unwrap();
    c.wait(leader, t).unwrap();
    c.run_for(100_000_000).unwrap();
    assert!(c.node(leader).status().voters.contains(&4));
    c.node(leader).checkpoint(applied, b"s").unwrap();
    let fs: Arc<dyn FileSystem> = c.disks[&leader].clone();
    let snap = SnapshotFile::new(fs, Path::new(&format!("/node{leader}")))
        .load()
        .unwrap()
        .unwrap();
    assert_eq!(snap.get_metadata().index, applied);
    assert_eq!(snap.get_metadata().get_conf_state().voters, vec![1, 2, 3]);
    // An older checkpoint than the latest changes nothing.
    let first = c.node(leader).first_index();
    assert_eq!(c.node(leader).checkpoint(applied, b"old").unwrap(), first);
    assert_eq!(c.node(leader).latest_checkpoint().unwrap().state, b"s");
}
