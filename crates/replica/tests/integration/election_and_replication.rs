//! Scenario: a 3-node cluster on the in-process fabric elects one leader and replicates
//! entries of mixed sizes over the fast path; every node ends with the same committed log.

use fabric::sim::SimConfig;
use replica::sim::SimCluster;
use replica::{Durability, Role};

/// Mixed sizes from 8 B to 64 KiB, mostly small, as a log sees them.
fn payload(i: u64) -> Vec<u8> {
    let len = match i % 100 {
        0 => 65_536,
        1..=4 => 16_384,
        5..=14 => 4096,
        15..=39 => 512,
        40..=69 => 64,
        _ => 8,
    };
    (0..len).map(|k| (i as usize * 31 + k) as u8).collect()
}

#[test]
fn one_leader_is_elected() {
    let mut c = SimCluster::new(3, 1, SimConfig::default(), |_| {}).unwrap();
    let leader = c.elect().unwrap();
    let term = c.node(leader).status().term;
    let leaders = (1..=3)
        .filter(|&i| c.node(i).status().role == Role::Leader)
        .count();
    assert_eq!(leaders, 1);
    for i in 1..=3 {
        let s = c.node(i).status();
        assert_eq!(s.term, term, "node {i}");
        assert_eq!(s.leader, Some(leader), "node {i}");
    }
}

#[test]
fn ten_thousand_entries_replicate_over_the_fast_path_and_logs_match() {
    // Memory durability: FaultFs snapshots whole files on every fsync, which would dominate
    // this run; Fsync is covered by the crash and catch-up tests.
    let mut c = SimCluster::new(3, 2, SimConfig::default(), |cfg| {
        cfg.durability = Durability::Memory
    })
    .unwrap();
    let leader = c.elect().unwrap();
    let n = 10_000u64;
    let mut tickets = Vec::new();
    for i in 0..n {
        // Keep a window of proposals in flight, as a real client would.
        tickets.push(c.node(leader).propose(&payload(i)).unwrap());
        if tickets.len() >= 16 {
            let t = tickets.remove(0);
            c.wait(leader, t).unwrap();
        }
    }
    for t in tickets {
        c.wait(leader, t).unwrap();
    }
    c.run_for(100_000_000).unwrap();
    let want = c.committed_log(leader).unwrap();
    assert_eq!(want.len() as u64, n);
    for (k, (_, data)) in want.iter().enumerate() {
        assert_eq!(data, &payload(k as u64), "entry {k}");
    }
    for i in 1..=3 {
        assert_eq!(c.committed_log(i).unwrap(), want, "node {i} differs");
    }
    let s = c.node(leader).stats();
    assert!(s.fast_appends > 0, "no fast appends: {s:?}");
    assert!(
        s.fast_appends > 5 * s.slow_appends,
        "mostly slow path: {s:?}"
    );
    assert_eq!(s.fenced_writes, 0);
}
