//! Feeds arbitrary bytes to the peer wire format's decoder (`replica::wire`), as a whole frame
//! and as the body behind a valid header, so that every input reaches the bincode body
//! decoder: no panic; a body that decodes encodes again to one that decodes the same, and its
//! raft message converts or fails with a typed error; and the hand codec the replica decodes
//! with (`wire::decode_frame`) gives the same verdict and the same message.
#![no_main]

use libfuzzer_sys::fuzz_target;
use replica::wire::{self, Body, Frame, HEADER_BYTES, MAX_BODY_BYTES, WIRE_VERSION};

/// The cluster id both sides of the fuzzed frames claim.
const CLUSTER: u64 = 7;

/// The derived decoder's verdict on `frame`, converted as the replica would, against the hand
/// codec's: both refuse it, or both give the same message.
fn same_verdict(frame: &[u8]) {
    let derived = wire::decode(CLUSTER, frame);
    let hand = wire::decode_frame(CLUSTER, frame);
    let converted = |msg| wire::from_wire(msg).ok();
    let agree = match (derived, hand) {
        (Err(_), Err(_)) => true,
        (Ok(Body::Raft { msg, ring }), Ok(Frame::Raft { msg: m, ring: r })) => {
            ring == r && converted(msg) == Some(m)
        }
        (
            Ok(Body::FastAppend {
                msg,
                lsn_start,
                lsn_end,
            }),
            Ok(Frame::FastAppend {
                msg: m,
                lsn_start: s,
                lsn_end: e,
            }),
        ) => lsn_start == s && lsn_end == e && converted(msg) == Some(m),
        (Ok(Body::Snapshot { msg, meta }), Ok(Frame::Snapshot { msg: m, meta: t })) => {
            meta == t && converted(msg) == Some(m)
        }
        (Ok(Body::SnapshotChunk { data, .. }), Ok(Frame::SnapshotChunk { data: d, .. })) => {
            data == d
        }
        // The derived decoder takes a body whose message does not convert; the hand codec
        // refuses it at once. The replica drops the peer either way.
        (
            Ok(Body::Raft { msg, .. } | Body::FastAppend { msg, .. } | Body::Snapshot { msg, .. }),
            Err(_),
        ) => converted(msg).is_none(),
        _ => false,
    };
    assert!(
        agree,
        "the hand codec disagrees with the derived one on {frame:?}"
    );
}

fuzz_target!(|data: &[u8]| {
    let _ = wire::decode(CLUSTER, data);
    same_verdict(data);
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
    same_verdict(&frame);
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
