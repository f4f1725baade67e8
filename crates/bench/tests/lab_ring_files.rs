//! Lab test: under `Durability::Memory` each replica's ring is a shared-memory file, present
//! while the node runs, recovered after a crash (see `node`'s lab_cluster kill -9 test), and
//! removed by a clean close, over real RDMA (rxe1..3).
//!
//! Method: three replicas in this process (`bench::lab::LabCluster`, rings in the temp dir),
//! 100 appends committed; the ring and tail files of all three exist; `close` each; the files
//! are gone, and the cluster reopened on the same data dirs (with new rings) holds every entry.

use std::path::PathBuf;
use std::time::Duration;

use bench::lab::{LAB_POLL, LabCluster};
use replica::Durability;

const CLUSTER: u64 = 0xbe5e;

/// This test's ring files in the temp dir (`rdmalog-<cluster>-n<id>-<tag>.ring` and `.tail`).
fn ring_files() -> Vec<PathBuf> {
    let prefix = format!("rdmalog-{CLUSTER:016x}-n");
    let mut v: Vec<PathBuf> = std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&prefix))
        })
        .collect();
    v.sort();
    v
}

#[test]
#[ignore = "lab: needs the Soft-RoCE lab; ops/test runs it"]
fn a_clean_close_removes_the_shared_memory_rings_and_keeps_every_entry() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    for f in ring_files() {
        std::fs::remove_file(f).unwrap();
    }
    let c = LabCluster::open(Durability::Memory, &dir, 7900, CLUSTER, LAB_POLL).unwrap();
    let k = c.leader(Duration::from_secs(60)).unwrap();
    let mut last = 0;
    for i in 0..100u32 {
        last = c.logs[k]
            .append(&i.to_le_bytes())
            .unwrap()
            .wait(Duration::from_secs(30))
            .unwrap();
    }
    let files = ring_files();
    println!("while running: {files:?}");
    assert_eq!(
        files.len(),
        6,
        "a ring and a tail file per replica: {files:?}"
    );
    for log in c.logs {
        log.close().unwrap();
    }
    assert_eq!(
        ring_files(),
        Vec::<PathBuf>::new(),
        "a clean close leaves no ring file"
    );

    // Reopen on the same data dirs: the segment files alone hold the log.
    let c = LabCluster::reopen(Durability::Memory, &dir, 7910, CLUSTER, LAB_POLL).unwrap();
    let k = c.leader(Duration::from_secs(60)).unwrap();
    let mut seen = Vec::new();
    let mut sub = c.logs[k].subscribe(1);
    while seen.len() < 100 {
        match sub.next_timeout(Duration::from_secs(30)).unwrap() {
            Some((index, data)) => {
                seen.push(u32::from_le_bytes(data.try_into().unwrap()));
                assert!(index <= last, "index {index} past the last append {last}");
            }
            None => panic!("only {} of 100 entries after reopening", seen.len()),
        }
    }
    assert_eq!(seen, (0..100).collect::<Vec<_>>());
    assert_eq!(
        ring_files().len(),
        6,
        "the reopened replicas have new rings"
    );
    c.close();
    assert_eq!(ring_files(), Vec::<PathBuf>::new());
}
