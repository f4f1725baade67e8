//! Three replicas of the log in this process, one per lab host (rxe1..3): what the lab suite
//! and the lab criterion bench measure through the embedded API.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use fabric::rdma::{RdmaConfig, RdmaEndpoint};
use fabric::tcp::{TcpConfig, TcpEndpoint};
use fabric::{Endpoint, NodeId, Transport};
use replica::{Durability, Log, LogOptions, PollMode, ReplicaConfig, Role};
use wal::fs::{FileSystem, StdFs};

/// `192.0.2.1<i>:<port>`, lab host `i`'s address.
pub fn lab_addr(i: u64, port: u16) -> SocketAddr {
    format!("192.0.2.1{i}:{port}").parse().expect("lab address")
}

/// Whether this process runs inside the lab (the lab sets `RDMALOG_LAB`).
pub fn in_lab() -> bool {
    std::env::var_os("RDMALOG_LAB").is_some()
}

/// Three replicas in this process, one per rxe host.
#[derive(Debug)]
pub struct LabCluster {
    /// The replicas, node 1 first.
    pub logs: Vec<Log<Endpoint>>,
}

/// The lab's default: three replicas and the rxe threads share 2 vCPUs, so spin briefly.
pub const LAB_POLL: PollMode = PollMode::Adaptive {
    spin: Duration::from_micros(50),
};

/// Parses `busy`, `event`, `adaptive` (50 µs) or `adaptive:<µs>`.
pub fn parse_poll(s: &str) -> anyhow::Result<PollMode> {
    Ok(match s {
        "busy" => PollMode::Busy,
        "event" => PollMode::Event,
        "adaptive" => LAB_POLL,
        _ => match s.strip_prefix("adaptive:").map(str::parse::<u64>) {
            Some(Ok(us)) => PollMode::Adaptive {
                spin: Duration::from_micros(us),
            },
            _ => bail!("unknown poll mode {s:?}: use busy, event, adaptive or adaptive:<µs>"),
        },
    })
}

impl LabCluster {
    /// Opens three replicas with durability `d`, data under `dir` (emptied first), RDMA ports
    /// `port_base + i`, drivers polling with `poll`, and waits for a leader.
    pub fn open(
        d: Durability,
        dir: &Path,
        port_base: u16,
        cluster: u64,
        poll: PollMode,
    ) -> anyhow::Result<LabCluster> {
        Self::open_on(Transport::Rdma, d, dir, port_base, cluster, poll)
    }

    /// Like [`LabCluster::open`], over `transport` between the same hosts.
    pub fn open_on(
        transport: Transport,
        d: Durability,
        dir: &Path,
        port_base: u16,
        cluster: u64,
        poll: PollMode,
    ) -> anyhow::Result<LabCluster> {
        let _ = std::fs::remove_dir_all(dir);
        Self::reopen_on(transport, d, dir, port_base, cluster, poll)
    }

    /// Like [`LabCluster::open`], but keeps what `dir` holds: the replicas recover their logs.
    pub fn reopen(
        d: Durability,
        dir: &Path,
        port_base: u16,
        cluster: u64,
        poll: PollMode,
    ) -> anyhow::Result<LabCluster> {
        Self::reopen_on(Transport::Rdma, d, dir, port_base, cluster, poll)
    }

    /// Like [`LabCluster::reopen`], over `transport`.
    pub fn reopen_on(
        transport: Transport,
        d: Durability,
        dir: &Path,
        port_base: u16,
        cluster: u64,
        poll: PollMode,
    ) -> anyhow::Result<LabCluster> {
        Self::open_polled(transport, d, dir, port_base, cluster, [poll; 3])
    }

    /// Like [`LabCluster::reopen_on`], each node's driver polling its own way (node 1's
    /// first). Node 1 wins the first election unless something goes wrong (its election
    /// timeout is the shortest), so `[busy, event, event]` spins on the leader only.
    pub fn open_polled(
        transport: Transport,
        d: Durability,
        dir: &Path,
        port_base: u16,
        cluster: u64,
        polls: [PollMode; 3],
    ) -> anyhow::Result<LabCluster> {
        let mut logs = Vec::new();
        for id in 1..=3u64 {
            let peers: BTreeMap<NodeId, SocketAddr> = (1..=3u64)
                .filter(|&p| p != id)
                .map(|p| (NodeId(p), lab_addr(p, port_base + p as u16)))
                .collect();
            let listen = lab_addr(id, port_base + id as u16);
            let ep: Endpoint = match transport {
                Transport::Rdma => {
                    RdmaEndpoint::open(RdmaConfig::new(NodeId(id), cluster, listen, peers))
                        .context("opening an RDMA endpoint (inside the lab?)")?
                        .into()
                }
                Transport::Tcp => {
                    TcpEndpoint::open(TcpConfig::new(NodeId(id), cluster, listen, peers))
                        .context("opening a TCP endpoint (inside the lab?)")?
                        .into()
                }
            };
            let mut cfg =
                ReplicaConfig::new(id, vec![1, 2, 3], cluster, dir.join(format!("n{id}")));
            cfg.durability = d;
            cfg.ring_dir = std::env::temp_dir();
            cfg.election_tick = 20;
            cfg.heartbeat_tick = 3;
            cfg.election_window = Some((20 + 10 * id as usize, 21 + 10 * id as usize));
            let fs: Arc<dyn FileSystem> = Arc::new(StdFs);
            let opts = LogOptions {
                tick: Duration::from_millis(20),
                poll: polls[id as usize - 1],
                pin_core: None,
            };
            logs.push(Log::open(cfg, ep, fs, opts)?);
        }
        let c = LabCluster { logs };
        c.leader(Duration::from_secs(60))?;
        Ok(c)
    }

    /// The index in `logs` of the leader, waiting up to `within` for one.
    pub fn leader(&self, within: Duration) -> anyhow::Result<usize> {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Some(k) = self
                .logs
                .iter()
                .position(|l| l.status().role == Role::Leader)
            {
                return Ok(k);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        bail!("no leader within {within:?}")
    }

    /// Closes every replica (flushing it).
    pub fn close(self) {
        for l in self.logs {
            let _ = l.close();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poll_modes_parse_and_bad_ones_are_named() {
        assert_eq!(parse_poll("busy").unwrap(), PollMode::Busy);
        assert_eq!(parse_poll("event").unwrap(), PollMode::Event);
        assert_eq!(parse_poll("adaptive").unwrap(), LAB_POLL);
        assert_eq!(
            parse_poll("adaptive:200").unwrap(),
            PollMode::Adaptive {
                spin: Duration::from_micros(200)
            }
        );
        let e = parse_poll("adaptive:fast").unwrap_err().to_string();
        assert!(e.contains("adaptive:fast") && e.contains("busy"), "{e}");
    }
}
