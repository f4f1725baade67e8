//! A cluster of `rdmalog-node` processes, one per lab host, and the client that drives it.
//!
//! Node `i` runs on lab host `i`: replication (RDMA or TCP, [`ClusterConfig::transport`]) at
//! `192.0.2.1i:<base + i>`, or at `127.0.1.i:<base + i>` on a host without the lab
//! ([`ClusterConfig::loopback`]); driver port at `127.0.0.1:<base + 100 + i>` (out of band:
//! faults on the fabric never touch it), data in `<dir>/node<i>`, log in `<dir>/node<i>.log`.
//! The workload keeps up to `window` appends in flight on one driver connection to the leader,
//! records every acknowledgement (sequence number, index, crc32c) in the order it arrived, and
//! after a failure resubmits what was not acknowledged, in order, to whichever node leads. It
//! appends through a client session (`APPEND_IN`, [`Workload::exactly_once`]), so a
//! resubmitted entry that had committed is not appended again.
//! [`Cluster::verify`] then reads the crc32c of every committed entry back from every live node,
//! and counts both lost and duplicated entries.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};

use crate::netns::Netns;
use std::sync::Arc;

/// How a cluster's nodes are started.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    /// The `rdmalog-node` binary.
    pub bin: PathBuf,
    /// Where node data dirs, node logs and the secret live.
    pub dir: PathBuf,
    /// Port base: RDMA on `base + i`, driver on `base + 100 + i`.
    pub base_port: u16,
    /// Number of nodes (one per lab host).
    pub nodes: u64,
    /// `fsync` or `memory`.
    pub durability: String,
    /// More `rdmalog-node` flags for every node (e.g. `--segment-mib 1`).
    pub extra_args: Vec<String>,
    /// The cluster id every node is started with.
    pub cluster_id: u64,
    /// `rdma` or `tcp`.
    pub transport: String,
    /// Replication on loopback addresses (`127.0.1.i`), for TCP clusters on a host without
    /// the lab; network faults (`Fault`) need the lab or [`ClusterConfig::netns`].
    pub loopback: bool,
    /// One network namespace per node on this host (no lab), whose one-way blocks and cable
    /// cuts [`Fault`] makes; replaces `loopback`.
    pub netns: Option<Arc<Netns>>,
}

impl ClusterConfig {
    /// Three nodes with fsync durability under `dir`.
    pub fn new(bin: impl Into<PathBuf>, dir: impl Into<PathBuf>, base_port: u16) -> Self {
        ClusterConfig {
            bin: bin.into(),
            dir: dir.into(),
            base_port,
            nodes: 3,
            durability: "fsync".into(),
            extra_args: Vec::new(),
            cluster_id: 0x1ab,
            transport: "rdma".into(),
            loopback: false,
            netns: None,
        }
    }
}

/// What to start a node with instead of the cluster's settings (a misconfigured or rogue node).
#[derive(Clone, Debug, Default)]
pub struct Overrides {
    /// Another secret file.
    pub secret_file: Option<PathBuf>,
    /// Another cluster id.
    pub cluster_id: Option<u64>,
    /// Another data directory.
    pub data_dir: Option<PathBuf>,
}

/// A node's `STATUS` answer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Status {
    /// leader, follower or candidate.
    pub role: String,
    /// Current term.
    pub term: u64,
    /// The leader it knows (0: none).
    pub leader: u64,
    /// Commit index.
    pub commit: u64,
    /// Last index of its log.
    pub last: u64,
    /// Appends it sent by RDMA Write.
    pub fast: u64,
    /// Appends it sent over send/recv.
    pub slow: u64,
    /// Its writes that a follower's revoked grant refused.
    pub fenced: u64,
    /// Its reconnects.
    pub reconnects: u64,
    /// Grants of remote write on its ring.
    pub grants: u64,
    /// Revocations of remote write on its ring.
    pub revokes: u64,
    /// Entries it recovered at start-up from the shared-memory ring of a crashed process.
    pub recovered: u64,
    /// The first index its log holds.
    pub first: u64,
    /// Snapshots it sent to followers behind a checkpoint.
    pub snap_sent: u64,
    /// Snapshots it installed from the leader.
    pub snap_installed: u64,
    /// Appends it counted as a follower's when its RDMA Write completed (replicated).
    pub nic_acks: u64,
    /// Entries it took from its ring as its leader placed them (replicated).
    pub placed: u64,
    /// Answers to its leader's descriptors it left unsent because the leader had counted
    /// them on its write's completion (replicated).
    pub quiet: u64,
    /// Each peer's connection state as `id:state`, comma-separated.
    pub conns: String,
    /// Whether it is recovering from a start that lost entries it may have acknowledged (it
    /// does not vote until it has caught up).
    pub recovering: bool,
}

impl Status {
    fn parse(line: &str) -> Option<Status> {
        let rest = line.strip_prefix("STATUS ")?;
        let mut s = Status::default();
        for kv in rest.split_whitespace() {
            let (k, v) = kv.split_once('=')?;
            let n = || v.parse::<u64>().ok();
            match k {
                "role" => s.role = v.to_string(),
                "term" => s.term = n()?,
                "leader" => s.leader = n()?,
                "commit" => s.commit = n()?,
                "last" => s.last = n()?,
                "fast" => s.fast = n()?,
                "slow" => s.slow = n()?,
                "fenced" => s.fenced = n()?,
                "reconnects" => s.reconnects = n()?,
                "grants" => s.grants = n()?,
                "revokes" => s.revokes = n()?,
                "recovered" => s.recovered = n()?,
                "first" => s.first = n()?,
                "snap_sent" => s.snap_sent = n()?,
                "snap_installed" => s.snap_installed = n()?,
                "nic_acks" => s.nic_acks = n()?,
                "placed" => s.placed = n()?,
                "quiet" => s.quiet = n()?,
                "conns" => s.conns = v.to_string(),
                "recovering" => s.recovering = n()? != 0,
                _ => {}
            }
        }
        Some(s)
    }
}

/// Running node processes.
#[derive(Debug)]
pub struct Cluster {
    cfg: ClusterConfig,
    procs: BTreeMap<u64, Child>,
    paused: BTreeSet<u64>,
    /// [`Cluster::append_one`]'s session and next number, once opened.
    session: std::sync::Mutex<Option<(u64, u64)>>,
}

fn host(i: u64) -> u8 {
    u8::try_from(i).expect("node ids are lab host numbers")
}

impl Cluster {
    /// Writes the cluster secret and starts every node.
    pub fn start(cfg: ClusterConfig) -> anyhow::Result<Cluster> {
        std::fs::create_dir_all(&cfg.dir)
            .with_context(|| format!("creating {}", cfg.dir.display()))?;
        let secret = cfg.dir.join("secret");
        write_secret(&secret, b"lab cluster secret for node tests\n")?;
        if cfg.transport == "rdma" && lab::guest::in_lab() {
            // Before any node holds a device: a Soft-RoCE artifact left by an earlier test (a
            // dead QP1, so no rdma_cm on that host) is repaired here, not failed on.
            lab::guest::repair_dead_rdma_cm().context("checking the lab's rdma_cm")?;
        }
        *lock_active() = cfg.netns.clone();
        let mut c = Cluster {
            session: std::sync::Mutex::new(None),
            cfg,
            procs: BTreeMap::new(),
            paused: BTreeSet::new(),
        };
        for i in 1..=c.cfg.nodes {
            c.start_node(i)?;
        }
        Ok(c)
    }

    /// The configuration it was started with.
    pub fn config(&self) -> &ClusterConfig {
        &self.cfg
    }

    /// Node `i`'s replication address (RDMA or TCP).
    pub fn peer_addr(&self, i: u64) -> SocketAddr {
        let port = self.cfg.base_port + i as u16;
        if let Some(n) = &self.cfg.netns {
            SocketAddr::from((n.data_ip(i), port))
        } else if self.cfg.loopback {
            SocketAddr::from(([127, 0, 1, host(i)], port))
        } else {
            SocketAddr::from((lab::config::host_addr(host(i)), port))
        }
    }

    /// Node `i`'s driver port. It listens on loopback (every lab host shares one kernel), so
    /// the test's control traffic never crosses the fabric its faults are injected into.
    pub fn driver_addr(&self, i: u64) -> SocketAddr {
        let port = self.cfg.base_port + 100 + i as u16;
        match &self.cfg.netns {
            // Inside a namespace, on its control link: data-network faults never touch it.
            Some(n) => SocketAddr::from((n.ctl_ip(i), port)),
            None => SocketAddr::from(([127, 0, 0, 1], port)),
        }
    }

    /// Node `i`'s data directory.
    pub fn data_dir(&self, i: u64) -> PathBuf {
        self.cfg.dir.join(format!("node{i}"))
    }

    /// Node `i`'s log file (stderr of every run of it, appended).
    pub fn log_path(&self, i: u64) -> PathBuf {
        self.cfg.dir.join(format!("node{i}.log"))
    }

    /// Node `i`'s log so far.
    pub fn log_text(&self, i: u64) -> String {
        std::fs::read_to_string(self.log_path(i)).unwrap_or_default()
    }

    /// Starts node `i` with the cluster's settings.
    pub fn start_node(&mut self, i: u64) -> anyhow::Result<()> {
        self.start_node_with(i, &Overrides::default())
    }

    /// Starts node `i`, overriding some settings.
    pub fn start_node_with(&mut self, i: u64, o: &Overrides) -> anyhow::Result<()> {
        ensure!(!self.procs.contains_key(&i), "node {i} is already running");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path(i))
            .with_context(|| format!("opening {}", self.log_path(i).display()))?;
        let mut cmd = match &self.cfg.netns {
            Some(n) => n.command(i, &self.cfg.bin),
            None => Command::new(&self.cfg.bin),
        };
        cmd.arg("--id")
            .arg(i.to_string())
            .arg("--cluster-id")
            .arg(o.cluster_id.unwrap_or(self.cfg.cluster_id).to_string())
            .arg("--transport")
            .arg(&self.cfg.transport)
            .arg("--listen")
            .arg(self.peer_addr(i).to_string())
            .arg("--driver")
            .arg(self.driver_addr(i).to_string())
            .arg("--durability")
            .arg(&self.cfg.durability)
            .args(&self.cfg.extra_args)
            .arg("--data-dir")
            .arg(o.data_dir.clone().unwrap_or_else(|| self.data_dir(i)))
            .arg("--secret-file")
            .arg(
                o.secret_file
                    .clone()
                    .unwrap_or_else(|| self.cfg.dir.join("secret")),
            );
        for p in (1..=self.cfg.nodes).filter(|&p| p != i) {
            cmd.arg("--peer").arg(format!("{p}={}", self.peer_addr(p)));
        }
        cmd.stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {}", self.cfg.bin.display()))?;
        self.procs.insert(i, child);
        self.paused.remove(&i);
        Ok(())
    }

    /// A machine crash of node `i` under memory durability, as far as one guest can make one:
    /// kill -9, then delete its shared-memory ring files, which a reboot takes with tmpfs.
    /// (The guest's page cache survives, so the node's segment files keep what its process
    /// wrote to them; a real crash would lose that too.) Returns the files it deleted.
    pub fn crash_machine(&mut self, i: u64) -> anyhow::Result<Vec<PathBuf>> {
        self.kill(i);
        let mut removed = Vec::new();
        for f in self.ring_files(i) {
            match std::fs::remove_file(&f) {
                Ok(()) => removed.push(f),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e).with_context(|| format!("removing {}", f.display())),
            }
        }
        Ok(removed)
    }

    /// Node `i`'s shared-memory ring files, the ring and its tail page, where a node under
    /// `memory` or `replicated` durability keeps them (`ReplicaConfig::ring_file`).
    fn ring_files(&self, i: u64) -> [PathBuf; 2] {
        let ring =
            replica::ReplicaConfig::new(i, Vec::new(), self.cfg.cluster_id, self.data_dir(i))
                .ring_file();
        [ring.with_extension("tail"), ring]
    }

    /// CPU time the running node processes have used so far, all their threads, in ns (the
    /// first field of each `/proc/<pid>/task/<tid>/schedstat`). Threads that ended are not
    /// counted, so take differences over a span in which no node starts or stops.
    pub fn cpu_ns(&self) -> anyhow::Result<u64> {
        let mut total = 0;
        for p in self.procs.values() {
            let dir = PathBuf::from(format!("/proc/{}/task", p.id()));
            for t in
                std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))?
            {
                let stat = std::fs::read_to_string(t?.path().join("schedstat")).unwrap_or_default();
                total += stat
                    .split_whitespace()
                    .next()
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0);
            }
        }
        Ok(total)
    }

    /// Whether node `i`'s process is running (paused counts as running).
    pub fn is_running(&self, i: u64) -> bool {
        self.procs.contains_key(&i)
    }

    /// Nodes whose processes run and are not paused.
    pub fn live(&self) -> Vec<u64> {
        self.procs
            .keys()
            .copied()
            .filter(|i| !self.paused.contains(i))
            .collect()
    }

    /// kill -9 of node `i`: a crash; nothing beyond what was durable survives.
    pub fn kill(&mut self, i: u64) {
        if let Some(mut p) = self.procs.remove(&i) {
            let _ = p.kill();
            let _ = p.wait();
        }
        self.paused.remove(&i);
    }

    /// kill -9 of every node at once (all signals are sent before any is reaped).
    pub fn kill_all(&mut self) {
        for p in self.procs.values_mut() {
            let _ = p.kill();
        }
        for (_, mut p) in std::mem::take(&mut self.procs) {
            let _ = p.wait();
        }
        self.paused.clear();
    }

    /// SIGSTOP of node `i`: the process freezes, its NIC (rxe, in the kernel) does not.
    pub fn pause(&mut self, i: u64) -> anyhow::Result<()> {
        let pid = self
            .procs
            .get(&i)
            .context("pausing a node that is not running")?
            .id();
        lab::guest::signal(pid, lab::guest::Signal::Stop)?;
        self.paused.insert(i);
        Ok(())
    }

    /// SIGCONT of node `i`.
    pub fn resume(&mut self, i: u64) -> anyhow::Result<()> {
        let pid = self
            .procs
            .get(&i)
            .context("resuming a node that is not running")?
            .id();
        lab::guest::signal(pid, lab::guest::Signal::Cont)?;
        self.paused.remove(&i);
        Ok(())
    }

    /// Sends `line` to node `i`'s driver port and returns its answer, or `None` if the node
    /// did not answer within `within`.
    pub fn ask_within(&self, i: u64, line: &str, within: Duration) -> Option<String> {
        ask(self.driver_addr(i), line, within)
    }

    /// Node `i`'s status, if it answers within 5 s.
    pub fn status(&self, i: u64) -> Option<Status> {
        Status::parse(&self.ask_within(i, "STATUS", Duration::from_secs(5))?)
    }

    /// Node `i`'s status, waiting up to `within` for it to answer (a node that just started
    /// opens its driver port only once its log is open).
    pub fn status_within(&self, i: u64, within: Duration) -> anyhow::Result<Status> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(s) = self.status(i) {
                return Ok(s);
            }
            ensure!(
                Instant::now() < deadline,
                "node {i} did not answer STATUS within {within:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The live node that says it leads, waiting up to `within`.
    pub fn leader(&self, within: Duration) -> anyhow::Result<u64> {
        self.leader_among(&self.live(), within)
    }

    /// The node among `nodes` that says it leads, waiting up to `within`.
    pub fn leader_among(&self, nodes: &[u64], within: Duration) -> anyhow::Result<u64> {
        let deadline = Instant::now() + within;
        loop {
            for &i in nodes {
                if self.status(i).is_some_and(|s| s.role == "leader") {
                    return Ok(i);
                }
            }
            ensure!(
                Instant::now() < deadline,
                "none of nodes {nodes:?} became leader within {within:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until node `i` has committed `index`.
    pub fn wait_commit(&self, i: u64, index: u64, within: Duration) -> anyhow::Result<Status> {
        let deadline = Instant::now() + within;
        loop {
            let s = self.status(i).unwrap_or_default();
            if s.commit >= index {
                return Ok(s);
            }
            ensure!(
                Instant::now() < deadline,
                "node {i} did not commit index {index} within {within:?} (status: {s:?})"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Appends one payload through the leader, retrying until acknowledged, exactly once: it
    /// goes through the cluster's client session, so a retry of an append that had committed
    /// answers the first copy's index.
    pub fn append_one(&self, payload: &[u8], within: Duration) -> anyhow::Result<(u64, u32)> {
        let deadline = Instant::now() + within;
        let mut slot = self.session.lock().unwrap_or_else(|e| e.into_inner());
        let (session, seq) = match *slot {
            Some(s) => s,
            None => (self.open_session(deadline)?, 1),
        };
        // Given up on, the append may or may not be in the log: the next one opens a new
        // session rather than leave a gap in this one's numbers.
        *slot = None;
        let line = format!("APPEND_IN {session} {seq} {}", hex(payload));
        loop {
            if let Ok(l) = self.leader(Duration::from_secs(5)) {
                if let Some(r) = self.ask_within(l, &line, Duration::from_secs(20)) {
                    if let Some((index, crc)) = parse_ok(&r) {
                        *slot = Some((session, seq + 1));
                        return Ok((index, crc));
                    }
                }
            }
            ensure!(
                Instant::now() < deadline,
                "an append was not acknowledged within {within:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Opens a client session on whichever node leads, retrying until `deadline`.
    pub fn open_session(&self, deadline: Instant) -> anyhow::Result<u64> {
        loop {
            if let Ok(l) = self.leader(Duration::from_secs(5)) {
                if let Some(r) = self.ask_within(l, "SESSION", Duration::from_secs(20)) {
                    if let Some(id) = r.strip_prefix("SESSION ").and_then(|v| v.parse().ok()) {
                        return Ok(id);
                    }
                }
            }
            ensure!(
                Instant::now() < deadline,
                "no session could be opened in time"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The crc32c token of every committed entry `1..=upto` on node `i` (`-` for entries with
    /// no application payload).
    pub fn crcs(&self, i: u64, upto: u64) -> anyhow::Result<Vec<String>> {
        let mut out = Vec::with_capacity(upto as usize);
        while (out.len() as u64) < upto {
            let from = out.len() as u64 + 1;
            let count = (upto + 1 - from).min(20_000);
            let r = self
                .ask_within(i, &format!("CRCS {from} {count}"), Duration::from_secs(60))
                .with_context(|| format!("node {i} did not answer CRCS"))?;
            let mut words = r.split_whitespace();
            ensure!(words.next() == Some("CRCS"), "node {i} answered `{r}`");
            let before = out.len();
            out.extend(words.skip(1).map(str::to_string));
            ensure!(
                out.len() > before,
                "node {i} has not committed index {from}"
            );
        }
        out.truncate(upto as usize);
        Ok(out)
    }

    /// Checks acknowledged entries on every live node: each is present at its index with its
    /// crc32c, acknowledgements came in log order, and the nodes' committed logs are identical.
    pub fn verify(&self, acks: &[Ack]) -> anyhow::Result<Verified> {
        self.verify_after(acks, 0)
    }

    /// As [`Cluster::verify`], for a log checkpointed at `checkpoint`: entries up to it may be
    /// truncated, so only acknowledgements and committed entries past it are compared.
    pub fn verify_after(&self, acks: &[Ack], checkpoint: u64) -> anyhow::Result<Verified> {
        for w in acks.windows(2) {
            ensure!(
                w[1].index > w[0].index,
                "acknowledgements out of log order: seq {} got index {} after seq {} got {}",
                w[1].seq,
                w[1].index,
                w[0].seq,
                w[0].index
            );
        }
        let target = acks.iter().map(|a| a.index).max().unwrap_or(0);
        let nodes = self.live();
        ensure!(!nodes.is_empty(), "no live node to verify");
        let mut upto = u64::MAX;
        for &i in &nodes {
            upto = upto.min(
                self.wait_commit(i, target, Duration::from_secs(120))?
                    .commit,
            );
        }
        let mut first: Option<(u64, Vec<String>)> = None;
        let mut duplicates = 0;
        for &i in &nodes {
            let crcs = self.crcs(i, upto)?;
            if first.is_none() {
                duplicates = duplicated(acks, &crcs, checkpoint);
                ensure!(
                    duplicates == 0,
                    "node {i}: {duplicates} acknowledged entries are in the committed log more than once"
                );
            }
            for a in acks.iter().filter(|a| a.index > checkpoint) {
                let got = &crcs[a.index as usize - 1];
                ensure!(
                    *got == format!("{:08x}", a.crc),
                    "node {i}: acknowledged entry seq {} at index {} has crc {got}, expected {:08x} (lost or changed)",
                    a.seq,
                    a.index,
                    a.crc
                );
            }
            match &first {
                None => first = Some((i, crcs)),
                Some((j, theirs)) => {
                    if let Some(k) =
                        (checkpoint as usize..upto as usize).find(|&k| theirs[k] != crcs[k])
                    {
                        bail!(
                            "committed logs differ: index {} is {} on node {j} but {} on node {i}",
                            k + 1,
                            theirs[k],
                            crcs[k]
                        );
                    }
                }
            }
        }
        Ok(Verified {
            acked: acks.len(),
            committed: upto,
            nodes,
            duplicates,
        })
    }
}

/// Committed entries (`crcs[k]` is index `k + 1`'s token) past `checkpoint` that carry the
/// payload of an acknowledged append at another index than its acknowledgement's. A payload
/// acknowledged more than once (the same workload run twice on one cluster) is not counted.
fn duplicated(acks: &[Ack], crcs: &[String], checkpoint: u64) -> usize {
    let mut at: BTreeMap<String, Option<u64>> = BTreeMap::new();
    for a in acks {
        at.entry(format!("{:08x}", a.crc))
            .and_modify(|i| *i = None)
            .or_insert(Some(a.index));
    }
    crcs.iter()
        .enumerate()
        .skip(checkpoint as usize)
        .filter(|(k, c)| {
            at.get(*c)
                .copied()
                .flatten()
                .is_some_and(|i| i != *k as u64 + 1)
        })
        .count()
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // A failing test shows what the nodes said last.
            for i in 1..=self.cfg.nodes {
                let text = self.log_text(i);
                let lines: Vec<&str> = text.lines().collect();
                eprintln!(
                    "---- last lines of node {i}'s log ({}) ----",
                    self.log_path(i).display()
                );
                for l in &lines[lines.len().saturating_sub(40)..] {
                    eprintln!("{l}");
                }
            }
        }
        for &i in &self.paused {
            if let Some(p) = self.procs.get(&i) {
                let _ = lab::guest::signal(p.id(), lab::guest::Signal::Cont);
            }
        }
        self.kill_all();
        // A killed node leaves its ring in shared memory for its next start to recover, outside
        // the data directory the test deletes: the cluster that owns the rings deletes them
        // (host test runs had left 240 MB of them in /dev/shm).
        for i in 1..=self.cfg.nodes {
            for f in self.ring_files(i) {
                let _ = std::fs::remove_file(f);
            }
        }
        let mut active = lock_active();
        if active
            .as_ref()
            .zip(self.cfg.netns.as_ref())
            .is_some_and(|(a, b)| Arc::ptr_eq(a, b))
        {
            *active = None;
        }
    }
}

/// The namespaces of the running [`Cluster`], if it has any: where [`Fault`]s apply.
static ACTIVE_NETNS: std::sync::Mutex<Option<Arc<Netns>>> = std::sync::Mutex::new(None);

fn lock_active() -> std::sync::MutexGuard<'static, Option<Arc<Netns>>> {
    ACTIVE_NETNS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A fault injected into the lab's fabric, undone when dropped (also when a test panics, so a
/// failed test cannot leave the fabric broken for the tests after it in the same boot).
#[derive(Debug)]
#[must_use = "the fault is lifted when this guard is dropped"]
pub enum Fault {
    /// What host `from` sends to host `to` is dropped.
    Block {
        /// Sender.
        from: u8,
        /// Receiver.
        to: u8,
        /// The namespaces it applies in, if not the lab's.
        net: Option<Arc<Netns>>,
    },
    /// Host `host`'s cable is cut.
    Cable {
        /// The host.
        host: u8,
        /// The namespaces it applies in, if not the lab's.
        net: Option<Arc<Netns>>,
    },
    /// Host `host` sends through netem (in namespaces: loses `loss_pct` of what it sends).
    Netem {
        /// The host.
        host: u8,
        /// The loss applied, to lift it again in namespaces.
        loss_pct: f64,
        /// The namespaces it applies in, if not the lab's.
        net: Option<Arc<Netns>>,
    },
}

impl Fault {
    /// Drops what node `from` sends to node `to` (one direction).
    pub fn block(from: u64, to: u64) -> anyhow::Result<Fault> {
        let net = lock_active().clone();
        match &net {
            Some(n) => n.block(from, to, true)?,
            None => lab::guest::block_path(host(from), host(to))?,
        }
        Ok(Fault::Block {
            from: host(from),
            to: host(to),
            net,
        })
    }

    /// Cuts node `i`'s cable: everything it sends and receives is dropped, its link stays up.
    pub fn cut_cable(i: u64) -> anyhow::Result<Fault> {
        let net = lock_active().clone();
        match &net {
            Some(n) => n.cut_cable(i, true)?,
            None => lab::guest::cut_cable(host(i), true)?,
        }
        Ok(Fault::Cable { host: host(i), net })
    }

    /// Applies netem to everything node `i` sends. In network namespaces only loss is
    /// available (see [`Netns::loss`]); added delay runs in the lab.
    pub fn netem(i: u64, netem: &lab::guest::Netem) -> anyhow::Result<Fault> {
        let net = lock_active().clone();
        match &net {
            Some(n) => {
                if netem.delay > Duration::ZERO || netem.jitter > Duration::ZERO {
                    bail!(
                        "added delay in network namespaces needs sch_netem, which this host's kernel may lack; delay runs in the lab"
                    );
                }
                n.loss(i, netem.loss_pct, true)?;
            }
            None => lab::guest::set_netem(host(i), netem)?,
        }
        Ok(Fault::Netem {
            host: host(i),
            loss_pct: netem.loss_pct,
            net,
        })
    }

    /// Packets this loss fault has dropped so far, where that is known (namespaces; netem in
    /// the lab does not count them).
    pub fn dropped(&self) -> Option<u64> {
        match self {
            Fault::Netem {
                host, net: Some(n), ..
            } => n.dropped(u64::from(*host)).ok(),
            _ => None,
        }
    }

    /// Lifts the fault now, reporting an error (dropping lifts it too, ignoring errors).
    pub fn lift(mut self) -> anyhow::Result<()> {
        let r = self.undo();
        // Not undone twice (no Drop), but the namespaces it refers to are let go.
        let (Fault::Block { net, .. } | Fault::Cable { net, .. } | Fault::Netem { net, .. }) =
            &mut self;
        drop(net.take());
        std::mem::forget(self);
        r
    }

    fn undo(&self) -> anyhow::Result<()> {
        match self {
            Fault::Block {
                from,
                to,
                net: Some(n),
            } => n.block(u64::from(*from), u64::from(*to), false)?,
            Fault::Block {
                from,
                to,
                net: None,
            } => lab::guest::unblock_path(*from, *to)?,
            Fault::Cable { host, net: Some(n) } => n.cut_cable(u64::from(*host), false)?,
            Fault::Cable { host, net: None } => lab::guest::cut_cable(*host, false)?,
            Fault::Netem {
                host,
                loss_pct,
                net: Some(n),
            } => n.loss(u64::from(*host), *loss_pct, false)?,
            Fault::Netem {
                host, net: None, ..
            } => lab::guest::clear_netem(*host)?,
        }
        Ok(())
    }
}

impl Drop for Fault {
    fn drop(&mut self) {
        if let Err(e) = self.undo() {
            eprintln!("lifting {self:?} failed: {e:#}");
        }
    }
}

/// Compares the WAL segment files (`*.wal`) of `dirs` byte for byte. Run it on stopped nodes
/// that had all committed the same last index: replicas place every record at the same Lsn, so
/// their segments must be identical files. Returns the number of files and bytes compared.
pub fn compare_segments(dirs: &[PathBuf]) -> anyhow::Result<(usize, u64)> {
    let list = |d: &Path| -> anyhow::Result<BTreeSet<String>> {
        let mut names = BTreeSet::new();
        for e in std::fs::read_dir(d).with_context(|| format!("listing {}", d.display()))? {
            let name = e?.file_name().to_string_lossy().into_owned();
            if name.ends_with(".wal") {
                names.insert(name);
            }
        }
        Ok(names)
    };
    let (first, rest) = dirs.split_first().context("no data dirs to compare")?;
    let names = list(first)?;
    ensure!(!names.is_empty(), "{} holds no segments", first.display());
    let mut bytes = 0;
    for d in rest {
        let theirs = list(d)?;
        ensure!(
            theirs == names,
            "segment files differ: {} has {names:?}, {} has {theirs:?}",
            first.display(),
            d.display()
        );
    }
    for name in &names {
        let a = std::fs::read(first.join(name))?;
        for d in rest {
            let b = std::fs::read(d.join(name))?;
            if a == b {
                continue;
            }
            if let Some(k) = (0..a.len().max(b.len())).find(|&k| a.get(k) != b.get(k)) {
                bail!(
                    "segment {name} differs at byte {k} between {} and {} (lengths {} and {})",
                    first.display(),
                    d.display(),
                    a.len(),
                    b.len()
                );
            }
        }
        bytes += a.len() as u64;
    }
    Ok((names.len(), bytes))
}

/// Sends `line` to the driver port at `addr` and returns its answer, or `None` if none came
/// within `within`. A free function, so a thread can ask without borrowing the cluster.
pub fn ask(addr: SocketAddr, line: &str, within: Duration) -> Option<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(within)).ok()?;
    writeln!(s, "{line}").ok()?;
    let mut reply = String::new();
    BufReader::new(s).read_line(&mut reply).ok()?;
    let reply = reply.trim();
    (!reply.is_empty()).then(|| reply.to_string())
}

/// Writes an owner-only secret file.
pub fn write_secret(path: &Path, secret: &[u8]) -> anyhow::Result<()> {
    std::fs::write(path, secret).with_context(|| format!("writing {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(())
}

/// What [`Cluster::verify`] checked.
#[derive(Clone, Debug)]
pub struct Verified {
    /// Acknowledged entries checked on every node.
    pub acked: usize,
    /// Committed entries compared across nodes.
    pub committed: u64,
    /// The nodes compared.
    pub nodes: Vec<u64>,
    /// Acknowledged entries found at a second index (always 0: `verify` fails otherwise).
    pub duplicates: usize,
}

impl fmt::Display for Verified {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} acknowledged entries present and unchanged on nodes {:?} (0 lost, {} duplicated), \
             acknowledged in log order; committed logs identical over {} entries",
            self.acked, self.nodes, self.duplicates, self.committed
        )
    }
}

/// One acknowledged append.
#[derive(Clone, Copy, Debug)]
pub struct Ack {
    /// The workload's sequence number of the payload.
    pub seq: u64,
    /// The index it committed at.
    pub index: u64,
    /// Its crc32c.
    pub crc: u32,
    /// Its length.
    pub len: usize,
    /// When the acknowledgement arrived.
    pub at: Instant,
    /// The node that acknowledged it.
    pub leader: u64,
}

/// Payload sizes of a workload.
#[derive(Clone, Copy, Debug)]
pub enum Sizes {
    /// Every payload this long.
    Fixed(usize),
    /// Log-uniform between `min` and `max` bytes (so small and large entries are both common).
    Mixed {
        /// Smallest, at least 8.
        min: usize,
        /// Largest.
        max: usize,
    },
}

fn mix(mut x: u64) -> u64 {
    // splitmix64
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

impl Sizes {
    /// The size of payload `seq`.
    pub fn of(&self, seq: u64) -> usize {
        match *self {
            Sizes::Fixed(n) => n.max(8),
            Sizes::Mixed { min, max } => {
                let (lo, hi) = ((min.max(8)) as f64, (max.max(min.max(8))) as f64);
                let u = (mix(seq) >> 11) as f64 / (1u64 << 53) as f64;
                ((lo.ln() + u * (hi.ln() - lo.ln())).exp() as usize).clamp(lo as usize, hi as usize)
            }
        }
    }
}

/// Payload `seq` of a workload: its sequence number, then bytes derived from it.
pub fn payload(seq: u64, len: usize) -> Vec<u8> {
    let mut p = Vec::with_capacity(len.max(8));
    p.extend_from_slice(&seq.to_le_bytes());
    let mut x = mix(seq ^ 0x5eed);
    while p.len() < len {
        x = mix(x);
        let take = (len - p.len()).min(8);
        p.extend_from_slice(&x.to_le_bytes()[..take]);
    }
    p
}

/// Lower-case hex.
pub fn hex(b: &[u8]) -> String {
    const D: &[u8; 16] = b"0123456789abcdef";
    let mut s = Vec::with_capacity(b.len() * 2);
    for &x in b {
        s.push(D[(x >> 4) as usize]);
        s.push(D[(x & 15) as usize]);
    }
    String::from_utf8(s).expect("hex digits are ASCII")
}

/// Parses hex; `None` on odd length or a non-hex digit.
pub fn unhex(s: &str) -> Option<Vec<u8>> {
    fn v(c: u8) -> Option<u8> {
        match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            b'A'..=b'F' => Some(c - b'A' + 10),
            _ => None,
        }
    }
    let b = s.as_bytes();
    if b.len() % 2 != 0 {
        return None;
    }
    b.chunks_exact(2)
        .map(|p| Some(v(p[0])? << 4 | v(p[1])?))
        .collect()
}

fn parse_ok(r: &str) -> Option<(u64, u32)> {
    let mut w = r.strip_prefix("OK ")?.split_whitespace();
    Some((w.next()?.parse().ok()?, w.next()?.parse().ok()?))
}

/// An append workload.
#[derive(Clone, Debug)]
pub struct Workload {
    /// Appends to acknowledge.
    pub total: u64,
    /// Appends in flight at once.
    pub window: usize,
    /// Payload sizes.
    pub sizes: Sizes,
    /// Give up when no append is acknowledged for this long.
    pub stall_limit: Duration,
    /// Append through a client session (`APPEND_IN`), so that a resubmitted append that had
    /// committed is not appended again. On by default; off, plain `APPEND` (at least once).
    pub exactly_once: bool,
}

impl Workload {
    /// `total` appends of `sizes`, 16 in flight.
    pub fn new(total: u64, sizes: Sizes) -> Self {
        Workload {
            total,
            window: 16,
            sizes,
            stall_limit: Duration::from_secs(120),
            exactly_once: true,
        }
    }
}

/// Where a workload is.
#[derive(Clone, Copy, Debug)]
pub struct Progress {
    /// Appends acknowledged.
    pub done: u64,
    /// Appends in the workload.
    pub total: u64,
    /// Payload bytes acknowledged.
    pub bytes: u64,
    /// Since the start.
    pub elapsed: Duration,
    /// Times the client reconnected and resubmitted.
    pub retries: u64,
    /// The node it appends through (0 while it looks for one).
    pub leader: u64,
    /// The acknowledgement that triggered this report.
    pub last: Option<Ack>,
}

/// What a workload did.
#[derive(Clone, Debug)]
pub struct Report {
    /// Every acknowledgement, in arrival order.
    pub acks: Vec<Ack>,
    /// Each acknowledgement's latency, from the request's send to its answer (same order);
    /// with a window of 1, the commit latency as a client of the node's driver port sees it.
    pub latencies: Vec<Duration>,
    /// Wall time.
    pub elapsed: Duration,
    /// Payload bytes acknowledged.
    pub bytes: u64,
    /// Times the client reconnected and resubmitted.
    pub retries: u64,
}

impl Report {
    /// Acknowledged appends per second.
    pub fn appends_per_sec(&self) -> f64 {
        self.acks.len() as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// Acknowledged payload MiB per second.
    pub fn mib_per_sec(&self) -> f64 {
        self.bytes as f64 / (1 << 20) as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// A failover's cost as the client sees it: the gap between the first acknowledgement
    /// after `t` served by a leader other than `old` and the acknowledgement just before it.
    /// Returns that gap, the leader of the acknowledgement before the gap, and the new leader;
    /// `None` if no other leader acknowledged anything after `t`.
    ///
    /// Acknowledgements from `old` that arrive after `t` are skipped, not counted as the
    /// failover: with a window of appends in flight, a leader killed at `t` may already have
    /// committed and answered some of them, and the client reads those answers later.
    pub fn failover_after(&self, t: Instant, old: u64) -> Option<(Duration, u64, u64)> {
        let k = self.acks.iter().position(|a| a.at > t && a.leader != old)?;
        let (before, prev_leader) = match k.checked_sub(1) {
            Some(j) => (self.acks[j].at.min(self.acks[k].at), self.acks[j].leader),
            None => (t, 0),
        };
        Some((self.acks[k].at - before, prev_leader, self.acks[k].leader))
    }

    /// The `q` quantile (0..=1) of the acknowledgements' latencies; `None` without any.
    pub fn latency_quantile(&self, q: f64) -> Option<Duration> {
        let mut l = self.latencies.clone();
        l.sort_unstable();
        let k = ((l.len() as f64 - 1.0) * q.clamp(0.0, 1.0)).round() as usize;
        l.get(k).copied()
    }

    /// How many acknowledgements `leader` served after `t`.
    pub fn acks_from_after(&self, t: Instant, leader: u64) -> usize {
        self.acks
            .iter()
            .filter(|a| a.at > t && a.leader == leader)
            .count()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} appends ({:.1} MiB) acknowledged in {:.1} s: {:.0} appends/s, {:.2} MiB/s, {} resubmissions",
            self.acks.len(),
            self.bytes as f64 / (1 << 20) as f64,
            self.elapsed.as_secs_f64(),
            self.appends_per_sec(),
            self.mib_per_sec(),
            self.retries
        )
    }
}

struct Conn {
    leader: u64,
    reader: BufReader<TcpStream>,
    writer: BufWriter<TcpStream>,
}

impl Conn {
    fn open(c: &Cluster, leader: u64) -> Option<Conn> {
        let s = TcpStream::connect_timeout(&c.driver_addr(leader), Duration::from_secs(2)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
        s.set_nodelay(true).ok()?;
        Some(Conn {
            leader,
            reader: BufReader::new(s.try_clone().ok()?),
            writer: BufWriter::with_capacity(1 << 20, s),
        })
    }
}

/// Runs `w` against the cluster. `hook` runs after every acknowledgement with the cluster and
/// the progress, to inject faults or show progress.
pub fn run_workload(
    c: &mut Cluster,
    w: &Workload,
    mut hook: impl FnMut(&mut Cluster, &Progress),
) -> anyhow::Result<Report> {
    let start = Instant::now();
    let mut acks: Vec<Ack> = Vec::with_capacity(w.total as usize);
    let mut retry: VecDeque<u64> = VecDeque::new();
    let mut inflight: VecDeque<(u64, u32, usize, Instant)> = VecDeque::new();
    let mut latencies = Vec::with_capacity(w.total as usize);
    let mut next_new = 0u64;
    let mut conn: Option<Conn> = None;
    let mut bytes = 0u64;
    let mut retries = 0u64;
    let mut last_progress = Instant::now();
    let mut line = String::new();
    // Workload seq `s` is number `s + 1` of the session.
    let session = match w.exactly_once {
        true => Some(c.open_session(Instant::now() + w.stall_limit)?),
        false => None,
    };
    while (acks.len() as u64) < w.total {
        ensure!(
            last_progress.elapsed() < w.stall_limit,
            "no append was acknowledged for {:?} ({} of {} done)",
            w.stall_limit,
            acks.len(),
            w.total
        );
        let Some(cn) = conn.as_mut() else {
            let found = c
                .leader(Duration::from_secs(10))
                .ok()
                .and_then(|l| Conn::open(c, l));
            if found.is_none() {
                std::thread::sleep(Duration::from_millis(50));
            }
            conn = found;
            continue;
        };
        let mut failed = false;
        while inflight.len() < w.window {
            let seq = match retry.pop_front() {
                Some(s) => s,
                None if next_new < w.total => {
                    next_new += 1;
                    next_new - 1
                }
                None => break,
            };
            let p = payload(seq, w.sizes.of(seq));
            inflight.push_back((seq, crc32c::crc32c(&p), p.len(), Instant::now()));
            let sent = match session {
                Some(s) => writeln!(cn.writer, "APPEND_IN {s} {} {}", seq + 1, hex(&p)),
                None => writeln!(cn.writer, "APPEND {}", hex(&p)),
            };
            if sent.is_err() {
                failed = true;
                break;
            }
        }
        if !failed && cn.writer.flush().is_err() {
            failed = true;
        }
        if !failed {
            line.clear();
            match cn.reader.read_line(&mut line) {
                Ok(n) if n > 0 => match parse_ok(line.trim()) {
                    Some((index, crc)) => {
                        let (seq, want, len, sent) =
                            inflight.pop_front().context("an answer nobody asked for")?;
                        latencies.push(sent.elapsed());
                        ensure!(
                            crc == want,
                            "node {} acknowledged seq {seq} with crc {crc:08x}, sent {want:08x}",
                            cn.leader
                        );
                        bytes += len as u64;
                        let ack = Ack {
                            seq,
                            index,
                            crc,
                            len,
                            at: Instant::now(),
                            leader: cn.leader,
                        };
                        acks.push(ack);
                        last_progress = Instant::now();
                        let p = Progress {
                            done: acks.len() as u64,
                            total: w.total,
                            bytes,
                            elapsed: start.elapsed(),
                            retries,
                            leader: cn.leader,
                            last: Some(ack),
                        };
                        hook(c, &p);
                    }
                    None => failed = true,
                },
                _ => failed = true,
            }
        }
        if failed {
            // Whatever was in flight may or may not have committed; resubmit it, in order,
            // ahead of anything queued: with the session, one that had committed answers
            // with its first copy's index.
            retries += 1;
            for (seq, _, _, _) in inflight.drain(..).rev() {
                retry.push_front(seq);
            }
            conn = None;
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    Ok(Report {
        acks,
        latencies,
        elapsed: start.elapsed(),
        bytes,
        retries,
    })
}

/// A one-line text progress bar: `[#####.....]  50%  2000/4000 appends  812/s  leader 2`.
pub fn progress_bar(p: &Progress) -> String {
    const WIDTH: u64 = 30;
    let filled = (p.done * WIDTH).checked_div(p.total).unwrap_or(WIDTH);
    format!(
        "[{}{}] {:3}% {}/{} appends, {:.1} MiB, {:.0}/s, leader {}, {} resubmissions",
        "#".repeat(filled as usize),
        ".".repeat((WIDTH - filled) as usize),
        (p.done * 100).checked_div(p.total).unwrap_or(100),
        p.done,
        p.total,
        p.bytes as f64 / (1 << 20) as f64,
        p.done as f64 / p.elapsed.as_secs_f64().max(1e-9),
        p.leader,
        p.retries
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips_and_rejects_garbage() {
        assert_eq!(unhex(&hex(b"\x00\xffab")).unwrap(), b"\x00\xffab");
        assert!(unhex("abc").is_none());
        assert!(unhex("zz").is_none());
    }

    #[test]
    fn mixed_sizes_span_the_range_and_payloads_are_distinct() {
        let s = Sizes::Mixed { min: 8, max: 65536 };
        let sizes: Vec<usize> = (0..10_000).map(|i| s.of(i)).collect();
        assert!(sizes.iter().all(|&n| (8..=65536).contains(&n)));
        assert!(sizes.iter().filter(|&&n| n < 64).count() > 1000);
        assert!(sizes.iter().filter(|&&n| n > 16_384).count() > 1000);
        assert_eq!(payload(7, 100).len(), 100);
        assert_ne!(payload(7, 100), payload(8, 100));
        assert_eq!(payload(7, 100), payload(7, 100));
        assert_eq!(&payload(7, 3)[..], &7u64.to_le_bytes()[..]);
    }

    #[test]
    fn status_lines_parse() {
        let s = Status::parse(
            "STATUS id=2 role=leader term=3 leader=2 commit=10 last=11 fast=5 slow=1 fenced=2 reconnects=0 grants=1 revokes=1",
        )
        .unwrap();
        assert_eq!(s.role, "leader");
        assert_eq!((s.term, s.commit, s.last, s.fenced), (3, 10, 11, 2));
        assert!(Status::parse("ERR x").is_none());
    }

    #[test]
    fn the_progress_bar_fills() {
        let p = Progress {
            done: 50,
            total: 100,
            bytes: 0,
            elapsed: Duration::from_secs(1),
            retries: 0,
            leader: 1,
            last: None,
        };
        let bar = progress_bar(&p);
        assert!(
            bar.starts_with("[###############...............]  50% 50/100"),
            "{bar}"
        );
    }

    #[test]
    fn a_gap_is_measured_from_the_last_ack_before_the_new_leaders_first() {
        let t0 = Instant::now();
        let ack = |index, ms, leader| Ack {
            seq: index,
            index,
            crc: 0,
            len: 8,
            at: t0 + Duration::from_millis(ms),
            leader,
        };
        let r = Report {
            acks: vec![ack(1, 0, 1), ack(2, 10, 1), ack(3, 900, 2)],
            latencies: Vec::new(),
            elapsed: Duration::from_secs(1),
            bytes: 24,
            retries: 1,
        };
        let (gap, from, to) = r.failover_after(t0 + Duration::from_millis(20), 1).unwrap();
        assert_eq!(gap, Duration::from_millis(890));
        assert_eq!((from, to), (1, 2));
        assert!(r.failover_after(t0 + Duration::from_secs(2), 1).is_none());
        // Answers the killed leader had already sent, read after the kill, are not the
        // failover (the CI run of 2026-12-01 read one 36 ms after the kill).
        let late = Report {
            acks: vec![ack(1, 0, 1), ack(2, 36, 1), ack(3, 900, 2), ack(4, 905, 2)],
            ..r
        };
        let (gap, from, to) = late
            .failover_after(t0 + Duration::from_millis(20), 1)
            .unwrap();
        assert_eq!(gap, Duration::from_millis(864));
        assert_eq!((from, to), (1, 2));
        assert_eq!(late.acks_from_after(t0 + Duration::from_millis(20), 1), 1);
        assert!(late.failover_after(t0, 2).is_some_and(|(_, _, to)| to == 1));
    }
}
