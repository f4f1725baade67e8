//! The seed family of replaced data dirs: seeds 1..=N where half the restarts of a crashed
//! machine come back on a new, empty disk under the node's old id (`Fault::DataDirReplaced`:
//! its data dir emptied, or the disk replaced), one node at a time, while the membership is the
//! configured one. Such a node has lost its term, its vote and every entry it acknowledged;
//! it must prove itself (every other voter tells it its term) before it votes. With the proof
//! taken away (`Mutation::TrustNewDataDir`: a new data dir votes at once, as at a first start)
//! a seed of the family fails in each durability mode; the default families never restart a
//! node on an empty disk, so none of their seeds could. Until every voter has told it its
//! term, such a node must also step no raft message: the family's episode of a deposed leader
//! waking beside it (`Fault::WokenBesideNewDisk`) catches one that does
//! (`Mutation::UnprovenSteps`) in each durability mode.
//!
//! `SIM_SEEDS=N` changes the number of seeds.

use replica::{Durability, Mutation};

fn seeds() -> u64 {
    sim::seeds_from_env(300)
}

fn options(mutation: Mutation, durability: Option<Durability>) -> sim::Options {
    sim::Options {
        wipes: true,
        mutation,
        durability,
        ..sim::Options::default()
    }
}

#[test]
fn every_seed_holds_with_replaced_data_dirs() {
    sim::expect_family_holds(
        "replaced data dirs",
        options(Mutation::None, None),
        seeds(),
        &[
            (sim::Fault::DataDirReplaced, "data dirs replaced"),
            (
                sim::Fault::WokenBesideNewDisk,
                "deposed leaders woken beside a new data dir",
            ),
        ],
    );
}

#[test]
fn trusting_a_new_data_dir_is_caught_in_every_durability_mode() {
    sim::expect_caught_in_every_mode(
        "trust-new-data-dir",
        |mode| options(Mutation::TrustNewDataDir, Some(mode)),
        seeds(),
    );
}

/// An unproven node that steps raft messages acknowledges the appends of a deposed leader
/// that wakes beside it, and that leader commits over entries committed without it: the
/// checker sees two different entries committed at one index.
#[test]
fn an_unproven_node_stepping_raft_messages_is_caught_in_every_durability_mode() {
    sim::expect_caught_in_every_mode(
        "unproven-steps",
        |mode| options(Mutation::UnprovenSteps, Some(mode)),
        seeds(),
    );
}

/// A seed of the family that found a defect, replayed with the schedule it had then (before
/// the episode of a deposed leader waking beside a new data dir): at seed 11 a node emptied
/// after the cluster added a member waited for good for that member's answer: it did not know
/// it as a peer, and the member, which never sends to a follower, kept a dead link for alive;
/// it now connects to the voters an answer names. (Seed 1,920 found that an unproven node must
/// step no raft message; later changes moved its schedule, and the episode was built to catch
/// that rule on purpose, above.)
#[test]
fn regression_seeds_of_the_family_pass() {
    let old_schedule = sim::Options {
        wipe_episodes: false,
        next_read_eio: true,
        ..options(Mutation::None, None)
    };
    if let Err(f) = sim::run(11, old_schedule, false) {
        panic!("\n{f}\n");
    }
    // Seed 505,669: a node emptied while the membership had a member added since, which it
    // could not reach, waited for it for good once the cluster removed it: it asked only the
    // voters that had not answered, and never heard of the removal.
    let found = sim::Options {
        next_read_eio: true,
        ..options(Mutation::None, None)
    };
    if let Err(f) = sim::run(505_669, found, false) {
        panic!("\n{f}\n");
    }
}
