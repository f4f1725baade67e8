//! The replication data path without a fabric: a leader appends into its ring and persists
//! from it; the ring bytes are copied word by word into a follower's ring memory (standing in
//! for an RDMA Write), the follower validates them with `accept_written`, persists them from
//! its own ring, and both logs then hold the same entries at the same Lsns. A conflicting
//! suffix on the follower is truncated and rewritten.

use crate::common;

use std::path::Path;
use std::sync::Arc;

use wal::fs::{FaultFs, FileSystem};
use wal::{AnonymousMemory, Durability, Index, RingConfig, Term, Wal, ring};

#[test]
fn follower_ends_with_the_same_entries_at_the_same_lsns() {
    let fs: Arc<dyn FileSystem> = Arc::new(FaultFs::new());
    let (leader_wal, _) = Wal::open(
        Arc::clone(&fs),
        Path::new("/leader"),
        common::ring_wal_config(),
    )
    .unwrap();
    let (follower_wal, _) = Wal::open(
        Arc::clone(&fs),
        Path::new("/follower"),
        common::ring_wal_config(),
    )
    .unwrap();
    let ring_config = RingConfig {
        capacity_bytes: 2048,
        block_bytes: 512,
    };
    let leader_memory = Arc::new(AnonymousMemory::new(2048).unwrap());
    let follower_memory = Arc::new(AnonymousMemory::new(2048).unwrap());
    let (mut leader, mut leader_consumer) =
        ring(leader_memory.clone(), ring_config, leader_wal.position()).unwrap();
    let (mut follower, mut follower_consumer) = ring(
        follower_memory.clone(),
        ring_config,
        follower_wal.position(),
    )
    .unwrap();

    for round in 0..30u64 {
        let start = leader.position().lsn;
        for i in 0..3 {
            leader
                .append_next(
                    Term(1 + round / 10),
                    &vec![(round * 3 + i) as u8; (round * 7 + i * 13) as usize % 200],
                )
                .unwrap();
        }
        let end = leader.position().lsn;
        leader_wal
            .persist_from(&leader_consumer, end, Durability::Fsync)
            .unwrap();
        common::rdma_write(&*leader_memory, &*follower_memory, start, end);
        let accepted = follower.accept_written(end).unwrap();
        follower_wal
            .persist_from(&follower_consumer, accepted.lsn, Durability::Fsync)
            .unwrap();
        leader_consumer.release(end).unwrap();
        // The follower keeps the latest, not yet committed round in its ring.
        follower_consumer.release(start).unwrap();
    }
    assert_eq!(leader_wal.position(), follower_wal.position());
    assert!(leader_wal.segment_count() > 1);
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for index in 1..=leader_wal.last_index().0 {
        let la = leader_wal.read(Index(index), &mut a).unwrap();
        let fb = follower_wal.read(Index(index), &mut b).unwrap();
        assert_eq!((la, &a), (fb, &b));
    }

    // A conflict: the follower drops its last 2 entries and takes new ones of a higher term.
    let from = Index(follower_wal.last_index().0 - 1);
    follower_wal.truncate_suffix(from).unwrap();
    let position = follower_wal.position();
    assert_eq!(position.last_index.0, from.0 - 1);
    follower.rewind(position).unwrap();
    follower
        .append(from, Term(9), b"new leader's entry")
        .unwrap();
    follower_wal
        .persist_from(
            &follower_consumer,
            follower.position().lsn,
            Durability::Fsync,
        )
        .unwrap();
    let entry = follower_wal.read(from, &mut b).unwrap();
    assert_eq!((entry.term, &b[..]), (Term(9), &b"new leader's entry"[..]));
    leader_wal.close().unwrap();
    follower_wal.close().unwrap();
}
