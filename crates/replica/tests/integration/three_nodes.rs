//! Helpers of the three-node scenarios in which a node loses state (`memory_machine_crash.rs`,
//! `replaced_data_dir.rs`).

use fabric::NodeId;
use replica::sim::SimCluster;

/// A second of virtual time.
pub const SECOND_NS: u64 = 1_000_000_000;

/// Acknowledged entries: (index, payload).
pub type Acked = Vec<(u64, Vec<u8>)>;

/// Cuts node `id` off from the other two (`on` false) or restores its links.
pub fn cut(c: &mut SimCluster, id: u64, on: bool) {
    cut_among(c, 3, id, on);
}

/// Cuts node `id` off from nodes `1..=n` (`on` false) or restores its links.
pub fn cut_among(c: &mut SimCluster, n: u64, id: u64, on: bool) {
    for other in (1..=n).filter(|&o| o != id) {
        c.net.set_link(NodeId(id), NodeId(other), on);
        c.net.set_link(NodeId(other), NodeId(id), on);
    }
}

/// Appends `n` entries one at a time on the leader; returns the acknowledged (index, data).
pub fn append(c: &mut SimCluster, from: u64, n: u64) -> Acked {
    (from..from + n)
        .map(|i| {
            let data = format!("entry-{i}").into_bytes();
            (c.append(&data).unwrap(), data)
        })
        .collect()
}

/// Runs until every node committed past the last of `acked`, then checks each holds every one.
pub fn assert_all_hold(c: &mut SimCluster, acked: &[(u64, Vec<u8>)]) {
    let last = acked.last().unwrap().0;
    let ok = c
        .run_until(60 * SECOND_NS, |c| {
            (1..=3).all(|id| c.node(id).status().commit >= last)
        })
        .unwrap();
    assert!(ok, "the cluster did not commit past {last} on every node");
    for id in 1..=3 {
        let log = c.committed_log(id).unwrap();
        let by_index: std::collections::BTreeMap<u64, Vec<u8>> = log.into_iter().collect();
        for (index, data) in acked {
            assert_eq!(
                by_index.get(index),
                Some(data),
                "node {id} lost or changed acknowledged entry {index}"
            );
        }
    }
}

/// Kills `a` and runs 10 s of virtual time; whether the other two elected a leader.
pub fn elects_without(c: &mut SimCluster, a: u64) -> bool {
    c.kill(a);
    c.run_until(10 * SECOND_NS, |c| c.leader().is_some())
        .unwrap()
}

/// Node `b` lost state and is held back: it refused votes and refuses to campaign. Returns
/// why it says it does not vote.
pub fn held_back(c: &mut SimCluster, b: u64) -> String {
    let s = c.node(b).status();
    let why = s.recovering.expect("B still held back");
    assert!(s.stats.refused_while_recovering > 0, "{:?}", s.stats);
    assert!(c.node(b).campaign().is_err(), "a held-back node campaigns");
    why
}

/// Restarts killed `a`, checks every node holds `acked`, and runs until `b` votes again.
pub fn restart_and_rejoin(c: &mut SimCluster, a: u64, b: u64, acked: &[(u64, Vec<u8>)]) {
    c.restart_killed(a).unwrap();
    assert_all_hold(c, acked);
    let rejoined = c
        .run_until(10 * SECOND_NS, |c| c.node(b).status().recovering.is_none())
        .unwrap();
    assert!(rejoined, "B never voted again: {:?}", c.node(b).status());
}
