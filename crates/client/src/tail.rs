//! A tail: committed entries streamed as they commit, resumed after a broken connection.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use proto::{Entry, Request, Response};

use crate::conn::{RecvError, retryable};
use crate::{Backoff, Client, ClientError};

/// Committed entries from an index on, as they commit: an iterator of
/// `Result<Entry, ClientError>` (from [`Client::tail`]).
///
/// Any member can serve a tail. If the connection breaks or the server shuts down, the tail
/// reconnects (to any member, with the client's backoff and deadline) and asks for the entries
/// after the last one it yielded, so none is skipped or repeated. A reconnection that fails
/// until the deadline yields `Some(Err(..))` (transient: the next call tries again); an error
/// retrying cannot fix (entries compacted, unauthorized) yields `Some(Err(..))` once and then
/// the iterator ends.
///
/// [`Iterator::next`] blocks until an entry commits; [`Tail::poll`] waits at most a given time.
#[derive(Debug)]
pub struct Tail {
    client: Client,
    /// The index the stream continues at.
    next: u64,
    /// The highest commit index a server reported.
    commit: u64,
    /// The id of the stream on the current connection.
    stream: Option<u64>,
    buf: VecDeque<Entry>,
    /// Consecutive breaks without an entry in between, for backing off.
    backoff: Backoff,
    breaks: u32,
    done: bool,
}

impl Tail {
    pub(crate) fn start(client: Client, from: u64) -> Result<Tail, ClientError> {
        let mut t = Tail {
            client,
            next: from.max(1),
            commit: 0,
            stream: None,
            buf: VecDeque::new(),
            backoff: Backoff::new(),
            breaks: 0,
            done: false,
        };
        t.open()?;
        Ok(t)
    }

    /// (Re)starts the stream at `next` on a connection of the client's.
    fn open(&mut self) -> Result<(), ClientError> {
        let from = self.next;
        let r = self.client.run(|conn, id, _| {
            conn.send(&Request::Tail { id, from })
                .map_err(|e| conn.broken(e))?;
            Ok(id)
        });
        match r {
            Ok(id) => {
                tracing::debug!(from, node = ?self.client.connected_to(), "tail streaming");
                self.stream = Some(id);
                Ok(())
            }
            Err(e) => {
                if !e.is_transient() {
                    self.done = true;
                }
                Err(e)
            }
        }
    }

    fn broke(&mut self, why: &dyn std::fmt::Display) {
        tracing::debug!(%why, next = self.next, "tail connection broke; resuming");
        self.client.conn = None;
        self.stream = None;
        self.breaks += 1;
        if self.breaks > 1 {
            std::thread::sleep(self.backoff.delay());
        }
    }

    fn fail(&mut self, e: ClientError) -> ClientError {
        self.done = true;
        self.client.conn = None;
        self.stream = None;
        e
    }

    /// The next entry, if one commits within `timeout` (reconnecting may take longer, up to
    /// the client's deadline). `Ok(None)`: nothing new yet.
    pub fn poll(&mut self, timeout: Duration) -> Result<Option<Entry>, ClientError> {
        if let Some(e) = self.buf.pop_front() {
            return Ok(Some(e));
        }
        if self.done {
            return Err(ClientError::Protocol(
                "the tail has ended after an error".into(),
            ));
        }
        let now = Instant::now();
        let until = now.checked_add(timeout).unwrap_or(now + crate::MAX_TIMEOUT);
        loop {
            if self.stream.is_none() || self.client.conn.is_none() {
                self.open()?;
            }
            let conn = self.client.conn.as_mut().expect("open connects");
            let wait = until.saturating_duration_since(Instant::now());
            match conn.recv(wait) {
                Ok(None) => return Ok(None),
                Ok(Some(Response::Entries {
                    id,
                    commit,
                    entries,
                })) if Some(id) == self.stream => {
                    // Every entry of a frame is committed by the frame's own `commit`
                    // (PROTOCOL.md 6.3): one past it is not known to be in the log.
                    if let Some(e) = entries.iter().find(|e| e.index > commit) {
                        let m = format!(
                            "{} sent a tail entry at index {} past the commit index {commit} \
                             it stated",
                            conn.addr, e.index
                        );
                        return Err(self.fail(ClientError::Protocol(m)));
                    }
                    self.commit = self.commit.max(commit);
                    for e in entries {
                        if e.index >= self.next {
                            let Some(next) = e.index.checked_add(1) else {
                                // No entry can follow it: the tail ends here, with the
                                // entries taken before it dropped too.
                                self.buf.clear();
                                return Err(self.fail(ClientError::Protocol(format!(
                                    "the tail sent an entry at index {}",
                                    e.index
                                ))));
                            };
                            self.next = next;
                            self.buf.push_back(e);
                        }
                    }
                    if let Some(e) = self.buf.pop_front() {
                        self.breaks = 0;
                        self.backoff.reset();
                        return Ok(Some(e));
                    }
                }
                Ok(Some(Response::Error { code, message, .. })) if retryable(code) => {
                    self.broke(&message);
                }
                Ok(Some(Response::Error { code, message, .. })) => {
                    return Err(self.fail(ClientError::Refused { code, message }));
                }
                Ok(Some(other)) => {
                    let m = format!("{} sent {other:?} on a tail", conn.addr);
                    return Err(self.fail(ClientError::Protocol(m)));
                }
                Err(RecvError::Io(e)) => self.broke(&e),
                Err(RecvError::Protocol(m)) => {
                    let m = format!("{}: {m}", conn.addr);
                    return Err(self.fail(ClientError::Protocol(m)));
                }
            }
        }
    }

    /// Where the tail continues: one past the last entry it yielded (or the first index
    /// asked for). A reconnection resumes here.
    pub fn resume_index(&self) -> u64 {
        self.buf.front().map_or(self.next, |e| e.index)
    }

    /// The highest commit index a server reported with the entries so far.
    pub fn commit(&self) -> u64 {
        self.commit
    }

    /// The client underneath (to see where it is connected).
    pub fn client(&self) -> &Client {
        &self.client
    }
}

impl Iterator for Tail {
    type Item = Result<Entry, ClientError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done && self.buf.is_empty() {
            return None;
        }
        loop {
            match self.poll(Duration::from_secs(3600)) {
                Ok(Some(e)) => return Some(Ok(e)),
                Ok(None) => {}
                Err(e) => return Some(Err(e)),
            }
        }
    }
}
