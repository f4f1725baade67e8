//! Scenarios (issue 13, defects 1 and 2): a batch is all-or-nothing at proposal, and a ticket
//! whose entry was committed and then checkpointed away still resolves as committed.
//!
//! Method: a 3-node `SimCluster`. For the batch, the followers are cut off so nothing commits
//! and raft's uncommitted-size limit is reached part-way through a large batch; before the
//! fix the first entries stayed in the log while the call failed. For the ticket, the leader
//! commits entries and checkpoints past them before asking for the ticket's status.

use fabric::NodeId;
use fabric::sim::SimConfig;
use replica::sim::SimCluster;
use replica::{ReplicaConfig, ReplicaError};

fn cluster(seed: u64) -> SimCluster {
    SimCluster::new(3, seed, SimConfig::default(), |cfg: &mut ReplicaConfig| {
        // raft's uncommitted limit is max(ring / 2, 1 MiB): 1 MiB here.
        cfg.ring_bytes = 1 << 20;
        cfg.block_bytes = 64 << 10;
        cfg.max_entry_bytes = 61 << 10;
        // Small segments, so a checkpoint deletes some.
        cfg.segment_bytes = 256 << 10;
    })
    .unwrap()
}

#[test]
fn a_batch_over_the_uncommitted_limit_leaves_nothing_in_the_log() {
    let mut c = cluster(41);
    let leader = c.elect().unwrap();
    for other in (1..=3).filter(|&o| o != leader) {
        c.net.set_link(NodeId(leader), NodeId(other), false);
        c.net.set_link(NodeId(other), NodeId(leader), false);
    }
    // Something uncommitted, so raft's limit applies to what follows.
    let first = c.node(leader).propose(b"pending").unwrap();
    let before = c.node(leader).status().last_index;
    assert_eq!(before, first.index);
    let payload = vec![7u8; 60 << 10];
    let batch: Vec<&[u8]> = (0..40).map(|_| &payload[..]).collect();
    let r = c.node(leader).propose_batch(&batch);
    assert!(
        matches!(r, Err(ReplicaError::Dropped(_))),
        "a 2.4 MB batch over the 1 MiB limit must be refused: {r:?}"
    );
    assert_eq!(
        c.node(leader).status().last_index,
        before,
        "a refused batch left some of its entries in the log"
    );
    // A batch within the limit goes in whole, at consecutive indexes.
    let small: Vec<&[u8]> = (0..5).map(|_| &payload[..1000]).collect();
    let tickets = c.node(leader).propose_batch(&small).unwrap();
    let indexes: Vec<u64> = tickets.iter().map(|t| t.index).collect();
    assert_eq!(indexes, (before + 1..=before + 5).collect::<Vec<_>>());
}

#[test]
fn a_batch_commits_whole_when_the_followers_are_back() {
    let mut c = cluster(42);
    let leader = c.elect().unwrap();
    let items: Vec<Vec<u8>> = (0..200u32).map(|i| i.to_le_bytes().to_vec()).collect();
    let refs: Vec<&[u8]> = items.iter().map(|v| &v[..]).collect();
    let tickets = c.node(leader).propose_batch(&refs).unwrap();
    let last = *tickets.last().unwrap();
    assert_eq!(c.wait(leader, last).unwrap(), last.index);
    for t in &tickets {
        assert_eq!(c.node(leader).ticket_status(*t).unwrap().unwrap(), t.index);
    }
}

#[test]
fn a_committed_ticket_still_resolves_after_its_entry_is_checkpointed() {
    let mut c = cluster(43);
    let leader = c.elect().unwrap();
    let mut tickets = Vec::new();
    for i in 0..300u32 {
        let t = c.node(leader).propose(&[7u8; 4000]).unwrap();
        c.wait(leader, t).unwrap();
        tickets.push((t, i));
    }
    let applied = c.node(leader).status().applied;
    let first = c.node(leader).checkpoint(applied, b"state").unwrap();
    assert!(
        first > tickets[0].0.index,
        "the checkpoint must delete the first tickets' entries (first index {first}), or this \
         test proves nothing"
    );
    for (t, _) in &tickets {
        assert_eq!(
            c.node(leader)
                .ticket_status(*t)
                .map(|r| r.map_err(|e| e.to_string())),
            Some(Ok(t.index)),
            "ticket {t:?}"
        );
    }
}
