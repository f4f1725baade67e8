//! The TCP back-end: the [`Fabric`] trait over kernel TCP sockets, for machines without RDMA.
//!
//! # Model
//!
//! - One TCP connection per peer pair, with `TCP_NODELAY`. An I/O thread per endpoint owns the
//!   listener and every socket's reading side, on a [`mio`] poll. It plays the part of the
//!   RDMA NIC: it places one-sided writes into the registered memory they name, acknowledges
//!   writes and sends, and passes received messages to the owner. The owner's
//!   [`Fabric::poll`] turns what the I/O thread reports into completions and events.
//! - A connection starts with a *hello* each way (cluster id, node id, protocol version, the
//!   advertised region and the initial receive credits), as the RDMA back-end's rdma_cm
//!   private data; a mismatch is answered with a reject that names the cause. Then the
//!   cluster-secret admission of [`crate::admission`] runs over control frames, and the
//!   duplicate-dial rule of [`crate::dial`] picks one connection when both sides dial.
//! - **Write.** [`Fabric::post_write`] copies the local bytes into frames of at most
//!   [`WRITE_CHUNK_BYTES`] and sends them. The peer's I/O thread checks the connection's grant,
//!   the region key and the bounds, and places the bytes into the registered memory while it
//!   holds the grant's lock, so that once [`Fabric::set_remote_write`] revokes, nothing more is
//!   placed. Then it acknowledges. The write completes at the writer when the acknowledgement
//!   of its last frame arrives: the peer placed every byte. A refused write is answered with a
//!   negative acknowledgement: `RemoteAccess` at the writer, nothing placed, and the connection
//!   breaks on both sides.
//! - **Send.** A message frame lands in one of the receiver's inbox slots; credits work as on
//!   RDMA (every frame carries the sender's cumulative grant of receive slots), so a sender
//!   that respects [`Fabric::send_credits`] never overruns the inbox. A frame beyond the grant
//!   breaks the connection.
//! - **Ordering.** One TCP stream per connection, read in order by one thread: a send posted
//!   after a write is handed to the owner only after the write's bytes were placed.
//! - **Failure.** An operation not acknowledged within [`TcpConfig::dead_peer_timeout`] fails
//!   `RetryExceeded`, and everything behind it `Flushed`; so does everything outstanding when
//!   the socket reports an error or the peer closes it. The ack counts as missing only once
//!   the I/O thread has read every socket to empty after the deadline, so a stall of this
//!   process cannot make a live peer look dead. A link with nothing outstanding is watched
//!   by the kernel's keepalive ([`TcpConfig::keepalive`]), so a peer whose machine died is
//!   found on an idle link too. A broken connection must be re-established with
//!   [`Fabric::connect`].
//!
//! Writes over TCP cost the peer's CPU (its I/O thread copies them from the socket into the
//! ring), which RDMA does not: that difference is what the transport comparison measures.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mio::net::{TcpListener, TcpStream};
use mio::{Interest, Poll, Token};

use verbs::SendCredits;

use crate::admission::{Admission, ControlOutcome};
use crate::dial;
use crate::shared::{self, Conns, Events, Grant, Inbox, Key, WordMemory};
use crate::tls::PeerTls;
use crate::{
    Completion, ConnState, DisconnectReason, Event, Fabric, FabricError, LocalRegion,
    MAX_MESSAGE_BYTES, Memory, NodeId, RemoteRegion, Waiter, WcOp, WcStatus, WriteRequest,
};

/// The largest frame of a one-sided write; longer writes go as several frames.
pub const WRITE_CHUNK_BYTES: usize = 256 * 1024;

/// The TCP protocol's version, checked in the hello.
pub const TCP_PROTOCOL_VERSION: u32 = 1;

const MAGIC: u64 = u64::from_le_bytes(*b"rdmalogT");

/// Frame header: body length (u32), kind (u8), three bytes of padding.
const HEADER: usize = 8;
const HELLO_BODY: usize = 56;
/// A write frame's body before its data: grant, rkey + padding, address.
const WRITE_HEAD: usize = 24;
/// A send frame's body before its message: grant.
const SEND_HEAD: usize = 8;
const MAX_BODY: usize = WRITE_HEAD + WRITE_CHUNK_BYTES;

const K_HELLO: u8 = 1;
const K_REJECT: u8 = 2;
const K_WRITE: u8 = 3;
const K_SEND: u8 = 4;
const K_CONTROL: u8 = 5;
const K_CREDIT: u8 = 6;
const K_ACK: u8 = 7;
const K_NAK: u8 = 8;

const LISTENER: Token = Token(usize::MAX - 1);
const WAKER: Token = Token(usize::MAX - 2);

/// How often the I/O thread looks at handshake deadlines when nothing happens.
const IO_TICK: Duration = Duration::from_millis(20);

/// Bytes the I/O thread reads from one connection before it turns to the others; the rest is
/// read on its next pass (a busy peer cannot starve the others).
const READ_BUDGET: usize = 512 * 1024;

/// Buffers kept for reuse (received messages, frames being built).
const POOL_LIMIT: usize = 64;

/// Configuration of one node's TCP endpoint.
#[derive(Clone, Debug)]
pub struct TcpConfig {
    /// This node.
    pub node: NodeId,
    /// Cluster id; peers of another cluster are refused at connect.
    pub cluster_id: u64,
    /// Where this node listens. Outgoing connections are made from its IP address too.
    pub listen: SocketAddr,
    /// Where each peer listens.
    pub peers: BTreeMap<NodeId, SocketAddr>,
    /// Receive slots per connection (the credit window).
    pub recv_slots: usize,
    /// Outstanding operations (writes and sends) per connection.
    pub queue_depth: usize,
    /// Accept connections only once a region has been advertised (see
    /// [`crate::rdma::RdmaConfig::accept_only_after_advertise`]).
    pub accept_only_after_advertise: bool,
    /// The cluster secret; see [`crate::admission`].
    pub secret: Option<Arc<Vec<u8>>>,
    /// How long a connected peer has to prove itself before it is dropped.
    pub admission_timeout: Duration,
    /// How long a dial (TCP connect and hello) may take; an incoming connection that says
    /// nothing for this long is dropped.
    pub connect_timeout: Duration,
    /// How long an operation may stay unacknowledged before the peer counts as dead
    /// (`RetryExceeded`). Also the socket's `TCP_USER_TIMEOUT`.
    pub dead_peer_timeout: Duration,
    /// The keepalive period (whole seconds, at least 1: the kernel's unit). A link that
    /// received nothing for a period is probed by the kernel (`SO_KEEPALIVE`), and one whose
    /// probes go unanswered for `dead_peer_timeout` fails: a peer whose machine died, or
    /// whose cable was cut, is found on an idle link too, where no operation is outstanding
    /// for `dead_peer_timeout` to judge.
    pub keepalive: Duration,
    /// TLS on every peer link (see [`crate::tls`] for what it protects); `None`: plain TCP.
    /// Both ends of a link must agree: a plain peer is refused by a TLS one and the other way
    /// round, with an error that says so.
    pub tls: Option<PeerTls>,
}

impl TcpConfig {
    /// The dead-peer bound an RDMA queue pair with this local ACK timeout exponent and retry
    /// count has ([`verbs::dead_peer_bound`], nominal), so that one setting means the same
    /// on both transports.
    pub fn dead_peer_from_qp(timeout: u8, retry_cnt: u8) -> Duration {
        verbs::dead_peer_bound(timeout, retry_cnt).nominal
    }

    /// Defaults: 16 receive slots, 256 outstanding operations, a 1 s dead-peer bound.
    pub fn new(
        node: NodeId,
        cluster_id: u64,
        listen: SocketAddr,
        peers: BTreeMap<NodeId, SocketAddr>,
    ) -> Self {
        TcpConfig {
            node,
            cluster_id,
            listen,
            peers,
            recv_slots: 16,
            queue_depth: 256,
            accept_only_after_advertise: true,
            secret: None,
            admission_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(2),
            dead_peer_timeout: Duration::from_secs(1),
            keepalive: Duration::from_secs(1),
            tls: None,
        }
    }
}

/// Memory allocated by this back-end (page-aligned words; shared-memory files for
/// [`Fabric::alloc_persistent`]). Any [`Memory`] can be registered here, since the I/O thread
/// places writes through the words.
pub type TcpMemory = WordMemory;

/// The kernel's keepalive for a period: the first probe after `period` without receiving
/// anything, then one a period; `TCP_USER_TIMEOUT` (the dead-peer timeout), when set, decides
/// when unanswered probes fail the socket, else the count. Whole seconds, at least one.
fn keepalive(period: Duration) -> socket2::TcpKeepalive {
    let secs = Duration::from_secs(period.as_secs_f64().ceil().max(1.0) as u64);
    socket2::TcpKeepalive::new()
        .with_time(secs)
        .with_interval(secs)
        .with_retries(3)
}

fn setup_err(reason: String) -> FabricError {
    FabricError::Setup { reason }
}

// ---------------------------------------------------------------------------------------------
// Frames

fn frame_header(out: &mut Vec<u8>, kind: u8, body: usize) {
    out.extend_from_slice(&(body as u32).to_le_bytes());
    out.extend_from_slice(&[kind, 0, 0, 0]);
}

/// What a hello says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Hello {
    version: u32,
    recv_credits: u32,
    cluster_id: u64,
    node: NodeId,
    region: Option<RemoteRegion>,
}

impl Hello {
    fn encode(&self, out: &mut Vec<u8>) {
        frame_header(out, K_HELLO, HELLO_BODY);
        let r = self.region.unwrap_or(RemoteRegion {
            addr: 0,
            rkey: 0,
            len_bytes: 0,
        });
        out.extend_from_slice(&MAGIC.to_le_bytes());
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&self.recv_credits.to_le_bytes());
        out.extend_from_slice(&self.cluster_id.to_le_bytes());
        out.extend_from_slice(&self.node.0.to_le_bytes());
        out.extend_from_slice(&r.addr.to_le_bytes());
        out.extend_from_slice(&r.len_bytes.to_le_bytes());
        out.extend_from_slice(&r.rkey.to_le_bytes());
        out.extend_from_slice(&[0; 4]);
    }

    fn decode(body: &[u8]) -> Result<Hello, String> {
        if body.len() != HELLO_BODY || u64_at(body, 0) != MAGIC {
            return Err("the peer does not speak rdmalog's TCP protocol".into());
        }
        let (addr, len_bytes, rkey) = (u64_at(body, 32), u64_at(body, 40), u32_at(body, 48));
        Ok(Hello {
            version: u32_at(body, 8),
            recv_credits: u32_at(body, 12),
            cluster_id: u64_at(body, 16),
            node: NodeId(u64_at(body, 24)),
            region: (len_bytes > 0).then_some(RemoteRegion {
                addr,
                rkey,
                len_bytes,
            }),
        })
    }
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

// ---------------------------------------------------------------------------------------------
// Shared state between the owner and the I/O thread

/// Buffers for frames and messages, reused so the steady state allocates nothing.
#[derive(Debug, Default)]
struct Pool(Mutex<Vec<Vec<u8>>>);

impl Pool {
    fn take(&self) -> Vec<u8> {
        let mut v = lock(&self.0).pop().unwrap_or_default();
        v.clear();
        v
    }

    fn give(&self, v: Vec<u8>) {
        let mut p = lock(&self.0);
        if p.len() < POOL_LIMIT && v.capacity() > 0 {
            p.push(v);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Frames written but not yet taken by the socket.
#[derive(Debug, Default)]
struct Out {
    pending: VecDeque<Vec<u8>>,
    /// Bytes of the front frame already written.
    head: usize,
    closed: bool,
}

/// One TCP connection, shared by the owner (it sends frames) and the I/O thread (it reads,
/// places writes, acknowledges, and flushes what the socket did not take at once).
struct Link {
    id: u64,
    stream: TcpStream,
    out: Mutex<Out>,
    /// The TLS session when the link is encrypted: both threads write through it, so it is
    /// shared too. Locked after `out` when both are held, never before.
    tls: Option<Mutex<rustls::Connection>>,
    /// Whether the peer may write into our registered memory over this connection. Held
    /// while a write is placed, so a revoke waits for a placement in progress.
    grant: Mutex<bool>,
    /// The peer's cumulative grant of receive slots to us.
    peer_grant: AtomicU64,
    /// When (ns after `Shared::epoch`) the last I/O pass began after which this socket was
    /// read to empty: every byte the peer's had arrived by then has been read, and what it
    /// carried is in the owner's channel. The owner judges the peer dead only by an ack
    /// missing from such a pass, so a stall of this process (SIGSTOP, a long pause) that left
    /// the acks unread in the kernel cannot make a live peer look dead; and, being this
    /// link's own, another peer that floods (its socket always left with bytes at the read
    /// budget) cannot hold the verdict on this one back.
    read_through: AtomicU64,
    pool: Arc<Pool>,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("id", &self.id)
            .field("stream", &self.stream)
            .field("tls", &self.tls.is_some())
            .finish_non_exhaustive()
    }
}

/// How a failed TLS session is reported: the handshake's failures usually mean the two ends
/// are configured differently.
fn tls_error(handshaking: bool, e: rustls::Error) -> io::Error {
    let why = if handshaking || matches!(e, rustls::Error::AlertReceived(_)) {
        format!(
            "TLS handshake failed: {e} (do both ends have peer TLS, with certificates from the same CA?)"
        )
    } else {
        format!("TLS: {e}")
    };
    io::Error::new(io::ErrorKind::InvalidData, why)
}

/// What a write to the socket means for a flush: go on with the bytes it took (0 after an
/// interrupted call), or stop: `Ok` when the socket is full, an error when the link is closed
/// (`out` is marked so).
fn socket_took(out: &mut Out, written: io::Result<usize>) -> ControlFlow<io::Result<()>, usize> {
    match written {
        Ok(0) => {
            out.closed = true;
            ControlFlow::Break(Err(io::ErrorKind::WriteZero.into()))
        }
        Ok(n) => ControlFlow::Continue(n),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => ControlFlow::Break(Ok(())),
        Err(e) if e.kind() == io::ErrorKind::Interrupted => ControlFlow::Continue(0),
        Err(e) => {
            out.closed = true;
            ControlFlow::Break(Err(e))
        }
    }
}

/// Whether `bytes` start like a TLS record (a handshake or an alert), which a plain peer link
/// receives when the peer speaks TLS.
fn looks_like_tls(bytes: &[u8]) -> bool {
    bytes.len() >= 3
        && matches!(bytes[0], 0x15 | 0x16)
        && bytes[1] == 0x03
        && (1..=4).contains(&bytes[2])
}

impl Link {
    /// Queues `frame` behind what is pending and writes as much as the socket takes.
    fn send(&self, frame: Vec<u8>) -> io::Result<()> {
        let mut out = lock(&self.out);
        if out.closed {
            self.pool.give(frame);
            return Err(io::ErrorKind::NotConnected.into());
        }
        out.pending.push_back(frame);
        if out.pending.len() == 1 {
            self.flush_locked(&mut out)
        } else {
            Ok(())
        }
    }

    /// Writes pending frames until the socket would block.
    fn flush(&self) -> io::Result<()> {
        let mut out = lock(&self.out);
        self.flush_locked(&mut out)
    }

    fn flush_locked(&self, out: &mut Out) -> io::Result<()> {
        if let Some(tls) = &self.tls {
            return self.flush_tls(out, &mut lock(tls));
        }
        while let Some(front) = out.pending.front() {
            match socket_took(out, (&self.stream).write(&front[out.head..])) {
                ControlFlow::Continue(n) => self.taken(out, n),
                ControlFlow::Break(r) => return r,
            }
        }
        Ok(())
    }

    /// Moves pending frames into the TLS session and its records into the socket, until the
    /// socket would block. Before the handshake completes the session buffers what it can
    /// take; the rest waits for the read that completes it (see [`Link::read`]).
    fn flush_tls(&self, out: &mut Out, tls: &mut rustls::Connection) -> io::Result<()> {
        loop {
            while tls.wants_write() {
                if let ControlFlow::Break(r) = socket_took(out, tls.write_tls(&mut &self.stream)) {
                    return r;
                }
            }
            let Some(front) = out.pending.front() else {
                return Ok(());
            };
            let n = tls.writer().write(&front[out.head..])?;
            if n == 0 {
                return Ok(()); // the session's buffer is full until the handshake completes
            }
            self.taken(out, n);
        }
    }

    /// Accounts `n` more bytes of the front frame as written.
    fn taken(&self, out: &mut Out, n: usize) {
        if n == 0 {
            return;
        }
        out.head += n;
        if out.head == out.pending.front().map_or(0, Vec::len) {
            out.head = 0;
            let done = out.pending.pop_front().expect("front exists");
            self.pool.give(done);
        }
    }

    /// Reads the peer's bytes (the plaintext, under TLS): `Ok(0)` when the peer closed.
    fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        let Some(tls) = &self.tls else {
            return (&self.stream).read(buf);
        };
        let (got, reply) = {
            let mut tls = lock(tls);
            let got = loop {
                match tls.reader().read(buf) {
                    Ok(n) => break Ok(n),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => break Err(e),
                }
                match tls.read_tls(&mut &self.stream) {
                    Ok(0) => break Ok(0),
                    Ok(_) => {
                        let handshaking = tls.is_handshaking();
                        if let Err(e) = tls.process_new_packets() {
                            break Err(tls_error(handshaking, e));
                        }
                    }
                    Err(e) => break Err(e),
                }
            };
            // Handshake messages, buffered frames once it completes, or an alert.
            (got, tls.wants_write())
        };
        if reply {
            let flushed = self.flush();
            if got.is_ok() {
                flushed?;
            }
        }
        got
    }

    /// Closes both directions: the I/O thread sees the end and forgets the socket. The
    /// grant goes first, under the lock a placement holds: frames the
    /// peer sent before the close may still be read from the socket, and none of their
    /// writes may land once the owner is told the connection is gone.
    fn close(&self) {
        // `closed` first: a placement the revoke stops then sends no negative
        // acknowledgement (the writer sees `Flushed`, not a fencing's `RemoteAccess`).
        lock(&self.out).closed = true;
        *lock(&self.grant) = false;
        if let Some(tls) = &self.tls {
            let mut tls = lock(tls);
            tls.send_close_notify();
            let _ = tls.write_tls(&mut &self.stream);
        }
        let _ = self.stream.shutdown(Shutdown::Both);
    }
}

/// A registered region as the I/O thread sees it.
#[derive(Debug)]
struct IoRegion {
    remote: RemoteRegion,
    memory: Arc<dyn Memory>,
}

/// What the owner and the I/O thread share.
#[derive(Debug)]
struct Shared {
    regions: RwLock<Vec<IoRegion>>,
    advertised: Mutex<Option<RemoteRegion>>,
    pool: Arc<Pool>,
    wait: Arc<TcpWaiter>,
    /// What links' `read_through` and `stall_io_until` count from.
    epoch: Instant,
    /// Test-only: the I/O thread makes no pass before this time (ns after `epoch`; 0: none).
    stall_io_until: AtomicU64,
}

impl Shared {
    fn since_epoch(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.epoch).as_nanos() as u64
    }

    fn at(&self, ns: u64) -> Instant {
        self.epoch + Duration::from_nanos(ns)
    }
}

/// Sleeps the owner until the I/O thread reports something.
#[derive(Debug, Default)]
pub struct TcpWaiter {
    woken: Mutex<bool>,
    cv: Condvar,
}

impl Waiter for TcpWaiter {
    fn arm(&self) -> Result<(), FabricError> {
        *lock(&self.woken) = false;
        Ok(())
    }

    fn wait(&self, timeout: Duration) -> Result<bool, FabricError> {
        let g = lock(&self.woken);
        let (g, _) = self
            .cv
            .wait_timeout_while(g, timeout, |w| !*w)
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Ok(*g)
    }

    fn wake(&self) {
        *lock(&self.woken) = true;
        self.cv.notify_all();
    }
}

/// What the I/O thread reports to the owner, in the order it happened on each connection.
#[derive(Debug)]
enum IoEvent {
    Up {
        link: Arc<Link>,
        hello: Hello,
        outgoing: bool,
    },
    DialFailed {
        peer: NodeId,
        why: String,
    },
    Recv {
        link: u64,
        bytes: Vec<u8>,
    },
    Control {
        link: u64,
        bytes: Vec<u8>,
    },
    Acked {
        link: u64,
        upto: u64,
    },
    Nak {
        link: u64,
        seq: u64,
        status: WcStatus,
    },
    Down {
        link: u64,
        why: String,
        reason: DisconnectReason,
    },
}

enum Cmd {
    Dial(NodeId, SocketAddr),
}

// ---------------------------------------------------------------------------------------------
// The owner's side

#[derive(Debug)]
struct Inflight {
    /// The sequence number of the operation's last frame on its connection.
    seq: u64,
    wr_id: u64,
    op: WcOp,
    signaled: bool,
    posted: Instant,
}

#[derive(Debug)]
struct Conn {
    link: Arc<Link>,
    inflight: VecDeque<Inflight>,
    /// Frames counted by the peer (writes and sends) sent so far.
    next_seq: u64,
    /// The peer's receive slots: its cumulative grant (from [`Link::peer_grant`]) and our
    /// sends.
    credits: SendCredits,
    /// Our cumulative grant of receive slots: the slots plus every repost.
    granted: u64,
    /// How much of it the peer was told.
    told: Grant,
    outgoing: bool,
    admission: Admission,
    region: Option<RemoteRegion>,
}

#[derive(Debug)]
struct IoThread {
    tx: Sender<Cmd>,
    waker: Arc<mio::Waker>,
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl Drop for IoThread {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        let _ = self.waker.wake();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// One node's TCP endpoint.
#[derive(Debug)]
pub struct TcpEndpoint {
    cfg: TcpConfig,
    conns: Conns<Conn>,
    /// Link id to connection, for the links adopted.
    links: HashMap<u64, Key>,
    inboxes: BTreeMap<NodeId, Inbox>,
    connecting: BTreeMap<NodeId, ()>,
    last_errors: BTreeMap<NodeId, String>,
    refusals: u64,
    /// Scratch for `poll`: (link id, its `read_through`) of links with operations outstanding.
    marks: Vec<(u64, u64)>,
    events: Events,
    locals: Vec<Arc<dyn Memory>>,
    shared: Arc<Shared>,
    rx: Receiver<IoEvent>,
    io: IoThread,
}

impl TcpEndpoint {
    /// Test-only: the I/O thread makes no pass (reads, writes nothing) for `d` from its next
    /// pass on, as when this process is stopped while its peers go on; the owner's thread
    /// is not stalled.
    #[doc(hidden)]
    pub fn stall_io_for_test(&self, d: Duration) {
        let until = self.shared.since_epoch(Instant::now() + d).max(1);
        self.shared.stall_io_until.store(until, Ordering::Release);
    }

    /// Binds the listener and starts the I/O thread.
    pub fn open(cfg: TcpConfig) -> Result<TcpEndpoint, FabricError> {
        if cfg.recv_slots < 1 || cfg.queue_depth < 1 {
            return Err(setup_err(
                "recv_slots and queue_depth must be at least 1".into(),
            ));
        }
        let listener = TcpListener::bind(cfg.listen)
            .map_err(|e| setup_err(format!("cannot listen on {}: {e}", cfg.listen)))?;
        let poll = Poll::new().map_err(|e| setup_err(format!("cannot create a poll: {e}")))?;
        let waker = Arc::new(
            mio::Waker::new(poll.registry(), WAKER)
                .map_err(|e| setup_err(format!("cannot create a waker: {e}")))?,
        );
        let shared = Arc::new(Shared {
            regions: RwLock::new(Vec::new()),
            advertised: Mutex::new(None),
            pool: Arc::new(Pool::default()),
            wait: Arc::new(TcpWaiter::default()),
            epoch: Instant::now(),
            stall_io_until: AtomicU64::new(0),
        });
        let (cmd_tx, cmd_rx) = mpsc::channel();
        let (ev_tx, ev_rx) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let mut io = Io {
            poll,
            listener,
            cfg: cfg.clone(),
            shared: shared.clone(),
            cmds: cmd_rx,
            tx: ev_tx,
            stop: stop.clone(),
            conns: HashMap::new(),
            next_id: 1,
            notify: false,
            unread: Vec::new(),
        };
        io.poll
            .registry()
            .register(&mut io.listener, LISTENER, Interest::READABLE)
            .map_err(|e| setup_err(format!("cannot poll the listener: {e}")))?;
        let handle = std::thread::Builder::new()
            .name(format!("rdmalog-tcp-{}", cfg.node.0))
            .spawn(move || io.run())
            .map_err(|e| setup_err(format!("cannot start the I/O thread: {e}")))?;
        Ok(TcpEndpoint {
            cfg,
            conns: Conns::default(),
            links: HashMap::new(),
            inboxes: BTreeMap::new(),
            connecting: BTreeMap::new(),
            last_errors: BTreeMap::new(),
            refusals: 0,
            marks: Vec::new(),
            events: Events::default(),
            locals: Vec::new(),
            shared,
            rx: ev_rx,
            io: IoThread {
                tx: cmd_tx,
                waker,
                stop,
                handle: Some(handle),
            },
        })
    }

    /// Why the last connect to `peer` failed, if it did: for logs and status pages.
    pub fn last_connect_error(&self, peer: NodeId) -> Option<&str> {
        self.last_errors.get(&peer).map(String::as_str)
    }

    /// Whether a dial to `peer` is still in flight.
    pub fn dialing(&self, peer: NodeId) -> bool {
        self.connecting.contains_key(&peer)
    }

    /// How many connected peers were refused admission.
    pub fn refusals(&self) -> u64 {
        self.refusals
    }

    /// Breaks the connection `key`. A current one reports its first failure, flushes
    /// everything else outstanding and is reported disconnected; a challenger was never
    /// reported, so it goes silently. A current one takes the peer's challenger with it.
    fn break_conn(&mut self, key: Key, first: Option<WcStatus>, reason: DisconnectReason) {
        let Some(mut c) = self.conns.remove(key) else {
            return;
        };
        let peer = key.peer;
        c.link.close();
        self.links.remove(&c.link.id);
        if !key.is_current() {
            tracing::debug!(%peer, "dropped a second connection before its proof");
            return;
        }
        let mut status = first;
        for f in c.inflight.drain(..) {
            let s = status.take().unwrap_or(WcStatus::Flushed);
            self.events.push(Event::Completion(Completion {
                peer,
                wr_id: f.wr_id,
                op: f.op,
                status: s,
                byte_len: 0,
            }));
        }
        self.events.forget_receives(peer);
        if let Some(inbox) = self.inboxes.get_mut(&peer) {
            inbox.clear();
        }
        self.events.push(Event::Disconnected { peer, reason });
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
        self.links.insert(c.link.id, Key::current(peer));
        self.conns.insert(Key::current(peer), c);
    }

    /// Refuses a connection that failed admission. A refused challenger leaves the peer's
    /// current connection as it was.
    fn refuse(&mut self, key: Key, why: &str) {
        let peer = key.peer;
        let why = key.refusal(why);
        tracing::warn!(%peer, why, "refused a peer");
        self.last_errors.insert(peer, why);
        self.refusals += 1;
        self.break_conn(key, None, DisconnectReason::Refused);
    }

    /// The connection to `peer`, if an operation may be posted on it now: announced, admitted
    /// and with room in its queue.
    fn postable(&mut self, peer: NodeId) -> Result<&mut Conn, FabricError> {
        if !self.usable(peer) {
            return Err(FabricError::NotConnected { peer });
        }
        let depth = self.cfg.queue_depth;
        let c = self.conns.get_mut(peer).expect("usable");
        if c.inflight.len() >= depth {
            return Err(FabricError::QueueFull { peer, depth });
        }
        Ok(c)
    }

    fn usable(&self, peer: NodeId) -> bool {
        self.conns.get(peer).is_some_and(|c| c.admission.admitted())
            && !self.events.unannounced(peer)
    }

    fn adopt(&mut self, link: Arc<Link>, hello: Hello, outgoing: bool) {
        let peer = hello.node;
        if outgoing {
            self.connecting.remove(&peer);
        }
        let held = self.conns.get(peer).map(|c| dial::Held {
            outgoing: c.outgoing,
            age: c.admission.since().elapsed(),
            admitted: c.admission.admitted(),
        });
        if dial::keep(self.cfg.node, peer, held, outgoing) == dial::Keep::Held {
            tracing::debug!(%peer, "dropping a duplicate connection");
            link.close();
            return;
        }
        let key = if dial::must_prove_first(held, self.cfg.secret.is_some()) {
            // Held beside the admitted one until it proves the secret; a challenger before it
            // is dropped (the newest dial is the one a restarted peer waits on).
            self.break_conn(Key::challenger(peer), None, DisconnectReason::PeerReset);
            Key::challenger(peer)
        } else {
            // The current one's break drops a challenger too.
            self.break_conn(Key::current(peer), None, DisconnectReason::PeerReset);
            Key::current(peer)
        };
        link.peer_grant
            .store(u64::from(hello.recv_credits), Ordering::Release);
        let slots = self.cfg.recv_slots as u64;
        let secret = self.cfg.secret.clone();
        let mut c = Conn {
            link: link.clone(),
            inflight: VecDeque::new(),
            next_seq: 0,
            credits: SendCredits::new(u64::from(hello.recv_credits)),
            granted: slots,
            told: Grant::new(slots),
            outgoing,
            admission: Admission::new(secret.as_deref().map(Vec::as_slice)),
            region: hello.region,
        };
        let challenge = if secret.is_some() {
            match c.admission.challenge() {
                Ok(m) => Some(m),
                Err(e) => {
                    tracing::error!(%peer, error = %e, "dropping the connection");
                    link.close();
                    if key.is_current() {
                        self.events.push(Event::Disconnected {
                            peer,
                            reason: DisconnectReason::Refused,
                        });
                    }
                    return;
                }
            }
        } else {
            None
        };
        self.links.insert(link.id, key);
        self.conns.insert(key, c);
        if key.is_current() {
            let inbox = self
                .inboxes
                .entry(peer)
                .or_insert_with(|| Inbox::new(slots as usize, 0));
            inbox.clear();
        }
        match challenge {
            None => self.events.announce(peer, hello.region),
            Some(msg) => {
                // A failed send means the link is closed: the I/O thread failed it (a peer
                // that wrote right after its hello), and its `Down`, with the reason, follows
                // this `Up`; or the socket failed, which the I/O thread sees too. Either way
                // the connection ends through `Down`, or at the admission deadline.
                let _ = self.send_frame(key, K_CONTROL, &msg);
            }
        }
    }

    /// Sends a frame of `kind` (send, control or credit) carrying `msg`, with our grant.
    fn send_frame(&mut self, key: Key, kind: u8, msg: &[u8]) -> io::Result<()> {
        let c = self.conns.at_mut(key).ok_or(io::ErrorKind::NotConnected)?;
        let mut f = self.shared.pool.take();
        match kind {
            K_SEND | K_CREDIT => {
                frame_header(&mut f, kind, SEND_HEAD + msg.len());
                f.extend_from_slice(&c.granted.to_le_bytes());
                c.told.told(c.granted);
            }
            _ => frame_header(&mut f, kind, msg.len()),
        }
        f.extend_from_slice(msg);
        c.link.send(f)
    }

    fn maybe_send_credit(&mut self, peer: NodeId) {
        let Some(c) = self.conns.get(peer) else {
            return;
        };
        if c.told.update_due(c.granted, self.cfg.recv_slots) {
            let _ = self.send_frame(Key::current(peer), K_CREDIT, &[]);
        }
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
                // A failed send means a closed link: its `Down` (with the reason) follows,
                // as in `adopt`.
                let _ = self.send_frame(key, K_CONTROL, &out);
            }
            ControlOutcome::Admitted => {
                let remote = c.region;
                if !key.is_current() {
                    // The peer proved it: its newest connection replaces the one in use,
                    // which the owner sees end before this one is reported.
                    tracing::info!(%peer, "a second connection proved the secret; it replaces the first");
                    self.promote(peer);
                }
                self.events.announce(peer, remote);
            }
            ControlOutcome::Nothing => {}
            ControlOutcome::Refuse(why) => self.refuse(key, why),
        }
    }

    fn on_acked(&mut self, key: Key, upto: u64) {
        let peer = key.peer;
        let Some(c) = self.conns.at_mut(key) else {
            return;
        };
        while c.inflight.front().is_some_and(|f| f.seq <= upto) {
            let f = c.inflight.pop_front().expect("front exists");
            if f.signaled {
                self.events.push(Event::Completion(Completion {
                    peer,
                    wr_id: f.wr_id,
                    op: f.op,
                    status: WcStatus::Success,
                    byte_len: 0,
                }));
            }
        }
    }

    fn on_io(&mut self, ev: IoEvent) {
        let peer_of = |s: &Self, link: u64| s.links.get(&link).copied();
        match ev {
            IoEvent::Up {
                link,
                hello,
                outgoing,
            } => self.adopt(link, hello, outgoing),
            IoEvent::DialFailed { peer, why } => {
                tracing::info!(%peer, why, "connect failed");
                self.connecting.remove(&peer);
                self.last_errors.insert(peer, why);
                if self.conns.get(peer).is_none() {
                    self.events.push(Event::Disconnected {
                        peer,
                        reason: DisconnectReason::Unreachable,
                    });
                }
            }
            IoEvent::Recv { link, bytes } => {
                let Some(key) = peer_of(self, link) else {
                    self.shared.pool.give(bytes);
                    return;
                };
                let peer = key.peer;
                if !self.conns.at(key).is_some_and(|c| c.admission.admitted()) {
                    self.shared.pool.give(bytes);
                    self.refuse(
                        key,
                        "it sent data before proving it knows the cluster secret",
                    );
                    return;
                }
                let mut bytes = bytes;
                let len = bytes.len() as u32;
                let inbox = self.inboxes.entry(peer).or_default();
                let Some(slot) = inbox.put(&mut bytes) else {
                    self.shared.pool.give(bytes);
                    tracing::warn!(%peer, "a message beyond the granted credits; dropping the connection");
                    self.break_conn(
                        key,
                        None,
                        DisconnectReason::Failed(WcStatus::RnrRetryExceeded),
                    );
                    return;
                };
                // `bytes` is now the slot's old buffer.
                self.shared.pool.give(bytes);
                self.events.push(Event::Completion(Completion {
                    peer,
                    wr_id: slot,
                    op: WcOp::Recv,
                    status: WcStatus::Success,
                    byte_len: len,
                }));
            }
            IoEvent::Control { link, bytes } => {
                if let Some(key) = peer_of(self, link) {
                    self.handle_control(key, &bytes);
                }
                self.shared.pool.give(bytes);
            }
            IoEvent::Acked { link, upto } => {
                if let Some(key) = peer_of(self, link) {
                    self.on_acked(key, upto);
                }
            }
            IoEvent::Nak { link, seq, status } => {
                let Some(key) = peer_of(self, link) else {
                    return;
                };
                if !self.conns.at(key).is_some_and(|c| c.admission.admitted()) {
                    // Nothing is written to a peer before admission: a protocol violation.
                    self.refuse(
                        key,
                        "it refused a write before proving it knows the cluster secret",
                    );
                    return;
                }
                // Frames before the refused one were placed (the peer handles them in order).
                self.on_acked(key, seq - 1);
                self.break_conn(key, Some(status), DisconnectReason::Failed(status));
            }
            IoEvent::Down { link, why, reason } => {
                let Some(key) = peer_of(self, link) else {
                    return;
                };
                let peer = key.peer;
                let Some(c) = self.conns.at(key) else {
                    return;
                };
                if !c.admission.admitted()
                    && reason == DisconnectReason::Failed(WcStatus::RemoteAccess)
                {
                    // The I/O thread refused what an unproven peer sent: a write (it has no
                    // grant before admission) or a malformed frame.
                    self.refuse(
                        key,
                        &format!("{why}, before proving it knows the cluster secret"),
                    );
                    return;
                }
                tracing::info!(%peer, why, "connection lost");
                let first = (!c.inflight.is_empty()).then_some(WcStatus::RetryExceeded);
                self.break_conn(key, first, reason);
            }
        }
    }

    fn post(&mut self, peer: NodeId, op: Inflight) {
        if let Some(c) = self.conns.get_mut(peer) {
            c.inflight.push_back(op);
        }
    }
}

impl Fabric for TcpEndpoint {
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
        let mut key = [0u8; 4];
        getrandom::fill(&mut key).map_err(|e| FabricError::Register {
            len_bytes,
            reason: format!("no randomness for a region key: {e}"),
        })?;
        let id = self.locals.len() as u32;
        // Addresses are names, not pointers: region i starts at (i + 1) << 40.
        let remote = RemoteRegion {
            addr: u64::from(id + 1) << 40,
            rkey: u32::from_le_bytes(key),
            len_bytes,
        };
        self.shared
            .regions
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(IoRegion {
                remote,
                memory: memory.clone(),
            });
        self.locals.push(memory);
        Ok((LocalRegion { id, len_bytes }, remote))
    }

    fn advertise(&mut self, region: RemoteRegion) {
        *lock(&self.shared.advertised) = Some(region);
    }

    fn connect(&mut self, peer: NodeId) -> Result<(), FabricError> {
        if self.conns.get(peer).is_some() || self.connecting.contains_key(&peer) {
            return Ok(());
        }
        let addr = *self
            .cfg
            .peers
            .get(&peer)
            .ok_or(FabricError::UnknownPeer { peer })?;
        self.connecting.insert(peer, ());
        self.io
            .tx
            .send(Cmd::Dial(peer, addr))
            .map_err(|_| FabricError::NodeDown {
                node: self.cfg.node,
            })?;
        let _ = self.io.waker.wake();
        Ok(())
    }

    fn disconnect(&mut self, peer: NodeId) {
        // Every connection to the peer (the current one's break drops a challenger too).
        self.break_conn(Key::current(peer), None, DisconnectReason::Closed);
    }

    fn conn_state(&self, peer: NodeId) -> ConnState {
        if self.usable(peer) {
            ConnState::Up
        } else if self.conns.get(peer).is_some() || self.connecting.contains_key(&peer) {
            ConnState::Connecting
        } else {
            ConnState::Down
        }
    }

    fn post_write(&mut self, peer: NodeId, wr: WriteRequest) -> Result<(), FabricError> {
        let end = wr.local_offset + wr.len_bytes;
        let mem = self
            .locals
            .get(wr.local.id as usize)
            .filter(|m| end <= m.words().len() as u64 * 8)
            .ok_or(FabricError::LocalRange {
                id: wr.local.id,
                offset: wr.local_offset,
                end,
            })?
            .clone();
        let pool = self.shared.pool.clone();
        let c = self.postable(peer)?;
        let mut done = 0u64;
        loop {
            let n = (wr.len_bytes - done).min(WRITE_CHUNK_BYTES as u64);
            let mut f = pool.take();
            frame_header(&mut f, K_WRITE, WRITE_HEAD + n as usize);
            f.extend_from_slice(&c.granted.to_le_bytes());
            f.extend_from_slice(&wr.remote.rkey.to_le_bytes());
            f.extend_from_slice(&[0; 4]);
            f.extend_from_slice(&(wr.remote.addr + wr.remote_offset + done).to_le_bytes());
            let at = f.len();
            f.resize(at + n as usize, 0);
            crate::read_bytes(mem.as_ref(), wr.local_offset + done, &mut f[at..]);
            c.told.told(c.granted);
            c.next_seq += 1;
            // A send failure shows as the connection's end (the I/O thread reports it), which
            // fails this write with everything else outstanding.
            let _ = c.link.send(f);
            done += n;
            if done >= wr.len_bytes {
                break;
            }
        }
        let seq = c.next_seq;
        self.post(
            peer,
            Inflight {
                seq,
                wr_id: wr.wr_id,
                op: WcOp::Write,
                signaled: wr.signaled,
                posted: Instant::now(),
            },
        );
        Ok(())
    }

    fn post_send(&mut self, peer: NodeId, wr_id: u64, msg: &[u8]) -> Result<(), FabricError> {
        if msg.len() > MAX_MESSAGE_BYTES || msg.is_empty() {
            return Err(FabricError::MessageTooLarge {
                len: msg.len(),
                max: MAX_MESSAGE_BYTES,
            });
        }
        let c = self.postable(peer)?;
        c.credits.update(c.link.peer_grant.load(Ordering::Acquire));
        if c.credits.take().is_err() {
            return Err(FabricError::NoCredit { peer });
        }
        c.next_seq += 1;
        let seq = c.next_seq;
        let _ = self.send_frame(Key::current(peer), K_SEND, msg);
        self.post(
            peer,
            Inflight {
                seq,
                wr_id,
                op: WcOp::Send,
                signaled: true,
                posted: Instant::now(),
            },
        );
        Ok(())
    }

    fn send_credits(&self, peer: NodeId) -> u32 {
        if !self.usable(peer) {
            return 0;
        }
        let c = self.conns.get(peer).expect("usable");
        if c.inflight.len() >= self.cfg.queue_depth {
            return 0;
        }
        let mut credits = c.credits;
        credits.update(c.link.peer_grant.load(Ordering::Acquire));
        credits.available().min(u64::from(u32::MAX)) as u32
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
            c.granted += 1;
        }
        self.maybe_send_credit(peer);
        Ok(())
    }

    fn set_remote_write(&mut self, peer: NodeId, allowed: bool) -> Result<(), FabricError> {
        match self.conns.get(peer).filter(|c| c.admission.admitted()) {
            Some(c) => {
                // Waits for a write being placed; none is placed after a revoke returns.
                *lock(&c.link.grant) = allowed;
                Ok(())
            }
            None if !allowed => Ok(()),
            None => Err(FabricError::NotConnected { peer }),
        }
    }

    fn waiter(&self) -> Option<Arc<dyn Waiter>> {
        Some(self.shared.wait.clone())
    }

    fn poll(&mut self, out: &mut [Event]) -> usize {
        // Taken before the channel is drained: what the I/O thread read of a link by its
        // mark is in the channel. Only links with operations outstanding are judged.
        let mut marks = std::mem::take(&mut self.marks);
        marks.clear();
        marks.extend(
            self.conns
                .iter()
                .map(|(_, c)| c)
                .filter(|c| !c.inflight.is_empty())
                .map(|c| (c.link.id, c.link.read_through.load(Ordering::Acquire))),
        );
        while let Ok(ev) = self.rx.try_recv() {
            self.on_io(ev);
        }
        let admission = self.cfg.admission_timeout;
        let dead = self.cfg.dead_peer_timeout;
        let mut late = Vec::new();
        let mut silent = Vec::new();
        for (key, c) in self.conns.iter() {
            if c.admission.overdue(admission) {
                late.push(key);
            } else if let Some(f) = c.inflight.front()
                && let Some(&(_, mark)) = marks.iter().find(|(link, _)| *link == c.link.id)
                && f.posted + dead < self.shared.at(mark)
            {
                silent.push(key);
            }
        }
        self.marks = marks;
        for key in late {
            self.refuse(key, "it did not prove it knows the cluster secret in time");
        }
        for key in silent {
            let peer = key.peer;
            tracing::info!(%peer, timeout_ms = dead.as_millis() as u64, "an operation was not acknowledged in time: the peer counts as dead");
            self.break_conn(
                key,
                Some(WcStatus::RetryExceeded),
                DisconnectReason::Failed(WcStatus::RetryExceeded),
            );
        }
        self.events.drain_into(out)
    }
}

impl Drop for TcpEndpoint {
    fn drop(&mut self) {
        for (_, c) in self.conns.iter() {
            c.link.close();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The I/O thread

#[derive(Debug)]
enum Phase {
    /// A dial waiting for its TCP connect.
    Dialing { peer: NodeId, deadline: Instant },
    /// Waiting for the peer's hello (`peer` is known for a dial).
    Hello {
        peer: Option<NodeId>,
        deadline: Instant,
    },
    /// Handed to the owner.
    Up,
    /// Refused or failed: reading and discarding until the peer closes.
    Draining { deadline: Instant },
}

struct IoConn {
    link: Arc<Link>,
    phase: Phase,
    rbuf: Vec<u8>,
    filled: usize,
    /// Writes and sends received (their sequence numbers start at 1).
    received: u64,
    acked: u64,
}

struct Io {
    poll: Poll,
    listener: TcpListener,
    cfg: TcpConfig,
    shared: Arc<Shared>,
    cmds: Receiver<Cmd>,
    tx: Sender<IoEvent>,
    stop: Arc<AtomicBool>,
    conns: HashMap<u64, IoConn>,
    next_id: u64,
    notify: bool,
    /// Connections whose read stopped at the budget with bytes left: read again on the next
    /// pass (edge-triggered polling will not report them again).
    unread: Vec<u64>,
}

/// What handling a frame leads to.
enum Next {
    Continue,
    /// Stop reading this connection: report and drain.
    Fail(String, DisconnectReason),
}

impl Io {
    fn run(mut self) {
        let mut events = mio::Events::with_capacity(256);
        while !self.stop.load(Ordering::Acquire) {
            let wait = if self.unread.is_empty() {
                IO_TICK
            } else {
                Duration::ZERO
            };
            self.stall_for_test();
            // Taken before the poll: whatever had arrived by now is reported by it, or was
            // read before, unless its connection is left in `unread`.
            let pass_start = self.shared.since_epoch(Instant::now());
            // A pass whose poll failed (EINTR after a SIGCONT, for one) or came back full
            // (more sockets ready than `events` holds) may have left ready sockets unread:
            // it moves no mark.
            let complete = match self.poll.poll(&mut events, Some(wait)) {
                Ok(()) => events.iter().count() < events.capacity(),
                Err(e) => {
                    if e.kind() != io::ErrorKind::Interrupted {
                        tracing::error!(error = %e, "the TCP fabric's poll failed");
                        std::thread::sleep(IO_TICK);
                    }
                    false
                }
            };
            for ev in events.iter() {
                match ev.token() {
                    LISTENER => self.accept(),
                    WAKER => {}
                    Token(t) => self.ready(t as u64, ev.is_writable()),
                }
            }
            for id in std::mem::take(&mut self.unread) {
                if let Some(link) = self.conns.get(&id).map(|c| c.link.clone()) {
                    self.read(id, &link);
                }
            }
            while let Ok(Cmd::Dial(peer, addr)) = self.cmds.try_recv() {
                self.dial(peer, addr);
            }
            self.deadlines();
            // After the reports of this pass went into the channel.
            if complete {
                for (id, c) in &self.conns {
                    if !self.unread.contains(id) {
                        c.link.read_through.store(pass_start, Ordering::Release);
                    }
                }
            }
            if std::mem::take(&mut self.notify) {
                self.shared.wait.wake();
            }
        }
        for c in self.conns.values() {
            c.link.close();
        }
    }

    /// Test-only: sleeps while a stall set by [`TcpEndpoint::stall_io_for_test`] lasts.
    fn stall_for_test(&self) {
        loop {
            let until = self.shared.stall_io_until.load(Ordering::Acquire);
            if until == 0 || self.shared.since_epoch(Instant::now()) >= until {
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn report(&mut self, ev: IoEvent) {
        // The owner is gone when the receiver is: nobody to tell.
        let _ = self.tx.send(ev);
        self.notify = true;
    }

    fn new_link(&mut self, mut stream: TcpStream, phase: Phase, tls: Option<rustls::Connection>) {
        let id = self.next_id;
        self.next_id += 1;
        let _ = stream.set_nodelay(true);
        let sock = socket2::SockRef::from(&stream);
        let _ = sock.set_tcp_user_timeout(Some(self.cfg.dead_peer_timeout));
        let _ = sock.set_tcp_keepalive(&keepalive(self.cfg.keepalive));
        if let Err(e) = self.poll.registry().register(
            &mut stream,
            Token(id as usize),
            Interest::READABLE | Interest::WRITABLE,
        ) {
            tracing::warn!(error = %e, "cannot poll a socket; dropping it");
            if let Phase::Dialing { peer, .. } = phase {
                self.report(IoEvent::DialFailed {
                    peer,
                    why: format!("cannot poll the socket: {e}"),
                });
            }
            return;
        }
        let link = Arc::new(Link {
            id,
            stream,
            out: Mutex::new(Out::default()),
            tls: tls.map(Mutex::new),
            grant: Mutex::new(false),
            peer_grant: AtomicU64::new(0),
            read_through: AtomicU64::new(0),
            pool: self.shared.pool.clone(),
        });
        self.conns.insert(
            id,
            IoConn {
                link,
                phase,
                rbuf: vec![0; HEADER + MAX_BODY],
                filled: 0,
                received: 0,
                acked: 0,
            },
        );
    }

    fn accept(&mut self) {
        loop {
            match self.listener.accept() {
                Ok((stream, from)) => {
                    let tls = match self.cfg.tls.as_ref().map(PeerTls::accept).transpose() {
                        Ok(tls) => tls,
                        Err(e) => {
                            tracing::warn!(%from, error = %e, "cannot start a TLS session; dropping the connection");
                            continue;
                        }
                    };
                    let deadline = Instant::now() + self.cfg.connect_timeout;
                    self.new_link(
                        stream,
                        Phase::Hello {
                            peer: None,
                            deadline,
                        },
                        tls,
                    );
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a connection failed");
                    return;
                }
            }
        }
    }

    fn dial(&mut self, peer: NodeId, addr: SocketAddr) {
        let tls = match self
            .cfg
            .tls
            .as_ref()
            .map(|t| t.dial(peer, addr))
            .transpose()
        {
            Ok(tls) => tls,
            Err(e) => {
                self.report(IoEvent::DialFailed {
                    peer,
                    why: format!("cannot start a TLS session for {addr}: {e}"),
                });
                return;
            }
        };
        let started = (|| -> io::Result<TcpStream> {
            let s = socket2::Socket::new(
                socket2::Domain::for_address(addr),
                socket2::Type::STREAM,
                Some(socket2::Protocol::TCP),
            )?;
            s.set_nonblocking(true)?;
            // From our own address, so the peer (and a network namespace's rules) see us there.
            s.bind(&SocketAddr::new(self.cfg.listen.ip(), 0).into())?;
            match s.connect(&addr.into()) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
                Err(e) => return Err(e),
            }
            Ok(TcpStream::from_std(s.into()))
        })();
        match started {
            Ok(stream) => {
                let deadline = Instant::now() + self.cfg.connect_timeout;
                self.new_link(stream, Phase::Dialing { peer, deadline }, tls);
            }
            Err(e) => self.report(IoEvent::DialFailed {
                peer,
                why: format!("cannot connect to {addr}: {e}"),
            }),
        }
    }

    fn our_hello(&self) -> Hello {
        Hello {
            version: TCP_PROTOCOL_VERSION,
            recv_credits: self.cfg.recv_slots as u32,
            cluster_id: self.cfg.cluster_id,
            node: self.cfg.node,
            region: *lock(&self.shared.advertised),
        }
    }

    fn send_hello(&self, link: &Link) -> io::Result<()> {
        let mut f = self.shared.pool.take();
        self.our_hello().encode(&mut f);
        link.send(f)
    }

    fn send_reject(&self, link: &Link, why: &str) {
        let mut f = self.shared.pool.take();
        frame_header(&mut f, K_REJECT, why.len());
        f.extend_from_slice(why.as_bytes());
        let _ = link.send(f);
        let _ = link.stream.shutdown(Shutdown::Write);
    }

    /// Ends a connection: reports it to whoever waits for it and drains it until the peer
    /// closes (so a reject or a negative acknowledgement is not lost to a reset).
    fn fail(&mut self, id: u64, why: String, reason: DisconnectReason) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        let ev = match std::mem::replace(
            &mut c.phase,
            Phase::Draining {
                deadline: Instant::now() + self.cfg.connect_timeout,
            },
        ) {
            Phase::Dialing { peer, .. }
            | Phase::Hello {
                peer: Some(peer), ..
            } => Some(IoEvent::DialFailed { peer, why }),
            Phase::Hello { peer: None, .. } => {
                tracing::debug!(why, "an incoming connection failed");
                None
            }
            Phase::Up => Some(IoEvent::Down {
                link: id,
                why,
                reason,
            }),
            Phase::Draining { .. } => None,
        };
        let _ = c.link.stream.shutdown(Shutdown::Write);
        lock(&c.link.out).closed = true;
        if let Some(ev) = ev {
            self.report(ev);
        }
    }

    fn forget(&mut self, id: u64) {
        if let Some(c) = self.conns.remove(&id) {
            let fd = std::os::fd::AsRawFd::as_raw_fd(&c.link.stream);
            let _ = self
                .poll
                .registry()
                .deregister(&mut mio::unix::SourceFd(&fd));
            c.link.close();
        }
    }

    fn deadlines(&mut self) {
        let now = Instant::now();
        let due: Vec<(u64, bool)> = self
            .conns
            .iter()
            .filter_map(|(id, c)| match c.phase {
                Phase::Dialing { deadline, .. } | Phase::Hello { deadline, .. } => {
                    (now > deadline).then_some((*id, false))
                }
                Phase::Draining { deadline } => (now > deadline).then_some((*id, true)),
                Phase::Up => None,
            })
            .collect();
        for (id, draining) in due {
            if draining {
                self.forget(id);
            } else {
                self.fail(
                    id,
                    format!(
                        "no connection and hello within {} ms",
                        self.cfg.connect_timeout.as_millis()
                    ),
                    DisconnectReason::Unreachable,
                );
            }
        }
    }

    fn ready(&mut self, id: u64, writable: bool) {
        let Some(c) = self.conns.get(&id) else {
            return;
        };
        let link = c.link.clone();
        if let Phase::Dialing { peer, .. } = c.phase {
            if !writable {
                return;
            }
            match link.stream.take_error() {
                Ok(None) if link.stream.peer_addr().is_ok() => {}
                Ok(Some(e)) | Err(e) => {
                    self.fail(
                        id,
                        format!("cannot connect: {e}"),
                        DisconnectReason::Unreachable,
                    );
                    return;
                }
                Ok(None) => return, // not connected yet
            }
            let deadline = Instant::now() + self.cfg.connect_timeout;
            self.conns.get_mut(&id).expect("present").phase = Phase::Hello {
                peer: Some(peer),
                deadline,
            };
            if let Err(e) = self.send_hello(&link) {
                self.fail(
                    id,
                    format!("cannot send the hello: {e}"),
                    DisconnectReason::Unreachable,
                );
                return;
            }
        }
        if writable && let Err(e) = link.flush() {
            self.fail(
                id,
                format!("write failed: {e}"),
                DisconnectReason::PeerReset,
            );
        }
        self.read(id, &link);
    }

    /// Reads until the socket would block (or the budget is spent), handling every whole frame.
    fn read(&mut self, id: u64, link: &Arc<Link>) {
        let mut budget = READ_BUDGET;
        loop {
            if budget == 0 {
                if !self.unread.contains(&id) {
                    self.unread.push(id);
                }
                break;
            }
            let Some(c) = self.conns.get_mut(&id) else {
                return;
            };
            let filled = c.filled;
            let got = link.read(&mut c.rbuf[filled..]);
            match got {
                Ok(0) => {
                    self.fail(
                        id,
                        "the peer closed the connection".into(),
                        DisconnectReason::PeerReset,
                    );
                    self.forget(id);
                    return;
                }
                Ok(n) => {
                    c.filled += n;
                    budget = budget.saturating_sub(n);
                    self.frames(id);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.fail(id, format!("read failed: {e}"), DisconnectReason::PeerReset);
                    self.forget(id);
                    return;
                }
            }
        }
        // One cumulative acknowledgement for everything this pass received.
        if let Some(c) = self.conns.get_mut(&id)
            && matches!(c.phase, Phase::Up)
            && c.received > c.acked
        {
            c.acked = c.received;
            let mut f = self.shared.pool.take();
            frame_header(&mut f, K_ACK, 8);
            f.extend_from_slice(&c.received.to_le_bytes());
            let _ = link.send(f);
        }
    }

    /// Handles the whole frames in a connection's buffer and keeps the partial one.
    fn frames(&mut self, id: u64) {
        let mut at = 0;
        loop {
            let Some(c) = self.conns.get_mut(&id) else {
                return;
            };
            if matches!(c.phase, Phase::Draining { .. }) {
                c.filled = 0;
                return;
            }
            let avail = c.filled - at;
            if at == 0
                && matches!(c.phase, Phase::Hello { .. })
                && c.link.tls.is_none()
                && looks_like_tls(&c.rbuf[..avail])
            {
                // A plain reject, which the peer's TLS session reports as a failed handshake.
                let link = c.link.clone();
                self.send_reject(&link, "this node's peer link is plain TCP, not TLS");
                self.fail(
                    id,
                    "the peer speaks TLS on its peer link and this node does not: configure peer TLS on both ends or on neither".into(),
                    DisconnectReason::Unreachable,
                );
                continue;
            }
            if avail < HEADER {
                break;
            }
            let body = u32_at(&c.rbuf, at) as usize;
            let kind = c.rbuf[at + 4];
            if body > MAX_BODY {
                self.fail(
                    id,
                    format!("a {body}-byte frame exceeds the {MAX_BODY}-byte limit"),
                    DisconnectReason::Failed(WcStatus::RemoteAccess),
                );
                continue;
            }
            if avail < HEADER + body {
                break;
            }
            let start = at + HEADER;
            at = start + body;
            if let Next::Fail(why, reason) = self.frame(id, kind, start..start + body) {
                self.fail(id, why, reason);
            }
        }
        if let Some(c) = self.conns.get_mut(&id) {
            c.rbuf.copy_within(at..c.filled, 0);
            c.filled -= at;
        }
    }

    fn frame(&mut self, id: u64, kind: u8, body: std::ops::Range<usize>) -> Next {
        let c = self.conns.get_mut(&id).expect("present");
        let b = &c.rbuf[body.clone()];
        match (&c.phase, kind) {
            (Phase::Draining { .. }, _) => Next::Continue,
            (Phase::Dialing { .. }, _) => Next::Fail(
                "data before the connection completed".into(),
                DisconnectReason::Unreachable,
            ),
            (Phase::Hello { peer, .. }, K_HELLO) => {
                let peer = *peer;
                let hello = match Hello::decode(b) {
                    Ok(h) => h,
                    Err(why) => {
                        return Next::Fail(why, DisconnectReason::Refused);
                    }
                };
                let link = c.link.clone();
                self.hello(id, link, peer, hello)
            }
            (Phase::Hello { .. }, K_REJECT) => Next::Fail(
                format!("refused: {}", String::from_utf8_lossy(b)),
                DisconnectReason::Refused,
            ),
            (Phase::Hello { .. }, _) => {
                Next::Fail("data before the hello".into(), DisconnectReason::Refused)
            }
            (Phase::Up, K_WRITE) if b.len() >= WRITE_HEAD => {
                c.received += 1;
                let seq = c.received;
                let grant = u64_at(b, 0);
                c.link.peer_grant.fetch_max(grant, Ordering::AcqRel);
                let (rkey, addr) = (u32_at(b, 8), u64_at(b, 16));
                let data = &b[WRITE_HEAD..];
                if place(&self.shared, &c.link, rkey, addr, data) {
                    Next::Continue
                } else {
                    let mut f = self.shared.pool.take();
                    frame_header(&mut f, K_NAK, 9);
                    f.extend_from_slice(&seq.to_le_bytes());
                    f.push(1);
                    let _ = c.link.send(f);
                    Next::Fail(
                        "the peer wrote without a grant, with a wrong key or out of bounds".into(),
                        DisconnectReason::Failed(WcStatus::RemoteAccess),
                    )
                }
            }
            (Phase::Up, K_SEND | K_CREDIT) if b.len() >= SEND_HEAD => {
                let grant = u64_at(b, 0);
                if c.link.peer_grant.fetch_max(grant, Ordering::AcqRel) < grant {
                    self.notify = true;
                }
                if kind == K_SEND {
                    c.received += 1;
                    let mut bytes = self.shared.pool.take();
                    bytes.extend_from_slice(&b[SEND_HEAD..]);
                    self.report(IoEvent::Recv { link: id, bytes });
                }
                Next::Continue
            }
            (Phase::Up, K_CONTROL) => {
                let mut bytes = self.shared.pool.take();
                bytes.extend_from_slice(b);
                self.report(IoEvent::Control { link: id, bytes });
                Next::Continue
            }
            (Phase::Up, K_ACK) if b.len() == 8 => {
                let upto = u64_at(b, 0);
                self.report(IoEvent::Acked { link: id, upto });
                Next::Continue
            }
            (Phase::Up, K_NAK) if b.len() == 9 => {
                let seq = u64_at(b, 0);
                self.report(IoEvent::Nak {
                    link: id,
                    seq: seq.max(1),
                    status: WcStatus::RemoteAccess,
                });
                // The owner breaks the connection; stop reading it.
                Next::Fail(
                    "the peer refused a write".into(),
                    DisconnectReason::Failed(WcStatus::RemoteAccess),
                )
            }
            (Phase::Up, k) => Next::Fail(
                format!("a malformed frame (kind {k}, {} bytes)", b.len()),
                DisconnectReason::Failed(WcStatus::RemoteAccess),
            ),
        }
    }

    fn hello(&mut self, id: u64, link: Arc<Link>, dialled: Option<NodeId>, hello: Hello) -> Next {
        let refuse = |why: String| Next::Fail(why, DisconnectReason::Refused);
        if hello.version != TCP_PROTOCOL_VERSION {
            let why = format!(
                "protocol version {} is not ours ({TCP_PROTOCOL_VERSION})",
                hello.version
            );
            if dialled.is_none() {
                tracing::warn!(peer = %hello.node, why, "refused a connection");
                self.send_reject(&link, &why);
            }
            return refuse(why);
        }
        if hello.cluster_id != self.cfg.cluster_id {
            let why = format!(
                "cluster id mismatch: {:#x} is not this cluster's ({:#x})",
                hello.cluster_id, self.cfg.cluster_id
            );
            if dialled.is_none() {
                tracing::warn!(peer = %hello.node, why, "refused a connection");
                self.send_reject(&link, &why);
            }
            return refuse(why);
        }
        match dialled {
            Some(peer) if hello.node != peer => {
                refuse(format!("the peer answered as {}, not {peer}", hello.node))
            }
            Some(_) => {
                self.up(id, link, hello, true);
                Next::Continue
            }
            None => {
                if hello.node == self.cfg.node || !self.cfg.peers.contains_key(&hello.node) {
                    let why = format!(
                        "{} is not a configured peer of {}",
                        hello.node, self.cfg.node
                    );
                    tracing::warn!(why, "refused a connection");
                    self.send_reject(&link, &why);
                    return refuse(why);
                }
                if self.cfg.accept_only_after_advertise && lock(&self.shared.advertised).is_none() {
                    // Peers learn our ring only from the hello: refuse at once so the dialer
                    // retries after its backoff.
                    let why = "not ready: no region advertised yet".to_string();
                    self.send_reject(&link, &why);
                    return refuse(why);
                }
                if let Err(e) = self.send_hello(&link) {
                    return refuse(format!("cannot answer the hello: {e}"));
                }
                self.up(id, link, hello, false);
                Next::Continue
            }
        }
    }

    fn up(&mut self, id: u64, link: Arc<Link>, hello: Hello, outgoing: bool) {
        if let Some(c) = self.conns.get_mut(&id) {
            c.phase = Phase::Up;
        }
        self.report(IoEvent::Up {
            link,
            hello,
            outgoing,
        });
    }
}

/// Places a write into the registered region `rkey` names, if the connection grants remote
/// write and the range lies inside it. The grant's lock is held while the bytes land.
fn place(shared: &Shared, link: &Link, rkey: u32, addr: u64, data: &[u8]) -> bool {
    let grant = lock(&link.grant);
    if !*grant {
        return false;
    }
    let regions = shared
        .regions
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let Some(r) = regions.iter().find(|r| r.remote.rkey == rkey) else {
        return false;
    };
    let end = addr.checked_add(data.len() as u64);
    let inside =
        addr >= r.remote.addr && end.is_some_and(|e| e <= r.remote.addr + r.remote.len_bytes);
    if !inside {
        return false;
    }
    crate::write_bytes(r.memory.as_ref(), addr - r.remote.addr, data);
    true
}
