//! The RDMA back-end: the [`Fabric`] trait over the verbs crate (rxe in the lab, mlx5 on real
//! NICs). It holds no `unsafe`: registration and posting go through the verbs crate's safe
//! [`WordBuffer`] API.
//!
//! # Model
//!
//! - One device context, one protection domain, one send CQ and one receive CQ per node.
//! - One RC connection per peer, set up with rdma_cm by a connection-manager thread: the
//!   [`Fabric::connect`] side connects, the other side's listener accepts. The private-data
//!   hello carries the cluster id (a mismatch is rejected on both sides), the node id, the
//!   protocol version, the advertised ring region and the initial receive credits.
//! - Every connection gets a pre-registered receive pool and send buffer. A frame on the wire
//!   is an 8-byte little-endian header, the receiver's cumulative *advertised receives* (its
//!   credit grant), then the message. Received messages are copied into the endpoint's inbox
//!   (a bounded slot table, the owner's `recv_message`/`repost_recv` buffers); a slot returns
//!   as credit only when the owner reposts it, so a sender that respects credits never meets
//!   an empty receive queue. One credit is kept back for credit-only frames, so credit
//!   updates can always flow.
//! - Remote write is granted per connection with a live QP access-flag change; a write on a
//!   revoked QP completes `RemoteAccess` (rxe: remote invalid request) and breaks it.
//! - Any error completion breaks the connection: it reports `Disconnected` once, every later
//!   completion of it is `Flushed`, and a new [`Fabric::connect`] builds a new QP.
//!
//! Dead-peer detection takes about `(retry_cnt + 1) × 4.096 µs × 2^timeout`
//! ([`verbs::dead_peer_bound`]); both are in [`RdmaConfig::qp`].

use std::collections::{BTreeMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use verbs::{
    AccessFlags, CompletionQueue, ConnectConfig, Connection, Context, Hello, Listener,
    PROTOCOL_VERSION, ProtectionDomain, QpConfig, RecvPool, SendCredits, WaitSet, Wakeup,
    WordBuffer, WordRegion,
};

use crate::admission::{Admission, ControlOutcome};
pub use crate::admission::{MIN_SECRET_BYTES, NONCE_BYTES, admission_proof, load_secret};
use crate::dial;
use crate::shared::{self, Conns, Events, Grant, Inbox, Key, WordMemory};
use crate::{
    Completion, ConnState, DisconnectReason, Event, Fabric, FabricError, LocalRegion,
    MAX_MESSAGE_BYTES, Memory, NodeId, RemoteRegion, Waiter, WcOp, WcStatus, WriteRequest,
};

/// Bytes of the frame header: the receiver's cumulative advertised receives.
const FRAME_HEADER_BYTES: usize = 8;

/// How long the connection-manager thread waits for an incoming connect before it looks at
/// its queue of outgoing connects again.
const ACCEPT_POLL: Duration = Duration::from_millis(50);

/// Receive completions kept for queue pairs not yet handed over by the CM thread.
const EARLY_WC_LIMIT: usize = 1024;

/// Queue pairs one peer may hold at once, each with its full share of both CQs reserved: the
/// adopted connection, a second one held beside it until it proves the cluster secret
/// (`dial::must_prove_first`), an outgoing dial and an incoming one being set up in the same
/// moment (a simultaneous reconnect). With room for one per peer, a reconnect after a break
/// was refused in the lab with "completion queue of capacity 511 cannot take 128 more entries
/// (384 already reserved by other QPs)".
const QPS_PER_PEER: u32 = 4;

/// Completions taken per CQ poll (the array is allocated once).
const WC_BATCH: usize = 64;

/// Configuration of one node's RDMA endpoint.
#[derive(Clone, Debug)]
pub struct RdmaConfig {
    /// This node.
    pub node: NodeId,
    /// Cluster id; peers of another cluster are refused at connect.
    pub cluster_id: u64,
    /// Where this node listens (an address on its RDMA netdev).
    pub listen: SocketAddr,
    /// Where each peer listens.
    pub peers: BTreeMap<NodeId, SocketAddr>,
    /// RDMA device name; `None` finds the device whose RoCE v2 GID is `listen`'s address.
    pub device: Option<String>,
    /// Queue-pair tuning: timeout and retry_cnt set the dead-peer bound. `qp.access` must
    /// stay `LOCAL_WRITE`: remote write is granted per connection by
    /// [`Fabric::set_remote_write`], after admission, and [`RdmaEndpoint::open`] refuses any
    /// other right.
    pub qp: QpConfig,
    /// rdma_cm timeouts.
    pub connect: ConnectConfig,
    /// Receive buffers per connection (the credit window).
    pub recv_slots: usize,
    /// Accept connections only once a region has been advertised (the replica's ring), so no
    /// peer ever holds a connection without our region. Off for endpoints that advertise
    /// nothing.
    pub accept_only_after_advertise: bool,
    /// The cluster secret. With one, a connected peer is admitted (its `Connected` event is
    /// reported, so it can be granted remote write and its messages are acted on) only after it
    /// proved it knows the secret: an HMAC-SHA256 over our fresh nonce, the cluster id and both
    /// node ids, exchanged over the first send/recv. rkeys are guessable; this is not.
    pub secret: Option<Arc<Vec<u8>>>,
    /// How long a connected peer has to prove itself before it is dropped.
    pub admission_timeout: Duration,
    /// The keepalive period. A queue pair fails only when something is posted on it, so an
    /// admitted connection on which nothing was posted for a whole period gets an empty
    /// credit frame: a peer whose machine died, or whose cable was cut, is found on an idle
    /// link within two periods plus the retry bound of `qp` (a follower's link to another
    /// follower carries nothing for as long as they both follow). The frame goes only with a
    /// send credit to spare: credits a dead peer took and never gave back (its owner held our
    /// messages) leave the link to be found at this side's next post.
    pub keepalive: Duration,
}

/// Bit 63 of a frame header marks a control frame (admission); credit totals never reach it.
const CONTROL_BIT: u64 = 1 << 63;

impl RdmaConfig {
    /// Defaults: 16 receive slots per connection, the verbs crate's QP tuning.
    pub fn new(
        node: NodeId,
        cluster_id: u64,
        listen: SocketAddr,
        peers: BTreeMap<NodeId, SocketAddr>,
    ) -> Self {
        RdmaConfig {
            node,
            cluster_id,
            listen,
            peers,
            device: None,
            qp: QpConfig {
                signal: verbs::SignalPolicy::All,
                ..QpConfig::default()
            },
            connect: ConnectConfig::default(),
            recv_slots: 16,
            accept_only_after_advertise: true,
            secret: None,
            admission_timeout: Duration::from_secs(10),
            keepalive: Duration::from_secs(1),
        }
    }
}

/// Ring memory allocated by this back-end: its address never moves, so it may be registered.
pub type RdmaMemory = WordMemory;

#[derive(Debug)]
struct Inflight {
    seq: u64,
    wr_id: u64,
    op: WcOp,
    signaled: bool,
    send_slot: Option<usize>,
}

/// One connection. Field order is drop order: the connection (its QP) goes before the
/// buffers it posts from and receives into.
#[derive(Debug)]
struct Conn {
    conn: Connection,
    recv: RecvPool,
    send_buf: WordRegion,
    /// The send buffer's words, for the CPU to fill (the MR holds the other reference).
    send_words: Arc<WordBuffer>,
    free_send: Vec<usize>,
    credits: SendCredits,
    /// How much of our advertised receives the peer was told.
    told: Grant,
    /// Messages held in the inbox, not yet reposted by the owner.
    held: u64,
    inflight: VecDeque<Inflight>,
    broken: bool,
    /// Whether this side connected (else it accepted).
    outgoing: bool,
    /// Whether the peer proved it knows the cluster secret, and since when it is up.
    admission: Admission,
    /// The region the peer advertised, reported once it is admitted.
    region: Option<RemoteRegion>,
    /// Work requests posted on it, and how many there were at the last keepalive round.
    posts: u64,
    posts_seen: u64,
}

impl Conn {
    fn advertised(&self) -> u64 {
        self.recv.posted_total() - self.held
    }
}

enum CmRequest {
    Connect(NodeId, SocketAddr),
}

enum CmResult {
    /// A connection is up; the flag says whether this side initiated it.
    Up(NodeId, Box<Connection>, RecvPool, bool),
    Failed(NodeId, String),
}

#[derive(Debug)]
struct CmThread {
    tx: Sender<CmRequest>,
    rx: Receiver<CmResult>,
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl Drop for CmThread {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// One node's RDMA endpoint.
///
/// Field order is drop order: connections (QPs) first, then the connection-manager thread,
/// then the registered regions peers write into, then the CQs, the PD and the context.
#[derive(Debug)]
pub struct RdmaEndpoint {
    conns: Conns<Conn>,
    cm: CmThread,
    regions: Vec<WordRegion>,
    send_cq: Arc<CompletionQueue>,
    recv_cq: Arc<CompletionQueue>,
    pd: Arc<ProtectionDomain>,
    ctx: Arc<Context>,
    cfg: RdmaConfig,
    hello: Arc<Mutex<Hello>>,
    connecting: BTreeMap<NodeId, ()>,
    last_errors: BTreeMap<NodeId, String>,
    refusals: u64,
    early_wc: Vec<verbs::Completion>,
    qpn: BTreeMap<u32, Key>,
    /// Received frames the owner has not reposted yet, one buffer per receive slot, made at
    /// connect with room for a whole frame; a received frame costs one copy out of the
    /// registered receive pool and no allocation.
    inboxes: BTreeMap<NodeId, Inbox>,
    /// The frame being received: filled from the receive pool, then swapped into its inbox
    /// slot (whose empty buffer comes back here). Room for a whole frame from the start.
    frame: Vec<u8>,
    events: Events,
    wc: Vec<verbs::Completion>,
    /// The connections a poll walks (overdue admissions, credit updates), kept between polls
    /// so that a poll allocates nothing.
    key_scratch: Vec<Key>,
    /// When the next keepalive round is due (see [`RdmaConfig::keepalive`]).
    keepalive_due: Instant,
    slot_bytes: usize,
    /// The CQs' completion channels and a wake-up rung by the connection threads (and by the
    /// owner's other threads, through [`Fabric::waiter`]).
    wait: Arc<WaitSet>,
    /// Why the endpoint failed for good (a completion queue could not be polled, or the
    /// device reported a fatal error), once it did: it then polls nothing more and has
    /// reported [`Event::Failed`].
    failed: Option<String>,
    /// Test-only: the next poll of the send CQ fails (see [`RdmaEndpoint::fail_cq_poll_for_test`]).
    cq_poll_fails_for_test: bool,
    /// The device context's asynchronous events (a thread reads and acknowledges them), taken
    /// once a keepalive period: a fatal device or CQ error fails the endpoint.
    async_events: verbs::AsyncEvents,
}

/// A failure of the event wait (its channels, eventfd or `poll(2)`).
fn wait_err(e: verbs::Error) -> FabricError {
    FabricError::Wait {
        reason: e.to_string(),
    }
}

impl Waiter for WaitSet {
    fn arm(&self) -> Result<(), FabricError> {
        WaitSet::arm(self).map_err(wait_err)
    }

    fn wait(&self, timeout: Duration) -> Result<bool, FabricError> {
        WaitSet::wait(self, timeout).map_err(wait_err)
    }

    fn wake(&self) {
        self.wakeup().ring();
    }
}

fn verr(e: verbs::Error) -> FabricError {
    FabricError::Setup {
        reason: e.to_string(),
    }
}

/// The only right a queue pair may start with: a connection is granted remote write only by
/// [`Fabric::set_remote_write`], after admission, and revoked by it (the replica's fencing).
const LOCAL_ACCESS: AccessFlags = AccessFlags::LOCAL_WRITE;

fn map_status(s: verbs::WcStatus) -> WcStatus {
    match s {
        verbs::WcStatus::Success => WcStatus::Success,
        verbs::WcStatus::RemoteAccess => WcStatus::RemoteAccess,
        verbs::WcStatus::RetryExceeded => WcStatus::RetryExceeded,
        verbs::WcStatus::Rnr => WcStatus::RnrRetryExceeded,
        verbs::WcStatus::Flushed => WcStatus::Flushed,
        // Local and other errors also break the connection; to the owner they mean the same
        // as a dead peer: nothing was acked, reconnect.
        _ => WcStatus::RetryExceeded,
    }
}

/// Finds the device whose RoCE v2 GID is `ip`.
pub fn device_for_ip(ip: IpAddr) -> Result<String, FabricError> {
    let IpAddr::V4(v4) = ip else {
        return Err(FabricError::Setup {
            reason: format!("{ip} is not IPv4; RoCE v2 devices are found by IPv4"),
        });
    };
    let devices = verbs::list_devices().map_err(verr)?;
    for d in &devices {
        if let Ok(ctx) = Context::open(&d.name) {
            if ctx.roce_v2_gid_index(1, v4).is_ok() {
                return Ok(d.name.clone());
            }
        }
    }
    Err(FabricError::Setup {
        reason: format!(
            "no RDMA device has a RoCE v2 GID for {ip} (devices: {:?})",
            devices.iter().map(|d| &d.name).collect::<Vec<_>>()
        ),
    })
}

impl RdmaEndpoint {
    /// Opens the device, starts listening and the connection-manager thread.
    pub fn open(cfg: RdmaConfig) -> Result<RdmaEndpoint, FabricError> {
        cfg.qp.validate().map_err(verr)?;
        if cfg.keepalive.is_zero() {
            return Err(FabricError::Setup {
                reason: "the keepalive period must be above zero".into(),
            });
        }
        let cfg_keepalive = cfg.keepalive;
        if cfg.qp.access.without(LOCAL_ACCESS) != AccessFlags::NONE {
            // A queue pair with remote rights from its creation would let a peer write the
            // ring before it proved the cluster secret, and after a revoke's reconnect.
            return Err(FabricError::Setup {
                reason: format!(
                    "qp.access {:#x} grants more than local access to every new connection; \
                     leave it LOCAL_WRITE (remote write is granted per connection, after \
                     admission, by set_remote_write)",
                    cfg.qp.access.bits()
                ),
            });
        }
        if cfg.recv_slots < 2 {
            return Err(FabricError::Setup {
                reason: "recv_slots must be at least 2 (one is kept for credit updates)".into(),
            });
        }
        // Every slot is posted on the receive queue at each connect: more slots than its
        // depth failed every connect, with an error naming neither.
        if cfg.recv_slots > cfg.qp.rq_depth as usize {
            return Err(FabricError::Setup {
                reason: format!(
                    "recv_slots {} exceeds qp.rq_depth {}: every slot is posted on the \
                     receive queue",
                    cfg.recv_slots, cfg.qp.rq_depth
                ),
            });
        }
        let name = match &cfg.device {
            Some(n) => n.clone(),
            None => device_for_ip(cfg.listen.ip())?,
        };
        let ctx = Context::open(&name).map_err(verr)?;
        let async_events = verbs::AsyncEvents::spawn(&ctx).map_err(verr)?;
        let pd = ProtectionDomain::new(&ctx).map_err(verr)?;
        let qps = cfg.peers.len().max(1) as u32 * QPS_PER_PEER;
        let send_cq = CompletionQueue::new(&ctx, cfg.qp.sq_depth * qps + 64).map_err(verr)?;
        let recv_cq = CompletionQueue::new(&ctx, cfg.qp.rq_depth * qps + 64).map_err(verr)?;
        let slot_bytes = FRAME_HEADER_BYTES + MAX_MESSAGE_BYTES;
        let hello = Arc::new(Mutex::new(Hello {
            cluster_id: cfg.cluster_id,
            node_id: cfg.node.0,
            version: PROTOCOL_VERSION,
            region: verbs::RemoteRegion::default(),
            recv_credits: cfg.recv_slots as u32,
        }));
        let listener = Listener::bind(&ctx, cfg.listen, 16).map_err(verr)?;
        let wait = Arc::new(
            WaitSet::new(
                vec![send_cq.clone(), recv_cq.clone()],
                Wakeup::new().map_err(wait_err)?,
            )
            .map_err(wait_err)?,
        );
        let (req_tx, req_rx) = mpsc::channel();
        let (res_tx, res_rx) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let worker = CmWorker {
            listener,
            pd: pd.clone(),
            send_cq: send_cq.clone(),
            recv_cq: recv_cq.clone(),
            cfg: cfg.clone(),
            hello: hello.clone(),
            slot_bytes,
            requests: req_rx,
            results: Results {
                tx: res_tx,
                wake: wait.wakeup().clone(),
            },
            stop: stop.clone(),
        };
        let handle = std::thread::Builder::new()
            .name(format!("rdmalog-cm-{}", cfg.node.0))
            .spawn(move || worker.run())
            .map_err(|e| FabricError::Setup {
                reason: format!("cannot start the connection thread: {e}"),
            })?;
        Ok(RdmaEndpoint {
            conns: Conns::default(),
            cm: CmThread {
                tx: req_tx,
                rx: res_rx,
                stop,
                handle: Some(handle),
            },
            regions: Vec::new(),
            send_cq,
            recv_cq,
            pd,
            ctx,
            cfg,
            hello,
            connecting: BTreeMap::new(),
            last_errors: BTreeMap::new(),
            refusals: 0,
            early_wc: Vec::new(),
            qpn: BTreeMap::new(),
            inboxes: BTreeMap::new(),
            frame: Vec::with_capacity(slot_bytes),
            events: Events::default(),
            wc: vec![verbs::Completion::EMPTY; WC_BATCH],
            key_scratch: Vec::new(),
            keepalive_due: Instant::now() + cfg_keepalive,
            slot_bytes,
            wait,
            failed: None,
            cq_poll_fails_for_test: false,
            async_events,
        })
    }

    /// Test-only: the next poll of the send completion queue fails as `ibv_poll_cq` does when
    /// the device fails under it (Soft-RoCE cannot be made to), to show the fail-stop.
    #[doc(hidden)]
    pub fn fail_cq_poll_for_test(&mut self) {
        self.cq_poll_fails_for_test = true;
    }

    /// Test-only: handles `event` as if the device had raised it (Soft-RoCE raises neither a
    /// fatal device error nor a CQ error), to show what the endpoint does with it.
    #[doc(hidden)]
    pub fn async_event_for_test(&mut self, event: verbs::AsyncEvent) {
        self.on_async_event(event);
    }

    /// What the device's asynchronous events mean here: a fatal error of the device or of a
    /// completion queue fails the endpoint for good (its completions can no longer be
    /// trusted or may never come); a port going down or up is logged (the connections over
    /// it fail through their completions, and dials retry); a QP's fatal or access error
    /// shows up as its work requests' error completions, which break that connection.
    fn on_async_event(&mut self, event: verbs::AsyncEvent) {
        use verbs::AsyncEvent as E;
        match event {
            E::DeviceFatal => {
                self.fail("the device reported a fatal error (IBV_EVENT_DEVICE_FATAL)".into())
            }
            E::CqError => {
                self.fail("a completion queue overran or failed (IBV_EVENT_CQ_ERR)".into())
            }
            E::PortDown { port } => {
                tracing::warn!(device = %self.device(), port, "the RDMA port went down")
            }
            E::PortActive { port } => {
                tracing::info!(device = %self.device(), port, "the RDMA port is active")
            }
            other => {
                tracing::debug!(device = %self.device(), event = ?other, "asynchronous device event")
            }
        }
    }

    /// The endpoint failed for good: a completion queue could not be polled (`ibv_poll_cq`
    /// fails only when the device or the CQ is broken), or the device reported a fatal error
    /// ([`RdmaEndpoint::on_async_event`]). Nothing more completes, so the owner
    /// is told once ([`Event::Failed`]) and the endpoint polls nothing more, rather than
    /// logging the same error at every poll (a busy poller's rate).
    fn fail(&mut self, why: String) {
        if self.failed.is_none() {
            tracing::error!(device = %self.device(), error = %why, "the RDMA device failed: the endpoint stops");
            self.failed = Some(why);
            self.events.push(Event::Failed);
        }
    }

    /// Why the last connect to `peer` failed, if it did: for logs and status pages.
    pub fn last_connect_error(&self, peer: NodeId) -> Option<&str> {
        self.last_errors.get(&peer).map(String::as_str)
    }

    /// Whether a dial to `peer` asked with [`Fabric::connect`] is still in flight (neither up
    /// nor failed yet). A dial made while the link was cut can complete long after another
    /// connection came up, and then replaces it (see `adopt`'s duplicate rule).
    pub fn dialing(&self, peer: NodeId) -> bool {
        self.connecting.contains_key(&peer)
    }

    /// How many connected peers were refused admission.
    pub fn refusals(&self) -> u64 {
        self.refusals
    }

    /// Entries of the send and the receive CQ reserved by this endpoint's live QPs (adopted
    /// connections and dials in progress). A broken or replaced connection gives its share
    /// back when its QP is destroyed; a leak would refuse a later reconnect.
    pub fn cq_reserved(&self) -> (u32, u32) {
        (self.send_cq.reserved(), self.recv_cq.reserved())
    }

    /// The device in use.
    pub fn device(&self) -> &str {
        self.ctx.name()
    }

    /// Breaks the connection `key` (first error or local close). A current one reports its
    /// first failure, flushes everything else outstanding and is reported disconnected; a
    /// challenger was never reported, so it goes silently. Either way the QP is forgotten.
    /// A current one takes the peer's challenger with it.
    fn break_conn(&mut self, key: Key, first: Option<WcStatus>, reason: DisconnectReason) {
        let Some(mut c) = self.conns.remove(key) else {
            return;
        };
        let peer = key.peer;
        self.qpn.remove(&c.conn.qp().qp_num());
        c.broken = true;
        if !key.is_current() {
            tracing::debug!(%peer, "dropped a second connection before its proof");
            return;
        }
        let mut status = first;
        for f in c.inflight.drain(..) {
            let s = status.take().unwrap_or(WcStatus::Flushed);
            if f.op == WcOp::Send && !f.signaled {
                // A credit, keepalive or admission frame of this endpoint's own: the owner
                // never posted it and must not see it complete.
                continue;
            }
            self.events.push(Event::Completion(Completion {
                peer,
                wr_id: f.wr_id,
                op: f.op,
                status: s,
                byte_len: 0,
            }));
        }
        // Receive events not yet taken by the owner name slots of this connection's inbox;
        // they must not be read as slots of the next one.
        self.events.forget_receives(peer);
        if let Some(inbox) = self.inboxes.get_mut(&peer) {
            inbox.clear();
        }
        self.events.push(Event::Disconnected { peer, reason });
        // Dropping the connection destroys the QP (and with it any WR still in the device).
        drop(c);
        // A challenger goes with it: promoted unproven, one that never proves would hold the
        // peer in `Connecting`, and each new hello would reset its deadline, while the owner
        // never dials. Both sides dial again instead.
        self.break_conn(Key::challenger(peer), None, reason);
    }

    /// `peer`'s challenger, which proved the secret, replaces its current connection (the
    /// owner sees the current one end).
    fn promote(&mut self, peer: NodeId) {
        let Some(c) = self.conns.remove(Key::challenger(peer)) else {
            return;
        };
        self.break_conn(Key::current(peer), None, DisconnectReason::PeerReset);
        self.qpn.insert(c.conn.qp().qp_num(), Key::current(peer));
        self.conns.insert(Key::current(peer), c);
    }

    fn adopt(&mut self, peer: NodeId, conn: Connection, recv: RecvPool, outgoing: bool) {
        if outgoing {
            self.connecting.remove(&peer);
        }
        let held = self
            .conns
            .get(peer)
            .filter(|c| !c.broken)
            .map(|c| dial::Held {
                outgoing: c.outgoing,
                age: c.admission.since().elapsed(),
                admitted: c.admission.admitted(),
            });
        if dial::keep(self.cfg.node, peer, held, outgoing) == dial::Keep::Held {
            tracing::debug!(%peer, "dropping a duplicate connection");
            // The QP goes before the receive buffers it still has posted.
            drop(conn);
            drop(recv);
            return;
        }
        let key = if dial::must_prove_first(held, self.cfg.secret.is_some()) {
            // Held beside the admitted one until it proves the secret; a challenger before it
            // is dropped (the newest dial is the one a restarted peer waits on).
            self.break_conn(Key::challenger(peer), None, DisconnectReason::PeerReset);
            // A dial claiming the peer says it may have restarted, and a QP whose peer died
            // fails only when something is posted on it: an idle one stayed up for good
            // beside a refused impostor (lab_cluster, a restart with the wrong secret). An
            // empty credit frame finds out within the retry bound.
            // Not sent with no credit to spare or no send slot left: the frames that took
            // them either are still outstanding (they fail if the peer is dead) or were all
            // taken by the peer's NIC before it died, and then only the owner's next write
            // finds out (the keepalive needs a spare credit too).
            self.probe(
                Key::current(peer),
                "the held connection, for a dial claiming its peer",
            );
            Key::challenger(peer)
        } else {
            // The current one's break drops a challenger too.
            self.break_conn(Key::current(peer), None, DisconnectReason::PeerReset);
            Key::current(peer)
        };
        let slots = self.cfg.recv_slots;
        let send = WordBuffer::new(slots * self.slot_bytes).and_then(|b| {
            WordRegion::register(&self.pd, b.clone(), AccessFlags::LOCAL_WRITE).map(|m| (m, b))
        });
        let (send_buf, send_words) = match send {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(%peer, error = %e, "cannot register a send buffer; dropping the connection");
                drop(conn);
                drop(recv);
                if key.is_current() {
                    self.events.push(Event::Disconnected {
                        peer,
                        reason: DisconnectReason::Unreachable,
                    });
                }
                return;
            }
        };
        let remote = conn.remote();
        let region = (remote.region.len > 0).then_some(RemoteRegion {
            addr: remote.region.addr,
            rkey: remote.region.rkey,
            len_bytes: remote.region.len,
        });
        let credits = SendCredits::new(u64::from(remote.recv_credits));
        let qp_num = conn.qp().qp_num();
        self.qpn.insert(qp_num, key);
        let c = Conn {
            told: Grant::new(recv.posted_total()),
            conn,
            recv,
            send_buf,
            send_words,
            free_send: (0..slots).rev().collect(),
            credits,
            held: 0,
            inflight: VecDeque::new(),
            broken: false,
            outgoing,
            admission: Admission::new(self.cfg.secret.as_deref().map(Vec::as_slice)),
            region,
            posts: 0,
            posts_seen: 0,
        };
        self.conns.insert(key, c);
        if key.is_current() {
            let slot_bytes = self.slot_bytes;
            self.inboxes.insert(peer, Inbox::new(slots, slot_bytes));
        }
        let early: Vec<verbs::Completion> = self
            .early_wc
            .iter()
            .filter(|w| w.qp_num == qp_num)
            .copied()
            .collect();
        self.early_wc.retain(|w| w.qp_num != qp_num);
        if self.cfg.secret.is_none() {
            for wc in early {
                self.handle_recv(key, wc);
            }
            self.announce(peer, region);
            return;
        }
        let challenge = self
            .conns
            .at_mut(key)
            .expect("inserted above")
            .admission
            .challenge();
        let msg = match challenge {
            Ok(m) => m,
            Err(e) => {
                tracing::error!(%peer, error = %e, "dropping the connection");
                self.break_conn(key, None, DisconnectReason::Refused);
                return;
            }
        };
        if let Err(e) = self.send_control(key, &msg) {
            self.lost_before_admission(key, &format!("our admission challenge: {e}"));
            return;
        }
        for wc in early {
            self.handle_recv(key, wc);
        }
    }

    fn send_control(&mut self, key: Key, msg: &[u8]) -> Result<(), FabricError> {
        self.send_frame_flags(key, u64::MAX, msg, true, CONTROL_BIT)
    }

    /// Queues the [`Event::Connected`] of a new, admitted connection to `peer`.
    fn announce(&mut self, peer: NodeId, remote: Option<RemoteRegion>) {
        self.events.announce(peer, remote);
    }

    /// Refuses a connection that failed admission, saying why on this side (the peer sees its
    /// connection drop and logs that it was refused). A refused challenger leaves the peer's
    /// current connection as it was.
    fn refuse(&mut self, key: Key, why: &str) {
        let peer = key.peer;
        let why = key.refusal(why);
        tracing::warn!(%peer, why, "refused a peer");
        self.last_errors.insert(peer, why);
        self.refusals += 1;
        self.break_conn(key, None, DisconnectReason::Refused);
    }

    fn handle_control(&mut self, key: Key, msg: &[u8]) {
        let peer = key.peer;
        let Some(c) = self.conns.at_mut(key) else {
            return;
        };
        let secret = self.cfg.secret.as_deref().map(Vec::as_slice);
        match c
            .admission
            .on_control(secret, self.cfg.cluster_id, self.cfg.node, peer, msg)
        {
            ControlOutcome::Reply(out) => {
                if let Err(e) = self.send_control(key, &out) {
                    self.lost_before_admission(key, &format!("our admission proof: {e}"));
                }
            }
            ControlOutcome::Admitted => {
                let remote = c.region;
                if !key.is_current() {
                    // The peer proved it: its newest connection replaces the one in use,
                    // which the owner sees end before this one is reported.
                    tracing::info!(%peer, "a second connection proved the secret; it replaces the first");
                    self.promote(peer);
                }
                self.announce(peer, remote);
            }
            ControlOutcome::Nothing => {}
            ControlOutcome::Refuse(why) => self.refuse(key, why),
        }
    }

    /// Sends one frame (header + `msg`) on `peer`'s connection.
    fn send_frame(
        &mut self,
        peer: NodeId,
        wr_id: u64,
        msg: &[u8],
        credit_only: bool,
    ) -> Result<(), FabricError> {
        let admitted = self.conns.get(peer).is_some_and(|c| c.admission.admitted())
            && !self.events.unannounced(peer);
        if !credit_only && !admitted {
            return Err(FabricError::NotConnected { peer });
        }
        self.send_frame_flags(Key::current(peer), wr_id, msg, credit_only, 0)
    }

    fn send_frame_flags(
        &mut self,
        key: Key,
        wr_id: u64,
        msg: &[u8],
        credit_only: bool,
        flags: u64,
    ) -> Result<(), FabricError> {
        let peer = key.peer;
        let c = self
            .conns
            .at_mut(key)
            .filter(|c| !c.broken)
            .ok_or(FabricError::NotConnected { peer })?;
        let reserve = if credit_only { 0 } else { 1 };
        if c.credits.available() <= reserve {
            return Err(FabricError::NoCredit { peer });
        }
        let Some(slot) = c.free_send.pop() else {
            return Err(FabricError::QueueFull {
                peer,
                depth: self.cfg.recv_slots,
            });
        };
        let off = slot * self.slot_bytes;
        let adv = c.advertised();
        crate::write_words(
            c.send_words.words(),
            off as u64,
            &(adv | flags).to_le_bytes(),
        );
        crate::write_words(c.send_words.words(), (off + FRAME_HEADER_BYTES) as u64, msg);
        match c
            .conn
            .qp()
            .post_send_words(&c.send_buf, off, FRAME_HEADER_BYTES + msg.len(), true)
        {
            Ok(seq) => {
                c.credits.take().expect("checked above");
                c.told.told(adv);
                c.posts += 1;
                c.inflight.push_back(Inflight {
                    seq,
                    wr_id,
                    op: WcOp::Send,
                    signaled: !credit_only,
                    send_slot: Some(slot),
                });
                Ok(())
            }
            Err(e) => {
                c.free_send.push(slot);
                tracing::warn!(%peer, error = %e, "post_send failed");
                Err(FabricError::QueueFull {
                    peer,
                    depth: self.cfg.qp.sq_depth as usize,
                })
            }
        }
    }

    fn maybe_send_credit(&mut self, key: Key) {
        let Some(c) = self.conns.at(key) else {
            return;
        };
        if c.told.update_due(c.advertised(), self.cfg.recv_slots) {
            let _ = self.send_frame_flags(key, u64::MAX, &[], true, 0);
        }
    }

    /// Sends an empty credit frame on `key`'s connection, which fails within the retry bound
    /// if the peer is dead. Only with a credit to spare: the last one stays for a credit
    /// update, as for the owner's frames (taken by a probe, the peer could wait for our update
    /// while we wait for its).
    fn probe(&mut self, key: Key, why: &str) {
        let spare = self
            .conns
            .at(key)
            .is_some_and(|c| c.credits.available() > 1);
        let sent = if spare {
            self.send_frame_flags(key, u64::MAX, &[], true, 0)
        } else {
            Err(FabricError::NoCredit { peer: key.peer })
        };
        if let Err(e) = sent {
            tracing::debug!(peer = %key.peer, why, error = %e, "no probe frame");
        }
    }

    /// Once a keepalive period: an empty credit frame on every admitted connection on which
    /// nothing was posted since the last round, so that a dead peer fails it within the retry
    /// bound (see [`RdmaConfig::keepalive`]). One with no credit to spare gets none (see
    /// [`RdmaEndpoint::probe`]).
    fn keepalive(&mut self) {
        let now = Instant::now();
        if now < self.keepalive_due {
            return;
        }
        self.keepalive_due = now + self.cfg.keepalive;
        while let Some(event) = self.async_events.try_recv() {
            self.on_async_event(event);
        }
        if self.failed.is_some() {
            return;
        }
        let mut keys = std::mem::take(&mut self.key_scratch);
        keys.clear();
        keys.extend(
            self.conns
                .iter()
                .filter(|(k, c)| {
                    k.is_current()
                        && !c.broken
                        && c.admission.admitted()
                        && c.posts == c.posts_seen
                        && c.inflight.is_empty()
                })
                .map(|(k, _)| k),
        );
        for &key in &keys {
            self.probe(key, "keepalive");
        }
        self.key_scratch = keys;
        for (_, c) in self.conns.iter_mut() {
            c.posts_seen = c.posts;
        }
    }

    fn poll_cm(&mut self) {
        while let Ok(r) = self.cm.rx.try_recv() {
            match r {
                CmResult::Up(peer, conn, recv, outgoing) => self.adopt(peer, *conn, recv, outgoing),
                CmResult::Failed(peer, why) => {
                    tracing::info!(%peer, why, "connect failed");
                    self.connecting.remove(&peer);
                    self.last_errors.insert(peer, why);
                    if self.conns.get(peer).is_some_and(|c| !c.broken) {
                        // The peer's own connection to us is up: our failed dial changes nothing.
                        continue;
                    }
                    self.events.push(Event::Disconnected {
                        peer,
                        reason: DisconnectReason::Unreachable,
                    });
                }
            }
        }
    }

    /// Takes one batch of send completions; how many there were.
    fn poll_send_cq(&mut self) -> usize {
        if std::mem::take(&mut self.cq_poll_fails_for_test) {
            self.fail("polling the send CQ failed: injected by a test".into());
            return 0;
        }
        let n = match self.send_cq.poll(&mut self.wc) {
            Ok(n) => n,
            Err(e) => {
                self.fail(format!("polling the send CQ failed: {e}"));
                return 0;
            }
        };
        for i in 0..n {
            let wc = self.wc[i];
            let Some(&key) = self.qpn.get(&wc.qp_num) else {
                continue;
            };
            let peer = key.peer;
            let Some(c) = self.conns.at_mut(key) else {
                continue;
            };
            // RC completes in order: everything before this sequence is done too (only
            // signaled WRs make completions, and every WR here is signaled).
            if !c.inflight.iter().any(|f| f.seq == wc.wr_id) {
                // Not one of ours (a stale completion of an earlier QP with this number).
                continue;
            }
            c.conn.qp().retire(&wc);
            let mut done = None;
            while let Some(f) = c.inflight.front() {
                if f.seq > wc.wr_id {
                    break;
                }
                let f = c.inflight.pop_front().expect("front exists");
                if let Some(s) = f.send_slot {
                    c.free_send.push(s);
                }
                if f.seq == wc.wr_id {
                    done = Some(f);
                    break;
                }
            }
            let Some(f) = done else { continue };
            let status = map_status(wc.status);
            if !key.is_current() {
                // A challenger posts only unsignaled control and credit frames.
                if status != WcStatus::Success {
                    self.failed(key, status);
                }
            } else if status == WcStatus::Success {
                if f.signaled {
                    self.events.push(Event::Completion(Completion {
                        peer,
                        wr_id: f.wr_id,
                        op: f.op,
                        status,
                        byte_len: 0,
                    }));
                }
            } else {
                if f.signaled || f.op == WcOp::Write {
                    self.events.push(Event::Completion(Completion {
                        peer,
                        wr_id: f.wr_id,
                        op: f.op,
                        status,
                        byte_len: 0,
                    }));
                }
                self.failed(key, status);
            }
        }
        n
    }

    /// An error completion broke `peer`'s connection. Before admission the cause cannot be
    /// told from the status (a write before the proof, which has no remote rights, puts our
    /// queue pair in error, as does a peer that crashed or dropped a duplicate connection):
    /// not counted as a refusal, but recorded, so the last reason is this one and not an
    /// earlier refusal's.
    fn failed(&mut self, key: Key, status: WcStatus) {
        if self.conns.at(key).is_some_and(|c| !c.admission.admitted()) {
            self.record_lost_before_admission(key, &format!("{status:?}"));
        }
        self.break_conn(key, None, DisconnectReason::Failed(status));
    }

    /// Records why `peer`'s connection ended before its admission, when the cause cannot be
    /// told (see [`RdmaEndpoint::failed`]): the last reason, not a refusal.
    fn record_lost_before_admission(&mut self, key: Key, what: &str) {
        let peer = key.peer;
        let which = if key.is_current() {
            "the connection"
        } else {
            "a second connection that claimed this peer's id"
        };
        let why = format!(
            "{which} failed ({what}) before the peer proved it knows the cluster \
             secret (a write before the proof does that; so do a crash and a dropped \
             duplicate connection)"
        );
        tracing::info!(%peer, why, "connection lost before admission");
        self.last_errors.insert(peer, why);
    }

    /// A send of the admission exchange failed (the queue pair in error, no credit): the
    /// connection ends, recorded but not counted as a refusal, as in [`RdmaEndpoint::failed`].
    fn lost_before_admission(&mut self, key: Key, what: &str) {
        self.record_lost_before_admission(key, what);
        self.break_conn(key, None, DisconnectReason::Refused);
    }

    /// Takes one batch of receive completions; how many there were.
    fn poll_recv_cq(&mut self) -> usize {
        let n = match self.recv_cq.poll(&mut self.wc) {
            Ok(n) => n,
            Err(e) => {
                self.fail(format!("polling the receive CQ failed: {e}"));
                return 0;
            }
        };
        for i in 0..n {
            let wc = self.wc[i];
            match self.qpn.get(&wc.qp_num) {
                Some(&key) => self.handle_recv(key, wc),
                None => {
                    // A connection the CM thread has brought up but not yet handed over: its
                    // peer may already be sending (the accepting side's QP is live before
                    // ESTABLISHED). Keep the completion for `adopt`, bounded.
                    if self.early_wc.len() >= EARLY_WC_LIMIT {
                        let dropped = self.early_wc.remove(0);
                        tracing::warn!(
                            qp_num = dropped.qp_num,
                            "dropping a receive of an unknown queue pair"
                        );
                    }
                    self.early_wc.push(wc);
                }
            }
        }
        n
    }

    fn handle_recv(&mut self, key: Key, wc: verbs::Completion) {
        let peer = key.peer;
        {
            let Some(c) = self.conns.at_mut(key) else {
                return;
            };
            if !c.recv.owns(&wc) {
                // A completion of an earlier queue pair's receives, under a number the device
                // gave this one too (Soft-RoCE keeps a destroyed QP's completions in the CQ).
                tracing::debug!(%peer, wr_id = wc.wr_id, "a stale receive completion; ignored");
                return;
            }
            let mut header = None;
            let frame = &mut self.frame;
            frame.clear();
            let got = c.recv.with_received(c.conn.qp(), &wc, |bytes| {
                if bytes.len() >= FRAME_HEADER_BYTES {
                    header = Some(u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")));
                    frame.extend_from_slice(&bytes[FRAME_HEADER_BYTES..]);
                }
            });
            match got {
                Ok(Ok(())) => {}
                Ok(Err(status)) => {
                    self.failed(key, map_status(status));
                    return;
                }
                Err(e) => {
                    tracing::warn!(%peer, error = %e, "receive bookkeeping failed; dropping the connection");
                    self.break_conn(key, None, DisconnectReason::Failed(WcStatus::RetryExceeded));
                    return;
                }
            }
            let Some(adv) = header else {
                if !c.admission.admitted() {
                    self.refuse(
                        key,
                        "it sent a frame shorter than its header before proving it knows the \
                         cluster secret",
                    );
                    return;
                }
                tracing::warn!(%peer, "a frame shorter than its header; dropping the connection");
                self.break_conn(key, None, DisconnectReason::Failed(WcStatus::RemoteAccess));
                return;
            };
            c.credits.update(adv & !CONTROL_BIT);
            if adv & CONTROL_BIT != 0 {
                let msg = std::mem::take(&mut self.frame);
                self.handle_control(key, &msg);
                self.frame = msg;
                return;
            }
            if self.frame.is_empty() {
                return; // a credit-only frame
            }
            if !c.admission.admitted() {
                self.refuse(
                    key,
                    "it sent data before proving it knows the cluster secret",
                );
                return;
            }
            let len = self.frame.len() as u32;
            let inbox = self.inboxes.entry(peer).or_default();
            let Some(slot) = inbox.put(&mut self.frame) else {
                // The peer sent beyond the credits we granted: a protocol violation.
                tracing::warn!(%peer, "a frame beyond the granted credits; dropping the connection");
                self.break_conn(
                    key,
                    None,
                    DisconnectReason::Failed(WcStatus::RnrRetryExceeded),
                );
                return;
            };
            c.held += 1;
            self.events.push(Event::Completion(Completion {
                peer,
                wr_id: slot,
                op: WcOp::Recv,
                status: WcStatus::Success,
                byte_len: len,
            }));
        }
    }
}

impl Fabric for RdmaEndpoint {
    fn node(&self) -> NodeId {
        self.cfg.node
    }

    fn alloc(&mut self, len_bytes: u64) -> Result<Arc<dyn Memory>, FabricError> {
        shared::alloc_words(len_bytes)
    }

    fn alloc_persistent(
        &mut self,
        path: &std::path::Path,
        len_bytes: u64,
    ) -> Result<(Arc<dyn Memory>, bool), FabricError> {
        shared::alloc_shared_words(path, len_bytes)
    }

    fn free_persistent(&mut self, path: &std::path::Path) -> Result<(), FabricError> {
        shared::free_shared(path)
    }

    fn register(
        &mut self,
        memory: Arc<dyn Memory>,
    ) -> Result<(LocalRegion, RemoteRegion), FabricError> {
        let len_bytes = memory.words().len() as u64 * 8;
        let mem = memory.into_any().downcast::<RdmaMemory>().map_err(|_| FabricError::Register {
            len_bytes,
            reason: "only memory from RdmaEndpoint::alloc can be registered (its address must never move)".into(),
        })?;
        let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
        let mr = WordRegion::register(&self.pd, mem.0.clone(), access).map_err(|e| {
            FabricError::Register {
                len_bytes,
                reason: e.to_string(),
            }
        })?;
        let remote = RemoteRegion {
            addr: mr.addr(),
            rkey: mr.rkey(),
            len_bytes,
        };
        let id = self.regions.len() as u32;
        self.regions.push(mr);
        Ok((LocalRegion { id, len_bytes }, remote))
    }

    fn advertise(&mut self, region: RemoteRegion) {
        let mut h = self
            .hello
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        h.region = verbs::RemoteRegion {
            addr: region.addr,
            rkey: region.rkey,
            len: region.len_bytes,
        };
    }

    fn connect(&mut self, peer: NodeId) -> Result<(), FabricError> {
        if self.conns.get(peer).is_some_and(|c| !c.broken) || self.connecting.contains_key(&peer) {
            return Ok(());
        }
        let addr = *self
            .cfg
            .peers
            .get(&peer)
            .ok_or(FabricError::UnknownPeer { peer })?;
        self.connecting.insert(peer, ());
        self.cm
            .tx
            .send(CmRequest::Connect(peer, addr))
            .map_err(|_| FabricError::NodeDown {
                node: self.cfg.node,
            })
    }

    fn disconnect(&mut self, peer: NodeId) {
        // Every connection to the peer (the current one's break drops a challenger too).
        self.break_conn(Key::current(peer), None, DisconnectReason::Closed);
    }

    fn conn_state(&self, peer: NodeId) -> ConnState {
        match self.conns.get(peer).filter(|c| !c.broken) {
            Some(c) if c.admission.admitted() && !self.events.unannounced(peer) => {
                return ConnState::Up;
            }
            Some(_) => return ConnState::Connecting,
            None => {}
        }
        if self.connecting.contains_key(&peer) {
            ConnState::Connecting
        } else {
            ConnState::Down
        }
    }

    fn post_write(&mut self, peer: NodeId, wr: WriteRequest) -> Result<(), FabricError> {
        let end = wr.local_offset + wr.len_bytes;
        let mr = self
            .regions
            .get(wr.local.id as usize)
            .filter(|m| end <= m.len() as u64)
            .ok_or(FabricError::LocalRange {
                id: wr.local.id,
                offset: wr.local_offset,
                end,
            })?;
        if self.events.unannounced(peer) {
            return Err(FabricError::NotConnected { peer });
        }
        let c = self
            .conns
            .get_mut(peer)
            .filter(|c| !c.broken && c.admission.admitted())
            .ok_or(FabricError::NotConnected { peer })?;
        let remote = verbs::RemoteRegion {
            addr: wr.remote.addr,
            rkey: wr.remote.rkey,
            len: wr.remote.len_bytes,
        };
        let seq = c
            .conn
            .qp()
            .post_write_words(
                mr,
                wr.local_offset as usize,
                wr.len_bytes as usize,
                &remote,
                wr.remote_offset,
                true,
            )
            .map_err(|_| FabricError::QueueFull {
                peer,
                depth: self.cfg.qp.sq_depth as usize,
            })?;
        c.posts += 1;
        c.inflight.push_back(Inflight {
            seq,
            wr_id: wr.wr_id,
            op: WcOp::Write,
            signaled: wr.signaled,
            send_slot: None,
        });
        Ok(())
    }

    fn post_send(&mut self, peer: NodeId, wr_id: u64, msg: &[u8]) -> Result<(), FabricError> {
        if msg.len() > MAX_MESSAGE_BYTES {
            return Err(FabricError::MessageTooLarge {
                len: msg.len(),
                max: MAX_MESSAGE_BYTES,
            });
        }
        if msg.is_empty() {
            // Empty frames are credit updates on the wire; an empty message has nothing to say.
            return Err(FabricError::MessageTooLarge {
                len: 0,
                max: MAX_MESSAGE_BYTES,
            });
        }
        self.send_frame(peer, wr_id, msg, false)
    }

    fn send_credits(&self, peer: NodeId) -> u32 {
        self.conns
            .get(peer)
            .filter(|c| !c.broken && c.admission.admitted() && !c.free_send.is_empty())
            .map_or(0, |c| c.credits.available().saturating_sub(1) as u32)
    }

    fn recv_message(&self, peer: NodeId, slot: u64) -> Result<&[u8], FabricError> {
        self.inboxes
            .get(&peer)
            .and_then(|i| i.message(slot))
            .ok_or(FabricError::BadSlot { peer, slot })
    }

    fn repost_recv(&mut self, peer: NodeId, slot: u64) -> Result<(), FabricError> {
        if !self.inboxes.get_mut(&peer).is_some_and(|i| i.release(slot)) {
            return Err(FabricError::BadSlot { peer, slot });
        }
        if let Some(c) = self.conns.get_mut(peer) {
            c.held = c.held.saturating_sub(1);
        }
        self.maybe_send_credit(Key::current(peer));
        Ok(())
    }

    fn set_remote_write(&mut self, peer: NodeId, allowed: bool) -> Result<(), FabricError> {
        match self
            .conns
            .get(peer)
            .filter(|c| !c.broken && c.admission.admitted())
        {
            Some(c) => {
                let r = if allowed {
                    c.conn.qp().grant_remote_write()
                } else {
                    c.conn.qp().revoke_remote_write()
                };
                r.map_err(|e| {
                    tracing::warn!(%peer, allowed, error = %e, "changing remote access failed");
                    FabricError::NotConnected { peer }
                })
            }
            None if !allowed => Ok(()),
            None => Err(FabricError::NotConnected { peer }),
        }
    }

    fn waiter(&self) -> Option<Arc<dyn Waiter>> {
        Some(self.wait.clone())
    }

    fn failure(&self) -> Option<String> {
        self.failed.clone()
    }

    fn poll(&mut self, out: &mut [Event]) -> usize {
        if self.failed.is_some() {
            return self.events.drain_into(out);
        }
        self.poll_cm();
        // Until a batch comes back short: a full batch may leave completions in the CQ, which
        // arming it would not report (only new ones raise an event), so a driver that found
        // no event in a full batch of credit-only or stale completions slept past them.
        while self.poll_send_cq() == self.wc.len() {}
        while self.failed.is_none() && self.poll_recv_cq() == self.wc.len() {}
        if self.failed.is_some() {
            // Nothing after the failure: what was queued before it, then `Failed`.
            return self.events.drain_into(out);
        }
        // Deadlines after the receives: a proof already in the CQ counts.
        let limit = self.cfg.admission_timeout;
        let mut keys = std::mem::take(&mut self.key_scratch);
        keys.clear();
        keys.extend(
            self.conns
                .iter()
                .filter(|(_, c)| !c.broken && c.admission.overdue(limit))
                .map(|(k, _)| k),
        );
        for &key in &keys {
            self.refuse(key, "it did not prove it knows the cluster secret in time");
        }
        // A credit update that found no free send slot is retried here.
        keys.clear();
        keys.extend(self.conns.iter().map(|(k, _)| k));
        for &key in &keys {
            self.maybe_send_credit(key);
        }
        self.key_scratch = keys;
        self.keepalive();
        self.events.drain_into(out)
    }
}

/// Where connection threads report, ringing the endpoint's wake-up so a sleeping owner polls.
#[derive(Clone)]
struct Results {
    tx: Sender<CmResult>,
    wake: Arc<Wakeup>,
}

impl Results {
    fn send(&self, r: CmResult) {
        // The endpoint is gone when the receiver is: nobody to tell.
        let _ = self.tx.send(r);
        self.wake.ring();
    }
}

struct CmWorker {
    listener: Listener,
    pd: Arc<ProtectionDomain>,
    send_cq: Arc<CompletionQueue>,
    recv_cq: Arc<CompletionQueue>,
    cfg: RdmaConfig,
    hello: Arc<Mutex<Hello>>,
    slot_bytes: usize,
    requests: Receiver<CmRequest>,
    results: Results,
    stop: Arc<AtomicBool>,
}

impl CmWorker {
    fn pool(&self) -> Result<RecvPool, String> {
        RecvPool::new(&self.pd, self.cfg.recv_slots, self.slot_bytes).map_err(|e| e.to_string())
    }

    fn run(self) {
        let mut spare: Option<RecvPool> = None;
        while !self.stop.load(Ordering::Acquire) {
            while let Ok(CmRequest::Connect(peer, addr)) = self.requests.try_recv() {
                let dialer = Dialer {
                    pd: self.pd.clone(),
                    send_cq: self.send_cq.clone(),
                    recv_cq: self.recv_cq.clone(),
                    cfg: self.cfg.clone(),
                    hello: self.hello.clone(),
                    slot_bytes: self.slot_bytes,
                };
                let results = self.results.clone();
                let spawned = std::thread::Builder::new()
                    .name(format!("rdmalog-dial-{}", peer.0))
                    .spawn(move || {
                        results.send(dialer.connect(peer, addr));
                    });
                if let Err(e) = spawned {
                    self.results.send(CmResult::Failed(
                        peer,
                        format!("cannot start a connect thread: {e}"),
                    ));
                }
            }
            if spare.is_none() {
                match self.pool() {
                    Ok(p) => spare = Some(p),
                    Err(e) => {
                        tracing::error!(error = %e, "cannot register a receive pool");
                        std::thread::sleep(Duration::from_millis(100));
                        continue;
                    }
                }
            }
            let mut pool = spare.take().expect("created above");
            let mut posted = false;
            let r = self.listener.accept_within(
                ACCEPT_POLL,
                &self.pd,
                &self.send_cq,
                &self.recv_cq,
                self.cfg.qp,
                &self.cfg.connect,
                // Read when a request arrives, not before the wait: a region advertised while
                // we waited must not be refused.
                &|| {
                    let hello = *self
                        .hello
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    if hello.region.len == 0 && self.cfg.accept_only_after_advertise {
                        // Peers learn our ring only from the hello: accepting before the owner
                        // has advertised it would give them a connection they can never write
                        // through. Refuse at once rather than leave the request pending: the
                        // dialer retries after its backoff instead of waiting out its whole CM
                        // timeout.
                        return Err(verbs::RejectReason::NotReady);
                    }
                    Ok(hello)
                },
                |qp| {
                    posted = true;
                    pool.post_all(qp)
                },
            );
            match r {
                Ok(conn) => {
                    let peer = NodeId(conn.remote().node_id);
                    if !self.cfg.peers.contains_key(&peer) || peer == self.cfg.node {
                        tracing::warn!(%peer, addr = conn.peer(), "refused a connection from a node that is not a configured peer");
                        continue;
                    }
                    self.results
                        .send(CmResult::Up(peer, Box::new(conn), pool, false));
                }
                Err(verbs::Error::CmTimeout { .. }) if !posted => spare = Some(pool),
                Err(verbs::Error::RefusedPeer { peer, reason }) if !posted => {
                    tracing::debug!(peer, %reason, "refused an incoming connection");
                    spare = Some(pool);
                }
                Err(e) => {
                    // The pool may have been posted to a QP that is gone: never reuse it.
                    tracing::info!(error = %e, "an incoming connection failed");
                }
            }
        }
    }
}

/// What an outgoing connect needs; each connect runs on its own short-lived thread, so one
/// slow or unreachable peer never delays the others.
#[derive(Clone)]
struct Dialer {
    pd: Arc<ProtectionDomain>,
    send_cq: Arc<CompletionQueue>,
    recv_cq: Arc<CompletionQueue>,
    cfg: RdmaConfig,
    hello: Arc<Mutex<Hello>>,
    slot_bytes: usize,
}

impl Dialer {
    fn connect(&self, peer: NodeId, addr: SocketAddr) -> CmResult {
        let mut pool = match RecvPool::new(&self.pd, self.cfg.recv_slots, self.slot_bytes) {
            Ok(p) => p,
            Err(e) => return CmResult::Failed(peer, e.to_string()),
        };
        let hello = *self
            .hello
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match Connection::connect(
            &self.pd,
            &self.send_cq,
            &self.recv_cq,
            self.cfg.qp,
            &self.cfg.connect,
            Some(self.cfg.listen.ip()),
            addr,
            &hello,
            |qp| pool.post_all(qp),
        ) {
            Ok(conn) if conn.remote().node_id == peer.0 => {
                CmResult::Up(peer, Box::new(conn), pool, true)
            }
            Ok(conn) => CmResult::Failed(
                peer,
                format!(
                    "{addr} answered as node {}, not {peer}",
                    conn.remote().node_id
                ),
            ),
            Err(e) => CmResult::Failed(peer, e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn statuses_map_to_the_fabric_classes() {
        assert_eq!(
            map_status(verbs::WcStatus::RemoteAccess),
            WcStatus::RemoteAccess
        );
        assert_eq!(map_status(verbs::WcStatus::Flushed), WcStatus::Flushed);
        assert_eq!(map_status(verbs::WcStatus::Rnr), WcStatus::RnrRetryExceeded);
        assert_eq!(
            map_status(verbs::WcStatus::LocalError),
            WcStatus::RetryExceeded
        );
    }

    /// Refused before any device is opened, so this runs on a host without RDMA.
    #[test]
    fn a_queue_pair_with_remote_rights_from_the_start_is_refused() {
        for remote in [
            AccessFlags::REMOTE_WRITE,
            AccessFlags::REMOTE_READ,
            AccessFlags::REMOTE_ATOMIC,
            AccessFlags::from_bits(1 << 4), // memory-window binding: not a local right either
        ] {
            let mut cfg = RdmaConfig::new(
                NodeId(1),
                1,
                "192.0.2.11:7470".parse().unwrap(),
                BTreeMap::new(),
            );
            cfg.device = Some("no-such-device".into());
            cfg.qp.access = AccessFlags::LOCAL_WRITE | remote;
            match RdmaEndpoint::open(cfg) {
                Err(FabricError::Setup { reason }) => {
                    assert!(reason.contains("qp.access"), "{reason}")
                }
                other => panic!("{:?}", other.err()),
            }
        }
        let mut cfg = RdmaConfig::new(
            NodeId(1),
            1,
            "192.0.2.11:7470".parse().unwrap(),
            BTreeMap::new(),
        );
        cfg.recv_slots = 1;
        let Err(err) = RdmaEndpoint::open(cfg.clone()) else {
            panic!("one receive slot was accepted")
        };
        assert!(
            err.to_string()
                .starts_with("cannot set up the fabric: recv_slots"),
            "{err}"
        );
        cfg.recv_slots = cfg.qp.rq_depth as usize + 1;
        let Err(err) = RdmaEndpoint::open(cfg) else {
            panic!("more receive slots than the receive queue holds were accepted")
        };
        assert!(err.to_string().contains("exceeds qp.rq_depth"), "{err}");
    }

    #[test]
    fn words_are_written_at_any_alignment() {
        let words: Vec<AtomicU64> = (0..4).map(|_| AtomicU64::new(0)).collect();
        crate::write_words(&words, 3, &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
        let bytes: Vec<u8> = words
            .iter()
            .flat_map(|w| w.load(Ordering::Relaxed).to_le_bytes())
            .collect();
        assert_eq!(
            &bytes[..16],
            &[0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 0, 0, 0]
        );
    }
}
