//! The software overhead of one replicated commit: a 3-node cluster on the in-process fabric
//! with zero network delay and an in-memory disk, so what remains is raft-rs, the ring, the
//! wal, the wire format and the fast path. Run: `cargo bench -p replica --bench replica`.
//! Instructions per commit: `valgrind --tool=callgrind` on the bench binary (see RESULTS.md).

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use fabric::sim::SimConfig;
use replica::Durability;
use replica::sim::SimCluster;

fn round_trip(c: &mut Criterion) {
    let mut g = c.benchmark_group("replicated_commit");
    // Memory and Replicated (the NIC-acknowledged commit) only: the simulator's disk is
    // FaultFs, whose fsync snapshots whole files and would measure the test double; Fsync is
    // measured on real disks in the lab.
    for (name, durability) in [
        ("memory", Durability::Memory),
        ("replicated", Durability::Replicated),
    ] {
        for size in [8usize, 64, 512, 4096, 16 * 1024, 64 * 1024] {
            let mut cluster = SimCluster::new(3, 1, SimConfig::zero_delay(), |cfg| {
                cfg.durability = durability;
                cfg.ring_bytes = 16 << 20;
            })
            .expect("cluster");
            let leader = cluster.elect().expect("leader");
            let payload = vec![7u8; size];
            g.throughput(Throughput::Bytes(size as u64));
            g.bench_with_input(BenchmarkId::new(name, size), &payload, |b, p| {
                b.iter(|| {
                    let t = cluster.node(leader).propose(black_box(p)).expect("propose");
                    // Drain the fabric until the ticket resolves; no ticks are needed.
                    loop {
                        cluster.net.step();
                        cluster.process_all().expect("process");
                        if let Some(r) = cluster.node(leader).ticket_status(t) {
                            break r.expect("committed");
                        }
                    }
                })
            });
        }
    }
    g.finish();
}

criterion_group!(benches, round_trip);
criterion_main!(benches);
