//! The embedded log library: a replica on its own driver thread behind a thread-safe handle.
//!
//! ```text
//! let log = Log::open(config, fabric, fs, LogOptions::default())?;
//! let index = log.append(b"hello")?.wait(Duration::from_secs(1))?;   // blocking
//! let index = log.append(b"world")?.await?;                          // or as a Future
//! for entry in log.subscribe(1) { ... }                              // committed, in order
//! log.close()?;
//! ```
//!
//! The driver thread owns the loop of a production node: it polls the fabric, hands raft its
//! `Ready`s, ticks raft's clock, and wakes waiters when the commit index moves. How it waits
//! for work is the [`PollMode`]: busy (lowest latency, one core per node), adaptive (spin a
//! bounded time, then sleep) or event (sleep at once). It can be pinned to a core.
//!
//! Sleeping means blocking on the fabric's [`Waiter`] when it has one (RDMA: the CQs'
//! completion channels plus a wake-up that appends, connection results and `close` ring), until
//! an event or the next tick; a completion wakes the driver directly, with no timer in the
//! path. Without one (the simulator), adaptive naps 50 µs at a time and event mode waits for a
//! kick or at most 1 ms.
//!
//! Under [`PollMode::Busy`] the caller's own thread runs to completion: [`Log::append`] writes
//! the entry into the ring and posts its writes and messages in the call, and a caller that
//! waits on its handle ([`AppendHandle::wait`], [`AppendHandle::wait_for`]) polls the fabric,
//! hands raft its `Ready`s and resolves itself, with no hand-off to the driver thread and no
//! wake-up in between. Its pass stops at the events that commit its entry (an answer, or under
//! `Replicated` a write's completion); raft's `Ready` behind them, the apply and the answers
//! it sends are left to the next pass, the caller's next one or the driver's. One caller
//! drives at a time (others wait for its progress as in the other modes), holding that right
//! from its first pass to the end of its wait, and the driver keeps out of the way meanwhile,
//! except for raft's ticks, yielding its CPU in between (to the caller, the fabric's kernel
//! work or another replica on a shared core).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_utils::Backoff;
use fabric::{Fabric, Waiter};
use wal::fs::FileSystem;

use crate::node::{Committed, Released, Replica, Status, Ticket};
use crate::reads::ReadTicket;
use crate::{ReplicaConfig, ReplicaError};

/// How the driver thread waits for work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PollMode {
    /// Never sleeps: the production mode on a dedicated core. Between polls that find nothing
    /// it spins a little, then yields its CPU (on a dedicated core the yield returns at once;
    /// on a shared one the fabric's kernel work and other threads run instead of the loop).
    Busy,
    /// Spins up to `spin`, then sleeps until a fabric event, an append or the next tick: for
    /// shared cores.
    Adaptive {
        /// Spin budget after the last work.
        spin: Duration,
    },
    /// Sleeps as soon as there is no work, until a fabric event, an append or the next tick:
    /// the least CPU, one wake-up more per event than adaptive.
    Event,
}

/// Options of the driver.
#[derive(Clone, Copy, Debug)]
pub struct LogOptions {
    /// Real time per raft tick.
    pub tick: Duration,
    /// How the driver waits.
    pub poll: PollMode,
    /// Core to pin the driver thread to.
    pub pin_core: Option<usize>,
}

impl LogOptions {
    /// Refuses options the driver cannot run with, naming the field: a tick of zero or over
    /// [`MAX_TICK`], a `pin_core` this process may not run on. [`Log::open`] runs it.
    pub fn validate(&self) -> Result<(), ReplicaError> {
        if self.tick.is_zero() || self.tick > MAX_TICK {
            return Err(ReplicaError::Config {
                field: "tick",
                reason: format!("must be positive and at most {MAX_TICK:?}"),
            });
        }
        if let Some(core) = self.pin_core {
            // Tried on a thread of its own, as the driver will: a core outside this
            // process's current affinity (one `isolcpus` took out of the default mask, as
            // ops/GUIDE.md advises) is fine if the kernel lets a thread move there.
            let pinned = core < MAX_CORES
                && std::thread::spawn(move || pin_current_thread(core))
                    .join()
                    .unwrap_or(false);
            if !pinned {
                return Err(ReplicaError::Config {
                    field: "pin_core",
                    reason: format!(
                        "the kernel does not let a thread run on core {core} (no such core, \
                         offline, or outside this process's cpuset)"
                    ),
                });
            }
        }
        Ok(())
    }
}

impl Default for LogOptions {
    fn default() -> Self {
        LogOptions {
            tick: Duration::from_millis(10),
            poll: PollMode::Adaptive {
                spin: Duration::from_micros(200),
            },
            pin_core: None,
        }
    }
}

struct Shared<F: Fabric> {
    /// The replica while the log is open; once it closed (or was dropped), only what its
    /// handles may still ask ([`Released`]): the replica, its fabric and its peer links go at
    /// the close, not with the last handle.
    replica: Mutex<Slot<F>>,
    /// Signalled whenever the commit index moves or the driver stops.
    progress: Condvar,
    progress_lock: Mutex<u64>,
    /// The wakers of pending [`AppendHandle`] futures, one per handle (keyed by
    /// [`AppendHandle::waker_key`]): a future polled again replaces its own, so a handle
    /// re-polled while pending (a `select!` loop) does not grow the list.
    wakers: Mutex<std::collections::HashMap<u64, Waker>>,
    /// The next [`AppendHandle::waker_key`].
    next_waker_key: AtomicU64,
    stop: AtomicBool,
    kick: Condvar,
    kick_lock: Mutex<bool>,
    failure: Mutex<Option<String>>,
    /// Test-only: makes the driver panic at its next pass (see [`Log::inject_driver_panic`]).
    panic_for_test: AtomicBool,
    /// Test-only: the driver makes no pass while set (see [`Log::hold_driver_for_test`]).
    hold_for_test: AtomicBool,
    /// Test-only: a driver that panicked waits before its fail-stop while set, and says so in
    /// the second (see [`Log::hold_fail_stop_for_test`]).
    hold_fail_stop_for_test: AtomicBool,
    fail_stop_held_for_test: AtomicBool,
    /// Test-only: where a checkpoint waits (0: nowhere, else a [`CheckpointPause`] + 1), and
    /// whether one does (see [`Log::pause_checkpoint_for_test`]).
    checkpoint_pause_for_test: std::sync::atomic::AtomicU8,
    checkpoint_waiting_for_test: AtomicBool,
    /// How the driver waits; under `Busy` a waiting caller drives its own append.
    poll: PollMode,
    /// Whether a caller is driving the replica (`Busy` only); the driver then only ticks.
    caller_driving: AtomicBool,
    /// Passes the driver thread made (see [`Log::driver_passes_for_test`]).
    driver_passes: AtomicU64,
    /// Times the driver found itself ten ticks or more behind ([`Log::driver_stalls`]).
    driver_stalls: AtomicU64,
    /// The highest commit index a pass reached, so that waiters are woken once per move.
    commit: AtomicU64,
    /// Linearizable reads confirmed so far, so that their waiters are woken once per move.
    reads: AtomicU64,
}

/// Test-only: where [`Log::pause_checkpoint_for_test`] holds a checkpoint.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckpointPause {
    /// After its checks, before it reads the log.
    BeforeReading,
    /// After it read the log, before it takes the lock again to store the checkpoint.
    AfterReading,
}

/// The replica of an open log, or what remains of it once the log closed.
enum Slot<F: Fabric> {
    Open(Box<Replica<F>>),
    Released(Released),
}

/// The replica of an open log, locked: a guard of a [`Slot::Open`] (only made from one).
struct Locked<'a, F: Fabric>(MutexGuard<'a, Slot<F>>);

impl<'a, F: Fabric> Locked<'a, F> {
    /// The replica in `slot`, if the log has not released it.
    fn open(slot: MutexGuard<'a, Slot<F>>) -> Option<Self> {
        matches!(*slot, Slot::Open(_)).then_some(Locked(slot))
    }
}

impl<F: Fabric> std::ops::Deref for Locked<'_, F> {
    type Target = Replica<F>;

    fn deref(&self) -> &Replica<F> {
        match &*self.0 {
            Slot::Open(r) => r,
            Slot::Released(_) => unreachable!("a Locked guard is made of an open slot only"),
        }
    }
}

impl<F: Fabric> std::ops::DerefMut for Locked<'_, F> {
    fn deref_mut(&mut self) -> &mut Replica<F> {
        match &mut *self.0 {
            Slot::Open(r) => r,
            Slot::Released(_) => unreachable!("a Locked guard is made of an open slot only"),
        }
    }
}

impl<F: Fabric> Shared<F> {
    fn slot(&self) -> MutexGuard<'_, Slot<F>> {
        self.replica
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The replica, locked, for the log's own calls and its driver: they all end before the
    /// log releases the replica ([`Log::close`], or a `Log` dropped), so it is there.
    fn lock(&self) -> Locked<'_, F> {
        Locked::open(self.slot())
            .expect("the replica is released only once the log and its driver stopped")
    }

    /// Takes the replica out once the log stopped and leaves what its handles may still ask
    /// ([`Replica::released`]). A replica that poisoned itself (a close whose flush failed, a
    /// call that failed after the driver's last pass) or whose lock a panic poisoned (a close
    /// that panicked) is recorded as the log's failure first, and its handles get that, as
    /// before the release. The replica is dropped outside the lock. Idempotent.
    fn release(&self) {
        let lock_poisoned = self.replica.is_poisoned();
        let mut slot = self.slot();
        let Slot::Open(r) = &*slot else {
            return;
        };
        if let Some(p) = r.poisoned() {
            self.record_failure(p.to_owned());
        } else if lock_poisoned {
            self.record_failure(
                "a call panicked holding the replica; the log stopped and must be restarted".into(),
            );
        }
        let view = match self.failure() {
            None => r.released(),
            Some(_) => Released::default(),
        };
        let replica = std::mem::replace(&mut *slot, Slot::Released(view));
        drop(slot);
        drop(replica);
        self.wake_all();
    }

    /// The replica, locked, for a call that reads it or changes it: refused with the cause
    /// once the log failed. That includes the moment between a pass that panicked holding the
    /// lock (the lock is poisoned then) and the fail-stop recording the panic: the replica's
    /// state is unknown from the panic on, and nothing may read or cut its log.
    fn lock_unfailed(&self) -> Result<Locked<'_, F>, ReplicaError> {
        Locked::open(self.slot_unfailed()?).ok_or(ReplicaError::Closed)
    }

    /// [`Shared::lock_unfailed`]'s checks, for a handle that answers from the released state
    /// too once the log closed.
    fn slot_unfailed(&self) -> Result<MutexGuard<'_, Slot<F>>, ReplicaError> {
        let slot = self.replica.lock().map_err(|_| {
            ReplicaError::Poisoned(self.failure().unwrap_or_else(|| {
                "a pass panicked holding the replica; the log stopped and must be restarted".into()
            }))
        })?;
        if let Some(f) = self.failure() {
            return Err(ReplicaError::Poisoned(f));
        }
        // A pass that failed on a storage error or a failed device poisoned the replica and
        // released the lock before the driver records the failure: refused from then on too.
        if let Slot::Open(r) = &*slot {
            if let Some(p) = r.poisoned() {
                return Err(ReplicaError::Poisoned(p.to_owned()));
            }
        }
        Ok(slot)
    }

    /// [`Shared::lock_unfailed`], also refused once the log is closed.
    fn lock_live(&self) -> Result<Locked<'_, F>, ReplicaError> {
        let r = self.lock_unfailed()?;
        if self.stop.load(Ordering::Acquire) {
            return Err(ReplicaError::Closed);
        }
        Ok(r)
    }

    /// Test-only: waits here at `stage`, outside the replica's lock, while a test holds a
    /// checkpoint there ([`Log::pause_checkpoint_for_test`]).
    fn pause_checkpoint_for_test(&self, stage: CheckpointPause) {
        let at = stage as u8 + 1;
        // One checkpoint waits, the first to come; the others go on.
        if self.checkpoint_pause_for_test.load(Ordering::Acquire) != at
            || self
                .checkpoint_waiting_for_test
                .swap(true, Ordering::AcqRel)
        {
            return;
        }
        while self.checkpoint_pause_for_test.load(Ordering::Acquire) == at {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        self.checkpoint_waiting_for_test
            .store(false, Ordering::Release);
    }

    /// Test-only: waits while a test holds the fail-stop of a driver whose pass failed or
    /// panicked ([`Log::hold_fail_stop_for_test`]), saying so.
    fn hold_fail_stop_if_asked(&self) {
        while self.hold_fail_stop_for_test.load(Ordering::Acquire) {
            self.fail_stop_held_for_test.store(true, Ordering::Release);
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Fail-stop: records why the driver stopped, stops it, and wakes every waiter, which then
    /// gets [`ReplicaError::Poisoned`] with the cause.
    fn fail(&self, why: String) {
        self.record_failure(why);
        self.wake_all();
    }

    /// [`Shared::fail`] without the wake-up, for a caller that holds the replica's lock.
    fn record_failure(&self, why: String) {
        self.failure
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get_or_insert(why);
        self.stop.store(true, Ordering::Release);
    }

    fn failure(&self) -> Option<String> {
        self.failure
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn wake_all(&self) {
        self.progress.notify_all();
        // Woken outside the lock: a wake may drop the last reference to the task that owns a
        // handle, whose drop takes this lock to remove its waker.
        let wakers = std::mem::take(
            &mut *self
                .wakers
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        for (_, w) in wakers {
            w.wake();
        }
    }

    /// Records the commit index a pass (the driver's or a caller's) reached, and wakes every
    /// waiter when it moved.
    fn publish_commit(&self, commit: u64) {
        if commit > self.commit.fetch_max(commit, Ordering::AcqRel) {
            *self
                .progress_lock
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = commit;
            self.wake_all();
        }
    }

    /// Records how many linearizable reads are confirmed, and wakes every waiter when that
    /// moved.
    fn publish_reads(&self, confirmed: u64) {
        if confirmed > self.reads.fetch_max(confirmed, Ordering::AcqRel) {
            // Taken so a waiter between its check and its wait cannot miss the wake-up.
            drop(
                self.progress_lock
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner),
            );
            self.wake_all();
        }
    }

    /// A pass of the replica's loop made on a caller's thread (`Busy`): a failure or a panic
    /// fail-stops the log exactly as it would on the driver thread, and the caller gets the
    /// cause.
    ///
    /// A caller waiting on `waiting` stops its pass at the events that resolve it
    /// ([`Replica::process_until_resolved`]); the next pass, its own or the driver's, does the
    /// rest.
    ///
    /// `then` runs on the replica after the pass, still under its lock; the waiters are woken
    /// after the lock is released, for a waker may poll a handle at once, on this thread.
    fn caller_pass<T>(
        &self,
        mut r: Locked<'_, F>,
        waiting: Option<Ticket>,
        then: impl FnOnce(&mut Replica<F>) -> T,
    ) -> Result<T, ReplicaError> {
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match waiting {
            Some(t) => r.process_until_resolved(t),
            None => r.process(),
        }));
        let why = match result {
            Ok(Ok(())) => {
                let (commit, reads) = (r.commit_index(), r.reads_confirmed());
                let out = then(&mut r);
                drop(r);
                self.publish_commit(commit);
                self.publish_reads(reads);
                return Ok(out);
            }
            Ok(Err(e)) => e.poison_cause(),
            Err(panic) => {
                let what = panic_message(panic.as_ref());
                tracing::error!(node = r.id(), panic = %what, "a pass driven by a caller panicked: the log stopped (fail-stop)");
                format!(
                    "a pass driven by a caller panicked ({what}); the log stopped and must be restarted"
                )
            }
        };
        // Recorded before the lock is released (no call may find the replica unrefused),
        // woken after.
        self.record_failure(why.clone());
        drop(r);
        self.wake_all();
        Err(ReplicaError::Poisoned(why))
    }

    /// Polls `ready` until it gives a value, sleeping on progress in between (see
    /// [`Shared::wait_progress`]); `None` once `timeout` passed.
    fn wait_until<T>(&self, timeout: Duration, mut ready: impl FnMut() -> Option<T>) -> Option<T> {
        let deadline = deadline_in(timeout);
        loop {
            if let Some(v) = ready() {
                return Some(v);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            self.wait_progress(left);
        }
    }

    /// Sleeps until the commit index moves (or the driver stops), at most `left`, and never
    /// longer than 10 ms so a waiter re-checks its own condition even if a wake-up is missed.
    fn wait_progress(&self, left: Duration) {
        let g = self
            .progress_lock
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let _ = self
            .progress
            .wait_timeout(g, left.min(Duration::from_millis(10)));
    }

    /// Wakes a driver that waits on the kick condvar (no fabric waiter, or a waiter error).
    fn kick_condvar(&self) {
        *self
            .kick_lock
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = true;
        self.kick.notify_one();
    }
}

/// A replicated log with its driver thread.
pub struct Log<F: Fabric + Send + 'static> {
    shared: Arc<Shared<F>>,
    driver: Option<JoinHandle<()>>,
    /// The fabric's event wait, when it has one: the driver sleeps on the completion channels
    /// and a wake-up instead of a timer, and [`Log::kick`] rings it. Held here and by the
    /// driver thread, not by the handles: it keeps the device's completion queues, so it goes
    /// with the log.
    waiter: Option<Arc<dyn Waiter>>,
}

impl<F: Fabric + Send + 'static> std::fmt::Debug for Log<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Log")
            .field("id", &self.shared.lock().id())
            .finish_non_exhaustive()
    }
}

impl<F: Fabric + Send + 'static> Log<F> {
    /// Opens the replica and starts its driver thread.
    pub fn open(
        config: ReplicaConfig,
        fabric: F,
        fs: Arc<dyn FileSystem>,
        options: LogOptions,
    ) -> Result<Self, ReplicaError> {
        options.validate()?;
        let waiter = fabric.waiter();
        let replica = Replica::open(config, fabric, fs)?;
        let shared = Arc::new(Shared {
            replica: Mutex::new(Slot::Open(Box::new(replica))),
            progress: Condvar::new(),
            progress_lock: Mutex::new(0),
            wakers: Mutex::new(std::collections::HashMap::new()),
            next_waker_key: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            kick: Condvar::new(),
            kick_lock: Mutex::new(false),
            failure: Mutex::new(None),
            panic_for_test: AtomicBool::new(false),
            hold_for_test: AtomicBool::new(false),
            hold_fail_stop_for_test: AtomicBool::new(false),
            fail_stop_held_for_test: AtomicBool::new(false),
            checkpoint_pause_for_test: std::sync::atomic::AtomicU8::new(0),
            checkpoint_waiting_for_test: AtomicBool::new(false),
            poll: options.poll,
            caller_driving: AtomicBool::new(false),
            driver_passes: AtomicU64::new(0),
            driver_stalls: AtomicU64::new(0),
            commit: AtomicU64::new(0),
            reads: AtomicU64::new(0),
        });
        let s = shared.clone();
        let driver = std::thread::Builder::new()
            .name("rdmalog-driver".into())
            .spawn({
                let waiter = waiter.clone();
                move || drive(s, options, waiter)
            })
            .map_err(|e| ReplicaError::Config {
                field: "driver",
                reason: format!("cannot start the driver thread: {e}"),
            })?;
        Ok(Log {
            shared,
            driver: Some(driver),
            waiter,
        })
    }

    /// Wakes the driver: through the fabric's waiter when there is one (one `write(2)` per
    /// append), else through the kick condvar. A driver that fell back to timed sleeps after a
    /// waiter error still polls within 1 ms.
    fn kick(&self) {
        match &self.waiter {
            Some(w) => w.wake(),
            None => self.shared.kick_condvar(),
        }
    }

    /// After a proposal, with the replica still locked: under `Busy` the caller's own pass
    /// writes it into the ring and posts it; otherwise the driver is woken to do so.
    fn after_propose(&self, r: Locked<'_, F>) -> Result<(), ReplicaError> {
        if self.shared.poll == PollMode::Busy {
            return self.shared.caller_pass(r, None, |_| ());
        }
        drop(r);
        self.kick();
        Ok(())
    }

    /// Proposes one entry; the handle resolves to its index once committed. Under
    /// [`PollMode::Busy`] the entry's writes and messages are posted before this returns.
    pub fn append(&self, data: &[u8]) -> Result<AppendHandle<F>, ReplicaError> {
        let mut r = self.shared.lock_live()?;
        let ticket = r.propose(data)?;
        self.after_propose(r)?;
        Ok(AppendHandle::new(&self.shared, ticket))
    }

    /// Proposes several entries in order, as one raft proposal: they get consecutive indexes,
    /// or (on an error) none of them is in the log. Once proposed, each handle resolves on its
    /// own: a change of leader may keep a prefix of the batch and replace the rest. Under
    /// [`PollMode::Busy`] their writes and messages are posted before this returns.
    pub fn append_batch(&self, items: &[&[u8]]) -> Result<Vec<AppendHandle<F>>, ReplicaError> {
        self.propose_with(|r| r.propose_batch(items))
    }

    /// Opens a client session for exactly-once appends ([`crate::sessions`]): the handle
    /// resolves to the session's id (the index of the entry that opened it) once committed.
    pub fn open_session(&self) -> Result<AppendHandle<F>, ReplicaError> {
        let mut h = self.propose_with(|r| r.open_session().map(|t| vec![t]))?;
        Ok(h.remove(0))
    }

    /// Appends `data` as number `seq` of session `session` (numbers start at 1 and go up by
    /// one per entry): the idempotency key of an application that retries after `Timeout` or a
    /// crash of its own. Sent again with the same number, it is not appended a second time;
    /// the handle resolves to the index the first copy got. `UnknownSession` once the session
    /// expired, `SessionSequence` if `seq` skips ahead of the session's next number.
    pub fn append_in_session(
        &self,
        session: u64,
        seq: u64,
        data: &[u8],
    ) -> Result<AppendHandle<F>, ReplicaError> {
        let mut h = self.append_batch_in_session(session, seq, &[data])?;
        Ok(h.remove(0))
    }

    /// [`Log::append_in_session`] for several entries, numbered `first_seq` on: those the log
    /// already holds resolve to their copies, the rest are proposed as one raft proposal.
    pub fn append_batch_in_session(
        &self,
        session: u64,
        first_seq: u64,
        items: &[&[u8]],
    ) -> Result<Vec<AppendHandle<F>>, ReplicaError> {
        self.propose_with(|r| r.propose_in_session(session, first_seq, items))
    }

    /// Proposes what `propose` proposes on the locked replica, then hands out a handle per
    /// ticket.
    fn propose_with(
        &self,
        propose: impl FnOnce(&mut Replica<F>) -> Result<Vec<Ticket>, ReplicaError>,
    ) -> Result<Vec<AppendHandle<F>>, ReplicaError> {
        let mut r = self.shared.lock_live()?;
        let tickets = propose(&mut r)?;
        self.after_propose(r)?;
        Ok(tickets
            .into_iter()
            .map(|ticket| AppendHandle::new(&self.shared, ticket))
            .collect())
    }

    /// Starts a linearizable read: on the leader, the handle resolves to a *read index* once a
    /// majority confirmed this node still leads (raft's ReadIndex, see [`crate::reads`]); from
    /// then on [`Log::read`] and [`Log::subscribe`] here see every entry the cluster had
    /// committed when this was called. `NotLeader` (with the leader it knows) on any other
    /// node, or if this one stops leading first.
    pub fn read_index(&self) -> Result<ReadHandle<F>, ReplicaError> {
        let mut r = self.shared.lock_live()?;
        let ticket = r.read_index()?;
        self.after_propose(r)?;
        Ok(ReadHandle {
            shared: self.shared.clone(),
            ticket,
            spent: false,
        })
    }

    /// This replica's commit index.
    pub fn commit_index(&self) -> u64 {
        self.shared.lock().commit_index()
    }

    /// Waits until this replica has committed `index` (on any replica: "read your writes" with
    /// the index an append returned, then [`Log::read`] here sees it). `Timeout` if it has not
    /// within `timeout`.
    pub fn wait_for_commit(&self, index: u64, timeout: Duration) -> Result<(), ReplicaError> {
        let s = &self.shared;
        s.wait_until(timeout, || match s.lock_live() {
            Err(e) => Some(Err(e)),
            Ok(r) => (r.commit_index() >= index).then_some(Ok(())),
        })
        .unwrap_or(Err(ReplicaError::Timeout { index }))
    }

    /// Sleeps until the commit index moves or a linearizable read is confirmed (or the log
    /// stops), at most `timeout`: for a caller polling [`ReadHandle::try_result`] among other
    /// work.
    pub fn wait_for_progress(&self, timeout: Duration) {
        self.shared.wait_progress(timeout);
    }

    /// [`Log::append_batch`] on a condition: only if the log ends at `expected_last` (its last
    /// index, committed or not) when the batch is ordered on the leader, so that if it
    /// commits, its first entry is at `expected_last + 1` (optimistic concurrency: read to the
    /// end, then append only if nobody appended since). Otherwise
    /// [`ReplicaError::ConditionFailed`] names where the log ends.
    pub fn append_batch_if(
        &self,
        items: &[&[u8]],
        expected_last: u64,
    ) -> Result<Vec<AppendHandle<F>>, ReplicaError> {
        self.propose_with(|r| r.propose_batch_if(items, expected_last))
    }

    /// The application payload at committed `index`; `None` if not committed or not an
    /// application entry (raft's no-ops and membership changes), [`ReplicaError::Compacted`]
    /// if committed and no longer held (deleted after a checkpoint: restore from
    /// [`Log::latest_checkpoint`]), as a subscription reports it.
    pub fn read(&self, index: u64) -> Result<Option<Vec<u8>>, ReplicaError> {
        let mut buf = Vec::new();
        let r = self.shared.lock_live()?;
        if let Some(e) = r.compacted(index) {
            return Err(e);
        }
        match r.read(index, &mut buf)? {
            Some(Committed::Application { .. }) => Ok(Some(buf)),
            _ => Ok(None),
        }
    }

    /// Committed application entries from `from` on, in order, blocking for new ones.
    pub fn subscribe(&self, from: u64) -> Subscription<F> {
        Subscription {
            shared: self.shared.clone(),
            next: from.max(1),
        }
    }

    /// Deletes entries below `index` after the application checkpointed them elsewhere (see
    /// [`Replica::truncate_prefix`](crate::Replica::truncate_prefix)).
    pub fn truncate_prefix(&self, index: u64) -> Result<u64, ReplicaError> {
        match self.checkpoint_where(&[], |r| r.truncation_checkpoint(index))? {
            Some(first) => Ok(first),
            None => Ok(self.shared.lock_live()?.first_index()),
        }
    }

    /// Applies a retention policy to this node's log ([`crate::retention`]) as of `now`:
    /// deletes the entries below the first index every limit lets it keep, through a
    /// checkpoint without state, when that deletes at least one segment. Returns the new
    /// first index, `None` when nothing was deleted.
    pub fn apply_retention(
        &self,
        policy: &crate::retention::Retention,
        now: std::time::SystemTime,
    ) -> Result<Option<u64>, ReplicaError> {
        if policy.is_unlimited() {
            return Ok(None);
        }
        self.checkpoint_where(&[], |r| {
            let held = r.retention_view();
            let keep = policy.first_to_keep(&held, now, |b| r.first_within_bytes(b));
            if !crate::retention::Retention::deletes_a_segment(&held, keep) {
                return None;
            }
            r.truncation_checkpoint(keep)
        })
    }

    /// Records the application's `state` after applying entries up to `index`, then deletes
    /// those entries; followers that fall behind get it as a snapshot (see
    /// [`Replica::checkpoint`](crate::Replica::checkpoint)).
    pub fn checkpoint(&self, index: u64, state: &[u8]) -> Result<u64, ReplicaError> {
        match self.checkpoint_where(state, |_| Some(index))? {
            Some(first) => Ok(first),
            None => unreachable!("a checkpoint at a given index always has an answer"),
        }
    }

    /// A checkpoint of `state` at the index `at` picks (`None`: none to take), in three steps:
    /// its checks under the replica's lock, the reading of the log its session table needs
    /// without the lock (every entry after the latest checkpoint up to its index: a trim or a
    /// retention pass reads back all it deletes, tens of milliseconds per 64 MiB segment, while
    /// the driver goes on), then storing it and cutting the log under the lock again. Planned
    /// anew when another checkpoint came in between. The new first index, `None` when `at`
    /// picked none.
    fn checkpoint_where(
        &self,
        state: &[u8],
        at: impl Fn(&Replica<F>) -> Option<u64>,
    ) -> Result<Option<u64>, ReplicaError> {
        loop {
            let plan = {
                let r = self.shared.lock_live()?;
                let Some(index) = at(&r) else {
                    return Ok(None);
                };
                match r.plan_checkpoint(index, state.len())? {
                    crate::node::Plan::Nothing { first } => return Ok(Some(first)),
                    crate::node::Plan::Read(plan) => plan,
                }
            };
            self.shared
                .pause_checkpoint_for_test(CheckpointPause::BeforeReading);
            let table = plan.read_sessions();
            self.shared
                .pause_checkpoint_for_test(CheckpointPause::AfterReading);
            // The log may have failed while the lock was not held: a replica in an unknown
            // state stores no checkpoint and cuts nothing.
            let mut r = self.shared.lock_live()?;
            let table = match table {
                Ok(t) => t,
                Err(e) => {
                    r.after_failed_reading(&plan, e)?;
                    continue;
                }
            };
            if let Some(first) = r.finish_checkpoint(plan, table, state)? {
                return Ok(Some(first));
            }
        }
    }

    /// The latest checkpoint, taken here or installed from the leader: what an application
    /// restores from when a read or a subscription reports [`ReplicaError::Compacted`].
    pub fn latest_checkpoint(&self) -> Option<crate::Checkpoint> {
        self.shared.lock().latest_checkpoint()
    }

    /// The replica's state; `failure` says why the log stopped, once it did.
    pub fn status(&self) -> Status {
        let mut s = self.shared.lock().status();
        if let Some(f) = self.shared.failure() {
            s.failure = Some(f);
        }
        s
    }

    /// The leader this node knows of.
    pub fn leader(&self) -> Option<u64> {
        self.shared.lock().leader()
    }

    /// Hands leadership to `to`; refused once the log failed or closed.
    pub fn transfer_leader(&self, to: u64) -> Result<(), ReplicaError> {
        self.shared.lock_live()?.transfer_leader(to);
        self.kick();
        Ok(())
    }

    /// Adds a voter (joint consensus through raft-rs); resolves when the change commits.
    pub fn add_node(&self, id: u64) -> Result<AppendHandle<F>, ReplicaError> {
        self.change_membership(id, true)
    }

    /// Removes a voter; resolves when the change commits.
    pub fn remove_node(&self, id: u64) -> Result<AppendHandle<F>, ReplicaError> {
        self.change_membership(id, false)
    }

    fn change_membership(&self, id: u64, add: bool) -> Result<AppendHandle<F>, ReplicaError> {
        let ticket = self.shared.lock_live()?.change_membership(id, add)?;
        self.kick();
        Ok(AppendHandle::new(&self.shared, ticket))
    }

    /// Stops the driver, fails pending waits with [`ReplicaError::Closed`], closes the wal,
    /// and drops the replica: its fabric (the peer port, the links), its raft state and its
    /// ring go now, even while handles and subscriptions of the log live on (they answer from
    /// what was settled at the close: an entry committed before it resolves `Ok`, a pending
    /// one `Closed`). After a failure of the driver (see [`Log::failure`]) it only stops:
    /// the replica's state is not trusted to flush, and under `Durability::Memory` its ring
    /// files stay for the next start to recover from; the error names the failure.
    pub fn close(mut self) -> Result<(), ReplicaError> {
        self.stop_driver();
        let closed = {
            // Checked under the lock: a `Busy` caller's pass may fail until the lock is ours.
            let mut r = self.shared.lock();
            match self
                .shared
                .failure()
                .or_else(|| r.poisoned().map(str::to_owned))
            {
                Some(f) => Err(ReplicaError::Poisoned(f)),
                None => r.flush(),
            }
        };
        self.shared.release();
        closed
    }

    /// Why the log stopped working, once its driver failed (a storage error poisoned the
    /// replica, or a pass panicked, on the driver thread or a caller's): every pending handle
    /// and subscription, and every later call that reads the log or changes it (appends,
    /// reads, waits for a commit, checkpoints, trims, retention, membership and leadership
    /// changes), fails with this cause. [`Log::status`], [`Log::commit_index`], [`Log::leader`] and
    /// [`Log::latest_checkpoint`] go on answering, from the state at the failure. A server
    /// should exit non-zero so that its supervisor restarts it.
    pub fn failure(&self) -> Option<String> {
        self.shared.failure()
    }

    /// How many times the driver thread found itself ten ticks or more behind, each logged
    /// as "the driver fell behind its ticks" (ops/GUIDE.md 2): a leader stalled that long
    /// lets its followers' election timers run out.
    pub fn driver_stalls(&self) -> u64 {
        self.shared.driver_stalls.load(Ordering::Relaxed)
    }

    /// Test-only: makes the driver thread panic at its next pass, to check the fail-stop.
    #[doc(hidden)]
    pub fn inject_driver_panic(&self) {
        self.shared.panic_for_test.store(true, Ordering::Release);
        self.kick();
    }

    /// Test-only: while `hold` is set the driver thread makes no pass (not even a tick), to
    /// show that a caller under [`PollMode::Busy`] runs its own append to completion.
    #[doc(hidden)]
    pub fn hold_driver_for_test(&self, hold: bool) {
        self.shared.hold_for_test.store(hold, Ordering::Release);
    }

    /// Test-only: while `hold` is set, a driver thread whose pass panicked (its replica's
    /// lock is poisoned meanwhile) or failed (the replica poisoned itself) waits before its
    /// fail-stop records the failure, to show that no call reads or changes a replica in
    /// that state.
    #[doc(hidden)]
    pub fn hold_fail_stop_for_test(&self, hold: bool) {
        self.shared
            .hold_fail_stop_for_test
            .store(hold, Ordering::Release);
    }

    /// Test-only: whether a driver whose pass panicked or failed waits at
    /// [`Log::hold_fail_stop_for_test`].
    #[doc(hidden)]
    pub fn fail_stop_held_for_test(&self) -> bool {
        self.shared.fail_stop_held_for_test.load(Ordering::Acquire)
    }

    /// Test-only: how many wakers of pending [`AppendHandle`] futures the log keeps.
    #[doc(hidden)]
    pub fn pending_wakers_for_test(&self) -> usize {
        self.shared
            .wakers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .len()
    }

    /// Test-only: while `at` is set, the first checkpoint to come (a trim, a retention pass)
    /// waits there, without the replica's lock (later ones go on); to show that the log serves
    /// meanwhile, and that a checkpoint taken in between makes it plan again.
    #[doc(hidden)]
    pub fn pause_checkpoint_for_test(&self, at: Option<CheckpointPause>) {
        self.shared
            .checkpoint_pause_for_test
            .store(at.map_or(0, |a| a as u8 + 1), Ordering::Release);
    }

    /// Test-only: whether a checkpoint waits at [`Log::pause_checkpoint_for_test`].
    #[doc(hidden)]
    pub fn checkpoint_waiting_for_test(&self) -> bool {
        self.shared
            .checkpoint_waiting_for_test
            .load(Ordering::Acquire)
    }

    /// Test-only: the passes the driver thread has made so far, to show that it keeps off
    /// the replica while a caller drives (`Busy`), but for its ticks.
    #[doc(hidden)]
    pub fn driver_passes_for_test(&self) -> u64 {
        self.shared.driver_passes.load(Ordering::Relaxed)
    }

    /// Test-only: whether a caller holds the right to drive the replica (`Busy`).
    #[doc(hidden)]
    pub fn caller_driving_for_test(&self) -> bool {
        self.shared.caller_driving.load(Ordering::Acquire)
    }

    fn stop_driver(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.kick();
        if let Some(d) = self.driver.take() {
            let _ = d.join();
        }
        self.shared.wake_all();
    }
}

impl<F: Fabric + Send + 'static> Drop for Log<F> {
    fn drop(&mut self) {
        if self.driver.is_some() {
            // Fallback only: close() reports errors, Drop can just stop the thread, and drop
            // the replica unflushed, as a process exit would.
            self.stop_driver();
        }
        // Also after a close that panicked before its release.
        self.shared.release();
    }
}

/// The driver thread: [`drive_loop`], failing stop if it panics. A panic leaves the replica
/// in an unknown state, so nothing may go on using it: pending handles and subscriptions get
/// the cause, and the server exits.
fn drive<F: Fabric + Send + 'static>(
    s: Arc<Shared<F>>,
    o: LogOptions,
    waiter: Option<Arc<dyn Waiter>>,
) {
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drive_loop(&s, o, waiter)));
    if let Err(panic) = r {
        s.hold_fail_stop_if_asked();
        let what = panic_message(panic.as_ref());
        let id = s.lock().id();
        tracing::error!(node = id, panic = %what, "the driver thread panicked: the log stopped (fail-stop)");
        s.fail(format!(
            "the driver thread panicked ({what}); the log stopped and must be restarted"
        ));
    }
}

/// The message a panic carried.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|m| (*m).to_owned()))
        .unwrap_or_else(|| "a panic without a message".into())
}

/// Cores a driver may be pinned to: `0..MAX_CORES` (the kernel's `CPU_SETSIZE`).
const MAX_CORES: usize = 1024;

/// Pins the calling thread to `core` (below [`MAX_CORES`]); whether the kernel allowed it.
fn pin_current_thread(core: usize) -> bool {
    core_affinity::set_for_current(core_affinity::CoreId { id: core })
}

/// The longest [`LogOptions::tick`]: raft's timeouts are a few dozen ticks.
pub const MAX_TICK: Duration = Duration::from_secs(60);

/// The instant `timeout` from now; a timeout too long for the clock (`Duration::MAX` for "no
/// limit") gives one so far away that it never comes.
fn deadline_in(timeout: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(timeout)
        .unwrap_or_else(|| now + Duration::from_secs(u64::from(u32::MAX)))
}

/// Ticks the driver may fall behind before it logs a warning: well under an election
/// timeout's worth at the node's defaults (20 to 30 ticks).
const STALL_TICKS: u32 = 10;

fn drive_loop<F: Fabric + Send + 'static>(
    s: &Shared<F>,
    o: LogOptions,
    mut waiter: Option<Arc<dyn Waiter>>,
) {
    if let Some(core) = o.pin_core {
        let pinned = core < MAX_CORES && pin_current_thread(core);
        if !pinned {
            s.fail(format!("cannot pin the driver to core {core}"));
            return;
        }
    }
    let mut next_tick = Instant::now() + o.tick;
    let mut idle_since: Option<Instant> = None;
    let backoff = Backoff::new();
    let mut armed = false;
    while !s.stop.load(Ordering::Acquire) {
        if s.hold_for_test.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(1));
            continue;
        }
        if s.caller_driving.load(Ordering::Acquire) && Instant::now() < next_tick {
            // A caller runs its append to completion (Busy): stay off the lock until the
            // next tick is due, and off the CPU while anything else wants it (on a dedicated
            // core the yield returns at once; on a shared one the caller, the fabric's kernel
            // work or another replica runs instead of this loop).
            std::thread::yield_now();
            continue;
        }
        let (result, progress, busy) = {
            let asked = Instant::now();
            let mut r = s.lock();
            if s.panic_for_test.swap(false, Ordering::AcqRel) {
                panic!("a panic injected by a test");
            }
            let now = Instant::now();
            // A driver that falls many ticks behind lets followers time out (or, as a
            // follower, misses the leader): say why, so an unexpected election can be traced.
            let behind = now.saturating_duration_since(next_tick);
            if behind >= o.tick * STALL_TICKS {
                s.driver_stalls.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    node = r.id(),
                    behind_ms = behind.as_millis() as u64,
                    lock_wait_ms = now.duration_since(asked).as_millis() as u64,
                    "the driver fell behind its ticks (lock_wait_ms: time spent waiting for \
                     the replica lock held by a caller; the rest: a long pass or no CPU)"
                );
            }
            if now >= next_tick {
                r.tick();
                // After a stall (a long fsync, a pause) tick once and move on: a burst of
                // catch-up ticks would make the leader step down and followers campaign.
                next_tick = (next_tick + o.tick).max(now);
            }
            let before = r.work_counter();
            let result = r.process();
            s.driver_passes.fetch_add(1, Ordering::Relaxed);
            (
                result,
                (r.commit_index(), r.reads_confirmed()),
                r.work_counter() != before,
            )
        };
        if let Err(e) = result {
            s.hold_fail_stop_if_asked();
            s.fail(e.poison_cause());
            return;
        }
        let (commit, reads) = progress;
        s.publish_commit(commit);
        s.publish_reads(reads);
        if busy {
            idle_since = None;
            backoff.reset();
            continue;
        }
        let sleep = match o.poll {
            PollMode::Busy => {
                // Never sleeps; spins a little, then yields between polls, so that on a shared
                // core the fabric's kernel work and the other replicas run (on a dedicated one
                // the yield returns at once).
                backoff.snooze();
                false
            }
            PollMode::Adaptive { spin } => {
                let since = *idle_since.get_or_insert_with(Instant::now);
                if since.elapsed() < spin {
                    backoff.snooze();
                    false
                } else {
                    true
                }
            }
            PollMode::Event => true,
        };
        if !sleep {
            continue;
        }
        let until_tick = next_tick.saturating_duration_since(Instant::now());
        match &waiter {
            // Arm, then go round once more: process() polls the fabric after the arm, so an
            // event that raced in before it is not slept through.
            Some(w) if !armed => match w.arm() {
                Ok(()) => armed = true,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot arm the fabric's event wait; falling back to timed sleeps");
                    waiter = None;
                }
            },
            Some(w) => {
                armed = false;
                if let Err(e) = w.wait(until_tick) {
                    tracing::warn!(error = %e, "the fabric's event wait failed; falling back to timed sleeps");
                    waiter = None;
                }
            }
            // No event source to sleep on (the simulator): adaptive naps, event mode waits
            // for a kick or the next tick.
            None if matches!(o.poll, PollMode::Adaptive { .. }) => {
                std::thread::sleep(Duration::from_micros(50));
            }
            None => {
                let wait = until_tick.min(Duration::from_millis(1));
                let mut kicked = s
                    .kick_lock
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                if !*kicked {
                    kicked = s
                        .kick
                        .wait_timeout(kicked, wait)
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .0;
                }
                *kicked = false;
            }
        }
    }
}

/// A linearizable read in flight ([`Log::read_index`]).
pub struct ReadHandle<F: Fabric + Send + 'static> {
    shared: Arc<Shared<F>>,
    ticket: ReadTicket,
    /// Resolved: the replica has forgotten it.
    spent: bool,
}

impl<F: Fabric + Send + 'static> std::fmt::Debug for ReadHandle<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadHandle")
            .field("ticket", &self.ticket)
            .finish()
    }
}

impl<F: Fabric + Send + 'static> ReadHandle<F> {
    /// The read index once it is confirmed and committed here, `Err(NotLeader)` if this node
    /// stopped leading first, `None` while pending. Never blocks.
    pub fn try_result(&mut self) -> Option<Result<u64, ReplicaError>> {
        if self.spent {
            return Some(Err(ReplicaError::Closed));
        }
        let r = match self.shared.slot_unfailed() {
            Ok(mut slot) => match &mut *slot {
                Slot::Open(r) => r.read_status(self.ticket),
                Slot::Released(r) => r.read_status(self.ticket),
            },
            Err(e) => return Some(Err(e)),
        };
        // A read confirmed before the log closed still resolves; one still pending is
        // `Closed`.
        let r = match r {
            None if self.shared.stop.load(Ordering::Acquire) => Some(Err(ReplicaError::Closed)),
            r => r,
        };
        self.spent = r.is_some();
        r
    }

    /// Waits at most `timeout` for the read to resolve; `Timeout` if it has not (a majority
    /// may be unreachable: nothing was read).
    pub fn wait(mut self, timeout: Duration) -> Result<u64, ReplicaError> {
        let shared = self.shared.clone();
        shared
            .wait_until(timeout, || self.try_result())
            .unwrap_or(Err(ReplicaError::ReadTimeout {
                waited_ms: timeout.as_millis() as u64,
            }))
    }
}

impl<F: Fabric + Send + 'static> Drop for ReadHandle<F> {
    fn drop(&mut self) {
        if !self.spent {
            if let Slot::Open(r) = &mut *self.shared.slot() {
                r.forget_read(self.ticket);
            }
        }
    }
}

/// An append in flight: wait for it with a timeout, or `.await` it (no runtime needed).
pub struct AppendHandle<F: Fabric + Send + 'static> {
    shared: Arc<Shared<F>>,
    ticket: Ticket,
    /// Where this handle's waker is kept while it is pending as a future, once polled.
    waker_key: Option<u64>,
}

impl<F: Fabric + Send + 'static> std::fmt::Debug for AppendHandle<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppendHandle")
            .field("ticket", &self.ticket)
            .finish()
    }
}

impl<F: Fabric + Send + 'static> AppendHandle<F> {
    fn new(shared: &Arc<Shared<F>>, ticket: Ticket) -> Self {
        AppendHandle {
            shared: shared.clone(),
            ticket,
            waker_key: None,
        }
    }

    /// The index the entry was given (committed only once the handle resolves `Ok`).
    pub fn ticket(&self) -> Ticket {
        self.ticket
    }

    /// The entry's outcome: the failure once the log failed; else what the replica knows of
    /// the ticket (an entry committed before [`Log::close`] resolves `Ok` after it too), and
    /// `Closed` for one still pending once the log closed.
    fn status(&self) -> Option<Result<u64, ReplicaError>> {
        let r = match self.shared.slot_unfailed() {
            Ok(slot) => match &*slot {
                Slot::Open(r) => r.ticket_status(self.ticket),
                Slot::Released(r) => r.ticket_status(self.ticket),
            },
            Err(e) => return Some(Err(e)),
        };
        match r {
            None if self.shared.stop.load(Ordering::Acquire) => Some(Err(ReplicaError::Closed)),
            r => r,
        }
    }

    /// The outcome if the entry is resolved (committed, superseded, or the log failed);
    /// `None` while it is pending. Never blocks.
    pub fn try_result(&self) -> Option<Result<u64, ReplicaError>> {
        self.status()
    }

    /// Waits at most `timeout` for the entry to resolve, without consuming the handle;
    /// `None` if it is still pending. Under [`PollMode::Busy`] the waiting thread drives the
    /// replica itself (see the module doc).
    pub fn wait_for(&self, timeout: Duration) -> Option<Result<u64, ReplicaError>> {
        let deadline = deadline_in(timeout);
        // Under `Busy`, the right to drive, held from the first pass to the end of the wait:
        // the driver stays off the lock meanwhile (but for its ticks).
        let mut driving = None;
        let backoff = Backoff::new();
        loop {
            if let Some(r) = self.drive_or_check(&mut driving) {
                return Some(r);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            self.pause(left, driving.is_some(), &backoff);
        }
    }

    /// Blocks until the entry is committed, superseded, the log closes, or `timeout` passes.
    /// Under [`PollMode::Busy`] the waiting thread drives the replica itself (see the module
    /// doc).
    pub fn wait(self, timeout: Duration) -> Result<u64, ReplicaError> {
        self.wait_for(timeout).unwrap_or(Err(ReplicaError::Timeout {
            index: self.ticket.index,
        }))
    }

    /// One step of a wait: under `Busy`, a pass of the replica on this thread if it drives
    /// (it takes the right to when no other caller holds it), then the ticket's status;
    /// otherwise only the status.
    fn drive_or_check<'a>(
        &'a self,
        driving: &mut Option<Driving<'a>>,
    ) -> Option<Result<u64, ReplicaError>> {
        let s = &self.shared;
        if driving.is_none() && s.poll == PollMode::Busy {
            *driving = Driving::take(&s.caller_driving);
        }
        if driving.is_none() {
            return self.status();
        }
        // A failed or closed log is not driven: the status says what became of the entry.
        let Ok(r) = s.lock_live() else {
            return self.status();
        };
        let t = self.ticket;
        s.caller_pass(r, Some(t), |r| r.ticket_status(t))
            .unwrap_or_else(|e| Some(Err(e)))
    }

    /// Between two steps of a wait: the driving caller polls on (spinning a little, then
    /// yielding between passes, as the busy driver does); any other sleeps until the commit
    /// index moves.
    fn pause(&self, left: Duration, driving: bool, backoff: &Backoff) {
        if driving {
            backoff.snooze();
        } else {
            self.shared.wait_progress(left);
        }
    }
}

/// The right to drive the replica from a caller's thread (`Busy`): at most one caller holds
/// it; dropping it (the wait ended, or unwound) hands the replica back to the driver.
struct Driving<'a>(&'a AtomicBool);

impl<'a> Driving<'a> {
    fn take(flag: &'a AtomicBool) -> Option<Driving<'a>> {
        flag.compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .ok()
            .map(|_| Driving(flag))
    }
}

impl Drop for Driving<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl<F: Fabric + Send + 'static> Future for AppendHandle<F> {
    type Output = Result<u64, ReplicaError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        if let Some(r) = this.status() {
            return Poll::Ready(r);
        }
        let key = *this
            .waker_key
            .get_or_insert_with(|| this.shared.next_waker_key.fetch_add(1, Ordering::Relaxed));
        {
            let mut wakers = this
                .shared
                .wakers
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            match wakers.get_mut(&key) {
                Some(w) if w.will_wake(cx.waker()) => {}
                Some(w) => w.clone_from(cx.waker()),
                None => {
                    wakers.insert(key, cx.waker().clone());
                }
            }
        }
        // Re-check after registering, so a commit between the check and the registration is
        // not missed.
        match this.status() {
            Some(r) => Poll::Ready(r),
            None => Poll::Pending,
        }
    }
}

impl<F: Fabric + Send + 'static> Drop for AppendHandle<F> {
    fn drop(&mut self) {
        if let Some(key) = self.waker_key {
            self.shared
                .wakers
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .remove(&key);
        }
    }
}

/// Committed application entries in order (`Iterator<Item = (index, payload)>`); blocks for
/// new ones and ends when the log closes. If the entries it needs next were truncated after a
/// checkpoint (this node installed a snapshot, or the application checkpointed past it), it
/// yields [`ReplicaError::Compacted`]: restore from [`Log::latest_checkpoint`] and subscribe
/// again from the checkpoint's index plus one.
pub struct Subscription<F: Fabric + Send + 'static> {
    shared: Arc<Shared<F>>,
    next: u64,
}

impl<F: Fabric + Send + 'static> std::fmt::Debug for Subscription<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription")
            .field("next", &self.next)
            .finish()
    }
}

impl<F: Fabric + Send + 'static> Subscription<F> {
    /// The next entry, waiting at most `timeout`; `Ok(None)` on timeout.
    pub fn next_timeout(
        &mut self,
        timeout: Duration,
    ) -> Result<Option<(u64, Vec<u8>)>, ReplicaError> {
        let deadline = deadline_in(timeout);
        let mut buf = Vec::new();
        loop {
            {
                let r = self.shared.lock_live()?;
                if let Some(e) = r.compacted(self.next) {
                    return Err(e);
                }
                while self.next <= r.commit_index() {
                    let i = self.next;
                    // Past the entry only once it was read: a failed read is returned and the
                    // next call tries the same index again, rather than skipping it for good.
                    let read = r.read(i, &mut buf)?;
                    self.next += 1;
                    if let Some(Committed::Application { .. }) = read {
                        return Ok(Some((i, buf)));
                    }
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            self.shared.wait_progress(left);
        }
    }
}

impl<F: Fabric + Send + 'static> Iterator for Subscription<F> {
    type Item = Result<(u64, Vec<u8>), ReplicaError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            match self.next_timeout(Duration::from_millis(100)) {
                Ok(Some(e)) => return Some(Ok(e)),
                Ok(None) => continue,
                Err(ReplicaError::Closed) => return None,
                Err(e) => return Some(Err(e)),
            }
        }
    }
}
