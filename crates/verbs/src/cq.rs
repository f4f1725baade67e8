//! Completion queues, typed completions and the three polling modes.

use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_utils::Backoff;

use crate::device::Context;
use crate::error::{Error, Result};
use crate::sys;

/// Work completions converted per `ibv_poll_cq` call; bounds the stack buffer (48 B each).
const POLL_BATCH: usize = 16;

/// Status of a work completion, grouped into the classes the log cares about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WcStatus {
    /// The WR completed.
    Success,
    /// The remote side refused the access: `IBV_WC_REM_ACCESS_ERR` (mlx5) or
    /// `IBV_WC_REM_INV_REQ_ERR` (rxe, for a QP whose REMOTE_WRITE was revoked, or a bad
    /// rkey). This is the *fenced* class.
    RemoteAccess,
    /// Transport retries ran out (`IBV_WC_RETRY_EXC_ERR`): the peer is dead or unreachable.
    RetryExceeded,
    /// RNR retries ran out (`IBV_WC_RNR_RETRY_EXC_ERR`): the peer had no receive posted.
    Rnr,
    /// Flushed because the QP is in the error state (`IBV_WC_WR_FLUSH_ERR`). Never an ack.
    Flushed,
    /// A local error: length, QP operation, protection, access (`IBV_WC_LOC_*`).
    LocalError,
    /// A remote operation error (`IBV_WC_REM_OP_ERR`).
    RemoteOperation,
    /// Anything else; the raw status is in [`Completion::raw_status`].
    Other,
}

impl WcStatus {
    /// Maps `enum ibv_wc_status`.
    pub fn from_raw(v: u32) -> WcStatus {
        use sys::ibv_wc_status as s;
        match v {
            s::IBV_WC_SUCCESS => WcStatus::Success,
            s::IBV_WC_REM_ACCESS_ERR | s::IBV_WC_REM_INV_REQ_ERR => WcStatus::RemoteAccess,
            s::IBV_WC_RETRY_EXC_ERR => WcStatus::RetryExceeded,
            s::IBV_WC_RNR_RETRY_EXC_ERR => WcStatus::Rnr,
            s::IBV_WC_WR_FLUSH_ERR => WcStatus::Flushed,
            s::IBV_WC_LOC_LEN_ERR
            | s::IBV_WC_LOC_QP_OP_ERR
            | s::IBV_WC_LOC_EEC_OP_ERR
            | s::IBV_WC_LOC_PROT_ERR
            | s::IBV_WC_LOC_ACCESS_ERR
            | s::IBV_WC_LOC_RDD_VIOL_ERR => WcStatus::LocalError,
            s::IBV_WC_REM_OP_ERR => WcStatus::RemoteOperation,
            _ => WcStatus::Other,
        }
    }

    /// Whether the peer fenced us (revoked REMOTE_WRITE, or the rkey is wrong).
    pub fn is_fenced(self) -> bool {
        self == WcStatus::RemoteAccess
    }
}

/// Opcode of a work completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WcOpcode {
    /// A Send finished.
    Send,
    /// An RDMA Write finished.
    RdmaWrite,
    /// An RDMA Read finished.
    RdmaRead,
    /// A receive consumed a Send.
    Recv,
    /// A receive consumed an RDMA Write with immediate.
    RecvRdmaWithImm,
    /// Any other opcode (error completions carry undefined opcodes).
    Other(u32),
}

impl WcOpcode {
    /// Maps `enum ibv_wc_opcode`.
    pub fn from_raw(v: u32) -> WcOpcode {
        use sys::ibv_wc_opcode as o;
        match v {
            o::IBV_WC_SEND => WcOpcode::Send,
            o::IBV_WC_RDMA_WRITE => WcOpcode::RdmaWrite,
            o::IBV_WC_RDMA_READ => WcOpcode::RdmaRead,
            o::IBV_WC_RECV => WcOpcode::Recv,
            o::IBV_WC_RECV_RDMA_WITH_IMM => WcOpcode::RecvRdmaWithImm,
            x => WcOpcode::Other(x),
        }
    }
}

/// One work completion, copied out of the CQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    /// The WR id given at post time.
    pub wr_id: u64,
    /// Typed status.
    pub status: WcStatus,
    /// The raw `ibv_wc_status`, for diagnostics.
    pub raw_status: u32,
    /// Vendor error syndrome.
    pub vendor_err: u32,
    /// Opcode (valid only on success).
    pub opcode: WcOpcode,
    /// Bytes received (receive completions).
    pub byte_len: u32,
    /// Immediate data in host order, when present.
    pub imm: Option<u32>,
    /// The local QP number.
    pub qp_num: u32,
}

impl Completion {
    /// A placeholder for preallocated completion arrays.
    pub const EMPTY: Completion = Completion {
        wr_id: 0,
        status: WcStatus::Other,
        raw_status: u32::MAX,
        vendor_err: 0,
        opcode: WcOpcode::Other(u32::MAX),
        byte_len: 0,
        imm: None,
        qp_num: 0,
    };

    fn from_wc(wc: &sys::ibv_wc) -> Completion {
        let imm = if wc.wc_flags & sys::ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0 {
            // SAFETY: IBV_WC_WITH_IMM says the union holds imm_data (network byte order).
            Some(u32::from_be(unsafe {
                wc.imm_data_invalidated_rkey_union.imm_data
            }))
        } else {
            None
        };
        Completion {
            wr_id: wc.wr_id,
            status: WcStatus::from_raw(wc.status),
            raw_status: wc.status,
            vendor_err: wc.vendor_err,
            opcode: WcOpcode::from_raw(wc.opcode),
            byte_len: wc.byte_len,
            imm,
            qp_num: wc.qp_num,
        }
    }
}

impl Default for Completion {
    fn default() -> Self {
        Completion::EMPTY
    }
}

/// How a wait for completions spends the CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PollMode {
    /// Poll in a loop until a completion or the deadline (production mode, on a pinned
    /// core).
    Busy,
    /// Spin for `spin`, then arm the CQ and block on its completion channel.
    Adaptive {
        /// How long to spin before blocking.
        spin: Duration,
    },
    /// Arm the CQ and block on its completion channel straight away.
    Event,
}

/// A completion queue with its own completion channel (for the adaptive and event modes).
///
/// Capacity is accounted: every QP attached reserves as many entries as it can produce
/// (its send or receive queue depth), so the CQ can never overrun.
#[derive(Debug)]
pub struct CompletionQueue {
    cq: *mut sys::ibv_cq,
    channel: *mut sys::ibv_comp_channel,
    capacity: u32,
    reserved: AtomicU32,
    /// Serialises arm/wait/ack on the completion channel.
    event_lock: Mutex<()>,
    ctx: Arc<Context>,
}

// SAFETY: ibv_poll_cq/ibv_req_notify_cq are thread-safe in libibverbs providers; channel
// operations are serialised by `event_lock`; only Drop destroys the handles.
unsafe impl Send for CompletionQueue {}
// SAFETY: as above.
unsafe impl Sync for CompletionQueue {}

impl CompletionQueue {
    /// Creates a CQ of at least `capacity` entries with a non-blocking completion channel.
    pub fn new(ctx: &Arc<Context>, capacity: u32) -> Result<Arc<CompletionQueue>> {
        if capacity == 0 {
            return Err(Error::InvalidConfig(
                "a completion queue needs capacity > 0".into(),
            ));
        }
        // SAFETY: the context is live while `ctx` is held (it is stored in the CQ).
        let channel = unsafe { sys::ibv_create_comp_channel(ctx.as_ptr()) };
        if channel.is_null() {
            return Err(Error::verbs(
                "ibv_create_comp_channel",
                ctx.name(),
                0,
                "-",
                -1,
            ));
        }
        // SAFETY: `channel` was just created and is live.
        let fd = unsafe { (*channel).fd };
        if let Err(e) = sys::set_nonblocking(fd) {
            // SAFETY: the channel has no CQ attached yet and is destroyed exactly once.
            unsafe { sys::ibv_destroy_comp_channel(channel) };
            return Err(Error::io(
                "fcntl(O_NONBLOCK) on completion channel",
                ctx.name(),
                0,
                "-",
                e,
            ));
        }
        // SAFETY: context and channel are live; cq_context is unused (null).
        let cq = unsafe {
            sys::ibv_create_cq(
                ctx.as_ptr(),
                capacity as i32,
                std::ptr::null_mut(),
                channel,
                0,
            )
        };
        if cq.is_null() {
            let e = Error::verbs("ibv_create_cq", ctx.name(), 0, "-", -1);
            // SAFETY: no CQ uses the channel; destroyed exactly once.
            unsafe { sys::ibv_destroy_comp_channel(channel) };
            return Err(e);
        }
        // SAFETY: the CQ is live; `cqe` is the real capacity (>= asked).
        let real = unsafe { (*cq).cqe }.max(0) as u32;
        Ok(Arc::new(CompletionQueue {
            cq,
            channel,
            capacity: real,
            reserved: AtomicU32::new(0),
            event_lock: Mutex::new(()),
            ctx: ctx.clone(),
        }))
    }

    /// Real capacity in entries.
    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Entries reserved by the live QPs that use this CQ; a destroyed QP gives its share back.
    pub fn reserved(&self) -> u32 {
        self.reserved.load(Ordering::Acquire)
    }

    /// The device context.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    pub(crate) fn as_ptr(&self) -> *mut sys::ibv_cq {
        self.cq
    }

    /// Reserves `n` entries for a QP; fails rather than over-commit.
    pub(crate) fn reserve(&self, n: u32) -> Result<()> {
        let mut cur = self.reserved.load(Ordering::Relaxed);
        loop {
            let next = cur.checked_add(n).filter(|&v| v <= self.capacity).ok_or(
                Error::CqOvercommitted {
                    capacity: self.capacity,
                    reserved: cur,
                    requested: n,
                },
            )?;
            match self
                .reserved
                .compare_exchange(cur, next, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => return Ok(()),
                Err(v) => cur = v,
            }
        }
    }

    pub(crate) fn unreserve(&self, n: u32) {
        self.reserved.fetch_sub(n, Ordering::AcqRel);
    }

    /// Polls once into `out` without blocking and without allocating. Returns how many
    /// completions were written to the front of `out`.
    pub fn poll(&self, out: &mut [Completion]) -> Result<usize> {
        let mut buf: [MaybeUninit<sys::ibv_wc>; POLL_BATCH] =
            [const { MaybeUninit::uninit() }; POLL_BATCH];
        let mut done = 0;
        while done < out.len() {
            let want = (out.len() - done).min(POLL_BATCH);
            // SAFETY: the CQ is live while self lives; `buf` has room for `want` ibv_wc
            // entries and ibv_poll_cq writes at most that many.
            let n = unsafe { sys::ibv_poll_cq(self.cq, want as i32, buf.as_mut_ptr().cast()) };
            if n < 0 {
                return Err(Error::verbs("ibv_poll_cq", self.ctx.name(), 0, "-", n));
            }
            let n = n as usize;
            for i in 0..n {
                // SAFETY: ibv_poll_cq initialised the first `n` entries.
                let wc = unsafe { buf[i].assume_init_ref() };
                out[done + i] = Completion::from_wc(wc);
            }
            done += n;
            if n < want {
                break;
            }
        }
        Ok(done)
    }

    /// Waits up to `timeout` for at least one completion, in the given mode.
    pub fn wait(&self, out: &mut [Completion], mode: PollMode, timeout: Duration) -> Result<usize> {
        if out.is_empty() {
            return Ok(0);
        }
        let start = Instant::now();
        let deadline = start + timeout;
        match mode {
            PollMode::Busy => self.spin_until(out, deadline),
            PollMode::Adaptive { spin } => {
                let spin_end = (start + spin).min(deadline);
                match self.spin_until(out, spin_end) {
                    Ok(n) => Ok(n),
                    Err(Error::PollTimeout(_)) => self.block_until(out, deadline, timeout),
                    Err(e) => Err(e),
                }
            }
            PollMode::Event => self.block_until(out, deadline, timeout),
        }
        .map_err(|e| match e {
            Error::PollTimeout(_) => Error::PollTimeout(timeout),
            e => e,
        })
    }

    fn spin_until(&self, out: &mut [Completion], deadline: Instant) -> Result<usize> {
        let backoff = Backoff::new();
        loop {
            let n = self.poll(out)?;
            if n > 0 {
                return Ok(n);
            }
            if Instant::now() >= deadline {
                return Err(Error::PollTimeout(Duration::ZERO));
            }
            // Busy mode never sleeps: spin (and, past the spin limit, yield).
            backoff.snooze();
            if backoff.is_completed() {
                backoff.reset();
            }
        }
    }

    fn block_until(
        &self,
        out: &mut [Completion],
        deadline: Instant,
        timeout: Duration,
    ) -> Result<usize> {
        let _guard = self.event_lock.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            // Arm first, then poll: a completion that raced in before arming is caught by
            // the poll, one after it raises an event.
            self.arm_locked()?;
            let n = self.poll(out)?;
            if n > 0 {
                return Ok(n);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::PollTimeout(timeout));
            }
            // SAFETY: the channel is live while self lives.
            let fd = unsafe { (*self.channel).fd };
            let ready = sys::wait_readable(fd, deadline - now)
                .map_err(|e| Error::io("poll(completion channel)", self.ctx.name(), 0, "-", e))?;
            if ready {
                self.take_event()?;
            }
        }
    }

    /// Requests a channel event for the next completion (see [`crate::WaitSet`]).
    pub(crate) fn arm(&self) -> Result<()> {
        let _guard = self.event_lock.lock().unwrap_or_else(|p| p.into_inner());
        self.arm_locked()
    }

    /// [`CompletionQueue::arm`] for a caller that holds `event_lock`.
    fn arm_locked(&self) -> Result<()> {
        // SAFETY: the CQ is live; the caller holds event_lock, which serialises arming.
        let rc = unsafe { sys::ibv_req_notify_cq(self.cq, 0) };
        if rc != 0 {
            return Err(Error::verbs(
                "ibv_req_notify_cq",
                self.ctx.name(),
                0,
                "-",
                rc,
            ));
        }
        Ok(())
    }

    /// The completion channel's file descriptor (readable when an event is pending).
    pub(crate) fn channel_fd(&self) -> libc::c_int {
        // SAFETY: the channel is live while self lives.
        unsafe { (*self.channel).fd }
    }

    /// Consumes and acknowledges every pending channel event.
    pub(crate) fn take_events(&self) -> Result<()> {
        let _guard = self.event_lock.lock().unwrap_or_else(|p| p.into_inner());
        while self.take_event()? {}
        Ok(())
    }

    /// Consumes one pending channel event (if any) and acknowledges it at once, so destroy
    /// never waits on unacknowledged events.
    fn take_event(&self) -> Result<bool> {
        let mut ev_cq: *mut sys::ibv_cq = std::ptr::null_mut();
        let mut ev_ctx: *mut libc::c_void = std::ptr::null_mut();
        // SAFETY: the channel is live and non-blocking; the out-pointers are valid locals.
        let rc = unsafe { sys::ibv_get_cq_event(self.channel, &mut ev_cq, &mut ev_ctx) };
        if rc != 0 {
            let e = sys::last_os_error();
            if e.kind() == std::io::ErrorKind::WouldBlock {
                return Ok(false);
            }
            return Err(Error::io("ibv_get_cq_event", self.ctx.name(), 0, "-", e));
        }
        // SAFETY: only our CQ is attached to this channel, so `ev_cq` is self.cq; one event
        // was taken, one is acknowledged.
        unsafe { sys::ibv_ack_cq_events(ev_cq, 1) };
        Ok(true)
    }

    /// Destroys the CQ, reporting failure (for example EBUSY while a QP still uses it,
    /// which the Arc graph prevents).
    pub fn close(self: Arc<Self>) -> Result<()> {
        match Arc::try_unwrap(self) {
            Ok(mut cq) => cq.destroy(),
            Err(_) => Err(Error::InvalidConfig(
                "completion queue closed while still shared".into(),
            )),
        }
    }

    fn destroy(&mut self) -> Result<()> {
        let mut result = Ok(());
        if !self.cq.is_null() {
            // SAFETY: no QP holds an Arc to us any more, every channel event was acked in
            // `take_event`; destroyed exactly once (nulled after).
            let rc = unsafe { sys::ibv_destroy_cq(self.cq) };
            self.cq = std::ptr::null_mut();
            if rc != 0 {
                result = Err(Error::verbs("ibv_destroy_cq", self.ctx.name(), 0, "-", rc));
            }
        }
        if !self.channel.is_null() {
            // SAFETY: the CQ using the channel is gone; destroyed exactly once.
            let rc = unsafe { sys::ibv_destroy_comp_channel(self.channel) };
            self.channel = std::ptr::null_mut();
            if rc != 0 && result.is_ok() {
                result = Err(Error::verbs(
                    "ibv_destroy_comp_channel",
                    self.ctx.name(),
                    0,
                    "-",
                    rc,
                ));
            }
        }
        result
    }
}

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        if let Err(e) = self.destroy() {
            tracing::warn!(error = %e, "completion queue teardown failed in drop");
        }
    }
}

/// Pins the calling thread to CPU `core`.
pub fn pin_current_thread(core: usize) -> Result<()> {
    // SAFETY: cpu_set_t is plain data; zeroed is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: CPU_SET writes a bit inside `set`; `core` is bounds-checked by the macro's
    // implementation against the set size.
    unsafe { libc::CPU_SET(core, &mut set) };
    // SAFETY: pid 0 is the calling thread; `set` is a valid cpu_set_t of the given size.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if rc != 0 {
        return Err(Error::io(
            "sched_setaffinity",
            "-",
            0,
            "-",
            sys::last_os_error(),
        ));
    }
    Ok(())
}

/// A thread that busy-polls one CQ and hands each completion to a handler.
#[derive(Debug)]
pub struct BusyPoller {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Result<()>>>,
}

/// Spawns a busy-poll thread on `cq`, pinned to `core` if given. The handler runs on that
/// thread for every completion; the loop ends on [`BusyPoller::stop`] or a poll error.
pub fn spawn_busy_poller<F>(
    cq: Arc<CompletionQueue>,
    core: Option<usize>,
    mut handler: F,
) -> Result<BusyPoller>
where
    F: FnMut(&Completion) + Send + 'static,
{
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let thread = std::thread::Builder::new()
        .name(format!("cq-poll-{}", cq.context().name()))
        .spawn(move || {
            if let Some(c) = core {
                pin_current_thread(c)?;
            }
            let mut out = [Completion::EMPTY; POLL_BATCH];
            while !stop2.load(Ordering::Relaxed) {
                let n = cq.poll(&mut out)?;
                for c in &out[..n] {
                    handler(c);
                }
                if n == 0 {
                    std::hint::spin_loop();
                }
            }
            Ok(())
        })
        .map_err(|e| Error::io("spawn busy-poll thread", "-", 0, "-", e))?;
    Ok(BusyPoller {
        stop,
        thread: Some(thread),
    })
}

impl BusyPoller {
    /// Stops the thread and returns its result.
    pub fn stop(mut self) -> Result<()> {
        self.stop.store(true, Ordering::Relaxed);
        match self.thread.take().map(|t| t.join()) {
            Some(Ok(r)) => r,
            Some(Err(_)) => Err(Error::InvalidConfig("busy-poll handler panicked".into())),
            None => Ok(()),
        }
    }
}

impl Drop for BusyPoller {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sys::ibv_wc_status as s;

    #[test]
    fn fenced_class_covers_rxe_and_mlx5_statuses() {
        assert_eq!(
            WcStatus::from_raw(s::IBV_WC_REM_ACCESS_ERR),
            WcStatus::RemoteAccess
        );
        assert_eq!(
            WcStatus::from_raw(s::IBV_WC_REM_INV_REQ_ERR),
            WcStatus::RemoteAccess
        );
        assert!(
            WcStatus::from_raw(9).is_fenced(),
            "rxe reports status 9 for a revoked QP"
        );
        assert!(WcStatus::from_raw(10).is_fenced());
    }

    #[test]
    fn status_mapping_matches_verbs_header() {
        assert_eq!(WcStatus::from_raw(0), WcStatus::Success);
        assert_eq!(
            WcStatus::from_raw(s::IBV_WC_RETRY_EXC_ERR),
            WcStatus::RetryExceeded
        );
        assert_eq!(WcStatus::from_raw(12), WcStatus::RetryExceeded);
        assert_eq!(
            WcStatus::from_raw(s::IBV_WC_RNR_RETRY_EXC_ERR),
            WcStatus::Rnr
        );
        assert_eq!(WcStatus::from_raw(5), WcStatus::Flushed);
        assert_eq!(
            WcStatus::from_raw(s::IBV_WC_LOC_PROT_ERR),
            WcStatus::LocalError
        );
        assert_eq!(
            WcStatus::from_raw(s::IBV_WC_REM_OP_ERR),
            WcStatus::RemoteOperation
        );
        assert_eq!(WcStatus::from_raw(s::IBV_WC_GENERAL_ERR), WcStatus::Other);
    }

    #[test]
    fn opcode_mapping() {
        use sys::ibv_wc_opcode as o;
        assert_eq!(WcOpcode::from_raw(o::IBV_WC_SEND), WcOpcode::Send);
        assert_eq!(
            WcOpcode::from_raw(o::IBV_WC_RDMA_WRITE),
            WcOpcode::RdmaWrite
        );
        assert_eq!(WcOpcode::from_raw(o::IBV_WC_RECV), WcOpcode::Recv);
        assert_eq!(
            WcOpcode::from_raw(o::IBV_WC_RECV_RDMA_WITH_IMM),
            WcOpcode::RecvRdmaWithImm
        );
    }

    #[test]
    fn imm_is_converted_from_network_order() {
        // SAFETY: ibv_wc is plain data; all-zero is a valid bit pattern.
        let mut wc: sys::ibv_wc = unsafe { std::mem::zeroed() };
        wc.wc_flags = sys::ibv_wc_flags::IBV_WC_WITH_IMM.0;
        wc.imm_data_invalidated_rkey_union.imm_data = 0x1234_5678u32.to_be();
        let c = Completion::from_wc(&wc);
        assert_eq!(c.imm, Some(0x1234_5678));
        assert_eq!(c.status, WcStatus::Success);
    }
}
