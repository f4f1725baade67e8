//! Scenario: the embedded API on driver threads over the in-process fabric in real time:
//! blocking and Future appends, batches, subscription in order, errors for a non-leader and an
//! oversized entry, every poll mode, and close.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::task::{Context, Poll, Wake};
use std::time::{Duration, Instant};

use fabric::NodeId;
use fabric::sim::{SimConfig, SimEndpoint, SimNet};
use replica::{Log, LogOptions, PollMode, ReplicaConfig, ReplicaError, Role};
use wal::fs::{FaultFs, FileSystem};

struct Thread(std::thread::Thread);
impl Wake for Thread {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// A minimal executor: the API needs no runtime.
fn block_on<T>(f: impl Future<Output = T>) -> T {
    let waker = Arc::new(Thread(std::thread::current())).into();
    let mut cx = Context::from_waker(&waker);
    let mut f = pin!(f);
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park_timeout(Duration::from_millis(10));
    }
}

fn cluster(poll: PollMode) -> (SimNet, Arc<AtomicBool>, Vec<Log<SimEndpoint>>) {
    let opts = LogOptions {
        poll,
        ..LogOptions::default()
    };
    cluster_with(opts, |_| {})
}

/// Three logs on a real-time in-process network, each driven with `opts`; `tune` adjusts each
/// replica's configuration after the defaults (2 MiB ring, 8 MiB segments, staggered election
/// windows).
fn cluster_with(
    opts: LogOptions,
    tune: impl Fn(&mut ReplicaConfig),
) -> (SimNet, Arc<AtomicBool>, Vec<Log<SimEndpoint>>) {
    let net = SimNet::new(SimConfig::default(), 5);
    let stop = Arc::new(AtomicBool::new(false));
    net.run_realtime(stop.clone());
    let logs = (1..=3u64)
        .map(|id| {
            let mut cfg = ReplicaConfig::new(id, vec![1, 2, 3], 9, format!("/n{id}").into());
            cfg.ring_bytes = 2 << 20;
            cfg.segment_bytes = 8 << 20;
            cfg.election_window = Some((10 + 3 * id as usize, 11 + 3 * id as usize));
            tune(&mut cfg);
            let disk: Arc<dyn FileSystem> = Arc::new(FaultFs::new());
            Log::open(cfg, net.add_node(NodeId(id)), disk, opts).unwrap()
        })
        .collect();
    (net, stop, logs)
}

fn leader(logs: &[Log<SimEndpoint>]) -> usize {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if let Some(k) = logs.iter().position(|l| l.status().role == Role::Leader) {
            return k;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!("no leader");
}

#[test]
fn appends_wait_await_batch_and_subscribe() {
    let (_net, stop, logs) = cluster(PollMode::Adaptive {
        spin: Duration::from_micros(100),
    });
    let l = leader(&logs);
    let mut sub = logs[(l + 1) % 3].subscribe(1);
    let a = logs[l]
        .append(b"one")
        .unwrap()
        .wait(Duration::from_secs(5))
        .unwrap();
    let b = block_on(logs[l].append(b"two").unwrap()).unwrap();
    assert!(b > a);
    let batch = logs[l].append_batch(&[b"three", b"four", b"five"]).unwrap();
    let idx: Vec<u64> = batch
        .into_iter()
        .map(|h| h.wait(Duration::from_secs(5)).unwrap())
        .collect();
    assert!(idx.windows(2).all(|w| w[1] == w[0] + 1));
    let mut seen = Vec::new();
    while seen.len() < 5 {
        let (i, data) = sub
            .next_timeout(Duration::from_secs(5))
            .unwrap()
            .expect("entry within 5 s");
        seen.push((i, data));
    }
    let data: Vec<&[u8]> = seen.iter().map(|(_, d)| d.as_slice()).collect();
    assert_eq!(data, [&b"one"[..], b"two", b"three", b"four", b"five"]);
    assert_eq!(logs[l].read(a).unwrap().as_deref(), Some(&b"one"[..]));

    let follower = (l + 1) % 3;
    match logs[follower].append(b"x") {
        Err(ReplicaError::NotLeader { leader_hint }) => assert_eq!(leader_hint, Some(l as u64 + 1)),
        other => panic!("expected NotLeader, got {other:?}"),
    }
    let big = vec![0u8; 64 * 1024 + 1];
    assert!(matches!(
        logs[l].append(&big),
        Err(ReplicaError::TooLarge { .. })
    ));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for log in logs {
        log.close().unwrap();
    }
}

#[test]
fn a_subscriber_behind_a_checkpoint_is_told_to_restore_from_it() {
    let opts = LogOptions {
        poll: PollMode::Event,
        ..LogOptions::default()
    };
    let (_net, stop, logs) = cluster_with(opts, |c| c.segment_bytes = 512 << 10);
    let l = leader(&logs);
    let mut sub = logs[l].subscribe(1);
    let mut last = 0;
    for i in 0..150u32 {
        last = logs[l]
            .append(&[(i % 251) as u8; 4000])
            .unwrap()
            .wait(Duration::from_secs(5))
            .unwrap();
    }
    // The application applied everything up to `last` and checkpoints its state there.
    let deadline = Instant::now() + Duration::from_secs(5);
    let first = loop {
        match logs[l].checkpoint(last, b"application state at last") {
            Ok(first) => break first,
            // The index is committed; applying it may lag by a tick.
            Err(ReplicaError::Checkpoint(why)) if Instant::now() < deadline => {
                assert!(why.contains("not applied yet"), "{why}");
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => panic!("{e}"),
        }
    };
    assert!(first > 2, "nothing was truncated (first index {first})");
    match sub.next_timeout(Duration::from_secs(5)) {
        Err(ReplicaError::Compacted {
            index,
            checkpoint_index,
        }) => assert_eq!((index, checkpoint_index), (1, last)),
        other => panic!("expected Compacted, got {other:?}"),
    }
    let cp = logs[l].latest_checkpoint().expect("a checkpoint");
    assert_eq!(
        (cp.index, cp.state.as_slice()),
        (last, &b"application state at last"[..])
    );
    let mut sub = logs[l].subscribe(cp.index + 1);
    let next = logs[l]
        .append(b"after the checkpoint")
        .unwrap()
        .wait(Duration::from_secs(5))
        .unwrap();
    let (i, data) = sub.next_timeout(Duration::from_secs(5)).unwrap().unwrap();
    assert_eq!((i, data.as_slice()), (next, &b"after the checkpoint"[..]));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for log in logs {
        log.close().unwrap();
    }
}

#[test]
fn busy_and_event_modes_commit_too() {
    for mode in [PollMode::Busy, PollMode::Event] {
        let (_net, stop, logs) = cluster(mode);
        // On 2 shared cores a busy poller can starve the others long enough for an election;
        // a client retries at the new leader, as the API documents.
        for i in 0..20u8 {
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                let l = leader(&logs);
                match logs[l]
                    .append(&[i; 32])
                    .and_then(|h| h.wait(Duration::from_secs(5)))
                {
                    Ok(_) => break,
                    Err(
                        ReplicaError::NotLeader { .. }
                        | ReplicaError::Superseded { .. }
                        | ReplicaError::Timeout { .. },
                    ) if Instant::now() < deadline => {}
                    Err(e) => panic!("append {i} in {mode:?}: {e}"),
                }
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for log in logs {
            log.close().unwrap();
        }
    }
}

#[test]
fn a_pending_wait_ends_when_its_leader_is_stopped() {
    let (net, stop, mut logs) = cluster(PollMode::Event);
    let l = leader(&logs);
    // Cut the leader off so the append cannot commit, then stop it.
    for f in (1..=3u64).filter(|&f| f != l as u64 + 1) {
        net.set_link(NodeId(l as u64 + 1), NodeId(f), false);
    }
    let h = logs[l].append(b"never").unwrap();
    let log = logs.remove(l);
    let waiter = std::thread::spawn(move || h.wait(Duration::from_secs(30)));
    std::thread::sleep(Duration::from_millis(100));
    log.close().unwrap();
    let r = waiter.join().unwrap();
    assert!(matches!(r, Err(ReplicaError::Closed)), "{r:?}");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// Under `Busy` the caller's thread runs its append to completion: with the leader's driver
/// thread held (no pass at all, not even a tick), an append still commits, because the caller
/// writes it into the ring and posts it in `append`, then polls, steps raft and resolves itself
/// in `wait`. The control: under `Adaptive` the same append waits for the held driver.
#[test]
fn a_busy_caller_runs_its_own_append_to_completion() {
    let adaptive = PollMode::Adaptive {
        spin: Duration::from_micros(100),
    };
    for mode in [PollMode::Busy, adaptive] {
        let (_net, stop, logs) = cluster(mode);
        let deadline = Instant::now() + Duration::from_secs(30);
        let outcome = loop {
            // On 2 shared cores busy drivers can starve each other into an election: retry at
            // the new leader, as a client would.
            let l = leader(&logs);
            if logs[l]
                .append(b"warm up")
                .and_then(|h| h.wait(Duration::from_secs(5)))
                .is_err()
            {
                continue;
            }
            logs[l].hold_driver_for_test(true);
            let r = logs[l]
                .append(b"driven by its caller")
                .map(|h| h.wait_for(Duration::from_millis(300)));
            logs[l].hold_driver_for_test(false);
            match r {
                Ok(Some(Ok(index))) => break Some(index),
                Ok(None) => break None,
                _ if Instant::now() < deadline => {}
                other => panic!("{mode:?}: {other:?}"),
            }
        };
        if mode == PollMode::Busy {
            assert!(
                outcome.is_some(),
                "a Busy caller did not commit its append with the driver held"
            );
        } else {
            assert_eq!(
                outcome, None,
                "an Adaptive append committed with its driver held: the test shows nothing"
            );
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for log in logs {
            log.close().unwrap();
        }
    }
}

/// Under `Busy` a waiting caller holds the replica for its whole wait, not pass by pass: the
/// leader's driver makes no pass meanwhile but its ticks (one per 10 ms tick at most), so the
/// caller's polls never queue behind the driver's lock and the driver's thread leaves the CPU
/// to the caller and the fabric. The wait is on an append that cannot commit (the leader is cut
/// off), so the caller drives through all of it.
#[test]
fn a_busy_caller_keeps_the_driver_off_for_its_whole_wait() {
    let (net, stop, logs) = cluster(PollMode::Busy);
    let l = loop {
        let l = leader(&logs);
        // Busy drivers on shared cores can starve each other into an election: retry.
        if logs[l]
            .append(b"warm up")
            .and_then(|h| h.wait(Duration::from_secs(5)))
            .is_ok()
        {
            break l;
        }
    };
    for f in (1..=3u64).filter(|&f| f != l as u64 + 1) {
        net.set_link(NodeId(l as u64 + 1), NodeId(f), false);
    }
    let h = logs[l].append(b"cannot commit").unwrap();
    std::thread::scope(|scope| {
        let waiter = scope.spawn(|| h.wait_for(Duration::from_secs(2)));
        // Count from the moment the caller holds the right to drive, over 300 ms of its wait.
        let deadline = Instant::now() + Duration::from_secs(1);
        while !logs[l].caller_driving_for_test() {
            assert!(Instant::now() < deadline, "the waiting caller never drove");
            std::thread::yield_now();
        }
        let before = logs[l].driver_passes_for_test();
        let t0 = Instant::now();
        std::thread::sleep(Duration::from_millis(300));
        let passes = logs[l].driver_passes_for_test() - before;
        let elapsed = t0.elapsed();
        // One pass per due tick, and one for a tick already due when the count began.
        let ticks = elapsed.as_millis() as u64 / 10 + 2;
        assert!(
            passes <= ticks,
            "the driver made {passes} passes during {elapsed:?} of a wait driven by its \
             caller (at most {ticks}: its ticks)"
        );
        assert!(
            logs[l].caller_driving_for_test(),
            "the caller stopped driving early"
        );
        let outcome = waiter.join().unwrap();
        assert!(
            outcome.is_none(),
            "the cut-off leader resolved its append: {outcome:?}"
        );
    });
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for log in logs {
        log.close().unwrap();
    }
}

/// The embedded API's idempotency key: an application that retries after `Timeout` (or after
/// a crash of its own) sends the same session and number again, and gets the first copy's
/// index instead of a second entry.
#[test]
fn an_append_retried_in_its_session_is_in_the_log_once() {
    let (_net, stop, logs) = cluster(PollMode::Event);
    let l = leader(&logs);
    let session = logs[l]
        .open_session()
        .unwrap()
        .wait(Duration::from_secs(10))
        .unwrap();
    let first = logs[l]
        .append_in_session(session, 1, b"pay once")
        .unwrap()
        .wait(Duration::from_secs(10))
        .unwrap();
    // The retry: same session, same number, same payload.
    let again = logs[l]
        .append_in_session(session, 1, b"pay once")
        .unwrap()
        .wait(Duration::from_secs(10))
        .unwrap();
    assert_eq!(again, first);
    let both = logs[l]
        .append_batch_in_session(session, 1, &[b"pay once", b"then this"])
        .unwrap();
    assert_eq!(both[0].ticket().index, first);
    let mut both = both;
    let next = block_on(both.pop().unwrap()).unwrap();
    assert!(next > first);
    assert!(matches!(
        logs[l].append_in_session(session, 9, b"gap"),
        Err(ReplicaError::SessionSequence {
            expected: 3,
            got: 9,
            ..
        })
    ));
    let mut copies = 0;
    for i in 1..=next {
        if logs[l].read(i).unwrap().as_deref() == Some(&b"pay once"[..]) {
            copies += 1;
        }
    }
    assert_eq!(copies, 1);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for log in logs {
        log.close().unwrap();
    }
}

/// ops/GUIDE.md 2: "A driver that falls ten ticks or more behind logs `the driver fell behind
/// its ticks`": each such stall is counted ([`Log::driver_stalls`], the server's
/// `rdmalog_driver_stalls_total`). Held for well over ten ticks, the driver counts one when
/// it runs again.
#[test]
fn a_driver_held_past_ten_ticks_counts_a_stall() {
    let (_net, stop, logs) = cluster(PollMode::Event);
    let tick = LogOptions::default().tick;
    let before = logs[0].driver_stalls();
    logs[0].hold_driver_for_test(true);
    std::thread::sleep(tick * 15);
    logs[0].hold_driver_for_test(false);
    let deadline = Instant::now() + Duration::from_secs(10);
    while logs[0].driver_stalls() == before && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(
        logs[0].driver_stalls() > before,
        "a driver held for 15 ticks counted no stall"
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for log in logs {
        log.close().unwrap();
    }
}

/// ops/GUIDE.md 2: "In both sleeping modes a completion, an append or a connection event
/// wakes the driver at once (it blocks on the completion channels and an eventfd, not on a
/// timer); with nothing to do it sleeps until its next raft tick." With a 200 ms tick, a
/// commit (an append, the leader's writes, each follower's answer) takes a small part of one
/// tick in `Event` and `Adaptive` modes (about 1 ms): the median of 10 must be under half a
/// tick, where drivers that woke only on their ticks would wait up to a tick per hop (about
/// 300 ms a commit), and busy drivers of other tests on the same cores cost a few ms.
#[test]
fn the_sleeping_modes_wake_for_work_not_for_their_tick() {
    let tick = Duration::from_millis(200);
    let adaptive = PollMode::Adaptive {
        spin: Duration::from_micros(50),
    };
    for mode in [PollMode::Event, adaptive] {
        let opts = LogOptions {
            tick,
            poll: mode,
            pin_core: None,
        };
        let (_net, stop, logs) = cluster_with(opts, |cfg| {
            // FaultFs copies a file at each fdatasync: small segments keep that cheap.
            cfg.segment_bytes = 1 << 20;
            cfg.election_tick = 5;
            cfg.heartbeat_tick = 1;
            cfg.election_window = Some((5 + 2 * cfg.id as usize, 6 + 2 * cfg.id as usize));
        });
        // Stops the network's clock thread however the test ends, so that a failure here
        // does not leave it waking every 50 us under the binary's other tests.
        struct StopOnDrop(Arc<AtomicBool>);
        impl Drop for StopOnDrop {
            fn drop(&mut self) {
                self.0.store(true, std::sync::atomic::Ordering::Relaxed);
            }
        }
        let _stop = StopOnDrop(stop.clone());
        let mut took = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        while took.len() < 10 {
            assert!(Instant::now() < deadline, "{mode:?}: no 10 commits in 60 s");
            let l = leader(&logs);
            let t = Instant::now();
            if logs[l]
                .append(b"wake")
                .and_then(|h| h.wait(Duration::from_secs(5)))
                .is_ok()
            {
                took.push(t.elapsed());
            }
        }
        took.sort();
        println!("{mode:?}: commits with a {tick:?} tick: {took:?}");
        assert!(
            took[5] < tick / 2,
            "{mode:?}: the median commit took {:?} with a {tick:?} tick: the drivers wait for \
             their ticks",
            took[5]
        );
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for log in logs {
            log.close().unwrap();
        }
    }
}
