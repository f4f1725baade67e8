//! `rdmalog-sim`: the long-run mode of the deterministic simulator.
//!
//! ```text
//! rdmalog-sim --seed 42 --verbose        # replay one seed with its event trace
//! rdmalog-sim --seeds 100000             # seeds 1..=100000
//! rdmalog-sim --hours 8 --start 1000000  # as many seeds as fit in 8 hours
//! ```
//!
//! It prints a progress line and, at the end, the faults exercised per kind. It exits non-zero
//! at the first failing seed, after printing the seed, its fault rates and the replay command.

#![deny(unsafe_code)]

use std::collections::BTreeMap;
use std::io::Write as _;
use std::time::{Duration, Instant};

use clap::Parser;

/// Runs seeds of the deterministic simulator.
#[derive(Debug, Parser)]
#[command(name = "rdmalog-sim", version)]
struct Args {
    /// Run exactly this seed.
    #[arg(long)]
    seed: Option<u64>,
    /// Run this many seeds, from --start on.
    #[arg(long)]
    seeds: Option<u64>,
    /// Run seeds until this many hours have passed.
    #[arg(long)]
    hours: Option<f64>,
    /// First seed of a range.
    #[arg(long, default_value_t = 1)]
    start: u64,
    /// Virtual milliseconds of the fault phase per seed.
    #[arg(long, default_value_t = 3_000)]
    fault_ms: u64,
    /// Client appends per seed.
    #[arg(long, default_value_t = 100)]
    appends: u64,
    /// Break a protocol rule on purpose (test-only); nic-quorum-any-index needs
    /// --callers-drive, condition-on-commit --conditional, dedup-committed-only --sessions.
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(
        sim::MUTATIONS.iter().map(|(name, _)| *name)
    ))]
    mutation: Option<String>,
    /// Run every seed in this durability mode (fsync, memory or replicated) instead of the
    /// one it draws.
    #[arg(long)]
    durability: Option<replica::Durability>,
    /// Make a third of single appends conditional on where the log ends (the seed family of
    /// tests/conditional.rs).
    #[arg(long)]
    conditional: bool,
    /// Append through client sessions, retries resending the same numbers (the seed family of
    /// tests/sessions.rs).
    #[arg(long)]
    sessions: bool,
    /// Clients drive their own waits: the node an append went to stops its passes at the
    /// events that commit it (the seed family of tests/callers_drive.rs).
    #[arg(long)]
    callers_drive: bool,
    /// Clients also make linearizable reads, each answer checked against what was committed
    /// and acknowledged before it began (the seed family of tests/reads.rs).
    #[arg(long)]
    reads: bool,
    /// Half the process kills are clean stops, and Replicated episodes end with their
    /// stalled followers stopped cleanly (the seed family of tests/clean_stops.rs).
    #[arg(long)]
    clean_stops: bool,
    /// Half the restarts of a crashed machine come back on a new, empty disk under the old id
    /// (the seed family of tests/replaced_data_dirs.rs).
    #[arg(long)]
    wipes: bool,
    /// Never kill a process in the middle of a disk operation (the schedule seeds had before
    /// that fault existed).
    #[arg(long)]
    no_kill_mid_op: bool,
    /// With --callers-drive, never draw the deposed-leader episode (the schedule the
    /// family's seeds had before it existed).
    #[arg(long)]
    no_deposed_episodes: bool,
    /// With --wipes, never draw the episode of a deposed leader waking beside a new disk (the
    /// schedule the family's seeds had before it existed).
    #[arg(long)]
    no_wipe_episodes: bool,
    /// Five voters, and an episode where a new leader replaces an old leader's entry on it
    /// only, while a follower still holds it (the seed family of tests/stale_tickets.rs).
    #[arg(long)]
    stale_tickets: bool,
    /// Small segments, and an episode where a follower that missed a membership change and a
    /// checkpoint restarts and its snapshot install fails at the write of the membership (the
    /// seed family of tests/stopped_installs.rs).
    #[arg(long)]
    stopped_installs: bool,
    /// Three of four removals of a voter remove the leader itself, which must step down once it
    /// applies the change (the seed family of tests/self_removals.rs).
    #[arg(long)]
    self_removals: bool,
    /// A read failure takes the node's next read, as before reads were drawn from the next
    /// few (the schedule of seeds found before).
    #[arg(long)]
    next_read_eio: bool,
    /// Print every event of the run (useful with --seed).
    #[arg(long)]
    verbose: bool,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // Replaying a seed: `RUST_LOG=raft=info,rdmalog::step=trace` shows raft-rs's records and
    // the entries' steps on stderr, in the order they happen (no virtual time).
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .without_time()
            .init();
    }
    let mutation = match args.mutation.as_deref() {
        None => replica::Mutation::None,
        Some(name) => match sim::MUTATIONS.iter().find(|(n, _)| *n == name) {
            Some(&(_, m)) => m,
            None => unreachable!("clap admits only the names of sim::MUTATIONS"),
        },
    };
    let options = sim::Options {
        fault_ns: args.fault_ms * 1_000_000,
        max_appends: args.appends,
        mutation,
        durability: args.durability,
        conditional: args.conditional,
        sessions: args.sessions,
        callers_drive: args.callers_drive,
        reads: args.reads,
        clean_stops: args.clean_stops,
        wipes: args.wipes,
        kill_mid_op: !args.no_kill_mid_op,
        deposed_episodes: !args.no_deposed_episodes,
        wipe_episodes: !args.no_wipe_episodes,
        stale_tickets: args.stale_tickets,
        stopped_installs: args.stopped_installs,
        self_removals: args.self_removals,
        next_read_eio: args.next_read_eio,
        ..sim::Options::default()
    };
    if let Some(seed) = args.seed {
        return match sim::run(seed, options, args.verbose) {
            Ok(s) => {
                println!("{s:#?}");
                Ok(())
            }
            Err(f) => {
                eprintln!("{f}");
                std::process::exit(1);
            }
        };
    }
    let deadline = args
        .hours
        .map(|h| Instant::now() + Duration::from_secs_f64(h * 3600.0));
    let count = args
        .seeds
        .unwrap_or(if deadline.is_some() { u64::MAX } else { 1_000 });
    let started = Instant::now();
    let mut faults: BTreeMap<sim::Fault, u64> = BTreeMap::new();
    let mut modes: BTreeMap<String, u64> = BTreeMap::new();
    let (mut done, mut acked, mut attempts, mut refused, mut torn) = (0u64, 0, 0, 0, 0);
    let mut ring_full = 0u64;
    let mut snapshots = 0u64;
    let (mut nic_acks, mut placed_taken, mut stopped) = (0u64, 0u64, 0u64);
    let mut caller_reads = 0u64;
    let mut answers_skipped = 0u64;
    let mut direct = 0u64;
    let mut queued = 0u64;
    let (mut reads_started, mut reads_answered, mut reads_refused) = (0u64, 0u64, 0u64);
    let mut last_draw = Instant::now() - Duration::from_secs(1);
    for seed in args.start..args.start.saturating_add(count) {
        if deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
        match sim::run(seed, options, args.verbose) {
            Ok(s) => {
                *modes.entry(format!("{:?}", s.durability)).or_default() += 1;
                for (k, v) in s.faults {
                    *faults.entry(k).or_default() += v;
                }
                acked += s.acked;
                attempts += s.attempts;
                refused += s.writes_refused;
                torn += s.writes_torn;
                ring_full += s.ring_full;
                snapshots += s.snapshots_installed;
                nic_acks += s.nic_acks;
                placed_taken += s.placed_taken;
                answers_skipped += s.answers_skipped;
                stopped += s.passes_stopped_at_commit;
                caller_reads += s.caller_reads;
                direct += s.direct_proposals;
                queued += s.queued_proposals;
                reads_started += s.reads_started;
                reads_answered += s.reads_answered;
                reads_refused += s.reads_refused;
            }
            Err(f) => {
                eprintln!("\n{f}");
                std::process::exit(1);
            }
        }
        done += 1;
        if last_draw.elapsed() >= Duration::from_millis(200) {
            last_draw = Instant::now();
            draw_progress(done, count, deadline, started);
        }
    }
    draw_progress(done, count, deadline, started);
    eprintln!();
    println!(
        "{done} seeds passed in {:.1} s: {attempts} client attempts, {acked} acked, \
         {refused} writes fenced or refused, {torn} writes torn, {ring_full} appends into a \
         full ring, {snapshots} snapshots installed, {nic_acks} appends counted on a write's \
         completion, {placed_taken} entries taken as placed, {answers_skipped} answers left \
         unsent as already counted, {stopped} passes stopped at a commit, {caller_reads} \
         committed entries read right after a caller's pass, {direct} proposals written \
         ahead of raft, {queued} queued for a pass, \
         {reads_started} linearizable reads started, {reads_answered} answered and checked, \
         {reads_refused} refused",
        started.elapsed().as_secs_f64()
    );
    println!("seeds per durability mode: {modes:?}");
    println!("faults exercised:");
    for (k, v) in faults {
        println!("  {k:?}: {v}");
    }
    Ok(())
}

/// A one-line progress bar on stderr (no terminal library needed).
fn draw_progress(done: u64, count: u64, deadline: Option<Instant>, started: Instant) {
    const WIDTH: u64 = 40;
    let fraction = match deadline {
        Some(d) => {
            let total = d.saturating_duration_since(started).as_secs_f64();
            (started.elapsed().as_secs_f64() / total.max(1e-9)).min(1.0)
        }
        None => done as f64 / count.max(1) as f64,
    };
    let filled = (fraction * WIDTH as f64) as u64;
    let bar: String = (0..WIDTH)
        .map(|i| if i < filled { '#' } else { '-' })
        .collect();
    let rate = done as f64 / started.elapsed().as_secs_f64().max(1e-9);
    eprint!("\r[{bar}] {done} seeds, {rate:.1}/s");
    let _ = std::io::stderr().flush();
}
