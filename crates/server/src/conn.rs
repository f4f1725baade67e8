//! One client connection: TLS handshake (if configured), the hello, then requests answered in
//! order, with at most `max_in_flight` pending.
//!
//! One thread per connection. While nothing is pending it blocks in `read` (with a short
//! timeout, to notice a shutdown); while appends are pending or a tail streams, it alternates
//! a non-blocking read with a wait of at most 1 ms on the oldest pending append, which wakes
//! as soon as it commits.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use fabric::Fabric;
use proto::tls::FramedSocket;
use proto::{
    Entry, ErrorCode, FrameError, MIN_PROTOCOL_VERSION, NodeStatus, PROTOCOL_VERSION,
    ReadConsistency, Request, Response, Role,
};
use replica::{AppendHandle, ReadHandle, ReplicaError, Subscription};

use crate::Shared;

/// Most bytes of entries in one `Entries` frame of a tail: 1 MiB, large enough that a frame's
/// fixed costs do not matter, small enough that a tail does not hold a connection thread for
/// long between looks at its pending requests.
const TAIL_BATCH_BYTES: usize = 1 << 20;

/// Largest `Entries` frame body the server sends: the default frame limit, which every client
/// accepts unless it was configured lower (such a client asks for less with `max_bytes`). A
/// server configured with a lower limit sends no more than its own limit either.
const RESPONSE_FRAME_BYTES: u32 = proto::DEFAULT_MAX_FRAME_BYTES;

/// The budget for the entries of one `Entries` frame, each counted as its payload plus
/// [`proto::ENTRY_OVERHEAD_BYTES`], so that the frame fits `max_frame_bytes` and
/// [`RESPONSE_FRAME_BYTES`].
fn entries_budget(max_frame_bytes: u32) -> usize {
    let frame = max_frame_bytes.min(RESPONSE_FRAME_BYTES) as usize;
    frame.saturating_sub(proto::ENTRIES_HEADER_BYTES)
}

/// What `entry` costs in an `Entries` frame, at most.
fn entry_cost(data: &[u8]) -> usize {
    data.len() + proto::ENTRY_OVERHEAD_BYTES
}

/// A byte stream with its TCP socket underneath (plain or TLS).
trait Stream: Read + Write {
    fn tcp(&self) -> &TcpStream;

    /// Reads what is there, taking the socket at most once (so within its read timeout);
    /// `WouldBlock` or `TimedOut` when nothing readable came.
    fn read_some(&mut self, buf: &mut [u8]) -> io::Result<usize>;

    /// Whether bytes of a frame are on their way below this stream: a TLS record begun and
    /// not ended, which decrypts to nothing until its last byte.
    fn mid_record(&self) -> bool;
}

impl Stream for TcpStream {
    fn tcp(&self) -> &TcpStream {
        self
    }

    fn read_some(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.read(buf)
    }

    fn mid_record(&self) -> bool {
        false
    }
}

/// TLS, read record by record: `StreamOwned::read` loops inside until a whole record has
/// come, each socket read under the timeout, so a client trickling a record held the
/// connection past every deadline ([`proto::tls::read_some`]).
impl Stream for rustls::StreamOwned<rustls::ServerConnection, FramedSocket> {
    fn tcp(&self) -> &TcpStream {
        &self.sock.sock
    }

    fn read_some(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        proto::tls::read_some(&mut self.conn, &mut self.sock, buf)
    }

    fn mid_record(&self) -> bool {
        self.sock.mid_record()
    }
}

/// Room a connection's read buffer keeps between frames.
const READ_BUF_KEPT: usize = 64 << 10;

/// Gives back the room of a large frame once it was taken from `buf`: a connection that sent
/// one frame of 16 MiB and then idled (with a request now and then against the idle close)
/// held 16-32 MiB until it closed, and `max_connections` of them held gigabytes.
fn release_spare(buf: &mut Vec<u8>) {
    if buf.capacity() > READ_BUF_KEPT && buf.len() <= READ_BUF_KEPT / 2 {
        buf.shrink_to(READ_BUF_KEPT);
    }
}

/// The name of a replica role in status answers.
pub(crate) fn role_name(r: replica::Role) -> &'static str {
    match r {
        replica::Role::Leader => "leader",
        replica::Role::Follower => "follower",
        replica::Role::Candidate => "candidate",
    }
}

/// Serves one connection until it closes, fails or the server shuts down.
pub(crate) fn serve<F: Fabric + Send + 'static>(
    shared: &Shared<F>,
    tcp: TcpStream,
    peer: SocketAddr,
    over_limit: bool,
) {
    let _ = tcp.set_nodelay(true);
    // A client whose machine died leaves no FIN: keepalive drops its connection (a tail's
    // never idles out, and held its slot for good).
    let _ = proto::set_keepalive(&tcp);
    let _ = tcp.set_nonblocking(false);
    let _ = tcp.set_write_timeout(Some(shared.opts.frame_timeout));
    let _ = tcp.set_read_timeout(Some(shared.opts.frame_timeout));
    match &shared.opts.tls {
        None => run(shared, tcp, peer, over_limit),
        Some(cfg) => {
            let conn = match rustls::ServerConnection::new(cfg.clone()) {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(%peer, error = %e, "cannot start TLS");
                    return;
                }
            };
            let mut s = rustls::StreamOwned::new(conn, FramedSocket::new(tcp));
            // The whole handshake within `frame_timeout`, as the hello after it: a client
            // that trickles its handshake a byte at a time never lets one read time out, and
            // would hold a connection slot for as long as it likes.
            let frame_timeout = shared.opts.frame_timeout;
            if let Err(e) =
                proto::tls::handshake(&mut s.conn, &mut s.sock, Instant::now() + frame_timeout)
            {
                shared
                    .metrics
                    .rejected_connections
                    .fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%peer, error = %e, "TLS handshake failed; connection refused");
                return;
            }
            let _ = s.sock.sock.set_read_timeout(Some(frame_timeout));
            let _ = s.sock.sock.set_write_timeout(Some(frame_timeout));
            run(shared, s, peer, over_limit);
        }
    }
}

enum Pending<F: Fabric + Send + 'static> {
    Ready(Response),
    Append {
        id: u64,
        handles: Vec<AppendHandle<F>>,
        start: Instant,
        /// An `AppendInSession`: answered with each entry's index, and safe to resend.
        in_session: bool,
    },
    /// An `OpenSession`, resolving to the session's id.
    Open {
        id: u64,
        handle: AppendHandle<F>,
        start: Instant,
    },
    Members {
        id: u64,
        handle: AppendHandle<F>,
        start: Instant,
    },
    /// A read waiting for its consistency: a majority's confirmation, or an index.
    Read {
        id: u64,
        from: u64,
        max_bytes: usize,
        wait: ReadWait<F>,
        start: Instant,
    },
}

/// What a [`Pending::Read`] waits for.
enum ReadWait<F: Fabric + Send + 'static> {
    /// Nothing: the read is made when its turn to be answered comes, so that a connection
    /// holds one read's entries at a time, not up to `max_in_flight` frames of them queued
    /// behind a request that waits.
    Now,
    /// The leader's ReadIndex.
    Linearizable(ReadHandle<F>),
    /// This node's commit index reaching the index.
    AtLeast(u64),
}

struct Conn<'a, F: Fabric + Send + 'static, S: Stream> {
    shared: &'a Shared<F>,
    s: S,
    peer: SocketAddr,
    buf: Vec<u8>,
    frame_started: Option<Instant>,
    /// When the connection was last busy: a frame arrived, or a request was pending. Idleness
    /// (`idle_timeout`) counts from here, so a request that took longer than the idle timeout
    /// does not get its connection closed right after its answer.
    last_active: Instant,
    nonblocking: bool,
    role: Role,
    /// The protocol version the client said at the hello (answers are in that version).
    version: u16,
    pending: VecDeque<Pending<F>>,
    tail: Option<Tail<F>>,
}

/// A streaming `Tail` request.
struct Tail<F: Fabric + Send + 'static> {
    /// The request id its frames carry.
    id: u64,
    sub: Subscription<F>,
    /// An entry taken from the subscription that did not fit the last frame.
    carry: Option<Entry>,
}

/// A frame that arrived whole.
enum Incoming {
    /// A request to handle.
    Request(Request),
    /// An `Append` over the batch limit, refused from its first bytes: answer it and go on
    /// (the frame was read whole, so the stream is still in step).
    BatchTooLong { id: u64, message: String },
}

/// Why a connection ends.
enum End {
    /// The client closed it, or it broke.
    Gone,
    /// Bad input or a policy: tell the client, count it, close.
    Refuse(ErrorCode, String),
    /// Idle for `idle_timeout`: tell the client (`Malformed`, the code version 1 clients
    /// know), close; not counted as a refusal.
    Idle(String),
}

fn run<F: Fabric + Send + 'static, S: Stream>(
    shared: &Shared<F>,
    s: S,
    peer: SocketAddr,
    over_limit: bool,
) {
    let mut c = Conn {
        shared,
        s,
        peer,
        buf: Vec::new(),
        frame_started: None,
        last_active: Instant::now(),
        nonblocking: false,
        role: Role::ReadOnly,
        version: PROTOCOL_VERSION,
        pending: VecDeque::new(),
        tail: None,
    };
    let end = if over_limit {
        End::Refuse(
            ErrorCode::Busy,
            format!(
                "the server already serves its limit of {} connections; retry later or use another node",
                shared.opts.max_connections
            ),
        )
    } else {
        match c.hello() {
            Ok(()) => c.requests(),
            Err(e) => e,
        }
    };
    let refused = match end {
        End::Gone => None,
        End::Idle(message) => {
            tracing::debug!(peer = %c.peer, %message, "closing an idle client connection");
            Some((ErrorCode::Malformed, message))
        }
        End::Refuse(code, message) => {
            let counter = match code {
                ErrorCode::ShuttingDown => None,
                ErrorCode::Busy => Some(&shared.metrics.busy_refusals),
                _ => Some(&shared.metrics.rejected_connections),
            };
            if let Some(n) = counter {
                n.fetch_add(1, Ordering::Relaxed);
            }
            tracing::info!(peer = %c.peer, ?code, %message, "closing a client connection");
            Some((code, message))
        }
    };
    if let Some((code, message)) = refused {
        let _ = c.send(&Response::Error {
            id: None,
            code,
            message,
        });
    }
}

impl<F: Fabric + Send + 'static, S: Stream> Conn<'_, F, S> {
    fn set_nonblocking(&mut self, on: bool) {
        if self.nonblocking != on {
            let _ = self.s.tcp().set_nonblocking(on);
            self.nonblocking = on;
        }
    }

    fn send(&mut self, r: &Response) -> Result<(), End> {
        self.set_nonblocking(false);
        // A request's error or redirect; a connection-level error (`id: None`: a refusal,
        // an idle close, a shutdown) answers no request and is counted where it is decided.
        if matches!(
            r,
            Response::Error { id: Some(_), .. } | Response::Redirect { .. }
        ) {
            self.shared
                .metrics
                .request_errors
                .fetch_add(1, Ordering::Relaxed);
        }
        proto::write_frame(&mut self.s, r).map_err(|_| End::Gone)
    }

    /// Reads what is available and returns a frame once one is complete. Blocks only in
    /// blocking mode, up to the socket's read timeout.
    fn poll_frame(&mut self) -> Result<Option<Incoming>, End> {
        let max = self.shared.opts.max_frame_bytes;
        loop {
            if self.buf.len() >= 4 {
                let len = u32::from_le_bytes(self.buf[..4].try_into().expect("4 bytes"));
                if len > max {
                    return Err(End::Refuse(
                        ErrorCode::TooLarge,
                        format!("a frame of {len} bytes exceeds this server's {max}-byte limit"),
                    ));
                }
                let end = 4 + len as usize;
                if self.buf.len() >= end {
                    let r = proto::decode_body(&self.buf[4..end], max);
                    self.buf.drain(..end);
                    release_spare(&mut self.buf);
                    self.frame_started =
                        (!self.buf.is_empty() || self.s.mid_record()).then(Instant::now);
                    self.last_active = Instant::now();
                    return match r {
                        Ok(req) => Ok(Some(Incoming::Request(req))),
                        Err(e @ FrameError::BatchTooLong { id, .. }) => {
                            Ok(Some(Incoming::BatchTooLong {
                                id,
                                message: e.to_string(),
                            }))
                        }
                        Err(e) => Err(End::Refuse(ErrorCode::Malformed, e.to_string())),
                    };
                }
            }
            if let Some(t) = self.frame_started {
                if t.elapsed() > self.shared.opts.frame_timeout {
                    return Err(End::Refuse(
                        ErrorCode::Malformed,
                        format!(
                            "a frame took longer than {:?} to arrive; closing (slow client)",
                            self.shared.opts.frame_timeout
                        ),
                    ));
                }
            }
            let mut tmp = [0u8; 16 << 10];
            match self.s.read_some(&mut tmp) {
                Ok(0) => return Err(End::Gone),
                Ok(n) => {
                    self.frame_started.get_or_insert_with(Instant::now);
                    self.buf.extend_from_slice(&tmp[..n]);
                }
                // Bytes came and completed no TLS record of data (or a signal): a frame on its
                // way is timed from its first byte on the wire, and read on at once (the
                // loop looks at `frame_timeout` first, so a client trickling a record is cut
                // there like one trickling a plain frame). With nothing pending (a record
                // that carried no data and ended) the caller looks at its own deadlines.
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {
                    if self.buf.is_empty() && !self.s.mid_record() {
                        self.frame_started = None;
                        return Ok(None);
                    }
                    self.frame_started.get_or_insert_with(Instant::now);
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return Ok(None);
                }
                Err(_) => return Err(End::Gone),
            }
        }
    }

    fn hello(&mut self) -> Result<(), End> {
        let opts = &self.shared.opts;
        let _ = self
            .s
            .tcp()
            .set_read_timeout(Some(Duration::from_millis(100)));
        let deadline = Instant::now() + opts.frame_timeout;
        let req = loop {
            if let Some(r) = self.poll_frame()? {
                break r;
            }
            if Instant::now() > deadline {
                return Err(End::Refuse(
                    ErrorCode::Malformed,
                    format!("no hello within {:?}", opts.frame_timeout),
                ));
            }
        };
        let Incoming::Request(Request::Hello {
            version,
            cluster_id,
            token,
        }) = req
        else {
            return Err(End::Refuse(
                ErrorCode::Malformed,
                "the first frame must be Hello".into(),
            ));
        };
        if !(MIN_PROTOCOL_VERSION..=PROTOCOL_VERSION).contains(&version) {
            return Err(End::Refuse(
                ErrorCode::WrongVersion,
                format!(
                    "this server speaks protocol versions {MIN_PROTOCOL_VERSION} to {PROTOCOL_VERSION}, the client {version}"
                ),
            ));
        }
        self.version = version;
        if cluster_id != opts.cluster_id {
            return Err(End::Refuse(
                ErrorCode::WrongCluster,
                format!(
                    "this server belongs to cluster {:#x}, the client asked for {cluster_id:#x}",
                    opts.cluster_id
                ),
            ));
        }
        self.role = match token {
            Some(t) => *opts
                .tokens
                .get(&t)
                .ok_or_else(|| End::Refuse(ErrorCode::Unauthorized, "unknown token".into()))?,
            None => opts.anonymous_role.ok_or_else(|| {
                End::Refuse(
                    ErrorCode::Unauthorized,
                    "this server requires a token".into(),
                )
            })?,
        };
        let leader = self.shared.log.leader().and_then(|l| opts.member(l));
        let welcome = Response::Welcome {
            node_id: opts.node_id,
            leader,
            role: self.role,
        };
        self.send(&welcome)
    }

    fn requests(&mut self) -> End {
        let _ = self
            .s
            .tcp()
            .set_read_timeout(Some(Duration::from_millis(200)));
        loop {
            if self.shared.shutting_down.load(Ordering::Acquire) {
                return self.drain_for_shutdown();
            }
            if let Err(e) = self.answer_resolved() {
                return e;
            }
            if let Err(e) = self.pump_tail() {
                return e;
            }
            let busy = !self.pending.is_empty() || self.tail.is_some();
            if self.pending.len() < self.shared.opts.max_in_flight {
                self.set_nonblocking(busy);
                match self.poll_frame() {
                    Ok(Some(Incoming::Request(req))) => {
                        if let Err(e) = self.handle(req) {
                            return e;
                        }
                        continue;
                    }
                    Ok(Some(Incoming::BatchTooLong { id, message })) => {
                        self.refuse(id, ErrorCode::EntryTooLarge, message);
                        if let Err(e) = self.answer_resolved() {
                            return e;
                        }
                        continue;
                    }
                    Ok(None) => {}
                    Err(e) => return e,
                }
            }
            if let Some(front) = self.pending.front() {
                self.last_active = Instant::now();
                match front {
                    Pending::Append { handles, .. } => {
                        if let Some(h) = handles.last() {
                            h.wait_for(Duration::from_millis(1));
                        }
                    }
                    Pending::Members { handle, .. } | Pending::Open { handle, .. } => {
                        handle.wait_for(Duration::from_millis(1));
                    }
                    Pending::Read { .. } => {
                        self.shared.log.wait_for_progress(Duration::from_millis(1));
                    }
                    Pending::Ready(_) => {}
                }
            } else if self.tail.is_none()
                && self.frame_started.is_none()
                && self.last_active.elapsed() > self.shared.opts.idle_timeout
            {
                return End::Idle(format!(
                    "idle for more than {:?}; closing",
                    self.shared.opts.idle_timeout
                ));
            }
        }
    }

    /// Shutdown: pending appends get the grace `ServerHandle::shutdown` was given to commit,
    /// then the rest fail.
    fn drain_for_shutdown(&mut self) -> End {
        let grace = self.shared.shutdown_grace_ms.load(Ordering::Acquire);
        let now = Instant::now();
        // `shutdown(Duration::MAX)` stores u64::MAX: no deadline the clock can add is later.
        let deadline = now
            .checked_add(Duration::from_millis(grace))
            .unwrap_or(now + Duration::from_secs(365 * 24 * 3600));
        // What already resolved is answered as it resolved, even with no grace at all: an
        // append that committed must not be told it may not have.
        if self.answer_resolved().is_err() {
            return End::Gone;
        }
        while !self.pending.is_empty() && Instant::now() < deadline {
            match self.pending.front() {
                Some(Pending::Append { handles, .. }) => {
                    if let Some(h) = handles.last() {
                        h.wait_for(Duration::from_millis(10));
                    }
                }
                Some(Pending::Members { handle, .. } | Pending::Open { handle, .. }) => {
                    handle.wait_for(Duration::from_millis(10));
                }
                _ => std::thread::sleep(Duration::from_millis(1)),
            }
            if self.answer_resolved().is_err() {
                return End::Gone;
            }
        }
        while let Some(p) = self.pending.pop_front() {
            let id = match p {
                Pending::Ready(r) => {
                    let _ = self.send(&r);
                    continue;
                }
                // A read behind a request still pending, with nothing to wait for: made now.
                Pending::Read {
                    id,
                    from,
                    max_bytes,
                    wait: ReadWait::Now,
                    ..
                } => {
                    let r = self.read(id, from, max_bytes);
                    let _ = self.send(&r);
                    continue;
                }
                Pending::Read { id, .. } => {
                    let _ = self.send(&Response::Error {
                        id: Some(id),
                        code: ErrorCode::ShuttingDown,
                        message:
                            "the server is shutting down; nothing was read: retry on another node"
                                .into(),
                    });
                    continue;
                }
                Pending::Append {
                    id,
                    handles,
                    start,
                    in_session,
                } => match self.append_answer(id, &handles, start, in_session, None) {
                    // Resolved behind a request still pending: answered as it resolved.
                    Some(a) => {
                        let _ = self.send(&a);
                        continue;
                    }
                    None => id,
                },
                Pending::Members { id, .. } | Pending::Open { id, .. } => id,
            };
            let _ = self.send(&Response::Error {
                id: Some(id),
                code: ErrorCode::ShuttingDown,
                message: "the server is shutting down; the append may or may not have committed: retry on another node".into(),
            });
        }
        End::Refuse(
            ErrorCode::ShuttingDown,
            "the server is shutting down; reconnect to another node".into(),
        )
    }

    fn answer_resolved(&mut self) -> Result<(), End> {
        let timeout = self.shared.opts.append_timeout;
        while let Some(front) = self.pending.front() {
            let answer = match front {
                Pending::Ready(_) => None,
                Pending::Append {
                    id,
                    handles,
                    start,
                    in_session,
                } => match self.append_answer(*id, handles, *start, *in_session, Some(timeout)) {
                    Some(a) => Some(a),
                    None => break,
                },
                Pending::Open { id, handle, start } => match handle.try_result() {
                    Some(Ok(session)) => Some(Response::SessionOpened { id: *id, session }),
                    Some(Err(e)) => Some(self.error(*id, &e)),
                    None if start.elapsed() > timeout => Some(Response::Error {
                        id: Some(*id),
                        code: ErrorCode::Timeout,
                        message: format!(
                            "the session did not open within {timeout:?}; open another one"
                        ),
                    }),
                    None => break,
                },
                Pending::Members { id, handle, start } => match handle.try_result() {
                    Some(Ok(index)) => Some(Response::MembershipChanged { id: *id, index }),
                    Some(Err(e)) => Some(self.error(*id, &e)),
                    None if start.elapsed() > timeout => Some(Response::Error {
                        id: Some(*id),
                        code: ErrorCode::Timeout,
                        message: format!("the membership change did not commit within {timeout:?}"),
                    }),
                    None => break,
                },
                Pending::Read { .. } => match self.read_outcome() {
                    Some(r) => Some(r),
                    None => break,
                },
            };
            let r = match (answer, self.pending.pop_front()) {
                (Some(a), _) => a,
                (None, Some(Pending::Ready(r))) => r,
                (None, _) => unreachable!("only Ready has no computed answer"),
            };
            self.send(&r)?;
        }
        Ok(())
    }

    /// Records `entries` committed by an append that began at `start`: each entry's commit
    /// latency, and the append's own when all of it (`whole`) committed.
    fn observe_committed(&self, start: Instant, entries: u64, whole: bool) {
        let m = &self.shared.metrics;
        if whole {
            m.append_latency.observe(start.elapsed());
        }
        for _ in 0..entries {
            m.commit_latency.observe(start.elapsed());
        }
        m.appended_entries.fetch_add(entries, Ordering::Relaxed);
    }

    /// The answer to a pending append (`in_session`: an `AppendInSession`) once its entries
    /// resolved, or once `timeout` (if any) passed since `start`; `None` while it waits.
    fn append_answer(
        &self,
        id: u64,
        handles: &[AppendHandle<F>],
        start: Instant,
        in_session: bool,
        timeout: Option<Duration>,
    ) -> Option<Response> {
        let timed_out = timeout.is_some_and(|t| start.elapsed() > t);
        let timeout = timeout.unwrap_or_default();
        if in_session {
            let results: Vec<_> = handles.iter().map(|h| h.try_result()).collect();
            return match session_outcome(results) {
                SessionOutcome::Committed(indexes) => {
                    self.observe_committed(start, handles.len() as u64, true);
                    Some(Response::AppendedAt { id, indexes })
                }
                SessionOutcome::Failed(e) => Some(self.error(id, &e)),
                SessionOutcome::Unknown(why) => Some(Response::Error {
                    id: Some(id),
                    code: ErrorCode::Timeout,
                    message: format!(
                        "{why}; resend the same request: its entries are never appended twice"
                    ),
                }),
                SessionOutcome::Pending if timed_out => Some(Response::Error {
                    id: Some(id),
                    code: ErrorCode::Timeout,
                    message: format!(
                        "not committed within {timeout:?}; it may still commit: resend the same request, its entries are never appended twice"
                    ),
                }),
                SessionOutcome::Pending => None,
            };
        }
        let results = handles
            .iter()
            .map(|h| (h.ticket().index, h.try_result()))
            .collect();
        match batch_outcome(results) {
            BatchOutcome::Committed { first, last } => {
                self.observe_committed(start, handles.len() as u64, true);
                Some(Response::Appended { id, first, last })
            }
            BatchOutcome::Partial { first, last } => {
                self.observe_committed(start, last - first + 1, false);
                Some(partial_answer(self.version, id, first, last, handles.len()))
            }
            BatchOutcome::Unknown(why) => Some(Response::Error {
                id: Some(id),
                code: ErrorCode::Timeout,
                message: format!(
                    "{why}; the batch may be in the log in part or in whole: do not resend it blindly"
                ),
            }),
            BatchOutcome::NotCommitted(e) | BatchOutcome::Failed(e) => Some(self.error(id, &e)),
            BatchOutcome::Pending if timed_out => Some(Response::Error {
                id: Some(id),
                code: ErrorCode::Timeout,
                message: format!(
                    "not committed within {timeout:?}; it may still commit (a majority may be unreachable)"
                ),
            }),
            BatchOutcome::Pending => None,
        }
    }

    /// An `Append`, an `AppendIf` or an `AppendInSession`: refused, or pending on its
    /// entries' handles.
    fn append(&mut self, id: u64, entries: Vec<Vec<u8>>, how: AppendKind) {
        let why = "this connection is read-only: appends need a read-write token";
        if !self.permits(id, Role::ReadWrite, why) {
            return;
        }
        if entries.is_empty() || entries.len() > proto::MAX_BATCH_ENTRIES {
            self.refuse(
                id,
                ErrorCode::EntryTooLarge,
                format!(
                    "a batch holds 1 to {} entries, not {}",
                    proto::MAX_BATCH_ENTRIES,
                    entries.len()
                ),
            );
            return;
        }
        let log = &self.shared.log;
        let refs: Vec<&[u8]> = entries.iter().map(Vec::as_slice).collect();
        let proposed = match how {
            AppendKind::Plain => log.append_batch(&refs),
            AppendKind::If(e) => log.append_batch_if(&refs, e),
            AppendKind::InSession { session, first_seq } => {
                log.append_batch_in_session(session, first_seq, &refs)
            }
        };
        let p = match proposed {
            Ok(handles) => Pending::Append {
                id,
                handles,
                start: Instant::now(),
                in_session: matches!(how, AppendKind::InSession { .. }),
            },
            Err(e) => Pending::Ready(self.error(id, &e)),
        };
        self.pending.push_back(p);
    }

    /// The answer to the front [`Pending::Read`] once its consistency is met (or cannot be
    /// in time); `None` while it waits.
    fn read_outcome(&mut self) -> Option<Response> {
        let timeout = self.shared.opts.append_timeout;
        let log = &self.shared.log;
        let Some(Pending::Read {
            id,
            from,
            max_bytes,
            wait,
            start,
        }) = self.pending.front_mut()
        else {
            return None;
        };
        let (id, from, max_bytes, late) = (*id, *from, *max_bytes, start.elapsed() > timeout);
        let ready = match wait {
            ReadWait::Now => Ok(()),
            ReadWait::Linearizable(h) => match h.try_result() {
                Some(Ok(_)) => Ok(()),
                Some(Err(e)) => Err(self.error(id, &e)),
                None if late => Err(self.error(
                    id,
                    &ReplicaError::ReadTimeout {
                        waited_ms: timeout.as_millis() as u64,
                    },
                )),
                None => return None,
            },
            ReadWait::AtLeast(index) if log.commit_index() >= *index => Ok(()),
            ReadWait::AtLeast(index) if late => Err(Response::Error {
                id: Some(id),
                code: ErrorCode::Timeout,
                message: format!(
                    "this node has not committed index {index} within {timeout:?}; nothing was read: retry, or read from the leader"
                ),
            }),
            ReadWait::AtLeast(_) => return None,
        };
        Some(match ready {
            Ok(()) => self.read(id, from, max_bytes),
            Err(r) => r,
        })
    }

    fn error(&self, id: u64, e: &ReplicaError) -> Response {
        if let ReplicaError::ConditionFailed { last, .. } = e {
            return Response::ConditionFailed { id, last: *last };
        }
        if let ReplicaError::NotLeader { leader_hint } = e {
            self.shared
                .metrics
                .redirects
                .fetch_add(1, Ordering::Relaxed);
            return Response::Redirect {
                id,
                leader: leader_hint.and_then(|l| self.shared.opts.member(l)),
            };
        }
        Response::Error {
            id: Some(id),
            code: error_code(e),
            message: e.to_string(),
        }
    }

    /// Whether this connection's role is at least `need`; if not, refuses request `id` as
    /// `Unauthorized` saying `why`.
    fn permits(&mut self, id: u64, need: Role, why: &str) -> bool {
        if self.role < need {
            self.refuse(id, ErrorCode::Unauthorized, why.into());
        }
        self.role >= need
    }

    fn refuse(&mut self, id: u64, code: ErrorCode, message: String) {
        self.pending.push_back(Pending::Ready(Response::Error {
            id: Some(id),
            code,
            message,
        }));
    }

    fn handle(&mut self, req: Request) -> Result<(), End> {
        let log = &self.shared.log;
        match req {
            Request::Hello { .. } => {
                return Err(End::Refuse(
                    ErrorCode::Malformed,
                    "a second Hello on one connection".into(),
                ));
            }
            Request::Append { id, entries } => self.append(id, entries, AppendKind::Plain),
            Request::AppendIf {
                id,
                expected_last,
                entries,
            } => self.append(id, entries, AppendKind::If(expected_last)),
            Request::AppendInSession {
                id,
                session,
                first_seq,
                entries,
            } => self.append(id, entries, AppendKind::InSession { session, first_seq }),
            Request::Trim { id, index } => {
                if self.permits(id, Role::Admin, "trimming the log needs an admin token") {
                    let r = match log.truncate_prefix(index) {
                        Ok(first_index) => {
                            tracing::info!(index, first_index, "trimmed the log on request");
                            Response::Trimmed { id, first_index }
                        }
                        Err(e) => self.error(id, &e),
                    };
                    self.pending.push_back(Pending::Ready(r));
                }
            }
            Request::OpenSession { id } => {
                let why = "this connection is read-only: sessions are for appends, which need a read-write token";
                if self.permits(id, Role::ReadWrite, why) {
                    let p = match log.open_session() {
                        Ok(handle) => Pending::Open {
                            id,
                            handle,
                            start: Instant::now(),
                        },
                        Err(e) => Pending::Ready(self.error(id, &e)),
                    };
                    self.pending.push_back(p);
                }
            }
            Request::Read {
                id,
                from,
                max_bytes,
            } => {
                self.pending.push_back(Pending::Read {
                    id,
                    from,
                    max_bytes: max_bytes as usize,
                    wait: ReadWait::Now,
                    start: Instant::now(),
                });
            }
            Request::ReadWith {
                id,
                from,
                max_bytes,
                consistency,
            } => {
                let max_bytes = max_bytes as usize;
                let wait = match consistency {
                    ReadConsistency::Local => Ok(ReadWait::Now),
                    ReadConsistency::AtLeast(index) if log.commit_index() >= index => {
                        Ok(ReadWait::Now)
                    }
                    ReadConsistency::AtLeast(index) => Ok(ReadWait::AtLeast(index)),
                    ReadConsistency::Linearizable => log.read_index().map(ReadWait::Linearizable),
                };
                let p = match wait {
                    Ok(wait) => Pending::Read {
                        id,
                        from,
                        max_bytes,
                        wait,
                        start: Instant::now(),
                    },
                    Err(e) => Pending::Ready(self.error(id, &e)),
                };
                self.pending.push_back(p);
            }
            Request::Tail { id, from } => {
                if self.tail.is_some() {
                    self.refuse(
                        id,
                        ErrorCode::Malformed,
                        "a tail is already streaming on this connection".into(),
                    );
                } else {
                    let s = log.status();
                    let from = from.max(1);
                    if from < s.first_index && from <= s.commit {
                        let r = self.compacted(id, from);
                        self.pending.push_back(Pending::Ready(r));
                    } else {
                        self.tail = Some(Tail {
                            id,
                            sub: log.subscribe(from),
                            carry: None,
                        });
                    }
                }
            }
            Request::Status { id } => {
                let r = self.status(id);
                self.pending.push_back(Pending::Ready(r));
            }
            Request::Members { id, add, node } => {
                if self.permits(id, Role::Admin, "membership changes need an admin token") {
                    let r = if add {
                        log.add_node(node)
                    } else {
                        log.remove_node(node)
                    };
                    let p = match r {
                        Ok(handle) => Pending::Members {
                            id,
                            handle,
                            start: Instant::now(),
                        },
                        Err(e) => Pending::Ready(self.error(id, &e)),
                    };
                    self.pending.push_back(p);
                }
            }
        }
        self.answer_resolved()
    }

    fn compacted(&self, id: u64, from: u64) -> Response {
        let cp = self.shared.log.latest_checkpoint().map_or(0, |c| c.index);
        Response::Error {
            id: Some(id),
            code: ErrorCode::Compacted,
            message: format!(
                "entries from {from} were truncated after checkpoint {cp}; read from {} on",
                cp + 1
            ),
        }
    }

    /// Committed entries from `from`: about `max_bytes` of payload, clamped to what one
    /// frame holds ([`entries_budget`]), and at least one entry when one is committed.
    fn read(&self, id: u64, from: u64, max_bytes: usize) -> Response {
        let log = &self.shared.log;
        let s = log.status();
        let from = from.max(1);
        if from < s.first_index && from <= s.commit {
            return self.compacted(id, from);
        }
        let frame_budget = entries_budget(self.shared.opts.max_frame_bytes);
        let mut entries = Vec::new();
        let (mut payload, mut cost) = (0, 0);
        let mut index = from;
        while index <= s.commit && (entries.is_empty() || payload < max_bytes) {
            match log.read(index) {
                Ok(Some(data)) => {
                    if !entries.is_empty() && cost + entry_cost(&data) > frame_budget {
                        break;
                    }
                    payload += data.len();
                    cost += entry_cost(&data);
                    entries.push(Entry { index, data });
                }
                Ok(None) => {}
                // A trim came in since the status: what was read is whole; the next read
                // from where this one ends is told.
                Err(ReplicaError::Compacted { .. }) if !entries.is_empty() => break,
                Err(e) => return self.error(id, &e),
            }
            index += 1;
        }
        Response::Entries {
            id,
            commit: s.commit,
            entries,
        }
    }

    fn status(&self, id: u64) -> Response {
        let s = self.shared.log.status();
        Response::Status {
            id,
            node: NodeStatus {
                id: s.id,
                // A recovering node says so where clients look for the role (the protocol's
                // status has no field for the reason; `/status` carries it).
                role: if s.recovering.is_some() {
                    "recovering".into()
                } else {
                    role_name(s.role).into()
                },
                term: s.term,
                commit: s.commit,
                applied: s.applied,
                first_index: s.first_index,
                last_index: s.last_index,
                ring_used_bytes: s.ring_used_bytes,
                ring_bytes: s.ring_capacity_bytes,
                fenced_writes: s.stats.fenced_writes,
                peers: s
                    .peers
                    .iter()
                    .map(|p| (p.id, p.matched, format!("{:?}", p.conn).to_lowercase()))
                    .collect(),
            },
            leader: s.leader.and_then(|l| self.shared.opts.member(l)),
            members: self.shared.opts.members.clone(),
        }
    }

    /// Sends what a tail has to send: committed entries, batched into frames of at most
    /// [`TAIL_BATCH_BYTES`] of entries (and never more than one frame holds).
    fn pump_tail(&mut self) -> Result<(), End> {
        let budget = entries_budget(self.shared.opts.max_frame_bytes).min(TAIL_BATCH_BYTES);
        let Some(tail) = self.tail.as_mut() else {
            return Ok(());
        };
        let id = tail.id;
        let mut entries: Vec<Entry> = tail.carry.take().into_iter().collect();
        let mut cost: usize = entries.iter().map(|e| entry_cost(&e.data)).sum();
        let mut wait = if self.pending.is_empty() && entries.is_empty() {
            Duration::from_millis(1)
        } else {
            Duration::ZERO
        };
        let mut failure = None;
        while cost < budget {
            match tail.sub.next_timeout(wait) {
                Ok(Some((index, data))) => {
                    let e = Entry { index, data };
                    if !entries.is_empty() && cost + entry_cost(&e.data) > budget {
                        tail.carry = Some(e);
                        break;
                    }
                    cost += entry_cost(&e.data);
                    entries.push(e);
                    wait = Duration::ZERO;
                }
                Ok(None) => break,
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
        }
        if !entries.is_empty() {
            let commit = self.shared.log.status().commit;
            self.send(&Response::Entries {
                id,
                commit,
                entries,
            })?;
        }
        if let Some(e) = failure {
            self.tail = None;
            let r = self.error(id, &e);
            self.send(&r)?;
        }
        Ok(())
    }
}

/// The protocol's code for a replica error (`NotLeader` is answered with a redirect instead).
fn error_code(e: &ReplicaError) -> ErrorCode {
    match e {
        ReplicaError::TooLarge { .. } => ErrorCode::EntryTooLarge,
        // Both may be in the log: the client must not resend blindly.
        ReplicaError::Timeout { .. } | ReplicaError::OutcomeUnknown { .. } => ErrorCode::Timeout,
        // Nothing was read: retrying is safe.
        ReplicaError::ReadTimeout { .. } => ErrorCode::Timeout,
        ReplicaError::Compacted { .. } => ErrorCode::Compacted,
        ReplicaError::Superseded { .. } | ReplicaError::Dropped(_) => ErrorCode::NotCommitted,
        // Transient: the client retries with backoff until the change before it applied.
        ReplicaError::MembershipPending => ErrorCode::Busy,
        ReplicaError::Closed => ErrorCode::ShuttingDown,
        ReplicaError::UnknownSession { .. } => ErrorCode::UnknownSession,
        ReplicaError::SessionSequence { .. } => ErrorCode::SessionSequence,
        ReplicaError::SessionTooOld { .. } => ErrorCode::SessionTooOld,
        _ => ErrorCode::Internal,
    }
}

/// The answer to a batch of `sent` entries of which the first committed at `first..=last`
/// and a new leader replaced the rest, for a client of protocol `version`.
fn partial_answer(version: u16, id: u64, first: u64, last: u64, sent: usize) -> Response {
    if version >= 2 {
        return Response::PartlyAppended { id, first, last };
    }
    // Version 1 has no answer that says so; Timeout is the one its clients do not resend.
    let committed = last - first + 1;
    Response::Error {
        id: Some(id),
        code: ErrorCode::Timeout,
        message: format!(
            "only the first {committed} of the batch's {sent} entries committed (at {first}..={last}); a new leader replaced the other {}, which are not in the log: append only those again",
            sent as u64 - committed
        ),
    }
}

/// What the handles of an append batch say together.
#[derive(Debug)]
enum BatchOutcome {
    /// Entries are still pending, and none of the others decide the answer.
    Pending,
    /// Every entry committed, at `first..=last`.
    Committed { first: u64, last: u64 },
    /// The batch's first entries committed at `first..=last`; a new leader replaced the rest,
    /// which are certainly not in the log.
    Partial { first: u64, last: u64 },
    /// No entry is in the log (superseded or dropped): the first entry's error.
    NotCommitted(ReplicaError),
    /// Whether some entries are in the log cannot be told: why.
    Unknown(String),
    /// Another failure (the log closed or failed): the first one.
    Failed(ReplicaError),
}

/// How an append asks to be ordered.
#[derive(Clone, Copy)]
enum AppendKind {
    Plain,
    /// Only if the log ends at this index.
    If(u64),
    /// In a session, numbered from `first_seq`.
    InSession {
        session: u64,
        first_seq: u64,
    },
}

/// What the handles of an `AppendInSession` call for.
#[derive(Debug)]
enum SessionOutcome {
    Pending,
    /// Every entry committed, at these indexes.
    Committed(Vec<u64>),
    /// Some entry's outcome cannot be told: why. Resending is safe.
    Unknown(String),
    /// The first failure: `Superseded`/`Dropped` (not in the log: resend, safely) or the log's
    /// own failure.
    Failed(ReplicaError),
}

/// Sorts the results of a session batch's handles. Unlike [`batch_outcome`], nothing needs
/// working out about prefixes: resending the whole batch appends nothing twice, so any entry
/// not in the log makes the answer "resend", and any unknown one "unknown, resend".
fn session_outcome(results: Vec<Option<Result<u64, ReplicaError>>>) -> SessionOutcome {
    let mut indexes = Vec::with_capacity(results.len());
    let mut unknown = None;
    let mut pending = false;
    for r in results {
        match r {
            Some(Ok(i)) => indexes.push(i),
            Some(Err(e @ ReplicaError::OutcomeUnknown { .. })) => {
                unknown.get_or_insert_with(|| e.to_string());
            }
            Some(Err(e)) => return SessionOutcome::Failed(e),
            None => pending = true,
        }
    }
    match unknown {
        Some(why) => SessionOutcome::Unknown(why),
        None if pending => SessionOutcome::Pending,
        None => SessionOutcome::Committed(indexes),
    }
}

/// Sorts the results of a batch's handles, `(ticket index, result)` in batch order, into
/// the answer they call for.
///
/// raft's log matching makes the committed entries of a batch a prefix of it: a log that
/// holds the batch's entry at index `i` holds the same leader's entries before `i`. So the
/// entries before the first superseded one are waited for and reported as committed, and those
/// from it on as not in the log. Anything that contradicts this, or that cannot be told, is
/// answered as unknown, never as "resend".
fn batch_outcome(results: Vec<(u64, Option<Result<u64, ReplicaError>>)>) -> BatchOutcome {
    let first = results.first().map_or(0, |r| r.0);
    let last = results.last().map_or(0, |r| r.0);
    // The first entry certainly not in the log, by position.
    let mut replaced: Option<(usize, ReplicaError)> = None;
    let mut unknown: Option<String> = None;
    let mut pending_before = false;
    let mut committed_after = false;
    for (at, (_, r)) in results.into_iter().enumerate() {
        match r {
            Some(Err(e @ (ReplicaError::Superseded { .. } | ReplicaError::Dropped(_))))
                if replaced.is_none() =>
            {
                replaced = Some((at, e));
            }
            Some(Err(ReplicaError::Superseded { .. } | ReplicaError::Dropped(_))) => {}
            Some(Err(e @ ReplicaError::OutcomeUnknown { .. })) => {
                unknown.get_or_insert_with(|| e.to_string());
            }
            Some(Err(e)) => return BatchOutcome::Failed(e),
            Some(Ok(_)) if replaced.is_some() => committed_after = true,
            Some(Ok(_)) => {}
            None if replaced.is_none() => pending_before = true,
            None => {}
        }
    }
    if let Some(why) = unknown {
        return BatchOutcome::Unknown(why);
    }
    match replaced {
        Some((at, _)) if committed_after => BatchOutcome::Unknown(format!(
            "entries of the batch committed after its entry {at}, which a new leader replaced"
        )),
        Some(_) if pending_before => BatchOutcome::Pending,
        Some((0, e)) => BatchOutcome::NotCommitted(e),
        Some((at, _)) => BatchOutcome::Partial {
            first,
            last: first + at as u64 - 1,
        },
        None if pending_before => BatchOutcome::Pending,
        None => BatchOutcome::Committed { first, last },
    }
}

impl From<FrameError> for End {
    fn from(e: FrameError) -> Self {
        match e {
            FrameError::Closed | FrameError::Io(_) => End::Gone,
            other => End::Refuse(ErrorCode::Malformed, other.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(index: u64) -> (u64, Option<Result<u64, ReplicaError>>) {
        (index, Some(Ok(index)))
    }

    fn superseded(index: u64) -> (u64, Option<Result<u64, ReplicaError>>) {
        (index, Some(Err(ReplicaError::Superseded { index })))
    }

    fn unknown(index: u64) -> (u64, Option<Result<u64, ReplicaError>>) {
        (index, Some(Err(ReplicaError::OutcomeUnknown { index })))
    }

    fn pending(index: u64) -> (u64, Option<Result<u64, ReplicaError>>) {
        (index, None)
    }

    #[test]
    fn a_committed_prefix_is_never_answered_as_not_committed() {
        // A new leader kept 10 and 11 and replaced 12 and 13.
        let o = batch_outcome(vec![ok(10), ok(11), superseded(12), superseded(13)]);
        assert!(
            matches!(
                o,
                BatchOutcome::Partial {
                    first: 10,
                    last: 11
                }
            ),
            "{o:?}"
        );
        // Nothing kept: resend it all.
        let o = batch_outcome(vec![superseded(10), superseded(11)]);
        assert!(matches!(o, BatchOutcome::NotCommitted(_)), "{o:?}");
        // The prefix is not decided yet: wait for it rather than answer.
        let o = batch_outcome(vec![ok(10), pending(11), superseded(12)]);
        assert!(matches!(o, BatchOutcome::Pending), "{o:?}");
        let o = batch_outcome(vec![ok(10), ok(11)]);
        assert!(
            matches!(
                o,
                BatchOutcome::Committed {
                    first: 10,
                    last: 11
                }
            ),
            "{o:?}"
        );
    }

    #[test]
    fn an_unknown_outcome_is_never_answered_as_not_committed() {
        let o = batch_outcome(vec![unknown(10), superseded(11)]);
        assert!(matches!(o, BatchOutcome::Unknown(_)), "{o:?}");
        let o = batch_outcome(vec![unknown(10), unknown(11)]);
        assert!(matches!(o, BatchOutcome::Unknown(_)), "{o:?}");
        // Committed entries after a superseded one contradict raft's log matching: whatever
        // happened, do not ask for a resend.
        let o = batch_outcome(vec![ok(10), superseded(11), ok(12)]);
        assert!(matches!(o, BatchOutcome::Unknown(_)), "{o:?}");
        // The log closing is answered as before (ShuttingDown, through `error`).
        let o = batch_outcome(vec![ok(10), (11, Some(Err(ReplicaError::Closed)))]);
        assert!(
            matches!(o, BatchOutcome::Failed(ReplicaError::Closed)),
            "{o:?}"
        );
        // A lone unknown entry (an append or a membership change) is a Timeout, not a resend.
        let e = ReplicaError::OutcomeUnknown { index: 10 };
        assert_eq!(error_code(&e), ErrorCode::Timeout);
        assert_eq!(
            error_code(&ReplicaError::Superseded { index: 10 }),
            ErrorCode::NotCommitted
        );
    }

    #[test]
    fn a_partial_batch_is_answered_in_the_clients_protocol_version() {
        assert_eq!(
            partial_answer(2, 5, 10, 11, 4),
            Response::PartlyAppended {
                id: 5,
                first: 10,
                last: 11
            }
        );
        match partial_answer(1, 5, 10, 11, 4) {
            Response::Error {
                id: Some(5),
                code: ErrorCode::Timeout,
                message,
            } => assert!(
                message.contains("first 2 of the batch's 4") && message.contains("10..=11"),
                "{message}"
            ),
            other => panic!("{other:?}"),
        }
    }
}
