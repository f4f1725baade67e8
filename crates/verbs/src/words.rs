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

use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use crate::cm::RemoteRegion;
use crate::error::{Error, Result};
use crate::mr::{AccessFlags, MemoryRegion, ProtectionDomain, RegistrableMemory};
use crate::qp::QueuePair;

/// Where a [`WordBuffer`]'s words live.
#[derive(Debug)]
enum Backing {
    /// A heap slice, private to this process.
    Heap(Box<[AtomicU64]>),
    /// A `MAP_SHARED` mapping of a tmpfs file, which outlives this process (not the machine).
    /// The file stays open, holding an exclusive `flock`, for as long as the mapping lives.
    Shared {
        map: memmap2::MmapRaw,
        _file: File,
        path: PathBuf,
    },
}

/// A fixed slice of atomic words, zeroed at creation: on the heap ([`WordBuffer::new`]) or
/// in a shared-memory file that survives a crash of this process ([`WordBuffer::open_shared`]).
#[derive(Debug)]
pub struct WordBuffer {
    backing: Backing,
}

/// Whether [`WordBuffer::open_shared`] found the file or made it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SharedOpen {
    /// The file did not exist (or was empty): its words are zero.
    Created,
    /// The file existed with the expected length: its words are what the last process left.
    Reopened,
}

/// `statfs` magic of tmpfs/shmem.
const TMPFS_MAGIC: i64 = 0x0102_1994;
/// `statfs` magic of hugetlbfs (also shmem, also fine to register).
const HUGETLBFS_MAGIC: i64 = 0x9584_58f6;

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
        Ok(Arc::new(WordBuffer {
            backing: Backing::Heap(words),
        }))
    }

    /// Maps the shared-memory file `path` (created if missing) as `len_bytes` of words, so
    /// that what this process stores survives its own crash: the next process that opens the
    /// same path sees the words as they were ([`SharedOpen::Reopened`]). A machine crash or
    /// reboot loses them, as it loses all of tmpfs.
    ///
    /// Refuses, with an error that says why: a length that is not a non-zero multiple of the
    /// page size; a file that is not on tmpfs or hugetlbfs (a mapping of an ext4 file cannot
    /// be registered on 6.x kernels, which refuse long-term pins of writable file pages); an
    /// existing file of another length (it may hold the words of a differently configured
    /// process); a file another process has mapped (an exclusive `flock` is held while the
    /// buffer lives).
    pub fn open_shared(path: &Path, len_bytes: usize) -> Result<(Arc<WordBuffer>, SharedOpen)> {
        let err = |reason: String| Error::SharedMemory {
            path: path.to_owned(),
            reason,
        };
        let page = crate::sys::page_size();
        if len_bytes == 0 || len_bytes % page != 0 {
            return Err(err(format!(
                "a shared word buffer must be a non-zero multiple of the {page}-byte page, not {len_bytes} bytes"
            )));
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)
            .map_err(|e| {
                err(format!(
                    "cannot open or create it: {e} (is its directory a writable tmpfs such as /dev/shm?)"
                ))
            })?;
        match crate::sys::try_lock_exclusive(&file) {
            Ok(true) => {}
            Ok(false) => {
                return Err(err(
                    "another process has it open (two processes must never share a ring: stop the other one first)"
                        .into(),
                ));
            }
            Err(e) => return Err(err(format!("cannot lock it: {e}"))),
        }
        let fs_type =
            crate::sys::fs_type(&file).map_err(|e| err(format!("cannot statfs it: {e}")))?;
        if fs_type != TMPFS_MAGIC && fs_type != HUGETLBFS_MAGIC {
            return Err(err(format!(
                "it is not on tmpfs or hugetlbfs (file system magic {fs_type:#x}); put it in /dev/shm: a mapping of a disk file cannot be registered for RDMA and would not be faster than the log itself"
            )));
        }
        let existing = file
            .metadata()
            .map_err(|e| err(format!("cannot stat it: {e}")))?
            .len();
        let opened = if existing == 0 {
            file.set_len(len_bytes as u64).map_err(|e| {
                err(format!(
                    "cannot size it to {len_bytes} bytes: {e} (is the tmpfs full?)"
                ))
            })?;
            SharedOpen::Created
        } else if existing == len_bytes as u64 {
            SharedOpen::Reopened
        } else {
            return Err(err(format!(
                "it holds {existing} bytes, not the {len_bytes} configured; it may hold entries a crashed process acknowledged, so it is not resized: start once with the old size, or remove the file if the last process shut down cleanly"
            )));
        };
        let map = memmap2::MmapOptions::new()
            .len(len_bytes)
            .map_raw(&file)
            .map_err(|e| err(format!("cannot map it: {e}")))?;
        let buffer = WordBuffer {
            backing: Backing::Shared {
                map,
                _file: file,
                path: path.to_owned(),
            },
        };
        // Touch every page (a load is enough for shmem) so that registration finds them
        // present and a full tmpfs fails here, with a clear error, rather than with SIGBUS
        // in the middle of an append.
        let words = buffer.words();
        for i in (0..words.len()).step_by(page / 8) {
            words[i].load(std::sync::atomic::Ordering::Relaxed);
        }
        Ok((Arc::new(buffer), opened))
    }

    /// The words.
    pub fn words(&self) -> &[AtomicU64] {
        match &self.backing {
            Backing::Heap(words) => words,
            Backing::Shared { map, .. } => {
                // Why this is sound: the mapping is `len()` bytes (a multiple of the page size,
                // hence of 8), page-aligned (so 8-aligned), readable and writable (MAP_SHARED,
                // PROT_READ|PROT_WRITE), and lives as long as `self`. `AtomicU64` has the size
                // and alignment of `u64`, and every byte of the file is a valid `u64`. All
                // access goes through the atomics (interior mutability), so stores by this
                // process, by the device, or by another process that maps the file despite the
                // lock can tear data but not cause undefined behaviour.
                let (ptr, words) = (map.as_ptr().cast::<AtomicU64>(), map.len() / 8);
                // SAFETY: `ptr` is valid, aligned and live for `words` atomics (see above).
                unsafe { std::slice::from_raw_parts(ptr, words) }
            }
        }
    }

    /// Length in bytes.
    pub fn len_bytes(&self) -> usize {
        self.words().len() * 8
    }

    /// The shared-memory file behind this buffer, if it has one.
    pub fn shared_path(&self) -> Option<&Path> {
        match &self.backing {
            Backing::Heap(_) => None,
            Backing::Shared { path, .. } => Some(path),
        }
    }
}

/// The registrable view of a [`WordBuffer`]. Private, so the only registration of word memory
/// is a [`WordRegion`], which never offers the byte-copying `read_at`/`write_at` of
/// [`MemoryRegion`] (a non-atomic copy racing with atomic stores would be undefined behaviour).
#[derive(Debug)]
struct Words(Arc<WordBuffer>);

// SAFETY: the words live in the Box's heap allocation or in the file mapping, which
// `WordBuffer` never moves, resizes, unmaps or replaces (it exposes no `&mut` access), and
// which is freed only when the last `Arc` drops; the MemoryRegion owns one `Arc`, so the
// memory outlives the registration. The range is valid for device reads and writes because
// every byte belongs to an `AtomicU64` (interior mutability), so writes through a pointer
// derived from a shared reference are allowed.
unsafe impl RegistrableMemory for Words {
    fn raw_parts(&self) -> (*mut u8, usize) {
        (self.0.words().as_ptr() as *mut u8, self.0.len_bytes())
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

    use std::sync::atomic::Ordering;

    fn shm_path(tag: &str) -> PathBuf {
        PathBuf::from(format!(
            "/dev/shm/rdmalog-verbs-test-{}-{tag}",
            std::process::id()
        ))
    }

    #[test]
    fn shared_words_outlive_their_mapping_and_are_exclusive() {
        let path = shm_path("reopen");
        let _ = std::fs::remove_file(&path);
        let (b, how) = WordBuffer::open_shared(&path, 8192).unwrap();
        assert_eq!(how, SharedOpen::Created);
        assert_eq!(b.len_bytes(), 8192);
        assert_eq!(b.shared_path(), Some(path.as_path()));
        assert!(b.words().iter().all(|w| w.load(Ordering::Relaxed) == 0));
        b.words()[3].store(0xfeed, Ordering::Release);
        b.words()[1023].store(7, Ordering::Release);
        // A second mapping while the first lives is refused: two processes must never share
        // one ring.
        let e = WordBuffer::open_shared(&path, 8192)
            .unwrap_err()
            .to_string();
        assert!(e.contains("another process has it open"), "{e}");
        let (p, _) = Words(b.clone()).raw_parts();
        assert_eq!(p as usize % crate::sys::page_size(), 0);
        drop(b);
        // As after a crash of the process: the next one sees the words as they were.
        let (b, how) = WordBuffer::open_shared(&path, 8192).unwrap();
        assert_eq!(how, SharedOpen::Reopened);
        assert_eq!(b.words()[3].load(Ordering::Acquire), 0xfeed);
        assert_eq!(b.words()[1023].load(Ordering::Acquire), 7);
        assert_eq!(b.words()[4].load(Ordering::Acquire), 0);
        drop(b);
        // Another length is refused rather than resized: the file may hold acked entries.
        let e = WordBuffer::open_shared(&path, 16384)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("holds 8192 bytes, not the 16384 configured"),
            "{e}"
        );
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn shared_words_refuse_disk_files_and_odd_lengths() {
        let dir = std::env::temp_dir().join(format!("rdmalog-verbs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let on_disk = dir.join("ring");
        let is_tmpfs =
            crate::sys::fs_type(&std::fs::File::open(&dir).unwrap()).unwrap() == TMPFS_MAGIC;
        let r = WordBuffer::open_shared(&on_disk, 4096);
        if is_tmpfs {
            // Some CI machines keep /tmp on tmpfs: then this file is shmem too.
            assert!(r.is_ok());
        } else {
            let e = r.unwrap_err().to_string();
            assert!(e.contains("not on tmpfs"), "{e}");
        }
        let e = WordBuffer::open_shared(&shm_path("odd"), 1000)
            .unwrap_err()
            .to_string();
        assert!(e.contains("multiple of the"), "{e}");
        let e = WordBuffer::open_shared(Path::new("/nonexistent-dir/ring"), 4096)
            .unwrap_err()
            .to_string();
        assert!(e.contains("cannot open or create it"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
