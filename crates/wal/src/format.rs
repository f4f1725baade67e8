//! Byte-exact record and segment formats, and the placement rule. See docs/FORMAT.md.
//!
//! Every decoder here bounds each length by the bytes that remain and returns a
//! [`DecodeError`]; none panics on any input (the fuzz targets and `tests/decode_fuzz.rs`
//! check that).

use crate::{Index, Lsn, Term};

/// Size of a record header in bytes. 32 keeps every header field naturally aligned and makes
/// a header exactly four 8-byte ring words.
pub const HEADER_BYTES: usize = 32;
/// Records start on 8-byte boundaries so that header fields are aligned in memory and the ring
/// can be moved as whole 64-bit words.
pub const RECORD_ALIGN_BYTES: usize = 8;
/// The record format version written in byte 28 of every header. Bump on any layout change.
pub const RECORD_VERSION: u8 = 1;
/// Hard upper bound on a payload, whatever the block size: 64 MiB minus the header, so that a
/// record fits the largest block ([`MAX_BLOCK_BYTES`]).
pub const MAX_PAYLOAD_BYTES: usize = MAX_BLOCK_BYTES as usize - HEADER_BYTES;
/// Smallest block: two headers, so a block always holds a record with a non-empty payload.
/// Only tests use blocks this small.
pub const MIN_BLOCK_BYTES: u64 = 64;
/// Largest block: 64 MiB, which bounds a single record and thus every buffer a reader needs.
pub const MAX_BLOCK_BYTES: u64 = 64 << 20;

/// Segment file magic, bytes 0..8 of a segment header.
pub const SEGMENT_MAGIC: [u8; 8] = *b"RDMALOG\0";
/// Segment header format version.
pub const SEGMENT_VERSION: u32 = 1;
/// Bytes of the encoded segment header (the rest of the header page is zero).
pub const SEGMENT_HEADER_BYTES: usize = 64;
/// Data begins one 4 KiB page into the file, so that data stays page-aligned for a later
/// O_DIRECT writer and the header page is written once.
pub const SEGMENT_DATA_OFFSET: u64 = 4096;

const _: () = assert!(HEADER_BYTES == 32);
const _: () = assert!(HEADER_BYTES % RECORD_ALIGN_BYTES == 0);
const _: () = assert!(SEGMENT_HEADER_BYTES as u64 <= SEGMENT_DATA_OFFSET);
const _: () = assert!(MIN_BLOCK_BYTES >= 2 * HEADER_BYTES as u64);
const _: () = assert!(MAX_BLOCK_BYTES.is_power_of_two() && MIN_BLOCK_BYTES.is_power_of_two());

/// Byte offsets of the record header's fields (docs/FORMAT.md, section 2). Only
/// [`EntryHeader::encode`], [`RawHeader::read`] and the checksum writer use them.
const RECORD_CRC_OFFSET: usize = 0;
const RECORD_PAYLOAD_LEN_OFFSET: usize = 4;
const RECORD_INDEX_OFFSET: usize = 8;
const RECORD_TERM_OFFSET: usize = 16;
const RECORD_LSN_LOW_OFFSET: usize = 24;
const RECORD_VERSION_OFFSET: usize = 28;
const RECORD_KIND_OFFSET: usize = 29;
const RECORD_RESERVED_OFFSET: usize = 30;
const _: () = assert!(RECORD_RESERVED_OFFSET + 2 == HEADER_BYTES);

/// Byte offsets of the segment header's fields (docs/FORMAT.md, section 3). Public so that
/// `inspect` can point at the field that is wrong.
pub const SEGMENT_VERSION_OFFSET: usize = 8;
/// See [`SEGMENT_VERSION_OFFSET`].
pub const SEGMENT_BLOCK_BYTES_OFFSET: usize = 12;
/// See [`SEGMENT_VERSION_OFFSET`].
pub const SEGMENT_CLUSTER_ID_OFFSET: usize = 16;
/// See [`SEGMENT_VERSION_OFFSET`].
pub const SEGMENT_FIRST_INDEX_OFFSET: usize = 24;
/// See [`SEGMENT_VERSION_OFFSET`].
pub const SEGMENT_FIRST_LSN_OFFSET: usize = 32;
/// See [`SEGMENT_VERSION_OFFSET`].
pub const SEGMENT_PREV_TERM_OFFSET: usize = 40;
/// See [`SEGMENT_VERSION_OFFSET`].
pub const SEGMENT_DATA_BYTES_OFFSET: usize = 48;
/// See [`SEGMENT_VERSION_OFFSET`].
pub const SEGMENT_WINDOW_BYTES_OFFSET: usize = 56;
/// See [`SEGMENT_VERSION_OFFSET`]; the crc covers every byte before it.
pub const SEGMENT_CRC_OFFSET: usize = 60;
const _: () = assert!(SEGMENT_CRC_OFFSET + 4 == SEGMENT_HEADER_BYTES);

/// What a record holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum RecordKind {
    /// A raft entry: `index` and `term` are meaningful, the checksum covers the payload.
    Entry = 1,
    /// Filler to the end of a block. `index`/`term` repeat the previous entry's; the checksum
    /// covers the header only and the payload bytes are don't-care.
    Padding = 2,
    /// Filler at the very start of a log that begins mid-block (a follower's log restarted
    /// after a snapshot, at the leader's position): from the first segment's block-aligned
    /// first Lsn to where the log continues. `index`/`term` are the snapshot's; the checksum
    /// covers the header only. Valid only as the first record of the first segment.
    Start = 3,
}

/// A decoded record header (docs/FORMAT.md, "Record header").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntryHeader {
    /// crc32c over header bytes 4..32 and then, for an entry, the payload.
    pub crc: u32,
    /// Payload length in bytes, excluding header and alignment padding.
    pub payload_len: u32,
    /// Raft index (for padding: the previous entry's).
    pub index: Index,
    /// Raft term (for padding: the previous entry's).
    pub term: Term,
    /// Low 32 bits of the record's own Lsn: a record copied to the wrong place, or a stale
    /// record from an earlier lap of the ring, fails this check.
    pub lsn_low: u32,
    /// Record kind.
    pub kind: RecordKind,
}

/// A record header's fields as its bytes hold them, before any check: the one reader of
/// record header bytes. A reader that copies a record out of memory someone else writes (a
/// ring) reads the header first, to learn how many payload bytes it claims or whether it is
/// padding to skip, and only then copies and decodes the record with [`decode_record`]. Every
/// field is unchecked: bound `claimed_len` before using it. [`EntryHeader::decode`] checks a
/// `RawHeader`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawHeader {
    /// The stored crc32c.
    pub crc: u32,
    /// The payload length the header claims.
    pub claimed_len: u32,
    /// The raft index field.
    pub index: Index,
    /// The raft term field.
    pub term: Term,
    /// The low 32 bits of the Lsn the record claims to sit at.
    pub lsn_low: u32,
    /// The version byte.
    pub version: u8,
    /// The kind byte; [`RawHeader::kind`] names it.
    pub kind_byte: u8,
    /// The reserved bytes, zero in a valid header.
    pub reserved: [u8; 2],
}

impl RawHeader {
    /// Reads the fields of `bytes`; never fails.
    pub fn read(bytes: &[u8; HEADER_BYTES]) -> Self {
        Self {
            crc: u32_at(bytes, RECORD_CRC_OFFSET),
            claimed_len: u32_at(bytes, RECORD_PAYLOAD_LEN_OFFSET),
            index: Index(u64_at(bytes, RECORD_INDEX_OFFSET)),
            term: Term(u64_at(bytes, RECORD_TERM_OFFSET)),
            lsn_low: u32_at(bytes, RECORD_LSN_LOW_OFFSET),
            version: bytes[RECORD_VERSION_OFFSET],
            kind_byte: bytes[RECORD_KIND_OFFSET],
            reserved: [
                bytes[RECORD_RESERVED_OFFSET],
                bytes[RECORD_RESERVED_OFFSET + 1],
            ],
        }
    }

    /// The kind the kind byte names, if it names one.
    pub fn kind(&self) -> Option<RecordKind> {
        match self.kind_byte {
            1 => Some(RecordKind::Entry),
            2 => Some(RecordKind::Padding),
            3 => Some(RecordKind::Start),
            _ => None,
        }
    }

    /// Bytes to copy for this record, header included, when `available` bytes remain (in the
    /// block, or before the end of a range): the header plus the claimed payload, bounded by
    /// `available`. A lying length therefore never makes a reader copy more than it has.
    pub fn copy_len(&self, available: usize) -> usize {
        (HEADER_BYTES + self.claimed_len as usize).min(available)
    }
}

/// Why a byte range is not a valid record or segment header. Carried as the `#[source]` of a
/// [`crate::WalError`]; the decoder itself needs no context, so it gets this small enum.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// Fewer bytes remain than the structure needs.
    #[error("only {available} bytes remain where {needed} are needed")]
    Truncated {
        /// Bytes the structure needs.
        needed: u64,
        /// Bytes that remain.
        available: u64,
    },
    /// The header is all zero: nothing was ever written here.
    #[error("the header is all zero, so no record was written here")]
    Empty,
    /// The version byte is not one this code reads.
    #[error("the record version is {found}, but this code reads version {RECORD_VERSION}")]
    Version {
        /// The version byte found.
        found: u8,
    },
    /// The kind byte is not a known [`RecordKind`].
    #[error("the record kind byte is {found}, which is not a known kind")]
    Kind {
        /// The kind byte found.
        found: u8,
    },
    /// Reserved bytes are not zero.
    #[error("the reserved header bytes are not zero")]
    Reserved,
    /// The payload length is larger than the block allows or than the bytes that remain.
    #[error("the payload length {len} exceeds the {limit} bytes available to it")]
    Length {
        /// The payload length found.
        len: u64,
        /// The bound it broke.
        limit: u64,
    },
    /// The checksum does not match.
    #[error("the crc32c is {found:#010x}, but the bytes hash to {computed:#010x}")]
    Checksum {
        /// The stored checksum.
        found: u32,
        /// The checksum of the bytes.
        computed: u32,
    },
    /// The record names a different Lsn than the one it sits at.
    #[error("the record claims lsn low bits {found:#x}, but it sits at lsn low bits {expected:#x}")]
    Misplaced {
        /// Low 32 bits of the position.
        expected: u32,
        /// Low 32 bits the record holds.
        found: u32,
    },
    /// The entry's index does not follow the previous one.
    #[error("the entry has index {found}, but index {expected} comes next")]
    IndexGap {
        /// The index that must come next.
        expected: u64,
        /// The index found.
        found: u64,
    },
    /// The entry's term is lower than the previous entry's.
    #[error("the entry has term {found}, lower than the previous entry's term {previous}")]
    TermRegressed {
        /// The previous entry's term.
        previous: u64,
        /// The term found.
        found: u64,
    },
    /// A padding record does not end at the block boundary.
    #[error("a padding record ends {found} bytes into the block instead of at its end")]
    Padding {
        /// Where the padding ended, relative to the block start.
        found: u64,
    },
    /// The segment header's magic is wrong.
    #[error("the segment magic is wrong")]
    Magic,
    /// The segment header names an unknown version.
    #[error("the segment version is {found}, but this code reads version {SEGMENT_VERSION}")]
    SegmentVersion {
        /// The version found.
        found: u32,
    },
    /// A segment header field is out of range.
    #[error("the segment header field {field} is out of range")]
    SegmentField {
        /// The field name.
        field: &'static str,
    },
    /// A truncation marker field is not one this code writes.
    #[error("the truncation marker field {field} is invalid")]
    MarkerField {
        /// The field name.
        field: &'static str,
    },
}

/// Bytes a record with `payload_len` bytes of payload occupies: header, payload, padding to
/// [`RECORD_ALIGN_BYTES`].
pub const fn record_bytes(payload_len: usize) -> usize {
    (HEADER_BYTES + payload_len + RECORD_ALIGN_BYTES - 1) & !(RECORD_ALIGN_BYTES - 1)
}

/// The placement rule: where a record of `record_len` bytes goes if the stream ends at `pos`.
/// A record never crosses a multiple of `block_bytes`; if it does not fit in the rest of the
/// current block it starts at the next block, and the gap is filled by a padding record (when
/// the gap holds a header) or skipped implicitly (when it is smaller than a header).
///
/// Precondition: `record_len <= block_bytes`, `pos` is 8-aligned, `block_bytes` a power of two.
pub const fn place(pos: u64, record_len: u64, block_bytes: u64) -> u64 {
    let rest = block_bytes - (pos & (block_bytes - 1));
    if record_len <= rest { pos } else { pos + rest }
}

/// Bytes from `pos` to the end of its block.
pub const fn block_rest(pos: u64, block_bytes: u64) -> u64 {
    block_bytes - (pos & (block_bytes - 1))
}

/// Largest payload a block of `block_bytes` holds.
pub const fn max_payload(block_bytes: u64) -> usize {
    let by_block = block_bytes as usize - HEADER_BYTES;
    if by_block < MAX_PAYLOAD_BYTES {
        by_block
    } else {
        MAX_PAYLOAD_BYTES
    }
}

impl EntryHeader {
    /// Encodes the header with `crc` as given.
    pub fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut out = [0u8; HEADER_BYTES];
        put(&mut out, RECORD_CRC_OFFSET, &self.crc.to_le_bytes());
        put(
            &mut out,
            RECORD_PAYLOAD_LEN_OFFSET,
            &self.payload_len.to_le_bytes(),
        );
        put(&mut out, RECORD_INDEX_OFFSET, &self.index.0.to_le_bytes());
        put(&mut out, RECORD_TERM_OFFSET, &self.term.0.to_le_bytes());
        put(&mut out, RECORD_LSN_LOW_OFFSET, &self.lsn_low.to_le_bytes());
        out[RECORD_VERSION_OFFSET] = RECORD_VERSION;
        out[RECORD_KIND_OFFSET] = self.kind as u8;
        // The reserved bytes stay zero.
        out
    }

    /// Decodes the fields of a header without checking the checksum. Checks version, kind,
    /// reserved bytes and that the payload fits `max_payload_len`.
    pub fn decode(bytes: &[u8; HEADER_BYTES], max_payload_len: u64) -> Result<Self, DecodeError> {
        if bytes.iter().all(|&b| b == 0) {
            return Err(DecodeError::Empty);
        }
        let raw = RawHeader::read(bytes);
        if raw.version != RECORD_VERSION {
            return Err(DecodeError::Version { found: raw.version });
        }
        let kind = raw.kind().ok_or(DecodeError::Kind {
            found: raw.kind_byte,
        })?;
        if raw.reserved != [0, 0] {
            return Err(DecodeError::Reserved);
        }
        if u64::from(raw.claimed_len) > max_payload_len {
            return Err(DecodeError::Length {
                len: raw.claimed_len.into(),
                limit: max_payload_len,
            });
        }
        Ok(Self {
            crc: raw.crc,
            payload_len: raw.claimed_len,
            index: raw.index,
            term: raw.term,
            lsn_low: raw.lsn_low,
            kind,
        })
    }

    /// The checksum this header and `payload` must carry: crc32c of header bytes 4..32, then
    /// (for an entry) the payload.
    pub fn checksum(header: &[u8; HEADER_BYTES], kind: RecordKind, payload: &[u8]) -> u32 {
        // Everything after the crc field itself.
        let crc = crc32c::crc32c(&header[RECORD_CRC_OFFSET + 4..]);
        match kind {
            RecordKind::Entry => crc32c::crc32c_append(crc, payload),
            RecordKind::Padding | RecordKind::Start => crc,
        }
    }

    /// Bytes this record occupies in the stream.
    pub fn record_len(&self) -> u64 {
        record_bytes(self.payload_len as usize) as u64
    }
}

fn put(out: &mut [u8], at: usize, bytes: &[u8]) {
    out[at..at + bytes.len()].copy_from_slice(bytes);
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    let mut word = [0u8; 4];
    word.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(word)
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(word)
}

/// Builds a header for an entry at `lsn` and returns it encoded, with its checksum.
pub fn entry_header(lsn: Lsn, index: Index, term: Term, payload: &[u8]) -> [u8; HEADER_BYTES] {
    let mut bytes = unsealed_entry_header(lsn, index, term, payload.len());
    let crc = EntryHeader::checksum(&bytes, RecordKind::Entry, payload);
    put(&mut bytes, RECORD_CRC_OFFSET, &crc.to_le_bytes());
    bytes
}

/// [`entry_header`] with its crc field zero, for a writer that lays the header and the
/// payload out next to each other and then seals the record with [`seal_entry`]: one
/// checksum call over contiguous bytes instead of two.
pub fn unsealed_entry_header(
    lsn: Lsn,
    index: Index,
    term: Term,
    payload_len: usize,
) -> [u8; HEADER_BYTES] {
    debug_assert!(payload_len <= MAX_PAYLOAD_BYTES);
    EntryHeader {
        crc: 0,
        payload_len: payload_len as u32,
        index,
        term,
        lsn_low: lsn.0 as u32,
        kind: RecordKind::Entry,
    }
    .encode()
}

/// Writes the crc of an entry record laid out as an [`unsealed_entry_header`] followed by its
/// payload (`record` is exactly those bytes): the same crc [`entry_header`] computes.
pub fn seal_entry(record: &mut [u8]) {
    let crc = crc32c::crc32c(&record[RECORD_CRC_OFFSET + 4..]);
    put(record, RECORD_CRC_OFFSET, &crc.to_le_bytes());
}

/// Builds a padding header at `lsn` that fills `gap_bytes` (at least [`HEADER_BYTES`]).
pub fn padding_header(lsn: Lsn, gap_bytes: u64, last: (Index, Term)) -> [u8; HEADER_BYTES] {
    filler_header(RecordKind::Padding, lsn, gap_bytes, last)
}

/// The header of a [`RecordKind::Start`] record of `gap_bytes` (at least a header) at `lsn`
/// (block-aligned), for a log whose entry `last.0 + 1` goes at `lsn + gap_bytes`.
pub fn start_header(lsn: Lsn, gap_bytes: u64, last: (Index, Term)) -> [u8; HEADER_BYTES] {
    filler_header(RecordKind::Start, lsn, gap_bytes, last)
}

fn filler_header(
    kind: RecordKind,
    lsn: Lsn,
    gap_bytes: u64,
    last: (Index, Term),
) -> [u8; HEADER_BYTES] {
    debug_assert!(gap_bytes >= HEADER_BYTES as u64);
    let header = EntryHeader {
        crc: 0,
        payload_len: (gap_bytes - HEADER_BYTES as u64) as u32,
        index: last.0,
        term: last.1,
        lsn_low: lsn.0 as u32,
        kind,
    };
    let mut bytes = header.encode();
    let crc = EntryHeader::checksum(&bytes, kind, &[]);
    put(&mut bytes, RECORD_CRC_OFFSET, &crc.to_le_bytes());
    bytes
}

/// Encodes a whole entry record into `out` (which must hold `record_bytes(payload.len())`
/// bytes) and returns the record length. The alignment tail is zeroed.
pub fn encode_entry(out: &mut [u8], lsn: Lsn, index: Index, term: Term, payload: &[u8]) -> usize {
    let len = record_bytes(payload.len());
    let header = entry_header(lsn, index, term, payload);
    out[..HEADER_BYTES].copy_from_slice(&header);
    out[HEADER_BYTES..HEADER_BYTES + payload.len()].copy_from_slice(payload);
    out[HEADER_BYTES + payload.len()..len].fill(0);
    len
}

/// Encodes padding from `lsn` to the end of its block into `out` (which holds exactly the gap)
/// and returns the gap length. Gaps smaller than a header are left as zeros (implicit skip).
pub fn encode_padding(out: &mut [u8], lsn: Lsn, last: (Index, Term)) -> usize {
    let gap = out.len();
    if gap == 0 {
        // The common case (a record right after the last): not even a call to memset.
        return 0;
    }
    out.fill(0);
    if gap >= HEADER_BYTES {
        out[..HEADER_BYTES].copy_from_slice(&padding_header(lsn, gap as u64, last));
    }
    gap
}

/// One record decoded from a byte slice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decoded<'a> {
    /// The header.
    pub header: EntryHeader,
    /// The payload (empty for padding).
    pub payload: &'a [u8],
    /// Bytes the record occupies, alignment included.
    pub record_len: u64,
}

/// Decodes and verifies the record that starts at `bytes[0]`, which sits at stream position
/// `lsn`. Checks bounds (against the bytes that remain and the block end), version, kind,
/// reserved bytes, the Lsn tag and the checksum. It does not check the index chain; see
/// [`ChainCheck`]. A gap smaller than a header before a block end is not a record; callers use
/// [`block_rest`] to skip it.
pub fn decode_record(bytes: &[u8], lsn: Lsn, block_bytes: u64) -> Result<Decoded<'_>, DecodeError> {
    decode(bytes, lsn, block_bytes, Checksum::Verify)
}

/// [`decode_record`] without the checksum, for the bytes of a record that passed it when it
/// entered this process's private memory (the wal's write buffer, a ring producer's verified
/// copy) and that nothing else writes since: bounds, version, kind, reserved bytes and the Lsn
/// tag are still checked, so a wrong position shows up as an error, never as wrong bytes. Bytes
/// that came from a file, a peer or shared memory go through [`decode_record`].
pub(crate) fn decode_verified(
    bytes: &[u8],
    lsn: Lsn,
    block_bytes: u64,
) -> Result<Decoded<'_>, DecodeError> {
    decode(bytes, lsn, block_bytes, Checksum::Trust)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Checksum {
    Verify,
    Trust,
}

fn decode(
    bytes: &[u8],
    lsn: Lsn,
    block_bytes: u64,
    checksum: Checksum,
) -> Result<Decoded<'_>, DecodeError> {
    let rest = block_rest(lsn.0, block_bytes);
    if bytes.len() < HEADER_BYTES {
        return Err(DecodeError::Truncated {
            needed: HEADER_BYTES as u64,
            available: bytes.len() as u64,
        });
    }
    let mut head = [0u8; HEADER_BYTES];
    head.copy_from_slice(&bytes[..HEADER_BYTES]);
    let limit = rest
        .saturating_sub(HEADER_BYTES as u64)
        .min(MAX_PAYLOAD_BYTES as u64);
    let header = EntryHeader::decode(&head, limit)?;
    if header.lsn_low != lsn.0 as u32 {
        return Err(DecodeError::Misplaced {
            expected: lsn.0 as u32,
            found: header.lsn_low,
        });
    }
    let record_len = header.record_len();
    if header.kind == RecordKind::Padding && record_len != rest {
        return Err(DecodeError::Padding {
            found: (lsn.0 & (block_bytes - 1)) + record_len,
        });
    }
    let payload_end = HEADER_BYTES + header.payload_len as usize;
    let payload = match header.kind {
        RecordKind::Entry => {
            if bytes.len() < payload_end {
                return Err(DecodeError::Truncated {
                    needed: payload_end as u64,
                    available: bytes.len() as u64,
                });
            }
            &bytes[HEADER_BYTES..payload_end]
        }
        RecordKind::Padding | RecordKind::Start => &[],
    };
    let computed = match checksum {
        // The header's bytes after the crc field and the payload lie next to each other
        // here: one call, the same sum as `EntryHeader::checksum`'s two.
        Checksum::Verify => {
            let end = HEADER_BYTES + payload.len();
            crc32c::crc32c(&bytes[RECORD_CRC_OFFSET + 4..end])
        }
        Checksum::Trust => header.crc,
    };
    if computed != header.crc {
        return Err(DecodeError::Checksum {
            found: header.crc,
            computed,
        });
    }
    Ok(Decoded {
        header,
        payload,
        record_len,
    })
}

/// The index chain rule: each entry's index is the previous entry's plus one and its term is
/// not lower. Padding and start records do not advance the chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChainCheck {
    /// The last entry's index.
    pub last_index: Index,
    /// The last entry's term.
    pub last_term: Term,
}

impl ChainCheck {
    /// Checks that `header` may follow and, if so, advances the chain.
    pub fn advance(&mut self, header: &EntryHeader) -> Result<(), DecodeError> {
        if header.kind != RecordKind::Entry {
            return Ok(());
        }
        let expected = self.last_index.0.wrapping_add(1);
        if header.index.0 != expected {
            return Err(DecodeError::IndexGap {
                expected,
                found: header.index.0,
            });
        }
        if header.term < self.last_term {
            return Err(DecodeError::TermRegressed {
                previous: self.last_term.0,
                found: header.term.0,
            });
        }
        self.last_index = header.index;
        self.last_term = header.term;
        Ok(())
    }
}

/// A segment file header (docs/FORMAT.md, "Segment header").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentHeader {
    /// Block size in bytes: the placement rule's unit.
    pub block_bytes: u32,
    /// The cluster this log belongs to; a segment of another cluster is refused.
    pub cluster_id: u64,
    /// Index of the first entry that this segment holds (or will hold).
    pub first_index: Index,
    /// Lsn of the first data byte.
    pub first_lsn: Lsn,
    /// Term of the entry before `first_index`, so the chain can be checked after earlier
    /// segments were deleted by prefix truncation.
    pub prev_term: Term,
    /// Bytes of the data area, a multiple of `block_bytes`.
    pub data_bytes: u64,
    /// The writer's bound on bytes written but not yet fdatasynced (the recovery window).
    pub window_bytes: u32,
}

impl SegmentHeader {
    /// Encodes the header with its checksum.
    pub fn encode(&self) -> [u8; SEGMENT_HEADER_BYTES] {
        let mut out = [0u8; SEGMENT_HEADER_BYTES];
        put(&mut out, 0, &SEGMENT_MAGIC);
        put(
            &mut out,
            SEGMENT_VERSION_OFFSET,
            &SEGMENT_VERSION.to_le_bytes(),
        );
        put(
            &mut out,
            SEGMENT_BLOCK_BYTES_OFFSET,
            &self.block_bytes.to_le_bytes(),
        );
        put(
            &mut out,
            SEGMENT_CLUSTER_ID_OFFSET,
            &self.cluster_id.to_le_bytes(),
        );
        put(
            &mut out,
            SEGMENT_FIRST_INDEX_OFFSET,
            &self.first_index.0.to_le_bytes(),
        );
        put(
            &mut out,
            SEGMENT_FIRST_LSN_OFFSET,
            &self.first_lsn.0.to_le_bytes(),
        );
        put(
            &mut out,
            SEGMENT_PREV_TERM_OFFSET,
            &self.prev_term.0.to_le_bytes(),
        );
        put(
            &mut out,
            SEGMENT_DATA_BYTES_OFFSET,
            &self.data_bytes.to_le_bytes(),
        );
        put(
            &mut out,
            SEGMENT_WINDOW_BYTES_OFFSET,
            &self.window_bytes.to_le_bytes(),
        );
        let crc = crc32c::crc32c(&out[..SEGMENT_CRC_OFFSET]);
        put(&mut out, SEGMENT_CRC_OFFSET, &crc.to_le_bytes());
        out
    }

    /// Decodes and verifies a header: magic, version, checksum and field ranges.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        if bytes.len() < SEGMENT_HEADER_BYTES {
            return Err(DecodeError::Truncated {
                needed: SEGMENT_HEADER_BYTES as u64,
                available: bytes.len() as u64,
            });
        }
        if bytes[..SEGMENT_MAGIC.len()] != SEGMENT_MAGIC {
            return Err(DecodeError::Magic);
        }
        let version = u32_at(bytes, SEGMENT_VERSION_OFFSET);
        if version != SEGMENT_VERSION {
            return Err(DecodeError::SegmentVersion { found: version });
        }
        let computed = crc32c::crc32c(&bytes[..SEGMENT_CRC_OFFSET]);
        let found = u32_at(bytes, SEGMENT_CRC_OFFSET);
        if computed != found {
            return Err(DecodeError::Checksum { found, computed });
        }
        let header = Self {
            block_bytes: u32_at(bytes, SEGMENT_BLOCK_BYTES_OFFSET),
            cluster_id: u64_at(bytes, SEGMENT_CLUSTER_ID_OFFSET),
            first_index: Index(u64_at(bytes, SEGMENT_FIRST_INDEX_OFFSET)),
            first_lsn: Lsn(u64_at(bytes, SEGMENT_FIRST_LSN_OFFSET)),
            prev_term: Term(u64_at(bytes, SEGMENT_PREV_TERM_OFFSET)),
            data_bytes: u64_at(bytes, SEGMENT_DATA_BYTES_OFFSET),
            window_bytes: u32_at(bytes, SEGMENT_WINDOW_BYTES_OFFSET),
        };
        let block = u64::from(header.block_bytes);
        if !block.is_power_of_two() || !(MIN_BLOCK_BYTES..=MAX_BLOCK_BYTES).contains(&block) {
            return Err(DecodeError::SegmentField {
                field: "block_bytes",
            });
        }
        if header.data_bytes == 0 || header.data_bytes % block != 0 || header.data_bytes > (1 << 40)
        {
            return Err(DecodeError::SegmentField {
                field: "data_bytes",
            });
        }
        if header.first_lsn.0 % block != 0
            || header.first_lsn.0.checked_add(header.data_bytes).is_none()
        {
            return Err(DecodeError::SegmentField { field: "first_lsn" });
        }
        if u64::from(header.window_bytes) < block
            || u64::from(header.window_bytes) > header.data_bytes
        {
            return Err(DecodeError::SegmentField {
                field: "window_bytes",
            });
        }
        Ok(header)
    }
}

/// Name of the truncation marker file in the log directory (docs/FORMAT.md, section 3).
pub const TRUNCATION_MARKER_NAME: &str = "wal-truncation";
/// Name of the file a poisoned log leaves when an fdatasync (or a write) of it failed
/// (docs/FORMAT.md, section 5): the page cache may show bytes the disk never got, and no later
/// fdatasync writes them, so the next open rewrites every segment before trusting it. Empty.
pub const SYNC_FAILED_MARKER_NAME: &str = "wal-sync-failed";
/// Truncation marker magic, bytes 0..8 of the marker.
pub const TRUNCATION_MAGIC: [u8; 8] = *b"RLWALCUT";
/// Truncation marker format version.
pub const TRUNCATION_VERSION: u32 = 1;
/// Bytes of an encoded truncation marker: the whole file.
pub const TRUNCATION_MARKER_BYTES: usize = 32;

/// Byte offsets of the truncation marker's fields (docs/FORMAT.md, section 3).
const MARKER_VERSION_OFFSET: usize = 8;
const MARKER_KIND_OFFSET: usize = 12;
const MARKER_KEEP_LSN_OFFSET: usize = 16;
const MARKER_CRC_OFFSET: usize = 24;
const MARKER_RESERVED_OFFSET: usize = 28;
const _: () = assert!(MARKER_RESERVED_OFFSET + 4 == TRUNCATION_MARKER_BYTES);

/// Which operation a truncation marker records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum TruncationKind {
    /// `Wal::truncate_prefix`: the segment at `keep_lsn` and every later one stay.
    Prefix = 1,
    /// `Wal::restart_at`: every segment goes; the new one is created after the marker is
    /// removed.
    Restart = 2,
}

/// The durable record of a deletion in progress (docs/FORMAT.md, section 3): written before a
/// prefix truncation or a restart deletes its first segment, removed once every deletion is
/// durable. Recovery deletes the segments that lie before `keep_lsn` only when a marker says
/// so; any other gap between segments is corruption.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TruncationMarker {
    /// The operation.
    pub kind: TruncationKind,
    /// Segments whose first Lsn is below this are doomed. For a prefix truncation it is the
    /// first Lsn of the first segment kept, which must exist; for a restart, the end of the
    /// old log's last segment.
    pub keep_lsn: Lsn,
}

impl TruncationMarker {
    /// Encodes the marker with its checksum.
    pub fn encode(&self) -> [u8; TRUNCATION_MARKER_BYTES] {
        let mut out = [0u8; TRUNCATION_MARKER_BYTES];
        put(&mut out, 0, &TRUNCATION_MAGIC);
        put(
            &mut out,
            MARKER_VERSION_OFFSET,
            &TRUNCATION_VERSION.to_le_bytes(),
        );
        put(
            &mut out,
            MARKER_KIND_OFFSET,
            &(self.kind as u32).to_le_bytes(),
        );
        put(
            &mut out,
            MARKER_KEEP_LSN_OFFSET,
            &self.keep_lsn.0.to_le_bytes(),
        );
        let crc = crc32c::crc32c(&out[..MARKER_CRC_OFFSET]);
        put(&mut out, MARKER_CRC_OFFSET, &crc.to_le_bytes());
        out
    }

    /// Decodes and verifies a marker: its length, magic, version, checksum, kind and reserved
    /// bytes.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        if bytes.len() != TRUNCATION_MARKER_BYTES {
            return Err(DecodeError::Truncated {
                needed: TRUNCATION_MARKER_BYTES as u64,
                available: bytes.len() as u64,
            });
        }
        if bytes[..TRUNCATION_MAGIC.len()] != TRUNCATION_MAGIC {
            return Err(DecodeError::MarkerField { field: "magic" });
        }
        if u32_at(bytes, MARKER_VERSION_OFFSET) != TRUNCATION_VERSION {
            return Err(DecodeError::MarkerField { field: "version" });
        }
        let computed = crc32c::crc32c(&bytes[..MARKER_CRC_OFFSET]);
        let found = u32_at(bytes, MARKER_CRC_OFFSET);
        if computed != found {
            return Err(DecodeError::Checksum { found, computed });
        }
        let kind = match u32_at(bytes, MARKER_KIND_OFFSET) {
            1 => TruncationKind::Prefix,
            2 => TruncationKind::Restart,
            _ => return Err(DecodeError::MarkerField { field: "kind" }),
        };
        if u32_at(bytes, MARKER_RESERVED_OFFSET) != 0 {
            return Err(DecodeError::MarkerField { field: "reserved" });
        }
        Ok(Self {
            kind,
            keep_lsn: Lsn(u64_at(bytes, MARKER_KEEP_LSN_OFFSET)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_round_trips_and_rejects_every_single_bit_flip() {
        let payload = b"hello, log";
        let lsn = Lsn(4096 + 64);
        let mut buf = vec![0u8; record_bytes(payload.len())];
        let len = encode_entry(&mut buf, lsn, Index(7), Term(3), payload);
        assert_eq!(len, 48);
        let decoded = decode_record(&buf, lsn, 4096).expect("valid record");
        assert_eq!(decoded.payload, payload);
        assert_eq!(decoded.header.index, Index(7));
        assert_eq!(decoded.header.term, Term(3));
        assert_eq!(decoded.record_len, 48);
        for bit in 0..(HEADER_BYTES + payload.len()) * 8 {
            let mut flipped = buf.clone();
            flipped[bit / 8] ^= 1 << (bit % 8);
            assert!(
                decode_record(&flipped, lsn, 4096).is_err(),
                "bit {bit} flip went unnoticed"
            );
        }
    }

    #[test]
    fn raw_header_reads_every_field_that_encode_writes() {
        let payload = [5u8; 20];
        let header = entry_header(Lsn(0x1_0000_0040), Index(9), Term(4), &payload);
        let raw = RawHeader::read(&header);
        assert_eq!(
            (raw.claimed_len, raw.index, raw.term, raw.lsn_low),
            (20, Index(9), Term(4), 0x40)
        );
        assert_eq!(
            (raw.version, raw.kind(), raw.reserved),
            (1, Some(RecordKind::Entry), [0, 0])
        );
        let decoded = EntryHeader::decode(&header, 100).expect("valid header");
        assert_eq!(decoded.crc, raw.crc);
        assert_eq!(raw.copy_len(1000), HEADER_BYTES + 20);
        assert_eq!(raw.copy_len(40), 40, "never more than is available");
        let padding = RawHeader::read(&padding_header(Lsn(64), 64, (Index(9), Term(4))));
        assert_eq!(padding.kind(), Some(RecordKind::Padding));
        let mut unknown = header;
        unknown[RECORD_KIND_OFFSET] = 9;
        assert_eq!(RawHeader::read(&unknown).kind(), None);
    }

    #[test]
    fn a_sealed_record_carries_the_crc_of_entry_header_and_decodes() {
        for len in [0usize, 1, 7, 8, 63, 64, 65, 4096] {
            let payload: Vec<u8> = (0..len).map(|i| (i * 31 + 7) as u8).collect();
            let (lsn, index, term) = (Lsn(0x2_0000_0100), Index(77), Term(3));
            let mut record = unsealed_entry_header(lsn, index, term, len).to_vec();
            record.extend_from_slice(&payload);
            seal_entry(&mut record);
            let summed = entry_header(lsn, index, term, &payload);
            assert_eq!(record[..HEADER_BYTES], summed[..], "payload of {len} bytes");
            record.resize(record_bytes(len), 0);
            let decoded = decode_record(&record, lsn, 1 << 16).expect("a sealed record decodes");
            assert_eq!(decoded.payload, &payload[..]);
            let last_payload_byte = (len > 0).then(|| HEADER_BYTES + len - 1);
            for at in [RECORD_INDEX_OFFSET].into_iter().chain(last_payload_byte) {
                let mut flipped = record.clone();
                flipped[at] ^= 1;
                assert!(
                    matches!(
                        decode_record(&flipped, lsn, 1 << 16),
                        Err(DecodeError::Checksum { .. })
                    ),
                    "byte {at} flipped: the one-call checksum sees it"
                );
            }
        }
    }

    #[test]
    fn misplaced_record_is_refused() {
        let mut buf = vec![0u8; record_bytes(1)];
        encode_entry(&mut buf, Lsn(64), Index(1), Term(1), b"x");
        assert_eq!(
            decode_record(&buf, Lsn(72), 4096).unwrap_err(),
            DecodeError::Misplaced {
                expected: 72,
                found: 64
            }
        );
    }

    #[test]
    fn length_is_bounded_by_block_and_by_remaining_bytes() {
        let mut buf = vec![0u8; record_bytes(100)];
        encode_entry(&mut buf, Lsn(0), Index(1), Term(1), &[1; 100]);
        assert!(matches!(
            decode_record(&buf, Lsn(0), 64),
            Err(DecodeError::Length { .. })
        ));
        assert!(matches!(
            decode_record(&buf[..60], Lsn(0), 4096),
            Err(DecodeError::Truncated { .. })
        ));
        assert_eq!(
            decode_record(&[0u8; 40], Lsn(0), 4096).unwrap_err(),
            DecodeError::Empty
        );
    }

    #[test]
    fn placement_never_crosses_a_block() {
        assert_eq!(place(0, 64, 64), 0);
        assert_eq!(place(8, 64, 64), 64);
        assert_eq!(place(40, 24, 64), 40);
        assert_eq!(place(48, 24, 64), 64);
    }

    #[test]
    fn padding_round_trips() {
        let mut buf = [0u8; 40];
        encode_padding(&mut buf, Lsn(88), (Index(4), Term(2)));
        let decoded = decode_record(&buf, Lsn(88), 128).expect("valid padding");
        assert_eq!(decoded.header.kind, RecordKind::Padding);
        assert_eq!(decoded.record_len, 40);
        assert!(matches!(
            decode_record(&buf, Lsn(88), 256),
            Err(DecodeError::Padding { .. })
        ));
    }

    #[test]
    fn chain_check_refuses_gaps_and_lower_terms() {
        let mut chain = ChainCheck {
            last_index: Index(4),
            last_term: Term(2),
        };
        let mut header = EntryHeader {
            crc: 0,
            payload_len: 0,
            index: Index(5),
            term: Term(2),
            lsn_low: 0,
            kind: RecordKind::Entry,
        };
        chain.advance(&header).expect("next index");
        header.index = Index(7);
        assert!(matches!(
            chain.advance(&header),
            Err(DecodeError::IndexGap { .. })
        ));
        header.index = Index(6);
        header.term = Term(1);
        assert!(matches!(
            chain.advance(&header),
            Err(DecodeError::TermRegressed { .. })
        ));
    }

    #[test]
    fn truncation_marker_round_trips_and_refuses_every_single_bit_flip() {
        for kind in [TruncationKind::Prefix, TruncationKind::Restart] {
            let marker = TruncationMarker {
                kind,
                keep_lsn: Lsn(6144),
            };
            let bytes = marker.encode();
            assert_eq!(TruncationMarker::decode(&bytes), Ok(marker));
            for bit in 0..TRUNCATION_MARKER_BYTES * 8 {
                let mut flipped = bytes;
                flipped[bit / 8] ^= 1 << (bit % 8);
                assert!(
                    TruncationMarker::decode(&flipped).is_err(),
                    "bit {bit} flip went unnoticed"
                );
            }
            assert!(TruncationMarker::decode(&bytes[..31]).is_err());
        }
    }

    #[test]
    fn segment_header_round_trips_and_checks_its_crc() {
        let header = SegmentHeader {
            block_bytes: 4096,
            cluster_id: 9,
            first_index: Index(11),
            first_lsn: Lsn(8192),
            prev_term: Term(2),
            data_bytes: 16384,
            window_bytes: 8192,
        };
        let bytes = header.encode();
        assert_eq!(SegmentHeader::decode(&bytes), Ok(header));
        let mut bad = bytes;
        bad[20] ^= 1;
        assert!(matches!(
            SegmentHeader::decode(&bad),
            Err(DecodeError::Checksum { .. })
        ));
    }

    /// The bytes are where docs/FORMAT.md puts them: the offsets and sizes of its tables
    /// written out here as numbers, not through the constants the code uses, so a constant
    /// changed in the code alone fails this.
    #[test]
    fn the_layout_is_the_documented_one() {
        let le32 = |b: &[u8], at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
        let le64 = |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());

        // Section 2: an entry record of a 5-byte payload at Lsn 0x1_2345_6788.
        let payload = b"hello";
        let mut rec = [0xffu8; 40];
        let len = encode_entry(&mut rec, Lsn(0x1_2345_6788), Index(77), Term(5), payload);
        assert_eq!(len, 40, "32-byte header, 5 bytes, aligned to 8");
        assert_eq!(le32(&rec, 4), 5, "payload_len at 4");
        assert_eq!(le64(&rec, 8), 77, "index at 8");
        assert_eq!(le64(&rec, 16), 5, "term at 16");
        assert_eq!(le32(&rec, 24), 0x2345_6788, "lsn_low at 24");
        assert_eq!(rec[28], 1, "version 1 at 28");
        assert_eq!(rec[29], 1, "kind 1 (entry) at 29");
        assert_eq!(&rec[30..32], &[0, 0], "reserved");
        assert_eq!(&rec[32..37], payload, "the payload after the header");
        assert_eq!(&rec[37..40], &[0, 0, 0], "zero alignment");
        let mut covered = rec[4..32].to_vec();
        covered.extend_from_slice(payload);
        assert_eq!(
            le32(&rec, 0),
            crc32c::crc32c(&covered),
            "crc of 4..32 and the payload"
        );

        // Section 3: a segment header.
        let seg = SegmentHeader {
            block_bytes: 4096,
            cluster_id: 0x0102_0304_0506_0708,
            first_index: Index(11),
            first_lsn: Lsn(8192),
            prev_term: Term(2),
            data_bytes: 16384,
            window_bytes: 8192,
        }
        .encode();
        assert_eq!(seg.len(), 64);
        assert_eq!(&seg[0..8], b"RDMALOG\0", "magic");
        assert_eq!(le32(&seg, 8), 1, "version at 8");
        assert_eq!(le32(&seg, 12), 4096, "block_bytes at 12");
        assert_eq!(le64(&seg, 16), 0x0102_0304_0506_0708, "cluster_id at 16");
        assert_eq!(le64(&seg, 24), 11, "first_index at 24");
        assert_eq!(le64(&seg, 32), 8192, "first_lsn at 32");
        assert_eq!(le64(&seg, 40), 2, "prev_term at 40");
        assert_eq!(le64(&seg, 48), 16384, "data_bytes at 48");
        assert_eq!(le32(&seg, 56), 8192, "window_bytes at 56");
        assert_eq!(
            le32(&seg, 60),
            crc32c::crc32c(&seg[..60]),
            "crc of 0..60 at 60"
        );

        // Section 3: a truncation marker.
        let marker = TruncationMarker {
            kind: TruncationKind::Restart,
            keep_lsn: Lsn(6144),
        }
        .encode();
        assert_eq!(marker.len(), 32);
        assert_eq!(&marker[0..8], b"RLWALCUT", "magic");
        assert_eq!(le32(&marker, 8), 1, "version at 8");
        assert_eq!(le32(&marker, 12), 2, "kind 2 (restart) at 12");
        assert_eq!(le64(&marker, 16), 6144, "keep_lsn at 16");
        assert_eq!(
            le32(&marker, 24),
            crc32c::crc32c(&marker[..24]),
            "crc of 0..24 at 24"
        );
        assert_eq!(&marker[28..32], &[0; 4], "reserved");
    }
}
