//! Helpers shared by the simulator's scenario tests.
#![allow(dead_code)] // reason: each scenario file uses a different subset

pub mod links;

use std::sync::Arc;

use fabric::sim::{SimConfig, SimEndpoint, SimNet};
use fabric::{ConnState, Event, Fabric, LocalRegion, NodeId, RemoteRegion, VecMemory};

pub const A: NodeId = NodeId(1);
pub const B: NodeId = NodeId(2);

#[derive(Debug)]
pub struct Node {
    pub ep: SimEndpoint,
    pub mem: Arc<VecMemory>,
    pub local: LocalRegion,
    pub remote: RemoteRegion,
    pub peer_region: Option<RemoteRegion>,
    pub events: Vec<Event>,
}

pub fn node(net: &SimNet, id: NodeId, bytes: u64) -> Node {
    let mut ep = net.add_node(id);
    let mem = Arc::new(VecMemory::new(bytes));
    let (local, remote) = ep.register(mem.clone()).unwrap();
    ep.advertise(remote);
    Node {
        ep,
        mem,
        local,
        remote,
        peer_region: None,
        events: Vec::new(),
    }
}

/// Polls every node once, collecting events and learning advertised regions.
pub fn pump(nodes: &mut [&mut Node]) {
    let mut buf = [Event::Disconnected {
        peer: NodeId(0),
        reason: fabric::DisconnectReason::Closed,
    }; 16];
    for n in nodes.iter_mut() {
        loop {
            let k = n.ep.poll(&mut buf);
            for e in &buf[..k] {
                if let Event::Connected { remote, .. } = e {
                    n.peer_region = *remote;
                }
                n.events.push(*e);
            }
            if k < buf.len() {
                break;
            }
        }
    }
}

/// Runs the net until nothing is scheduled before `t`, polling as it goes.
pub fn settle(net: &SimNet, nodes: &mut [&mut Node], t: u64) {
    while let Some(next) = net.next_time() {
        if next > t {
            break;
        }
        net.step();
        pump(nodes);
    }
    net.run_until(t);
    pump(nodes);
}

/// Connects a to b and grants b's memory to a.
pub fn connected_pair(seed: u64) -> (SimNet, Node, Node) {
    let net = SimNet::new(SimConfig::default(), seed);
    let mut a = node(&net, A, 1 << 16);
    let mut b = node(&net, B, 1 << 16);
    a.ep.connect(B).unwrap();
    let t = net.now() + 1_000_000;
    settle(&net, &mut [&mut a, &mut b], t);
    assert_eq!(a.ep.conn_state(B), ConnState::Up);
    assert_eq!(b.ep.conn_state(A), ConnState::Up);
    b.ep.set_remote_write(A, true).unwrap();
    a.events.clear();
    b.events.clear();
    (net, a, b)
}
