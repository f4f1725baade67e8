//! The producer's verified copy: the wal persists each record exactly as the producer encoded
//! or checked it, without a second checksum, even when the shared memory changes after the
//! checks (a write that breaks the protocol, standing in here for a deposed leader's late RDMA
//! Write). The mutation that reads the copy again from the shared memory is caught here.

use crate::common;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use wal::fs::{FaultFs, FileSystem};
use wal::{
    AnonymousMemory, Durability, Index, Producer, RecordSource, RingConfig, RingMemory, Term, Wal,
    WalError, ring,
};

const RING: RingConfig = RingConfig {
    capacity_bytes: 4096,
    block_bytes: 512,
};

fn open(fs: &Arc<dyn FileSystem>, dir: &str) -> Wal {
    Wal::open(Arc::clone(fs), Path::new(dir), common::ring_wal_config())
        .unwrap()
        .0
}

fn persist_verified(wal: &Wal, producer: &mut Producer) {
    let end = producer.position().lsn;
    let verified = producer.verified();
    assert!(verified.covers(wal.position().lsn, end));
    let done = wal.persist_from(&verified, end, Durability::Fsync).unwrap();
    producer.forget_verified(done.lsn);
}

/// A follower accepts one entry the leader wrote into its ring; then the entry's payload in
/// the follower's shared memory changes; then the follower persists. Returns what the
/// follower's wal reads back.
fn follower_persists_after_a_late_write(reread_mutation: bool) -> Result<Vec<u8>, WalError> {
    let fs: Arc<dyn FileSystem> = Arc::new(FaultFs::new());
    let wal = open(&fs, "/follower");
    let leader_memory = Arc::new(AnonymousMemory::new(RING.capacity_bytes).unwrap());
    let follower_memory = Arc::new(AnonymousMemory::new(RING.capacity_bytes).unwrap());
    let (mut leader, _) = ring(leader_memory.clone(), RING, wal.position()).unwrap();
    let (mut follower, _) = ring(follower_memory.clone(), RING, wal.position()).unwrap();
    if reread_mutation {
        follower.reread_after_checks_for_test();
    }
    let (_, lsn) = leader.append_next(Term(1), &[0xab; 64]).unwrap();
    let end = leader.position().lsn;
    common::rdma_write(&*leader_memory, &*follower_memory, lsn, end);
    follower.accept_written(end).unwrap();
    // The late write: the first payload word of the accepted record changes.
    let word = ((lsn.0 + 32) & (RING.capacity_bytes - 1)) / 8;
    follower_memory.words()[word as usize].store(u64::MAX, Ordering::Relaxed);
    persist_verified(&wal, &mut follower);
    let mut payload = Vec::new();
    wal.read(Index(1), &mut payload)?;
    Ok(payload)
}

#[test]
fn the_wal_persists_the_checked_bytes_even_if_the_ring_changes_after_the_checks() {
    assert_eq!(
        follower_persists_after_a_late_write(false).unwrap(),
        vec![0xab; 64]
    );
}

#[test]
fn the_mutation_that_reads_the_ring_again_lets_the_changed_bytes_through() {
    // What the test above would see if the copy were taken from the shared memory again
    // after the checks: the segment holds bytes no checksum covered, and the acknowledged
    // entry is lost (its read from the file fails its checksum).
    match follower_persists_after_a_late_write(true) {
        Err(WalError::ReadCorrupt { index, .. }) => assert_eq!(index, Index(1)),
        other => panic!("the mutation went unnoticed: {other:?}"),
    }
}

/// Entries of many sizes (padding at block ends, laps of the ring), a conflict and a rewind:
/// a log persisted from the verified copy holds the same entries at the same positions as one
/// persisted from the shared memory, and the copy holds nothing the wal already has.
#[test]
fn a_log_persisted_from_the_copy_equals_one_persisted_from_the_ring() {
    let fs: Arc<dyn FileSystem> = Arc::new(FaultFs::new());
    let from_copy = open(&fs, "/copy");
    let from_ring = open(&fs, "/ring");
    let leader_memory = Arc::new(AnonymousMemory::new(RING.capacity_bytes).unwrap());
    let follower_memory = Arc::new(AnonymousMemory::new(RING.capacity_bytes).unwrap());
    let (mut leader, mut leader_consumer) =
        ring(leader_memory.clone(), RING, from_copy.position()).unwrap();
    let (mut follower, mut follower_consumer) =
        ring(follower_memory.clone(), RING, from_ring.position()).unwrap();
    for round in 0..40u64 {
        let start = leader.position().lsn;
        for i in 0..3 {
            let len = (round * 37 + i * 101) as usize % 460;
            leader
                .append_next(Term(1 + round / 10), &vec![(round * 3 + i) as u8; len])
                .unwrap();
        }
        let end = leader.position().lsn;
        persist_verified(&from_copy, &mut leader);
        assert_eq!(leader.verified().held().0, end);
        assert_eq!(
            leader.verified().held().1,
            end,
            "the copy is empty once persisted"
        );
        common::rdma_write(&*leader_memory, &*follower_memory, start, end);
        follower.accept_written(end).unwrap();
        from_ring
            .persist_from(&follower_consumer, end, Durability::Fsync)
            .unwrap();
        follower.forget_verified(end);
        // The leader keeps its latest round in its ring, for the rewind below.
        leader_consumer.release(start).unwrap();
        follower_consumer.release(end).unwrap();
    }
    assert_eq!(from_copy.position(), from_ring.position());
    // Byte for byte: the copy's records go in as one block per persist and are checked in
    // place, the ring's one record at a time; the padding is the wal's own in both.
    let files = |dir: &str| {
        let mut names = fs.list(Path::new(dir)).unwrap();
        names.sort();
        names
            .into_iter()
            .map(|name| {
                let f = fs.open(&Path::new(dir).join(&name)).unwrap();
                let mut bytes = vec![0u8; f.size_bytes().unwrap() as usize];
                f.read_exact_at(&mut bytes, 0).unwrap();
                (name, bytes)
            })
            .collect::<Vec<_>>()
    };
    let (copy_files, ring_files) = (files("/copy"), files("/ring"));
    assert!(copy_files.len() > 2, "the rounds cross segments");
    assert!(
        copy_files == ring_files,
        "the segment files differ between the two ways of persisting"
    );
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for index in 1..=from_copy.last_index().0 {
        let ea = from_copy.read(Index(index), &mut a).unwrap();
        let eb = from_ring.read(Index(index), &mut b).unwrap();
        assert_eq!((ea, &a), (eb, &b));
    }

    // A conflict on the leader's side: it drops its last entry, rewinds, takes a new one.
    // The copy starts again at the rewound end and still covers what the wal lacks.
    let last = from_copy.last_index();
    from_copy.truncate_suffix(last).unwrap();
    leader.rewind(from_copy.position()).unwrap();
    leader.append(last, Term(9), b"after the conflict").unwrap();
    persist_verified(&from_copy, &mut leader);
    let entry = from_copy.read(last, &mut a).unwrap();
    assert_eq!((entry.term, &a[..]), (Term(9), &b"after the conflict"[..]));
    from_copy.close().unwrap();
    from_ring.close().unwrap();

    // Reopened, the segments read back the same entries (the copy wrote valid records).
    let reopened = open(&fs, "/copy");
    let entry = reopened.read(last, &mut a).unwrap();
    assert_eq!((entry.term, &a[..]), (Term(9), &b"after the conflict"[..]));
    let other = open(&fs, "/ring");
    for index in 1..last.0 {
        let ea = reopened.read(Index(index), &mut a).unwrap();
        let eb = other.read(Index(index), &mut b).unwrap();
        assert_eq!((ea, &a), (eb, &b));
    }
}
