//! Exactly-once appends (the default): against a scripted server on loopback, so that the
//! failures a client must survive happen exactly when the test wants them. The client opens a
//! session before its first append, resends the same session and numbers after a broken
//! connection and after a server's `Timeout`, numbers its next batch right after, and replaces
//! a session the cluster expired only for a batch it never sent with it. The real cluster's
//! side (duplicates answered with the first copy's index) is `server/tests/protocol.rs` and
//! `tests/client.rs`.

use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use client::{Client, ClientConfig, ClientError};
use proto::{ErrorCode, Request, Response, Role, read_frame, write_frame};

/// What the scripted server does with the n-th request it gets (from 0).
enum Act {
    Answer(Response),
    /// Close the connection without answering.
    Drop,
}

type Seen = Arc<Mutex<Vec<Request>>>;

fn scripted_server(script: impl Fn(usize, &Request) -> Act + Send + 'static) -> (String, Seen) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let seen = Seen::default();
    let log = seen.clone();
    std::thread::spawn(move || {
        for s in listener.incoming() {
            let mut s = s.unwrap();
            let max = proto::DEFAULT_MAX_FRAME_BYTES;
            if !matches!(
                read_frame::<Request>(&mut s, max),
                Ok(Request::Hello { .. })
            ) {
                continue;
            }
            let welcome = Response::Welcome {
                node_id: 1,
                leader: None,
                role: Role::ReadWrite,
            };
            write_frame(&mut s, &welcome).unwrap();
            while let Ok(req) = read_frame::<Request>(&mut s, max) {
                let n = {
                    let mut g = log.lock().unwrap();
                    g.push(req.clone());
                    g.len() - 1
                };
                match script(n, &req) {
                    Act::Answer(r) => write_frame(&mut s, &r).unwrap(),
                    Act::Drop => break,
                }
            }
        }
    });
    (addr, seen)
}

fn id_of(r: &Request) -> u64 {
    match r {
        Request::OpenSession { id } | Request::AppendInSession { id, .. } => *id,
        other => panic!("unexpected {other:?}"),
    }
}

/// The session and first number of an `AppendInSession`.
fn numbers(r: &Request) -> (u64, u64, usize) {
    match r {
        Request::AppendInSession {
            session,
            first_seq,
            entries,
            ..
        } => (*session, *first_seq, entries.len()),
        other => panic!("expected AppendInSession, got {other:?}"),
    }
}

/// Answers opens with sessions 100, 101, ... and appends with consecutive indexes from 1000.
fn opened(n: usize, r: &Request) -> Response {
    Response::SessionOpened {
        id: id_of(r),
        session: 100 + n as u64,
    }
}

fn appended(r: &Request, first: u64) -> Response {
    let (_, _, len) = numbers(r);
    Response::AppendedAt {
        id: id_of(r),
        indexes: (first..first + len as u64).collect(),
    }
}

fn client(addr: String) -> Client {
    let mut cfg = ClientConfig::new(vec![addr], 0xc1);
    cfg.deadline = Duration::from_secs(5);
    Client::connect(cfg).unwrap()
}

#[test]
fn a_resend_after_a_broken_connection_or_a_timeout_reuses_the_numbers() {
    let (addr, seen) = scripted_server(|n, r| match (n, r) {
        (_, Request::OpenSession { .. }) => Act::Answer(opened(n, r)),
        // The first send of the first batch: the connection breaks before the answer.
        (1, _) => Act::Drop,
        // Its resend: the server could not tell in time.
        (2, _) => Act::Answer(Response::Error {
            id: Some(id_of(r)),
            code: ErrorCode::Timeout,
            message: "not committed within 10s".into(),
        }),
        _ => Act::Answer(appended(r, 1000)),
    });
    let mut c = client(addr);
    assert_eq!(c.append(&[b"a", b"b"]).unwrap(), (1000, 1001));
    assert_eq!(c.session(), Some((100, 3)));
    assert_eq!(c.append_at(&[b"c"]).unwrap(), [1000]);
    let got = seen.lock().unwrap();
    assert!(matches!(got[0], Request::OpenSession { .. }));
    // Three sends of the first batch, all with session 100 and numbers 1..=2; then the next
    // batch starts at 3. No second session was opened.
    assert_eq!(numbers(&got[1]), (100, 1, 2));
    assert_eq!(numbers(&got[2]), (100, 1, 2));
    assert_eq!(numbers(&got[3]), (100, 1, 2));
    assert_eq!(numbers(&got[4]), (100, 3, 1));
    assert_eq!(got.len(), 5);
}

#[test]
fn an_expired_session_is_replaced_only_for_a_batch_never_sent_with_it() {
    let (addr, seen) = scripted_server(|n, r| match (n, r) {
        (_, Request::OpenSession { .. }) => Act::Answer(opened(n, r)),
        (1, _) => Act::Answer(appended(r, 10)),
        // The cluster expired session 100 before the second batch's first send.
        (_, Request::AppendInSession { session: 100, .. }) => Act::Answer(Response::Error {
            id: Some(id_of(r)),
            code: ErrorCode::UnknownSession,
            message: "session 100 is unknown".into(),
        }),
        _ => Act::Answer(appended(r, 20)),
    });
    let mut c = client(addr);
    c.append(&[b"a"]).unwrap();
    assert_eq!(c.append(&[b"b"]).unwrap(), (20, 20));
    {
        let got = seen.lock().unwrap();
        assert_eq!(numbers(&got[2]), (100, 2, 1));
        assert!(matches!(got[3], Request::OpenSession { .. }));
        assert_eq!(numbers(&got[4]), (103, 1, 1));
    }
    assert_eq!(c.session(), Some((103, 2)));

    // A batch whose first send broke and whose resend finds the session expired may be in
    // the log: the error says so and nothing is sent with a new session.
    let (addr, seen) = scripted_server(|n, r| match (n, r) {
        (_, Request::OpenSession { .. }) => Act::Answer(opened(n, r)),
        (1, _) => Act::Drop,
        _ => Act::Answer(Response::Error {
            id: Some(id_of(r)),
            code: ErrorCode::UnknownSession,
            message: "session 100 is unknown".into(),
        }),
    });
    let mut c = client(addr);
    let e = c.append(&[b"a"]).unwrap_err();
    assert!(
        matches!(
            e,
            ClientError::Refused {
                code: ErrorCode::UnknownSession,
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(c.session(), None, "the next append opens a new session");
    assert_eq!(seen.lock().unwrap().len(), 3);
}

#[test]
fn without_exactly_once_appends_are_plain() {
    let (addr, seen) = scripted_server(|_, r| match r {
        Request::Append { id, .. } => Act::Answer(Response::Appended {
            id: *id,
            first: 5,
            last: 5,
        }),
        other => panic!("unexpected {other:?}"),
    });
    let mut cfg = ClientConfig::new(vec![addr], 0xc1);
    cfg.exactly_once = false;
    let mut c = Client::connect(cfg).unwrap();
    assert_eq!(c.append(&[b"a"]).unwrap(), (5, 5));
    assert_eq!(c.session(), None);
    assert_eq!(seen.lock().unwrap().len(), 1);
}
