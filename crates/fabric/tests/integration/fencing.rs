//! Scenario: the receiver revokes remote write on a live connection; the writer's next write
//! completes RemoteAccess, the target bytes are unchanged, later operations are flushed, and
//! after reconnecting and re-granting writes work again. A guessed rkey is refused the same way.

use crate::common;

use common::*;
use fabric::sim::{SimConfig, SimNet};
use fabric::{
    ConnState, DisconnectReason, Event, Fabric, WcStatus, WriteRequest, read_bytes, write_bytes,
};

fn write(a: &Node, region: fabric::RemoteRegion, wr_id: u64, len: u64) -> WriteRequest {
    WriteRequest {
        wr_id,
        local: a.local,
        local_offset: 0,
        remote: region,
        remote_offset: 64,
        len_bytes: len,
        signaled: true,
    }
}

#[test]
fn a_revoked_connection_refuses_and_breaks() {
    let (net, mut a, mut b) = connected_pair(3);
    let region = a.peer_region.unwrap();
    write_bytes(b.mem.as_ref(), 64, &[0x5A; 128]);
    write_bytes(a.mem.as_ref(), 0, &[0xEE; 128]);
    b.ep.set_remote_write(A, false).unwrap();
    let w1 = write(&a, region, 1, 128);
    let w2 = write(&a, region, 2, 128);
    a.ep.post_write(B, w1).unwrap();
    a.ep.post_write(B, w2).unwrap();
    settle(&net, &mut [&mut a, &mut b], net.now() + 5_000_000);
    let statuses: Vec<_> = a
        .events
        .iter()
        .filter_map(|e| match e {
            Event::Completion(c) => Some((c.wr_id, c.status)),
            _ => None,
        })
        .collect();
    assert_eq!(
        statuses,
        [(1, WcStatus::RemoteAccess), (2, WcStatus::Flushed)]
    );
    assert!(a.events.contains(&Event::Disconnected {
        peer: B,
        reason: DisconnectReason::Failed(WcStatus::RemoteAccess)
    }));
    let mut target = [0u8; 128];
    read_bytes(b.mem.as_ref(), 64, &mut target);
    assert_eq!(target, [0x5A; 128], "fenced write changed memory");
    assert_eq!(net.stats().writes_refused, 2);
    assert_eq!(a.ep.conn_state(B), ConnState::Down);

    // Reconnect; the new connection starts revoked until the owner grants it.
    a.events.clear();
    a.ep.connect(B).unwrap();
    settle(&net, &mut [&mut a, &mut b], net.now() + 5_000_000);
    assert_eq!(a.ep.conn_state(B), ConnState::Up);
    let w3 = write(&a, region, 3, 128);
    a.ep.post_write(B, w3).unwrap();
    settle(&net, &mut [&mut a, &mut b], net.now() + 5_000_000);
    read_bytes(b.mem.as_ref(), 64, &mut target);
    assert_eq!(
        target, [0x5A; 128],
        "a new connection must start without remote write"
    );

    a.events.clear();
    a.ep.connect(B).unwrap();
    settle(&net, &mut [&mut a, &mut b], net.now() + 5_000_000);
    b.ep.set_remote_write(A, true).unwrap();
    let w4 = write(&a, region, 4, 128);
    a.ep.post_write(B, w4).unwrap();
    settle(&net, &mut [&mut a, &mut b], net.now() + 5_000_000);
    read_bytes(b.mem.as_ref(), 64, &mut target);
    assert_eq!(target, [0xEE; 128]);
}

#[test]
fn a_guessed_rkey_or_range_is_refused() {
    let (net, mut a, mut b) = connected_pair(4);
    let region = a.peer_region.unwrap();
    let mut wrong = region;
    wrong.rkey += 1;
    let w = write(&a, wrong, 9, 8);
    a.ep.post_write(B, w).unwrap();
    settle(&net, &mut [&mut a, &mut b], net.now() + 5_000_000);
    assert!(a.events.iter().any(
        |e| matches!(e, Event::Completion(c) if c.wr_id == 9 && c.status == WcStatus::RemoteAccess)
    ));

    a.events.clear();
    a.ep.connect(B).unwrap();
    settle(&net, &mut [&mut a, &mut b], net.now() + 5_000_000);
    b.ep.set_remote_write(A, true).unwrap();
    let mut past_end = write(&a, region, 10, 8);
    past_end.remote_offset = region.len_bytes - 4;
    a.ep.post_write(B, past_end).unwrap();
    settle(&net, &mut [&mut a, &mut b], net.now() + 5_000_000);
    assert!(a.events.iter().any(
        |e| matches!(e, Event::Completion(c) if c.wr_id == 10 && c.status == WcStatus::RemoteAccess)
    ));
}

/// A write lost on the wire (its link cut) is never completed `Success` by what happens to
/// the writes behind it: the target revoking access while a later write is on the wire does
/// not tear that later write (the responder takes nothing past the gap), so no `RemoteAccess`
/// answer acknowledges the lost one. The lost write fails, and the target's bytes stay as
/// they were. (Before the fix the later write was torn and its answer completed the lost one
/// `Success`: simulator seed 9,601,360, `--callers-drive --durability replicated`.)
#[test]
fn a_lost_write_is_not_completed_by_a_later_write_torn_at_a_revoke() {
    let net = SimNet::new(
        SimConfig {
            tear_writes_at_revoke: true,
            ..SimConfig::default()
        },
        5,
    );
    let mut a = node(&net, A, 1 << 16);
    let mut b = node(&net, B, 1 << 16);
    a.ep.connect(B).unwrap();
    settle(&net, &mut [&mut a, &mut b], net.now() + 1_000_000);
    b.ep.set_remote_write(A, true).unwrap();
    a.events.clear();
    let region = a.peer_region.unwrap();
    write_bytes(b.mem.as_ref(), 64, &[0x5A; 128]);
    write_bytes(a.mem.as_ref(), 0, &[0xEE; 128]);

    // The first write is lost: its link is cut while it travels.
    net.set_link(A, B, false);
    a.ep.post_write(B, write(&a, region, 1, 128)).unwrap();
    settle(&net, &mut [&mut a, &mut b], net.now() + 100_000);
    net.set_link(A, B, true);
    // The second is on the wire when the target revokes.
    a.ep.post_write(B, write(&a, region, 2, 128)).unwrap();
    b.ep.set_remote_write(A, false).unwrap();
    settle(&net, &mut [&mut a, &mut b], net.now() + 2_000_000_000);

    let status = |wr_id| {
        a.events.iter().find_map(|e| match e {
            Event::Completion(c) if c.wr_id == wr_id => Some(c.status),
            _ => None,
        })
    };
    assert_ne!(status(1), Some(WcStatus::Success), "{:?}", a.events);
    assert!(
        status(1).is_some(),
        "the lost write never completed: {:?}",
        a.events
    );
    assert_ne!(status(2), Some(WcStatus::Success), "{:?}", a.events);
    let mut target = [0u8; 128];
    read_bytes(b.mem.as_ref(), 64, &mut target);
    assert_eq!(target, [0x5A; 128], "a write placed bytes past a lost one");
}
