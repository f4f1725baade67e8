//! The client library against real servers (real TCP, real TLS) over three replicas on the
//! in-process fabric: append and read, following a follower's redirect, carrying on after
//! the leader stops, a tail that resumes after its server stops, errors that must not be
//! retried, TLS with a CA, cluster status and the runtime-free async append.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use client::{Client, ClientConfig, ClientError, TlsConfig};
use proto::{ErrorCode, Role};
use server::ServerOptions;

use server::testing::{CLUSTER, SimServers as Cluster};

/// Three replicas and three servers; `tune` adjusts each server's options.
fn cluster(tune: impl Fn(&mut ServerOptions)) -> Cluster {
    Cluster::start(17, tune)
}

/// Client settings for a [`Cluster`].
trait ClientSettings {
    /// A client config naming `ids`, with a deadline short enough for tests.
    fn config(&self, ids: &[u64]) -> ClientConfig;
}

impl ClientSettings for Cluster {
    fn config(&self, ids: &[u64]) -> ClientConfig {
        let mut cfg = ClientConfig::new(ids.iter().map(|&id| self.addr(id)).collect(), CLUSTER);
        cfg.deadline = Duration::from_secs(20);
        cfg.request_timeout = Duration::from_secs(12);
        cfg
    }
}

fn other_than(ids: &[u64]) -> u64 {
    (1..=3).find(|id| !ids.contains(id)).unwrap()
}

fn payloads(entries: &[proto::Entry]) -> Vec<&[u8]> {
    entries.iter().map(|e| e.data.as_slice()).collect()
}

#[test]
fn append_then_read_back() {
    let c = cluster(|_| {});
    c.leader();
    let mut client = Client::connect(c.config(&[1, 2, 3])).unwrap();
    let (first, last) = client.append(&[b"one", b"two", b"three"]).unwrap();
    assert_eq!(last, first + 2);
    // Usually `last + 1`; a leader change in between adds the new leader's own entry.
    let (second, _) = client.append(&[b"four"]).unwrap();
    assert!(second > last);
    let (entries, commit) = client.read(first, 1 << 20).unwrap();
    assert!(commit >= second);
    let at = |index: u64| {
        entries
            .iter()
            .find(|e| e.index == index)
            .map(|e| e.data.as_slice())
    };
    assert_eq!(at(first), Some(&b"one"[..]));
    assert_eq!(at(first + 1), Some(&b"two"[..]));
    assert_eq!(at(last), Some(&b"three"[..]));
    assert_eq!(at(second), Some(&b"four"[..]));
    assert_eq!(entries[0].index, first);
    // A small budget still returns at least one entry; nothing past the commit is empty.
    let (one, _) = client.read(first, 1).unwrap();
    assert_eq!(payloads(&one), [&b"one"[..]]);
    let (none, _) = client.read(second + 1, 1 << 20).unwrap();
    assert!(none.is_empty());
    // An empty batch is refused locally with the code the server would use.
    let e = client.append(&[]).unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::EntryTooLarge), "{e}");
}

#[test]
fn a_follower_address_is_enough_to_append() {
    let c = cluster(|_| {});
    let l = c.leader();
    let f = other_than(&[l]);
    let mut client = Client::connect(c.config(&[f])).unwrap();
    assert_eq!(client.connected_to().map(|(n, _, _)| n), Some(f));
    let (first, last) = client.append(&[b"via a follower"]).unwrap();
    assert_eq!(first, last);
    // The redirect moved the client to the leader, whose address it learned.
    // (On a loaded machine the leader may have moved on since; then the client followed.)
    let (node, addr, role) = client.connected_to().unwrap();
    assert!(
        node == l || c.leader() != l,
        "connected to {node}, leader {l}"
    );
    assert_eq!(addr, c.addr(node));
    assert_eq!(role, Role::ReadWrite);
    assert!(client.known_addrs().contains(&c.addr(node)));
    let (entries, _) = client.read(first, 1 << 20).unwrap();
    assert_eq!(payloads(&entries), [&b"via a follower"[..]]);
}

#[test]
fn the_client_carries_on_after_the_leader_stops() {
    let mut c = cluster(|_| {});
    let l = c.leader();
    let mut cfg = c.config(&[l, other_than(&[l]), other_than(&[l, other_than(&[l])])]);
    cfg.deadline = Duration::from_secs(15);
    let mut client = Client::connect(cfg).unwrap();
    let (before, _) = client.append(&[b"before"]).unwrap();
    // The node that committed it leads (normally `l`, unless the leader moved meanwhile).
    let (l, _, _) = client.connected_to().unwrap();

    c.crash(l);
    let t = Instant::now();
    let (after, _) = client.append(&[b"after"]).unwrap();
    let took = t.elapsed();
    assert!(took < Duration::from_secs(15), "took {took:?}");
    let (now, _, _) = client.connected_to().unwrap();
    assert_ne!(now, l);
    assert_ne!(c.leader(), l);
    assert!(after > before);
    // Nothing acknowledged was lost, and nothing is there twice: the resend went through the
    // client's session, which the new leader found in its log.
    let (entries, _) = client.read(before, 1 << 20).unwrap();
    let data = payloads(&entries);
    assert_eq!(data, [&b"before"[..], &b"after"[..]], "{entries:?}");
    assert_eq!(entries[1].index, after);
    let (session, next) = client.session().expect("appends go through a session");
    assert!(session > 0 && next == 3, "{:?}", client.session());
}

#[test]
fn tail_follows_new_commits_and_resumes_after_a_reconnect() {
    let mut c = cluster(|_| {});
    let l = c.leader();
    let f = other_than(&[l]);
    let mut writer = Client::connect(c.config(&[l])).unwrap();
    let (first, _) = writer.append(&[b"a", b"b"]).unwrap();

    // The tail starts on a follower.
    let tailer = Client::connect(c.config(&[f, l, other_than(&[l, f])])).unwrap();
    assert_eq!(tailer.connected_to().map(|(n, _, _)| n), Some(f));
    let mut tail = tailer.tail(first).unwrap();
    let next = |tail: &mut client::Tail| {
        tail.poll(Duration::from_secs(10))
            .unwrap()
            .expect("an entry within 10 s")
    };
    let a = next(&mut tail);
    assert_eq!((a.index, a.data.as_slice()), (first, &b"a"[..]));
    assert_eq!(next(&mut tail).data, b"b");
    assert!(tail.poll(Duration::from_millis(100)).unwrap().is_none());
    // New commits arrive as they commit.
    writer.append(&[b"c"]).unwrap();
    assert_eq!(next(&mut tail).data, b"c");
    let resume = tail.resume_index();
    assert!(resume > first + 2);

    // The tail's server stops: it reconnects elsewhere and continues after "c", without
    // repeating or skipping anything.
    c.stop_server(f);
    writer.append(&[b"d", b"e"]).unwrap();
    let d = next(&mut tail);
    assert_eq!(d.data, b"d");
    assert!(d.index >= resume);
    assert_eq!(next(&mut tail).data, b"e");
    let (node, _, _) = tail.client().connected_to().unwrap();
    assert_ne!(node, f);
    assert!(tail.commit() > d.index);
    // As an iterator.
    writer.append(&[b"f"]).unwrap();
    let got = tail.next().unwrap().unwrap();
    assert_eq!(got.data, b"f");
}

#[test]
fn refusals_are_returned_at_once_without_retries() {
    let c = cluster(|o| {
        o.tokens
            .insert("reader-token-0123456789".into(), Role::ReadOnly);
        o.tokens
            .insert("writer-token-0123456789".into(), Role::ReadWrite);
        o.anonymous_role = None;
    });
    c.leader();
    // No token where one is required, and an unknown token: Unauthorized, fast.
    for token in [None, Some("guessed")] {
        let mut cfg = c.config(&[1, 2, 3]);
        cfg.deadline = Duration::from_secs(20);
        cfg.token = token.map(str::to_string);
        let t = Instant::now();
        let e = Client::connect(cfg).unwrap_err();
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        assert!(
            matches!(
                e,
                ClientError::Refused {
                    code: ErrorCode::Unauthorized,
                    ..
                }
            ),
            "{e:?}"
        );
        assert!(!e.is_transient());
    }
    // A read-only token cannot append.
    let mut cfg = c.config(&[1, 2, 3]);
    cfg.token = Some("reader-token-0123456789".into());
    let mut reader = Client::connect(cfg).unwrap();
    let t = Instant::now();
    let e = reader.append(&[b"nope"]).unwrap_err();
    assert!(t.elapsed() < Duration::from_secs(2));
    assert_eq!(e.code(), Some(ErrorCode::Unauthorized), "{e}");
    // ... but the connection is still good for reads.
    reader.status().unwrap();
    // Another cluster's id.
    let mut cfg = c.config(&[1]);
    cfg.cluster_id = 0xdead;
    cfg.token = Some("writer-token-0123456789".into());
    let t = Instant::now();
    let e = Client::connect(cfg).unwrap_err();
    assert!(t.elapsed() < Duration::from_secs(2));
    assert_eq!(e.code(), Some(ErrorCode::WrongCluster), "{e}");
    assert!(e.to_string().contains("0xc1"), "{e}");
    // A batch larger than the frame limit never leaves the client.
    let mut cfg = c.config(&[1, 2, 3]);
    cfg.token = Some("writer-token-0123456789".into());
    cfg.max_frame_bytes = 64 << 10;
    let mut writer = Client::connect(cfg).unwrap();
    let big = vec![7u8; 100 << 10];
    let e = writer.append(&[&big]).unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::TooLarge), "{e}");
    writer.append(&[b"small"]).unwrap();
}

#[test]
fn cluster_status_asks_every_member() {
    let mut c = cluster(|_| {});
    let l = c.leader();
    let mut client = Client::connect(c.config(&[l])).unwrap();
    client.append(&[b"x"]).unwrap();
    let me = client.status().unwrap();
    let (connected, addr, _) = client.connected_to().unwrap();
    assert_eq!(me.node.id, connected);
    assert_eq!(me.addr, addr);
    assert_eq!(me.members.len(), 3);
    let all = client.cluster_status().unwrap();
    assert_eq!(all.len(), 3);
    for (r, m) in all.iter().zip(&me.members) {
        let r = r.as_ref().unwrap();
        assert_eq!(r.node.id, m.id);
        assert_eq!(r.addr, m.client_addr);
        assert!(r.node.commit > 0);
        assert_eq!(r.node.peers.len(), 2);
    }
    // Someone leads (the leader may have moved since `c.leader()` on a loaded machine).
    assert!(
        all.iter()
            .any(|r| r.as_ref().unwrap().node.role == "leader"),
        "{all:?}"
    );
    // A stopped member is reported as unreachable; the others still answer.
    let f = other_than(&[connected]);
    c.stop_server(f);
    let all = client.cluster_status().unwrap();
    for (r, m) in all.iter().zip(&me.members) {
        if m.id == f {
            assert!(matches!(r, Err(ClientError::Unreachable { .. })), "{r:?}");
        } else {
            assert!(r.is_ok(), "{r:?}");
        }
    }
}

/// A waker that unparks the thread that blocks on a future.
struct Unpark(std::thread::Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park_timeout(Duration::from_secs(1));
    }
}

#[test]
fn append_async_is_a_future_that_needs_no_runtime() {
    let c = cluster(|_| {});
    let l = c.leader();
    let client = Client::connect(c.config(&[other_than(&[l])])).unwrap();
    let pending: Vec<_> = (0..4u8)
        .map(|i| client.append_async(vec![vec![i; 10], vec![i; 20]]))
        .collect();
    let mut ranges: Vec<(u64, u64)> = pending.into_iter().map(|p| block_on(p).unwrap()).collect();
    ranges.sort();
    for r in &ranges {
        assert_eq!(r.1, r.0 + 1);
    }
    for w in ranges.windows(2) {
        assert!(w[1].0 > w[0].1);
    }
    // Blocking use, without async.
    let (first, last) = client.append_async(vec![b"sync".to_vec()]).wait().unwrap();
    assert_eq!(first, last);
    // A later call reuses a session an earlier one finished with: no session opens in
    // between, so one at a time they take consecutive indexes.
    let mut end = last;
    for i in 0..3u8 {
        let (first, last) = client.append_async(vec![vec![i; 5]]).wait().unwrap();
        assert_eq!(
            first,
            end + 1,
            "an entry (a session opening) between two appends"
        );
        end = last;
    }
}

/// A CA, and certificates it signs, written as PEM files.
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

    fn issue(&self, names: &[&str], dir: &Path) -> (PathBuf, PathBuf) {
        let params =
            rcgen::CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.ca).unwrap();
        let (c, k) = (
            dir.join(format!("{}.crt", names[0])),
            dir.join(format!("{}.key", names[0])),
        );
        std::fs::write(&c, cert.pem()).unwrap();
        std::fs::write(&k, key.serialize_pem()).unwrap();
        // A private key is refused unless it is its owner's only.
        std::fs::set_permissions(&k, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        (c, k)
    }
}

#[test]
fn tls_with_a_ca_and_a_client_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new("rdmalog test CA");
    let ca = dir.path().join("ca.pem");
    pki.write_ca(&ca);
    let (cert, key) = pki.issue(&["localhost", "127.0.0.1"], dir.path());
    let (ccert, ckey) = pki.issue(&["client"], dir.path());
    let rogue = Pki::new("someone else");
    let rogue_ca = dir.path().join("rogue-ca.pem");
    rogue.write_ca(&rogue_ca);

    let c = cluster(|o| {
        o.tls = Some(server::tls::server_config(&cert, &key, Some(&ca)).unwrap());
    });
    let l = c.leader();
    let tls = TlsConfig {
        ca: ca.clone(),
        client_cert: Some((ccert.clone(), ckey.clone())),
        server_name: None,
    };
    // Verified against the address's host part (an IP address in the certificate), starting
    // at a follower: the redirect is followed over TLS too.
    let mut cfg = c.config(&[other_than(&[l])]);
    cfg.tls = Some(tls.clone());
    let mut client = Client::connect(cfg).unwrap();
    let (first, _) = client.append(&[b"over tls"]).unwrap();
    let (entries, _) = client.read(first, 1 << 20).unwrap();
    assert_eq!(payloads(&entries), [&b"over tls"[..]]);
    let (node, _, _) = client.connected_to().unwrap();
    assert!(
        node == l || c.leader() != l,
        "connected to {node}, leader {l}"
    );
    // An explicit server name.
    let mut cfg = c.config(&[l]);
    cfg.tls = Some(TlsConfig {
        server_name: Some("localhost".into()),
        ..tls.clone()
    });
    Client::connect(cfg).unwrap().append(&[b"by name"]).unwrap();

    // Failures that retrying cannot fix come back at once.
    let quick = |cfg: ClientConfig| {
        let t = Instant::now();
        let e = Client::connect(cfg).unwrap_err();
        assert!(
            t.elapsed() < Duration::from_secs(3),
            "{e}: {:?}",
            t.elapsed()
        );
        e
    };
    // A server whose certificate does not carry the name asked for.
    let mut cfg = c.config(&[l]);
    cfg.tls = Some(TlsConfig {
        server_name: Some("elsewhere.example".into()),
        ..tls.clone()
    });
    let e = quick(cfg);
    assert!(matches!(e, ClientError::Tls(_)), "{e:?}");
    // A client that does not trust the servers' CA.
    let mut cfg = c.config(&[l]);
    cfg.tls = Some(TlsConfig {
        ca: rogue_ca,
        ..tls.clone()
    });
    let e = quick(cfg);
    assert!(matches!(e, ClientError::Tls(_)), "{e:?}");
    // No client certificate where the servers require one.
    let mut cfg = c.config(&[l]);
    cfg.tls = Some(TlsConfig {
        client_cert: None,
        ..tls
    });
    let e = quick(cfg);
    assert!(matches!(e, ClientError::Tls(_)), "{e:?}");
    // Plain TCP to a TLS port.
    let e = quick(c.config(&[l]));
    assert!(
        matches!(&e, ClientError::Protocol(m) if m.contains("requires TLS")),
        "{e:?}"
    );
}

/// "A call takes at most its deadline" under TLS too: a server that answers the hello with
/// one TLS record trickled a byte every 50 ms (each socket read beats its timeout) held the
/// client inside rustls's read, which loops until a whole record has come, for as long as
/// the record took (a 16 KiB record: 14 minutes). Now each read takes the socket once and the
/// attempt's deadline is looked at between them.
#[test]
fn a_server_trickling_a_tls_record_does_not_hold_a_call_past_its_deadline() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new("rdmalog test CA");
    let ca = dir.path().join("ca.pem");
    pki.write_ca(&ca);
    let (cert, key) = pki.issue(&["localhost", "127.0.0.1"], dir.path());
    let server_cfg = server::tls::server_config(&cert, &key, None).unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop2 = stop.clone();
    let server = std::thread::spawn(move || {
        let (tcp, _) = listener.accept().unwrap();
        let mut conn = rustls::ServerConnection::new(server_cfg).unwrap();
        let mut sock = tcp;
        let by = Instant::now() + Duration::from_secs(10);
        proto::tls::handshake(&mut conn, &mut sock, by).unwrap();
        // The client's hello (any plaintext), then a record header announcing 16 KiB and
        // its bytes one at a time.
        let mut buf = [0u8; 4096];
        sock.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        while !matches!(proto::tls::read_some(&mut conn, &mut sock, &mut buf), Ok(n) if n > 0) {
            assert!(Instant::now() < by, "no hello from the client");
        }
        sock.write_all(&[0x17, 0x03, 0x03, 0x40, 0x00]).unwrap();
        let t = Instant::now();
        while !stop2.load(std::sync::atomic::Ordering::Relaxed)
            && t.elapsed() < Duration::from_secs(60)
            && sock.write_all(&[0]).is_ok()
        {
            std::thread::sleep(Duration::from_millis(50));
        }
    });
    let mut cfg = ClientConfig::new(vec![addr], CLUSTER);
    cfg.tls = Some(TlsConfig {
        ca,
        client_cert: None,
        server_name: Some("localhost".into()),
    });
    cfg.connect_timeout = Duration::from_secs(1);
    cfg.request_timeout = Duration::from_secs(1);
    cfg.deadline = Duration::from_secs(2);
    let t = Instant::now();
    let r = Client::connect(cfg);
    let took = t.elapsed();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    server.join().unwrap();
    assert!(r.is_err(), "a hello answered with nothing connected");
    assert!(
        took < Duration::from_secs(6),
        "the call took {took:?} with a 2 s deadline: {:?}",
        r.err()
    );
    println!("the call gave up after {took:?}: {:?}", r.err());
}

/// Sockets of this machine's TCP table (`/proc/net/tcp`) on `port` at their local end (`true`)
/// or remote end (`false`): their timer kind (2: keepalive) and when it fires, in clock ticks.
fn tcp_timers(port: u16, local: bool) -> Vec<(u32, u64)> {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let end = if local { f[1] } else { f[2] };
            let p = u16::from_str_radix(end.split(':').nth(1)?, 16).ok()?;
            // Established connections only (state 01).
            if p != port || f[3] != "01" {
                return None;
            }
            let (kind, when) = f[5].split_once(':')?;
            Some((
                u32::from_str_radix(kind, 16).ok()?,
                u64::from_str_radix(when, 16).ok()?,
            ))
        })
        .collect()
}

/// "A tail on a member whose machine died moves to another within about 25 s; a server drops
/// a dead client's connection likewise" (docs/PROTOCOL.md, section 7): both ends of a client
/// connection run TCP keepalive at `proto::KEEPALIVE` (10 s of silence). A tail waits with no
/// deadline and never idles out, so without it a silent peer (no FIN, no RST) held both for
/// good: the kernel's default is two hours, and neither end asked for keepalive at all.
#[test]
fn both_ends_of_a_client_connection_run_keepalive() {
    let c = cluster(|_| {});
    let l = c.leader();
    let mut client = Client::connect(c.config(&[l])).unwrap();
    client.status().unwrap();
    // Past the acknowledgement of the last answer (the retransmit timer, kind 1, runs until it).
    std::thread::sleep(Duration::from_millis(300));
    let port: u16 = c.addr(l).rsplit(':').next().unwrap().parse().unwrap();
    // Clock ticks (USER_HZ, 100 on Linux) until the timer fires: at most the 10 s idle time.
    let ticks_per_s = 100;
    for (local, end) in [(true, "server"), (false, "client")] {
        let timers = tcp_timers(port, local);
        assert!(!timers.is_empty(), "no {end} socket on port {port}");
        for (kind, when) in &timers {
            assert_eq!(
                *kind, 2,
                "the {end}'s socket runs no keepalive timer: {timers:?}"
            );
            assert!(
                *when <= 10 * ticks_per_s,
                "the {end}'s keepalive fires in {when} ticks, past 10 s: {timers:?}"
            );
        }
    }
    drop(client);
}

/// `read_with`: a linearizable read from a client connected to a follower follows the
/// redirect to the leader and holds what was appended; an `AtLeast` read on a follower holds
/// the index it waited for.
#[test]
fn reads_with_a_stated_consistency_follow_the_leader_or_wait_on_a_follower() {
    use client::ReadConsistency;
    let c = cluster(|_| {});
    let l = c.leader();
    let f = other_than(&[l]);
    let mut writer = Client::connect(c.config(&[l])).unwrap();
    let (_, last) = writer.append(&[b"written"]).unwrap();

    let mut reader = Client::connect(c.config(&[f])).unwrap();
    let (entries, commit) = reader
        .read_with(last, 1 << 20, ReadConsistency::AtLeast(last))
        .unwrap();
    assert!(commit >= last);
    assert_eq!(payloads(&entries), [&b"written"[..]]);
    assert_eq!(
        reader.connected_to().map(|(n, _, _)| n),
        Some(f),
        "AtLeast stays put"
    );

    let (entries, _) = reader
        .read_with(last, 1 << 20, ReadConsistency::Linearizable)
        .unwrap();
    assert_eq!(payloads(&entries), [&b"written"[..]]);
    let (node, _, _) = reader.connected_to().unwrap();
    assert!(node == l || c.leader() != l, "read from {node}, leader {l}");
}

/// `append_if`: lands right after the end it was told, or fails with the actual end.
#[test]
fn append_if_appends_only_where_the_log_ends() {
    use client::ReadConsistency;
    let c = cluster(|_| {});
    let mut client = Client::connect(c.config(&[1, 2, 3])).unwrap();
    client.append(&[b"first"]).unwrap();
    let (_, end) = client
        .read_with(1, 1 << 20, ReadConsistency::Linearizable)
        .unwrap();
    let (first, last) = client.append_if(&[b"a", b"b"], end).unwrap();
    assert_eq!((first, last), (end + 1, end + 2));
    match client.append_if(&[b"late"], end) {
        Err(ClientError::ConditionFailed {
            expected,
            last,
            maybe_committed,
        }) => {
            assert_eq!((expected, last, maybe_committed), (end, end + 2, false));
        }
        other => panic!("{other:?}"),
    }
    // The connection stays usable.
    client.append_if(&[b"next"], end + 2).unwrap();
}

/// A client whose connection the server closed for idleness (its error frame, then the
/// close) appends and reads on the next call as if nothing happened, over plain TCP and over
/// TLS: an idle close is not the caller's business. The pauses are shorter than the second
/// after which a connection-level `Malformed` would be taken for an idle close crossing the
/// request, so only the look at the socket before reuse can save the calls.
#[test]
fn a_connection_closed_for_idleness_is_replaced_silently() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new("rdmalog test CA");
    let ca = dir.path().join("ca.pem");
    pki.write_ca(&ca);
    let (cert, key) = pki.issue(&["localhost", "127.0.0.1"], dir.path());
    for tls in [false, true] {
        let c = cluster(|o| {
            o.idle_timeout = Duration::from_millis(100);
            if tls {
                o.tls = Some(server::tls::server_config(&cert, &key, None).unwrap());
            }
        });
        let leader = c.leader();
        let mut cfg = c.config(&[leader]);
        if tls {
            cfg.tls = Some(TlsConfig {
                ca: ca.clone(),
                client_cert: None,
                server_name: None,
            });
        }
        let mut client = Client::connect(cfg).unwrap();
        let (first, _) = client.append(&[b"before"]).unwrap();
        std::thread::sleep(Duration::from_millis(600));
        let (second, _) = client
            .append(&[b"after"])
            .unwrap_or_else(|e| panic!("an append after an idle close (tls: {tls}): {e}"));
        assert!(second > first);
        std::thread::sleep(Duration::from_millis(600));
        let (entries, _) = client
            .read(second, 1 << 20)
            .unwrap_or_else(|e| panic!("a read after an idle close (tls: {tls}): {e}"));
        assert_eq!(payloads(&entries), [&b"after"[..]]);
    }
}

/// A member that accepts connections and never answers the hello (a stopped process) is
/// first in the list, and the call's deadline is as short as the connect timeout (the CLI's
/// `--timeout 3s` sets both): the client still reaches the others in time, as each attempt
/// gets a share of what is left. Before, the hung member took the whole deadline.
#[test]
fn a_member_that_never_answers_does_not_take_the_whole_deadline() {
    let c = cluster(|_| {});
    c.leader();
    let hung = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let hung_addr = hung.local_addr().unwrap().to_string();
    // Accepted by the kernel's backlog, never read: the hello stays unanswered.
    let mut cfg = c.config(&[1, 2, 3]);
    cfg.servers.insert(0, hung_addr.clone());
    cfg.deadline = Duration::from_secs(3);
    cfg.connect_timeout = Duration::from_secs(3);
    let start = Instant::now();
    let mut client =
        Client::connect(cfg).unwrap_or_else(|e| panic!("connect with {hung_addr} hung first: {e}"));
    let took = start.elapsed();
    let (_, addr, _) = client.connected_to().unwrap();
    assert_ne!(addr, hung_addr);
    // A quarter of the 3 s for the hung member, then the next one answers.
    assert!(took < Duration::from_secs(3), "{took:?}");
    client.append(&[b"past a hung member"]).unwrap();
    drop(hung);
}

/// A TLS handshake is bounded by the attempt's deadline as a whole: a "server" that trickles
/// its handshake a byte at a time (each of the client's reads then succeeds before its
/// timeout) does not hold `Client::connect` past its deadline. Before, rustls's `complete_io`
/// kept reading for as long as the bytes came.
#[test]
fn a_server_that_trickles_its_tls_handshake_cannot_hold_the_client() {
    use std::io::{Read, Write};
    use std::sync::atomic::{AtomicBool, Ordering};
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    Pki::new("rdmalog test CA").write_ca(&ca);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let stop = Arc::new(AtomicBool::new(false));
    let stopped = stop.clone();
    std::thread::spawn(move || {
        for s in listener.incoming() {
            let Ok(mut s) = s else { return };
            let stopped = stopped.clone();
            std::thread::spawn(move || {
                s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
                let _ = s.read(&mut [0u8; 4096]);
                // A handshake record's header announcing 16 KiB, then its bytes one at a time.
                if s.write_all(&[0x16, 0x03, 0x03, 0x40, 0x00]).is_err() {
                    return;
                }
                let start = Instant::now();
                while !stopped.load(Ordering::Relaxed) && start.elapsed() < Duration::from_secs(30)
                {
                    if s.write_all(&[0x02]).is_err() {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            });
        }
    });
    let mut cfg = ClientConfig::new(vec![addr.clone()], 9);
    cfg.tls = Some(TlsConfig {
        ca,
        client_cert: None,
        server_name: Some("localhost".into()),
    });
    cfg.connect_timeout = Duration::from_secs(1);
    cfg.deadline = Duration::from_secs(2);
    let start = Instant::now();
    let e = match Client::connect(cfg) {
        Ok(_) => panic!("connected to a server that never finishes its handshake"),
        Err(e) => e,
    };
    let took = start.elapsed();
    stop.store(true, Ordering::Relaxed);
    println!("gave up on {addr} after {took:?}: {e}");
    assert!(took < Duration::from_secs(4), "{took:?}: {e}");
    assert!(
        e.to_string().contains("TLS handshake"),
        "the error does not say what did not finish: {e}"
    );
}
