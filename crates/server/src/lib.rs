//! `rdmalog-server`: one replica of the log behind the TCP client protocol (`proto`), with TLS,
//! roles, bounded connections and requests, a Prometheus `/metrics` and a `/status` JSON
//! endpoint, and graceful shutdown.
//!
//! The server is a library over any [`fabric::Fabric`], so tests run whole clusters of real
//! servers (real TCP, real TLS) over the in-process fabric; `rdmalog-server` (`main.rs`) runs
//! one over RDMA from a TOML configuration ([`config`]).
//!
//! Threads: one accept loop, one thread per client connection (at most
//! [`ServerOptions::max_connections`]), one for the metrics endpoint. A connection answers its
//! requests in order and keeps at most [`ServerOptions::max_in_flight`] of them pending
//! (appends waiting for their commit); it stops reading until one resolves.

#![deny(unsafe_code)]

pub mod config;
mod conn;
mod metrics;
pub mod testing;
pub mod tls;

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use fabric::Fabric;
use proto::{NodeInfo, Role};
use replica::Log;

pub use metrics::Metrics;

/// The role of a client without a token when nothing says otherwise, in
/// [`ServerOptions::new`] and in the configuration file (`auth.anonymous_role`): it may read,
/// never write, so an embedded server is no more open than a configured one.
pub const DEFAULT_ANONYMOUS_ROLE: Role = Role::ReadOnly;

/// How a server serves clients.
#[derive(Clone)]
pub struct ServerOptions {
    /// This node's id.
    pub node_id: u64,
    /// The cluster id clients must name.
    pub cluster_id: u64,
    /// Every member's client address, this node's included (what redirects and `Status`
    /// tell clients).
    pub members: Vec<NodeInfo>,
    /// Where to listen for clients.
    pub client_listen: SocketAddr,
    /// TLS on the client port; `None` is plain TCP, which the configuration must ask for
    /// explicitly.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// Tokens and the role each grants.
    pub tokens: HashMap<String, Role>,
    /// The role of a client without a token; `None` refuses it. [`DEFAULT_ANONYMOUS_ROLE`]
    /// unless set, as in the configuration file.
    pub anonymous_role: Option<Role>,
    /// Most open client connections; more are told `Busy` and closed.
    pub max_connections: usize,
    /// Most requests pending on one connection.
    pub max_in_flight: usize,
    /// Largest frame body accepted.
    pub max_frame_bytes: u32,
    /// Longest a frame may take to arrive once it started (slow-loris bound), and the
    /// longest the TLS handshake and the hello may take.
    pub frame_timeout: Duration,
    /// A connection with no request pending, no tail and no partial frame, for this long
    /// since its last frame or its last pending request, is closed (`Malformed`, "idle").
    pub idle_timeout: Duration,
    /// Longest an append waits for its commit before answering `Timeout`.
    pub append_timeout: Duration,
    /// Where to serve `/metrics` and `/status`; `None` serves none.
    pub metrics_listen: Option<SocketAddr>,
    /// What this node's log keeps ([`replica::retention`]); unlimited by default.
    pub retention: replica::retention::Retention,
    /// How often the retention policy is applied.
    pub retention_interval: Duration,
}

impl std::fmt::Debug for ServerOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Tokens are secrets: show how many there are, never what they are.
        f.debug_struct("ServerOptions")
            .field("node_id", &self.node_id)
            .field("cluster_id", &self.cluster_id)
            .field("members", &self.members)
            .field("client_listen", &self.client_listen)
            .field("tls", &self.tls.is_some())
            .field("tokens", &self.tokens.len())
            .field("anonymous_role", &self.anonymous_role)
            .field("max_connections", &self.max_connections)
            .field("max_in_flight", &self.max_in_flight)
            .field("max_frame_bytes", &self.max_frame_bytes)
            .finish_non_exhaustive()
    }
}

impl ServerOptions {
    /// Plain-TCP options with the configuration file's defaults (embedded use and tests):
    /// anonymous clients may only read ([`DEFAULT_ANONYMOUS_ROLE`]); set `tokens`, or
    /// `anonymous_role`, to let clients write.
    pub fn new(node_id: u64, cluster_id: u64, client_listen: SocketAddr) -> Self {
        ServerOptions {
            node_id,
            cluster_id,
            members: Vec::new(),
            client_listen,
            tls: None,
            tokens: HashMap::new(),
            anonymous_role: Some(DEFAULT_ANONYMOUS_ROLE),
            max_connections: 1024,
            max_in_flight: 256,
            max_frame_bytes: proto::DEFAULT_MAX_FRAME_BYTES,
            frame_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(300),
            append_timeout: Duration::from_secs(10),
            metrics_listen: None,
            retention: replica::retention::Retention::default(),
            retention_interval: Duration::from_secs(10),
        }
    }

    /// Refuses options a server cannot work with, naming the field: a zero count or
    /// duration (a zero `frame_timeout` would leave reads unbounded, as the socket takes no
    /// zero timeout), a `max_frame_bytes` outside the protocol's range. The configuration
    /// file's checks are stricter (`idle_timeout_ms` at least a second); [`start`] runs
    /// these for embedded servers too.
    pub fn validate(&self) -> Result<(), String> {
        let must_be_positive = [
            ("max_connections", self.max_connections == 0),
            ("max_in_flight", self.max_in_flight == 0),
            ("frame_timeout", self.frame_timeout.is_zero()),
            ("idle_timeout", self.idle_timeout.is_zero()),
            ("append_timeout", self.append_timeout.is_zero()),
            ("retention_interval", self.retention_interval.is_zero()),
        ];
        if let Some((field, _)) = must_be_positive.iter().find(|(_, zero)| *zero) {
            return Err(format!("ServerOptions::{field}: must be positive"));
        }
        if !(1024..=proto::MAX_FRAME_LIMIT).contains(&self.max_frame_bytes) {
            return Err(format!(
                "ServerOptions::max_frame_bytes: expected 1024..={}, not {}",
                proto::MAX_FRAME_LIMIT,
                self.max_frame_bytes
            ));
        }
        Ok(())
    }

    fn member(&self, id: u64) -> Option<NodeInfo> {
        self.members.iter().find(|m| m.id == id).cloned()
    }
}

/// What the connection threads share.
struct Shared<F: Fabric + Send + 'static> {
    opts: ServerOptions,
    log: Arc<Log<F>>,
    metrics: Metrics,
    shutting_down: AtomicBool,
    /// How long pending appends may still resolve once `shutting_down` is set (ms).
    shutdown_grace_ms: AtomicU64,
    connections: AtomicUsize,
}

/// A running server.
pub struct ServerHandle<F: Fabric + Send + 'static> {
    shared: Arc<Shared<F>>,
    client_addr: SocketAddr,
    metrics_addr: Option<SocketAddr>,
    accept: Option<JoinHandle<()>>,
}

impl<F: Fabric + Send + 'static> std::fmt::Debug for ServerHandle<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerHandle")
            .field("client_addr", &self.client_addr)
            .field("metrics_addr", &self.metrics_addr)
            .finish()
    }
}

/// The client port and the metrics port, bound ([`bind`]) and not yet served. Until [`serve`]
/// (while the log opens: a recovery may take a while) a thread accepts every connection and
/// closes it at once, so that a client moves on to another member instead of waiting in the
/// kernel's backlog for an answer that comes only once the log is served.
#[derive(Debug)]
pub struct Bound {
    opts: ServerOptions,
    /// The client and metrics listeners, held by the refusing thread until [`serve`].
    refuser: Option<Refuser>,
    client_addr: SocketAddr,
}

/// The thread that refuses connections on bound ports until they are served.
#[derive(Debug)]
struct Refuser {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<(TcpListener, Option<TcpListener>)>,
}

impl Refuser {
    fn start(client: TcpListener, metrics: Option<TcpListener>) -> std::io::Result<Refuser> {
        client.set_nonblocking(true)?;
        if let Some(m) = &metrics {
            m.set_nonblocking(true)?;
        }
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::Builder::new()
            .name("opening".into())
            .spawn(move || {
                while !s.load(Ordering::Acquire) {
                    let mut refused = false;
                    for l in std::iter::once(&client).chain(metrics.as_ref()) {
                        // Closed unread: the peer sees its connection reset or ended. A
                        // bounded batch, so that a flood does not hold up `stop`.
                        for _ in 0..64 {
                            let Ok((c, _)) = l.accept() else { break };
                            drop(c);
                            refused = true;
                        }
                    }
                    if !refused {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                }
                (client, metrics)
            })?;
        Ok(Refuser { stop, thread })
    }

    /// Stops refusing and hands the listeners back.
    fn stop(self) -> (TcpListener, Option<TcpListener>) {
        self.stop.store(true, Ordering::Release);
        self.thread
            .join()
            .expect("the refusing thread does not panic")
    }
}

impl Drop for Bound {
    fn drop(&mut self) {
        if let Some(r) = self.refuser.take() {
            r.stop();
        }
    }
}

/// Checks `opts` ([`ServerOptions::validate`]: `InvalidInput`) and binds the client and metrics
/// ports, before there is a log to serve: a port in use then fails a node before it has
/// joined its cluster, not after. Until [`serve`] every connection is closed at once.
pub fn bind(opts: ServerOptions) -> std::io::Result<Bound> {
    opts.validate()
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let port = |what: &'static str, addr: SocketAddr| {
        move |e: std::io::Error| {
            std::io::Error::new(e.kind(), format!("the {what} port {addr}: {e}"))
        }
    };
    let listener =
        TcpListener::bind(opts.client_listen).map_err(port("client", opts.client_listen))?;
    let metrics_listener = match opts.metrics_listen {
        Some(addr) => Some(TcpListener::bind(addr).map_err(port("metrics", addr))?),
        None => None,
    };
    let client_addr = listener.local_addr()?;
    Ok(Bound {
        opts,
        refuser: Some(Refuser::start(listener, metrics_listener)?),
        client_addr,
    })
}

impl Bound {
    /// The client port's address (the port the system chose for port 0).
    pub fn client_addr(&self) -> SocketAddr {
        self.client_addr
    }
}

/// Starts serving `log` to clients: [`bind`], then [`serve`].
pub fn start<F: Fabric + Send + 'static>(
    opts: ServerOptions,
    log: Arc<Log<F>>,
) -> std::io::Result<ServerHandle<F>> {
    serve(bind(opts)?, log)
}

/// Serves `log` to clients on the ports `bound` holds.
pub fn serve<F: Fabric + Send + 'static>(
    bound: Bound,
    log: Arc<Log<F>>,
) -> std::io::Result<ServerHandle<F>> {
    let mut bound = bound;
    let opts = bound.opts.clone();
    let (listener, metrics_listener) = bound.refuser.take().expect("a Bound is served once").stop();
    metrics_listener
        .as_ref()
        .map(|l| l.set_nonblocking(false))
        .transpose()?;
    let client_addr = listener.local_addr()?;
    let metrics_addr = metrics_listener
        .as_ref()
        .map(TcpListener::local_addr)
        .transpose()?;
    let shared = Arc::new(Shared {
        opts,
        log,
        metrics: Metrics::default(),
        shutting_down: AtomicBool::new(false),
        shutdown_grace_ms: AtomicU64::new(0),
        connections: AtomicUsize::new(0),
    });
    if !shared.opts.retention.is_unlimited() {
        let s = shared.clone();
        std::thread::Builder::new()
            .name("retention".into())
            .spawn(move || retention_loop(&s))?;
    }
    if let Some(l) = metrics_listener {
        let s = shared.clone();
        std::thread::Builder::new()
            .name("metrics".into())
            .spawn(move || metrics::serve(l, &s))?;
    }
    listener.set_nonblocking(true)?;
    let s = shared.clone();
    let accept = std::thread::Builder::new()
        .name("accept".into())
        .spawn(move || accept_loop(listener, s))?;
    tracing::info!(%client_addr, ?metrics_addr, "serving clients");
    Ok(ServerHandle {
        shared,
        client_addr,
        metrics_addr,
        accept: Some(accept),
    })
}

/// Applies the retention policy every `retention_interval` until shutdown. A refusal is logged
/// and counted, and the next round tries again; a write that failed stops the log (the server
/// then exits for its supervisor to restart it), and the thread ends.
fn retention_loop<F: Fabric + Send + 'static>(shared: &Shared<F>) {
    let policy = shared.opts.retention;
    let mut next = std::time::Instant::now() + shared.opts.retention_interval;
    while !shared.shutting_down.load(Ordering::Acquire) {
        if std::time::Instant::now() < next {
            std::thread::sleep(Duration::from_millis(50));
            continue;
        }
        next += shared.opts.retention_interval;
        match shared
            .log
            .apply_retention(&policy, std::time::SystemTime::now())
        {
            Ok(Some(first)) => {
                shared
                    .metrics
                    .retention_trims
                    .fetch_add(1, Ordering::Relaxed);
                tracing::info!(
                    first_index = first,
                    ?policy,
                    "retention deleted old segments"
                );
            }
            Ok(None) => {}
            Err(e) => {
                shared
                    .metrics
                    .retention_failures
                    .fetch_add(1, Ordering::Relaxed);
                if shared.log.failure().is_some() {
                    tracing::error!(error = %e, "retention failed a write: the log stopped");
                    return;
                }
                tracing::warn!(error = %e, "retention could not trim the log; trying again");
            }
        }
    }
}

fn accept_loop<F: Fabric + Send + 'static>(listener: TcpListener, shared: Arc<Shared<F>>) {
    while !shared.shutting_down.load(Ordering::Acquire) {
        match listener.accept() {
            Ok((stream, peer)) => {
                shared
                    .metrics
                    .connections_total
                    .fetch_add(1, Ordering::Relaxed);
                let open = shared.connections.fetch_add(1, Ordering::AcqRel) + 1;
                if open > 2 * shared.opts.max_connections {
                    // Past twice the limit even the refusal is not served: its `Busy` takes a
                    // thread, and under TLS a handshake of up to `frame_timeout`, so a flood of
                    // connections would grow threads without bound. Closed at once, counted.
                    shared.connections.fetch_sub(1, Ordering::AcqRel);
                    shared.metrics.busy_refusals.fetch_add(1, Ordering::Relaxed);
                    drop(stream);
                    continue;
                }
                let s = shared.clone();
                let spawned = std::thread::Builder::new()
                    .name(format!("client {peer}"))
                    .spawn(move || {
                        conn::serve(&s, stream, peer, open > s.opts.max_connections);
                        s.connections.fetch_sub(1, Ordering::AcqRel);
                    });
                if let Err(e) = spawned {
                    shared.connections.fetch_sub(1, Ordering::AcqRel);
                    tracing::warn!(%peer, error = %e, "cannot start a connection thread");
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

impl<F: Fabric + Send + 'static> ServerHandle<F> {
    /// Where clients connect.
    pub fn client_addr(&self) -> SocketAddr {
        self.client_addr
    }

    /// Where `/metrics` and `/status` are served.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// The log it serves.
    pub fn log(&self) -> &Arc<Log<F>> {
        &self.shared.log
    }

    /// Open client connections.
    pub fn connections(&self) -> usize {
        self.shared.connections.load(Ordering::Acquire)
    }

    /// Blocks until `stop` is set (a signal) or the log fails; returns the failure. A log
    /// whose driver failed (a storage error, a panic) serves nothing any more, so the binary
    /// then exits non-zero for its supervisor to restart it.
    pub fn run_until(&self, stop: &AtomicBool) -> Option<String> {
        while !stop.load(Ordering::Acquire) {
            if let Some(why) = self.shared.log.failure() {
                tracing::error!(cause = %why, "the log failed; stopping so that the supervisor restarts this server");
                return Some(why);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }

    /// Stops accepting, lets pending appends resolve for up to `grace`, then answers what is
    /// left with `ShuttingDown` and closes every connection. Returns once every connection
    /// closed, or after `grace` and one second more (a connection thread notices the
    /// shutdown within 200 ms; one stuck writing to a client that stopped reading ends at its
    /// `frame_timeout`, after this returns). The log itself stays open: the caller closes it
    /// (which flushes it) after this returns.
    pub fn shutdown(mut self, grace: Duration) {
        let ms = u64::try_from(grace.as_millis()).unwrap_or(u64::MAX);
        self.shared.shutdown_grace_ms.store(ms, Ordering::Release);
        self.shared.shutting_down.store(true, Ordering::Release);
        if let Some(a) = self.accept.take() {
            let _ = a.join();
        }
        let now = std::time::Instant::now();
        let deadline = now
            .checked_add(grace.saturating_add(Duration::from_secs(1)))
            .unwrap_or(now + Duration::from_secs(365 * 24 * 3600));
        while self.connections() > 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        tracing::info!(
            left = self.connections(),
            "client connections closed; the server has stopped"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Between [`bind`] and [`serve`] (while the log opens) the ports are taken but refuse
    /// connections at once, so a client moves on to another member instead of waiting in a
    /// backlog; served, they accept. [`bind`] checks the options first (`InvalidInput`).
    #[test]
    fn a_bound_port_refuses_connections_until_it_is_served() {
        use fabric::NodeId;
        use fabric::sim::{SimConfig, SimNet};
        use std::net::TcpStream;
        use wal::fs::{FaultFs, FileSystem};

        let mut bad = ServerOptions::new(1, 9, "127.0.0.1:0".parse().unwrap());
        bad.max_connections = 0;
        let e = bind(bad).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains("max_connections"), "{e}");

        let mut opts = ServerOptions::new(1, 9, "127.0.0.1:0".parse().unwrap());
        opts.metrics_listen = Some("127.0.0.1:0".parse().unwrap());
        let bound = bind(opts).unwrap();
        let addr = bound.client_addr();
        // Taken: a second server cannot bind the port.
        let e = TcpListener::bind(addr).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::AddrInUse);
        // Closed at once, and nothing is answered.
        let refused = |a: SocketAddr| {
            let mut c = TcpStream::connect(a).unwrap();
            c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut buf = [0u8; 1];
            match std::io::Read::read(&mut c, &mut buf) {
                Ok(n) => assert_eq!(n, 0, "{a} answered"),
                Err(e) => assert_ne!(e.kind(), std::io::ErrorKind::WouldBlock, "{a} held"),
            }
        };
        refused(addr);
        let net = SimNet::new(SimConfig::default(), 1);
        let stop = Arc::new(AtomicBool::new(false));
        net.run_realtime(stop.clone());
        let cfg = replica::ReplicaConfig::new(1, vec![1], 9, "/n1".into());
        let disk: Arc<dyn FileSystem> = Arc::new(FaultFs::new());
        let log = replica::Log::open(
            cfg,
            net.add_node(NodeId(1)),
            disk,
            replica::LogOptions::default(),
        )
        .unwrap();
        let handle = serve(bound, Arc::new(log)).unwrap();
        assert_eq!(handle.client_addr(), addr);
        // Served: the connection waits for its hello.
        let mut c = TcpStream::connect(addr).unwrap();
        c.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        let e = std::io::Read::read(&mut c, &mut [0u8; 1]).unwrap_err();
        assert!(
            matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
            "{e}"
        );
        TcpStream::connect(handle.metrics_addr().unwrap()).unwrap();
        handle.shutdown(Duration::ZERO);
        stop.store(true, Ordering::Release);
    }

    #[test]
    fn options_a_server_cannot_work_with_are_refused_by_name() {
        let good = ServerOptions::new(1, 9, "127.0.0.1:0".parse().unwrap());
        assert_eq!(good.validate(), Ok(()));
        type Spoil = fn(&mut ServerOptions);
        let cases: [(Spoil, &str); 8] = [
            (
                |o| o.max_connections = 0,
                "max_connections: must be positive",
            ),
            (|o| o.max_in_flight = 0, "max_in_flight: must be positive"),
            (
                |o| o.frame_timeout = Duration::ZERO,
                "frame_timeout: must be positive",
            ),
            (
                |o| o.idle_timeout = Duration::ZERO,
                "idle_timeout: must be positive",
            ),
            (
                |o| o.append_timeout = Duration::ZERO,
                "append_timeout: must be positive",
            ),
            (
                |o| o.retention_interval = Duration::ZERO,
                "retention_interval: must be positive",
            ),
            (
                |o| o.max_frame_bytes = 1023,
                "max_frame_bytes: expected 1024..=",
            ),
            (
                |o| o.max_frame_bytes = proto::MAX_FRAME_LIMIT + 1,
                "max_frame_bytes: expected 1024..=",
            ),
        ];
        for (spoil, says) in cases {
            let mut o = good.clone();
            spoil(&mut o);
            let e = o.validate().unwrap_err();
            assert!(e.contains(says), "{e:?} does not say {says:?}");
        }
    }
}
