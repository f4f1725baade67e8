//! The registered ring: a power-of-two window over the tail of the log's byte stream.
//!
//! # Layout and positions
//!
//! Stream position `lsn` lives at ring byte `lsn & (capacity - 1)`. Positions are wide `u64`
//! values that only grow (except for [`Producer::rewind`]), so they never wrap in practice
//! (2^64 bytes). Records never cross a block boundary ([`crate::format::place`]) and the
//! capacity is a multiple of the block, so a record never crosses the end of the ring and no
//! caller ever splits one: the ring pads to the block end with a padding record instead of
//! double-mapping, because a double mapping needs `mmap` of the same memory twice (unsafe, and
//! twice the registrations), while padding costs at most one block per lap and keeps Lsns equal
//! on every replica whatever its ring capacity.
//!
//! # Full/empty rule
//!
//! `head` is the first byte the consumer still holds, `tail` the end of the published records.
//! Always `head <= tail <= head + capacity`. Empty: `head == tail`. Full for a record of `n`
//! bytes placed at `start`: `start + n - head > capacity`.
//!
//! # Who touches what (the safety section of the shared-memory protocol)
//!
//! * The producer alone writes ring words in `[tail, head + capacity)` and then stores `tail`
//!   with `Release`. A remote peer (RDMA Write) writes the same window of a follower's ring;
//!   the follower's producer reads those bytes only after the fabric says the write is placed
//!   (a Send after the Write) and accepts them only after [`Producer::accept_written`] checked
//!   them.
//! * The consumer alone reads words in `[head, tail)` after loading `tail` with `Acquire`, and
//!   alone stores `head` with `Release` when it releases bytes; the producer loads `head` with
//!   `Acquire` before reusing them.
//!
//! The memory is a slice of `AtomicU64`, so even a peer that breaks the protocol (a deposed
//! leader writing late) causes garbage, never undefined behaviour; garbage fails the checksum.
//!
//! # The verified copy
//!
//! The producer keeps a private copy of every record it published and has not yet been told
//! is persisted: the bytes it encoded ([`Producer::append`]) or the very bytes whose checks it
//! ran ([`Producer::accept_written`]), never a second read of the shared memory. The wal
//! persists from that copy ([`Producer::verified`], a [`RecordSource`]) without computing a
//! checksum again, and still persists exactly what was checked even if a write that breaks the
//! protocol lands in the shared memory afterwards. Its cost is one private `memcpy` per record
//! in place of a second copy out of the ring's atomic words and a second crc32c.

use std::fmt;
use std::sync::Arc;

use crossbeam_utils::CachePadded;

use crate::error::WalError;
use crate::format::{
    self, ChainCheck, DecodeError, Decoded, HEADER_BYTES, MAX_BLOCK_BYTES, MIN_BLOCK_BYTES,
    RawHeader, RecordKind,
};
use crate::sync::{AtomicBool, AtomicU64, Ordering};
use crate::{Index, Lsn, Position, Term};

/// Largest ring: 64 GiB, far above any registered region we plan for, and small enough that
/// word offsets fit comfortably in `usize` on 64-bit targets.
pub const MAX_RING_BYTES: u64 = 64 << 30;

/// Memory that holds a ring. It is plain memory that other crates register with the NIC: use
/// [`RingMemory::as_ptr`] and [`RingMemory::len_bytes`] for `ibv_reg_mr`.
///
/// The wal crate ships [`AnonymousMemory`]. Shared memory that survives a process crash (a
/// memfd or a file in /dev/shm) needs an `mmap` of a file, which is `unsafe` in memmap2; the
/// verbs crate, the only crate allowed `unsafe`, implements this trait for such a mapping.
/// Registered memory must be anonymous or shmem, never an ext4 file mapping (6.12 kernels
/// refuse long-term pins of writable file pages).
pub trait RingMemory: Send + Sync + fmt::Debug {
    /// The memory as 64-bit words. Ring positions map to `words()[(lsn & mask) / 8]`, bytes in
    /// little-endian order within a word.
    fn words(&self) -> &[AtomicU64];

    /// Start address, for registration.
    fn as_ptr(&self) -> *const u8 {
        self.words().as_ptr().cast()
    }

    /// Length in bytes, for registration.
    fn len_bytes(&self) -> usize {
        self.words().len() * 8
    }

    /// A word outside the ring where the producer mirrors the end of what it published, for
    /// memory that outlives the process: after a crash, [`published_tail`] says how far the
    /// ring's records are the log's (bytes past it were never published, or were cut by a
    /// rewind). `None` (the default) for memory that dies with the process.
    fn tail_mirror(&self) -> Option<&AtomicU64> {
        None
    }
}

/// The published end a crashed process left in `memory`'s [`RingMemory::tail_mirror`], if
/// the memory has one. Read it before building a ring over the memory with
/// [`ring_recovering`], then hand it to [`Producer::recover_published`].
pub fn published_tail(memory: &dyn RingMemory) -> Option<Lsn> {
    memory
        .tail_mirror()
        .map(|w| Lsn(w.load(Ordering::Acquire) & !OPEN_TO_REMOTE))
}

/// Marks `memory` as holding no published records (end 0, closed to remote writes), as a new
/// ring at Lsn 0 would, without building one. For a caller about to restart its log somewhere
/// else (a snapshot install): until the new ring is built over the memory, a crash leaves
/// nothing claimed past any state of the log, so recovery takes nothing.
pub fn clear_published(memory: &dyn RingMemory) {
    if let Some(mirror) = memory.tail_mirror() {
        mirror.store(0, Ordering::Release);
    }
}

/// Whether a crashed process left `memory` open to remote writes
/// ([`Producer::set_open_to_remote`]): records past the published tail may then have been
/// placed by a writer that counted them as held, and recovery must take them with
/// [`Producer::accept_placed`]. `false` for memory without a tail mirror.
pub fn open_to_remote(memory: &dyn RingMemory) -> bool {
    memory
        .tail_mirror()
        .is_some_and(|w| w.load(Ordering::Acquire) & OPEN_TO_REMOTE != 0)
}

/// The tail mirror's top bit: the ring is open to remote writes (an Lsn never reaches 2^63).
const OPEN_TO_REMOTE: u64 = 1 << 63;

/// Anonymous, private memory, zeroed and touched at creation so that its pages exist before
/// registration pins them. Large allocations come from an anonymous `mmap` by the allocator.
pub struct AnonymousMemory {
    words: Box<[AtomicU64]>,
}

impl fmt::Debug for AnonymousMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AnonymousMemory")
            .field("len_bytes", &self.len_bytes())
            .finish()
    }
}

impl AnonymousMemory {
    /// Allocates `len_bytes` of zeroed memory (a multiple of 8, at most [`MAX_RING_BYTES`]).
    pub fn new(len_bytes: u64) -> Result<Self, WalError> {
        if len_bytes == 0 || len_bytes % 8 != 0 || len_bytes > MAX_RING_BYTES {
            return Err(WalError::Config {
                reason: "ring memory must be a non-zero multiple of 8 bytes, at most 64 GiB",
            });
        }
        let words = (0..len_bytes / 8).map(|_| AtomicU64::new(0)).collect();
        Ok(Self { words })
    }
}

impl RingMemory for AnonymousMemory {
    fn words(&self) -> &[AtomicU64] {
        &self.words
    }
}

/// Ring geometry. Every replica of one log must use the same `block_bytes` (Lsns depend on
/// it); capacities may differ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingConfig {
    /// Ring size: a power of two, a multiple of `block_bytes`, equal to the memory's length.
    pub capacity_bytes: u64,
    /// Block size of the placement rule: a power of two in 64 B ..= 64 MiB.
    pub block_bytes: u64,
}

struct Shared {
    memory: Arc<dyn RingMemory>,
    mask: u64,
    capacity: u64,
    block: u64,
    head: CachePadded<AtomicU64>,
    tail: CachePadded<AtomicU64>,
    /// Mirrored in the tail mirror's top bit: see [`Producer::set_open_to_remote`].
    open_to_remote: AtomicBool,
}

impl Shared {
    /// The words of `[pos, pos + len)`, which does not cross the ring end. One trait call
    /// and one bounds check per range, not per word: this is the append hot path.
    fn span(&self, pos: u64, len: usize) -> &[AtomicU64] {
        let first = ((pos & self.mask) / 8) as usize;
        &self.memory.words()[first..first + len.div_ceil(8)]
    }

    /// Stores `bytes` at 8-aligned `pos`; the last word is zero-filled. The range does not
    /// cross the ring end (records never cross a block).
    fn store(&self, pos: u64, bytes: &[u8]) {
        debug_assert!(pos % 8 == 0);
        let words = self.span(pos, bytes.len());
        let mut chunks = bytes.chunks_exact(8);
        for (word, chunk) in words.iter().zip(&mut chunks) {
            let mut value = [0u8; 8];
            value.copy_from_slice(chunk);
            word.store(u64::from_le_bytes(value), Ordering::Relaxed);
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut value = [0u8; 8];
            value[..rest.len()].copy_from_slice(rest);
            words[words.len() - 1].store(u64::from_le_bytes(value), Ordering::Relaxed);
        }
    }

    /// Loads `out.len()` bytes from 8-aligned `pos`, splitting at the ring end.
    fn load(&self, pos: u64, out: &mut [u8]) {
        debug_assert!(pos % 8 == 0);
        let until_end = (self.capacity - (pos & self.mask)) as usize;
        let (here, wrapped) = out.split_at_mut(out.len().min(until_end));
        self.load_span(pos, here);
        if !wrapped.is_empty() {
            self.load_span(pos + here.len() as u64, wrapped);
        }
    }

    fn load_span(&self, pos: u64, out: &mut [u8]) {
        let words = self.span(pos, out.len());
        let mut chunks = out.chunks_exact_mut(8);
        for (word, chunk) in words.iter().zip(&mut chunks) {
            chunk.copy_from_slice(&word.load(Ordering::Relaxed).to_le_bytes());
        }
        let rest = chunks.into_remainder();
        if !rest.is_empty() {
            let value = words[words.len() - 1].load(Ordering::Relaxed).to_le_bytes();
            let len = rest.len();
            rest.copy_from_slice(&value[..len]);
        }
    }
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shared")
            .field("capacity", &self.capacity)
            .field("block", &self.block)
            .field("head", &self.head.load(Ordering::Relaxed))
            .field("tail", &self.tail.load(Ordering::Relaxed))
            .finish()
    }
}

/// Builds a ring over `memory` whose stream continues at `start`, and returns its two handles.
/// The ring's published end is `start`: whatever the memory held past it is not the log's.
pub fn ring(
    memory: Arc<dyn RingMemory>,
    config: RingConfig,
    start: Position,
) -> Result<(Producer, Consumer), WalError> {
    let (producer, consumer) = build(memory, config, start)?;
    producer.shared.publish(start.lsn.0);
    Ok((producer, consumer))
}

/// As [`ring`], but leaves the memory's [`RingMemory::tail_mirror`] as a crashed process left
/// it, so that a crash during recovery loses nothing: call [`Producer::recover_published`]
/// next, with the tail [`published_tail`] read before this call, then, if the memory was left
/// [`open_to_remote`], [`Producer::accept_placed`] and `set_open_to_remote(false)`.
pub fn ring_recovering(
    memory: Arc<dyn RingMemory>,
    config: RingConfig,
    start: Position,
) -> Result<(Producer, Consumer), WalError> {
    let open = open_to_remote(memory.as_ref());
    let (producer, consumer) = build(memory, config, start)?;
    // Publishing during recovery keeps the mark: a crash before the placed records are taken
    // must find it again.
    producer
        .shared
        .open_to_remote
        .store(open, Ordering::Relaxed);
    Ok((producer, consumer))
}

fn build(
    memory: Arc<dyn RingMemory>,
    config: RingConfig,
    start: Position,
) -> Result<(Producer, Consumer), WalError> {
    let RingConfig {
        capacity_bytes: capacity,
        block_bytes: block,
    } = config;
    if !block.is_power_of_two() || !(MIN_BLOCK_BYTES..=MAX_BLOCK_BYTES).contains(&block) {
        return Err(WalError::Config {
            reason: "ring block size must be a power of two in 64 B ..= 64 MiB",
        });
    }
    if !capacity.is_power_of_two() || capacity < block || capacity > MAX_RING_BYTES {
        return Err(WalError::Config {
            reason: "ring capacity must be a power of two, at least one block, at most 64 GiB",
        });
    }
    if memory.len_bytes() as u64 != capacity {
        return Err(WalError::Config {
            reason: "ring memory length must equal the ring capacity",
        });
    }
    if start.lsn.0 % 8 != 0 {
        return Err(WalError::Config {
            reason: "a ring must start at an 8-aligned lsn",
        });
    }
    let shared = Arc::new(Shared {
        memory,
        mask: capacity - 1,
        capacity,
        block,
        head: CachePadded::new(AtomicU64::new(start.lsn.0)),
        tail: CachePadded::new(AtomicU64::new(start.lsn.0)),
        open_to_remote: AtomicBool::new(false),
    });
    let producer = Producer {
        shared: Arc::clone(&shared),
        tail: start.lsn.0,
        cached_head: start.lsn.0,
        last_index: start.last_index,
        last_term: start.last_term,
        scratch: vec![0; block as usize].into_boxed_slice(),
        verified: VerifiedCopy {
            from: start.lsn.0,
            bytes: Vec::new(),
        },
        reread_after_checks: false,
    };
    let consumer = Consumer {
        shared,
        head: start.lsn.0,
        scratch: vec![0; block as usize].into_boxed_slice(),
    };
    Ok((producer, consumer))
}

impl Shared {
    /// Publishes `tail` to the consumer and to the memory's tail mirror. The mirror is
    /// stored after the records (Release), so a crash after it finds them in place.
    fn publish(&self, tail: u64) {
        if let Some(mirror) = self.memory.tail_mirror() {
            let open = if self.open_to_remote.load(Ordering::Relaxed) {
                OPEN_TO_REMOTE
            } else {
                0
            };
            mirror.store(tail | open, Ordering::Release);
        }
        self.tail.store(tail, Ordering::Release);
    }
}

/// The writing end: the leader appends entries, a follower accepts what the leader wrote.
#[derive(Debug)]
pub struct Producer {
    shared: Arc<Shared>,
    tail: u64,
    cached_head: u64,
    last_index: Index,
    last_term: Term,
    /// One block, allocated once, for validating remote bytes.
    scratch: Box<[u8]>,
    /// The private copy of `[verified.from, tail)`: see the module's "verified copy".
    verified: VerifiedCopy,
    /// Test-only mutation: [`Producer::verified`] reads the shared memory again instead of the
    /// copy, so bytes that changed after the checks reach the wal unchecked.
    reread_after_checks: bool,
}

/// A private copy of the stream bytes `[from, from + bytes.len())`: each record as it was
/// encoded or checked, at its offset, the bytes between records zero. It ends at the
/// producer's tail, and whoever persists forgets what the wal took, so it never holds more
/// than the ring's published, unpersisted bytes.
#[derive(Debug, Default)]
struct VerifiedCopy {
    from: u64,
    bytes: Vec<u8>,
}

impl VerifiedCopy {
    fn end(&self) -> u64 {
        self.from + self.bytes.len() as u64
    }

    /// Copies `data` to `pos` (at or past the end; the gap zero-filled).
    fn put(&mut self, pos: u64, data: &[u8]) {
        debug_assert!(pos >= self.end());
        self.bytes.resize((pos - self.from) as usize, 0);
        self.bytes.extend_from_slice(data);
    }

    /// The copy's bytes from `pos` (held) to its end.
    fn tail_from(&mut self, pos: u64) -> &mut [u8] {
        &mut self.bytes[(pos - self.from) as usize..]
    }

    /// Makes the copy end exactly at `end` (the producer's tail): zero-fills up to it, or
    /// drops what lies past it; a copy that started past `end` starts there, empty.
    fn settle(&mut self, end: u64) {
        if end < self.from {
            self.from = end;
            self.bytes.clear();
        } else {
            self.bytes.resize((end - self.from) as usize, 0);
        }
    }

    /// Drops the bytes before `lsn`.
    fn forget_before(&mut self, lsn: u64) {
        if lsn >= self.end() {
            self.from = lsn;
            self.bytes.clear();
        } else if lsn > self.from {
            self.bytes.drain(..(lsn - self.from) as usize);
            self.from = lsn;
        }
    }
}

/// Where [`crate::Wal::persist_from`] copies records from: the ring's shared memory (a
/// [`Consumer`], every record checked again) or a producer's private copy of records that
/// already passed their checks ([`Producer::verified`]).
pub trait RecordSource {
    /// Block size of the placement rule.
    fn block_bytes(&self) -> u64;
    /// The stream bytes held, `[start, end)`.
    fn held(&self) -> (Lsn, Lsn);
    /// Copies the stream bytes `[start, start + out.len())`, which must be held.
    fn copy_range(&self, start: Lsn, out: &mut [u8]) -> Result<(), WalError>;
    /// Whether every record held already passed the checks of [`crate::format::decode_record`]
    /// into private memory that nothing else writes: its checksum is then not computed again.
    fn verified(&self) -> bool;
    /// The stream bytes `[start, end)` as one slice of such verified private memory, where
    /// the source holds them so: the wal then copies them in one go and checks each record's
    /// header in place. `None` (the default): the wal copies record by record.
    fn view(&self, _start: Lsn, _end: Lsn) -> Option<&[u8]> {
        None
    }
}

/// A producer's private copy of the records it published since the wal last persisted
/// ([`Producer::verified`]).
#[derive(Clone, Copy, Debug)]
pub struct Verified<'a> {
    from: u64,
    bytes: &'a [u8],
    block: u64,
    /// The mutation of [`Producer::reread_after_checks_for_test`].
    reread: Option<&'a Shared>,
}

impl Verified<'_> {
    /// Whether it holds every byte of `[start, end)`.
    pub fn covers(&self, start: Lsn, end: Lsn) -> bool {
        self.from <= start.0 && end.0 <= self.from + self.bytes.len() as u64
    }
}

impl RecordSource for Verified<'_> {
    fn block_bytes(&self) -> u64 {
        self.block
    }

    fn held(&self) -> (Lsn, Lsn) {
        (Lsn(self.from), Lsn(self.from + self.bytes.len() as u64))
    }

    fn copy_range(&self, start: Lsn, out: &mut [u8]) -> Result<(), WalError> {
        let end = start.0.checked_add(out.len() as u64);
        if !end.is_some_and(|end| self.covers(start, Lsn(end))) {
            let (held_start, held_end) = self.held();
            return Err(WalError::Range {
                start,
                end: Lsn(end.unwrap_or(u64::MAX)),
                held_start,
                held_end,
            });
        }
        if let Some(shared) = self.reread {
            shared.load(start.0, out);
            return Ok(());
        }
        let at = (start.0 - self.from) as usize;
        out.copy_from_slice(&self.bytes[at..at + out.len()]);
        Ok(())
    }

    fn verified(&self) -> bool {
        true
    }

    fn view(&self, start: Lsn, end: Lsn) -> Option<&[u8]> {
        // The mutation reads the shared memory again, through `copy_range`.
        if self.reread.is_some() || start > end || !self.covers(start, end) {
            return None;
        }
        let at = (start.0 - self.from) as usize;
        Some(&self.bytes[at..at + (end.0 - start.0) as usize])
    }
}

impl RecordSource for Consumer {
    fn block_bytes(&self) -> u64 {
        self.shared.block
    }

    fn held(&self) -> (Lsn, Lsn) {
        (self.head(), self.tail())
    }

    fn copy_range(&self, start: Lsn, out: &mut [u8]) -> Result<(), WalError> {
        Consumer::copy_range(self, start, out)
    }

    fn verified(&self) -> bool {
        false
    }
}

impl Producer {
    /// Appends an entry with the next index and returns its index and Lsn.
    pub fn append_next(&mut self, term: Term, payload: &[u8]) -> Result<(Index, Lsn), WalError> {
        let index = Index(self.last_index.0 + 1);
        self.append(index, term, payload).map(|lsn| (index, lsn))
    }

    /// Appends an entry and publishes it to the consumer. The index must be the last plus one
    /// and the term not lower. Allocates only while the private verified copy grows to the most
    /// it ever held between two persists (it keeps its capacity).
    pub fn append(&mut self, index: Index, term: Term, payload: &[u8]) -> Result<Lsn, WalError> {
        let max = format::max_payload(self.shared.block);
        if payload.len() > max {
            return Err(WalError::EntryTooLarge {
                len: payload.len(),
                max,
            });
        }
        if index.0 != self.last_index.0 + 1 || term < self.last_term {
            return Err(WalError::OutOfOrder {
                index,
                term,
                last_index: self.last_index,
                last_term: self.last_term,
            });
        }
        let record = format::record_bytes(payload.len()) as u64;
        let start = format::place(self.tail, record, self.shared.block);
        let end = start + record;
        self.reserve(start, end)?;
        if start > self.tail {
            self.write_padding(start);
        }
        // Laid out in the private copy first and sealed there (one checksum over contiguous
        // bytes), then stored to the shared memory in one go.
        let header = format::unsealed_entry_header(Lsn(start), index, term, payload.len());
        self.verified.put(start, &header);
        self.verified.put(start + HEADER_BYTES as u64, payload);
        let record = self.verified.tail_from(start);
        format::seal_entry(record);
        self.shared.store(start, record);
        self.verified.settle(end);
        self.tail = end;
        self.last_index = index;
        self.last_term = term;
        self.shared.publish(end);
        Ok(Lsn(start))
    }

    fn reserve(&mut self, start: u64, end: u64) -> Result<(), WalError> {
        if end - self.cached_head > self.shared.capacity {
            self.cached_head = self.shared.head.load(Ordering::Acquire);
            if end - self.cached_head > self.shared.capacity {
                return Err(WalError::RingFull {
                    lsn: Lsn(start),
                    needed_bytes: end - self.tail,
                    free_bytes: self.free_bytes(),
                });
            }
        }
        Ok(())
    }

    fn write_padding(&mut self, start: u64) {
        let gap = start - self.tail;
        if gap >= HEADER_BYTES as u64 {
            let header =
                format::padding_header(Lsn(self.tail), gap, (self.last_index, self.last_term));
            self.shared.store(self.tail, &header);
            self.verified.put(self.tail, &header);
        }
    }

    /// Checks the bytes that someone else (the leader, by RDMA Write) placed in
    /// `[tail, end)` and, if every record is valid, publishes them. Checks: `end` is within
    /// the free window, every record's length is bounded by its block and by `end`, its Lsn
    /// tag, its crc32c, and the index chain (next index, term not lower). On any failure
    /// nothing is accepted. Returns the new end of the log.
    pub fn accept_written(&mut self, end: Lsn) -> Result<Position, WalError> {
        self.accept_written_each(end, |_, _| {})
    }

    /// [`Producer::accept_written`], handing each record it checked (padding excepted) to
    /// `each` with its Lsn, in order, from the very copy that passed the checks: a caller
    /// that needs the records (a follower giving them to raft) reads and checksums nothing a
    /// second time, and sees exactly the bytes that were verified. On an error some records
    /// may have been handed over although nothing was published.
    pub fn accept_written_each(
        &mut self,
        end: Lsn,
        mut each: impl FnMut(Lsn, &Decoded<'_>),
    ) -> Result<Position, WalError> {
        let (accepted, _) = self.validate(end.0, Term(u64::MAX), &mut each)?;
        debug_assert_eq!(accepted, end.0);
        Ok(self.position())
    }

    /// Recovery after a crash of the process that owned this (crash-surviving) memory: checks
    /// the records in `[tail, published)`, where `published` is what [`published_tail`] read,
    /// as [`Producer::accept_written`] does, and publishes them. It stops before the first
    /// entry whose term is above `max_term` (the last term the process had made durable: an
    /// entry of a later term was never acknowledged). Returns the new end of the log and how
    /// many entries were recovered. A published record that fails a check is corruption of
    /// acknowledged data, and an error.
    pub fn recover_published(
        &mut self,
        published: Lsn,
        max_term: Term,
    ) -> Result<(Position, u64), WalError> {
        let before = self.last_index;
        if published.0 <= self.tail {
            return Ok((self.position(), 0));
        }
        self.validate(published.0, max_term, &mut |_, _| {})?;
        Ok((self.position(), self.last_index.0 - before.0))
    }

    /// Validates `[tail, end)` and publishes it, stopping before an entry of a term above
    /// `max_term`; returns where it stopped.
    fn validate(
        &mut self,
        end: u64,
        max_term: Term,
        each: &mut dyn FnMut(Lsn, &Decoded<'_>),
    ) -> Result<(u64, ChainCheck), WalError> {
        let r = self.validate_inner(end, max_term, each);
        // On an error nothing was accepted: the copy of what was checked goes too.
        self.verified.settle(self.tail);
        r
    }

    fn validate_inner(
        &mut self,
        end: u64,
        max_term: Term,
        each: &mut dyn FnMut(Lsn, &Decoded<'_>),
    ) -> Result<(u64, ChainCheck), WalError> {
        let head = self.shared.head.load(Ordering::Acquire);
        if end < self.tail || end % 8 != 0 || end - head > self.shared.capacity {
            return Err(WalError::Range {
                start: Lsn(self.tail),
                end: Lsn(end),
                held_start: Lsn(head),
                held_end: Lsn(head + self.shared.capacity),
            });
        }
        let block = self.shared.block;
        let mut chain = ChainCheck {
            last_index: self.last_index,
            last_term: self.last_term,
        };
        let mut pos = self.tail;
        while pos < end {
            let last_index = chain.last_index;
            let fail = move |source| WalError::RemoteRange {
                lsn: Lsn(pos),
                index: last_index,
                source,
            };
            let rest = format::block_rest(pos, block);
            let available = (end - pos).min(rest) as usize;
            if rest < HEADER_BYTES as u64 {
                if end - pos < rest {
                    return Err(fail(DecodeError::Truncated {
                        needed: rest,
                        available: end - pos,
                    }));
                }
                pos += rest;
                continue;
            }
            let decoded = self.read_record(pos, available).map_err(fail)?;
            let header = decoded.header;
            if header.kind == RecordKind::Entry && header.term > max_term {
                break;
            }
            let len = decoded.record_len;
            chain.advance(&header).map_err(fail)?;
            if header.kind != RecordKind::Padding {
                each(Lsn(pos), &decoded);
            }
            let checked = HEADER_BYTES + decoded.payload.len();
            self.keep_checked(pos, checked);
            pos += len;
        }
        self.tail = pos;
        self.last_index = chain.last_index;
        self.last_term = chain.last_term;
        self.shared.publish(pos);
        Ok((pos, chain))
    }

    /// Takes every record a remote writer placed past the tail that is valid and continues
    /// the chain (the checks of [`Producer::accept_written`]), up to the first that is not,
    /// or the first entry of a term above `max_term`, and publishes them. Unlike
    /// `accept_written` it is given no end: it is how a follower takes what a leader wrote
    /// and counted as held although no descriptor said so (the leader's completion came
    /// back, the follower has not seen the descriptor yet, or never will). The log then ends
    /// at the last entry taken: a padding record after it is left, because the next entry
    /// may still fit before the block's end. Never fails: a record that is not valid is
    /// where the placed bytes end. Returns the new end and how many entries were taken.
    pub fn accept_placed(&mut self, max_term: Term) -> (Position, u64) {
        self.accept_placed_each(max_term, |_, _| {})
    }

    /// [`Producer::accept_placed`], handing each entry it took to `each` with its Lsn, in
    /// order, from the very copy that passed the checks (as
    /// [`Producer::accept_written_each`] does): a follower building raft's entries from them
    /// reads and checksums nothing a second time.
    pub fn accept_placed_each(
        &mut self,
        max_term: Term,
        mut each: impl FnMut(Lsn, &Decoded<'_>),
    ) -> (Position, u64) {
        let head = self.shared.head.load(Ordering::Acquire);
        let limit = head + self.shared.capacity;
        let block = self.shared.block;
        let before = self.last_index;
        let mut chain = ChainCheck {
            last_index: self.last_index,
            last_term: self.last_term,
        };
        let mut pos = self.tail;
        let mut end = self.tail;
        while pos < limit {
            let rest = format::block_rest(pos, block);
            if rest < HEADER_BYTES as u64 {
                pos += rest;
                continue;
            }
            let available = (limit - pos).min(rest) as usize;
            let Ok(decoded) = self.read_record(pos, available) else {
                break;
            };
            let header = decoded.header;
            match header.kind {
                RecordKind::Entry if header.term > max_term => break,
                RecordKind::Entry => {}
                RecordKind::Padding => {
                    let len = decoded.record_len;
                    self.keep_checked(pos, HEADER_BYTES);
                    pos += len;
                    continue;
                }
                // A start record is only ever the first of a segment, never placed.
                _ => break,
            }
            if chain.advance(&header).is_err() {
                break;
            }
            each(Lsn(pos), &decoded);
            let (len, checked) = (decoded.record_len, HEADER_BYTES + decoded.payload.len());
            self.keep_checked(pos, checked);
            pos += len;
            end = pos;
        }
        self.tail = end;
        self.verified.settle(end);
        self.last_index = chain.last_index;
        self.last_term = chain.last_term;
        self.shared.publish(end);
        (self.position(), self.last_index.0 - before.0)
    }

    /// Zeroes the free part of the ring, `[tail, head + capacity)`: whatever an earlier
    /// writer left there (records of a log this ring no longer follows, placed bytes nobody
    /// took) can then never pass for a record that [`Producer::accept_placed`] takes.
    pub fn clear_free(&mut self) {
        let head = self.shared.head.load(Ordering::Acquire);
        let mut pos = self.tail;
        let limit = head + self.shared.capacity;
        while pos < limit {
            let n = (limit - pos).min(self.shared.capacity - (pos & self.shared.mask));
            for w in self.shared.span(pos, n as usize) {
                w.store(0, Ordering::Relaxed);
            }
            pos += n;
        }
        crate::sync::fence(Ordering::Release);
    }

    /// Whether the ring is open to remote writes ([`Producer::set_open_to_remote`]; after
    /// [`ring_recovering`], as the crashed process left it).
    pub fn open_to_remote(&self) -> bool {
        self.shared.open_to_remote.load(Ordering::Relaxed)
    }

    /// Marks the ring open (or closed) to remote writes that a writer counts as held before
    /// this producer saw them, in the tail mirror, so that recovery after a crash of this
    /// process knows to take them ([`open_to_remote`], then [`Producer::accept_placed`]).
    /// Open it before granting remote write; close it only after the grant was revoked and
    /// what was placed was taken.
    pub fn set_open_to_remote(&mut self, open: bool) {
        self.shared.open_to_remote.store(open, Ordering::Relaxed);
        self.shared.publish(self.tail);
    }

    /// Adds the first `len` bytes of the scratch block (the record at `pos` that just passed
    /// its checks there) to the verified copy.
    fn keep_checked(&mut self, pos: u64, len: usize) {
        self.verified.put(pos, &self.scratch[..len]);
    }

    /// The private copy of the records published since the last
    /// [`Producer::forget_verified`]: each exactly as encoded here or as its checks saw it.
    /// Persist from it ([`crate::Wal::persist_from`]) where it [`Verified::covers`] what the
    /// wal lacks, and from the [`Consumer`] (every record checked again) where it does not.
    pub fn verified(&self) -> Verified<'_> {
        Verified {
            from: self.verified.from,
            bytes: &self.verified.bytes,
            block: self.shared.block,
            reread: self.reread_after_checks.then_some(&*self.shared),
        }
    }

    /// Drops the verified copy of everything before `lsn` (what the wal now holds).
    pub fn forget_verified(&mut self, lsn: Lsn) {
        self.verified.forget_before(lsn.0);
    }

    /// Test-only mutation: the copy that [`Producer::verified`] hands to the wal reads the
    /// shared memory again instead of the bytes that passed the checks, and is still trusted
    /// (no checksum), so a write that lands after the checks reaches the wal unchecked.
    /// `wal/tests/integration/verified_copy.rs` proves the tests notice.
    #[doc(hidden)]
    pub fn reread_after_checks_for_test(&mut self) {
        self.reread_after_checks = true;
    }

    /// Decodes the record at `pos` from at most `available` bytes (bounded by its block and by
    /// the range being checked): the header first, then only as much payload as the header
    /// claims.
    fn read_record(&mut self, pos: u64, available: usize) -> Result<Decoded<'_>, DecodeError> {
        let scratch = &mut self.scratch[..available];
        let head_len = HEADER_BYTES.min(available);
        self.shared.load(pos, &mut scratch[..head_len]);
        // Only a whole header says how much payload follows.
        if let Ok(header) = <&[u8; HEADER_BYTES]>::try_from(&scratch[..head_len]) {
            let want = RawHeader::read(header).copy_len(available);
            self.shared
                .load(pos + HEADER_BYTES as u64, &mut scratch[HEADER_BYTES..want]);
        }
        format::decode_record(scratch, Lsn(pos), self.shared.block)
    }

    /// Moves the tail back to `to` (a raft conflict on a follower). `to` must be a record
    /// boundary in `[head, tail]`. Call it only while the consumer is not reading past `to`.
    pub fn rewind(&mut self, to: Position) -> Result<(), WalError> {
        let head = self.shared.head.load(Ordering::Acquire);
        if to.lsn.0 < head || to.lsn.0 > self.tail || to.lsn.0 % 8 != 0 {
            return Err(WalError::Range {
                start: to.lsn,
                end: Lsn(self.tail),
                held_start: Lsn(head),
                held_end: Lsn(self.tail),
            });
        }
        self.tail = to.lsn.0;
        self.last_index = to.last_index;
        self.last_term = to.last_term;
        self.verified.settle(self.tail);
        self.shared.publish(self.tail);
        Ok(())
    }

    /// End of the published records, and the last entry.
    pub fn position(&self) -> Position {
        Position {
            lsn: Lsn(self.tail),
            last_index: self.last_index,
            last_term: self.last_term,
        }
    }

    /// Bytes free for new records (including any padding they need).
    pub fn free_bytes(&self) -> u64 {
        self.shared.capacity - (self.tail - self.shared.head.load(Ordering::Acquire))
    }

    /// The ring's memory, for registration.
    pub fn memory(&self) -> &Arc<dyn RingMemory> {
        &self.shared.memory
    }
}

/// The reading end: persists records to segments and releases them.
#[derive(Debug)]
pub struct Consumer {
    shared: Arc<Shared>,
    head: u64,
    /// One block, allocated once, that records are copied into for decoding.
    scratch: Box<[u8]>,
}

impl Consumer {
    /// First byte still held.
    pub fn head(&self) -> Lsn {
        Lsn(self.head)
    }

    /// End of the published records.
    pub fn tail(&self) -> Lsn {
        Lsn(self.shared.tail.load(Ordering::Acquire))
    }

    /// Copies the stream bytes `[start, start + out.len())`, which must be held.
    pub fn copy_range(&self, start: Lsn, out: &mut [u8]) -> Result<(), WalError> {
        let tail = self.shared.tail.load(Ordering::Acquire);
        let end = start.0.checked_add(out.len() as u64);
        if start.0 < self.head || start.0 % 8 != 0 || end.is_none_or(|end| end > tail) {
            return Err(WalError::Range {
                start,
                end: Lsn(end.unwrap_or(u64::MAX)),
                held_start: Lsn(self.head),
                held_end: Lsn(tail),
            });
        }
        self.shared.load(start.0, out);
        Ok(())
    }

    /// Returns the next entry at or after `from` (skipping padding), with its Lsn, or `None`
    /// when `from` reaches the tail. The entry is re-verified (bounds, Lsn tag, crc32c); the
    /// payload borrows an internal buffer. The entry ends at `lsn + record_len`.
    pub fn next_entry(&mut self, from: Lsn) -> Result<Option<(Lsn, Decoded<'_>)>, WalError> {
        let tail = self.shared.tail.load(Ordering::Acquire);
        let block = self.shared.block;
        let mut pos = from.0;
        if pos < self.head || pos % 8 != 0 {
            return Err(WalError::Range {
                start: from,
                end: Lsn(tail),
                held_start: Lsn(self.head),
                held_end: Lsn(tail),
            });
        }
        while pos < tail {
            let rest = format::block_rest(pos, block);
            if rest < HEADER_BYTES as u64 {
                pos += rest;
                continue;
            }
            let available = (tail - pos).min(rest) as usize;
            let mut header = [0u8; HEADER_BYTES];
            self.shared.load(pos, &mut header);
            let header = RawHeader::read(&header);
            if header.kind() == Some(RecordKind::Padding) {
                pos += rest;
                continue;
            }
            let want = header.copy_len(available);
            self.shared.load(pos, &mut self.scratch[..want]);
            let decoded = format::decode_record(&self.scratch[..want], Lsn(pos), block).map_err(
                |source| WalError::RemoteRange {
                    lsn: Lsn(pos),
                    index: Index(0),
                    source,
                },
            )?;
            return Ok(Some((Lsn(pos), decoded)));
        }
        Ok(None)
    }

    /// Releases everything before `up_to` to the producer. `up_to` must be in `[head, tail]`.
    pub fn release(&mut self, up_to: Lsn) -> Result<(), WalError> {
        let tail = self.shared.tail.load(Ordering::Acquire);
        if up_to.0 < self.head || up_to.0 > tail {
            return Err(WalError::Range {
                start: Lsn(self.head),
                end: up_to,
                held_start: Lsn(self.head),
                held_end: Lsn(tail),
            });
        }
        self.head = up_to.0;
        self.shared.head.store(up_to.0, Ordering::Release);
        Ok(())
    }

    /// Block size of the placement rule.
    pub fn block_bytes(&self) -> u64 {
        self.shared.block
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn small_ring(capacity: u64, block: u64) -> (Producer, Consumer) {
        let memory = Arc::new(AnonymousMemory::new(capacity).unwrap());
        ring(
            memory,
            RingConfig {
                capacity_bytes: capacity,
                block_bytes: block,
            },
            Position::default(),
        )
        .unwrap()
    }

    #[test]
    fn empty_then_full_then_empty_again() {
        let (mut producer, mut consumer) = small_ring(256, 128);
        assert_eq!(consumer.head(), consumer.tail(), "a new ring is empty");
        // 56-byte payload -> 88-byte record; two fit per 128-byte block? No: 88 + 88 > 128, so
        // each record takes one block (with 40 bytes of padding after it).
        producer.append_next(Term(1), &[1; 56]).unwrap();
        producer.append_next(Term(1), &[2; 56]).unwrap();
        assert_eq!(producer.free_bytes(), 256 - 128 - 88);
        let err = producer.append_next(Term(1), &[3; 56]).unwrap_err();
        assert!(matches!(err, WalError::RingFull { .. }), "{err}");
        let (lsn, entry) = consumer.next_entry(Lsn(0)).unwrap().unwrap();
        assert_eq!(
            (lsn, entry.header.index, entry.payload),
            (Lsn(0), Index(1), &[1u8; 56][..])
        );
        let next = lsn.0 + entry.record_len;
        consumer.release(Lsn(next)).unwrap();
        producer.append_next(Term(1), &[3; 56]).unwrap();
        let (lsn, entry) = consumer.next_entry(Lsn(next)).unwrap().unwrap();
        assert_eq!((lsn, entry.header.index), (Lsn(128), Index(2)));
        let tail = consumer.tail();
        consumer.release(tail).unwrap();
        assert_eq!(producer.free_bytes(), 256);
    }

    #[test]
    fn wrap_around_keeps_entries_contiguous_and_in_order() {
        let (mut producer, mut consumer) = small_ring(512, 128);
        let mut next = Lsn(0);
        for i in 0..200u64 {
            let payload = vec![i as u8; (i % 70) as usize];
            let (index, lsn) = producer.append_next(Term(1 + i / 50), &payload).unwrap();
            assert_eq!(index, Index(i + 1));
            assert_eq!(
                lsn.0 / 128,
                (lsn.0 + format::record_bytes(payload.len()) as u64 - 1) / 128,
                "never crosses a block"
            );
            let (at, entry) = consumer.next_entry(next).unwrap().unwrap();
            assert_eq!(at, lsn);
            assert_eq!(entry.payload, &payload[..]);
            next = Lsn(at.0 + entry.record_len);
            consumer.release(next).unwrap();
        }
        assert!(next.0 > 4 * 512, "wrapped several times");
    }

    #[test]
    fn oversized_and_out_of_order_entries_are_refused() {
        let (mut producer, _consumer) = small_ring(256, 128);
        assert!(matches!(
            producer.append_next(Term(1), &[0; 97]),
            Err(WalError::EntryTooLarge { max: 96, .. })
        ));
        assert!(matches!(
            producer.append(Index(2), Term(1), b"x"),
            Err(WalError::OutOfOrder { .. })
        ));
        producer.append(Index(1), Term(2), b"x").unwrap();
        assert!(matches!(
            producer.append(Index(2), Term(1), b"x"),
            Err(WalError::OutOfOrder { .. })
        ));
    }

    #[test]
    fn follower_accepts_a_valid_remote_range_and_refuses_a_bad_one() {
        let (mut leader, leader_consumer) = small_ring(1024, 256);
        for i in 0..6u64 {
            leader
                .append_next(Term(2), &vec![i as u8; 40 + i as usize * 9])
                .unwrap();
        }
        let end = leader.position().lsn;
        let mut bytes = vec![0u8; end.0 as usize];
        leader_consumer.copy_range(Lsn(0), &mut bytes).unwrap();

        // A faithful "RDMA Write" of the whole range into the follower's memory.
        let memory = Arc::new(AnonymousMemory::new(1024).unwrap());
        let config = RingConfig {
            capacity_bytes: 1024,
            block_bytes: 256,
        };
        let (mut follower, _c) = ring(memory.clone(), config, Position::default()).unwrap();
        write_words(&*memory, 0, &bytes);
        // Each record comes back once, in order, as written (the 256 B blocks force padding
        // between some of them, which is not handed over).
        let mut seen = Vec::new();
        let position = follower
            .accept_written_each(end, |lsn, d| {
                seen.push((lsn, d.header.index, d.header.term, d.payload.to_vec()))
            })
            .unwrap();
        assert_eq!(
            (position.last_index, position.last_term, position.lsn),
            (Index(6), Term(2), end)
        );
        let mut reader = leader_consumer;
        let mut at = Lsn(0);
        assert_eq!(seen.len(), 6);
        for (i, (lsn, index, term, payload)) in seen.into_iter().enumerate() {
            let (want_lsn, d) = reader.next_entry(at).unwrap().unwrap();
            assert_eq!((lsn, index, term), (want_lsn, Index(i as u64 + 1), Term(2)));
            assert_eq!(payload, d.payload);
            at = Lsn(want_lsn.0 + d.record_len);
        }

        // Each kind of damage is refused and nothing is accepted.
        for damage in 0..4 {
            let memory = Arc::new(AnonymousMemory::new(1024).unwrap());
            let (mut follower, _c) = ring(memory.clone(), config, Position::default()).unwrap();
            let mut bad = bytes.clone();
            match damage {
                0 => bad[200] ^= 0x40,                                  // payload bit flip
                1 => bad[4..8].copy_from_slice(&5000u32.to_le_bytes()), // length beyond block
                2 => bad[8..16].copy_from_slice(&9u64.to_le_bytes()), // index gap (crc breaks too)
                _ => {}
            }
            write_words(&*memory, 0, &bad);
            let claimed_end = if damage == 3 { Lsn(end.0 - 8) } else { end }; // torn range end
            let err = follower.accept_written(claimed_end).unwrap_err();
            assert!(
                matches!(err, WalError::RemoteRange { .. }),
                "damage {damage}: {err}"
            );
            assert_eq!(follower.position(), Position::default());
        }
        // A follower whose chain does not match (it expects index 10 next) refuses too.
        let memory = Arc::new(AnonymousMemory::new(1024).unwrap());
        let start = Position {
            lsn: Lsn(0),
            last_index: Index(9),
            last_term: Term(1),
        };
        let (mut follower, _c) = ring(memory.clone(), config, start).unwrap();
        write_words(&*memory, 0, &bytes);
        let err = follower.accept_written(end).unwrap_err();
        assert!(
            matches!(
                err,
                WalError::RemoteRange {
                    source: DecodeError::IndexGap { .. },
                    ..
                }
            ),
            "{err}"
        );
        // And a range beyond the free window is refused before any byte is read.
        assert!(matches!(
            follower.accept_written(Lsn(2048)),
            Err(WalError::Range { .. })
        ));
    }

    fn write_words(memory: &dyn RingMemory, at: usize, bytes: &[u8]) {
        for (i, chunk) in bytes.chunks(8).enumerate() {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            memory.words()[at / 8 + i].store(u64::from_le_bytes(word), Ordering::Relaxed);
        }
    }

    #[test]
    fn concurrent_producer_and_consumer_see_every_entry_once_in_order() {
        let (mut producer, mut consumer) = small_ring(4096, 512);
        const ENTRIES: u64 = 50_000;
        let writer = std::thread::spawn(move || {
            let mut payload = [0u8; 120];
            for i in 1..=ENTRIES {
                let len = (i % 113) as usize;
                payload[..8].copy_from_slice(&i.to_le_bytes());
                loop {
                    match producer.append_next(Term(1), &payload[..len.max(8)]) {
                        Ok(_) => break,
                        Err(WalError::RingFull { .. }) => std::thread::yield_now(),
                        Err(other) => panic!("append failed: {other}"),
                    }
                }
            }
        });
        let mut next = Lsn(0);
        let mut seen = 0u64;
        while seen < ENTRIES {
            match consumer.next_entry(next).unwrap() {
                Some((lsn, entry)) => {
                    seen += 1;
                    assert_eq!(entry.header.index, Index(seen));
                    assert_eq!(entry.payload[..8], seen.to_le_bytes());
                    next = Lsn(lsn.0 + entry.record_len);
                    consumer.release(next).unwrap();
                }
                None => std::thread::yield_now(),
            }
        }
        writer.join().unwrap();
    }

    #[test]
    fn rewind_moves_the_tail_back_within_the_held_range() {
        let (mut producer, consumer) = small_ring(1024, 256);
        let (_, lsn2) = {
            producer.append_next(Term(1), b"one").unwrap();
            producer.append_next(Term(1), b"two").unwrap()
        };
        let to = Position {
            lsn: lsn2,
            last_index: Index(1),
            last_term: Term(1),
        };
        producer.rewind(to).unwrap();
        assert_eq!(consumer.tail(), lsn2);
        producer.append(Index(2), Term(3), b"new two").unwrap();
        assert!(
            producer
                .rewind(Position {
                    lsn: Lsn(4096),
                    ..to
                })
                .is_err()
        );
    }

    /// Ring memory that outlives its rings, with a tail mirror: what a shmem file gives.
    #[derive(Debug)]
    struct Surviving {
        words: Box<[AtomicU64]>,
        mirror: AtomicU64,
    }

    impl RingMemory for Surviving {
        fn words(&self) -> &[AtomicU64] {
            &self.words
        }
        fn tail_mirror(&self) -> Option<&AtomicU64> {
            Some(&self.mirror)
        }
    }

    fn surviving(len: u64) -> Arc<Surviving> {
        Arc::new(Surviving {
            words: (0..len / 8).map(|_| AtomicU64::new(0)).collect(),
            mirror: AtomicU64::new(0),
        })
    }

    const CFG: RingConfig = RingConfig {
        capacity_bytes: 1024,
        block_bytes: 256,
    };

    #[test]
    fn a_cleared_ring_claims_nothing_and_is_closed_to_remote_writes() {
        let memory = surviving(1024);
        let (mut p, _c) = ring(memory.clone(), CFG, Position::default()).unwrap();
        p.append_next(Term(1), b"one").unwrap();
        p.set_open_to_remote(true);
        assert!(published_tail(memory.as_ref()).unwrap() > Lsn(0));
        assert!(open_to_remote(memory.as_ref()));
        clear_published(memory.as_ref());
        assert_eq!(published_tail(memory.as_ref()), Some(Lsn(0)));
        assert!(!open_to_remote(memory.as_ref()));
        // A process starting now over a log that ends anywhere takes nothing from the ring.
        let end = Position {
            lsn: Lsn(64),
            last_index: Index(1),
            last_term: Term(1),
        };
        let (mut p, _c) = ring_recovering(memory.clone(), CFG, end).unwrap();
        assert_eq!(p.recover_published(Lsn(0), Term(1)).unwrap(), (end, 0));
    }

    #[test]
    fn a_crashed_producers_published_records_are_recovered_and_nothing_past_them() {
        let memory = surviving(1024);
        let (mut p, mut c) = ring(memory.clone(), CFG, Position::default()).unwrap();
        p.append_next(Term(1), b"one").unwrap();
        p.append_next(Term(1), b"two").unwrap();
        let (_, lsn3) = p.append_next(Term(2), b"three").unwrap();
        // The consumer (the log) took the first entry; then a rewind cuts "three" and an
        // unpublished record lands past the end (a leader's write whose descriptor never
        // came, or an append interrupted by the crash).
        let (l1, e1) = c.next_entry(Lsn(0)).unwrap().unwrap();
        let after_one = Position {
            lsn: Lsn(l1.0 + e1.record_len),
            last_index: Index(1),
            last_term: Term(1),
        };
        p.rewind(Position {
            lsn: lsn3,
            last_index: Index(2),
            last_term: Term(1),
        })
        .unwrap();
        assert_eq!(published_tail(memory.as_ref()), Some(lsn3));
        drop((p, c)); // the process dies; the memory stays
        let published = published_tail(memory.as_ref()).unwrap();
        let (mut p, _c) = ring_recovering(memory.clone(), CFG, after_one).unwrap();
        assert_eq!(
            published_tail(memory.as_ref()),
            Some(lsn3),
            "building the ring must not move the mirror before recovery"
        );
        let (end, n) = p.recover_published(published, Term(5)).unwrap();
        assert_eq!(
            n, 1,
            "only \"two\" lies between the log's end and the published end"
        );
        assert_eq!(
            (end.lsn, end.last_index, end.last_term),
            (lsn3, Index(2), Term(1))
        );
        // Recovering again from the same place is idempotent.
        let (mut p2, _c2) = ring_recovering(memory.clone(), CFG, after_one).unwrap();
        assert_eq!(p2.recover_published(published, Term(5)).unwrap().1, 1);
        p.append_next(Term(3), b"new three").unwrap();
        assert!(published_tail(memory.as_ref()).unwrap() > lsn3);
    }

    #[test]
    fn recovery_stops_before_an_entry_of_an_undurable_term_and_refuses_corruption() {
        let memory = surviving(1024);
        let (mut p, _c) = ring(memory.clone(), CFG, Position::default()).unwrap();
        p.append_next(Term(1), b"one").unwrap();
        let (_, lsn2) = p.append_next(Term(4), b"two").unwrap();
        let published = published_tail(memory.as_ref()).unwrap();
        drop(p);
        let (mut p, _c) = ring_recovering(memory.clone(), CFG, Position::default()).unwrap();
        let (end, n) = p.recover_published(published, Term(3)).unwrap();
        assert_eq!(
            (end.lsn, n),
            (lsn2, 1),
            "term 4 was never durable, so never acked"
        );
        // Corrupt a published payload byte: recovery reports it instead of cutting the log.
        memory.words[5].fetch_xor(0xff, Ordering::Relaxed);
        let (mut p, _c) = ring_recovering(memory.clone(), CFG, Position::default()).unwrap();
        let e = p.recover_published(published, Term(9)).unwrap_err();
        assert!(matches!(e, WalError::RemoteRange { .. }), "{e}");
        // Memory without a mirror has nothing to recover.
        let plain = AnonymousMemory::new(1024).unwrap();
        assert_eq!(published_tail(&plain), None);
    }

    /// Six entries of term 2 written by a "leader", and the bytes of its ring.
    fn leader_bytes() -> (Vec<u8>, Vec<Lsn>, Lsn) {
        let (mut leader, leader_consumer) = small_ring(1024, 256);
        let mut starts = Vec::new();
        for i in 0..6u64 {
            let (_, lsn) = leader
                .append_next(Term(2), &vec![i as u8; 40 + i as usize * 9])
                .unwrap();
            starts.push(lsn);
        }
        let end = leader.position().lsn;
        let mut bytes = vec![0u8; end.0 as usize];
        leader_consumer.copy_range(Lsn(0), &mut bytes).unwrap();
        (bytes, starts, end)
    }

    #[test]
    fn placed_records_are_taken_up_to_the_first_that_is_not_valid() {
        let (bytes, starts, end) = leader_bytes();
        let memory = surviving(1024);
        let (mut f, _c) = ring(memory.clone(), CFG, Position::default()).unwrap();
        // Nothing placed: nothing taken.
        assert_eq!(f.accept_placed(Term(9)), (Position::default(), 0));
        write_words(&*memory, 0, &bytes);
        let (pos, n) = f.accept_placed(Term(9));
        assert_eq!((pos.lsn, pos.last_index, n), (end, Index(6), 6));
        assert_eq!(published_tail(memory.as_ref()), Some(end));
        // Taking again finds nothing more.
        assert_eq!(f.accept_placed(Term(9)).1, 0);

        // A torn fourth record: the first three are taken, the valid ones after it are not.
        let (mut f, _c) = ring(surviving(1024), CFG, Position::default()).unwrap();
        let mut torn = bytes.clone();
        torn[starts[3].0 as usize + 40] ^= 1;
        write_words(&*f.memory().clone(), 0, &torn);
        let (pos, n) = f.accept_placed(Term(9));
        assert_eq!((pos.lsn, pos.last_index, n), (starts[3], Index(3), 3));

        // An entry of a term above the limit is not taken, nor anything after it.
        let (mut f, _c) = ring(surviving(1024), CFG, Position::default()).unwrap();
        write_words(&*f.memory().clone(), 0, &bytes);
        assert_eq!(f.accept_placed(Term(1)).1, 0);

        // Records that do not continue this ring's chain are not taken.
        let start = Position {
            lsn: Lsn(0),
            last_index: Index(9),
            last_term: Term(1),
        };
        let (mut f, _c) = ring(surviving(1024), CFG, start).unwrap();
        write_words(&*f.memory().clone(), 0, &bytes);
        assert_eq!(f.accept_placed(Term(9)), (start, 0));
    }

    #[test]
    fn each_placed_record_taken_is_handed_over_in_order() {
        let (bytes, starts, _end) = leader_bytes();
        let memory = surviving(1024);
        let (mut f, _c) = ring(memory.clone(), CFG, Position::default()).unwrap();
        let mut torn = bytes.clone();
        torn[starts[3].0 as usize + 40] ^= 1;
        write_words(&*memory, 0, &torn);
        let mut seen = Vec::new();
        let (_, n) = f.accept_placed_each(Term(9), |lsn, d| {
            seen.push((lsn, d.header.index, d.payload.to_vec()));
        });
        assert_eq!(n, 3);
        let want: Vec<_> = (0..3u64)
            .map(|i| {
                (
                    starts[i as usize],
                    Index(i + 1),
                    vec![i as u8; 40 + i as usize * 9],
                )
            })
            .collect();
        assert_eq!(seen, want);
    }

    #[test]
    fn a_trailing_padding_record_is_not_taken_as_the_end_of_the_log() {
        // Entries of 200 bytes in 256-byte blocks: each is followed by padding to the block end.
        let (mut leader, lc) = small_ring(1024, 256);
        leader.append_next(Term(1), &[7; 150]).unwrap();
        let one_end = leader.position().lsn;
        leader.append_next(Term(1), &[8; 150]).unwrap();
        let mut bytes = vec![0u8; leader.position().lsn.0 as usize];
        lc.copy_range(Lsn(0), &mut bytes).unwrap();
        // Only the first entry and the padding after it were placed.
        bytes.truncate(256);
        let (mut f, _c) = ring(surviving(1024), CFG, Position::default()).unwrap();
        write_words(&*f.memory().clone(), 0, &bytes);
        let (pos, n) = f.accept_placed(Term(1));
        assert_eq!((pos.lsn, n), (one_end, 1));
    }

    #[test]
    fn clearing_the_free_part_leaves_nothing_to_take_and_keeps_the_log() {
        let (bytes, _, end) = leader_bytes();
        let memory = surviving(1024);
        let (mut f, _c) = ring(memory.clone(), CFG, Position::default()).unwrap();
        f.append_next(Term(1), b"mine").unwrap();
        let mine = f.position();
        // Stale records of another log past our end (a cut suffix, bytes nobody took).
        write_words(
            &*memory,
            mine.lsn.0 as usize,
            &bytes[..(end.0 - mine.lsn.0) as usize],
        );
        f.clear_free();
        assert!(
            memory.words[(mine.lsn.0 / 8) as usize..]
                .iter()
                .all(|w| w.load(Ordering::Relaxed) == 0)
        );
        assert_eq!(f.accept_placed(Term(9)), (mine, 0));
        let mut out = vec![0u8; mine.lsn.0 as usize];
        _c.copy_range(Lsn(0), &mut out).unwrap();
        assert_eq!(&out[32..36], b"mine");
    }

    #[test]
    fn the_open_to_remote_mark_rides_in_the_tail_mirror() {
        let memory = surviving(1024);
        let (mut p, _c) = ring(memory.clone(), CFG, Position::default()).unwrap();
        assert!(!open_to_remote(memory.as_ref()));
        p.set_open_to_remote(true);
        let (_, _) = p.append_next(Term(1), b"one").unwrap();
        let end = p.position().lsn;
        assert!(open_to_remote(memory.as_ref()));
        assert_eq!(
            published_tail(memory.as_ref()),
            Some(end),
            "the mark is not part of the Lsn"
        );
        p.set_open_to_remote(false);
        assert!(!open_to_remote(memory.as_ref()));
        assert_eq!(published_tail(memory.as_ref()), Some(end));
        assert!(!open_to_remote(&AnonymousMemory::new(1024).unwrap()));
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    //! Model-checks the publish/release protocol. Run with
    //! `RUSTFLAGS="--cfg loom" cargo test -p wal --lib --release loom`.
    use super::*;

    #[test]
    fn loom_producer_consumer_handoff() {
        loom::model(|| {
            let memory = Arc::new(AnonymousMemory::new(128).unwrap());
            let config = RingConfig {
                capacity_bytes: 128,
                block_bytes: 64,
            };
            let (mut producer, mut consumer) = ring(memory, config, Position::default()).unwrap();
            let writer = loom::thread::spawn(move || {
                for i in 1..=3u8 {
                    while producer.append_next(Term(1), &[i; 8]).is_err() {
                        loom::thread::yield_now();
                    }
                }
            });
            let mut next = Lsn(0);
            let mut seen = 0u8;
            while seen < 3 {
                match consumer.next_entry(next).unwrap() {
                    Some((lsn, entry)) => {
                        seen += 1;
                        assert_eq!(entry.payload, &[seen; 8]);
                        next = Lsn(lsn.0 + entry.record_len);
                        consumer.release(next).unwrap();
                    }
                    None => loom::thread::yield_now(),
                }
            }
            writer.join().unwrap();
        });
    }
}
