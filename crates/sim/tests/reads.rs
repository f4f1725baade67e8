//! The seed family of linearizable reads: seeds 1..=N where the clients also read through
//! raft's ReadIndex (`Replica::read_index`), on the node they take for the leader and, half
//! the times one of their appends is acknowledged, at once on the node that acknowledged it.
//! Every answer is checked: its read index covers every index a node had committed and every
//! append acknowledged before the read began, and the answering node's log holds that append
//! there (`sim::reads`). Each family runs once as drawn and once with callers driving their
//! own waits under `Durability::Replicated`, where a ticket resolves before raft's commit
//! index moves.
//!
//! The two rules that make a read linearizable are each removed by a mutation, and the family
//! must catch both: `read-without-quorum` (a leader answers from its own commit index, with no
//! heartbeat round a majority answered: a new leader's or a deposed one's index lags) and
//! `read-before-nic-acks` (a read takes raft's commit index before stepping the write
//! completions that already resolved a caller's ticket).
//!
//! `SIM_SEEDS=N` changes the number of seeds.

use replica::{Durability, Mutation};

fn seeds() -> u64 {
    sim::seeds_from_env(150)
}

fn reading(mutation: Mutation) -> sim::Options {
    sim::Options {
        reads: true,
        mutation,
        ..sim::Options::default()
    }
}

fn reading_while_callers_drive(mutation: Mutation) -> sim::Options {
    sim::Options {
        callers_drive: true,
        durability: Some(Durability::Replicated),
        ..reading(mutation)
    }
}

/// Runs the family's seeds with `options`; panics on the first failure.
fn every_seed_holds(options: sim::Options, what: &str) {
    let started = std::time::Instant::now();
    let (mut begun, mut answered, mut refused, mut acked) = (0, 0, 0, 0);
    for seed in 1..=seeds() {
        match sim::run(seed, options, false) {
            Ok(s) => {
                begun += s.reads_started;
                answered += s.reads_answered;
                refused += s.reads_refused;
                acked += s.acked;
            }
            Err(f) => panic!("\n{f}\n"),
        }
    }
    eprintln!(
        "{} seeds {what} passed in {:.1} s: {begun} reads begun, {answered} answered and \
         checked, {refused} refused; {acked} appends acknowledged",
        seeds(),
        started.elapsed().as_secs_f64()
    );
    // Each seed's final read is answered; reads during the faults must be too, or the family
    // checks little.
    assert!(
        answered > seeds(),
        "only {answered} reads were answered in {} seeds: the family tests little",
        seeds()
    );
}

#[test]
fn every_answered_read_covers_what_was_committed_before_it() {
    every_seed_holds(reading(Mutation::None), "with reads");
}

#[test]
fn every_answered_read_covers_what_was_committed_before_it_with_callers_driving() {
    every_seed_holds(
        reading_while_callers_drive(Mutation::None),
        "with reads, callers driving, Replicated",
    );
}

/// The first seed of `1..=seeds()` that fails with `options`: the seed and the report.
/// Panics if that seed fails without the mutation too.
fn first_catch(options: sim::Options) -> Option<(u64, String)> {
    sim::first_catch(options, 1..=seeds())
        .unwrap_or_else(|f| panic!("the catching seed fails without the mutation too:\n{f}"))
        .map(|c| (c.seed, c.failure.to_string()))
}

#[test]
fn answering_without_a_quorum_is_caught() {
    let Some((seed, why)) = first_catch(reading(Mutation::ReadWithoutQuorum)) else {
        panic!(
            "leaders answering reads from their own commit index went unnoticed for {} seeds",
            seeds()
        );
    };
    eprintln!("caught at seed {seed}:\n{why}");
    assert!(
        why.contains("linearizable reads:") && why.contains("--reads"),
        "caught, but not by the reads' checker, or the replay line lacks --reads:\n{why}"
    );
}

#[test]
fn reading_before_the_resolved_completions_are_stepped_is_caught() {
    let options = reading_while_callers_drive(Mutation::ReadBeforeNicAcks);
    let Some((seed, why)) = first_catch(options) else {
        panic!(
            "reads that missed commits a caller was told of went unnoticed for {} seeds",
            seeds()
        );
    };
    eprintln!("caught at seed {seed}:\n{why}");
    assert!(
        why.contains("linearizable reads:")
            && why.contains("--mutation read-before-nic-acks")
            && why.contains("--callers-drive"),
        "caught, but not by the reads' checker, or the replay line lacks the flags:\n{why}"
    );
}
