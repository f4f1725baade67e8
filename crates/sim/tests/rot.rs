//! Bit rot in stored records, as the CI budget draws it: Fsync seeds, half of them with 16 KiB
//! blocks and 32 KiB segments, where a byte of a committed record with a whole sealed segment
//! after it rots on a live node's disk.
//!
//! Method: runs seeds 1..=200 and adds up their summaries. Asserted: rot happens, reads of a
//! rotten record are refused by its check (the checker re-reads committed entries and compares
//! anything served with what was committed, so rotten bytes served as data fail the seed; the
//! `unchecked-reads` mutation in `mutation.rs` shows it), nodes refuse to start on rot, and
//! the operator's replacement (remove the node, add a fresh one) runs, all with every checker
//! and the liveness phase passing.

use sim::Fault;

#[test]
fn rot_is_detected_and_the_node_replaced_within_the_ci_budget() {
    let mut faults = std::collections::BTreeMap::new();
    for seed in 1..=200 {
        let s =
            sim::run(seed, sim::Options::default(), false).unwrap_or_else(|f| panic!("\n{f}\n"));
        for (k, v) in s.faults {
            *faults.entry(k).or_insert(0u64) += v;
        }
    }
    let n = |k: Fault| faults.get(&k).copied().unwrap_or(0);
    eprintln!(
        "seeds 1..=200: {} rots, {} reads refused by the record check, {} nodes replaced",
        n(Fault::RecordRot),
        n(Fault::RotDetected),
        n(Fault::DiskReplaced)
    );
    assert!(n(Fault::RecordRot) > 0, "no record rotted");
    assert!(
        n(Fault::RotDetected) > 0,
        "no read of a rotten record was refused"
    );
    assert!(
        n(Fault::DiskReplaced) > 0,
        "no node refused to start on rot"
    );
}
