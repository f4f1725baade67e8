//! At most one batch (`window_bytes`, the configured `max_batch_bytes`) is ever written but
//! unsynced (docs/FORMAT.md, section 4): recovery relies on it to tell a torn tail, which lies
//! within the last window, from corruption in the middle of the log (section 5).
//!
//! Method: a `FaultFs` disk that measures, after every write, the bytes written whose content
//! the disk does not hold yet (per file, the span of differing bytes; zeroes written ahead over
//! zeroes do not count), under four threads appending at once, with `Fsync` and `Memory`
//! appends mixed, across several segment rotations.

use std::path::Path;
use std::sync::Arc;

use wal::fs::{FaultFs, FileSystem};
use wal::{Durability, Term, Wal, WalConfig};

#[test]
fn no_more_than_one_batch_is_ever_written_but_unsynced() {
    let config = WalConfig {
        cluster_id: 7,
        block_bytes: 512,
        segment_data_bytes: 16 << 10,
        max_batch_bytes: 2048,
        ..WalConfig::default()
    };
    let window = config.max_batch_bytes;
    let fs = FaultFs::new();
    fs.track_unsynced();
    let dyn_fs: Arc<dyn FileSystem> = Arc::new(fs.clone());
    let (wal, _) = Wal::open(dyn_fs, Path::new("/log"), config).unwrap();
    let wal = Arc::new(wal);
    let threads: Vec<_> = (0..4u8)
        .map(|t| {
            let wal = wal.clone();
            std::thread::spawn(move || {
                for i in 0..150u32 {
                    let len = (i as usize * 37 + t as usize * 11) % 180;
                    let payload = vec![t.wrapping_mul(31).wrapping_add(i as u8) | 1; len];
                    let durability = if i % 3 == 0 {
                        Durability::Memory
                    } else {
                        Durability::Fsync
                    };
                    wal.append_next(Term(1), &payload, durability).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    wal.sync().unwrap();
    assert!(wal.segment_count() >= 4, "the workload rotates segments");
    let high = fs.unsynced_high_water();
    eprintln!("at most {high} bytes written but unsynced; window {window}");
    assert!(high > 0, "the measure saw no write before its sync");
    assert!(
        high <= window,
        "{high} bytes were written but unsynced at once, more than one batch of {window}"
    );
}
