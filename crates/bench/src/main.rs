//! `rdmalog-bench`: the lab benchmark of issue 9, run inside the 3-host Soft-RoCE lab by
//! `ops/bench` (one boot for everything).
//!
//! `rdmalog-bench suite --out DIR` measures, in order: the perftest baseline (`ib_write_lat`,
//! `ib_send_lat`, `ib_write_bw` between rxe1 and rxe2); rdmalog's 3-replica commit latency
//! through the embedded API (64 B and 4 KiB, `Replicated` with the lab's adaptive polling and
//! with busy drivers and callers that drive their own appends, `Memory` and `Fsync`), each
//! interleaved with `ib_write_lat` of the same size as A/B pairs (and, for `Fsync`, beside an
//! fdatasync of the same disk); replicated throughput with 4 KiB entries
//! interleaved with `ib_write_bw`; throughput against payload size; and etcd 3.4 (Debian's
//! `etcd-server`, three members on the lab's addresses) with puts of the same sizes through
//! its v3 JSON gateway, in A/B pairs with three `rdmalog-server` processes (fsync durability)
//! driven through their TCP client protocol, with each server's CPU per entry from its
//! `/status`. It writes `results.json`, `table.md` and two SVG charts to `DIR`.
//! The ratios are medians of per-pair ratios with their min and max: absolute times under TCG
//! mean nothing, ratios measured in the same boot do.
//!
//! `rdmalog-bench transports --out DIR` is issue 15's table: the same three replicas over RDMA
//! and over TCP between the same lab hosts, in A/B pairs alternating which goes first, 4 KiB
//! entries under `Fsync`, `Memory` and `Replicated`: commit p50/p99/p99.9 at 1 and 16 in flight, the highest
//! open-loop rate whose p99 stays under 10 ms, and the whole guest's CPU per committed entry
//! (user, system, softirq from `/proc/stat`).
//!
//! `rdmalog-bench host-tcp --out DIR` runs on a host without the lab: three `rdmalog-server`
//! processes replicating over TCP on loopback against three etcd 3.4 members on the same host.
//!
//! `rdmalog-bench embedded ...` and `rdmalog-bench etcd ...` run one measurement each.

#![deny(unsafe_code)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bench::plot::{self, Series};
use bench::{Load, Summary};
use clap::{Parser, Subcommand};
use lab::perftest::{self, Tool};
use replica::Durability;

#[derive(Parser, Debug)]
#[command(
    name = "rdmalog-bench",
    about = "rdmalog's lab benchmarks beside perftest and etcd"
)]
struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(clap::Args, Debug, Clone)]
struct Common {
    /// Payload bytes per operation.
    #[arg(long, default_value_t = 64)]
    size: usize,
    /// Operations measured (after the warm-up).
    #[arg(long, default_value_t = 500)]
    count: u64,
    /// Operations run first and not measured.
    #[arg(long, default_value_t = 50)]
    warmup: u64,
    /// Operations in flight (closed loop), or worker threads (open loop).
    #[arg(long, default_value_t = 1)]
    in_flight: usize,
    /// Open loop at this many operations per second (coordinated-omission corrected).
    #[arg(long)]
    rate: Option<f64>,
}

impl Common {
    /// Runs `count + warmup` operations of `op` under this load, with a progress line on
    /// stderr.
    fn run(&self, name: &str, op: impl Fn(usize, u64) -> bool + Sync) -> Summary {
        let total = self.count + self.warmup;
        let t0 = Instant::now();
        let s = bench::run(
            name,
            self.size as u64,
            total,
            self.warmup,
            self.load(),
            op,
            |d| eprint!("{}", bench::progress_line(name, d, total, t0)),
        );
        eprintln!();
        s
    }

    fn load(&self) -> Load {
        match self.rate {
            Some(rate) => Load::Open {
                rate,
                workers: self.in_flight.max(1),
            },
            None => Load::Closed {
                in_flight: self.in_flight,
            },
        }
    }
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Commit latency of three replicas (embedded API) on rxe1..3.
    Embedded {
        #[command(flatten)]
        c: Common,
        /// fsync, memory or replicated.
        #[arg(long, default_value = "memory")]
        durability: String,
        /// Where the replicas keep their data.
        #[arg(long, default_value = "/tmp/rdmalog-bench")]
        dir: PathBuf,
        /// How the drivers wait: busy, event, adaptive (spin 50 µs) or adaptive:<µs>.
        #[arg(long, default_value = "adaptive")]
        poll: String,
        /// Also break each commit down into its steps (one append in flight): the median
        /// time from the append to each step on the leader and the first follower.
        #[arg(long)]
        steps: bool,
    },
    /// Put latency of an etcd cluster through its v3 JSON gateway.
    Etcd {
        #[command(flatten)]
        c: Common,
        /// A client URL host:port.
        #[arg(long, default_value = "192.0.2.11:2379")]
        endpoint: SocketAddr,
    },
    /// RDMA against TCP, same hosts, same build, one boot (issue 15's table).
    Transports {
        /// Where results go.
        #[arg(long)]
        out: PathBuf,
        /// A/B pairs (each runs both transports; which goes first alternates).
        #[arg(long, default_value_t = 3)]
        pairs: usize,
        /// Operations per measurement.
        #[arg(long, default_value_t = 300)]
        count: u64,
        /// Data directories (the lab's ext4 disk, so fsync means something).
        #[arg(long, default_value = "/run/lab/disk/bench")]
        dir: PathBuf,
    },
    /// Commit latency by how the replicas poll (adaptive, busy, busy on the leader only)
    /// against `ib_write_lat`, in A/B pairs, one boot.
    PollModes {
        /// Where results go.
        #[arg(long)]
        out: PathBuf,
        /// A/B pairs (each runs every configuration; the order rotates).
        #[arg(long, default_value_t = 3)]
        pairs: usize,
        /// Appends per measurement (perftest iterations likewise).
        #[arg(long, default_value_t = 300)]
        count: u64,
        /// fsync, memory or replicated.
        #[arg(long, default_value = "replicated")]
        durability: String,
        /// Where the replicas keep their data.
        #[arg(long, default_value = "/run/lab/disk/bench")]
        dir: PathBuf,
    },
    /// On this host, no lab: three `rdmalog-server` processes replicating over TCP on
    /// loopback against three etcd 3.4 members on the same host, in A/B pairs.
    HostTcp {
        /// Where results go.
        #[arg(long)]
        out: PathBuf,
        /// A/B pairs per comparison.
        #[arg(long, default_value_t = 5)]
        pairs: usize,
        /// Operations per measurement.
        #[arg(long, default_value_t = 500)]
        count: u64,
        /// Data directories (a real disk, so fsync means something).
        #[arg(long, default_value = "/var/tmp/rdmalog-bench-host")]
        dir: PathBuf,
    },
    /// The whole suite, one boot.
    Suite {
        /// Where results go.
        #[arg(long)]
        out: PathBuf,
        /// A/B pairs per comparison.
        #[arg(long, default_value_t = 5)]
        pairs: usize,
        /// Operations per measurement (perftest iterations likewise).
        #[arg(long, default_value_t = 500)]
        count: u64,
        /// Data directories (the lab's ext4 disk, so fsync means something).
        #[arg(long, default_value = "/run/lab/disk/bench")]
        dir: PathBuf,
    },
}

fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    match a.cmd {
        Cmd::Embedded {
            c,
            durability,
            dir,
            poll,
            steps,
        } => {
            let d = durability_of(&durability)?;
            let recorder = if steps {
                Some(bench::steps::Recorder::install()?)
            } else {
                None
            };
            let cluster = Embedded::open(d, &dir, 7000, 0xbe01, bench::lab::parse_poll(&poll)?)?;
            let name = format!("rdmalog {durability} {} B", c.size);
            match recorder {
                Some(r) => println!("{}", cluster.steps(&c, &r, &name)?),
                None => {
                    let (s, extra) = cluster.measure(&c, &name)?;
                    println!("{}", serde_json::to_string_pretty(&(s, extra))?);
                }
            }
        }
        Cmd::Etcd { c, endpoint } => {
            let s = measure_etcd(endpoint, &c, &format!("etcd put {} B", c.size))?;
            println!("{}", serde_json::to_string_pretty(&s)?);
        }
        Cmd::Suite {
            out,
            pairs,
            count,
            dir,
        } => suite(&out, pairs, count, &dir)?,
        Cmd::Transports {
            out,
            pairs,
            count,
            dir,
        } => transports::run(&out, pairs, count, &dir)?,
        Cmd::PollModes {
            out,
            pairs,
            count,
            durability,
            dir,
        } => polls::run(&out, pairs, count, &dir, durability_of(&durability)?)?,
        Cmd::HostTcp {
            out,
            pairs,
            count,
            dir,
        } => host_tcp(&out, pairs, count, &dir)?,
    }
    Ok(())
}

fn durability_of(s: &str) -> anyhow::Result<Durability> {
    s.parse()
        .map_err(|e: String| anyhow::anyhow!("--durability: {e}"))
}

/// Three replicas in this process, one per rxe host.
struct Embedded(bench::lab::LabCluster);

mod polls;
mod transports;

/// What an embedded measurement adds to the latency summary.
#[derive(Debug, Clone, Default, serde::Serialize)]
struct Extra {
    /// Bytes the leader RDMA-wrote into followers' rings per second.
    leader_rdma_bytes_per_s: f64,
    /// Process CPU (all three replicas) per committed entry, µs.
    cpu_us_per_entry_all_replicas: f64,
}

impl Embedded {
    fn open(
        d: Durability,
        dir: &Path,
        port_base: u16,
        cluster: u64,
        poll: replica::PollMode,
    ) -> anyhow::Result<Embedded> {
        Ok(Embedded(bench::lab::LabCluster::open(
            d, dir, port_base, cluster, poll,
        )?))
    }

    fn leader(&self, within: Duration) -> anyhow::Result<usize> {
        self.0.leader(within)
    }

    fn measure(&self, c: &Common, name: &str) -> anyhow::Result<(Summary, Extra)> {
        Self::measure_on(&self.0, c, name)
    }

    /// Commit latency through `cluster`'s leader under `c`'s load, with the leader's RDMA
    /// bytes and the process's CPU per entry.
    fn measure_on(
        cluster: &bench::lab::LabCluster,
        c: &Common,
        name: &str,
    ) -> anyhow::Result<(Summary, Extra)> {
        let k = cluster.leader(Duration::from_secs(30))?;
        let log = &cluster.logs[k];
        let payload = vec![0x5au8; c.size];
        let before = log.status().stats.fast_bytes;
        let cpu0 = bench::process_cpu_seconds().unwrap_or(0.0);
        let t0 = Instant::now();
        let total = c.count + c.warmup;
        let s = c.run(name, |_, _| {
            log.append(&payload)
                .and_then(|h| h.wait(Duration::from_secs(30)))
                .is_ok()
        });
        let secs = t0.elapsed().as_secs_f64();
        let cpu = bench::process_cpu_seconds().unwrap_or(0.0) - cpu0;
        let extra = Extra {
            leader_rdma_bytes_per_s: (log.status().stats.fast_bytes - before) as f64 / secs,
            cpu_us_per_entry_all_replicas: cpu * 1e6 / total as f64,
        };
        Ok((s, extra))
    }

    /// One append at a time, each broken down into the steps the replicas mark; returns the
    /// breakdown as a Markdown table.
    fn steps(
        &self,
        c: &Common,
        recorder: &bench::steps::Recorder,
        name: &str,
    ) -> anyhow::Result<String> {
        let k = self.leader(Duration::from_secs(30))?;
        let log = &self.0.logs[k];
        let leader = log.status().id;
        let payload = vec![0x5au8; c.size];
        let mut samples = Vec::new();
        for i in 0..c.warmup + c.count {
            if i == c.warmup {
                recorder.take();
            }
            let start = Instant::now();
            let index = log
                .append(&payload)
                .and_then(|h| h.wait(Duration::from_secs(30)))
                .with_context(|| format!("append {i} of the step breakdown"))?;
            let end = Instant::now();
            if i >= c.warmup {
                samples.push(bench::steps::Sample { index, start, end });
            }
        }
        // Steps that follow the commit (a follower's persist under Replicated) come late.
        std::thread::sleep(Duration::from_millis(200));
        let rows = bench::steps::breakdown(&recorder.take(), &samples, leader);
        Ok(format!(
            "{name}: each step's median time from the append ({} appends, one in flight)\n\n{}",
            samples.len(),
            bench::steps::render(&rows)
        ))
    }

    fn close(self) {
        self.0.close();
    }
}

/// A base64 encoding (the etcd gateway's JSON carries keys and values in base64).
fn b64(data: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for c in data.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for k in 0..4 {
            if k <= c.len() {
                out.push(T[(n >> (18 - 6 * k) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// One HTTP/1.1 keep-alive connection to an etcd member.
struct Http {
    r: BufReader<TcpStream>,
    host: String,
}

impl Http {
    fn connect(addr: SocketAddr) -> anyhow::Result<Http> {
        let s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(Duration::from_secs(30)))?;
        Ok(Http {
            r: BufReader::new(s),
            host: addr.to_string(),
        })
    }

    fn post(&mut self, path: &str, body: &str) -> anyhow::Result<String> {
        let s = self.r.get_mut();
        write!(
            s,
            "POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            self.host,
            body.len()
        )?;
        let mut status = String::new();
        self.r.read_line(&mut status)?;
        let mut len = 0usize;
        loop {
            let mut h = String::new();
            self.r.read_line(&mut h)?;
            if h == "\r\n" || h.is_empty() {
                break;
            }
            if let Some(v) = h.to_ascii_lowercase().strip_prefix("content-length:") {
                len = v.trim().parse()?;
            }
        }
        let mut b = vec![0u8; len];
        self.r.read_exact(&mut b)?;
        let text = String::from_utf8_lossy(&b).into_owned();
        if !status.contains(" 200 ") {
            bail!("etcd answered {}: {text}", status.trim());
        }
        Ok(text)
    }
}

fn measure_etcd(endpoint: SocketAddr, c: &Common, name: &str) -> anyhow::Result<Summary> {
    let value = b64(&vec![0x5au8; c.size]);
    let conns: Vec<std::sync::Mutex<Http>> = (0..c.in_flight.max(1))
        .map(|_| Http::connect(endpoint).map(std::sync::Mutex::new))
        .collect::<anyhow::Result<_>>()?;
    let s = c.run(name, |w, i| {
        let body = format!(
            "{{\"key\":\"{}\",\"value\":\"{value}\"}}",
            b64(format!("k{i}").as_bytes())
        );
        conns[w]
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .post("/v3/kv/put", &body)
            .is_ok()
    });
    if s.count == 0 {
        bail!("every etcd put failed ({} errors)", s.errors);
    }
    Ok(s)
}

/// Where the etcd and `rdmalog-server` clusters run: their addresses and the servers'
/// replication transport.
#[derive(Clone, Copy, Debug)]
struct Place {
    /// Host `i`'s address.
    ip: fn(u64) -> String,
    /// The servers' replication transport.
    transport: &'static str,
}

/// The lab's hosts, servers over RDMA.
const LAB: Place = Place {
    ip: |i| format!("192.0.2.1{i}"),
    transport: "rdma",
};

/// This host's loopback, no lab, servers over TCP.
const HOST_TCP: Place = Place {
    ip: |i| format!("127.0.1.{i}"),
    transport: "tcp",
};

impl Place {
    fn addr(&self, i: u64, port: u64) -> String {
        format!("{}:{port}", (self.ip)(i))
    }

    fn socket(&self, i: u64, port: u64) -> SocketAddr {
        self.addr(i, port).parse().expect("address")
    }
}

/// Three etcd members at `at`, data on `dir`.
fn start_etcd(dir: &Path, at: Place) -> anyhow::Result<Vec<Child>> {
    let which = Command::new("etcd").arg("--version").output();
    let Ok(v) = which else {
        bail!("etcd is not installed: ops/bench installs Debian's etcd-server");
    };
    eprintln!(
        "{}",
        String::from_utf8_lossy(&v.stdout)
            .lines()
            .next()
            .unwrap_or("etcd")
    );
    let cluster: Vec<String> = (1..=3)
        .map(|i| format!("e{i}=http://{}", at.addr(i, 2380)))
        .collect();
    let mut kids = Vec::new();
    for i in 1..=3 {
        let d = dir.join(format!("etcd{i}"));
        std::fs::create_dir_all(&d)?;
        let log = std::fs::File::create(dir.join(format!("etcd{i}.log")))?;
        kids.push(
            Command::new("etcd")
                .args(["--name", &format!("e{i}")])
                .arg("--data-dir")
                .arg(&d)
                .args([
                    "--listen-client-urls",
                    &format!("http://{}", at.addr(i, 2379)),
                    "--advertise-client-urls",
                    &format!("http://{}", at.addr(i, 2379)),
                    "--listen-peer-urls",
                    &format!("http://{}", at.addr(i, 2380)),
                    "--initial-advertise-peer-urls",
                    &format!("http://{}", at.addr(i, 2380)),
                    "--initial-cluster",
                    &cluster.join(","),
                    "--initial-cluster-state",
                    "new",
                ])
                .stdout(log.try_clone()?)
                .stderr(log)
                .stdin(Stdio::null())
                .spawn()
                .context("starting etcd")?,
        );
    }
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let ok = Http::connect(at.socket(1, 2379))
            .and_then(|mut h| h.post("/v3/kv/put", "{\"key\":\"cmVhZHk=\",\"value\":\"MQ==\"}"))
            .is_ok();
        if ok {
            return Ok(kids);
        }
        if Instant::now() > deadline {
            for mut k in kids {
                let _ = k.kill();
            }
            bail!(
                "etcd did not accept a put within 90 s (logs in {})",
                dir.display()
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Three `rdmalog-server` processes (fsync durability, like etcd), one per host of a
/// [`Place`], from the binary beside this one.
struct ServerCluster {
    kids: Vec<Child>,
    at: Place,
}

const SERVER_CLUSTER: u64 = 0x5e4;

fn server_client_addr(at: Place, i: u64) -> String {
    at.addr(i, 9400 + i)
}

fn server_metrics_addr(i: u64) -> SocketAddr {
    format!("127.0.0.1:{}", 9500 + i).parse().expect("address")
}

impl ServerCluster {
    fn start(dir: &Path, at: Place) -> anyhow::Result<ServerCluster> {
        let exe = std::env::current_exe()?;
        let bin = exe.with_file_name("rdmalog-server");
        if !bin.is_file() {
            bail!(
                "{} is missing: build the server in the same profile (ops/bench does)",
                bin.display()
            );
        }
        std::fs::create_dir_all(dir)?;
        let mut kids = Vec::new();
        for i in 1..=3u64 {
            let mut peers = String::new();
            for p in (1..=3u64).filter(|&p| p != i) {
                peers += &format!(
                    "[[peers]]\nid = {p}\nrdma = \"{}\"\nclient = \"{}\"\n\n",
                    at.addr(p, 9300 + p),
                    server_client_addr(at, p)
                );
            }
            let cfg = dir.join(format!("server{i}.toml"));
            std::fs::write(
                &cfg,
                format!(
                    "node_id = {i}\ncluster_id = {SERVER_CLUSTER}\ntransport = \"{}\"\ndata_dir = \"{}\"\ndurability = \"fsync\"\n\n[rdma]\nlisten = \"{}\"\n\n{peers}[client]\nlisten = \"{}\"\nplaintext = true\n\n[auth]\nanonymous_role = \"read-write\"\n\n[metrics]\nlisten = \"{}\"\n",
                    at.transport,
                    dir.join(format!("server{i}")).display(),
                    at.addr(i, 9300 + i),
                    server_client_addr(at, i),
                    server_metrics_addr(i),
                ),
            )?;
            let log = std::fs::File::create(dir.join(format!("server{i}.log")))?;
            kids.push(
                Command::new(&bin)
                    .arg("--config")
                    .arg(&cfg)
                    .stdout(log.try_clone()?)
                    .stderr(log)
                    .stdin(Stdio::null())
                    .spawn()
                    .context("starting rdmalog-server")?,
            );
        }
        let c = ServerCluster { kids, at };
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let ok = client::Client::connect(c.client_config())
                .and_then(|mut k| k.append(&[b"ready".as_slice()]))
                .is_ok();
            if ok {
                return Ok(c);
            }
            if Instant::now() > deadline {
                bail!(
                    "the rdmalog-server cluster took no append within 90 s (logs in {})",
                    dir.display()
                );
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    fn client_config(&self) -> client::ClientConfig {
        let at = self.at;
        client::ClientConfig::new(
            (1..=3).map(|i| server_client_addr(at, i)).collect(),
            SERVER_CLUSTER,
        )
    }

    /// Each server's role and CPU seconds, from its `/status`.
    fn cpu(&self) -> Vec<(String, f64)> {
        (1..=3)
            .map(|i| {
                let v: serde_json::Value = get(server_metrics_addr(i), "/status")
                    .ok()
                    .and_then(|b| serde_json::from_str(&b).ok())
                    .unwrap_or_default();
                (
                    v["role"].as_str().unwrap_or("unknown").to_string(),
                    v["cpu_seconds"].as_f64().unwrap_or(f64::NAN),
                )
            })
            .collect()
    }

    fn measure(&self, c: &Common, name: &str) -> anyhow::Result<(Summary, Vec<(String, f64)>)> {
        let clients: Vec<std::sync::Mutex<client::Client>> = (0..c.in_flight.max(1))
            .map(|_| client::Client::connect(self.client_config()).map(std::sync::Mutex::new))
            .collect::<Result<_, _>>()?;
        let payload = vec![0x5au8; c.size];
        let before = self.cpu();
        let total = c.count + c.warmup;
        let s = c.run(name, |w, _| {
            clients[w]
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .append(&[payload.as_slice()])
                .is_ok()
        });
        let after = self.cpu();
        let per_entry = before
            .iter()
            .zip(&after)
            .map(|((_, a), (role, b))| (role.clone(), (b - a) * 1e6 / total as f64))
            .collect();
        Ok((s, per_entry))
    }
}

impl Drop for ServerCluster {
    fn drop(&mut self) {
        for k in &mut self.kids {
            let _ = k.kill();
            let _ = k.wait();
        }
    }
}

/// Sends `sig` (e.g. "STOP", "CONT") to every child.
fn signal(kids: &[Child], sig: &str) {
    for k in kids {
        let _ = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(k.id().to_string())
            .status();
    }
}

/// One HTTP/1.0 GET, the body back.
fn get(addr: SocketAddr, path: &str) -> anyhow::Result<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(s, "GET {path} HTTP/1.0\r\n\r\n")?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out.split("\r\n\r\n").nth(1).unwrap_or("").to_string())
}

/// Median, min and max of per-pair ratios.
#[derive(Debug, Clone, Default, serde::Serialize)]
struct Ratio {
    median: f64,
    min: f64,
    max: f64,
    pairs: Vec<f64>,
}

fn ratio(pairs: Vec<f64>) -> Ratio {
    let mut v: Vec<f64> = pairs.iter().copied().filter(|x| x.is_finite()).collect();
    v.sort_by(f64::total_cmp);
    let median = match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    };
    Ratio {
        median,
        min: v.first().copied().unwrap_or(f64::NAN),
        max: v.last().copied().unwrap_or(f64::NAN),
        pairs,
    }
}

fn write_lat(size: u64, count: u64, port: u16) -> anyhow::Result<perftest::Latency> {
    let out = perftest::run_pair(Tool::WriteLat, 1, 2, size, count, port)?;
    Ok(perftest::parse_latency(&out)?)
}

fn cdf_of_perftest(l: &perftest::Latency) -> Vec<(f64, f64)> {
    vec![
        (l.t_min_us, 0.0),
        (l.t_typical_us, 0.5),
        (l.p99_us, 0.99),
        (l.p999_us, 0.999),
        (l.t_max_us, 1.0),
    ]
}

#[derive(Debug, Default, serde::Serialize)]
struct Results {
    date: String,
    baseline: Vec<String>,
    measurements: Vec<serde_json::Value>,
    ratios: BTreeMap<String, Ratio>,
    cpu_us_per_entry_all_replicas: BTreeMap<String, f64>,
    cpu_us_per_entry_servers: BTreeMap<String, f64>,
}

fn suite(out: &Path, pairs: usize, count: u64, dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(out)?;
    std::fs::create_dir_all(dir)?;
    let mut r = Results {
        date: String::from_utf8_lossy(&Command::new("date").arg("-u").output()?.stdout)
            .trim()
            .to_string(),
        ..Results::default()
    };
    // perftest's baseline uses 18515..=18517; the pairs use ports from 18600 on.
    let mut port = 18600u16;
    eprintln!("== perftest baseline (rxe1 <-> rxe2)");
    let (b, _) = perftest::run_baseline(1, 2, 64, 4096, count)?;
    r.baseline.push(b.line());
    println!("{}", b.line());

    let mut cdf = Vec::new();
    embedded_pairs(&mut r, &mut cdf, out, pairs, count, dir, &mut port)?;
    etcd_pairs(&mut r, &mut cdf, pairs, count, dir, LAB)?;
    report(
        out,
        &r,
        &cdf,
        "64 B commit latency CDF (Soft-RoCE under TCG: compare shapes and ratios, not µs)",
    )
}

/// etcd against `rdmalog-server` over TCP on this host: what the log costs without RDMA.
fn host_tcp(out: &Path, pairs: usize, count: u64, dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(out)?;
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir)?;
    let mut r = Results {
        date: String::from_utf8_lossy(&Command::new("date").arg("-u").output()?.stdout)
            .trim()
            .to_string(),
        ..Results::default()
    };
    let mut cdf = Vec::new();
    etcd_pairs(&mut r, &mut cdf, pairs, count, dir, HOST_TCP)?;
    let _ = std::fs::remove_dir_all(dir);
    report(
        out,
        &r,
        &cdf,
        "64 B latency CDF on one host: rdmalog-server over TCP and etcd 3.4",
    )
}

/// The next perftest port (each run takes its own).
fn next_port(port: &mut u16) -> u16 {
    *port += 1;
    *port
}

/// Commit latency and throughput of three replicas (embedded API) in each durability mode,
/// in A/B pairs with perftest: ratios P1, P1b and P2, and for `Fsync` P1f (against two
/// round trips plus one fdatasync of the same disk).
fn embedded_pairs(
    r: &mut Results,
    cdf: &mut Vec<Series>,
    out: &Path,
    pairs: usize,
    count: u64,
    dir: &Path,
    port: &mut u16,
) -> anyhow::Result<()> {
    // Each pair runs its reference first with nothing else in the guest, then opens a fresh
    // three-replica cluster for the rdmalog side and closes it afterwards: an idle cluster's
    // pollers and ticks would otherwise slow the reference and flatter the ratio.
    let mut port_base = 7100u16;
    // The lab's adaptive polling in every mode, and the run-to-completion mode issue 14 set P1
    // for (busy drivers, the caller driving its own append) with the NIC-acknowledged commit.
    // Busy threads share the guest's 2 vCPUs with Soft-RoCE: `ops/bench polls` compares the
    // ways of polling on their own.
    for (dname, d, poll) in [
        ("replicated", Durability::Replicated, bench::lab::LAB_POLL),
        (
            "replicated, busy",
            Durability::Replicated,
            replica::PollMode::Busy,
        ),
        ("memory", Durability::Memory, bench::lab::LAB_POLL),
        ("fsync", Durability::Fsync, bench::lab::LAB_POLL),
    ] {
        let reference_mode = poll == bench::lab::LAB_POLL;
        let sizes = [64usize, 4096];
        let mut p1: BTreeMap<usize, (Vec<f64>, Vec<f64>)> = BTreeMap::new();
        let mut p1f: BTreeMap<usize, Vec<f64>> = BTreeMap::new();
        let mut p2 = Vec::new();
        for k in 0..pairs {
            eprintln!(
                "== pair {}/{pairs} ({dname}): references first, on an idle guest",
                k + 1
            );
            let mut refs = Vec::new();
            for size in sizes {
                let rtt = write_lat(size as u64, count, next_port(port))?;
                // Fsync commits wait for a majority's fdatasync: its reference is the same
                // disk's, measured here on the same idle guest.
                let sync = if d == Durability::Fsync {
                    Some(
                        bench::fdatasync_latency(dir, size, count, count / 10)
                            .context("the fdatasync reference")?,
                    )
                } else {
                    None
                };
                refs.push((size, rtt, sync));
            }
            // The throughput pair runs in the mode with nothing but the NICs on the commit path.
            let bw = if d == Durability::Replicated && reference_mode {
                Some(perftest::parse_bandwidth(&perftest::run_pair(
                    Tool::WriteBw,
                    1,
                    2,
                    4096,
                    count,
                    next_port(port),
                )?)?)
            } else {
                None
            };
            port_base += 10;
            let pair_dir = dir.join(format!("{}-{k}", dname.replace(", ", "-")));
            let cluster = Embedded::open(d, &pair_dir, port_base, 0xbe00 + port_base as u64, poll)?;
            for (size, a, sync) in refs {
                let name = format!("rdmalog commit {dname} {size} B");
                let c = Common {
                    size,
                    count,
                    warmup: count / 10,
                    in_flight: 1,
                    rate: None,
                };
                let (s, extra) = cluster.measure(&c, &name)?;
                let e = p1.entry(size).or_default();
                e.0.push(s.p50_us / (2.0 * a.t_typical_us));
                e.1.push(s.p99_us / (2.0 * a.p99_us));
                if let Some(f) = &sync {
                    p1f.entry(size)
                        .or_default()
                        .push(s.p50_us / (2.0 * a.t_typical_us + f.p50_us));
                }
                r.cpu_us_per_entry_all_replicas
                    .insert(name.clone(), extra.cpu_us_per_entry_all_replicas);
                if k == 0 && size == 64 {
                    cdf.push(Series {
                        label: format!("rdmalog commit ({dname})"),
                        points: s.cdf.clone(),
                    });
                    if d == Durability::Replicated && reference_mode {
                        cdf.push(Series {
                            label: "2 x ib_write_lat (one RDMA round trip each way)".into(),
                            points: cdf_of_perftest(&a)
                                .into_iter()
                                .map(|(us, f)| (2.0 * us, f))
                                .collect(),
                        });
                    }
                }
                r.measurements.push(serde_json::json!({"pair": k, "perftest": format!("{a:?}"), "fdatasync": sync, "rdmalog": s, "extra": extra}));
            }
            if let Some(bw) = bw {
                let c = Common {
                    size: 4096,
                    count,
                    warmup: count / 10,
                    in_flight: 16,
                    rate: None,
                };
                let (s, extra) =
                    cluster.measure(&c, &format!("rdmalog throughput {dname} 4 KiB x16"))?;
                p2.push(extra.leader_rdma_bytes_per_s / 2.0 / (bw.avg_mib_s * 1048576.0));
                r.measurements.push(serde_json::json!({"pair": k, "perftest": format!("{bw:?}"), "rdmalog": s, "extra": extra}));
                if k + 1 == pairs {
                    let mut tp = Vec::new();
                    for size in [64usize, 512, 4096, 16384, 65000] {
                        let c = Common {
                            size,
                            count: count / 2,
                            warmup: count / 20,
                            in_flight: 16,
                            rate: None,
                        };
                        let (s, _) =
                            cluster.measure(&c, &format!("rdmalog throughput {size} B x16"))?;
                        tp.push((size as f64, s.bytes_per_s / 1048576.0));
                    }
                    plot::throughput_vs_size(
                        &out.join("throughput_vs_size.svg"),
                        "rdmalog replicated throughput (3 replicas, replicated durability, 16 in flight, Soft-RoCE under TCG)",
                        &[Series {
                            label: "rdmalog commits".into(),
                            points: tp,
                        }],
                    )?;
                }
            }
            cluster.close();
            // Each cluster preallocates its segments (3 x 64 MiB): fifteen pairs would fill
            // the lab's disk.
            std::fs::remove_dir_all(&pair_dir)
                .with_context(|| format!("removing {}", pair_dir.display()))?;
        }
        for (size, (a, b)) in p1 {
            let name = format!("rdmalog commit {dname} {size} B");
            r.ratios.insert(format!("P1 {name}"), ratio(a));
            r.ratios.insert(format!("P1b {name}"), ratio(b));
        }
        for (size, f) in p1f {
            r.ratios.insert(
                format!("P1f rdmalog commit {dname} {size} B / (2 RTT + fdatasync)"),
                ratio(f),
            );
        }
        if !p2.is_empty() {
            r.ratios.insert(
                "P2 leader RDMA bytes/s per follower / ib_write_bw (4 KiB)".into(),
                ratio(p2),
            );
        }
    }

    Ok(())
}

/// etcd 3.4 against rdmalog-server, both through their TCP client protocols: ratios P5 and
/// P5t. Skipped, and said so in the results, when either cannot start.
fn etcd_pairs(
    r: &mut Results,
    cdf: &mut Vec<Series>,
    pairs: usize,
    count: u64,
    dir: &Path,
    at: Place,
) -> anyhow::Result<()> {
    eprintln!(
        "== etcd 3.4 and rdmalog-server (replicating over {}), both through their TCP client protocols",
        at.transport
    );
    let etcd = start_etcd(&dir.join("etcd"), at);
    let servers = ServerCluster::start(&dir.join("servers"), at);
    match (etcd, servers) {
        (Ok(mut kids), Ok(servers)) => {
            for (size, in_flight) in [(64usize, 1usize), (4096, 1), (4096, 16)] {
                let c = Common {
                    size,
                    count,
                    warmup: count / 10,
                    in_flight,
                    rate: None,
                };
                let (mut lat, mut thr) = (Vec::new(), Vec::new());
                for k in 0..pairs {
                    eprintln!(
                        "== pair {}/{pairs}: etcd put {size} B x{in_flight}, then rdmalog-server append (the other side stopped)",
                        k + 1
                    );
                    // Each side runs with the other stopped (SIGSTOP), so neither's idle work
                    // slows the other; a pause lets timers settle after SIGCONT.
                    signal(&servers.kids, "STOP");
                    let e = measure_etcd(
                        at.socket(1, 2379),
                        &c,
                        &format!("etcd put {size} B x{in_flight}"),
                    );
                    signal(&servers.kids, "CONT");
                    signal(&kids, "STOP");
                    std::thread::sleep(Duration::from_secs(2));
                    let name = format!("rdmalog-server append {size} B x{in_flight}");
                    let srv = servers.measure(&c, &name);
                    signal(&kids, "CONT");
                    std::thread::sleep(Duration::from_secs(2));
                    let (e, (s, cpu)) = (e?, srv?);
                    lat.push(s.p50_us / e.p50_us);
                    thr.push(s.ops_per_s / e.ops_per_s);
                    for (role, us) in &cpu {
                        r.cpu_us_per_entry_servers
                            .insert(format!("{name} ({role})"), *us);
                    }
                    if k == 0 && size == 64 {
                        cdf.push(Series {
                            label: "etcd 3.4 put".into(),
                            points: e.cdf.clone(),
                        });
                        cdf.push(Series {
                            label: "rdmalog-server append (TCP client)".into(),
                            points: s.cdf.clone(),
                        });
                    }
                    r.measurements.push(serde_json::json!({"pair": k, "etcd": e, "rdmalog_server": s, "cpu_us_per_entry": cpu}));
                }
                if in_flight == 1 {
                    r.ratios.insert(
                        format!("P5 rdmalog-server p50 / etcd p50 ({size} B)"),
                        ratio(lat),
                    );
                } else {
                    r.ratios.insert(
                        format!("P5t rdmalog-server / etcd throughput ({size} B x{in_flight})"),
                        ratio(thr),
                    );
                }
            }
            for k in &mut kids {
                let _ = k.kill();
                let _ = k.wait();
            }
        }
        (e, s) => {
            let why = format!(
                "etcd: {}; servers: {}",
                e.as_ref()
                    .err()
                    .map_or("up".to_string(), |e| format!("{e:#}")),
                s.as_ref()
                    .err()
                    .map_or("up".to_string(), |e| format!("{e:#}"))
            );
            if let Ok(mut kids) = e {
                for k in &mut kids {
                    let _ = k.kill();
                }
            }
            eprintln!("etcd comparison skipped: {why}");
            r.measurements
                .push(serde_json::json!({"etcd_comparison": format!("skipped: {why}")}));
        }
    }
    Ok(())
}

/// Writes the CDF plot, the table and the JSON of `r` under `out`, and prints the table.
fn report(out: &Path, r: &Results, cdf: &[Series], title: &str) -> anyhow::Result<()> {
    plot::latency_cdf(&out.join("latency_cdf.svg"), title, cdf)?;
    let table = render_table(r);
    std::fs::write(out.join("table.md"), &table)?;
    std::fs::write(out.join("results.json"), serde_json::to_string_pretty(r)?)?;
    println!("{table}");
    Ok(())
}

fn render_table(r: &Results) -> String {
    let mut t = String::from("| ratio | median | min | max | goal |\n|---|---:|---:|---:|---|\n");
    for (name, x) in &r.ratios {
        let goal = if name.starts_with("P1b") {
            "≤ 2"
        } else if name.starts_with("P1f") {
            "≤ 1.3"
        } else if name.starts_with("P1") {
            "≤ 1.5"
        } else if name.starts_with("P2") {
            "≥ 0.8"
        } else if name.starts_with("P5t") {
            "≥ 3"
        } else if name.starts_with("P5") {
            "≤ 0.5"
        } else {
            ""
        };
        t += &format!(
            "| {name} | {:.2} | {:.2} | {:.2} | {goal} |\n",
            x.median, x.min, x.max
        );
    }
    for (title, rows) in [
        (
            "CPU per committed entry (3 replicas in one process)",
            &r.cpu_us_per_entry_all_replicas,
        ),
        (
            "CPU per committed entry, per rdmalog-server process (last pair)",
            &r.cpu_us_per_entry_servers,
        ),
    ] {
        if rows.is_empty() {
            continue;
        }
        t += &format!("\n| {title} | µs |\n|---|---:|\n");
        for (name, us) in rows {
            t += &format!("| {name} | {us:.0} |\n");
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_the_standard_alphabet_and_padding() {
        assert_eq!(b64(b""), "");
        assert_eq!(b64(b"f"), "Zg==");
        assert_eq!(b64(b"fo"), "Zm8=");
        assert_eq!(b64(b"foo"), "Zm9v");
        assert_eq!(b64(b"foobar"), "Zm9vYmFy");
    }

    #[test]
    fn ratios_take_the_median_of_the_pairs() {
        let r = ratio(vec![3.0, 1.0, 2.0, f64::NAN, 10.0]);
        assert_eq!((r.median, r.min, r.max), (2.5, 1.0, 10.0));
        assert_eq!(ratio(vec![4.0, 1.0, 2.0]).median, 2.0);
    }
}
