//! Helpers shared by the integration tests: a small geometry so that tests rotate segments
//! and wrap blocks often, and a deterministic payload generator.
#![allow(dead_code)] // reason: each test file uses a different subset of the helpers

use std::path::Path;
use std::sync::Arc;

use wal::fs::{FaultFs, FileSystem};
use wal::{Index, Wal, WalConfig, WalError};

/// The directory every FaultFs-based test uses.
pub const DIR: &str = "/log";

/// 256 B blocks, 2 KiB segments, 512 B batches: rotation every few entries.
pub fn small_config() -> WalConfig {
    WalConfig {
        cluster_id: 7,
        block_bytes: 256,
        segment_data_bytes: 2048,
        max_batch_bytes: 512,
        ..WalConfig::default()
    }
}

pub fn open(fs: &FaultFs) -> Result<Wal, WalError> {
    let fs: Arc<dyn FileSystem> = Arc::new(fs.clone());
    Wal::open(fs, Path::new(DIR), small_config()).map(|(wal, _)| wal)
}

/// The payload of entry `index` in generation `generation` (so a rewritten index differs).
pub fn payload(index: u64, generation: u64) -> Vec<u8> {
    let len = ((index * 37 + generation * 11) % 150) as usize;
    (0..len)
        .map(|i| (index as usize * 31 + i + generation as usize * 7) as u8)
        .collect()
}

/// Reads every entry from the first to the last index.
pub fn read_all(wal: &Wal) -> Vec<(u64, u64, Vec<u8>)> {
    let mut out = Vec::new();
    let mut buf = Vec::new();
    let last = wal.last_index().0;
    for index in wal.first_index().0..=last {
        let entry = wal
            .read(Index(index), &mut buf)
            .expect("every held entry reads back");
        out.push((index, entry.term.0, buf.clone()));
    }
    out
}

/// The geometry of the ring tests: 512 B blocks, 4 KiB segments, 1 KiB batches.
pub fn ring_wal_config() -> WalConfig {
    WalConfig {
        block_bytes: 512,
        segment_data_bytes: 4096,
        max_batch_bytes: 1024,
        ..WalConfig::default()
    }
}

/// Copies the stream bytes `[start, end)` from one ring memory to another, word by word,
/// each at its own ring's offset: what an RDMA Write does to a follower's ring.
pub fn rdma_write(
    from: &dyn wal::RingMemory,
    to: &dyn wal::RingMemory,
    start: wal::Lsn,
    end: wal::Lsn,
) {
    use std::sync::atomic::Ordering;
    let (from_mask, to_mask) = (from.len_bytes() as u64 - 1, to.len_bytes() as u64 - 1);
    for pos in (start.0..end.0).step_by(8) {
        let word = from.words()[((pos & from_mask) / 8) as usize].load(Ordering::Relaxed);
        to.words()[((pos & to_mask) / 8) as usize].store(word, Ordering::Relaxed);
    }
}

/// The power-cut points `1..=ops` of an operation, each once without a tear (`tear` false) or
/// with eight tear seeds (for [`FaultFs::reboot`]), mixed so that they differ in every bit.
pub fn cut_points(ops: u64, tear: bool) -> Vec<(u64, Option<u64>)> {
    (1..=ops)
        .flat_map(|k| {
            let seeds: Vec<Option<u64>> = if tear {
                (0..8u64)
                    .map(|s| Some((k * 8 + s).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x5EED))
                    .collect()
            } else {
                vec![None]
            };
            seeds.into_iter().map(move |seed| (k, seed))
        })
        .collect()
}

/// A closed log of four good entries and a torn fifth: the fifth's header and the first 20
/// of its 100 payload bytes (0xAB) on disk, the rest zeroed, as a crash mid-write leaves it.
pub struct TornTail {
    /// The four good entries.
    pub good: Vec<(u64, u64, Vec<u8>)>,
    /// Where the log ends after them.
    pub last: wal::Position,
    /// Where the torn record starts.
    pub torn: wal::Lsn,
}

/// Writes [`TornTail`]'s log on `fs`.
pub fn write_torn_tail(fs: &FaultFs) -> TornTail {
    let wal = open(fs).unwrap();
    for i in 1..=4 {
        wal.append_next(wal::Term(1), &payload(i, 0), wal::Durability::Fsync)
            .unwrap();
    }
    let good = read_all(&wal);
    let last = wal.position();
    let entry = wal
        .append_next(wal::Term(1), &[0xAB; 100], wal::Durability::Fsync)
        .unwrap();
    wal.close().unwrap();
    drop(wal);
    let segment = Path::new(DIR).join("00000000000000000000.wal");
    let cut_from = wal::format::SEGMENT_DATA_OFFSET + entry.lsn.0 + 52;
    fs.corrupt(&segment, cut_from, &[0; 80]);
    TornTail {
        good,
        last,
        torn: entry.lsn,
    }
}
