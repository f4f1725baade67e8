//! Reliable-connected queue pairs: explicit state transitions, live access-flag changes (the
//! fencing primitive) and the posting data path with a periodic-signal policy.
//!
//! Send-side WR ids belong to this crate: every Send/Write gets the QP's next sequence
//! number (returned by the post call, and echoed as [`Completion::wr_id`]). Because an RC
//! send queue completes in order, a completion for sequence `s` retires every WR up to `s`
//! ([`QueuePair::retire`]), signaled or not. That is what lets most WRs go unsignaled without
//! the send queue ever overflowing.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::RemoteRegion;
use crate::cq::{Completion, CompletionQueue};
use crate::error::{Error, Result};
use crate::mr::{AccessFlags, MemoryRegion, ProtectionDomain, RegistrableMemory};
use crate::sys;

/// Path MTU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Mtu {
    /// 256 bytes.
    M256,
    /// 512 bytes.
    M512,
    /// 1024 bytes (rxe's usual active MTU on a 1500-byte netdev).
    M1024,
    /// 2048 bytes.
    M2048,
    /// 4096 bytes.
    M4096,
}

impl Mtu {
    /// Maps `enum ibv_mtu`; unknown values map to the smallest MTU.
    pub fn from_raw(v: u32) -> Mtu {
        use sys::ibv_mtu as m;
        match v {
            m::IBV_MTU_512 => Mtu::M512,
            m::IBV_MTU_1024 => Mtu::M1024,
            m::IBV_MTU_2048 => Mtu::M2048,
            m::IBV_MTU_4096 => Mtu::M4096,
            _ => Mtu::M256,
        }
    }
    /// The `enum ibv_mtu` value.
    pub fn to_raw(self) -> u32 {
        use sys::ibv_mtu as m;
        match self {
            Mtu::M256 => m::IBV_MTU_256,
            Mtu::M512 => m::IBV_MTU_512,
            Mtu::M1024 => m::IBV_MTU_1024,
            Mtu::M2048 => m::IBV_MTU_2048,
            Mtu::M4096 => m::IBV_MTU_4096,
        }
    }
    /// Bytes.
    pub fn bytes(self) -> u32 {
        256 << (self as u32)
    }
}

/// QP state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QpState {
    /// Reset.
    Reset,
    /// Initialised.
    Init,
    /// Ready to receive.
    Rtr,
    /// Ready to send.
    Rts,
    /// Send queue drained.
    Sqd,
    /// Send queue error.
    Sqe,
    /// Error: everything outstanding is flushed.
    Error,
    /// Unknown value.
    Unknown(u32),
}

impl QpState {
    /// Maps `enum ibv_qp_state`.
    pub fn from_raw(v: u32) -> QpState {
        use sys::ibv_qp_state as s;
        match v {
            s::IBV_QPS_RESET => QpState::Reset,
            s::IBV_QPS_INIT => QpState::Init,
            s::IBV_QPS_RTR => QpState::Rtr,
            s::IBV_QPS_RTS => QpState::Rts,
            s::IBV_QPS_SQD => QpState::Sqd,
            s::IBV_QPS_SQE => QpState::Sqe,
            s::IBV_QPS_ERR => QpState::Error,
            o => QpState::Unknown(o),
        }
    }
}

/// When to request a completion for a send-side WR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignalPolicy {
    /// Signal every WR.
    All,
    /// Signal every n-th WR (and whenever the send queue's last free slot is taken), so the
    /// queue never overflows while most WRs cost no completion.
    Every(u32),
}

/// Queue pair configuration. Defaults suit rxe and mlx5 for the log's traffic.
#[derive(Debug, Clone, Copy)]
pub struct QpConfig {
    /// Send queue depth (WRs).
    pub sq_depth: u32,
    /// Receive queue depth (WRs).
    pub rq_depth: u32,
    /// Inline data requested; the device may give more (see [`QueuePair::max_inline`]).
    pub max_inline: u32,
    /// Path MTU wanted; the lower of this and the path's is used.
    pub path_mtu: Mtu,
    /// Local ACK timeout exponent: 4.096 µs × 2^timeout per try.
    pub timeout: u8,
    /// Transport retries before `RetryExceeded` (0..=6). The verbs specification allows 7
    /// retries, but Soft-RoCE (`rdma_rxe`) takes 7 as "retry forever" (it counts down only
    /// from values below 7), so a QP whose peer died never failed in the lab: refused, as
    /// `rnr_retry`'s 7 is.
    pub retry_cnt: u8,
    /// RNR retries (0..=6; 7 would mean infinite and is refused).
    pub rnr_retry: u8,
    /// Minimal RNR NAK timer code the responder advertises.
    pub min_rnr_timer: u8,
    /// Outstanding RDMA reads/atomics we initiate.
    pub max_rd_atomic: u8,
    /// Outstanding RDMA reads/atomics we accept.
    pub max_dest_rd_atomic: u8,
    /// Remote access granted on this QP when it is brought up. Defaults to none: a peer may
    /// write only after an explicit grant.
    pub access: AccessFlags,
    /// Signaling policy for Sends and Writes.
    pub signal: SignalPolicy,
}

impl Default for QpConfig {
    fn default() -> Self {
        QpConfig {
            sq_depth: 128,
            rq_depth: 128,
            max_inline: 64,
            path_mtu: Mtu::M1024,
            timeout: 14,
            retry_cnt: 6,
            rnr_retry: 6,
            min_rnr_timer: 12,
            max_rd_atomic: 1,
            max_dest_rd_atomic: 1,
            access: AccessFlags::LOCAL_WRITE,
            signal: SignalPolicy::Every(16),
        }
    }
}

impl QpConfig {
    /// Checks the limits the verbs API imposes.
    pub fn validate(&self) -> Result<()> {
        if self.sq_depth == 0 || self.rq_depth == 0 {
            return Err(Error::InvalidConfig("queue depths must be > 0".into()));
        }
        if self.retry_cnt > 6 {
            return Err(Error::InvalidConfig(format!(
                "retry_cnt {} must be at most 6: Soft-RoCE retries forever at 7, so a dead \
                 peer would never be detected",
                self.retry_cnt
            )));
        }
        if self.rnr_retry > 6 {
            return Err(Error::InvalidConfig(format!(
                "rnr_retry {} would be infinite (7) or invalid; use 0..=6 so RNR is finite",
                self.rnr_retry
            )));
        }
        if self.timeout > 31 {
            return Err(Error::InvalidConfig(format!(
                "timeout exponent {} > 31",
                self.timeout
            )));
        }
        if let SignalPolicy::Every(n) = self.signal
            && (n == 0 || n > self.sq_depth)
        {
            return Err(Error::InvalidConfig(format!(
                "signal every {n} must be in 1..={} (the send queue depth)",
                self.sq_depth
            )));
        }
        Ok(())
    }
}

/// Address and sequence parameters for RTR when not using rdma_cm.
#[derive(Debug, Clone, Copy)]
pub struct RtrParams {
    /// Remote QP number.
    pub dest_qp_num: u32,
    /// Starting receive PSN (the peer's send PSN).
    pub rq_psn: u32,
    /// Remote GID (RoCE v2: IPv4-mapped).
    pub dgid: [u8; 16],
    /// Local GID index (query it, see [`crate::Context::roce_v2_gid_index`]).
    pub sgid_index: u8,
    /// Local port.
    pub port: u8,
}

/// Send-queue accounting: posted and retired WR counts as monotonically increasing
/// sequence numbers. `posted - retired` WRs occupy the queue; it is full at `depth`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SqAccounting {
    pub posted: u64,
    pub depth: u32,
    pub policy: SignalPolicy,
}

impl SqAccounting {
    /// Decides whether WR number `self.posted` may be posted now and whether it is signaled.
    pub fn admit(&self, retired: u64, force_signal: bool) -> std::result::Result<bool, u64> {
        let outstanding = self.posted - retired;
        if outstanding >= u64::from(self.depth) {
            return Err(outstanding);
        }
        let seq = self.posted;
        let signaled = force_signal
            || match self.policy {
                SignalPolicy::All => true,
                SignalPolicy::Every(n) => (seq + 1) % u64::from(n) == 0,
            }
            // The WR that takes the last free slot is always signaled, so a completion that
            // frees the queue is guaranteed to come.
            || outstanding + 1 == u64::from(self.depth);
        Ok(signaled)
    }
}

/// WR sequence numbers each QP has to itself: 2^40 WRs per QP, for 2^22 QPs in turn (then the
/// bases come round again; a QP's numbers past its span overlap the next base's, which
/// matters only if that QP's number is given again while this one's completions still come).
const SEQ_SPAN: u64 = 1 << 40;

/// The first WR sequence number of the next QP created ([`QueuePair`]'s numbering).
static NEXT_SEQ_BASE: AtomicU64 = AtomicU64::new(0);

/// An RC queue pair.
///
/// Drop order: the QP is destroyed in `Drop::drop` before its fields (the CQ and PD
/// references) are released, so the CQs and PD outlive it.
#[derive(Debug)]
pub struct QueuePair {
    qp: *mut sys::ibv_qp,
    qp_num: u32,
    cfg: QpConfig,
    max_inline: u32,
    port: std::sync::atomic::AtomicU8,
    sq: Mutex<SqAccounting>,
    retired: AtomicU64,
    send_cq: Arc<CompletionQueue>,
    recv_cq: Arc<CompletionQueue>,
    pd: Arc<ProtectionDomain>,
}

// SAFETY: libibverbs QPs may be posted to and modified from any thread (providers lock
// internally); our own accounting is behind a Mutex/atomics; only Drop destroys the QP.
unsafe impl Send for QueuePair {}
// SAFETY: as above.
unsafe impl Sync for QueuePair {}

impl QueuePair {
    /// Creates an RC QP in RESET on `pd`, with completions going to the given CQs.
    pub fn new(
        pd: &Arc<ProtectionDomain>,
        send_cq: &Arc<CompletionQueue>,
        recv_cq: &Arc<CompletionQueue>,
        cfg: QpConfig,
    ) -> Result<QueuePair> {
        cfg.validate()?;
        let dev = pd.context().name().to_owned();
        if send_cq.context().as_ptr() != pd.context().as_ptr()
            || recv_cq.context().as_ptr() != pd.context().as_ptr()
        {
            return Err(Error::InvalidConfig(format!(
                "QP on {dev}: CQs and PD must be on the same device"
            )));
        }
        send_cq.reserve(cfg.sq_depth)?;
        if let Err(e) = recv_cq.reserve(cfg.rq_depth) {
            send_cq.unreserve(cfg.sq_depth);
            return Err(e);
        }
        // SAFETY: ibv_qp_init_attr is plain data; zero is a valid start.
        let mut init: sys::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        init.send_cq = send_cq.as_ptr();
        init.recv_cq = recv_cq.as_ptr();
        init.qp_type = sys::ibv_qp_type::IBV_QPT_RC;
        init.sq_sig_all = 0;
        init.cap.max_send_wr = cfg.sq_depth;
        init.cap.max_recv_wr = cfg.rq_depth;
        init.cap.max_send_sge = 1;
        init.cap.max_recv_sge = 1;
        init.cap.max_inline_data = cfg.max_inline;
        // SAFETY: pd and both CQs are live (we hold Arcs that the QP keeps); `init` is a
        // valid init attr that the call may update with the real capabilities.
        let qp = unsafe { sys::ibv_create_qp(pd.as_ptr(), &mut init) };
        if qp.is_null() {
            send_cq.unreserve(cfg.sq_depth);
            recv_cq.unreserve(cfg.rq_depth);
            return Err(Error::verbs("ibv_create_qp", &dev, 0, "-", -1));
        }
        // SAFETY: the QP was just created and is live.
        let qp_num = unsafe { (*qp).qp_num };
        // Every QP of the process numbers its WRs from a base of its own, above every earlier
        // QP's numbers: a device may give a new QP the number of a destroyed one, whose
        // completions can still come (Soft-RoCE keeps them in the CQ), and a caller matching
        // completions by QP number would otherwise credit an old WR's completion (a flush, or
        // a success) to the new QP's WR of the same sequence.
        // Taken modulo 2^62: the counter may wrap (a QP is made for every connect request,
        // before admission), and a QP's numbers then still have 2^62 to go before they could
        // overflow.
        let base = NEXT_SEQ_BASE.fetch_add(SEQ_SPAN, Ordering::Relaxed) % (1 << 62);
        Ok(QueuePair {
            qp,
            qp_num,
            cfg,
            max_inline: init.cap.max_inline_data,
            port: std::sync::atomic::AtomicU8::new(1),
            sq: Mutex::new(SqAccounting {
                posted: base,
                depth: cfg.sq_depth,
                policy: cfg.signal,
            }),
            retired: AtomicU64::new(base),
            send_cq: send_cq.clone(),
            recv_cq: recv_cq.clone(),
            pd: pd.clone(),
        })
    }

    /// The QP number.
    pub fn qp_num(&self) -> u32 {
        self.qp_num
    }
    /// The configuration it was created with.
    pub fn config(&self) -> &QpConfig {
        &self.cfg
    }
    /// Largest payload that is sent inline (copied at post time).
    pub fn max_inline(&self) -> u32 {
        self.max_inline
    }
    /// The protection domain.
    pub fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }
    /// The send CQ.
    pub fn send_cq(&self) -> &Arc<CompletionQueue> {
        &self.send_cq
    }
    /// The receive CQ.
    pub fn recv_cq(&self) -> &Arc<CompletionQueue> {
        &self.recv_cq
    }
    fn dev(&self) -> &str {
        self.pd.context().name()
    }

    /// Runs `ibv_modify_qp` with a prepared attribute and mask.
    pub(crate) fn modify_raw(
        &self,
        attr: &mut sys::ibv_qp_attr,
        mask: u32,
        op: &'static str,
    ) -> Result<()> {
        // SAFETY: the QP is live while self lives; `attr` is a valid attribute for `mask`.
        let rc = unsafe { sys::ibv_modify_qp(self.qp, attr, mask as i32) };
        if rc != 0 {
            return Err(Error::verbs(
                op,
                self.dev(),
                self.port.load(Ordering::Relaxed),
                "-",
                rc,
            ));
        }
        Ok(())
    }

    /// Queries the current state.
    pub fn state(&self) -> Result<QpState> {
        // SAFETY: plain data, zero is valid.
        let mut attr: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut init: sys::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        // SAFETY: the QP is live; both out-structs are valid for writes.
        let rc = unsafe {
            sys::ibv_query_qp(
                self.qp,
                &mut attr,
                sys::ibv_qp_attr_mask::IBV_QP_STATE.0 as i32,
                &mut init,
            )
        };
        if rc != 0 {
            return Err(Error::verbs("ibv_query_qp", self.dev(), 0, "-", rc));
        }
        Ok(QpState::from_raw(attr.qp_state))
    }

    /// RESET → INIT on `port`, with the configured remote access.
    pub fn to_init(&self, port: u8) -> Result<()> {
        use sys::ibv_qp_attr_mask as m;
        // SAFETY: plain data, zero is valid.
        let mut attr: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.qp_state = sys::ibv_qp_state::IBV_QPS_INIT;
        attr.pkey_index = 0;
        attr.port_num = port;
        attr.qp_access_flags = self.cfg.access.bits();
        self.port.store(port, Ordering::Relaxed);
        let mask = m::IBV_QP_STATE | m::IBV_QP_PKEY_INDEX | m::IBV_QP_PORT | m::IBV_QP_ACCESS_FLAGS;
        self.modify_raw(&mut attr, mask.0, "ibv_modify_qp(RESET->INIT)")
    }

    /// INIT → RTR towards a peer given by GID and QP number (RoCE v2, no rdma_cm).
    pub fn to_rtr(&self, p: &RtrParams) -> Result<()> {
        use sys::ibv_qp_attr_mask as m;
        // SAFETY: plain data, zero is valid.
        let mut attr: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.qp_state = sys::ibv_qp_state::IBV_QPS_RTR;
        attr.path_mtu = self.cfg.path_mtu.to_raw();
        attr.dest_qp_num = p.dest_qp_num;
        attr.rq_psn = p.rq_psn;
        attr.max_dest_rd_atomic = self.cfg.max_dest_rd_atomic;
        attr.min_rnr_timer = self.cfg.min_rnr_timer;
        attr.ah_attr.is_global = 1;
        attr.ah_attr.grh.dgid = sys::ibv_gid { raw: p.dgid };
        attr.ah_attr.grh.sgid_index = p.sgid_index;
        attr.ah_attr.grh.hop_limit = 64;
        attr.ah_attr.port_num = p.port;
        let mask = m::IBV_QP_STATE
            | m::IBV_QP_AV
            | m::IBV_QP_PATH_MTU
            | m::IBV_QP_DEST_QPN
            | m::IBV_QP_RQ_PSN
            | m::IBV_QP_MAX_DEST_RD_ATOMIC
            | m::IBV_QP_MIN_RNR_TIMER;
        self.modify_raw(&mut attr, mask.0, "ibv_modify_qp(INIT->RTR)")
    }

    /// RTR → RTS with the configured timeout, retry_cnt, rnr_retry and max_rd_atomic.
    pub fn to_rts(&self, sq_psn: u32) -> Result<()> {
        use sys::ibv_qp_attr_mask as m;
        // SAFETY: plain data, zero is valid.
        let mut attr: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.qp_state = sys::ibv_qp_state::IBV_QPS_RTS;
        attr.sq_psn = sq_psn;
        attr.timeout = self.cfg.timeout;
        attr.retry_cnt = self.cfg.retry_cnt;
        attr.rnr_retry = self.cfg.rnr_retry;
        attr.max_rd_atomic = self.cfg.max_rd_atomic;
        let mask = m::IBV_QP_STATE
            | m::IBV_QP_SQ_PSN
            | m::IBV_QP_TIMEOUT
            | m::IBV_QP_RETRY_CNT
            | m::IBV_QP_RNR_RETRY
            | m::IBV_QP_MAX_QP_RD_ATOMIC;
        self.modify_raw(&mut attr, mask.0, "ibv_modify_qp(RTR->RTS)")
    }

    /// Sets the remote access flags on a live (RTS) QP. Revoking REMOTE_WRITE makes the
    /// peer's next write through this QP fail with the fenced class; this is the fencing
    /// primitive.
    pub fn set_remote_access(&self, access: AccessFlags) -> Result<()> {
        use sys::ibv_qp_attr_mask as m;
        // SAFETY: plain data, zero is valid.
        let mut attr: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.qp_access_flags = access.bits();
        self.modify_raw(
            &mut attr,
            m::IBV_QP_ACCESS_FLAGS.0,
            "ibv_modify_qp(ACCESS_FLAGS)",
        )
    }

    /// Revokes REMOTE_WRITE on the live QP (fence the peer).
    pub fn revoke_remote_write(&self) -> Result<()> {
        self.set_remote_access(self.cfg.access.without(AccessFlags::REMOTE_WRITE))
    }

    /// Grants REMOTE_WRITE on the live QP.
    pub fn grant_remote_write(&self) -> Result<()> {
        self.set_remote_access(self.cfg.access | AccessFlags::REMOTE_WRITE)
    }

    /// Moves the QP to ERROR, flushing everything outstanding.
    pub fn to_error(&self) -> Result<()> {
        // SAFETY: plain data, zero is valid.
        let mut attr: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.qp_state = sys::ibv_qp_state::IBV_QPS_ERR;
        self.modify_raw(
            &mut attr,
            sys::ibv_qp_attr_mask::IBV_QP_STATE.0,
            "ibv_modify_qp(->ERR)",
        )
    }

    /// Moves the QP to RESET, dropping all queued WRs without completions, and resets the
    /// send-queue accounting. Drain (poll) completions you still need before calling this.
    pub fn reset(&self) -> Result<()> {
        // SAFETY: plain data, zero is valid.
        let mut attr: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.qp_state = sys::ibv_qp_state::IBV_QPS_RESET;
        let sq = self.sq.lock().unwrap_or_else(|p| p.into_inner());
        self.modify_raw(
            &mut attr,
            sys::ibv_qp_attr_mask::IBV_QP_STATE.0,
            "ibv_modify_qp(->RESET)",
        )?;
        self.retired.store(sq.posted, Ordering::Release);
        Ok(())
    }

    /// Retires send-queue slots for a polled send-side completion of this QP: the WR with
    /// sequence `wc.wr_id` and, RC being in order, all before it. Completions of other QPs
    /// are ignored. Returns whether it was ours.
    pub fn retire(&self, wc: &Completion) -> bool {
        if wc.qp_num != self.qp_num {
            return false;
        }
        self.retired.fetch_max(wc.wr_id + 1, Ordering::AcqRel);
        true
    }

    /// WRs posted and not yet retired.
    pub fn outstanding(&self) -> u64 {
        let sq = self.sq.lock().unwrap_or_else(|p| p.into_inner());
        sq.posted - self.retired.load(Ordering::Acquire).min(sq.posted)
    }

    /// Posts one send-side WR, with sequence/signal bookkeeping.
    #[allow(clippy::too_many_arguments)] // reason: private helper mirroring the WR fields
    fn post_one(
        &self,
        opcode: u32,
        sge: Option<sys::ibv_sge>,
        remote: Option<(u64, u32)>,
        imm: Option<u32>,
        inline: bool,
        force_signal: bool,
        op: &'static str,
    ) -> Result<u64> {
        let mut sq = self.sq.lock().unwrap_or_else(|p| p.into_inner());
        let retired = self.retired.load(Ordering::Acquire).min(sq.posted);
        let signaled =
            sq.admit(retired, force_signal)
                .map_err(|outstanding| Error::SendQueueFull {
                    qp_num: self.qp_num,
                    outstanding,
                    depth: sq.depth,
                })?;
        let seq = sq.posted;
        let mut sge_storage = sge;
        // SAFETY: ibv_send_wr is plain data with unions; zero is a valid start.
        let mut wr: sys::ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = seq;
        wr.opcode = opcode;
        if let Some(s) = sge_storage.as_mut() {
            wr.sg_list = s;
            wr.num_sge = if s.length == 0 { 0 } else { 1 };
        }
        let mut flags = 0;
        if signaled {
            flags |= sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
        }
        if inline {
            flags |= sys::ibv_send_flags::IBV_SEND_INLINE.0;
        }
        wr.send_flags = flags;
        if let Some(v) = imm {
            wr.imm_data_invalidated_rkey_union.imm_data = v.to_be();
        }
        if let Some((addr, rkey)) = remote {
            wr.wr.rdma = sys::rdma_t {
                remote_addr: addr,
                rkey,
            };
        }
        let mut bad: *mut sys::ibv_send_wr = std::ptr::null_mut();
        // SAFETY: the QP is live; `wr` and the SGE it points to live on this stack frame for
        // the whole call (the provider copies the WR, or the inline bytes, before returning);
        // the memory the SGE names is covered by the caller's contract (see post_write).
        let rc = unsafe { sys::ibv_post_send(self.qp, &mut wr, &mut bad) };
        if rc != 0 {
            return Err(Error::verbs(
                op,
                self.dev(),
                self.port.load(Ordering::Relaxed),
                "-",
                rc,
            ));
        }
        sq.posted += 1;
        Ok(seq)
    }

    /// Posts an RDMA Write of `len` bytes at `offset` in `local` to `remote` at
    /// `remote_offset`, with immediate data if given. Payloads within
    /// [`max_inline`](Self::max_inline) go inline. Returns the WR's sequence number.
    ///
    /// # Safety
    /// Unless the write went inline, the device reads `local[offset..offset+len]` after this
    /// call returns: the caller must not modify that range (and `local` must not be dropped
    /// or deregistered, which would turn it into a local protection error) until a send
    /// completion with sequence ≥ the returned one has been polled from this QP's send CQ.
    #[allow(clippy::too_many_arguments)] // reason: mirrors the verbs WR fields one to one
    pub unsafe fn post_write<M: RegistrableMemory>(
        &self,
        local: &MemoryRegion<M>,
        offset: usize,
        len: usize,
        remote: &RemoteRegion,
        remote_offset: u64,
        imm: Option<u32>,
        force_signal: bool,
    ) -> Result<u64> {
        local.check(offset, len)?;
        remote.check(remote_offset, len as u64)?;
        let length = wr_length(len)?;
        let sge = sys::ibv_sge {
            addr: local.addr() + offset as u64,
            length,
            lkey: local.lkey(),
        };
        let opcode = if imm.is_some() {
            sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM
        } else {
            sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE
        };
        self.post_one(
            opcode,
            Some(sge),
            Some((remote.addr + remote_offset, remote.rkey)),
            imm,
            length <= self.max_inline && len > 0,
            force_signal,
            "ibv_post_send(RDMA_WRITE)",
        )
    }

    /// Posts a Send of `len` bytes at `offset` in `local`. The peer must have a receive
    /// posted (use [`crate::SendCredits`]). Returns the WR's sequence number.
    ///
    /// # Safety
    /// Same contract as [`post_write`](Self::post_write): unless sent inline, the range
    /// must stay unmodified and registered until a send completion with sequence ≥ the
    /// returned one has been polled.
    pub unsafe fn post_send<M: RegistrableMemory>(
        &self,
        local: &MemoryRegion<M>,
        offset: usize,
        len: usize,
        imm: Option<u32>,
        force_signal: bool,
    ) -> Result<u64> {
        local.check(offset, len)?;
        let length = wr_length(len)?;
        let sge = sys::ibv_sge {
            addr: local.addr() + offset as u64,
            length,
            lkey: local.lkey(),
        };
        let opcode = if imm.is_some() {
            sys::ibv_wr_opcode::IBV_WR_SEND_WITH_IMM
        } else {
            sys::ibv_wr_opcode::IBV_WR_SEND
        };
        self.post_one(
            opcode,
            Some(sge),
            None,
            imm,
            length <= self.max_inline && len > 0,
            force_signal,
            "ibv_post_send(SEND)",
        )
    }

    /// Posts a Send whose payload (at most [`max_inline`](Self::max_inline) bytes) is copied
    /// at post time; safe because no memory is referenced afterwards.
    pub fn post_send_inline(
        &self,
        data: &[u8],
        imm: Option<u32>,
        force_signal: bool,
    ) -> Result<u64> {
        if data.len() as u32 > self.max_inline {
            return Err(Error::InvalidConfig(format!(
                "inline send of {} bytes exceeds the QP's max_inline {}",
                data.len(),
                self.max_inline
            )));
        }
        let sge = sys::ibv_sge {
            addr: data.as_ptr() as u64,
            length: data.len() as u32,
            lkey: 0,
        };
        let opcode = if imm.is_some() {
            sys::ibv_wr_opcode::IBV_WR_SEND_WITH_IMM
        } else {
            sys::ibv_wr_opcode::IBV_WR_SEND
        };
        self.post_one(
            opcode,
            Some(sge),
            None,
            imm,
            !data.is_empty(),
            force_signal,
            "ibv_post_send(SEND inline)",
        )
    }

    /// Posts an RDMA Write whose payload (at most [`max_inline`](Self::max_inline) bytes) is
    /// copied at post time.
    pub fn post_write_inline(
        &self,
        data: &[u8],
        remote: &RemoteRegion,
        remote_offset: u64,
        imm: Option<u32>,
        force_signal: bool,
    ) -> Result<u64> {
        if data.len() as u32 > self.max_inline {
            return Err(Error::InvalidConfig(format!(
                "inline write of {} bytes exceeds the QP's max_inline {}",
                data.len(),
                self.max_inline
            )));
        }
        remote.check(remote_offset, data.len() as u64)?;
        let sge = sys::ibv_sge {
            addr: data.as_ptr() as u64,
            length: data.len() as u32,
            lkey: 0,
        };
        let opcode = if imm.is_some() {
            sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM
        } else {
            sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE
        };
        self.post_one(
            opcode,
            Some(sge),
            Some((remote.addr + remote_offset, remote.rkey)),
            imm,
            !data.is_empty(),
            force_signal,
            "ibv_post_send(RDMA_WRITE inline)",
        )
    }

    /// Posts a receive into `mr[offset..offset+len]` with the caller's `wr_id`.
    ///
    /// # Safety
    /// The device owns the range from now until the receive's completion is polled (or the
    /// QP is reset or destroyed): the caller must not read or write it, nor post another
    /// receive over it, in that time.
    pub unsafe fn post_recv<M: RegistrableMemory>(
        &self,
        mr: &MemoryRegion<M>,
        offset: usize,
        len: usize,
        wr_id: u64,
    ) -> Result<()> {
        mr.check(offset, len)?;
        let mut sge = sys::ibv_sge {
            addr: mr.addr() + offset as u64,
            length: len as u32,
            lkey: mr.lkey(),
        };
        // SAFETY: ibv_recv_wr is plain data; zero is a valid start.
        let mut wr: sys::ibv_recv_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = wr_id;
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        let mut bad: *mut sys::ibv_recv_wr = std::ptr::null_mut();
        // SAFETY: the QP is live; `wr`/`sge` live for the call; the buffer is registered and
        // the caller hands it to the device per this function's contract.
        let rc = unsafe { sys::ibv_post_recv(self.qp, &mut wr, &mut bad) };
        if rc != 0 {
            return Err(Error::verbs(
                "ibv_post_recv",
                self.dev(),
                self.port.load(Ordering::Relaxed),
                "-",
                rc,
            ));
        }
        Ok(())
    }

    fn destroy(&mut self) -> Result<()> {
        if self.qp.is_null() {
            return Ok(());
        }
        // SAFETY: the QP is live and destroyed once (nulled after). The async-event reader
        // acknowledges every event immediately, so destroy cannot wait on an unacked one.
        let rc = unsafe { sys::ibv_destroy_qp(self.qp) };
        self.qp = std::ptr::null_mut();
        self.send_cq.unreserve(self.cfg.sq_depth);
        self.recv_cq.unreserve(self.cfg.rq_depth);
        if rc != 0 {
            return Err(Error::verbs("ibv_destroy_qp", self.dev(), 0, "-", rc));
        }
        Ok(())
    }

    /// Destroys the QP, reporting failure.
    pub fn close(mut self) -> Result<()> {
        self.destroy()
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        if let Err(e) = self.destroy() {
            tracing::warn!(error = %e, "queue pair destruction failed in drop");
        }
    }
}

/// The most bytes one work request may move: the RDMA message limit of the specifications
/// (2^31; a device may allow less, `max_msg_sz`).
pub const MAX_WR_BYTES: usize = 1 << 31;

/// A work request's length as the verbs take it (a `u32`): refused past [`MAX_WR_BYTES`]
/// rather than cut to its low 32 bits (2^32 + k bytes went out as a k-byte write, and
/// completed successfully).
fn wr_length(len: usize) -> Result<u32> {
    if len > MAX_WR_BYTES {
        return Err(Error::InvalidConfig(format!(
            "a work request of {len} bytes: at most {MAX_WR_BYTES} per request"
        )));
    }
    Ok(len as u32)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_work_request_longer_than_the_message_limit_is_refused() {
        assert_eq!(super::wr_length(0).unwrap(), 0);
        assert_eq!(super::wr_length(super::MAX_WR_BYTES).unwrap(), 1 << 31);
        assert!(super::wr_length(super::MAX_WR_BYTES + 1).is_err());
        assert!(
            super::wr_length((1 << 32) + 8).is_err(),
            "not cut to 8 bytes"
        );
    }

    use super::*;

    fn run(policy: SignalPolicy, depth: u32, n: u64) -> (Vec<bool>, u64) {
        // Simulates a poster that retires on every signaled completion at once, and counts
        // how often the queue would have been full.
        let mut sq = SqAccounting {
            posted: 0,
            depth,
            policy,
        };
        let mut retired = 0;
        let mut signals = Vec::new();
        let mut full = 0;
        let mut pending_signaled: Option<u64> = None;
        while sq.posted < n {
            match sq.admit(retired, false) {
                Ok(sig) => {
                    signals.push(sig);
                    if sig {
                        pending_signaled = Some(sq.posted);
                    }
                    sq.posted += 1;
                }
                Err(outstanding) => {
                    full += 1;
                    assert_eq!(outstanding, u64::from(depth));
                    // A full queue always has a signaled WR outstanding to wait for.
                    let s = pending_signaled
                        .take()
                        .expect("full queue without a signaled WR");
                    retired = s + 1;
                }
            }
        }
        (signals, full)
    }

    #[test]
    fn every_n_signals_periodically_and_never_deadlocks() {
        let (sig, _) = run(SignalPolicy::Every(4), 16, 64);
        let idx: Vec<usize> = sig
            .iter()
            .enumerate()
            .filter(|(_, s)| **s)
            .map(|(i, _)| i)
            .collect();
        assert_eq!(&idx[..4], &[3, 7, 11, 15]);
    }

    #[test]
    fn last_free_slot_is_always_signaled() {
        // Every(16) with depth 5: without the last-slot rule nothing in the first 5 WRs
        // would be signaled and a full queue could never drain.
        let (sig, full) = run(SignalPolicy::Every(5), 5, 40);
        assert!(sig[4]);
        assert!(full > 0);
        let sq = SqAccounting {
            posted: 4,
            depth: 5,
            policy: SignalPolicy::Every(1000),
        };
        assert_eq!(sq.admit(0, false), Ok(true));
        let sq = SqAccounting {
            posted: 5,
            depth: 5,
            policy: SignalPolicy::Every(1000),
        };
        assert_eq!(sq.admit(0, false), Err(5));
    }

    #[test]
    fn all_policy_and_force_signal() {
        let sq = SqAccounting {
            posted: 0,
            depth: 8,
            policy: SignalPolicy::All,
        };
        assert_eq!(sq.admit(0, false), Ok(true));
        let sq = SqAccounting {
            posted: 0,
            depth: 8,
            policy: SignalPolicy::Every(8),
        };
        assert_eq!(sq.admit(0, false), Ok(false));
        assert_eq!(sq.admit(0, true), Ok(true));
    }

    #[test]
    fn config_validation() {
        assert!(QpConfig::default().validate().is_ok());
        let c = QpConfig {
            rnr_retry: 7,
            ..QpConfig::default()
        };
        assert!(c.validate().is_err(), "infinite RNR retry is refused");
        let c = QpConfig {
            retry_cnt: 7,
            ..QpConfig::default()
        };
        assert!(
            c.validate().is_err(),
            "a transport retry count Soft-RoCE takes as infinite is refused"
        );
        assert!(
            QpConfig {
                retry_cnt: 6,
                ..QpConfig::default()
            }
            .validate()
            .is_ok()
        );
        let c = QpConfig {
            signal: SignalPolicy::Every(0),
            ..QpConfig::default()
        };
        assert!(c.validate().is_err());
        let c = QpConfig {
            sq_depth: 8,
            signal: SignalPolicy::Every(9),
            ..QpConfig::default()
        };
        assert!(c.validate().is_err());
        assert!(
            !QpConfig::default()
                .access
                .contains(AccessFlags::REMOTE_WRITE)
        );
    }

    #[test]
    fn mtu_and_state_mappings() {
        assert_eq!(Mtu::M1024.bytes(), 1024);
        assert_eq!(Mtu::M4096.bytes(), 4096);
        for m in [Mtu::M256, Mtu::M512, Mtu::M1024, Mtu::M2048, Mtu::M4096] {
            assert_eq!(Mtu::from_raw(m.to_raw()), m);
        }
        assert_eq!(
            QpState::from_raw(sys::ibv_qp_state::IBV_QPS_RTS),
            QpState::Rts
        );
        assert_eq!(
            QpState::from_raw(sys::ibv_qp_state::IBV_QPS_ERR),
            QpState::Error
        );
    }
}
