//! Scenario: the leader appends entries that no follower receives, is cut off, and the others
//! elect a new leader that commits different entries at the same indexes. When the old leader
//! returns as a follower, its divergent suffix sits exactly where the new leader would write:
//! the new leader must not RDMA-write there until the slow path has truncated it, and the logs
//! must end identical.

use fabric::NodeId;
use fabric::sim::SimConfig;
use replica::sim::SimCluster;

#[test]
fn a_divergent_suffix_is_repaired_by_the_slow_path() {
    let mut c = SimCluster::new(3, 21, SimConfig::default(), |_| {}).unwrap();
    let old = c.elect().unwrap();
    for i in 0..10u8 {
        c.append(&[i; 64]).unwrap();
    }
    c.run_for(50_000_000).unwrap();
    // Cut the leader off in both directions, then let it append entries only it will hold.
    for f in (1..=3).filter(|&i| i != old) {
        c.net.set_link(NodeId(old), NodeId(f), false);
        c.net.set_link(NodeId(f), NodeId(old), false);
    }
    let mut orphan = Vec::new();
    for i in 0..5u8 {
        orphan.push(c.node(old).propose(&[200 + i; 64]).unwrap());
    }
    c.run_for(20_000_000).unwrap();
    let old_last = c.node(old).status().last_index;
    let ok = c
        .run_until(10_000_000_000, |c| c.leader().is_some_and(|l| l != old))
        .unwrap();
    assert!(ok);
    let new = c.leader().unwrap();
    for i in 0..8u8 {
        c.append(&[50 + i; 64]).unwrap();
    }
    assert!(
        c.node(new).status().commit >= old_last,
        "the new leader's log should overlap the orphan suffix"
    );
    let slow_before = c.node(new).stats().slow_appends;
    // Heal.
    for f in (1..=3).filter(|&i| i != old) {
        c.net.set_link(NodeId(old), NodeId(f), true);
        c.net.set_link(NodeId(f), NodeId(old), true);
    }
    c.append(b"healed").unwrap();
    let converged = c
        .run_until(10_000_000_000, |c| {
            let s = c.node(new).status().commit;
            c.node(old).status().commit == s
        })
        .unwrap();
    assert!(converged, "the old leader never caught up");
    c.run_for(200_000_000).unwrap();
    for t in orphan {
        assert!(
            c.node(old).ticket_status(t).unwrap().is_err(),
            "an orphan entry survived"
        );
    }
    let want = c.committed_log(new).unwrap();
    for i in 1..=3 {
        assert_eq!(c.committed_log(i).unwrap(), want, "node {i}");
    }
    assert!(
        c.node(new).stats().slow_appends > slow_before,
        "the repair did not use the slow path"
    );
    assert_eq!(
        c.node(old).stats().fast_rejected,
        0,
        "the new leader wrote over the divergent suffix"
    );
}
