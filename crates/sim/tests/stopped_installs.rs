//! The seed family of stopped installs: seeds 1..=N with small segments and an episode
//! (`episodes`, `Fault::InstallStopped`) in which a follower is down while the leader adds a
//! node and checkpoints past the follower's log; the follower restarts, is sent the
//! checkpoint, and its write of the snapshot's membership fails (EIO), so it fail-stops inside
//! the install and starts again. The snapshot's membership must be durable before the log
//! restarts at the snapshot, in the install and in the start that finishes one: with that
//! order flipped (`Mutation::MembershipAfterLogRestart`) a node counts the membership from
//! before the snapshot, which the membership checker sees, in each durability mode. The
//! default families reach a failed write inside an install only by chance (1,000 seeds
//! missed it).
//!
//! `SIM_SEEDS=N` changes the number of seeds.

use replica::{Durability, Mutation};

fn seeds() -> u64 {
    sim::seeds_from_env(300)
}

fn options(mutation: Mutation, durability: Option<Durability>) -> sim::Options {
    sim::Options {
        stopped_installs: true,
        mutation,
        durability,
        ..sim::Options::default()
    }
}

#[test]
fn every_seed_holds_with_stopped_installs() {
    sim::expect_family_holds(
        "stopped installs",
        options(Mutation::None, None),
        seeds(),
        &[(
            sim::Fault::InstallStopped,
            "installs stopped at their write of the membership",
        )],
    );
}

#[test]
fn the_membership_stored_after_the_log_restart_is_caught_in_every_durability_mode() {
    sim::expect_caught_in_every_mode(
        "membership-after-log-restart",
        |mode| options(Mutation::MembershipAfterLogRestart, Some(mode)),
        seeds(),
    );
}

/// Seeds of the family that found a defect, replayed: a start that finished an interrupted
/// install restarted the log before it stored the snapshot's membership, and a stop in
/// between (a power cut during the start at seed 1,539 with `Fsync`; a failed write at 2,667
/// of the default draw) left a log that the next start took for a finished install, with the
/// membership from before it.
#[test]
fn regression_seeds_of_the_family_pass() {
    for (seed, durability) in [(1_539, Some(Durability::Fsync)), (2_667, None)] {
        // The schedule each was found with: a read failure took the node's next read.
        let found = sim::Options {
            next_read_eio: true,
            ..options(Mutation::None, durability)
        };
        if let Err(f) = sim::run(seed, found, false) {
            panic!("\n{f}\n");
        }
    }
}
