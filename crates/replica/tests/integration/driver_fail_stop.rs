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
use replica::{Log, LogOptions, ReplicaConfig, ReplicaError, Role};
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
    stop.store(true, Ordering::Relaxed);
    let mut logs = logs;
    let failed = logs.remove(l);
    let r = failed.close();
    assert!(r.as_ref().is_err_and(is_cause), "close: {r:?}");
    for log in logs {
        log.close().unwrap();
    }
}
