//! Scenario (regression, found in review): after the application truncates the prefix, every
//! node crashes and restarts. raft-rs used to refuse to start because the persisted commit
//! index (only rewritten when term or vote change) lay below the truncated log.

use fabric::sim::SimConfig;
use replica::sim::SimCluster;

#[test]
fn nodes_restart_after_prefix_truncation() {
    let mut c = SimCluster::new(3, 77, SimConfig::default(), |cfg| {
        cfg.segment_bytes = 1 << 20
    })
    .unwrap();
    let leader = c.elect().unwrap();
    for i in 0..300u32 {
        c.append(&[(i % 251) as u8; 8192]).unwrap();
    }
    c.run_for(100_000_000).unwrap();
    for id in 1..=3 {
        let first = c.node(id).truncate_prefix(200).unwrap();
        assert!(
            first > 1,
            "node {id}: nothing was truncated (first index {first})"
        );
    }
    for id in 1..=3 {
        c.crash(id);
    }
    for id in 1..=3 {
        c.restart(id).unwrap();
    }
    let leader2 = c.elect().unwrap();
    c.append(b"after truncation and restart").unwrap();
    let log = c.committed_log(leader2).unwrap();
    assert_eq!(log.last().unwrap().1, b"after truncation and restart");
    let _ = leader;
}
