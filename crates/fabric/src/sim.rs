//! The in-process fabric: deterministic, on a virtual clock, driven by a scheduler.
//!
//! Deterministic use drives everything from one thread. [`SimNet::run_realtime`] instead lets a
//! clock thread follow the wall clock, for examples with replicas on their own threads.
//!
//! All nodes of a simulated cluster share one [`SimNet`], which owns the virtual clock, a
//! seeded random number generator, and a queue of in-flight packets ordered by delivery time
//! (ties broken by posting order). Nothing happens until the driver calls [`SimNet::step`] or
//! [`SimNet::run_until`], so a run is a pure function of its seed and of the calls made.
//!
//! The model follows RC verbs:
//! - each directed pair of nodes is a FIFO wire: a packet is delivered no earlier than the one
//!   posted before it on the same connection, which gives "send after write is seen after the
//!   write's bytes";
//! - a write or send is acked by a packet travelling back; a lost request *or* a lost ack makes
//!   the writer's oldest outstanding operation fail with `RetryExceeded` after
//!   [`SimConfig::retry_timeout_ns`] (so a write can land and still not be acked, as on a real
//!   network), and all later ones `Flushed`;
//! - remote write is checked at the target against the connection's grant, the rkey and the
//!   bounds; a refused write leaves memory unchanged and breaks the connection;
//! - receive buffers are pre-posted per connection; credits count them, and a send that finds
//!   none fails with `RnrRetryExceeded`.
//!
//! Faults for the simulator: [`SimNet::set_link`] (partitions, symmetric or not),
//! [`SimNet::set_extra_delay`], [`SimNet::break_connection`], [`SimNet::crash`] and
//! [`SimNet::restart`].

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::{
    Completion, ConnState, DisconnectReason, Event, Fabric, FabricError, LocalRegion,
    MAX_MESSAGE_BYTES, Memory, NodeId, RemoteRegion, WcOp, WcStatus, WriteRequest, read_bytes,
    write_bytes,
};

/// Timing and sizing of a simulated fabric. Virtual nanoseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SimConfig {
    /// Base one-way latency. 2 µs is a typical RoCE hop through one switch.
    pub one_way_ns: u64,
    /// Extra one-way latency per KiB (serialisation): ~80 ns/KiB is 100 Gb/s.
    pub per_kib_ns: u64,
    /// Uniform random jitter added per packet, 0..jitter_ns.
    pub jitter_ns: u64,
    /// How long an unacked operation waits before `RetryExceeded`: the dead-peer bound,
    /// (retry_cnt + 1) × 4.096 µs × 2^timeout on hardware, ~0.5 s at timeout 14, retry 6.
    pub retry_timeout_ns: u64,
    /// Receive buffers posted per connection (the initial credits).
    pub recv_slots: u32,
    /// Send queue depth per connection.
    pub max_outstanding: usize,
    /// Whether a write's source bytes are read when the write is delivered (as a NIC that
    /// DMA-reads the source while it transmits, late) instead of when it is posted. With it,
    /// a sender that reuses a buffer a write still reads from delivers what it wrote since.
    pub read_source_at_delivery: bool,
    /// Whether revoking remote write tears the writes from that peer still on the wire: each
    /// places a random subset of its words (the NIC was mid-DMA when access changed) and
    /// completes `RemoteAccess` at its sender.
    pub tear_writes_at_revoke: bool,
    /// Chance, in parts per million, that a write lands with one byte flipped (memory or
    /// DMA corruption past the wire's checksum): what the receiver's record checks are for.
    pub corrupt_write_ppm: u64,
    /// Test-only mutation: a connection takes writes and sends as soon as it is up, before
    /// its owner polled its `Connected` (the rule of [`Fabric::conn_state`] removed; simulator
    /// seed 928 catches it).
    #[doc(hidden)]
    pub use_before_announced: bool,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            one_way_ns: 2_000,
            per_kib_ns: 80,
            jitter_ns: 500,
            retry_timeout_ns: 500_000_000,
            recv_slots: 32,
            max_outstanding: 256,
            read_source_at_delivery: false,
            tear_writes_at_revoke: false,
            corrupt_write_ppm: 0,
            use_before_announced: false,
        }
    }
}

impl SimConfig {
    /// No network delay, no jitter (the rest as [`SimConfig::default`]): for benchmarks and
    /// instruction counts, where what remains of a commit is the replicas' own work.
    pub fn zero_delay() -> Self {
        SimConfig {
            one_way_ns: 0,
            per_kib_ns: 0,
            jitter_ns: 0,
            ..SimConfig::default()
        }
    }
}

/// Places a random subset of `data`'s 8-byte words at `base` of `memory`: a write torn on the
/// wire (its writer crashed, or its target revoked access mid-DMA).
fn place_torn(rng: &mut SplitMix64, memory: &dyn Memory, base: u64, data: &[u8]) {
    for (k, chunk) in data.chunks(8).enumerate() {
        if rng.below(2) == 1 {
            write_bytes(memory, base + 8 * k as u64, chunk);
        }
    }
}

/// A small, fast, seedable generator (SplitMix64) so runs replay exactly from a seed.
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// Seeds the generator.
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next_u64() % n }
    }
}

#[derive(Debug)]
struct Region {
    memory: Arc<dyn Memory>,
    remote: RemoteRegion,
}

#[derive(Debug)]
struct Outstanding {
    wr_id: u64,
    op: WcOp,
    signaled: bool,
    seq: u64,
}

#[derive(Debug)]
struct Conn {
    epoch: u64,
    state: ConnState,
    remote_write: bool,
    credits: u32,
    outstanding: VecDeque<Outstanding>,
    free_slots: Vec<u64>,
}

impl Conn {
    fn new(epoch: u64, slots: u32) -> Self {
        Conn {
            epoch,
            state: ConnState::Down,
            remote_write: false,
            credits: 0,
            outstanding: VecDeque::new(),
            free_slots: (0..u64::from(slots)).rev().collect(),
        }
    }
}

#[derive(Debug)]
struct NodeState {
    up: bool,
    regions: Vec<Region>,
    advertised: Option<RemoteRegion>,
    conns: BTreeMap<NodeId, Conn>,
    /// Per peer, the [`Event::Connected`]s queued in `events` and not yet polled: while any
    /// is, the connection is not yet the owner's to use ([`Fabric::conn_state`]).
    unannounced: BTreeMap<NodeId, u32>,
    events: VecDeque<Event>,
    /// The messages of the receive completions in `events`, in the same order, with the
    /// epoch of the connection they arrived on. Keeping them in event order means a
    /// `Disconnected` event clears only the buffers of messages that arrived before it.
    recv_data: VecDeque<(u64, Vec<u8>)>,
    /// The node's shared-memory files ([`Fabric::alloc_persistent`]): they survive
    /// [`SimNet::kill_process`], not [`SimNet::crash`].
    shm: BTreeMap<std::path::PathBuf, Arc<crate::VecMemory>>,
    /// Why the node's endpoint failed for good ([`SimNet::fail_device`]).
    failed: Option<String>,
}

impl NodeState {
    /// Queues the [`Event::Connected`] of a new connection to `peer`.
    fn announce(&mut self, peer: NodeId, remote: Option<RemoteRegion>) {
        *self.unannounced.entry(peer).or_default() += 1;
        self.events.push_back(Event::Connected { peer, remote });
    }

    /// The connection to `peer`, if it is up and its owner has polled its
    /// [`Event::Connected`] (unless `gate` is off: the test-only
    /// [`SimConfig::use_before_announced`]).
    fn usable_conn(&self, peer: NodeId, gate: bool) -> Option<&Conn> {
        if gate && self.unannounced.contains_key(&peer) {
            return None;
        }
        self.conns.get(&peer).filter(|c| c.state == ConnState::Up)
    }
}

#[derive(Debug)]
enum Packet {
    ConnectReq {
        advertised: Option<RemoteRegion>,
    },
    ConnectAck {
        advertised: Option<RemoteRegion>,
    },
    Write {
        rkey: u32,
        addr: u64,
        data: Vec<u8>,
        op_seq: u64,
        /// With `read_source_at_delivery`: the source memory and offset, read again when the
        /// write is placed.
        source: Option<(Arc<dyn Memory>, u64)>,
    },
    Send {
        data: Vec<u8>,
        op_seq: u64,
    },
    Ack {
        op_seq: u64,
    },
    Nak {
        op_seq: u64,
        status: WcStatus,
    },
    Credit,
}

#[derive(Debug)]
enum Action {
    Deliver {
        src: NodeId,
        dst: NodeId,
        epoch: u64,
        packet: Packet,
    },
    /// The sender gives up on operation `op_seq` (or on a connect, when `op_seq` is 0).
    Timeout {
        node: NodeId,
        peer: NodeId,
        epoch: u64,
        op_seq: u64,
    },
}

#[derive(Debug)]
struct Net {
    now: u64,
    seq: u64,
    rng: SplitMix64,
    config: SimConfig,
    nodes: BTreeMap<NodeId, NodeState>,
    queue: BinaryHeap<Reverse<(u64, u64)>>,
    actions: BTreeMap<u64, Action>,
    blocked: BTreeSet<(NodeId, NodeId)>,
    /// Wires `(src, dst, epoch)` that lost a request. RC delivers a connection's requests in
    /// order or not at all: after a lost one the responder takes nothing later of that
    /// connection (it would NAK the sequence gap), so the sender's oldest operation fails
    /// after the retry bound. Without this, a later send's cumulative ack would retire the
    /// lost one and its receive credit would never come back.
    lost_requests: BTreeSet<(NodeId, NodeId, u64)>,
    extra_delay: BTreeMap<(NodeId, NodeId), u64>,
    last_delivery: BTreeMap<(NodeId, NodeId), u64>,
    next_rkey: u32,
    next_epoch: u64,
    stats: SimStats,
}

/// Counters of what the fabric did, for tests and the simulator's summary.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SimStats {
    /// Writes whose bytes were placed.
    pub writes_placed: u64,
    /// Writes refused at the target (fenced, bad rkey, out of bounds).
    pub writes_refused: u64,
    /// Messages delivered into receive buffers.
    pub messages_delivered: u64,
    /// Packets dropped by partitions, crashes or stale connections.
    pub packets_dropped: u64,
    /// Connections established.
    pub connects: u64,
    /// Writes cut short by their writer's crash: a random subset of their words landed.
    pub writes_torn: u64,
    /// Writes that landed with a flipped byte (`SimConfig::corrupt_write_ppm`).
    pub writes_corrupted: u64,
}

impl Net {
    fn schedule(&mut self, at: u64, action: Action) {
        self.seq += 1;
        self.queue.push(Reverse((at, self.seq)));
        self.actions.insert(self.seq, action);
    }

    /// Tears the writes from `src` to `dst` on connection `epoch` still on the wire, as
    /// `dst` revokes `src`'s remote write: each places a random subset of its 8-byte words
    /// and is answered `RemoteAccess` instead of placed whole.
    ///
    /// Only writes that can arrive now: none behind a cut link, and none after a request of
    /// the connection that was lost. A responder takes no operation past a gap in the
    /// sequence (it would NAK the gap), and the `RemoteAccess` answer acknowledges every
    /// operation before it: a torn write after a lost one would complete the lost one
    /// `Success`, a write that placed nothing counted as placed (simulator seed 9,601,360
    /// of `--callers-drive --durability replicated` failed on that, not on the replica).
    fn tear_writes_at_revoke(&mut self, src: NodeId, dst: NodeId, epoch: u64) {
        if !self.deliverable(src, dst, epoch) {
            return;
        }
        let in_flight: Vec<u64> = self
            .actions
            .iter()
            .filter_map(|(seq, a)| match a {
                Action::Deliver {
                    src: s,
                    dst: d,
                    epoch: e,
                    packet: Packet::Write { .. },
                } if *s == src && *d == dst && *e == epoch => Some(*seq),
                _ => None,
            })
            .collect();
        for seq in in_flight {
            let Some(Action::Deliver {
                packet:
                    Packet::Write {
                        rkey,
                        addr,
                        mut data,
                        op_seq,
                        source,
                    },
                ..
            }) = self.actions.remove(&seq)
            else {
                continue;
            };
            if let Some((memory, offset)) = &source {
                read_bytes(memory.as_ref(), *offset, &mut data);
            }
            let end = addr + data.len() as u64;
            let region = self.nodes.get(&dst).and_then(|t| {
                t.regions.iter().find(|r| {
                    r.remote.rkey == rkey
                        && addr >= r.remote.addr
                        && end <= r.remote.addr + r.remote.len_bytes
                })
            });
            if let Some(r) = region {
                let memory = r.memory.clone();
                let base = addr - r.remote.addr;
                place_torn(&mut self.rng, memory.as_ref(), base, &data);
                self.stats.writes_torn += 1;
            }
            // The answer takes the write's place on the wire, so per-wire order holds.
            self.actions.insert(
                seq,
                Action::Deliver {
                    src: dst,
                    dst: src,
                    epoch,
                    packet: Packet::Nak {
                        op_seq,
                        status: WcStatus::RemoteAccess,
                    },
                },
            );
        }
    }

    fn send_packet(&mut self, src: NodeId, dst: NodeId, epoch: u64, packet: Packet) {
        let bytes = match &packet {
            Packet::Write { data, .. } | Packet::Send { data, .. } => data.len() as u64,
            _ => 0,
        };
        let jitter = self.rng.below(self.config.jitter_ns);
        let extra = self.extra_delay.get(&(src, dst)).copied().unwrap_or(0);
        let mut at = self.now
            + self.config.one_way_ns
            + bytes * self.config.per_kib_ns / 1024
            + jitter
            + extra;
        // FIFO per directed wire: never overtake the packet posted before.
        let last = self.last_delivery.entry((src, dst)).or_insert(0);
        if at <= *last {
            at = *last + 1;
        }
        *last = at;
        self.schedule(
            at,
            Action::Deliver {
                src,
                dst,
                epoch,
                packet,
            },
        );
    }

    /// Sends an operation's packet and arms its retry timeout: if neither its ack nor a NAK
    /// arrives in time, the sender's oldest outstanding operation fails `RetryExceeded`.
    fn send_op(&mut self, src: NodeId, dst: NodeId, epoch: u64, op_seq: u64, packet: Packet) {
        self.send_packet(src, dst, epoch, packet);
        let at = self.now + self.config.retry_timeout_ns;
        self.schedule(
            at,
            Action::Timeout {
                node: src,
                peer: dst,
                epoch,
                op_seq,
            },
        );
    }

    fn conn_epoch(&self, node: NodeId, peer: NodeId) -> Option<u64> {
        self.nodes.get(&node)?.conns.get(&peer).map(|c| c.epoch)
    }

    /// Breaks `node`'s side of the connection to `peer`: the oldest outstanding operation gets
    /// `first`, the rest `Flushed`, then a `Disconnected` event.
    fn fail_conn(
        &mut self,
        node: NodeId,
        peer: NodeId,
        first: Option<WcStatus>,
        reason: DisconnectReason,
    ) {
        let slots = self.config.recv_slots;
        let Some(n) = self.nodes.get_mut(&node) else {
            return;
        };
        let Some(c) = n.conns.get_mut(&peer) else {
            return;
        };
        if c.state == ConnState::Down && c.outstanding.is_empty() {
            return;
        }
        let mut status = first;
        while let Some(o) = c.outstanding.pop_front() {
            let s = status.take().unwrap_or(WcStatus::Flushed);
            n.events.push_back(Event::Completion(Completion {
                peer,
                wr_id: o.wr_id,
                op: o.op,
                status: s,
                byte_len: 0,
            }));
        }
        let epoch = c.epoch;
        *c = Conn::new(epoch, slots);
        n.events.push_back(Event::Disconnected { peer, reason });
    }

    /// Retires outstanding operations up to and including `op_seq` (RC completes in order;
    /// unsignaled ones complete silently).
    fn ack(&mut self, node: NodeId, peer: NodeId, op_seq: u64) {
        let Some(n) = self.nodes.get_mut(&node) else {
            return;
        };
        let Some(c) = n.conns.get_mut(&peer) else {
            return;
        };
        while let Some(o) = c.outstanding.front() {
            if o.seq > op_seq {
                break;
            }
            let o = c.outstanding.pop_front().expect("front exists");
            if o.signaled {
                n.events.push_back(Event::Completion(Completion {
                    peer,
                    wr_id: o.wr_id,
                    op: o.op,
                    status: WcStatus::Success,
                    byte_len: 0,
                }));
            }
        }
    }

    /// Whether `dst` grants remote write to `src` on the connection of `epoch`.
    fn conns_grant(&self, dst: NodeId, src: NodeId, epoch: u64) -> bool {
        self.nodes
            .get(&dst)
            .and_then(|n| n.conns.get(&src))
            .is_some_and(|c| c.epoch == epoch && c.remote_write && c.state == ConnState::Up)
    }

    /// Whether a packet of the connection `epoch` reaches `dst`'s side. A side in the error
    /// state (`Down`) answers nothing, as a QP in ERROR does: the sender's operation then
    /// fails after the retry bound, so a half-open connection is always detected.
    fn deliverable(&self, src: NodeId, dst: NodeId, epoch: u64) -> bool {
        !self.blocked.contains(&(src, dst))
            && !self.lost_requests.contains(&(src, dst, epoch))
            && self.nodes.get(&dst).is_some_and(|n| n.up)
            && self.nodes.get(&src).is_some_and(|n| n.up)
            && self
                .nodes
                .get(&dst)
                .and_then(|n| n.conns.get(&src))
                .is_some_and(|c| c.epoch == epoch && c.state != ConnState::Down)
    }

    fn deliver(&mut self, src: NodeId, dst: NodeId, epoch: u64, packet: Packet) {
        let slots = self.config.recv_slots;
        if let Packet::ConnectReq { advertised } = packet {
            let reachable =
                !self.blocked.contains(&(src, dst)) && self.nodes.get(&dst).is_some_and(|n| n.up);
            if !reachable {
                self.stats.packets_dropped += 1;
                return;
            }
            // The responder resets its side: whatever was in flight on the old connection is
            // flushed, and remote write starts revoked (granting is the owner's decision).
            self.fail_conn(dst, src, None, DisconnectReason::PeerReset);
            let n = self.nodes.get_mut(&dst).expect("dst exists");
            let mut c = Conn::new(epoch, slots);
            c.state = ConnState::Up;
            c.credits = slots;
            n.conns.insert(src, c);
            n.announce(src, advertised);
            let mine = n.advertised;
            self.send_packet(dst, src, epoch, Packet::ConnectAck { advertised: mine });
            return;
        }
        if !self.deliverable(src, dst, epoch) {
            self.stats.packets_dropped += 1;
            if matches!(packet, Packet::Write { .. } | Packet::Send { .. }) {
                self.lost_requests.insert((src, dst, epoch));
            }
            let errored_side = !self.blocked.contains(&(src, dst))
                && self.nodes.get(&dst).is_some_and(|n| n.up)
                && self
                    .nodes
                    .get(&dst)
                    .and_then(|n| n.conns.get(&src))
                    .is_some_and(|c| c.epoch == epoch && c.state == ConnState::Down);
            if errored_side && matches!(packet, Packet::Write { .. }) {
                // The target's QP is in error: the write is refused there, memory unchanged.
                self.stats.writes_refused += 1;
            }
            if matches!(packet, Packet::Credit) && self.conn_epoch(src, dst) == Some(epoch) {
                // A credit rides on reliable traffic on hardware: it is never silently lost
                // on a live connection. If it cannot arrive, the connection fails at the side
                // that returned it (its carrier exhausted the retries), so the sender never
                // waits forever with zero credits and nothing outstanding.
                self.fail_conn(
                    src,
                    dst,
                    None,
                    DisconnectReason::Failed(WcStatus::RetryExceeded),
                );
            }
            return;
        }
        match packet {
            Packet::ConnectReq { .. } => unreachable!("handled above"),
            Packet::ConnectAck { advertised } => {
                let n = self.nodes.get_mut(&dst).expect("dst exists");
                let c = n.conns.get_mut(&src).expect("deliverable implies a conn");
                if c.state == ConnState::Connecting {
                    c.state = ConnState::Up;
                    c.credits = slots;
                    n.announce(src, advertised);
                    self.stats.connects += 1;
                }
            }
            Packet::Write {
                rkey,
                addr,
                mut data,
                op_seq,
                source,
            } => {
                if let Some((memory, offset)) = &source {
                    read_bytes(memory.as_ref(), *offset, &mut data);
                }
                if !data.is_empty() && self.rng.below(1_000_000) < self.config.corrupt_write_ppm {
                    let at = self.rng.below(data.len() as u64) as usize;
                    data[at] ^= 1 << self.rng.below(8);
                    self.stats.writes_corrupted += 1;
                }
                let n = self.nodes.get(&dst).expect("dst exists");
                let grant = n.conns.get(&src).is_some_and(|c| c.remote_write);
                let end = addr + data.len() as u64;
                let region = n.regions.iter().find(|r| {
                    r.remote.rkey == rkey
                        && addr >= r.remote.addr
                        && end <= r.remote.addr + r.remote.len_bytes
                });
                match (grant, region) {
                    (true, Some(r)) => {
                        write_bytes(r.memory.as_ref(), addr - r.remote.addr, &data);
                        self.stats.writes_placed += 1;
                        self.send_packet(dst, src, epoch, Packet::Ack { op_seq });
                    }
                    _ => {
                        self.stats.writes_refused += 1;
                        self.send_packet(
                            dst,
                            src,
                            epoch,
                            Packet::Nak {
                                op_seq,
                                status: WcStatus::RemoteAccess,
                            },
                        );
                        // The responder's QP goes to the error state too.
                        self.fail_conn(
                            dst,
                            src,
                            None,
                            DisconnectReason::Failed(WcStatus::RemoteAccess),
                        );
                    }
                }
            }
            Packet::Send { data, op_seq } => {
                let n = self.nodes.get_mut(&dst).expect("dst exists");
                let c = n.conns.get_mut(&src).expect("deliverable implies a conn");
                match c.free_slots.pop() {
                    Some(slot) => {
                        n.events.push_back(Event::Completion(Completion {
                            peer: src,
                            wr_id: slot,
                            op: WcOp::Recv,
                            status: WcStatus::Success,
                            byte_len: data.len() as u32,
                        }));
                        n.recv_data.push_back((epoch, data));
                        self.stats.messages_delivered += 1;
                        self.send_packet(dst, src, epoch, Packet::Ack { op_seq });
                    }
                    None => {
                        self.send_packet(
                            dst,
                            src,
                            epoch,
                            Packet::Nak {
                                op_seq,
                                status: WcStatus::RnrRetryExceeded,
                            },
                        );
                        self.fail_conn(
                            dst,
                            src,
                            None,
                            DisconnectReason::Failed(WcStatus::RnrRetryExceeded),
                        );
                    }
                }
            }
            Packet::Ack { op_seq } => self.ack(dst, src, op_seq),
            Packet::Nak { op_seq, status } => {
                // Everything before the refused operation completed.
                self.ack(dst, src, op_seq.saturating_sub(1));
                self.fail_conn(dst, src, Some(status), DisconnectReason::Failed(status));
            }
            Packet::Credit => {
                if let Some(c) = self.nodes.get_mut(&dst).and_then(|n| n.conns.get_mut(&src)) {
                    c.credits += 1;
                }
            }
        }
    }

    fn timeout(&mut self, node: NodeId, peer: NodeId, epoch: u64, op_seq: u64) {
        let Some(c) = self.nodes.get(&node).and_then(|n| n.conns.get(&peer)) else {
            return;
        };
        if c.epoch != epoch {
            return;
        }
        if op_seq == 0 {
            if c.state == ConnState::Connecting {
                self.fail_conn(node, peer, None, DisconnectReason::Unreachable);
            }
            return;
        }
        if c.outstanding.iter().any(|o| o.seq == op_seq) {
            self.fail_conn(
                node,
                peer,
                Some(WcStatus::RetryExceeded),
                DisconnectReason::Failed(WcStatus::RetryExceeded),
            );
        }
    }

    fn step(&mut self) -> bool {
        let Some(Reverse((at, seq))) = self.queue.pop() else {
            return false;
        };
        self.now = self.now.max(at);
        let action = self.actions.remove(&seq).expect("queued action exists");
        match action {
            Action::Deliver {
                src,
                dst,
                epoch,
                packet,
            } => self.deliver(src, dst, epoch, packet),
            Action::Timeout {
                node,
                peer,
                epoch,
                op_seq,
            } => self.timeout(node, peer, epoch, op_seq),
        }
        true
    }
}

trait LockNet {
    fn lock_net(&self) -> MutexGuard<'_, Net>;
}

impl LockNet for Arc<Mutex<Net>> {
    fn lock_net(&self) -> MutexGuard<'_, Net> {
        // A panic while holding the lock is a bug in the simulator itself; the state is still
        // the last consistent one, so keep going rather than cascade the panic.
        self.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The simulated network shared by all nodes of one cluster. It is `Send + Sync`: a single
/// thread can drive it step by step (deterministic), or a clock thread can advance it in real
/// time while replicas run on their own threads (the embedded API's example).
#[derive(Debug, Clone)]
pub struct SimNet {
    net: Arc<Mutex<Net>>,
}

impl SimNet {
    /// A network with `config`, whose randomness comes from `seed`.
    pub fn new(config: SimConfig, seed: u64) -> Self {
        SimNet {
            net: Arc::new(Mutex::new(Net {
                now: 0,
                seq: 0,
                rng: SplitMix64::new(seed),
                config,
                nodes: BTreeMap::new(),
                queue: BinaryHeap::new(),
                actions: BTreeMap::new(),
                blocked: BTreeSet::new(),
                lost_requests: BTreeSet::new(),
                extra_delay: BTreeMap::new(),
                last_delivery: BTreeMap::new(),
                next_rkey: 0x100,
                next_epoch: 1,
                stats: SimStats::default(),
            })),
        }
    }

    /// Adds a node and returns its endpoint. Panics if the node exists (a test bug).
    pub fn add_node(&self, node: NodeId) -> SimEndpoint {
        let mut n = self.net.lock_net();
        let fresh = n
            .nodes
            .insert(
                node,
                NodeState {
                    up: true,
                    regions: Vec::new(),
                    advertised: None,
                    conns: BTreeMap::new(),
                    unannounced: BTreeMap::new(),
                    events: VecDeque::new(),
                    recv_data: VecDeque::new(),
                    shm: BTreeMap::new(),
                    failed: None,
                },
            )
            .is_none();
        assert!(fresh, "{node} added twice");
        let slots = n.config.recv_slots as usize;
        SimEndpoint {
            net: self.net.clone(),
            node,
            inboxes: BTreeMap::new(),
            slots,
        }
    }

    /// The shared-memory paths node `node` holds (from `alloc_persistent`), for tests.
    pub fn shm_paths(&self, node: NodeId) -> Vec<std::path::PathBuf> {
        self.net
            .lock_net()
            .nodes
            .get(&node)
            .map(|s| s.shm.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// Overwrites node `node`'s shared-memory file `path` with `byte` from `offset` on, for
    /// `len` bytes (tests: a ring whose records rot while its process is down). Returns
    /// whether the file exists.
    pub fn corrupt_shm(
        &self,
        node: NodeId,
        path: &std::path::Path,
        offset: u64,
        len: usize,
        byte: u8,
    ) -> bool {
        let net = self.net.lock_net();
        let Some(m) = net.nodes.get(&node).and_then(|s| s.shm.get(path)) else {
            return false;
        };
        crate::write_bytes(m.as_ref(), offset, &vec![byte; len]);
        true
    }

    /// Virtual time now, in ns.
    pub fn now(&self) -> u64 {
        self.net.lock_net().now
    }

    /// Time of the next scheduled action, if any.
    pub fn next_time(&self) -> Option<u64> {
        self.net.lock_net().queue.peek().map(|Reverse((t, _))| *t)
    }

    /// Processes one scheduled action; false when nothing is scheduled.
    pub fn step(&self) -> bool {
        self.net.lock_net().step()
    }

    /// Processes every action scheduled up to `t` and sets the clock to `t`.
    pub fn run_until(&self, t: u64) {
        loop {
            match self.next_time() {
                Some(next) if next <= t => {
                    self.step();
                }
                _ => break,
            }
        }
        let mut n = self.net.lock_net();
        n.now = n.now.max(t);
    }

    /// Blocks (`up = false`) or restores the directed link `from → to`.
    pub fn set_link(&self, from: NodeId, to: NodeId, up: bool) {
        let mut n = self.net.lock_net();
        if up {
            n.blocked.remove(&(from, to));
        } else {
            n.blocked.insert((from, to));
        }
    }

    /// Adds `ns` of one-way delay to packets `from → to`.
    pub fn set_extra_delay(&self, from: NodeId, to: NodeId, ns: u64) {
        self.net.lock_net().extra_delay.insert((from, to), ns);
    }

    /// Breaks the connection between `a` and `b` on both sides (as a QP error would).
    pub fn break_connection(&self, a: NodeId, b: NodeId) {
        let mut n = self.net.lock_net();
        n.fail_conn(a, b, None, DisconnectReason::PeerReset);
        n.fail_conn(b, a, None, DisconnectReason::PeerReset);
    }

    /// Breaks the connection between `a` and `b` on both sides, as
    /// [`SimNet::break_connection`], and lets the next packets of both directions go at once,
    /// however long the broken connection's last ones were delayed
    /// ([`SimNet::set_extra_delay`]): those belong to the broken connection and are dropped
    /// when they arrive, so a new connection need not queue behind them (a wire is FIFO only
    /// within a connection). A connect request among them would still arrive, late: delays
    /// that long outlast a run.
    pub fn break_connection_and_wires(&self, a: NodeId, b: NodeId) {
        let mut n = self.net.lock_net();
        n.fail_conn(a, b, None, DisconnectReason::PeerReset);
        n.fail_conn(b, a, None, DisconnectReason::PeerReset);
        n.last_delivery.remove(&(a, b));
        n.last_delivery.remove(&(b, a));
    }

    /// Fails `node`'s device for good, as a real one whose completion queue can no longer be
    /// polled: its endpoint reports [`Event::Failed`] at its next poll, and
    /// [`Fabric::failure`] gives `why`.
    pub fn fail_device(&self, node: NodeId, why: &str) {
        let mut n = self.net.lock_net();
        if let Some(s) = n.nodes.get_mut(&node) {
            if s.failed.is_none() {
                s.failed = Some(why.to_owned());
                s.events.push_back(Event::Failed);
            }
        }
    }

    /// Crashes the machine of `node`: its connections, registrations, pending events and
    /// shared memory vanish. Peers notice only through timeouts, as on a real network.
    pub fn crash(&self, node: NodeId) {
        self.kill_process(node);
        if let Some(s) = self.net.lock_net().nodes.get_mut(&node) {
            s.shm.clear();
        }
    }

    /// Kills the process of `node` (kill -9) while its machine stays up: as
    /// [`SimNet::crash`], except that its shared memory ([`Fabric::alloc_persistent`]) keeps
    /// what was stored in it. Peers notice only through timeouts.
    pub fn kill_process(&self, node: NodeId) {
        let mut n = self.net.lock_net();
        if let Some(s) = n.nodes.get_mut(&node) {
            s.up = false;
            s.regions.clear();
            s.advertised = None;
            s.conns.clear();
            s.unannounced.clear();
            s.events.clear();
            s.recv_data.clear();
            // The next process opens the device afresh.
            s.failed = None;
        }
    }

    /// Crashes `node` in the middle of its in-flight writes: each write it posted that has not
    /// landed yet places a random subset of its 8-byte words (where the target still grants
    /// remote write, as a NIC would check), and the rest never arrives. Then it crashes as
    /// [`SimNet::crash`] does. Returns how many writes were torn.
    pub fn crash_tearing_writes(&self, node: NodeId) -> u64 {
        let torn = {
            let mut guard = self.net.lock_net();
            let n = &mut *guard;
            let mut torn = 0;
            let in_flight: Vec<u64> = n
                .actions
                .iter()
                .filter(|(_, a)| {
                    matches!(a, Action::Deliver { src, packet: Packet::Write { .. }, .. } if *src == node)
                })
                .map(|(seq, _)| *seq)
                .collect();
            for seq in in_flight {
                let Some(Action::Deliver {
                    src,
                    dst,
                    epoch,
                    packet:
                        Packet::Write {
                            rkey, addr, data, ..
                        },
                }) = n.actions.remove(&seq)
                else {
                    continue;
                };
                // The packet is gone from the wire; its queue slot becomes a no-op.
                n.actions.insert(
                    seq,
                    Action::Timeout {
                        node: src,
                        peer: dst,
                        epoch: 0,
                        op_seq: 0,
                    },
                );
                let Some(target) = n.nodes.get(&dst).filter(|t| t.up) else {
                    continue;
                };
                let granted = n.conns_grant(dst, src, epoch);
                let end = addr + data.len() as u64;
                let Some(r) = target.regions.iter().find(|r| {
                    r.remote.rkey == rkey
                        && addr >= r.remote.addr
                        && end <= r.remote.addr + r.remote.len_bytes
                }) else {
                    continue;
                };
                if !granted {
                    continue;
                }
                let memory = r.memory.clone();
                let base = addr - r.remote.addr;
                place_torn(&mut n.rng, memory.as_ref(), base, &data);
                torn += 1;
            }
            n.stats.writes_torn += torn;
            torn
        };
        self.crash(node);
        torn
    }

    /// Restarts a crashed node with a fresh endpoint; it must register its memory again.
    pub fn restart(&self, node: NodeId) -> SimEndpoint {
        {
            let mut n = self.net.lock_net();
            let s = n.nodes.get_mut(&node).expect("restart of an unknown node");
            s.up = true;
        }
        let slots = self.net.lock_net().config.recv_slots as usize;
        SimEndpoint {
            net: self.net.clone(),
            node,
            inboxes: BTreeMap::new(),
            slots,
        }
    }

    /// Follows the wall clock from a background thread until `stop` is set: virtual time is
    /// the real time since the call, so timeouts behave as configured in real seconds.
    pub fn run_realtime(
        &self,
        stop: Arc<std::sync::atomic::AtomicBool>,
    ) -> std::thread::JoinHandle<()> {
        let net = self.clone();
        std::thread::spawn(move || {
            let start = std::time::Instant::now();
            let base = net.now();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                net.run_until(base + start.elapsed().as_nanos() as u64);
                std::thread::sleep(std::time::Duration::from_micros(50));
            }
        })
    }

    /// Whether `node` is up.
    pub fn is_up(&self, node: NodeId) -> bool {
        self.net.lock_net().nodes.get(&node).is_some_and(|n| n.up)
    }

    /// The fabric's counters.
    pub fn stats(&self) -> SimStats {
        self.net.lock_net().stats
    }

    /// A random number from the network's seeded generator (for drivers that want one stream).
    pub fn random_below(&self, n: u64) -> u64 {
        self.net.lock_net().rng.below(n)
    }
}

/// A message in a receive buffer, with the epoch of the connection it arrived on.
type Received = (u64, Vec<u8>);

/// One node's endpoint on a [`SimNet`].
#[derive(Debug)]
pub struct SimEndpoint {
    net: Arc<Mutex<Net>>,
    node: NodeId,
    /// Receive buffers per peer: the messages moved out of the net by `poll`.
    inboxes: BTreeMap<NodeId, Vec<Option<Received>>>,
    slots: usize,
}

impl SimEndpoint {
    fn check_up(&self, n: &Net) -> Result<(), FabricError> {
        if n.nodes.get(&self.node).is_some_and(|s| s.up) {
            Ok(())
        } else {
            Err(FabricError::NodeDown { node: self.node })
        }
    }
}

impl Fabric for SimEndpoint {
    fn node(&self) -> NodeId {
        self.node
    }

    fn alloc(&mut self, len_bytes: u64) -> Result<Arc<dyn Memory>, FabricError> {
        if len_bytes == 0 {
            return Err(FabricError::Register {
                len_bytes,
                reason: "empty region".into(),
            });
        }
        Ok(Arc::new(crate::VecMemory::new(len_bytes)))
    }

    fn free_persistent(&mut self, path: &std::path::Path) -> Result<(), FabricError> {
        let mut n = self.net.lock_net();
        self.check_up(&n)?;
        let state = n.nodes.get_mut(&self.node).expect("checked up");
        state.shm.remove(path);
        Ok(())
    }

    fn alloc_persistent(
        &mut self,
        path: &std::path::Path,
        len_bytes: u64,
    ) -> Result<(Arc<dyn Memory>, bool), FabricError> {
        if len_bytes == 0 || len_bytes % 4096 != 0 {
            return Err(FabricError::Register {
                len_bytes,
                reason: "persistent memory must be a non-zero multiple of 4096 bytes".into(),
            });
        }
        let mut n = self.net.lock_net();
        self.check_up(&n)?;
        let state = n.nodes.get_mut(&self.node).expect("checked up");
        match state.shm.get(path) {
            Some(m) if m.words().len() as u64 * 8 == len_bytes => Ok((m.clone(), true)),
            Some(m) => Err(FabricError::Register {
                len_bytes,
                reason: format!(
                    "{} holds {} bytes, not {len_bytes}",
                    path.display(),
                    m.words().len() * 8
                ),
            }),
            None => {
                let m = Arc::new(crate::VecMemory::new(len_bytes));
                state.shm.insert(path.to_owned(), m.clone());
                Ok((m, false))
            }
        }
    }

    fn register(
        &mut self,
        memory: Arc<dyn Memory>,
    ) -> Result<(LocalRegion, RemoteRegion), FabricError> {
        let mut n = self.net.lock_net();
        self.check_up(&n)?;
        let len_bytes = memory.words().len() as u64 * 8;
        if len_bytes == 0 {
            return Err(FabricError::Register {
                len_bytes,
                reason: "empty region".into(),
            });
        }
        // rkeys are sequential, as on rxe: guessable, which is why fencing is per connection.
        n.next_rkey += 1;
        let rkey = n.next_rkey;
        let node = n.nodes.get_mut(&self.node).expect("node exists");
        let id = node.regions.len() as u32;
        let addr = (self.node.0 << 44) | (u64::from(id) << 36) | 0x1000;
        let remote = RemoteRegion {
            addr,
            rkey,
            len_bytes,
        };
        node.regions.push(Region { memory, remote });
        Ok((LocalRegion { id, len_bytes }, remote))
    }

    fn advertise(&mut self, region: RemoteRegion) {
        if let Some(n) = self.net.lock_net().nodes.get_mut(&self.node) {
            n.advertised = Some(region);
        }
    }

    fn connect(&mut self, peer: NodeId) -> Result<(), FabricError> {
        let mut n = self.net.lock_net();
        self.check_up(&n)?;
        if peer == self.node || !n.nodes.contains_key(&peer) {
            return Err(FabricError::UnknownPeer { peer });
        }
        if let Some(c) = n.nodes[&self.node].conns.get(&peer) {
            if c.state != ConnState::Down {
                return Ok(());
            }
        }
        n.fail_conn(self.node, peer, None, DisconnectReason::Closed);
        n.next_epoch += 1;
        let epoch = n.next_epoch;
        let slots = n.config.recv_slots;
        let me = n.nodes.get_mut(&self.node).expect("node exists");
        // Drop the Disconnected event fail_conn may have queued for a connection that was
        // already down from our point of view.
        let mut c = Conn::new(epoch, slots);
        c.state = ConnState::Connecting;
        me.conns.insert(peer, c);
        let advertised = me.advertised;
        self.inboxes.insert(peer, vec![None; self.slots]);
        n.send_packet(self.node, peer, epoch, Packet::ConnectReq { advertised });
        let at = n.now + 2 * n.config.retry_timeout_ns;
        n.schedule(
            at,
            Action::Timeout {
                node: self.node,
                peer,
                epoch,
                op_seq: 0,
            },
        );
        Ok(())
    }

    fn disconnect(&mut self, peer: NodeId) {
        self.net
            .lock_net()
            .fail_conn(self.node, peer, None, DisconnectReason::Closed);
    }

    fn conn_state(&self, peer: NodeId) -> ConnState {
        let net = self.net.lock_net();
        let gate = !net.config.use_before_announced;
        net.nodes
            .get(&self.node)
            .and_then(|n| {
                let c = n.conns.get(&peer)?;
                Some(if gate && n.unannounced.contains_key(&peer) {
                    ConnState::Connecting
                } else {
                    c.state
                })
            })
            .map_or(ConnState::Down, |s| s)
    }

    fn post_write(&mut self, peer: NodeId, wr: WriteRequest) -> Result<(), FabricError> {
        let mut n = self.net.lock_net();
        self.check_up(&n)?;
        let depth = n.config.max_outstanding;
        let gate = !n.config.use_before_announced;
        let me = n.nodes.get(&self.node).expect("node exists");
        let c = me
            .usable_conn(peer, gate)
            .ok_or(FabricError::NotConnected { peer })?;
        if c.outstanding.len() >= depth {
            return Err(FabricError::QueueFull { peer, depth });
        }
        let end = wr.local_offset + wr.len_bytes;
        let region = me
            .regions
            .get(wr.local.id as usize)
            .filter(|r| end <= r.remote.len_bytes)
            .ok_or(FabricError::LocalRange {
                id: wr.local.id,
                offset: wr.local_offset,
                end,
            })?;
        // The NIC reads the source bytes when it transmits: the simulator reads them at post,
        // or, with `read_source_at_delivery`, again when the write is placed.
        let mut data = vec![0u8; wr.len_bytes as usize];
        read_bytes(region.memory.as_ref(), wr.local_offset, &mut data);
        let source = n
            .config
            .read_source_at_delivery
            .then(|| (region.memory.clone(), wr.local_offset));
        let epoch = c.epoch;
        n.seq += 1;
        let op_seq = n.seq;
        let c = n
            .nodes
            .get_mut(&self.node)
            .and_then(|m| m.conns.get_mut(&peer))
            .expect("checked above");
        c.outstanding.push_back(Outstanding {
            wr_id: wr.wr_id,
            op: WcOp::Write,
            signaled: wr.signaled,
            seq: op_seq,
        });
        let addr = wr.remote.addr + wr.remote_offset;
        n.send_op(
            self.node,
            peer,
            epoch,
            op_seq,
            Packet::Write {
                rkey: wr.remote.rkey,
                addr,
                data,
                op_seq,
                source,
            },
        );
        Ok(())
    }

    fn post_send(&mut self, peer: NodeId, wr_id: u64, msg: &[u8]) -> Result<(), FabricError> {
        if msg.len() > MAX_MESSAGE_BYTES {
            return Err(FabricError::MessageTooLarge {
                len: msg.len(),
                max: MAX_MESSAGE_BYTES,
            });
        }
        let mut n = self.net.lock_net();
        self.check_up(&n)?;
        let depth = n.config.max_outstanding;
        let gate = !n.config.use_before_announced;
        let c = n
            .nodes
            .get(&self.node)
            .and_then(|m| m.usable_conn(peer, gate))
            .ok_or(FabricError::NotConnected { peer })?;
        if c.outstanding.len() >= depth {
            return Err(FabricError::QueueFull { peer, depth });
        }
        if c.credits == 0 {
            return Err(FabricError::NoCredit { peer });
        }
        let epoch = c.epoch;
        n.seq += 1;
        let op_seq = n.seq;
        let c = n
            .nodes
            .get_mut(&self.node)
            .and_then(|m| m.conns.get_mut(&peer))
            .expect("checked above");
        c.credits -= 1;
        c.outstanding.push_back(Outstanding {
            wr_id,
            op: WcOp::Send,
            signaled: true,
            seq: op_seq,
        });
        n.send_op(
            self.node,
            peer,
            epoch,
            op_seq,
            Packet::Send {
                data: msg.to_vec(),
                op_seq,
            },
        );
        Ok(())
    }

    fn send_credits(&self, peer: NodeId) -> u32 {
        self.net
            .lock_net()
            .nodes
            .get(&self.node)
            .and_then(|n| n.conns.get(&peer))
            .filter(|c| c.state == ConnState::Up)
            .map_or(0, |c| c.credits)
    }

    fn recv_message(&self, peer: NodeId, slot: u64) -> Result<&[u8], FabricError> {
        self.inboxes
            .get(&peer)
            .and_then(|v| v.get(slot as usize))
            .and_then(|m| m.as_ref())
            .map(|(_, data)| data.as_slice())
            .ok_or(FabricError::BadSlot { peer, slot })
    }

    fn repost_recv(&mut self, peer: NodeId, slot: u64) -> Result<(), FabricError> {
        let taken = self
            .inboxes
            .get_mut(&peer)
            .and_then(|v| v.get_mut(slot as usize))
            .and_then(Option::take);
        let Some((arrived_on, _)) = taken else {
            return Err(FabricError::BadSlot { peer, slot });
        };
        let mut n = self.net.lock_net();
        let Some(c) = n
            .nodes
            .get_mut(&self.node)
            .and_then(|m| m.conns.get_mut(&peer))
        else {
            return Ok(());
        };
        // A buffer of an older connection goes back to nobody: the new connection started
        // with all its buffers posted, so reposting would post one twice.
        if c.state != ConnState::Up || c.epoch != arrived_on {
            return Ok(());
        }
        c.free_slots.push(slot);
        let epoch = c.epoch;
        // The credit travels back to the sender (piggybacked on a real back-end's traffic).
        n.send_packet(self.node, peer, epoch, Packet::Credit);
        Ok(())
    }

    fn set_remote_write(&mut self, peer: NodeId, allowed: bool) -> Result<(), FabricError> {
        let mut n = self.net.lock_net();
        self.check_up(&n)?;
        match n
            .nodes
            .get_mut(&self.node)
            .and_then(|m| m.conns.get_mut(&peer))
        {
            Some(c) if c.state == ConnState::Up => {
                let revoked = c.remote_write && !allowed;
                let epoch = c.epoch;
                c.remote_write = allowed;
                if revoked && n.config.tear_writes_at_revoke {
                    n.tear_writes_at_revoke(peer, self.node, epoch);
                }
                Ok(())
            }
            _ if !allowed => Ok(()), // nothing to revoke
            _ => Err(FabricError::NotConnected { peer }),
        }
    }

    fn failure(&self) -> Option<String> {
        let n = self.net.lock_net();
        n.nodes.get(&self.node).and_then(|s| s.failed.clone())
    }

    fn poll(&mut self, out: &mut [Event]) -> usize {
        let mut n = self.net.lock_net();
        let slots = self.slots;
        let Some(me) = n.nodes.get_mut(&self.node) else {
            return 0;
        };
        let mut k = 0;
        while k < out.len() {
            match me.events.pop_front() {
                Some(e) => {
                    match e {
                        Event::Connected { peer, .. } => {
                            if let Some(k) = me.unannounced.get_mut(&peer) {
                                *k -= 1;
                                if *k == 0 {
                                    me.unannounced.remove(&peer);
                                }
                            }
                        }
                        Event::Disconnected { peer, .. } => {
                            if let Some(v) = self.inboxes.get_mut(&peer) {
                                v.iter_mut().for_each(|m| *m = None);
                            }
                        }
                        Event::Completion(Completion {
                            peer,
                            wr_id: slot,
                            op: WcOp::Recv,
                            ..
                        }) => {
                            // Move the message into this endpoint's receive buffer.
                            let data = me
                                .recv_data
                                .pop_front()
                                .expect("every receive completion has its message");
                            let inbox = self
                                .inboxes
                                .entry(peer)
                                .or_insert_with(|| vec![None; slots]);
                            inbox[slot as usize] = Some(data);
                        }
                        _ => {}
                    }
                    out[k] = e;
                    k += 1;
                }
                None => break,
            }
        }
        k
    }
}
