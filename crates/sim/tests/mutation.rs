//! The mutation check: the checkers can fail. With one protocol rule broken on purpose behind
//! the test-only `ReplicaConfig::mutation` switch, the simulator must catch it within a bounded
//! number of seeds.
//!
//! Method: run seeds 1.. with the mutation on and the seed's own fault rates; the first
//! failing seed must come within `WITHIN` seeds. The same seeds pass without the mutation (the
//! CI run covers them).

use replica::Mutation;

/// Seeds the simulator gets to catch a broken rule.
const WITHIN: u64 = 60;

fn first_failure(mutation: Mutation) -> Option<(u64, String)> {
    let options = sim::Options {
        mutation,
        ..sim::Options::default()
    };
    (1..=WITHIN).find_map(|seed| {
        sim::run(seed, options, false)
            .err()
            .map(|f| (seed, f.violation.clone()))
    })
}

#[test]
fn acking_without_fsync_is_caught() {
    let caught = first_failure(Mutation::AckWithoutFsync);
    eprintln!("ack without fsync: {caught:?}");
    assert!(
        caught.is_some(),
        "acknowledging appends without fdatasync went unnoticed for {WITHIN} seeds"
    );
}
