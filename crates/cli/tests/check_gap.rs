//! `rdmalog check` on a stopped node's data dir with a segment file deleted from the middle
//! (defect 11): it exits 1 and names the missing Lsn range and files, where it used to exit 0
//! and call the segments before the gap leftovers of a prefix truncation.
//!
//! Method: a log written by a real `wal::Wal` on the real file system in a temporary
//! directory, one segment file removed with `std::fs`, the `rdmalog` binary run on it.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use wal::fs::StdFs;
use wal::{Durability, Term, Wal, WalConfig};

/// 64 KiB segments; returns the segment file names in Lsn order.
fn write_log(dir: &Path) -> Vec<String> {
    let config = WalConfig {
        cluster_id: 7,
        block_bytes: 4096,
        segment_data_bytes: 64 << 10,
        max_batch_bytes: 4096,
        ..WalConfig::default()
    };
    let (wal, _) = Wal::open(Arc::new(StdFs), dir, config).unwrap();
    for i in 0..300u32 {
        let payload = vec![i as u8; 1000];
        wal.append_next(Term(1), &payload, Durability::Memory)
            .unwrap();
    }
    wal.close().unwrap();
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".wal"))
        .collect();
    names.sort();
    names
}

fn check(dir: &Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_rdmalog"))
        .args(["check", dir.to_str().unwrap()])
        .output()
        .unwrap()
}

#[test]
fn check_exits_1_and_names_a_segment_missing_from_the_middle() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let names = write_log(&dir);
    assert!(names.len() >= 4, "{names:?}");
    let o = check(&dir);
    assert_eq!(o.status.code(), Some(0), "a whole log checks clean: {o:?}");

    std::fs::remove_file(dir.join(&names[2])).unwrap();
    let o = check(&dir);
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "stdout:\n{out}\nstderr:\n{err}");
    assert!(out.contains("CORRUPT"), "{out}");
    let start: u64 = names[2].trim_end_matches(".wal").parse().unwrap();
    let end: u64 = names[3].trim_end_matches(".wal").parse().unwrap();
    for needle in [
        format!("nothing holds lsn {start} to {end}"),
        names[1].clone(),
        names[2].clone(),
        names[3].clone(),
        "no interrupted prefix truncation explains".to_owned(),
    ] {
        assert!(err.contains(&needle), "{needle:?} in {err}");
    }
    assert!(!out.contains("leftover"), "{out}");
    // Nothing was deleted: check only reads.
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), names.len() - 1);
}
