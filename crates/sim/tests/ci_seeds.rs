//! The CI run of the deterministic simulator: 1,000 seeds (1..=1000), each with its own fault
//! rates drawn from the seed, a 3- or 5-node cluster, 3 s of virtual time under faults and up to 100 client appends and then
//! the liveness phase. Split into shards so the test harness runs them on every core.
//!
//! Method: `sim::run(seed, Options::default())`; the checkers run after every step. On failure
//! the panic message holds the seed, its fault rates, the last events and a one-line replay
//! command; add the seed to `tests/regressions.rs` once it is fixed.
//!
//! The last shard to finish also checks that the seeds drew every fault the README's
//! durability table cites the simulator for, in each mode (`CITED`).
//!
//! `SIM_SEEDS=N` changes the number of seeds (for a quick local run or a longer one).

use std::collections::BTreeMap;
use std::sync::Mutex;

use replica::Durability;
use sim::Fault;

const SHARDS: u64 = 8;

/// How many times the seeds of a durability mode (its name) drew a fault.
type Drawn = BTreeMap<(String, Fault), u64>;

/// The faults drawn, summed over the shards that finished, and how many finished.
static DRAWN: Mutex<(Drawn, u64)> = Mutex::new((BTreeMap::new(), 0));

/// The faults the README's durability table cites "sim" for, per mode: the CI seeds must draw
/// each, or the table's cell proves nothing.
const CITED: &[(Durability, &[Fault])] = &[
    (
        Durability::Fsync,
        &[
            Fault::ProcessKill,
            Fault::Crash,
            Fault::RestartTorn,
            Fault::PowerLossAll,
        ],
    ),
    (Durability::Memory, &[Fault::ProcessKill, Fault::Crash]),
    (
        Durability::Replicated,
        &[
            Fault::ProcessKill,
            Fault::Crash,
            Fault::StalledFollowerQuorum,
            Fault::SleptThroughReelection,
        ],
    ),
];

/// Adds a shard's drawn faults; the last of the eight shards to finish checks that every
/// cited fault was drawn (when a filter runs fewer shards, or fewer seeds run, nothing is
/// checked).
fn record(drawn: Drawn) {
    let mut all = DRAWN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    for (k, v) in drawn {
        *all.0.entry(k).or_default() += v;
    }
    all.1 += 1;
    if all.1 < SHARDS || seeds() < 1_000 {
        return;
    }
    for &(mode, faults) in CITED {
        for &f in faults {
            let n = all.0.get(&(mode.to_string(), f)).copied().unwrap_or(0);
            eprintln!("{mode:?} seeds drew {f:?} {n} times");
            assert!(
                n > 0,
                "no {mode:?} seed of the CI budget drew {f:?}, which the README cites for it"
            );
        }
    }
}

fn seeds() -> u64 {
    sim::seeds_from_env(1_000)
}

fn shard(k: u64) {
    let n = seeds();
    let started = std::time::Instant::now();
    let mut ran = 0;
    let mut drawn = Drawn::new();
    for seed in (1..=n).filter(|s| s % SHARDS == k) {
        match sim::run(seed, sim::Options::default(), false) {
            Ok(summary) => {
                for (f, v) in summary.faults {
                    *drawn
                        .entry((summary.durability.to_string(), f))
                        .or_default() += v;
                }
            }
            Err(f) => panic!("\n{f}\n"),
        }
        ran += 1;
    }
    record(drawn);
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
