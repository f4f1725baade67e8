//! Scenario: a fourth node is added through raft-rs's membership change, catches up and takes
//! part; a node is removed; leadership is transferred; the application truncates the prefix.

use fabric::sim::SimConfig;
use replica::sim::SimCluster;

#[test]
fn add_remove_transfer_and_truncate() {
    let mut c = SimCluster::new(3, 44, SimConfig::default(), |_| {}).unwrap();
    let leader = c.elect().unwrap();
    for i in 0..30u32 {
        c.append(&i.to_le_bytes()).unwrap();
    }
    c.add_node(4).unwrap();
    let t = c.node(leader).change_membership(4, true).unwrap();
    c.wait(leader, t).unwrap();
    let target = c.node(leader).status().commit;
    let ok = c
        .run_until(10_000_000_000, |c| c.node(4).status().commit >= target)
        .unwrap();
    assert!(ok, "node 4 did not catch up: {:?}", c.node(4).status());
    assert_eq!(c.node(leader).status().voters, vec![1, 2, 3, 4]);
    c.append(b"four nodes").unwrap();
    c.run_for(100_000_000).unwrap();
    assert_eq!(
        c.committed_log(4).unwrap(),
        c.committed_log(leader).unwrap()
    );

    // Remove a follower other than node 4.
    let gone = (1..=3).find(|&i| i != leader).unwrap();
    let t = c.node(leader).change_membership(gone, false).unwrap();
    c.wait(leader, t).unwrap();
    c.run_for(100_000_000).unwrap();
    assert!(!c.node(leader).status().voters.contains(&gone));
    c.append(b"without the removed node").unwrap();

    // Transfer leadership to node 4.
    c.node(leader).transfer_leader(4);
    let ok = c
        .run_until(5_000_000_000, |c| c.leader() == Some(4))
        .unwrap();
    assert!(ok, "leadership did not move to node 4");
    c.run_for(50_000_000).unwrap();
    c.append(b"led by four").unwrap();

    // Truncate the prefix on every member after the application checkpointed index 20.
    for id in [1u64, 2, 3, 4].into_iter().filter(|&i| i != gone) {
        let first = c.node(id).truncate_prefix(20).unwrap();
        assert!(first <= 20);
        let s = c.node(id).status();
        assert_eq!(s.first_index, first);
        let mut buf = Vec::new();
        assert!(
            c.node(id)
                .read(first.saturating_sub(1).max(1), &mut buf)
                .unwrap()
                .is_none()
                || first == 1
        );
    }
    c.append(b"after truncation").unwrap();
    let log = c.committed_log(4).unwrap();
    assert_eq!(log.last().unwrap().1, b"after truncation");
}

/// raft-rs takes one membership change at a time, and in place of a second one it appends an
/// empty entry, which commits: `change_membership` returned a ticket that resolved, and the
/// change was never made (a `members remove` followed at once by a `members add` kept the
/// removed node a voter, so the operator's next step, clearing its data dir, made it vote as
/// a member that never acknowledged anything). The second is refused, nothing proposed, and
/// goes through once the first has applied.
#[test]
fn a_second_membership_change_waits_for_the_first() {
    let mut c = SimCluster::new(3, 45, SimConfig::default(), |_| {}).unwrap();
    let leader = c.elect().unwrap();
    let f = (1..=3).find(|&i| i != leader).unwrap();
    c.add_node(4).unwrap();
    let t = c.node(leader).change_membership(4, true).unwrap();
    let last = c.node(leader).status().last_index;
    match c.node(leader).change_membership(f, false) {
        Err(replica::ReplicaError::MembershipPending) => {}
        other => panic!("a second change while one is pending: {other:?}"),
    }
    assert_eq!(c.node(leader).status().last_index, last, "nothing proposed");
    c.wait(leader, t).unwrap();
    let ok = c
        .run_until(5_000_000_000, |c| {
            c.node(leader).status().applied >= t.index
        })
        .unwrap();
    assert!(ok);
    let t2 = c.node(leader).change_membership(f, false).unwrap();
    c.wait(leader, t2).unwrap();
    c.run_for(500_000_000).unwrap();
    let mut want: Vec<u64> = (1..=4).filter(|&i| i != f).collect();
    want.sort_unstable();
    assert_eq!(c.node(leader).status().voters, want);
}
