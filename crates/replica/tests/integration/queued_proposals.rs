//! Scenario (issue 14): proposals a leader cannot make ahead of raft are queued for its next
//! pass, which steps all of them into raft as one proposal (`node::direct`,
//! `Replica::queue_proposal`). Asserted, in every durability: a burst of proposals made
//! between two passes gets consecutive indexes at once (the log's end counts them before raft
//! hears of them), commits at those indexes with its bytes on every node, in order; a caller's
//! pass steps what waits; and queueing never takes in more than raft-rs would take proposal by
//! proposal: past raft's uncommitted-size limit a proposal is refused at once, with raft's
//! reason, and once the burst commits the leader takes proposals again.

use replica::sim::SimCluster;
use replica::{Committed, Durability, Mutation, ReplicaError, Ticket};

use crate::caller_driven_pass::{cluster_with, drive_until_resolved};

const DURABILITIES: [Durability; 3] = [
    Durability::Memory,
    Durability::Fsync,
    Durability::Replicated,
];

/// Runs the cluster until every node applied `t`, then checks that each holds `data[k]` at
/// `tickets[k]`'s index, in its term.
fn committed_everywhere(c: &mut SimCluster, d: Durability, tickets: &[Ticket], data: &[Vec<u8>]) {
    let last = tickets.last().unwrap().index;
    let applied = c
        .run_until(5_000_000_000, |c| {
            (1..=3).all(|id| c.node(id).status().applied >= last)
        })
        .unwrap();
    assert!(applied, "{d}: not every node applied up to {last}");
    for id in 1..=3 {
        for (t, want) in tickets.iter().zip(data) {
            let mut out = Vec::new();
            let got = c.node(id).read(t.index, &mut out).unwrap();
            assert_eq!(
                got,
                Some(Committed::Application { term: t.term }),
                "{d}: node {id}, index {}",
                t.index
            );
            assert_eq!(&out, want, "{d}: node {id}, index {}", t.index);
        }
    }
}

#[test]
fn a_burst_of_proposals_between_passes_commits_at_consecutive_indexes() {
    for d in DURABILITIES {
        let (mut c, leader) = cluster_with(d, Mutation::None);
        let before = c.node(leader).status();
        let data: Vec<Vec<u8>> = (0..16u8).map(|i| vec![i; 64 + i as usize]).collect();
        let mut tickets = Vec::new();
        for item in &data {
            tickets.push(c.node(leader).propose(item).unwrap());
        }
        let s = c.node(leader).status();
        for (k, t) in tickets.iter().enumerate() {
            assert_eq!(t.index, before.last_index + 1 + k as u64, "{d}");
            assert_eq!(t.term, s.term, "{d}");
        }
        assert_eq!(
            s.last_index,
            before.last_index + 16,
            "{d}: the log's end counts them"
        );
        // Under `Replicated` the first goes ahead of raft (the pipeline is empty), the rest
        // find its writes in flight; elsewhere all wait for the pass.
        let ahead = s.stats.direct_proposals - before.stats.direct_proposals;
        let queued = s.stats.queued_proposals - before.stats.queued_proposals;
        assert_eq!(ahead + queued, 16, "{d}: {:?}", s.stats);
        assert_eq!(ahead, u64::from(d == Durability::Replicated), "{d}");
        // A caller's passes step the queue: the last one resolves.
        let last = *tickets.last().unwrap();
        let r = drive_until_resolved(&mut c, leader, last);
        assert_eq!(r.map(|r| r.unwrap()), Some(last.index), "{d}");
        committed_everywhere(&mut c, d, &tickets, &data);
        for t in &tickets {
            assert_eq!(c.node(leader).ticket_status(*t).unwrap().unwrap(), t.index);
        }
    }
}

/// Proposes 64 KiB entries on the leader, with no pass in between, until one is refused:
/// the tickets taken and the refusal.
fn propose_until_refused(
    c: &mut SimCluster,
    leader: u64,
    data: &[u8],
) -> (Vec<Ticket>, ReplicaError) {
    let mut tickets = Vec::new();
    loop {
        match c.node(leader).propose(data) {
            Ok(t) => tickets.push(t),
            Err(e) => return (tickets, e),
        }
        assert!(tickets.len() < 1_000, "never refused");
    }
}

#[test]
fn queueing_takes_no_more_than_raft_s_uncommitted_limit() {
    for d in DURABILITIES {
        let (mut c, leader) = cluster_with(d, Mutation::None);
        let data = vec![7u8; 64 << 10];
        let (tickets, refused) = propose_until_refused(&mut c, leader, &data);
        // raft-rs's limit for the simulated cluster's 4 MiB rings is 2 MiB of payloads, with
        // nothing uncommitted before: 31 of 64 KiB and a tag byte (2,031,647 bytes; 32 would
        // be 2,097,184). Raft-rs proposal by proposal takes exactly as many.
        let payload = data.len() + 1;
        assert_eq!(
            tickets.len(),
            (2 << 20) / payload,
            "{d}: proposals of {payload} bytes taken"
        );
        assert!(
            matches!(refused, ReplicaError::Dropped(_)),
            "{d}: refused with {refused:?}"
        );
        // What was taken commits, and then the leader takes proposals again.
        let last = *tickets.last().unwrap();
        let r = drive_until_resolved(&mut c, leader, last);
        assert_eq!(r.map(|r| r.unwrap()), Some(last.index), "{d}");
        let copies = vec![data.clone(); tickets.len()];
        committed_everywhere(&mut c, d, &tickets, &copies);
        let t = c.node(leader).propose(b"after the burst").unwrap();
        // (The simulated cluster's clock may re-elect the same leader while the burst of
        // 2 MiB drains, as it does without the queue: the next index can be a term's first.)
        assert!(t.index > last.index, "{d}");
        committed_everywhere(&mut c, d, &[t], &[b"after the burst".to_vec()]);
    }
}
