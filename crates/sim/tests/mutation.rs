//! The mutation check: the checkers can fail. With one protocol rule broken on purpose behind
//! the test-only `ReplicaConfig::mutation` switch, the simulator must catch it within a bounded
//! number of seeds.
//!
//! Method: run seeds 1.. with the mutation on and the seed's own fault rates; the first
//! failing seed must come within `WITHIN` seeds. The same seeds pass without the mutation (the
//! CI run covers them).

use replica::Mutation;

/// Seeds the simulator gets to catch a broken rule: inside the CI budget of 1,000 seeds
/// (`ci_seeds.rs`). The first catching seeds today, and the checker that caught each:
/// ack-without-fsync 2 (a restart finds synced data missing), private-ring 9 and
/// no-recovering-guard 36 (state machine safety), skip-revoke 32 (ring integrity: a deposed
/// leader's write landed over a record a follower had accepted), ack-before-crc 24 (log
/// matching: a follower took a corrupted write's descriptor as its entries), snapshot-own-lsn
/// 34 (Lsn agreement after an install), unchecked-reads 10 (durability: a committed entry
/// re-read after its stored bytes rotted).
const WITHIN: u64 = 300;

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

#[test]
fn a_private_ring_is_caught() {
    let caught = first_failure(Mutation::PrivateRing);
    eprintln!("private ring: {caught:?}");
    assert!(
        caught.is_some(),
        "a Memory ring in private memory (lost at every process kill) went unnoticed for \
         {WITHIN} seeds"
    );
}

#[test]
fn removing_the_recovering_guard_is_caught() {
    let caught = first_failure(Mutation::NoRecoveringGuard);
    eprintln!("no recovering guard: {caught:?}");
    assert!(
        caught.is_some(),
        "nodes voting after losing their Memory ring went unnoticed for {WITHIN} seeds"
    );
}

#[test]
fn skipping_the_revoke_is_caught() {
    let caught = first_failure(Mutation::SkipRevoke);
    eprintln!("skip revoke: {caught:?}");
    assert!(
        caught.is_some(),
        "followers that never revoke a deposed leader's write access went unnoticed for \
         {WITHIN} seeds"
    );
}

#[test]
fn acking_before_the_crc_check_is_caught() {
    let caught = first_failure(Mutation::AckBeforeCrc);
    eprintln!("ack before crc: {caught:?}");
    assert!(
        caught.is_some(),
        "followers acknowledging fast appends whose bytes failed their checks went unnoticed \
         for {WITHIN} seeds"
    );
}

#[test]
fn a_snapshot_install_at_the_wrong_lsn_is_caught() {
    let caught = first_failure(Mutation::SnapshotOwnLsn);
    eprintln!("snapshot at own lsn: {caught:?}");
    assert!(
        caught.is_some(),
        "followers restarting their log at their own position after a snapshot went \
         unnoticed for {WITHIN} seeds"
    );
}

#[test]
fn serving_a_rotten_record_is_caught() {
    let caught = first_failure(Mutation::UncheckedReads);
    eprintln!("unchecked reads: {caught:?}");
    assert!(
        caught.is_some(),
        "reads that skip the record check served rotten bytes unnoticed for {WITHIN} seeds"
    );
}
