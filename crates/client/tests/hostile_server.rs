//! A server that answers what no correct server would: the client reports a protocol error
//! naming it, and never panics, loops, or hands the application an index the server did not
//! give each entry. Against a scripted server on loopback, which answers each request with a
//! script (a real server cannot be made to lie).

use std::net::TcpListener;
use std::time::Duration;

use client::{Client, ClientConfig, ClientError};
use proto::{
    Entry, ErrorCode, NodeInfo, NodeStatus, PROTOCOL_VERSION, Request, Response, Role, read_frame,
    write_frame,
};

/// The request id of `r`.
fn id_of(r: &Request) -> u64 {
    match r {
        Request::Append { id, .. }
        | Request::AppendIf { id, .. }
        | Request::AppendInSession { id, .. }
        | Request::OpenSession { id }
        | Request::Read { id, .. }
        | Request::ReadWith { id, .. }
        | Request::Tail { id, .. }
        | Request::Status { id }
        | Request::Members { id, .. }
        | Request::Trim { id, .. } => *id,
        Request::Hello { .. } => 0,
    }
}

/// A server on loopback that welcomes every connection and answers each request with
/// `answer(request, its id)`.
fn scripted(answer: impl Fn(&Request, u64) -> Response + Send + Sync + 'static) -> String {
    scripted_or_close(move |r, id| Some(answer(r, id)))
}

/// As [`scripted`], closing the connection unanswered where `answer` gives `None` (an answer
/// lost with its connection).
fn scripted_or_close(
    answer: impl Fn(&Request, u64) -> Option<Response> + Send + Sync + 'static,
) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let answer = std::sync::Arc::new(answer);
    std::thread::spawn(move || {
        for s in listener.incoming() {
            let Ok(mut s) = s else { return };
            let answer = answer.clone();
            std::thread::spawn(move || {
                let max = proto::DEFAULT_MAX_FRAME_BYTES;
                match read_frame::<Request>(&mut s, max) {
                    Ok(Request::Hello { version, .. }) => assert_eq!(version, PROTOCOL_VERSION),
                    _ => return,
                }
                let welcome = Response::Welcome {
                    node_id: 1,
                    leader: None,
                    role: Role::Admin,
                };
                if write_frame(&mut s, &welcome).is_err() {
                    return;
                }
                while let Ok(req) = read_frame::<Request>(&mut s, max) {
                    let Some(a) = answer(&req, id_of(&req)) else {
                        return;
                    };
                    if write_frame(&mut s, &a).is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

fn client(addr: String, exactly_once: bool) -> Client {
    let mut cfg = ClientConfig::new(vec![addr], 0xc1);
    cfg.deadline = Duration::from_secs(3);
    cfg.exactly_once = exactly_once;
    Client::connect(cfg).unwrap()
}

fn protocol_error<T: std::fmt::Debug>(r: Result<T, ClientError>, what: &str) -> String {
    match r {
        Err(ClientError::Protocol(m)) => m,
        other => panic!("{what}: expected a protocol error, got {other:?}"),
    }
}

/// `Appended` ranges that are not one index per entry of the batch (ends swapped, the whole
/// index space, one too many, index 0): each a protocol error. Before, the first panicked
/// (an empty range indexed), the second aborted (capacity overflow) and the third was
/// returned as the batch's indexes.
#[test]
fn an_appended_range_that_does_not_fit_the_batch_is_refused() {
    for (first, last) in [(10, 5), (0, u64::MAX), (10, 13), (0, 1)] {
        let addr = scripted(move |_, id| Response::Appended { id, first, last });
        let mut c = client(addr, false);
        let m = protocol_error(c.append(&[b"a", b"b"]), "append");
        assert!(m.contains(&format!("{first}..={last}")), "{m}");
        let m = protocol_error(c.append_at(&[b"a", b"b"]), "append_at");
        assert!(m.contains("Appended"), "{m}");
    }
}

/// In a session: `AppendedAt` indexes out of order, or 0, and a `PartlyAppended` over the
/// whole index space: protocol errors (the command line's append subtracted them and
/// panicked).
#[test]
fn session_and_partial_answers_that_cannot_be_are_refused() {
    for indexes in [vec![10, 5], vec![0, 1], vec![7, 7]] {
        let addr = scripted(move |r, id| match r {
            Request::OpenSession { .. } => Response::SessionOpened { id, session: 3 },
            _ => Response::AppendedAt {
                id,
                indexes: indexes.clone(),
            },
        });
        let mut c = client(addr, true);
        let m = protocol_error(c.append_at(&[b"a", b"b"]), "append_at in a session");
        assert!(m.contains("AppendedAt"), "{m}");
    }
    let addr = scripted(|_, id| Response::PartlyAppended {
        id,
        first: 0,
        last: u64::MAX,
    });
    let m = protocol_error(client(addr, false).append(&[b"a", b"b"]), "partly");
    assert!(m.contains("not a prefix"), "{m}");
}

/// Entries of a read out of order, before the index asked for, or past the commit index the
/// answer states: a protocol error (the command line's `tail` without `--follow` read from
/// the last index + 1 for ever when the last was below where it started).
#[test]
fn read_answers_out_of_order_are_refused() {
    let entry = |index| Entry {
        index,
        data: b"x".to_vec(),
    };
    for (entries, commit) in [
        (vec![entry(7), entry(5)], 9),
        (vec![entry(2)], 9),
        (vec![entry(5), entry(6)], 5),
    ] {
        let addr = scripted(move |_, id| Response::Entries {
            id,
            commit,
            entries: entries.clone(),
        });
        let mut c = client(addr, false);
        let m = protocol_error(c.read(5, 1 << 20), "read");
        assert!(m.contains("not in order"), "{m}");
    }
    // Skipped indexes are fine: raft's own entries are not sent.
    let addr = scripted(move |_, id| Response::Entries {
        id,
        commit: 9,
        entries: vec![entry(5), entry(8)],
    });
    let (got, commit) = client(addr, false).read(5, 1 << 20).unwrap();
    assert_eq!((got.len(), commit), (2, 9));
}

/// A `Status` listing more members than any cluster has: a protocol error, not millions of
/// addresses learned (each a later connection attempt) and, for the cluster status, as many
/// threads.
#[test]
fn a_status_with_absurd_members_is_refused() {
    let addr = scripted(|_, id| Response::Status {
        id,
        node: NodeStatus::default(),
        leader: None,
        members: (1..=2000)
            .map(|i| NodeInfo {
                id: i,
                client_addr: format!("10.0.{}.{}:7600", i / 256, i % 256),
            })
            .collect(),
    });
    let mut c = client(addr, false);
    let m = protocol_error(c.status(), "status");
    assert!(m.contains("Status"), "{m}");
    assert!(c.cluster_status().is_err());
}

/// A tail entry at the last possible index ends the tail with a protocol error (the next
/// index overflowed: a panic in debug builds, and in release a wrap to 0 that let every later
/// entry through). `Duration::MAX` is "no limit" to a poll.
#[test]
fn a_tail_entry_at_the_last_index_ends_the_tail() {
    let addr = scripted(|_, id| Response::Entries {
        id,
        commit: u64::MAX,
        entries: vec![
            Entry {
                index: 4,
                data: b"ok".to_vec(),
            },
            Entry {
                index: u64::MAX,
                data: b"x".to_vec(),
            },
        ],
    });
    let mut t = client(addr, false).tail(4).unwrap();
    let m = protocol_error(t.poll(Duration::MAX), "tail");
    assert!(m.contains(&u64::MAX.to_string()), "{m}");
    // Ended: no entry of that frame comes after the error, and no more frames are read.
    let m = protocol_error(t.poll(Duration::from_millis(100)), "tail after the error");
    assert!(m.contains("ended"), "{m}");
}

/// Timeouts the clock cannot add are a configuration error naming them (they panicked at the
/// first call), and so is a zero deadline (every call timed out at once).
#[test]
fn timeouts_past_the_clock_are_refused_by_name() {
    for (field, set) in [
        (
            "deadline",
            (|c: &mut ClientConfig| c.deadline = Duration::MAX) as fn(&mut _),
        ),
        ("deadline", |c| c.deadline = Duration::ZERO),
        ("connect_timeout", |c| c.connect_timeout = Duration::MAX),
        ("request_timeout", |c| c.request_timeout = Duration::MAX),
    ] {
        let mut cfg = ClientConfig::new(vec!["127.0.0.1:1".into()], 1);
        set(&mut cfg);
        match Client::connect(cfg) {
            Err(ClientError::Config(m)) => assert!(m.contains(field), "{m}"),
            other => panic!("{field}: {other:?}"),
        }
    }
}

/// A tail frame with an entry past the commit index the frame states ends the tail with a
/// protocol error, and none of the frame's entries is yielded: an entry past the commit is not
/// known to be in the log.
#[test]
fn a_tail_entry_past_its_frames_commit_ends_the_tail() {
    let addr = scripted(|_, id| Response::Entries {
        id,
        commit: 4,
        entries: vec![
            Entry {
                index: 4,
                data: b"ok".to_vec(),
            },
            Entry {
                index: 5,
                data: b"not committed".to_vec(),
            },
        ],
    });
    let mut t = client(addr, false).tail(4).unwrap();
    let m = protocol_error(t.poll(Duration::MAX), "tail");
    assert!(m.contains("index 5 past the commit index 4"), "{m}");
    let m = protocol_error(t.poll(Duration::from_millis(100)), "tail after the error");
    assert!(m.contains("ended"), "{m}");
}

/// A conditional append whose first send went unanswered (its connection broke) and whose
/// resend fails its condition: the first send may have committed, so the error says so
/// instead of "nothing was appended" (a resend fails its condition on its own first copy).
#[test]
fn a_condition_failed_after_an_unanswered_send_may_have_committed() {
    let sends = std::sync::atomic::AtomicUsize::new(0);
    let addr = scripted_or_close(move |r, id| match r {
        Request::AppendIf { expected_last, .. } => {
            if sends.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
                None
            } else {
                Some(Response::ConditionFailed {
                    id,
                    last: expected_last + 1,
                })
            }
        }
        _ => None,
    });
    match client(addr, false).append_if(&[b"x"], 7) {
        Err(
            e @ ClientError::ConditionFailed {
                expected: 7,
                last: 8,
                maybe_committed: true,
            },
        ) => {
            let m = e.to_string();
            assert!(
                m.contains("may have committed") && m.contains("read from 8"),
                "{m}"
            );
        }
        other => panic!("{other:?}"),
    }
}

/// A conditional append whose first send was answered `NotCommitted` (its entries are
/// certainly not in the log) and whose resend fails its condition: nothing was appended, and
/// the error says so (docs/PROTOCOL.md 6.1). It said "may have committed", as after a send
/// that went unanswered, sending the caller on a needless read (found by a review helper).
#[test]
fn a_condition_failed_after_not_committed_is_certain() {
    let sends = std::sync::atomic::AtomicUsize::new(0);
    let addr = scripted(move |r, id| match r {
        Request::AppendIf { expected_last, .. } => {
            if sends.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
                Response::Error {
                    id: Some(id),
                    code: ErrorCode::NotCommitted,
                    message: "a new leader's entries took its place".into(),
                }
            } else {
                Response::ConditionFailed {
                    id,
                    last: expected_last + 1,
                }
            }
        }
        _ => Response::Error {
            id: Some(id),
            code: ErrorCode::Internal,
            message: "unexpected".into(),
        },
    });
    match client(addr, false).append_if(&[b"x"], 7) {
        Err(ClientError::ConditionFailed {
            expected: 7,
            last: 8,
            maybe_committed: false,
        }) => {}
        other => panic!("{other:?}"),
    }
}

/// An exactly-once append whose first send went unanswered (its connection broke) and whose
/// resend is refused for good: the refusal says nothing of the first send, which may have
/// committed, and the error says so (`MaybeAppended`). It was a bare `Refused`, which the
/// crate docs did not count among the uncertain outcomes (found by a review helper).
#[test]
fn a_refusal_after_an_unanswered_session_append_says_the_batch_may_be_in_the_log() {
    let sends = std::sync::atomic::AtomicUsize::new(0);
    let addr = scripted_or_close(move |r, id| match r {
        Request::OpenSession { .. } => Some(Response::SessionOpened { id, session: 9 }),
        Request::AppendInSession { .. } => {
            if sends.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
                None
            } else {
                Some(Response::Error {
                    id: Some(id),
                    code: ErrorCode::Internal,
                    message: "the log failed".into(),
                })
            }
        }
        _ => None,
    });
    match client(addr, true).append(&[b"x"]) {
        Err(ClientError::MaybeAppended { cause }) => {
            assert_eq!(cause.code(), Some(ErrorCode::Internal), "{cause:?}");
        }
        other => panic!("{other:?}"),
    }
}

/// A conditional append answered as appended anywhere but right after the end it expected
/// (the server would have appended where the condition did not hold): a protocol error.
#[test]
fn a_conditional_append_answered_elsewhere_is_refused() {
    let addr = scripted(|r, id| match r {
        Request::AppendIf { expected_last, .. } => Response::Appended {
            id,
            first: expected_last + 5,
            last: expected_last + 5,
        },
        _ => Response::Error {
            id: Some(id),
            code: proto::ErrorCode::Internal,
            message: "unexpected".into(),
        },
    });
    let m = protocol_error(client(addr, false).append_if(&[b"x"], 7), "append_if");
    assert!(m.contains("ending at 7") && m.contains("from 12"), "{m}");
}
