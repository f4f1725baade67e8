//! Scenario: a follower crashes, the others commit far more than its ring holds (the ring
//! wraps many times on the leader), and the follower restarts from its disk and catches up
//! through the slow path, ending byte-identical; then both durability modes replicate.

use fabric::sim::SimConfig;
use replica::Durability;
use replica::sim::SimCluster;

#[test]
fn a_follower_far_behind_catches_up_after_restart() {
    let mut c =
        SimCluster::new(3, 33, SimConfig::default(), |cfg| cfg.ring_bytes = 1 << 20).unwrap();
    let leader = c.elect().unwrap();
    let lagger = (1..=3).find(|&i| i != leader).unwrap();
    for i in 0..20u32 {
        c.append(&i.to_le_bytes()).unwrap();
    }
    c.run_for(50_000_000).unwrap();
    c.crash(lagger);
    // 4 MiB through a 1 MiB ring.
    let mut tickets = Vec::new();
    for i in 0..400u32 {
        tickets.push(
            c.node(leader)
                .propose(&vec![(i % 251) as u8; 10_000])
                .unwrap(),
        );
        if tickets.len() >= 8 {
            let t = tickets.remove(0);
            c.wait(leader, t).unwrap();
        }
    }
    for t in tickets {
        c.wait(leader, t).unwrap();
    }
    c.restart(lagger).unwrap();
    let target = c.node(leader).status().commit;
    let ok = c
        .run_until(30_000_000_000, |c| c.node(lagger).status().commit >= target)
        .unwrap();
    assert!(
        ok,
        "the restarted follower did not catch up: {:?}",
        c.node(lagger).status()
    );
    let want = c.committed_log(leader).unwrap();
    assert_eq!(want.len(), 420);
    assert_eq!(c.committed_log(lagger).unwrap(), want);
    // After catching up it is back on the fast path.
    let fast = c.node(leader).stats().fast_appends;
    for i in 0..10u8 {
        c.append(&[i; 100]).unwrap();
    }
    assert!(c.node(leader).stats().fast_appends >= fast + 10);
}

#[test]
fn memory_durability_replicates_the_same_log() {
    let mut c = SimCluster::new(3, 34, SimConfig::default(), |cfg| {
        cfg.durability = Durability::Memory
    })
    .unwrap();
    let leader = c.elect().unwrap();
    for i in 0..200u32 {
        c.append(&i.to_le_bytes()).unwrap();
    }
    c.run_for(100_000_000).unwrap();
    let want = c.committed_log(leader).unwrap();
    assert_eq!(want.len(), 200);
    for i in 1..=3 {
        assert_eq!(c.committed_log(i).unwrap(), want);
    }
}

#[test]
fn fsync_durability_survives_a_crash_of_every_node() {
    let mut c = SimCluster::new(3, 35, SimConfig::default(), |_| {}).unwrap();
    c.elect().unwrap();
    for i in 0..50u32 {
        c.append(&i.to_le_bytes()).unwrap();
    }
    for id in 1..=3 {
        c.crash(id);
    }
    for id in 1..=3 {
        c.restart(id).unwrap();
    }
    let leader = c.elect().unwrap();
    c.append(b"after power loss").unwrap();
    let log = c.committed_log(leader).unwrap();
    let acked: Vec<Vec<u8>> = (0..50u32).map(|i| i.to_le_bytes().to_vec()).collect();
    let got: Vec<Vec<u8>> = log.iter().map(|(_, d)| d.clone()).take(50).collect();
    assert_eq!(got, acked, "an acknowledged entry was lost");
}
