//! The seed family of self-removals: seeds 1..=N in which three of four removals of a voter
//! remove the leader itself (`Fault::RemoveLeader`: an operator retiring the node that leads).
//! Once it applies its own removal the leader must step down, and the voters left elect a
//! leader among themselves; the removed node is retired once another leads. With the
//! step-down taken away (`Mutation::RemovedLeaderLeads`) raft-rs keeps the node leading a
//! membership that no longer counts it (and panics at its next commit): the membership
//! checker sees a leader outside its own voters first, in each durability mode. The default families only
//! remove followers, and met this only where a removed node won an election before it
//! applied its own removal (regression seed 10,500,953 of `Fsync`).
//!
//! `SIM_SEEDS=N` changes the number of seeds.

use replica::{Durability, Mutation};

fn seeds() -> u64 {
    sim::seeds_from_env(300)
}

fn options(mutation: Mutation, durability: Option<Durability>) -> sim::Options {
    sim::Options {
        self_removals: true,
        mutation,
        durability,
        ..sim::Options::default()
    }
}

#[test]
fn every_seed_holds_with_self_removals() {
    sim::expect_family_holds(
        "self-removals",
        options(Mutation::None, None),
        seeds(),
        &[(sim::Fault::RemoveLeader, "leaders that removed themselves")],
    );
}

#[test]
fn a_removed_leader_that_leads_on_is_caught_in_every_durability_mode() {
    sim::expect_caught_in_every_mode(
        "removed-leader-leads",
        |mode| options(Mutation::RemovedLeaderLeads, Some(mode)),
        seeds(),
    );
}
