//! Lab test: teardown in any order the API allows, without hangs or leaks, including with an
//! async event outstanding.
//!
//! Method (host 3, rxe3 on v3, which no other verbs lab test uses):
//! 1. Creates context, PD, CQ, QP (in INIT) and MR, then drops them in five different
//!    orders (the Arc graph keeps parents alive); after all rounds `rdma resource show`'s
//!    pd/cq/qp/mr counts for rxe3 equal the baseline, and so does this process's fd count.
//! 2. With a QP and CQ alive and no async reader running, `ip link set v3 down` queues a
//!    port-error event; the QP and CQ are then destroyed (asserted to take < 5 s), the
//!    reader is started and must surface `PortDown { port: 1 }`; after `ip link set v3 up`
//!    a QP/CQ are created and destroyed again with the reader running.

use std::process::Command;
use std::time::{Duration, Instant};

use verbs::{
    AccessFlags, AnonMemory, AsyncEvent, AsyncEvents, CompletionQueue, Context, MemoryRegion,
    ProtectionDomain, QpConfig, QueuePair,
};

fn res_counts() -> Vec<(String, u64)> {
    let out = Command::new("rdma")
        .args(["resource", "show"])
        .output()
        .expect("rdma resource show");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let line = text
        .lines()
        .find(|l| l.contains("rxe3:"))
        .expect("rxe3 in rdma resource show")
        .to_owned();
    let words: Vec<&str> = line.split_whitespace().collect();
    words
        .windows(2)
        .filter(|w| ["pd", "cq", "qp", "mr"].contains(&w[0]))
        .map(|w| (w[0].to_owned(), w[1].parse().unwrap_or(u64::MAX)))
        .collect()
}

fn fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

#[test]
#[ignore = "lab: needs the Soft-RoCE lab; ops/test runs it"]
fn drop_in_any_order_no_hang_no_leak() {
    // Warm up librdmacm's device list so its contexts are in the baseline.
    drop(Context::open("rxe3").unwrap());
    let base = res_counts();
    let base_fds = fd_count();
    let orders: [[usize; 5]; 5] = [
        [0, 1, 2, 3, 4],
        [4, 3, 2, 1, 0],
        [3, 4, 0, 1, 2],
        [1, 0, 4, 2, 3],
        [2, 0, 1, 4, 3],
    ];
    for order in orders {
        let ctx = Context::open("rxe3").unwrap();
        let pd = ProtectionDomain::new(&ctx).unwrap();
        let cq = CompletionQueue::new(&ctx, 64).unwrap();
        let qp = QueuePair::new(
            &pd,
            &cq,
            &cq,
            QpConfig {
                sq_depth: 16,
                rq_depth: 16,
                ..QpConfig::default()
            },
        )
        .unwrap();
        qp.to_init(1).unwrap();
        let mr = MemoryRegion::register(
            &pd,
            AnonMemory::new(8192).unwrap(),
            AccessFlags::LOCAL_WRITE,
        )
        .unwrap();
        let mut slots: (Option<_>, Option<_>, Option<_>, Option<_>, Option<_>) =
            (Some(ctx), Some(pd), Some(cq), Some(qp), Some(mr));
        let start = Instant::now();
        for i in order {
            match i {
                0 => drop(slots.0.take()),
                1 => drop(slots.1.take()),
                2 => drop(slots.2.take()),
                3 => drop(slots.3.take()),
                _ => drop(slots.4.take()),
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "teardown in order {order:?} took {:?}",
            start.elapsed()
        );
    }
    assert_eq!(res_counts(), base, "verbs objects leaked on rxe3");
    assert_eq!(fd_count(), base_fds, "file descriptors leaked");
    println!("teardown: 5 orders, counts back to {base:?}, {base_fds} fds");
}

#[test]
#[ignore = "lab: needs the Soft-RoCE lab; ops/test runs it"]
fn teardown_with_outstanding_async_event() {
    let ip = |args: &[&str]| {
        let s = Command::new("ip").args(args).status().unwrap();
        assert!(s.success(), "ip {args:?}");
    };
    let ctx = Context::open("rxe3").unwrap();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let cq = CompletionQueue::new(&ctx, 64).unwrap();
    let qp = QueuePair::new(
        &pd,
        &cq,
        &cq,
        QpConfig {
            sq_depth: 16,
            rq_depth: 16,
            ..QpConfig::default()
        },
    )
    .unwrap();
    qp.to_init(1).unwrap();

    ip(&["link", "set", "v3", "down"]);
    std::thread::sleep(Duration::from_millis(500));
    let start = Instant::now();
    qp.close().unwrap();
    cq.close().unwrap();
    let took = start.elapsed();
    assert!(
        took < Duration::from_secs(5),
        "QP/CQ teardown with an unread async event took {took:?}"
    );

    let events = AsyncEvents::spawn(&ctx).unwrap();
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline && !seen.contains(&AsyncEvent::PortDown { port: 1 }) {
        if let Some(e) = events.recv_timeout(Duration::from_millis(200)) {
            seen.push(e);
        }
    }
    ip(&["link", "set", "v3", "up"]);
    println!("async events seen: {seen:?}; QP+CQ teardown took {took:?}");
    assert!(
        seen.contains(&AsyncEvent::PortDown { port: 1 }),
        "port down was not surfaced: {seen:?}"
    );

    // With the reader running (it acknowledges at once) teardown cannot hang either.
    let cq = CompletionQueue::new(&ctx, 64).unwrap();
    let qp = QueuePair::new(
        &pd,
        &cq,
        &cq,
        QpConfig {
            sq_depth: 16,
            rq_depth: 16,
            ..QpConfig::default()
        },
    )
    .unwrap();
    let start = Instant::now();
    drop(qp);
    drop(cq);
    assert!(start.elapsed() < Duration::from_secs(5));
    // Give the port time to come back, collecting PortActive if the device reports it.
    if let Some(e) = events.recv_timeout(Duration::from_secs(3)) {
        println!("after link up: {e:?}");
    }
    events.close();
}
