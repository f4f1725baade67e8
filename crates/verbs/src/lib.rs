//! Safe RDMA Verbs over rdma-sys 0.3 (libibverbs + librdmacm): devices, PD, MR, CQ, RC QP and
//! rdma_cm connection setup. This is the only crate in the workspace with `unsafe`.
//!
//! # Object graph and drop order
//!
//! Every object holds an `Arc` to its parent and destroys itself in `Drop`, so a parent can
//! never be destroyed while a child lives (the rust-ibverbs model):
//!
//! ```text
//! DeviceList ─▶ Context ─▶ ProtectionDomain ─▶ MemoryRegion<M>
//!                 │              └──────────▶ QueuePair ──▶ CompletionQueue (send, recv)
//!                 ├─▶ CompletionQueue
//!                 └─▶ AsyncEvents (thread)
//! cm::Connection = { QueuePair, cm id, event channel }
//! ```
//!
//! When several of these live in one struct, **declaration order is drop order**: declare the
//! `QueuePair` (or `Connection`) before the `MemoryRegion`s it posts from or exposes, and the
//! `MemoryRegion` before (or as owner of) its memory. A `MemoryRegion` owns its memory, so the
//! memory can never be freed while it is registered. Destroying a QP first means the device
//! stops touching the memory before it is deregistered; deregistering first is still memory
//! safe (the device then fails the access with a protection error) but turns in-flight WRs
//! into errors instead of clean flushes.
//!
//! # Safety: the shared-memory protocol with the device
//!
//! Memory registered in a [`MemoryRegion`] is shared with the RDMA device (and, when remote
//! access is granted, with remote peers). The rules, enforced partly by types and partly by
//! the `# Safety` contracts of the `unsafe fn`s:
//!
//! * **Who writes what.** A remote peer may write a registered range only while
//!   `REMOTE_WRITE` is granted on both the MR and the QP it writes through. The local CPU may
//!   write a range that is the source of a posted Send/Write only after that WR's completion
//!   (or a later completion on the same send queue) has been polled. A receive buffer belongs
//!   to the device from `post_recv` until its completion is polled.
//! * **When bytes are visible.** Bytes that a peer RDMA-writes become visible to the local
//!   CPU when a completion that the peer ordered after the write is polled here (on one RC QP,
//!   a Send posted after a Write is delivered after the Write's data is placed). Before that,
//!   the bytes may be torn. Even after it, they are **untrusted** input: callers validate
//!   length, checksum and sequence themselves.
//! * **How the CPU reads it.** This crate never hands out `&[u8]` or `&mut [u8]` to memory
//!   that the device may write concurrently; it copies in and out with raw-pointer copies
//!   ([`MemoryRegion::read_at`], [`MemoryRegion::write_at`]). `unsafe fn`
//!   [`MemoryRegion::as_slice`] exists for callers that can prove no DMA is in flight.
//!
//! # Polling
//!
//! Completion queues support three modes ([`PollMode`]): busy polling (optionally on a thread
//! pinned to a core, [`spawn_busy_poller`]), adaptive (spin for a bounded time, then arm the
//! CQ and block on its completion channel) and event-driven. All waits are bounded.

mod cm;
mod cq;
mod credits;
mod device;
mod error;
mod events;
mod mr;
mod qp;
mod recv_pool;
mod sys;
mod wake;
mod words;

pub use cm::{
    ConnectConfig, Connection, Hello, Listener, PRIVATE_DATA_LEN, PROTOCOL_VERSION, RejectReason,
    RemoteRegion, dead_peer_bound,
};
pub use cq::{
    BusyPoller, Completion, CompletionQueue, PollMode, WcOpcode, WcStatus, pin_current_thread,
    spawn_busy_poller,
};
pub use credits::SendCredits;
pub use device::{
    Context, DeviceAttributes, DeviceInfo, GidEntry, GidType, PortAttributes, PortState,
    list_devices, select_roce_v2_gid,
};
pub use error::{Error, Result};
pub use events::{AsyncEvent, AsyncEvents};
pub use mr::{AccessFlags, AnonMemory, MemoryRegion, ProtectionDomain, RegistrableMemory};
pub use qp::{Mtu, QpConfig, QpState, QueuePair, RtrParams, SignalPolicy};
pub use recv_pool::RecvPool;
pub use wake::{MAX_WAIT_CQS, WaitSet, Wakeup};
pub use words::{SharedOpen, WordBuffer, WordRegion};
