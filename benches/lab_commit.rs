//! Criterion bench of the replicated commit through the embedded API in the lab: three
//! replicas on rxe1..3 (one process, real RDMA over Soft-RoCE), `Durability::Memory`, one
//! append at a time on the leader, waited for until committed, by payload size 8 B..64 KiB
//! (`Throughput::Bytes`). `ops/bench criterion` runs it (with `benches/verbs.rs`) inside the lab
//! and brings the reports back; on the host, without RDMA devices, it says so and exits 0.

use std::time::Duration;

use bench::lab::{LabCluster, in_lab};
use criterion::{BenchmarkId, Criterion, Throughput};
use replica::Durability;

/// Payload sizes measured.
const SIZES: [usize; 5] = [8, 64, 512, 4096, 64 * 1024 - 64];

fn main() {
    if !in_lab() {
        eprintln!(
            "lab_commit: not inside the lab (RDMALOG_LAB is unset); `ops/bench criterion` runs it there"
        );
        return;
    }
    let dir = std::env::temp_dir().join("rdmalog-lab-commit-bench");
    let cluster = LabCluster::open(Durability::Memory, &dir, 7300, 0xbe77, bench::lab::LAB_POLL)
        .expect("three replicas on rxe1..3");
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_secs(2))
        .measurement_time(Duration::from_secs(8))
        .sample_size(20)
        .configure_from_args();
    let mut g = c.benchmark_group("replicated_commit_embedded");
    for size in SIZES {
        let payload = vec![0x5au8; size];
        g.throughput(Throughput::Bytes(size as u64));
        g.bench_with_input(BenchmarkId::from_parameter(size), &payload, |b, p| {
            b.iter(|| {
                let k = cluster.leader(Duration::from_secs(30)).expect("a leader");
                cluster.logs[k]
                    .append(p)
                    .and_then(|h| h.wait(Duration::from_secs(30)))
                    .expect("committed")
            })
        });
    }
    g.finish();
    c.final_summary();
    cluster.close();
}
