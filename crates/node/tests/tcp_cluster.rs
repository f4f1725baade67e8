//! Host tests: a 3-node cluster of `rdmalog-node` processes over TCP on this host, no lab and
//! no RDMA. On loopback (`127.0.1.1-3`): kill -9 of a follower and of the leader, kill -9 of
//! all three (fsync and memory durability), a machine crash of a follower under memory
//! durability, a follower's data dir emptied, a follower caught up by a snapshot, and a node with the wrong secret or cluster
//! id. In network namespaces (`node::netns`, one per node on a bridge): a SIGSTOPped leader
//! behind a one-way block that wakes deposed, cable cuts of a follower and of the leader,
//! packet loss on the leader's sends, `Replicated` durability through kills, a stopped leader,
//! loss, a cut and a kill of all three, and the chaos schedule. Every scenario of
//! `lab_cluster.rs` thus runs here too. The same scenarios
//! (`common/cluster_scenarios.rs`) run over RDMA and TCP in the lab (`lab_cluster.rs`); every
//! acknowledged append is checked on every live node afterwards.
//!
//! The scenarios run one at a time (three node processes each), whatever `--test-threads`.

mod common;

use std::sync::Mutex;

use common::cluster_scenarios::{self as s, Setup};

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Runs `scenario` on loopback.
fn run(scenario: fn(&Setup)) {
    run_on(scenario, &Setup::HOST_TCP);
}

/// Runs `scenario` at `setup`, one scenario at a time.
fn run_on(scenario: fn(&Setup), setup: &Setup) {
    let _g = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    scenario(setup);
}

#[test]
fn steady_state_mixed_sizes_commit_identically() {
    run(s::steady_state_mixed_sizes_commit_identically);
}

#[test]
fn follower_crash_mid_load_then_catch_up() {
    run(s::follower_crash_mid_load_then_catch_up);
}

#[test]
fn leader_crash_mid_load_fails_over_and_rejoins() {
    run(s::leader_crash_mid_load_fails_over_and_rejoins);
}

#[test]
fn kill_9_of_all_three_keeps_every_acknowledged_entry() {
    run(s::kill_9_of_all_three_keeps_every_acknowledged_entry);
}

#[test]
fn memory_durability_survives_kill_9_of_every_process() {
    run(s::memory_durability_survives_kill_9_of_every_process);
}

#[test]
fn memory_machine_crash_of_a_follower_does_not_let_the_others_elect_without_it() {
    run(s::memory_machine_crash_of_a_follower_does_not_let_the_others_elect_without_it);
}

#[test]
fn a_follower_on_an_emptied_data_dir_does_not_let_the_others_elect_without_it() {
    run(s::a_follower_on_an_emptied_data_dir_does_not_let_the_others_elect_without_it);
}

#[test]
fn a_follower_behind_a_checkpoint_is_caught_up_by_a_snapshot() {
    run(s::a_follower_behind_a_checkpoint_is_caught_up_by_a_snapshot);
}

#[test]
fn a_wrong_peer_is_refused_on_both_sides() {
    run(s::a_wrong_peer_is_refused_on_both_sides);
}

#[test]
fn a_killed_follower_is_seen_down_within_the_dead_peer_bound() {
    run(s::a_killed_follower_is_seen_down_within_the_dead_peer_bound);
}

#[test]
fn netns_a_crashed_machine_is_seen_down_over_idle_links() {
    run_on(
        s::a_crashed_machine_is_seen_down_over_idle_links,
        &Setup::HOST_NETNS_TCP,
    );
}

#[test]
fn netns_deposed_leader_wakes_up_and_cannot_commit() {
    run_on(
        s::deposed_leader_wakes_up_and_is_fenced,
        &Setup::HOST_NETNS_TCP,
    );
}

#[test]
fn netns_partitions_heal_and_a_cut_off_leader_cannot_commit() {
    run_on(
        s::partitions_heal_and_a_cut_off_leader_cannot_commit,
        &Setup::HOST_NETNS_TCP,
    );
}

#[test]
fn netns_lossy_link_keeps_the_log_correct() {
    run_on(s::lossy_link_keeps_the_log_correct, &Setup::HOST_NETNS_TCP);
}

#[test]
fn netns_replicated_durability_through_kills_a_stopped_leader_loss_a_cut_and_a_kill_of_all() {
    run_on(
        s::replicated_durability_through_kills_a_stopped_leader_loss_a_cut_and_a_kill_of_all,
        &Setup::HOST_NETNS_TCP,
    );
}

#[test]
fn netns_after_a_chaos_schedule_is_lifted_the_cluster_elects_serves_and_reconnects() {
    run_on(
        s::after_a_chaos_schedule_is_lifted_the_cluster_elects_serves_and_reconnects,
        &Setup::HOST_NETNS_TCP,
    );
}
