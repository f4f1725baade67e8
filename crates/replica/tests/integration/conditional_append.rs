//! `Replica::propose_batch_if`: on the leader, a batch proposed on the log's current end gets
//! the indexes right after it, even while earlier entries are still uncommitted; one proposed
//! on any other end is refused with the actual end and proposes nothing; a follower refuses
//! with `NotLeader`. The simulator's seed family (`sim/tests/conditional.rs`) checks the same
//! under faults and leader changes.

use fabric::sim::SimConfig;
use replica::ReplicaError;
use replica::sim::SimCluster;

#[test]
fn a_conditional_batch_lands_right_after_the_end_it_expected_or_not_at_all() {
    let mut c = SimCluster::new(3, 21, SimConfig::default(), |_| {}).unwrap();
    let l = c.elect().unwrap();
    c.append(b"committed").unwrap();
    // An entry ordered but not committed yet still counts as the end.
    let pending = c.node(l).propose(b"in flight").unwrap();
    let end = c.node(l).last_index();
    assert_eq!(end, pending.index);
    let t = c
        .node(l)
        .propose_batch_if(&[b"if-1", b"if-2"], end)
        .unwrap();
    assert_eq!(
        t.iter().map(|t| t.index).collect::<Vec<_>>(),
        [end + 1, end + 2]
    );
    let before = c.node(l).last_index();
    match c.node(l).propose_batch_if(&[b"stale"], end) {
        Err(ReplicaError::ConditionFailed { expected, last }) => {
            assert_eq!((expected, last), (end, end + 2));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        c.node(l).last_index(),
        before,
        "a failed condition proposed something"
    );
    assert_eq!(c.wait(l, t[1]).unwrap(), end + 2);
    let log = c.committed_log(l).unwrap();
    assert!(log.iter().all(|(_, d)| !d.ends_with(b"stale")));

    let f = (1..=3).find(|&i| i != l).unwrap();
    let fe = c.node(f).last_index();
    assert!(matches!(
        c.node(f).propose_batch_if(&[b"x"], fe),
        Err(ReplicaError::NotLeader { .. })
    ));
}
