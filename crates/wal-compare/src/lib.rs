//! Runs the same durable append workload against this project's `wal` and against
//! [okaywal](https://crates.io/crates/okaywal), for the `wal_compare` bench.
//!
//! Equal durability: every append returns only after the bytes it wrote have been made durable
//! by an fdatasync that covers them. `wal` gets `Durability::Fsync` (group commit: one
//! fdatasync per batch of concurrent appenders); okaywal gets `EntryWriter::commit`, which
//! also returns after an fdatasync and also lets concurrent writers share one. Both write to
//! the same directory tree, with the same payload size and the same number of writer threads,
//! each writer with one append outstanding at a time.

#![deny(unsafe_code)]

use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use okaywal::{Entry, EntryId, LogManager, SegmentReader, WriteAheadLog};
use wal::fs::StdFs;
use wal::{Durability, Term, Wal, WalConfig};

/// Which log a run measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Log {
    /// This project's `wal` crate.
    Ours,
    /// okaywal 0.3.
    Okaywal,
}

/// An open log of either kind, shared by the writer threads.
#[derive(Debug)]
pub enum Opened {
    /// This project's `wal` crate.
    Ours(Arc<Wal>),
    /// okaywal 0.3.
    Okaywal(WriteAheadLog),
}

/// okaywal's checkpointer: the bench keeps no state behind the log, so recovering and
/// checkpointing have nothing to do (okaywal still runs its checkpoints, as it would in use).
#[derive(Debug)]
struct Discard;

impl LogManager for Discard {
    fn recover(&mut self, _entry: &mut Entry<'_>) -> io::Result<()> {
        Ok(())
    }

    fn checkpoint_to(
        &mut self,
        _last_checkpointed_id: EntryId,
        _checkpointed_entries: &mut SegmentReader,
        _wal: &WriteAheadLog,
    ) -> io::Result<()> {
        Ok(())
    }
}

/// The `wal` configuration of the comparison: 1 MiB blocks, 256 MiB segments, 4 MiB batches,
/// adaptive gathering (the defaults the replica uses, with bigger segments).
pub fn our_config() -> WalConfig {
    WalConfig {
        block_bytes: 1 << 20,
        segment_data_bytes: 256 << 20,
        max_batch_bytes: 4 << 20,
        ..WalConfig::default()
    }
}

/// Opens a fresh log of kind `log` in `dir` (which must be empty or absent).
pub fn open(log: Log, dir: &Path) -> io::Result<Opened> {
    match log {
        Log::Ours => {
            let (wal, _) =
                Wal::open(Arc::new(StdFs), dir, our_config()).map_err(io::Error::other)?;
            Ok(Opened::Ours(Arc::new(wal)))
        }
        Log::Okaywal => Ok(Opened::Okaywal(WriteAheadLog::recover(dir, Discard)?)),
    }
}

impl Opened {
    /// Appends one durable entry holding `payload`.
    pub fn append(&self, payload: &[u8]) -> io::Result<()> {
        match self {
            Opened::Ours(wal) => wal
                .append_next(Term(1), payload, Durability::Fsync)
                .map(|_| ())
                .map_err(io::Error::other),
            Opened::Okaywal(log) => {
                let mut writer = log.begin_entry()?;
                writer.write_chunk(payload)?;
                writer.commit().map(|_| ())
            }
        }
    }

    /// Closes the log, making everything durable.
    pub fn close(self) -> io::Result<()> {
        match self {
            Opened::Ours(wal) => wal.close().map_err(io::Error::other),
            Opened::Okaywal(log) => log.shutdown(),
        }
    }
}

/// Runs `total` durable appends of `payload_bytes` each, spread evenly over `writers` threads,
/// and returns the elapsed time scaled to exactly `total` appends.
pub fn run(log: &Arc<Opened>, writers: usize, payload_bytes: usize, total: u64) -> Duration {
    let per_writer = (total / writers as u64).max(1);
    let start = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..writers {
            let log = Arc::clone(log);
            scope.spawn(move || {
                let payload = vec![0x5Au8; payload_bytes];
                for _ in 0..per_writer {
                    log.append(&payload).expect("durable append");
                }
            });
        }
    });
    let done = per_writer * writers as u64;
    start.elapsed().mul_f64(total as f64 / done as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_logs_take_concurrent_durable_appends() {
        for kind in [Log::Ours, Log::Okaywal] {
            let dir = tempfile::tempdir().unwrap();
            let log = Arc::new(open(kind, &dir.path().join("log")).unwrap());
            let elapsed = run(&log, 4, 64, 40);
            assert!(elapsed > Duration::ZERO);
            Arc::try_unwrap(log).unwrap().close().unwrap();
        }
    }
}
