//! The setup two regression scenarios share (`stale_branch_after_a_failed_cut.rs`,
//! `failed_cut_keeps_the_ring.rs`): in a 5-node cluster, a follower X holds uncommitted
//! entries of a deposed leader A durably in its segment files, and the other three have
//! committed other entries at those indexes, so X's next contact with their leader makes it
//! cut that suffix. Also the scenario of a ticket whose entry a new leader's replaced on the
//! old leader only, and which commits after all
//! (`a_ticket_is_not_superseded_by_an_entry_that_never_commits`).

use fabric::NodeId;
use replica::sim::SimCluster;
use replica::{Mutation, ReplicaError};

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

/// A ticket is superseded only when the commit index says so. Five voters: the leader A and a
/// follower X alone hold an entry; the other three elect B, whose first entry reaches A only
/// (A's entry is replaced there) and never commits; B dies; X, holding A's entry, wins the
/// next term with the other two and commits it. A's ticket said "superseded" as soon as its
/// own log held B's entry, although the entry was committed after all: a client told "not
/// committed" would resend it (a second copy), or fail the condition of an `AppendIf` and be
/// told nothing was appended.
#[test]
fn a_ticket_is_not_superseded_by_an_entry_that_never_commits() {
    let (status_then, committed) = replaced_by_an_entry_that_never_commits(Mutation::None);
    assert!(committed, "A's entry committed after all");
    assert!(
        status_then.is_none(),
        "A's ticket resolved {status_then:?} while its entry could still commit"
    );
}

/// The mutation `superseded-uncommitted` takes the rule away: the same schedule tells the
/// ticket superseded, and its entry commits.
#[test]
fn without_the_rule_a_ticket_is_superseded_by_an_entry_that_never_commits() {
    let (status_then, committed) =
        replaced_by_an_entry_that_never_commits(Mutation::SupersededUncommitted);
    assert!(committed);
    assert!(
        matches!(status_then, Some(Err(ReplicaError::Superseded { .. }))),
        "{status_then:?}"
    );
}

/// The schedule of [`a_ticket_is_not_superseded_by_an_entry_that_never_commits`]: what A's
/// ticket said while A's log held B's entry, and whether A's entry committed in the end.
fn replaced_by_an_entry_that_never_commits(
    mutation: Mutation,
) -> (Option<Result<u64, ReplicaError>>, bool) {
    use replica::ReplicaConfig;
    // Who times out first decides the elections: A = 1, then B = 3; X = 2, D = 4, E = 5.
    let (a, x, b, d, e) = (1, 2, 3, 4, 5);
    let mut c = SimCluster::new(
        5,
        61,
        fabric::sim::SimConfig::default(),
        |cfg: &mut ReplicaConfig| {
            cfg.election_window = Some(match cfg.id {
                1 => (10, 11),
                3 => (20, 21),
                _ => (60, 61),
            });
            cfg.mutation = mutation;
        },
    )
    .unwrap();
    assert_eq!(c.elect().unwrap(), a);
    c.append(b"before").unwrap();
    // A's entry reaches X only: A is cut off from D and E, and what it sends B is held on
    // the wire (the link stays up, so B's later entry reaches A at once).
    isolate(&mut c, a, &[d, e], false);
    isolate(&mut c, x, &[b, d, e], false);
    c.net
        .set_extra_delay(NodeId(a), NodeId(b), 1_000 * SECOND_NS);
    let t = c.node(a).propose(b"cas").unwrap();
    let got = c
        .run_until(5 * SECOND_NS, |c| c.node(x).status().last_index >= t.index)
        .unwrap();
    assert!(got, "X did not receive A's entry");
    isolate(&mut c, x, &[a], false);
    // B, D and E elect B (A's log is longer: it refuses B its vote). B's entries are slow
    // to reach D and E, so that its first one is still on the wire when B is cut off from
    // them: it reaches A alone, and replaces A's entry there.
    for (i, j) in [(b, d), (b, e), (d, b), (e, b), (d, e), (e, d)] {
        c.net.set_extra_delay(NodeId(i), NodeId(j), 30_000_000);
    }
    let ok = c
        .run_until(30 * SECOND_NS, |c| c.leader() == Some(b))
        .unwrap();
    assert!(ok, "B was not elected");
    isolate(&mut c, b, &[d, e], false);
    let replaced = c
        .run_until(5 * SECOND_NS, |c| {
            c.node(a)
                .persisted_term(t.index)
                .is_some_and(|term| term != t.term)
        })
        .unwrap();
    assert!(replaced, "B's entry did not replace A's on A");
    assert!(
        (1..=5).all(|i| c.node(i).status().commit < t.index),
        "B's entry must not commit"
    );
    let status_then = c.node(a).ticket_status(t);
    // B dies; X wins the next term with D and E, and commits A's entry.
    c.kill(b);
    isolate(&mut c, a, &[b, x], false);
    c.net.set_extra_delay(NodeId(d), NodeId(e), 0);
    c.net.set_extra_delay(NodeId(e), NodeId(d), 0);
    isolate(&mut c, x, &[d, e], true);
    let ok = c
        .run_until(60 * SECOND_NS, |c| {
            c.leader() == Some(x) && c.node(x).status().commit >= t.index
        })
        .unwrap();
    assert!(ok, "X did not lead and commit");
    let log = c.committed_log(x).unwrap();
    let committed = log.iter().any(|(i, d)| *i == t.index && d == b"cas");
    if mutation == Mutation::None {
        // Reconnected, A learns the commit: the ticket resolves to its index.
        isolate(&mut c, a, &[x, d, e], true);
        let ok = c
            .run_until(30 * SECOND_NS, |c| c.node(a).ticket_status(t).is_some())
            .unwrap();
        assert!(ok, "A never learned");
        assert_eq!(c.node(a).ticket_status(t).unwrap().unwrap(), t.index);
    }
    (status_then, committed)
}
