//! The asynchronous event reader: one thread per device context reads every async event,
//! acknowledges it at once (so destroying a QP or CQ never hangs on an unacknowledged
//! event), and forwards the ones an owner must act on through a channel.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::device::Context;
use crate::error::{Error, Result};
use crate::sys;

/// How often the reader re-checks its stop flag while no event arrives.
const STOP_CHECK_INTERVAL: Duration = Duration::from_millis(50);

/// An asynchronous device event, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AsyncEvent {
    /// The port went down (`IBV_EVENT_PORT_ERR`).
    PortDown {
        /// Port number.
        port: u8,
    },
    /// The port became active.
    PortActive {
        /// Port number.
        port: u8,
    },
    /// A QP hit a fatal error and is in the error state.
    QpFatal {
        /// QP number.
        qp_num: u32,
    },
    /// A QP saw an invalid request or access error as responder.
    QpAccessError {
        /// QP number.
        qp_num: u32,
    },
    /// Communication established on a QP.
    CommEstablished {
        /// QP number.
        qp_num: u32,
    },
    /// A CQ overran or failed.
    CqError,
    /// The device failed.
    DeviceFatal,
    /// Any other event type (its raw `ibv_event_type`).
    Other(u32),
}

/// The reader thread and the receiving end of its channel.
#[derive(Debug)]
pub struct AsyncEvents {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    rx: Receiver<AsyncEvent>,
}

impl AsyncEvents {
    /// Starts the reader for `ctx`.
    pub fn spawn(ctx: &Arc<Context>) -> Result<AsyncEvents> {
        // SAFETY: the context is live while `ctx` is held (the thread keeps a clone).
        let fd = unsafe { (*ctx.as_ptr()).async_fd };
        sys::set_nonblocking(fd)
            .map_err(|e| Error::io("fcntl(O_NONBLOCK) on async fd", ctx.name(), 0, "-", e))?;
        let (tx, rx) = channel();
        let stop = Arc::new(AtomicBool::new(false));
        let (ctx2, stop2) = (ctx.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name(format!("async-{}", ctx.name()))
            .spawn(move || reader(ctx2, fd, stop2, tx))
            .map_err(|e| Error::io("spawn async event thread", ctx.name(), 0, "-", e))?;
        Ok(AsyncEvents {
            stop,
            thread: Some(thread),
            rx,
        })
    }

    /// Waits up to `timeout` for the next event.
    pub fn recv_timeout(&self, timeout: Duration) -> Option<AsyncEvent> {
        self.rx.recv_timeout(timeout).ok()
    }

    /// Returns an event if one is queued.
    pub fn try_recv(&self) -> Option<AsyncEvent> {
        self.rx.try_recv().ok()
    }

    /// Stops the reader thread and waits for it.
    pub fn close(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for AsyncEvents {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn reader(ctx: Arc<Context>, fd: libc::c_int, stop: Arc<AtomicBool>, tx: Sender<AsyncEvent>) {
    while !stop.load(Ordering::Relaxed) {
        match sys::wait_readable(fd, STOP_CHECK_INTERVAL) {
            Ok(true) => {}
            Ok(false) => continue,
            Err(e) => {
                tracing::warn!(device = ctx.name(), error = %e, "async event fd poll failed; reader stops");
                return;
            }
        }
        let mut ev = std::mem::MaybeUninit::<sys::ibv_async_event>::uninit();
        // SAFETY: the context is live (we hold an Arc) and its fd is non-blocking; `ev` is a
        // writable ibv_async_event.
        let rc = unsafe { sys::ibv_get_async_event(ctx.as_ptr(), ev.as_mut_ptr()) };
        if rc != 0 {
            continue; // EAGAIN: another reader or a spurious wake-up
        }
        // SAFETY: ibv_get_async_event returned 0 and filled `ev`.
        let mut ev = unsafe { ev.assume_init() };
        let decoded = decode(&ev);
        // SAFETY: `ev` came from ibv_get_async_event and is acknowledged exactly once, right
        // after its element (qp/cq pointer, still valid until this ack) was read in `decode`.
        unsafe { sys::ibv_ack_async_event(&mut ev) };
        tracing::debug!(device = ctx.name(), event = ?decoded, "async event");
        let _ = tx.send(decoded);
    }
}

fn decode(ev: &sys::ibv_async_event) -> AsyncEvent {
    use sys::ibv_event_type as t;
    // Reading the union's `qp` member is only valid for QP events; each arm reads the member
    // that its event type defines.
    let qp_num = || {
        // SAFETY: called only for QP event types, whose element is a QP that stays alive
        // until the event is acknowledged (libibverbs' destroy waits for the ack).
        unsafe { (*ev.element.qp).qp_num }
    };
    let port = || {
        // SAFETY: called only for port event types, whose element is the port number.
        unsafe { ev.element.port_num }.clamp(0, 255) as u8
    };
    match ev.event_type {
        t::IBV_EVENT_PORT_ERR => AsyncEvent::PortDown { port: port() },
        t::IBV_EVENT_PORT_ACTIVE => AsyncEvent::PortActive { port: port() },
        t::IBV_EVENT_QP_FATAL => AsyncEvent::QpFatal { qp_num: qp_num() },
        t::IBV_EVENT_QP_REQ_ERR | t::IBV_EVENT_QP_ACCESS_ERR => {
            AsyncEvent::QpAccessError { qp_num: qp_num() }
        }
        t::IBV_EVENT_COMM_EST => AsyncEvent::CommEstablished { qp_num: qp_num() },
        t::IBV_EVENT_CQ_ERR => AsyncEvent::CqError,
        t::IBV_EVENT_DEVICE_FATAL => AsyncEvent::DeviceFatal,
        other => AsyncEvent::Other(other as u32),
    }
}
