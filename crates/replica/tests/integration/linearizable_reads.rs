//! Linearizable reads (raft's ReadIndex, `Replica::read_index`) on the in-process fabric:
//! the leader's read resolves at or above everything committed before it; a follower refuses
//! (`NotLeader`); a read asked of a new leader before it committed in its term waits and then
//! resolves; and a deposed leader, paused while the others elected a new leader and committed
//! more, never answers a read below the new commit index: it steps down and answers
//! `NotLeader`. With `Mutation::ReadWithoutQuorum` (the leader answers from its own commit
//! index without a majority) the deposed-leader check fails.

use fabric::sim::SimConfig;
use replica::sim::SimCluster;
use replica::{Mutation, ReadTicket, ReplicaError};

/// Runs until read `t` on `node` resolves (5 s of virtual time at most).
fn resolve(c: &mut SimCluster, node: u64, t: ReadTicket) -> Option<Result<u64, ReplicaError>> {
    let mut out = None;
    c.run_until(5_000_000_000, |c| {
        out = c.node(node).read_status(t);
        out.is_some()
    })
    .unwrap();
    out
}

/// The deposed-leader scenario: what the old leader's read answered (if anything), and the
/// new leader's commit index it must not fall below.
fn deposed_leader_read(mutation: Mutation) -> (Option<Result<u64, ReplicaError>>, u64) {
    let mut c =
        SimCluster::new(3, 11, SimConfig::default(), |cfg| cfg.mutation = mutation).unwrap();
    let old = c.elect().unwrap();
    for i in 0..5u8 {
        c.append(&[i; 64]).unwrap();
    }
    c.paused.insert(old);
    let ok = c
        .run_until(10_000_000_000, |c| c.leader().is_some_and(|l| l != old))
        .unwrap();
    assert!(ok, "no new leader while the old one was paused");
    let new = c.leader().unwrap();
    for i in 0..5u8 {
        c.append(&[100 + i; 64]).unwrap();
    }
    let new_commit = c.node(new).commit_index();
    c.paused.remove(&old);
    // The old leader wakes believing it leads, and is asked for a read before it hears of
    // the new term.
    let t = c
        .node(old)
        .read_index()
        .expect("it still believes it leads");
    (resolve(&mut c, old, t), new_commit)
}

#[test]
fn reads_on_the_leader_resolve_and_followers_refuse() {
    let mut c = SimCluster::new(3, 5, SimConfig::default(), |_| {}).unwrap();
    let l = c.elect().unwrap();
    let mut last = 0;
    for i in 0..10u8 {
        last = c.append(&[i; 100]).unwrap();
    }
    let t = c.node(l).read_index().unwrap();
    let r = resolve(&mut c, l, t).expect("the read resolved");
    let index = r.unwrap();
    assert!(
        index >= last,
        "read index {index} below the last commit {last}"
    );
    assert!(c.node(l).commit_index() >= index);

    let f = (1..=3).find(|&i| i != l).unwrap();
    match c.node(f).read_index() {
        Err(ReplicaError::NotLeader { leader_hint }) => assert_eq!(leader_hint, Some(l)),
        other => panic!("a follower answered a linearizable read: {other:?}"),
    }
}

#[test]
fn a_read_asked_before_the_leader_committed_in_its_term_waits_then_resolves() {
    let mut c = SimCluster::new(3, 7, SimConfig::default(), |_| {}).unwrap();
    let ok = c
        .run_until(30_000_000_000, |c| c.leader().is_some())
        .unwrap();
    assert!(ok);
    // At once: the new leader's no-op has not committed yet.
    let l = c.leader().unwrap();
    let t = c.node(l).read_index().unwrap();
    let r = resolve(&mut c, l, t).expect("the read resolved");
    let index = r.unwrap();
    assert!(index >= 1, "the read index covers the leader's own no-op");
}

#[test]
fn a_deposed_leader_never_answers_a_read_below_the_new_commit() {
    let (r, new_commit) = deposed_leader_read(Mutation::None);
    match r {
        Some(Err(ReplicaError::NotLeader { .. })) => {}
        Some(Ok(index)) => assert!(
            index >= new_commit,
            "a deposed leader answered a read at {index}, below the new leader's commit {new_commit}"
        ),
        other => panic!("the deposed leader's read did not resolve: {other:?}"),
    }
}

#[test]
fn the_deposed_leader_check_catches_reads_without_a_quorum() {
    let (r, new_commit) = deposed_leader_read(Mutation::ReadWithoutQuorum);
    match r {
        Some(Ok(index)) if index < new_commit => {}
        other => panic!(
            "with reads answered without a quorum, the deposed leader should answer below {new_commit}: {other:?}"
        ),
    }
}
