//! Scenario (issue 13, defect 7): when the leader's ring is full it releases space that RDMA
//! writes in flight still read from ("unpin"). With a NIC that reads a write's source bytes
//! when the write lands, such a write delivers whatever the leader wrote into the slot since.
//! The suspicion was that a stale append response could then point the fast path behind a
//! follower's real end, so that garbage lands over records the follower already accepted.
//!
//! Method: a 3-node `SimCluster` with a two-block ring, `read_source_at_delivery` on, and a
//! slow link to one follower, so writes to it stay in flight while the leader fills its ring
//! with batches. After every step each node's ring must still hold every accepted record
//! intact (`Replica::verify_ring`), and at the end the committed logs must be identical and
//! hold every acknowledged entry. The ring-full path must have run, or the test proves
//! nothing.
//!
//! The suspicion was right in general: the simulator later found (seed 53809) raft sending an
//! append again from the end an older response reported while a slow append was still in
//! flight, and the fast write went over the records that append placed. A response now
//! re-opens the fast path only when the follower holds everything sent to it on the
//! connection (`FastPeer::sent_to` in `replica::node::fast`).

use fabric::NodeId;
use fabric::sim::SimConfig;
use replica::ReplicaConfig;
use replica::sim::SimCluster;

#[test]
fn a_full_ring_with_late_reading_writes_never_corrupts_accepted_records() {
    let fabric = SimConfig {
        read_source_at_delivery: true,
        ..SimConfig::default()
    };
    let mut c = SimCluster::new(3, 61, fabric, |cfg: &mut ReplicaConfig| {
        cfg.ring_bytes = 128 << 10;
        cfg.block_bytes = 64 << 10;
        cfg.max_entry_bytes = 8 << 10;
        cfg.segment_bytes = 1 << 20;
    })
    .unwrap();
    let leader = c.elect().unwrap();
    let slow = (1..=3).find(|&id| id != leader).unwrap();
    let mut acked = Vec::new();
    let mut pending = Vec::new();
    for round in 0..60u64 {
        // Writes to the slow follower stay in flight for a few milliseconds, pinning the
        // leader's ring, while batches fill it.
        let ns = if round % 3 == 0 { 8_000_000 } else { 0 };
        c.net.set_extra_delay(NodeId(leader), NodeId(slow), ns);
        let items: Vec<Vec<u8>> = (0..12)
            .map(|k| vec![(round * 12 + k) as u8; 3000 + (k as usize * 397) % 4000])
            .collect();
        let refs: Vec<&[u8]> = items.iter().map(|v| &v[..]).collect();
        if let Ok(tickets) = c.node(leader).propose_batch(&refs) {
            pending.extend(tickets.into_iter().zip(items));
        }
        for _ in 0..5 {
            c.run_for(1_000_000).unwrap();
            for id in 1..=3 {
                if let Err(e) = c.node(id).verify_ring() {
                    panic!("node {id}'s ring after round {round}: {e}");
                }
            }
        }
        pending.retain(|(t, data)| match c.node(leader).ticket_status(*t) {
            Some(Ok(index)) => {
                acked.push((index, data.clone()));
                false
            }
            Some(Err(_)) => false,
            None => true,
        });
    }
    c.net.set_extra_delay(NodeId(leader), NodeId(slow), 0);
    for (t, data) in pending {
        if let Ok(index) = c.wait(leader, t) {
            acked.push((index, data));
        }
    }
    let ring_full = c.node(leader).stats().ring_full;
    assert!(
        ring_full > 0,
        "the leader's ring never filled, so this test proves nothing"
    );
    let last = acked.iter().map(|(i, _)| *i).max().unwrap();
    let ok = c
        .run_until(30_000_000_000, |c| {
            (1..=3).all(|id| c.node(id).status().commit >= last)
        })
        .unwrap();
    assert!(ok, "the cluster did not commit everything");
    let reference = c.committed_log(leader).unwrap();
    for id in 1..=3 {
        assert_eq!(c.committed_log(id).unwrap(), reference, "node {id}");
    }
    let by_index: std::collections::BTreeMap<u64, Vec<u8>> = reference.into_iter().collect();
    for (index, data) in &acked {
        assert_eq!(
            by_index.get(index),
            Some(data),
            "acknowledged entry {index}"
        );
    }
    println!(
        "ring full {ring_full} times; {} entries acknowledged; follower {slow} fast-rejected {}",
        acked.len(),
        c.node(slow).stats().fast_rejected
    );
}
