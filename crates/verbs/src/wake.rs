//! Sleeping until any of several sources has work: the completion channels of some CQs and a
//! wake-up that other threads ring (an `eventfd`).
//!
//! The protocol is the usual one for completion channels, split so that the polling happens
//! wherever the owner polls (under its own lock):
//!
//! 1. [`WaitSet::arm`] requests a notification on every CQ;
//! 2. the owner polls its CQs (and its other queues) once more: a completion that raced in
//!    before the arm is caught here, one after it raises a channel event;
//! 3. [`WaitSet::wait`] sleeps until a channel event, a [`Wakeup::ring`] or the timeout, and
//!    consumes what woke it. The CQs are then disarmed: arm again before the next wait.
//!
//! A spurious return (an event for a completion that step 2 already took) costs one extra
//! poll and is harmless.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use crate::cq::CompletionQueue;
use crate::error::{Error, Result};
use crate::sys;

/// A wake-up any thread can ring to end a [`WaitSet::wait`] early (or make the next one
/// return at once). Rings coalesce: many rings before a wait end one wait.
#[derive(Debug)]
pub struct Wakeup {
    fd: OwnedFd,
}

impl Wakeup {
    /// A new, un-rung wake-up.
    pub fn new() -> Result<Arc<Wakeup>> {
        // SAFETY: eventfd has no memory arguments; the result is checked below.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(Error::io("eventfd", "-", 0, "-", sys::last_os_error()));
        }
        // SAFETY: `fd` was just returned by eventfd, is valid and owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Arc::new(Wakeup { fd }))
    }

    /// Rings: the current or next wait returns. Never blocks.
    pub fn ring(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live local to an eventfd we own. A full counter
        // (EAGAIN) means it is rung already, which is all a ring needs, so the result is
        // deliberately ignored.
        let _ = unsafe {
            libc::write(
                self.fd.as_raw_fd(),
                (&raw const one).cast(),
                std::mem::size_of::<u64>(),
            )
        };
    }

    /// Clears the ring (non-blocking). Returns whether it was rung.
    fn clear(&self) -> bool {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a live local from a non-blocking eventfd we own; EAGAIN
        // (not rung) is a normal outcome.
        let n = unsafe {
            libc::read(
                self.fd.as_raw_fd(),
                (&raw mut v).cast(),
                std::mem::size_of::<u64>(),
            )
        };
        n == std::mem::size_of::<u64>() as isize
    }
}

/// Most CQs one [`WaitSet`] watches: a wait builds its `poll(2)` set on the stack, so that
/// sleeping and waking on the data path never allocates.
pub const MAX_WAIT_CQS: usize = 4;

/// Completion queues and a [`Wakeup`] that one thread sleeps on together.
#[derive(Debug, Clone)]
pub struct WaitSet {
    cqs: Vec<Arc<CompletionQueue>>,
    wake: Arc<Wakeup>,
}

impl WaitSet {
    /// Waits on `cqs` (each with its own completion channel; at most [`MAX_WAIT_CQS`]) and
    /// `wake`.
    pub fn new(cqs: Vec<Arc<CompletionQueue>>, wake: Arc<Wakeup>) -> Result<WaitSet> {
        if cqs.len() > MAX_WAIT_CQS {
            return Err(Error::InvalidConfig(format!(
                "a wait set watches at most {MAX_WAIT_CQS} completion queues, not {}",
                cqs.len()
            )));
        }
        Ok(WaitSet { cqs, wake })
    }

    /// The wake-up other threads ring.
    pub fn wakeup(&self) -> &Arc<Wakeup> {
        &self.wake
    }

    /// Requests a channel event for the next completion on every CQ. Poll the CQs after this
    /// and before [`WaitSet::wait`].
    pub fn arm(&self) -> Result<()> {
        self.cqs.iter().try_for_each(|cq| cq.arm())
    }

    /// Sleeps until a channel event of an armed CQ, a ring, or `timeout`; consumes what it
    /// found. Returns whether anything woke it (false: the timeout passed).
    pub fn wait(&self, timeout: Duration) -> Result<bool> {
        let idle = libc::pollfd {
            fd: -1,
            events: 0,
            revents: 0,
        };
        let mut all = [idle; MAX_WAIT_CQS + 1];
        let n = self.cqs.len() + 1;
        let fds = &mut all[..n];
        for (pfd, fd) in fds.iter_mut().zip(
            self.cqs
                .iter()
                .map(|cq| cq.channel_fd())
                .chain(std::iter::once(self.wake.fd.as_raw_fd())),
        ) {
            pfd.fd = fd;
            pfd.events = libc::POLLIN;
        }
        let woke =
            sys::wait_any(fds, timeout).map_err(|e| Error::io("poll(wait set)", "-", 0, "-", e))?;
        if !woke {
            return Ok(false);
        }
        for (cq, pfd) in self.cqs.iter().zip(fds.iter()) {
            if pfd.revents != 0 {
                cq.take_events()?;
            }
        }
        self.wake.clear();
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn a_ring_ends_one_wait_and_rings_coalesce() {
        let set = WaitSet::new(Vec::new(), Wakeup::new().unwrap()).unwrap();
        let t = Instant::now();
        assert!(
            !set.wait(Duration::from_millis(30)).unwrap(),
            "nothing rang"
        );
        assert!(
            t.elapsed() >= Duration::from_millis(25),
            "{:?}",
            t.elapsed()
        );

        set.wakeup().ring();
        set.wakeup().ring();
        assert!(
            set.wait(Duration::from_secs(10)).unwrap(),
            "rung before the wait"
        );
        assert!(
            !set.wait(Duration::from_millis(10)).unwrap(),
            "two rings end one wait, not two"
        );

        let wake = set.wakeup().clone();
        let ringer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            wake.ring();
        });
        let t = Instant::now();
        assert!(
            set.wait(Duration::from_secs(10)).unwrap(),
            "rung from another thread"
        );
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        ringer.join().unwrap();
    }
}
