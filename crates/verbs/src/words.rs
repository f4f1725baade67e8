//! Memory shared word by word between the CPU and the device, so that posting from it is safe.
//!
//! A [`WordBuffer`] is a heap slice of `AtomicU64` that this crate allocates and never resizes
//! or swaps. Because every word has interior mutability, the CPU may keep writing words while
//! the device reads or writes them: the result can be torn *data* (which the log's checksums
//! reject), never undefined behaviour. That is what lets [`QueuePair::post_write_words`] and
//! [`QueuePair::post_send_words`] be safe functions, unlike [`QueuePair::post_write`], whose
//! byte buffers must not be touched until the completion.
//!
//! Who touches what: the owner's CPU reads and writes words with atomic operations; the local
//! device reads the source ranges of posted sends and writes; a remote peer writes words only
//! while remote write is granted on both the MR and the QP it comes through.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use crate::cm::RemoteRegion;
use crate::error::{Error, Result};
use crate::mr::{AccessFlags, MemoryRegion, ProtectionDomain, RegistrableMemory};
use crate::qp::QueuePair;

/// A fixed heap slice of atomic words, zeroed at creation.
#[derive(Debug)]
pub struct WordBuffer {
    words: Box<[AtomicU64]>,
}

impl WordBuffer {
    /// `len_bytes` (rounded up to whole words) of zeroed memory, touched so its pages exist
    /// before registration pins them.
    pub fn new(len_bytes: usize) -> Result<Arc<WordBuffer>> {
        if len_bytes == 0 {
            return Err(Error::InvalidConfig("a word buffer of 0 bytes".into()));
        }
        let words = (0..len_bytes.div_ceil(8))
            .map(|_| AtomicU64::new(0))
            .collect();
        Ok(Arc::new(WordBuffer { words }))
    }

    /// The words.
    pub fn words(&self) -> &[AtomicU64] {
        &self.words
    }

    /// Length in bytes.
    pub fn len_bytes(&self) -> usize {
        self.words.len() * 8
    }
}

/// The registrable view of a [`WordBuffer`]. Private, so the only registration of word memory
/// is a [`WordRegion`], which never offers the byte-copying `read_at`/`write_at` of
/// [`MemoryRegion`] (a non-atomic copy racing with atomic stores would be undefined behaviour).
#[derive(Debug)]
struct Words(Arc<WordBuffer>);

// SAFETY: the words live in the Box's heap allocation, which `WordBuffer` never moves, resizes
// or replaces (it exposes no `&mut` access), and which is freed only when the last `Arc`
// drops; the MemoryRegion owns one `Arc`, so the allocation outlives the registration. The
// range is valid for device reads and writes because every byte belongs to an `AtomicU64`
// (interior mutability), so writes through a pointer derived from a shared reference are
// allowed.
unsafe impl RegistrableMemory for Words {
    fn raw_parts(&self) -> (*mut u8, usize) {
        (self.0.words.as_ptr() as *mut u8, self.0.len_bytes())
    }
}

/// A registered [`WordBuffer`]: the CPU touches it only through the buffer's atomic words,
/// the device through posted work requests and remote writes.
#[derive(Debug)]
pub struct WordRegion {
    mr: MemoryRegion<Words>,
}

impl WordRegion {
    /// Registers `buffer` in `pd` with `access`.
    pub fn register(
        pd: &Arc<ProtectionDomain>,
        buffer: Arc<WordBuffer>,
        access: AccessFlags,
    ) -> Result<WordRegion> {
        Ok(WordRegion {
            mr: MemoryRegion::register(pd, Words(buffer), access)?,
        })
    }

    /// Local key.
    pub fn lkey(&self) -> u32 {
        self.mr.lkey()
    }

    /// Remote key.
    pub fn rkey(&self) -> u32 {
        self.mr.rkey()
    }

    /// Start address.
    pub fn addr(&self) -> u64 {
        self.mr.addr()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.mr.len()
    }

    /// Whether the region is empty (never: buffers have at least one word).
    pub fn is_empty(&self) -> bool {
        self.mr.is_empty()
    }

    /// What a peer needs to write here.
    pub fn remote(&self) -> RemoteRegion {
        self.mr.remote()
    }

    /// Deregisters, reporting a failure (Drop only logs it).
    pub fn close(self) -> Result<()> {
        self.mr.close()
    }
}

impl QueuePair {
    /// Posts an RDMA Write from a registered [`WordBuffer`]. Safe: the CPU may keep changing
    /// the source words until the completion, which can only tear the data the peer receives.
    /// Returns the WR's sequence number (its `wr_id` in the completion).
    pub fn post_write_words(
        &self,
        local: &WordRegion,
        offset: usize,
        len: usize,
        remote: &RemoteRegion,
        remote_offset: u64,
        force_signal: bool,
    ) -> Result<u64> {
        // post_write's contract asks that the source range stay unmodified and registered
        // until completion. Registration: `local` is borrowed for the call; if its owner
        // deregisters it before the completion, ibv_dereg_mr has revoked the lkey in the
        // device first, so the WR fails with a local protection error instead of touching
        // freed memory.
        // SAFETY: the range is atomic words, so CPU stores that race with the device's reads
        // tear only data, never cause UB; deregistration is handled as said above.
        unsafe {
            self.post_write(
                &local.mr,
                offset,
                len,
                remote,
                remote_offset,
                None,
                force_signal,
            )
        }
    }

    /// Posts a Send from a registered [`WordBuffer`]; safe for the same reasons as
    /// [`QueuePair::post_write_words`].
    pub fn post_send_words(
        &self,
        local: &WordRegion,
        offset: usize,
        len: usize,
        force_signal: bool,
    ) -> Result<u64> {
        // SAFETY: as in post_write_words: atomic source words, and a deregistered lkey fails
        // the WR rather than reading freed memory.
        unsafe { self.post_send(&local.mr, offset, len, None, force_signal) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_round_up_to_words_and_refuse_zero() {
        let b = WordBuffer::new(13).unwrap();
        assert_eq!(b.len_bytes(), 16);
        assert_eq!(b.words().len(), 2);
        assert!(WordBuffer::new(0).is_err());
        let (p, len) = Words(b.clone()).raw_parts();
        assert_eq!(len, 16);
        assert_eq!(p as usize % 8, 0);
    }
}
