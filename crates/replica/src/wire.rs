//! The control-message wire format: our own, never protobuf from the network.
//!
//! Every frame starts with a fixed 16-byte header, then a bincode 2 body:
//!
//! | offset | size | field | value |
//! |---|---|---|---|
//! | 0 | 2 | magic | `b"RL"` |
//! | 2 | 1 | version | [`WIRE_VERSION`] |
//! | 3 | 1 | reserved | 0 |
//! | 4 | 4 | body length | u32 LE, at most [`MAX_BODY_BYTES`] |
//! | 8 | 8 | cluster id | u64 LE |
//!
//! The header is checked (magic, version, cluster id, length bound) before the body is
//! decoded, and the body is decoded with a byte limit, so a malformed or hostile frame costs
//! at most one bounded decode and is rejected with a typed error.

use bincode::{Decode, Encode};
use bytes::Bytes;
use protobuf::ProtobufEnum;
use raft::prelude::{Entry, EntryType, Message, MessageType};

mod codec;

pub use codec::{Frame, decode_frame, encode_fast_append, encode_fast_append_last, encode_raft};

/// The protocol version this build speaks. Version 2 added snapshot transfer
/// ([`Body::SnapshotChunk`], [`Body::Snapshot`]); version 3 the session entries and the
/// session table in a snapshot's data ([`crate::sessions`]), which a version 2 node would
/// misread, so the two refuse each other; version 4 the term exchange of a node on a new data
/// dir ([`Body::TermQuery`], [`Body::TermAnswer`], see [`crate::recovering::Unproven`]).
pub const WIRE_VERSION: u8 = 4;

/// Application state bytes in one [`Body::SnapshotChunk`]: half a frame, so a chunk always
/// fits with its header and fields.
pub const SNAPSHOT_CHUNK_BYTES: usize = MAX_BODY_BYTES / 2;

/// Most members in a snapshot's membership lists (as in the raft-state file).
pub const MAX_MEMBERS: usize = 1024;

/// Size of the fixed frame header.
pub const HEADER_BYTES: usize = 16;

/// Largest frame body: the fabric's message limit less the header.
pub const MAX_BODY_BYTES: usize = fabric::MAX_MESSAGE_BYTES - HEADER_BYTES;

const MAGIC: [u8; 2] = *b"RL";

/// What a follower reports about its ring with every message to the leader, for the fast
/// path's invariant and for flow control.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Encode, Decode)]
pub struct RingInfo {
    /// The real last index of the follower's log.
    pub last_index: u64,
    /// Its term.
    pub last_term: u64,
    /// The Lsn where the follower's next record goes.
    pub ring_end: u64,
    /// The first Lsn the follower still holds in its ring; the leader never writes past
    /// `ring_head + capacity`.
    pub ring_head: u64,
    /// The last index the follower has persisted.
    pub persisted_index: u64,
}

/// A raft log entry on the wire.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct WireEntry {
    /// `EntryType` as an integer.
    pub entry_type: i32,
    /// Term.
    pub term: u64,
    /// Index.
    pub index: u64,
    /// Payload (empty in fast-path descriptors: the bytes are in the ring).
    pub data: Vec<u8>,
}

/// A raft message on the wire (a snapshot's metadata travels beside it in [`Body::Snapshot`],
/// its data in [`Body::SnapshotChunk`]s before it).
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct WireMessage {
    /// `MessageType` as an integer.
    pub msg_type: i32,
    /// Receiver.
    pub to: u64,
    /// Sender.
    pub from: u64,
    /// Sender's term.
    pub term: u64,
    /// Term of the entry before `entries` (appends) or of the last entry (votes).
    pub log_term: u64,
    /// Index of the entry before `entries`.
    pub index: u64,
    /// Leader's commit index.
    pub commit: u64,
    /// Term of the commit index.
    pub commit_term: u64,
    /// Rejection.
    pub reject: bool,
    /// Rejection hint.
    pub reject_hint: u64,
    /// Snapshot request.
    pub request_snapshot: u64,
    /// Election priority.
    pub priority: i64,
    /// Opaque context (read-index, transfer-leader).
    pub context: Vec<u8>,
    /// Entries.
    pub entries: Vec<WireEntry>,
}

/// A frame's body.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub enum Body {
    /// A raft message, with the payload of any entries (the slow path), and the sender's ring
    /// state when the sender is a follower.
    Raft {
        /// The message.
        msg: WireMessage,
        /// The sender's ring, if it reports one.
        ring: Option<RingInfo>,
    },
    /// A fast-path append descriptor: the raft MsgAppend fields and the entries' index and
    /// term, with the payload already RDMA-written into the receiver's ring at `[lsn_start,
    /// lsn_end)`.
    FastAppend {
        /// The MsgAppend, entries without data.
        msg: WireMessage,
        /// First byte written.
        lsn_start: u64,
        /// End of the bytes written.
        lsn_end: u64,
    },
    /// Part of a snapshot's data, sent in order before its [`Body::Snapshot`] on the same
    /// connection.
    SnapshotChunk {
        /// The snapshot's index.
        index: u64,
        /// The snapshot's term.
        term: u64,
        /// Where these bytes go in the data.
        offset: u64,
        /// Total bytes of the data.
        total: u64,
        /// The bytes (at most [`SNAPSHOT_CHUNK_BYTES`]).
        data: Vec<u8>,
    },
    /// raft's MsgSnapshot: the message and the snapshot's metadata; its data came in chunks.
    Snapshot {
        /// The MsgSnapshot.
        msg: WireMessage,
        /// The snapshot's metadata.
        meta: WireSnapshotMeta,
    },
    /// Asks the receiver for its current term: sent by a node whose data dir was new at its
    /// start until every other voter has answered (see [`crate::recovering::Unproven`]).
    TermQuery,
    /// The answer to a [`Body::TermQuery`]: the sender's current term and the membership it
    /// has applied.
    TermAnswer {
        /// The sender's term when it answered.
        term: u64,
        /// The index its membership is as of (the latest change it applied, or its
        /// checkpoint's).
        conf_as_of: u64,
        /// That membership's voters (both halves of a joint one; at most [`MAX_MEMBERS`]).
        voters: Vec<u64>,
    },
}

/// raft's snapshot metadata on the wire.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct WireSnapshotMeta {
    /// Index of the last entry the snapshot covers.
    pub index: u64,
    /// Its term.
    pub term: u64,
    /// Voters as of `index`.
    pub voters: Vec<u64>,
    /// Learners.
    pub learners: Vec<u64>,
    /// Outgoing voters of a joint configuration.
    pub voters_outgoing: Vec<u64>,
    /// Learners to be.
    pub learners_next: Vec<u64>,
    /// Whether a joint configuration leaves itself.
    pub auto_leave: bool,
    /// Total bytes of the snapshot's data, sent in chunks before this message.
    pub data_len: u64,
}

/// Why a frame was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// Shorter than a header, or than the length it claims.
    #[error("frame of {len} bytes is truncated (needs {needed})")]
    Truncated {
        /// Bytes received.
        len: usize,
        /// Bytes needed.
        needed: usize,
    },
    /// Not our protocol.
    #[error("frame has bad magic {found:02x?}")]
    BadMagic {
        /// What was there.
        found: [u8; 2],
    },
    /// Another protocol version.
    #[error("frame has protocol version {found}, this node speaks {WIRE_VERSION}")]
    Version {
        /// The version received.
        found: u8,
    },
    /// Another cluster.
    #[error("frame is for cluster {found:#x}, this node is in cluster {expected:#x}")]
    Cluster {
        /// Cluster id received.
        found: u64,
        /// Ours.
        expected: u64,
    },
    /// The body claims more than the limit.
    #[error("frame body of {len} bytes exceeds the {MAX_BODY_BYTES}-byte limit")]
    TooLarge {
        /// Claimed length.
        len: usize,
    },
    /// The body does not decode.
    #[error("frame body does not decode: {0}")]
    Body(String),
    /// A field is out of range (unknown message or entry type).
    #[error("frame has an invalid field: {0}")]
    Field(&'static str),
}

/// How many bytes of memory bincode 2 may count against its decode limit per byte of frame
/// body. bincode counts what a value occupies in memory, not what it encoded to: a
/// [`WireEntry`] encodes in as few as 4 bytes and occupies `size_of::<WireEntry>()` (48), so
/// a limit of `MAX_BODY_BYTES` refused a valid append of ~5,400 small entries (raft packs
/// that many into `max_size_per_msg`). The body length is checked against `MAX_BODY_BYTES`
/// first, so this only bounds what a hostile length prefix can make the decoder reserve.
const DECODE_BYTES_PER_BODY_BYTE: usize = 16;
const _: () = assert!(
    std::mem::size_of::<WireEntry>() <= 4 * DECODE_BYTES_PER_BODY_BYTE,
    "a WireEntry (at least 4 encoded bytes) must fit the decode limit per byte"
);

fn config() -> impl bincode::config::Config {
    bincode::config::standard()
        .with_little_endian()
        .with_limit::<{ MAX_BODY_BYTES * DECODE_BYTES_PER_BODY_BYTE }>()
}

/// Encodes `body` into `out` (cleared first). The buffer is reused across calls.
///
/// This is the format's definition, derived by bincode. The hot path encodes raft messages
/// with [`encode_raft`] and [`encode_fast_append`], which write the same bytes without
/// building a [`WireMessage`] first.
pub fn encode(cluster_id: u64, body: &Body, out: &mut Vec<u8>) -> Result<(), WireError> {
    start_frame(cluster_id, out);
    bincode::encode_into_std_write(body, out, config())
        .map_err(|e| WireError::Body(e.to_string()))?;
    finish_frame(out)
}

/// Clears `out` and writes a header whose body length [`finish_frame`] fills in.
fn start_frame(cluster_id: u64, out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(&MAGIC);
    out.push(WIRE_VERSION);
    out.push(0);
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&cluster_id.to_le_bytes());
}

/// Fills in the body length of a frame [`start_frame`] began, or refuses a body over the limit.
fn finish_frame(out: &mut [u8]) -> Result<(), WireError> {
    let body_len = out.len() - HEADER_BYTES;
    if body_len > MAX_BODY_BYTES {
        return Err(WireError::TooLarge { len: body_len });
    }
    out[4..8].copy_from_slice(&(body_len as u32).to_le_bytes());
    Ok(())
}

/// Checks the header and decodes the body.
///
/// This is the format's definition, derived by bincode; the replica decodes with
/// [`decode_frame`], which accepts exactly the frames this accepts (and [`from_wire`] then
/// converts) and builds raft's message directly.
pub fn decode(cluster_id: u64, frame: &[u8]) -> Result<Body, WireError> {
    let body = checked_body(cluster_id, frame)?;
    let (decoded, used) = bincode::decode_from_slice::<Body, _>(body, config())
        .map_err(|e| WireError::Body(e.to_string()))?;
    if used != body.len() {
        return Err(WireError::Body(format!(
            "{} trailing bytes",
            body.len() - used
        )));
    }
    Ok(decoded)
}

/// Checks a frame's header (magic, version, cluster id, length bound) and returns its body.
fn checked_body(cluster_id: u64, frame: &[u8]) -> Result<&[u8], WireError> {
    if frame.len() < HEADER_BYTES {
        return Err(WireError::Truncated {
            len: frame.len(),
            needed: HEADER_BYTES,
        });
    }
    let magic = [frame[0], frame[1]];
    if magic != MAGIC {
        return Err(WireError::BadMagic { found: magic });
    }
    if frame[2] != WIRE_VERSION {
        return Err(WireError::Version { found: frame[2] });
    }
    let found = u64::from_le_bytes(frame[8..16].try_into().expect("8 bytes"));
    if found != cluster_id {
        return Err(WireError::Cluster {
            found,
            expected: cluster_id,
        });
    }
    let len = u32::from_le_bytes(frame[4..8].try_into().expect("4 bytes")) as usize;
    if len > MAX_BODY_BYTES {
        return Err(WireError::TooLarge { len });
    }
    frame
        .get(HEADER_BYTES..HEADER_BYTES + len)
        .ok_or(WireError::Truncated {
            len: frame.len(),
            needed: HEADER_BYTES + len,
        })
}

/// Converts a raft message to its wire form; `with_data` false drops entry payloads.
pub fn to_wire(m: &Message, with_data: bool) -> WireMessage {
    WireMessage {
        msg_type: m.get_msg_type().value(),
        to: m.to,
        from: m.from,
        term: m.term,
        log_term: m.log_term,
        index: m.index,
        commit: m.commit,
        commit_term: m.commit_term,
        reject: m.reject,
        reject_hint: m.reject_hint,
        request_snapshot: m.request_snapshot,
        priority: m.priority,
        context: m.context.to_vec(),
        entries: m
            .entries
            .iter()
            .map(|e| WireEntry {
                entry_type: e.get_entry_type().value(),
                term: e.term,
                index: e.index,
                data: if with_data {
                    e.data.to_vec()
                } else {
                    Vec::new()
                },
            })
            .collect(),
    }
}

/// Converts a wire message back to raft's type, rejecting unknown enum values.
pub fn from_wire(w: WireMessage) -> Result<Message, WireError> {
    let mut m = Message::default();
    m.set_msg_type(MessageType::from_i32(w.msg_type).ok_or(WireError::Field("message type"))?);
    m.to = w.to;
    m.from = w.from;
    m.term = w.term;
    m.log_term = w.log_term;
    m.index = w.index;
    m.commit = w.commit;
    m.commit_term = w.commit_term;
    m.reject = w.reject;
    m.reject_hint = w.reject_hint;
    m.request_snapshot = w.request_snapshot;
    m.priority = w.priority;
    m.context = Bytes::from(w.context);
    let mut entries = Vec::with_capacity(w.entries.len());
    for e in w.entries {
        let mut x = Entry::default();
        x.set_entry_type(EntryType::from_i32(e.entry_type).ok_or(WireError::Field("entry type"))?);
        x.term = e.term;
        x.index = e.index;
        x.data = Bytes::from(e.data);
        entries.push(x);
    }
    m.set_entries(entries.into());
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Body {
        let mut m = Message::default();
        m.set_msg_type(MessageType::MsgAppend);
        m.to = 2;
        m.from = 1;
        m.term = 3;
        m.index = 9;
        let mut e = Entry::default();
        e.index = 10;
        e.term = 3;
        e.data = Bytes::from_static(b"\x01hello");
        m.set_entries(vec![e].into());
        Body::Raft {
            msg: to_wire(&m, true),
            ring: None,
        }
    }

    /// An append of as many small entries as raft packs into one message decodes (bincode
    /// counted their in-memory size against a limit of the frame's size and refused it).
    #[test]
    fn an_append_of_many_small_entries_decodes() {
        let mut m = Message::default();
        m.set_msg_type(MessageType::MsgAppend);
        m.to = 2;
        m.from = 1;
        m.term = 3;
        m.index = 9;
        let entries: Vec<Entry> = (0..8_000u64)
            .map(|i| {
                let mut e = Entry::default();
                e.index = 10 + i;
                e.term = 3;
                e.data = Bytes::from_static(b"\x01");
                e
            })
            .collect();
        m.set_entries(entries.into());
        for with_data in [true, false] {
            let body = Body::Raft {
                msg: to_wire(&m, with_data),
                ring: None,
            };
            let mut buf = Vec::new();
            encode(7, &body, &mut buf).unwrap();
            assert!(buf.len() < MAX_BODY_BYTES);
            assert_eq!(decode(7, &buf).unwrap(), body, "with data: {with_data}");
        }
    }

    #[test]
    fn frames_round_trip() {
        let mut buf = Vec::new();
        encode(7, &sample(), &mut buf).unwrap();
        let back = decode(7, &buf).unwrap();
        assert_eq!(back, sample());
        let Body::Raft { msg, .. } = back else {
            panic!()
        };
        let m = from_wire(msg).unwrap();
        assert_eq!(m.get_msg_type(), MessageType::MsgAppend);
        assert_eq!(&m.entries[0].data[..], b"\x01hello");
    }

    #[test]
    fn snapshot_chunks_and_metadata_round_trip_and_fit_a_frame() {
        let Body::Raft { msg, .. } = sample() else {
            unreachable!()
        };
        let chunk = Body::SnapshotChunk {
            index: 9,
            term: 2,
            offset: SNAPSHOT_CHUNK_BYTES as u64,
            total: 3 * SNAPSHOT_CHUNK_BYTES as u64,
            data: vec![0xAB; SNAPSHOT_CHUNK_BYTES],
        };
        let snap = Body::Snapshot {
            msg,
            meta: WireSnapshotMeta {
                index: 9,
                term: 2,
                voters: vec![1, 2, 3],
                learners: vec![4],
                voters_outgoing: vec![],
                learners_next: vec![],
                auto_leave: false,
                data_len: 3 * SNAPSHOT_CHUNK_BYTES as u64,
            },
        };
        let answer = Body::TermAnswer {
            term: 41,
            conf_as_of: 9,
            voters: vec![1, 2, 3],
        };
        for body in [chunk, snap, Body::TermQuery, answer] {
            let mut buf = Vec::new();
            encode(7, &body, &mut buf).unwrap();
            assert!(buf.len() <= fabric::MAX_MESSAGE_BYTES);
            assert_eq!(decode(7, &buf).unwrap(), body);
        }
    }

    #[test]
    fn wrong_cluster_version_magic_and_length_are_rejected() {
        let mut buf = Vec::new();
        encode(7, &sample(), &mut buf).unwrap();
        assert!(matches!(
            decode(8, &buf),
            Err(WireError::Cluster {
                found: 7,
                expected: 8
            })
        ));
        let mut v = buf.clone();
        v[2] = 99;
        assert!(matches!(
            decode(7, &v),
            Err(WireError::Version { found: 99 })
        ));
        let mut v = buf.clone();
        v[0] = b'X';
        assert!(matches!(decode(7, &v), Err(WireError::BadMagic { .. })));
        let mut v = buf.clone();
        v[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(decode(7, &v), Err(WireError::TooLarge { .. })));
        assert!(matches!(
            decode(7, &buf[..buf.len() - 1]),
            Err(WireError::Truncated { .. })
        ));
        assert!(matches!(
            decode(7, &buf[..5]),
            Err(WireError::Truncated { .. })
        ));
    }

    #[test]
    fn unknown_enum_values_are_rejected() {
        let Body::Raft { mut msg, .. } = sample() else {
            panic!()
        };
        msg.msg_type = 999;
        assert!(from_wire(msg).is_err());
    }

    #[test]
    fn random_bytes_never_panic() {
        // A valid header (this build's version, our cluster, the body's length) before
        // random bodies, so that they reach the body decoder; every other body starts with a
        // valid variant, so that they get past its first byte.
        let mut x = 0x1234_5678_9abc_def0u64;
        let mut reached_the_body = 0;
        for len in 0..400 {
            let mut v = Vec::with_capacity(len + HEADER_BYTES);
            v.extend_from_slice(&MAGIC);
            v.push(WIRE_VERSION);
            v.push(0);
            v.extend_from_slice(&(len as u32).to_le_bytes());
            v.extend_from_slice(&7u64.to_le_bytes());
            for _ in 0..len {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                v.push(x as u8);
            }
            if len % 2 == 1 {
                v[HEADER_BYTES] %= 4;
            }
            match decode(7, &v) {
                Ok(_) | Err(WireError::Body(_)) => reached_the_body += 1,
                Err(WireError::Truncated { .. }) if len == 0 => {}
                Err(e) => panic!("a random body of {len} bytes was refused by its header: {e}"),
            }
        }
        assert!(reached_the_body >= 399, "{reached_the_body}");
    }

    #[test]
    fn mutated_frames_decode_or_fail_cleanly() {
        let mut frame = Vec::new();
        encode(7, &sample(), &mut frame).unwrap();
        let mut x = 0x0bad_5eed_u64;
        for _ in 0..2000 {
            let mut v = frame.clone();
            for _ in 0..1 + x % 3 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let at = HEADER_BYTES + (x as usize >> 8) % (v.len() - HEADER_BYTES);
                v[at] = x as u8;
            }
            if let Ok(Body::Raft { msg, .. }) = decode(7, &v) {
                let _ = from_wire(msg);
            }
        }
    }
}
