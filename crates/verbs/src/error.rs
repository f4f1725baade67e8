//! The crate's one error type.

use std::time::Duration;

use crate::cm::RejectReason;

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in the verbs layer. Each variant carries the context a
/// reader needs to act: the device, port, peer, the failing operation and the errno.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// libibverbs/librdmacm found no RDMA device at all (for example a host without kernel
    /// InfiniBand support).
    #[error(
        "no RDMA device is present on this host (the kernel exposes no InfiniBand/RoCE device)"
    )]
    NoDevices,
    /// A device was asked for by name and is not present.
    #[error("RDMA device {name:?} was not found; the devices present are [{present}]")]
    DeviceNotFound {
        /// The name asked for.
        name: String,
        /// The names present, comma separated.
        present: String,
    },
    /// A verbs or rdma_cm call failed with an errno.
    #[error("{op} failed on device {device} port {port} (peer {peer}): {source}")]
    Verbs {
        /// The libibverbs/librdmacm function that failed.
        op: &'static str,
        /// Device name.
        device: String,
        /// Port number, 0 when not applicable.
        port: u8,
        /// Peer address, or "-" when there is none.
        peer: String,
        /// The errno.
        #[source]
        source: std::io::Error,
    },
    /// No RoCE v2 GID on the port carries the requested IPv4 address.
    #[error(
        "device {device} port {port} has no RoCE v2 GID for {ip}; is the address configured on its netdev?"
    )]
    NoRoceV2Gid {
        /// Device name.
        device: String,
        /// Port number.
        port: u8,
        /// The address looked for.
        ip: std::net::Ipv4Addr,
    },
    /// rdma_cm bound the connection to a different device than the protection domain's.
    #[error(
        "rdma_cm placed the connection to {peer} on device {actual}, but its protection domain is on {expected}"
    )]
    WrongDevice {
        /// Device of the PD.
        expected: String,
        /// Device the cm id resolved to.
        actual: String,
        /// Peer address.
        peer: String,
    },
    /// A bounded wait for a connection-manager event ran out.
    #[error(
        "waited {waited:?} for rdma_cm event {expected} during {op} with peer {peer}, and none came"
    )]
    CmTimeout {
        /// What was being done.
        op: &'static str,
        /// The event awaited.
        expected: &'static str,
        /// Peer address.
        peer: String,
        /// How long we waited.
        waited: Duration,
    },
    /// The connection manager delivered an event other than the one awaited.
    #[error(
        "during {op} with peer {peer} rdma_cm reported {event} (status {status}) instead of {expected}"
    )]
    CmUnexpected {
        /// What was being done.
        op: &'static str,
        /// The event awaited.
        expected: &'static str,
        /// The event that came.
        event: String,
        /// Its status field (negative errno or IB reject reason).
        status: i32,
        /// Peer address.
        peer: String,
    },
    /// The remote side rejected our connect request and said why.
    #[error("peer {peer} rejected the connection: {reason}")]
    Rejected {
        /// Peer address.
        peer: String,
        /// The reason it sent.
        reason: RejectReason,
    },
    /// We rejected an incoming connect request, for the reason given.
    #[error("rejected an incoming connection from {peer}: {reason}")]
    RefusedPeer {
        /// Peer address.
        peer: String,
        /// The reason we sent back.
        reason: RejectReason,
    },
    /// Connection private data was malformed.
    #[error("connection private data from {peer} is malformed: {detail}")]
    BadPrivateData {
        /// Peer address.
        peer: String,
        /// What was wrong.
        detail: String,
    },
    /// Posting would overflow the send queue; poll and retire completions first.
    #[error(
        "send queue of QP {qp_num} is full ({outstanding} of {depth} WRs outstanding); poll completions and retire them first"
    )]
    SendQueueFull {
        /// QP number.
        qp_num: u32,
        /// WRs not yet retired.
        outstanding: u64,
        /// Send queue depth.
        depth: u32,
    },
    /// The peer has no posted receive for another Send.
    #[error(
        "no send credits left towards the peer (it has {posted} receives posted in total, we sent {sent}); wait for a credit update"
    )]
    NoCredits {
        /// Cumulative receives the peer reported posting.
        posted: u64,
        /// Cumulative Sends we made.
        sent: u64,
    },
    /// A CQ would be over-committed: its capacity cannot hold every completion its QPs can
    /// produce.
    #[error(
        "completion queue of capacity {capacity} cannot take {requested} more entries ({reserved} already reserved by other QPs); a CQ overrun would break it"
    )]
    CqOvercommitted {
        /// CQ capacity.
        capacity: u32,
        /// Already reserved.
        reserved: u32,
        /// Requested by the new QP.
        requested: u32,
    },
    /// A local range falls outside its memory region.
    #[error("range {offset}..{offset}+{len} is outside the {region_len}-byte memory region")]
    OutOfBounds {
        /// Offset into the region.
        offset: usize,
        /// Length asked for.
        len: usize,
        /// Region length.
        region_len: usize,
    },
    /// An invalid argument or configuration.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// A wait for completions ran out.
    #[error("no completion arrived within {0:?}")]
    PollTimeout(Duration),
    /// A shared-memory word file (a crash-surviving ring) cannot be used.
    #[error("shared memory file {}: {reason}", path.display())]
    SharedMemory {
        /// The file.
        path: std::path::PathBuf,
        /// Why, with what to do about it.
        reason: String,
    },
}

impl Error {
    /// Builds an [`Error::Verbs`] from the current errno (or a positive return code).
    pub(crate) fn verbs(op: &'static str, device: &str, port: u8, peer: &str, rc: i32) -> Self {
        Error::Verbs {
            op,
            device: device.to_owned(),
            port,
            peer: peer.to_owned(),
            source: crate::sys::rc_error(rc),
        }
    }

    /// Builds an [`Error::Verbs`] from an `io::Error`.
    pub(crate) fn io(
        op: &'static str,
        device: &str,
        port: u8,
        peer: &str,
        e: std::io::Error,
    ) -> Self {
        Error::Verbs {
            op,
            device: device.to_owned(),
            port,
            peer: peer.to_owned(),
            source: e,
        }
    }

    /// The errno of a failed verbs call, if this is one.
    pub fn errno(&self) -> Option<i32> {
        match self {
            Error::Verbs { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }
}
