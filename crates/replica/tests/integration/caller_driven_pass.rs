//! Scenario (issue 14): a caller that drives its own wait (`PollMode::Busy`) runs the leader's
//! passes with `Replica::process_until_resolved`. The pass stops at the events that commit the
//! caller's entry (under `Replicated` the write completions that stand for the followers'
//! answers, under `Memory` an answer): the ticket is resolved while the entry is not applied
//! yet, because raft's `Ready` behind the commit is left to the next pass. That next pass,
//! an ordinary one, applies it, and every node learns of the commit and applies it.

use fabric::sim::SimConfig;
use replica::sim::SimCluster;
use replica::{Durability, ReplicaConfig};

fn cluster(durability: Durability) -> (SimCluster, u64) {
    let zero = SimConfig {
        one_way_ns: 0,
        per_kib_ns: 0,
        jitter_ns: 0,
        ..SimConfig::default()
    };
    let mut c = SimCluster::new(3, 5, zero, |cfg: &mut ReplicaConfig| {
        cfg.durability = durability;
    })
    .unwrap();
    let leader = c.elect().unwrap();
    // Open the fast paths, and let the election's last messages land.
    for i in 0..4u8 {
        c.append(&[i; 64]).unwrap();
    }
    c.run_for(50_000_000).unwrap();
    (c, leader)
}

fn stops_at_the_commit(durability: Durability) {
    let (mut c, leader) = cluster(durability);
    let t = c.node(leader).propose(&[9; 64]).unwrap();
    let mut resolved = None;
    for _ in 0..1_000 {
        c.net.step();
        for id in 1..=3 {
            let r = c.node(id);
            if id == leader {
                r.process_until_resolved(t).unwrap();
            } else {
                r.process().unwrap();
            }
        }
        resolved = c.node(leader).ticket_status(t);
        if resolved.is_some() {
            break;
        }
    }
    assert!(
        matches!(resolved, Some(Ok(i)) if i == t.index),
        "{durability}: the entry committed: {resolved:?}"
    );
    let s = c.node(leader).status();
    assert_eq!(
        s.stats.passes_stopped_at_commit, 1,
        "{durability}: the committing pass stopped at the commit"
    );
    assert!(
        s.applied < t.index,
        "{durability}: the pass that committed {} stopped before applying it (applied {})",
        t.index,
        s.applied
    );

    // The next pass, an ordinary one, does the rest even with nothing new to poll.
    c.node(leader).process().unwrap();
    assert!(c.node(leader).status().applied >= t.index);
    // A ticket resolved before the pass stops nothing.
    c.node(leader).process_until_resolved(t).unwrap();
    assert_eq!(c.node(leader).status().stats.passes_stopped_at_commit, 1);
    let learned = c
        .run_until(1_000_000_000, |c| {
            (1..=3).all(|id| {
                let s = c.node(id).status();
                s.commit >= t.index && s.applied >= t.index
            })
        })
        .unwrap();
    assert!(
        learned,
        "{durability}: every node learned of the commit and applied it"
    );
}

#[test]
fn a_replicated_leader_stops_its_pass_at_the_completions_that_commit() {
    stops_at_the_commit(Durability::Replicated);
}

#[test]
fn a_memory_leader_stops_its_pass_at_the_answer_that_commits() {
    stops_at_the_commit(Durability::Memory);
}
