//! rdmalog's client protocol: how any application reaches the log over TCP (optionally TLS),
//! without RDMA.
//!
//! # Frames
//!
//! Every message is one frame: a 4-byte little-endian body length, then the body, a bincode 2
//! encoding (standard config, little-endian, variable-length integers) of a [`Request`] or a
//! [`Response`]. The reader checks the length against its limit *before* allocating or
//! reading the body ([`read_frame`]), and decodes with the same byte limit, so a hostile peer
//! costs at most one bounded buffer.
//!
//! # Session
//!
//! 1. The client sends [`Request::Hello`] with [`PROTOCOL_VERSION`], the cluster id it expects
//!    and an optional token. The server answers [`Response::Welcome`] (its node id, the
//!    leader it knows, the role the token grants) or [`Response::Error`] and closes
//!    (`WrongVersion`, `WrongCluster`, `Unauthorized`).
//! 2. Then requests, each with a client-chosen `id` that its response echoes. Responses come
//!    in request order. `Append` on a node that is not the leader answers
//!    [`Response::Redirect`] with the leader's client address when known.
//! 3. [`Request::Tail`] turns the connection into a stream: [`Response::Entries`] frames as
//!    entries commit, until the client closes it.
//!
//! A malformed, oversized, wrong-version or wrong-cluster frame gets an error frame and the
//! connection is closed; nothing else is affected.

#![deny(unsafe_code)]

use std::io::{self, Read, Write};

use bincode::{Decode, Encode};

/// The protocol version this build speaks.
pub const PROTOCOL_VERSION: u16 = 1;

/// Default largest frame body: 16 MiB (a batch of 256 maximum-size entries).
pub const DEFAULT_MAX_FRAME_BYTES: u32 = 16 << 20;

/// Largest frame limit a server or client may configure: 64 MiB.
pub const MAX_FRAME_LIMIT: u32 = 64 << 20;

/// Most entries in one `Append`.
pub const MAX_BATCH_ENTRIES: usize = 4096;

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
    /// entry when one is committed).
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
    /// The append did not commit in time; it may still commit.
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

/// Decodes one frame body of at most `max` bytes.
pub fn decode_body<T: Decode<()>>(body: &[u8], max: u32) -> Result<T, FrameError> {
    if body.len() as u64 > u64::from(max) {
        return Err(FrameError::TooLarge {
            len: body.len() as u64,
            max,
        });
    }
    // The decoder's byte limit bounds what a length field inside the body may make it
    // allocate; it is a type parameter, so take the smallest tier that holds the body: a
    // hostile length claim then costs at most 16 times the frame's own size.
    let n = body.len();
    let decoded = if n <= 4 << 10 {
        bincode::decode_from_slice(body, config::<{ 4 << 10 }>())
    } else if n <= 64 << 10 {
        bincode::decode_from_slice(body, config::<{ 64 << 10 }>())
    } else if n <= 1 << 20 {
        bincode::decode_from_slice(body, config::<{ 1 << 20 }>())
    } else if n <= 16 << 20 {
        bincode::decode_from_slice(body, config::<{ 16 << 20 }>())
    } else {
        bincode::decode_from_slice(body, config::<{ MAX_FRAME_LIMIT as usize }>())
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
pub fn decode_frame<T: Decode<()>>(bytes: &[u8], max: u32) -> Result<T, FrameError> {
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
pub fn read_frame<T: Decode<()>>(r: &mut impl Read, max: u32) -> Result<T, FrameError> {
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
}
