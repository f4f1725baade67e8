//! Protection domains, access flags and memory regions over caller-provided memory.

use std::sync::Arc;
use std::sync::atomic::{Ordering, fence};

use crate::device::Context;
use crate::error::{Error, Result};
use crate::sys;

/// Access rights of a memory region or a QP. `RELAXED_ORDERING` is never in the default and
/// must never be set on memory that peers read or poll (byte placement could reorder).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AccessFlags(u32);

impl AccessFlags {
    /// No access beyond local read.
    pub const NONE: AccessFlags = AccessFlags(0);
    /// `IBV_ACCESS_LOCAL_WRITE`: the device may write it (needed for receive buffers and
    /// for any remote write/read access).
    pub const LOCAL_WRITE: AccessFlags =
        AccessFlags(sys::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0);
    /// `IBV_ACCESS_REMOTE_WRITE`: peers may RDMA-write it.
    pub const REMOTE_WRITE: AccessFlags =
        AccessFlags(sys::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0);
    /// `IBV_ACCESS_REMOTE_READ`: peers may RDMA-read it.
    pub const REMOTE_READ: AccessFlags =
        AccessFlags(sys::ibv_access_flags::IBV_ACCESS_REMOTE_READ.0);
    /// `IBV_ACCESS_REMOTE_ATOMIC`: peers may run atomics on it.
    pub const REMOTE_ATOMIC: AccessFlags =
        AccessFlags(sys::ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC.0);
    /// `IBV_ACCESS_RELAXED_ORDERING`: only for memory nobody polls; never a default.
    pub const RELAXED_ORDERING: AccessFlags =
        AccessFlags(sys::ibv_access_flags::IBV_ACCESS_RELAXED_ORDERING.0);

    /// The raw `ibv_access_flags` bits.
    pub const fn bits(self) -> u32 {
        self.0
    }
    /// Builds flags from raw bits.
    pub const fn from_bits(bits: u32) -> Self {
        AccessFlags(bits)
    }
    /// Whether every flag of `other` is set.
    pub const fn contains(self, other: AccessFlags) -> bool {
        self.0 & other.0 == other.0
    }
    /// These flags without those of `other`.
    pub const fn without(self, other: AccessFlags) -> AccessFlags {
        AccessFlags(self.0 & !other.0)
    }
    /// Union of two flag sets.
    pub const fn union(self, other: AccessFlags) -> AccessFlags {
        AccessFlags(self.0 | other.0)
    }
}

impl Default for AccessFlags {
    /// Local write only: nothing remote and never relaxed ordering.
    fn default() -> Self {
        AccessFlags::LOCAL_WRITE
    }
}

impl std::ops::BitOr for AccessFlags {
    type Output = AccessFlags;
    fn bitor(self, rhs: AccessFlags) -> AccessFlags {
        self.union(rhs)
    }
}

/// A protection domain.
#[derive(Debug)]
pub struct ProtectionDomain {
    pd: *mut sys::ibv_pd,
    ctx: Arc<Context>,
}

// SAFETY: ibv_pd handles may be used from any thread (libibverbs is thread-safe); only Drop
// destroys it.
unsafe impl Send for ProtectionDomain {}
// SAFETY: as above; no method mutates the pd through a shared reference.
unsafe impl Sync for ProtectionDomain {}

impl ProtectionDomain {
    /// Allocates a protection domain on `ctx`.
    pub fn new(ctx: &Arc<Context>) -> Result<Arc<ProtectionDomain>> {
        // SAFETY: the context is live for as long as `ctx` (held below) lives.
        let pd = unsafe { sys::ibv_alloc_pd(ctx.as_ptr()) };
        if pd.is_null() {
            return Err(Error::verbs("ibv_alloc_pd", ctx.name(), 0, "-", -1));
        }
        Ok(Arc::new(ProtectionDomain {
            pd,
            ctx: ctx.clone(),
        }))
    }

    /// The device context.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    pub(crate) fn as_ptr(&self) -> *mut sys::ibv_pd {
        self.pd
    }
}

impl Drop for ProtectionDomain {
    fn drop(&mut self) {
        // SAFETY: every MR and QP holds an Arc to this PD, so none is alive here; the pd is
        // deallocated exactly once.
        let rc = unsafe { sys::ibv_dealloc_pd(self.pd) };
        if rc != 0 {
            tracing::warn!(
                device = self.ctx.name(),
                rc,
                "ibv_dealloc_pd failed in drop"
            );
        }
    }
}

/// Memory whose address and length stay fixed for as long as the value lives, so the device
/// may be given its pages.
///
/// # Safety
/// Implementors guarantee that `raw_parts` returns the same pointer and length for the
/// value's whole life, that the range is valid for reads and writes of that length, and that
/// nothing else frees or moves it while the value lives. A [`MemoryRegion`] owns the value
/// and never hands out `&mut M`, so owner-side APIs that could reallocate cannot be reached.
pub unsafe trait RegistrableMemory: Send + Sync {
    /// Start pointer and length in bytes.
    fn raw_parts(&self) -> (*mut u8, usize);
}

// SAFETY: a Box<[u8]>'s heap allocation never moves while the box lives, and the MR never
// exposes the box mutably.
unsafe impl RegistrableMemory for Box<[u8]> {
    fn raw_parts(&self) -> (*mut u8, usize) {
        (self.as_ptr() as *mut u8, self.len())
    }
}

// SAFETY: a Vec's buffer moves only on reallocation, which needs `&mut Vec`; the MR owns the
// Vec and never hands one out.
unsafe impl RegistrableMemory for Vec<u8> {
    fn raw_parts(&self) -> (*mut u8, usize) {
        (self.as_ptr() as *mut u8, self.len())
    }
}

// SAFETY: an MmapMut's mapping is fixed until it is unmapped in its Drop.
unsafe impl RegistrableMemory for memmap2::MmapMut {
    fn raw_parts(&self) -> (*mut u8, usize) {
        (self.as_ptr() as *mut u8, self.len())
    }
}

/// Page-aligned anonymous memory (`mmap(MAP_PRIVATE|MAP_ANONYMOUS)`), zero-filled.
#[derive(Debug)]
pub struct AnonMemory {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value; access goes through raw pointers.
unsafe impl Send for AnonMemory {}
// SAFETY: as above.
unsafe impl Sync for AnonMemory {}

impl AnonMemory {
    /// Maps `len` bytes (rounded up to a page) of zeroed anonymous memory.
    pub fn new(len: usize) -> Result<AnonMemory> {
        if len == 0 {
            return Err(Error::InvalidConfig("anonymous memory of 0 bytes".into()));
        }
        // SAFETY: a fresh anonymous private mapping; no existing memory is affected.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(Error::io("mmap", "-", 0, "-", sys::last_os_error()));
        }
        Ok(AnonMemory { ptr: p.cast(), len })
    }
}

impl Drop for AnonMemory {
    fn drop(&mut self) {
        // SAFETY: `ptr/len` is exactly the mapping created in `new`, unmapped once here.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

// SAFETY: the mapping is fixed from `new` until `drop`.
unsafe impl RegistrableMemory for AnonMemory {
    fn raw_parts(&self) -> (*mut u8, usize) {
        (self.ptr, self.len)
    }
}

/// A registered memory region that owns its memory.
///
/// Drop order inside: the registration is removed first (in `Drop::drop`), then the memory
/// `M` is dropped, then the PD reference. So the memory is never freed while registered.
#[derive(Debug)]
pub struct MemoryRegion<M: RegistrableMemory> {
    mr: *mut sys::ibv_mr,
    access: AccessFlags,
    // Field order is drop order: memory before the PD it was registered in.
    memory: Option<M>,
    pd: Arc<ProtectionDomain>,
}

// SAFETY: the ibv_mr handle is immutable after registration; memory access goes through raw
// copies with fences (see the crate-level safety section); M is Send + Sync.
unsafe impl<M: RegistrableMemory> Send for MemoryRegion<M> {}
// SAFETY: as above.
unsafe impl<M: RegistrableMemory> Sync for MemoryRegion<M> {}

impl<M: RegistrableMemory> MemoryRegion<M> {
    /// Registers `memory` in `pd` with exactly `access` (nothing implied except that remote
    /// write/atomic access requires LOCAL_WRITE, which the device demands and we add).
    pub fn register(pd: &Arc<ProtectionDomain>, memory: M, access: AccessFlags) -> Result<Self> {
        let (ptr, len) = memory.raw_parts();
        let mut access = access;
        if access.contains(AccessFlags::REMOTE_WRITE) || access.contains(AccessFlags::REMOTE_ATOMIC)
        {
            access = access | AccessFlags::LOCAL_WRITE;
        }
        // SAFETY: `ptr..ptr+len` is valid and fixed while `memory` lives (RegistrableMemory
        // contract), and `memory` is owned by the returned MR, which deregisters before
        // dropping it.
        let mr = unsafe { sys::ibv_reg_mr(pd.as_ptr(), ptr.cast(), len, access.bits() as i32) };
        if mr.is_null() {
            return Err(Error::verbs("ibv_reg_mr", pd.context().name(), 0, "-", -1));
        }
        Ok(MemoryRegion {
            mr,
            access,
            memory: Some(memory),
            pd: pd.clone(),
        })
    }

    fn parts(&self) -> (*mut u8, usize) {
        match &self.memory {
            Some(m) => m.raw_parts(),
            None => (std::ptr::null_mut(), 0),
        }
    }

    /// Local key, for SGEs.
    pub fn lkey(&self) -> u32 {
        // SAFETY: `mr` is a live registration until drop/close consume self.
        unsafe { (*self.mr).lkey }
    }
    /// Remote key, for peers.
    pub fn rkey(&self) -> u32 {
        // SAFETY: as in `lkey`.
        unsafe { (*self.mr).rkey }
    }
    /// Start address as the device sees it.
    pub fn addr(&self) -> u64 {
        self.parts().0 as u64
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.parts().1
    }
    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The access flags it was registered with.
    pub fn access(&self) -> AccessFlags {
        self.access
    }
    /// The PD it belongs to.
    pub fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }
    /// The descriptor a peer needs to write here.
    pub fn remote(&self) -> crate::RemoteRegion {
        crate::RemoteRegion {
            addr: self.addr(),
            rkey: self.rkey(),
            len: self.len() as u64,
        }
    }

    pub(crate) fn check(&self, offset: usize, len: usize) -> Result<()> {
        let region_len = self.len();
        if offset.checked_add(len).is_none_or(|end| end > region_len) {
            return Err(Error::OutOfBounds {
                offset,
                len,
                region_len,
            });
        }
        Ok(())
    }

    /// Copies `dst.len()` bytes at `offset` out of the region. Bytes a peer wrote are
    /// visible only after the completion that orders them was polled (see crate docs).
    pub fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.check(offset, dst.len())?;
        fence(Ordering::Acquire);
        // SAFETY: bounds checked above; the region is valid while self lives; `dst` is a
        // distinct exclusive Rust buffer, so the ranges cannot overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(self.parts().0.add(offset), dst.as_mut_ptr(), dst.len())
        };
        Ok(())
    }

    /// Copies `src` into the region at `offset`. Must not race with a posted WR that reads
    /// this range (see the `# Safety` of the posting functions).
    pub fn write_at(&self, offset: usize, src: &[u8]) -> Result<()> {
        self.check(offset, src.len())?;
        // SAFETY: bounds checked; the region is valid while self lives; `src` is a separate
        // Rust borrow and cannot overlap memory owned by the MR.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.parts().0.add(offset), src.len())
        };
        fence(Ordering::Release);
        Ok(())
    }

    /// Fills `len` bytes at `offset` with `byte`.
    pub fn fill(&self, offset: usize, len: usize, byte: u8) -> Result<()> {
        self.check(offset, len)?;
        // SAFETY: bounds checked; the region is valid while self lives.
        unsafe { std::ptr::write_bytes(self.parts().0.add(offset), byte, len) };
        fence(Ordering::Release);
        Ok(())
    }

    /// Borrows the whole region as a slice.
    ///
    /// # Safety
    /// While the slice lives, no device or remote peer may write the region: no receive may
    /// be posted into it and no QP may hold REMOTE_WRITE towards it with a peer that could
    /// write, and the caller must not write it through `write_at`.
    pub unsafe fn as_slice(&self) -> &[u8] {
        let (p, l) = self.parts();
        // SAFETY: the caller guarantees no concurrent writer; the range is valid while self
        // lives.
        unsafe { std::slice::from_raw_parts(p, l) }
    }

    /// Borrows `len` bytes at `offset` as a slice.
    ///
    /// # Safety
    /// While the slice lives, neither the device nor a remote peer may write that range (no
    /// receive posted over it, no peer able to RDMA-write it), and the caller must not write
    /// it through `write_at`/`fill`. Other ranges of the region are unaffected.
    pub unsafe fn range(&self, offset: usize, len: usize) -> Result<&[u8]> {
        self.check(offset, len)?;
        fence(Ordering::Acquire);
        // SAFETY: bounds checked; the caller guarantees no concurrent writer of this range;
        // the memory lives as long as `self`.
        Ok(unsafe { std::slice::from_raw_parts(self.parts().0.add(offset), len) })
    }

    fn dereg(&mut self) -> Result<()> {
        if self.mr.is_null() {
            return Ok(());
        }
        // SAFETY: `mr` is live and deregistered exactly once (nulled right after).
        let rc = unsafe { sys::ibv_dereg_mr(self.mr) };
        self.mr = std::ptr::null_mut();
        if rc != 0 {
            return Err(Error::verbs(
                "ibv_dereg_mr",
                self.pd.context().name(),
                0,
                "-",
                rc,
            ));
        }
        Ok(())
    }

    /// Deregisters and returns the memory. If deregistration fails the memory is leaked
    /// (the device might still use it) and the error is returned.
    pub fn into_inner(mut self) -> Result<M> {
        match self.dereg() {
            Ok(()) => Ok(self.memory.take().expect("memory present until into_inner")),
            Err(e) => {
                std::mem::forget(self.memory.take());
                Err(e)
            }
        }
    }

    /// Deregisters explicitly, reporting failure; then frees the memory.
    pub fn close(self) -> Result<()> {
        self.into_inner().map(drop)
    }
}

impl<M: RegistrableMemory> Drop for MemoryRegion<M> {
    fn drop(&mut self) {
        if let Err(e) = self.dereg() {
            tracing::warn!(error = %e, "memory region deregistration failed in drop; leaking its memory");
            std::mem::forget(self.memory.take());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_access_is_local_write_only() {
        let d = AccessFlags::default();
        assert!(d.contains(AccessFlags::LOCAL_WRITE));
        assert!(!d.contains(AccessFlags::REMOTE_WRITE));
        assert!(!d.contains(AccessFlags::RELAXED_ORDERING));
    }

    #[test]
    fn access_bits_match_verbs_header() {
        assert_eq!(AccessFlags::LOCAL_WRITE.bits(), 1);
        assert_eq!(AccessFlags::REMOTE_WRITE.bits(), 2);
        assert_eq!(AccessFlags::REMOTE_READ.bits(), 4);
        assert_eq!(AccessFlags::REMOTE_ATOMIC.bits(), 8);
        assert_eq!(AccessFlags::RELAXED_ORDERING.bits(), 1 << 20);
        let rw = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
        assert_eq!(
            rw.without(AccessFlags::REMOTE_WRITE),
            AccessFlags::LOCAL_WRITE
        );
    }

    #[test]
    fn anon_memory_is_zeroed_and_page_aligned() {
        let m = AnonMemory::new(10_000).unwrap();
        let (p, l) = m.raw_parts();
        assert_eq!(l, 10_000);
        assert_eq!(p as usize % 4096, 0);
        // SAFETY: the mapping is valid for `l` bytes and nobody else writes it.
        let bytes = unsafe { std::slice::from_raw_parts(p, l) };
        assert!(bytes.iter().all(|&b| b == 0));
    }
}
