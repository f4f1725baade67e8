//! `rdmalog-server`: one replica over RDMA, serving clients over TCP/TLS.
//!
//! `rdmalog-server --config /etc/rdmalog/server.toml [overrides]`. SIGTERM or SIGINT shuts it
//! down gracefully: it stops accepting, gives pending appends a few seconds to commit, fails
//! the rest with `ShuttingDown`, then flushes and closes the log. A restart recovers from the
//! data dir.

#![deny(unsafe_code)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use fabric::NodeId;
use fabric::rdma::{RdmaConfig, RdmaEndpoint};
use fabric::tcp::{TcpConfig, TcpEndpoint};
use fabric::{Endpoint, Transport};
use proto::NodeInfo;
use replica::{Log, LogOptions, PollMode, ReplicaConfig};
use server::ServerOptions;
use server::config::ServerConfig;
use wal::fs::{FileSystem, StdFs};

#[derive(Parser, Debug)]
#[command(
    name = "rdmalog-server",
    about = "One rdmalog replica over RDMA or TCP, serving clients over TCP (TLS)"
)]
struct Args {
    /// The TOML configuration (see ops/config/).
    #[arg(long, short)]
    config: PathBuf,
    /// Overrides `node_id`.
    #[arg(long)]
    node_id: Option<u64>,
    /// Overrides `data_dir`.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Overrides `client.listen`.
    #[arg(long)]
    client_listen: Option<SocketAddr>,
    /// Overrides `metrics.listen`.
    #[arg(long)]
    metrics_listen: Option<SocketAddr>,
    /// Overrides `transport` (rdma or tcp).
    #[arg(long, value_parser = ["rdma", "tcp"])]
    transport: Option<String>,
    /// Overrides `poll.pin_core`.
    #[arg(long)]
    pin_core: Option<usize>,
    /// Checks the configuration and exits.
    #[arg(long)]
    check_config: bool,
}

fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let mut cfg = ServerConfig::load(&a.config)?;
    let f = &mut cfg.file;
    if let Some(v) = a.node_id {
        f.node_id = v;
    }
    if let Some(v) = a.data_dir.clone() {
        f.data_dir = v;
    }
    if let Some(v) = a.client_listen {
        f.client.listen = v;
    }
    if let Some(v) = a.metrics_listen {
        f.metrics = Some(server::config::MetricsSection { listen: v });
    }
    if let Some(v) = a.transport.clone() {
        f.transport = Some(v);
    }
    if let Some(v) = a.pin_core {
        f.poll.pin_core = Some(v);
    }
    let cfg = ServerConfig::check(cfg.file, &a.config.display().to_string())?;
    if a.check_config {
        println!("{}: configuration is valid", a.config.display());
        return Ok(());
    }
    run(cfg)
}

fn run(cfg: ServerConfig) -> anyhow::Result<()> {
    let f = &cfg.file;
    let tls = cfg.client_tls.clone();
    if tls.is_none() {
        tracing::warn!("serving clients over plain TCP, as client.plaintext = true asks");
    }
    let peers: BTreeMap<NodeId, SocketAddr> =
        f.peers.iter().map(|p| (NodeId(p.id), p.rdma)).collect();
    let secret = cfg.secret.clone();
    if secret.is_none() {
        tracing::warn!(transport = %cfg.transport, "no rdma.secret_file: peers are not authenticated");
    }
    let (qp_timeout, qp_retry) = (
        f.rdma.qp_timeout.unwrap_or(14),
        f.rdma.qp_retry.unwrap_or(7),
    );
    let ep: Endpoint = match cfg.transport {
        Transport::Rdma => {
            let mut rc = RdmaConfig::new(NodeId(f.node_id), cfg.cluster_id, f.rdma.listen, peers);
            rc.device = f.rdma.device.clone();
            rc.qp.timeout = qp_timeout;
            rc.qp.retry_cnt = qp_retry;
            rc.secret = secret;
            RdmaEndpoint::open(rc)
                .with_context(|| format!("opening the RDMA endpoint on {}", f.rdma.listen))?
                .into()
        }
        Transport::Tcp => {
            let mut tc = TcpConfig::new(NodeId(f.node_id), cfg.cluster_id, f.rdma.listen, peers);
            // The same bound as RDMA's retry timer, so one setting means one thing.
            tc.dead_peer_timeout = TcpConfig::dead_peer_from_qp(qp_timeout, qp_retry);
            tc.secret = secret;
            tc.tls = cfg.peer_tls.clone();
            if tc.tls.is_none() {
                tracing::warn!("peer links are plain TCP (no [peer_tls]): use a private network");
            }
            TcpEndpoint::open(tc)
                .with_context(|| format!("opening the TCP endpoint on {}", f.rdma.listen))?
                .into()
        }
    };
    let mut voters: Vec<u64> = f.peers.iter().map(|p| p.id).collect();
    voters.push(f.node_id);
    voters.sort_unstable();
    let mut rcfg = ReplicaConfig::new(f.node_id, voters, cfg.cluster_id, f.data_dir.clone());
    rcfg.durability = cfg.durability;
    if let Some(d) = &f.ring_dir {
        rcfg.ring_dir = d.clone();
    }
    if let Some(m) = f.ring_mib {
        rcfg.ring_bytes = m << 20;
    }
    if let Some(m) = f.segment_mib {
        rcfg.segment_bytes = m << 20;
    }
    rcfg.election_tick = f.raft.election_ticks;
    rcfg.heartbeat_tick = f.raft.heartbeat_ticks;
    rcfg.broadcast_commit = f.raft.broadcast_commit;
    let opts = LogOptions {
        tick: Duration::from_millis(f.raft.tick_ms),
        poll: match f.poll.mode.as_deref() {
            Some("busy") => PollMode::Busy,
            Some("event") => PollMode::Event,
            _ => PollMode::Adaptive {
                spin: Duration::from_micros(50),
            },
        },
        pin_core: f.poll.pin_core,
    };
    let fs: Arc<dyn FileSystem> = Arc::new(StdFs);
    let log = Arc::new(Log::open(rcfg, ep, fs, opts).context("opening the log")?);

    let mut members = vec![NodeInfo {
        id: f.node_id,
        client_addr: cfg.advertise(),
    }];
    members.extend(f.peers.iter().map(|p| NodeInfo {
        id: p.id,
        client_addr: p.client.clone(),
    }));
    let c = &f.client;
    let mut so = ServerOptions::new(f.node_id, cfg.cluster_id, c.listen);
    so.members = members;
    so.tls = tls;
    so.tokens = cfg.tokens.clone();
    so.anonymous_role = cfg.anonymous_role;
    so.max_connections = c.max_connections.unwrap_or(so.max_connections);
    so.max_in_flight = c.max_in_flight.unwrap_or(so.max_in_flight);
    so.max_frame_bytes = c.max_frame_bytes.unwrap_or(so.max_frame_bytes);
    if let Some(ms) = c.frame_timeout_ms {
        so.frame_timeout = Duration::from_millis(ms);
    }
    if let Some(ms) = c.idle_timeout_ms {
        so.idle_timeout = Duration::from_millis(ms);
    }
    if let Some(ms) = c.append_timeout_ms {
        so.append_timeout = Duration::from_millis(ms);
    }
    so.metrics_listen = f.metrics.as_ref().map(|m| m.listen);
    let r = &f.retention;
    so.retention = replica::retention::Retention {
        max_entries: r.max_entries,
        max_bytes: r.max_bytes,
        max_age: r.max_age_secs.map(Duration::from_secs),
    };
    if let Some(ms) = r.interval_ms {
        so.retention_interval = Duration::from_millis(ms);
    }
    let handle = server::start(so, log.clone())
        .with_context(|| format!("listening for clients on {}", c.listen))?;
    eprintln!(
        "rdmalog-server {}: up ({} {}{}, clients {}{}, data {})",
        f.node_id,
        cfg.transport,
        f.rdma.listen,
        if cfg.peer_tls.is_some() { " tls" } else { "" },
        handle.client_addr(),
        if f.tls.is_some() {
            " tls"
        } else {
            " plaintext"
        },
        f.data_dir.display()
    );

    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, stop.clone()).context("installing signal handlers")?;
    }
    // A log whose driver failed (a storage error, a panic) serves nothing any more: exit
    // non-zero so the supervisor restarts the server, which recovers from the data dir.
    if let Some(why) = handle.run_until(&stop) {
        handle.shutdown(Duration::ZERO);
        anyhow::bail!("the log failed and the server stopped: {why}");
    }
    tracing::info!("shutting down: no new clients; pending appends get 5 s");
    handle.shutdown(Duration::from_secs(5));
    // The metrics thread lets go of the log within its next poll.
    let mut log = log;
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let log = loop {
        match Arc::try_unwrap(log) {
            Ok(l) => break l,
            Err(l) if std::time::Instant::now() < deadline => {
                log = l;
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(_) => anyhow::bail!(
                "the log is still in use 5 s after shutdown; not flushed cleanly (a restart recovers it)"
            ),
        }
    };
    log.close().context("flushing and closing the log")?;
    eprintln!("rdmalog-server {}: stopped cleanly", cfg.file.node_id);
    Ok(())
}
