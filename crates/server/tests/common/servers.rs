//! A three-server cluster driven by the `rdmalog` CLI, on either transport; the scenario of
//! `lab_server.rs` (lab, RDMA and TCP) and `tcp_server.rs` (this host, TCP on loopback), and
//! the recovering node of `tcp_server.rs` (memory durability, a tmpfs ring directory).
#![allow(dead_code)] // reason: each test binary runs a subset

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const CLUSTER: &str = "0x1ab";

/// Where the servers run: the transport, their addresses and ports.
#[derive(Clone, Copy, Debug)]
pub struct Place {
    /// `rdma` or `tcp`.
    pub transport: &'static str,
    /// Loopback (`127.0.1.i`, no lab) instead of the lab hosts (`192.0.2.1i`).
    pub loopback: bool,
    /// Port base: replication at `base + i`, clients at `base + 100 + i`.
    pub base: u16,
    /// TLS on the peer links (`[peer_tls]`, certificates from a CA made for the test).
    pub peer_tls: bool,
    /// TLS on the client port (`[tls]`, the same certificates; the CLI then gets `--ca`).
    pub client_tls: bool,
    /// `durability` (`fsync`, `memory` or `replicated`); the rings of the last two in a
    /// directory of their own on /dev/shm.
    pub durability: &'static str,
}

impl Place {
    /// RDMA across the lab's hosts.
    pub const LAB_RDMA: Place = Place {
        transport: "rdma",
        loopback: false,
        base: 9100,
        peer_tls: false,
        client_tls: false,
        durability: "fsync",
    };
    /// TCP across the lab's hosts.
    pub const LAB_TCP: Place = Place {
        transport: "tcp",
        loopback: false,
        base: 9400,
        peer_tls: false,
        client_tls: false,
        durability: "fsync",
    };
    /// TCP on this host's loopback.
    pub const HOST_TCP: Place = Place {
        transport: "tcp",
        loopback: true,
        base: 9700,
        peer_tls: false,
        client_tls: false,
        durability: "fsync",
    };
    /// TCP on this host's loopback, under `memory` durability.
    pub const HOST_TCP_MEMORY: Place = Place {
        transport: "tcp",
        loopback: true,
        base: 13700,
        peer_tls: false,
        client_tls: false,
        durability: "memory",
    };
    /// TCP on this host's loopback, with TLS on the peer links.
    pub const HOST_TCP_TLS: Place = Place {
        transport: "tcp",
        loopback: true,
        base: 11700,
        peer_tls: true,
        client_tls: false,
        durability: "fsync",
    };
}

static PLACE: std::sync::Mutex<Place> = std::sync::Mutex::new(Place::LAB_RDMA);

/// The CA of the client port's certificates, when the place has client TLS.
static CLIENT_CA: std::sync::Mutex<Option<PathBuf>> = std::sync::Mutex::new(None);

fn client_ca() -> Option<PathBuf> {
    CLIENT_CA
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone()
}

fn place() -> Place {
    *PLACE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn ip(i: u64) -> String {
    if place().loopback {
        format!("127.0.1.{i}")
    } else {
        format!("192.0.2.1{i}")
    }
}

fn rdma_addr(i: u64) -> String {
    format!("{}:{}", ip(i), place().base + i as u16)
}

fn client_addr(i: u64) -> String {
    format!("{}:{}", ip(i), place().base + 100 + i as u16)
}

fn servers_arg() -> String {
    (1..=3).map(client_addr).collect::<Vec<_>>().join(",")
}

/// The `rdmalog` CLI built beside this test (target/debug/rdmalog).
fn cli_bin() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap();
    let bin = dir.join("rdmalog");
    assert!(
        bin.is_file(),
        "{} is missing: build the workspace (cargo test --workspace builds it)",
        bin.display()
    );
    bin
}

/// Three servers at one place, their files in a temporary directory. Holds the one-place-at-a-
/// time lock: the helpers read the place from `PLACE`.
pub struct Servers {
    dir: PathBuf,
    procs: Vec<Option<Child>>,
    _files: tempfile::TempDir,
    /// The ring directory (tmpfs) under `memory` or `replicated` durability.
    rings: Option<tempfile::TempDir>,
    /// Appended to every node's configuration file (sections of its own, such as `[raft]`).
    extra: String,
    _one: std::sync::MutexGuard<'static, ()>,
}

/// Starts three servers at `at`. One place at a time.
pub fn start_three(at: Place) -> Servers {
    start_three_with(at, "")
}

/// [`start_three`] with `extra` appended to every node's configuration file.
pub fn start_three_with(at: Place, extra: &str) -> Servers {
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let one = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    *PLACE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = at;
    println!(
        "servers over {}{} ({})",
        at.transport,
        if at.peer_tls { " with peer TLS" } else { "" },
        if at.loopback { "loopback" } else { "lab hosts" }
    );
    let root = std::env::var_os("RDMALOG_LAB_DISK")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let t = tempfile::Builder::new()
        .prefix("servers")
        .tempdir_in(root)
        .unwrap();
    let rings = (at.durability != "fsync").then(|| {
        tempfile::Builder::new()
            .prefix("rdmalog-rings")
            .tempdir_in("/dev/shm")
            .unwrap()
    });
    let mut s = Servers {
        dir: t.path().to_path_buf(),
        procs: vec![None, None, None],
        _files: t,
        rings,
        extra: extra.to_string(),
        _one: one,
    };
    s.write_configs();
    if at.transport == "rdma" {
        // A Soft-RoCE artifact left by an earlier lab test (a dead QP1) would fail this one.
        lab::guest::repair_dead_rdma_cm().unwrap();
    }
    for i in 1..=3 {
        s.start(i);
    }
    s
}

impl Servers {
    /// The three client addresses, comma-separated.
    pub fn client_addrs(&self) -> String {
        servers_arg()
    }

    /// The CA file of the client port's certificates (a place with client TLS).
    pub fn client_ca(&self) -> Option<PathBuf> {
        client_ca()
    }

    /// Server `i`'s client address.
    pub fn client_addr(&self, i: u64) -> String {
        client_addr(i)
    }

    /// Whether server `i`'s process is still running (it may have exited on its own).
    pub fn running(&mut self, i: u64) -> bool {
        self.procs[i as usize - 1]
            .as_mut()
            .is_some_and(|c| c.try_wait().unwrap().is_none())
    }

    /// The cluster id the servers are configured with.
    pub fn cluster_id(&self) -> &'static str {
        CLUSTER
    }

    /// Waits for a leader that `want_members` members see, and returns it.
    pub fn leader(&self, want_members: usize) -> u64 {
        leader_of(&status(want_members))
    }

    /// A scratch directory beside the servers' files.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn config(&self, i: u64) -> PathBuf {
        self.dir.join(format!("node{i}.toml"))
    }

    fn data_dir(&self, i: u64) -> PathBuf {
        self.dir.join(format!("node{i}"))
    }

    fn log(&self, i: u64) -> PathBuf {
        self.dir.join(format!("node{i}.log"))
    }

    fn write_configs(&self) {
        let secret = self.dir.join("cluster.secret");
        std::fs::write(&secret, b"lab-server-test-secret-0123456789\n").unwrap();
        std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .unwrap();
        let tls = (place().peer_tls || place().client_tls).then(|| self.write_pki());
        *CLIENT_CA
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = tls
            .as_ref()
            .filter(|_| place().client_tls)
            .map(|(ca, _)| ca.clone());
        for i in 1..=3u64 {
            let client_tls = match (&tls, place().client_tls) {
                (Some((_, certs)), true) => format!(
                    "[tls]\ncert = \"{}\"\nkey = \"{}\"\n\n",
                    certs[i as usize - 1].0.display(),
                    certs[i as usize - 1].1.display()
                ),
                _ => String::new(),
            };
            let plaintext = if place().client_tls {
                ""
            } else {
                "plaintext = true\n"
            };
            let peer_tls =
                tls.as_ref()
                    .filter(|_| place().peer_tls)
                    .map_or(String::new(), |(ca, certs)| {
                        format!(
                            "[peer_tls]\ncert = \"{}\"\nkey = \"{}\"\nca = \"{}\"\n\n",
                            certs[i as usize - 1].0.display(),
                            certs[i as usize - 1].1.display(),
                            ca.display()
                        )
                    });
            let mut peers = String::new();
            for p in (1..=3u64).filter(|&p| p != i) {
                peers += &format!(
                    "[[peers]]\nid = {p}\nrdma = \"{}\"\nclient = \"{}\"\n\n",
                    rdma_addr(p),
                    client_addr(p)
                );
            }
            let rings = self.rings.as_ref().map_or(String::new(), |r| {
                format!("ring_dir = \"{}\"\n", r.path().display())
            });
            let text = format!(
                "node_id = {i}\ncluster_id = \"{CLUSTER}\"\ntransport = \"{}\"\ndurability = \"{}\"\n{rings}data_dir = \"{}\"\nsegment_mib = 1\n\n[rdma]\nlisten = \"{}\"\nsecret_file = \"{}\"\n\n{peer_tls}{peers}[poll]\nmode = \"adaptive\"\n\n[client]\nlisten = \"{}\"\n{plaintext}append_timeout_ms = 20000\n\n{client_tls}[auth]\nanonymous_role = \"admin\"\n\n[metrics]\nlisten = \"127.0.0.1:{}\"\n",
                place().transport,
                place().durability,
                self.data_dir(i).display(),
                rdma_addr(i),
                secret.display(),
                client_addr(i),
                place().base + 200 + i as u16,
            ) + &self.extra;
            std::fs::write(self.config(i), text).unwrap();
        }
    }

    /// A CA and a certificate for each node's replication address, as PEM files: the CA's
    /// path and each node's (certificate, key).
    fn write_pki(&self) -> (PathBuf, Vec<(PathBuf, PathBuf)>) {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "rdmalog peer CA");
        let ca = rcgen::CertifiedIssuer::self_signed(params, rcgen::KeyPair::generate().unwrap())
            .unwrap();
        let ca_path = self.dir.join("peer-ca.crt");
        std::fs::write(&ca_path, ca.pem()).unwrap();
        let certs = (1..=3u64)
            .map(|i| {
                let params = rcgen::CertificateParams::new(vec![ip(i)]).unwrap();
                let key = rcgen::KeyPair::generate().unwrap();
                let cert = params.signed_by(&key, &ca).unwrap();
                let (c, k) = (
                    self.dir.join(format!("node{i}-peer.crt")),
                    self.dir.join(format!("node{i}-peer.key")),
                );
                std::fs::write(&c, cert.pem()).unwrap();
                std::fs::write(&k, key.serialize_pem()).unwrap();
                // A private key is refused unless it is its owner's only.
                std::fs::set_permissions(&k, std::os::unix::fs::PermissionsExt::from_mode(0o600))
                    .unwrap();
                (c, k)
            })
            .collect();
        (ca_path, certs)
    }

    /// Starts server `i`.
    pub fn start(&mut self, i: u64) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log(i))
            .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_rdmalog-server"))
            .arg("--config")
            .arg(self.config(i))
            .env("RUST_LOG", "info")
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        self.procs[i as usize - 1] = Some(child);
    }

    /// kill -9 of server `i`.
    pub fn kill(&mut self, i: u64) {
        if let Some(mut c) = self.procs[i as usize - 1].take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Sends `signal` (`STOP`, `CONT`, ...) to server `i`.
    pub fn signal(&self, i: u64, signal: &str) {
        let c = self.procs[i as usize - 1].as_ref().expect("running");
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &c.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill -{signal} of node {i}");
    }

    /// Removes server `i`'s ring files (as a machine crash loses them); how many there were.
    pub fn remove_rings(&self, i: u64) -> usize {
        let dir = self.rings.as_ref().expect("a ring directory").path();
        let tag = format!("-n{i}-");
        let mut removed = 0;
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            if e.file_name().to_string_lossy().contains(&tag) {
                std::fs::remove_file(e.path()).unwrap();
                removed += 1;
            }
        }
        removed
    }

    /// Server `i`'s `/metrics` page (empty when it does not answer within 5 s).
    pub fn metrics(&self, i: u64) -> String {
        http_get(i, "/metrics")
    }

    /// SIGTERM to server `i`, then waits for its exit.
    pub fn stop(&mut self, i: u64) -> std::process::ExitStatus {
        self.stop_with(i, "TERM")
    }

    /// `signal` (`TERM` or `INT`) to server `i`, then waits for its exit.
    pub fn stop_with(&mut self, i: u64, signal: &str) -> std::process::ExitStatus {
        let mut c = self.procs[i as usize - 1].take().expect("running");
        let pid = c.id().to_string();
        Command::new("kill")
            .args([&format!("-{signal}"), &pid])
            .status()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(s) = c.try_wait().unwrap() {
                return s;
            }
            if Instant::now() >= deadline {
                // Out of `procs` already: kill it here, or nothing would.
                let _ = c.kill();
                let _ = c.wait();
                panic!("node {i} did not stop within 30 s of SIG{signal}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The last lines of server `i`'s log.
    pub fn tail_log(&self, i: u64) -> String {
        let text = std::fs::read_to_string(self.log(i)).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        for i in 1..=3 {
            self.kill(i);
            if std::thread::panicking() {
                eprintln!("---- node {i} log ----\n{}", self.tail_log(i));
            }
        }
    }
}

/// `GET path` from server `i`'s metrics port: the whole reply, empty when it does not answer
/// within 5 s.
fn http_get(i: u64, path: &str) -> String {
    let addr = format!("127.0.0.1:{}", place().base + 200 + i as u16);
    let mut out = String::new();
    if let Ok(mut s) = std::net::TcpStream::connect(&addr) {
        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
        let _ = s.write_all(format!("GET {path} HTTP/1.0\r\n\r\n").as_bytes());
        let _ = std::io::Read::read_to_string(&mut s, &mut out);
    }
    out
}

/// `rdmalog` pointed at the three servers (plaintext, this cluster).
fn cli_command() -> Command {
    let mut c = Command::new(cli_bin());
    c.args(["--servers", &servers_arg(), "--cluster-id", CLUSTER]);
    match client_ca() {
        Some(ca) => c.arg("--ca").arg(ca),
        None => c.arg("--plaintext"),
    };
    c
}

fn cli(args: &[&str]) -> Output {
    let out = cli_command().args(args).output().unwrap();
    println!(
        "$ rdmalog {}\n{}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn status(want_members: usize) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let out = cli(&["status", "--json"]);
        if out.status.success() {
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            let reachable = v["members"]
                .as_array()
                .map_or(0, |a| a.iter().filter(|m| m["reachable"] == true).count());
            if v["leader"].as_u64().is_some() && reachable >= want_members {
                return v;
            }
        }
        assert!(
            Instant::now() < deadline,
            "no status with a leader within 60 s"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn leader_of(v: &serde_json::Value) -> u64 {
    v["members"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["role"] == "leader")
        .and_then(|n| n["id"].as_u64())
        .expect("a leader in the status")
}

/// Three servers at `at`, driven by the CLI through a leader crash (see `lab_server.rs`).
pub fn three_servers_serve_the_cli_through_a_leader_crash(at: Place) {
    let mut s = start_three(at);
    let st = status(3);
    let leader = leader_of(&st);
    println!("leader: node {leader}");
    for i in 1..=3 {
        let banner = format!(
            "up ({} {}{}",
            at.transport,
            rdma_addr(i),
            if at.peer_tls { " tls" } else { "" }
        );
        assert!(
            s.tail_log(i).contains(&banner),
            "node {i} did not start as `{banner}`:\n{}",
            s.tail_log(i)
        );
    }

    assert!(cli(&["append", "one", "two", "three"]).status.success());
    // A follower of the log as a user would run it: tail -f, in the background.
    let mut tail = cli_command()
        .args(["tail", "-f", "--from", "1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let stdout = tail.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });

    s.kill(leader);
    println!("injected: kill -9 of the leader, node {leader}");
    let t0 = Instant::now();
    let out = cli(&["append", "four", "five", "six"]);
    assert!(
        out.status.success(),
        "the CLI did not carry on after the leader crash"
    );
    println!(
        "appended through the new leader {:.2} s after the crash",
        t0.elapsed().as_secs_f64()
    );
    let last = last_committed(&out);
    // Reads with a stated consistency: a linearizable read (the CLI follows the redirect to
    // the leader) and a read-your-writes read on whichever member answers hold it.
    let last_arg = last.to_string();
    for mode in [vec!["--linearizable"], vec!["--after", last_arg.as_str()]] {
        let mut args = vec!["tail", "--from", "1"];
        args.extend(mode);
        let out = cli(&args);
        assert!(out.status.success(), "rdmalog {args:?} failed");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.lines().any(|l| l == format!("{last}\tsix")),
            "rdmalog {args:?} lacks entry {last}: {text}"
        );
    }

    // A conditional append: refused on a stale end, naming the real one; accepted there.
    let out = cli(&["append", "--if-last", "1", "stale"]);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "a stale --if-last was accepted");
    let end: u64 = err
        .split("the log ends at index ")
        .nth(1)
        .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no end in {err:?}"));
    let out = cli(&["append", "--if-last", &end.to_string(), "if-end"]);
    assert!(out.status.success(), "--if-last {end} failed");
    assert_eq!(last_committed(&out), end + 1);
    println!(
        "conditional append: refused on end 1, committed at {} on end {end}",
        end + 1
    );

    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while seen.len() < 7 && Instant::now() < deadline {
        if let Ok(line) = rx.recv_timeout(Duration::from_millis(500)) {
            seen.push(line.split('\t').nth(1).unwrap_or("").to_string());
        }
    }
    let _ = tail.kill();
    let _ = tail.wait();
    println!("tail -f saw: {seen:?}");
    assert_eq!(
        seen,
        ["one", "two", "three", "four", "five", "six", "if-end"]
    );

    s.start(leader);
    println!("restarted node {leader}");
    wait_all_commit(last);
    let bench = cli(&[
        "bench",
        "--entries",
        "200",
        "--size",
        "512",
        "--in-flight",
        "4",
    ]);
    assert!(bench.status.success());
    assert!(String::from_utf8_lossy(&bench.stdout).contains("p99"));

    // Trim: 1.2 MB more (two batches of 4 KB lines) fills more than the first 1 MiB segment;
    // once every member has applied it, `rdmalog trim` deletes it on each, and a read from 1
    // is told the entries were compacted.
    let big = s.dir().join("big.txt");
    let line = "x".repeat(4000);
    std::fs::write(&big, format!("{line}\n").repeat(300)).unwrap();
    let out = cli(&["append", "--file", big.to_str().unwrap()]);
    assert!(out.status.success(), "appending 1.2 MB failed");
    let end = last_committed(&out);
    wait_all_commit(end);
    let out = cli(&["trim", &end.to_string()]);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    println!("$ rdmalog trim {end}\n{text}");
    assert!(out.status.success(), "trim failed: {text}");
    let firsts: Vec<u64> = text
        .lines()
        .filter_map(|l| {
            l.rsplit_once("first index ")
                .and_then(|(_, f)| f.parse().ok())
        })
        .collect();
    assert_eq!(firsts.len(), 3, "{text}");
    assert!(firsts.iter().all(|&f| f > 1 && f <= end), "{text}");
    let out = cli(&["tail", "--from", "1"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("checkpoint"),
        "a read from 1 after the trim: {err}"
    );

    // SIGINT (a terminal's ^C) for one, SIGTERM (the unit's stop) for the others: both stop
    // it the same way.
    for (i, signal) in [(1, "INT"), (2, "TERM"), (3, "TERM")] {
        let st = s.stop_with(i, signal);
        assert!(
            st.success(),
            "node {i} exited with {st} after SIG{signal}:\n{}",
            s.tail_log(i)
        );
        assert!(
            s.tail_log(i).contains("stopped cleanly"),
            "{}",
            s.tail_log(i)
        );
    }
    println!("SIGINT and SIGTERM: all three stopped cleanly");
    for i in 1..=3 {
        let d = s.data_dir(i);
        let out = Command::new(cli_bin())
            .arg("check")
            .arg(&d)
            .output()
            .unwrap();
        println!(
            "$ rdmalog check {}\n{}",
            d.display(),
            String::from_utf8_lossy(&out.stdout)
        );
        assert!(
            out.status.success(),
            "check failed on {}: {}",
            d.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let _ = std::io::stdout().flush();
}

/// The last index an `rdmalog append` printed: from "committed FIRST..=LAST (...)" or, when a
/// resend found entries already in the log, "committed at I,J,K (...)".
fn last_committed(out: &Output) -> u64 {
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix("committed "))
        .filter_map(|rest| {
            let list = rest.split_whitespace().next()?;
            let list = list
                .strip_prefix("at")
                .map_or(list, |_| rest.split_whitespace().nth(1).unwrap_or(""));
            let last = list.rsplit(['=', ',']).next()?;
            last.parse().ok()
        })
        .next_back()
        .unwrap_or_else(|| panic!("no committed index in {stdout:?}"))
}

/// Waits until every member has committed `index` (60 s at most).
fn wait_all_commit(index: u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let v = status(3);
        let commits: Vec<u64> = v["members"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|n| n["commit"].as_u64())
            .collect();
        if commits.len() == 3 && commits.iter().all(|&c| c >= index) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "not every member committed {index}: {v}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// ops/GUIDE.md 3: "A node that starts without the ring it used before ... comes back
/// recovering: `rdmalog status` shows its role as `recovering`, `/status` has a `recovering`
/// sentence and `rdmalog_recovering` is 1." Under `memory` durability a follower is killed
/// (-9), its ring files removed (as its machine's crash would), and it restarts while the two
/// others are stopped (SIGSTOP), so it cannot catch up: recovering, on all three surfaces.
/// Once they run again it catches up and is a follower, `rdmalog_recovering` 0.
pub fn a_node_that_lost_its_ring_shows_recovering(at: Place) {
    let mut s = start_three(at);
    let leader = leader_of(&status(3));
    assert!(cli(&["append", "one", "two", "three"]).status.success());
    let f = (1..=3).find(|&i| i != leader).unwrap();
    let other = (1..=3).find(|&i| i != leader && i != f).unwrap();
    s.kill(f);
    let removed = s.remove_rings(f);
    assert!(removed > 0, "node {f} had no ring files");
    s.signal(leader, "STOP");
    s.signal(other, "STOP");
    s.start(f);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !s.metrics(f).contains("\nrdmalog_recovering 1") {
        assert!(
            Instant::now() < deadline,
            "node {f} never reported rdmalog_recovering 1:\n{}\n{}",
            s.metrics(f),
            s.tail_log(f)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // The two stopped members take the connect timeout (3 s) each to give up on.
    let out = cli(&["--timeout", "20s", "status", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    let role = v["members"]
        .as_array()
        .and_then(|m| m.iter().find(|n| n["id"] == f))
        .map(|n| n["role"].clone());
    assert_eq!(
        role,
        Some(serde_json::Value::from("recovering")),
        "rdmalog status: {v}"
    );
    let page = http_get(f, "/status");
    let body: serde_json::Value =
        serde_json::from_str(page.split("\r\n\r\n").nth(1).unwrap_or("{}"))
            .unwrap_or_else(|e| panic!("/status of node {f}: {e}: {page}"));
    assert!(
        body["recovering"].as_str().is_some_and(|w| !w.is_empty()),
        "/status without a recovering sentence: {body}"
    );
    s.signal(leader, "CONT");
    s.signal(other, "CONT");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !s.metrics(f).contains("\nrdmalog_recovering 0") {
        assert!(
            Instant::now() < deadline,
            "node {f} never caught up:\n{}",
            s.tail_log(f)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}
