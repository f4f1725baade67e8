//! The lab demo (`ops/demo` runs it inside the 3-host Soft-RoCE lab): three replicas on rxe1,
//! rxe2 and rxe3, each with its own RDMA endpoint and driver thread; an append workload with
//! progress; the leader is stopped halfway; the demo shows the failover and verifies that
//! every acknowledged entry is present, byte for byte, on the surviving replicas.
//!
//! Outside the lab (no rxe devices) it says so and exits with status 2.

use std::collections::BTreeMap;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fabric::NodeId;
use fabric::rdma::{RdmaConfig, RdmaEndpoint};
use replica::{Durability, Log, LogOptions, PollMode, ReplicaConfig, ReplicaError, Role};
use wal::fs::{FileSystem, StdFs};

const NODES: u64 = 3;

fn addr(i: u64) -> SocketAddr {
    format!("192.0.2.1{i}:{}", 7600 + i)
        .parse()
        .expect("lab address")
}

fn payload(i: u64) -> Vec<u8> {
    let len = [8usize, 64, 512, 4096, 16_384, 65_536][(i % 6) as usize];
    (0..len).map(|k| (i as usize * 31 + k) as u8).collect()
}

fn open(id: u64, dir: &std::path::Path) -> Result<Log<RdmaEndpoint>, Box<dyn std::error::Error>> {
    let peers: BTreeMap<NodeId, SocketAddr> = (1..=NODES)
        .filter(|&p| p != id)
        .map(|p| (NodeId(p), addr(p)))
        .collect();
    let mut rc = RdmaConfig::new(NodeId(id), 0xde30, addr(id), peers);
    // Peers are admitted only after proving they know the cluster secret.
    rc.secret = Some(Arc::new(
        b"demo cluster secret, not for production".to_vec(),
    ));
    let ep = RdmaEndpoint::open(rc)?;
    let mut cfg = ReplicaConfig::new(
        id,
        (1..=NODES).collect(),
        0xde30,
        dir.join(format!("node{id}")),
    );
    cfg.durability = Durability::Fsync;
    cfg.election_tick = 20;
    cfg.heartbeat_tick = 3;
    cfg.election_window = Some((20 + 10 * id as usize, 21 + 10 * id as usize));
    let fs: Arc<dyn FileSystem> = Arc::new(StdFs);
    let opts = LogOptions {
        tick: Duration::from_millis(20),
        poll: PollMode::Adaptive {
            spin: Duration::from_micros(50),
        },
        pin_core: None,
    };
    Ok(Log::open(cfg, ep, fs, opts)?)
}

fn leader(logs: &[Option<Log<RdmaEndpoint>>], within: Duration) -> Option<u64> {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if let Some(s) = logs
            .iter()
            .flatten()
            .map(|l| l.status())
            .find(|s| s.role == Role::Leader)
        {
            return Some(s.id);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    None
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if std::env::var_os("RDMALOG_LAB").is_none() {
        eprintln!("rdma_demo: not inside the lab (RDMALOG_LAB is unset); run `ops/demo`");
        std::process::exit(2);
    }
    let total: u64 = std::env::var("RDMALOG_DEMO_APPENDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let dir = std::env::temp_dir().join("rdmalog-demo");
    let _ = std::fs::remove_dir_all(&dir);
    let mut logs: Vec<Option<Log<RdmaEndpoint>>> = Vec::new();
    for id in 1..=NODES {
        logs.push(Some(open(id, &dir)?));
        println!("demo: node {id} up on rxe{id} ({})", addr(id));
    }
    let first = leader(&logs, Duration::from_secs(60)).ok_or("no leader within 60 s")?;
    println!("demo: node {first} is the leader");

    let mut acked: Vec<(u64, u64)> = Vec::new();
    let mut killed = None;
    let mut failover = None;
    let started = Instant::now();
    let mut i = 0u64;
    while i < total {
        if killed.is_none() && i >= total / 2 {
            let l = leader(&logs, Duration::from_secs(10)).ok_or("no leader")?;
            let last_commit = Instant::now();
            if let Some(log) = logs[l as usize - 1].take() {
                log.close()?;
            }
            println!("\ndemo: stopped the leader, node {l}, after {i} appends");
            killed = Some((l, last_commit));
        }
        let Some(l) = leader(&logs, Duration::from_secs(60)) else {
            return Err("no leader within 60 s".into());
        };
        let log = logs[l as usize - 1].as_ref().expect("leader is up");
        let end = (i + 16).min(total);
        let handles: Vec<_> = (i..end)
            .map_while(|k| log.append(&payload(k)).ok().map(|h| (k, h)))
            .collect();
        for (k, h) in handles {
            match h.wait(Duration::from_secs(30)) {
                Ok(index) => {
                    if let (Some((_, t)), None) = (killed, failover) {
                        failover = Some((l, t.elapsed()));
                        println!(
                            "demo: node {l} took over; failover (last commit before the stop -> first commit after) {:.0} ms",
                            t.elapsed().as_secs_f64() * 1000.0
                        );
                    }
                    acked.push((index, k));
                    i = k + 1;
                }
                Err(
                    ReplicaError::NotLeader { .. }
                    | ReplicaError::Superseded { .. }
                    | ReplicaError::Timeout { .. }
                    | ReplicaError::Closed,
                ) => break,
                Err(e) => return Err(e.into()),
            }
        }
        if i % 100 < 16 || i == total {
            print!(
                "\rdemo: {i}/{total} appended and committed ({:.0}/s)",
                i as f64 / started.elapsed().as_secs_f64()
            );
            std::io::stdout().flush().ok();
        }
    }
    println!();
    let survivors: Vec<u64> = logs.iter().flatten().map(|l| l.status().id).collect();
    let mut lost = 0;
    let mut differ = 0;
    for log in logs.iter().flatten() {
        for &(index, k) in &acked {
            let deadline = Instant::now() + Duration::from_secs(30);
            let got = loop {
                match log.read(index)? {
                    Some(d) => break Some(d),
                    None if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(10))
                    }
                    None => break None,
                }
            };
            match got {
                None => lost += 1,
                Some(d) if d != payload(k) => differ += 1,
                Some(_) => {}
            }
        }
    }
    let l = leader(&logs, Duration::from_secs(10)).ok_or("no leader at the end")?;
    let s = logs[l as usize - 1].as_ref().expect("up").status();
    println!(
        "demo: leader {l} stats: {} fast appends ({:.1} MiB RDMA-written), {} slow, {} fenced writes",
        s.stats.fast_appends,
        s.stats.fast_bytes as f64 / 1048576.0,
        s.stats.slow_appends,
        s.stats.fenced_writes
    );
    let identical = lost == 0 && differ == 0;
    println!(
        "demo: {} appended, {} committed, {lost} lost, logs {} on {} hosts ({:?})",
        total,
        acked.len(),
        if identical { "identical" } else { "DIFFERENT" },
        survivors.len(),
        survivors
    );
    for log in logs.into_iter().flatten() {
        log.close()?;
    }
    if !identical || acked.len() as u64 != total {
        return Err("verification failed".into());
    }
    Ok(())
}
