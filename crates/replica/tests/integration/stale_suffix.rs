//! The setup two regression scenarios share (`stale_branch_after_a_failed_cut.rs`,
//! `failed_cut_keeps_the_ring.rs`): in a 5-node cluster, a follower X holds uncommitted
//! entries of a deposed leader A durably in its segment files, and the other three have
//! committed other entries at those indexes, so X's next contact with their leader makes it
//! cut that suffix.

use fabric::NodeId;
use replica::sim::SimCluster;

pub const SECOND_NS: u64 = 1_000_000_000;

/// Cuts (`on == false`) or restores the links between `id` and each of `from`, both ways.
pub fn isolate(c: &mut SimCluster, id: u64, from: &[u64], on: bool) {
    for &o in from {
        c.net.set_link(NodeId(id), NodeId(o), on);
        c.net.set_link(NodeId(o), NodeId(id), on);
    }
}

/// Where [`stale_suffix_on_a_follower`] leaves the cluster.
pub struct StaleSuffix {
    /// The follower holding the stale suffix, still cut off from `rest`.
    pub x: u64,
    /// The three nodes that elected a leader without A and X.
    pub rest: Vec<u64>,
    /// The first index of the stale suffix.
    pub first_stale: u64,
    /// The term of its entries.
    pub stale_term: u64,
}

/// On a fresh 5-node cluster `c`: A leads and commits 5 entries; A and X, cut off from the
/// others, share 3 entries no one else has; a clean stop and restart of X puts them in its
/// segment files (its ring starts past them); the other three elect a leader, A is killed, and
/// 5 entries commit at those indexes. X stays cut off from them.
pub fn stale_suffix_on_a_follower(c: &mut SimCluster) -> StaleSuffix {
    let a = c.elect().unwrap();
    for i in 0..5 {
        c.append(format!("committed-{i}").as_bytes()).unwrap();
    }
    let x = (1..=5).find(|&i| i != a).unwrap();
    let rest: Vec<u64> = (1..=5).filter(|&i| i != a && i != x).collect();

    // A and X alone: A's next entries reach X only and cannot commit.
    isolate(c, a, &rest, false);
    isolate(c, x, &rest, false);
    let first_stale = c.node(a).status().last_index + 1;
    for i in 0..3 {
        c.node(a).propose(format!("stale-{i}").as_bytes()).unwrap();
    }
    let a_last = c.node(a).status().last_index;
    let got = c
        .run_until(5 * SECOND_NS, |c| c.node(x).status().last_index >= a_last)
        .unwrap();
    assert!(got, "X did not receive A's uncommitted entries");
    let stale_term = c.node(x).persisted_term(first_stale).unwrap();
    // A clean stop makes them durable in X's segment files.
    c.stop(x).unwrap();
    c.restart_killed(x).unwrap();
    assert_eq!(c.node(x).persisted_term(first_stale), Some(stale_term));

    // The other three elect a leader and commit entries of a later term at those indexes.
    isolate(c, a, &[x], false);
    let ok = c
        .run_until(30 * SECOND_NS, |c| {
            c.leader().is_some_and(|l| l != a && l != x)
        })
        .unwrap();
    assert!(ok, "the other three elected no leader");
    c.kill(a);
    for i in 0..5 {
        c.append(format!("new-{i}").as_bytes()).unwrap();
    }
    StaleSuffix {
        x,
        rest,
        first_stale,
        stale_term,
    }
}
