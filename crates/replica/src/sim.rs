//! A whole cluster in one thread on the in-process fabric: the harness for scenario tests,
//! benchmarks and the deterministic simulator.
//!
//! Virtual time advances only through [`SimCluster::run_for`]: fabric packets are delivered in
//! time order, every live node processes its events after each delivery, and every node ticks
//! each [`SimCluster::tick_ns`]. Disks are [`wal::fs::FaultFs`] instances, so a crash keeps
//! only durable bytes.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use fabric::NodeId;
use fabric::sim::{SimConfig, SimEndpoint, SimNet};
use wal::fs::{FaultFs, FileSystem};

use crate::node::{Committed, Replica, Role, Ticket};
use crate::{ReplicaConfig, ReplicaError};

/// A simulated cluster.
#[derive(Debug)]
pub struct SimCluster {
    /// The network.
    pub net: SimNet,
    /// Live replicas (`None` while crashed).
    pub nodes: BTreeMap<u64, Option<Replica<SimEndpoint>>>,
    /// Each node's disk.
    pub disks: BTreeMap<u64, Arc<FaultFs>>,
    /// Each node's configuration.
    pub configs: BTreeMap<u64, ReplicaConfig>,
    /// Virtual nanoseconds per raft tick.
    pub tick_ns: u64,
    /// Paused nodes: their CPU is stopped (no ticks, no processing) while their NIC keeps
    /// placing and acking one-sided writes, like a process under SIGSTOP or a long GC.
    pub paused: std::collections::BTreeSet<u64>,
    /// Fail-stop mode (the simulator's): a node whose `process` fails (a poisoned log after an
    /// fsync error or ENOSPC) is killed ([`SimCluster::kill`]), as its process would exit
    /// while its machine stays up, and recorded in
    /// [`SimCluster::failed`] instead of failing the whole run.
    pub fail_stop: bool,
    /// Nodes that failed in fail-stop mode, with the error, since the driver last took them.
    pub failed: BTreeMap<u64, String>,
    /// A ticket a caller on the node waits on while driving the node's passes itself
    /// (`PollMode::Busy`): [`SimCluster::process_all`] runs that node's pass with
    /// [`Replica::process_until_resolved`]. Cleared when the process dies.
    pub waiting: BTreeMap<u64, crate::Ticket>,
    /// Nodes of [`SimCluster::waiting`] whose caller, the moment its ticket resolves, starts
    /// a linearizable read there ([`Replica::read_index`]) before anything else runs on the
    /// node, as a busy caller reading its own write does; it then stops waiting. Cleared
    /// with `waiting`.
    pub read_on_resolve: std::collections::BTreeSet<u64>,
    /// The reads so started since the driver last took them.
    pub reads_on_resolve: Vec<ReadOnResolve>,
    /// What each node's log read at the indexes its commit index newly covered, right after
    /// a caller's pass (a waiter of [`SimCluster::waiting`] woken by the commit reads then,
    /// before any other pass runs), since the driver last took them: the simulator checks
    /// each against the committed log.
    pub caller_reads: Vec<CallerRead>,
    /// Per node, the highest index [`SimCluster::caller_reads`] covered in this process.
    caller_read_to: BTreeMap<u64, u64>,
    next_tick: u64,
}

/// An entry a node's log held right after a caller's pass, at an index its commit index
/// covered ([`SimCluster::caller_reads`]).
#[derive(Debug)]
pub struct CallerRead {
    /// The node.
    pub node: u64,
    /// The committed index read.
    pub index: u64,
    /// Its term with the raw payload (raft's tag byte first), `None` when the log does not
    /// hold the index, or why the read failed.
    pub read: Result<Option<(u64, Vec<u8>)>, ReplicaError>,
}

/// A read a caller started the moment its ticket resolved ([`SimCluster::read_on_resolve`]).
#[derive(Debug)]
pub struct ReadOnResolve {
    /// The node.
    pub node: u64,
    /// The append ticket that resolved.
    pub resolved: crate::Ticket,
    /// The read's ticket, or why the node refused it.
    pub read: Result<crate::ReadTicket, ReplicaError>,
    /// Virtual time it started.
    pub at_ns: u64,
    /// The highest commit index of any live node when the pass that started it began: every
    /// entry up to it was committed before the read.
    pub committed_before: u64,
}

impl SimCluster {
    /// `n` nodes (ids 1..=n) with configurations shaped by `tune`, on a fabric with `fabric`
    /// timing, seeded by `seed`. Each node's election window is pinned to width 1 from the
    /// seed, so elections replay exactly.
    pub fn new(
        n: u64,
        seed: u64,
        fabric: SimConfig,
        tune: impl Fn(&mut ReplicaConfig),
    ) -> Result<Self, ReplicaError> {
        let net = SimNet::new(fabric, seed);
        let voters: Vec<u64> = (1..=n).collect();
        let mut c = SimCluster {
            net,
            nodes: BTreeMap::new(),
            disks: BTreeMap::new(),
            configs: BTreeMap::new(),
            tick_ns: 10_000_000,
            paused: Default::default(),
            fail_stop: false,
            failed: BTreeMap::new(),
            waiting: BTreeMap::new(),
            read_on_resolve: Default::default(),
            reads_on_resolve: Vec::new(),
            caller_reads: Vec::new(),
            caller_read_to: BTreeMap::new(),
            next_tick: 10_000_000,
        };
        let spread = ReplicaConfig::new(1, Vec::new(), 0, PathBuf::new()).election_tick;
        let mut offsets: Vec<usize> = (0..spread.max(n as usize)).collect();
        for i in (1..offsets.len()).rev() {
            let j = c.net.random_below(i as u64 + 1) as usize;
            offsets.swap(i, j);
        }
        for id in 1..=n {
            let mut cfg = ReplicaConfig::new(
                id,
                voters.clone(),
                0x5eed,
                PathBuf::from(format!("/node{id}")),
            );
            cfg.ring_bytes = 4 << 20;
            cfg.segment_bytes = 16 << 20;
            // Distinct, seed-chosen timeouts: equal ones would split every vote forever.
            let base = cfg.election_tick + offsets[(id - 1) as usize % offsets.len()];
            cfg.election_window = Some((base, base + 1));
            // A new cluster: every node votes from the start (a test that wants the first
            // start proven by the term exchange turns it off in `tune`).
            cfg.new_cluster = true;
            tune(&mut cfg);
            let disk = Arc::new(FaultFs::new());
            let ep = c.net.add_node(NodeId(id));
            let r = Replica::open(cfg.clone(), ep, disk.clone() as Arc<dyn FileSystem>)?;
            c.nodes.insert(id, Some(r));
            c.disks.insert(id, disk);
            c.configs.insert(id, cfg);
        }
        Ok(c)
    }

    /// The live replica `id`.
    pub fn node(&mut self, id: u64) -> &mut Replica<SimEndpoint> {
        self.nodes
            .get_mut(&id)
            .and_then(Option::as_mut)
            .unwrap_or_else(|| panic!("node {id} is down"))
    }

    /// Lets every live node process what is pending.
    pub fn process_all(&mut self) -> Result<(), ReplicaError> {
        let mut dead = Vec::new();
        let committed_before = if self.read_on_resolve.is_empty() {
            0
        } else {
            self.max_commit()
        };
        for (id, r) in self.nodes.iter_mut() {
            if let Some(r) = r.as_mut().filter(|_| !self.paused.contains(id)) {
                let pass = match self.waiting.get(id) {
                    Some(&t) => r.process_until_resolved(t),
                    None => r.process(),
                };
                if let (Ok(()), Some(_)) = (&pass, self.waiting.get(id)) {
                    let disk = &self.disks[id];
                    // A read failure armed for the node is the node's to meet, not this
                    // check's: it is held back while the check reads.
                    if !disk.is_down() {
                        let to = self.caller_read_to.entry(*id).or_default();
                        let from = (*to).max(r.first_index().saturating_sub(1));
                        for index in from + 1..=r.commit_index() {
                            let mut buf = Vec::new();
                            let read = disk.without_read_faults(|| {
                                r.read_persisted(index, &mut buf)
                                    .map(|t| t.map(|term| (term, buf)))
                            });
                            self.caller_reads.push(CallerRead {
                                node: *id,
                                index,
                                read,
                            });
                        }
                        *to = (*to).max(r.commit_index());
                    }
                }
                if let (Ok(()), Some(&t)) = (&pass, self.waiting.get(id)) {
                    if self.read_on_resolve.contains(id) && r.ticket_status(t).is_some() {
                        self.read_on_resolve.remove(id);
                        self.waiting.remove(id);
                        self.reads_on_resolve.push(ReadOnResolve {
                            node: *id,
                            resolved: t,
                            read: r.read_index(),
                            at_ns: self.net.now(),
                            committed_before,
                        });
                    }
                }
                if let Err(e) = pass {
                    if !self.fail_stop {
                        return Err(e);
                    }
                    dead.push((*id, e.to_string()));
                }
            }
        }
        for (id, why) in dead {
            self.kill(id);
            self.failed.insert(id, why);
        }
        Ok(())
    }

    /// The highest commit index of the live nodes.
    pub fn max_commit(&self) -> u64 {
        self.nodes
            .values()
            .flatten()
            .map(Replica::commit_index)
            .max()
            .unwrap_or(0)
    }

    /// Runs the cluster for `ns` of virtual time.
    pub fn run_for(&mut self, ns: u64) -> Result<(), ReplicaError> {
        let until = self.net.now() + ns;
        self.process_all()?;
        loop {
            let next_packet = self.net.next_time().unwrap_or(u64::MAX);
            let next = next_packet.min(self.next_tick);
            if next > until {
                break;
            }
            if next_packet <= self.next_tick {
                self.net.step();
            } else {
                self.net.run_until(self.next_tick);
                self.next_tick += self.tick_ns;
                for (id, r) in self.nodes.iter_mut() {
                    if let Some(r) = r.as_mut().filter(|_| !self.paused.contains(id)) {
                        r.tick();
                    }
                }
            }
            self.process_all()?;
        }
        self.net.run_until(until);
        self.process_all()
    }

    /// Runs until `cond` holds or `max_ns` of virtual time passed; returns whether it held.
    pub fn run_until(
        &mut self,
        max_ns: u64,
        mut cond: impl FnMut(&mut SimCluster) -> bool,
    ) -> Result<bool, ReplicaError> {
        let deadline = self.net.now() + max_ns;
        while self.net.now() < deadline {
            if cond(self) {
                return Ok(true);
            }
            self.run_for(self.tick_ns)?;
        }
        Ok(cond(self))
    }

    /// The single leader among live nodes, if exactly one claims the highest term.
    pub fn leader(&self) -> Option<u64> {
        let leaders: Vec<(u64, u64)> = self
            .nodes
            .values()
            .flatten()
            .map(|r| r.status())
            .filter(|s| s.role == Role::Leader)
            .map(|s| (s.term, s.id))
            .collect();
        leaders.iter().max().map(|&(_, id)| id)
    }

    /// Runs until some node is leader.
    pub fn elect(&mut self) -> Result<u64, ReplicaError> {
        let ok = self.run_until(30_000_000_000, |c| c.leader().is_some())?;
        assert!(ok, "no leader within 30 s of virtual time");
        // Let the new leader's no-op commit so proposals go through at once.
        self.run_for(50_000_000)?;
        Ok(self.leader().expect("elected"))
    }

    /// Proposes on the current leader and runs until the ticket resolves.
    pub fn append(&mut self, data: &[u8]) -> Result<u64, ReplicaError> {
        let leader = self
            .leader()
            .ok_or(ReplicaError::NotLeader { leader_hint: None })?;
        let t = self.node(leader).propose(data)?;
        self.wait(leader, t)
    }

    /// Runs until ticket `t` proposed on `node` resolves (or 30 s of virtual time pass).
    pub fn wait(&mut self, node: u64, t: Ticket) -> Result<u64, ReplicaError> {
        let mut result = None;
        self.run_until(30_000_000_000, |c| {
            match c.nodes.get(&node).and_then(Option::as_ref) {
                Some(r) => {
                    result = r.ticket_status(t);
                    result.is_some()
                }
                None => true,
            }
        })?;
        result.unwrap_or(Err(ReplicaError::Dropped(
            "ticket did not resolve in 30 s of virtual time".into(),
        )))
    }

    /// Crashes node `id`: its process memory is gone, its disk keeps only durable bytes.
    pub fn crash(&mut self, id: u64) {
        self.paused.remove(&id);
        self.net.crash(NodeId(id));
        // Power first, so that nothing the dead process buffered reaches the disk on the way
        // out.
        self.disks[&id].crash_now();
        self.waiting.remove(&id);
        self.read_on_resolve.remove(&id);
        self.caller_read_to.remove(&id);
        if let Some(r) = self.nodes.insert(id, None).flatten() {
            r.abandon();
        }
    }

    /// Stops node `id` cleanly, as `Log::close` does: flushes its log (under
    /// `Durability::Memory` removing its ring's shared memory), then its process exits.
    /// Restart it with [`SimCluster::restart_killed`].
    pub fn stop(&mut self, id: u64) -> Result<(), ReplicaError> {
        self.paused.remove(&id);
        self.waiting.remove(&id);
        self.read_on_resolve.remove(&id);
        self.caller_read_to.remove(&id);
        let closed = match self.nodes.insert(id, None).flatten() {
            Some(r) => r.close(),
            None => Ok(()),
        };
        self.net.kill_process(NodeId(id));
        closed
    }

    /// Kills node `id`'s process (kill -9) while its machine stays up: its memory is gone,
    /// except shared memory (the `Durability::Memory` ring); its disk keeps every byte written
    /// (the page cache survives), synced or not.
    pub fn kill(&mut self, id: u64) {
        self.paused.remove(&id);
        self.net.kill_process(NodeId(id));
        self.waiting.remove(&id);
        self.read_on_resolve.remove(&id);
        self.caller_read_to.remove(&id);
        if let Some(r) = self.nodes.insert(id, None).flatten() {
            r.abandon();
        }
    }

    /// Restarts a killed node (see [`SimCluster::kill`]): its disk as the dead process left it.
    pub fn restart_killed(&mut self, id: u64) -> Result<(), ReplicaError> {
        // A new process: a kill armed on the disk for the old one is void.
        self.disks[&id].revive();
        let ep = self.net.restart(NodeId(id));
        let r = Replica::open(
            self.configs[&id].clone(),
            ep,
            self.disks[&id].clone() as Arc<dyn FileSystem>,
        )?;
        self.nodes.insert(id, Some(r));
        Ok(())
    }

    /// Restarts a crashed node from its disk.
    pub fn restart(&mut self, id: u64) -> Result<(), ReplicaError> {
        self.restart_torn(id, None)
    }

    /// Restarts a crashed node from its disk; with `tear_seed`, each sector written since its
    /// last fdatasync survives or not at random (a torn unsynced tail).
    pub fn restart_torn(&mut self, id: u64, tear_seed: Option<u64>) -> Result<(), ReplicaError> {
        self.disks[&id].reboot(tear_seed);
        self.restart_killed(id)
    }

    /// Crashes node `id`'s machine and restarts it under its old id on a new, empty disk: its
    /// data dir emptied or replaced (see [`crate::recovering::Unproven`]).
    pub fn wipe(&mut self, id: u64) -> Result<(), ReplicaError> {
        self.crash(id);
        self.restart_on_new_disk(id)
    }

    /// Restarts crashed node `id` under its old id on a new, empty disk (no longer a new
    /// cluster's first start: it ran before).
    pub fn restart_on_new_disk(&mut self, id: u64) -> Result<(), ReplicaError> {
        self.disks.insert(id, Arc::new(FaultFs::new()));
        if let Some(cfg) = self.configs.get_mut(&id) {
            cfg.new_cluster = false;
        }
        self.restart_killed(id)
    }

    /// Adds a new, empty node `id` that knows no members yet; the leader adds it with
    /// [`Replica::change_membership`].
    pub fn add_node(&mut self, id: u64) -> Result<(), ReplicaError> {
        let template = self
            .configs
            .values()
            .next()
            .expect("a cluster has nodes")
            .clone();
        // Every setting of the others (block size, durability, limits, the mutation under
        // test): a log's replicas must agree on them.
        let mut cfg = template;
        cfg.id = id;
        cfg.voters = Vec::new();
        cfg.data_dir = PathBuf::from(format!("/node{id}"));
        let top = self
            .configs
            .values()
            .filter_map(|c| c.election_window)
            .map(|(_, b)| b)
            .max();
        cfg.election_window = top.map(|b| (b, b + 1));
        let disk = Arc::new(FaultFs::new());
        let ep = self.net.add_node(NodeId(id));
        let r = Replica::open(cfg.clone(), ep, disk.clone() as Arc<dyn FileSystem>)?;
        self.nodes.insert(id, Some(r));
        self.disks.insert(id, disk);
        self.configs.insert(id, cfg);
        Ok(())
    }

    /// The committed application entries of node `id`, in order, from its log.
    pub fn committed_log(&mut self, id: u64) -> Result<Vec<(u64, Vec<u8>)>, ReplicaError> {
        let r = self.node(id);
        let s = r.status();
        let mut out = Vec::new();
        let mut buf = Vec::new();
        for i in s.first_index.max(1)..=s.commit {
            if let Some(Committed::Application { .. }) = r.read(i, &mut buf)? {
                out.push((i, buf.clone()));
            }
        }
        Ok(out)
    }
}
