//! Shared set-up for the lab tests: one node per rxe device, a connected pair over rdma_cm,
//! and small wire helpers. Host i is device `rxe{i}` with address 192.0.2.1{i}.
#![allow(dead_code)] // reason: each lab_* binary uses a different subset of these helpers

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use verbs::{
    AccessFlags, Completion, CompletionQueue, ConnectConfig, Connection, Context, Hello, Listener,
    PROTOCOL_VERSION, PollMode, ProtectionDomain, QpConfig, QueuePair, RemoteRegion, Result,
};

/// Cluster id every lab test uses unless it tests a mismatch.
pub const CLUSTER: u64 = 0x524c_4f47_0000_0001;

/// The address of lab host `i`.
pub fn host_ip(i: u8) -> Ipv4Addr {
    Ipv4Addr::new(192, 0, 2, 10 + i)
}

/// One side: device context, PD and a send and a receive CQ.
pub struct Node {
    pub ctx: Arc<Context>,
    pub pd: Arc<ProtectionDomain>,
    pub send_cq: Arc<CompletionQueue>,
    pub recv_cq: Arc<CompletionQueue>,
}

impl Node {
    pub fn open(host: u8) -> Node {
        let ctx = Context::open(&format!("rxe{host}")).expect("open rxe device");
        let pd = ProtectionDomain::new(&ctx).expect("alloc pd");
        let send_cq = CompletionQueue::new(&ctx, 512).expect("send cq");
        let recv_cq = CompletionQueue::new(&ctx, 512).expect("recv cq");
        Node {
            ctx,
            pd,
            send_cq,
            recv_cq,
        }
    }
}

pub fn hello(node_id: u64, region: RemoteRegion, credits: u32) -> Hello {
    Hello {
        cluster_id: CLUSTER,
        node_id,
        version: PROTOCOL_VERSION,
        region,
        recv_credits: credits,
    }
}

pub fn rw_config() -> QpConfig {
    QpConfig {
        access: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        ..QpConfig::default()
    }
}

pub fn cm_config() -> ConnectConfig {
    ConnectConfig {
        event_timeout: Duration::from_secs(15),
        resolve_timeout: Duration::from_secs(5),
    }
}

/// Connects a client on `client` (host number) to a listener on `server`, running the
/// accept on a thread. Each `prepare` posts that side's receives.
#[allow(clippy::too_many_arguments)] // reason: test helper mirroring connect/accept
pub fn connect_pair(
    server: &Node,
    server_host: u8,
    server_cfg: QpConfig,
    server_hello: Hello,
    server_prepare: impl FnOnce(&QueuePair) -> Result<()> + Send,
    client: &Node,
    client_host: u8,
    client_cfg: QpConfig,
    client_hello: Hello,
    client_prepare: impl FnOnce(&QueuePair) -> Result<()>,
    port: u16,
) -> (Result<Connection>, Result<Connection>) {
    let addr = SocketAddr::new(IpAddr::V4(host_ip(server_host)), port);
    let listener = Listener::bind(&server.ctx, addr, 4).expect("listen");
    std::thread::scope(|scope| {
        let t = scope.spawn(|| {
            listener.accept(
                &server.pd,
                &server.send_cq,
                &server.recv_cq,
                server_cfg,
                &cm_config(),
                &server_hello,
                server_prepare,
            )
        });
        let c = Connection::connect(
            &client.pd,
            &client.send_cq,
            &client.recv_cq,
            client_cfg,
            &cm_config(),
            Some(IpAddr::V4(host_ip(client_host))),
            addr,
            &client_hello,
            client_prepare,
        );
        let s = t.join().expect("accept thread");
        (s, c)
    })
}

/// Waits for one completion on `cq`, failing the test after `timeout`.
pub fn wait_one(cq: &CompletionQueue, mode: PollMode, timeout: Duration) -> Completion {
    let mut out = [Completion::EMPTY; 1];
    let n = cq
        .wait(&mut out, mode, timeout)
        .expect("completion within timeout");
    assert_eq!(n, 1);
    out[0]
}

/// A small deterministic PRNG (xorshift64*), so tests need no extra crates.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let v = self.next().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
}

/// Encodes a small control message: (round, offset, size, credits) as little-endian u64s.
pub fn msg(words: [u64; 4]) -> [u8; 32] {
    let mut b = [0u8; 32];
    for (i, w) in words.iter().enumerate() {
        b[i * 8..i * 8 + 8].copy_from_slice(&w.to_le_bytes());
    }
    b
}

pub fn unmsg(b: &[u8]) -> [u64; 4] {
    let mut w = [0u64; 4];
    for (i, v) in w.iter_mut().enumerate() {
        *v = u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().unwrap());
    }
    w
}

/// Unwraps both sides of `connect_pair`, reporting both errors if either failed.
pub fn both(s: Result<Connection>, c: Result<Connection>) -> (Connection, Connection) {
    match (s, c) {
        (Ok(s), Ok(c)) => (s, c),
        (s, c) => panic!(
            "connect failed: accept side: {:?}; connect side: {:?}",
            s.as_ref().err().map(|e| e.to_string()),
            c.as_ref().err().map(|e| e.to_string())
        ),
    }
}

/// The RoCE v2 GID (index and bytes) of lab host `host` on its device, found by query.
pub fn roce_gid(node: &Node, host: u8) -> (u8, [u8; 16]) {
    let table = node.ctx.gid_table(1).expect("gid table");
    let e =
        verbs::select_roce_v2_gid(&table, host_ip(host)).expect("RoCE v2 GID for the host address");
    (e.index as u8, e.gid)
}

/// Connects two QPs without rdma_cm: GIDs by query, then explicit RESET→INIT→RTR→RTS on
/// both sides (the exchange is in-process, as perftest does over its TCP side channel).
/// Each `prepare` runs in INIT, before the peer can send: post receives there.
#[allow(clippy::too_many_arguments)] // reason: test helper mirroring both sides
pub fn manual_pair(
    a: &Node,
    a_host: u8,
    a_cfg: QpConfig,
    a_prepare: impl FnOnce(&QueuePair) -> Result<()>,
    b: &Node,
    b_host: u8,
    b_cfg: QpConfig,
    b_prepare: impl FnOnce(&QueuePair) -> Result<()>,
) -> (QueuePair, QueuePair) {
    let qa = QueuePair::new(&a.pd, &a.send_cq, &a.recv_cq, a_cfg).expect("qp a");
    let qb = QueuePair::new(&b.pd, &b.send_cq, &b.recv_cq, b_cfg).expect("qp b");
    bring_up_pair(a, a_host, &qa, a_prepare, b, b_host, &qb, b_prepare);
    (qa, qb)
}

/// The usual pair of the one-sided tests: a receiver QP on host 1 (`rx`) and a writer QP on
/// host 2 (`tx`), both with remote write allowed, nothing posted in INIT.
pub fn rdma_write_pair(rx: &Node, tx: &Node) -> (QueuePair, QueuePair) {
    manual_pair(
        rx,
        1,
        rw_config(),
        |_| Ok(()),
        tx,
        2,
        rw_config(),
        |_| Ok(()),
    )
}

/// Drives two RESET QPs to RTS towards each other.
#[allow(clippy::too_many_arguments)] // reason: test helper mirroring both sides
pub fn bring_up_pair(
    a: &Node,
    a_host: u8,
    qa: &QueuePair,
    a_prepare: impl FnOnce(&QueuePair) -> Result<()>,
    b: &Node,
    b_host: u8,
    qb: &QueuePair,
    b_prepare: impl FnOnce(&QueuePair) -> Result<()>,
) {
    let (ia, ga) = roce_gid(a, a_host);
    let (ib, gb) = roce_gid(b, b_host);
    let (psn_a, psn_b) = (0x1000 + qa.qp_num() % 0x1000, 0x2000 + qb.qp_num() % 0x1000);
    qa.to_init(1).expect("a INIT");
    qb.to_init(1).expect("b INIT");
    a_prepare(qa).expect("prepare a");
    b_prepare(qb).expect("prepare b");
    qa.to_rtr(&verbs::RtrParams {
        dest_qp_num: qb.qp_num(),
        rq_psn: psn_b,
        dgid: gb,
        sgid_index: ia,
        port: 1,
    })
    .expect("a RTR");
    qb.to_rtr(&verbs::RtrParams {
        dest_qp_num: qa.qp_num(),
        rq_psn: psn_a,
        dgid: ga,
        sgid_index: ib,
        port: 1,
    })
    .expect("b RTR");
    qa.to_rts(psn_a).expect("a RTS");
    qb.to_rts(psn_b).expect("b RTS");
}

/// Makes sure RoCE traffic has flowed both ways between two lab hosts, with default
/// (long) timeouts and a generous wait; `b_host` transmits first. Observed in the current
/// lab (6.12 rxe, bridge topology): if rxe1 transmits to rxe2 before rxe2 ever transmitted
/// to rxe1 in that boot, rxe1's packets are black-holed (no completion, not even
/// RetryExceeded, for 60 s; rdma_cm requests never arrive); when rxe2 goes first its first
/// WR stalls ~2-4 s (it completes after a few more posts) and from then on both directions
/// work. Tests that measure timing or use rdma_cm call this first; it asserts nothing
/// about the code under test.
pub fn warm_up(a_host: u8, b_host: u8) {
    let (a, b) = (Node::open(a_host), Node::open(b_host));
    let rw = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let ma = verbs::MemoryRegion::register(&a.pd, vec![0u8; 64], rw).unwrap();
    let mb = verbs::MemoryRegion::register(&b.pd, vec![0u8; 64], rw).unwrap();
    let (qa, qb) = manual_pair(
        &a,
        a_host,
        rw_config(),
        |_| Ok(()),
        &b,
        b_host,
        rw_config(),
        |_| Ok(()),
    );
    // A lone first write can sit unprocessed in the lab until another WR is posted on the
    // QP, so keep posting (up to 30 times, 2 s apart) until one completes.
    for (q, node, remote) in [(&qb, &b, ma.remote()), (&qa, &a, mb.remote())] {
        let mut out = [Completion::EMPTY; 32];
        let mut done = false;
        for attempt in 0..30 {
            q.post_write_inline(&[1u8; 8], &remote, 0, None, true)
                .unwrap();
            if let Ok(n) = node
                .send_cq
                .wait(&mut out, PollMode::Busy, Duration::from_secs(2))
            {
                for c in &out[..n] {
                    assert_eq!(
                        c.status,
                        verbs::WcStatus::Success,
                        "lab warm-up write failed: {c:?}"
                    );
                    q.retire(c);
                }
                if attempt > 0 {
                    println!(
                        "lab warm-up {a_host}<->{b_host}: first completion after {} posts",
                        attempt + 1
                    );
                }
                done = true;
                break;
            }
        }
        assert!(
            done,
            "lab warm-up {a_host}<->{b_host}: no completion in 60 s"
        );
        std::thread::sleep(Duration::from_millis(200));
        while let Ok(n) = node.send_cq.poll(&mut out) {
            if n == 0 {
                break;
            }
        }
    }
}
