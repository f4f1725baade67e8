//! A batch that a change of leader kept only in part: against a scripted server on loopback
//! (a change of leader that keeps a prefix of one batch cannot be provoked on purpose in a
//! real cluster), which answers the first `Append` with `PartlyAppended`. The client must not
//! resend anything, and must say which entries committed. This is the plain, at-least-once
//! `Append` (`exactly_once: false`); a session batch never gets `PartlyAppended`
//! (`tests/sessions.rs`).
//!
//! The same scripted server also closes a connection for idleness just as a request crosses
//! the close, which a real server does only in a window too small to hit on purpose.

use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use client::{Client, ClientConfig, ClientError};
use proto::{PROTOCOL_VERSION, Request, Response, Role, read_frame, write_frame};

/// Every batch a scripted server received, in order.
type Batches = Arc<Mutex<Vec<Vec<Vec<u8>>>>>;

/// Serves one client: the hello, then answers each `Append` with `answer(n, batch)` (the
/// n-th append, from 0) and records every batch it got.
fn scripted_server(
    answer: impl Fn(usize, u64, &[Vec<u8>]) -> Response + Send + 'static,
) -> (String, Batches) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let got = Batches::default();
    let seen = got.clone();
    std::thread::spawn(move || {
        for s in listener.incoming() {
            let mut s = s.unwrap();
            let max = proto::DEFAULT_MAX_FRAME_BYTES;
            match read_frame::<Request>(&mut s, max) {
                Ok(Request::Hello { version, .. }) => assert_eq!(version, PROTOCOL_VERSION),
                other => panic!("expected a hello, got {other:?}"),
            }
            let welcome = Response::Welcome {
                node_id: 1,
                leader: None,
                role: Role::ReadWrite,
            };
            write_frame(&mut s, &welcome).unwrap();
            while let Ok(req) = read_frame::<Request>(&mut s, max) {
                let Request::Append { id, entries } = req else {
                    panic!("expected an append, got {req:?}")
                };
                let n = {
                    let mut g = seen.lock().unwrap();
                    g.push(entries.clone());
                    g.len() - 1
                };
                write_frame(&mut s, &answer(n, id, &entries)).unwrap();
            }
        }
    });
    (addr, got)
}

fn client(addr: String) -> Client {
    let mut cfg = ClientConfig::new(vec![addr], 0xc1);
    cfg.deadline = Duration::from_secs(5);
    cfg.exactly_once = false;
    Client::connect(cfg).unwrap()
}

#[test]
fn a_partly_committed_batch_is_reported_and_not_resent() {
    let (addr, got) = scripted_server(|_, id, _| Response::PartlyAppended {
        id,
        first: 10,
        last: 11,
    });
    let mut c = client(addr);
    let e = c.append(&[b"a", b"b", b"c", b"d"]).unwrap_err();
    match &e {
        ClientError::PartlyCommitted {
            first: 10,
            last: 11,
            committed: 2,
            sent: 4,
        } => {}
        other => panic!("{other:?}"),
    }
    assert!(!e.is_transient());
    assert!(e.to_string().contains("first 2 of the batch's 4"), "{e}");
    // One append reached the server: nothing was resent.
    assert_eq!(got.lock().unwrap().len(), 1);
}

#[test]
fn a_partly_appended_answer_that_is_no_prefix_is_a_protocol_error() {
    // "Committed" 4 entries of a batch of 4 (not a part), and a reversed range.
    for (first, last) in [(10, 13), (11, 10)] {
        let (addr, got) =
            scripted_server(move |_, id, _| Response::PartlyAppended { id, first, last });
        let e = client(addr).append(&[b"a", b"b", b"c", b"d"]).unwrap_err();
        assert!(matches!(e, ClientError::Protocol(_)), "{e:?}");
        assert_eq!(got.lock().unwrap().len(), 1);
    }
}

/// A script: the first append is appended, every later one answered with a
/// connection-level `Malformed`.
fn appended_then_malformed(n: usize, id: u64, _: &[Vec<u8>]) -> Response {
    match n {
        0 => Response::Appended {
            id,
            first: 1,
            last: 1,
        },
        _ => Response::Error {
            id: None,
            code: proto::ErrorCode::Malformed,
            message: "a frame that does not decode".into(),
        },
    }
}

/// The server's idle close crossed the client's request on a connection unused for over a
/// second (the error frame answers the request, then the close): the request goes again, on
/// a new connection, and succeeds. A connection-level `Malformed` on a connection in use is
/// the client's fault, and returned.
#[test]
fn an_idle_close_crossing_a_request_is_retried_once() {
    let (addr, got) = scripted_server(|n, id, _| match n {
        1 => Response::Error {
            id: None,
            code: proto::ErrorCode::Malformed,
            message: "idle for more than 1s; closing".into(),
        },
        // Indexes start at 1.
        _ => Response::Appended {
            id,
            first: n as u64 + 1,
            last: n as u64 + 1,
        },
    });
    let mut c = client(addr);
    assert_eq!(c.append(&[b"first"]).unwrap(), (1, 1));
    std::thread::sleep(Duration::from_millis(1_200));
    assert_eq!(
        c.append(&[b"second"]).unwrap(),
        (3, 3),
        "resent once, on a new connection"
    );
    assert_eq!(got.lock().unwrap().len(), 3);

    // On a connection that has answered nothing yet, and again on the new connection after
    // one resend: returned.
    let (addr, got) = scripted_server(appended_then_malformed);
    let mut c = client(addr.clone());
    c.append(&[b"first"]).unwrap();
    std::thread::sleep(Duration::from_millis(1_200));
    let e = c.append(&[b"x"]).unwrap_err();
    assert_eq!(e.code(), Some(proto::ErrorCode::Malformed), "{e}");
    assert_eq!(got.lock().unwrap().len(), 3, "sent once, resent once");
    let mut c = client(addr);
    let e = c.append(&[b"y"]).unwrap_err();
    assert_eq!(e.code(), Some(proto::ErrorCode::Malformed), "{e}");
    assert_eq!(
        got.lock().unwrap().len(),
        4,
        "a fresh connection's Malformed is not resent"
    );

    // On a used connection without the idle second: returned too.
    let (addr, got) = scripted_server(appended_then_malformed);
    let mut c = client(addr);
    c.append(&[b"first"]).unwrap();
    let e = c.append(&[b"z"]).unwrap_err();
    assert_eq!(e.code(), Some(proto::ErrorCode::Malformed), "{e}");
    assert_eq!(
        got.lock().unwrap().len(),
        2,
        "a busy connection's Malformed is not resent"
    );
}
