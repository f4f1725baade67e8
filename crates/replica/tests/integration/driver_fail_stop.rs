//! Scenario (issue 13, defect 4): a panic in a log's driver thread must not leave a zombie
//! that accepts appends and never resolves them. The log fails stop: pending handles,
//! subscriptions and later calls get an error naming the cause, `status` shows it, and
//! `close` reports it instead of flushing a replica in an unknown state.
//!
//! Method: three `Log`s on driver threads over the in-process fabric in real time; the
//! leader's links are cut so an append stays pending, then the test-only
//! `Log::inject_driver_panic` makes the leader's driver panic.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use fabric::NodeId;
use fabric::sim::{SimConfig, SimEndpoint, SimNet};
use replica::retention::Retention;
use replica::{CheckpointPause, Log, LogOptions, ReplicaConfig, ReplicaError, Role};
use wal::fs::{FaultFs, FileSystem};

fn cluster() -> (SimNet, Arc<AtomicBool>, Vec<Log<SimEndpoint>>) {
    let net = SimNet::new(SimConfig::default(), 7);
    let stop = Arc::new(AtomicBool::new(false));
    net.run_realtime(stop.clone());
    let logs = (1..=3u64)
        .map(|id| {
            let mut cfg = ReplicaConfig::new(id, vec![1, 2, 3], 9, format!("/n{id}").into());
            cfg.ring_bytes = 2 << 20;
            cfg.election_window = Some((10 + 3 * id as usize, 11 + 3 * id as usize));
            let disk: Arc<dyn FileSystem> = Arc::new(FaultFs::new());
            Log::open(cfg, net.add_node(NodeId(id)), disk, LogOptions::default()).unwrap()
        })
        .collect();
    (net, stop, logs)
}

fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if cond() {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!("{what} did not happen within 20 s");
}

#[test]
fn a_driver_panic_fails_every_waiter_with_its_cause() {
    let (net, stop, logs) = cluster();
    // On a loaded machine the realtime cluster may change leader at any moment: find one,
    // commit through it, cut it off and give it an append; start over if it was no longer
    // the leader by then.
    let mut attempt = 0;
    let (l, pending) = loop {
        attempt += 1;
        assert!(attempt <= 10, "no leader took an append in 10 tries");
        let mut l = 0;
        wait_for("an election", || {
            match logs.iter().position(|g| g.status().role == Role::Leader) {
                Some(k) => {
                    l = k;
                    true
                }
                None => false,
            }
        });
        let committed = logs[l]
            .append(b"before")
            .and_then(|h| h.wait(Duration::from_secs(5)));
        if committed.is_err() {
            continue;
        }
        let me = NodeId(l as u64 + 1);
        let cut = |up: bool| {
            for other in (1..=3).map(NodeId).filter(|&o| o != me) {
                net.set_link(me, other, up);
                net.set_link(other, me, up);
            }
        };
        cut(false);
        match logs[l].append(b"pending") {
            Ok(pending) => break (l, pending),
            Err(ReplicaError::NotLeader { .. }) => cut(true),
            Err(e) => panic!("the cut-off leader refused an append: {e}"),
        }
    };
    let mut sub = logs[l].subscribe(2);
    logs[l].inject_driver_panic();
    wait_for("the fail-stop", || logs[l].failure().is_some());

    let is_cause = |e: &ReplicaError| matches!(e, ReplicaError::Poisoned(why) if why.contains("driver thread panicked"));
    let r = pending.wait(Duration::from_secs(5));
    assert!(r.as_ref().is_err_and(is_cause), "pending handle: {r:?}");
    let r = logs[l].append(b"after");
    assert!(
        r.as_ref().is_err_and(is_cause),
        "a later append: {:?}",
        r.err()
    );
    let r = sub.next_timeout(Duration::from_secs(1));
    assert!(r.as_ref().is_err_and(is_cause), "subscription: {r:?}");
    let s = logs[l].status();
    assert!(
        s.failure.as_deref().is_some_and(|f| f.contains("panicked")),
        "status: {:?}",
        s.failure
    );
    refuses_everything_with(&logs[l], is_cause);
    stop.store(true, Ordering::Relaxed);
    let mut logs = logs;
    let failed = logs.remove(l);
    let r = failed.close();
    assert!(r.as_ref().is_err_and(is_cause), "close: {r:?}");
    for log in logs {
        log.close().unwrap();
    }
}

/// Every call that reads the log or changes it is refused with the cause (`is_cause`): a
/// replica whose pass panicked is in an unknown state, and nothing may read its entries or cut
/// its wal (the server's retention thread would).
fn refuses_everything_with(log: &Log<SimEndpoint>, is_cause: impl Fn(&ReplicaError) -> bool) {
    let first = log.status().first_index;
    let trim = Retention {
        max_entries: Some(1),
        ..Retention::default()
    };
    let calls: Vec<(&str, Result<(), ReplicaError>)> = vec![
        ("read", log.read(1).map(drop)),
        ("read_index", log.read_index().map(drop)),
        ("append_batch", log.append_batch(&[b"x"]).map(drop)),
        ("open_session", log.open_session().map(drop)),
        ("truncate_prefix", log.truncate_prefix(2).map(drop)),
        ("checkpoint", log.checkpoint(1, b"state").map(drop)),
        (
            "apply_retention",
            log.apply_retention(&trim, std::time::SystemTime::now())
                .map(drop),
        ),
        ("transfer_leader", log.transfer_leader(2)),
        ("add_node", log.add_node(4).map(drop)),
        ("remove_node", log.remove_node(3).map(drop)),
    ];
    for (name, r) in calls {
        assert!(
            r.as_ref().is_err_and(&is_cause),
            "{name} after the failure: {r:?}"
        );
    }
    assert_eq!(
        log.status().first_index,
        first,
        "the failed log's wal was cut"
    );
}

/// A leader of a three-node cluster over the in-process fabric in real time that has
/// committed two entries: the cluster, the leader's position and the index of its second
/// entry.
fn leader_with_two_entries() -> (SimNet, Arc<AtomicBool>, Vec<Log<SimEndpoint>>, usize, u64) {
    let (net, stop, logs) = cluster();
    for _ in 0..10 {
        let mut l = 0;
        wait_for("an election", || {
            match logs.iter().position(|g| g.status().role == Role::Leader) {
                Some(k) => {
                    l = k;
                    true
                }
                None => false,
            }
        });
        let two = logs[l]
            .append(b"one")
            .and_then(|h| h.wait(Duration::from_secs(5)))
            .and_then(|_| logs[l].append(b"two"))
            .and_then(|h| h.wait(Duration::from_secs(5)));
        if let Ok(index) = two {
            return (net, stop, logs, l, index);
        }
    }
    panic!("no leader committed two entries in 10 tries");
}

fn close_all(stop: &AtomicBool, logs: Vec<Log<SimEndpoint>>) {
    stop.store(true, Ordering::Relaxed);
    for log in logs {
        let _ = log.close();
    }
}

#[test]
fn between_a_panic_and_its_fail_stop_nothing_reads_or_cuts_the_log() {
    // The driver panics holding the replica's lock; until its fail-stop records the panic,
    // the only sign is the poisoned lock. Held there, every call must already be refused.
    let (_net, stop, logs, l, _) = leader_with_two_entries();
    logs[l].hold_fail_stop_for_test(true);
    logs[l].inject_driver_panic();
    wait_for("the panic", || logs[l].fail_stop_held_for_test());
    assert_eq!(logs[l].failure(), None, "the fail-stop is held");
    let refused = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        refuses_everything_with(
            &logs[l],
            |e| matches!(e, ReplicaError::Poisoned(why) if why.contains("panicked")),
        )
    }));
    // Released before any assertion fails: a held driver would hang the logs' drop.
    logs[l].hold_fail_stop_for_test(false);
    if let Err(failed) = refused {
        std::panic::resume_unwind(failed);
    }
    wait_for("the fail-stop", || logs[l].failure().is_some());
    close_all(&stop, logs);
}

#[test]
fn a_checkpoint_reading_when_the_log_fails_stores_nothing_and_cuts_nothing() {
    // A trim (or the server's retention pass) reads the log without the replica's lock; the
    // driver panics meanwhile. Taking the lock again, the trim must see the failure rather
    // than store a checkpoint and cut the wal of a replica in an unknown state.
    let (_net, stop, logs, l, second) = leader_with_two_entries();
    let first = logs[l].status().first_index;
    logs[l].pause_checkpoint_for_test(Some(CheckpointPause::AfterReading));
    let trim = std::thread::scope(|scope| {
        let trim = scope.spawn(|| logs[l].truncate_prefix(second));
        wait_for("the trim to read", || logs[l].checkpoint_waiting_for_test());
        logs[l].inject_driver_panic();
        wait_for("the fail-stop", || logs[l].failure().is_some());
        logs[l].pause_checkpoint_for_test(None);
        trim.join().unwrap()
    });
    assert!(
        matches!(&trim, Err(ReplicaError::Poisoned(why)) if why.contains("panicked")),
        "the trim: {trim:?}"
    );
    assert_eq!(
        logs[l].status().first_index,
        first,
        "the failed log's wal was cut"
    );
    assert_eq!(
        logs[l].latest_checkpoint().map(|c| c.index),
        None,
        "a checkpoint was stored"
    );
    close_all(&stop, logs);
}

#[test]
fn a_handle_whose_entry_committed_says_so_after_close() {
    // `close` ends pending appends with `Closed`; one that committed before must still say
    // committed (a caller asking after the close must not take it for a maybe-lost entry).
    let (net, stop, mut logs, l, _) = leader_with_two_entries();
    let committed = logs[l].append(b"three").unwrap();
    let index = committed
        .wait_for(Duration::from_secs(5))
        .expect("the third entry did not commit")
        .unwrap();
    let me = NodeId(l as u64 + 1);
    for other in (1..=3).map(NodeId).filter(|&o| o != me) {
        net.set_link(me, other, false);
        net.set_link(other, me, false);
    }
    let pending = logs[l].append(b"four");
    let leader = logs.remove(l);
    leader.close().unwrap();
    assert_eq!(committed.try_result().map(|r| r.ok()), Some(Some(index)));
    if let Ok(pending) = pending {
        let r = pending.try_result();
        assert!(
            matches!(r, Some(Err(ReplicaError::Closed))),
            "pending after close: {r:?}"
        );
    }
    close_all(&stop, logs);
}

#[test]
fn a_pending_future_polled_again_keeps_one_waker() {
    // A future re-polled while pending (as a `select!` loop does) replaces its waker; it
    // must not add one per poll for as long as the entry is pending.
    use std::task::{Context, Wake, Waker};
    struct Nothing;
    impl Wake for Nothing {
        fn wake(self: Arc<Self>) {}
    }
    let (net, stop, logs, l, _) = leader_with_two_entries();
    let me = NodeId(l as u64 + 1);
    for other in (1..=3).map(NodeId).filter(|&o| o != me) {
        net.set_link(me, other, false);
        net.set_link(other, me, false);
    }
    let Ok(mut pending) = logs[l].append(b"pending") else {
        // Deposed already: nothing pending to poll.
        return close_all(&stop, logs);
    };
    for _ in 0..1000 {
        let waker = Waker::from(Arc::new(Nothing));
        let mut cx = Context::from_waker(&waker);
        if std::future::Future::poll(std::pin::Pin::new(&mut pending), &mut cx).is_ready() {
            break;
        }
    }
    assert!(
        logs[l].pending_wakers_for_test() <= 1,
        "{} wakers",
        logs[l].pending_wakers_for_test()
    );
    drop(pending);
    assert_eq!(
        logs[l].pending_wakers_for_test(),
        0,
        "a dropped handle's waker stayed"
    );
    close_all(&stop, logs);
}

#[test]
fn a_failed_device_fails_the_log_stop_with_its_cause() {
    // The fabric reports that its device failed for good (`Event::Failed`: a completion queue
    // that can no longer be polled): the node must fail stop with the cause, as on a storage
    // failure, rather than stay up and useless; the others go on.
    let (net, stop, logs, l, _) = leader_with_two_entries();
    net.fail_device(NodeId(l as u64 + 1), "polling the send CQ failed: a test");
    wait_for("the fail-stop", || logs[l].failure().is_some());
    let is_cause = |e: &ReplicaError| {
        matches!(e, ReplicaError::Poisoned(why) if why.contains("fabric failed")
            && why.contains("polling the send CQ failed: a test"))
    };
    let r = logs[l].append(b"after");
    assert!(r.as_ref().is_err_and(is_cause), "an append: {:?}", r.err());
    let others: Vec<usize> = (0..3).filter(|&k| k != l).collect();
    wait_for("a new leader", || {
        others
            .iter()
            .any(|&k| logs[k].status().role == Role::Leader)
    });
    close_all(&stop, logs);
}
