//! Feeds arbitrary bytes to the peer wire format's decoder (`replica::wire`), as a whole frame
//! and as the body behind a valid header, so that every input reaches the bincode body
//! decoder: no panic; a body that decodes encodes again to one that decodes the same, and its
//! raft message converts or fails with a typed error.
#![no_main]

use libfuzzer_sys::fuzz_target;
use replica::wire::{self, Body, HEADER_BYTES, MAX_BODY_BYTES, WIRE_VERSION};

/// The cluster id both sides of the fuzzed frames claim.
const CLUSTER: u64 = 7;

fuzz_target!(|data: &[u8]| {
    let _ = wire::decode(CLUSTER, data);
    if data.len() > MAX_BODY_BYTES {
        return;
    }
    // The header of the format table in wire.rs: magic, version, reserved, length, cluster.
    let mut frame = Vec::with_capacity(HEADER_BYTES + data.len());
    frame.extend_from_slice(b"RL");
    frame.push(WIRE_VERSION);
    frame.push(0);
    frame.extend_from_slice(&(data.len() as u32).to_le_bytes());
    frame.extend_from_slice(&CLUSTER.to_le_bytes());
    frame.extend_from_slice(data);
    if let Ok(body) = wire::decode(CLUSTER, &frame) {
        let mut again = Vec::new();
        wire::encode(CLUSTER, &body, &mut again).unwrap();
        assert_eq!(wire::decode(CLUSTER, &again).unwrap(), body);
        match body {
            Body::Raft { msg, .. } | Body::FastAppend { msg, .. } | Body::Snapshot { msg, .. } => {
                let _ = wire::from_wire(msg);
            }
            Body::SnapshotChunk { .. } => {}
        }
    }
});
