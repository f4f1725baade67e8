//! Scenario (issue 13, defect 4): a panic in a log's driver thread must not leave a zombie
//! that accepts appends and never resolves them. The log fails stop: pending handles,
//! subscriptions and later calls get an error naming the cause, `status` shows it, and
//! `close` reports it instead of flushing a replica in an unknown state.
//!
//! Method: three `Log`s on driver threads over the in-process fabric in real time; the
//! leader's links are cut so an append stays pending, then the test-only
//! `Log::inject_driver_panic` makes the leader's driver panic.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Wake, Waker};
use std::time::{Duration, Instant};

use fabric::NodeId;
use fabric::sim::{SimConfig, SimEndpoint, SimNet};
use replica::retention::Retention;
use replica::{
    AppendHandle, CheckpointPause, Durability, Log, LogOptions, PollMode, ReplicaConfig,
    ReplicaError, Role,
};
use wal::fs::{FaultFs, FileSystem};

fn cluster() -> (SimNet, Arc<AtomicBool>, Vec<Log<SimEndpoint>>) {
    let (net, stop, logs, _) = cluster_with_disks();
    (net, stop, logs)
}

type Disks = Vec<Arc<FaultFs>>;

fn cluster_with_disks() -> (SimNet, Arc<AtomicBool>, Vec<Log<SimEndpoint>>, Disks) {
    cluster_polling(LogOptions::default())
}

fn cluster_polling(options: LogOptions) -> (SimNet, Arc<AtomicBool>, Vec<Log<SimEndpoint>>, Disks) {
    cluster_in(options, Durability::Fsync)
}

fn cluster_in(
    options: LogOptions,
    durability: Durability,
) -> (SimNet, Arc<AtomicBool>, Vec<Log<SimEndpoint>>, Disks) {
    let net = SimNet::new(SimConfig::default(), 7);
    let stop = Arc::new(AtomicBool::new(false));
    net.run_realtime(stop.clone());
    let disks: Disks = (1..=3).map(|_| Arc::new(FaultFs::new())).collect();
    let logs = (1..=3u64)
        .map(|id| {
            let disk: Arc<dyn FileSystem> = disks[id as usize - 1].clone();
            let cfg = node_config(id, durability);
            Log::open(cfg, net.add_node(NodeId(id)), disk, options).unwrap()
        })
        .collect();
    (net, stop, logs, disks)
}

/// Node `id`'s configuration in these clusters.
fn node_config(id: u64, durability: Durability) -> ReplicaConfig {
    let mut cfg = ReplicaConfig::new(id, vec![1, 2, 3], 9, format!("/n{id}").into());
    cfg.ring_bytes = 2 << 20;
    cfg.durability = durability;
    cfg.election_window = Some((10 + 3 * id as usize, 11 + 3 * id as usize));
    cfg
}

/// Starts node `l` (a position among the logs) again on its disk, as after a kill, and waits
/// until its commit index reaches `commit`.
fn restart_at(
    net: &SimNet,
    disks: &Disks,
    l: usize,
    durability: Durability,
    commit: u64,
) -> Log<SimEndpoint> {
    let id = l as u64 + 1;
    net.kill_process(NodeId(id));
    let disk: Arc<dyn FileSystem> = disks[l].clone();
    let cfg = node_config(id, durability);
    let log = Log::open(cfg, net.restart(NodeId(id)), disk, LogOptions::default()).unwrap();
    wait_for("the restarted node's commit", || {
        log.status().commit >= commit
    });
    log
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

/// The position of a leader among `logs`, once one leads.
fn wait_for_leader(logs: &[Log<SimEndpoint>]) -> usize {
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
    l
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
        let l = wait_for_leader(&logs);
        let committed = logs[l]
            .append(b"before")
            .and_then(|h| h.wait(Duration::from_secs(5)));
        if committed.is_err() {
            continue;
        }
        cut(&net, l, false);
        match logs[l].append(b"pending") {
            Ok(pending) => break (l, pending),
            Err(ReplicaError::NotLeader { .. }) => cut(&net, l, true),
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
        (
            "wait_for_commit",
            log.wait_for_commit(1, Duration::from_millis(10)),
        ),
        (
            "subscribe",
            log.subscribe(1)
                .next_timeout(Duration::from_millis(10))
                .map(drop),
        ),
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
    let (net, stop, logs, l, index, _) = leader_with_two_entries_and_disks();
    (net, stop, logs, l, index)
}

/// [`leader_with_two_entries`], with the nodes' disks.
fn leader_with_two_entries_and_disks() -> (
    SimNet,
    Arc<AtomicBool>,
    Vec<Log<SimEndpoint>>,
    usize,
    u64,
    Disks,
) {
    let (net, stop, logs, disks) = cluster_with_disks();
    for _ in 0..10 {
        let l = wait_for_leader(&logs);
        let two = logs[l]
            .append(b"one")
            .and_then(|h| h.wait(Duration::from_secs(5)))
            .and_then(|_| logs[l].append(b"two"))
            .and_then(|h| h.wait(Duration::from_secs(5)));
        if let Ok(index) = two {
            return (net, stop, logs, l, index, disks);
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
    refuses_everything_while_held(
        &logs[l],
        |e| matches!(e, ReplicaError::Poisoned(why) if why.contains("panicked")),
    );
    close_all(&stop, logs);
}

/// With `log`'s fail-stop held after its pass failed or panicked (within 20 s), before the
/// failure is recorded: [`refuses_everything_with`]; then the fail-stop is let go and seen.
fn refuses_everything_while_held(log: &Log<SimEndpoint>, is_cause: impl Fn(&ReplicaError) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !log.fail_stop_held_for_test() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let refused = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        assert!(log.fail_stop_held_for_test(), "no pass failed in 20 s");
        assert_eq!(log.failure(), None, "the fail-stop is held");
        refuses_everything_with(log, is_cause)
    }));
    // Released before any assertion fails: a held driver would hang the logs' drop.
    log.hold_fail_stop_for_test(false);
    if let Err(failed) = refused {
        std::panic::resume_unwind(failed);
    }
    wait_for("the fail-stop", || log.failure().is_some());
}

#[test]
fn between_a_failed_pass_and_its_fail_stop_nothing_reads_or_cuts_the_log() {
    // A pass that fails on a storage error poisons the replica and releases its lock; the
    // driver records the failure after. Held in between, every call must already be refused:
    // raft may have moved past what the wal holds.
    let (_net, stop, logs, l, _, disks) = leader_with_two_entries_and_disks();
    logs[l].hold_fail_stop_for_test(true);
    disks[l].fail_next_sync();
    let _ = logs[l].append(b"its fdatasync fails");
    refuses_everything_while_held(&logs[l], |e| matches!(e, ReplicaError::Poisoned(_)));
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

/// Cuts node `l` off from the others, both ways (`up: false`), or heals its links.
fn cut(net: &SimNet, l: usize, up: bool) {
    let me = NodeId(l as u64 + 1);
    for other in (1..=3).map(NodeId).filter(|&o| o != me) {
        net.set_link(me, other, up);
        net.set_link(other, me, up);
    }
}

/// A cluster whose leader `l` ran `before_cut`, was cut off from the others, and holds an
/// append there that `still_pending` finds pending (retried on a fresh cluster when the
/// leader was deposed first, as a loaded machine may make it).
#[allow(clippy::type_complexity)]
fn pending_on_a_cut_off_leader<T>(
    mut before_cut: impl FnMut(&Log<SimEndpoint>) -> T,
    mut still_pending: impl FnMut(&mut AppendHandle<SimEndpoint>) -> bool,
) -> (
    SimNet,
    Arc<AtomicBool>,
    Vec<Log<SimEndpoint>>,
    usize,
    T,
    AppendHandle<SimEndpoint>,
) {
    for _ in 0..5 {
        let (net, stop, logs, l, _) = leader_with_two_entries();
        let t = before_cut(&logs[l]);
        cut(&net, l, false);
        if let Ok(mut pending) = logs[l].append(b"pending") {
            if still_pending(&mut pending) {
                return (net, stop, logs, l, t, pending);
            }
        }
        close_all(&stop, logs);
    }
    panic!("no leader kept an append pending in 5 tries");
}

#[test]
fn a_handle_whose_entry_committed_says_so_after_close() {
    // `close` ends pending appends with `Closed`; one that committed before must still say
    // committed (a caller asking after the close must not take it for a maybe-lost entry).
    let (_net, stop, mut logs, l, committed, pending) = pending_on_a_cut_off_leader(
        |log| {
            let h = log.append(b"three").unwrap();
            let index = h.wait_for(Duration::from_secs(5)).map(|r| r.unwrap());
            (h, index)
        },
        |p| p.try_result().is_none(),
    );
    let (committed, index) = committed;
    let index = index.expect("the third entry did not commit");
    let leader = logs.remove(l);
    leader.close().unwrap();
    assert_eq!(committed.try_result().map(|r| r.ok()), Some(Some(index)));
    let r = pending.try_result();
    assert!(
        matches!(r, Some(Err(ReplicaError::Closed))),
        "pending after close: {r:?}"
    );
    close_all(&stop, logs);
}

/// A waker that does nothing.
struct Nothing;

impl Wake for Nothing {
    fn wake(self: Arc<Self>) {}
}

#[test]
fn a_pending_future_polled_again_keeps_one_waker() {
    // A future re-polled while pending (as a `select!` loop does) replaces its waker; it
    // must not add one per poll for as long as the entry is pending.
    let (_net, stop, logs, l, (), pending) = pending_on_a_cut_off_leader(
        |_| (),
        |p| {
            (0..1000).all(|_| {
                let waker = Waker::from(Arc::new(Nothing));
                let mut cx = Context::from_waker(&waker);
                Future::poll(Pin::new(&mut *p), &mut cx).is_pending()
            })
        },
    );
    assert_eq!(logs[l].pending_wakers_for_test(), 1, "wakers kept");
    drop(pending);
    assert_eq!(
        logs[l].pending_wakers_for_test(),
        0,
        "a dropped handle's waker stayed"
    );
    close_all(&stop, logs);
}

/// A task that owns a pending append, as an executor's task owns its future.
struct Task(Mutex<Option<AppendHandle<SimEndpoint>>>);

impl Wake for Task {
    fn wake(self: Arc<Self>) {}
}

#[test]
fn a_wake_that_drops_the_last_task_holding_a_handle_does_not_hang_the_log() {
    // The log wakes a pending future when the commit moves. If that wake drops the last
    // reference to the task owning the handle (an executor whose queue is gone), the
    // handle's drop removes its waker from the very list being woken: done under the list's
    // lock, it hung the driver thread for good, and `close` with it.
    let (net, stop, logs, l, (), pending) =
        pending_on_a_cut_off_leader(|_| (), |p| p.try_result().is_none());
    let task = Arc::new(Task(Mutex::new(Some(pending))));
    let waker = Waker::from(task.clone());
    let polled = {
        let mut handle = task.0.lock().unwrap();
        let h = handle.as_mut().unwrap();
        Future::poll(Pin::new(h), &mut Context::from_waker(&waker))
    };
    assert!(polled.is_pending());
    // From here only the log's registered waker keeps the task (and the handle) alive.
    drop(waker);
    drop(task);
    let commit = logs[l].commit_index();
    cut(&net, l, true);
    wait_for("the commit to move", || logs[l].commit_index() > commit);
    let passes = logs[l].driver_passes_for_test();
    let deadline = Instant::now() + Duration::from_secs(10);
    while logs[l].driver_passes_for_test() == passes && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    if logs[l].driver_passes_for_test() == passes {
        // A hung driver would hang the logs' drop too: leave them.
        std::mem::forget(logs);
        panic!("the driver thread made no pass for 10 s after the wake");
    }
    assert_eq!(logs[l].pending_wakers_for_test(), 0);
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

/// A waker that asks another handle for its outcome when woken, as an executor that polls
/// the woken task at once, on the waking thread, does.
struct AsksAtOnce(Mutex<Option<AppendHandle<SimEndpoint>>>);

impl Wake for AsksAtOnce {
    fn wake(self: Arc<Self>) {
        if let Some(h) = self.0.lock().unwrap().as_ref() {
            let _ = h.try_result();
        }
    }
}

#[test]
fn a_busy_callers_wake_may_poll_a_handle_at_once() {
    // Under `Busy` the caller's own pass publishes the commit and wakes the futures' wakers.
    // Woken with the replica still locked, a waker that polls a handle at once, on the
    // caller's thread, took the same lock again: the caller hung for good.
    let options = LogOptions {
        poll: PollMode::Busy,
        ..LogOptions::default()
    };
    let (_net, stop, logs, _) = cluster_polling(options);
    let l = wait_for_leader(&logs);
    // Only this thread drives the leader from here: the wake comes from its pass.
    logs[l].hold_driver_for_test(true);
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let outcome = (|| {
                let other = logs[l].append(b"asked by the waker")?;
                let waker = Arc::new(AsksAtOnce(Mutex::new(Some(other))));
                let mut first = logs[l].append(b"awaited")?;
                let _ = Future::poll(
                    Pin::new(&mut first),
                    &mut Context::from_waker(&Waker::from(waker)),
                );
                logs[l].append(b"driven")?.wait(Duration::from_secs(10))
            })();
            let _ = done.send(outcome);
        });
        match finished.recv_timeout(Duration::from_secs(20)) {
            Ok(outcome) => {
                logs[l].hold_driver_for_test(false);
                assert!(outcome.is_ok(), "the driven append: {outcome:?}");
            }
            Err(_) => {
                // The caller's thread hung holding the replica: nothing can stop the logs.
                eprintln!("the busy caller hung in its own wake-up");
                std::process::exit(101);
            }
        }
    });
    close_all(&stop, logs);
}

#[test]
fn a_checkpoint_whose_write_fails_stops_the_log_and_loses_nothing() {
    // A checkpoint stores its file, cuts the wal, then stores the raft state. A failed write
    // in it returned `Poisoned` ("refuses further work") while the replica went on serving
    // appends. It now stops: every call is refused with the cause, and so is `close`. The
    // driver is held (it makes no pass after the failure) for the first file, so it is the
    // release at the close that records the failure; for the second the driver's next pass
    // records it, naming the cause once. The log's handles answer the cause after the close
    // as they did before it. A restart on the same disk then has every committed entry.
    for (file, held) in [("snapshot.tmp", true), ("raft-state.tmp", false)] {
        let (net, stop, mut logs, l, second, disks) = leader_with_two_entries_and_disks();
        let kept = logs[l].append(b"three").unwrap();
        let third = match kept.wait_for(Duration::from_secs(5)) {
            Some(Ok(index)) => index,
            other => panic!("the third entry: {other:?}"),
        };
        wait_for("the third entry's apply", || {
            logs[l].status().applied >= third
        });
        logs[l].hold_driver_for_test(true);
        disks[l].fail_next_sync_of(file);
        let is_cause =
            |e: &ReplicaError| matches!(e, ReplicaError::Poisoned(w) if w.contains(file));
        let checkpoint = logs[l].checkpoint(third, b"state");
        assert!(
            checkpoint.as_ref().is_err_and(is_cause),
            "the checkpoint failing at {file}: {checkpoint:?}"
        );
        if !held {
            logs[l].hold_driver_for_test(false);
            wait_for("the driver's fail-stop", || logs[l].failure().is_some());
        }
        refuses_everything_with(&logs[l], is_cause);
        let failure = logs[l].status().failure.unwrap_or_default();
        assert!(
            failure.contains(file),
            "{file}: the status's failure: {failure:?}"
        );
        assert!(
            !failure.contains("poisoned"),
            "{file}: the failure says it is a poisoning (twice, in an error): {failure:?}"
        );
        answers_the_cause(&kept, is_cause, &format!("{file}, before the close"));
        closes_with_the_cause(logs.remove(l), &kept, is_cause, file);

        // The same node starts again on its disk: nothing committed is lost.
        let again = restart_at(&net, &disks, l, Durability::Fsync, third);
        let first = again.status().first_index;
        for (index, want) in [(second, &b"two"[..]), (third, b"three")] {
            if index >= first {
                let got = again.read(index).unwrap();
                assert_eq!(
                    got.as_deref(),
                    Some(want),
                    "{file}: entry {index} after the restart"
                );
            }
        }
        logs.push(again);
        close_all(&stop, logs);
    }
}

#[test]
fn a_close_whose_final_sync_fails_fails_the_log_with_its_cause() {
    // Under `Memory` the close makes the wal durable: a failed fdatasync there leaves the
    // durability of its tail unknown. The flush poisons the replica, so the close records the
    // failure and the log's handles answer it (a committed one said `Closed` or `Ok`, as if
    // the close had gone well); the ring's files stay, and a restart has every entry.
    let (net, stop, mut logs, disks) = cluster_in(LogOptions::default(), Durability::Memory);
    let l = wait_for_leader(&logs);
    let kept = logs[l].append(b"kept").unwrap();
    let index = match kept.wait_for(Duration::from_secs(5)) {
        Some(Ok(index)) => index,
        other => panic!("the append: {other:?}"),
    };
    logs[l].hold_driver_for_test(true);
    disks[l].fail_next_sync();
    let is_cause = |e: &ReplicaError| matches!(e, ReplicaError::Poisoned(w) if w.contains("sync"));
    closes_with_the_cause(logs.remove(l), &kept, is_cause, "the final sync");
    let again = restart_at(&net, &disks, l, Durability::Memory, index);
    assert_eq!(again.read(index).unwrap().as_deref(), Some(&b"kept"[..]));
    logs.insert(l, again);
    close_all(&stop, logs);
}

/// Asserts that the committed entry's handle `kept` answers with the failure (`is_cause`).
fn answers_the_cause(
    kept: &AppendHandle<SimEndpoint>,
    is_cause: impl Fn(&ReplicaError) -> bool,
    when: &str,
) {
    let r = kept.try_result();
    assert!(
        r.as_ref().is_some_and(|r| r.as_ref().is_err_and(&is_cause)),
        "{when}: the committed entry's handle: {r:?}"
    );
}

/// Closes `log`, which failed (`is_cause`, from `what`): the close reports the failure, and so
/// does the committed entry's handle `kept` after it.
fn closes_with_the_cause(
    log: Log<SimEndpoint>,
    kept: &AppendHandle<SimEndpoint>,
    is_cause: impl Fn(&ReplicaError) -> bool,
    what: &str,
) {
    let closed = log.close();
    assert!(
        closed.as_ref().is_err_and(&is_cause),
        "{what}: the close: {closed:?}"
    );
    answers_the_cause(kept, is_cause, &format!("{what}, after the close"));
}
