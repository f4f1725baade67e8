//! `rdmalog-demo`: the README's main job, run inside the 3-host lab by `ops/demo`.
//!
//! It starts one `rdmalog-node` process per lab host, runs an append workload through the
//! leader with a progress bar, kills the leader (kill -9) halfway, restarts it as a follower,
//! and ends with the failover time and the verification of every acknowledged entry on all
//! three hosts.

#![deny(unsafe_code)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use node::harness::{Cluster, ClusterConfig, Sizes, Workload, progress_bar, run_workload};

#[derive(Parser, Debug)]
#[command(
    name = "rdmalog-demo",
    about = "A 3-node rdmalog cluster in the lab: appends, a leader crash, failover, verification"
)]
struct Args {
    /// Appends to acknowledge.
    #[arg(long, env = "RDMALOG_DEMO_APPENDS", default_value_t = 2000)]
    appends: u64,
    /// Smallest payload in bytes.
    #[arg(long, default_value_t = 8)]
    min_bytes: usize,
    /// Largest payload in bytes (at most 65536).
    #[arg(long, default_value_t = 16 << 10)]
    max_bytes: usize,
    /// The rdmalog-node binary [default: next to this one].
    #[arg(long)]
    node_bin: Option<PathBuf>,
    /// Where data dirs and node logs go [default: $RDMALOG_LAB_DISK, else a temporary dir].
    #[arg(long)]
    dir: Option<PathBuf>,
    /// fsync, memory or replicated.
    #[arg(
        long,
        env = "RDMALOG_DEMO_DURABILITY",
        default_value = "fsync",
        value_parser = ["fsync", "memory", "replicated"]
    )]
    durability: String,
    /// The replication transport between the lab hosts: rdma (Soft-RoCE) or tcp.
    #[arg(
        long,
        env = "RDMALOG_DEMO_TRANSPORT",
        default_value = "rdma",
        value_parser = ["rdma", "tcp"]
    )]
    transport: String,
    /// Appends of the final latency measurement (64 B, one in flight).
    #[arg(long, default_value_t = 300)]
    latency_appends: u64,
}

fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    anyhow::ensure!(
        a.appends >= 10,
        "--appends must be at least 10 (got {})",
        a.appends
    );
    anyhow::ensure!(
        (8..=65536).contains(&a.max_bytes) && a.min_bytes <= a.max_bytes,
        "payload sizes must satisfy 8 <= --min-bytes <= --max-bytes <= 65536"
    );
    anyhow::ensure!(
        lab::guest::in_lab(),
        "rdmalog-demo runs inside the lab: use ops/demo (or ops/lab run -- rdmalog-demo)"
    );
    let bin = match a.node_bin {
        Some(b) => b,
        None => std::env::current_exe()?
            .parent()
            .context("locating rdmalog-node")?
            .join("rdmalog-node"),
    };
    anyhow::ensure!(
        bin.exists(),
        "{} does not exist: build it with cargo build -p node",
        bin.display()
    );
    let keep;
    let dir = match a
        .dir
        .or_else(|| std::env::var_os("RDMALOG_LAB_DISK").map(PathBuf::from))
    {
        Some(d) => {
            keep = None;
            d.join(format!("demo-{}", std::process::id()))
        }
        None => {
            let t = tempfile::tempdir()?;
            let p = t.path().to_path_buf();
            keep = Some(t);
            p
        }
    };
    let mut cfg = ClusterConfig::new(bin, &dir, 9000);
    cfg.durability = a.durability.clone();
    cfg.transport = a.transport.clone();
    let on = if a.transport == "rdma" {
        "on rxe i at 192.0.2.1i"
    } else {
        "over TCP at 192.0.2.1i"
    };
    println!(
        "demo: starting 3 rdmalog nodes (node i {on}, durability {}, data in {})",
        cfg.durability,
        dir.display()
    );
    let mut c = Cluster::start(cfg)?;
    let t = Instant::now();
    let first = c.leader(Duration::from_secs(60))?;
    println!(
        "demo: node {first} was elected leader in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let n = a.appends;
    println!(
        "demo: appending {n} entries of {}-{} bytes, 16 in flight; the leader gets kill -9 at {}",
        a.min_bytes,
        a.max_bytes,
        n / 2
    );
    let mut killed: Option<(u64, Instant)> = None;
    let mut restarted = false;
    let w = Workload::new(
        n,
        Sizes::Mixed {
            min: a.min_bytes,
            max: a.max_bytes,
        },
    );
    let step = (n / 20).max(1);
    let r = run_workload(&mut c, &w, |c, p| {
        if p.done % step == 0 || p.done == p.total {
            println!("demo: {}", progress_bar(p));
        }
        if p.done == n / 2 && killed.is_none() {
            println!("demo: kill -9 of the leader, node {}", p.leader);
            killed = Some((p.leader, Instant::now()));
            c.kill(p.leader);
        }
        if let Some((old, at)) = killed {
            if !restarted && p.leader != old && at.elapsed() > Duration::from_secs(2) {
                println!("demo: restarting node {old}; it rejoins as a follower");
                if let Err(e) = c.start_node(old) {
                    println!("demo: restarting node {old} failed: {e:#}");
                }
                restarted = true;
            }
        }
    })?;
    println!("demo: {r}");
    let (old, at) = killed.context("the workload ended before the leader was killed")?;
    if let Some((gap, from, to)) = r.failover_after(at, old) {
        println!(
            "demo: node {to} took over from node {from}; failover (last commit before the kill -> first commit after) {:.0} ms",
            gap.as_secs_f64() * 1000.0
        );
    }
    if !restarted {
        c.start_node(old)?;
        println!("demo: restarting node {old}; it rejoins as a follower");
    }
    let last = r.acks.iter().map(|a| a.index).max().unwrap_or(0);
    let s = c.wait_commit(old, last, Duration::from_secs(180))?;
    println!(
        "demo: node {old} is back as a {} of node {} and holds index {}",
        s.role, s.leader, s.commit
    );
    let leader = c.leader(Duration::from_secs(30))?;
    let ls = c.status(leader).context("the leader did not answer")?;
    println!(
        "demo: leader {leader} stats: {} fast appends (RDMA Write + descriptor), {} slow, {} fenced writes",
        ls.fast, ls.slow, ls.fenced
    );
    let v = c.verify(&r.acks)?;
    println!("demo: verified: {v}");
    let latency = commit_latency(&mut c, a.latency_appends)?;
    println!(
        "demo: {} appended, {} committed, 0 lost, {} duplicated, logs identical on {} hosts ({:?})",
        n,
        r.acks.len(),
        v.duplicates,
        v.nodes.len(),
        v.nodes
    );
    println!("demo: {latency}");
    drop(c);
    drop(keep);
    Ok(())
}

/// One 64 B append at a time through the leader's driver port: the commit latency as a client
/// on the same machine sees it, as ratios to the RDMA round trip perftest measured in this
/// boot (`ops/demo` runs it first), and the CPU the three node processes spent per entry.
fn commit_latency(c: &mut Cluster, n: u64) -> anyhow::Result<String> {
    let mut w = Workload::new(n, Sizes::Fixed(64));
    w.window = 1;
    let cpu0 = c.cpu_ns()?;
    let r = run_workload(c, &w, |_, _| {})?;
    let cpu = c.cpu_ns()?.saturating_sub(cpu0);
    let (p50, p99) = (
        r.latency_quantile(0.5).context("no latencies")?,
        r.latency_quantile(0.99).context("no latencies")?,
    );
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let perftest = lab::guest::out_dir()
        .ok()
        .and_then(|d| std::fs::read_to_string(d.join("perftest-summary.txt")).ok())
        .and_then(|l| lab::perftest::parse_summary_line(&l))
        .map(|kv| kv.into_iter().collect::<std::collections::BTreeMap<_, _>>());
    let ratios = match perftest
        .as_ref()
        .and_then(|m| Some((m.get("write_lat_t_typical_us")?, m.get("write_lat_p99_us")?)))
    {
        Some((lat, lat99)) => format!(
            " = {:.1} x and {:.1} x two ib_write_lat round trips of this boot (p50 {:.0} µs, p99 {:.0} µs)",
            us(p50) / (2.0 * lat),
            us(p99) / (2.0 * lat99),
            2.0 * lat,
            2.0 * lat99
        ),
        None => " (no perftest summary in this boot to compare with)".into(),
    };
    Ok(format!(
        "commit latency, 64 B, one in flight, {n} appends through the leader's driver port: p50 {:.0} µs, p99 {:.0} µs{ratios}; {:.0} appends/s; CPU per entry, 3 node processes: {:.0} µs",
        us(p50),
        us(p99),
        r.appends_per_sec(),
        cpu as f64 / 1e3 / r.acks.len().max(1) as f64
    ))
}
