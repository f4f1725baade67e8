//! The replicas mark every step the breakdown names, for an entry committed on the fast
//! path: without them `rdmalog-bench embedded --steps` would print a table with rows missing.

use std::time::Instant;

use bench::steps::{Recorder, Sample, breakdown};
use fabric::sim::SimConfig;
use replica::Durability;
use replica::sim::SimCluster;

fn steps_of(durability: Durability) -> Vec<String> {
    let ((samples, leader), events) = Recorder::scoped(|| {
        let mut c = SimCluster::new(3, 7, SimConfig::default(), |cfg| {
            cfg.durability = durability
        })
        .unwrap();
        let leader = c.elect().unwrap();
        c.run_for(50_000_000).unwrap();
        let mut samples = Vec::new();
        for _ in 0..5 {
            let start = Instant::now();
            let t = c.node(leader).propose(b"step").unwrap();
            let index = loop {
                c.run_for(100_000).unwrap();
                if let Some(r) = c.node(leader).ticket_status(t) {
                    break r.unwrap();
                }
            };
            // The followers' late steps (a persist after the commit) land too.
            c.run_for(5_000_000).unwrap();
            samples.push(Sample {
                index,
                start,
                end: Instant::now(),
            });
        }
        (samples, leader)
    });
    breakdown(&events, &samples, leader)
        .into_iter()
        .map(|r| r.name)
        .collect()
}

#[test]
fn a_fast_path_commit_marks_every_step_on_both_roles() {
    for d in [Durability::Memory, Durability::Fsync] {
        let names = steps_of(d);
        for want in [
            "leader ready",
            "leader sent",
            "leader persisted",
            "follower received",
            "follower ready",
            "follower persisted",
            "follower answered",
            "leader acked",
            "leader committed",
            "client returns",
        ] {
            assert!(
                names.iter().any(|n| n == want),
                "{d}: no {want} in {names:?}"
            );
        }
    }
    let names = steps_of(Durability::Replicated);
    for want in ["leader nic_acked", "follower received", "leader committed"] {
        assert!(
            names.iter().any(|n| n == want),
            "replicated: no {want} in {names:?}"
        );
    }
}
