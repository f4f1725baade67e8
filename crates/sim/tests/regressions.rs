//! Every seed that ever failed in the simulator, named after what it found. Each runs with the
//! options it failed with: the first version's 2 s fault phase and 60 appends. The driver has
//! gained faults since (power loss, leader-targeted torn writes), so a seed's run is no longer
//! byte-identical to the failing one; the bugs also have focused tests
//! (`replica/tests/integration/joiner_membership.rs`).
//!
//! Method: `sim::run(seed, options)` must pass all checkers.

/// The options every seed here was found with: a read failure took the node's next read
/// (before reads were drawn from the next few, `Options::next_read_eio`), so each replays the
/// schedule that failed.
fn found_before() -> sim::Options {
    sim::Options {
        next_read_eio: true,
        ..sim::Options::default()
    }
}

fn pass(seed: u64) {
    let options = sim::Options {
        fault_ns: 2_000_000_000,
        max_appends: 60,
        ..found_before()
    };
    if let Err(f) = sim::run(seed, options, false) {
        panic!("\n{f}\n");
    }
}

/// Liveness: a one-directional partition left a half-open connection (the sender's side Up,
/// the receiver's in error), and the fabric simulator still delivered sends into the errored
/// side while its credits never came back: the sender sat at zero credits with nothing
/// outstanding, so nothing ever failed and the lower-id node never reconnected. Fixed in
/// `fabric::sim` (an errored side answers nothing; an undeliverable credit fails the
/// connection). The same seed then found the next bug: a node added to the cluster replayed a
/// "remove node 2" entry onto its empty membership and fail-stopped with "removed all voters"
/// at every restart. Fixed in `replica` (a membership change records the voters after it; a
/// joiner adopts them).
#[test]
fn seed_5_half_open_connection_and_joiner_membership() {
    pass(5);
}

/// Liveness: a node that had not applied the entry adding node 4 did not know node 4, and
/// node 4 (the leader, the higher id) never connected to it, because only the lower id of a
/// pair connected. Fixed in `replica` (the higher id connects too after the connection stayed
/// down for several reconnect periods). Seeds 792, 595, 972 and 494 failed the same way.
#[test]
fn seed_121_higher_id_never_connects_to_a_lagging_node() {
    pass(121);
}

/// Liveness: a paused node's NIC took messages on a new connection while an older
/// connection's `Disconnected` event was still queued; at wake-up the simulated endpoint moved
/// the new messages into the receive buffers first and then cleared them all on that stale
/// event, so the replica could not repost them and their credits never returned: the leader
/// sat at zero credits forever. Fixed in `fabric::sim` (messages travel in event order, and a
/// buffer from an older connection is never reposted twice).
#[test]
fn seed_733_paused_receiver_leaks_credits() {
    pass(733);
}

#[test]
fn seed_792_same_as_121() {
    pass(792);
}

/// Harness bug, not a replica bug: the client asked a node restarted by a power loss about a
/// ticket its previous process gave, saw "superseded" (the new process's log was shorter) and
/// recorded a definite failure of an append that was in fact committed. Tickets now belong to
/// one incarnation; a later one reports the outcome as unknown. Found with the defaults.
#[test]
fn seed_248_ticket_asked_of_a_later_incarnation() {
    if let Err(f) = sim::run(248, found_before(), false) {
        panic!("\n{f}\n");
    }
}

/// Liveness (driver): under `Durability::Memory`, two machine crashes while five nodes were
/// members left two recovering nodes, and a voter removal then made them half of the smaller
/// configuration: no leader could be elected, the documented stall. Fixed in the driver
/// (machine crashes and removals keep recovering nodes a minority of the smallest
/// configuration). Seed 709 failed the same way through a node that was added to the driver
/// but never became a voter.
#[test]
fn seed_444_recovering_nodes_became_a_majority() {
    let options = found_before();
    for seed in [444, 709] {
        if let Err(f) = sim::run(seed, options, false) {
            panic!("\n{f}\n");
        }
    }
}

/// Lsn agreement (issue 13, defect 6): a follower cut a conflicting suffix whose previous entry
/// the ring had already released, and rewound to the start of the cut record instead of the
/// end of the previous entry; padding lay between the two, so it then held entry 61 at Lsn
/// 65536 where the leader had it at 63440, and every later entry at other Lsns than the
/// leader's. Found by the Lsn checker; fixed in `Replica::truncate_from`.
#[test]
fn seed_76_truncation_rewound_past_padding() {
    if let Err(f) = sim::run(76, found_before(), false) {
        panic!("\n{f}\n");
    }
}

/// Seeds found once checkpoints and mid-write power cuts joined the faults:
/// - 20: a power cut made a read of the log fail inside raft-rs, which panics on storage
///   errors; the replica now fails stop with the failed read as its cause
///   (`Replica::process`).
/// - 106: a power cut that fired while a killed node restarted (driver: it is a machine crash
///   then).
/// - 414: under Memory a checkpoint, then kills: the next start took the checkpoint for an
///   interrupted snapshot install before it took the ring's entries over, and lost committed
///   entries (`replica/tests/integration/memory_durability.rs` has the focused test).
/// - 524: a node added after the leader's checkpoint was refused the checkpoint's snapshot by
///   raft-rs, whose membership lacked it, and never joined
///   (`replica/tests/integration/joiner_after_checkpoint.rs`).
#[test]
fn seeds_20_106_414_524_checkpoints_and_power_cuts() {
    for seed in [20, 106, 414, 524] {
        if let Err(f) = sim::run(seed, found_before(), false) {
            panic!("\n{f}\n");
        }
    }
}

/// Checker artifact (driver): every node had a read failure armed that no read took, so the
/// checkers skipped them to the end and reported acknowledged entries missing from a
/// committed log they never saw. The repair disarms read failures.
#[test]
fn seeds_4334_50616_read_failures_armed_to_the_end() {
    for seed in [4334, 50616] {
        if let Err(f) = sim::run(seed, found_before(), false) {
            panic!("\n{f}\n");
        }
    }
}

/// Found by the long run:
/// - 53809 and 5759 (ring integrity, issue 13 defect 7): after a follower's restart raft sent
///   an append again from the end an older response reported while a slow append was still
///   in flight; the fast write went over the record that append had placed, and a corrupted
///   write there damaged an accepted record. A response now re-opens the fast path only when
///   the follower holds everything sent to it on the connection (`FastPeer::sent_to`).
/// - 7487 (liveness, driver): under Memory a machine crash left a recovering node while a
///   retired node was still a voter of every configuration: the documented stall. The driver
///   counts retired and recovering voters against every configuration's majority.
#[test]
fn seeds_53809_5759_7487_stale_fast_end_and_retired_voters() {
    for seed in [53809, 5759, 7487] {
        if let Err(f) = sim::run(seed, found_before(), false) {
            panic!("\n{f}\n");
        }
    }
}

/// Liveness (driver), found by the long run: under Memory two machine crashes while a voter's
/// removal was in flight; once it committed, the two recovering nodes were half of the smaller
/// configuration (the documented stall). The driver counts nodes being removed as gone.
#[test]
fn seed_20514_recovering_nodes_and_a_removal_in_flight() {
    if let Err(f) = sim::run(20514, found_before(), false) {
        panic!("\n{f}\n");
    }
}

/// Liveness (fabric simulator), found by the long run: a one-way block dropped a send, the
/// link healed, and the next send on the same connection was delivered; its cumulative ack
/// retired the lost one as a success, so the receive credit it never consumed never came
/// back. After enough of those the leader sat at zero credits with 152 frames queued and its
/// follower, hearing nothing, stayed a pre-candidate. RC delivers a connection's requests in
/// order or not at all: `fabric::sim` now drops everything after a lost request on that
/// connection, so the oldest fails `RetryExceeded` and the connection is rebuilt
/// (`fabric/tests/integration/dead_peer.rs` has the focused test).
#[test]
fn seeds_44395_55510_a_lost_send_overtaken_leaks_a_credit() {
    for seed in [44395, 55510] {
        if let Err(f) = sim::run(seed, found_before(), false) {
            panic!("\n{f}\n");
        }
    }
}

/// Found when rot seeds got 16 KiB blocks and 32 KiB segments (segment rotation within a
/// seed):
/// - 627 (wal recovery): a torn restart lost the only record of a new segment; the log went on
///   in the previous segment's padding, and the emptied segment's header named the wrong first
///   entry, so a prefix truncation kept the locations of records it deleted (a panic in
///   `Wal::read`). Recovery now deletes segments left without an entry.
/// - 1765 (Lsn agreement): a deposed leader's checkpoint deleted the segment holding the
///   checkpoint's entry; when its uncommitted entries after it were replaced, its log could
///   only go on at the next segment's start. A prefix truncation now keeps that segment.
#[test]
fn seeds_627_1765_small_segments() {
    for seed in [627, 1765] {
        if let Err(f) = sim::run(seed, found_before(), false) {
            panic!("\n{f}\n");
        }
    }
}

/// Liveness (driver), found by the 100,000-seed run with the rot fault: a random removal was
/// in flight while a node that had a rotten record was about to be lost for good; the removed
/// node was shut down before every configuration had dropped it, and with the lost one the
/// configuration had no majority left. The driver makes no membership change of its own while
/// a rotten node is still a member, and rots nothing while a removal is in flight.
#[test]
fn seeds_43139_88155_a_removal_beside_a_lost_node() {
    for seed in [43139, 88155] {
        if let Err(f) = sim::run(seed, found_before(), false) {
            panic!("\n{f}\n");
        }
    }
}

/// Checker, found by the first long run of `Durability::Replicated` seeds (all forced to that
/// mode, the CI's default options): an acknowledged entry was flagged "in no node's committed
/// log" while the only node holding it committed, the leader, had an armed read failure that
/// never fired (it served everything from its ring, so the checker skipped it step after
/// step), and the other live node had restarted from a later checkpoint. The checker now
/// leaves such an ack to a later step and to the final history check while no node it reads
/// could show the entry.
#[test]
fn seed_2697_replicated_an_ack_only_a_skipped_leader_could_show() {
    let options = sim::Options {
        durability: Some(replica::Durability::Replicated),
        ..found_before()
    };
    if let Err(f) = sim::run(2697, options, false) {
        panic!("\n{f}\n");
    }
}

/// Ring integrity, found by the checker that fails a seed when a follower is sent a descriptor
/// of its granted leader starting below the records it had accepted (issue 13, defect 7's
/// family): a leader slept (SIGSTOP) while its follower re-dialled; the fabric built the new
/// connection at once, and the leader, waking, proposed and wrote from the fast-path end it
/// kept for the old connection before it polled the `Connected` of the new one, whose grant
/// the follower had already given. A connection is now usable only once its owner polled its
/// `Connected` (`fabric/tests/integration/unannounced_connection.rs` has the focused test).
#[test]
fn seed_928_a_leader_woke_and_wrote_on_a_connection_it_had_not_seen() {
    if let Err(f) = sim::run(928, found_before(), false) {
        panic!("\n{f}\n");
    }
}

/// Found once `FaultFs` modelled a failed fdatasync as Linux does (the failed pages are marked
/// clean: the page cache keeps the new bytes, the disk the old ones, and no later fdatasync
/// writes them), and by the 100,000-seed run of issue 13 before that:
/// - 319 (recovery): a node fail-stopped on an append's failed fdatasync, restarted on the
///   same machine reading the entry from the page cache, synced later entries, and after a
///   machine crash refused to start: a hole, then valid records.
/// - 62767 (state machine safety, `Replicated`): a follower's cut of a stale branch failed at
///   its fdatasync; the next process read the cut from the page cache, caught up and persisted
///   a commit index over the new entries; a machine crash brought the stale branch back and
///   open clamped the commit into it.
///
/// The poisoned wal now leaves a marker and the next open rewrites every segment
/// (`wal/tests/integration/failed_sync.rs`), and a node that lost its ring no longer trusts its commit
/// index (`replica/tests/integration/stale_branch_after_a_failed_cut.rs`).
#[test]
fn seeds_319_62767_bytes_read_back_after_a_failed_fdatasync() {
    for seed in [319, 62767] {
        if let Err(f) = sim::run(seed, found_before(), false) {
            panic!("\n{f}\n");
        }
    }
}

/// Well-formed messages (the check that fails a seed on any frame a node refuses): raft-rs's
/// `batch_append` added the entries from 100, sent after a rejection, to the empty append at
/// 118 it had queued to the same follower in the same round, and the follower refused an
/// append with index 118 and entries 100..=118. Fixed in `replica` (`node::send::repair_batched`
/// gives such entries the index before them); the mutation `unrepaired-raft-batches` takes the
/// fix away and this seed fails again (`tests/mutation.rs`). Runs with the default options it
/// failed with.
#[test]
fn seed_1088_entries_batched_onto_an_empty_append() {
    // Both schedules: the one it was found with (before kills in the middle of a disk
    // operation existed) and today's default.
    for kill_mid_op in [false, true] {
        let options = sim::Options {
            kill_mid_op,
            ..found_before()
        };
        if let Err(f) = sim::run(1088, options, false) {
            panic!("\n{f}\n");
        }
    }
}

/// Liveness, found by a 3,000-seed `Durability::Replicated` run from seed 500,000: no leader
/// after the faults stopped. One node's machine had crashed (it came back recovering, as it
/// must); another's cut of a conflicting suffix failed at its fdatasync after the wal was cut
/// and before the ring was rewound, so the ring's published end claimed records the ring no
/// longer held. That node read its intact ring as corrupt and came back recovering too: two
/// of three voters would not vote. A follower now rewinds its ring before it cuts its wal
/// (`Replica::truncate_from`); `replica/tests/integration/failed_cut_keeps_the_ring.rs` builds
/// the situation on purpose and catches the mutation `cut-wal-before-ring`.
#[test]
fn seed_501055_replicated_a_failed_cut_read_its_own_ring_as_corrupt() {
    let options = sim::Options {
        durability: Some(replica::Durability::Replicated),
        ..found_before()
    };
    if let Err(f) = sim::run(501055, options, false) {
        panic!("\n{f}\n");
    }
}

fn pass_with(seed: u64, options: sim::Options) {
    if let Err(f) = sim::run(seed, options, false) {
        panic!("\n{f}\n");
    }
}

/// State machine safety, found by a 2,000-seed `--callers-drive --durability replicated` run
/// on 2026-12-05: a leader counted a follower's NIC for an entry whose write had been lost on
/// a cut link. A simulator bug, not the replica's: the follower revoked the leader's access
/// while a later write of the same connection was on the wire, the in-process fabric tore
/// that later write and answered it `RemoteAccess`, and the answer acknowledged every
/// operation before it, the lost write too, as `Success`. A responder takes nothing past a
/// gap in the sequence; the fabric now tears only writes that can arrive
/// (`fabric/tests/integration/fencing.rs`,
/// `a_lost_write_is_not_completed_by_a_later_write_torn_at_a_revoke`).
#[test]
fn seed_9601360_callers_drive_replicated_a_lost_write_completed_by_a_torn_one() {
    pass_with(
        9_601_360,
        sim::Options {
            callers_drive: true,
            // The schedule it was found with, before the family's deposed-leader episode.
            deposed_episodes: false,
            durability: Some(replica::Durability::Replicated),
            ..found_before()
        },
    );
}

/// A panic, found by a 1,500-seed `--callers-drive --conditional` run on 2026-12-05: a read
/// of the log failed (an injected EIO) while a tick stepped the proposals waiting for raft,
/// outside the wrapper that turns raft-rs's panic on a failed read into a fail-stop. The
/// tick now steps them inside it (`Replica::tick`; mutation `tick-outside-fail-stop`).
#[test]
fn seed_9800079_callers_drive_conditional_a_read_error_in_a_tick() {
    pass_with(
        9_800_079,
        sim::Options {
            callers_drive: true,
            // The schedule it was found with, before the family's deposed-leader episode.
            deposed_episodes: false,
            conditional: true,
            ..found_before()
        },
    );
}

/// Liveness, found by a 1,500-seed `--conditional` run on 2026-12-05 and, the same way, by
/// seed 8,000,412 of `--durability replicated` earlier: node 4 was removed and shut down,
/// the other nodes were killed and restarted, and came back counting it again: each had
/// stored the membership change with the commit index it had before (a `Ready` applies its
/// committed entries before it stores its hard state), so the restart took the removal for
/// uncommitted. With one more node recovering (a machine crash) no election could win.
/// Fixed in `replica` (the commit index that covers a change is stored with it;
/// `replica/tests/integration/removal_survives_restart.rs`, mutation
/// `conf-change-commit-lags` in `tests/mutation.rs`); the simulator also shuts a removed node
/// down only once every live node's configuration has dropped it.
#[test]
fn seed_9950157_conditional_a_restart_forgot_a_removal() {
    pass_with(
        9_950_157,
        sim::Options {
            conditional: true,
            ..found_before()
        },
    );
    pass_with(
        8_000_412,
        sim::Options {
            durability: Some(replica::Durability::Replicated),
            ..found_before()
        },
    );
}

/// A panic, found by a 1,500-seed `--durability fsync` run on 2026-12-05 (and failing the same
/// way before proposals ahead of raft): a node removed from the voters won an election with a
/// configuration that still counted it, then applied its own removal, and raft-rs kept it
/// leading with no progress of its own: the next response it stepped panicked in
/// `Raft::maybe_commit`. Fixed in `replica` (a leader that applies its own removal steps
/// down; `replica/tests/integration/removed_leader.rs`, mutation `removed-leader-leads`).
#[test]
fn seed_10500953_fsync_a_removed_leader_led_on() {
    pass_with(
        10_500_953,
        sim::Options {
            durability: Some(replica::Durability::Fsync),
            ..found_before()
        },
    );
}

/// Liveness, found by a 1,500-seed `--callers-drive --sessions` run on 2026-12-05 (failing
/// the same way at 8924509): the harness, not the replica. After the faults stopped a session
/// client still had about 17 numbers queued and kept sending later ones while earlier ones
/// were not appended yet; the leader refused each ("skips ahead") and the retries missed the
/// liveness bound, though every number the replica took committed. After the faults stop a
/// session's client now sends its numbers in order (`Run::waits_for_an_earlier_number`).
#[test]
fn seed_10700044_sessions_a_client_that_refused_itself() {
    pass_with(
        10_700_044,
        sim::Options {
            callers_drive: true,
            // The schedule it was found with, before the family's deposed-leader episode.
            deposed_episodes: false,
            sessions: true,
            ..found_before()
        },
    );
}

/// Liveness, found by a 1,000-seed `--sessions` run on 2026-12-07 (also at the session's
/// first commit, 8612626): the harness, not the replica. A session client's number 3 had
/// committed without the client hearing of it; by its next try the session's table had moved
/// past it, and the leader answered `SessionTooOld` ("in the log, too far back to tell its
/// index"). The client took that for a failure and retried it for ever, and its later numbers
/// waited behind it. A client, as the real ones do, now takes `SessionTooOld` as the entry
/// being in the log once (the checker holds every key to at most once) and moves on.
#[test]
fn seed_60000796_sessions_a_number_too_old_to_retry() {
    pass_with(
        60_000_796,
        sim::Options {
            sessions: true,
            ..found_before()
        },
    );
}

/// A panic: a client's linearizable read on a leader whose disk failed the read raft-rs made
/// of its log (the term of its commit index, to see whether it committed in its own term)
/// unwound out of `Replica::read_index`: raft-rs panics on any storage error it does not
/// expect, and only the passes and proposals turned that into a fail-stop. Found by the first
/// run of the `--reads` family. Fixed in `replica` (`read_index` fail-stops like a pass, and
/// refuses `Poisoned` once stopped).
#[test]
fn seed_30001061_reads_a_read_error_in_a_linearizable_read() {
    pass_with(
        30_001_061,
        sim::Options {
            reads: true,
            ..found_before()
        },
    );
}

/// Liveness, found by a 600-seed `--conditional` run on 2026-12-07: raft dropped six
/// additions in a row (a change was pending), and the empty joiners stayed up; after the
/// faults the client, asking a random live node for the leader, met only joiners that knew
/// none, 27 times out of 27, and the append made after the repair never went through. A
/// harness bug: a real client sends to the members it learns from `Status` and redirects.
/// Once the faults stop the simulated one picks among the nodes a live node counts as
/// voters.
#[test]
fn seed_70500186_conditional_a_client_asked_only_joiners() {
    pass_with(
        70_500_186,
        sim::Options {
            conditional: true,
            ..found_before()
        },
    );
}

/// Membership agreement, found by the membership checker the day it was added (2026-12-07):
/// node 1 applied the removal of node 5, then its machine crashed; the restart started raft
/// with the stored membership (without 5) and applied the log again from its first entry,
/// the addition of 5 included, so it counted node 5 again until it re-applied the removal. A
/// restart no longer applies the changes its stored membership holds (mutation
/// `replay-applied-conf-changes`).
#[test]
fn seed_522_a_restart_went_back_to_an_older_membership() {
    pass_with(522, found_before());
}
