//! Scenario: a crashed or partitioned peer makes the oldest outstanding operation fail with
//! RetryExceeded after the retry bound and the rest Flushed; a lost ack fails a write that did
//! land; healing and reconnecting restores service.

use crate::common;

use common::*;
use fabric::sim::SimConfig;
use fabric::{ConnState, Event, Fabric, WcStatus, WriteRequest};

fn completions(n: &Node) -> Vec<(u64, WcStatus)> {
    n.events
        .iter()
        .filter_map(|e| match e {
            Event::Completion(c) => Some((c.wr_id, c.status)),
            _ => None,
        })
        .collect()
}

#[test]
fn crash_gives_retry_exceeded_then_flushed_within_the_bound() {
    let (net, mut a, mut b) = connected_pair(11);
    let region = a.peer_region.unwrap();
    net.crash(B);
    let t0 = net.now();
    for i in 0..3 {
        let wr = WriteRequest {
            wr_id: i,
            local: a.local,
            local_offset: 0,
            remote: region,
            remote_offset: 0,
            len_bytes: 64,
            signaled: true,
        };
        a.ep.post_write(B, wr).unwrap();
    }
    a.ep.post_send(B, 99, b"hello").unwrap();
    let bound = SimConfig::default().retry_timeout_ns;
    settle(&net, &mut [&mut a, &mut b], t0 + bound - 1);
    assert!(completions(&a).is_empty(), "failed before the retry bound");
    settle(&net, &mut [&mut a, &mut b], t0 + bound + 1_000_000);
    assert_eq!(
        completions(&a),
        [
            (0, WcStatus::RetryExceeded),
            (1, WcStatus::Flushed),
            (2, WcStatus::Flushed),
            (99, WcStatus::Flushed)
        ]
    );
    assert_eq!(a.ep.conn_state(B), ConnState::Down);
    assert!(
        a.ep.post_send(B, 100, b"x").is_err(),
        "posting on a broken connection"
    );
}

#[test]
fn a_lost_ack_fails_a_write_that_landed() {
    let (net, mut a, mut b) = connected_pair(12);
    let region = a.peer_region.unwrap();
    net.set_link(B, A, false); // acks from b are lost
    fabric::write_bytes(a.mem.as_ref(), 0, &[7; 16]);
    let wr = WriteRequest {
        wr_id: 1,
        local: a.local,
        local_offset: 0,
        remote: region,
        remote_offset: 0,
        len_bytes: 16,
        signaled: true,
    };
    a.ep.post_write(B, wr).unwrap();
    settle(
        &net,
        &mut [&mut a, &mut b],
        net.now() + SimConfig::default().retry_timeout_ns + 1_000_000,
    );
    assert_eq!(completions(&a), [(1, WcStatus::RetryExceeded)]);
    let mut got = [0u8; 16];
    fabric::read_bytes(b.mem.as_ref(), 0, &mut got);
    assert_eq!(
        got, [7; 16],
        "the bytes landed even though the writer saw a failure"
    );
}

#[test]
fn partition_then_heal_and_reconnect() {
    let (net, mut a, mut b) = connected_pair(13);
    net.set_link(A, B, false);
    net.set_link(B, A, false);
    a.ep.post_send(B, 1, b"ping").unwrap();
    settle(
        &net,
        &mut [&mut a, &mut b],
        net.now() + SimConfig::default().retry_timeout_ns + 1_000_000,
    );
    assert_eq!(completions(&a), [(1, WcStatus::RetryExceeded)]);
    a.events.clear();
    a.ep.connect(B).unwrap();
    settle(
        &net,
        &mut [&mut a, &mut b],
        net.now() + 3 * SimConfig::default().retry_timeout_ns,
    );
    assert!(a.events.iter().any(|e| matches!(
        e,
        Event::Disconnected {
            reason: fabric::DisconnectReason::Unreachable,
            ..
        }
    )));
    net.set_link(A, B, true);
    net.set_link(B, A, true);
    a.events.clear();
    a.ep.connect(B).unwrap();
    settle(&net, &mut [&mut a, &mut b], net.now() + 1_000_000);
    assert_eq!(a.ep.conn_state(B), ConnState::Up);
    a.ep.post_send(B, 2, b"again").unwrap();
    settle(&net, &mut [&mut a, &mut b], net.now() + 1_000_000);
    assert_eq!(completions(&a), [(2, WcStatus::Success)]);
}

/// RC delivers a connection's requests in order or not at all. A send lost on a blocked link
/// is not overtaken by one posted after the link heals: the later one's ack would otherwise
/// retire the lost one as a success, and the receive credit it never consumed would never
/// come back (simulator seeds 44395 and 55510 starved a leader's heartbeats that way).
#[test]
fn a_send_lost_on_a_blocked_link_is_never_overtaken_by_a_later_one() {
    let (net, mut a, mut b) = connected_pair(14);
    net.set_link(A, B, false);
    a.ep.post_send(B, 1, b"lost").unwrap();
    settle(&net, &mut [&mut a, &mut b], net.now() + 1_000_000);
    net.set_link(A, B, true);
    a.ep.post_send(B, 2, b"after the heal").unwrap();
    settle(
        &net,
        &mut [&mut a, &mut b],
        net.now() + SimConfig::default().retry_timeout_ns + 1_000_000,
    );
    assert_eq!(
        completions(&a),
        [(1, WcStatus::RetryExceeded), (2, WcStatus::Flushed)]
    );
    assert!(
        !b.events.iter().any(|e| matches!(
            e,
            Event::Completion(c) if c.op == fabric::WcOp::Recv
        )),
        "the send after the gap was delivered: {:?}",
        b.events
    );
    assert_eq!(a.ep.conn_state(B), ConnState::Down);
}
