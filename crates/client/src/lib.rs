//! The rdmalog client: appends, reads, tails and administers a cluster over the TCP (TLS)
//! client protocol ([`proto`]).
//!
//! ```no_run
//! use client::{Client, ClientConfig};
//!
//! let mut cfg = ClientConfig::new(vec!["10.0.0.1:7000".into(), "10.0.0.2:7000".into()], 0xc1);
//! cfg.token = Some("writer-token".into());
//! # cfg.tls = None;
//! let mut c = Client::connect(cfg)?;
//! let (first, last) = c.append(&[b"one", b"two"])?;
//! let (entries, commit) = c.read(first, 1 << 20)?;
//! assert!(entries.len() == 2 && commit >= last);
//! # Ok::<(), client::ClientError>(())
//! ```
//!
//! # Finding the leader and retrying
//!
//! A [`Client`] holds one connection at a time, to any member. Appends and membership changes
//! must reach the leader: a follower answers `Redirect` and the client follows it at once.
//! When no leader is known (an election), when a connection breaks, and when a server is busy
//! or shutting down, the client backs off exponentially (20 ms doubling to 1 s, with jitter)
//! and tries again, rotating through [`ClientConfig::servers`] and the addresses it learned
//! from redirects and status answers, until [`ClientConfig::deadline`] has passed since the
//! call began.
//!
//! A proposal that a new leader superseded or that raft dropped is not in the log; the server
//! reports it as `NotCommitted`, and the client resends it the same way.
//!
//! A connection the server closed while it was unused (`idle_timeout`, a shutdown) is
//! replaced before the next request goes out, and a connection-level `Malformed` answering a
//! request on a connection that answered one before and then sat unused for a second or more
//! is taken for an idle close that crossed it (the server read none of it): the request goes again, once, on a new
//! connection (`tests/client.rs`, `a_connection_closed_for_idleness_is_replaced_silently`;
//! `tests/partial_batch.rs`, `an_idle_close_crossing_a_request_is_retried_once`).
//!
//! The client speaks protocol version 4 ([`proto::PROTOCOL_VERSION`]); servers of an older
//! build refuse it with `WrongVersion`: upgrade servers first.
//!
//! It never retries what retrying cannot fix: `Unauthorized`, `WrongCluster`, `WrongVersion`,
//! `EntryTooLarge`, `Malformed` (and `TooLarge`, `Compacted`, any other `Internal`) come back at
//! once as [`ClientError::Refused`], TLS failures as [`ClientError::Tls`]; the one exception is
//! the idle close above.
//!
//! # Appends are exactly once
//!
//! By default ([`ClientConfig::exactly_once`]) a client appends through a *session* it opens
//! on the leader before its first append (`docs/PROTOCOL.md` 6.1): each entry carries the
//! session and a number, and the leader never appends a number its log already holds, but
//! answers with the first copy's index. So the client resends the same batch after a broken
//! connection, no answer, `ShuttingDown`, `NotCommitted` or a server's `Timeout`, to
//! whichever node leads, and each entry is in the log once. What remains uncertain is only a
//! call that fails for good ([`ClientError::Timeout`] at the deadline, [`ClientError::Io`],
//! `UnknownSession` for a batch already sent, and [`ClientError::MaybeAppended`]: any other
//! failure after a send that went unanswered): its batch may or may not be in the log, and the
//! client's next append opens a new session. The simulator's seed family
//! `sim/tests/sessions.rs` and `tests/sessions.rs` test this.
//!
//! With `exactly_once` off, appends are **at least once**: a retry after a broken connection
//! (or `ShuttingDown`, or no answer within the request timeout) may apply the batch twice; a
//! batch a change of leader kept only in part returns [`ClientError::PartlyCommitted`], which
//! names the committed prefix (nothing is resent); an append whose outcome cannot be told
//! (`Timeout`) is not resent.
//!
//! # Threads and async
//!
//! Calls block the calling thread. [`Client::append_async`] returns a [`PendingAppend`], a
//! [`Future`] that needs no runtime: a thread of its own does the
//! blocking call on its own connection and wakes the task when it is done.

#![deny(unsafe_code)]

mod conn;
mod error;
mod pending;
mod tail;
pub mod tls;

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use proto::{ErrorCode, NodeInfo, NodeStatus, Request, Response, Role};

use conn::{Conn, Failure, Step, give_up, set_id};

pub use error::ClientError;
pub use pending::PendingAppend;
pub use proto::{Entry, ReadConsistency};
pub use tail::Tail;

/// First backoff delay.
const BACKOFF_START: Duration = Duration::from_millis(20);
/// Longest backoff delay.
const BACKOFF_MAX: Duration = Duration::from_secs(1);
/// Redirects followed in a row before backing off (the leader keeps moving).
const MAX_HOPS: u32 = 4;

/// The least time a connection attempt gets while other addresses wait their turn (see
/// [`ClientConfig::connect_timeout`]), or what is left of the call if less.
const MIN_ATTEMPT: Duration = Duration::from_millis(500);

/// The longest timeout or deadline of a [`ClientConfig`]: far past any wait that makes sense,
/// and well inside what the clock's arithmetic takes.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(365 * 86_400);

/// Most members a `Status` answer may list: a longer list is not a real cluster's, and each
/// member costs an address to try and, in [`Client::cluster_status`], a thread.
pub const MAX_MEMBERS: usize = 1024;

/// How to reach a cluster.
#[derive(Clone)]
pub struct ClientConfig {
    /// `host:port` of any members (one is enough; more help when it is down).
    pub servers: Vec<String>,
    /// The cluster id the servers must have.
    pub cluster_id: u64,
    /// The token that grants a role; `None` gets the servers' anonymous role.
    pub token: Option<String>,
    /// TLS; `None` is plain TCP.
    pub tls: Option<TlsConfig>,
    /// Longest a connection (TCP, TLS handshake and hello) may take. An attempt at an address
    /// of the rotation also gets at most an even share of the call's time left among the
    /// addresses it has not tried yet (at least half a second), so a member that accepts and
    /// never answers leaves time to try the others within a short `deadline`.
    pub connect_timeout: Duration,
    /// Longest to wait for the answer to one request before treating the connection as
    /// broken. Keep it above the servers' append timeout (10 s by default), so that a slow
    /// commit is reported by the server rather than retried.
    pub request_timeout: Duration,
    /// Total time a call may spend, retries included.
    pub deadline: Duration,
    /// Largest frame body sent or accepted (at most [`proto::MAX_FRAME_LIMIT`]).
    pub max_frame_bytes: u32,
    /// Append through a session, so that a resent batch is never appended twice (see the
    /// crate docs). On by default; off, appends are plain `Append`s, at least once.
    pub exactly_once: bool,
}

impl std::fmt::Debug for ClientConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The token is a secret: say whether there is one, never what it is.
        f.debug_struct("ClientConfig")
            .field("servers", &self.servers)
            .field("cluster_id", &format_args!("{:#x}", self.cluster_id))
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("tls", &self.tls)
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("deadline", &self.deadline)
            .field("max_frame_bytes", &self.max_frame_bytes)
            .field("exactly_once", &self.exactly_once)
            .finish()
    }
}

impl ClientConfig {
    /// Plain TCP to `servers` of cluster `cluster_id`, no token, and default timeouts:
    /// connect 3 s, request 15 s, deadline 30 s.
    pub fn new(servers: Vec<String>, cluster_id: u64) -> Self {
        ClientConfig {
            servers,
            cluster_id,
            token: None,
            tls: None,
            connect_timeout: Duration::from_secs(3),
            request_timeout: Duration::from_secs(15),
            deadline: Duration::from_secs(30),
            max_frame_bytes: proto::DEFAULT_MAX_FRAME_BYTES,
            exactly_once: true,
        }
    }

    fn validate(&self) -> Result<(), ClientError> {
        if self.servers.is_empty() {
            return Err(ClientError::Config(
                "no server addresses: give at least one host:port".into(),
            ));
        }
        if let Some(bad) = self.servers.iter().find(|s| !s.contains(':')) {
            return Err(ClientError::Config(format!(
                "{bad:?} is not host:port (the port is required)"
            )));
        }
        if !(1024..=proto::MAX_FRAME_LIMIT).contains(&self.max_frame_bytes) {
            return Err(ClientError::Config(format!(
                "max_frame_bytes must be 1 KiB ..= {} bytes, not {}",
                proto::MAX_FRAME_LIMIT,
                self.max_frame_bytes
            )));
        }
        for (what, d) in [
            ("connect_timeout", self.connect_timeout),
            ("request_timeout", self.request_timeout),
            ("deadline", self.deadline),
        ] {
            if d.is_zero() || d > MAX_TIMEOUT {
                return Err(ClientError::Config(format!(
                    "{what} must be positive and at most {} days, not {d:?}",
                    MAX_TIMEOUT.as_secs() / 86_400
                )));
            }
        }
        Ok(())
    }
}

/// TLS settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsConfig {
    /// PEM bundle of the CAs that sign the servers' certificates.
    pub ca: PathBuf,
    /// A client certificate and its key (PEM), for servers that require one.
    pub client_cert: Option<(PathBuf, PathBuf)>,
    /// The name the servers' certificates must carry; default: the host part of each
    /// address (a DNS name or an IP address).
    pub server_name: Option<String>,
}

/// One node's answer to `Status`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatusReport {
    /// The address that answered.
    pub addr: String,
    /// Its state.
    pub node: NodeStatus,
    /// The leader it knows.
    pub leader: Option<NodeInfo>,
    /// Every member, as its configuration lists them.
    pub members: Vec<NodeInfo>,
}

/// Exponential backoff with jitter.
#[derive(Debug)]
struct Backoff {
    next: Duration,
    rng: u64,
}

impl Backoff {
    fn new() -> Backoff {
        // A random seed without a dependency: std's hasher keys are random per process.
        let mut h = RandomState::new().build_hasher();
        h.write_u64(u64::from(std::process::id()));
        Backoff {
            next: BACKOFF_START,
            rng: h.finish() | 1,
        }
    }

    fn reset(&mut self) {
        self.next = BACKOFF_START;
    }

    /// The next delay: uniformly in [d/2, d] for the current step d, which then doubles.
    fn delay(&mut self) -> Duration {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        let d = self.next;
        self.next = (self.next * 2).min(BACKOFF_MAX);
        let half = d / 2;
        half + half.mul_f64((self.rng >> 11) as f64 / (1u64 << 53) as f64)
    }

    /// Sleeps the next delay, cut at `deadline`; false if the deadline has passed.
    fn sleep(&mut self, deadline: Instant) -> bool {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        std::thread::sleep(self.delay().min(left));
        true
    }
}

/// A connection to a cluster that finds the leader and retries (see the crate docs).
pub struct Client {
    cfg: ClientConfig,
    tls: Option<Arc<rustls::ClientConfig>>,
    conn: Option<Conn>,
    /// Where to connect: the configured servers, then addresses learned since.
    addrs: Vec<String>,
    /// Index into `addrs` of the next one to try.
    next_addr: usize,
    /// Try this one first (the leader a redirect named).
    preferred: Option<String>,
    next_id: u64,
    backoff: Backoff,
    /// The session appends go through, once opened: its id and the next entry's number.
    session: Option<(u64, u64)>,
    /// Sessions [`Client::append_async`] calls finished with, each free for the next call
    /// (one call at a time per session keeps its numbers in order).
    idle_sessions: Arc<Mutex<Vec<(u64, u64)>>>,
}

/// At most this many idle sessions are kept for [`Client::append_async`]; more are left for
/// the cluster to expire.
const MAX_IDLE_SESSIONS: usize = 64;

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("cfg", &self.cfg)
            .field("conn", &self.conn)
            .field("addrs", &self.addrs)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// Validates `cfg`, loads the TLS files, and connects to one of the servers (retrying
    /// until the deadline).
    pub fn connect(cfg: ClientConfig) -> Result<Client, ClientError> {
        cfg.validate()?;
        let tls = match &cfg.tls {
            Some(t) => Some(tls::client_config(
                &t.ca,
                t.client_cert
                    .as_ref()
                    .map(|(c, k)| (c.as_path(), k.as_path())),
            )?),
            None => None,
        };
        let mut c = Client::unconnected(cfg, tls);
        c.run(|_, _, _| Ok(()))?;
        Ok(c)
    }

    fn unconnected(cfg: ClientConfig, tls: Option<Arc<rustls::ClientConfig>>) -> Client {
        let mut addrs: Vec<String> = Vec::new();
        for s in &cfg.servers {
            if !addrs.contains(s) {
                addrs.push(s.clone());
            }
        }
        Client {
            cfg,
            tls,
            conn: None,
            addrs,
            next_addr: 0,
            preferred: None,
            next_id: 0,
            backoff: Backoff::new(),
            session: None,
            idle_sessions: Arc::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &ClientConfig {
        &self.cfg
    }

    /// The node the client is connected to now, and the role its token has there.
    pub fn connected_to(&self) -> Option<(u64, &str, Role)> {
        self.conn
            .as_ref()
            .map(|c| (c.node_id, c.addr.as_str(), c.role))
    }

    /// Every address the client knows: the configured ones and those learned since.
    pub fn known_addrs(&self) -> &[String] {
        &self.addrs
    }

    fn learn(&mut self, addr: &str) {
        if !self.addrs.iter().any(|a| a == addr) {
            tracing::debug!(addr, "learned a member address");
            self.addrs.push(addr.to_string());
        }
    }

    /// Connects if not connected; the next address is the preferred one, else the next in
    /// the rotation.
    fn ensure_conn(&mut self, deadline: Instant, tried: &mut Vec<String>) -> Result<(), Step> {
        if let Some(c) = &mut self.conn {
            if !c.stale() {
                return Ok(());
            }
            // Closed for idleness or for a shutdown while unused: connect again, to the same
            // server first. Nothing was pending on it.
            tracing::debug!(addr = %c.addr, "the server closed the unused connection");
            self.preferred.get_or_insert_with(|| c.addr.clone());
            self.conn = None;
        }
        let (addr, preferred) = match self.preferred.take() {
            Some(a) => (a, true),
            None => {
                let a = self.addrs[self.next_addr % self.addrs.len()].clone();
                self.next_addr = (self.next_addr + 1) % self.addrs.len();
                (a, false)
            }
        };
        // A member that accepts and never answers (a stopped process, a full backlog) must
        // not take the whole deadline from the others: an address of the rotation gets an
        // even share of what is left among those this call has not tried yet (at least
        // `MIN_ATTEMPT`); the last of them, a redirect's target and the server an unused
        // connection came from get all of it (each at most `connect_timeout`).
        let untried = self.addrs.iter().filter(|a| !tried.contains(a)).count();
        if !tried.contains(&addr) {
            tried.push(addr.clone());
        }
        let now = Instant::now();
        let left = deadline.saturating_duration_since(now);
        let budget = if preferred || untried <= 1 {
            left
        } else {
            (left / untried as u32).max(MIN_ATTEMPT.min(left))
        };
        let c = Conn::open(&self.cfg, self.tls.as_ref(), &addr, now + budget)?;
        tracing::debug!(addr, node = c.node_id, leader = ?c.leader, "connected");
        if let Some(l) = &c.leader {
            let a = l.client_addr.clone();
            self.learn(&a);
        }
        // The next rotation starts after this one.
        if let Some(i) = self.addrs.iter().position(|a| *a == addr) {
            self.next_addr = (i + 1) % self.addrs.len();
        }
        self.conn = Some(c);
        Ok(())
    }

    /// Runs `op` on a connection until it succeeds, fails for good, or the deadline passes.
    /// `op` gets the connection, a fresh request id and the deadline.
    pub(crate) fn run<T>(
        &mut self,
        mut op: impl FnMut(&mut Conn, u64, Instant) -> Result<T, Step>,
    ) -> Result<T, ClientError> {
        let start = Instant::now();
        let deadline = start + self.cfg.deadline;
        let mut tried = Vec::new();
        let mut hops = 0;
        self.backoff.reset();
        loop {
            let step = match self.ensure_conn(deadline, &mut tried) {
                Err(step) => step,
                Ok(()) => {
                    self.next_id += 1;
                    let id = self.next_id;
                    let conn = self.conn.as_mut().expect("connected");
                    match op(conn, id, deadline) {
                        Ok(v) => return Ok(v),
                        Err(step) => step,
                    }
                }
            };
            let failure = match step {
                Step::Fatal { err, keep_conn } => {
                    if !keep_conn {
                        self.conn = None;
                    }
                    return Err(err);
                }
                Step::TimedOut(last) => {
                    return Err(ClientError::Timeout {
                        waited: start.elapsed(),
                        last,
                    });
                }
                Step::Redirect(leader) => {
                    self.conn = None;
                    self.learn(&leader.client_addr);
                    if hops < MAX_HOPS {
                        hops += 1;
                        tracing::debug!(leader = leader.id, addr = %leader.client_addr, "redirected to the leader");
                        self.preferred = Some(leader.client_addr);
                        continue;
                    }
                    // The leader keeps moving: wait for the election to settle.
                    Failure::NoLeader
                }
                Step::Retry(f) => {
                    self.conn = None;
                    f
                }
            };
            tracing::debug!(?failure, elapsed = ?start.elapsed(), "retrying");
            hops = 0;
            if !self.backoff.sleep(deadline) {
                return Err(give_up(failure, start.elapsed(), &tried));
            }
        }
    }

    /// Appends `entries` as one batch (1 to [`proto::MAX_BATCH_ENTRIES`] entries) and returns
    /// the indexes of its first and last entry.
    ///
    /// **Exactly once** (with [`ClientConfig::exactly_once`], the default): the batch goes
    /// through the client's session, and however often it is resent (a broken connection, a
    /// change of leader, a server's `Timeout`), each entry is in the log once. The entries
    /// are at consecutive indexes `first..=last` unless a resend found the first ones already
    /// in the log; [`Client::append_at`] gives each entry's index.
    ///
    /// Without a session, **at least once**: if the connection breaks (or the server shuts
    /// down) before the answer, the batch is sent again, and may then be in the log twice;
    /// and if a change of leader kept only a prefix of the batch, nothing is resent and the
    /// call returns [`ClientError::PartlyCommitted`]: append the entries after that prefix
    /// again. See the crate docs.
    pub fn append(&mut self, entries: &[&[u8]]) -> Result<(u64, u64), ClientError> {
        let at = self.append_at(entries)?;
        Ok((at[0], at[at.len() - 1]))
    }

    /// [`Client::append`], returning each entry's index, in order.
    pub fn append_at(&mut self, entries: &[&[u8]]) -> Result<Vec<u64>, ClientError> {
        if !self.cfg.exactly_once {
            let (first, last) = self.append_batch(entries, None)?;
            return Ok((first..=last).collect());
        }
        let req = Request::AppendInSession {
            id: 0,
            session: 0,
            first_seq: 0,
            entries: entries.iter().map(|e| e.to_vec()).collect(),
        };
        self.check_batch(&req, entries.len())?;
        self.append_in_session(req, entries.len())
    }

    /// The session appends go through (its id and the next entry's number), once one is open.
    pub fn session(&self) -> Option<(u64, u64)> {
        self.session
    }

    /// Opens a session on the leader and returns its id.
    fn open_session(&mut self) -> Result<u64, ClientError> {
        self.run(|conn, id, deadline| {
            match conn.call(&Request::OpenSession { id }, id, deadline)? {
                Response::SessionOpened { session, .. } => Ok(session),
                other => Err(unexpected(conn, "OpenSession", &other)),
            }
        })
    }

    /// Sends `req`, an `AppendInSession` of `n` entries, in the session (opening one first if
    /// there is none), resending the same numbers until it is answered. A session the cluster
    /// expired is replaced only if this batch was never sent with it; otherwise the error
    /// says the batch may be in the log.
    fn append_in_session(&mut self, mut req: Request, n: usize) -> Result<Vec<u64>, ClientError> {
        for fresh_session in [false, true] {
            let (session, first_seq) = match self.session {
                Some(s) if !fresh_session => s,
                _ => (self.open_session()?, 1),
            };
            self.session = Some((session, first_seq + n as u64));
            if let Request::AppendInSession {
                session: s,
                first_seq: f,
                ..
            } = &mut req
            {
                (*s, *f) = (session, first_seq);
            }
            let mut sends = 0u32;
            // Whether a send went unanswered (its batch may have committed).
            let mut unanswered = false;
            let r = self.run(|conn, id, deadline| {
                set_id(&mut req, id);
                sends += 1;
                let answer = conn.call(&req, id, deadline);
                if let Err(
                    Step::TimedOut(_)
                    | Step::Retry(
                        Failure::Broken { .. }
                        | Failure::Busy {
                            maybe_acted: true, ..
                        },
                    ),
                ) = &answer
                {
                    unanswered = true;
                }
                let resp = match answer {
                    // Not the leader: nothing was proposed, so this send does not count.
                    Err(Step::Redirect(l)) => {
                        sends -= 1;
                        return Err(Step::Redirect(l));
                    }
                    // The server could not tell in time; resending cannot append twice.
                    Err(Step::TimedOut(last)) => {
                        return Err(Step::Retry(Failure::Busy {
                            addr: conn.addr.clone(),
                            message: last,
                            maybe_acted: true,
                        }));
                    }
                    r => r?,
                };
                match resp {
                    Response::AppendedAt { indexes, .. }
                        if indexes.len() == n && ascending_from(indexes.iter().copied(), 1) =>
                    {
                        Ok(indexes)
                    }
                    other => Err(unexpected(conn, "AppendInSession", &other)),
                }
            });
            match r {
                Ok(indexes) => return Ok(indexes),
                Err(ClientError::Refused {
                    code: ErrorCode::UnknownSession,
                    ..
                }) if sends == 1 && !fresh_session => {
                    // Never sent with that session before: safe to send with a new one.
                    tracing::debug!(session, "the cluster expired the session; opening another");
                    self.session = None;
                }
                Err(e) => {
                    // Whether the batch is in the log may be unknown: the next append must
                    // not leave a gap in this session's numbers, so it opens a new one.
                    self.session = None;
                    // `Timeout`, `Io` and `UnknownSession` say so themselves; any other error
                    // after an unanswered send (a refused reconnect, say) says nothing of the
                    // batch, which may be in the log.
                    let says_so = matches!(e, ClientError::Timeout { .. } | ClientError::Io(_))
                        || e.code() == Some(ErrorCode::UnknownSession);
                    return Err(if unanswered && !says_so {
                        ClientError::MaybeAppended { cause: Box::new(e) }
                    } else {
                        e
                    });
                }
            }
        }
        unreachable!("the second pass returns")
    }

    /// Refuses a batch that no server would take: empty, too many entries, or a frame over
    /// the limit.
    fn check_batch(&self, req: &Request, n: usize) -> Result<(), ClientError> {
        if n == 0 || n > proto::MAX_BATCH_ENTRIES {
            return Err(ClientError::Refused {
                code: ErrorCode::EntryTooLarge,
                message: format!(
                    "a batch holds 1 to {} entries, not {n}",
                    proto::MAX_BATCH_ENTRIES,
                ),
            });
        }
        let mut frame = Vec::new();
        proto::encode_frame(req, &mut frame).map_err(|e| ClientError::Protocol(e.to_string()))?;
        if frame.len() - 4 > self.cfg.max_frame_bytes as usize {
            return Err(ClientError::Refused {
                code: ErrorCode::TooLarge,
                message: format!(
                    "the batch encodes to {} bytes, more than the {}-byte frame limit; send fewer or smaller entries",
                    frame.len() - 4,
                    self.cfg.max_frame_bytes
                ),
            });
        }
        Ok(())
    }

    /// [`Client::append`] on a condition: the batch is appended only if the log ends at
    /// `expected_last` (its last index, raft's own entries included: the `commit` a read
    /// returned once nothing is in flight) when the leader orders it, so that it lands at
    /// `expected_last + 1 ..`. Otherwise nothing is appended and the call returns
    /// [`ClientError::ConditionFailed`] with the actual end. Resending after a broken
    /// connection cannot append twice: the condition fails the second time, so a
    /// `ConditionFailed` may also mean that an earlier send of this call committed: read from
    /// `expected_last + 1` to see. Needs servers of protocol version 3.
    pub fn append_if(
        &mut self,
        entries: &[&[u8]],
        expected_last: u64,
    ) -> Result<(u64, u64), ClientError> {
        self.append_batch(entries, Some(expected_last))
    }

    fn append_batch(
        &mut self,
        entries: &[&[u8]],
        expected_last: Option<u64>,
    ) -> Result<(u64, u64), ClientError> {
        let batch = entries.iter().map(|e| e.to_vec()).collect();
        let mut req = match expected_last {
            None => Request::Append {
                id: 0,
                entries: batch,
            },
            Some(expected_last) => Request::AppendIf {
                id: 0,
                expected_last,
                entries: batch,
            },
        };
        self.check_batch(&req, entries.len())?;
        // Whether a send went unanswered (its outcome unknown) before the one answered: a
        // resent conditional append then fails its condition on its own first copy.
        let mut unanswered = false;
        self.run(|conn, id, deadline| {
            set_id(&mut req, id);
            let answer = conn.call(&req, id, deadline);
            // `NotCommitted` (and `Busy`) say the entries are certainly not in the log
            // (docs/PROTOCOL.md 6.1): the resend's condition is judged on a log without them.
            if let Err(Step::Retry(
                Failure::Broken { .. }
                | Failure::Busy {
                    maybe_acted: true, ..
                },
            )) = &answer
            {
                unanswered = true;
            }
            match answer? {
                // A conditional append lands right after the end it expected, or nowhere.
                Response::Appended { first, .. } | Response::PartlyAppended { first, .. }
                    if expected_last.is_some_and(|e| e.checked_add(1) != Some(first)) =>
                {
                    Err(Step::Fatal {
                        err: ClientError::Protocol(format!(
                            "{} answered an append conditional on the log ending at {} with \
                             entries from {first}",
                            conn.addr,
                            expected_last.unwrap_or_default()
                        )),
                        keep_conn: false,
                    })
                }
                Response::Appended { first, last, .. } => {
                    appended_range(conn, first, last, entries.len())
                }
                Response::PartlyAppended { first, last, .. } => {
                    Err(partly_committed(conn, first, last, entries.len()))
                }
                Response::ConditionFailed { last, .. } if expected_last.is_some() => {
                    Err(Step::Fatal {
                        err: ClientError::ConditionFailed {
                            expected: expected_last.unwrap_or_default(),
                            last,
                            maybe_committed: unanswered,
                        },
                        keep_conn: true,
                    })
                }
                other => Err(unexpected(conn, "Append", &other)),
            }
        })
    }

    /// Reads committed entries from `from`, about `max_bytes` of payload (at least one entry
    /// when one is committed), from whichever node the client is connected to; returns them
    /// with that node's commit index. An empty answer means nothing is committed from `from`
    /// on (on that node).
    pub fn read(&mut self, from: u64, max_bytes: u32) -> Result<(Vec<Entry>, u64), ClientError> {
        self.entries(
            Request::Read {
                id: 0,
                from,
                max_bytes,
            },
            from,
            "Read",
        )
    }

    /// Sends a read request (`Read` or `ReadWith`) and returns its entries and commit index.
    /// Sends a read request (`Read` or `ReadWith` of entries from `from`) and returns its
    /// entries and commit index. Entries that cannot be the answer (out of order, before
    /// `from`, past the commit index the answer states) are a protocol error. (Indexes may
    /// skip: raft's own entries are not sent.)
    fn entries(
        &mut self,
        mut req: Request,
        from: u64,
        what: &str,
    ) -> Result<(Vec<Entry>, u64), ClientError> {
        self.run(|conn, id, deadline| {
            set_id(&mut req, id);
            match conn.call(&req, id, deadline)? {
                Response::Entries {
                    commit, entries, ..
                } => {
                    let indexes = || entries.iter().map(|e| e.index);
                    if !ascending_from(indexes(), from.max(1))
                        || entries.last().is_some_and(|e| e.index > commit)
                    {
                        let shown: Vec<String> = indexes().take(8).map(|i| i.to_string()).collect();
                        let more = if entries.len() > 8 { ", ..." } else { "" };
                        return Err(Step::Fatal {
                            err: ClientError::Protocol(format!(
                                "{} answered a {what} from {from} with entries at [{}{more}] (commit {commit}): not in order from there",
                                conn.addr,
                                shown.join(", ")
                            )),
                            keep_conn: false,
                        });
                    }
                    Ok((entries, commit))
                }
                other => Err(unexpected(conn, what, &other)),
            }
        })
    }

    /// As [`Client::read`], with a stated consistency ([`ReadConsistency`]; docs/PROTOCOL.md
    /// §6.2): `Linearizable` is answered by the leader only (the client follows the redirect)
    /// and holds every entry committed before the call; `AtLeast(i)` waits until the node
    /// answering has committed `i` (read your writes with the `last` an append returned).
    /// Needs servers of protocol version 3.
    pub fn read_with(
        &mut self,
        from: u64,
        max_bytes: u32,
        consistency: ReadConsistency,
    ) -> Result<(Vec<Entry>, u64), ClientError> {
        self.entries(
            Request::ReadWith {
                id: 0,
                from,
                max_bytes,
                consistency,
            },
            from,
            "ReadWith",
        )
    }

    /// Streams committed entries from `from` on, as they commit; see [`Tail`].
    pub fn tail(self, from: u64) -> Result<Tail, ClientError> {
        Tail::start(self, from)
    }

    /// The state of the node the client is connected to, the leader it knows and the members.
    pub fn status(&mut self) -> Result<StatusReport, ClientError> {
        let report = self.run(|conn, id, deadline| {
            match conn.call(&Request::Status { id }, id, deadline)? {
                Response::Status {
                    node,
                    leader,
                    members,
                    ..
                } if members.len() <= MAX_MEMBERS => Ok(StatusReport {
                    addr: conn.addr.clone(),
                    node,
                    leader,
                    members,
                }),
                other => Err(unexpected(conn, "Status", &other)),
            }
        })?;
        for m in &report.members {
            self.learn(&m.client_addr);
        }
        Ok(report)
    }

    /// The status of every member the connected node lists, one result per member in the
    /// order of [`StatusReport::members`] of [`Client::status`] (or just this node's when the
    /// list is empty). Members are asked in parallel, each once, on a connection of its own;
    /// one that cannot be reached in the connect and request timeouts gets an error.
    pub fn cluster_status(
        &mut self,
    ) -> Result<Vec<Result<StatusReport, ClientError>>, ClientError> {
        let me = self.status()?;
        if me.members.is_empty() {
            return Ok(vec![Ok(me)]);
        }
        let members = me.members.clone();
        let mut out = self.member_statuses(&members);
        for (slot, m) in out.iter_mut().zip(&members) {
            // The connected node's own answer is fresher than nothing if its second
            // connection failed (say, at a connection limit).
            if slot.is_err() && m.client_addr == me.addr {
                *slot = Ok(me.clone());
            }
        }
        Ok(out)
    }

    /// Asks each of `members` for its status, in parallel, each once on a connection of its
    /// own (no retries, no redirects); results in the order of `members`.
    pub fn member_statuses(&self, members: &[NodeInfo]) -> Vec<Result<StatusReport, ClientError>> {
        each_member(members, "status", |m| self.status_once(&m.client_addr))
    }

    fn status_once(&self, addr: &str) -> Result<StatusReport, ClientError> {
        self.ask_once(addr, &Request::Status { id: 1 }, "Status", |r| match r {
            Response::Status {
                node,
                leader,
                members,
                ..
            } if members.len() <= MAX_MEMBERS => Ok(StatusReport {
                addr: addr.to_string(),
                node,
                leader,
                members,
            }),
            other => Err(Box::new(other)),
        })
    }

    /// Sends `req` (id 1) to `addr` on a connection of its own, once, and takes its answer
    /// with `pick` (which hands back any other response, a protocol error).
    fn ask_once<T>(
        &self,
        addr: &str,
        req: &Request,
        what: &str,
        pick: impl FnOnce(Response) -> Result<T, Box<Response>>,
    ) -> Result<T, ClientError> {
        let start = Instant::now();
        let deadline = start + self.cfg.connect_timeout + self.cfg.request_timeout;
        let tried = [addr.to_string()];
        let step = match Conn::open(&self.cfg, self.tls.as_ref(), addr, deadline) {
            Err(step) => step,
            Ok(mut conn) => match conn.call(req, 1, deadline) {
                Ok(r) => match pick(r) {
                    Ok(v) => return Ok(v),
                    Err(other) => unexpected(&conn, what, other.as_ref()),
                },
                Err(step) => step,
            },
        };
        Err(match step {
            Step::Fatal { err, .. } => err,
            Step::TimedOut(last) => ClientError::Timeout {
                waited: start.elapsed(),
                last,
            },
            Step::Redirect(_) => ClientError::Protocol(format!("{addr} redirected a {what}")),
            Step::Retry(f) => give_up(f, start.elapsed(), &tried),
        })
    }

    /// Deletes the entries below `index` on every member of `members` (each keeps its own
    /// log; needs an admin token), in parallel; returns each member's new first index, or
    /// why it failed. A member deletes whole segments and never an entry it has not applied,
    /// so its first index may stay below `index`.
    pub fn trim_members(&self, members: &[NodeInfo], index: u64) -> Vec<Result<u64, ClientError>> {
        each_member(members, "trim", |m| {
            let req = Request::Trim { id: 1, index };
            self.ask_once(&m.client_addr, &req, "Trim", |r| match r {
                Response::Trimmed { first_index, .. } => Ok(first_index),
                other => Err(Box::new(other)),
            })
        })
    }

    /// Adds (`add`) or removes voter `node` (needs an admin token); returns the index the
    /// change committed at.
    pub fn members(&mut self, add: bool, node: u64) -> Result<u64, ClientError> {
        self.run(|conn, id, deadline| {
            let req = Request::Members { id, add, node };
            match conn.call(&req, id, deadline)? {
                Response::MembershipChanged { index, .. } => Ok(index),
                other => Err(unexpected(conn, "Members", &other)),
            }
        })
    }

    /// Appends `entries` without blocking the caller: returns a [`PendingAppend`], a future
    /// that resolves to what [`Client::append`] would return. It needs no async runtime: a
    /// new thread opens its own connection (to the node this client is connected to first,
    /// then the others it knows), makes the blocking call, and wakes the task that polls the
    /// future. It can also be waited for without async with [`PendingAppend::wait`].
    ///
    /// Each call costs a thread and a connection; for many appends in flight at once, prefer
    /// several clients on threads of your own. Dropping the future does not cancel the
    /// append. The append goes through a session that no other call uses meanwhile, with the
    /// same guarantee as [`Client::append`]: one an earlier call finished with, or a new one
    /// (opened first: one more commit). A call that fails leaves its session unused, since its
    /// numbers may have a gap.
    pub fn append_async(&self, entries: Vec<Vec<u8>>) -> PendingAppend {
        let mut cfg = self.cfg.clone();
        let mut servers: Vec<String> = self.conn.iter().map(|c| c.addr.clone()).collect();
        for a in &self.addrs {
            if !servers.contains(a) {
                servers.push(a.clone());
            }
        }
        cfg.servers = servers;
        let tls = self.tls.clone();
        let idle = self.idle_sessions.clone();
        PendingAppend::spawn(move || {
            let mut c = Client::unconnected(cfg, tls);
            if c.cfg.exactly_once {
                c.session = idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
            }
            let refs: Vec<&[u8]> = entries.iter().map(Vec::as_slice).collect();
            let r = c.append(&refs);
            if let (Ok(_), Some(s)) = (&r, c.session) {
                let mut idle = idle.lock().unwrap_or_else(|e| e.into_inner());
                if idle.len() < MAX_IDLE_SESSIONS {
                    idle.push(s);
                }
            }
            r
        })
    }
}

/// Runs `ask` for each of `members` on a thread of its own, all at once; results in the order
/// of `members` (a panicked thread is a protocol error naming `what`).
fn each_member<T: Send>(
    members: &[NodeInfo],
    what: &str,
    ask: impl Fn(&NodeInfo) -> Result<T, ClientError> + Sync,
) -> Vec<Result<T, ClientError>> {
    std::thread::scope(|s| {
        let handles: Vec<_> = members
            .iter()
            .map(|m| {
                let ask = &ask;
                s.spawn(move || ask(m))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(ClientError::Protocol(format!("a {what} thread panicked")))
                })
            })
            .collect()
    })
}

/// A `PartlyAppended` answer to a batch of `sent` entries, as a fatal step (resending would
/// append the committed prefix twice), or a protocol error if it cannot describe a prefix.
fn partly_committed(conn: &Conn, first: u64, last: u64, sent: usize) -> Step {
    let committed = range_len(first, last).and_then(|n| usize::try_from(n).ok());
    let err = match committed {
        Some(committed) if committed < sent => ClientError::PartlyCommitted {
            first,
            last,
            committed,
            sent,
        },
        _ => ClientError::Protocol(format!(
            "{} answered an append of {sent} entries with PartlyAppended {first}..={last}, which is not a prefix of it",
            conn.addr
        )),
    };
    Step::Fatal {
        err,
        keep_conn: true,
    }
}

/// An `Appended { first, last }` answer to a batch of `sent` entries, checked to be one
/// index per entry (anything else is a protocol error, never a commit reported at an index
/// the server did not give each entry).
fn appended_range(conn: &Conn, first: u64, last: u64, sent: usize) -> Result<(u64, u64), Step> {
    if range_len(first, last) == Some(sent as u64) {
        return Ok((first, last));
    }
    Err(Step::Fatal {
        err: ClientError::Protocol(format!(
            "{} answered an append of {sent} entries with Appended {first}..={last}",
            conn.addr
        )),
        keep_conn: false,
    })
}

/// How many indexes `first..=last` holds, if it is a range of real ones (from 1, not empty).
fn range_len(first: u64, last: u64) -> Option<u64> {
    last.checked_sub(first)
        .and_then(|d| d.checked_add(1))
        .filter(|_| first > 0)
}

/// Whether `indexes` rise strictly, from `from` on.
fn ascending_from(indexes: impl Iterator<Item = u64>, from: u64) -> bool {
    let mut prev = None;
    for i in indexes {
        if i < from || prev.is_some_and(|p| i <= p) {
            return false;
        }
        prev = Some(i);
    }
    true
}

/// A response of the wrong kind, as a fatal step.
fn unexpected(conn: &Conn, what: &str, got: &Response) -> Step {
    Step::Fatal {
        err: ClientError::Protocol(format!(
            "{} answered {what} with an unexpected {got:?}",
            conn.addr
        )),
        keep_conn: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_a_second_with_jitter() {
        let mut b = Backoff::new();
        let mut steps = Vec::new();
        for _ in 0..10 {
            steps.push(b.delay());
        }
        assert!(steps[0] >= Duration::from_millis(10) && steps[0] <= BACKOFF_START);
        assert!(steps[1] >= Duration::from_millis(20) && steps[1] <= Duration::from_millis(40));
        for d in &steps[6..] {
            assert!(*d >= BACKOFF_MAX / 2 && *d <= BACKOFF_MAX, "{d:?}");
        }
        b.reset();
        assert!(b.delay() <= BACKOFF_START);
    }

    /// The defaults `ClientConfig::new`'s rustdoc states (and the Python client shares).
    #[test]
    fn the_defaults_are_the_documented_ones() {
        let c = ClientConfig::new(vec!["127.0.0.1:7600".into()], 1);
        assert_eq!(c.connect_timeout, Duration::from_secs(3));
        assert_eq!(c.request_timeout, Duration::from_secs(15));
        assert_eq!(c.deadline, Duration::from_secs(30));
        assert_eq!(c.max_frame_bytes, proto::DEFAULT_MAX_FRAME_BYTES);
        assert!(c.exactly_once && c.tls.is_none() && c.token.is_none());
    }

    #[test]
    fn bad_configurations_are_refused_before_connecting() {
        let c = Client::connect(ClientConfig::new(vec![], 1));
        assert!(matches!(c, Err(ClientError::Config(_))), "{c:?}");
        let c = Client::connect(ClientConfig::new(vec!["localhost".into()], 1));
        assert!(matches!(c, Err(ClientError::Config(_))), "{c:?}");
        let mut cfg = ClientConfig::new(vec!["127.0.0.1:1".into()], 1);
        cfg.tls = Some(TlsConfig {
            ca: "/nonexistent/ca.pem".into(),
            client_cert: None,
            server_name: None,
        });
        let c = Client::connect(cfg);
        assert!(
            matches!(&c, Err(ClientError::Config(m)) if m.contains("/nonexistent/ca.pem")),
            "{c:?}"
        );
    }

    #[test]
    fn an_unreachable_cluster_is_reported_after_the_deadline() {
        // Bind then drop, so the port most likely refuses connections.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut cfg = ClientConfig::new(vec![format!("127.0.0.1:{port}")], 1);
        cfg.deadline = Duration::from_millis(300);
        let t = Instant::now();
        let c = Client::connect(cfg);
        assert!(t.elapsed() >= Duration::from_millis(300));
        assert!(t.elapsed() < Duration::from_secs(5));
        match c {
            Err(ClientError::Unreachable { tried, last }) => {
                assert_eq!(tried, [format!("127.0.0.1:{port}")]);
                assert!(last.contains(&port.to_string()), "{last}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_token_is_not_shown() {
        let mut cfg = ClientConfig::new(vec!["a:1".into()], 1);
        cfg.token = Some("secret-token".into());
        assert!(!format!("{cfg:?}").contains("secret-token"));
    }
}
