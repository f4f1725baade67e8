//! Runs N replicated commits (64 B, three replicas, in-process fabric with zero delay, memory
//! durability) so that `valgrind --tool=callgrind` can count instructions per commit: run it
//! with two values of N and divide the difference in instructions by the difference in N.
//!
//! `cargo build --release -p replica --example commit_cost`, then
//! `valgrind --tool=callgrind target/release/examples/commit_cost 200` and `... 1200`.

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
    let mut c = SimCluster::new(3, 1, zero, |cfg| cfg.durability = Durability::Memory)?;
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
    println!("{n} commits");
    Ok(())
}
