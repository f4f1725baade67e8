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
