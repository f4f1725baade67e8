//! Writes a small valid log on the in-memory fault file system, overwrites its segment data
//! with fuzzer bytes, and reopens it: recovery must return a verified prefix or a typed error,
//! never panic.
#![no_main]

use std::path::Path;
use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use wal::fs::{FaultFs, FileSystem};
use wal::{Durability, Index, Term, Wal, WalConfig};

fn config() -> WalConfig {
    WalConfig { block_bytes: 256, segment_data_bytes: 2048, max_batch_bytes: 512, ..WalConfig::default() }
}

fuzz_target!(|data: &[u8]| {
    let fs = FaultFs::new();
    let dir = Path::new("/log");
    let dyn_fs: Arc<dyn FileSystem> = Arc::new(fs.clone());
    let (wal, _) = Wal::open(Arc::clone(&dyn_fs), dir, config()).unwrap();
    for i in 0..8u8 {
        wal.append_next(Term(1), &[i; 20], Durability::Fsync).unwrap();
    }
    wal.close().unwrap();
    drop(wal);
    let segment = dir.join("00000000000000000000.wal");
    // The first two bytes choose where the fuzzer's bytes land in the data area.
    let at = data.first().map_or(0, |&b| u64::from(b) * 8);
    fs.corrupt(&segment, 4096 + at, data.get(1..).unwrap_or(&[]));
    if let Ok((wal, _)) = Wal::open(dyn_fs, dir, config()) {
        let mut buf = Vec::new();
        for index in wal.first_index().0..=wal.last_index().0 {
            wal.read(Index(index), &mut buf).unwrap();
        }
    }
});
