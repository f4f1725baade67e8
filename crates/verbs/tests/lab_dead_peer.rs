//! Lab test: a dead peer is detected within the bound that timeout and retry_cnt give.
//!
//! Method: the test re-executes its own binary as a child process (env
//! `RDMALOG_DEAD_PEER_CHILD=1`, test `dead_peer_child`) that opens rxe1, registers a region
//! and brings an RC QP up towards the parent's QP on rxe2 (QP numbers over the child's
//! stdin/stdout, GIDs by query). The parent (timeout exponent 12, retry_cnt 3) checks one
//! write succeeds, SIGKILLs the child, waits for it to exit, then posts 8 signaled writes.
//! Asserted: the first completes with `RetryExceeded`, the other 7 with `Flushed`, and the
//! first error arrives within `dead_peer_bound(12, 3).upper` (4 × (3+1) × 4.096 µs × 2^12 ≈
//! 268 ms) plus a 1 s allowance for the TCG guest's scheduling; the measured time is
//! printed. A `common::warm_up` exchange with long timeouts runs first, so the lab's
//! first-contact stall between two hosts is not mistaken for a dead peer.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use verbs::{
    AccessFlags, AnonMemory, Completion, Context, MemoryRegion, PollMode, QpConfig, QueuePair,
    RemoteRegion, RtrParams, SignalPolicy, WcStatus, dead_peer_bound, select_roce_v2_gid,
};

const CHILD_ENV: &str = "RDMALOG_DEAD_PEER_CHILD";
const CHILD_PSN: u32 = 0x111;
const PARENT_PSN: u32 = 0x222;
const TIMEOUT: u8 = 12;
const RETRY: u8 = 3;
const WRITES: usize = 8;

fn gid_of(host: u8) -> (u8, [u8; 16]) {
    let ctx = Context::open(&format!("rxe{host}")).unwrap();
    let e = select_roce_v2_gid(&ctx.gid_table(1).unwrap(), host_ip(host)).unwrap();
    (e.index as u8, e.gid)
}

#[test]
#[ignore = "lab: needs the Soft-RoCE lab; ops/test runs it"]
fn dead_peer_child() {
    if std::env::var(CHILD_ENV).is_err() {
        return; // only meaningful as the parent's child process
    }
    let node = Node::open(1);
    let region = MemoryRegion::register(
        &node.pd,
        AnonMemory::new(4096).unwrap(),
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
    )
    .unwrap();
    let qp = QueuePair::new(&node.pd, &node.send_cq, &node.recv_cq, rw_config()).unwrap();
    let r = region.remote();
    println!("CHILD {} {} {} {}", qp.qp_num(), r.addr, r.rkey, r.len);
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    let parent_qpn: u32 = line.trim().parse().unwrap();
    let (my_idx, _) = gid_of(1);
    let (_, parent_gid) = gid_of(2);
    qp.to_init(1).unwrap();
    qp.to_rtr(&RtrParams {
        dest_qp_num: parent_qpn,
        rq_psn: PARENT_PSN,
        dgid: parent_gid,
        sgid_index: my_idx,
        port: 1,
    })
    .unwrap();
    qp.to_rts(CHILD_PSN).unwrap();
    println!("CHILD READY");
    std::io::stdout().flush().unwrap();
    std::thread::sleep(Duration::from_secs(120));
}

#[test]
#[ignore = "lab: needs the Soft-RoCE lab; ops/test runs it"]
fn dead_peer_is_detected_within_bound() {
    // The short retry budget below must not meet the lab's first-contact stall.
    warm_up(1, 2);
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "dead_peer_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut stdin = child.stdin.take().unwrap();
    // Kills the child if this test fails early, so nothing outlives it.
    let mut child = KillOnDrop(Some(child));
    let mut read_child = || loop {
        let mut l = String::new();
        assert!(out.read_line(&mut l).unwrap() > 0, "child exited early");
        // libtest prints "test dead_peer_child ... " without a newline before our line.
        if let Some((_, rest)) = l.trim().split_once("CHILD ") {
            return rest.to_owned();
        }
    };
    let w: Vec<u64> = read_child()
        .split(' ')
        .map(|x| x.parse().unwrap())
        .collect();
    let (child_qpn, remote) = (
        w[0] as u32,
        RemoteRegion {
            addr: w[1],
            rkey: w[2] as u32,
            len: w[3],
        },
    );

    let node = Node::open(2);
    let cfg = QpConfig {
        timeout: TIMEOUT,
        retry_cnt: RETRY,
        signal: SignalPolicy::All,
        ..rw_config()
    };
    let qp = QueuePair::new(&node.pd, &node.send_cq, &node.recv_cq, cfg).unwrap();
    let src = MemoryRegion::register(&node.pd, vec![1u8; 4096], AccessFlags::LOCAL_WRITE).unwrap();
    writeln!(stdin, "{}", qp.qp_num()).unwrap();
    stdin.flush().unwrap();
    let (my_idx, _) = gid_of(2);
    let (_, child_gid) = gid_of(1);
    qp.to_init(1).unwrap();
    qp.to_rtr(&RtrParams {
        dest_qp_num: child_qpn,
        rq_psn: CHILD_PSN,
        dgid: child_gid,
        sgid_index: my_idx,
        port: 1,
    })
    .unwrap();
    qp.to_rts(PARENT_PSN).unwrap();
    assert_eq!(read_child(), "READY");

    // SAFETY: `src` is never modified and outlives the QP.
    unsafe { qp.post_write(&src, 0, 4096, &remote, 0, None, true) }.unwrap();
    let wc = wait_one(&node.send_cq, PollMode::Busy, Duration::from_secs(10));
    assert_eq!(
        wc.status,
        WcStatus::Success,
        "write to the live child: {wc:?}"
    );
    qp.retire(&wc);

    let mut c = child.0.take().unwrap();
    c.kill().unwrap();
    let killed = Instant::now();
    while c.try_wait().unwrap().is_none() {
        assert!(
            killed.elapsed() < Duration::from_secs(20),
            "killed child did not exit"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    println!("child exited {:?} after SIGKILL", killed.elapsed());

    let bound = dead_peer_bound(TIMEOUT, RETRY);
    let start = Instant::now();
    for _ in 0..WRITES {
        // SAFETY: as above.
        unsafe { qp.post_write(&src, 0, 4096, &remote, 0, None, true) }.unwrap();
    }
    let mut got: Vec<(WcStatus, Duration)> = Vec::new();
    let mut buf = [Completion::EMPTY; WRITES];
    while got.len() < WRITES {
        let n = node
            .send_cq
            .wait(&mut buf, PollMode::Busy, Duration::from_secs(30))
            .expect("error completions");
        for c in &buf[..n] {
            got.push((c.status, start.elapsed()));
            qp.retire(c);
        }
    }
    let first = got[0].1;
    println!(
        "dead peer: first error {:?} after {:?} (nominal bound {:?}, upper {:?}); then {:?}",
        got[0].0,
        first,
        bound.nominal,
        bound.upper,
        got[1..].iter().map(|g| g.0).collect::<Vec<_>>()
    );
    assert_eq!(got[0].0, WcStatus::RetryExceeded);
    assert!(got[1..].iter().all(|g| g.0 == WcStatus::Flushed), "{got:?}");
    assert!(
        first <= bound.upper + Duration::from_secs(1),
        "detected after {first:?}, bound {:?}",
        bound.upper
    );
    qp.close().unwrap();
}

struct KillOnDrop(Option<std::process::Child>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(c) = self.0.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
