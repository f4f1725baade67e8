//! Scenario (issue 13, defect 4): when a node's log fails (here its driver thread panics), the
//! server must not stay up as a zombie. `ServerHandle::run_until`, the loop the binary waits
//! in, returns the failure so that `rdmalog-server` exits non-zero and its supervisor restarts
//! it.
//!
//! Method: three servers over the in-process fabric (`server::testing::SimServers`); the
//! test-only `Log::inject_driver_panic` on one of them.

use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use server::testing::SimServers;

#[test]
fn a_failed_log_ends_the_serve_loop_with_its_cause() {
    let c = SimServers::start(61, |_| {});
    let leader = c.leader();
    let handle = c.server(leader);
    let stop = AtomicBool::new(false);
    handle.log().inject_driver_panic();
    let started = Instant::now();
    let why = handle.run_until(&stop);
    assert!(
        why.as_deref()
            .is_some_and(|w| w.contains("driver thread panicked")),
        "run_until: {why:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    // A healthy node's loop keeps running until the stop flag.
    let other = (1..=3).find(|&id| id != leader).unwrap();
    let stop = AtomicBool::new(true);
    assert_eq!(c.server(other).run_until(&stop), None);
}

#[test]
fn a_retention_trim_whose_write_fails_ends_the_serve_loop_with_its_cause() {
    // Retention checkpoints and cuts the log; a failed write of the checkpoint stops the log
    // (its state on disk is no longer known), and the serve loop returns the cause, so the
    // binary exits non-zero for its supervisor to restart it rather than logging the failure
    // and trying again next round while it serves on.
    let c = SimServers::start_tuned(
        63,
        |cfg| cfg.segment_bytes = 512 << 10,
        |o| {
            o.retention = replica::retention::Retention {
                max_bytes: Some(600_000),
                ..Default::default()
            };
            o.retention_interval = Duration::from_millis(100);
        },
    );
    let leader = c.leader();
    c.disks[leader as usize - 1].fail_next_sync_of("snapshot.tmp");
    let log = c.server(leader).log();
    for k in 0..6u8 {
        let batch: Vec<Vec<u8>> = (0..100).map(|_| vec![k; 3000]).collect();
        let items: Vec<&[u8]> = batch.iter().map(Vec::as_slice).collect();
        let last = log.append_batch(&items).and_then(|handles| {
            let last = handles.into_iter().last().expect("a handle per entry");
            last.wait(Duration::from_secs(10))
        });
        match last {
            Ok(_) => {}
            // The trim may stop the log while the last batches are appended.
            Err(e) => {
                assert!(matches!(e, replica::ReplicaError::Poisoned(_)), "{e}");
                break;
            }
        }
    }
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let timer = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_secs(20));
            stop.store(true, std::sync::atomic::Ordering::Release);
        })
    };
    let why = c.server(leader).run_until(&stop);
    assert!(
        why.as_deref().is_some_and(|w| w.contains("snapshot.tmp")),
        "run_until: {why:?}"
    );
    stop.store(true, std::sync::atomic::Ordering::Release);
    drop(timer);
}
