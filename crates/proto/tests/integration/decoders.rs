//! The protocol decoders against arbitrary and hostile input: every valid message round-trips,
//! no input panics, an oversized length prefix is refused before the body is read, and
//! trailing bytes are refused. `fuzz/` has the same entry point for cargo-fuzz.

use proptest::prelude::*;
use proto::{
    DEFAULT_MAX_FRAME_BYTES, ErrorCode, FrameError, NodeInfo, Request, Response, Role,
    decode_frame, encode_frame, read_frame,
};
use std::io::Read;

fn request() -> impl Strategy<Value = Request> {
    prop_oneof![
        (
            any::<u16>(),
            any::<u64>(),
            proptest::option::of("[a-z0-9]{0,40}")
        )
            .prop_map(|(version, cluster_id, token)| Request::Hello {
                version,
                cluster_id,
                token
            }),
        (
            any::<u64>(),
            proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 0..20)
        )
            .prop_map(|(id, entries)| Request::Append { id, entries }),
        (any::<u64>(), any::<u64>(), any::<u32>()).prop_map(|(id, from, max_bytes)| {
            Request::Read {
                id,
                from,
                max_bytes,
            }
        }),
        (any::<u64>(), any::<u64>()).prop_map(|(id, from)| Request::Tail { id, from }),
        any::<u64>().prop_map(|id| Request::Status { id }),
        (any::<u64>(), any::<bool>(), any::<u64>()).prop_map(|(id, add, node)| Request::Members {
            id,
            add,
            node
        }),
        (
            any::<u64>(),
            any::<u64>(),
            proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 0..20)
        )
            .prop_map(|(id, expected_last, entries)| Request::AppendIf {
                id,
                expected_last,
                entries
            }),
        (
            any::<u64>(),
            any::<u64>(),
            any::<u32>(),
            any::<u8>(),
            any::<u64>()
        )
            .prop_map(|(id, from, max_bytes, mode, index)| Request::ReadWith {
                id,
                from,
                max_bytes,
                consistency: match mode % 3 {
                    0 => proto::ReadConsistency::Local,
                    1 => proto::ReadConsistency::Linearizable,
                    _ => proto::ReadConsistency::AtLeast(index),
                },
            }),
    ]
}

proptest! {
    #[test]
    fn requests_round_trip(req in request()) {
        let mut buf = Vec::new();
        encode_frame(&req, &mut buf).unwrap();
        let back: Request = decode_frame(&buf, DEFAULT_MAX_FRAME_BYTES).unwrap();
        prop_assert_eq!(back, req);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = decode_frame::<Request>(&bytes, DEFAULT_MAX_FRAME_BYTES);
        let _ = decode_frame::<Response>(&bytes, DEFAULT_MAX_FRAME_BYTES);
        let _ = read_frame::<Request>(&mut &bytes[..], 1024);
    }

    #[test]
    fn mutated_frames_decode_or_fail_cleanly(req in request(), at in any::<usize>(), byte in any::<u8>()) {
        let mut buf = Vec::new();
        encode_frame(&req, &mut buf).unwrap();
        let k = at % buf.len();
        buf[k] = byte;
        let _ = decode_frame::<Request>(&buf, DEFAULT_MAX_FRAME_BYTES);
    }
}

/// A reader that fails the test if anything past the length prefix is read.
struct OnlyHeader {
    head: [u8; 4],
    pos: usize,
}

impl Read for OnlyHeader {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        assert!(
            self.pos < 4,
            "the body was read although its length exceeds the limit"
        );
        let n = out.len().min(4 - self.pos);
        out[..n].copy_from_slice(&self.head[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

#[test]
fn a_length_claim_inside_a_tiny_frame_cannot_make_the_decoder_allocate_much() {
    // Append { id: 1, entries: [<claims 60 MiB>] }: variant 1, id 1, one entry, then a
    // varint length of 60 MiB (0xFC = u32 follows) and no bytes.
    let mut body = vec![1u8, 1, 1, 0xFC];
    body.extend_from_slice(&(60u32 << 20).to_le_bytes());
    let mut frame = (body.len() as u32).to_le_bytes().to_vec();
    frame.extend_from_slice(&body);
    match decode_frame::<Request>(&frame, DEFAULT_MAX_FRAME_BYTES) {
        Err(FrameError::Malformed(m)) => assert!(m.contains("Limit"), "{m}"),
        other => panic!("expected a refused claim, got {other:?}"),
    }
}

#[test]
fn an_oversized_length_is_refused_before_the_body_is_read() {
    let mut r = OnlyHeader {
        head: u32::MAX.to_le_bytes(),
        pos: 0,
    };
    match read_frame::<Request>(&mut r, DEFAULT_MAX_FRAME_BYTES) {
        Err(FrameError::TooLarge { len, max }) => {
            assert_eq!((len, max), (u64::from(u32::MAX), DEFAULT_MAX_FRAME_BYTES))
        }
        other => panic!("expected TooLarge, got {other:?}"),
    }
}

#[test]
fn trailing_bytes_truncated_bodies_and_clean_closes_are_told_apart() {
    let mut buf = Vec::new();
    encode_frame(&Request::Status { id: 7 }, &mut buf).unwrap();
    let mut longer = buf.clone();
    longer.push(0);
    let len = u32::from_le_bytes(longer[..4].try_into().unwrap()) + 1;
    longer[..4].copy_from_slice(&len.to_le_bytes());
    assert!(matches!(
        decode_frame::<Request>(&longer, 1024),
        Err(FrameError::Malformed(m)) if m.contains("trailing")
    ));
    assert!(matches!(
        read_frame::<Request>(&mut &buf[..buf.len() - 1], 1024),
        Err(FrameError::Io(_))
    ));
    assert!(matches!(
        read_frame::<Request>(&mut &[][..], 1024),
        Err(FrameError::Closed)
    ));
    let r = Response::Error {
        id: None,
        code: ErrorCode::WrongCluster,
        message: "x".into(),
    };
    encode_frame(&r, &mut buf).unwrap();
    assert_eq!(decode_frame::<Response>(&buf, 1024).unwrap(), r);
    let w = Response::Welcome {
        node_id: 1,
        leader: Some(NodeInfo {
            id: 2,
            client_addr: "10.0.0.2:7600".into(),
        }),
        role: Role::ReadOnly,
    };
    encode_frame(&w, &mut buf).unwrap();
    assert_eq!(decode_frame::<Response>(&buf, 1024).unwrap(), w);
}
