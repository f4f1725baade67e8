//! A log opened with another cluster id or block size than its segments were written with is
//! refused, and the refusal changes nothing on disk (docs/FORMAT.md, the segment header's
//! `cluster_id` and `block_bytes`): a node pointed at another cluster's directory, or started
//! with another geometry, must not treat those records as its own, nor repair or delete them.
//!
//! Method: a `FaultFs` disk; entries appended and synced with the tests' configuration, the
//! log closed, then opened with one field changed (refused, naming the field), then opened as
//! written (every entry back).

use std::path::Path;
use std::sync::Arc;

use crate::common;

use common::{DIR, open, payload, read_all, small_config};
use wal::fs::{FaultFs, FileSystem};
use wal::{Durability, Term, WalConfig, WalError};

fn written(fs: &FaultFs) -> Vec<(u64, u64, Vec<u8>)> {
    let wal = open(fs).unwrap();
    // Enough entries for several segments (2 KiB each in the tests' geometry).
    for i in 1..=40 {
        wal.append_next(Term(1), &payload(i, 0), Durability::Fsync)
            .unwrap();
    }
    let entries = read_all(&wal);
    drop(wal);
    entries
}

fn open_with(fs: &FaultFs, config: WalConfig) -> Result<wal::Wal, WalError> {
    let dyn_fs: Arc<dyn FileSystem> = Arc::new(fs.clone());
    wal::Wal::open(dyn_fs, Path::new(DIR), config).map(|(wal, _)| wal)
}

/// Every file of the log directory with its bytes.
fn files(fs: &FaultFs) -> Vec<(String, Option<Vec<u8>>)> {
    fs.names(Path::new(DIR))
        .into_iter()
        .map(|n| {
            let bytes = fs.read_file(&Path::new(DIR).join(&n));
            (n, bytes)
        })
        .collect()
}

fn refused_then_intact(changed: WalConfig, field: &str) {
    let fs = FaultFs::new();
    let before = written(&fs);
    assert_eq!(before.len(), 40);
    let on_disk = files(&fs);
    match open_with(&fs, changed) {
        Err(WalError::SegmentMismatch { reason, .. }) => {
            assert!(
                reason.contains(field),
                "refused for {reason:?}, not the {field}"
            );
        }
        Err(e) => panic!("refused, but not as a segment of another configuration: {e}"),
        Ok(_) => panic!("a log whose segments have another {field} was opened"),
    }
    assert!(files(&fs) == on_disk, "the refused open changed the files");
    let wal = open(&fs).expect("the log opens as it was written");
    assert_eq!(read_all(&wal), before, "the refused open changed the log");
}

#[test]
fn another_clusters_segments_are_refused_and_left_as_they_are() {
    refused_then_intact(
        WalConfig {
            cluster_id: small_config().cluster_id + 1,
            ..small_config()
        },
        "cluster id",
    );
}

#[test]
fn segments_of_another_block_size_are_refused_and_left_as_they_are() {
    refused_then_intact(
        WalConfig {
            block_bytes: small_config().block_bytes * 2,
            ..small_config()
        },
        "block size",
    );
}
