//! `rdmalog-server`: one replica over RDMA, serving clients over TCP/TLS.
//!
//! `rdmalog-server --config /etc/rdmalog/server.toml [overrides]`. SIGTERM or SIGINT shuts it
//! down gracefully: it stops accepting, gives pending appends a few seconds to commit, fails
//! the rest with `ShuttingDown`, then flushes and closes the log. A restart recovers from the
//! data dir.

#![deny(unsafe_code)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use fabric::rdma::RdmaEndpoint;
use fabric::tcp::TcpEndpoint;
use fabric::{Endpoint, Transport};
use replica::Log;
use server::config::{ServerConfig, ServerFile};
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
    // Parsed, then overridden from the command line, then checked once (the check reads the
    // secret, the token and the TLS files).
    let mut file = ServerFile::load(&a.config)?;
    let f = &mut file;
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
    let cfg = ServerConfig::check(file, &a.config.display().to_string())?;
    if a.check_config {
        println!("{}: configuration is valid", a.config.display());
        return Ok(());
    }
    run(cfg)
}

/// Open files the server needs besides its clients' connections: segment files (one per
/// segment the log holds), the ring, the listeners, peer links, the metrics port.
const FILES_BESIDES_CLIENTS: u64 = 1024;

/// Raises the soft limit on open files to the hard one, as most servers do: a shell's default
/// of 1,024 is spent by a client flood (up to twice `max_connections` are held open while
/// refused) or by a log of a thousand segments, and the next segment file could not be
/// created, which stops the log. Warns when even the hard limit is short of what
/// `max_connections` may take.
fn raise_open_files_limit(max_connections: usize) {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    let (soft, hard) = (limit.current, limit.maximum);
    if soft != hard {
        let raised = Rlimit {
            current: hard,
            maximum: hard,
        };
        match setrlimit(Resource::Nofile, raised) {
            Ok(()) => tracing::info!(from = ?soft, to = ?hard, "raised the open files limit"),
            Err(e) => {
                tracing::warn!(error = %e, limit = ?soft, "cannot raise the open files limit")
            }
        }
    }
    let have = getrlimit(Resource::Nofile).current;
    let need = 2 * max_connections as u64 + FILES_BESIDES_CLIENTS;
    if have.is_some_and(|n| n < need) {
        tracing::warn!(
            limit = ?have,
            need,
            "the open files limit is short of twice client.max_connections and {FILES_BESIDES_CLIENTS} \
             for the log and peers: a flood of clients could leave the log unable to create its \
             next segment, which stops it; raise LimitNOFILE (systemd) or the hard ulimit -n, or \
             lower client.max_connections"
        );
    }
}

fn run(cfg: ServerConfig) -> anyhow::Result<()> {
    let f = &cfg.file;
    raise_open_files_limit(cfg.server_options().max_connections);
    // The client and metrics ports first: one in use stops this node before it takes part.
    let bound = server::bind(cfg.server_options()).context("binding the ports")?;
    if cfg.client_tls.is_none() {
        tracing::warn!("serving clients over plain TCP, as client.plaintext = true asks");
    }
    if cfg.secret.is_none() {
        tracing::warn!(transport = %cfg.transport, "no rdma.secret_file: peers are not authenticated");
    }
    let ep: Endpoint = match cfg.transport {
        Transport::Rdma => RdmaEndpoint::open(cfg.rdma_config())
            .with_context(|| format!("opening the RDMA endpoint on {}", f.rdma.listen))?
            .into(),
        Transport::Tcp => {
            if cfg.peer_tls.is_none() {
                tracing::warn!("peer links are plain TCP (no [peer_tls]): use a private network");
            }
            TcpEndpoint::open(cfg.tcp_config())
                .with_context(|| format!("opening the TCP endpoint on {}", f.rdma.listen))?
                .into()
        }
    };
    let fs: Arc<dyn FileSystem> = Arc::new(StdFs);
    let log = Arc::new(
        Log::open(cfg.replica_config(), ep, fs, cfg.log_options()).context("opening the log")?,
    );
    let handle = server::serve(bound, log.clone()).context("serving clients")?;
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
