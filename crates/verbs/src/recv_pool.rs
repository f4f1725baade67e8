//! A pre-registered pool of fixed-size receive buffers.
//!
//! Slot `i` is `[i * slot_size, (i + 1) * slot_size)` of one memory region and is posted
//! with `wr_id = i`. `posted[i]` says whether the device owns slot `i`; the CPU reads a slot
//! only after its completion was polled and it was marked not posted, and re-posts it after.

use std::sync::Arc;

use crate::cq::{Completion, WcStatus};
use crate::error::{Error, Result};
use crate::mr::{AccessFlags, AnonMemory, MemoryRegion, ProtectionDomain};
use crate::qp::QueuePair;

/// Receive buffers registered once, posted and re-posted without allocation.
#[derive(Debug)]
pub struct RecvPool {
    mr: MemoryRegion<AnonMemory>,
    slot_size: usize,
    posted: Vec<bool>,
    posted_total: u64,
}

impl RecvPool {
    /// Registers `slots` buffers of `slot_size` bytes each in `pd`.
    pub fn new(pd: &Arc<ProtectionDomain>, slots: usize, slot_size: usize) -> Result<RecvPool> {
        if slots == 0 || slot_size == 0 {
            return Err(Error::InvalidConfig(
                "a receive pool needs slots and a slot size".into(),
            ));
        }
        let mem = AnonMemory::new(slots * slot_size)?;
        let mr = MemoryRegion::register(pd, mem, AccessFlags::LOCAL_WRITE)?;
        Ok(RecvPool {
            mr,
            slot_size,
            posted: vec![false; slots],
            posted_total: 0,
        })
    }

    /// Number of slots.
    pub fn slots(&self) -> usize {
        self.posted.len()
    }

    /// Slot size in bytes.
    pub fn slot_size(&self) -> usize {
        self.slot_size
    }

    /// Cumulative receives ever posted: what to report to the sender as credit.
    pub fn posted_total(&self) -> u64 {
        self.posted_total
    }

    fn post(&mut self, qp: &QueuePair, slot: usize) -> Result<()> {
        debug_assert!(!self.posted[slot]);
        // SAFETY: slot `slot` is not posted (checked by callers through `posted`), so no other
        // receive covers it and the CPU does not touch it until its completion is polled and
        // `with_received` marks it free again; the MR lives as long as the pool.
        unsafe { qp.post_recv(&self.mr, slot * self.slot_size, self.slot_size, slot as u64)? };
        self.posted[slot] = true;
        self.posted_total += 1;
        Ok(())
    }

    /// Posts every slot that is not posted.
    pub fn post_all(&mut self, qp: &QueuePair) -> Result<()> {
        for slot in 0..self.posted.len() {
            if !self.posted[slot] {
                self.post(qp, slot)?;
            }
        }
        Ok(())
    }

    /// Hands the bytes of a successful receive completion to `f`, then re-posts the slot.
    /// For an error completion the slot is released (not re-posted) and the status returned.
    pub fn with_received<R>(
        &mut self,
        qp: &QueuePair,
        wc: &Completion,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<std::result::Result<R, WcStatus>> {
        let slot = wc.wr_id as usize;
        if slot >= self.posted.len() || !self.posted[slot] {
            return Err(Error::InvalidConfig(format!(
                "completion wr_id {} is not a posted receive slot",
                wc.wr_id
            )));
        }
        self.posted[slot] = false;
        if wc.status != WcStatus::Success {
            return Ok(Err(wc.status));
        }
        let len = (wc.byte_len as usize).min(self.slot_size);
        // The slice covers only this slot (other slots may still be posted), it stays
        // unposted while the slice lives, and the pool's memory is never remotely writable
        // (LOCAL_WRITE only).
        // SAFETY: the slot's completion was polled and it is marked not posted, so the
        // device no longer writes this range while the slice lives.
        let bytes = unsafe { self.mr.range(slot * self.slot_size, len)? };
        let r = f(bytes);
        self.post(qp, slot)?;
        Ok(Ok(r))
    }
}
