//! Connection setup with rdma_cm: listen, connect and accept, with private data that carries
//! the cluster id, node id, protocol version, receive credits and the region a peer may
//! write; mismatched clusters or versions are rejected with the reason on both sides.
//!
//! The QP is *not* handed to rdma_cm (no `rdma_create_qp`): this module creates it with
//! [`QueuePair::new`], asks the CM for the path attributes (`rdma_init_qp_attr`) and drives
//! RESET→INIT→RTR→RTS itself, overriding path MTU, timeout, retry_cnt, rnr_retry and
//! max_rd_atomic from [`QpConfig`]. Every wait for a CM event is bounded.
//!
//! # Private data layout (little-endian, 48 bytes; RC connect requests carry at most 56
//! bytes through rdma_cm)
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 4 | magic `RLOG` |
//! | 4 | 2 | protocol version |
//! | 6 | 2 | reserved, 0 |
//! | 8 | 8 | cluster id |
//! | 16 | 8 | node id |
//! | 24 | 8 | region address |
//! | 32 | 4 | region rkey |
//! | 36 | 4 | receives posted (initial send credits for the peer) |
//! | 40 | 8 | region length |
//!
//! Reject private data (28 bytes): magic `RLRJ`, reason code u16, reserved u16, our cluster
//! id u64, their cluster id u64, our version u16, their version u16.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::cq::CompletionQueue;
use crate::device::Context;
use crate::error::{Error, Result};
use crate::mr::ProtectionDomain;
use crate::qp::{QpConfig, QueuePair};
use crate::sys;

/// Wire protocol version this build speaks.
pub const PROTOCOL_VERSION: u16 = 1;
/// Bytes of connect/accept private data we send.
pub const PRIVATE_DATA_LEN: usize = 48;
/// Most private data an RC connect request carries through rdma_cm (92-byte CM REQ private
/// data minus rdma_cm's 36-byte header).
const RC_CONNECT_PRIVATE_DATA_MAX: usize = 56;
/// Most private data a CM REJ carries (IBTA CM REJ private data size).
const REJECT_PRIVATE_DATA_MAX: usize = 148;
/// Bytes of reject private data we send.
const REJECT_DATA_LEN: usize = 28;
const HELLO_MAGIC: [u8; 4] = *b"RLOG";
const REJECT_MAGIC: [u8; 4] = *b"RLRJ";

const _: () = assert!(PRIVATE_DATA_LEN <= RC_CONNECT_PRIVATE_DATA_MAX);
const _: () = assert!(REJECT_DATA_LEN <= REJECT_PRIVATE_DATA_MAX);

/// A region a peer may RDMA-write: address, rkey and length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RemoteRegion {
    /// Remote virtual address.
    pub addr: u64,
    /// Remote key.
    pub rkey: u32,
    /// Length in bytes.
    pub len: u64,
}

impl RemoteRegion {
    pub(crate) fn check(&self, offset: u64, len: u64) -> Result<()> {
        // The region as advertised must also fit the address space: a peer advertising an
        // address near the top would make `addr + offset` wrap (a panic in debug builds, a
        // write elsewhere in release).
        let fits = offset
            .checked_add(len)
            .filter(|&end| end <= self.len)
            .and_then(|end| self.addr.checked_add(end));
        if fits.is_none() {
            return Err(Error::OutOfBounds {
                offset: offset as usize,
                len: len as usize,
                region_len: self.len as usize,
            });
        }
        Ok(())
    }
}

/// What each side says about itself when connecting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Hello {
    /// Cluster id; peers of different clusters never connect.
    pub cluster_id: u64,
    /// The sender's node id.
    pub node_id: u64,
    /// Protocol version.
    pub version: u16,
    /// The region the peer may write into (zero when none).
    pub region: RemoteRegion,
    /// Receives the sender has posted: the peer's initial send credits.
    pub recv_credits: u32,
}

impl Hello {
    /// Encodes to the fixed private-data layout.
    pub fn encode(&self) -> [u8; PRIVATE_DATA_LEN] {
        let mut b = [0u8; PRIVATE_DATA_LEN];
        b[0..4].copy_from_slice(&HELLO_MAGIC);
        b[4..6].copy_from_slice(&self.version.to_le_bytes());
        b[8..16].copy_from_slice(&self.cluster_id.to_le_bytes());
        b[16..24].copy_from_slice(&self.node_id.to_le_bytes());
        b[24..32].copy_from_slice(&self.region.addr.to_le_bytes());
        b[32..36].copy_from_slice(&self.region.rkey.to_le_bytes());
        b[36..40].copy_from_slice(&self.recv_credits.to_le_bytes());
        b[40..48].copy_from_slice(&self.region.len.to_le_bytes());
        b
    }

    /// Decodes private data (transports may pad it; trailing bytes are ignored).
    pub fn decode(b: &[u8]) -> std::result::Result<Hello, String> {
        if b.len() < PRIVATE_DATA_LEN {
            return Err(format!(
                "{} bytes, expected at least {PRIVATE_DATA_LEN}",
                b.len()
            ));
        }
        if b[0..4] != HELLO_MAGIC {
            return Err(format!(
                "magic {:02x?} is not {:02x?}",
                &b[0..4],
                HELLO_MAGIC
            ));
        }
        let u16_at = |o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
        Ok(Hello {
            version: u16_at(4),
            cluster_id: u64_at(8),
            node_id: u64_at(16),
            region: RemoteRegion {
                addr: u64_at(24),
                rkey: u32_at(32),
                len: u64_at(40),
            },
            recv_credits: u32_at(36),
        })
    }

    /// Checks a peer's hello against ours.
    pub fn check_peer(&self, theirs: &Hello) -> std::result::Result<(), RejectReason> {
        if theirs.cluster_id != self.cluster_id {
            return Err(RejectReason::ClusterMismatch {
                ours: self.cluster_id,
                theirs: theirs.cluster_id,
            });
        }
        if theirs.version != self.version {
            return Err(RejectReason::VersionMismatch {
                ours: self.version,
                theirs: theirs.version,
            });
        }
        Ok(())
    }
}

/// Why a connection was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RejectReason {
    /// The two sides belong to different clusters. `ours` is the rejecting side's id.
    ClusterMismatch {
        /// The rejecting side's cluster id.
        ours: u64,
        /// The rejected side's cluster id.
        theirs: u64,
    },
    /// The two sides speak different protocol versions.
    VersionMismatch {
        /// The rejecting side's version.
        ours: u16,
        /// The rejected side's version.
        theirs: u16,
    },
    /// The private data was not ours (wrong magic or too short).
    Malformed,
    /// The listener is up but not ready for peers yet (its owner is still starting); retry.
    NotReady,
    /// A reject without our reject data (no listener, a foreign peer): the CM status.
    Unspecified {
        /// The rdma_cm event status (IB CM reject reason).
        status: i32,
    },
}

impl fmt::Display for RejectReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RejectReason::ClusterMismatch { ours, theirs } => write!(
                f,
                "cluster id mismatch: the rejecting node is in cluster {ours:#x}, the connecting node in cluster {theirs:#x}"
            ),
            RejectReason::VersionMismatch { ours, theirs } => write!(
                f,
                "protocol version mismatch: the rejecting node speaks version {ours}, the connecting node version {theirs}"
            ),
            RejectReason::Malformed => {
                write!(f, "the connect private data was not an rdmalog hello")
            }
            RejectReason::NotReady => {
                write!(
                    f,
                    "the node is still starting and not ready for peers; retry"
                )
            }
            RejectReason::Unspecified { status } => {
                write!(
                    f,
                    "rejected without a reason from rdmalog (CM reject status {status})"
                )
            }
        }
    }
}

impl RejectReason {
    /// Encodes to reject private data.
    pub fn encode(&self) -> [u8; REJECT_DATA_LEN] {
        let mut b = [0u8; REJECT_DATA_LEN];
        b[0..4].copy_from_slice(&REJECT_MAGIC);
        let (code, oc, tc, ov, tv) = match *self {
            RejectReason::ClusterMismatch { ours, theirs } => (1u16, ours, theirs, 0, 0),
            RejectReason::VersionMismatch { ours, theirs } => (2, 0, 0, ours, theirs),
            RejectReason::Malformed => (3, 0, 0, 0, 0),
            RejectReason::Unspecified { .. } => (4, 0, 0, 0, 0),
            RejectReason::NotReady => (5, 0, 0, 0, 0),
        };
        b[4..6].copy_from_slice(&code.to_le_bytes());
        b[8..16].copy_from_slice(&oc.to_le_bytes());
        b[16..24].copy_from_slice(&tc.to_le_bytes());
        b[24..26].copy_from_slice(&ov.to_le_bytes());
        b[26..28].copy_from_slice(&tv.to_le_bytes());
        b
    }

    /// Decodes reject private data; `status` is the CM event status for foreign rejects.
    pub fn decode(b: &[u8], status: i32) -> RejectReason {
        if b.len() < REJECT_DATA_LEN || b[0..4] != REJECT_MAGIC {
            return RejectReason::Unspecified { status };
        }
        let u16_at = |o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
        match u16_at(4) {
            1 => RejectReason::ClusterMismatch {
                ours: u64_at(8),
                theirs: u64_at(16),
            },
            2 => RejectReason::VersionMismatch {
                ours: u16_at(24),
                theirs: u16_at(26),
            },
            3 => RejectReason::Malformed,
            5 => RejectReason::NotReady,
            _ => RejectReason::Unspecified { status },
        }
    }
}

/// Time for an RC QP to declare its peer dead: `nominal` = (retry_cnt + 1) × 4.096 µs ×
/// 2^timeout; the IBTA lets a device wait up to 4× per try, so `upper` is 4× nominal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeadPeerBound {
    /// Nominal detection time.
    pub nominal: Duration,
    /// Upper bound the spec allows.
    pub upper: Duration,
}

/// Computes the dead-peer detection bound for a QP's `timeout` exponent and `retry_cnt`.
pub fn dead_peer_bound(timeout: u8, retry_cnt: u8) -> DeadPeerBound {
    let per_try_ns = 4096u128 << timeout.min(31);
    let nominal_ns = per_try_ns * (u128::from(retry_cnt) + 1);
    let nominal = Duration::from_nanos(nominal_ns.min(u64::MAX as u128) as u64);
    DeadPeerBound {
        nominal,
        upper: nominal * 4,
    }
}

/// Connection-manager settings.
#[derive(Debug, Clone, Copy)]
pub struct ConnectConfig {
    /// Bound on every wait for a CM event.
    pub event_timeout: Duration,
    /// Address and route resolution timeout handed to rdma_cm.
    pub resolve_timeout: Duration,
}

impl Default for ConnectConfig {
    fn default() -> Self {
        ConnectConfig {
            event_timeout: Duration::from_secs(10),
            resolve_timeout: Duration::from_secs(5),
        }
    }
}

/// An rdma_cm event channel, non-blocking, destroyed after the ids on it.
#[derive(Debug)]
struct EventChannel {
    ch: *mut sys::rdma_event_channel,
}

impl EventChannel {
    fn new() -> Result<EventChannel> {
        // SAFETY: no preconditions; returns a new channel or null.
        let ch = unsafe { sys::rdma_create_event_channel() };
        if ch.is_null() {
            return Err(Error::verbs("rdma_create_event_channel", "-", 0, "-", -1));
        }
        let chan = EventChannel { ch };
        // SAFETY: the channel is live.
        let fd = unsafe { (*ch).fd };
        sys::set_nonblocking(fd)
            .map_err(|e| Error::io("fcntl(O_NONBLOCK) on cm channel", "-", 0, "-", e))?;
        Ok(chan)
    }

    /// Waits up to `timeout` for the next event.
    fn next(
        &self,
        timeout: Duration,
        op: &'static str,
        expected: &'static str,
        peer: &str,
    ) -> Result<CmEvent> {
        let deadline = Instant::now() + timeout;
        loop {
            let mut ev: *mut sys::rdma_cm_event = std::ptr::null_mut();
            // SAFETY: the channel is live and non-blocking; `ev` is a valid out-pointer.
            let rc = unsafe { sys::rdma_get_cm_event(self.ch, &mut ev) };
            if rc == 0 {
                return Ok(CmEvent { ev });
            }
            let e = sys::last_os_error();
            if e.kind() != std::io::ErrorKind::WouldBlock {
                return Err(Error::io("rdma_get_cm_event", "-", 0, peer, e));
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::CmTimeout {
                    op,
                    expected,
                    peer: peer.to_owned(),
                    waited: timeout,
                });
            }
            // SAFETY: the channel is live.
            let fd = unsafe { (*self.ch).fd };
            sys::wait_readable(fd, deadline - now)
                .map_err(|e| Error::io("poll(cm channel)", "-", 0, peer, e))?;
        }
    }
}

impl Drop for EventChannel {
    fn drop(&mut self) {
        // SAFETY: every id on this channel is destroyed before (field order in the owners)
        // and every event was acked (CmEvent acks on drop); destroyed exactly once.
        unsafe { sys::rdma_destroy_event_channel(self.ch) };
    }
}

/// A received CM event; acknowledged when dropped (rdma_destroy_id waits for that).
#[derive(Debug)]
struct CmEvent {
    ev: *mut sys::rdma_cm_event,
}

impl CmEvent {
    fn kind(&self) -> u32 {
        // SAFETY: the event is live until acked in Drop.
        unsafe { (*self.ev).event }
    }
    fn status(&self) -> i32 {
        // SAFETY: as above.
        unsafe { (*self.ev).status }
    }
    fn id(&self) -> *mut sys::rdma_cm_id {
        // SAFETY: as above.
        unsafe { (*self.ev).id }
    }
    fn name(&self) -> String {
        // SAFETY: rdma_event_str returns a static string for any value.
        unsafe { sys::cstr(sys::rdma_event_str(self.kind())) }
    }
    /// Copies the connection private data out of the event.
    fn private_data(&self) -> Vec<u8> {
        // SAFETY: for connection events `param.conn` is the active member; its pointer and
        // length describe a buffer owned by the event until it is acked.
        unsafe {
            let conn = (*self.ev).param.conn;
            if conn.private_data.is_null() {
                return Vec::new();
            }
            std::slice::from_raw_parts(
                conn.private_data.cast::<u8>(),
                usize::from(conn.private_data_len),
            )
            .to_vec()
        }
    }
    fn conn_param(&self) -> sys::rdma_conn_param {
        // SAFETY: connection events carry `param.conn`; it is plain data we copy.
        unsafe { (*self.ev).param.conn }
    }
    fn unexpected(&self, op: &'static str, expected: &'static str, peer: &str) -> Error {
        Error::CmUnexpected {
            op,
            expected,
            event: self.name(),
            status: self.status(),
            peer: peer.to_owned(),
        }
    }
}

impl Drop for CmEvent {
    fn drop(&mut self) {
        // SAFETY: the event came from rdma_get_cm_event and is acked exactly once.
        unsafe { sys::rdma_ack_cm_event(self.ev) };
    }
}

/// An owned rdma_cm id.
#[derive(Debug)]
struct CmId {
    id: *mut sys::rdma_cm_id,
}

impl Drop for CmId {
    fn drop(&mut self) {
        // SAFETY: the id is live, has no QP attached (we never use rdma_create_qp), its
        // events were acked; destroyed exactly once.
        unsafe { sys::rdma_destroy_id(self.id) };
    }
}

impl CmId {
    fn new(ch: &EventChannel) -> Result<CmId> {
        let mut id: *mut sys::rdma_cm_id = std::ptr::null_mut();
        // SAFETY: the channel is live; `id` is a valid out-pointer.
        let rc = unsafe {
            sys::rdma_create_id(
                ch.ch,
                &mut id,
                std::ptr::null_mut(),
                sys::rdma_port_space::RDMA_PS_TCP,
            )
        };
        if rc != 0 {
            return Err(Error::verbs("rdma_create_id", "-", 0, "-", rc));
        }
        Ok(CmId { id })
    }

    fn verbs(&self) -> *mut sys::ibv_context {
        // SAFETY: the id is live.
        unsafe { (*self.id).verbs }
    }

    fn set_ack_timeout(&self, timeout: u8, dev: &str, peer: &str) -> Result<()> {
        let mut v = timeout;
        // SAFETY: the id is live; the option value is a u8 as rdma_cma.h specifies for
        // RDMA_OPTION_ID_ACK_TIMEOUT, passed with its size.
        let rc = unsafe {
            sys::rdma_set_option(
                self.id,
                sys::RDMA_OPTION_ID,
                sys::RDMA_OPTION_ID_ACK_TIMEOUT,
                (&mut v as *mut u8).cast(),
                1,
            )
        };
        if rc != 0 {
            return Err(Error::verbs(
                "rdma_set_option(ACK_TIMEOUT)",
                dev,
                0,
                peer,
                rc,
            ));
        }
        Ok(())
    }

    fn check_device(&self, pd: &ProtectionDomain, peer: &str) -> Result<()> {
        let v = self.verbs();
        if v != pd.context().as_ptr() {
            let actual = if v.is_null() {
                "(none)".to_owned()
            } else {
                // SAFETY: a non-null verbs pointer of a live id is a live context whose device
                // name is a NUL-terminated array.
                unsafe { sys::cstr((*(*v).device).name.as_ptr()) }
            };
            return Err(Error::WrongDevice {
                expected: pd.context().name().to_owned(),
                actual,
                peer: peer.to_owned(),
            });
        }
        Ok(())
    }

    /// Asks the CM for the attributes of `state`, lets `adjust` override them, and applies
    /// them to `qp`.
    fn transition(
        &self,
        qp: &QueuePair,
        state: u32,
        op: &'static str,
        peer: &str,
        adjust: impl FnOnce(&mut sys::ibv_qp_attr, &mut u32),
    ) -> Result<()> {
        // SAFETY: plain data; zero is valid.
        let mut attr: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.qp_state = state;
        let mut mask: libc::c_int = 0;
        // SAFETY: the id is live and connected far enough for `state` (callers order the
        // calls after the matching CM events); `attr`/`mask` are valid out-pointers.
        let rc = unsafe { sys::rdma_init_qp_attr(self.id, &mut attr, &mut mask) };
        if rc != 0 {
            return Err(Error::verbs(
                "rdma_init_qp_attr",
                qp.pd().context().name(),
                0,
                peer,
                rc,
            ));
        }
        let mut mask = mask as u32;
        adjust(&mut attr, &mut mask);
        qp.modify_raw(&mut attr, mask, op)
    }
}

fn to_sockaddr(addr: SocketAddr) -> libc::sockaddr_storage {
    // SAFETY: sockaddr_storage is plain data; zero is valid.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and suitably aligned for sockaddr_in.
            unsafe { std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin) };
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than and suitably aligned for sockaddr_in6.
            unsafe { std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin6) };
        }
    }
    ss
}

/// The peer address of a cm id, as text for errors and logs.
fn peer_of(id: *mut sys::rdma_cm_id) -> String {
    // SAFETY: the id is live; route.addr.dst_addr_union holds a sockaddr whose family says
    // which member is valid.
    unsafe {
        let dst = &(*id).route.addr.dst_addr_union;
        match i32::from(dst.dst_addr.sa_family) {
            libc::AF_INET => {
                let s = dst.dst_sin;
                let ip = std::net::Ipv4Addr::from(u32::from_be(s.sin_addr.s_addr));
                format!("{ip}:{}", u16::from_be(s.sin_port))
            }
            libc::AF_INET6 => {
                let s = dst.dst_sin6;
                format!(
                    "[{}]:{}",
                    std::net::Ipv6Addr::from(s.sin6_addr.s6_addr),
                    u16::from_be(s.sin6_port)
                )
            }
            _ => "?".to_owned(),
        }
    }
}

/// A connected RC queue pair with its cm id.
///
/// Drop order (field order): the QP is destroyed first, then the cm id, then its event
/// channel. Keep any `MemoryRegion` the peer may write declared *after* the connection in
/// your own structs, so the QP goes before the MR.
#[derive(Debug)]
pub struct Connection {
    qp: QueuePair,
    id: CmId,
    channel: EventChannel,
    peer: String,
    remote: Hello,
    disconnected: bool,
}

// SAFETY: the cm id and channel are only used through &mut self (disconnect, close) or in
// Drop; librdmacm calls are thread-safe; the QP is Send + Sync itself.
unsafe impl Send for Connection {}
// SAFETY: shared access only reaches the QP (Sync) and immutable fields.
unsafe impl Sync for Connection {}

impl Connection {
    /// The queue pair.
    pub fn qp(&self) -> &QueuePair {
        &self.qp
    }
    /// What the peer said at connect (its region, credits, node id).
    pub fn remote(&self) -> &Hello {
        &self.remote
    }
    /// The peer's address.
    pub fn peer(&self) -> &str {
        &self.peer
    }

    /// Connects to `dst` (optionally from `src`), exchanging hellos. `prepare` runs once the
    /// QP is in INIT and before the connect request goes out: post the receives there that
    /// `hello.recv_credits` promises.
    #[allow(clippy::too_many_arguments)] // reason: the connect needs every one of these
    pub fn connect(
        pd: &Arc<ProtectionDomain>,
        send_cq: &Arc<CompletionQueue>,
        recv_cq: &Arc<CompletionQueue>,
        qp_cfg: QpConfig,
        cfg: &ConnectConfig,
        src: Option<IpAddr>,
        dst: SocketAddr,
        hello: &Hello,
        prepare: impl FnOnce(&QueuePair) -> Result<()>,
    ) -> Result<Connection> {
        let peer = dst.to_string();
        let dev = pd.context().name().to_owned();
        let channel = EventChannel::new()?;
        let id = CmId::new(&channel)?;
        let mut dst_ss = to_sockaddr(dst);
        let mut src_ss = src.map(|ip| to_sockaddr(SocketAddr::new(ip, 0)));
        let src_ptr = src_ss.as_mut().map_or(std::ptr::null_mut(), |s| {
            (s as *mut libc::sockaddr_storage).cast()
        });
        let ms = cfg.resolve_timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: the id is live; both sockaddrs are valid for the call (rdma_cm copies them).
        let rc = unsafe {
            sys::rdma_resolve_addr(
                id.id,
                src_ptr,
                (&mut dst_ss as *mut libc::sockaddr_storage).cast(),
                ms,
            )
        };
        if rc != 0 {
            return Err(Error::verbs("rdma_resolve_addr", &dev, 0, &peer, rc));
        }
        let ev = channel.next(cfg.event_timeout, "connect", "ADDR_RESOLVED", &peer)?;
        if ev.kind() != sys::rdma_cm_event_type::RDMA_CM_EVENT_ADDR_RESOLVED {
            return Err(ev.unexpected("connect", "ADDR_RESOLVED", &peer));
        }
        drop(ev);
        id.check_device(pd, &peer)?;
        id.set_ack_timeout(qp_cfg.timeout, &dev, &peer)?;
        // SAFETY: the id is live with a resolved address.
        let rc = unsafe { sys::rdma_resolve_route(id.id, ms) };
        if rc != 0 {
            return Err(Error::verbs("rdma_resolve_route", &dev, 0, &peer, rc));
        }
        let ev = channel.next(cfg.event_timeout, "connect", "ROUTE_RESOLVED", &peer)?;
        if ev.kind() != sys::rdma_cm_event_type::RDMA_CM_EVENT_ROUTE_RESOLVED {
            return Err(ev.unexpected("connect", "ROUTE_RESOLVED", &peer));
        }
        drop(ev);

        let qp = QueuePair::new(pd, send_cq, recv_cq, qp_cfg)?;
        let access = qp_cfg.access.bits();
        id.transition(
            &qp,
            sys::ibv_qp_state::IBV_QPS_INIT,
            "ibv_modify_qp(RESET->INIT)",
            &peer,
            |a, m| {
                a.qp_access_flags = access;
                *m |= sys::ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS.0;
            },
        )?;

        // Receives go in now, before the peer can learn our credits and send.
        prepare(&qp)?;
        let data = hello.encode();
        // SAFETY: plain data; zero is valid.
        let mut param: sys::rdma_conn_param = unsafe { std::mem::zeroed() };
        param.private_data = data.as_ptr().cast();
        param.private_data_len = PRIVATE_DATA_LEN as u8;
        param.responder_resources = qp_cfg.max_dest_rd_atomic;
        param.initiator_depth = qp_cfg.max_rd_atomic;
        param.flow_control = 1;
        param.retry_count = qp_cfg.retry_cnt;
        param.rnr_retry_count = qp_cfg.rnr_retry;
        param.qp_num = qp.qp_num();
        // SAFETY: the id is route-resolved; `param` and the private data it points to live
        // for the call (the kernel copies them).
        let rc = unsafe { sys::rdma_connect(id.id, &mut param) };
        if rc != 0 {
            return Err(Error::verbs("rdma_connect", &dev, 0, &peer, rc));
        }
        let ev = channel.next(cfg.event_timeout, "connect", "CONNECT_RESPONSE", &peer)?;
        use sys::rdma_cm_event_type as t;
        match ev.kind() {
            t::RDMA_CM_EVENT_CONNECT_RESPONSE => {}
            t::RDMA_CM_EVENT_REJECTED => {
                let reason = RejectReason::decode(&ev.private_data(), ev.status());
                if reason == RejectReason::NotReady {
                    tracing::debug!(peer, %reason, "connect rejected by peer");
                } else {
                    tracing::warn!(peer, %reason, "connect rejected by peer");
                }
                return Err(Error::Rejected { peer, reason });
            }
            _ => return Err(ev.unexpected("connect", "CONNECT_RESPONSE", &peer)),
        }
        let remote = Hello::decode(&ev.private_data()).map_err(|detail| Error::BadPrivateData {
            peer: peer.clone(),
            detail,
        })?;
        let responder = ev.conn_param().responder_resources;
        drop(ev);
        if let Err(reason) = hello.check_peer(&remote) {
            let rej = reason.encode();
            // SAFETY: the id is live in REP-received state; the reject data lives for the call.
            unsafe { sys::rdma_reject(id.id, rej.as_ptr().cast(), rej.len() as u8) };
            tracing::warn!(peer, %reason, "refusing accepting peer");
            return Err(Error::RefusedPeer { peer, reason });
        }
        bring_up(
            &id,
            &qp,
            &qp_cfg,
            &peer,
            qp_cfg.max_dest_rd_atomic,
            qp_cfg.max_rd_atomic.min(responder.max(1)),
        )?;
        // SAFETY: the id is live and its QP (ours, driven manually) is in RTS.
        let rc = unsafe { sys::rdma_establish(id.id) };
        if rc != 0 {
            return Err(Error::verbs("rdma_establish", &dev, 0, &peer, rc));
        }
        Ok(Connection {
            qp,
            id,
            channel,
            peer,
            remote,
            disconnected: false,
        })
    }

    /// Waits up to `timeout` for the peer to disconnect. Returns whether it did.
    pub fn wait_disconnected(&mut self, timeout: Duration) -> Result<bool> {
        if self.disconnected {
            return Ok(true);
        }
        match self
            .channel
            .next(timeout, "wait for disconnect", "DISCONNECTED", &self.peer)
        {
            Ok(ev) => {
                if ev.kind() == sys::rdma_cm_event_type::RDMA_CM_EVENT_DISCONNECTED {
                    self.disconnected = true;
                }
                Ok(self.disconnected)
            }
            Err(Error::CmTimeout { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Disconnects: moves the QP to ERROR (flushing outstanding WRs), sends DREQ and waits
    /// (bounded) for the CM to confirm.
    pub fn disconnect(&mut self, timeout: Duration) -> Result<()> {
        self.qp.to_error()?;
        if self.disconnected {
            return Ok(());
        }
        // SAFETY: the id is live.
        let rc = unsafe { sys::rdma_disconnect(self.id.id) };
        if rc != 0 {
            return Err(Error::verbs(
                "rdma_disconnect",
                self.qp.pd().context().name(),
                0,
                &self.peer,
                rc,
            ));
        }
        self.wait_disconnected(timeout)?;
        Ok(())
    }

    /// Disconnects and destroys the QP and cm id, reporting the first failure.
    pub fn close(mut self, timeout: Duration) -> Result<()> {
        let r = self.disconnect(timeout);
        let Connection {
            qp, id, channel, ..
        } = self;
        let q = qp.close();
        drop(id);
        drop(channel);
        r.and(q)
    }
}

/// INIT→RTR→RTS from the CM's path attributes plus our overrides.
fn bring_up(
    id: &CmId,
    qp: &QueuePair,
    cfg: &QpConfig,
    peer: &str,
    dest_rd_atomic: u8,
    rd_atomic: u8,
) -> Result<()> {
    use sys::ibv_qp_attr_mask as m;
    let mtu = cfg.path_mtu.to_raw();
    let (min_rnr, timeout, retry, rnr) =
        (cfg.min_rnr_timer, cfg.timeout, cfg.retry_cnt, cfg.rnr_retry);
    id.transition(
        qp,
        sys::ibv_qp_state::IBV_QPS_RTR,
        "ibv_modify_qp(INIT->RTR)",
        peer,
        |a, mask| {
            // Never exceed the path's MTU: take the lower of ours and the CM's.
            a.path_mtu = a.path_mtu.min(mtu);
            a.min_rnr_timer = min_rnr;
            a.max_dest_rd_atomic = dest_rd_atomic;
            *mask |=
                (m::IBV_QP_PATH_MTU | m::IBV_QP_MIN_RNR_TIMER | m::IBV_QP_MAX_DEST_RD_ATOMIC).0;
        },
    )?;
    id.transition(
        qp,
        sys::ibv_qp_state::IBV_QPS_RTS,
        "ibv_modify_qp(RTR->RTS)",
        peer,
        |a, mask| {
            a.timeout = timeout;
            a.retry_cnt = retry;
            a.rnr_retry = rnr;
            a.max_rd_atomic = rd_atomic;
            *mask |= (m::IBV_QP_TIMEOUT
                | m::IBV_QP_RETRY_CNT
                | m::IBV_QP_RNR_RETRY
                | m::IBV_QP_MAX_QP_RD_ATOMIC)
                .0;
        },
    )
}

/// A listening cm id. Field order is drop order: the id before its channel.
#[derive(Debug)]
pub struct Listener {
    /// Kept for its Drop (destroys the listening id before `channel`).
    _id: CmId,
    channel: EventChannel,
    ctx: Arc<Context>,
    addr: SocketAddr,
}

// SAFETY: the listening id and channel are used only through &self for get_cm_event, which
// librdmacm serialises internally, and destroyed in Drop.
unsafe impl Send for Listener {}
// SAFETY: as above.
unsafe impl Sync for Listener {}

impl Listener {
    /// Binds to `addr` (an address on `ctx`'s netdev) and listens.
    pub fn bind(ctx: &Arc<Context>, addr: SocketAddr, backlog: i32) -> Result<Listener> {
        let channel = EventChannel::new()?;
        let id = CmId::new(&channel)?;
        let mut ss = to_sockaddr(addr);
        let me = addr.to_string();
        // SAFETY: the id is live; the sockaddr is valid for the call.
        let rc =
            unsafe { sys::rdma_bind_addr(id.id, (&mut ss as *mut libc::sockaddr_storage).cast()) };
        if rc != 0 {
            return Err(Error::verbs("rdma_bind_addr", ctx.name(), 0, &me, rc));
        }
        if !id.verbs().is_null() && id.verbs() != ctx.as_ptr() {
            // SAFETY: non-null verbs of a live id is a live context.
            let actual = unsafe { sys::cstr((*(*id.verbs()).device).name.as_ptr()) };
            return Err(Error::WrongDevice {
                expected: ctx.name().to_owned(),
                actual,
                peer: me,
            });
        }
        // SAFETY: the id is bound.
        let rc = unsafe { sys::rdma_listen(id.id, backlog) };
        if rc != 0 {
            return Err(Error::verbs("rdma_listen", ctx.name(), 0, &me, rc));
        }
        Ok(Listener {
            _id: id,
            channel,
            ctx: ctx.clone(),
            addr,
        })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Waits (bounded) for one connect request; rejects it with the reason if its hello does
    /// not match ours (returning [`Error::RefusedPeer`]), else brings a QP up and accepts.
    /// `prepare` runs with the QP in INIT, before the accept goes out: post the receives that
    /// `hello.recv_credits` promises there.
    #[allow(clippy::too_many_arguments)] // reason: the accept needs every one of these
    pub fn accept(
        &self,
        pd: &Arc<ProtectionDomain>,
        send_cq: &Arc<CompletionQueue>,
        recv_cq: &Arc<CompletionQueue>,
        qp_cfg: QpConfig,
        cfg: &ConnectConfig,
        hello: &Hello,
        prepare: impl FnOnce(&QueuePair) -> Result<()>,
    ) -> Result<Connection> {
        self.accept_within(
            cfg.event_timeout,
            pd,
            send_cq,
            recv_cq,
            qp_cfg,
            cfg,
            &|| Ok(*hello),
            prepare,
        )
    }

    /// Like [`Listener::accept`], but waits at most `request_wait` for the connect request
    /// (returning [`Error::CmTimeout`] when none came), while the rest of the
    /// handshake keeps `cfg.event_timeout`. A connection-manager thread polls with a short
    /// `request_wait` so it can also serve outgoing connects.
    ///
    /// `hello` is asked for our hello only once a request has arrived, so it reflects the
    /// owner's state at that moment (e.g. a region advertised while we waited). It returns
    /// `Err(reason)` to refuse the request (e.g. [`RejectReason::NotReady`] before the owner
    /// has advertised anything); the dialer learns the reason at once, and the call returns
    /// [`Error::RefusedPeer`].
    #[allow(clippy::too_many_arguments)] // reason: accept's parameters plus the wait
    pub fn accept_within(
        &self,
        request_wait: Duration,
        pd: &Arc<ProtectionDomain>,
        send_cq: &Arc<CompletionQueue>,
        recv_cq: &Arc<CompletionQueue>,
        qp_cfg: QpConfig,
        cfg: &ConnectConfig,
        hello: &dyn Fn() -> std::result::Result<Hello, RejectReason>,
        prepare: impl FnOnce(&QueuePair) -> Result<()>,
    ) -> Result<Connection> {
        let me = self.addr.to_string();
        let ev = self
            .channel
            .next(request_wait, "accept", "CONNECT_REQUEST", &me)?;
        if ev.kind() != sys::rdma_cm_event_type::RDMA_CM_EVENT_CONNECT_REQUEST {
            return Err(ev.unexpected("accept", "CONNECT_REQUEST", &me));
        }
        // The new id is ours from here on: wrap it so every error path destroys it.
        let id = CmId { id: ev.id() };
        let peer = peer_of(id.id);
        let data = ev.private_data();
        let req = ev.conn_param();
        drop(ev); // ack before migrating: rdma_migrate_id waits for the id's events to be acked
        let theirs = match Hello::decode(&data) {
            Ok(h) => h,
            Err(detail) => {
                let rej = RejectReason::Malformed.encode();
                // SAFETY: the id is live in connect-request state; data lives for the call.
                unsafe { sys::rdma_reject(id.id, rej.as_ptr().cast(), rej.len() as u8) };
                tracing::warn!(peer, detail, "rejected connect with malformed private data");
                return Err(Error::BadPrivateData { peer, detail });
            }
        };
        // Refuses the request with `reason`, so the dialer learns it at once.
        let refuse = |reason: RejectReason| -> Error {
            let rej = reason.encode();
            // SAFETY: the id is live in connect-request state and its event was acked; `rej`
            // lives for the call. The CmId wrapper destroys the id afterwards.
            let rc = unsafe { sys::rdma_reject(id.id, rej.as_ptr().cast(), rej.len() as u8) };
            if rc != 0 {
                return Error::verbs("rdma_reject", self.ctx.name(), 0, &peer, rc);
            }
            Error::RefusedPeer {
                peer: peer.clone(),
                reason,
            }
        };
        let hello = match hello() {
            Ok(h) => h,
            Err(reason) => {
                tracing::debug!(peer, %reason, "refused a connect request");
                return Err(refuse(reason));
            }
        };
        if let Err(reason) = hello.check_peer(&theirs) {
            tracing::warn!(peer, %reason, "rejected incoming connection");
            return Err(refuse(reason));
        }
        let channel = EventChannel::new()?;
        // SAFETY: the id is live and its only event was acked; the channel is live.
        let rc = unsafe { sys::rdma_migrate_id(id.id, channel.ch) };
        if rc != 0 {
            return Err(Error::verbs(
                "rdma_migrate_id",
                self.ctx.name(),
                0,
                &peer,
                rc,
            ));
        }
        id.check_device(pd, &peer)?;
        id.set_ack_timeout(qp_cfg.timeout, pd.context().name(), &peer)?;
        let qp = QueuePair::new(pd, send_cq, recv_cq, qp_cfg)?;
        let access = qp_cfg.access.bits();
        id.transition(
            &qp,
            sys::ibv_qp_state::IBV_QPS_INIT,
            "ibv_modify_qp(RESET->INIT)",
            &peer,
            |a, m| {
                a.qp_access_flags = access;
                *m |= sys::ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS.0;
            },
        )?;
        let dest_rd = qp_cfg.max_dest_rd_atomic.max(req.initiator_depth);
        let rd = qp_cfg.max_rd_atomic.min(req.responder_resources.max(1));
        prepare(&qp)?;
        bring_up(&id, &qp, &qp_cfg, &peer, dest_rd, rd)?;
        let data = hello.encode();
        // SAFETY: plain data; zero is valid.
        let mut param: sys::rdma_conn_param = unsafe { std::mem::zeroed() };
        param.private_data = data.as_ptr().cast();
        param.private_data_len = PRIVATE_DATA_LEN as u8;
        param.responder_resources = dest_rd;
        param.initiator_depth = rd;
        param.flow_control = 1;
        param.retry_count = qp_cfg.retry_cnt;
        param.rnr_retry_count = qp_cfg.rnr_retry;
        param.qp_num = qp.qp_num();
        // SAFETY: the id is in connect-request state on our channel; `param` and its private
        // data live for the call; the QP it names is in RTS.
        let rc = unsafe { sys::rdma_accept(id.id, &mut param) };
        if rc != 0 {
            return Err(Error::verbs("rdma_accept", self.ctx.name(), 0, &peer, rc));
        }
        let ev = channel.next(cfg.event_timeout, "accept", "ESTABLISHED", &peer)?;
        if ev.kind() != sys::rdma_cm_event_type::RDMA_CM_EVENT_ESTABLISHED {
            return Err(ev.unexpected("accept", "ESTABLISHED", &peer));
        }
        drop(ev);
        Ok(Connection {
            qp,
            id,
            channel,
            peer,
            remote: theirs,
            disconnected: false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A range is checked against the advertised length and against the address space: a
    /// peer advertising a region at the top of it cannot make `addr + offset` wrap.
    #[test]
    fn a_remote_range_must_fit_the_region_and_the_address_space() {
        let r = RemoteRegion {
            addr: 1 << 20,
            rkey: 1,
            len: 4096,
        };
        assert!(r.check(0, 4096).is_ok());
        assert!(r.check(4000, 97).is_err());
        assert!(r.check(u64::MAX, 2).is_err());
        let top = RemoteRegion {
            addr: u64::MAX - 100,
            rkey: 1,
            len: 4096,
        };
        assert!(top.check(0, 100).is_ok());
        assert!(top.check(0, 101).is_err());
        assert!(top.check(50, 100).is_err(), "addr + offset + len wraps");
    }

    fn hello() -> Hello {
        Hello {
            cluster_id: 0xC1u64 << 40 | 7,
            node_id: 3,
            version: PROTOCOL_VERSION,
            region: RemoteRegion {
                addr: 0x7f00_dead_b000,
                rkey: 0x1234,
                len: 1 << 20,
            },
            recv_credits: 64,
        }
    }

    #[test]
    fn hello_round_trips_and_tolerates_padding() {
        let h = hello();
        let b = h.encode();
        assert_eq!(b.len(), PRIVATE_DATA_LEN);
        assert_eq!(Hello::decode(&b).unwrap(), h);
        // rdma_cm hands the receiver the whole CM private-data area (56 B for a REQ).
        let mut padded = [0u8; RC_CONNECT_PRIVATE_DATA_MAX];
        padded[..PRIVATE_DATA_LEN].copy_from_slice(&b);
        assert_eq!(Hello::decode(&padded).unwrap(), h);
    }

    #[test]
    fn hello_rejects_short_or_foreign_data() {
        assert!(Hello::decode(&[0u8; 10]).is_err());
        let mut b = hello().encode();
        b[0] = b'X';
        assert!(Hello::decode(&b).unwrap_err().contains("magic"));
    }

    #[test]
    fn hello_layout_is_little_endian_at_fixed_offsets() {
        let b = hello().encode();
        assert_eq!(&b[0..4], b"RLOG");
        assert_eq!(u16::from_le_bytes([b[4], b[5]]), PROTOCOL_VERSION);
        assert_eq!(u32::from_le_bytes(b[32..36].try_into().unwrap()), 0x1234);
        assert_eq!(u64::from_le_bytes(b[40..48].try_into().unwrap()), 1 << 20);
    }

    #[test]
    fn cluster_and_version_checks() {
        let ours = hello();
        assert_eq!(ours.check_peer(&ours), Ok(()));
        let other = Hello {
            cluster_id: 99,
            ..ours
        };
        assert_eq!(
            ours.check_peer(&other),
            Err(RejectReason::ClusterMismatch {
                ours: ours.cluster_id,
                theirs: 99
            })
        );
        let newer = Hello {
            version: PROTOCOL_VERSION + 1,
            ..ours
        };
        assert_eq!(
            ours.check_peer(&newer),
            Err(RejectReason::VersionMismatch {
                ours: PROTOCOL_VERSION,
                theirs: PROTOCOL_VERSION + 1
            })
        );
    }

    #[test]
    fn reject_reason_round_trips_and_reads_as_a_sentence() {
        for r in [
            RejectReason::ClusterMismatch { ours: 1, theirs: 2 },
            RejectReason::VersionMismatch { ours: 1, theirs: 3 },
            RejectReason::Malformed,
            RejectReason::NotReady,
        ] {
            let mut padded = [0u8; REJECT_PRIVATE_DATA_MAX];
            padded[..REJECT_DATA_LEN].copy_from_slice(&r.encode());
            assert_eq!(RejectReason::decode(&padded, 28), r);
        }
        assert_eq!(
            RejectReason::decode(&[], 28),
            RejectReason::Unspecified { status: 28 }
        );
        let s = RejectReason::ClusterMismatch { ours: 1, theirs: 2 }.to_string();
        assert!(
            s.contains("cluster id mismatch") && s.contains("0x1") && s.contains("0x2"),
            "{s}"
        );
        let e = Error::Rejected {
            peer: "192.0.2.12:7000".into(),
            reason: RejectReason::VersionMismatch { ours: 1, theirs: 2 },
        };
        assert_eq!(
            e.to_string(),
            "peer 192.0.2.12:7000 rejected the connection: protocol version mismatch: the rejecting node speaks version 1, the connecting node version 2"
        );
    }

    #[test]
    fn dead_peer_bound_arithmetic() {
        // timeout 14, retry 6 (the default; 7 is refused, Soft-RoCE retries forever at 7):
        // 7 × 4.096 µs × 16384 = 469.762048 ms.
        let b = dead_peer_bound(14, 6);
        assert_eq!(b.nominal, Duration::from_nanos(469_762_048));
        assert_eq!(b.upper, b.nominal * 4);
        assert_eq!(dead_peer_bound(0, 0).nominal, Duration::from_nanos(4096));
        assert_eq!(
            dead_peer_bound(12, 3).nominal,
            Duration::from_nanos(4 * 4096 * 4096)
        );
        // No overflow at the extremes.
        assert!(dead_peer_bound(31, 7).nominal > Duration::from_secs(60_000));
    }

    #[test]
    fn remote_region_bounds() {
        let r = RemoteRegion {
            addr: 0,
            rkey: 1,
            len: 100,
        };
        assert!(r.check(0, 100).is_ok());
        assert!(r.check(1, 100).is_err());
        assert!(r.check(u64::MAX, 2).is_err());
    }
}
