//! Scenario (issue 14): a caller that drives its own wait (`PollMode::Busy`) runs the leader's
//! passes with `Replica::process_until_resolved`. The pass stops at the events that commit the
//! caller's entry (under `Replicated` the write completions that stand for the followers'
//! answers, under `Memory` an answer): the ticket is resolved while the entry is not applied
//! yet, because raft's `Ready` behind the commit is left to the next pass. That next pass,
//! an ordinary one, applies it, and every node learns of the commit and applies it.

use fabric::sim::SimConfig;
use replica::sim::SimCluster;
use replica::{Durability, Mutation, ReplicaConfig, ReplicaError, Ticket};

fn cluster(durability: Durability) -> (SimCluster, u64) {
    cluster_with(durability, Mutation::None)
}

/// A three-node cluster of `durability` with its fast paths open and nothing in flight: the
/// cluster and its leader.
pub fn cluster_with(durability: Durability, mutation: Mutation) -> (SimCluster, u64) {
    let mut c = SimCluster::new(3, 5, SimConfig::zero_delay(), |cfg: &mut ReplicaConfig| {
        cfg.durability = durability;
        cfg.mutation = mutation;
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

/// Steps the wire by hand, the leader making a caller's passes for `t` and the followers
/// ordinary ones, until the leader resolves `t` (or 1,000 steps passed): its status then.
pub fn drive_until_resolved(
    c: &mut SimCluster,
    leader: u64,
    t: Ticket,
) -> Option<Result<u64, ReplicaError>> {
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
        if let Some(r) = c.node(leader).ticket_status(t) {
            return Some(r);
        }
    }
    None
}

fn stops_at_the_commit(durability: Durability) {
    let (mut c, leader) = cluster(durability);
    let t = c.node(leader).propose(&[9; 64]).unwrap();
    let resolved = drive_until_resolved(&mut c, leader, t);
    assert!(
        matches!(resolved, Some(Ok(i)) if i == t.index),
        "{durability}: the entry committed: {resolved:?}"
    );
    let s = c.node(leader).status();
    assert_eq!(
        s.stats.passes_stopped_at_commit, 1,
        "{durability}: the committing pass stopped at the commit"
    );
    if durability == Durability::Replicated {
        // The write completion that made the quorum resolved the ticket; raft steps it (and
        // moves its commit index) in the next pass.
        assert!(
            s.commit < t.index,
            "{durability}: the ticket resolved before raft stepped the completion (commit {})",
            s.commit
        );
    }
    assert!(
        s.applied < t.index,
        "{durability}: the pass that committed {} stopped before applying it (applied {})",
        t.index,
        s.applied
    );

    // The next pass, an ordinary one, does the rest even with nothing new to poll.
    c.node(leader).process().unwrap();
    let s = c.node(leader).status();
    assert!(s.commit >= t.index && s.applied >= t.index, "{s:?}");
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

/// A linearizable read that starts after a caller learned of its commit sees it, also when the
/// commit was learned from a write completion raft has not stepped yet (`Replicated`): the read
/// steps them first, so that its read index covers every commit a caller was told of.
#[test]
fn a_read_after_a_commit_learned_from_write_completions_covers_it() {
    let (read, committed) = read_after_a_commit_from_write_completions(Mutation::None);
    assert!(
        read >= committed,
        "a read that began after the commit of {committed} was told of read at {read}"
    );
}

/// The control: with the read not stepping the completions first
/// (`Mutation::ReadBeforeNicAcks`), the same read misses the commit.
#[test]
fn a_read_that_does_not_step_the_completions_first_misses_the_commit() {
    let (read, committed) = read_after_a_commit_from_write_completions(Mutation::ReadBeforeNicAcks);
    assert!(
        read < committed,
        "the mutation changed nothing (read at {read}, commit at {committed}): the test shows nothing"
    );
}

/// A ticket resolved from a write completion raft has not stepped, then a linearizable read
/// on the leader: (the read's index, the ticket's index).
fn read_after_a_commit_from_write_completions(mutation: Mutation) -> (u64, u64) {
    let (mut c, leader) = cluster_with(Durability::Replicated, mutation);
    let t = c.node(leader).propose(&[7; 64]).unwrap();
    let resolved = drive_until_resolved(&mut c, leader, t);
    assert!(
        matches!(resolved, Some(Ok(i)) if i == t.index),
        "{resolved:?}"
    );
    assert!(
        c.node(leader).status().commit < t.index,
        "the scenario needs a commit raft has not stepped yet"
    );
    let read = c.node(leader).read_index().unwrap();
    // Stepped by hand as above: `run_until` would fire the ticks the manual steps skipped in
    // one burst, and the leader would step down.
    let mut index = None;
    for _ in 0..1_000 {
        c.net.step();
        for id in 1..=3 {
            c.node(id).process().unwrap();
        }
        index = c.node(leader).read_status(read);
        if index.is_some() {
            break;
        }
    }
    let index = index.expect("the read was never confirmed").unwrap();
    (index, t.index)
}
