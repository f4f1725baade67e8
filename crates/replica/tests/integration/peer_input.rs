//! Peer input that no correct peer sends neither panics a node nor stops it: raft-rs trusts
//! its peers and panics on some of it, or takes it for its own (a message of term 0), so each
//! is dropped and counted (`bad_frames`) before raft sees it, and the cluster goes on
//! committing (`replica::node::peer_input`).
//!
//! Method: a 3-node `SimCluster`; each message is handed to the leader and to a follower as if
//! a member had sent it (`Replica::receive_for_test`), then the cluster runs and commits.

use fabric::sim::SimConfig;
use raft::prelude::{Entry, Message, MessageType};
use replica::sim::SimCluster;
use replica::storage::CheckpointData;
use replica::wire::{self, Body, WireSnapshotMeta};

fn msg(t: MessageType, from: u64, to: u64, term: u64) -> Message {
    let mut m = Message::default();
    m.set_msg_type(t);
    m.from = from;
    m.to = to;
    m.term = term;
    m
}

fn entry(index: u64, term: u64) -> Entry {
    Entry {
        index,
        term,
        data: b"x".to_vec().into(),
        ..Default::default()
    }
}

/// What `from` sends `to` that a correct peer never does: labelled frames.
/// (A transfer request is a correct peer's to a leader: a follower forwards it.)
fn bad_messages(
    cluster: u64,
    from: u64,
    (to, to_leads): (u64, bool),
    term: u64,
    last: u64,
) -> Vec<(String, Vec<u8>)> {
    use MessageType::*;
    let raft = |label: &str, m: Message| {
        let mut out = Vec::new();
        wire::encode_raft(cluster, &m, None, &mut out).unwrap();
        (label.to_string(), out)
    };
    let mut out = Vec::new();
    for t in [term, term + 1] {
        // raft-rs gives every index past the log term 0, so this append "matches", and
        // committing its commit index (or appending its entry) panics.
        let mut m = msg(MsgAppend, from, to, t);
        m.index = last + 5;
        m.commit = last + 5;
        out.push(raft(
            &format!("append past the log, log term 0, term {t}"),
            m.clone(),
        ));
        m.entries = vec![entry(last + 6, t)].into();
        out.push(raft(
            &format!("append past the log with an entry, term {t}"),
            m.clone(),
        ));
        let mut fast = Vec::new();
        m.entries = vec![entry(last + 6, t)].into();
        wire::encode_fast_append(cluster, &m, 0, 64, &mut fast).unwrap();
        out.push((format!("descriptor past the log, term {t}"), fast));
    }
    for t in [0, term] {
        out.push(raft(
            &format!("empty proposal, term {t}"),
            msg(MsgPropose, from, to, t),
        ));
        out.push(raft(
            &format!("read index, term {t}"),
            msg(MsgReadIndex, from, to, t),
        ));
        if t == 0 || !to_leads {
            out.push(raft(
                &format!("transfer, term {t}"),
                msg(MsgTransferLeader, from, to, t),
            ));
        }
    }
    out.push(raft("heartbeat of term 0", msg(MsgHeartbeat, from, to, 0)));
    let mut m = msg(MsgReadIndexResp, from, to, 0);
    m.index = last + 5;
    m.entries = vec![entry(0, 0)].into();
    out.push(raft("read index response of term 0", m));
    let mut m = msg(MsgAppendResponse, from, to, term);
    m.index = u64::MAX;
    out.push(raft("append response at u64::MAX", m));
    if to_leads {
        // (A follower ignores append responses.)
        let mut m = msg(MsgAppendResponse, from, to, term);
        m.index = last + 100;
        out.push(raft("append response past the log", m));
    }
    out.push(raft(
        "snapshot in a raft frame",
        msg(MsgSnapshot, from, to, term),
    ));
    out.push(raft("hup", msg(MsgHup, from, to, term)));
    // Snapshots: the data first, in one chunk, then the metadata.
    let good = CheckpointData {
        lsn: 1 << 20,
        sessions: &[],
        state: b"state",
    }
    .encode();
    let members = vec![1, 2, 3];
    let conf = |voters: Vec<u64>, learners: Vec<u64>, outgoing: Vec<u64>, auto_leave: bool| {
        WireSnapshotMeta {
            index: last + 50,
            term,
            voters,
            learners,
            voters_outgoing: outgoing,
            learners_next: vec![],
            auto_leave,
            data_len: 0,
        }
    };
    let snapshots = [
        (
            "auto_leave without a joint membership",
            conf(members.clone(), vec![], vec![], true),
            good.clone(),
        ),
        (
            "a learner that is a voter",
            conf(vec![1, 2, 3], vec![to], vec![], false),
            good.clone(),
        ),
        (
            "no voters",
            conf(vec![], vec![to], vec![], false),
            good.clone(),
        ),
        (
            "a state that does not decode",
            conf(members.clone(), vec![], vec![], false),
            b"abc".to_vec(),
        ),
        (
            "a log position not 8-aligned",
            conf(members.clone(), vec![], vec![], false),
            CheckpointData {
                lsn: 13,
                sessions: &[],
                state: b"s",
            }
            .encode(),
        ),
    ];
    for (label, mut meta, data) in snapshots {
        meta.data_len = data.len() as u64;
        let mut frames = Vec::new();
        let chunk = Body::SnapshotChunk {
            index: meta.index,
            term: meta.term,
            offset: 0,
            total: data.len() as u64,
            data: data.clone(),
        };
        let mut b = Vec::new();
        wire::encode(cluster, &chunk, &mut b).unwrap();
        frames.push(b);
        let mut m = msg(MsgSnapshot, from, to, term);
        m.log_term = term;
        let body = Body::Snapshot {
            msg: wire::to_wire(&m, true),
            meta,
        };
        let mut b = Vec::new();
        wire::encode(cluster, &body, &mut b).unwrap();
        frames.push(b);
        for (k, f) in frames.into_iter().enumerate() {
            out.push((format!("snapshot with {label} (frame {k})"), f));
        }
    }
    out
}

#[test]
fn messages_no_correct_peer_sends_are_dropped_and_the_cluster_goes_on() {
    let mut c = SimCluster::new(3, 47, SimConfig::default(), |_| {}).unwrap();
    let leader = c.elect().unwrap();
    let mut last = 0;
    for i in 0..10u64 {
        last = c.append(format!("before {i}").as_bytes()).unwrap();
    }
    c.run_for(200_000_000).unwrap();
    let follower = (1..=3).find(|&id| id != leader).unwrap();
    let other = (1..=3).find(|&id| id != leader && id != follower).unwrap();
    let cluster = c.configs[&leader].cluster_id;
    for (to, from) in [(leader, follower), (follower, leader), (follower, other)] {
        let term = c.node(to).status().term;
        let last_index = c.node(to).status().last_index;
        let before = c.node(to).stats().bad_frames;
        let bad = bad_messages(cluster, from, (to, to == leader), term, last_index);
        // A snapshot's chunk is taken (its metadata is what is dropped), and a transfer with
        // its term set that reaches a follower is a correct peer's, ignored uncounted.
        let counted = |l: &str| {
            let ignored = l.starts_with("transfer") && !l.ends_with("term 0");
            !l.contains("(frame 0)") && !ignored
        };
        let dropped = bad.iter().filter(|(l, _)| counted(l)).count() as u64;
        for (label, frame) in &bad {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                c.node(to).receive_for_test(from, frame)
            }));
            match r {
                Ok(Ok(())) => {}
                Ok(Err(e)) => panic!("node {to}: {label} from {from}: {e}"),
                Err(_) => panic!("node {to} panicked at {label} from {from}"),
            }
            c.node(to)
                .process()
                .unwrap_or_else(|e| panic!("node {to} after {label} from {from}: {e}"));
            assert_eq!(c.node(to).status().term, term.max(c.node(to).status().term));
        }
        assert_eq!(
            c.node(to).stats().bad_frames - before,
            dropped,
            "node {to}: every message from {from} dropped and counted"
        );
    }
    // The cluster goes on: same leader, new commits everywhere.
    for i in 0..10u64 {
        last = c.append(format!("after {i}").as_bytes()).unwrap();
    }
    c.run_for(500_000_000).unwrap();
    assert_eq!(
        c.leader(),
        Some(leader),
        "a dropped message moved the leadership"
    );
    for id in 1..=3 {
        assert!(
            c.node(id).status().commit >= last,
            "node {id} stopped committing"
        );
        assert!(c.node(id).status().failure.is_none());
    }
    let reference = c.committed_log(leader).unwrap();
    for id in 1..=3 {
        assert_eq!(c.committed_log(id).unwrap(), reference);
    }
}
