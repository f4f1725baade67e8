//! Lab tests: a real 3-host cluster of `rdmalog-node` processes under faults.
//!
//! Method: runs inside the 3-host Soft-RoCE lab (`ops/test` runs every `lab_*` binary with
//! `--ignored`, with an ext4 disk image at `$RDMALOG_LAB_DISK`). One `rdmalog-node` process per
//! host (node i on rxe i at 192.0.2.1i), each with its own data dir and the cluster secret; the
//! test is the client (`node::harness`). It records every acknowledged append (sequence number,
//! index, crc32c) in arrival order and, after the faults, reads the crc32c of every committed
//! entry back from every live node: nothing acknowledged may be lost or changed, acknowledgements
//! must follow log order, and all live nodes' committed logs must be identical.
//! Each test prints what it injected and what it verified.
//!
//! Long versions for off-CI runs: `RDMALOG_LAB_STEADY_APPENDS` (default 3000; the full
//! run is 100000) and `RDMALOG_LAB_FAULT_APPENDS` (default 600) scale the workloads. The nodes
//! use 4 MiB segments, not the default 64 MiB (`RDMALOG_LAB_SEGMENT_MIB`; `Setup::segment_mib`
//! says why).
//!
//! The scenarios live in `common/cluster_scenarios.rs`; `tcp_cluster.rs` runs those that need
//! no network fault over TCP on the host. Here each runs twice in one boot: over RDMA, and
//! (the `tcp_` tests) over TCP between the same hosts on the same bridge.

mod common;

use common::cluster_scenarios::{self as s, Setup};

#[test]
#[ignore = "lab: needs the Soft-RoCE lab; ops/test runs it"]
fn steady_state_mixed_sizes_commit_identically() {
    s::steady_state_mixed_sizes_commit_identically(&Setup::LAB_RDMA);
}

#[test]
#[ignore = "lab: needs the Soft-RoCE lab; ops/test runs it"]
fn follower_crash_mid_load_then_catch_up() {
    s::follower_crash_mid_load_then_catch_up(&Setup::LAB_RDMA);
}

#[test]
#[ignore = "lab: needs the Soft-RoCE lab; ops/test runs it"]
fn leader_crash_mid_load_fails_over_and_rejoins() {
    s::leader_crash_mid_load_fails_over_and_rejoins(&Setup::LAB_RDMA);
}

#[test]
#[ignore = "lab: needs the Soft-RoCE lab; ops/test runs it"]
fn deposed_leader_wakes_up_and_is_fenced() {
    s::deposed_leader_wakes_up_and_is_fenced(&Setup::LAB_RDMA);
}

#[test]
#[ignore = "lab: needs the Soft-RoCE lab; ops/test runs it"]
fn lossy_link_keeps_the_log_correct() {
    s::lossy_link_keeps_the_log_correct(&Setup::LAB_RDMA);
}

#[test]
#[ignore = "lab: needs the Soft-RoCE lab; ops/test runs it"]
fn partitions_heal_and_a_cut_off_leader_cannot_commit() {
    s::partitions_heal_and_a_cut_off_leader_cannot_commit(&Setup::LAB_RDMA);
}

#[test]
#[ignore = "lab: needs the Soft-RoCE lab; ops/test runs it"]
fn kill_9_of_all_three_keeps_every_acknowledged_entry() {
    s::kill_9_of_all_three_keeps_every_acknowledged_entry(&Setup::LAB_RDMA);
}

#[test]
#[ignore = "lab: needs the Soft-RoCE lab; ops/test runs it"]
fn memory_durability_survives_kill_9_of_every_process() {
    s::memory_durability_survives_kill_9_of_every_process(&Setup::LAB_RDMA);
}

#[test]
#[ignore = "lab: needs the Soft-RoCE lab; ops/test runs it"]
fn replicated_durability_through_kills_a_stopped_leader_loss_a_cut_and_a_kill_of_all() {
    s::replicated_durability_through_kills_a_stopped_leader_loss_a_cut_and_a_kill_of_all(
        &Setup::LAB_RDMA,
    );
}

#[test]
#[ignore = "lab: needs the Soft-RoCE lab; ops/test runs it"]
fn memory_machine_crash_of_a_follower_does_not_let_the_others_elect_without_it() {
    s::memory_machine_crash_of_a_follower_does_not_let_the_others_elect_without_it(
        &Setup::LAB_RDMA,
    );
}

#[test]
#[ignore = "lab: needs the Soft-RoCE lab; ops/test runs it"]
fn a_follower_on_an_emptied_data_dir_does_not_let_the_others_elect_without_it() {
    s::a_follower_on_an_emptied_data_dir_does_not_let_the_others_elect_without_it(&Setup::LAB_RDMA);
}

#[test]
#[ignore = "lab: needs the Soft-RoCE lab; ops/test runs it"]
fn a_follower_behind_a_checkpoint_is_caught_up_by_a_snapshot() {
    s::a_follower_behind_a_checkpoint_is_caught_up_by_a_snapshot(&Setup::LAB_RDMA);
}

#[test]
#[ignore = "lab: needs the Soft-RoCE lab; ops/test runs it"]
fn a_wrong_peer_is_refused_on_both_sides() {
    s::a_wrong_peer_is_refused_on_both_sides(&Setup::LAB_RDMA);
}

#[test]
#[ignore = "lab: needs the Soft-RoCE lab; ops/test runs it"]
fn a_killed_follower_is_seen_down_within_the_dead_peer_bound() {
    s::a_killed_follower_is_seen_down_within_the_dead_peer_bound(&Setup::LAB_RDMA);
}

#[test]
#[ignore = "lab: needs the Soft-RoCE lab; ops/test runs it"]
fn a_crashed_machine_is_seen_down_over_idle_links() {
    s::a_crashed_machine_is_seen_down_over_idle_links(&Setup::LAB_RDMA);
}

#[test]
#[ignore = "lab: needs the Soft-RoCE lab; ops/test runs it"]
fn after_a_chaos_schedule_is_lifted_the_cluster_elects_serves_and_reconnects() {
    s::after_a_chaos_schedule_is_lifted_the_cluster_elects_serves_and_reconnects(&Setup::LAB_RDMA);
}

#[test]
#[ignore = "lab: needs the Soft-RoCE lab; ops/test runs it"]
fn tcp_deposed_leader_wakes_up_and_is_fenced() {
    s::deposed_leader_wakes_up_and_is_fenced(&Setup::LAB_TCP);
}

#[test]
#[ignore = "lab: needs the Soft-RoCE lab; ops/test runs it"]
fn tcp_lossy_link_keeps_the_log_correct() {
    s::lossy_link_keeps_the_log_correct(&Setup::LAB_TCP);
}

#[test]
#[ignore = "lab: needs the Soft-RoCE lab; ops/test runs it"]
fn tcp_partitions_heal_and_a_cut_off_leader_cannot_commit() {
    s::partitions_heal_and_a_cut_off_leader_cannot_commit(&Setup::LAB_TCP);
}

#[test]
#[ignore = "lab: needs the Soft-RoCE lab; ops/test runs it"]
fn tcp_replicated_durability_through_kills_a_stopped_leader_loss_a_cut_and_a_kill_of_all() {
    s::replicated_durability_through_kills_a_stopped_leader_loss_a_cut_and_a_kill_of_all(
        &Setup::LAB_TCP,
    );
}

#[test]
#[ignore = "lab: needs the Soft-RoCE lab; ops/test runs it"]
fn tcp_after_a_chaos_schedule_is_lifted_the_cluster_elects_serves_and_reconnects() {
    s::after_a_chaos_schedule_is_lifted_the_cluster_elects_serves_and_reconnects(&Setup::LAB_TCP);
}

#[test]
#[ignore = "lab: needs the Soft-RoCE lab; ops/test runs it"]
fn tcp_steady_state_mixed_sizes_commit_identically() {
    s::steady_state_mixed_sizes_commit_identically(&Setup::LAB_TCP);
}

#[test]
#[ignore = "lab: needs the Soft-RoCE lab; ops/test runs it"]
fn tcp_follower_crash_mid_load_then_catch_up() {
    s::follower_crash_mid_load_then_catch_up(&Setup::LAB_TCP);
}

#[test]
#[ignore = "lab: needs the Soft-RoCE lab; ops/test runs it"]
fn tcp_leader_crash_mid_load_fails_over_and_rejoins() {
    s::leader_crash_mid_load_fails_over_and_rejoins(&Setup::LAB_TCP);
}

#[test]
#[ignore = "lab: needs the Soft-RoCE lab; ops/test runs it"]
fn tcp_kill_9_of_all_three_keeps_every_acknowledged_entry() {
    s::kill_9_of_all_three_keeps_every_acknowledged_entry(&Setup::LAB_TCP);
}

#[test]
#[ignore = "lab: needs the Soft-RoCE lab; ops/test runs it"]
fn tcp_memory_durability_survives_kill_9_of_every_process() {
    s::memory_durability_survives_kill_9_of_every_process(&Setup::LAB_TCP);
}

#[test]
#[ignore = "lab: needs the Soft-RoCE lab; ops/test runs it"]
fn tcp_memory_machine_crash_of_a_follower_does_not_let_the_others_elect_without_it() {
    s::memory_machine_crash_of_a_follower_does_not_let_the_others_elect_without_it(&Setup::LAB_TCP);
}

#[test]
#[ignore = "lab: needs the Soft-RoCE lab; ops/test runs it"]
fn tcp_a_follower_on_an_emptied_data_dir_does_not_let_the_others_elect_without_it() {
    s::a_follower_on_an_emptied_data_dir_does_not_let_the_others_elect_without_it(&Setup::LAB_TCP);
}

#[test]
#[ignore = "lab: needs the Soft-RoCE lab; ops/test runs it"]
fn tcp_a_follower_behind_a_checkpoint_is_caught_up_by_a_snapshot() {
    s::a_follower_behind_a_checkpoint_is_caught_up_by_a_snapshot(&Setup::LAB_TCP);
}

#[test]
#[ignore = "lab: needs the Soft-RoCE lab; ops/test runs it"]
fn tcp_a_wrong_peer_is_refused_on_both_sides() {
    s::a_wrong_peer_is_refused_on_both_sides(&Setup::LAB_TCP);
}

#[test]
#[ignore = "lab: needs the Soft-RoCE lab; ops/test runs it"]
fn tcp_a_killed_follower_is_seen_down_within_the_dead_peer_bound() {
    s::a_killed_follower_is_seen_down_within_the_dead_peer_bound(&Setup::LAB_TCP);
}

#[test]
#[ignore = "lab: needs the Soft-RoCE lab; ops/test runs it"]
fn tcp_a_crashed_machine_is_seen_down_over_idle_links() {
    s::a_crashed_machine_is_seen_down_over_idle_links(&Setup::LAB_TCP);
}
