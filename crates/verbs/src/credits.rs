//! Send credits, so a Send never meets an empty receive queue (RNR never happens in normal
//! operation).
//!
//! Both counters are cumulative and monotonically increasing: the receiver reports the total
//! number of receives it has ever posted ([`crate::RecvPool::posted_total`]), the sender counts
//! the Sends it ever made. Available credit is their difference, so a lost or repeated update
//! can never create credit that is not there.

use crate::error::{Error, Result};

/// The sender's view of the peer's receive queue.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SendCredits {
    peer_posted_total: u64,
    sent_total: u64,
}

impl SendCredits {
    /// Starts with the peer's initial posted-receive total (exchanged at connect).
    pub fn new(peer_posted_total: u64) -> Self {
        SendCredits {
            peer_posted_total,
            sent_total: 0,
        }
    }

    /// Sends that may be made now.
    pub fn available(&self) -> u64 {
        self.peer_posted_total - self.sent_total
    }

    /// Takes one credit for a Send, or fails without side effect.
    pub fn take(&mut self) -> Result<()> {
        if self.available() == 0 {
            return Err(Error::NoCredits {
                posted: self.peer_posted_total,
                sent: self.sent_total,
            });
        }
        self.sent_total += 1;
        Ok(())
    }

    /// Applies an update carrying the peer's cumulative posted-receive total. Stale
    /// (smaller) updates are ignored.
    pub fn update(&mut self, peer_posted_total: u64) {
        self.peer_posted_total = self.peer_posted_total.max(peer_posted_total);
    }

    /// Cumulative Sends made.
    pub fn sent_total(&self) -> u64 {
        self.sent_total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credits_never_exceed_posted_receives() {
        let mut c = SendCredits::new(2);
        c.take().unwrap();
        c.take().unwrap();
        assert!(matches!(
            c.take(),
            Err(Error::NoCredits { posted: 2, sent: 2 })
        ));
        c.update(5);
        assert_eq!(c.available(), 3);
        c.update(4); // stale, reordered update
        assert_eq!(c.available(), 3);
        c.update(5); // duplicate
        assert_eq!(c.available(), 3);
        for _ in 0..3 {
            c.take().unwrap();
        }
        assert!(c.take().is_err());
        assert_eq!(c.sent_total(), 5);
    }
}
