//! The protocol's documented limits, at and just over each: every `Append` within
//! [`MAX_BATCH_ENTRIES`] entries and the frame limit decodes, whatever its entries' sizes; one
//! entry more is refused as a batch over the entry limit (naming the request), and a byte more
//! than the frame limit as a frame over it. `Entries` responses as large as a frame decode on
//! the client side. Each message is encoded with [`encode_frame`] and decoded with
//! [`decode_frame`] at the default frame limit, as a client and a server do.

use proto::{
    DEFAULT_MAX_FRAME_BYTES, Entry, FrameError, MAX_BATCH_ENTRIES, Request, Response, decode_frame,
    encode_frame,
};

/// The replica's default entry limit (`replica::ReplicaConfig::max_entry_bytes`); the server's
/// tests check that the replica agrees.
const ENTRY_BYTES: usize = 64 << 10;

fn append(entries: usize, bytes: usize) -> Request {
    Request::Append {
        id: 7,
        entries: vec![vec![0xA5; bytes]; entries],
    }
}

fn frame(msg: &impl bincode::Encode) -> Vec<u8> {
    let mut buf = Vec::new();
    encode_frame(msg, &mut buf).unwrap();
    buf
}

#[test]
fn every_batch_within_the_limits_decodes() {
    // The sizes of the field report (defect 12), the documented limits, and the worst case
    // for the decoder's byte limit (empty entries: one byte on the wire, 24 in memory).
    for (n, bytes) in [
        (1, 0),
        (170, 1),
        (200, 8),
        (256, 2),
        (300, 4),
        (3000, 8),
        (MAX_BATCH_ENTRIES, 0),
        (MAX_BATCH_ENTRIES, 1),
        (MAX_BATCH_ENTRIES, 8),
        (MAX_BATCH_ENTRIES, 1000),
        (64, ENTRY_BYTES),
        (255, ENTRY_BYTES),
    ] {
        let req = append(n, bytes);
        let buf = frame(&req);
        match decode_frame::<Request>(&buf, DEFAULT_MAX_FRAME_BYTES) {
            Ok(back) => assert!(back == req, "{n} entries of {bytes} B changed in transit"),
            Err(e) => panic!(
                "{n} entries of {bytes} B ({} B frame) do not decode: {e}",
                buf.len()
            ),
        }
    }
}

#[test]
fn a_batch_over_the_entry_count_limit_is_refused_as_such() {
    for (n, bytes) in [(MAX_BATCH_ENTRIES + 1, 0), (5000, 8), (100_000, 1)] {
        let buf = frame(&append(n, bytes));
        let e = decode_frame::<Request>(&buf, DEFAULT_MAX_FRAME_BYTES).unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains(&format!("{n} entries")) && text.contains("4096-entry"),
            "{n} entries of {bytes} B: {text}"
        );
        match e {
            FrameError::BatchTooLong { id, entries } => {
                assert_eq!((id, entries), (7, n as u64));
            }
            other => panic!("{n} entries of {bytes} B: {other:?}"),
        }
    }
}

#[test]
fn a_frame_over_the_frame_limit_is_refused_as_such() {
    let buf = frame(&append(256, ENTRY_BYTES));
    let len = buf.len() - 4;
    assert_eq!(len, 16_778_501, "the size defect 14 reports");
    match decode_frame::<Request>(&buf, DEFAULT_MAX_FRAME_BYTES) {
        Err(FrameError::TooLarge { len: got, max }) => {
            assert_eq!((got, max), (len as u64, DEFAULT_MAX_FRAME_BYTES));
        }
        other => panic!("{other:?}"),
    }
}

/// The claim in [`DEFAULT_MAX_FRAME_BYTES`]'s documentation, computed.
#[test]
fn the_default_frame_holds_255_entries_of_the_default_entry_limit() {
    let fits = frame(&append(255, ENTRY_BYTES)).len() - 4;
    assert!(fits <= DEFAULT_MAX_FRAME_BYTES as usize, "{fits} B");
    let over = frame(&append(256, ENTRY_BYTES)).len() - 4;
    assert!(over > DEFAULT_MAX_FRAME_BYTES as usize, "{over} B");
}

fn entries(n: usize, bytes: usize) -> Response {
    Response::Entries {
        id: 9,
        commit: u64::MAX,
        entries: (1..=n as u64)
            .map(|index| Entry {
                index,
                data: vec![0x5A; bytes],
            })
            .collect(),
    }
}

#[test]
fn entries_responses_up_to_the_frame_limit_decode() {
    // `rdmalog tail` over 300 entries of 4 B (defect 12); a tail chunk of 1 MiB of small
    // entries; 4 MiB of empty entries (the most the decoder charges per byte of an Entries
    // frame: 32 in memory for 2 to 6 bytes on the wire).
    for (n, bytes) in [
        (300, 4),
        (1 << 17, 8),
        (16, ENTRY_BYTES),
        ((4 << 20) / 6, 0),
    ] {
        let r = entries(n, bytes);
        let buf = frame(&r);
        assert!(buf.len() - 4 <= DEFAULT_MAX_FRAME_BYTES as usize);
        match decode_frame::<Response>(&buf, DEFAULT_MAX_FRAME_BYTES) {
            Ok(back) => assert!(back == r, "{n} entries of {bytes} B changed in transit"),
            Err(e) => panic!("{n} entries of {bytes} B do not decode: {e}"),
        }
    }
}

#[test]
fn an_entry_costs_at_most_its_overhead_besides_its_payload() {
    let one = frame(&entries(1, 100)).len();
    let two = frame(&entries(2, 100)).len();
    assert!(two - one <= 100 + proto::ENTRY_OVERHEAD_BYTES);
    let empty = frame(&Response::Entries {
        id: u64::MAX,
        commit: u64::MAX,
        entries: Vec::new(),
    })
    .len()
        - 4;
    // The count's varint is one byte here and at most 9.
    assert!(empty - 1 + 9 <= proto::ENTRIES_HEADER_BYTES, "{empty}");
}
