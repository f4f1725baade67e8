//! What the owner saw of a connection, read from its events: shared by the TCP tests
//! (`tcp_fabric.rs`) and the RDMA lab tests (`lab_rdma_fabric.rs`) of the same properties.

use fabric::{Event, WcOp};

/// How many messages were delivered.
pub fn delivered(events: &[Event]) -> usize {
    events
        .iter()
        .filter(|e| matches!(e, Event::Completion(c) if c.op == WcOp::Recv))
        .count()
}

/// The connection's ups and downs, in order: `up`, or `down` and the reason.
pub fn ups_and_downs(events: &[Event]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Disconnected { reason, .. } => Some(format!("down {reason:?}")),
            Event::Connected { .. } => Some("up".to_string()),
            _ => None,
        })
        .collect()
}
