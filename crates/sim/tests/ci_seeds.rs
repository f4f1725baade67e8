//! The CI run of the deterministic simulator: 1,000 seeds (1..=1000), each with its own fault
//! rates drawn from the seed, a 3- or 5-node cluster, 3 s of virtual time under faults and up to 100 client appends and then
//! the liveness phase. Split into shards so the test harness runs them on every core.
//!
//! Method: `sim::run(seed, Options::default())`; the checkers run after every step. On failure
//! the panic message holds the seed, its fault rates, the last events and a one-line replay
//! command; add the seed to `tests/regressions.rs` once it is fixed.
//!
//! `SIM_SEEDS=N` changes the number of seeds (for a quick local run or a longer one).

const SHARDS: u64 = 8;

fn seeds() -> u64 {
    std::env::var("SIM_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000)
}

fn shard(k: u64) {
    let n = seeds();
    let started = std::time::Instant::now();
    let mut ran = 0;
    for seed in (1..=n).filter(|s| s % SHARDS == k) {
        if let Err(f) = sim::run(seed, sim::Options::default(), false) {
            panic!("\n{f}\n");
        }
        ran += 1;
    }
    eprintln!(
        "shard {k}: {ran} seeds passed in {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

#[test]
fn seeds_shard_0() {
    shard(0);
}
#[test]
fn seeds_shard_1() {
    shard(1);
}
#[test]
fn seeds_shard_2() {
    shard(2);
}
#[test]
fn seeds_shard_3() {
    shard(3);
}
#[test]
fn seeds_shard_4() {
    shard(4);
}
#[test]
fn seeds_shard_5() {
    shard(5);
}
#[test]
fn seeds_shard_6() {
    shard(6);
}
#[test]
fn seeds_shard_7() {
    shard(7);
}
