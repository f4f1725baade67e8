//! Scenario: the same 100 appends, one at a time, on a cluster that broadcasts every commit at
//! once (`broadcast_commit = true`, raft-rs's default) and on one that does not (the default
//! here). Asserted: without the broadcast a commit costs clearly fewer messages; the leader's
//! acknowledgements are the same; followers that went idle learn the last commit within two
//! heartbeats; and every replica ends with the same committed log in both modes.

use fabric::sim::SimConfig;
use replica::sim::SimCluster;

/// A node's committed log: (index, payload).
type CommittedLog = Vec<(u64, Vec<u8>)>;

/// Messages per commit, and the committed log of each node once idle.
fn run(broadcast: bool) -> (f64, Vec<CommittedLog>) {
    let mut c = SimCluster::new(3, 77, SimConfig::default(), |cfg| {
        cfg.broadcast_commit = broadcast;
    })
    .unwrap();
    let leader = c.elect().unwrap();
    c.run_for(100_000_000).unwrap();
    let before = c.net.stats().messages_delivered;
    let mut last = 0;
    for i in 0..100u32 {
        last = c.append(&i.to_le_bytes()).unwrap();
    }
    let per_commit = (c.net.stats().messages_delivered - before) as f64 / 100.0;
    // Idle from here on: heartbeats (heartbeat_tick = 2 ticks of 10 ms) carry the commit.
    let caught = c
        .run_until(40_000_000, |c| {
            (1..=3).all(|id| c.node(id).status().commit >= last)
        })
        .unwrap();
    assert!(
        caught,
        "broadcast={broadcast}: followers did not learn commit {last} within two heartbeats"
    );
    assert_eq!(c.leader(), Some(leader));
    let logs = (1..=3).map(|id| c.committed_log(id).unwrap()).collect();
    (per_commit, logs)
}

#[test]
fn skipping_the_commit_broadcast_saves_messages_and_loses_nothing() {
    let (with, logs_with) = run(true);
    let (without, logs_without) = run(false);
    println!("messages per commit: {with:.2} with the broadcast, {without:.2} without");
    assert!(
        without <= with * 0.7,
        "{without:.2} messages per commit without the broadcast against {with:.2} with it"
    );
    for logs in [&logs_with, &logs_without] {
        assert!(logs.iter().all(|l| l == &logs[0]), "replicas differ");
        let payloads: Vec<&Vec<u8>> = logs[0].iter().map(|(_, d)| d).collect();
        let want: Vec<Vec<u8>> = (0..100u32).map(|i| i.to_le_bytes().to_vec()).collect();
        assert_eq!(payloads, want.iter().collect::<Vec<_>>());
    }
}
