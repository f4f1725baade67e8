//! `rdmalog-node`: one replica on one host, over RDMA or TCP (`--transport`), with a line-based *driver port* that
//! the lab's workload, fault tests and demo use (it is a test harness interface, not the client
//! protocol of the server issue).
//!
//! Driver port commands, one per line, answered with one line each, in order. Commands may be
//! pipelined: an `APPEND` is proposed as soon as its line is read, and its answer is written
//! once it commits, so a client can keep many in flight on one connection.
//! - `APPEND <hex payload>` → `OK <index> <crc32c>` | `NOTLEADER <leader id or 0>` | `ERR <why>`
//! - `SESSION` → `SESSION <id>` once the session is committed | `NOTLEADER <l>` | `ERR <why>`:
//!   opens a client session for exactly-once appends (`replica::sessions`)
//! - `APPEND_IN <session> <seq> <hex payload>` → as `APPEND`: entry number `seq` (from 1) of
//!   the session; sent again, it is not appended twice, and answers the first copy's index
//! - `READ <index>` → `DATA <hex payload>` | `NONE` (not committed, or no payload) | `ERR ...`
//!   (deleted after a checkpoint: `Compacted`)
//! - `CRCS <from> <count>` → `CRCS <commit> <one token per index>`: the crc32c of each committed
//!   entry as 8 hex digits, `-` for a committed entry that carries no application payload
//!   (an election no-op or a membership change); it stops at the commit index.
//! - `CHECKPOINT <index>` → `CHECKPOINT <first index>` | `ERR <why>`: records a checkpoint at
//!   `index` (state: the text `lab checkpoint at <index>`) and truncates the log below it
//! - `STATUS` → `STATUS id=<id> role=<role> term=<t> leader=<l> commit=<c> last=<i> fast=<n>
//!   slow=<n> fenced=<n> reconnects=<n> grants=<n> revokes=<n> recovered=<n> first=<n>
//!   snap_sent=<n> snap_installed=<n> nic_acks=<n> placed=<n> quiet=<n> conns=<id>:<state>,...`
//!   (`recovered`: entries taken at start-up from the shared-memory ring a crashed process
//!   left, under `--durability memory` or `replicated`; `first`: the first index the log
//!   holds; `snap_*`: snapshots sent to followers behind a checkpoint, and installed from the
//!   leader; `nic_acks`: appends it counted as a follower's when its RDMA Write completed,
//!   `placed`: entries it took from its ring as its leader placed them, and `quiet`: answers
//!   to its leader's descriptors it left unsent because the leader had counted them, all
//!   three under `--durability replicated`)
#![deny(unsafe_code)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::{Arc, mpsc};
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Parser;
use fabric::NodeId;
use fabric::rdma::{RdmaConfig, RdmaEndpoint, load_secret};
use fabric::tcp::{TcpConfig, TcpEndpoint};
use fabric::{Endpoint, Transport};
use node::harness::{hex, unhex};
use replica::{AppendHandle, Log, LogOptions, PollMode, ReplicaConfig, ReplicaError, Role};
use wal::fs::{FileSystem, StdFs};

#[derive(Parser, Debug)]
#[command(
    name = "rdmalog-node",
    about = "One rdmalog replica over RDMA or TCP with a driver port for lab tests"
)]
struct Args {
    /// This node's id (1..=100: its election window, 20 + 10 x id ticks, grows with it).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=100))]
    id: u64,
    /// Cluster id (hex or decimal).
    #[arg(long, default_value = "0x1ab")]
    cluster_id: String,
    /// The replication transport: rdma (one-sided writes, no peer CPU) or tcp (kernel
    /// sockets, for hosts without RDMA).
    #[arg(long, default_value = "rdma", value_parser = ["rdma", "tcp"])]
    transport: String,
    /// Replication listen address, e.g. 192.0.2.11:7700 (under rdma, an address on this
    /// host's RDMA netdev).
    #[arg(long)]
    listen: SocketAddr,
    /// A peer as ID=IP:PORT (repeat for each peer).
    #[arg(long = "peer", value_name = "ID=IP:PORT")]
    peers: Vec<String>,
    /// Data directory (segments and raft state).
    #[arg(long)]
    data_dir: PathBuf,
    /// Cluster secret file (owner-only, at least 16 bytes); peers must prove it.
    #[arg(long)]
    secret_file: Option<PathBuf>,
    /// fsync (ack after fdatasync on a majority), memory (ack after a majority validated
    /// the entry in its ring, which lives in shared memory under --ring-dir so that a crash
    /// of this process loses nothing; a machine crash of a majority does) or replicated (as
    /// memory, but a follower counts once the leader's RDMA Write into its ring completed).
    #[arg(long, default_value = "fsync", value_parser = ["fsync", "memory", "replicated"])]
    durability: String,
    /// Under --durability memory: the tmpfs directory for the ring's shared-memory files.
    #[arg(long, default_value = "/dev/shm")]
    ring_dir: PathBuf,
    /// Size of one WAL segment file in MiB (a checkpoint deletes whole segments).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=65536))]
    segment_mib: u64,
    /// The driver port (TCP), e.g. 192.0.2.11:8700.
    #[arg(long)]
    driver: SocketAddr,
    /// Raft tick in milliseconds.
    #[arg(long, default_value_t = 20)]
    tick_ms: u64,
    /// How the replica's driver thread polls: busy (a dedicated core), adaptive (spin, then
    /// sleep; for shared cores) or event (sleep until work or the next tick).
    #[arg(long, default_value = "adaptive", value_parser = ["busy", "adaptive", "event"])]
    poll: String,
    /// Pin the driver thread to this core.
    #[arg(long)]
    pin_core: Option<usize>,
    /// QP local ACK timeout exponent (4.096 us x 2^N per try); with --qp-retry it bounds how
    /// long a dead peer takes to detect (under tcp, the same bound is the time an operation
    /// may stay unacknowledged).
    #[arg(long, default_value_t = 14, value_parser = clap::value_parser!(u8).range(1..=31))]
    qp_timeout: u8,
    /// QP transport retries before a peer is declared dead (0-6; Soft-RoCE retries forever
    /// at 7).
    #[arg(long, default_value_t = 6, value_parser = clap::value_parser!(u8).range(0..=6))]
    qp_retry: u8,
}

fn parse_peer(s: &str) -> anyhow::Result<(NodeId, SocketAddr)> {
    let (id, addr) = s
        .split_once('=')
        .with_context(|| format!("--peer `{s}` is not ID=IP:PORT"))?;
    Ok((
        NodeId(
            id.parse()
                .with_context(|| format!("--peer `{s}`: bad id"))?,
        ),
        addr.parse()
            .with_context(|| format!("--peer `{s}`: bad address"))?,
    ))
}

fn parse_u64(s: &str) -> anyhow::Result<u64> {
    Ok(match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16)?,
        None => s.parse()?,
    })
}

/// Most entries one `CRCS` answers.
const MAX_CRCS: u64 = 20_000;

fn crcs(log: &Log<Endpoint>, from: u64, count: u64) -> String {
    let commit = log.status().commit;
    let mut out = format!("CRCS {commit}");
    for index in from.max(1)..from.max(1).saturating_add(count).min(commit + 1) {
        match log.read(index) {
            Ok(Some(d)) => out.push_str(&format!(" {:08x}", crc32c::crc32c(&d))),
            Ok(None) | Err(ReplicaError::Compacted { .. }) => out.push_str(" -"),
            Err(e) => return format!("ERR reading index {index}: {e}"),
        }
    }
    out
}

fn append_answer(r: Result<u64, ReplicaError>, crc: u32) -> String {
    match r {
        Ok(index) => format!("OK {index} {crc}"),
        Err(ReplicaError::NotLeader { leader_hint }) => {
            format!("NOTLEADER {}", leader_hint.unwrap_or(0))
        }
        Err(e) => format!("ERR {e}"),
    }
}

fn answer(log: &Log<Endpoint>, line: &str) -> String {
    let mut words = line.split_whitespace();
    match (words.next(), words.next()) {
        (Some("READ"), Some(i)) => match i.parse().map(|i| log.read(i)) {
            Ok(Ok(Some(d))) => format!("DATA {}", hex(&d)),
            Ok(Ok(None)) => "NONE".into(),
            Ok(Err(e)) => format!("ERR {e}"),
            Err(e) => format!("ERR bad index: {e}"),
        },
        (Some("CRCS"), Some(from)) => {
            match (from.parse::<u64>(), words.next().map(str::parse::<u64>)) {
                (Ok(from), Some(Ok(count))) => crcs(log, from, count.min(MAX_CRCS)),
                _ => "ERR usage: CRCS <from> <count>".into(),
            }
        }
        (Some("CHECKPOINT"), Some(i)) => match i.parse::<u64>() {
            Ok(index) => {
                match log.checkpoint(index, format!("lab checkpoint at {index}").as_bytes()) {
                    Ok(first) => format!("CHECKPOINT {first}"),
                    Err(e) => format!("ERR {e}"),
                }
            }
            Err(e) => format!("ERR bad index: {e}"),
        },
        (Some("STATUS"), None) => {
            let s = log.status();
            let role = match s.role {
                Role::Leader => "leader",
                Role::Follower => "follower",
                Role::Candidate => "candidate",
            };
            format!(
                "STATUS id={} role={role} term={} leader={} commit={} last={} fast={} slow={} fenced={} reconnects={} grants={} revokes={} recovered={} first={} snap_sent={} snap_installed={} nic_acks={} placed={} quiet={} recovering={} conns={}",
                s.id,
                s.term,
                s.leader.unwrap_or(0),
                s.commit,
                s.last_index,
                s.stats.fast_appends,
                s.stats.slow_appends,
                s.stats.fenced_writes,
                s.stats.reconnects,
                s.stats.grants,
                s.stats.revokes,
                s.stats.recovered_from_ring,
                s.first_index,
                s.stats.snapshots_sent,
                s.stats.snapshots_installed,
                s.stats.nic_acks,
                s.stats.placed_taken,
                s.stats.answers_skipped,
                u64::from(s.recovering.is_some()),
                s.peers
                    .iter()
                    .map(|p| format!("{}:{:?}", p.id, p.conn).to_lowercase())
                    .collect::<Vec<_>>()
                    .join(",")
            )
        }
        _ => format!(
            "ERR unknown command `{}`",
            line.chars().take(40).collect::<String>()
        ),
    }
}

/// One answer owed to a client, in the order its command arrived.
enum Owed {
    Ready(String),
    Append(AppendHandle<Endpoint>, u32),
    Session(AppendHandle<Endpoint>),
}

/// Most commands a connection may have in flight; the reader waits beyond it.
const MAX_IN_FLIGHT: usize = 256;

fn serve(log: Arc<Log<Endpoint>>, stream: TcpStream) {
    let Ok(read_half) = stream.try_clone() else {
        return;
    };
    let (tx, rx) = mpsc::sync_channel::<Owed>(MAX_IN_FLIGHT);
    // The writer answers in order, waiting for each append to commit.
    let writer = std::thread::spawn(move || {
        let mut out = std::io::BufWriter::new(stream);
        loop {
            // Flush only when nothing else is owed right now, so a burst goes out together.
            let owed = match rx.try_recv() {
                Ok(o) => o,
                Err(mpsc::TryRecvError::Empty) => {
                    if out.flush().is_err() {
                        return;
                    }
                    match rx.recv() {
                        Ok(o) => o,
                        Err(_) => break,
                    }
                }
                Err(mpsc::TryRecvError::Disconnected) => break,
            };
            let reply = match owed {
                Owed::Ready(r) => r,
                Owed::Append(h, crc) => append_answer(h.wait(APPEND_WAIT), crc),
                Owed::Session(h) => match h.wait(APPEND_WAIT) {
                    Ok(session) => format!("SESSION {session}"),
                    Err(e) => append_answer(Err(e), 0),
                },
            };
            if writeln!(out, "{reply}").is_err() {
                return;
            }
        }
        let _ = out.flush();
    });
    // A line is bounded: a 64 KiB payload in hex plus the command.
    let mut reader = BufReader::new(read_half.take(1 << 20));
    let mut line = String::new();
    loop {
        line.clear();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        let owed = match line.trim().split_once(' ') {
            None if line.trim() == "SESSION" => match log.open_session() {
                Ok(h) => Owed::Session(h),
                Err(e) => Owed::Ready(append_answer(Err(e), 0)),
            },
            Some(("APPEND_IN", rest)) => {
                let mut it = rest.split_whitespace();
                let parsed = (|| {
                    let session = it.next()?.parse::<u64>().ok()?;
                    let seq = it.next()?.parse::<u64>().ok()?;
                    Some((session, seq, unhex(it.next()?)?))
                })();
                match parsed {
                    Some((session, seq, data)) => {
                        let crc = crc32c::crc32c(&data);
                        match log.append_in_session(session, seq, &data) {
                            Ok(handle) => Owed::Append(handle, crc),
                            Err(e) => Owed::Ready(append_answer(Err(e), crc)),
                        }
                    }
                    None => Owed::Ready(
                        "ERR bad APPEND_IN: expected <session> <seq> <hex payload>".into(),
                    ),
                }
            }
            Some(("APPEND", h)) => match unhex(h.trim()) {
                Some(data) => {
                    let crc = crc32c::crc32c(&data);
                    match log.append(&data) {
                        Ok(handle) => Owed::Append(handle, crc),
                        Err(e) => Owed::Ready(append_answer(Err(e), crc)),
                    }
                }
                None => Owed::Ready("ERR bad payload: not an even number of hex digits".into()),
            },
            _ => Owed::Ready(answer(&log, line.trim())),
        };
        if tx.send(owed).is_err() {
            break;
        }
        reader.get_mut().set_limit(1 << 20);
    }
    drop(tx);
    let _ = writer.join();
}

/// How long the driver waits for an append to commit before answering `ERR`.
const APPEND_WAIT: Duration = Duration::from_secs(10);

use std::io::Read as _;

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
    let cluster_id = parse_u64(&a.cluster_id).context("--cluster-id")?;
    let mut peers: BTreeMap<NodeId, SocketAddr> = BTreeMap::new();
    for p in &a.peers {
        let (id, addr) = parse_peer(p)?;
        if id == NodeId(a.id) {
            bail!("--peer `{p}` names this node's own id");
        }
        if peers.insert(id, addr).is_some() {
            bail!("--peer `{p}`: node {} is given twice", id.0);
        }
    }
    let transport: Transport = a
        .transport
        .parse()
        .map_err(|e: String| anyhow::anyhow!("--transport: {e}"))?;
    let bound = verbs::dead_peer_bound(a.qp_timeout, a.qp_retry);
    tracing::info!(
        %transport,
        nominal_ms = bound.nominal.as_millis() as u64,
        upper_ms = bound.upper.as_millis() as u64,
        "a dead peer is detected within this bound (QP timeout {} and {} retries)",
        a.qp_timeout,
        a.qp_retry
    );
    let secret = match &a.secret_file {
        Some(f) => Some(Arc::new(load_secret(f)?)),
        None => None,
    };
    let started = std::time::Instant::now();
    let ep: Endpoint = match transport {
        Transport::Rdma => {
            let mut rc = RdmaConfig::new(NodeId(a.id), cluster_id, a.listen, peers.clone());
            rc.qp.timeout = a.qp_timeout;
            rc.qp.retry_cnt = a.qp_retry;
            rc.secret = secret;
            RdmaEndpoint::open(rc)
                .with_context(|| format!("opening the RDMA endpoint on {}", a.listen))?
                .into()
        }
        Transport::Tcp => {
            let mut tc = TcpConfig::new(NodeId(a.id), cluster_id, a.listen, peers.clone());
            tc.dead_peer_timeout = bound.nominal;
            tc.secret = secret;
            TcpEndpoint::open(tc)
                .with_context(|| format!("opening the TCP endpoint on {}", a.listen))?
                .into()
        }
    };
    let mut voters: Vec<u64> = peers.keys().map(|p| p.0).collect();
    voters.push(a.id);
    voters.sort_unstable();
    let mut cfg = ReplicaConfig::new(a.id, voters, cluster_id, a.data_dir.clone());
    cfg.durability = a
        .durability
        .parse()
        .map_err(|e: String| anyhow::anyhow!("--durability: {e}"))?;
    cfg.ring_dir = a.ring_dir.clone();
    cfg.segment_bytes = a.segment_mib << 20;
    // Test-only: a protocol rule broken on purpose, to prove a lab test notices.
    if let Ok(m) = std::env::var("RDMALOG_NODE_MUTATION") {
        cfg.mutation = match m.as_str() {
            "ack-without-fsync" => replica::Mutation::AckWithoutFsync,
            "skip-revoke" => replica::Mutation::SkipRevoke,
            "private-ring" => replica::Mutation::PrivateRing,
            "no-recovering-guard" => replica::Mutation::NoRecoveringGuard,
            "trust-new-data-dir" => replica::Mutation::TrustNewDataDir,
            other => bail!("unknown RDMALOG_NODE_MUTATION `{other}`"),
        };
        tracing::warn!(
            mutation = m,
            "TEST MUTATION ACTIVE: this node breaks a rule on purpose"
        );
    }
    cfg.election_tick = 20;
    cfg.heartbeat_tick = 3;
    cfg.election_window = Some((20 + 10 * a.id as usize, 21 + 10 * a.id as usize));
    let fs: Arc<dyn FileSystem> = Arc::new(StdFs);
    let opts = LogOptions {
        tick: Duration::from_millis(a.tick_ms),
        poll: match a.poll.as_str() {
            "busy" => PollMode::Busy,
            "event" => PollMode::Event,
            _ => PollMode::Adaptive {
                spin: Duration::from_micros(50),
            },
        },
        pin_core: a.pin_core,
    };
    let endpoint_secs = started.elapsed().as_secs_f64();
    let log = Arc::new(Log::open(cfg, ep, fs, opts).context("opening the replica")?);
    let log_secs = started.elapsed().as_secs_f64() - endpoint_secs;
    let listener = TcpListener::bind(a.driver)
        .with_context(|| format!("binding the driver port {}", a.driver))?;
    eprintln!(
        "rdmalog-node {}: up ({transport} {}, driver {}, data {}; endpoint opened in {endpoint_secs:.2} s, log in {log_secs:.2} s)",
        a.id,
        a.listen,
        a.driver,
        a.data_dir.display()
    );
    for stream in listener.incoming() {
        let Ok(stream) = stream else { continue };
        let log = log.clone();
        std::thread::spawn(move || serve(log, stream));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_and_ids_parse() {
        let (id, addr) = parse_peer("2=192.0.2.12:7702").unwrap();
        assert_eq!(id, NodeId(2));
        assert_eq!(addr.port(), 7702);
        assert!(parse_peer("2:192.0.2.12").is_err());
        assert_eq!(parse_u64("0x1ab").unwrap(), 0x1ab);
        assert_eq!(parse_u64("17").unwrap(), 17);
    }
}
