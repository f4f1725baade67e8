//! Sessions (`replica::sessions`): an entry sent again with its session and number is never
//! appended twice, whether its first copy is committed, still in flight on the leader, or in
//! a new leader's log uncommitted; the table survives restarts, checkpoints and snapshot
//! installs, because every replica derives it from the log. The simulator's seed family
//! (`sim/tests/sessions.rs`) checks the same under faults.

use fabric::NodeId;
use fabric::sim::SimConfig;
use replica::sim::SimCluster;
use replica::{Mutation, ReplicaConfig, ReplicaError, Ticket};

fn open(c: &mut SimCluster, l: u64) -> u64 {
    let t = c.node(l).open_session().unwrap();
    c.wait(l, t).unwrap()
}

fn payloads_of(c: &mut SimCluster, node: u64, needle: &[u8]) -> Vec<u64> {
    c.committed_log(node)
        .unwrap()
        .into_iter()
        .filter(|(_, d)| d == needle)
        .map(|(i, _)| i)
        .collect()
}

#[test]
fn a_retry_resolves_to_the_first_copy_committed_or_in_flight() {
    let mut c = SimCluster::new(3, 31, SimConfig::default(), |_| {}).unwrap();
    let l = c.elect().unwrap();
    let s = open(&mut c, l);
    let t1 = c.node(l).propose_in_session(s, 1, &[b"one"]).unwrap()[0];
    let i1 = c.wait(l, t1).unwrap();
    // Committed: the retry gets the first copy's index.
    let again = c.node(l).propose_in_session(s, 1, &[b"one"]).unwrap()[0];
    assert_eq!(c.wait(l, again).unwrap(), i1);
    // In flight: proposed, not committed, then sent again with one more entry.
    let t2 = c.node(l).propose_in_session(s, 2, &[b"two"]).unwrap()[0];
    let both = c
        .node(l)
        .propose_in_session(s, 2, &[b"two", b"three"])
        .unwrap();
    assert_eq!(both[0], t2);
    assert_eq!(both[1].index, t2.index + 1);
    for t in &both {
        c.wait(l, *t).unwrap();
    }
    assert_eq!(c.node(l).stats().session_duplicates_refused, 2);
    for i in 1..=3 {
        c.run_for(100_000_000).unwrap();
        assert_eq!(payloads_of(&mut c, i, b"one"), [i1], "node {i}");
        assert_eq!(payloads_of(&mut c, i, b"two"), [t2.index], "node {i}");
        assert_eq!(c.node(i).stats().session_duplicates_applied, 0);
        assert_eq!(c.node(i).sessions().get(s).unwrap().last_seq, 3);
    }
    // A number past the next one is refused; so is a session nobody opened.
    match c.node(l).propose_in_session(s, 5, &[b"five"]) {
        Err(ReplicaError::SessionSequence {
            expected: 4,
            got: 5,
            ..
        }) => {}
        other => panic!("{other:?}"),
    }
    match c.node(l).propose_in_session(s + 1_000, 1, &[b"x"]) {
        Err(ReplicaError::UnknownSession { .. }) => {}
        other => panic!("{other:?}"),
    }
    let f = (1..=3).find(|&i| i != l).unwrap();
    assert!(matches!(
        c.node(f).propose_in_session(s, 4, &[b"four"]),
        Err(ReplicaError::NotLeader { .. })
    ));
}

/// The first copy is in the new leader's log but not committed when the client retries
/// there: the new leader must find it among its unapplied entries. Under
/// `Mutation::DedupCommittedOnly` it does not, and the log holds the entry twice.
fn retry_on_a_new_leader(mutation: Mutation) -> (Vec<u64>, u64) {
    let mut c =
        SimCluster::new(3, 33, SimConfig::default(), |cfg| cfg.mutation = mutation).unwrap();
    let old = c.elect().unwrap();
    let s = open(&mut c, old);
    c.run_for(100_000_000).unwrap();
    let (f1, f2) = {
        let o: Vec<u64> = (1..=3).filter(|&i| i != old).collect();
        (o[0], o[1])
    };
    // Only f1 gets the entry; neither follower hears of a commit before the old leader is
    // cut off.
    c.net.set_link(NodeId(old), NodeId(f2), false);
    c.net.set_link(NodeId(f2), NodeId(old), false);
    c.net.set_link(NodeId(f1), NodeId(old), false);
    let _lost: Ticket = c.node(old).propose_in_session(s, 1, &[b"once"]).unwrap()[0];
    c.run_for(30_000_000).unwrap();
    c.net.set_link(NodeId(old), NodeId(f1), false);
    let held = c.node(f1).status().last_index;
    assert!(
        c.node(f1).status().commit < held,
        "the test needs the entry uncommitted on {f1}"
    );
    // f1 has the longer log, so it wins among f1 and f2. f2's answers are slow, so the new
    // leader's first entry (which would commit the old one) is not committed yet when the
    // client retries there.
    c.net.set_extra_delay(NodeId(f2), NodeId(f1), 60_000_000);
    let ok = c
        .run_until(20_000_000_000, |c| c.leader() == Some(f1))
        .unwrap();
    assert!(ok, "node {f1} did not take over");
    let st = c.node(f1).status();
    assert!(
        st.commit < held,
        "the test needs the entry uncommitted on the new leader: {st:?}"
    );
    let retry = c.node(f1).propose_in_session(s, 1, &[b"once"]).unwrap()[0];
    c.net.set_extra_delay(NodeId(f2), NodeId(f1), 0);
    let at = c.wait(f1, retry).unwrap();
    for a in [old, f2] {
        for b in [old, f1, f2] {
            c.net.set_link(NodeId(a), NodeId(b), true);
        }
    }
    c.run_for(500_000_000).unwrap();
    let copies = payloads_of(&mut c, f1, b"once");
    (copies, at)
}

#[test]
fn a_new_leader_finds_the_first_copy_among_its_unapplied_entries() {
    let (copies, at) = retry_on_a_new_leader(Mutation::None);
    assert_eq!(
        copies,
        [at],
        "the entry is in the log once, where the retry said"
    );
    let (copies, _) = retry_on_a_new_leader(Mutation::DedupCommittedOnly);
    assert_eq!(
        copies.len(),
        2,
        "the mutation should have appended the retry again: {copies:?}"
    );
}

#[test]
fn the_table_survives_restarts_checkpoints_and_snapshot_installs() {
    let mut c = SimCluster::new(3, 35, SimConfig::default(), |cfg: &mut ReplicaConfig| {
        cfg.segment_bytes = 512 << 10;
    })
    .unwrap();
    let l = c.elect().unwrap();
    let s = open(&mut c, l);
    let f = (1..=3).find(|&i| i != l).unwrap();
    let mut first = Vec::new();
    for k in 1..=5u64 {
        let t = c
            .node(l)
            .propose_in_session(s, k, &[format!("e{k}").as_bytes()])
            .unwrap()[0];
        first.push(c.wait(l, t).unwrap());
    }
    c.run_for(100_000_000).unwrap();
    // A checkpoint at the third entry records the table as of that index, not the latest.
    let at = first[2];
    for i in 1..=3 {
        c.node(i).checkpoint(at, b"state").unwrap();
    }
    // A follower restarts: table from the checkpoint, then the entries after it again.
    c.crash(f);
    c.restart(f).unwrap();
    c.run_for(1_000_000_000).unwrap();
    assert_eq!(c.node(f).sessions().get(s).unwrap().last_seq, 5);
    assert_eq!(c.node(f).latest_checkpoint().unwrap().state, b"state");
    // Every node restarts; a retry of entries before and after the checkpoint still resolves
    // to the first copies.
    for i in 1..=3 {
        c.crash(i);
    }
    for i in 1..=3 {
        c.restart(i).unwrap();
    }
    let l = c.elect().unwrap();
    let items: Vec<Vec<u8>> = (2..=6u64).map(|k| format!("e{k}").into_bytes()).collect();
    let refs: Vec<&[u8]> = items.iter().map(|v| &v[..]).collect();
    let t = c.node(l).propose_in_session(s, 2, &refs).unwrap();
    let got: Vec<u64> = t.iter().map(|t| c.wait(l, *t).unwrap()).collect();
    assert_eq!(&got[..4], &first[1..]);
    // A new node installs a snapshot and must know the session too. Enough entries for the
    // checkpoint to delete whole segments, so that the new node needs the snapshot.
    for k in 0..300u32 {
        c.append(&[k as u8; 3000]).unwrap();
    }
    c.run_for(100_000_000).unwrap();
    let l = c.leader().unwrap();
    let last = c.node(l).status().applied;
    let first = c.node(l).checkpoint(last, b"state2").unwrap();
    assert!(
        first > got[4],
        "the checkpoint must delete the session's entries"
    );
    c.add_node(4).unwrap();
    let t = c.node(l).change_membership(4, true).unwrap();
    c.wait(l, t).unwrap();
    let end = c.append(b"after").unwrap();
    let ok = c
        .run_until(30_000_000_000, |c| c.node(4).status().applied >= end)
        .unwrap();
    assert!(ok, "node 4 did not catch up");
    assert!(c.node(4).stats().snapshots_installed >= 1);
    c.run_for(200_000_000).unwrap();
    let joined = c.node(4).sessions().clone();
    assert_eq!(&joined, c.node(l).sessions());
    assert_eq!(joined.get(s).unwrap().last_seq, 6);
    assert_eq!(payloads_of(&mut c, l, b"e2").len(), 0, "compacted");
    // The session goes on from the new node's view too: a retry of its latest entry
    // resolves on whichever node leads.
    let t = c.node(l).propose_in_session(s, 6, &[b"e6"]).unwrap()[0];
    assert_eq!(c.wait(l, t).unwrap(), got[4]);
    for i in 1..=4 {
        assert_eq!(c.node(i).stats().session_duplicates_applied, 0);
    }
}

/// A restart takes the session table as of the latest checkpoint and must not apply again the
/// entries that table already covers: the wal keeps the segment holding the checkpoint's
/// index, so the log read back starts at or below it. Applying them again reset every session
/// whose open was replayed, and the opens replayed after them then expired other sessions
/// than on the replicas that never restarted: a follower held a session the others had
/// expired and had lost one they kept (a resend in it refused as unknown once it led).
#[test]
fn a_restart_after_a_checkpoint_keeps_the_same_session_table() {
    let mut c = SimCluster::new(3, 37, SimConfig::zero_delay(), |_| {}).unwrap();
    let l = c.elect().unwrap();
    let f = (1..=3).find(|&i| i != l).unwrap();
    let capacity = replica::sessions::SESSION_CAPACITY;
    let s: Vec<u64> = (0..capacity).map(|_| open(&mut c, l)).collect();
    let (z, v) = (open(&mut c, l), open(&mut c, l));
    // Used once each: every session but `v` (and the two expired above) used after its open.
    for &id in std::iter::once(&z).chain(&s[2..]) {
        let t = c.node(l).propose_in_session(id, 1, &[b"x"]).unwrap()[0];
        c.wait(l, t).unwrap();
    }
    let w = open(&mut c, l);
    c.run_for(100_000_000).unwrap();
    let table = c.node(l).sessions().clone();
    assert!(table.get(v).is_none() && table.get(w).is_some() && table.get(s[2]).is_some());
    assert_eq!(c.node(f).sessions(), &table);
    let applied = c.node(f).status().applied;
    c.node(f).checkpoint(applied, b"").unwrap();
    c.crash(f);
    c.restart(f).unwrap();
    c.run_for(1_000_000_000).unwrap();
    assert_eq!(c.node(f).status().applied, applied);
    assert!(
        c.node(f).sessions() == &table,
        "the restarted follower's table differs: it holds v {} and s[2] {}",
        c.node(f).sessions().get(v).is_some(),
        c.node(f).sessions().get(s[2]).is_some()
    );
    assert_eq!(c.node(f).stats().session_duplicates_applied, 0);
}

/// The same cause, seen from the alarm: a session opened in a segment a checkpoint deleted,
/// with entries in the segment it kept. Applying those entries again at the restart counted
/// them as committed twice (`session_duplicates_applied`, an error in the log), a false alarm
/// from the one check of the table at run time.
#[test]
fn a_restart_after_a_checkpoint_applies_no_session_entry_twice() {
    let mut c = SimCluster::new(3, 38, SimConfig::zero_delay(), |cfg: &mut ReplicaConfig| {
        cfg.segment_bytes = 512 << 10;
    })
    .unwrap();
    let l = c.elect().unwrap();
    let f = (1..=3).find(|&i| i != l).unwrap();
    let s = open(&mut c, l);
    for k in 0..300u32 {
        c.append(&[k as u8; 3000]).unwrap();
    }
    for k in 1..=3u64 {
        let t = c.node(l).propose_in_session(s, k, &[b"x"]).unwrap()[0];
        c.wait(l, t).unwrap();
    }
    c.run_for(100_000_000).unwrap();
    let applied = c.node(f).status().applied;
    let first = c.node(f).checkpoint(applied, b"").unwrap();
    assert!(first > s, "the checkpoint must delete the session's open");
    c.crash(f);
    c.restart(f).unwrap();
    c.run_for(1_000_000_000).unwrap();
    assert_eq!(c.node(f).sessions().get(s).unwrap().last_seq, 3);
    assert_eq!(c.node(f).stats().session_duplicates_applied, 0);
    let table = c.node(l).sessions().clone();
    assert_eq!(c.node(f).sessions(), &table);
}

/// A trim's checkpoint is taken below the applied index, so its session table is read back
/// from the entries it deletes (the latest checkpoint's table and every entry after it): a
/// resend of an entry whose segment the trim deleted, after every node restarted from that
/// checkpoint, still resolves to its first copy and is not appended again.
#[test]
fn a_resend_after_a_trim_below_the_applied_index_resolves_to_the_first_copy() {
    let mut c = SimCluster::new(3, 39, SimConfig::zero_delay(), |cfg: &mut ReplicaConfig| {
        cfg.segment_bytes = 512 << 10;
    })
    .unwrap();
    let l = c.elect().unwrap();
    let s = open(&mut c, l);
    let mut first = Vec::new();
    for k in 1..=3u64 {
        let t = c
            .node(l)
            .propose_in_session(s, k, &[format!("e{k}").as_bytes()])
            .unwrap()[0];
        first.push(c.wait(l, t).unwrap());
    }
    let mut filler = 0;
    for k in 0..300u32 {
        filler = c.append(&[k as u8; 3000]).unwrap();
    }
    let t = c.node(l).propose_in_session(s, 4, &[b"e4"]).unwrap()[0];
    first.push(c.wait(l, t).unwrap());
    c.run_for(100_000_000).unwrap();
    // The trim: a checkpoint at the last filler entry, below every node's applied index.
    for i in 1..=3 {
        assert!(c.node(i).status().applied > filler);
        let from = c.node(i).checkpoint(filler, b"trimmed").unwrap();
        assert!(from > first[2], "node {i}: the trim must delete e1..e3");
    }
    for i in 1..=3 {
        c.crash(i);
    }
    for i in 1..=3 {
        c.restart(i).unwrap();
    }
    let l = c.elect().unwrap();
    let t = c
        .node(l)
        .propose_in_session(s, 2, &[b"e2", b"e3", b"e4"])
        .unwrap();
    let got: Vec<u64> = t.iter().map(|t| c.wait(l, *t).unwrap()).collect();
    assert_eq!(
        got,
        &first[1..],
        "resent entries resolve to their first copies"
    );
    c.run_for(200_000_000).unwrap();
    for i in 1..=3 {
        assert_eq!(payloads_of(&mut c, i, b"e4"), [first[3]], "node {i}");
        assert_eq!(c.node(i).stats().session_duplicates_applied, 0);
        assert_eq!(c.node(i).sessions().get(s).unwrap().last_seq, 4);
    }
}

/// Opens proposed and not yet applied expire the least recently used sessions when they are
/// applied, before any entry proposed after them. A leader that took an entry into such a
/// session had it acknowledged as in the session although every replica applied it as an
/// ordinary entry, and a resend after a lost answer found the session unknown. The leader now
/// counts the opens in its log: the session is unknown already.
#[test]
fn a_session_that_pending_opens_will_expire_takes_no_new_entry() {
    let mut c = SimCluster::new(3, 40, SimConfig::zero_delay(), |_| {}).unwrap();
    let l = c.elect().unwrap();
    let s = open(&mut c, l);
    let t = c.node(l).propose_in_session(s, 1, &[b"s1"]).unwrap()[0];
    c.wait(l, t).unwrap();
    for _ in 0..replica::sessions::SESSION_CAPACITY {
        c.node(l).open_session().unwrap();
    }
    match c.node(l).propose_in_session(s, 2, &[b"s2"]) {
        Err(ReplicaError::UnknownSession { session }) => assert_eq!(session, s),
        other => panic!("an entry into a session its pending opens expire: {other:?}"),
    }
    c.run_for(1_000_000_000).unwrap();
    for i in 1..=3 {
        assert!(c.node(i).sessions().get(s).is_none(), "node {i}");
        assert!(payloads_of(&mut c, i, b"s2").is_empty(), "node {i}");
    }
}
