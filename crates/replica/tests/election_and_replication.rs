//! Scenario: a 3-node cluster on the in-process fabric elects one leader and replicates
//! entries of mixed sizes over the fast path; every node ends with the same committed log.

use fabric::sim::SimConfig;
use replica::sim::SimCluster;
use replica::{Durability, Role};

fn payload(i: u64) -> Vec<u8> {
    let len = [8usize, 100, 1000, 4096, 20_000, 65_536][(i % 6) as usize];
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
fn entries_replicate_over_the_fast_path_and_logs_match() {
    let mut c = SimCluster::new(3, 2, SimConfig::default(), |cfg| {
        cfg.durability = Durability::Fsync
    })
    .unwrap();
    let leader = c.elect().unwrap();
    let n = 600u64;
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
