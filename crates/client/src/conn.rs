//! One connection to one server: TCP (or TLS over it), the hello, and framed requests and
//! responses. Frames are read into a buffer, so a read timeout never loses part of a frame
//! (a tail waits with timeouts between frames).

use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

use proto::{ErrorCode, NodeInfo, PROTOCOL_VERSION, Request, Response, Role};

use crate::{ClientConfig, ClientError, tls};

/// Shortest socket timeout we set (zero means "none" to the OS, which we never want).
const MIN_WAIT: Duration = Duration::from_millis(1);

/// A byte stream to a server.
enum Stream {
    Plain(TcpStream),
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
}

impl Stream {
    fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Plain(s) => s,
            Stream::Tls(s) => &s.sock,
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read(buf),
            // One socket read a call: `StreamOwned::read` loops until a whole record came,
            // so a server trickling one held the call past its deadline.
            Stream::Tls(s) => proto::tls::read_some(&mut s.conn, &mut s.sock, buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write(buf),
            Stream::Tls(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Plain(s) => s.flush(),
            Stream::Tls(s) => s.flush(),
        }
    }
}

/// Why one attempt failed in a way another attempt may fix.
#[derive(Debug)]
pub(crate) enum Failure {
    /// Could not connect, finish TLS or the hello.
    Connect { addr: String, why: String },
    /// The server knows no leader.
    NoLeader,
    /// The connection broke (or no answer came in time) during a request.
    Broken { addr: String, err: io::Error },
    /// The server is busy or shutting down. `maybe_acted`: the request may have been acted on
    /// (`ShuttingDown` for a pending append: it may or may not have committed); `Busy` and
    /// `NotCommitted` say it certainly was not.
    Busy {
        addr: String,
        message: String,
        maybe_acted: bool,
    },
}

/// What the retry loop does after an attempt.
#[derive(Debug)]
pub(crate) enum Step {
    /// Back off, then try again (on a new connection).
    Retry(Failure),
    /// Go to the leader, now.
    Redirect(NodeInfo),
    /// The server says the request did not complete in its time (it may still).
    TimedOut(String),
    /// Give up with this error; `keep_conn` when the connection itself is still good.
    Fatal { err: ClientError, keep_conn: bool },
}

impl Step {
    fn fatal(err: ClientError) -> Step {
        Step::Fatal {
            err,
            keep_conn: false,
        }
    }
}

/// Why a frame could not be received.
#[derive(Debug)]
pub(crate) enum RecvError {
    /// The connection broke or closed.
    Io(io::Error),
    /// The bytes are not a frame we accept.
    Protocol(String),
}

/// Whether the server means "try again, elsewhere or later": `Busy`, `ShuttingDown`, and
/// `NotCommitted` (raft dropped the proposal or a new leader's entries took its place: the
/// entries are certainly not in the log, so resending cannot duplicate them).
pub(crate) fn retryable(code: ErrorCode) -> bool {
    matches!(
        code,
        ErrorCode::Busy | ErrorCode::ShuttingDown | ErrorCode::NotCommitted
    )
}

/// The request id a response answers, if it names one.
fn response_id(r: &Response) -> Option<u64> {
    match r {
        Response::Welcome { .. } => None,
        Response::Appended { id, .. }
        | Response::PartlyAppended { id, .. }
        | Response::Entries { id, .. }
        | Response::Status { id, .. }
        | Response::MembershipChanged { id, .. }
        | Response::Redirect { id, .. }
        | Response::ConditionFailed { id, .. }
        | Response::SessionOpened { id, .. }
        | Response::AppendedAt { id, .. }
        | Response::Trimmed { id, .. } => Some(*id),
        Response::Error { id, .. } => *id,
    }
}

/// Sets the id of any request but a hello.
pub(crate) fn set_id(req: &mut Request, new: u64) {
    match req {
        Request::Hello { .. } => {}
        Request::Append { id, .. }
        | Request::AppendIf { id, .. }
        | Request::Read { id, .. }
        | Request::Tail { id, .. }
        | Request::Status { id }
        | Request::Members { id, .. }
        | Request::ReadWith { id, .. }
        | Request::OpenSession { id }
        | Request::AppendInSession { id, .. }
        | Request::Trim { id, .. } => *id = new,
    }
}

/// An open, welcomed connection.
pub(crate) struct Conn {
    stream: Stream,
    /// The address it was opened to.
    pub(crate) addr: String,
    /// The server's node id.
    pub(crate) node_id: u64,
    /// The leader the server knew at the hello.
    pub(crate) leader: Option<NodeInfo>,
    /// What the token allows here.
    pub(crate) role: Role,
    rbuf: Vec<u8>,
    /// What one socket read fills, before it joins `rbuf`.
    chunk: Vec<u8>,
    wbuf: Vec<u8>,
    max_frame: u32,
    request_timeout: Duration,
    /// When the last request's answer arrived (or the hello's).
    last_used: Instant,
    /// Whether a request (not the hello) was answered on it.
    answered: bool,
}

/// A connection that answered a request and then sat unused for at least this long may have
/// been closed by the server for idleness just as a request went out (`idle_timeout`,
/// PROTOCOL.md 4.3): a connection-level `Malformed` answering it is taken for that close, and
/// the request goes again, once, on a new connection (the server read none of it).
const IDLE_RACE: Duration = Duration::from_secs(1);

/// [`Conn::stale`] looks at the socket only after the connection was unused this long.
const STALE_CHECK_AFTER: Duration = Duration::from_millis(20);

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("addr", &self.addr)
            .field("node_id", &self.node_id)
            .field("tls", &matches!(self.stream, Stream::Tls(_)))
            .field("role", &self.role)
            .finish_non_exhaustive()
    }
}

/// The first bytes of a TLS record (handshake or alert, any TLS version).
fn looks_like_tls(bytes: &[u8]) -> bool {
    bytes.len() >= 2 && matches!(bytes[0], 0x15 | 0x16) && bytes[1] == 0x03
}

impl Conn {
    /// Connects to `addr`, finishes TLS and the hello within `connect_timeout` (and before
    /// `deadline`), all of it: each step gets what is left, the TLS handshake as a whole.
    pub(crate) fn open(
        cfg: &ClientConfig,
        tls_cfg: Option<&Arc<rustls::ClientConfig>>,
        addr: &str,
        deadline: Instant,
    ) -> Result<Conn, Step> {
        let connect_failed = |why: String| {
            Step::Retry(Failure::Connect {
                addr: addr.to_string(),
                why,
            })
        };
        let start = Instant::now();
        let until = deadline.min(start + cfg.connect_timeout);
        let rest = || {
            until
                .saturating_duration_since(Instant::now())
                .max(MIN_WAIT)
        };
        let resolved: Vec<_> = addr
            .to_socket_addrs()
            .map_err(|e| connect_failed(format!("cannot resolve the address: {e}")))?
            .collect();
        let mut last = None;
        let mut tcp = None;
        for sa in resolved {
            match TcpStream::connect_timeout(&sa, rest()) {
                Ok(s) => {
                    tcp = Some(s);
                    break;
                }
                Err(e) => last = Some(e),
            }
        }
        let tcp = tcp.ok_or_else(|| {
            connect_failed(match last {
                Some(e) => e.to_string(),
                None => "the address resolves to nothing".into(),
            })
        })?;
        let setup = |e: io::Error| connect_failed(e.to_string());
        tcp.set_nodelay(true).map_err(setup)?;
        // A tail waits with no deadline: without keepalive, one on a member whose machine
        // died (no FIN, no RST) waited for good instead of moving to another member.
        if let Err(e) = proto::set_keepalive(&tcp) {
            // A system without these options still serves; only a dead peer is found later.
            tracing::debug!(%addr, error = %e, "cannot turn on TCP keepalive");
        }
        tcp.set_read_timeout(Some(rest())).map_err(setup)?;
        tcp.set_write_timeout(Some(rest())).map_err(setup)?;
        let tls_failed = |e: &io::Error| {
            Step::fatal(ClientError::Tls(format!(
                "{addr}: {e} (check the CA, the server name and the client certificate)"
            )))
        };
        let stream = match tls_cfg {
            None => Stream::Plain(tcp),
            Some(tc) => {
                let name = tls::server_name(
                    cfg.tls.as_ref().and_then(|t| t.server_name.as_deref()),
                    addr,
                )
                .map_err(Step::fatal)?;
                let conn = rustls::ClientConnection::new(tc.clone(), name)
                    .map_err(|e| Step::fatal(ClientError::Tls(format!("{addr}: {e}"))))?;
                let mut s = rustls::StreamOwned::new(conn, tcp);
                // The whole handshake by the attempt's deadline: a server that trickles its
                // handshake a byte at a time would hold each read, and the attempt, as long
                // as it likes.
                let by = Instant::now() + rest();
                if let Err(e) = proto::tls::handshake(&mut s.conn, &mut s.sock, by) {
                    return Err(if tls::is_tls_failure(&e) {
                        tls_failed(&e)
                    } else {
                        connect_failed(format!("TLS handshake: {e}"))
                    });
                }
                s.sock.set_read_timeout(Some(rest())).map_err(setup)?;
                s.sock.set_write_timeout(Some(rest())).map_err(setup)?;
                Stream::Tls(Box::new(s))
            }
        };
        let mut c = Conn {
            stream,
            addr: addr.to_string(),
            node_id: 0,
            leader: None,
            role: Role::ReadOnly,
            rbuf: Vec::new(),
            chunk: vec![0; 64 << 10],
            wbuf: Vec::new(),
            max_frame: cfg.max_frame_bytes,
            request_timeout: cfg.request_timeout,
            last_used: Instant::now(),
            answered: false,
        };
        let hello = Request::Hello {
            version: PROTOCOL_VERSION,
            cluster_id: cfg.cluster_id,
            token: cfg.token.clone(),
        };
        if let Err(e) = c.send(&hello) {
            return Err(if tls::is_tls_failure(&e) {
                tls_failed(&e)
            } else {
                connect_failed(format!("sending the hello: {e}"))
            });
        }
        let plain = matches!(c.stream, Stream::Plain(_));
        let not_tls = |c: &Conn| plain && looks_like_tls(&c.rbuf);
        let requires_tls = || {
            Step::fatal(ClientError::Protocol(format!(
                "{addr} answered with TLS: the server requires TLS (give the CA that signed its certificate)"
            )))
        };
        let answer = c.recv(rest());
        match answer {
            Ok(Some(Response::Welcome {
                node_id,
                leader,
                role,
            })) => {
                c.node_id = node_id;
                c.leader = leader;
                c.role = role;
            }
            Ok(Some(Response::Error { code, message, .. })) if retryable(code) => {
                return Err(Step::Retry(Failure::Busy {
                    addr: addr.to_string(),
                    message,
                    maybe_acted: false,
                }));
            }
            Ok(Some(Response::Error { code, message, .. })) => {
                return Err(Step::fatal(ClientError::Refused { code, message }));
            }
            Ok(Some(other)) => {
                return Err(Step::fatal(ClientError::Protocol(format!(
                    "{addr} answered the hello with {other:?}"
                ))));
            }
            Ok(None) if not_tls(&c) => return Err(requires_tls()),
            Ok(None) => {
                return Err(connect_failed(format!(
                    "no answer to the hello within {:?} of connecting",
                    start.elapsed()
                )));
            }
            Err(_) if not_tls(&c) => return Err(requires_tls()),
            Err(RecvError::Io(e)) if tls::is_tls_failure(&e) => return Err(tls_failed(&e)),
            Err(RecvError::Io(e)) => {
                let hint = if plain {
                    " (if the server requires TLS, give its CA)"
                } else {
                    ""
                };
                return Err(connect_failed(format!("during the hello: {e}{hint}")));
            }
            Err(RecvError::Protocol(m)) => {
                return Err(Step::fatal(ClientError::Protocol(format!("{addr}: {m}"))));
            }
        }
        let tcp = c.stream.tcp();
        let _ = tcp.set_write_timeout(Some(cfg.request_timeout.max(MIN_WAIT)));
        c.last_used = Instant::now();
        Ok(c)
    }

    /// Writes one frame.
    pub(crate) fn send(&mut self, req: &Request) -> io::Result<()> {
        proto::encode_frame(req, &mut self.wbuf)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        self.stream.write_all(&self.wbuf)?;
        self.stream.flush()
    }

    /// The next frame, if one arrives within `wait`.
    pub(crate) fn recv(&mut self, wait: Duration) -> Result<Option<Response>, RecvError> {
        let until = Instant::now() + wait;
        loop {
            if let Some(r) = self.parse()? {
                return Ok(Some(r));
            }
            let now = Instant::now();
            if now >= until {
                return Ok(None);
            }
            self.stream
                .tcp()
                .set_read_timeout(Some((until - now).max(MIN_WAIT)))
                .map_err(RecvError::Io)?;
            match self.stream.read(&mut self.chunk) {
                Ok(0) => {
                    return Err(RecvError::Io(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the server closed the connection",
                    )));
                }
                Ok(n) => self.rbuf.extend_from_slice(&self.chunk[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock
                            | io::ErrorKind::TimedOut
                            | io::ErrorKind::Interrupted
                    ) => {}
                Err(e) => return Err(RecvError::Io(e)),
            }
        }
    }

    /// A whole frame from the buffer, if one is there.
    fn parse(&mut self) -> Result<Option<Response>, RecvError> {
        let Some(head) = self.rbuf.get(..4) else {
            return Ok(None);
        };
        let len = u32::from_le_bytes(head.try_into().expect("4 bytes"));
        if len > self.max_frame {
            return Err(RecvError::Protocol(format!(
                "a frame of {len} bytes exceeds this client's {}-byte limit",
                self.max_frame
            )));
        }
        let end = 4 + len as usize;
        if self.rbuf.len() < end {
            return Ok(None);
        }
        let r = proto::decode_body(&self.rbuf[4..end], self.max_frame);
        self.rbuf.drain(..end);
        r.map(Some).map_err(|e| RecvError::Protocol(e.to_string()))
    }

    /// Whether the server said something unasked or closed the connection since the last
    /// answer: only a connection-level error (an idle close, a shutdown) or the close itself
    /// can arrive then, so the connection is of no more use and no request has been lost
    /// on it. Reads through TLS, so that records carrying nothing for us (a session ticket)
    /// do not count, and plaintext TLS already holds does.
    pub(crate) fn stale(&mut self) -> bool {
        if !self.rbuf.is_empty() {
            return true;
        }
        if self.last_used.elapsed() < STALE_CHECK_AFTER {
            // Back-to-back requests skip the three system calls; what a server says in
            // between (a shutdown notice) answers the next request, and is retried.
            return false;
        }
        if self.stream.tcp().set_nonblocking(true).is_err() {
            return true;
        }
        let arrived = match self.stream.read(&mut self.chunk) {
            // Bytes nobody asked for (the connection is dropped with them), or the close.
            Ok(_) => true,
            Err(e) => !matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
            ),
        };
        self.stream.tcp().set_nonblocking(false).is_err() || arrived
    }

    /// A broken connection, as a step.
    pub(crate) fn broken(&self, err: io::Error) -> Step {
        Step::Retry(Failure::Broken {
            addr: self.addr.clone(),
            err,
        })
    }

    /// Sends `req` (whose id is `id`) and waits for its answer, at most the request timeout
    /// and never past `deadline`. Redirects, retryable and fatal errors come back as steps.
    pub(crate) fn call(
        &mut self,
        req: &Request,
        id: u64,
        deadline: Instant,
    ) -> Result<Response, Step> {
        // Only a connection that answered before and then sat unused can meet an idle close.
        let idle_race = self.answered && self.last_used.elapsed() >= IDLE_RACE;
        self.send(req).map_err(|e| self.broken(e))?;
        let wait = self
            .request_timeout
            .min(deadline.saturating_duration_since(Instant::now()));
        let resp = match self.recv(wait) {
            Ok(Some(r)) => r,
            Ok(None) => {
                return Err(self.broken(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("no answer within {wait:?}"),
                )));
            }
            Err(RecvError::Io(e)) => return Err(self.broken(e)),
            Err(RecvError::Protocol(m)) => {
                return Err(Step::fatal(ClientError::Protocol(format!(
                    "{}: {m}",
                    self.addr
                ))));
            }
        };
        if response_id(&resp).is_some_and(|r| r != id) {
            return Err(Step::fatal(ClientError::Protocol(format!(
                "{} answered request {:?} while request {id} was pending",
                self.addr,
                response_id(&resp)
            ))));
        }
        self.last_used = Instant::now();
        self.answered = true;
        match resp {
            Response::Error {
                id: None,
                code,
                message,
            } => Err(if retryable(code) {
                Step::Retry(Failure::Busy {
                    addr: self.addr.clone(),
                    message,
                    maybe_acted: code == ErrorCode::ShuttingDown,
                })
            } else if code == ErrorCode::Malformed && idle_race {
                // The idle close crossed our request. The new connection has answered
                // nothing, so a real `Malformed` on it is returned: one resend at most.
                Step::Retry(Failure::Broken {
                    addr: self.addr.clone(),
                    err: io::Error::new(io::ErrorKind::ConnectionReset, message),
                })
            } else {
                Step::fatal(ClientError::Refused { code, message })
            }),
            Response::Error { code, message, .. } => Err(match code {
                c if retryable(c) => Step::Retry(Failure::Busy {
                    addr: self.addr.clone(),
                    message,
                    maybe_acted: c == ErrorCode::ShuttingDown,
                }),
                ErrorCode::Timeout => Step::TimedOut(format!("{}: {message}", self.addr)),
                _ => Step::Fatal {
                    err: ClientError::Refused { code, message },
                    keep_conn: true,
                },
            }),
            Response::Redirect {
                leader: Some(l), ..
            } => Err(Step::Redirect(l)),
            Response::Redirect { leader: None, .. } => Err(Step::Retry(Failure::NoLeader)),
            other => Ok(other),
        }
    }
}

/// The error to return for `failure` once the deadline has passed.
pub(crate) fn give_up(failure: Failure, waited: Duration, tried: &[String]) -> ClientError {
    match failure {
        Failure::Connect { addr, why } => ClientError::Unreachable {
            tried: tried.to_vec(),
            last: format!("{addr}: {why}"),
        },
        Failure::NoLeader => ClientError::NoLeader { waited },
        Failure::Broken { addr, err } => {
            if matches!(
                err.kind(),
                io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock
            ) {
                ClientError::Timeout {
                    waited,
                    last: format!("{addr}: {err}"),
                }
            } else {
                ClientError::Io(io::Error::new(err.kind(), format!("{addr}: {err}")))
            }
        }
        Failure::Busy { addr, message, .. } => ClientError::Timeout {
            waited,
            last: format!("{addr}: {message}"),
        },
    }
}
