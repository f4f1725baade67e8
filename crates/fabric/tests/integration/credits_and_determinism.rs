//! Scenario: credits bound sends to posted receive buffers (no RNR in normal operation), reposts
//! return them, oversize messages are refused, and a run replays exactly from its seed.

use crate::common;

use common::*;
use fabric::sim::SimConfig;
use fabric::{Event, Fabric, FabricError, MAX_MESSAGE_BYTES, WcOp};

#[test]
fn credits_run_out_and_come_back() {
    let (net, mut a, mut b) = connected_pair(21);
    let slots = SimConfig::default().recv_slots;
    assert_eq!(a.ep.send_credits(B), slots);
    for i in 0..slots {
        a.ep.post_send(B, u64::from(i), &[i as u8; 10]).unwrap();
    }
    assert_eq!(
        a.ep.post_send(B, 999, b"x"),
        Err(FabricError::NoCredit { peer: B })
    );
    settle(&net, &mut [&mut a, &mut b], net.now() + 1_000_000);
    let recvs: Vec<u64> = b
        .events
        .iter()
        .filter_map(|e| match e {
            Event::Completion(c) if c.op == WcOp::Recv => Some(c.wr_id),
            _ => None,
        })
        .collect();
    assert_eq!(recvs.len(), slots as usize);
    assert_eq!(a.ep.send_credits(B), 0);
    for slot in recvs {
        assert_eq!(b.ep.recv_message(A, slot).unwrap().len(), 10);
        b.ep.repost_recv(A, slot).unwrap();
        assert!(b.ep.repost_recv(A, slot).is_err(), "double repost");
    }
    settle(&net, &mut [&mut a, &mut b], net.now() + 1_000_000);
    assert_eq!(a.ep.send_credits(B), slots);
}

#[test]
fn oversize_messages_are_refused_before_posting() {
    let (_net, mut a, _b) = connected_pair(22);
    let big = vec![0u8; MAX_MESSAGE_BYTES + 1];
    assert!(matches!(
        a.ep.post_send(B, 1, &big),
        Err(FabricError::MessageTooLarge { .. })
    ));
    assert_eq!(a.ep.send_credits(B), SimConfig::default().recv_slots);
}

fn trace(seed: u64) -> Vec<(u64, String)> {
    let (net, mut a, mut b) = connected_pair(seed);
    let mut out = Vec::new();
    for i in 0..20u64 {
        a.ep.post_send(B, i, &i.to_le_bytes()).unwrap();
        b.ep.post_send(A, 100 + i, &i.to_le_bytes()).unwrap();
        let until = net.now() + 20_000;
        // Step action by action so each event is stamped with the virtual time it appeared.
        while net.next_time().is_some_and(|t| t <= until) {
            net.step();
            pump(&mut [&mut a, &mut b]);
            for e in a.events.drain(..).chain(b.events.drain(..)) {
                out.push((net.now(), format!("{e:?}")));
            }
        }
        // Return credits so the run never stalls.
        for (me, peer) in [(&mut a, B), (&mut b, A)] {
            for slot in 0..u64::from(SimConfig::default().recv_slots) {
                if me.ep.recv_message(peer, slot).is_ok() {
                    me.ep.repost_recv(peer, slot).unwrap();
                }
            }
        }
    }
    out
}

#[test]
fn the_same_seed_replays_the_same_trace() {
    assert_eq!(trace(5), trace(5));
    assert_ne!(trace(5), trace(6), "jitter should make seeds differ");
}
