//! Scenario: on one connection, a send posted after a write is received only after the write's
//! bytes are visible, for many random sizes and jittered timing.

use crate::common;

use common::*;
use fabric::{Event, Fabric, WcOp, WcStatus, WriteRequest, read_bytes, write_bytes};

#[test]
fn every_recv_sees_the_write_before_it() {
    let (net, mut a, mut b) = connected_pair(7);
    let region = a.peer_region.expect("b advertised its region");
    let mut rng = fabric::sim::SplitMix64::new(99);
    for round in 0..500u64 {
        let len = 1 + rng.below(8 * 1024);
        let byte = (round % 251) as u8 + 1;
        write_bytes(a.mem.as_ref(), 0, &vec![byte; len as usize]);
        let wr = WriteRequest {
            wr_id: round,
            local: a.local,
            local_offset: 0,
            remote: region,
            remote_offset: 0,
            len_bytes: len,
            signaled: round % 4 == 0,
        };
        a.ep.post_write(B, wr).unwrap();
        a.ep.post_send(B, 1_000_000 + round, &len.to_le_bytes())
            .unwrap();
        let t = net.now() + 10_000_000;
        // Step one action at a time and check at the very first moment b sees the message.
        loop {
            assert!(net.step(), "round {round}: nothing left to run");
            pump(&mut [&mut a, &mut b]);
            if let Some(pos) = b
                .events
                .iter()
                .position(|e| matches!(e, Event::Completion(c) if c.op == WcOp::Recv))
            {
                let Event::Completion(c) = b.events.remove(pos) else {
                    unreachable!()
                };
                let msg = b.ep.recv_message(A, c.wr_id).unwrap().to_vec();
                let n = u64::from_le_bytes(msg.try_into().unwrap());
                let mut got = vec![0u8; n as usize];
                read_bytes(b.mem.as_ref(), 0, &mut got);
                assert!(
                    got.iter().all(|&x| x == byte),
                    "round {round}: stale bytes at recv time"
                );
                b.ep.repost_recv(A, c.wr_id).unwrap();
                break;
            }
            assert!(net.now() < t, "round {round}: no recv");
        }
        settle(&net, &mut [&mut a, &mut b], net.now() + 1_000_000);
        assert!(
            a.events
                .iter()
                .all(|e| matches!(e, Event::Completion(c) if c.status == WcStatus::Success))
        );
        a.events.clear();
        b.events.clear();
    }
    assert_eq!(net.stats().writes_placed, 500);
}
