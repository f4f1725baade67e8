//! The seed family of callers that drive their own waits (`PollMode::Busy`, issue 14): seeds
//! 1..=N where, after each append, the node it went to runs its passes with
//! `Replica::process_until_resolved` on the append's ticket until the client sees it resolve.
//! Such a pass stops at the events that commit the entry and leaves raft's `Ready` behind
//! them, the apply and the answers to the next pass; every checker still holds. With a rule of
//! the NIC-acknowledged commit broken (`Mutation::NicAckBeforeGrant`) a seed of the family
//! fails, so the family's checkers can fail with callers driving.
//!
//! The family also draws an episode of its own (`episodes`, `Fault::DeposedWhileWaiting`): a
//! leader with a caller waiting on it is cut off until another node commits past its log,
//! then healed while the caller waits; and after every caller's pass the simulator reads the
//! node's log at each index its commit index newly covers (what a woken reader would read)
//! and checks it against the committed log. A caller's pass on a deposed leader that stops
//! at its ticket before the `Ready` that cuts the old suffix
//! (`Mutation::DeposedCallerStopsEarly`) is caught.
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
    let (mut acked, mut stopped, mut read, mut deposed) = (0, 0, 0, 0);
    for seed in 1..=seeds() {
        match sim::run(seed, options(Mutation::None, None), false) {
            Ok(s) => {
                acked += s.acked;
                stopped += s.passes_stopped_at_commit;
                read += s.caller_reads;
                deposed += s
                    .faults
                    .get(&sim::Fault::DeposedHealed)
                    .copied()
                    .unwrap_or(0);
            }
            Err(f) => panic!("\n{f}\n"),
        }
    }
    eprintln!(
        "{} seeds with callers driving passed in {:.1} s: {acked} acknowledged, {stopped} \
         passes stopped at a commit, {read} committed entries read right after a caller's \
         pass, {deposed} deposed leaders healed while their caller waited",
        seeds(),
        started.elapsed().as_secs_f64()
    );
    assert!(
        stopped > 0,
        "no pass stopped at a commit: the family tests nothing"
    );
    assert!(
        read > 0 && deposed > 0,
        "no read after a caller's pass ({read}) or no deposed leader healed while its caller \
         waited ({deposed})"
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

/// A caller's pass on a deposed leader must run in full: its ticket resolves (superseded) at
/// the new leader's append, which also moves the commit index over entries the wal does not
/// hold yet. With the pass stopping there (`Mutation::DeposedCallerStopsEarly`) the read of
/// the committed entries right after it finds the superseded entry.
#[test]
fn the_family_catches_a_deposed_callers_pass_that_stops_before_the_cut() {
    for durability in [
        Durability::Replicated,
        Durability::Memory,
        Durability::Fsync,
    ] {
        let caught = sim::first_catch(
            options(Mutation::DeposedCallerStopsEarly, Some(durability)),
            1..=seeds(),
        )
        .unwrap_or_else(|f| panic!("the catching seed fails without the mutation too:\n{f}"));
        let Some(c) = caught else {
            panic!(
                "{durability:?}: a deposed leader's caller stopping its pass before the Ready \
                 went unnoticed for {} seeds",
                seeds()
            );
        };
        let why = c.failure.to_string();
        eprintln!("{durability:?}: caught at seed {}:\n{why}", c.seed);
        assert!(
            why.contains("caller's pass"),
            "caught, but not by the read after a caller's pass:\n{why}"
        );
    }
}
