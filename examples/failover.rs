//! Three replicas in one process on the in-process fabric: append, stop the leader, watch the
//! failover, append again, and check that nothing acknowledged was lost.
//!
//! Run with `cargo run -p replica --example failover`.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use fabric::NodeId;
use fabric::sim::{SimConfig, SimNet};
use replica::{Log, LogOptions, ReplicaConfig};
use wal::fs::{FaultFs, FileSystem};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let net = SimNet::new(SimConfig::default(), 42);
    let stop = Arc::new(AtomicBool::new(false));
    let clock = net.run_realtime(stop.clone());
    let voters = vec![1, 2, 3];
    let mut logs = Vec::new();
    for id in 1..=3u64 {
        let mut cfg = ReplicaConfig::new(id, voters.clone(), 7, format!("/node{id}").into());
        cfg.ring_bytes = 4 << 20;
        cfg.segment_bytes = 16 << 20;
        let disk: Arc<dyn FileSystem> = Arc::new(FaultFs::new());
        logs.push(Some(Log::open(
            cfg,
            net.add_node(NodeId(id)),
            disk,
            LogOptions::default(),
        )?));
    }
    let leader = wait_for_leader(&logs, None)?;
    println!("node {leader} is the leader");

    let mut acked = Vec::new();
    for i in 0..100u32 {
        let log = logs[leader as usize - 1].as_ref().expect("leader is up");
        let index = log
            .append(format!("entry {i}").as_bytes())?
            .wait(Duration::from_secs(5))?;
        acked.push((index, format!("entry {i}")));
    }
    println!("appended and committed 100 entries through node {leader}");

    let t = Instant::now();
    net.crash(NodeId(leader));
    if let Some(old) = logs[leader as usize - 1].take() {
        drop(old);
    }
    println!("stopped node {leader}");
    let new = wait_for_leader(&logs, Some(leader))?;
    println!(
        "node {new} took over after {:.0} ms",
        t.elapsed().as_secs_f64() * 1000.0
    );

    for i in 100..150u32 {
        let log = logs[new as usize - 1].as_ref().expect("new leader is up");
        let index = log
            .append(format!("entry {i}").as_bytes())?
            .wait(Duration::from_secs(5))?;
        acked.push((index, format!("entry {i}")));
    }
    let log = logs[new as usize - 1].as_ref().expect("up");
    let mut lost = 0;
    for (index, want) in &acked {
        if log.read(*index)?.as_deref() != Some(want.as_bytes()) {
            lost += 1;
        }
    }
    println!(
        "{} appended, {} committed, {lost} lost",
        acked.len(),
        acked.len() - lost
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for log in logs.into_iter().flatten() {
        log.close()?;
    }
    clock.join().ok();
    if lost > 0 {
        return Err(format!("{lost} acknowledged entries were lost").into());
    }
    Ok(())
}

fn wait_for_leader(
    logs: &[Option<Log<fabric::sim::SimEndpoint>>],
    not: Option<u64>,
) -> Result<u64, String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        for log in logs.iter().flatten() {
            let s = log.status();
            if s.role == replica::Role::Leader && Some(s.id) != not {
                return Ok(s.id);
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Err("no leader within 10 s".into())
}
