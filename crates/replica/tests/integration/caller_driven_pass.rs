//! Scenario (issue 14): a caller that drives its own wait (`PollMode::Busy`) runs the leader's
//! passes with `Replica::process_until_resolved`. The pass stops at the events that commit the
//! caller's entry (under `Replicated` the write completions that stand for the followers'
//! answers, under `Memory` an answer): the ticket is resolved while the entry is not applied
//! yet, because raft's `Ready` behind the commit is left to the next pass. That next pass,
//! an ordinary one, applies it, and every node learns of the commit and applies it.
//!
//! Only a leader of the ticket's term stops early: a deposed leader whose caller waits on an
//! entry a new leader replaced runs its pass in full, so that no reader sees the superseded
//! entry as committed.

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

fn isolate(c: &mut SimCluster, id: u64, from: &[u64], on: bool) {
    for &o in from {
        c.net.set_link(fabric::NodeId(id), fabric::NodeId(o), on);
        c.net.set_link(fabric::NodeId(o), fabric::NodeId(id), on);
    }
}

/// A deposed leader's caller drives its passes with `process_until_resolved` while the new
/// leader's append replaces its entry. The pass used to stop at that append, whose commit
/// index covered entries still only in raft's unstable log, before the `Ready` that cuts the
/// old suffix from the wal: `read` (what `Log::read` and subscriptions use, woken by the
/// pass) returned the superseded entry as committed and failed on the committed indexes
/// after it (found by a review helper). Every read up to the commit index must now give what
/// the new leader committed there.
fn a_deposed_leaders_caller_reads_only_what_was_committed(durability: Durability) {
    let mut c = SimCluster::new(3, 7, SimConfig::zero_delay(), |cfg: &mut ReplicaConfig| {
        cfg.durability = durability;
    })
    .unwrap();
    let a = c.elect().unwrap();
    for i in 0..3u8 {
        c.append(&[i; 16]).unwrap();
    }
    c.run_for(50_000_000).unwrap();
    let rest: Vec<u64> = (1..=3).filter(|&i| i != a).collect();
    isolate(&mut c, a, &rest, false);
    let t = c.node(a).propose(b"STALE-never-committed").unwrap();
    let leads = |c: &mut SimCluster, i: u64| c.node(i).status().role == replica::Role::Leader;
    assert!(
        c.run_until(20_000_000_000, |c| rest.iter().any(|&i| leads(c, i)))
            .unwrap(),
        "no new leader"
    );
    let b = *rest.iter().find(|&&i| leads(&mut c, i)).unwrap();
    for i in 0..3u8 {
        let tb = c.node(b).propose(&[0xB0 + i; 16]).unwrap();
        c.wait(b, tb).unwrap();
    }
    c.run_for(50_000_000).unwrap();
    let mut buf = Vec::new();
    assert_eq!(
        c.node(a).read_persisted(t.index, &mut buf).unwrap(),
        Some(t.term),
        "A holds its own entry, which never committed"
    );
    // Heal: A's caller waits on t, driving A's passes.
    isolate(&mut c, a, &rest, true);
    let mut resolved = None;
    for step in 0..200_000u64 {
        if !c.net.step() {
            let now = c.net.now();
            c.net.run_until(now + 10_000_000);
            for id in 1..=3 {
                c.node(id).tick();
            }
        } else if step % 64 == 0 {
            let now = c.net.now();
            c.net.run_until(now + 1_000_000);
        }
        for id in 1..=3 {
            if id == a {
                c.node(a).process_until_resolved(t).unwrap();
            } else {
                c.node(id).process().unwrap();
            }
        }
        if let Some(r) = c.node(a).ticket_status(t) {
            resolved = Some(r);
            break;
        }
    }
    let resolved = resolved.expect("A's ticket resolved");
    assert!(
        matches!(resolved, Err(ReplicaError::Superseded { .. })),
        "{resolved:?}"
    );
    // What A's readers see right after the pass that resolved it: for every committed index,
    // what the new leader committed there.
    let commit = c.node(a).commit_index();
    assert!(commit >= t.index);
    for i in t.index..=commit {
        let (mut here, mut there) = (Vec::new(), Vec::new());
        let got = c.node(a).read(i, &mut here);
        let want = c.node(b).read(i, &mut there).unwrap();
        assert!(
            matches!(&got, Ok(g) if *g == want) && here == there,
            "{durability}: A read {got:?} {:?} at committed index {i}; {b} committed {want:?} {:?}",
            String::from_utf8_lossy(&here),
            String::from_utf8_lossy(&there)
        );
    }
}

#[test]
fn a_deposed_memory_leaders_caller_reads_only_what_was_committed() {
    a_deposed_leaders_caller_reads_only_what_was_committed(Durability::Memory);
}

#[test]
fn a_deposed_replicated_leaders_caller_reads_only_what_was_committed() {
    a_deposed_leaders_caller_reads_only_what_was_committed(Durability::Replicated);
}
