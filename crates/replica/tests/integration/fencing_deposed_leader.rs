//! Scenario: the leader is paused (its NIC keeps acking, its CPU stops), the others elect a
//! new leader and commit more entries, then the old leader wakes and, before reading its
//! inbox, RDMA-writes a new entry at its stale positions. The followers revoked its connection
//! when they granted the new leader, so its writes complete RemoteAccess (counted as fenced),
//! no follower's log changes, and the old leader steps down and converges.

use fabric::sim::SimConfig;
use replica::Role;
use replica::sim::SimCluster;

#[test]
fn a_deposed_leaders_writes_are_fenced() {
    let mut c = SimCluster::new(3, 9, SimConfig::default(), |_| {}).unwrap();
    let old = c.elect().unwrap();
    for i in 0..20u8 {
        c.append(&[i; 300]).unwrap();
    }
    c.run_for(50_000_000).unwrap();
    assert!(c.node(old).stats().fast_appends > 0);

    c.paused.insert(old);
    let ok = c
        .run_until(10_000_000_000, |c| c.leader().is_some_and(|l| l != old))
        .unwrap();
    if !ok {
        for i in 1..=3 {
            eprintln!("{:?}", c.node(i).status());
        }
    }
    assert!(ok, "no new leader while the old one was paused");
    let new = c.leader().unwrap();
    for i in 0..10u8 {
        c.append(&[100 + i; 500]).unwrap();
    }
    c.run_for(100_000_000).unwrap();
    let followers: Vec<u64> = (1..=3).filter(|&i| i != old).collect();
    let before: Vec<_> = followers
        .iter()
        .map(|&f| c.committed_log(f).unwrap())
        .collect();

    // Wake the old leader: it still believes it leads, proposes, and writes before it reads.
    c.paused.remove(&old);
    assert_eq!(c.node(old).status().role, Role::Leader);
    c.node(old).propose(b"stale write").unwrap();
    c.node(old).process_ready_only().unwrap();
    c.run_for(200_000_000).unwrap();

    let fenced = c.node(old).stats().fenced_writes;
    assert!(
        fenced > 0,
        "the stale leader's writes were not fenced: {:?}",
        c.node(old).stats()
    );
    let stats = c.net.stats();
    assert!(stats.writes_refused > 0);
    for (k, &f) in followers.iter().enumerate() {
        let after = c.committed_log(f).unwrap();
        assert_eq!(
            &after[..before[k].len()],
            &before[k][..],
            "follower {f}'s committed log changed"
        );
        assert!(
            after.iter().all(|(_, d)| d != b"stale write"),
            "follower {f} accepted the stale entry"
        );
    }
    // The old leader steps down, drops its stale entry and converges.
    c.append(b"after").unwrap();
    c.run_for(500_000_000).unwrap();
    assert_eq!(c.node(old).status().role, Role::Follower);
    assert_eq!(c.node(old).status().leader, Some(new));
    let want = c.committed_log(new).unwrap();
    for i in 1..=3 {
        assert_eq!(c.committed_log(i).unwrap(), want, "node {i}");
    }
}
