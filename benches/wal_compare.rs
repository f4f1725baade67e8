//! `wal` against okaywal at equal durability (criterion; the goal is reported, not asserted).
//!
//! `durable/LOG/WRITERS/PAYLOAD`: WRITERS threads each append PAYLOAD-byte entries, one at a
//! time, and every append returns only after an fdatasync covered it (`Durability::Fsync` for
//! `wal`, `EntryWriter::commit` for okaywal); both logs let concurrent writers share an
//! fdatasync. Goal: `wal` >= 2 x okaywal for the same writers and payload.
//!
//! After criterion, a short timed run prints the ratios. Run with
//! `cargo bench -j2 -p wal-compare --bench wal_compare -- --warm-up-time 1 --measurement-time 3`.
//! Set `WAL_BENCH_DIR` to put the logs on a particular disk (default: target/).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group};
use wal_compare::{Log, Opened, open, run};

/// Writer counts, as in the wal bench's group-commit goal.
const WRITERS: [usize; 3] = [1, 8, 64];
/// Payload sizes: a small raft entry and a page.
const PAYLOADS: [usize; 2] = [64, 4096];
const LOGS: [(Log, &str); 2] = [(Log::Ours, "wal"), (Log::Okaywal, "okaywal")];

fn bench_dir() -> PathBuf {
    let base = std::env::var_os("WAL_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target"));
    std::fs::create_dir_all(&base).unwrap();
    tempfile::tempdir_in(base).unwrap().keep()
}

fn opened(log: Log, dir: &std::path::Path, name: String) -> Arc<Opened> {
    Arc::new(open(log, &dir.join(name)).unwrap())
}

fn close(log: Arc<Opened>) {
    Arc::try_unwrap(log).unwrap().close().unwrap();
}

fn benches(c: &mut Criterion) {
    let dir = bench_dir();
    let mut group = c.benchmark_group("durable");
    group.sample_size(10);
    for (log, name) in LOGS {
        for writers in WRITERS {
            for payload in PAYLOADS {
                let opened = opened(log, &dir, format!("{name}-{writers}-{payload}"));
                group.throughput(Throughput::Bytes(payload as u64));
                let id = BenchmarkId::new(name, format!("{writers}/{payload}"));
                group.bench_function(id, |b| {
                    b.iter_custom(|n| run(&opened, writers, payload, n.max(writers as u64)))
                });
                close(opened);
            }
        }
    }
    group.finish();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A short timed run of each configuration, printing `wal` / okaywal.
fn print_ratios() {
    let dir = bench_dir();
    println!("\nwal vs okaywal, durable appends/s (goal: wal >= 2 x okaywal):");
    for writers in WRITERS {
        for payload in PAYLOADS {
            let mut rates = [0.0f64; 2];
            for (i, (log, name)) in LOGS.into_iter().enumerate() {
                let opened = opened(log, &dir, format!("ratio-{name}-{writers}-{payload}"));
                let total = 300 * writers as u64;
                // One warm-up pass, then the measured one.
                run(&opened, writers, payload, total / 4);
                let elapsed: Duration = run(&opened, writers, payload, total);
                rates[i] = total as f64 / elapsed.as_secs_f64();
                close(opened);
            }
            println!(
                "  {writers:>2} writers, {payload:>4} B: wal {:>8.0}/s, okaywal {:>8.0}/s = {:.2} x",
                rates[0],
                rates[1],
                rates[0] / rates[1]
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

criterion_group!(compare, benches);

fn main() {
    compare();
    Criterion::default().configure_from_args().final_summary();
    print_ratios();
}
