//! Scenario: a leader with appends in flight pauses (SIGSTOP, a long GC) while its connection
//! to a follower breaks and the follower dials again; it wakes within its lease, still leader,
//! and proposes and writes before it reads its inbox (`process_ready_only`). The connection
//! that came up while it slept is not its own until it polled its `Connected`
//! (`fabric/tests/integration/unannounced_connection.rs`), so its writes from before are
//! refused there (`NotConnected`): the follower never gets a descriptor its ring does not
//! bear out, and all three logs agree.
//!
//! Without that rule (the fabric's test-only `use_before_announced`, the replica's
//! `Mutation::UseConnectionBeforeAnnounced`) the woken leader posts its write and descriptor
//! on the new connection from the old connection's state, and the follower refuses the
//! descriptor: `the_rule_removed_is_caught` shows this test fails then. The simulator's seeds
//! reach this only by chance (seed 928 once; since appends are coalesced, no seed of the CI
//! budget), so this scenario is the mutation's check.

use fabric::NodeId;
use fabric::sim::SimConfig;
use replica::sim::SimCluster;
use replica::{Durability, ReplicaStats, Role};

/// The seeds the scenario runs: each draws its own election timeouts and link timing.
const SEEDS: std::ops::RangeInclusive<u64> = 1..=6;

/// Runs the scenario with seed `seed`; returns each node's stats at the end, after checking
/// that the woken node was still leader and that all three committed logs agree.
fn woken_leader(seed: u64, use_before_announced: bool) -> Vec<ReplicaStats> {
    let fabric = SimConfig {
        use_before_announced,
        ..SimConfig::default()
    };
    let mut c =
        SimCluster::new(3, seed, fabric, |cfg| cfg.durability = Durability::Memory).unwrap();
    let leader = c.elect().unwrap();
    for i in 0..20u8 {
        c.append(&[i; 300]).unwrap();
    }
    c.run_for(20_000_000).unwrap();
    let follower = if leader == 1 { 2 } else { 1 };

    // Appends in flight, then the leader's CPU stops and its connection to one follower breaks.
    for i in 0..3u8 {
        c.node(leader).propose(&[200 + i; 400]).unwrap();
    }
    c.node(leader).process_ready_only().unwrap();
    c.paused.insert(leader);
    c.net.break_connection(NodeId(leader), NodeId(follower));
    // Long enough for the follower to dial again, shorter than an election timeout.
    c.run_for(30_000_000).unwrap();

    c.paused.remove(&leader);
    assert_eq!(c.node(leader).status().role, Role::Leader, "seed {seed}");
    c.node(leader).propose(b"after waking").unwrap();
    c.node(leader).process_ready_only().unwrap();
    c.run_for(300_000_000).unwrap();

    let logs: Vec<_> = (1..=3).map(|id| c.committed_log(id).unwrap()).collect();
    let shortest = logs.iter().map(Vec::len).min().unwrap();
    for log in &logs[1..] {
        assert_eq!(log[..shortest], logs[0][..shortest], "seed {seed}");
    }
    assert!(
        shortest >= 24,
        "seed {seed}: only {shortest} entries committed everywhere"
    );
    (1..=3).map(|id| c.node(id).stats()).collect()
}

#[test]
fn a_leader_waking_after_its_follower_reconnected_sends_nothing_it_refuses() {
    for seed in SEEDS {
        let stats = woken_leader(seed, false);
        for (k, s) in stats.iter().enumerate() {
            assert_eq!(
                (s.fast_rejected, s.fast_overwrites, s.bad_frames),
                (0, 0, 0),
                "seed {seed}: node {} refused what its leader sent: {s:?}",
                k + 1
            );
        }
    }
}

/// The check above can fail: with the connection usable before its owner saw it, most seeds'
/// followers refuse a descriptor.
#[test]
fn the_rule_removed_is_caught() {
    let caught: Vec<u64> = SEEDS
        .filter(|&seed| {
            woken_leader(seed, true)
                .iter()
                .any(|s| s.fast_rejected + s.fast_overwrites + s.bad_frames > 0)
        })
        .collect();
    eprintln!("seeds that caught use-before-announced: {caught:?}");
    assert!(
        !caught.is_empty(),
        "a connection used before its owner polled its Connected went unnoticed"
    );
}
