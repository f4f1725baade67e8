//! Runs N replicated commits (64 B, three replicas, in-process fabric with zero delay, memory
//! durability) so that `valgrind --tool=callgrind` can count instructions per commit: run it
//! with two values of N and divide the difference in instructions by the difference in N.
//!
//! `cargo build --release -p replica --example commit_cost`, then
//! `valgrind --tool=callgrind target/release/examples/commit_cost 200` and `... 1200`. A second
//! argument picks the durability (`memory`, the default, `replicated` or `fsync`); it prints how
//! many commits the leader counted on a write's completion.

use fabric::sim::SimConfig;
use replica::Durability;
use replica::sim::SimCluster;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n: u64 = std::env::args()
        .nth(1)
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(1000);
    let zero = SimConfig {
        one_way_ns: 0,
        per_kib_ns: 0,
        jitter_ns: 0,
        ..SimConfig::default()
    };
    let durability: Durability = match std::env::args().nth(2) {
        Some(d) => d.parse()?,
        None => Durability::Memory,
    };
    let mut c = SimCluster::new(3, 1, zero, |cfg| cfg.durability = durability)?;
    let leader = c.elect()?;
    let payload = [7u8; 64];
    for _ in 0..n {
        let t = c.node(leader).propose(&payload)?;
        loop {
            c.net.step();
            c.process_all()?;
            if let Some(r) = c.node(leader).ticket_status(t) {
                r?;
                break;
            }
        }
    }
    let nic = c.node(leader).stats().nic_acks;
    println!("{n} commits ({durability}; {nic} counted on a write's completion)");
    Ok(())
}
