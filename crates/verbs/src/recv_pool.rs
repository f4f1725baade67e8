//! A pre-registered pool of fixed-size receive buffers.
//!
//! Slot `i` is `[i * slot_size, (i + 1) * slot_size)` of one memory region and is posted
//! with `wr_id = base + i`, `base` the pool's own (no two pools of the process share a
//! `wr_id`: a completion of an earlier queue pair's pool, reported under a queue pair number a
//! device reused, is not taken for one of this pool's, [`RecvPool::owns`]). `posted[i]` says whether the device owns slot `i`; the CPU reads a slot
//! only after its completion was polled and it was marked not posted, and re-posts it after.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::cq::{Completion, WcStatus};
use crate::error::{Error, Result};
use crate::mr::{AccessFlags, AnonMemory, MemoryRegion, ProtectionDomain};
use crate::qp::QueuePair;

/// Receive buffers registered once, posted and re-posted without allocation.
#[derive(Debug)]
pub struct RecvPool {
    mr: MemoryRegion<AnonMemory>,
    /// The `wr_id` of slot 0.
    base: u64,
    slot_size: usize,
    posted: Vec<bool>,
    posted_total: u64,
}

/// `wr_id`s each pool has to itself.
const POOL_SPAN: u64 = 1 << 32;

/// The `wr_id` base of the next pool.
static NEXT_POOL_BASE: AtomicU64 = AtomicU64::new(0);

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
        if slots as u64 > POOL_SPAN {
            return Err(Error::InvalidConfig(format!(
                "a receive pool of {slots} slots: at most {POOL_SPAN}"
            )));
        }
        Ok(RecvPool {
            mr,
            base: NEXT_POOL_BASE.fetch_add(POOL_SPAN, Ordering::Relaxed),
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
        unsafe {
            qp.post_recv(
                &self.mr,
                slot * self.slot_size,
                self.slot_size,
                self.base + slot as u64,
            )?
        };
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

    /// Whether `wc` is a completion of one of this pool's receives (not of another pool's,
    /// reported under the same queue pair number).
    pub fn owns(&self, wc: &Completion) -> bool {
        wc.wr_id
            .checked_sub(self.base)
            .is_some_and(|slot| slot < self.posted.len() as u64)
    }

    /// Hands the bytes of a successful receive completion to `f`, then re-posts the slot.
    /// For an error completion the slot is released (not re-posted) and the status returned.
    pub fn with_received<R>(
        &mut self,
        qp: &QueuePair,
        wc: &Completion,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<std::result::Result<R, WcStatus>> {
        let slot = wc.wr_id.wrapping_sub(self.base) as usize;
        if !self.owns(wc) || !self.posted[slot] {
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
