//! Scenario (issue 13, defect 10): a follower whose last record rots while it is stopped
//! recovers less than it acknowledged (the wal cuts the bad record as a torn tail and keeps it
//! in a `.broken` file). The leader still counts the entry as the follower's, so its
//! heartbeats carry a commit index beyond the follower's log, on which raft-rs panics. The
//! follower must never panic, and must catch up from the leader with no new appends to
//! prompt it.
//!
//! Method: a 3-node `SimCluster` with `Durability::Fsync`; stop a follower cleanly, flip a
//! byte of its last record's payload in the segment file, start it, and let the idle cluster
//! run.

use fabric::sim::SimConfig;
use replica::sim::SimCluster;
use replica::{Durability, ReplicaConfig};
use wal::fs::FileSystem;

#[test]
fn a_follower_that_recovered_less_than_it_acknowledged_catches_up_without_panicking() {
    let mut c = SimCluster::new(3, 31, SimConfig::default(), |cfg: &mut ReplicaConfig| {
        cfg.durability = Durability::Fsync;
    })
    .unwrap();
    let leader = c.elect().unwrap();
    let mut last = 0;
    for i in 0..30u64 {
        last = c.append(format!("entry-{i}").as_bytes()).unwrap();
    }
    // Let the followers learn the commit index (it travels with the next heartbeat).
    c.run_for(500_000_000).unwrap();
    let b = (1..=3).find(|&id| id != leader).unwrap();
    assert_eq!(c.node(b).status().commit, last);
    c.stop(b).unwrap();

    let dir = c.configs[&b].data_dir.clone();
    let disk = c.disks[&b].clone();
    let mut end = None;
    wal::inspect::dump(
        disk.as_ref() as &dyn FileSystem,
        &dir,
        |index, _, lsn, _| {
            end = Some((index, lsn));
        },
    )
    .unwrap();
    let (index, lsn) = end.unwrap();
    assert_eq!(index.0, last);
    let report = wal::inspect::check(disk.as_ref() as &dyn FileSystem, &dir).unwrap();
    let seg = report
        .segments
        .iter()
        .rev()
        .find(|s| s.first_lsn <= lsn)
        .unwrap();
    let offset = wal::format::SEGMENT_DATA_OFFSET
        + (lsn.0 - seg.first_lsn.0)
        + wal::format::HEADER_BYTES as u64;
    disk.corrupt(&dir.join(&seg.name), offset, &[0x5a]);

    c.restart_killed(b).unwrap();
    assert!(
        c.node(b).status().last_index < last,
        "the rotten record should have been cut, or this test proves nothing"
    );
    // No new appends: the leader alone must notice and send the entry again.
    let caught_up = c
        .run_until(10_000_000_000, |c| c.node(b).status().commit >= last)
        .unwrap();
    let s = c.node(b).status();
    assert!(caught_up, "the follower never caught up: {s:?}");
    assert!(
        c.node(leader).stats().followers_rewound > 0 || s.stats.clamped_heartbeats > 0,
        "nothing noticed the lost entry: leader {:?}, follower {:?}",
        c.node(leader).stats(),
        s.stats
    );
    let reference = c.committed_log(leader).unwrap();
    assert_eq!(c.committed_log(b).unwrap(), reference);
}
