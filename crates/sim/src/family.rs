//! What the seed families' tests (`tests/*.rs`) share: running a family's seeds with a count
//! of the fault it exists for, and finding where a mutation is caught with each durability mode
//! forced.

use std::time::{Duration, Instant};

use replica::Durability;

use crate::{Catch, Failure, Fault, Options, first_catch, run};

/// What [`run_family`] saw.
#[derive(Clone, Debug)]
pub struct FamilyRun {
    /// Seeds run.
    pub seeds: u64,
    /// Client appends acknowledged, over all seeds.
    pub acked: u64,
    /// Faults of each kind counted, over all seeds, in the order asked.
    pub counted: Vec<u64>,
    /// How long the seeds took.
    pub elapsed: Duration,
}

/// Runs seeds `1..=seeds` with `options` and counts the faults of each kind in `counted`;
/// the first failing seed's failure instead.
pub fn run_family(
    options: Options,
    seeds: u64,
    counted: &[Fault],
) -> Result<FamilyRun, Box<Failure>> {
    let started = Instant::now();
    let mut out = FamilyRun {
        seeds,
        acked: 0,
        counted: vec![0; counted.len()],
        elapsed: Duration::ZERO,
    };
    for seed in 1..=seeds {
        let s = run(seed, options, false)?;
        out.acked += s.acked;
        for (n, f) in out.counted.iter_mut().zip(counted) {
            *n += s.faults.get(f).copied().unwrap_or(0);
        }
    }
    out.elapsed = started.elapsed();
    Ok(out)
}

/// For a family's test: [`run_family`] over seeds `1..=seeds`, printing what it saw; panics
/// with the first failing seed, or when a fault of `expected` (its kind, and what it is, for
/// the messages) never happened: a family whose fault never happens tests nothing.
pub fn expect_family_holds(name: &str, options: Options, seeds: u64, expected: &[(Fault, &str)]) {
    let kinds: Vec<Fault> = expected.iter().map(|&(f, _)| f).collect();
    let r = run_family(options, seeds, &kinds).unwrap_or_else(|f| panic!("\n{f}\n"));
    let counts: Vec<String> = expected
        .iter()
        .zip(&r.counted)
        .map(|((_, what), n)| format!("{n} {what}"))
        .collect();
    eprintln!(
        "{} seeds with {name} passed in {:.1?}: {} acknowledged, {}",
        r.seeds,
        r.elapsed,
        r.acked,
        counts.join(", ")
    );
    for ((_, what), &n) in expected.iter().zip(&r.counted) {
        assert!(n > 0, "{name}: no {what}: the family tests nothing");
    }
}

/// The durability modes, each forced in turn by [`catches_in_every_mode`].
pub const DURABILITIES: [Durability; 3] = [
    Durability::Fsync,
    Durability::Memory,
    Durability::Replicated,
];

/// For each durability mode, the first seed of `1..=seeds` that catches the mutation of
/// `options(mode)` ([`first_catch`]: the seed passes without it). An error names the mode in
/// which no seed caught it, or gives the failure of a catching seed that fails without the
/// mutation too.
pub fn catches_in_every_mode(
    options: impl Fn(Durability) -> Options,
    seeds: u64,
) -> Result<Vec<(Durability, Catch)>, String> {
    DURABILITIES
        .iter()
        .map(|&mode| {
            let o = options(mode);
            match first_catch(o, 1..=seeds) {
                Ok(Some(catch)) => Ok((mode, catch)),
                Ok(None) => Err(format!(
                    "{:?}: no seed of 1..={seeds} caught it ({mode:?})",
                    o.mutation
                )),
                Err(f) => Err(format!(
                    "the catching seed fails without the mutation too ({mode:?}):\n{f}"
                )),
            }
        })
        .collect()
}

/// For a family's test: [`catches_in_every_mode`], printing where `name` (the mutation's
/// flag) was caught in each mode; panics with the error otherwise.
pub fn expect_caught_in_every_mode(
    name: &str,
    options: impl Fn(Durability) -> Options,
    seeds: u64,
) {
    let catches = catches_in_every_mode(options, seeds).unwrap_or_else(|e| panic!("{name}: {e}"));
    for (mode, c) in catches {
        eprintln!(
            "{name} caught at seed {} ({mode:?}):\n{}",
            c.seed, c.failure
        );
    }
}
