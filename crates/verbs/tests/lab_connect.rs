//! Lab test: rdma_cm connection setup with private data, and rejection of a wrong cluster.
//!
//! Method: a listener on rxe2 (192.0.2.12) accepts with a hello (cluster, node, version,
//! region, credits); a client on rxe1 (192.0.2.11) connects. (This direction on purpose: in
//! the current lab a first contact from rxe2 to rxe1 stalls for seconds, so rdma_cm's
//! request from rxe2 never reaches rxe1 in time and `rping -c` on rxe2 fails the same way;
//! see benches/RESULTS.md.) Each test first runs `common::warm_up`, one RDMA write each
//! way with long timeouts, because rdma_cm's first request in a boot is otherwise lost. (1) Matching cluster: both
//! sides see the other's hello (region descriptor, credits, node id), and a write plus a
//! Send cross the connection. (2) Wrong cluster id: the accepting side returns
//! `Error::RefusedPeer` with `ClusterMismatch`, the connecting side gets `Error::Rejected`
//! with the same reason decoded from the reject private data; both messages are printed.

mod common;

use std::time::Duration;

use common::*;
use verbs::{
    AccessFlags, AnonMemory, Error, MemoryRegion, PollMode, RecvPool, RejectReason, WcStatus,
};

#[test]
#[ignore = "lab: needs the Soft-RoCE lab; ops/test runs it"]
fn connect_exchanges_hellos_and_carries_traffic() {
    warm_up(1, 2);
    let rx = Node::open(2);
    let tx = Node::open(1);
    let region = MemoryRegion::register(
        &rx.pd,
        AnonMemory::new(4096).unwrap(),
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
    )
    .unwrap();
    let src = MemoryRegion::register(&tx.pd, vec![0x3Cu8; 4096], AccessFlags::LOCAL_WRITE).unwrap();
    let mut pool = RecvPool::new(&rx.pd, 8, 64).unwrap();
    let (s, c) = connect_pair(
        &rx,
        2,
        rw_config(),
        hello(1, region.remote(), 8),
        |qp| pool.post_all(qp),
        &tx,
        1,
        rw_config(),
        hello(2, Default::default(), 0),
        |_| Ok(()),
        7481,
    );
    let (s, c) = both(s, c);
    assert_eq!(c.remote().region, region.remote());
    assert_eq!(c.remote().recv_credits, 8);
    assert_eq!(s.remote().node_id, 2);
    // SAFETY: `src` is never modified and outlives the connection.
    unsafe {
        c.qp()
            .post_write(&src, 0, 4096, &c.remote().region, 0, None, false)
    }
    .unwrap();
    c.qp().post_send_inline(b"done", None, true).unwrap();
    let wc = wait_one(&rx.recv_cq, PollMode::Busy, Duration::from_secs(10));
    assert_eq!(wc.status, WcStatus::Success);
    pool.with_received(s.qp(), &wc, |b| assert_eq!(b, b"done"))
        .unwrap()
        .unwrap();
    let mut now = vec![0u8; 4096];
    region.read_at(0, &mut now).unwrap();
    assert!(now.iter().all(|&b| b == 0x3C));
    c.close(Duration::from_secs(3)).unwrap();
    drop(s);
}

#[test]
#[ignore = "lab: needs the Soft-RoCE lab; ops/test runs it"]
fn wrong_cluster_is_rejected_with_reason_on_both_sides() {
    warm_up(1, 2);
    let rx = Node::open(2);
    let tx = Node::open(1);
    let mut wrong = hello(2, Default::default(), 0);
    wrong.cluster_id = CLUSTER ^ 0xff;
    let (s, c) = connect_pair(
        &rx,
        2,
        rw_config(),
        hello(1, Default::default(), 0),
        |_| Ok(()),
        &tx,
        1,
        rw_config(),
        wrong,
        |_| Ok(()),
        7482,
    );
    let s = s.expect_err("accepting side must refuse");
    let c = c.expect_err("connecting side must be rejected");
    println!("accepting side: {s}\nconnecting side: {c}");
    let want = RejectReason::ClusterMismatch {
        ours: CLUSTER,
        theirs: CLUSTER ^ 0xff,
    };
    assert!(
        matches!(s, Error::RefusedPeer { reason, .. } if reason == want),
        "{s:?}"
    );
    assert!(
        matches!(c, Error::Rejected { reason, .. } if reason == want),
        "{c:?}"
    );
}
