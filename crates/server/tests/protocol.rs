//! The client protocol end to end: three real servers (real TCP, real TLS) over three replicas
//! on the in-process fabric. Checks the happy path (append, read, tail, status, redirect), every
//! kind of bad input (wrong version, wrong cluster, oversized and malformed frames, a
//! slow-loris client, an unknown token, too many connections), roles, TLS with and without
//! client certificates, the metrics endpoint, and graceful shutdown. After each bad client the
//! server still serves a good one, and every acknowledged entry is readable.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use proto::{
    ErrorCode, NodeInfo, PROTOCOL_VERSION, Request, Response, Role, read_frame, write_frame,
};
use server::ServerOptions;

use server::testing::{CLUSTER, SimServers as Cluster};

/// Three replicas and three servers; `tune` adjusts each server's options.
fn cluster(tune: impl Fn(&mut ServerOptions)) -> Cluster {
    Cluster::start(11, tune)
}

/// A raw protocol client over any stream.
struct Client<S: Read + Write> {
    s: S,
    next: u64,
}

fn hello_frame(token: Option<&str>) -> Request {
    Request::Hello {
        version: PROTOCOL_VERSION,
        cluster_id: CLUSTER,
        token: token.map(str::to_string),
    }
}

impl<S: Read + Write> Client<S> {
    fn recv(&mut self) -> Response {
        read_frame(&mut self.s, proto::DEFAULT_MAX_FRAME_BYTES).expect("a response frame")
    }

    fn call(&mut self, make: impl FnOnce(u64) -> Request) -> Response {
        self.next += 1;
        write_frame(&mut self.s, &make(self.next)).unwrap();
        self.recv()
    }

    fn hello(s: S, token: Option<&str>) -> (Client<S>, Response) {
        let mut c = Client { s, next: 0 };
        write_frame(&mut c.s, &hello_frame(token)).unwrap();
        let r = c.recv();
        (c, r)
    }
}

fn tcp(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s
}

fn connect(addr: SocketAddr, token: Option<&str>) -> Client<TcpStream> {
    let (c, r) = Client::hello(tcp(addr), token);
    assert!(matches!(r, Response::Welcome { .. }), "{r:?}");
    c
}

/// The error frame a refused connection gets, and that it is closed afterwards.
fn refused(mut s: TcpStream) -> (ErrorCode, String) {
    let r: Response = read_frame(&mut s, proto::DEFAULT_MAX_FRAME_BYTES).expect("an error frame");
    let Response::Error {
        id: None,
        code,
        message,
    } = r
    else {
        panic!("expected a connection error, got {r:?}");
    };
    let mut rest = [0u8; 1];
    assert_eq!(
        s.read(&mut rest).unwrap_or(0),
        0,
        "the connection stays open after {code:?}"
    );
    (code, message)
}

fn append(c: &mut Client<TcpStream>, data: &[u8]) -> Response {
    c.call(|id| Request::Append {
        id,
        entries: vec![data.to_vec()],
    })
}

#[test]
fn append_read_tail_status_and_redirect() {
    let c = cluster(|_| {});
    let l = c.leader();
    let mut client = connect(c.server(l).client_addr(), None);
    let r = client.call(|id| Request::Append {
        id,
        entries: vec![b"one".to_vec(), b"two".to_vec(), b"three".to_vec()],
    });
    let Response::Appended { first, last, .. } = r else {
        panic!("{r:?}")
    };
    assert_eq!(last, first + 2);
    // A follower redirects appends to the leader's client address.
    let f = if l == 1 { 2 } else { 1 };
    let mut fc = connect(c.server(f).client_addr(), None);
    match append(&mut fc, b"x") {
        Response::Redirect {
            leader: Some(NodeInfo { id, client_addr }),
            ..
        } => {
            assert_eq!(id, l);
            assert_eq!(client_addr, c.server(l).client_addr().to_string());
        }
        other => panic!("expected a redirect, got {other:?}"),
    }
    // Read from the follower once it committed.
    let deadline = Instant::now() + Duration::from_secs(10);
    let got = loop {
        let r = fc.call(|id| Request::Read {
            id,
            from: first,
            max_bytes: 1 << 20,
        });
        let Response::Entries { entries, .. } = r else {
            panic!("{r:?}")
        };
        if entries.len() == 3 || Instant::now() > deadline {
            break entries;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let data: Vec<&[u8]> = got.iter().map(|e| e.data.as_slice()).collect();
    assert_eq!(data, [&b"one"[..], b"two", b"three"]);
    // Status names the leader and every member.
    let r = fc.call(|id| Request::Status { id });
    let Response::Status {
        node,
        leader,
        members,
        ..
    } = r
    else {
        panic!("{r:?}")
    };
    assert_eq!(node.id, f);
    assert_eq!(leader.map(|n| n.id), Some(l));
    assert_eq!(members.len(), 3);
    // Tail streams what commits, in order.
    let mut tail = connect(c.server(f).client_addr(), None);
    tail.next += 1;
    write_frame(
        &mut tail.s,
        &Request::Tail {
            id: 99,
            from: first,
        },
    )
    .unwrap();
    let mut seen = Vec::new();
    while seen.len() < 4 {
        if seen.len() == 3 {
            assert!(matches!(
                append(&mut client, b"four"),
                Response::Appended { .. }
            ));
        }
        match tail.recv() {
            Response::Entries {
                id: 99, entries, ..
            } => seen.extend(entries.into_iter().map(|e| e.data)),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(seen[3], b"four");
}

#[test]
fn bad_input_is_refused_and_the_server_keeps_serving() {
    let c = cluster(|o| {
        o.frame_timeout = Duration::from_millis(500);
        o.max_frame_bytes = 64 << 10;
    });
    let l = c.leader();
    let addr = c.server(l).client_addr();
    let mut good = connect(addr, None);
    assert!(matches!(
        append(&mut good, b"before"),
        Response::Appended { .. }
    ));

    // Wrong version.
    let mut s = tcp(addr);
    write_frame(
        &mut s,
        &Request::Hello {
            version: 99,
            cluster_id: CLUSTER,
            token: None,
        },
    )
    .unwrap();
    assert_eq!(refused(s).0, ErrorCode::WrongVersion);
    // Wrong cluster.
    let mut s = tcp(addr);
    write_frame(
        &mut s,
        &Request::Hello {
            version: PROTOCOL_VERSION,
            cluster_id: 7,
            token: None,
        },
    )
    .unwrap();
    let (code, msg) = refused(s);
    assert_eq!(code, ErrorCode::WrongCluster);
    assert!(msg.contains("0xc1"), "{msg}");
    // An oversized frame: only its length prefix is sent.
    let mut s = tcp(addr);
    s.write_all(&(100u32 << 20).to_le_bytes()).unwrap();
    assert_eq!(refused(s).0, ErrorCode::TooLarge);
    // Garbage of a valid length.
    let mut s = tcp(addr);
    s.write_all(&8u32.to_le_bytes()).unwrap();
    s.write_all(&[0xff; 8]).unwrap();
    assert_eq!(refused(s).0, ErrorCode::Malformed);
    // A request before the hello.
    let mut s = tcp(addr);
    write_frame(&mut s, &Request::Status { id: 1 }).unwrap();
    assert_eq!(refused(s).0, ErrorCode::Malformed);
    // Slow loris: half a frame, then nothing. Closed after the frame timeout.
    let mut s = tcp(addr);
    let t0 = Instant::now();
    s.write_all(&[20, 0]).unwrap();
    let (code, msg) = refused(s);
    assert_eq!(code, ErrorCode::Malformed);
    assert!(
        t0.elapsed() >= Duration::from_millis(400),
        "closed too early"
    );
    assert!(msg.contains("no hello") || msg.contains("slow"), "{msg}");
    // Oversized after the hello: refused too, and the good client still gets its answers.
    let mut big = connect(addr, None);
    let r = big.call(|id| Request::Append {
        id,
        entries: vec![vec![0; 100 << 10]],
    });
    assert!(
        matches!(
            r,
            Response::Error {
                id: None,
                code: ErrorCode::TooLarge,
                ..
            }
        ),
        "{r:?}"
    );
    assert!(matches!(
        append(&mut good, b"after"),
        Response::Appended { .. }
    ));
    // Nothing acknowledged was lost.
    let r = good.call(|id| Request::Read {
        id,
        from: 1,
        max_bytes: 1 << 20,
    });
    let Response::Entries { entries, .. } = r else {
        panic!("{r:?}")
    };
    let data: Vec<&[u8]> = entries.iter().map(|e| e.data.as_slice()).collect();
    assert_eq!(data, [&b"before"[..], b"after"]);
    let m = get(c.server(l).metrics_addr().unwrap(), "/metrics");
    assert!(m.contains("rdmalog_rejected_connections_total 7"), "{m}");
}

#[test]
fn roles_tokens_and_the_connection_limit() {
    let c = cluster(|o| {
        o.tokens
            .insert("writer-token-0123456789".into(), Role::ReadWrite);
        o.tokens
            .insert("reader-token-0123456789".into(), Role::ReadOnly);
        o.anonymous_role = None;
        o.max_connections = 3;
    });
    let l = c.leader();
    let addr = c.server(l).client_addr();
    // No token, and a guessed one: both unauthorized.
    for token in [None, Some("guessed")] {
        let (s, r) = Client::hello(tcp(addr), token);
        assert!(
            matches!(
                r,
                Response::Error {
                    code: ErrorCode::Unauthorized,
                    ..
                }
            ),
            "{token:?}: {r:?}"
        );
        drop(s);
    }
    let mut reader = connect(addr, Some("reader-token-0123456789"));
    let r = append(&mut reader, b"nope");
    assert!(
        matches!(
            r,
            Response::Error {
                code: ErrorCode::Unauthorized,
                ..
            }
        ),
        "{r:?}"
    );
    assert!(matches!(
        reader.call(|id| Request::Status { id }),
        Response::Status { .. }
    ));
    let r = reader.call(|id| Request::Members {
        id,
        add: true,
        node: 9,
    });
    assert!(
        matches!(
            r,
            Response::Error {
                code: ErrorCode::Unauthorized,
                ..
            }
        ),
        "{r:?}"
    );
    let mut writer = connect(addr, Some("writer-token-0123456789"));
    assert!(matches!(
        append(&mut writer, b"yes"),
        Response::Appended { .. }
    ));
    // Two connections are open; let the refused ones finish closing, then fill the limit.
    std::thread::sleep(Duration::from_millis(200));
    let _third = connect(addr, Some("reader-token-0123456789"));
    let (code, msg) = refused(tcp(addr));
    assert_eq!(code, ErrorCode::Busy);
    assert!(msg.contains("limit of 3"), "{msg}");
    // The two hellos without a good token are rejections; the Busy one is counted apart.
    let m = get(c.server(l).metrics_addr().unwrap(), "/metrics");
    assert!(m.contains("rdmalog_rejected_connections_total 2\n"), "{m}");
    assert!(m.contains("rdmalog_busy_refusals_total 1\n"), "{m}");
}

/// Past twice `max_connections` a connection is closed at once, not served a refusal: under
/// TLS the refusal's `Busy` comes after a handshake of up to `frame_timeout` on a thread of its
/// own, so a flood of connections grew threads without bound. Two connections fill the limit
/// and two more wait in their refusal's handshake (none of them sends a byte); the fifth is
/// closed at once and counted.
#[test]
fn past_twice_the_connection_limit_a_connection_is_closed_at_once() {
    use std::io::Read;
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new("rdmalog test CA");
    let (cert, key) = pki.issue("localhost", dir.path());
    let c = cluster(|o| {
        o.tls = Some(server::tls::server_config(&cert, &key, None).unwrap());
        o.max_connections = 2;
        o.frame_timeout = Duration::from_secs(10);
    });
    let l = c.leader();
    let addr = c.server(l).client_addr();
    let held: Vec<TcpStream> = (0..4).map(|_| tcp(addr)).collect();
    // Let the server count them before the fifth.
    std::thread::sleep(Duration::from_millis(300));
    let mut fifth = tcp(addr);
    fifth
        .set_read_timeout(Some(Duration::from_secs(3)))
        .unwrap();
    let start = Instant::now();
    let closed = match fifth.read(&mut [0u8; 16]) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => !matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
    };
    assert!(
        closed,
        "the fifth connection was kept for {:?}",
        start.elapsed()
    );
    let m = get(c.server(l).metrics_addr().unwrap(), "/metrics");
    assert!(m.contains("rdmalog_busy_refusals_total 1\n"), "{m}");
    drop(held);
}

#[test]
fn shutdown_fails_pending_work_with_a_clear_error() {
    let mut c = cluster(|_| {});
    let l = c.leader();
    let mut client = connect(c.server(l).client_addr(), None);
    let kept = match append(&mut client, b"kept") {
        Response::Appended { first, .. } => first,
        other => panic!("{other:?}"),
    };
    let handle = c.servers[l as usize - 1].take().unwrap();
    let log = handle.log().clone();
    handle.shutdown(Duration::from_millis(100));
    let r = client.recv();
    assert!(
        matches!(
            r,
            Response::Error {
                id: None,
                code: ErrorCode::ShuttingDown,
                ..
            }
        ),
        "{r:?}"
    );
    // The acknowledged entry is in the stopped server's log at the index it was given. (Not
    // necessarily at its commit index: on a loaded machine an election may have committed a
    // new leader's no-op after it, which `read` reports as no application entry.)
    assert!(log.status().commit >= kept, "{:?}", log.status());
    assert_eq!(log.read(kept).unwrap().as_deref(), Some(&b"kept"[..]));
}

/// `shutdown(grace)` gives an append that cannot commit (its leader cut off from both
/// followers) `grace` to resolve, not a fixed time: with 300 ms it is answered `ShuttingDown`
/// within about that (it was 5 s whatever the grace).
#[test]
fn shutdown_waits_its_grace_for_pending_appends() {
    use fabric::NodeId;
    let grace = Duration::from_millis(300);
    let mut c = cluster(|_| {});
    let l = c.leader();
    let mut client = connect(c.server(l).client_addr(), None);
    assert!(matches!(
        append(&mut client, b"warm"),
        Response::Appended { .. }
    ));
    for f in (1..=3).filter(|&f| f != l) {
        c.net.set_link(NodeId(l), NodeId(f), false);
        c.net.set_link(NodeId(f), NodeId(l), false);
    }
    client.next += 1;
    let id = client.next;
    let pending = Request::Append {
        id,
        entries: vec![b"pending".to_vec()],
    };
    write_frame(&mut client.s, &pending).unwrap();
    std::thread::sleep(Duration::from_millis(100)); // the append is pending
    let handle = c.servers[l as usize - 1].take().unwrap();
    let t = Instant::now();
    handle.shutdown(grace);
    let r = client.recv();
    let took = t.elapsed();
    assert!(
        matches!(
            r,
            Response::Error {
                code: ErrorCode::ShuttingDown,
                ..
            }
        ),
        "{r:?}"
    );
    assert!(
        took >= grace - Duration::from_millis(50) && took < grace + Duration::from_millis(900),
        "answered after {took:?} with a grace of {grace:?}"
    );
}

/// With no grace at all, an append that already committed is still answered `Appended`, not
/// `ShuttingDown` ("may or may not have committed"), which would invite a duplicate resend.
#[test]
fn shutdown_without_grace_answers_what_already_committed() {
    let mut c = cluster(|_| {});
    let l = c.leader();
    let mut client = connect(c.server(l).client_addr(), None);
    let log = c.server(l).log().clone();
    let before = log.status().last_index;
    // A read that waits (pending ahead), then an append pipelined behind it that commits.
    client.next += 1;
    let read = Request::ReadWith {
        id: client.next,
        from: 1,
        max_bytes: 1 << 20,
        consistency: proto::ReadConsistency::AtLeast(1 << 40),
    };
    write_frame(&mut client.s, &read).unwrap();
    client.next += 1;
    let id = client.next;
    let append = Request::Append {
        id,
        entries: vec![b"committed".to_vec()],
    };
    write_frame(&mut client.s, &append).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let committed = |log: &replica::Log<_>| {
        (before + 1..=log.status().commit)
            .any(|i| log.read(i).ok().flatten().as_deref() == Some(&b"committed"[..]))
    };
    while !committed(&log) {
        assert!(Instant::now() < deadline, "the append never committed");
        std::thread::sleep(Duration::from_millis(5));
    }
    let handle = c.servers[l as usize - 1].take().unwrap();
    handle.shutdown(Duration::ZERO);
    let answers = [client.recv(), client.recv()];
    assert!(
        matches!(
            answers[0],
            Response::Error {
                code: ErrorCode::ShuttingDown,
                ..
            }
        ),
        "the waiting read: {:?}",
        answers[0]
    );
    assert!(
        matches!(answers[1], Response::Appended { .. }),
        "the committed append: {:?}",
        answers[1]
    );
}

fn get(addr: SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// The metrics endpoint serves one scrape at a time: a client that trickles its request a
/// byte at a time is cut after 2 s as a whole, and a scrape behind it is answered. Before,
/// each byte arrived within its read's timeout and the trickle held the endpoint for as long
/// as it liked (8 KiB at a byte every 300 ms: 40 minutes).
#[test]
fn a_trickled_metrics_request_does_not_hold_the_endpoint() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let c = cluster(|_| {});
    let l = c.leader();
    let addr = c.server(l).metrics_addr().unwrap();
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let stopped = stop.clone();
    let trickler = std::thread::spawn(move || {
        let mut s = TcpStream::connect(addr).unwrap();
        let start = Instant::now();
        while !stopped.load(Ordering::Relaxed) && start.elapsed() < Duration::from_secs(20) {
            if s.write_all(b"G").is_err() {
                return start.elapsed();
            }
            std::thread::sleep(Duration::from_millis(300));
        }
        start.elapsed()
    });
    std::thread::sleep(Duration::from_millis(200));
    let start = Instant::now();
    let m = get(addr, "/metrics");
    let took = start.elapsed();
    stop.store(true, Ordering::Relaxed);
    assert!(m.starts_with("HTTP/1.0 200 OK"), "{m}");
    assert!(took < Duration::from_secs(5), "a scrape waited {took:?}");
    let held = trickler.join().unwrap();
    println!("scrape answered after {took:?}; the trickler was cut after {held:?}");
}

#[test]
fn metrics_and_status_endpoints() {
    let c = cluster(|_| {});
    let l = c.leader();
    let mut client = connect(c.server(l).client_addr(), None);
    for i in 0..5u8 {
        assert!(matches!(
            append(&mut client, &[i; 100]),
            Response::Appended { .. }
        ));
    }
    let m = get(c.server(l).metrics_addr().unwrap(), "/metrics");
    assert!(m.starts_with("HTTP/1.0 200 OK"), "{m}");
    for needle in [
        "rdmalog_append_latency_seconds_count 5",
        "rdmalog_appended_entries_total 5",
        "rdmalog_is_leader 1",
        "rdmalog_work_completions_total{status=\"success\"}",
        "rdmalog_fsync_seconds_count",
        "rdmalog_ring_used_bytes",
        "rdmalog_fenced_writes_total 0",
        "process_cpu_seconds_total",
        "rdmalog_work_completions_total{status=\"retry_exceeded\"}",
        "rdmalog_work_completions_total{status=\"flushed\"}",
    ] {
        assert!(m.contains(needle), "missing {needle} in\n{m}");
    }
    // Every metric the operator guide names is served (read from the guide, so a name it
    // gains or changes is checked too).
    let guide = include_str!("../../../ops/GUIDE.md");
    let mut named = std::collections::BTreeSet::new();
    for (at, _) in guide.match_indices("rdmalog_") {
        let name: String = guide[at..]
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
            .collect();
        named.insert(name);
    }
    assert!(named.len() >= 10, "the guide names only {named:?}");
    for name in &named {
        assert!(
            m.lines().any(|l| l.starts_with(&format!("{name} "))
                || l.starts_with(&format!("{name}{{"))
                || l.starts_with(&format!("{name}_"))),
            "ops/GUIDE.md names {name}, which /metrics does not serve:\n{m}"
        );
    }
    let s = get(c.server(l).metrics_addr().unwrap(), "/status");
    let body = s.split("\r\n\r\n").nth(1).unwrap();
    let v: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(v["id"], l);
    assert_eq!(v["role"], "leader");
    assert!(v["commit"].as_u64().unwrap() >= 5);
    assert_eq!(v["members"].as_array().unwrap().len(), 3);
    assert!(get(c.server(l).metrics_addr().unwrap(), "/nope").starts_with("HTTP/1.0 404"));
}

/// A CA, and certificates it signs, written as PEM files under `dir`.
struct Pki {
    ca: rcgen::CertifiedIssuer<'static, rcgen::KeyPair>,
}

impl Pki {
    fn new(name: &str) -> Pki {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        let key = rcgen::KeyPair::generate().unwrap();
        Pki {
            ca: rcgen::CertifiedIssuer::self_signed(params, key).unwrap(),
        }
    }

    fn write_ca(&self, path: &Path) {
        std::fs::write(path, self.ca.pem()).unwrap();
    }

    fn issue(&self, name: &str, dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
        let params = rcgen::CertificateParams::new(vec![name.to_string()]).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.ca).unwrap();
        let (c, k) = (
            dir.join(format!("{name}.crt")),
            dir.join(format!("{name}.key")),
        );
        std::fs::write(&c, cert.pem()).unwrap();
        std::fs::write(&k, key.serialize_pem()).unwrap();
        // A private key is refused unless it is its owner's only.
        std::fs::set_permissions(&k, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        (c, k)
    }
}

fn tls_connect(
    addr: SocketAddr,
    ca: &Path,
    client: Option<(&Path, &Path)>,
) -> std::io::Result<rustls::StreamOwned<rustls::ClientConnection, TcpStream>> {
    let cfg = client::tls::client_config(ca, client).unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let conn = rustls::ClientConnection::new(cfg, name).unwrap();
    let mut s = rustls::StreamOwned::new(conn, tcp(addr));
    while s.conn.is_handshaking() {
        s.conn.complete_io(&mut s.sock)?;
    }
    Ok(s)
}

#[test]
fn tls_with_and_without_client_certificates() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new("rdmalog test CA");
    let ca = dir.path().join("ca.pem");
    pki.write_ca(&ca);
    let (cert, key) = pki.issue("localhost", dir.path());
    let (ccert, ckey) = pki.issue("client", dir.path());
    let rogue = Pki::new("someone else");
    let rogue_ca = dir.path().join("rogue-ca.pem");
    rogue.write_ca(&rogue_ca);
    let rdir = dir.path().join("rogue");
    std::fs::create_dir(&rdir).unwrap();
    let (rcert, rkey) = rogue.issue("client", &rdir);

    let with_client_auth = |o: &mut ServerOptions| {
        o.tls = Some(server::tls::server_config(&cert, &key, Some(&ca)).unwrap());
    };
    let c = cluster(with_client_auth);
    let l = c.leader();
    let addr = c.server(l).client_addr();
    // A trusted client with a certificate from the CA: served.
    let s = tls_connect(addr, &ca, Some((&ccert, &ckey))).unwrap();
    let (mut client, r) = Client::hello(s, None);
    assert!(matches!(r, Response::Welcome { .. }), "{r:?}");
    let r = client.call(|id| Request::Append {
        id,
        entries: vec![b"over tls".to_vec()],
    });
    assert!(matches!(r, Response::Appended { .. }), "{r:?}");
    // A client certificate from another CA: refused during the handshake.
    // (TLS 1.3 finishes the client's side of the handshake first; the refusal arrives as an
    // alert on its first read.)
    let served = |s: std::io::Result<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>| {
        s.map_err(|e| e.to_string()).and_then(|mut s| {
            write_frame(&mut s, &hello_frame(None)).map_err(|e| e.to_string())?;
            read_frame::<Response>(&mut s, 1024).map_err(|e| e.to_string())
        })
    };
    let r = served(tls_connect(addr, &ca, Some((&rcert, &rkey))));
    assert!(
        r.is_err(),
        "an untrusted client certificate was accepted: {r:?}"
    );
    // No client certificate at all: refused.
    let r = served(tls_connect(addr, &ca, None));
    assert!(
        r.is_err(),
        "a client without a certificate was accepted: {r:?}"
    );
    // A client that does not trust the server's CA refuses the server.
    assert!(tls_connect(addr, &rogue_ca, Some((&ccert, &ckey))).is_err());
    // Plain TCP to a TLS port gets nowhere.
    let mut s = tcp(addr);
    write_frame(&mut s, &hello_frame(None)).unwrap();
    assert!(read_frame::<Response>(&mut s, 1024).is_err());
    let m = get(c.server(l).metrics_addr().unwrap(), "/metrics");
    assert!(!m.contains("rdmalog_rejected_connections_total 0"), "{m}");
}

/// A TLS 1.2 client is served as a TLS 1.3 one: the server's last flight of the handshake (its
/// Finished, which a 1.2 client waits for before it says anything) goes out within it.
#[test]
fn a_tls_1_2_client_is_served() {
    use rustls::pki_types::pem::PemObject;
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new("rdmalog test CA");
    let ca = dir.path().join("ca.pem");
    pki.write_ca(&ca);
    let (cert, key) = pki.issue("localhost", dir.path());
    let c = cluster(|o| o.tls = Some(server::tls::server_config(&cert, &key, None).unwrap()));
    let l = c.leader();
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(rustls::pki_types::CertificateDer::from_pem_file(&ca).unwrap())
        .unwrap();
    let cfg = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS12])
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let conn = rustls::ClientConnection::new(std::sync::Arc::new(cfg), name).unwrap();
    let mut s = rustls::StreamOwned::new(conn, tcp(c.server(l).client_addr()));
    while s.conn.is_handshaking() {
        s.conn.complete_io(&mut s.sock).unwrap();
    }
    assert_eq!(
        s.conn.protocol_version(),
        Some(rustls::ProtocolVersion::TLSv1_2)
    );
    let (mut client, r) = Client::hello(s, None);
    assert!(matches!(r, Response::Welcome { .. }), "{r:?}");
    let r = client.call(|id| Request::Append {
        id,
        entries: vec![b"over tls 1.2".to_vec()],
    });
    assert!(matches!(r, Response::Appended { .. }), "{r:?}");
}

/// A TLS handshake is bounded by `frame_timeout` as a whole, like the hello after it: a
/// client that sends nothing, and one that trickles its ClientHello a byte at a time (each
/// read of the server's then succeeds before its timeout), are both disconnected and counted
/// as refused. Before, the trickling one held its connection slot for as long as it kept
/// sending.
#[test]
fn a_stalled_or_trickled_tls_handshake_is_cut_at_frame_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new("rdmalog test CA");
    let (cert, key) = pki.issue("localhost", dir.path());
    let frame_timeout = Duration::from_millis(500);
    let c = cluster(|o| {
        o.tls = Some(server::tls::server_config(&cert, &key, None).unwrap());
        o.frame_timeout = frame_timeout;
    });
    let l = c.leader();
    let addr = c.server(l).client_addr();
    for trickle in [false, true] {
        // Before the connect: the server's deadline starts at its accept.
        let start = Instant::now();
        let mut s = tcp(addr);
        if trickle {
            // A handshake record's header announcing 16 KiB, then its bytes one at a time,
            // each well inside the server's read timeout.
            s.write_all(&[0x16, 0x03, 0x01, 0x40, 0x00]).unwrap();
        }
        let cut = loop {
            if trickle && s.write_all(&[0x01]).is_err() {
                break start.elapsed();
            }
            if closed_by_server(&mut s, Duration::from_millis(100)) {
                break start.elapsed();
            }
            assert!(
                start.elapsed() < frame_timeout * 10,
                "a TLS handshake (trickled: {trickle}) still open after {:?}",
                start.elapsed()
            );
            std::thread::sleep(Duration::from_millis(100));
        };
        assert!(
            cut >= frame_timeout,
            "cut after {cut:?} (trickled: {trickle})"
        );
        println!("a TLS handshake (trickled: {trickle}) was cut after {cut:?}");
    }
    let m = get(c.server(l).metrics_addr().unwrap(), "/metrics");
    assert!(m.contains("rdmalog_rejected_connections_total 2"), "{m}");
}

/// Whether the server has closed `s`: a read within `wait` sees the end or a reset, not a
/// timeout (bytes before the end, an error frame or a TLS alert, are read and pass).
fn closed_by_server(s: &mut TcpStream, wait: Duration) -> bool {
    s.set_read_timeout(Some(wait)).unwrap();
    match s.read(&mut [0u8; 256]) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => !matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
    }
}

/// "A frame must arrive whole within `frame_timeout`" and "the hello within `frame_timeout`
/// of the handshake" (docs/PROTOCOL.md) under TLS too: a client that sends a TLS record's
/// header announcing 16 KiB and then one byte every 50 ms, before its hello or after it, is
/// cut at about `frame_timeout`. rustls's `StreamOwned::read` looped inside until the record
/// was whole, each socket read beating the timeout, so such a client held its connection slot
/// for 14 minutes a record, and then the next.
#[test]
fn a_client_trickling_a_tls_record_is_cut_at_frame_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new("rdmalog test CA");
    let ca = dir.path().join("ca.pem");
    pki.write_ca(&ca);
    let (cert, key) = pki.issue("localhost", dir.path());
    let frame_timeout = Duration::from_millis(500);
    let c = cluster(|o| {
        o.tls = Some(server::tls::server_config(&cert, &key, None).unwrap());
        o.frame_timeout = frame_timeout;
    });
    let l = c.leader();
    let addr = c.server(l).client_addr();
    for hello_first in [false, true] {
        let s = tls_connect(addr, &ca, None).unwrap();
        let mut s = if hello_first {
            let (client, r) = Client::hello(s, None);
            assert!(matches!(r, Response::Welcome { .. }), "{r:?}");
            client.s
        } else {
            s
        };
        let start = Instant::now();
        s.sock.write_all(&[0x17, 0x03, 0x03, 0x40, 0x00]).unwrap();
        let cut = loop {
            if s.sock.write_all(&[0x01]).is_err() {
                break start.elapsed();
            }
            if closed_by_server(&mut s.sock, Duration::from_millis(50)) {
                break start.elapsed();
            }
            assert!(
                start.elapsed() < frame_timeout * 10,
                "a client trickling a TLS record (hello first: {hello_first}) still connected after {:?}",
                start.elapsed()
            );
        };
        assert!(
            cut >= frame_timeout,
            "cut after {cut:?} (hello first: {hello_first})"
        );
        println!(
            "a client trickling a TLS record (hello first: {hello_first}) was cut after {cut:?}"
        );
    }
    // The server still serves.
    let s = tls_connect(addr, &ca, None).unwrap();
    let (_, r) = Client::hello(s, None);
    assert!(matches!(r, Response::Welcome { .. }), "{r:?}");
}

/// The resident memory of this process, in bytes.
fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

/// A connection does not keep the room of the largest frame it ever sent: four connections
/// that each send one frame of 40 MiB (refused by name, the connection goes on) and stay open
/// leave the server's memory about where it was (24 MiB more; it grew by 184 MiB when each
/// kept its read buffer's room until it closed: found by a review helper, at the defaults
/// `max_connections` such connections would hold about 28 GiB).
#[test]
fn a_large_frame_leaves_no_memory_behind_on_its_connection() {
    // Read-only clients: the appends are read whole, then refused (nothing enters the log).
    // Frames of 40 MiB: above glibc's largest mmap threshold (32 MiB), so the frame's other
    // buffers go back to the system when freed, and only what a connection keeps stays.
    let c = cluster(|o| {
        o.anonymous_role = Some(Role::ReadOnly);
        o.max_frame_bytes = 64 << 20;
    });
    let l = c.leader();
    let addr = c.server(l).client_addr();
    let big = vec![0x5A; 40 << 20];
    // One round first, so that allocator pools grown by any large frame are counted before.
    let mut warm = connect(addr, None);
    let _ = append(&mut warm, &big);
    drop(warm);
    std::thread::sleep(Duration::from_millis(200));
    let before = rss_bytes();
    let mut open = Vec::new();
    for _ in 0..4 {
        let mut conn = connect(addr, None);
        let r = append(&mut conn, &big);
        assert!(
            matches!(r, Response::Error { .. } | Response::Appended { .. }),
            "{r:?}"
        );
        open.push(conn);
    }
    std::thread::sleep(Duration::from_millis(200));
    let grown = rss_bytes().saturating_sub(before);
    println!(
        "four connections that each sent a 40 MiB frame grew the process by {} MiB",
        grown >> 20
    );
    assert!(
        grown < 96 << 20,
        "four open connections hold {} MiB after their 40 MiB frames",
        grown >> 20
    );
    drop(open);
}

fn entries_of(r: Response) -> Vec<proto::Entry> {
    match r {
        Response::Entries { entries, .. } => entries,
        other => panic!("expected entries, got {other:?}"),
    }
}

/// Defect 12: batches of any size within the documented limits are accepted, one over a
/// limit gets the error naming it (and the connection goes on), and the answers to reads
/// and tails of many small entries decode on the client side.
#[test]
fn batches_at_the_limits_are_accepted_and_over_them_refused_by_name() {
    let c = cluster(|_| {});
    let l = c.leader();
    let addr = c.server(l).client_addr();
    let mut client = connect(addr, None);
    let mut firsts = Vec::new();
    for (n, bytes) in [
        (170, 1),
        (200, 8),
        (300, 4),
        (3000, 8),
        (proto::MAX_BATCH_ENTRIES, 8),
        (64, 64 << 10),
    ] {
        let r = client.call(|id| Request::Append {
            id,
            entries: vec![vec![n as u8; bytes]; n],
        });
        match r {
            Response::Appended { first, last, .. } => {
                assert_eq!(last - first + 1, n as u64, "{n} entries of {bytes} B");
                firsts.push((first, n, bytes));
            }
            other => panic!("{n} entries of {bytes} B: {other:?}"),
        }
    }
    // Too many entries, and too large an entry: refused for the request, by name.
    for (n, bytes) in [
        (proto::MAX_BATCH_ENTRIES + 1, 8),
        (5000, 8),
        (1, (64 << 10) + 1),
    ] {
        let r = client.call(|id| Request::Append {
            id,
            entries: vec![vec![0; bytes]; n],
        });
        match r {
            Response::Error {
                id: Some(id),
                code: ErrorCode::EntryTooLarge,
                message,
            } => {
                assert_eq!(id, client.next);
                assert!(message.contains("limit"), "{message}");
            }
            other => panic!("{n} entries of {bytes} B: {other:?}"),
        }
    }
    // Reads of many small entries decode, whole batches at a time.
    for &(first, n, bytes) in &firsts[..4] {
        let got = entries_of(client.call(|id| Request::Read {
            id,
            from: first,
            max_bytes: (n * bytes) as u32,
        }));
        assert!(
            got.len() >= n,
            "{n} entries of {bytes} B: read {}",
            got.len()
        );
        assert!(got[..n].iter().all(|e| e.data == vec![n as u8; bytes]));
    }
    // So do tail chunks: 300 entries of 4 B (`rdmalog tail`'s case) and the rest.
    let (first, ..) = firsts[2];
    client.next += 1;
    write_frame(
        &mut client.s,
        &Request::Tail {
            id: 77,
            from: first,
        },
    )
    .unwrap();
    let mut seen = 0;
    while seen < 300 + 3000 + proto::MAX_BATCH_ENTRIES {
        seen += entries_of(client.recv()).len();
    }
}

/// `proto::DEFAULT_MAX_FRAME_BYTES` says it holds 255 entries of the replica's default entry
/// limit; the proto crate checks it for 64 KiB, this that the replica's default is that.
#[test]
fn the_default_frame_holds_255_entries_of_the_replicas_default_limit() {
    let max = replica::ReplicaConfig::new(1, vec![1], CLUSTER, "/n1".into()).max_entry_bytes;
    assert_eq!(max, 64 << 10);
    let mut buf = Vec::new();
    let batch = |n| Request::Append {
        id: u64::MAX,
        entries: vec![vec![0; max]; n],
    };
    proto::encode_frame(&batch(255), &mut buf).unwrap();
    assert!(buf.len() - 4 <= proto::DEFAULT_MAX_FRAME_BYTES as usize);
    proto::encode_frame(&batch(256), &mut buf).unwrap();
    assert!(buf.len() - 4 > proto::DEFAULT_MAX_FRAME_BYTES as usize);
}
/// A default frame's worth of maximum-size entries commits. Replicating 16 MiB sometimes
/// takes long enough that the test cluster changes leader and the batch is superseded, so this
/// goes through the client, which resends what is certainly not in the log.
#[test]
fn a_full_default_frame_of_maximum_size_entries_commits() {
    let c = cluster(|_| {});
    c.leader();
    let mut cfg = client::ClientConfig::new(c.addrs.clone(), CLUSTER);
    cfg.deadline = Duration::from_secs(30);
    let mut client = client::Client::connect(cfg).unwrap();
    let batch = vec![vec![7u8; 64 << 10]; 255];
    let mut rest: Vec<&[u8]> = batch.iter().map(Vec::as_slice).collect();
    while !rest.is_empty() {
        match client.append(&rest) {
            Ok((first, last)) => {
                assert_eq!(last - first + 1, rest.len() as u64);
                rest.clear();
            }
            Err(client::ClientError::PartlyCommitted { committed, .. }) => {
                rest.drain(..committed);
            }
            Err(e) => panic!("255 entries of 64 KiB: {e}"),
        }
    }
}

/// Defect 3: a `Read` asking for 4 GiB gets at most one frame (here the server's 1 MiB
/// limit, which the client shares), and still at least one entry; so does a tail's chunk.
#[test]
fn a_huge_read_budget_is_clamped_to_one_frame() {
    const FRAME: u32 = 1 << 20;
    let c = cluster(|o| o.max_frame_bytes = FRAME);
    let l = c.leader();
    let mut client = connect(c.server(l).client_addr(), None);
    let mut first = None;
    for i in 0..4u8 {
        let r = client.call(|id| Request::Append {
            id,
            entries: vec![vec![i; 60 << 10]; 6],
        });
        let Response::Appended { first: f, .. } = r else {
            panic!("{r:?}")
        };
        first.get_or_insert(f);
    }
    let first = first.unwrap();
    let mut next = first;
    let mut total = 0;
    while total < 24 {
        client.next += 1;
        write_frame(
            &mut client.s,
            &Request::Read {
                id: client.next,
                from: next,
                max_bytes: u32::MAX,
            },
        )
        .unwrap();
        let r: Response = read_frame(&mut client.s, FRAME).expect("a response within the frame");
        let got = entries_of(r);
        assert!(!got.is_empty(), "no progress at {next}");
        total += got.iter().filter(|e| e.data.len() == 60 << 10).count();
        next = got.last().unwrap().index + 1;
    }
    // A tail's chunks fit the frame too, and the entry that did not fit one starts the next.
    write_frame(
        &mut client.s,
        &Request::Tail {
            id: 78,
            from: first,
        },
    )
    .unwrap();
    let mut seen = Vec::new();
    while seen.iter().filter(|&&(_, len)| len == 60 << 10).count() < 24 {
        let r: Response = read_frame(&mut client.s, FRAME).expect("a chunk within the frame");
        seen.extend(entries_of(r).iter().map(|e| (e.index, e.data.len())));
    }
    assert!(seen.windows(2).all(|w| w[1].0 > w[0].0), "{seen:?}");
    assert!(seen.len() >= 24 && seen[0].0 == first);
}

/// Protocol version 2 only added an answer a version-1 client never gets: such a client is
/// still served, and a version the server does not know is refused by name.
#[test]
fn a_version_1_client_is_still_served() {
    let c = cluster(|_| {});
    let l = c.leader();
    let addr = c.server(l).client_addr();
    let mut s = tcp(addr);
    write_frame(
        &mut s,
        &Request::Hello {
            version: proto::MIN_PROTOCOL_VERSION,
            cluster_id: CLUSTER,
            token: None,
        },
    )
    .unwrap();
    let mut old = Client { s, next: 0 };
    assert!(matches!(old.recv(), Response::Welcome { .. }));
    assert!(matches!(append(&mut old, b"v1"), Response::Appended { .. }));
    let mut s = tcp(addr);
    write_frame(
        &mut s,
        &Request::Hello {
            version: PROTOCOL_VERSION + 1,
            cluster_id: CLUSTER,
            token: None,
        },
    )
    .unwrap();
    let (code, message) = refused(s);
    assert_eq!(code, ErrorCode::WrongVersion);
    assert!(
        message.contains(&format!("versions 1 to {PROTOCOL_VERSION}")),
        "{message}"
    );
}

/// `ReadWith` (protocol version 3): `AtLeast` on a follower waits for the index and then holds
/// it; `Linearizable` is redirected by a follower and answered by the leader with everything
/// appended; an index the node never reaches times out with nothing read; and a leader cut off
/// from the others, while they elect a new leader and commit more, never answers a
/// linearizable read from its stale log (it redirects or times out).
#[test]
fn reads_with_a_stated_consistency() {
    use proto::ReadConsistency;
    let c = cluster(|o| o.append_timeout = Duration::from_secs(3));
    let l = c.leader();
    let mut lc = connect(c.server(l).client_addr(), None);
    let r = lc.call(|id| Request::Append {
        id,
        entries: vec![b"r1".to_vec(), b"r2".to_vec(), b"r3".to_vec()],
    });
    let Response::Appended { last, .. } = r else {
        panic!("{r:?}")
    };
    let read = |cl: &mut Client<TcpStream>, consistency| {
        cl.call(|id| Request::ReadWith {
            id,
            from: 1,
            max_bytes: 1 << 20,
            consistency,
        })
    };
    let holds = |r: &Response, index: u64| match r {
        Response::Entries { entries, .. } => entries.iter().any(|e| e.index == index),
        _ => false,
    };

    let f = (1..=3).find(|&i| i != l).unwrap();
    let mut fc = connect(c.server(f).client_addr(), None);
    let r = read(&mut fc, ReadConsistency::AtLeast(last));
    assert!(holds(&r, last), "a follower's AtLeast({last}) read: {r:?}");
    let r = read(&mut fc, ReadConsistency::Linearizable);
    assert!(
        matches!(&r, Response::Redirect { leader: Some(n), .. } if n.id == l),
        "a follower's linearizable read: {r:?}"
    );
    let r = read(&mut lc, ReadConsistency::Linearizable);
    assert!(holds(&r, last), "the leader's linearizable read: {r:?}");
    let r = read(&mut lc, ReadConsistency::Local);
    assert!(holds(&r, last), "{r:?}");
    let t = Instant::now();
    let r = read(&mut fc, ReadConsistency::AtLeast(last + 1000));
    assert!(
        matches!(
            &r,
            Response::Error {
                code: ErrorCode::Timeout,
                ..
            }
        ),
        "{r:?}"
    );
    assert!(t.elapsed() >= Duration::from_secs(3));
    assert!(matches!(
        read(&mut fc, ReadConsistency::Local),
        Response::Entries { .. }
    ));

    // Cut the leader off; the others elect a new one and commit more.
    for o in (1..=3).filter(|&o| o != l) {
        c.net.set_link(fabric::NodeId(l), fabric::NodeId(o), false);
        c.net.set_link(fabric::NodeId(o), fabric::NodeId(l), false);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    let new = loop {
        let r = fc.call(|id| Request::Status { id });
        if let Response::Status {
            leader: Some(n), ..
        } = &r
            && n.id != l
        {
            break n.id;
        }
        assert!(Instant::now() < deadline, "no new leader: {r:?}");
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut nc = connect(c.server(new).client_addr(), None);
    let r = append(&mut nc, b"after the cut");
    let Response::Appended { last: after, .. } = r else {
        panic!("{r:?}")
    };
    let r = read(&mut lc, ReadConsistency::Linearizable);
    match &r {
        Response::Redirect { .. }
        | Response::Error {
            code: ErrorCode::Timeout,
            ..
        } => {}
        Response::Entries { .. } => assert!(
            holds(&r, after),
            "the cut-off leader answered a linearizable read without index {after}: {r:?}"
        ),
        other => panic!("{other:?}"),
    }
    let r = read(&mut nc, ReadConsistency::Linearizable);
    assert!(holds(&r, after), "the new leader's read: {r:?}");
}

/// `AppendIf` (protocol version 3): appended right after the end it expected when the log ends
/// there; `ConditionFailed` with the actual end, and nothing appended, when it does not; a
/// follower redirects it like an `Append`.
#[test]
fn a_conditional_append_lands_right_after_the_end_it_expected_or_not_at_all() {
    use proto::ReadConsistency;
    let c = cluster(|_| {});
    let l = c.leader();
    let mut lc = connect(c.server(l).client_addr(), None);
    assert!(matches!(
        append(&mut lc, b"before"),
        Response::Appended { .. }
    ));
    let r = lc.call(|id| Request::ReadWith {
        id,
        from: 1,
        max_bytes: 1 << 20,
        consistency: ReadConsistency::Linearizable,
    });
    let Response::Entries { commit: end, .. } = r else {
        panic!("{r:?}")
    };
    let append_if = |cl: &mut Client<TcpStream>, expected_last, data: &[&[u8]]| {
        cl.call(|id| Request::AppendIf {
            id,
            expected_last,
            entries: data.iter().map(|d| d.to_vec()).collect(),
        })
    };
    let r = append_if(&mut lc, end, &[b"if-1", b"if-2"]);
    assert!(
        matches!(r, Response::Appended { first, last, .. } if first == end + 1 && last == end + 2),
        "expected end {end}: {r:?}"
    );
    let r = append_if(&mut lc, end, &[b"stale"]);
    assert!(
        matches!(r, Response::ConditionFailed { last, .. } if last == end + 2),
        "{r:?}"
    );
    let r = lc.call(|id| Request::Read {
        id,
        from: 1,
        max_bytes: 1 << 20,
    });
    let Response::Entries { entries, .. } = r else {
        panic!("{r:?}")
    };
    assert!(entries.iter().all(|e| e.data != b"stale"), "{entries:?}");
    let f = (1..=3).find(|&i| i != l).unwrap();
    let mut fc = connect(c.server(f).client_addr(), None);
    assert!(matches!(
        append_if(&mut fc, end + 2, &[b"x"]),
        Response::Redirect { .. }
    ));
}

/// Sessions (protocol version 4): `OpenSession` answers the session's id; the same
/// `AppendInSession` sent again (as after a broken connection) answers the first copy's
/// indexes and appends nothing; a resend with one more entry appends only that one; a number
/// past the next one and an unknown session are refused by name; a
/// follower redirects both requests.
#[test]
fn appends_in_a_session_are_exactly_once() {
    let c = cluster(|_| {});
    let l = c.leader();
    let mut lc = connect(c.server(l).client_addr(), None);
    let r = lc.call(|id| Request::OpenSession { id });
    let Response::SessionOpened { session, .. } = r else {
        panic!("{r:?}")
    };
    let send = |cl: &mut Client<TcpStream>, first_seq, data: &[&[u8]]| {
        cl.call(|id| Request::AppendInSession {
            id,
            session,
            first_seq,
            entries: data.iter().map(|d| d.to_vec()).collect(),
        })
    };
    let r = send(&mut lc, 1, &[b"s-1", b"s-2"]);
    let Response::AppendedAt { indexes: first, .. } = r else {
        panic!("{r:?}")
    };
    assert_eq!(first.len(), 2);
    assert_eq!(first[1], first[0] + 1);
    // Resent on a new connection, as a client does after a broken one.
    let mut again = connect(c.server(l).client_addr(), None);
    let r = send(&mut again, 1, &[b"s-1", b"s-2"]);
    assert!(
        matches!(&r, Response::AppendedAt { indexes, .. } if *indexes == first),
        "{r:?}"
    );
    let r = send(&mut again, 1, &[b"s-1", b"s-2", b"s-3"]);
    let Response::AppendedAt { indexes, .. } = r else {
        panic!("{r:?}")
    };
    assert_eq!(&indexes[..2], &first[..]);
    assert!(indexes[2] > first[1]);
    let r = lc.call(|id| Request::Read {
        id,
        from: 1,
        max_bytes: 1 << 20,
    });
    let Response::Entries { entries, .. } = r else {
        panic!("{r:?}")
    };
    for (k, want) in [b"s-1", b"s-2", b"s-3"].iter().enumerate() {
        let at: Vec<u64> = entries
            .iter()
            .filter(|e| e.data == want.as_slice())
            .map(|e| e.index)
            .collect();
        assert_eq!(at, [indexes[k]], "{} is in the log once", k + 1);
    }
    let code = |r: Response| match r {
        Response::Error { code, message, .. } => {
            assert!(!message.is_empty());
            code
        }
        other => panic!("{other:?}"),
    };
    assert_eq!(
        code(send(&mut lc, 5, &[b"s-5"])),
        ErrorCode::SessionSequence
    );
    let r = lc.call(|id| Request::AppendInSession {
        id,
        session: session + 1_000,
        first_seq: 1,
        entries: vec![b"x".to_vec()],
    });
    assert_eq!(code(r), ErrorCode::UnknownSession);
    let f = (1..=3).find(|&i| i != l).unwrap();
    let mut fc = connect(c.server(f).client_addr(), None);
    assert!(matches!(
        fc.call(|id| Request::OpenSession { id }),
        Response::Redirect { .. }
    ));
    assert!(matches!(
        send(&mut fc, 4, &[b"s-4"]),
        Response::Redirect { .. }
    ));
}

/// `Trim` (admin role): each node deletes its own entries below the index, in whole segments;
/// readers from below its new first index get `Compacted`, the rest of the log is served as
/// before, and the metrics show the new first index and the bytes held. A read-write token is
/// refused. Then `[retention]` (here `max_bytes`) does the same by itself on every node.
#[test]
fn trim_and_retention_delete_old_segments_and_readers_behind_get_compacted() {
    let small = |cfg: &mut replica::ReplicaConfig| cfg.segment_bytes = 512 << 10;
    let admin = "admin-token-0123456789";
    let c = Cluster::start_tuned(13, small, |o| {
        o.tokens.insert(admin.into(), Role::Admin);
    });
    let l = c.leader();
    let mut lc = connect(c.server(l).client_addr(), Some(admin));
    let mut last = 0;
    for k in 0..6u8 {
        let r = lc.call(|id| Request::Append {
            id,
            entries: (0..100).map(|_| vec![k; 3000]).collect(),
        });
        let Response::Appended { last: l, .. } = r else {
            panic!("{r:?}")
        };
        last = l;
    }
    let mut anon = connect(c.server(l).client_addr(), None);
    let r = anon.call(|id| Request::Trim { id, index: 300 });
    assert!(
        matches!(
            r,
            Response::Error {
                code: ErrorCode::Unauthorized,
                ..
            }
        ),
        "{r:?}"
    );
    for i in 1..=3 {
        let s = c.server(i);
        s.log()
            .wait_for_commit(last, Duration::from_secs(10))
            .unwrap();
        let bytes_before = s.log().status().log_bytes;
        let mut cl = connect(s.client_addr(), Some(admin));
        let r = cl.call(|id| Request::Trim { id, index: 300 });
        let Response::Trimmed { first_index, .. } = r else {
            panic!("{r:?}")
        };
        assert!(
            first_index > 1 && first_index <= 300,
            "node {i}: {first_index}"
        );
        let st = s.log().status();
        assert_eq!(st.first_index, first_index);
        assert!(st.log_bytes < bytes_before);
        let r = cl.call(|id| Request::Read {
            id,
            from: 1,
            max_bytes: 1 << 20,
        });
        assert!(
            matches!(
                r,
                Response::Error {
                    code: ErrorCode::Compacted,
                    ..
                }
            ),
            "node {i}: {r:?}"
        );
        let r = cl.call(|id| Request::Read {
            id,
            from: first_index,
            max_bytes: 1 << 20,
        });
        assert!(
            matches!(&r, Response::Entries { entries, .. } if entries[0].index == first_index),
            "node {i}: {r:?}"
        );
        let m = get(s.metrics_addr().unwrap(), "/metrics");
        assert!(
            m.contains(&format!("rdmalog_first_index {first_index}\n")),
            "{m}"
        );
        assert!(
            m.contains(&format!("rdmalog_log_bytes {}\n", st.log_bytes)),
            "{m}"
        );
    }
    drop(c);

    let c = Cluster::start_tuned(14, small, |o| {
        o.retention = replica::retention::Retention {
            max_bytes: Some(600_000),
            ..Default::default()
        };
        o.retention_interval = Duration::from_millis(100);
    });
    let l = c.leader();
    let mut lc = connect(c.server(l).client_addr(), None);
    for k in 0..6u8 {
        let r = lc.call(|id| Request::Append {
            id,
            entries: (0..100).map(|_| vec![k; 3000]).collect(),
        });
        assert!(matches!(r, Response::Appended { .. }), "{r:?}");
    }
    for i in 1..=3 {
        let s = c.server(i);
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let st = s.log().status();
            if st.first_index > 1 && st.log_bytes <= 600_000 + (512 << 10) {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "node {i} kept {} bytes from index {}",
                st.log_bytes,
                st.first_index
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let m = get(s.metrics_addr().unwrap(), "/metrics");
        assert!(!m.contains("rdmalog_retention_trims_total 0\n"), "{m}");
        assert!(m.contains("rdmalog_retention_failures_total 0\n"), "{m}");
    }
}

/// A read queued behind a request that waits is made when its turn to be answered comes,
/// not when it arrives: a connection holds one read's entries at a time, never up to
/// `max_in_flight` frames of them (255 reads of 16 MiB queued behind a read waiting for an
/// index pinned 4 GiB per connection). Seen from outside: the queued read returns an entry
/// committed after it arrived, while the read ahead of it waited.
#[test]
fn a_read_queued_behind_a_waiting_one_is_made_when_answered() {
    let c = cluster(|_| {});
    let l = c.leader();
    let log = c.server(l).log().clone();
    let mut writer = connect(c.server(l).client_addr(), None);
    let Response::Appended { first: a, .. } = append(&mut writer, b"before") else {
        panic!("no append")
    };
    let mut client = connect(c.server(l).client_addr(), None);
    // Waits for the entry after `a`, then a plain read from `a`.
    let commit = log.status().commit;
    let wait = Request::ReadWith {
        id: 1,
        from: a,
        max_bytes: 1 << 20,
        consistency: proto::ReadConsistency::AtLeast(commit + 1),
    };
    write_frame(&mut client.s, &wait).unwrap();
    let read = Request::Read {
        id: 2,
        from: a,
        max_bytes: 1 << 20,
    };
    write_frame(&mut client.s, &read).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let Response::Appended { first: b, .. } = append(&mut writer, b"after") else {
        panic!("no append")
    };
    let r = client.recv();
    assert!(matches!(r, Response::Entries { id: 1, .. }), "{r:?}");
    let r = client.recv();
    let Response::Entries { id: 2, entries, .. } = r else {
        panic!("{r:?}")
    };
    assert!(
        entries.iter().any(|e| e.index == b && e.data == b"after"),
        "the queued read was made when it arrived: {entries:?}"
    );
}

/// A connection keeps at most `max_in_flight` requests pending: past that the server reads
/// nothing more from it until an answer goes out, so a pipelining client is held back by TCP,
/// not queued without bound. Two reads that wait for an index far ahead (`AtLeast`) stay
/// pending until `append_timeout`; an append pipelined behind them is not read, so not in the
/// log, until they are answered; then it is, and the answers come back in request order.
#[test]
fn a_connection_keeps_at_most_max_in_flight_requests_pending() {
    let c = cluster(|o| {
        o.max_in_flight = 2;
        // Far longer than the look below takes, even on a loaded machine.
        o.append_timeout = Duration::from_secs(5);
    });
    let l = c.leader();
    let log = c.server(l).log().clone();
    let mut client = connect(c.server(l).client_addr(), None);
    let before = log.status().last_index;
    for id in 1..=2 {
        let far = Request::ReadWith {
            id,
            from: 1,
            max_bytes: 1 << 10,
            consistency: proto::ReadConsistency::AtLeast(1 << 40),
        };
        write_frame(&mut client.s, &far).unwrap();
    }
    let behind = Request::Append {
        id: 3,
        entries: vec![b"behind two waiting reads".to_vec()],
    };
    write_frame(&mut client.s, &behind).unwrap();
    // Well inside the reads' timeout: the append is still unread. (Not `last_index`: a leader
    // change on a loaded machine appends a no-op.)
    std::thread::sleep(Duration::from_millis(800));
    let last = log.status().last_index;
    for i in before + 1..=last {
        assert_ne!(
            log.read(i).ok().flatten().as_deref(),
            Some(&b"behind two waiting reads"[..]),
            "the server took a third request while two were pending"
        );
    }
    let proposed = (before + 1..=last).count();
    assert!(proposed <= 1, "{proposed} entries appended meanwhile");
    // The reads time out, in order, and only then is the append read and committed.
    for id in 1..=2 {
        let r = client.recv();
        assert!(
            matches!(r, Response::Error { id: Some(i), code: ErrorCode::Timeout, .. } if i == id),
            "{r:?}"
        );
    }
    let r = client.recv();
    let Response::Appended { first, .. } = r else {
        panic!("{r:?}")
    };
    assert!(first > before, "{r:?}");
}

/// A connection with nothing pending, no tail and no frame for `idle_timeout` is closed with
/// an error frame that says so (docs/PROTOCOL.md, section 3); a tailing connection is not,
/// however long nothing commits, and still streams what commits later.
#[test]
fn an_idle_connection_is_closed_and_a_tail_never_idles_out() {
    let idle = Duration::from_secs(1);
    let c = cluster(|o| o.idle_timeout = idle);
    let l = c.leader();
    let addr = c.server(l).client_addr();

    let quiet = connect(addr, None);
    let mut tail = connect(addr, None);
    write_frame(&mut tail.s, &Request::Tail { id: 7, from: 1 }).unwrap();
    // Three idle timeouts with nothing to say on either connection.
    std::thread::sleep(idle * 3);
    let (code, message) = refused(quiet.s.try_clone().unwrap());
    assert_eq!(code, ErrorCode::Malformed, "{message}");
    assert!(message.contains("idle"), "{message}");
    drop(quiet);
    // An idle close is no rejection and answers no request: alerts on either must not fire
    // for idle clients.
    let m = get(c.server(l).metrics_addr().unwrap(), "/metrics");
    assert!(m.contains("rdmalog_rejected_connections_total 0\n"), "{m}");
    assert!(m.contains("rdmalog_request_errors_total 0\n"), "{m}");

    // The tail is still open: what commits now reaches it.
    let mut writer = connect(addr, None);
    let Response::Appended { first, .. } = append(&mut writer, b"after a long quiet") else {
        panic!("the append failed")
    };
    loop {
        match tail.recv() {
            Response::Entries { id: 7, entries, .. } => {
                if entries.iter().any(|e| e.index == first) {
                    break;
                }
            }
            other => panic!("the tail got {other:?}"),
        }
    }
}

/// Idleness counts from the last answer too, not only from the last request: a request that
/// waited longer than `idle_timeout` (here a `ReadWith` that times out) leaves its connection
/// open for the next one.
#[test]
fn a_long_request_does_not_make_its_connection_idle() {
    let c = cluster(|o| {
        o.idle_timeout = Duration::from_millis(1_000);
        o.append_timeout = Duration::from_millis(2_500);
    });
    let l = c.leader();
    let mut cl = connect(c.server(l).client_addr(), None);
    let r = cl.call(|id| Request::ReadWith {
        id,
        from: 1,
        max_bytes: 1 << 20,
        consistency: proto::ReadConsistency::AtLeast(1 << 40),
    });
    assert!(
        matches!(
            &r,
            Response::Error {
                code: ErrorCode::Timeout,
                ..
            }
        ),
        "{r:?}"
    );
    // Well within the idle timeout of the answer, and longer than the server's 200 ms read.
    std::thread::sleep(Duration::from_millis(500));
    let r = cl.call(|id| Request::Status { id });
    assert!(
        matches!(r, Response::Status { .. }),
        "closed as idle: {r:?}"
    );
}

/// A client that stops reading while the server has frames for it (here a tail of a few
/// megabytes it never reads) is disconnected once a write blocks for `frame_timeout`, without
/// an error frame (docs/PROTOCOL.md, section 1): its connection thread does not hang on it,
/// and the server goes on serving others.
#[test]
fn a_client_that_stops_reading_is_disconnected() {
    let frame_timeout = Duration::from_millis(500);
    let c = cluster(|o| o.frame_timeout = frame_timeout);
    let l = c.leader();
    let addr = c.server(l).client_addr();
    let mut writer = connect(addr, None);
    let chunk = vec![0x5A; 60 << 10];
    // More than the server's socket send buffer can grow to (`tcp_wmem`'s maximum) plus what
    // the client's receive buffer holds, so the server's writes must block.
    let wmem_max: usize = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_wmem")
        .ok()
        .and_then(|s| s.split_whitespace().nth(2).and_then(|v| v.parse().ok()))
        .unwrap_or(4 << 20);
    let rmem_max: usize = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_rmem")
        .ok()
        .and_then(|s| s.split_whitespace().nth(2).and_then(|v| v.parse().ok()))
        .unwrap_or(6 << 20);
    let batch = 16 * chunk.len();
    let batches = (wmem_max + rmem_max).div_ceil(batch) + 2;
    for _ in 0..batches {
        let r = writer.call(|id| Request::Append {
            id,
            entries: vec![chunk.clone(); 16],
        });
        assert!(matches!(r, Response::Appended { .. }), "{r:?}");
    }
    // Everything to stream: more than the socket buffers on both sides hold.
    let mut stuck = connect(addr, None);
    write_frame(&mut stuck.s, &Request::Tail { id: 1, from: 1 }).unwrap();
    std::thread::sleep(frame_timeout * 6);
    // Reading now drains what the buffers held, then finds the connection closed.
    stuck
        .s
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let t = Instant::now();
    let mut sink = vec![0u8; 1 << 20];
    let mut drained = 0usize;
    let closed = loop {
        match stuck.s.read(&mut sink) {
            Ok(0) => break true,
            Ok(n) => drained += n,
            // Still open, with nothing more to say: not closed.
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                break false;
            }
            Err(_) => break true,
        }
        if t.elapsed() > Duration::from_secs(20) {
            break false;
        }
    };
    assert!(closed, "the server kept a client that stopped reading");
    assert!(
        drained < batches * batch,
        "the whole tail arrived ({drained} bytes): the client never blocked the server"
    );
    // The server still serves.
    let r = append(&mut writer, b"after the stuck client");
    assert!(matches!(r, Response::Appended { .. }), "{r:?}");
}
