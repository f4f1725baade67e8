//! Scenario: a connection is the owner's to use only once `poll` handed out its `Connected`.
//! A node that sleeps while its peer reconnects (SIGSTOP, a long pause) wakes with state that
//! describes the connection before: a leader's idea of where the follower's log ends. A write
//! posted from that state onto the new connection, which the follower may already have
//! granted, can land over records the follower accepted since (simulator seed 928). So until
//! the owner polled the new connection's `Connected`, it reads as `Connecting` and refuses
//! writes and sends.

use crate::common;

use common::*;
use fabric::{ConnState, Event, Fabric, FabricError, WriteRequest};

#[test]
fn a_connection_made_while_its_owner_slept_is_unusable_until_its_event_is_polled() {
    let (net, mut a, mut b) = connected_pair(31);
    let region = a.peer_region.unwrap();
    // b drops the connection and dials again while a does not poll.
    b.ep.disconnect(A);
    b.ep.connect(A).unwrap();
    let until = net.now() + 1_000_000;
    while net.next_time().is_some_and(|t| t <= until) {
        net.step();
        pump(&mut [&mut b]);
    }
    assert_eq!(b.ep.conn_state(A), ConnState::Up, "b's side is up");
    b.ep.set_remote_write(A, true).unwrap();

    assert_eq!(
        a.ep.conn_state(B),
        ConnState::Connecting,
        "a has not seen the new connection"
    );
    let wr = WriteRequest {
        wr_id: 1,
        local: a.local,
        local_offset: 0,
        remote: region,
        remote_offset: 0,
        len_bytes: 64,
        signaled: true,
    };
    assert!(matches!(
        a.ep.post_write(B, wr),
        Err(FabricError::NotConnected { .. })
    ));
    assert!(matches!(
        a.ep.post_send(B, 2, b"stale"),
        Err(FabricError::NotConnected { .. })
    ));

    // Once a polled the Connected, the connection is its own.
    pump(&mut [&mut a]);
    assert!(
        a.events
            .iter()
            .any(|e| matches!(e, Event::Connected { peer, .. } if *peer == B))
    );
    assert_eq!(a.ep.conn_state(B), ConnState::Up);
    a.ep.post_write(B, wr).unwrap();
    a.ep.post_send(B, 3, b"fresh").unwrap();
}
