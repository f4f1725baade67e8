//! `rdmalog-bench transports`: the motivating table (TCP against RoCE v2 for 4 KiB writes to
//! three replicas) measured with the same log, build and hosts in one lab boot.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use bench::lab::{LAB_POLL, LabCluster};
use bench::{MachineCpu, Summary};
use fabric::Transport;
use replica::Durability;
use serde::Serialize;

use super::{Common, ratio};

/// The p99 the highest sustained rate must keep.
const P99_LIMIT_US: f64 = 10_000.0;

/// Fractions of the closed-loop (16 in flight) throughput tried as open-loop rates, in order;
/// the scan stops at the first rate whose p99 exceeds the limit.
const RATE_STEPS: [f64; 6] = [0.125, 0.25, 0.5, 0.75, 1.0, 1.25];

/// Seconds of load per open-loop step (at least 60 appends, at most `--count`).
const RATE_STEP_SECONDS: f64 = 3.0;

/// One transport's figures in one mode and pair.
#[derive(Clone, Debug, Default, Serialize)]
struct Run {
    transport: String,
    durability: String,
    pair: usize,
    one: Summary,
    sixteen: Summary,
    /// `(rate tried, p99 µs, errors)`.
    rates: Vec<(f64, f64, u64)>,
    /// The highest rate tried whose p99 stayed under 10 ms with no errors (0: none).
    max_rate: f64,
    /// The whole guest's CPU per committed entry during the 16-in-flight run, µs.
    cpu_us: MachineCpu,
}

/// Which figure of a [`Run`] a table row shows.
type Figure = fn(&Run) -> f64;

const FIGURES: [(&str, Figure); 11] = [
    ("commit p50, 1 in flight (µs)", |r| r.one.p50_us),
    ("commit p99, 1 in flight (µs)", |r| r.one.p99_us),
    ("commit p99.9, 1 in flight (µs)", |r| r.one.p999_us),
    ("commit p50, 16 in flight (µs)", |r| r.sixteen.p50_us),
    ("commit p99, 16 in flight (µs)", |r| r.sixteen.p99_us),
    ("commit p99.9, 16 in flight (µs)", |r| r.sixteen.p999_us),
    ("max sustained rate, p99 < 10 ms (appends/s)", |r| {
        r.max_rate
    }),
    ("CPU per entry: user (µs)", |r| r.cpu_us.user),
    ("CPU per entry: system (µs)", |r| r.cpu_us.system),
    ("CPU per entry: softirq (µs)", |r| r.cpu_us.softirq),
    ("CPU per entry: all (µs)", |r| {
        r.cpu_us.user + r.cpu_us.system + r.cpu_us.softirq
    }),
];

fn measure(
    transport: Transport,
    d: Durability,
    dname: &str,
    pair: usize,
    count: u64,
    dir: &Path,
    port_base: u16,
) -> anyhow::Result<Run> {
    let cluster = LabCluster::open_on(
        transport,
        d,
        dir,
        port_base,
        0xbe00 + u64::from(port_base),
        LAB_POLL,
    )
    .with_context(|| format!("opening three replicas over {transport}"))?;
    let k = cluster.leader(Duration::from_secs(60))?;
    let log = &cluster.logs[k];
    let payload = vec![0x5au8; 4096];
    let append = |_: usize, _: u64| {
        log.append(&payload)
            .and_then(|h| h.wait(Duration::from_secs(30)))
            .is_ok()
    };
    let load = |in_flight: usize, rate: Option<f64>| Common {
        size: 4096,
        count,
        warmup: count / 10,
        in_flight,
        rate,
    };
    let name = |what: &str| format!("{transport} {dname} 4 KiB {what}");
    let one = load(1, None).run(&name("x1"), append);
    let cpu0 = MachineCpu::now().context("reading /proc/stat")?;
    let c16 = load(16, None);
    let sixteen = c16.run(&name("x16"), append);
    let cpu = MachineCpu::now()
        .context("reading /proc/stat")?
        .since(&cpu0);
    let entries = (c16.count + c16.warmup) as f64;
    let per = |s: f64| s * 1e6 / entries;
    let mut rates = Vec::new();
    let mut max_rate = 0.0;
    for f in RATE_STEPS {
        let rate = (sixteen.ops_per_s * f).max(1.0);
        let mut c = load(16, Some(rate));
        c.count = ((rate * RATE_STEP_SECONDS) as u64).clamp(60, count);
        c.warmup = c.count / 10;
        let s = c.run(&name(&format!("open {rate:.0}/s")), append);
        rates.push((rate, s.p99_us, s.errors));
        if s.p99_us >= P99_LIMIT_US || s.errors > 0 {
            break;
        }
        max_rate = rate;
    }
    cluster.close();
    std::fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
    Ok(Run {
        transport: transport.to_string(),
        durability: dname.into(),
        pair,
        one,
        sixteen,
        rates,
        max_rate,
        cpu_us: MachineCpu {
            user: per(cpu.user),
            system: per(cpu.system),
            softirq: per(cpu.softirq),
            idle: per(cpu.idle),
        },
    })
}

/// Runs every pair and writes `results.json` and `table.md` to `out`.
pub fn run(out: &Path, pairs: usize, count: u64, dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(out)?;
    std::fs::create_dir_all(dir)?;
    let mut runs = Vec::new();
    let mut port_base = 7600u16;
    for (dname, d) in [
        ("fsync", Durability::Fsync),
        ("memory", Durability::Memory),
        ("replicated", Durability::Replicated),
    ] {
        for pair in 0..pairs {
            let order = if pair % 2 == 0 {
                [Transport::Rdma, Transport::Tcp]
            } else {
                [Transport::Tcp, Transport::Rdma]
            };
            for t in order {
                port_base += 10;
                eprintln!("== {dname}, pair {}/{pairs}: {t}", pair + 1);
                let run = measure(
                    t,
                    d,
                    dname,
                    pair,
                    count,
                    &dir.join(format!("{dname}-{t}-{pair}")),
                    port_base,
                )?;
                runs.push(run);
            }
        }
    }
    let table = render(&runs);
    std::fs::write(out.join("table.md"), &table)?;
    std::fs::write(
        out.join("results.json"),
        serde_json::to_string_pretty(&runs)?,
    )?;
    println!("{table}");
    Ok(())
}

fn median(v: Vec<f64>) -> f64 {
    ratio(v).median
}

/// Medians over the pairs, RDMA beside TCP and their ratio; the ratio's spread over the pairs
/// (each pair's RDMA figure over the same pair's TCP figure) in brackets.
fn render(runs: &[Run]) -> String {
    let mut t = String::new();
    let modes: Vec<&str> = {
        let mut m: Vec<&str> = runs.iter().map(|r| r.durability.as_str()).collect();
        m.dedup();
        m
    };
    for mode in modes {
        let _ = writeln!(
            t,
            "\n**{mode}** (4 KiB, 3 replicas; medians of {} pairs; RDMA/TCP per pair: median [min, max])\n",
            runs.iter()
                .filter(|r| r.durability == mode && r.transport == "rdma")
                .count()
        );
        let _ = writeln!(
            t,
            "| figure | RDMA | TCP | RDMA/TCP |\n|---|---:|---:|---:|"
        );
        for (label, f) in FIGURES {
            let of = |tr: &str| -> BTreeMap<usize, f64> {
                runs.iter()
                    .filter(|r| r.durability == mode && r.transport == tr)
                    .map(|r| (r.pair, f(r)))
                    .collect()
            };
            let (rdma, tcp) = (of("rdma"), of("tcp"));
            let per_pair: Vec<f64> = rdma
                .iter()
                .filter_map(|(p, a)| tcp.get(p).map(|b| a / b))
                .collect();
            let r = ratio(per_pair);
            // A rate of 0 means no rate tried kept the p99 under the limit.
            let fig = |v: f64| {
                if v == 0.0 && label.starts_with("max sustained") {
                    "none".to_string()
                } else {
                    format!("{v:.0}")
                }
            };
            let ratio_text = if r.median.is_finite() {
                format!("{:.2} [{:.2}, {:.2}]", r.median, r.min, r.max)
            } else {
                "n/a".into()
            };
            let _ = writeln!(
                t,
                "| {label} | {} | {} | {ratio_text} |",
                fig(median(rdma.values().copied().collect())),
                fig(median(tcp.values().copied().collect())),
            );
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(transport: &str, pair: usize, p50: f64) -> Run {
        Run {
            transport: transport.into(),
            durability: "memory".into(),
            pair,
            one: Summary {
                p50_us: p50,
                ..Summary::default()
            },
            ..Run::default()
        }
    }

    #[test]
    fn the_table_pairs_each_rdma_run_with_the_same_pairs_tcp_run() {
        let runs = [
            run("rdma", 0, 100.0),
            run("tcp", 0, 400.0),
            run("tcp", 1, 300.0),
            run("rdma", 1, 150.0),
        ];
        let t = render(&runs);
        assert!(t.contains("**memory**"), "{t}");
        assert!(
            t.contains("| commit p50, 1 in flight (µs) | 125 | 350 | 0.38 [0.25, 0.50] |"),
            "{t}"
        );
    }
}
