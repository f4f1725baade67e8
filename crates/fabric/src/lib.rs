//! The fabric: a transport trait with exactly the semantics of RDMA verbs on RC queue pairs,
//! so that the replica runs unchanged on the in-process simulator ([`sim`]) and on rxe/mlx5.
//!
//! # Semantics every back-end keeps
//!
//! - **Registration.** [`Fabric::register`] makes memory remotely writable in principle and
//!   returns a [`RemoteRegion`] (addr, rkey, len) that peers learn at connect time. Registration
//!   happens once, at start-up.
//! - **One reliable connection per peer pair.** [`Fabric::connect`] establishes it (or
//!   re-establishes a broken one); [`Event::Connected`] reports it with the peer's advertised
//!   region, [`Event::Disconnected`] reports its loss.
//! - **One-sided write.** [`Fabric::post_write`] places bytes in the peer's registered region
//!   with no peer CPU. Its successful completion at the writer means the peer's NIC acked.
//! - **Send/Recv.** [`Fabric::post_send`] delivers a message into a receive buffer the peer
//!   posted in advance. Credits ([`Fabric::send_credits`]) say how many buffers are posted, so a
//!   sender that respects them never causes RNR.
//! - **Ordering.** On one connection, operations are delivered in the order posted: a send
//!   posted after a write is received only after the write's bytes are visible. Bytes *within*
//!   one write may land in any order.
//! - **Fencing.** The receiver grants or revokes remote write per connection
//!   ([`Fabric::set_remote_write`]). A write on a revoked connection completes with
//!   [`WcStatus::RemoteAccess`], leaves the target bytes unchanged, and breaks the connection.
//! - **Failure.** A dead or unreachable peer makes the oldest outstanding operation complete
//!   with [`WcStatus::RetryExceeded`] after the retry bound, and every later one with
//!   [`WcStatus::Flushed`]. A flushed or failed operation is never an ack. A broken connection
//!   must be re-established with [`Fabric::connect`].
//! - **Polling.** Completions and connection events are polled into a caller-provided array.

#![deny(unsafe_code)]

pub mod admission;
pub mod dial;
pub mod endpoint;
pub mod rdma;
mod shared;
pub mod sim;
pub mod tcp;
pub mod tls;

pub use endpoint::{Endpoint, Transport};
pub use shared::WordMemory;

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

/// A node of the cluster, as the fabric addresses it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeId(pub u64);

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "node {}", self.0)
    }
}

/// What a peer needs to write into a registered region: address, key and length.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RemoteRegion {
    /// The region's start address in the owner's address space.
    pub addr: u64,
    /// The remote key.
    pub rkey: u32,
    /// Length in bytes.
    pub len_bytes: u64,
}

/// A local handle to a registered region.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LocalRegion {
    /// Back-end specific id.
    pub id: u32,
    /// Length in bytes.
    pub len_bytes: u64,
}

/// Memory a fabric can register: plain memory seen as 64-bit words. Bytes are little-endian
/// within a word. Atomic words make a peer that breaks the protocol (a deposed leader writing
/// late) produce garbage, which checksums reject, never undefined behaviour.
pub trait Memory: Send + Sync + fmt::Debug {
    /// The memory as words.
    fn words(&self) -> &[AtomicU64];

    /// The same memory as `Any`, so a back-end can recognise memory it allocated itself
    /// (the RDMA back-end registers only its own allocations, whose address it knows is fixed).
    fn into_any(self: Arc<Self>) -> Arc<dyn std::any::Any + Send + Sync>;
}

/// The largest control message. Append descriptors, votes, responses and commit indexes are
/// far smaller; the limit is set by the slow path, where one raft append carries up to one
/// maximum-size entry (64 KiB) plus a batch of smaller ones (48 KiB), with room to spare.
/// 32 receive buffers per connection of this size are 8 MiB per peer.
pub const MAX_MESSAGE_BYTES: usize = 256 * 1024;

/// A one-sided write to post.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WriteRequest {
    /// Caller's id, echoed in the completion.
    pub wr_id: u64,
    /// The local region to read from.
    pub local: LocalRegion,
    /// Offset in the local region.
    pub local_offset: u64,
    /// The peer's region.
    pub remote: RemoteRegion,
    /// Offset in the peer's region.
    pub remote_offset: u64,
    /// Bytes to write.
    pub len_bytes: u64,
    /// Whether a successful completion is reported. Errors are always reported.
    pub signaled: bool,
}

/// The operation a completion belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WcOp {
    /// A one-sided write.
    Write,
    /// A send.
    Send,
    /// A receive: a message arrived in receive slot `slot`.
    Recv,
}

/// How an operation ended. rxe reports a write on a revoked QP as a remote invalid request
/// and mlx5 as a remote access error; both are [`WcStatus::RemoteAccess`] here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum WcStatus {
    /// Done; for a write, the peer's NIC acked.
    Success,
    /// The peer refused the access (revoked, wrong rkey, out of bounds): fenced.
    RemoteAccess,
    /// The peer did not answer within the retry bound: dead or unreachable.
    RetryExceeded,
    /// The peer had no receive posted for longer than the RNR retry bound.
    RnrRetryExceeded,
    /// Not executed because the connection broke first. Never an ack.
    Flushed,
}

/// One completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    /// The peer of the connection.
    pub peer: NodeId,
    /// The caller's id (for receives: the slot number).
    pub wr_id: u64,
    /// The operation.
    pub op: WcOp,
    /// How it ended.
    pub status: WcStatus,
    /// For receives: the message length.
    pub byte_len: u32,
}

/// Why a connection went down.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DisconnectReason {
    /// An operation failed with this status.
    Failed(WcStatus),
    /// The peer could not be reached to connect.
    Unreachable,
    /// The peer reset or re-established the connection.
    PeerReset,
    /// This side closed it.
    Closed,
    /// The peer failed admission (wrong cluster secret, or none), or refused us.
    Refused,
}

/// Something [`Fabric::poll`] reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// An operation completed.
    Completion(Completion),
    /// A connection to `peer` is up; `remote` is the region it advertised.
    Connected {
        /// The peer.
        peer: NodeId,
        /// The peer's advertised region, if it advertised one.
        remote: Option<RemoteRegion>,
    },
    /// The connection to `peer` is down; outstanding operations were flushed.
    Disconnected {
        /// The peer.
        peer: NodeId,
        /// Why.
        reason: DisconnectReason,
    },
    /// The endpoint failed for good (polling a completion queue of its device failed):
    /// nothing more completes or arrives on it, and [`Fabric::failure`] says why. Reported
    /// once. The owner must stop (fail-stop) for its supervisor to restart it on a working
    /// device; going on would leave a node up and useless.
    Failed,
}

/// State of the connection to one peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConnState {
    /// No connection.
    Down,
    /// A connect is in flight.
    Connecting,
    /// Connected.
    Up,
}

/// Errors of posting and management calls. Failures of operations in flight are completions,
/// not errors.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FabricError {
    /// There is no live connection to the peer.
    #[error("no connection to {peer}: connect first")]
    NotConnected {
        /// The peer.
        peer: NodeId,
    },
    /// The send queue to the peer is full; poll completions first.
    #[error("the send queue to {peer} is full ({depth} outstanding operations)")]
    QueueFull {
        /// The peer.
        peer: NodeId,
        /// The queue depth.
        depth: usize,
    },
    /// The peer has no receive buffer posted for us; wait for credits.
    #[error("no send credits for {peer}: it has no receive buffer posted")]
    NoCredit {
        /// The peer.
        peer: NodeId,
    },
    /// A message is larger than [`MAX_MESSAGE_BYTES`].
    #[error("a {len}-byte message exceeds the {max}-byte limit")]
    MessageTooLarge {
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The local region or range is not registered.
    #[error("local region {id} does not cover {offset}..{end}")]
    LocalRange {
        /// Region id.
        id: u32,
        /// Start offset.
        offset: u64,
        /// End offset.
        end: u64,
    },
    /// The receive slot is not one that holds a message.
    #[error("receive slot {slot} of {peer} holds no message")]
    BadSlot {
        /// The peer.
        peer: NodeId,
        /// The slot.
        slot: u64,
    },
    /// The peer is this node, or not part of the fabric.
    #[error("{peer} is not a peer of this node")]
    UnknownPeer {
        /// The peer.
        peer: NodeId,
    },
    /// A shared-memory file of [`Fabric::alloc_persistent`] could not be removed.
    #[error("shared memory {path}: {reason}")]
    SharedMemory {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        reason: String,
    },
    /// Sleeping for events failed (the device's event channel or `poll(2)` failed).
    #[error("waiting for fabric events failed: {reason}")]
    Wait {
        /// Why.
        reason: String,
    },
    /// This node is down (crashed in the simulator).
    #[error("{node} is down")]
    NodeDown {
        /// The node.
        node: NodeId,
    },
    /// The endpoint cannot be set up: its configuration is refused, or the device, the
    /// listening socket or the secret file cannot be used.
    #[error("cannot set up the fabric: {reason}")]
    Setup {
        /// Why, naming the setting or resource.
        reason: String,
    },
    /// Registration failed.
    #[error("cannot register {len_bytes} bytes: {reason}")]
    Register {
        /// Length asked for.
        len_bytes: u64,
        /// Why.
        reason: String,
    },
}

/// Lets a thread sleep until an endpoint may have new events (a completion, a connection
/// result) or until another thread wakes it, instead of polling on a timer.
///
/// Use: [`Waiter::arm`], then poll the endpoint once more ([`Fabric::poll`]), then
/// [`Waiter::wait`]. An event that arrives after the arm ends the wait; one that raced in
/// before it is found by that poll. A wait may also return for an event the poll already took;
/// that costs one empty poll.
pub trait Waiter: Send + Sync + std::fmt::Debug {
    /// Requests a wake-up for the next event.
    fn arm(&self) -> Result<(), FabricError>;
    /// Sleeps until an event after the last arm, a [`Waiter::wake`], or `timeout`. Returns
    /// whether something woke it.
    fn wait(&self, timeout: std::time::Duration) -> Result<bool, FabricError>;
    /// Ends the current or next wait, from any thread (for example: a proposal is queued).
    fn wake(&self);
}

/// One node's view of the fabric.
pub trait Fabric {
    /// This node.
    fn node(&self) -> NodeId;

    /// Allocates zeroed memory that this back-end can register (use it for rings).
    fn alloc(&mut self, len_bytes: u64) -> Result<Arc<dyn Memory>, FabricError>;

    /// Allocates registrable memory that survives a crash of this process, but not of the
    /// machine: the shared-memory file `path` (on tmpfs, such as /dev/shm). A process that
    /// opens the same path after a crash finds the words as they were, and `true` says so;
    /// `false` means the memory is new and zeroed. `len_bytes` must be a multiple of 4096.
    fn alloc_persistent(
        &mut self,
        path: &std::path::Path,
        len_bytes: u64,
    ) -> Result<(Arc<dyn Memory>, bool), FabricError>;

    /// Removes the shared-memory file `path` from [`Fabric::alloc_persistent`], for an owner
    /// that closed cleanly and keeps nothing there that is not durable elsewhere. The memory
    /// stays valid while this process maps it; the next allocation of `path` is new and
    /// zeroed. A file already gone is not an error.
    fn free_persistent(&mut self, path: &std::path::Path) -> Result<(), FabricError>;

    /// Registers memory from [`Fabric::alloc`] once, at start-up.
    fn register(
        &mut self,
        memory: Arc<dyn Memory>,
    ) -> Result<(LocalRegion, RemoteRegion), FabricError>;

    /// The region peers learn when they connect to us.
    fn advertise(&mut self, region: RemoteRegion);

    /// Starts connecting to `peer` (no-op when up). Completion is [`Event::Connected`] or
    /// [`Event::Disconnected`] with [`DisconnectReason::Unreachable`].
    fn connect(&mut self, peer: NodeId) -> Result<(), FabricError>;

    /// Closes the connection to `peer`, flushing outstanding operations.
    fn disconnect(&mut self, peer: NodeId);

    /// The state of the connection to `peer`. A connection is `Up`, and takes writes and
    /// sends, only once [`Fabric::poll`] has handed out its [`Event::Connected`]: until then
    /// the owner's state for the peer (where its log ends, what was sent) still describes the
    /// connection before, and an operation posted from that state must not reach the new
    /// one (simulator seed 928: a leader paused through a reconnect wrote from its stale end
    /// over records its follower had accepted).
    fn conn_state(&self, peer: NodeId) -> ConnState;

    /// Posts a one-sided write. Fails with [`FabricError::NotConnected`] unless the connection
    /// is `Up` (see [`Fabric::conn_state`]).
    fn post_write(&mut self, peer: NodeId, wr: WriteRequest) -> Result<(), FabricError>;

    /// Posts a send of `msg` (copied into a registered send buffer). Consumes one credit.
    fn post_send(&mut self, peer: NodeId, wr_id: u64, msg: &[u8]) -> Result<(), FabricError>;

    /// How many sends to `peer` can be posted now without risking RNR.
    fn send_credits(&self, peer: NodeId) -> u32;

    /// The message in receive slot `slot` from `peer` (after a [`WcOp::Recv`] completion).
    fn recv_message(&self, peer: NodeId, slot: u64) -> Result<&[u8], FabricError>;

    /// Re-posts receive slot `slot` for `peer` once its message has been consumed, returning a
    /// credit to the peer.
    fn repost_recv(&mut self, peer: NodeId, slot: u64) -> Result<(), FabricError>;

    /// Grants or revokes remote write on our registered memory for the connection with `peer`.
    fn set_remote_write(&mut self, peer: NodeId, allowed: bool) -> Result<(), FabricError>;

    /// Moves up to `out.len()` events into `out`; returns how many. Never allocates.
    fn poll(&mut self, out: &mut [Event]) -> usize;

    /// Why the endpoint failed for good, once it reported [`Event::Failed`].
    fn failure(&self) -> Option<String> {
        None
    }

    /// A handle to sleep on until this endpoint may have events. `None` when the back-end has
    /// nothing to block on (the simulator is stepped by its caller): the owner then sleeps on
    /// its own clock.
    fn waiter(&self) -> Option<Arc<dyn Waiter>> {
        None
    }
}

/// Reads `out.len()` bytes at byte offset `offset` of `memory` into `out` (little-endian
/// words): one load per word, not per byte. The TCP back-end sends every write's source bytes
/// through it, and a load per byte cost about 10 instructions per byte (40,000 per 4 KiB).
pub fn read_bytes(memory: &dyn Memory, offset: u64, out: &mut [u8]) {
    read_words(memory.words(), offset, out);
}

/// Reads `out.len()` bytes at byte offset `offset` of a slice of little-endian words: the
/// partial words at the edges, and whole words between them.
pub fn read_words(words: &[AtomicU64], offset: u64, out: &mut [u8]) {
    use std::sync::atomic::Ordering;
    let mut pos = offset;
    let mut out = out;
    let within = (pos % 8) as usize;
    if within != 0 && !out.is_empty() {
        let take = (8 - within).min(out.len());
        let w = words[(pos / 8) as usize]
            .load(Ordering::Acquire)
            .to_le_bytes();
        out[..take].copy_from_slice(&w[within..within + take]);
        pos += take as u64;
        out = &mut out[take..];
    }
    let first = (pos / 8) as usize;
    let whole = out.len() / 8;
    let (body, tail) = out.split_at_mut(whole * 8);
    for (chunk, word) in body.chunks_exact_mut(8).zip(&words[first..first + whole]) {
        chunk.copy_from_slice(&word.load(Ordering::Acquire).to_le_bytes());
    }
    if !tail.is_empty() {
        let w = words[first + whole].load(Ordering::Acquire).to_le_bytes();
        tail.copy_from_slice(&w[..tail.len()]);
    }
}

/// Writes `data` at byte offset `offset` of `memory`, word by word where aligned.
pub fn write_bytes(memory: &dyn Memory, offset: u64, data: &[u8]) {
    write_words(memory.words(), offset, data);
}

/// Writes `data` at byte offset `offset` of a slice of little-endian words: whole words where
/// aligned, read-modify-write at the edges. Both back-ends fill registered memory with it.
pub fn write_words(words: &[AtomicU64], offset: u64, data: &[u8]) {
    use std::sync::atomic::Ordering;
    let mut pos = offset;
    let mut rest = data;
    while !rest.is_empty() {
        let wi = (pos / 8) as usize;
        let within = (pos % 8) as usize;
        let take = (8 - within).min(rest.len());
        if take == 8 {
            let mut b = [0u8; 8];
            b.copy_from_slice(&rest[..8]);
            words[wi].store(u64::from_le_bytes(b), Ordering::Release);
        } else {
            let mut cur = words[wi].load(Ordering::Acquire).to_le_bytes();
            cur[within..within + take].copy_from_slice(&rest[..take]);
            words[wi].store(u64::from_le_bytes(cur), Ordering::Release);
        }
        pos += take as u64;
        rest = &rest[take..];
    }
}

/// Plain zeroed memory for tests and the simulator.
#[derive(Debug)]
pub struct VecMemory {
    words: Box<[AtomicU64]>,
}

impl VecMemory {
    /// `len_bytes` of zeroed memory, rounded up to whole words.
    pub fn new(len_bytes: u64) -> Self {
        let n = len_bytes.div_ceil(8) as usize;
        VecMemory {
            words: (0..n).map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

impl Memory for VecMemory {
    fn words(&self) -> &[AtomicU64] {
        &self.words
    }

    fn into_any(self: Arc<Self>) -> Arc<dyn std::any::Any + Send + Sync> {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_round_trip_at_any_alignment() {
        let m = VecMemory::new(64);
        let data: Vec<u8> = (1..=29).collect();
        for off in [0u64, 1, 7, 8, 13] {
            write_bytes(&m, off, &data);
            let mut back = vec![0u8; data.len()];
            read_bytes(&m, off, &mut back);
            assert_eq!(back, data, "offset {off}");
        }
    }

    #[test]
    fn reads_match_a_byte_by_byte_read_at_every_offset_and_length() {
        let m = VecMemory::new(64);
        let data: Vec<u8> = (0..64).map(|i| (i * 7 + 3) as u8).collect();
        write_bytes(&m, 0, &data);
        for off in 0..24u64 {
            for len in 0..=(64 - off as usize).min(40) {
                let mut got = vec![0xEEu8; len];
                read_bytes(&m, off, &mut got);
                assert_eq!(got, data[off as usize..off as usize + len], "{off}+{len}");
            }
        }
    }

    #[test]
    fn writes_touch_only_their_range() {
        let m = VecMemory::new(32);
        write_bytes(&m, 0, &[0xAA; 32]);
        write_bytes(&m, 5, &[1, 2, 3]);
        let mut all = [0u8; 32];
        read_bytes(&m, 0, &mut all);
        assert_eq!(&all[..5], &[0xAA; 5]);
        assert_eq!(&all[5..8], &[1, 2, 3]);
        assert_eq!(&all[8..], &[0xAA; 24]);
    }
}
