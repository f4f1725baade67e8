//! Lab test: fencing by revoking REMOTE_WRITE on a live QP, and re-granting.
//!
//! Method: a receiver on rxe1 exposes a 4 KiB region (MR with REMOTE_WRITE) through an RC
//! QP that grants REMOTE_WRITE; a writer on rxe2 writes pattern A and waits for success.
//! The receiver then revokes REMOTE_WRITE on the live RTS QP (`ibv_modify_qp` with
//! `IBV_QP_ACCESS_FLAGS`). Asserted: the writer's next write completes with the fenced class
//! (`WcStatus::RemoteAccess`; rxe reports `IBV_WC_REM_INV_REQ_ERR`, mlx5
//! `IBV_WC_REM_ACCESS_ERR`), the receiver's bytes are identical to before, and the writer's
//! QP is in ERROR. Then both QPs are reset and brought up again, the receiver grants
//! REMOTE_WRITE, and a write of pattern B succeeds and lands. A revoke followed at once by
//! a grant on a live QP leaves writes working.

mod common;

use std::time::Duration;

use common::*;
use verbs::{AccessFlags, AnonMemory, MemoryRegion, PollMode, QpState, WcStatus};

const LEN: usize = 4096;

#[test]
#[ignore = "lab: needs the Soft-RoCE lab; ops/test runs it"]
fn revoke_fences_the_writer_and_regrant_after_reset_works() {
    let rx = Node::open(1);
    let tx = Node::open(2);
    let region = MemoryRegion::register(
        &rx.pd,
        AnonMemory::new(LEN).unwrap(),
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
    )
    .unwrap();
    let src = MemoryRegion::register(&tx.pd, vec![0u8; 2 * LEN], AccessFlags::LOCAL_WRITE).unwrap();
    src.fill(0, LEN, 0xA1).unwrap();
    src.fill(LEN, LEN, 0xB2).unwrap();
    let (rq, wq) = rdma_write_pair(&rx, &tx);
    let remote = region.remote();
    let t = Duration::from_secs(10);

    // SAFETY: `src` is never modified while writes are outstanding and outlives the QPs.
    unsafe { wq.post_write(&src, 0, LEN, &remote, 0, None, true) }.unwrap();
    let wc = wait_one(&tx.send_cq, PollMode::Busy, t);
    assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
    wq.retire(&wc);
    let mut before = vec![0u8; LEN];
    region.read_at(0, &mut before).unwrap();
    assert!(before.iter().all(|&b| b == 0xA1));

    // Revoke then grant straight away: the QP stays usable.
    rq.revoke_remote_write().unwrap();
    rq.grant_remote_write().unwrap();
    // SAFETY: as above.
    unsafe { wq.post_write(&src, 0, LEN, &remote, 0, None, true) }.unwrap();
    let wc = wait_one(&tx.send_cq, PollMode::Busy, t);
    assert_eq!(
        wc.status,
        WcStatus::Success,
        "write after revoke+grant: {wc:?}"
    );
    wq.retire(&wc);

    // The fence.
    rq.revoke_remote_write().unwrap();
    assert_eq!(
        rq.state().unwrap(),
        QpState::Rts,
        "revoking keeps the receiver's QP in RTS"
    );
    // SAFETY: as above.
    unsafe { wq.post_write(&src, LEN, LEN, &remote, 0, None, true) }.unwrap();
    let wc = wait_one(&tx.send_cq, PollMode::Busy, t);
    println!(
        "fenced write completed with {:?} (raw status {})",
        wc.status, wc.raw_status
    );
    assert!(
        wc.status.is_fenced(),
        "expected the fenced class, got {wc:?}"
    );
    wq.retire(&wc);
    let mut after = vec![0u8; LEN];
    region.read_at(0, &mut after).unwrap();
    assert_eq!(before, after, "a fenced write changed receiver memory");
    assert_eq!(wq.state().unwrap(), QpState::Error);

    // Recover: reset both ends, bring them up again, grant, and write B.
    wq.reset().unwrap();
    rq.reset().unwrap();
    bring_up_pair(&rx, 1, &rq, |_| Ok(()), &tx, 2, &wq, |_| Ok(()));
    rq.grant_remote_write().unwrap();
    // SAFETY: as above.
    unsafe { wq.post_write(&src, LEN, LEN, &remote, 0, None, true) }.unwrap();
    let wc = wait_one(&tx.send_cq, PollMode::Busy, t);
    assert_eq!(wc.status, WcStatus::Success, "write after re-grant: {wc:?}");
    region.read_at(0, &mut after).unwrap();
    assert!(
        after.iter().all(|&b| b == 0xB2),
        "re-granted write did not land"
    );

    // Declaration order is drop order: QPs before the MRs they used.
    wq.close().unwrap();
    rq.close().unwrap();
    region.close().unwrap();
    src.close().unwrap();
}
