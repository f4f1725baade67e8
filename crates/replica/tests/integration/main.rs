//! The replica crate's host integration tests, one module per scenario file, in one test
//! binary: one link and one monomorphisation of the replica crate instead of one per file
//! (a cold `cargo test --workspace --no-run` spent 297 CPU-seconds on its 25 binaries here). The
//! lab test (`lab_rdma_replication.rs`) stays a binary of its own, as `ops/test` runs every
//! `lab_*` binary inside the lab.

mod ahead_of_raft;
mod allocations;
mod batch_and_tickets;
mod caller_driven_pass;
mod caller_misuse;
mod closed_log;
mod commit_broadcast;
mod conditional_append;
mod divergent_suffix;
mod driver_fail_stop;
mod election_and_replication;
mod embedded_api;
mod exactly_once;
mod failed_cut_keeps_the_ring;
mod fencing_deposed_leader;
mod follower_catch_up;
mod joiner_after_checkpoint;
mod joiner_membership;
mod linearizable_reads;
mod lost_tail_catch_up;
mod membership_and_truncation;
mod memory_durability;
mod memory_machine_crash;
mod peer_input;
mod queued_proposals;
mod removal_survives_restart;
mod removed_leader;
mod replaced_data_dir;
mod replicated_durability;
mod restart_after_truncation;
mod retention;
mod ring_full_late_reads;
mod sim_add_node;
mod snapshot_transfer;
mod stale_branch_after_a_failed_cut;
mod stale_suffix;
mod three_nodes;
mod woken_leader_after_reconnect;
