//! Runs N replicated commits (64 B, three replicas, in-process fabric with zero delay, memory
//! durability) so that `valgrind --tool=callgrind` can count instructions per commit: run it
//! with two values of N and divide the difference in instructions by the difference in N.
//!
//! `cargo build --release -p replica --example commit_cost`, then
//! `valgrind --tool=callgrind target/release/examples/commit_cost 200` and `... 1200`. A second
//! argument picks the durability (`memory`, the default, `replicated` or `fsync`), a third the
//! payload size in bytes (64 by default); it prints how many commits the leader counted on a
//! write's completion. `ops/commit-cost` runs both and
//! splits the difference by role.
//!
//! Every call into a replica goes through one of the `#[inline(never)]` functions below, so a
//! profile attributes instructions to a role by their inclusive cost: `leader_propose` +
//! `leader_pass` + `leader_status` is the leader's whole work per commit, `follower_pass` the
//! followers'. `SimNet::step` (the simulated wire) and the `SimEndpoint` methods (the
//! in-process fabric's own bookkeeping) are test scaffolding and are subtracted by name.
//!
//! `commit_cost critical N [durability]` measures the leader's critical path alone: each commit
//! runs from `critical_propose` through `critical_pass` (the leader's passes, each made as a
//! caller waiting on its append makes it under `PollMode::Busy`:
//! `Replica::process_until_resolved`, which stops at the events that commit it) until
//! `critical_status` reports it committed, then everything still in flight is delivered and
//! handled by `settle_pass`, outside that window, before the next proposal. `critical_*`'s
//! inclusive cost per commit is the leader's work from propose to commit; the rest of the
//! pass that commits it (raft's `Ready`, the apply) falls in the first `settle_pass`.
//!
//! `commit_cost pipelined N [durability]` keeps [`PIPELINE`] appends in flight instead of one:
//! the leader proposes until that many wait, and proposes again as the oldest commit. Its
//! difference between two values of N, divided, is the cost per entry with raft batching
//! what is pending (issue 14's goal at 64 in flight).
//!
//! `commit_cost idle N` instead runs N driver passes of every replica with nothing to do (no
//! packet, no tick, no proposal): the difference between two values of N, divided by 3 N, is
//! the cost of one idle pass of `Replica::process`.

use fabric::sim::{SimConfig, SimEndpoint};
use replica::sim::SimCluster;
use replica::{Durability, Replica, ReplicaError, Ticket};

#[inline(never)]
fn leader_propose(r: &mut Replica<SimEndpoint>, payload: &[u8]) -> Result<Ticket, ReplicaError> {
    r.propose(payload)
}

// The two passes differ by a marker the optimiser cannot drop, so that the linker does not
// fold them into one function (which would credit the followers' work to the leader).
#[inline(never)]
fn leader_pass(r: &mut Replica<SimEndpoint>) -> Result<(), ReplicaError> {
    std::hint::black_box(1u8);
    r.process()
}

#[inline(never)]
fn follower_pass(r: &mut Replica<SimEndpoint>) -> Result<(), ReplicaError> {
    std::hint::black_box(2u8);
    r.process()
}

#[inline(never)]
fn leader_status(r: &Replica<SimEndpoint>, t: Ticket) -> Option<Result<u64, ReplicaError>> {
    r.ticket_status(t)
}

#[inline(never)]
fn critical_propose(r: &mut Replica<SimEndpoint>, payload: &[u8]) -> Result<Ticket, ReplicaError> {
    std::hint::black_box(3u8);
    r.propose(payload)
}

/// The leader's pass as a caller that drives its own wait makes it (`PollMode::Busy`): it
/// stops at the events that commit `t` and leaves the rest to the next pass.
#[inline(never)]
fn critical_pass(r: &mut Replica<SimEndpoint>, t: Ticket) -> Result<(), ReplicaError> {
    std::hint::black_box(4u8);
    r.process_until_resolved(t)
}

#[inline(never)]
fn critical_status(r: &Replica<SimEndpoint>, t: Ticket) -> Option<Result<u64, ReplicaError>> {
    std::hint::black_box(5u8);
    r.ticket_status(t)
}

#[inline(never)]
fn settle_pass(r: &mut Replica<SimEndpoint>) -> Result<(), ReplicaError> {
    std::hint::black_box(6u8);
    r.process()
}

/// One commit measured for the leader's critical path (see the module's documentation).
fn critical_commit(c: &mut SimCluster, leader: u64, payload: &[u8]) -> Result<(), ReplicaError> {
    let t = critical_propose(c.node(leader), payload)?;
    loop {
        c.net.step();
        pass_each(c, leader, |r| critical_pass(r, t), follower_pass)?;
        if let Some(r) = critical_status(c.node(leader), t) {
            r?;
            break;
        }
    }
    // Deliver and handle what is still in flight (the other follower's write and answer),
    // so that the next commit's window holds none of this one's work.
    loop {
        let more = c.net.step();
        pass_each(c, leader, settle_pass, settle_pass)?;
        if !more && c.net.next_time().is_none() {
            return Ok(());
        }
    }
}

/// Appends in flight in `commit_cost pipelined`.
const PIPELINE: usize = 64;

/// N commits with up to [`PIPELINE`] in flight, through the same role functions as the
/// one-at-a-time run.
fn pipelined(c: &mut SimCluster, leader: u64, payload: &[u8], n: u64) -> Result<(), ReplicaError> {
    let mut waiting = std::collections::VecDeque::with_capacity(PIPELINE);
    let mut proposed = 0;
    while proposed < n || !waiting.is_empty() {
        while proposed < n && waiting.len() < PIPELINE {
            waiting.push_back(leader_propose(c.node(leader), payload)?);
            proposed += 1;
        }
        c.net.step();
        pass_all(c, leader)?;
        while let Some(&t) = waiting.front() {
            match leader_status(c.node(leader), t) {
                Some(r) => {
                    r?;
                    waiting.pop_front();
                }
                None => break,
            }
        }
    }
    Ok(())
}

/// One driver pass over every replica in id order: the leader through `lead`, the others
/// through `follow` (role-named functions above, called directly: each is its own type).
fn pass_each(
    c: &mut SimCluster,
    leader: u64,
    lead: impl Fn(&mut Replica<SimEndpoint>) -> Result<(), ReplicaError>,
    follow: impl Fn(&mut Replica<SimEndpoint>) -> Result<(), ReplicaError>,
) -> Result<(), ReplicaError> {
    for (&id, r) in c.nodes.iter_mut() {
        let r = r.as_mut().expect("no node is killed here");
        if id == leader { lead(r)? } else { follow(r)? }
    }
    Ok(())
}

/// One driver pass over every replica, each through its role's function.
fn pass_all(c: &mut SimCluster, leader: u64) -> Result<(), ReplicaError> {
    pass_each(c, leader, leader_pass, follower_pass)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args: Vec<String> = std::env::args().collect();
    let idle = args.get(1).is_some_and(|a| a == "idle");
    let critical = args.get(1).is_some_and(|a| a == "critical");
    let pipeline = args.get(1).is_some_and(|a| a == "pipelined");
    if idle || critical || pipeline {
        args.remove(1);
    }
    let n: u64 = args.get(1).map(|a| a.parse()).transpose()?.unwrap_or(1000);
    let durability: Durability = match args.get(2) {
        Some(d) => d.parse()?,
        None => Durability::Memory,
    };
    let bytes: usize = args.get(3).map(|a| a.parse()).transpose()?.unwrap_or(64);
    let mut c = SimCluster::new(3, 1, SimConfig::zero_delay(), |cfg| {
        cfg.durability = durability
    })?;
    let leader = c.elect()?;
    // Let the election's last messages land, so that the runs below start from a quiet cluster.
    c.run_for(50_000_000)?;
    if idle {
        for _ in 0..n {
            pass_all(&mut c, leader)?;
        }
        println!("{n} idle passes of each of 3 replicas ({durability})");
        return Ok(());
    }
    let payload = vec![7u8; bytes];
    if pipeline {
        pipelined(&mut c, leader, &payload, n)?;
        let s = c.node(leader).stats();
        println!(
            "{n} commits, {PIPELINE} in flight ({durability}; {} counted on a write's completion; \
             {} appends sent by the fast path, {} by the slow)",
            s.nic_acks, s.fast_appends, s.slow_appends
        );
        return Ok(());
    }
    if critical {
        for _ in 0..n {
            critical_commit(&mut c, leader, &payload)?;
        }
        let nic = c.node(leader).stats().nic_acks;
        println!(
            "{n} commits, critical path ({durability}; {nic} counted on a write's completion)"
        );
        return Ok(());
    }
    for _ in 0..n {
        let t = leader_propose(c.node(leader), &payload)?;
        loop {
            c.net.step();
            pass_all(&mut c, leader)?;
            if let Some(r) = leader_status(c.node(leader), t) {
                r?;
                break;
            }
        }
    }
    let nic = c.node(leader).stats().nic_acks;
    println!("{n} commits ({durability}; {nic} counted on a write's completion)");
    Ok(())
}
