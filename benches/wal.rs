//! wal benchmarks (criterion; goals are reported, not asserted).
//!
//! * `ring_append/N`: one thread appends N-byte entries into the ring, no fsync
//!   (goal: >= 10 M appends/s at 64 B; >= 0.5 x memcpy bandwidth at 4 KiB).
//! * `memcpy/N`: the memcpy reference for the same sizes, measured in the same run, into one
//!   hot N-byte buffer (it stays in L1), and `memcpy_ring/N` into successive N-byte pieces of
//!   a buffer as large as the bench's ring: the same memory footprint as the ring append,
//!   which writes a new part of its 64 MiB ring every time.
//! * `group_commit/T`: T threads append 64 B entries with `Durability::Fsync` to a real disk
//!   (goal: >= 50 x the fsync-per-append reference below).
//! * `fsync_per_append`: write 64 B + fdatasync per append with `std::fs`, the reference.
//!
//! After criterion, a short timed run prints the ratios against the goals. Run with
//! `cargo bench -p wal --bench wal -- --warm-up-time 1 --measurement-time 2`.
//! Set `WAL_BENCH_DIR` to put the durable benches on a particular disk (default: target/).

use std::fs::OpenOptions;
use std::hint::black_box;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group};
use wal::fs::StdFs;
use wal::{
    AnonymousMemory, Consumer, Durability, Position, Producer, RingConfig, Term, Wal, WalConfig,
    WalError, ring,
};

/// Payload sizes from 8 B to 64 KiB, as the issue asks; the 1 MiB block holds the largest.
const SIZES: [usize; 6] = [8, 64, 512, 4096, 16384, 65536];
/// Ring size for the append benches: 64 MiB, big enough that releases are rare.
const RING_BYTES: u64 = 64 << 20;
/// Entry size of the durable benches, as in the goal.
const DURABLE_PAYLOAD: usize = 64;

fn new_ring() -> (Producer, Consumer) {
    let memory = Arc::new(AnonymousMemory::new(RING_BYTES).unwrap());
    ring(
        memory,
        RingConfig {
            capacity_bytes: RING_BYTES,
            block_bytes: 1 << 20,
        },
        Position::default(),
    )
    .unwrap()
}

fn append(producer: &mut Producer, consumer: &mut Consumer, payload: &[u8]) {
    loop {
        match producer.append_next(Term(1), payload) {
            Ok(_) => return,
            Err(WalError::RingFull { .. }) => {
                let tail = consumer.tail();
                consumer.release(tail).unwrap();
            }
            Err(other) => panic!("append failed: {other}"),
        }
    }
}

fn bench_dir() -> PathBuf {
    let base = std::env::var_os("WAL_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target"));
    std::fs::create_dir_all(&base).unwrap();
    tempfile::tempdir_in(base).unwrap().keep()
}

fn durable_config() -> WalConfig {
    WalConfig {
        block_bytes: 1 << 20,
        segment_data_bytes: 256 << 20,
        max_batch_bytes: 4 << 20,
        ..WalConfig::default()
    }
}

/// Runs `total` Fsync appends spread over `threads` threads; returns the elapsed time.
fn group_commit(wal: &Arc<Wal>, threads: usize, total: u64) -> Duration {
    let per_thread = (total / threads as u64).max(1);
    let start = Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let wal = Arc::clone(wal);
            std::thread::spawn(move || {
                let payload = [7u8; DURABLE_PAYLOAD];
                for _ in 0..per_thread {
                    wal.append_next(Term(1), &payload, Durability::Fsync)
                        .unwrap();
                }
            })
        })
        .collect();
    for handle in handles {
        handle.join().unwrap();
    }
    start.elapsed() * total as u32 / (per_thread * threads as u64) as u32
}

/// A buffer of the ring's size that `copy` fills piece after piece, wrapping at its end, as
/// the ring append does: the memcpy reference with the ring append's memory footprint.
struct RingSized {
    bytes: Vec<u8>,
    at: usize,
}

impl RingSized {
    fn new() -> Self {
        RingSized {
            bytes: vec![0; RING_BYTES as usize],
            at: 0,
        }
    }

    fn copy(&mut self, source: &[u8]) {
        if self.at + source.len() > self.bytes.len() {
            self.at = 0;
        }
        self.bytes[self.at..self.at + source.len()].copy_from_slice(source);
        black_box(&mut self.bytes);
        self.at += source.len();
    }
}

/// The reference: one write and one fdatasync per 64 B append.
fn fsync_per_append(file: &mut std::fs::File, iterations: u64) -> Duration {
    let payload = [7u8; DURABLE_PAYLOAD];
    let start = Instant::now();
    for _ in 0..iterations {
        file.write_all(&payload).unwrap();
        file.sync_data().unwrap();
    }
    start.elapsed()
}

fn benches(c: &mut Criterion) {
    let mut group = c.benchmark_group("ring_append");
    let (mut producer, mut consumer) = new_ring();
    for size in SIZES {
        let payload = vec![0x5Au8; size];
        group.throughput(Throughput::Bytes(size as u64));
        group.bench_with_input(BenchmarkId::from_parameter(size), &payload, |b, payload| {
            b.iter(|| append(&mut producer, &mut consumer, black_box(payload)))
        });
    }
    group.finish();

    let mut group = c.benchmark_group("memcpy");
    for size in SIZES {
        let source = vec![0x5Au8; size];
        let mut target = vec![0u8; size];
        group.throughput(Throughput::Bytes(size as u64));
        group.bench_with_input(BenchmarkId::from_parameter(size), &source, |b, source| {
            b.iter(|| {
                target.copy_from_slice(black_box(source));
                black_box(&mut target);
            })
        });
    }
    group.finish();

    let mut group = c.benchmark_group("memcpy_ring");
    for size in SIZES {
        let source = vec![0x5Au8; size];
        let mut target = RingSized::new();
        group.throughput(Throughput::Bytes(size as u64));
        group.bench_with_input(BenchmarkId::from_parameter(size), &source, |b, source| {
            b.iter(|| target.copy(black_box(source)))
        });
    }
    group.finish();

    let dir = bench_dir();
    let mut group = c.benchmark_group("group_commit");
    group.sample_size(10);
    for threads in [1usize, 8, 64] {
        let (wal, _) = Wal::open(
            Arc::new(StdFs),
            &dir.join(format!("gc{threads}")),
            durable_config(),
        )
        .unwrap();
        let wal = Arc::new(wal);
        group.throughput(Throughput::Elements(1));
        group.bench_function(BenchmarkId::from_parameter(threads), |b| {
            b.iter_custom(|iterations| group_commit(&wal, threads, iterations.max(threads as u64)))
        });
    }
    group.finish();

    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("reference"))
        .unwrap();
    let mut group = c.benchmark_group("fsync_per_append");
    group.sample_size(10);
    group.throughput(Throughput::Elements(1));
    group.bench_function("64", |b| {
        b.iter_custom(|iterations| fsync_per_append(&mut file, iterations))
    });
    group.finish();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A short timed run of each measurement, to print the ratios the goals name.
fn print_ratios() {
    let rate = |count: u64, elapsed: Duration| count as f64 / elapsed.as_secs_f64();
    let (mut producer, mut consumer) = new_ring();
    let small = [0x5Au8; 64];
    let n = 2_000_000u64;
    let start = Instant::now();
    for _ in 0..n {
        append(&mut producer, &mut consumer, black_box(&small));
    }
    let appends_64 = rate(n, start.elapsed());

    let big = vec![0x5Au8; 4096];
    let n = 200_000u64;
    let start = Instant::now();
    for _ in 0..n {
        append(&mut producer, &mut consumer, black_box(&big));
    }
    let ring_4k = rate(n * 4096, start.elapsed());
    let mut target = vec![0u8; 4096];
    let start = Instant::now();
    for _ in 0..n {
        target.copy_from_slice(black_box(&big));
        black_box(&mut target);
    }
    let memcpy_4k = rate(n * 4096, start.elapsed());
    let mut ring_sized = RingSized::new();
    let start = Instant::now();
    for _ in 0..n {
        ring_sized.copy(black_box(&big));
    }
    let memcpy_ring_4k = rate(n * 4096, start.elapsed());

    let dir = bench_dir();
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("reference"))
        .unwrap();
    let reference = rate(200, fsync_per_append(&mut file, 200));
    println!("\nwal ratios (goals in parentheses):");
    println!(
        "  ring append 64 B: {:.2} M appends/s (>= 10 M/s)",
        appends_64 / 1e6
    );
    println!(
        "  ring append 4 KiB: {:.2} GB/s vs memcpy into one hot 4 KiB buffer {:.2} GB/s = {:.2} x, \
         vs memcpy with the ring's footprint {:.2} GB/s = {:.2} x (>= 0.5 x)",
        ring_4k / 1e9,
        memcpy_4k / 1e9,
        ring_4k / memcpy_4k,
        memcpy_ring_4k / 1e9,
        ring_4k / memcpy_ring_4k
    );
    println!("  fsync per append: {reference:.0} appends/s (reference)");
    for threads in [1usize, 8, 64] {
        let (wal, _) = Wal::open(
            Arc::new(StdFs),
            &dir.join(format!("ratio{threads}")),
            durable_config(),
        )
        .unwrap();
        let wal = Arc::new(wal);
        let total = 400 * threads as u64;
        let elapsed = group_commit(&wal, threads, total);
        let throughput = rate(total, elapsed);
        println!(
            "  group commit, {threads} appenders: {throughput:.0} appends/s = {:.1} x fsync-per-append (>= 50 x)",
            throughput / reference
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

criterion_group!(wal_benches, benches);

fn main() {
    wal_benches();
    Criterion::default().configure_from_args().final_summary();
    print_ratios();
}
