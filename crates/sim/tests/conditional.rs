//! The seed family of conditional appends (issue 16): seeds 1..=N with a third of single
//! appends proposed on a condition (`Replica::propose_batch_if`, expecting the log to end
//! where the proposing node's log ends, or one entry earlier), under each seed's own faults.
//! Besides every other checker, the history checker requires a conditional append that is in
//! the committed log at all to sit right after the index it expected; one whose condition
//! failed counts as definitely not in the log. With `Mutation::ConditionOnCommit` (the check
//! made against the commit index, forgetting entries ordered but not committed) a seed within
//! the family fails.
//!
//! `SIM_SEEDS=N` changes the number of seeds.

use replica::Mutation;

fn seeds() -> u64 {
    sim::seeds_from_env(200)
}

fn options(mutation: Mutation) -> sim::Options {
    sim::Options {
        conditional: true,
        mutation,
        ..sim::Options::default()
    }
}

#[test]
fn conditional_appends_commit_right_after_the_end_they_expected() {
    let started = std::time::Instant::now();
    for seed in 1..=seeds() {
        if let Err(f) = sim::run(seed, options(Mutation::None), false) {
            panic!("\n{f}\n");
        }
    }
    eprintln!(
        "{} seeds with conditional appends passed in {:.1} s",
        seeds(),
        started.elapsed().as_secs_f64()
    );
}

#[test]
fn the_family_catches_a_condition_checked_against_the_commit_index() {
    let caught = sim::first_catch(options(Mutation::ConditionOnCommit), 1..=seeds())
        .unwrap_or_else(|f| panic!("the catching seed fails without the mutation too:\n{f}"))
        .map(|c| (c.seed, c.failure.to_string()));
    let Some((seed, why)) = caught else {
        panic!("no seed of 1..={} caught condition-on-commit", seeds());
    };
    eprintln!("condition-on-commit caught by seed {seed}");
    assert!(
        why.contains("conditional"),
        "seed {seed} failed otherwise: {why}"
    );
}
