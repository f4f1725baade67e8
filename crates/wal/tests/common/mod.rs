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
