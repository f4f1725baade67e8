//! The seed family of callers that drive their own waits (`PollMode::Busy`, issue 14): seeds
//! 1..=N where, after each append, the node it went to runs its passes with
//! `Replica::process_until_resolved` on the append's ticket until the client sees it resolve.
//! Such a pass stops at the events that commit the entry and leaves raft's `Ready` behind
//! them, the apply and the answers to the next pass; every checker still holds. With a rule of
//! the NIC-acknowledged commit broken (`Mutation::NicAckBeforeGrant`) a seed of the family
//! fails, so the family's checkers can fail with callers driving.
//!
//! `SIM_SEEDS=N` changes the number of seeds.

use replica::{Durability, Mutation};

fn seeds() -> u64 {
    sim::seeds_from_env(200)
}

fn options(mutation: Mutation, durability: Option<Durability>) -> sim::Options {
    sim::Options {
        callers_drive: true,
        mutation,
        durability,
        ..sim::Options::default()
    }
}

#[test]
fn every_seed_holds_with_passes_stopping_at_a_commit() {
    let started = std::time::Instant::now();
    let (mut acked, mut stopped) = (0, 0);
    for seed in 1..=seeds() {
        match sim::run(seed, options(Mutation::None, None), false) {
            Ok(s) => {
                acked += s.acked;
                stopped += s.passes_stopped_at_commit;
            }
            Err(f) => panic!("\n{f}\n"),
        }
    }
    eprintln!(
        "{} seeds with callers driving passed in {:.1} s: {acked} acknowledged, {stopped} \
         passes stopped at a commit",
        seeds(),
        started.elapsed().as_secs_f64()
    );
    assert!(
        stopped > 0,
        "no pass stopped at a commit: the family tests nothing"
    );
}

/// The first seed of the family, every seed `Replicated`, that fails with `mutation` on: the
/// seed and the failure's report. Panics if that seed fails without the mutation too.
fn first_catch(mutation: Mutation) -> Option<(u64, String)> {
    sim::first_catch(options(mutation, Some(Durability::Replicated)), 1..=seeds())
        .unwrap_or_else(|f| panic!("the catching seed fails without the mutation too:\n{f}"))
        .map(|c| (c.seed, c.failure.to_string()))
}

#[test]
fn the_family_catches_a_commit_counted_on_an_ungranted_connection() {
    let caught = first_catch(Mutation::NicAckBeforeGrant);
    let Some((seed, why)) = caught else {
        panic!(
            "a leader counting write completions from connections not granted for its term \
             went unnoticed for {} seeds with callers driving",
            seeds()
        );
    };
    eprintln!("caught at seed {seed}:\n{why}");
    // The replay line must run the same schedule: the family's flags and the mutation.
    assert!(
        why.contains("--callers-drive")
            && why.contains("--mutation nic-ack-before-grant")
            && why.contains("--durability replicated"),
        "the replay line does not name the run's options:\n{why}"
    );
}

/// A caller's pass under `Replicated` resolves its ticket from write completions raft has not
/// stepped yet (`Replica::nic_quorum_reaches`). With that quorum check removed (any completion
/// taken as the quorum, `Mutation::NicQuorumAnyIndex`) a seed fails: the replica asserts that
/// raft's commit index reaches every ticket so resolved once it steps the completions.
#[test]
fn the_family_catches_a_ticket_resolved_without_a_quorum() {
    let caught = first_catch(Mutation::NicQuorumAnyIndex);
    let Some((seed, why)) = caught else {
        panic!(
            "tickets resolved from any write completion went unnoticed for {} seeds",
            seeds()
        );
    };
    eprintln!("caught at seed {seed}:\n{why}");
}
