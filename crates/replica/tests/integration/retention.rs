//! Retention (`replica::retention`, `Log::apply_retention`) on real files: three logs on the
//! in-process fabric, each in a temporary directory with small segments. Each limit (entries,
//! bytes, age by the segment files' last writes) deletes whole segments through a checkpoint,
//! keeps the tail segment and everything unapplied, and leaves the log readable from its new
//! first index, with `Compacted` below it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use fabric::NodeId;
use fabric::sim::{SimConfig, SimNet};
use replica::retention::Retention;
use replica::{
    CheckpointPause, Log, LogOptions, Mutation, PollMode, ReplicaConfig, ReplicaError, Role,
};
use wal::fs::{FileSystem, StdFs};

/// Three logs on real files (512 KiB segments) on a real-time in-process network, with
/// `mutation` in each replica's configuration, 600 entries of 3,000 bytes committed on every
/// node: the logs, the leader's position among them and the last index.
struct Three {
    _dirs: Vec<tempfile::TempDir>,
    net: SimNet,
    stop: Arc<AtomicBool>,
    logs: Vec<Log<fabric::sim::SimEndpoint>>,
    leader: usize,
    last: u64,
}

fn three_with_600_entries(mutation: Mutation) -> Three {
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let net = SimNet::new(SimConfig::default(), 17);
    let stop = Arc::new(AtomicBool::new(false));
    net.run_realtime(stop.clone());
    let logs: Vec<Log<_>> = (1..=3u64)
        .map(|id| {
            let mut cfg = ReplicaConfig::new(
                id,
                vec![1, 2, 3],
                9,
                dirs[id as usize - 1].path().to_path_buf(),
            );
            cfg.ring_bytes = 2 << 20;
            cfg.segment_bytes = 512 << 10;
            cfg.election_window = Some((10 + 3 * id as usize, 11 + 3 * id as usize));
            cfg.mutation = mutation;
            let fs: Arc<dyn FileSystem> = Arc::new(StdFs);
            let opts = LogOptions {
                poll: PollMode::Event,
                ..LogOptions::default()
            };
            Log::open(cfg, net.add_node(NodeId(id)), fs, opts).unwrap()
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(20);
    let l = loop {
        if let Some(k) = logs.iter().position(|l| l.status().role == Role::Leader) {
            break k;
        }
        assert!(Instant::now() < deadline, "no leader");
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut last = 0;
    for k in 0..600u32 {
        last = logs[l]
            .append(&[k as u8; 3000])
            .unwrap()
            .wait(Duration::from_secs(10))
            .unwrap();
    }
    for log in &logs {
        log.wait_for_commit(last, Duration::from_secs(10)).unwrap();
    }
    Three {
        _dirs: dirs,
        net,
        stop,
        logs,
        leader: l,
        last,
    }
}

/// Waits up to `secs` seconds for `done`, failing with `why` if it never comes.
fn wait_for(secs: u64, mut done: impl FnMut() -> bool, why: impl Fn() -> String) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !done() {
        assert!(Instant::now() < deadline, "{}", why());
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn each_limit_deletes_whole_old_segments_and_keeps_the_rest_readable() {
    let Three {
        _dirs,
        net: _net,
        stop,
        logs,
        leader: l,
        last,
    } = three_with_600_entries(Mutation::None);
    let log = &logs[l];
    let now = SystemTime::now();
    let s = log.status();
    assert_eq!(s.first_index, 1);
    assert!(s.log_bytes >= 600 * 3000, "{}", s.log_bytes);

    // Nothing is old yet, and an unlimited policy does nothing.
    let young = Retention {
        max_age: Some(Duration::from_secs(3600)),
        ..Retention::default()
    };
    assert_eq!(log.apply_retention(&young, now).unwrap(), None);
    assert_eq!(
        log.apply_retention(&Retention::default(), now).unwrap(),
        None
    );

    // At most 400 entries: whole segments go, the first index kept is at most last - 399.
    let entries = Retention {
        max_entries: Some(400),
        ..Retention::default()
    };
    let first = log.apply_retention(&entries, now).unwrap().expect("a trim");
    assert!(
        first > 1 && first <= last - 399,
        "first {first}, last {last}"
    );
    assert_eq!(log.status().first_index, first);
    assert!(matches!(
        log.subscribe(1).next_timeout(Duration::from_secs(1)),
        Err(ReplicaError::Compacted { .. })
    ));
    // A read below the first index is told so, as the subscription is (it returned `None`,
    // "not committed", and the server's reads skipped such entries as no-ops).
    match log.read(first - 1) {
        Err(ReplicaError::Compacted {
            index,
            checkpoint_index,
        }) => assert!(index == first - 1 && checkpoint_index >= index),
        other => panic!("a read of a deleted entry: {other:?}"),
    }
    assert_eq!(log.read(0).unwrap(), None);
    assert_eq!(log.read(first).unwrap().map(|d| d.len()), Some(3000));

    // At most ~600 KB: the log holds at most that plus one segment.
    let bytes = Retention {
        max_bytes: Some(600_000),
        ..Retention::default()
    };
    log.apply_retention(&bytes, now).unwrap().expect("a trim");
    let s = log.status();
    assert!(
        s.log_bytes <= 600_000 + (512 << 10),
        "{} bytes held",
        s.log_bytes
    );

    // Two hours later every segment but the tail is old.
    let later = now + Duration::from_secs(7200);
    let before = log.status().first_index;
    let first = log.apply_retention(&young, later).unwrap().expect("a trim");
    assert!(first > before);
    assert!(log.status().log_bytes <= 512 << 10);
    assert_eq!(log.read(last).unwrap().map(|d| d.len()), Some(3000));
    // The other nodes kept their own logs: retention is per node.
    let other = (l + 1) % 3;
    assert_eq!(logs[other].status().first_index, 1);
    stop.store(true, Ordering::Relaxed);
    for log in logs {
        log.close().unwrap();
    }
}

/// A retention pass reads back the entries it deletes (for their session records) without
/// the replica's lock. Held before that reading or after it (a test hook), the pass leaves
/// the log serving: appends commit and status answers. A checkpoint taken meanwhile makes the
/// pass plan again (before the reading, the entries are gone under it; after it, the latest
/// checkpoint is another one), and the newer checkpoint stays the latest. Without the second
/// check the pass failed with "the membership as of index 201 is no longer known", a refusal
/// of a checkpoint its caller never asked for.
#[test]
fn a_retention_pass_reads_the_log_without_holding_up_the_replica() {
    for at in [
        CheckpointPause::BeforeReading,
        CheckpointPause::AfterReading,
    ] {
        let t = three_with_600_entries(Mutation::None);
        let log = &t.logs[t.leader];
        log.pause_checkpoint_for_test(Some(at));
        let (first, latest, newer) = std::thread::scope(|s| {
            let pass = s.spawn(|| {
                let entries = Retention {
                    max_entries: Some(400),
                    ..Retention::default()
                };
                log.apply_retention(&entries, SystemTime::now())
            });
            wait_for(
                20,
                || log.checkpoint_waiting_for_test(),
                || format!("the pass never reached {at:?}"),
            );
            // The pass is between its two steps under the lock: the log goes on.
            let mut newer = 0;
            for k in 0..5u8 {
                newer = log
                    .append(&[k; 100])
                    .unwrap()
                    .wait(Duration::from_secs(10))
                    .unwrap_or_else(|e| panic!("an append while a retention pass reads: {e}"));
            }
            assert!(newer > t.last);
            assert!(log.checkpoint_waiting_for_test(), "the pass went on");
            // A newer checkpoint, at the last append (once applied).
            wait_for(
                10,
                || log.status().applied >= newer,
                || format!("{newer} never applied"),
            );
            log.checkpoint(newer, b"newer").unwrap();
            log.pause_checkpoint_for_test(None);
            // Planned again, the pass finds nothing left to delete: the newer checkpoint cut
            // the log.
            let first = pass
                .join()
                .unwrap()
                .unwrap_or_else(|e| panic!("the pass held {at:?}: {e}"));
            (first, log.latest_checkpoint().unwrap(), newer)
        });
        assert_eq!(first, None, "{at:?}");
        assert_eq!(log.status().stats.checkpoints_replanned, 1, "{at:?}");
        assert_eq!(
            latest.index, newer,
            "{at:?}: the newer checkpoint stays the latest"
        );
        assert_eq!(latest.state, b"newer");
        assert!(log.status().first_index > 1);
        assert_eq!(log.read(newer).unwrap().map(|d| d.len()), Some(100));
        t.stop.store(true, Ordering::Relaxed);
        for log in t.logs {
            log.close().unwrap();
        }
    }
}

/// A follower's retention pass, held before or after its reading of the log (without the
/// replica's lock), while the follower installs a snapshot from its leader (which restarts its
/// log under the reading): the pass plans again and ends cleanly, and the installed checkpoint
/// stays the latest.
#[test]
fn a_snapshot_installed_during_a_retention_pass_makes_it_plan_again() {
    for at in [
        CheckpointPause::BeforeReading,
        CheckpointPause::AfterReading,
    ] {
        let t = three_with_600_entries(Mutation::None);
        let (l, f) = (t.leader, (t.leader + 1) % 3);
        let (lid, fid) = (NodeId(l as u64 + 1), NodeId(f as u64 + 1));
        // The follower falls behind the leader's next trim.
        t.net.set_link(lid, fid, false);
        t.net.set_link(fid, lid, false);
        let mut last = t.last;
        for k in 0..300u32 {
            last = t.logs[l]
                .append(&[k as u8; 3000])
                .unwrap()
                .wait(Duration::from_secs(10))
                .unwrap();
        }
        wait_for(
            10,
            || t.logs[l].status().applied >= last,
            || format!("{last} never applied"),
        );
        let cut = t.logs[l].checkpoint(last, b"the leader's").unwrap();
        assert!(
            cut > t.last + 1,
            "the leader's log must start past the follower's end"
        );
        let follower = &t.logs[f];
        follower.pause_checkpoint_for_test(Some(at));
        let (result, latest) = std::thread::scope(|s| {
            let pass = s.spawn(|| {
                let entries = Retention {
                    max_entries: Some(400),
                    ..Retention::default()
                };
                follower.apply_retention(&entries, SystemTime::now())
            });
            wait_for(
                20,
                || follower.checkpoint_waiting_for_test(),
                || format!("the pass never reached {at:?}"),
            );
            t.net.set_link(lid, fid, true);
            t.net.set_link(fid, lid, true);
            wait_for(
                20,
                || follower.latest_checkpoint().map(|c| c.index) == Some(last),
                || "no snapshot installed".to_string(),
            );
            assert!(follower.checkpoint_waiting_for_test(), "the pass went on");
            follower.pause_checkpoint_for_test(None);
            let result = pass.join().unwrap();
            (result, follower.latest_checkpoint().unwrap())
        });
        let first = result.unwrap_or_else(|e| panic!("the pass held {at:?}: {e}"));
        assert_eq!(
            first, None,
            "{at:?}: nothing left to delete after the install"
        );
        assert_eq!(
            latest.index, last,
            "{at:?}: the installed checkpoint stays the latest"
        );
        assert_eq!(latest.state, b"the leader's");
        assert_eq!(follower.status().stats.checkpoints_replanned, 1, "{at:?}");
        // The follower goes on from the snapshot.
        let next = t.logs[l]
            .append(b"after")
            .unwrap()
            .wait(Duration::from_secs(10))
            .unwrap();
        follower
            .wait_for_commit(next, Duration::from_secs(10))
            .unwrap();
        t.stop.store(true, Ordering::Relaxed);
        for log in t.logs {
            log.close().unwrap();
        }
    }
}
