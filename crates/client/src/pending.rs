//! [`PendingAppend`]: an append in flight on a thread of its own, as a runtime-free future.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::task::{Context, Poll, Waker};

use crate::ClientError;

type AppendResult = Result<(u64, u64), ClientError>;

#[derive(Debug, Default)]
struct Slot {
    result: Option<AppendResult>,
    waker: Option<Waker>,
    /// The result was handed out.
    taken: bool,
}

#[derive(Debug, Default)]
struct Shared {
    slot: Mutex<Slot>,
    done: Condvar,
}

/// An append running on its own thread (from [`Client::append_async`](crate::Client::append_async)).
///
/// It is a [`Future`] with `Output = Result<(u64, u64), ClientError>` that works under any
/// executor, or none: the thread makes the blocking call and then wakes the last task that
/// polled it. Without async, [`PendingAppend::wait`] blocks for the result and
/// [`PendingAppend::try_result`] checks for it. Dropping it does not cancel the append.
#[derive(Debug)]
pub struct PendingAppend {
    shared: Arc<Shared>,
}

impl PendingAppend {
    /// Runs `call` on a new thread.
    pub(crate) fn spawn(call: impl FnOnce() -> AppendResult + Send + 'static) -> PendingAppend {
        let shared = Arc::new(Shared::default());
        let s = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("rdmalog-append".into())
            .spawn(move || {
                let r = call();
                complete(&s, r);
            });
        if let Err(e) = spawned {
            complete(&shared, Err(ClientError::Io(e)));
        }
        PendingAppend { shared }
    }

    /// Blocks until the append completes.
    pub fn wait(self) -> AppendResult {
        let mut slot = self.lock();
        loop {
            if let Some(r) = slot.result.take() {
                slot.taken = true;
                return r;
            }
            if slot.taken {
                return Err(taken());
            }
            slot = self
                .shared
                .done
                .wait(slot)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// The result, if the append has completed (then later calls return `None`).
    pub fn try_result(&mut self) -> Option<AppendResult> {
        let mut slot = self.lock();
        let r = slot.result.take();
        if r.is_some() {
            slot.taken = true;
        }
        r
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Slot> {
        self.shared
            .slot
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

fn taken() -> ClientError {
    ClientError::Protocol("the append's result was already taken".into())
}

fn complete(shared: &Shared, r: AppendResult) {
    let waker = {
        let mut slot = shared.slot.lock().unwrap_or_else(PoisonError::into_inner);
        slot.result = Some(r);
        slot.waker.take()
    };
    shared.done.notify_all();
    if let Some(w) = waker {
        w.wake();
    }
}

impl Future for PendingAppend {
    type Output = AppendResult;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<AppendResult> {
        let mut slot = self.lock();
        if let Some(r) = slot.result.take() {
            slot.taken = true;
            return Poll::Ready(r);
        }
        if slot.taken {
            // Polled again after it completed.
            return Poll::Ready(Err(taken()));
        }
        match &slot.waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            _ => slot.waker = Some(cx.waker().clone()),
        }
        Poll::Pending
    }
}
