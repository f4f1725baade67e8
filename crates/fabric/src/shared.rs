//! The owner-side bookkeeping every connection-oriented back-end needs, whatever moves the
//! bytes: the event queue with its rule for announced connections, the inbox of received
//! messages, the receive side of the credit scheme, and the word memory the back-ends
//! allocate. `rdma` and `tcp` both use these (the send side of the credits is
//! [`verbs::SendCredits`], which both use too).

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use verbs::WordBuffer;

use crate::{Event, FabricError, Memory, NodeId, RemoteRegion, WcOp};

/// The receive side of the credit scheme: how much of our cumulative grant of inbox slots the
/// peer has been told. Every frame that carries the grant tells it; a credit-only frame is due
/// once half the window (at least one slot) is owed, so the peer never waits on credits while
/// the update costs one frame per half window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Grant {
    told: u64,
}

impl Grant {
    /// The peer knows `initial` (the receive slots of the connect exchange).
    pub(crate) fn new(initial: u64) -> Self {
        Grant { told: initial }
    }

    /// Whether a credit-only frame should tell the peer `granted` now, for a window of
    /// `window` receive slots.
    pub(crate) fn update_due(&self, granted: u64, window: usize) -> bool {
        granted.saturating_sub(self.told) >= (window as u64 / 2).max(1)
    }

    /// A frame carrying `granted` went out.
    pub(crate) fn told(&mut self, granted: u64) {
        self.told = self.told.max(granted);
    }
}

/// Events waiting for the owner's [`crate::Fabric::poll`], and which peers' `Connected` is
/// among them: until the owner has taken it, the connection is not its to use
/// ([`crate::Fabric::conn_state`]; simulator seed 928).
#[derive(Debug, Default)]
pub(crate) struct Events {
    queue: VecDeque<Event>,
    unannounced: BTreeMap<NodeId, u32>,
}

impl Events {
    /// Queues an event.
    pub(crate) fn push(&mut self, e: Event) {
        self.queue.push_back(e);
    }

    /// Queues the `Connected` of a new, admitted connection to `peer`.
    pub(crate) fn announce(&mut self, peer: NodeId, remote: Option<RemoteRegion>) {
        *self.unannounced.entry(peer).or_default() += 1;
        self.queue.push_back(Event::Connected { peer, remote });
    }

    /// Whether a `Connected` of `peer` is queued and not yet polled.
    pub(crate) fn unannounced(&self, peer: NodeId) -> bool {
        self.unannounced.contains_key(&peer)
    }

    /// Drops the queued receive events of `peer`: they name slots of a connection that broke,
    /// and must not be read as slots of the next one.
    pub(crate) fn forget_receives(&mut self, peer: NodeId) {
        self.queue
            .retain(|e| !matches!(e, Event::Completion(x) if x.peer == peer && x.op == WcOp::Recv));
    }

    /// Moves up to `out.len()` events into `out`; returns how many.
    pub(crate) fn drain_into(&mut self, out: &mut [Event]) -> usize {
        let mut k = 0;
        while k < out.len() {
            let Some(e) = self.queue.pop_front() else {
                break;
            };
            if let Event::Connected { peer, .. } = e
                && let Some(n) = self.unannounced.get_mut(&peer)
            {
                *n -= 1;
                if *n == 0 {
                    self.unannounced.remove(&peer);
                }
            }
            out[k] = e;
            k += 1;
        }
        k
    }
}

/// Which of a peer's connections: the one in use (reported to the owner), or a newer one held
/// beside an admitted one until it proves the cluster secret ([`crate::dial::must_prove_first`]),
/// which then replaces it. A challenger is never reported, posted on or delivered from, and
/// goes when the current one goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Role {
    Current,
    Challenger,
}

/// One connection of a back-end: its peer and its [`Role`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Key {
    pub(crate) peer: NodeId,
    pub(crate) role: Role,
}

impl Key {
    pub(crate) fn current(peer: NodeId) -> Key {
        Key {
            peer,
            role: Role::Current,
        }
    }

    pub(crate) fn challenger(peer: NodeId) -> Key {
        Key {
            peer,
            role: Role::Challenger,
        }
    }

    pub(crate) fn is_current(self) -> bool {
        self.role == Role::Current
    }

    /// What a refusal of this connection records as the peer's last error: a challenger's
    /// says it was a second connection, so its peer's admitted link is not taken for refused.
    pub(crate) fn refusal(self, why: &str) -> String {
        if self.is_current() {
            format!("refused: {why}")
        } else {
            format!("refused a second connection that claimed this peer's id: {why}")
        }
    }
}

/// A back-end's connections, at most one of each [`Role`] per peer.
#[derive(Debug)]
pub(crate) struct Conns<C> {
    map: BTreeMap<Key, C>,
}

impl<C> Default for Conns<C> {
    fn default() -> Self {
        Conns {
            map: BTreeMap::new(),
        }
    }
}

impl<C> Conns<C> {
    /// `peer`'s current connection.
    pub(crate) fn get(&self, peer: NodeId) -> Option<&C> {
        self.map.get(&Key::current(peer))
    }

    /// `peer`'s current connection.
    pub(crate) fn get_mut(&mut self, peer: NodeId) -> Option<&mut C> {
        self.map.get_mut(&Key::current(peer))
    }

    pub(crate) fn at(&self, key: Key) -> Option<&C> {
        self.map.get(&key)
    }

    pub(crate) fn at_mut(&mut self, key: Key) -> Option<&mut C> {
        self.map.get_mut(&key)
    }

    pub(crate) fn insert(&mut self, key: Key, c: C) {
        self.map.insert(key, c);
    }

    pub(crate) fn remove(&mut self, key: Key) -> Option<C> {
        self.map.remove(&key)
    }

    /// Every connection, in key order (a peer's current one before its challenger).
    pub(crate) fn iter(&self) -> impl Iterator<Item = (Key, &C)> {
        self.map.iter().map(|(k, c)| (*k, c))
    }

    /// Every connection, in key order, to change.
    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = (Key, &mut C)> {
        self.map.iter_mut().map(|(k, c)| (*k, c))
    }
}

/// Received messages the owner has not reposted, one buffer per receive slot. Buffers are
/// only swapped, never freed or grown here, so a received message costs no allocation.
#[derive(Debug, Default)]
pub(crate) struct Inbox {
    slots: Vec<Slot>,
}

#[derive(Debug, Default)]
struct Slot {
    bytes: Vec<u8>,
    full: bool,
}

impl Inbox {
    /// `slots` empty slots with room for `capacity` bytes each.
    pub(crate) fn new(slots: usize, capacity: usize) -> Inbox {
        Inbox {
            slots: (0..slots)
                .map(|_| Slot {
                    bytes: Vec::with_capacity(capacity),
                    full: false,
                })
                .collect(),
        }
    }

    /// Empties every slot (the connection they belonged to is gone).
    pub(crate) fn clear(&mut self) {
        self.slots.iter_mut().for_each(|s| s.full = false);
    }

    /// Swaps `bytes` into a free slot and returns its number; `bytes` then holds the slot's
    /// old, empty buffer. `None` when every slot is full (the peer sent beyond its credits).
    pub(crate) fn put(&mut self, bytes: &mut Vec<u8>) -> Option<u64> {
        let slot = self.slots.iter().position(|s| !s.full)?;
        let s = &mut self.slots[slot];
        std::mem::swap(&mut s.bytes, bytes);
        s.full = true;
        Some(slot as u64)
    }

    /// The message in `slot`, if it holds one.
    pub(crate) fn message(&self, slot: u64) -> Option<&[u8]> {
        self.slots
            .get(slot as usize)
            .filter(|s| s.full)
            .map(|s| &s.bytes[..])
    }

    /// Frees `slot`; false if it held no message.
    pub(crate) fn release(&mut self, slot: u64) -> bool {
        match self.slots.get_mut(slot as usize).filter(|s| s.full) {
            Some(s) => {
                s.full = false;
                true
            }
            None => false,
        }
    }
}

/// Memory a back-end allocated: page-aligned words whose address never moves (anonymous, or a
/// shared-memory file for [`crate::Fabric::alloc_persistent`]).
#[derive(Debug)]
pub struct WordMemory(pub(crate) Arc<WordBuffer>);

impl Memory for WordMemory {
    fn words(&self) -> &[AtomicU64] {
        self.0.words()
    }

    fn into_any(self: Arc<Self>) -> Arc<dyn std::any::Any + Send + Sync> {
        self
    }
}

/// [`crate::Fabric::alloc`] for back-ends that allocate [`WordMemory`].
pub(crate) fn alloc_words(len_bytes: u64) -> Result<Arc<dyn Memory>, FabricError> {
    let buf = WordBuffer::new(len_bytes as usize).map_err(|e| FabricError::Register {
        len_bytes,
        reason: e.to_string(),
    })?;
    Ok(Arc::new(WordMemory(buf)))
}

/// [`crate::Fabric::alloc_persistent`] for back-ends that allocate [`WordMemory`].
pub(crate) fn alloc_shared_words(
    path: &std::path::Path,
    len_bytes: u64,
) -> Result<(Arc<dyn Memory>, bool), FabricError> {
    let (buf, opened) =
        WordBuffer::open_shared(path, len_bytes as usize).map_err(|e| FabricError::Register {
            len_bytes,
            reason: e.to_string(),
        })?;
    Ok((
        Arc::new(WordMemory(buf)),
        opened == verbs::SharedOpen::Reopened,
    ))
}

/// [`crate::Fabric::free_persistent`]: removes the file; one already gone is not an error.
pub(crate) fn free_shared(path: &std::path::Path) -> Result<(), FabricError> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(FabricError::SharedMemory {
            path: path.to_owned(),
            reason: format!("cannot remove it: {e}"),
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Completion, DisconnectReason, WcStatus};

    fn recv(peer: u64, slot: u64) -> Event {
        Event::Completion(Completion {
            peer: NodeId(peer),
            wr_id: slot,
            op: WcOp::Recv,
            status: WcStatus::Success,
            byte_len: 1,
        })
    }

    #[test]
    fn a_connection_is_unannounced_until_its_connected_is_polled() {
        let mut e = Events::default();
        let p = NodeId(2);
        e.push(recv(3, 0));
        e.announce(p, None);
        e.announce(p, None);
        assert!(e.unannounced(p));
        let mut out = [Event::Disconnected {
            peer: p,
            reason: DisconnectReason::Closed,
        }; 2];
        assert_eq!(e.drain_into(&mut out), 2);
        assert!(e.unannounced(p), "one of two Connected is still queued");
        assert_eq!(e.drain_into(&mut out), 1);
        assert!(!e.unannounced(p));
        e.push(recv(2, 1));
        e.push(recv(3, 1));
        e.forget_receives(NodeId(2));
        assert_eq!(e.drain_into(&mut out), 1);
        assert_eq!(out[0], recv(3, 1));
    }

    #[test]
    fn the_inbox_swaps_buffers_and_refuses_past_its_slots() {
        let mut i = Inbox::new(2, 16);
        let mut m = b"one".to_vec();
        assert_eq!(i.put(&mut m), Some(0));
        assert!(
            m.is_empty() && m.capacity() >= 16,
            "the slot's buffer came back"
        );
        let mut m2 = b"two".to_vec();
        assert_eq!(i.put(&mut m2), Some(1));
        assert_eq!(i.put(&mut b"three".to_vec()), None);
        assert_eq!(i.message(0), Some(&b"one"[..]));
        assert!(i.release(0));
        assert!(!i.release(0));
        assert_eq!(i.message(0), None);
        i.clear();
        assert_eq!(i.message(1), None);
    }

    #[test]
    fn a_credit_update_is_due_at_half_the_window_and_never_goes_back() {
        let mut g = Grant::new(16);
        assert!(!g.update_due(16, 16));
        assert!(!g.update_due(23, 16), "7 owed of a 16-slot window");
        assert!(g.update_due(24, 16), "8 owed: half the window");
        g.told(24);
        assert!(!g.update_due(24, 16));
        g.told(20); // a frame built before a later one: the peer keeps the larger total
        assert!(!g.update_due(31, 16));
        assert!(g.update_due(32, 16));
        // A one-slot window updates at every repost; a stale grant is never due.
        let g = Grant::new(1);
        assert!(g.update_due(2, 1));
        assert!(!g.update_due(0, 1));
    }
}
