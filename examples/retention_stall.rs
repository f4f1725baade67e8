//! How long a retention pass holds up commits: three logs on real files (8 MiB segments, in a
//! temporary directory) over the in-process fabric, 20,000 entries of 4,000 bytes, then one
//! pass keeping the newest 1,000 entries while a second thread appends and waits for one
//! entry at a time; prints the pass's duration and the longest commit meanwhile.
//!
//! `cargo run --release -p replica --example retention_stall` (benches/RESULTS.md records the
//! figures; wall-clock times of a shared machine, to compare builds in one sitting).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use fabric::NodeId;
use fabric::sim::{SimConfig, SimNet};
use replica::retention::Retention;
use replica::{Log, LogOptions, ReplicaConfig, Role};
use wal::fs::{FileSystem, StdFs};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let net = SimNet::new(SimConfig::default(), 5);
    let stop = Arc::new(AtomicBool::new(false));
    net.run_realtime(stop.clone());
    let mut logs = Vec::new();
    for id in 1..=3u64 {
        let mut cfg = ReplicaConfig::new(id, vec![1, 2, 3], 9, dir.path().join(format!("n{id}")));
        cfg.ring_bytes = 8 << 20;
        cfg.segment_bytes = 8 << 20;
        cfg.election_window = Some((10 + 3 * id as usize, 11 + 3 * id as usize));
        let disk: Arc<dyn FileSystem> = Arc::new(StdFs);
        let log = Log::open(cfg, net.add_node(NodeId(id)), disk, LogOptions::default())?;
        logs.push(Arc::new(log));
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    let l = loop {
        if let Some(k) = logs.iter().position(|l| l.status().role == Role::Leader) {
            break k;
        }
        if Instant::now() > deadline {
            return Err("no leader within 30 s".into());
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let payload = vec![7u8; 4000];
    let (n, batch) = (20_000, 100);
    let started = Instant::now();
    for _ in 0..n / batch {
        let items: Vec<&[u8]> = (0..batch).map(|_| &payload[..]).collect();
        for h in logs[l].append_batch(&items)? {
            h.wait(Duration::from_secs(30))?;
        }
    }
    println!(
        "appended {n} entries of {} bytes in {:?}",
        payload.len(),
        started.elapsed()
    );
    let probe_log = logs[l].clone();
    let probing = Arc::new(AtomicBool::new(true));
    let still = probing.clone();
    let probe = std::thread::spawn(move || -> Result<(Duration, u64), String> {
        let (mut worst, mut commits) = (Duration::ZERO, 0);
        while still.load(Ordering::Relaxed) {
            let t = Instant::now();
            probe_log
                .append(b"probe")
                .and_then(|h| h.wait(Duration::from_secs(30)))
                .map_err(|e| e.to_string())?;
            worst = worst.max(t.elapsed());
            commits += 1;
        }
        Ok((worst, commits))
    });
    std::thread::sleep(Duration::from_millis(200));
    let policy = Retention {
        max_entries: Some(1000),
        ..Retention::default()
    };
    let t = Instant::now();
    let first = logs[l].apply_retention(&policy, SystemTime::now())?;
    let took = t.elapsed();
    std::thread::sleep(Duration::from_millis(200));
    probing.store(false, Ordering::Relaxed);
    let (worst, commits) = probe.join().map_err(|_| "the probe panicked")??;
    println!("retention pass: new first index {first:?} in {took:?}");
    println!(
        "longest commit of {commits} meanwhile (one at a time, 0.4 s around the pass): {worst:?}"
    );
    stop.store(true, Ordering::Relaxed);
    Ok(())
}
