//! Group commit on a real disk (a temporary directory through `StdFs`): many appenders with
//! `Durability::Fsync` each get a distinct index, every acknowledged entry reads back, and the
//! log after reopening holds exactly the acknowledged entries in index order.

use std::sync::Arc;
use std::time::Duration;

use wal::fs::StdFs;
use wal::{Durability, Index, Term, Wal, WalConfig};

#[test]
fn concurrent_fsync_appenders_share_batches_and_all_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let config = WalConfig {
        block_bytes: 4096,
        segment_data_bytes: 16 << 10,
        max_batch_bytes: 16 << 10,
        max_batch_delay: Duration::from_micros(200),
        ..WalConfig::default()
    };
    let (wal, _) = Wal::open(Arc::new(StdFs), dir.path(), config.clone()).unwrap();
    let wal = Arc::new(wal);
    const THREADS: u64 = 8;
    const PER_THREAD: u64 = 60;
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let wal = Arc::clone(&wal);
            std::thread::spawn(move || {
                let mut indexes = Vec::new();
                for i in 0..PER_THREAD {
                    let payload = [(t * 1000 + i) as u8; 100];
                    indexes.push(
                        wal.append_next(Term(1), &payload, Durability::Fsync)
                            .unwrap()
                            .index,
                    );
                }
                indexes
            })
        })
        .collect();
    let mut all: Vec<Index> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    all.sort();
    let expected: Vec<Index> = (1..=THREADS * PER_THREAD).map(Index).collect();
    assert_eq!(
        all, expected,
        "every appender got a distinct, gap-free index"
    );
    assert!(wal.segment_count() > 1, "the workload rotated segments");
    Arc::try_unwrap(wal).unwrap().close().unwrap();

    let (wal, report) = Wal::open(Arc::new(StdFs), dir.path(), config).unwrap();
    assert_eq!(report.torn_tail, None);
    assert_eq!(wal.last_index(), Index(THREADS * PER_THREAD));
    let mut buf = Vec::new();
    for index in 1..=THREADS * PER_THREAD {
        wal.read(Index(index), &mut buf).unwrap();
        assert_eq!(buf.len(), 100);
    }
    wal.close().unwrap();
}
