//! A closed log lets go of its replica at once: its peer port, links and ring go at
//! `Log::close` (or when the `Log` is dropped), not when the last of its handles and
//! subscriptions is dropped, and those handles answer from what was settled at the close
//! (`replica::node::Released`).
//!
//! Method: a one-voter log over the real TCP fabric on loopback, closed while an append's
//! handle and a subscription live on, then opened again on the same port and data dir in the
//! same process (the old endpoint used to keep the port bound); and, in a `SimCluster` whose
//! nodes hold committed, superseded, stale and compacted entries of several terms and
//! confirmed, pending and foreign linearizable reads, every ticket's and read's answer from the
//! released view compared with the replica's own.

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fabric::NodeId;
use fabric::sim::SimConfig;
use fabric::tcp::{TcpConfig, TcpEndpoint};
use replica::sim::SimCluster;
use replica::{Log, LogOptions, ReplicaConfig, ReplicaError, Role, Ticket};
use wal::fs::{FaultFs, FileSystem};

use crate::stale_suffix::isolate;

const SECOND_NS: u64 = 1_000_000_000;

/// A loopback address with a port nobody listens on now.
fn free_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
}

/// A one-voter log over TCP on `addr`, on `disk`, leading.
fn open_single(addr: SocketAddr, disk: &Arc<dyn FileSystem>) -> Log<TcpEndpoint> {
    try_open_single(addr, disk).expect("the peer port is free")
}

/// [`open_single`], `None` when `addr` cannot be bound.
fn try_open_single(addr: SocketAddr, disk: &Arc<dyn FileSystem>) -> Option<Log<TcpEndpoint>> {
    let tcp = TcpConfig::new(NodeId(1), 9, addr, BTreeMap::new());
    let ep = TcpEndpoint::open(tcp).ok()?;
    let mut cfg = ReplicaConfig::new(1, vec![1], 9, "/n1".into());
    cfg.ring_bytes = 1 << 20;
    cfg.segment_bytes = 1 << 20;
    let log = Log::open(cfg, ep, disk.clone(), LogOptions::default()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while log.status().role != Role::Leader {
        assert!(Instant::now() < deadline, "a one-voter log did not lead");
        std::thread::sleep(Duration::from_millis(5));
    }
    Some(log)
}

#[test]
fn a_closed_log_frees_its_peer_port_while_its_handles_live_on() {
    let disk: Arc<dyn FileSystem> = Arc::new(FaultFs::new());
    // A port found free may be taken by another process before the first open binds it: then
    // another port (after that the test holds it, but for the moments between close and
    // reopen, which it is about).
    let (addr, log) = (0..5)
        .find_map(|_| {
            let addr = free_addr();
            try_open_single(addr, &disk).map(|log| (addr, log))
        })
        .expect("no free loopback port in five tries");
    let committed = log.append(b"kept").unwrap();
    let index = committed
        .wait_for(Duration::from_secs(10))
        .expect("the append did not commit")
        .unwrap();
    let mut subscription = log.subscribe(index + 1);
    log.close().unwrap();

    // The handles answer from the close: committed stays committed, the subscription ends.
    assert_eq!(
        committed.try_result().map(|r| r.map_err(|e| e.to_string())),
        Some(Ok(index))
    );
    assert!(
        subscription.next().is_none(),
        "a subscription of a closed log ends"
    );

    // The same process opens the log again on the same port and data dir while both live.
    let log = open_single(addr, &disk);
    let again = log.append(b"after the reopen").unwrap();
    let next = again.wait(Duration::from_secs(10)).unwrap();
    assert!(next > index, "reopened at {next}, after {index}");
    drop(log);
    // A dropped (not closed) log lets go of the port too.
    let log = open_single(addr, &disk);
    log.close().unwrap();
    drop((committed, subscription));
}

/// Every ticket of indexes 0 ..= last + 2 and terms 0 ..= the highest + 1 that node `id` can
/// be asked about: a leader is asked about its own term only where its log holds that term
/// (it never gave other tickets of it).
fn askable(c: &mut SimCluster, id: u64, last: u64, top: u64) -> Vec<Ticket> {
    let s = c.node(id).status();
    let mut out = Vec::new();
    for term in 0..=top + 1 {
        for index in 0..=last + 2 {
            if s.role == Role::Leader
                && term == s.term
                && c.node(id).persisted_term(index) != Some(term)
            {
                continue;
            }
            out.push(Ticket { index, term });
        }
    }
    out
}

fn answer(r: Option<Result<u64, ReplicaError>>) -> String {
    format!("{:?}", r.map(|r| r.map_err(|e| e.to_string())))
}

#[test]
fn the_released_view_answers_every_ticket_and_read_as_the_replica_did() {
    let mut c = SimCluster::new(3, 71, SimConfig::default(), |cfg: &mut ReplicaConfig| {
        cfg.ring_bytes = 1 << 20;
        cfg.block_bytes = 64 << 10;
        cfg.max_entry_bytes = 61 << 10;
        // Small segments, so a checkpoint deletes some.
        cfg.segment_bytes = 256 << 10;
    })
    .unwrap();
    let a = c.elect().unwrap();
    for _ in 0..100 {
        c.append(&[1u8; 4000]).unwrap();
    }
    // A, cut off, appends entries that never commit; the other two elect and commit in two
    // terms, and one of them checkpoints past the first term's entries.
    let others: Vec<u64> = (1..=3).filter(|&i| i != a).collect();
    isolate(&mut c, a, &others, false);
    for _ in 0..3 {
        c.node(a).propose(b"stale").unwrap();
    }
    let ok = c
        .run_until(30 * SECOND_NS, |c| c.leader().is_some_and(|l| l != a))
        .unwrap();
    assert!(ok, "the other two elected nobody");
    let b = c.leader().unwrap();
    for _ in 0..5 {
        c.append(b"second term").unwrap();
    }
    let other = others.iter().copied().find(|&o| o != b).unwrap();
    c.node(b).transfer_leader(other);
    let ok = c
        .run_until(30 * SECOND_NS, |c| c.leader() == Some(other))
        .unwrap();
    assert!(ok, "the leadership did not move to {other}");
    for _ in 0..5 {
        c.append(b"third term").unwrap();
    }
    // Linearizable reads on the leader: two confirmed, one started as it is cut off (never
    // confirmed), and the same tickets asked of the other nodes (not theirs).
    let mut reads = Vec::new();
    for _ in 0..2 {
        reads.push(c.node(other).read_index().unwrap());
    }
    c.run_for(SECOND_NS / 10).unwrap();
    let rest: Vec<u64> = (1..=3).filter(|&i| i != other).collect();
    isolate(&mut c, other, &rest, false);
    reads.push(c.node(other).read_index().unwrap());
    c.run_for(SECOND_NS / 100).unwrap();
    let applied = c.node(b).status().applied;
    let first = c.node(b).checkpoint(applied, b"state").unwrap();
    assert!(
        first > 2,
        "the checkpoint deleted nothing, or this test proves less"
    );

    let last = (1..=3)
        .map(|id| c.node(id).status().last_index)
        .max()
        .unwrap();
    let top = (1..=3).map(|id| c.node(id).status().term).max().unwrap();
    // How many answers of each kind: committed, superseded, unknown, pending; and committed
    // below the checkpoint on `b`.
    let mut kinds = [0usize; 5];
    for id in 1..=3 {
        let released = c.node(id).released();
        for t in askable(&mut c, id, last, top) {
            let live = c.node(id).ticket_status(t);
            let kind = match &live {
                Some(Ok(_)) if id == b && t.index < first => 4,
                Some(Ok(_)) => 0,
                Some(Err(ReplicaError::Superseded { .. })) => 1,
                Some(Err(_)) => 2,
                None => 3,
            };
            kinds[kind] += 1;
            assert_eq!(
                answer(released.ticket_status(t)),
                answer(live),
                "node {id}, ticket {t:?}"
            );
        }
    }
    // Reads: the view first, for the replica forgets a read it answered.
    let mut read_kinds = [0usize; 3];
    for id in 1..=3 {
        let released = c.node(id).released();
        for &t in &reads {
            let view = released.read_status(t);
            let live = c.node(id).read_status(t);
            read_kinds[match &live {
                Some(Ok(_)) => 0,
                Some(Err(_)) => 1,
                None => 2,
            }] += 1;
            assert_eq!(answer(view), answer(live), "node {id}, read {t:?}");
        }
    }
    assert!(
        read_kinds.iter().all(|&k| k > 0),
        "confirmed, refused, pending reads: {read_kinds:?}; each must occur"
    );
    assert!(
        kinds.iter().all(|&k| k > 0),
        "committed, superseded, unknown, pending, compacted: {kinds:?}; each must occur, or \
         this test proves less"
    );
}

/// Under `Replicated` a caller's pass may stop at the write completions that made a quorum,
/// before raft steps them: every ticket they cover is committed on the replica, asked or not.
/// The view says so too (here the second entry of a batch whose first a caller waited on).
#[test]
fn the_released_view_counts_the_write_completions_raft_has_not_stepped() {
    use crate::caller_driven_pass::{cluster_with, drive_until_resolved};
    let (mut c, leader) = cluster_with(replica::Durability::Replicated, replica::Mutation::None);
    let tickets = c
        .node(leader)
        .propose_batch(&[b"first".as_slice(), b"second".as_slice()])
        .unwrap();
    let (first, second) = (tickets[0], tickets[1]);
    let resolved = drive_until_resolved(&mut c, leader, first);
    assert!(matches!(resolved, Some(Ok(_))), "{resolved:?}");
    let released = c.node(leader).released();
    let live = c.node(leader).ticket_status(second);
    assert!(
        matches!(live, Some(Ok(i)) if i == second.index)
            && c.node(leader).status().commit < second.index,
        "the second entry should be committed on its completions only, raft behind: {live:?}"
    );
    assert_eq!(answer(released.ticket_status(second)), answer(live));
}
