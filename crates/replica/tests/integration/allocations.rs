//! Scenario: a commit allocates no more than raft-rs makes it allocate. Three replicas on the
//! in-process fabric (zero delay) commit 64 B entries one at a time, then 64 in flight, and
//! the allocations their thread makes are counted (`allocation_counter`, per thread, so the
//! other tests of this binary do not count). What a `Replicated` commit allocates, three
//! replicas together (17.2; attributed by callgrind at the same code, benches/RESULTS.md,
//! "Allocations per commit, counted by a test"):
//!
//! - raft-rs's own: its `Ready` (3), its message vectors (1) and slices (2);
//! - forced by raft-rs's types: the `Vec<Entry>` its `Storage::entries` returns (3), the
//!   entries vector of a received `MsgAppend` (2, one per follower: a `Message` owns its
//!   entries), the one-entry vector of the leader's `MsgPropose` (1);
//! - the in-process fabric's scaffolding (5.2: a buffer per posted Send and per placed
//!   Write; `fabric::rdma` copies into buffers made at connect instead).
//!
//! A `Memory` commit adds the followers' answers (raft-rs's message vectors and the fabric's
//! sends: 22.4). The bounds are these counts with a margin below one allocation per commit,
//! so a new allocation per commit anywhere on the path (the leader's proposal, the
//! descriptors, a follower's take, accept, persist or apply, a pass with nothing to do) fails
//! the test. It is deterministic: one thread drives the cluster, and the simulated network has
//! no jitter.

use allocation_counter::measure;
use fabric::sim::SimConfig;
use replica::sim::SimCluster;
use replica::{Durability, ReplicaConfig, Ticket};

/// Allocations per `Replicated` commit, one in flight, three replicas: 17.2 measured.
const REPLICATED: f64 = 18.0;
/// The same under `Memory`: 22.4 measured.
const MEMORY: f64 = 23.0;
/// Allocations per `Replicated` entry with 64 in flight, three replicas: 0.63 measured
/// (the per-batch allocations above, shared by the entries of a batch).
const PIPELINED: f64 = 1.0;

fn cluster(durability: Durability) -> (SimCluster, u64) {
    let mut c = SimCluster::new(3, 1, SimConfig::zero_delay(), |cfg: &mut ReplicaConfig| {
        cfg.durability = durability;
    })
    .unwrap();
    let leader = c.elect().unwrap();
    // Let the election's last messages land.
    c.run_for(50_000_000).unwrap();
    (c, leader)
}

fn settled(c: &mut SimCluster, leader: u64, t: Ticket) -> bool {
    match c.node(leader).ticket_status(t) {
        Some(r) => {
            r.unwrap();
            true
        }
        None => false,
    }
}

/// `n` commits one at a time: propose, then deliver and process until the ticket resolves.
fn one_at_a_time(c: &mut SimCluster, leader: u64, n: u64) {
    let payload = [7u8; 64];
    for _ in 0..n {
        let t = c.node(leader).propose(&payload).unwrap();
        while !settled(c, leader, t) {
            c.net.step();
            c.process_all().unwrap();
        }
    }
}

/// `n` commits with up to 64 in flight.
fn pipelined(c: &mut SimCluster, leader: u64, n: u64) {
    let payload = [7u8; 64];
    let mut waiting = std::collections::VecDeque::with_capacity(64);
    let mut proposed = 0;
    while proposed < n || !waiting.is_empty() {
        while proposed < n && waiting.len() < 64 {
            waiting.push_back(c.node(leader).propose(&payload).unwrap());
            proposed += 1;
        }
        c.net.step();
        c.process_all().unwrap();
        while waiting.front().is_some_and(|&t| settled(c, leader, t)) {
            waiting.pop_front();
        }
    }
}

/// Allocations per commit of `run(n)`, from two values of `n` (what a run does once, its
/// first commits growing buffers to size, cancels out).
fn per_commit(durability: Durability, run: fn(&mut SimCluster, u64, u64), a: u64, b: u64) -> f64 {
    let count = |n| {
        let (mut c, leader) = cluster(durability);
        measure(|| run(&mut c, leader, n)).count_total
    };
    let (low, high) = (count(a), count(b));
    (high - low) as f64 / (b - a) as f64
}

#[test]
fn a_replicated_commit_allocates_only_what_raft_rs_makes_it() {
    let one = per_commit(Durability::Replicated, one_at_a_time, 100, 400);
    println!("Replicated, one in flight: {one:.2} allocations per commit");
    assert!(
        one <= REPLICATED,
        "a Replicated commit allocates {one:.2} times, three replicas together (bound \
         {REPLICATED}): something on the commit path allocates per commit"
    );
    let many = per_commit(Durability::Replicated, pipelined, 640, 2560);
    println!("Replicated, 64 in flight: {many:.2} allocations per entry");
    assert!(
        many <= PIPELINED,
        "with 64 in flight an entry allocates {many:.2} times (bound {PIPELINED})"
    );
}

#[test]
fn a_memory_commit_allocates_only_what_raft_rs_makes_it() {
    let one = per_commit(Durability::Memory, one_at_a_time, 100, 400);
    println!("Memory, one in flight: {one:.2} allocations per commit");
    assert!(
        one <= MEMORY,
        "a Memory commit allocates {one:.2} times (bound {MEMORY})"
    );
}
