//! Host test: three `rdmalog-server` processes with `transport = "tcp"` on this host's
//! loopback (`127.0.1.1-3`), no RDMA and no lab, driven by the `rdmalog` CLI as a user would:
//! append, tail -f, status, kill -9 of the leader with the CLI carrying on through the
//! redirect, the old leader's restart and catch-up, `rdmalog bench`, SIGINT of one server and
//! SIGTERM of the others, and `rdmalog check` of every data dir. The same scenario runs over RDMA and TCP in the lab
//! (`lab_server.rs`). With `[peer_tls]` the same scenario runs with TLS on every peer link.
//! Under `memory` durability, a follower whose ring was lost shows `recovering` in
//! `rdmalog status`, `/status` and `rdmalog_recovering` until it caught up. SIGTERM gives an
//! append pending at the leader its grace to commit.

mod common;

use common::servers::{
    Place, a_node_that_lost_its_ring_shows_recovering,
    three_servers_serve_the_cli_through_a_leader_crash as scenario,
};

#[test]
fn three_tcp_servers_serve_the_cli_through_a_leader_crash() {
    scenario(Place::HOST_TCP);
}

#[test]
fn three_tcp_servers_with_peer_tls_serve_the_cli_through_a_leader_crash() {
    scenario(Place::HOST_TCP_TLS);
}

#[test]
fn a_node_that_lost_its_ring_shows_recovering_in_status_and_metrics() {
    a_node_that_lost_its_ring_shows_recovering(Place::HOST_TCP_MEMORY);
}

/// SIGTERM gives the appends pending at the leader its grace (5 s) to commit, at the binary:
/// both followers are stopped (SIGSTOP), a client's append waits at the leader, the leader
/// gets SIGTERM, and it is still running a second later; then the followers go on (SIGCONT),
/// the append commits, the client gets its answer from the leader that is shutting down (it
/// knows no other address, so an answer means this one), and the leader exits cleanly. The
/// entry is then in the log the survivors elect a new leader over. Elections are slowed
/// (3 s) so that the stopped followers do not cost the leader its term meanwhile
/// (`check_quorum`).
#[test]
fn sigterm_gives_pending_appends_their_grace() {
    use std::time::{Duration, Instant};
    const GRACE: Place = Place {
        base: 14700,
        ..Place::HOST_TCP
    };
    let mut s = common::servers::start_three_with(GRACE, "\n[raft]\nelection_ticks = 150\n");
    let leader = s.leader(3);
    let followers: Vec<u64> = (1..=3).filter(|&i| i != leader).collect();
    let mut cfg = client::ClientConfig::new(vec![s.client_addr(leader)], 0);
    cfg.cluster_id = u64::from_str_radix(s.cluster_id().trim_start_matches("0x"), 16).unwrap();
    cfg.exactly_once = false;
    cfg.deadline = Duration::from_secs(20);
    let mut c = client::Client::connect(cfg).unwrap();
    for &f in &followers {
        s.signal(f, "STOP");
    }
    let append = std::thread::spawn(move || c.append(&[b"graced"]));
    std::thread::sleep(Duration::from_millis(300));
    s.signal(leader, "TERM");
    let termed = Instant::now();
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        s.running(leader),
        "the leader exited within a second of SIGTERM with an append pending:\n{}",
        s.tail_log(leader)
    );
    for &f in &followers {
        s.signal(f, "CONT");
    }
    let (first, last) = append
        .join()
        .unwrap()
        .unwrap_or_else(|e| panic!("the pending append: {e}\n{}", s.tail_log(leader)));
    assert_eq!(first, last);
    let st = s.stop(leader);
    let took = termed.elapsed();
    assert!(st.success(), "exit {st}:\n{}", s.tail_log(leader));
    assert!(
        s.tail_log(leader).contains("stopped cleanly"),
        "{}",
        s.tail_log(leader)
    );
    println!(
        "the append pending at SIGTERM committed at {first}; the leader exited {took:?} after SIGTERM"
    );
    // The survivors hold it.
    let mut cfg =
        client::ClientConfig::new(followers.iter().map(|&f| s.client_addr(f)).collect(), 0);
    cfg.cluster_id = u64::from_str_radix(s.cluster_id().trim_start_matches("0x"), 16).unwrap();
    cfg.deadline = Duration::from_secs(30);
    let mut c = client::Client::connect(cfg).unwrap();
    let (entries, _) = c
        .read_with(first, 1 << 20, proto::ReadConsistency::Linearizable)
        .unwrap();
    assert_eq!(
        entries.first().map(|e| e.data.as_slice()),
        Some(&b"graced"[..])
    );
}

/// The server raises its soft limit on open files to the hard one at start: a shell's default
/// of 1,024 is spent by a flood of clients (up to twice `max_connections` held while refused)
/// or by a log of a thousand segment files, and a log that cannot create its next segment
/// stops. Started under a soft limit of 300 (hard 2,048), it says it raised it, and warns that
/// 2,048 is short of what 1,024 connections may take; then it serves.
#[test]
fn the_server_raises_its_open_files_limit() {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().unwrap();
    let config = single_node_config(dir.path(), free_port());
    let mut child = std::process::Command::new("prlimit")
        .arg("--nofile=300:2048")
        .arg(env!("CARGO_BIN_EXE_rdmalog-server"))
        .arg("--config")
        .arg(&config)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("prlimit (util-linux) runs the server");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut seen = Vec::new();
    let up = loop {
        let Some(Ok(line)) = lines.next() else {
            break false;
        };
        seen.push(line.clone());
        if line.contains(": up (") {
            break true;
        }
    };
    let _ = child.kill();
    let _ = child.wait();
    let all = seen.join("\n");
    assert!(up, "the server did not come up:\n{all}");
    assert!(
        all.contains("raised the open files limit from=Some(300) to=Some(2048)"),
        "{all}"
    );
    assert!(
        all.contains("the open files limit is short") && all.contains("need=3072"),
        "{all}"
    );
}

/// A client port in use stops the server before it opens the log, so before it takes part
/// in its cluster (it used to open the log, start its driver, vote, and then fail to bind):
/// the error names the port, and the data dir is not created.
#[test]
fn a_client_port_in_use_stops_the_server_before_it_opens_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let data = dir.path().join("data");
    let config = single_node_config(dir.path(), taken.local_addr().unwrap());
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_rdmalog-server"))
        .arg("--config")
        .arg(&config)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains(&format!("the client port {}", taken.local_addr().unwrap())),
        "{err}"
    );
    assert!(
        !data.exists(),
        "the log was opened before the port was bound"
    );
}

/// A port on loopback free when asked.
fn free_port() -> std::net::SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// The configuration of a one-node cluster over TCP in `dir` (its data in `dir/data`), serving
/// clients on `client`; its path.
fn single_node_config(dir: &std::path::Path, client: std::net::SocketAddr) -> std::path::PathBuf {
    let config = dir.join("server.toml");
    std::fs::write(
        &config,
        format!(
            "node_id = 1\ncluster_id = 7\ntransport = \"tcp\"\ndata_dir = \"{}\"\n\n[rdma]\nlisten = \"{}\"\n\n[client]\nlisten = \"{client}\"\nplaintext = true\n",
            dir.join("data").display(),
            free_port()
        ),
    )
    .unwrap();
    config
}
