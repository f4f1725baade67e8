//! Test support: three real servers (real TCP, and TLS when asked) over three replicas on the
//! in-process fabric, in this process. The server's, the client's and the CLI's tests share it.

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use fabric::NodeId;
use fabric::sim::{SimConfig, SimEndpoint, SimNet};
use proto::NodeInfo;
use replica::{Log, LogOptions, PollMode, ReplicaConfig};
use wal::fs::{FaultFs, FileSystem};

use crate::{ServerHandle, ServerOptions};

/// The cluster id of every [`SimServers`] cluster.
pub const CLUSTER: u64 = 0xc1;

/// Three replicas with a server each; dropping it stops the fabric's clock.
pub struct SimServers {
    /// The in-process fabric (crash a node with `net.crash`).
    pub net: SimNet,
    stop: Arc<AtomicBool>,
    /// The servers, node 1 first; `None` once stopped.
    pub servers: Vec<Option<ServerHandle<SimEndpoint>>>,
    /// Their client addresses, node 1 first.
    pub addrs: Vec<String>,
    /// Their disks, node 1 first (a clone shares the disk: arm its faults).
    pub disks: Vec<FaultFs>,
}

impl std::fmt::Debug for SimServers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimServers")
            .field("addrs", &self.addrs)
            .finish_non_exhaustive()
    }
}

impl Drop for SimServers {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn free_port() -> std::io::Result<SocketAddr> {
    TcpListener::bind("127.0.0.1:0")?.local_addr()
}

impl SimServers {
    /// Starts the cluster; `tune` adjusts each server's options (with `metrics_listen` on an
    /// ephemeral port, and read-write for clients without a token, unlike the default).
    /// Ports are picked free but may be taken before the servers bind them: then everything
    /// starts again (up to five times).
    pub fn start(seed: u64, tune: impl Fn(&mut ServerOptions)) -> SimServers {
        Self::start_tuned(seed, |_| {}, tune)
    }

    /// [`SimServers::start`], with `replica` adjusting each replica's configuration too
    /// (smaller segments, say).
    pub fn start_tuned(
        seed: u64,
        replica: impl Fn(&mut ReplicaConfig),
        tune: impl Fn(&mut ServerOptions),
    ) -> SimServers {
        let mut attempt = 0;
        loop {
            match Self::try_start(seed, &replica, &tune) {
                Ok(c) => return c,
                Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && attempt < 5 => attempt += 1,
                Err(e) => panic!("cannot start the cluster: {e}"),
            }
        }
    }

    fn try_start(
        seed: u64,
        replica: &dyn Fn(&mut ReplicaConfig),
        tune: &dyn Fn(&mut ServerOptions),
    ) -> std::io::Result<SimServers> {
        let net = SimNet::new(SimConfig::default(), seed);
        let stop = Arc::new(AtomicBool::new(false));
        net.run_realtime(stop.clone());
        let addrs: Vec<SocketAddr> = (0..3).map(|_| free_port()).collect::<Result<_, _>>()?;
        let members: Vec<NodeInfo> = (1..=3u64)
            .map(|id| NodeInfo {
                id,
                client_addr: addrs[id as usize - 1].to_string(),
            })
            .collect();
        let mut c = SimServers {
            net,
            stop,
            servers: Vec::new(),
            addrs: addrs.iter().map(ToString::to_string).collect(),
            disks: Vec::new(),
        };
        for id in 1..=3u64 {
            let mut cfg = ReplicaConfig::new(id, vec![1, 2, 3], CLUSTER, format!("/n{id}").into());
            cfg.ring_bytes = 2 << 20;
            cfg.segment_bytes = 8 << 20;
            cfg.election_window = Some((10 + 3 * id as usize, 11 + 3 * id as usize));
            replica(&mut cfg);
            let fs = FaultFs::new();
            c.disks.push(fs.clone());
            let disk: Arc<dyn FileSystem> = Arc::new(fs);
            let opts = LogOptions {
                poll: PollMode::Event,
                ..LogOptions::default()
            };
            let log = Log::open(cfg, c.net.add_node(NodeId(id)), disk, opts)
                .map_err(|e| std::io::Error::other(e.to_string()))?;
            let mut so = ServerOptions::new(id, CLUSTER, addrs[id as usize - 1]);
            so.members = members.clone();
            // The tests' clients write without a token.
            so.anonymous_role = Some(proto::Role::ReadWrite);
            so.metrics_listen = Some(SocketAddr::from(([127, 0, 0, 1], 0)));
            tune(&mut so);
            match crate::start(so, Arc::new(log)) {
                Ok(s) => c.servers.push(Some(s)),
                Err(e) => {
                    for s in c.servers.drain(..).flatten() {
                        s.shutdown(Duration::ZERO);
                    }
                    return Err(e);
                }
            }
        }
        Ok(c)
    }

    /// Node `id`'s server. Panics if it was stopped.
    pub fn server(&self, id: u64) -> &ServerHandle<SimEndpoint> {
        self.servers[id as usize - 1]
            .as_ref()
            .unwrap_or_else(|| panic!("node {id}'s server was stopped"))
    }

    /// Node `id`'s client address.
    pub fn addr(&self, id: u64) -> String {
        self.addrs[id as usize - 1].clone()
    }

    /// The leader among the running servers, waiting up to 20 s for one that is established:
    /// it has committed everything it holds (its election's entry included) and no running
    /// node knows a later term. A node that only just won, or one a later election already
    /// deposed without its knowing, would answer the test's first append with an error on a
    /// loaded machine.
    pub fn leader(&self) -> u64 {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            let statuses: Vec<(u64, replica::Status)> = (1..=3u64)
                .filter_map(|id| Some((id, self.servers[id as usize - 1].as_ref()?.log().status())))
                .collect();
            let top = statuses.iter().map(|(_, s)| s.term).max().unwrap_or(0);
            let established = statuses.iter().find(|(_, s)| {
                s.role == replica::Role::Leader
                    && s.term == top
                    && s.commit > 0
                    && s.commit >= s.last_index
            });
            if let Some((id, _)) = established {
                return *id;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        panic!("no established leader within 20 s");
    }

    /// Stops node `id`'s server (its clients get `ShuttingDown`); the replica keeps running.
    pub fn stop_server(&mut self, id: u64) {
        let handle = self.servers[id as usize - 1]
            .take()
            .expect("the server is running");
        handle.shutdown(Duration::from_millis(100));
    }

    /// Stops node `id` altogether: its replica drops off the fabric, its server shuts down.
    pub fn crash(&mut self, id: u64) {
        self.net.crash(NodeId(id));
        self.stop_server(id);
    }
}
