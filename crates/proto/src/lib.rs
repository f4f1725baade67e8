//! rdmalog's client protocol: how any application reaches the log over TCP (optionally TLS),
//! without RDMA.
//!
//! # Frames
//!
//! Every message is one frame: a 4-byte little-endian body length, then the body, a bincode 2
//! encoding (standard config, little-endian, variable-length integers) of a [`Request`] or a
//! [`Response`]. The reader checks the length against its limit *before* allocating or
//! reading the body ([`read_frame`]), and decodes with a byte limit in proportion to the body's
//! size, so a hostile peer costs at most one bounded buffer. An `Append` of more than
//! [`MAX_BATCH_ENTRIES`] entries is refused from its first bytes
//! ([`FrameError::BatchTooLong`]), before its entries are decoded.
//!
//! # Session
//!
//! 1. The client sends [`Request::Hello`] with [`PROTOCOL_VERSION`], the cluster id it expects
//!    and an optional token. The server answers [`Response::Welcome`] (its node id, the
//!    leader it knows, the role the token grants) or [`Response::Error`] and closes
//!    (`WrongVersion`, `WrongCluster`, `Unauthorized`). A server accepts the versions from
//!    [`MIN_PROTOCOL_VERSION`] to its own and answers in the client's.
//! 2. Then requests, each with a client-chosen `id` that its response echoes. Responses come
//!    in request order. `Append` on a node that is not the leader answers
//!    [`Response::Redirect`] with the leader's client address when known. An `Append` is
//!    answered [`Response::Appended`] (every entry committed), [`Response::PartlyAppended`]
//!    (a change of leader kept only a prefix), `NotCommitted` (none is in the log: resend the
//!    batch), or `Timeout` (unknown: do not resend it blindly).
//! 3. [`Request::Tail`] turns the connection into a stream: [`Response::Entries`] frames as
//!    entries commit, until the client closes it.
//!
//! A malformed, oversized, wrong-version or wrong-cluster frame gets an error frame and the
//! connection is closed; nothing else is affected.

#![deny(unsafe_code)]

#[cfg(feature = "tls")]
pub mod tls;

/// How long a client connection may carry nothing before TCP keepalive probes it, the time
/// between probes, and how many may go unanswered: a peer whose machine died (or whose cable
/// was cut) is found within about 25 s, so a client's tail on a dead member moves to another
/// and a server drops a dead client's connection, where nothing else would (a tail waits
/// with no deadline, and never idles out).
pub const KEEPALIVE: (std::time::Duration, std::time::Duration, u32) = (
    std::time::Duration::from_secs(10),
    std::time::Duration::from_secs(5),
    3,
);

/// Turns on TCP keepalive ([`KEEPALIVE`]) on a client-protocol connection, at either end.
pub fn set_keepalive(sock: &std::net::TcpStream) -> std::io::Result<()> {
    let (idle, interval, retries) = KEEPALIVE;
    socket2::SockRef::from(sock).set_tcp_keepalive(
        &socket2::TcpKeepalive::new()
            .with_time(idle)
            .with_interval(interval)
            .with_retries(retries),
    )
}

use std::io::{self, Read, Write};

use bincode::{Decode, Encode};

/// The protocol version this build speaks. Version 2 added [`Response::PartlyAppended`]; a
/// server answers a version-1 client's partly committed batch with a `Timeout` error instead,
/// which that client does not resend. Version 3 added [`Request::ReadWith`], a read with a
/// stated consistency, and [`Request::AppendIf`], a conditional append answered
/// [`Response::ConditionFailed`] when its condition does not hold; clients of versions 1 and
/// 2 never send them. Version 4 added client sessions for exactly-once appends:
/// [`Request::OpenSession`] (answered [`Response::SessionOpened`]) and
/// [`Request::AppendInSession`] (answered [`Response::AppendedAt`]), with the error codes
/// `UnknownSession`, `SessionSequence` and `SessionTooOld`, and [`Request::Trim`] (answered
/// [`Response::Trimmed`]) for operators.
pub const PROTOCOL_VERSION: u16 = 4;

/// The oldest protocol version a server of this build still accepts at the hello. Each
/// version only added a message that older clients never send or receive, so a client of
/// version 1 or 2 keeps working against this server; a client of this build needs a server of
/// version 3 or later to send [`Request::ReadWith`], and of version 4 for sessions (upgrade
/// servers before clients).
pub const MIN_PROTOCOL_VERSION: u16 = 1;

/// Default largest frame body: 16 MiB, a round power of two. It holds an `Append` of 255
/// entries of 64 KiB (the replica's default entry limit) or of any smaller ones, up to
/// [`MAX_BATCH_ENTRIES`]; 256 such entries do not fit, as each costs a few bytes of length
/// besides its payload (`tests/limits.rs` computes both).
pub const DEFAULT_MAX_FRAME_BYTES: u32 = 16 << 20;

/// Largest frame limit a server or client may configure: 64 MiB, four default frames.
pub const MAX_FRAME_LIMIT: u32 = 64 << 20;

/// Most entries in one `Append`: 4096, a bound on the per-entry work (a ticket, a handle, a
/// raft entry) one request can ask of the server; a larger batch is refused before its
/// entries are decoded ([`FrameError::BatchTooLong`]).
pub const MAX_BATCH_ENTRIES: usize = 4096;

/// Most bytes an [`Entry`] adds to an encoded [`Response::Entries`] besides its payload: its
/// index and its payload's length, each a bincode variable-length integer of at most 9 bytes
/// (a marker byte, then 8).
pub const ENTRY_OVERHEAD_BYTES: usize = 2 * 9;

/// Most bytes of an encoded [`Response::Entries`] besides its entries: the variant (1 byte
/// for the few variants there are), the request id, the commit index and the entry count
/// (each at most 9 bytes), rounded up.
pub const ENTRIES_HEADER_BYTES: usize = 32;

/// How many bytes the decoder may charge against its limit per byte of a frame body.
///
/// bincode charges each value its in-memory size, not its encoded size: a `Vec<T>` of `n`
/// elements reserves `n * size_of::<T>()` before it reads them, a `u64` 8 bytes. The most any
/// message of this protocol is charged per byte of its encoding is 24: a `Vec<u8>` (24 bytes)
/// inside a `Vec`, whose encoding can be one byte (an empty entry of an `Append`); the
/// assertions below check each element type of a `Vec` in a message. 32 is that, rounded up to
/// a power of two.
const DECODE_BYTES_PER_BODY_BYTE: usize = 32;

// Each element type a message holds a `Vec` of, against its smallest encoding.
const _: () = assert!(size_of::<Vec<u8>>() <= DECODE_BYTES_PER_BODY_BYTE);
const _: () = assert!(size_of::<u64>() <= DECODE_BYTES_PER_BODY_BYTE);
const _: () = assert!(size_of::<Entry>() <= 2 * DECODE_BYTES_PER_BODY_BYTE);
const _: () = assert!(size_of::<NodeInfo>() <= 2 * DECODE_BYTES_PER_BODY_BYTE);
const _: () = assert!(size_of::<(u64, u64, String)>() <= 3 * DECODE_BYTES_PER_BODY_BYTE);

/// What a client may do, from its token (or the server's anonymous role).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Encode, Decode)]
pub enum Role {
    /// `Read`, `Tail`, `Status`.
    ReadOnly,
    /// Also `Append`.
    ReadWrite,
    /// Also `Members`.
    Admin,
}

impl Role {
    /// The name used in configuration files and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Role::ReadOnly => "read-only",
            Role::ReadWrite => "read-write",
            Role::Admin => "admin",
        }
    }

    /// Parses [`Role::name`].
    pub fn parse(s: &str) -> Option<Role> {
        match s {
            "read-only" => Some(Role::ReadOnly),
            "read-write" => Some(Role::ReadWrite),
            "admin" => Some(Role::Admin),
            _ => None,
        }
    }
}

/// A node and where clients reach it.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct NodeInfo {
    /// Node id.
    pub id: u64,
    /// Its client address, `host:port`.
    pub client_addr: String,
}

/// A request from a client.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub enum Request {
    /// The first frame of every connection.
    Hello {
        /// [`PROTOCOL_VERSION`].
        version: u16,
        /// The cluster the client means to talk to.
        cluster_id: u64,
        /// A token from the server's configuration; `None` gets the anonymous role.
        token: Option<String>,
    },
    /// Appends a batch; answered with [`Response::Appended`] once every entry committed.
    Append {
        /// Echoed in the response.
        id: u64,
        /// The entries, in order (at most [`MAX_BATCH_ENTRIES`]).
        entries: Vec<Vec<u8>>,
    },
    /// Reads committed entries from `from`, up to about `max_bytes` of payload (at least one
    /// entry when one is committed). The server clamps the budget to what one response frame
    /// holds (the default frame limit, or its own if lower): read on from the last index.
    Read {
        /// Echoed in the response.
        id: u64,
        /// First index.
        from: u64,
        /// Payload budget.
        max_bytes: u32,
    },
    /// Streams committed entries from `from` as they commit.
    Tail {
        /// Echoed in every response.
        id: u64,
        /// First index.
        from: u64,
    },
    /// The state of this node and of what it knows of the others.
    Status {
        /// Echoed in the response.
        id: u64,
    },
    /// Adds or removes a voter (admin role, on the leader).
    Members {
        /// Echoed in the response.
        id: u64,
        /// Add (true) or remove.
        add: bool,
        /// The node.
        node: u64,
    },
    /// [`Request::Read`] with a stated consistency (protocol version 3; last, so that the
    /// earlier variants keep their encoding).
    ReadWith {
        /// Echoed in the response.
        id: u64,
        /// First index.
        from: u64,
        /// Payload budget, as for `Read`.
        max_bytes: u32,
        /// How fresh the answer must be.
        consistency: ReadConsistency,
    },
    /// [`Request::Append`] on a condition (protocol version 3): the batch is appended only if
    /// the log ends at `expected_last` when the leader orders it, so that its first entry goes
    /// to `expected_last + 1`; otherwise it is answered [`Response::ConditionFailed`] with the
    /// actual end and nothing is appended.
    AppendIf {
        /// Echoed in the response.
        id: u64,
        /// Where the log must end: its last index, raft's own entries included (the `commit`
        /// of an `Entries` answer once everything is committed).
        expected_last: u64,
        /// The entries, in order (at most [`MAX_BATCH_ENTRIES`]).
        entries: Vec<Vec<u8>>,
    },
    /// Opens a client session for exactly-once appends (protocol version 4; read-write role,
    /// on the leader): answered [`Response::SessionOpened`] once the session is committed.
    OpenSession {
        /// Echoed in the response.
        id: u64,
    },
    /// [`Request::Append`] in a session (protocol version 4): the entries are numbers
    /// `first_seq`, `first_seq + 1`, ... of `session` (a session's first entry is number 1).
    /// An entry whose number the log already holds is not appended again: its index is the
    /// first copy's. So the same request may be resent after any failure, a broken
    /// connection or a `Timeout` included, and nothing is appended twice. Answered
    /// [`Response::AppendedAt`] once every entry is committed.
    AppendInSession {
        /// Echoed in the response.
        id: u64,
        /// The session, from [`Response::SessionOpened`].
        session: u64,
        /// The first entry's number in the session.
        first_seq: u64,
        /// The entries, in order (at most [`MAX_BATCH_ENTRIES`]).
        entries: Vec<Vec<u8>>,
    },
    /// Deletes this node's entries below `index` (admin role; protocol version 4), through a
    /// checkpoint: whole segments, so the node may keep some entries below `index`, and
    /// never one it has not applied. Answered [`Response::Trimmed`]. Every node keeps its own
    /// log: send it to each member to trim the cluster (the CLI's `trim` does).
    Trim {
        /// Echoed in the response.
        id: u64,
        /// The first index to keep.
        index: u64,
    },
}

/// How fresh a read's answer must be ([`Request::ReadWith`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Encode, Decode)]
pub enum ReadConsistency {
    /// What this node has committed when the read arrives: any node answers, a follower may
    /// lag behind the leader. What a plain [`Request::Read`] gets.
    Local,
    /// Linearizable: the answer holds every entry committed anywhere before the read arrived.
    /// Only the leader answers (after a majority confirmed it still leads, raft's ReadIndex);
    /// any other node answers [`Response::Redirect`].
    Linearizable,
    /// Once this node has committed at least this index (read your writes: the `last` of an
    /// `Appended`), then as `Local`. Any node answers; `Timeout` if it has not within the
    /// server's append timeout (nothing was read: retry, or ask another node).
    AtLeast(u64),
}

/// Why a request failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Encode, Decode)]
pub enum ErrorCode {
    /// The frame could not be decoded; the connection closes.
    Malformed,
    /// The frame exceeds the limit; the connection closes.
    TooLarge,
    /// Another protocol version; the connection closes.
    WrongVersion,
    /// Another cluster id; the connection closes.
    WrongCluster,
    /// The role does not allow the request (or the token is unknown at hello).
    Unauthorized,
    /// An entry exceeds the log's entry limit, or a batch the entry count limit.
    EntryTooLarge,
    /// Whether the append is in the log is not known: it did not commit in time and may still
    /// commit, or its entries were checkpointed after a change of leader so that whether they
    /// were this append's cannot be told any more. Do not resend it blindly.
    Timeout,
    /// The entries asked for were truncated after a checkpoint.
    Compacted,
    /// Too many connections or requests in flight; retry later.
    Busy,
    /// The server is shutting down; retry on another node.
    ShuttingDown,
    /// Anything else; the message says what.
    Internal,
    /// The entries are certainly not in the log (raft dropped the proposal, or a new leader's
    /// entries took their place): resend them.
    NotCommitted,
    /// The session of an `AppendInSession` does not exist: it expired (a cluster keeps its
    /// 1,024 most recently used sessions) or was never opened. Entries sent with it before
    /// may be in the log; open a new session for new entries.
    UnknownSession,
    /// An `AppendInSession` skips numbers: the message names the session's next number.
    /// Nothing was appended; send the missing entries first.
    SessionSequence,
    /// An entry of an `AppendInSession` is in the log, so long ago that its index is no longer
    /// known; it was not appended again.
    SessionTooOld,
}

/// An entry in a [`Response::Entries`].
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct Entry {
    /// Its index.
    pub index: u64,
    /// The payload.
    pub data: Vec<u8>,
}

/// One node's state in a [`Response::Status`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Encode, Decode)]
pub struct NodeStatus {
    /// Node id.
    pub id: u64,
    /// leader, follower, candidate, or recovering (a follower that lost entries it may have
    /// acknowledged and does not vote until it caught up; the server's `/status` says why).
    pub role: String,
    /// Current term.
    pub term: u64,
    /// Commit index.
    pub commit: u64,
    /// Applied index.
    pub applied: u64,
    /// First index held.
    pub first_index: u64,
    /// Last index held.
    pub last_index: u64,
    /// Ring bytes in use, of `ring_bytes`.
    pub ring_used_bytes: u64,
    /// Ring size.
    pub ring_bytes: u64,
    /// Fenced writes seen as leader.
    pub fenced_writes: u64,
    /// Per peer: `(id, matched index, connection state)`.
    pub peers: Vec<(u64, u64, String)>,
}

/// A response from the server.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub enum Response {
    /// The handshake succeeded.
    Welcome {
        /// The server's node id.
        node_id: u64,
        /// The leader it knows.
        leader: Option<NodeInfo>,
        /// What this connection may do.
        role: Role,
    },
    /// The batch of `Append` `id` committed at `first..=last`.
    Appended {
        /// The request id.
        id: u64,
        /// Index of the first entry.
        first: u64,
        /// Index of the last entry.
        last: u64,
    },
    /// Committed entries (a `Read` answer or one `Tail` chunk).
    Entries {
        /// The request id.
        id: u64,
        /// The commit index when they were read.
        commit: u64,
        /// The entries, in order.
        entries: Vec<Entry>,
    },
    /// This node's status and the cluster as it sees it.
    Status {
        /// The request id.
        id: u64,
        /// This node.
        node: NodeStatus,
        /// The leader it knows.
        leader: Option<NodeInfo>,
        /// Every member's client address.
        members: Vec<NodeInfo>,
    },
    /// A membership change committed at `index`.
    MembershipChanged {
        /// The request id.
        id: u64,
        /// The change's index.
        index: u64,
    },
    /// Not the leader: ask `leader` (unknown during an election: retry shortly).
    Redirect {
        /// The request id.
        id: u64,
        /// The leader, if known.
        leader: Option<NodeInfo>,
    },
    /// The request `id` (`None`: the connection) failed.
    Error {
        /// The request id, if the failure belongs to one.
        id: Option<u64>,
        /// What kind of failure.
        code: ErrorCode,
        /// A sentence a person can act on.
        message: String,
    },
    /// Only the first `last - first + 1` entries of the batch of `Append` `id` committed, at
    /// `first..=last`; a new leader's entries replaced the others, which are certainly not in
    /// the log: resend those, and only those. (Protocol version 2; last, so that the earlier
    /// variants keep their encoding.)
    PartlyAppended {
        /// The request id.
        id: u64,
        /// Index of the batch's first entry.
        first: u64,
        /// Index of the last entry that committed.
        last: u64,
    },
    /// The log did not end where [`Request::AppendIf`] `id` expected: it ends at `last`, and
    /// nothing was appended (protocol version 3).
    ConditionFailed {
        /// The request id.
        id: u64,
        /// Where the log ends (its last index on the leader when the request was ordered).
        last: u64,
    },
    /// [`Request::OpenSession`] `id` committed: `session` is the new session's id
    /// (protocol version 4).
    SessionOpened {
        /// The request id.
        id: u64,
        /// The session.
        session: u64,
    },
    /// Every entry of [`Request::AppendInSession`] `id` is committed, each once, at these
    /// indexes, in the request's order (protocol version 4). They are increasing, and
    /// consecutive unless a resent batch found its first entries already in the log.
    AppendedAt {
        /// The request id.
        id: u64,
        /// Each entry's index.
        indexes: Vec<u64>,
    },
    /// [`Request::Trim`] `id` is done: the node's log now starts at `first_index`
    /// (protocol version 4).
    Trimmed {
        /// The request id.
        id: u64,
        /// The first index the node holds.
        first_index: u64,
    },
}

/// Why a frame could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// The peer closed the connection cleanly between frames.
    #[error("the connection was closed")]
    Closed,
    /// The length prefix exceeds the limit (nothing more was read).
    #[error("a frame of {len} bytes exceeds the {max}-byte limit")]
    TooLarge {
        /// Claimed body length.
        len: u64,
        /// The limit.
        max: u32,
    },
    /// The body is an `Append` of more than [`MAX_BATCH_ENTRIES`] entries; it was refused
    /// from its first bytes, before its entries were decoded. The frame was read whole, so
    /// the connection can go on.
    #[error(
        "request {id} is an Append of {entries} entries, over the {MAX_BATCH_ENTRIES}-entry batch limit: send at most {MAX_BATCH_ENTRIES} entries per Append"
    )]
    BatchTooLong {
        /// The request's id.
        id: u64,
        /// How many entries it claims.
        entries: u64,
    },
    /// The body is not a valid message.
    #[error("malformed frame: {0}")]
    Malformed(String),
    /// Reading or writing failed (including a timeout).
    #[error("i/o: {0}")]
    Io(#[from] io::Error),
}

fn config<const N: usize>() -> impl bincode::config::Config {
    bincode::config::standard()
        .with_little_endian()
        .with_limit::<N>()
}

/// Encodes `msg` as a frame (length prefix and body) into `out`, which is cleared first.
pub fn encode_frame<T: Encode>(msg: &T, out: &mut Vec<u8>) -> Result<(), FrameError> {
    out.clear();
    out.extend_from_slice(&[0; 4]);
    let len = bincode::encode_into_std_write(msg, out, config::<{ MAX_FRAME_LIMIT as usize }>())
        .map_err(|e| FrameError::Malformed(e.to_string()))?;
    let len = u32::try_from(len).map_err(|_| FrameError::TooLarge {
        len: len as u64,
        max: MAX_FRAME_LIMIT,
    })?;
    out[..4].copy_from_slice(&len.to_le_bytes());
    Ok(())
}

/// Writes `msg` as one frame and flushes.
pub fn write_frame<T: Encode>(w: &mut impl Write, msg: &T) -> Result<(), FrameError> {
    let mut buf = Vec::new();
    encode_frame(msg, &mut buf)?;
    w.write_all(&buf)?;
    w.flush()?;
    Ok(())
}

/// A message frames carry: a [`Request`] or a [`Response`].
pub trait Message: Encode + Decode<()> + sealed::Sealed {
    /// Refuses, from its first bytes, a body whose decoding would cost more than its limits
    /// allow (an `Append` over [`MAX_BATCH_ENTRIES`]); anything else is left to the decoder.
    fn check_body(body: &[u8]) -> Result<(), FrameError>;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::Request {}
    impl Sealed for super::Response {}
}

/// `Request::Append`'s variant index: bincode numbers variants in declaration order.
const APPEND_VARIANT: u32 = 1;

/// `Request::AppendIf`'s variant index.
const APPEND_IF_VARIANT: u32 = 7;

/// `Request::AppendInSession`'s variant index.
const APPEND_IN_SESSION_VARIANT: u32 = 9;

impl Message for Request {
    fn check_body(body: &[u8]) -> Result<(), FrameError> {
        // The variant, the id and the entry count lead an Append's encoding (an AppendIf's
        // has the expected end before the count, an AppendInSession's the session and the
        // first number). The limit only has to cover five integers.
        let count = match bincode::decode_from_slice::<(u32, u64, u64), _>(body, config::<64>()) {
            Ok(((APPEND_VARIANT, id, entries), _)) => Some((id, entries)),
            Ok(((APPEND_IF_VARIANT, ..), _)) => {
                bincode::decode_from_slice::<(u32, u64, u64, u64), _>(body, config::<64>())
                    .ok()
                    .map(|((_, id, _, entries), _)| (id, entries))
            }
            Ok(((APPEND_IN_SESSION_VARIANT, ..), _)) => {
                bincode::decode_from_slice::<(u32, u64, u64, u64, u64), _>(body, config::<64>())
                    .ok()
                    .map(|((_, id, _, _, entries), _)| (id, entries))
            }
            _ => None,
        };
        match count {
            Some((id, entries)) if entries > MAX_BATCH_ENTRIES as u64 => {
                Err(FrameError::BatchTooLong { id, entries })
            }
            _ => Ok(()),
        }
    }
}

impl Message for Response {
    fn check_body(_body: &[u8]) -> Result<(), FrameError> {
        Ok(())
    }
}

/// Decodes `body` with a decoder limit of `LIMIT` bytes.
fn decode_limited<T: Decode<()>, const LIMIT: usize>(
    body: &[u8],
) -> Result<(T, usize), bincode::error::DecodeError> {
    bincode::decode_from_slice(body, config::<LIMIT>())
}

/// Decodes one frame body of at most `max` bytes.
pub fn decode_body<T: Message>(body: &[u8], max: u32) -> Result<T, FrameError> {
    if body.len() as u64 > u64::from(max) {
        return Err(FrameError::TooLarge {
            len: body.len() as u64,
            max,
        });
    }
    T::check_body(body)?;
    // The decoder's byte limit bounds what a length field inside the body may make it
    // allocate. It counts in-memory bytes, up to DECODE_BYTES_PER_BODY_BYTE per body byte
    // for a valid message, and it is a type parameter: so take the smallest tier (tiers grow
    // fourfold) that holds this body, times that factor. A hostile length claim then costs at
    // most 4 * DECODE_BYTES_PER_BODY_BYTE times the body's size (or 128 KiB for a body under
    // 4 KiB), and only until the decoder finds the bytes missing.
    const K: usize = DECODE_BYTES_PER_BODY_BYTE;
    let n = body.len();
    let decoded = if n <= 4 << 10 {
        decode_limited::<T, { K * (4 << 10) }>(body)
    } else if n <= 16 << 10 {
        decode_limited::<T, { K * (16 << 10) }>(body)
    } else if n <= 64 << 10 {
        decode_limited::<T, { K * (64 << 10) }>(body)
    } else if n <= 256 << 10 {
        decode_limited::<T, { K * (256 << 10) }>(body)
    } else if n <= 1 << 20 {
        decode_limited::<T, { K * (1 << 20) }>(body)
    } else if n <= 4 << 20 {
        decode_limited::<T, { K * (4 << 20) }>(body)
    } else if n <= 16 << 20 {
        decode_limited::<T, { K * (16 << 20) }>(body)
    } else {
        decode_limited::<T, { K * MAX_FRAME_LIMIT as usize }>(body)
    };
    let (msg, used) = decoded.map_err(|e| FrameError::Malformed(e.to_string()))?;
    if used != body.len() {
        return Err(FrameError::Malformed(format!(
            "{} trailing bytes after the message",
            body.len() - used
        )));
    }
    Ok(msg)
}

/// Decodes a whole frame (length prefix and body) from `bytes`, as [`read_frame`] would.
pub fn decode_frame<T: Message>(bytes: &[u8], max: u32) -> Result<T, FrameError> {
    let head: [u8; 4] = bytes
        .get(..4)
        .and_then(|h| h.try_into().ok())
        .ok_or_else(|| FrameError::Malformed("shorter than a length prefix".into()))?;
    let len = u32::from_le_bytes(head);
    if len > max {
        return Err(FrameError::TooLarge {
            len: len.into(),
            max,
        });
    }
    let body = bytes
        .get(4..4 + len as usize)
        .ok_or_else(|| FrameError::Malformed("shorter than its length prefix".into()))?;
    decode_body(body, max)
}

/// Reads one frame of at most `max` body bytes. The length is checked before the body is
/// allocated or read. A clean close before the first byte is [`FrameError::Closed`].
pub fn read_frame<T: Message>(r: &mut impl Read, max: u32) -> Result<T, FrameError> {
    let mut head = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        match r.read(&mut head[got..]) {
            Ok(0) if got == 0 => return Err(FrameError::Closed),
            Ok(0) => {
                return Err(FrameError::Io(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the connection closed inside a length prefix",
                )));
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(FrameError::Io(e)),
        }
    }
    let len = u32::from_le_bytes(head);
    if len > max {
        return Err(FrameError::TooLarge {
            len: len.into(),
            max,
        });
    }
    let mut body = vec![0u8; len as usize];
    r.read_exact(&mut body)?;
    decode_body(&body, max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_parse_their_names() {
        for r in [Role::ReadOnly, Role::ReadWrite, Role::Admin] {
            assert_eq!(Role::parse(r.name()), Some(r));
        }
        assert_eq!(Role::parse("root"), None);
        assert!(Role::ReadOnly < Role::ReadWrite && Role::ReadWrite < Role::Admin);
    }

    #[test]
    fn the_batch_check_reads_the_append_variant_bincode_writes() {
        let mut buf = Vec::new();
        let req = Request::Append {
            id: 3,
            entries: vec![vec![9]],
        };
        encode_frame(&req, &mut buf).unwrap();
        assert_eq!(buf[4..], [APPEND_VARIANT as u8, 3, 1, 1, 9]);
        // A claim over the limit is refused from the head alone, bytes or no bytes.
        let head = [APPEND_VARIANT as u8, 3, 0xFB, 0x01, 0x10];
        assert!(matches!(
            Request::check_body(&head),
            Err(FrameError::BatchTooLong {
                id: 3,
                entries: 4097
            })
        ));
        assert!(Request::check_body(&[2, 3, 0xFB, 0x01, 0x10]).is_ok());
        // An AppendIf's count comes after its expected end.
        let head = [APPEND_IF_VARIANT as u8, 3, 9, 0xFB, 0x01, 0x10];
        assert!(matches!(
            Request::check_body(&head),
            Err(FrameError::BatchTooLong {
                id: 3,
                entries: 4097
            })
        ));
        let mut buf = Vec::new();
        let req = Request::AppendIf {
            id: 3,
            expected_last: 9,
            entries: vec![vec![9]],
        };
        encode_frame(&req, &mut buf).unwrap();
        assert_eq!(buf[4..], [APPEND_IF_VARIANT as u8, 3, 9, 1, 1, 9]);
        // An AppendInSession's count comes after its session and first number.
        let head = [APPEND_IN_SESSION_VARIANT as u8, 3, 7, 1, 0xFB, 0x01, 0x10];
        assert!(matches!(
            Request::check_body(&head),
            Err(FrameError::BatchTooLong {
                id: 3,
                entries: 4097
            })
        ));
        let mut buf = Vec::new();
        let req = Request::AppendInSession {
            id: 3,
            session: 7,
            first_seq: 1,
            entries: vec![vec![9]],
        };
        encode_frame(&req, &mut buf).unwrap();
        assert_eq!(
            buf[4..],
            [APPEND_IN_SESSION_VARIANT as u8, 3, 7, 1, 1, 1, 9]
        );
    }
}
