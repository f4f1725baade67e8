//! The hot path's codec for the two bodies every commit sends: [`Body::Raft`] and
//! [`Body::FastAppend`]. It writes and reads the bytes bincode's derive does for the same
//! values (the format's definition stays the derived [`super::encode`] /
//! [`super::decode`]), but straight from and into raft's [`Message`]: no
//! [`WireMessage`](super::WireMessage) in between, no generic reader or writer, no entries
//! vector built twice. It took the three replicas' work per 64 B commit from 66,317 to 59,191
//! instructions (benches/RESULTS.md, "The wire's hand codec").
//!
//! The bincode 2 `standard()` encoding, little-endian, as used here:
//! - an unsigned integer is one byte below 251, else 251 then a `u16`, 252 then a `u32`, or
//!   253 then a `u64` (a decoder takes any of these forms whose value fits the type, as
//!   bincode does; a `u32` refuses the 253 form);
//! - a signed one is zigzagged first (`v >= 0`: `2v`; `v < 0`: `!v * 2 + 1`);
//! - a `bool` and an `Option`'s tag are one byte, 0 or 1;
//! - a `Vec` is its length as a `u64`, then its elements;
//! - an enum is its variant's index as a `u32`, then its fields.
//!
//! `tests` below prove both directions against the derive: equal bytes for every message
//! encoded, and for every frame (valid, random, mutated) the same verdict and the same
//! message decoded.

use bytes::Bytes;
use protobuf::ProtobufEnum;
use raft::prelude::{Entry, EntryType, Message, MessageType};

use super::{Body, RingInfo, WireError, WireSnapshotMeta};

/// Variant indexes of [`Body`], in declaration order.
const RAFT: u32 = 0;
const FAST_APPEND: u32 = 1;
const SNAPSHOT_CHUNK: u32 = 2;
const SNAPSHOT: u32 = 3;
const TERM_QUERY: u32 = 4;
const TERM_ANSWER: u32 = 5;

/// The fewest bytes one entry takes in a frame: its type, term, index and data length.
const MIN_ENTRY_BYTES: usize = 4;

/// A decoded frame, with raft's message built.
#[derive(Debug, Clone, PartialEq)]
pub enum Frame {
    /// [`Body::Raft`].
    Raft {
        /// The message.
        msg: Message,
        /// The sender's ring, if it reports one.
        ring: Option<RingInfo>,
    },
    /// [`Body::FastAppend`].
    FastAppend {
        /// The MsgAppend, entries without data.
        msg: Message,
        /// First byte written.
        lsn_start: u64,
        /// End of the bytes written.
        lsn_end: u64,
    },
    /// [`Body::SnapshotChunk`].
    SnapshotChunk {
        /// The snapshot's index.
        index: u64,
        /// The snapshot's term.
        term: u64,
        /// Where these bytes go in the data.
        offset: u64,
        /// Total bytes of the data.
        total: u64,
        /// The bytes.
        data: Vec<u8>,
    },
    /// [`Body::Snapshot`].
    Snapshot {
        /// The MsgSnapshot.
        msg: Message,
        /// The snapshot's metadata.
        meta: WireSnapshotMeta,
    },
    /// [`Body::TermQuery`].
    TermQuery,
    /// [`Body::TermAnswer`].
    TermAnswer {
        /// The sender's term.
        term: u64,
        /// The index its membership is as of.
        conf_as_of: u64,
        /// That membership's voters.
        voters: Vec<u64>,
    },
}

impl Frame {
    /// The frame of a body the derived decoder gave, raft's message converted by
    /// [`super::from_wire`].
    fn from_body(body: Body) -> Result<Frame, WireError> {
        Ok(match body {
            Body::Raft { msg, ring } => Frame::Raft {
                msg: super::from_wire(msg)?,
                ring,
            },
            Body::FastAppend {
                msg,
                lsn_start,
                lsn_end,
            } => Frame::FastAppend {
                msg: super::from_wire(msg)?,
                lsn_start,
                lsn_end,
            },
            Body::SnapshotChunk {
                index,
                term,
                offset,
                total,
                data,
            } => Frame::SnapshotChunk {
                index,
                term,
                offset,
                total,
                data,
            },
            Body::Snapshot { msg, meta } => Frame::Snapshot {
                msg: super::from_wire(msg)?,
                meta,
            },
            Body::TermQuery => Frame::TermQuery,
            Body::TermAnswer {
                term,
                conf_as_of,
                voters,
            } => Frame::TermAnswer {
                term,
                conf_as_of,
                voters,
            },
        })
    }
}

/// Encodes `m` as a [`Body::Raft`] frame, entries with their data, into `out` (cleared
/// first): the bytes of `encode(Body::Raft { msg: to_wire(m, true), ring })`.
pub fn encode_raft(
    cluster_id: u64,
    m: &Message,
    ring: Option<&RingInfo>,
    out: &mut Vec<u8>,
) -> Result<(), WireError> {
    super::start_frame(cluster_id, out);
    put_u32(out, RAFT);
    put_message(out, m, true);
    match ring {
        None => out.push(0),
        Some(r) => {
            out.push(1);
            for v in [
                r.last_index,
                r.last_term,
                r.ring_end,
                r.ring_head,
                r.persisted_index,
            ] {
                put_u64(out, v);
            }
        }
    }
    super::finish_frame(out)
}

/// Encodes `m` as a [`Body::FastAppend`] frame, entries without their data, into `out`
/// (cleared first): the bytes of `encode(Body::FastAppend { msg: to_wire(m, false), .. })`.
pub fn encode_fast_append(
    cluster_id: u64,
    m: &Message,
    lsn_start: u64,
    lsn_end: u64,
    out: &mut Vec<u8>,
) -> Result<(), WireError> {
    encode_fast_append_of(
        cluster_id,
        m,
        (m.index, m.log_term),
        &m.entries,
        lsn_start,
        lsn_end,
        out,
    )
}

/// [`encode_fast_append`] of `m` cut down to its last entry, the entry before it (or `m`'s
/// own `index`/`log_term` for one entry) as the message's `index` and `log_term`: a
/// `Replicated` leader's descriptor, which a follower answers for the whole batch (see
/// `Replica::try_fast_append`). `m` must carry entries.
pub fn encode_fast_append_last(
    cluster_id: u64,
    m: &Message,
    lsn_start: u64,
    lsn_end: u64,
    out: &mut Vec<u8>,
) -> Result<(), WireError> {
    let entries = m.entries.as_slice();
    let n = entries.len();
    debug_assert!(n > 0, "a descriptor of no entry");
    let prev = match n {
        0 | 1 => (m.index, m.log_term),
        _ => (entries[n - 2].index, entries[n - 2].term),
    };
    let last = &entries[n.saturating_sub(1)..];
    encode_fast_append_of(cluster_id, m, prev, last, lsn_start, lsn_end, out)
}

/// [`encode_fast_append`] of `m` as if it carried only `entries` after the entry `prev`
/// (index, term).
fn encode_fast_append_of(
    cluster_id: u64,
    m: &Message,
    prev: (u64, u64),
    entries: &[Entry],
    lsn_start: u64,
    lsn_end: u64,
    out: &mut Vec<u8>,
) -> Result<(), WireError> {
    super::start_frame(cluster_id, out);
    put_u32(out, FAST_APPEND);
    put_message_of(out, m, prev, entries, false);
    put_u64(out, lsn_start);
    put_u64(out, lsn_end);
    super::finish_frame(out)
}

/// Checks the header and decodes the body: accepts exactly what [`super::decode`] followed by
/// [`super::from_wire`] accepts, and gives the same message.
pub fn decode_frame(cluster_id: u64, frame: &[u8]) -> Result<Frame, WireError> {
    let body = super::checked_body(cluster_id, frame)?;
    let mut r = Reader { buf: body, pos: 0 };
    let decoded = match r.u32()? {
        RAFT => {
            let msg = r.message()?;
            let ring = match r.u8()? {
                0 => None,
                1 => Some(RingInfo {
                    last_index: r.u64()?,
                    last_term: r.u64()?,
                    ring_end: r.u64()?,
                    ring_head: r.u64()?,
                    persisted_index: r.u64()?,
                }),
                _ => return Err(Bad::Tag.into()),
            };
            Frame::Raft { msg, ring }
        }
        FAST_APPEND => Frame::FastAppend {
            msg: r.message()?,
            lsn_start: r.u64()?,
            lsn_end: r.u64()?,
        },
        // Snapshots are rare and large, the term exchange rare and small: the derived
        // decoder, then the conversion.
        SNAPSHOT_CHUNK | SNAPSHOT | TERM_QUERY | TERM_ANSWER => {
            return Frame::from_body(super::decode(cluster_id, frame)?);
        }
        _ => return Err(WireError::Body("unknown body variant".into())),
    };
    if r.pos != body.len() {
        return Err(WireError::Body(format!(
            "{} trailing bytes",
            body.len() - r.pos
        )));
    }
    Ok(decoded)
}

#[inline]
fn put_u64(out: &mut Vec<u8>, v: u64) {
    if v <= 250 {
        out.push(v as u8);
    } else {
        put_wide_u64(out, v);
    }
}

fn put_wide_u64(out: &mut Vec<u8>, v: u64) {
    if v <= u64::from(u16::MAX) {
        out.push(251);
        out.extend_from_slice(&(v as u16).to_le_bytes());
    } else if v <= u64::from(u32::MAX) {
        out.push(252);
        out.extend_from_slice(&(v as u32).to_le_bytes());
    } else {
        out.push(253);
        out.extend_from_slice(&v.to_le_bytes());
    }
}

#[inline]
fn put_u32(out: &mut Vec<u8>, v: u32) {
    put_u64(out, u64::from(v));
}

fn zigzag(v: i64) -> u64 {
    if v < 0 {
        !(v as u64) * 2 + 1
    } else {
        (v as u64) * 2
    }
}

/// [`zigzag`]'s inverse.
fn unzigzag(n: u64) -> i64 {
    if n % 2 == 0 {
        (n / 2) as i64
    } else {
        !(n / 2) as i64
    }
}

#[inline]
fn put_i32(out: &mut Vec<u8>, v: i32) {
    // A zigzagged i32 fits a u32, so it takes the same forms as a u32.
    put_u64(out, zigzag(i64::from(v)));
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_u64(out, b.len() as u64);
    out.extend_from_slice(b);
}

/// A [`WireMessage`]'s fields, in its declaration order, from raft's message.
fn put_message(out: &mut Vec<u8>, m: &Message, with_data: bool) {
    put_message_of(out, m, (m.index, m.log_term), &m.entries, with_data);
}

/// `m` with `index`/`log_term` from `prev` and `entries` in place of its own.
fn put_message_of(
    out: &mut Vec<u8>,
    m: &Message,
    prev: (u64, u64),
    entries: &[Entry],
    with_data: bool,
) {
    // The fixed fields' widest forms, and each entry's without its data.
    out.reserve(110 + m.context.len() + entries.len() * 30);
    put_i32(out, m.get_msg_type().value());
    let (index, log_term) = prev;
    for v in [
        m.to,
        m.from,
        m.term,
        log_term,
        index,
        m.commit,
        m.commit_term,
    ] {
        put_u64(out, v);
    }
    out.push(u8::from(m.reject));
    put_u64(out, m.reject_hint);
    put_u64(out, m.request_snapshot);
    put_u64(out, zigzag(m.priority));
    put_bytes(out, &m.context);
    put_u64(out, entries.len() as u64);
    for e in entries {
        put_i32(out, e.get_entry_type().value());
        put_u64(out, e.term);
        put_u64(out, e.index);
        if with_data {
            put_bytes(out, &e.data);
        } else {
            out.push(0);
        }
    }
}

/// Why a body did not decode; small and `Copy`, so that every read returns in registers, and
/// made a [`WireError`] once, at the end.
#[derive(Clone, Copy, Debug)]
enum Bad {
    /// The body ends inside a value.
    Short,
    /// An integer, bool or option tag no encoder writes.
    Tag,
    /// An enum value raft does not know.
    Field(&'static str),
}

impl From<Bad> for WireError {
    fn from(b: Bad) -> Self {
        match b {
            Bad::Short => WireError::Body("unexpected end of body".into()),
            Bad::Tag => WireError::Body("bad integer, bool or option tag".into()),
            Bad::Field(f) => WireError::Field(f),
        }
    }
}

/// Reads a body; every read is bounds-checked.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    #[inline]
    fn take(&mut self, n: usize) -> Result<&'a [u8], Bad> {
        let end = self.pos.checked_add(n).ok_or(Bad::Short)?;
        let s = self.buf.get(self.pos..end).ok_or(Bad::Short)?;
        self.pos = end;
        Ok(s)
    }

    #[inline]
    fn u8(&mut self) -> Result<u8, Bad> {
        let b = *self.buf.get(self.pos).ok_or(Bad::Short)?;
        self.pos += 1;
        Ok(b)
    }

    #[inline]
    fn array<const N: usize>(&mut self) -> Result<[u8; N], Bad> {
        Ok(self.take(N)?.try_into().expect("N bytes"))
    }

    /// A varint: one byte below 251, else a tag and 2, 4 or 8 bytes.
    #[inline]
    fn u64(&mut self) -> Result<u64, Bad> {
        match self.u8()? {
            b @ 0..=250 => Ok(u64::from(b)),
            tag => self.wide_u64(tag),
        }
    }

    fn wide_u64(&mut self, tag: u8) -> Result<u64, Bad> {
        Ok(match tag {
            251 => u64::from(u16::from_le_bytes(self.array()?)),
            252 => u64::from(u32::from_le_bytes(self.array()?)),
            253 => u64::from_le_bytes(self.array()?),
            _ => return Err(Bad::Tag),
        })
    }

    #[inline]
    fn u32(&mut self) -> Result<u32, Bad> {
        Ok(match self.u8()? {
            b @ 0..=250 => u32::from(b),
            251 => u32::from(u16::from_le_bytes(self.array()?)),
            252 => u32::from_le_bytes(self.array()?),
            _ => return Err(Bad::Tag),
        })
    }

    /// A zigzagged `u32` form; its value always fits an `i32`.
    #[inline]
    fn i32(&mut self) -> Result<i32, Bad> {
        Ok(unzigzag(u64::from(self.u32()?)) as i32)
    }

    #[inline]
    fn i64(&mut self) -> Result<i64, Bad> {
        Ok(unzigzag(self.u64()?))
    }

    #[inline]
    fn bool(&mut self) -> Result<bool, Bad> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(Bad::Tag),
        }
    }

    /// A length-prefixed byte string, as `Bytes` (empty ones allocate nothing).
    #[inline]
    fn bytes(&mut self) -> Result<Bytes, Bad> {
        let len = self.u64()?;
        let len = usize::try_from(len).map_err(|_| Bad::Short)?;
        let b = self.take(len)?;
        Ok(if b.is_empty() {
            Bytes::new()
        } else {
            Bytes::copy_from_slice(b)
        })
    }

    fn message(&mut self) -> Result<Message, Bad> {
        let mut m = Message::default();
        m.set_msg_type(MessageType::from_i32(self.i32()?).ok_or(Bad::Field("message type"))?);
        m.to = self.u64()?;
        m.from = self.u64()?;
        m.term = self.u64()?;
        m.log_term = self.u64()?;
        m.index = self.u64()?;
        m.commit = self.u64()?;
        m.commit_term = self.u64()?;
        m.reject = self.bool()?;
        m.reject_hint = self.u64()?;
        m.request_snapshot = self.u64()?;
        m.priority = self.i64()?;
        m.context = self.bytes()?;
        let n = self.u64()?;
        // Every entry takes at least MIN_ENTRY_BYTES, so a count the body cannot hold is
        // refused before anything is reserved for it.
        let n = usize::try_from(n)
            .ok()
            .filter(|&n| n <= (self.buf.len() - self.pos) / MIN_ENTRY_BYTES)
            .ok_or(Bad::Short)?;
        let mut entries = Vec::with_capacity(n);
        for _ in 0..n {
            let mut e = Entry::default();
            e.set_entry_type(EntryType::from_i32(self.i32()?).ok_or(Bad::Field("entry type"))?);
            e.term = self.u64()?;
            e.index = self.u64()?;
            e.data = self.bytes()?;
            entries.push(e);
        }
        m.set_entries(entries.into());
        Ok(m)
    }
}

/// What the derived decoder and the conversion give for `frame`: the reference
/// [`decode_frame`] is tested against.
#[cfg(test)]
fn reference(cluster_id: u64, frame: &[u8]) -> Result<Frame, WireError> {
    Frame::from_body(super::decode(cluster_id, frame)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{WireMessage, encode, to_wire};

    const CLUSTER: u64 = 0x5eed;

    /// A xorshift stream, so the cases are the same on every run.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        /// A value near one of the varint forms' edges, or anywhere.
        fn int(&mut self) -> u64 {
            const EDGES: [u64; 9] = [
                0,
                250,
                251,
                u16::MAX as u64,
                u16::MAX as u64 + 1,
                u32::MAX as u64,
                u32::MAX as u64 + 1,
                u64::MAX - 1,
                u64::MAX,
            ];
            match self.next() % 4 {
                0 => EDGES[(self.next() % EDGES.len() as u64) as usize],
                1 => self.next() % 300,
                2 => self.next() >> (self.next() % 64),
                _ => self.next(),
            }
        }

        fn bytes(&mut self, max: u64) -> Bytes {
            let n = self.next() % (max + 1);
            (0..n).map(|_| self.next() as u8).collect::<Vec<_>>().into()
        }
    }

    fn message(rng: &mut Rng) -> Message {
        let mut m = Message::default();
        let types = MessageType::values();
        m.set_msg_type(types[(rng.next() % types.len() as u64) as usize]);
        m.to = rng.int();
        m.from = rng.int();
        m.term = rng.int();
        m.log_term = rng.int();
        m.index = rng.int();
        m.commit = rng.int();
        m.commit_term = rng.int();
        m.reject = rng.next() % 2 == 0;
        m.reject_hint = rng.int();
        m.request_snapshot = rng.int();
        m.priority = rng.int() as i64;
        m.context = if rng.next() % 3 == 0 {
            rng.bytes(300)
        } else {
            Bytes::new()
        };
        let n = [0, 1, 2, 7, 300][(rng.next() % 5) as usize];
        let entries: Vec<Entry> = (0..n)
            .map(|_| {
                let mut e = Entry::default();
                let kinds = EntryType::values();
                e.set_entry_type(kinds[(rng.next() % kinds.len() as u64) as usize]);
                e.term = rng.int();
                e.index = rng.int();
                let max = if rng.next() % 8 == 0 { 70_000 } else { 64 };
                e.data = rng.bytes(max);
                e
            })
            .collect();
        m.set_entries(entries.into());
        m
    }

    fn ring(rng: &mut Rng) -> Option<RingInfo> {
        (rng.next() % 2 == 0).then(|| RingInfo {
            last_index: rng.int(),
            last_term: rng.int(),
            ring_end: rng.int(),
            ring_head: rng.int(),
            persisted_index: rng.int(),
        })
    }

    /// Frames of every kind from the hand encoder, each checked byte for byte against the
    /// derived one.
    fn frames(count: usize) -> Vec<Vec<u8>> {
        let mut rng = Rng(0x0dd_ba11);
        let mut out = Vec::new();
        while out.len() < count {
            let m = message(&mut rng);
            let r = ring(&mut rng);
            let (mut hand, mut derived) = (Vec::new(), Vec::new());
            let lsn = (rng.int(), rng.int());
            let (got, want) = if rng.next() % 2 == 0 {
                (
                    encode_raft(CLUSTER, &m, r.as_ref(), &mut hand),
                    encode(
                        CLUSTER,
                        &Body::Raft {
                            msg: to_wire(&m, true),
                            ring: r,
                        },
                        &mut derived,
                    ),
                )
            } else {
                (
                    encode_fast_append(CLUSTER, &m, lsn.0, lsn.1, &mut hand),
                    encode(
                        CLUSTER,
                        &Body::FastAppend {
                            msg: to_wire(&m, false),
                            lsn_start: lsn.0,
                            lsn_end: lsn.1,
                        },
                        &mut derived,
                    ),
                )
            };
            assert_eq!(got.is_ok(), want.is_ok(), "{m:?}");
            if got.is_ok() {
                assert_eq!(hand, derived, "{m:?}");
                out.push(hand);
            }
        }
        out
    }

    fn same_verdict(frame: &[u8]) -> bool {
        let (got, want) = (decode_frame(CLUSTER, frame), reference(CLUSTER, frame));
        match (&got, &want) {
            (Ok(a), Ok(b)) => assert_eq!(a, b),
            (Err(_), Err(_)) => {}
            _ => panic!("decode_frame gave {got:?}, the derived decoder {want:?} for {frame:?}"),
        }
        got.is_ok()
    }

    /// A `Replicated` descriptor of a batch's last entry: the bytes of the whole message with
    /// `index`/`log_term` and the entries replaced, and it decodes to exactly that message.
    #[test]
    fn a_descriptor_of_part_of_a_message_is_that_message_cut_down() {
        let mut rng = Rng(0x5eed_cafe);
        let mut checked = 0;
        for _ in 0..100 {
            let mut m = message(&mut rng);
            if m.entries.is_empty() {
                continue;
            }
            let n = m.entries.len();
            let prev = match n {
                1 => (m.index, m.log_term),
                _ => (m.entries[n - 2].index, m.entries[n - 2].term),
            };
            let lsn = (rng.int(), rng.int());
            let mut thin = Vec::new();
            let got = encode_fast_append_last(CLUSTER, &m, lsn.0, lsn.1, &mut thin);
            m.index = prev.0;
            m.log_term = prev.1;
            let last = m.entries[n - 1].clone();
            m.set_entries(vec![last].into());
            let mut whole = Vec::new();
            let want = encode_fast_append(CLUSTER, &m, lsn.0, lsn.1, &mut whole);
            assert_eq!(got.is_ok(), want.is_ok(), "{m:?}");
            if want.is_err() {
                continue;
            }
            assert_eq!(thin, whole, "{m:?}");
            match decode_frame(CLUSTER, &thin).expect("a descriptor decodes") {
                Frame::FastAppend {
                    msg,
                    lsn_start,
                    lsn_end,
                } => {
                    assert_eq!((lsn_start, lsn_end), lsn);
                    assert_eq!((msg.index, msg.log_term), prev);
                    assert_eq!(msg.entries.len(), 1);
                    let (e, want) = (&msg.entries[0], &m.entries[0]);
                    assert_eq!(
                        (e.index, e.term, e.get_entry_type()),
                        (want.index, want.term, want.get_entry_type())
                    );
                    assert!(e.data.is_empty(), "a descriptor carries no payload");
                }
                other => panic!("a descriptor decoded as {other:?}"),
            }
            checked += 1;
        }
        assert!(
            checked >= 20,
            "only {checked} messages with entries were drawn"
        );
    }

    #[test]
    fn the_hand_encoder_writes_the_derived_bytes_and_they_decode_the_same() {
        for f in frames(400) {
            assert!(same_verdict(&f));
        }
    }

    #[test]
    fn mutated_truncated_and_random_bodies_get_the_derived_verdict() {
        let mut rng = Rng(0xfeed_f00d);
        let mut accepted = 0;
        for f in frames(200) {
            for _ in 0..40 {
                let mut v = f.clone();
                for _ in 0..1 + rng.next() % 3 {
                    let at = super::super::HEADER_BYTES
                        + (rng.next() as usize) % (v.len() - super::super::HEADER_BYTES);
                    v[at] = rng.next() as u8;
                }
                accepted += usize::from(same_verdict(&v));
            }
            // Shorter bodies under a header that still claims their length.
            let cut = super::super::HEADER_BYTES
                + (rng.next() as usize) % (f.len() - super::super::HEADER_BYTES);
            let mut v = f[..cut].to_vec();
            v[4..8].copy_from_slice(&((cut - super::super::HEADER_BYTES) as u32).to_le_bytes());
            same_verdict(&v);
        }
        for len in 0..2000usize {
            let mut v = Vec::new();
            super::super::start_frame(CLUSTER, &mut v);
            for _ in 0..len {
                v.push(rng.next() as u8);
            }
            if let Some(b) = v.get_mut(super::super::HEADER_BYTES) {
                *b %= 5;
            }
            super::super::finish_frame(&mut v).unwrap();
            same_verdict(&v);
        }
        assert!(
            accepted > 1000,
            "mutations kept few frames valid: {accepted}"
        );
    }

    #[test]
    fn snapshot_frames_decode_through_the_derived_decoder() {
        let mut rng = Rng(7);
        let mut m = message(&mut rng);
        m.set_msg_type(MessageType::MsgSnapshot);
        let meta = WireSnapshotMeta {
            index: 9,
            term: 2,
            voters: vec![1, 2, 3],
            learners: vec![],
            voters_outgoing: vec![],
            learners_next: vec![4],
            auto_leave: false,
            data_len: 10,
        };
        let chunk = Body::SnapshotChunk {
            index: 9,
            term: 2,
            offset: 0,
            total: 10,
            data: vec![7; 10],
        };
        let snap = Body::Snapshot {
            msg: to_wire(&m, false),
            meta,
        };
        let query = Body::TermQuery;
        let answer = Body::TermAnswer {
            term: u64::MAX,
            conf_as_of: 3,
            voters: vec![1, 2, 3],
        };
        for body in [chunk, snap, query, answer] {
            let mut buf = Vec::new();
            encode(CLUSTER, &body, &mut buf).unwrap();
            assert!(same_verdict(&buf));
        }
    }

    /// The type [`WireMessage`] still names the format: the hand codec's field order is its.
    #[test]
    fn the_wire_message_is_what_the_hand_codec_writes() {
        let mut rng = Rng(11);
        let m = message(&mut rng);
        let w: WireMessage = to_wire(&m, true);
        assert_eq!(super::super::from_wire(w).unwrap(), m);
    }
}
