//! `rdmalog-bench poll-modes`: P1 (commit p50 over two `ib_write_lat` round trips) by how the
//! replicas' drivers poll, in A/B pairs in one boot.
//!
//! The suite runs the lab's default, adaptive polling on every replica, because three busy
//! drivers, the client and Soft-RoCE's kernel threads share the guest's 2 vCPUs. Under
//! `Replicated` the followers' CPU is off the commit path (their NICs acknowledge the write),
//! so only the leader needs to spin: with `PollMode::Busy` its caller runs its own append to
//! completion, with no thread hand-off. This measures each way side by side, with the CPU it
//! costs (the process's, and the whole guest's including Soft-RoCE's softirq work).

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, bail};
use bench::lab::{LAB_POLL, LabCluster};
use bench::{MachineCpu, Summary};
use fabric::Transport;
use replica::{Durability, PollMode};
use serde::Serialize;

use super::{Common, next_port, ratio, write_lat};

/// The configurations compared: a name and each node's poll mode, node 1 (the leader) first.
fn configs() -> Vec<(&'static str, [PollMode; 3])> {
    vec![
        ("adaptive, all three (the suite's)", [LAB_POLL; 3]),
        ("busy, all three", [PollMode::Busy; 3]),
        (
            "busy leader, event followers",
            [PollMode::Busy, PollMode::Event, PollMode::Event],
        ),
        (
            "busy leader, adaptive followers",
            [PollMode::Busy, LAB_POLL, LAB_POLL],
        ),
    ]
}

/// One configuration's figures in one pair.
#[derive(Clone, Debug, Serialize)]
struct Run {
    config: String,
    pair: usize,
    size: usize,
    rdmalog: Summary,
    /// `ib_write_lat`'s typical and p99 one-way latency of the pair, µs.
    write_lat_typical_us: f64,
    write_lat_p99_us: f64,
    /// The process's CPU (three replicas and the client) per committed entry, µs.
    process_cpu_us: f64,
    /// The whole guest's CPU per committed entry (user, system, softirq), µs.
    guest_cpu_us: MachineCpu,
}

pub(super) fn run(
    out: &Path,
    pairs: usize,
    count: u64,
    dir: &Path,
    durability: Durability,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(out)?;
    std::fs::create_dir_all(dir)?;
    let configs = configs();
    let sizes = [64usize, 4096];
    let mut runs = Vec::new();
    let mut port = 18800u16;
    let mut port_base = 7500u16;
    for k in 0..pairs {
        eprintln!(
            "== pair {}/{pairs}: ib_write_lat first, on an idle guest",
            k + 1
        );
        let mut refs = Vec::new();
        for size in sizes {
            refs.push((size, write_lat(size as u64, count, next_port(&mut port))?));
        }
        // Rotate the order so that no configuration always runs first after the reference.
        for j in 0..configs.len() {
            let (name, polls) = configs[(j + k) % configs.len()];
            port_base += 10;
            let cluster_dir = dir.join(format!("polls-{k}-{j}"));
            let cluster = LabCluster::open_polled(
                Transport::Rdma,
                durability,
                &cluster_dir,
                port_base,
                0xbf00 + port_base as u64,
                polls,
            )?;
            lead_from_node_1(&cluster, polls)
                .with_context(|| format!("pair {} ({name})", k + 1))?;
            for (size, rtt) in &refs {
                let c = Common {
                    size: *size,
                    count,
                    warmup: count / 10,
                    in_flight: 1,
                    rate: None,
                };
                let cpu0 = MachineCpu::now().context("reading /proc/stat")?;
                let (s, extra) = super::Embedded::measure_on(
                    &cluster,
                    &c,
                    &format!("rdmalog commit {size} B ({name})"),
                )?;
                let guest = MachineCpu::now()
                    .context("reading /proc/stat")?
                    .since(&cpu0);
                let per = 1e6 / (c.count + c.warmup) as f64;
                runs.push(Run {
                    config: name.to_string(),
                    pair: k,
                    size: *size,
                    rdmalog: s,
                    write_lat_typical_us: rtt.t_typical_us,
                    write_lat_p99_us: rtt.p99_us,
                    process_cpu_us: extra.cpu_us_per_entry_all_replicas,
                    guest_cpu_us: MachineCpu {
                        user: guest.user * per,
                        system: guest.system * per,
                        softirq: guest.softirq * per,
                        idle: guest.idle * per,
                    },
                });
            }
            cluster.close();
            // Every cluster preallocates its segments: keep the lab's disk from filling up.
            std::fs::remove_dir_all(&cluster_dir)
                .with_context(|| format!("removing {}", cluster_dir.display()))?;
        }
    }
    let table = table(&configs, &sizes, &runs);
    println!("{table}");
    std::fs::write(out.join("table.md"), &table)?;
    std::fs::write(
        out.join("results.json"),
        serde_json::to_string_pretty(&runs)?,
    )?;
    Ok(())
}

/// Makes node 1 the leader when the nodes poll differently (the configuration names node 1's
/// mode as the leader's), handing leadership over if another node won the election.
fn lead_from_node_1(cluster: &LabCluster, polls: [PollMode; 3]) -> anyhow::Result<()> {
    if polls.iter().all(|p| *p == polls[0]) {
        return Ok(());
    }
    let k = cluster.leader(Duration::from_secs(30))?;
    if k == 0 {
        return Ok(());
    }
    eprintln!("node {} leads; handing leadership to node 1", k + 1);
    cluster.logs[k]
        .transfer_leader(1)
        .context("handing leadership to node 1")?;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while std::time::Instant::now() < deadline {
        if cluster.leader(Duration::from_secs(5))? == 0 {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!("node 1 did not take over leadership within 20 s")
}

/// The Markdown table: per configuration and size, the medians over the pairs (min-max).
fn table(configs: &[(&str, [PollMode; 3])], sizes: &[usize], runs: &[Run]) -> String {
    let mut t = String::new();
    let _ = writeln!(
        t,
        "| polling | size | P1: p50 / 2 x ib_write_lat | p99 / 2 x ib_write_lat p99 | process CPU per entry (µs) | guest CPU per entry: user + system + softirq (µs) |"
    );
    let _ = writeln!(t, "|---|---:|---:|---:|---:|---:|");
    for (name, _) in configs {
        for &size in sizes {
            let of: Vec<&Run> = runs
                .iter()
                .filter(|r| r.config == *name && r.size == size)
                .collect();
            let cell = |f: &dyn Fn(&Run) -> f64| {
                let r = ratio(of.iter().map(|x| f(x)).collect());
                format!("{:.2} ({:.2}-{:.2})", r.median, r.min, r.max)
            };
            let _ = writeln!(
                t,
                "| {name} | {size} B | {} | {} | {} | {} |",
                cell(&|r| r.rdmalog.p50_us / (2.0 * r.write_lat_typical_us)),
                cell(&|r| r.rdmalog.p99_us / (2.0 * r.write_lat_p99_us)),
                cell(&|r| r.process_cpu_us),
                cell(&|r| r.guest_cpu_us.user + r.guest_cpu_us.system + r.guest_cpu_us.softirq),
            );
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(config: &str, pair: usize, p50: f64, p99: f64, typical: f64, cpu: f64) -> Run {
        Run {
            config: config.into(),
            pair,
            size: 64,
            rdmalog: Summary {
                p50_us: p50,
                p99_us: p99,
                ..Summary::default()
            },
            write_lat_typical_us: typical,
            write_lat_p99_us: typical * 2.0,
            process_cpu_us: cpu,
            guest_cpu_us: MachineCpu {
                user: cpu,
                system: 1.0,
                softirq: 2.0,
                idle: 100.0,
            },
        }
    }

    #[test]
    fn the_table_shows_each_configurations_median_ratio_over_its_pairs() {
        let configs = configs();
        let busy = configs[1].0;
        let runs = vec![
            run(busy, 0, 300.0, 800.0, 100.0, 10.0),
            run(busy, 1, 500.0, 1200.0, 100.0, 30.0),
            run(busy, 2, 400.0, 400.0, 50.0, 20.0),
        ];
        let t = table(&configs, &[64], &runs);
        // p50 / (2 x typical): 1.5, 2.5, 4.0; p99 / (2 x p99): 2.0, 3.0, 2.0.
        let row = t
            .lines()
            .find(|l| l.starts_with(&format!("| {busy} | 64 B")))
            .unwrap();
        assert_eq!(
            row,
            format!(
                "| {busy} | 64 B | 2.50 (1.50-4.00) | 2.00 (2.00-3.00) | 20.00 (10.00-30.00) | 23.00 (13.00-33.00) |"
            )
        );
        // A configuration without runs says so rather than inventing a figure.
        assert!(t.contains(&format!("| {} | 64 B | NaN (NaN-NaN)", configs[0].0)));
    }
}
