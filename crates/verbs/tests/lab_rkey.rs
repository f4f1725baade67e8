//! Lab test: a write with a stale or guessed rkey is refused.
//!
//! Method: a receiver on rxe1 registers a 4 KiB region (REMOTE_WRITE) and a second region
//! that it then deregisters, keeping its now-stale rkey. A writer on rxe2 writes through a
//! QP that is granted REMOTE_WRITE, (1) with the stale rkey and (2) with a guessed rkey (the
//! live rkey plus 0x1000), each time aimed at the live region's address. Asserted: each
//! write completes with `WcStatus::RemoteAccess` and the live region stays all zero. The
//! pair is reset and brought up again between the two cases (an error moves the QP to
//! ERROR).

mod common;

use std::time::Duration;

use common::*;
use verbs::{AccessFlags, AnonMemory, MemoryRegion, PollMode, RemoteRegion, WcStatus};

const LEN: usize = 4096;

#[test]
#[ignore = "lab: needs the Soft-RoCE lab; ops/test runs it"]
fn stale_or_guessed_rkey_is_refused_and_memory_untouched() {
    let rx = Node::open(1);
    let tx = Node::open(2);
    let rw = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let region = MemoryRegion::register(&rx.pd, AnonMemory::new(LEN).unwrap(), rw).unwrap();
    let stale_rkey = {
        let gone = MemoryRegion::register(&rx.pd, AnonMemory::new(LEN).unwrap(), rw).unwrap();
        let k = gone.rkey();
        gone.close().unwrap();
        k
    };
    let src = MemoryRegion::register(&tx.pd, vec![0x5Au8; LEN], AccessFlags::LOCAL_WRITE).unwrap();
    let (rq, wq) = rdma_write_pair(&rx, &tx);
    let live = region.remote();
    let cases = [
        ("stale", stale_rkey),
        ("guessed", live.rkey.wrapping_add(0x1000)),
    ];
    for (i, (name, rkey)) in cases.into_iter().enumerate() {
        if i > 0 {
            wq.reset().unwrap();
            rq.reset().unwrap();
            bring_up_pair(&rx, 1, &rq, |_| Ok(()), &tx, 2, &wq, |_| Ok(()));
        }
        assert_ne!(rkey, live.rkey);
        let bad = RemoteRegion { rkey, ..live };
        // SAFETY: `src` is never modified and outlives the QPs.
        unsafe { wq.post_write(&src, 0, LEN, &bad, 0, None, true) }.unwrap();
        let wc = wait_one(&tx.send_cq, PollMode::Busy, Duration::from_secs(10));
        println!(
            "{name} rkey {rkey:#x}: {:?} (raw status {})",
            wc.status, wc.raw_status
        );
        assert_eq!(wc.status, WcStatus::RemoteAccess, "{name} rkey: {wc:?}");
        wq.retire(&wc);
        let mut now = vec![0u8; LEN];
        region.read_at(0, &mut now).unwrap();
        assert!(
            now.iter().all(|&b| b == 0),
            "{name} rkey write touched memory"
        );
    }
    wq.close().unwrap();
    rq.close().unwrap();
    region.close().unwrap();
}
