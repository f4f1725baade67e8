//! What a call can fail with, sorted by what the caller can do about it.

use std::time::Duration;

use proto::ErrorCode;

/// Why a [`Client`](crate::Client) call failed.
///
/// Transient failures ([`ClientError::is_transient`]) were already retried until the
/// configured deadline; calling again may succeed. The others are returned at once and will
/// fail the same way until something changes (the token, the cluster id, the certificates,
/// the request).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// No server could be reached (connection refused or timed out, TLS or hello not
    /// completed) before the deadline.
    #[error("no server reachable (tried {}); last failure: {last}", tried.join(", "))]
    Unreachable {
        /// Every address tried, in order of first attempt.
        tried: Vec<String>,
        /// The last failure, with its address.
        last: String,
    },
    /// The server refused the request for a reason retrying cannot fix: `Unauthorized`,
    /// `WrongCluster`, `WrongVersion`, `EntryTooLarge`, `Malformed`, `TooLarge`, `Compacted`
    /// or `Internal` (other than the retryable ones: see the crate docs).
    #[error("refused by the server ({code:?}): {message}")]
    Refused {
        /// The server's error code.
        code: ErrorCode,
        /// The server's explanation.
        message: String,
    },
    /// A change of leader kept only the first `committed` of the `sent` entries of an append
    /// batch, at `first..=last`, and replaced the others, which are certainly not in the log.
    /// Nothing was resent: append `entries[committed..]` again (and only those) to have the
    /// whole batch in the log once.
    #[error(
        "only the first {committed} of the batch's {sent} entries committed (at {first}..={last}); a new leader replaced the other {}, which are not in the log: append only those again",
        sent - committed
    )]
    PartlyCommitted {
        /// Index of the batch's first entry.
        first: u64,
        /// Index of the last entry that committed.
        last: u64,
        /// How many of the batch's entries committed: its first `committed`.
        committed: usize,
        /// How many entries the batch had.
        sent: usize,
    },
    /// A conditional append ([`crate::Client::append_if`]) found the log ending at `last`, not
    /// at `expected`: the send so answered appended nothing. Read on from `expected + 1` and
    /// decide again. With `maybe_committed`, an earlier send of the same call went unanswered
    /// (a broken connection, a server shutting down) and may have committed: the entries
    /// from `expected + 1` may be this call's own.
    #[error("{}", condition_failed(*expected, *last, *maybe_committed))]
    ConditionFailed {
        /// Where the call expected the log to end.
        expected: u64,
        /// Where it ends.
        last: u64,
        /// An earlier send of this call, whose answer was lost, may have committed.
        maybe_committed: bool,
    },
    /// The call did not complete in time: the deadline passed while the servers were busy or
    /// shutting down or while waiting for an answer, or the server reported that an append
    /// did not commit within its own timeout or that whether it is in the log cannot be told
    /// (its entries were checkpointed after a change of leader). **An append that timed out may still commit.**
    #[error("timed out after {waited:?}: {last}")]
    Timeout {
        /// How long the call ran.
        waited: Duration,
        /// What the last attempt ran into.
        last: String,
    },
    /// No leader was known before the deadline (an election was under way, or a majority of
    /// the cluster is unreachable).
    #[error(
        "no leader known after {waited:?}: an election may be under way or a majority of the cluster unreachable"
    )]
    NoLeader {
        /// How long the call ran.
        waited: Duration,
    },
    /// The server answered something this client does not understand (a frame that does not
    /// decode or is too large, a response of the wrong kind or for another request, or a
    /// plain-TCP client talking to a TLS port).
    #[error("protocol error: {0}")]
    Protocol(String),
    /// A connection broke during a request and the deadline left no time to retry. **An
    /// append may or may not have committed.**
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    /// TLS failed: the server's certificate is not trusted or does not name the server, the
    /// server refused the client certificate, or the port does not speak TLS.
    #[error("TLS: {0}")]
    Tls(String),
    /// The configuration cannot work: no servers, an unreadable certificate or key file, an
    /// invalid server name or frame limit.
    #[error("configuration: {0}")]
    Config(String),
    /// An exactly-once append failed for good with `cause` after an earlier send of the same
    /// batch went unanswered (a broken connection, a server shutting down or timing out): **the
    /// batch may or may not be in the log.** Read the log to find out before appending it
    /// again (the next append opens a new session, which would not recognise this batch).
    #[error("the batch may or may not be in the log (an earlier send went unanswered): {cause}")]
    MaybeAppended {
        /// What the last attempt failed with.
        cause: Box<ClientError>,
    },
}

impl ClientError {
    /// Whether calling again later may succeed: `Unreachable`, `Timeout`, `NoLeader` and `Io`
    /// are transient; `Refused`, `PartlyCommitted` (calling again would append the committed
    /// entries twice), `MaybeAppended` (read the log first), `Protocol`, `Tls` and `Config`
    /// are not.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            ClientError::Unreachable { .. }
                | ClientError::Timeout { .. }
                | ClientError::NoLeader { .. }
                | ClientError::Io(_)
        )
    }

    /// The server's error code, for [`ClientError::Refused`].
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            ClientError::Refused { code, .. } => Some(*code),
            _ => None,
        }
    }
}

/// [`ClientError::ConditionFailed`]'s message.
fn condition_failed(expected: u64, last: u64, maybe_committed: bool) -> String {
    if maybe_committed {
        format!(
            "the log ends at index {last}, not at {expected}; an earlier send of this call went \
             unanswered and may have committed: read from {} to see whether those entries are \
             this call's",
            expected.saturating_add(1)
        )
    } else {
        format!("the log ends at index {last}, not at {expected}: nothing was appended")
    }
}
