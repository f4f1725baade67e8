//! Verbs latency bench: RDMA Write ping-pong and Send ping-pong between rxe1 and rxe2 (two
//! threads, one process, real traffic across the lab bridge), by payload size 8 B..64 KiB.
//!
//! Method, chosen to match perftest so the numbers compare: each iteration the initiator
//! sets the last byte of its payload to an iteration tag, posts a signaled Write (Send) and
//! polls its own send completion; the responder spins until the tag shows up in its region
//! (or its receive completes) and answers the same way. Latency is half the round trip;
//! the printed figure is the median of `RDMALOG_BENCH_ITERS` (default 1000) iterations,
//! beside perftest's `t_typical` (`ib_write_lat` / `ib_send_lat`, `-x` = the RoCE v2 GID
//! index found by query) measured in the same boot. Criterion then runs the same loops
//! (`Throughput::Bytes`). Without RDMA devices it prints why and exits 0.

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput};
use verbs::{
    AccessFlags, AnonMemory, Completion, CompletionQueue, Context, MemoryRegion, PollMode,
    ProtectionDomain, QpConfig, QueuePair, RecvPool, RemoteRegion, RtrParams, SignalPolicy,
    WcStatus, select_roce_v2_gid,
};

/// Largest payload measured (the brief's 64 KiB).
const MAX_SIZE: usize = 64 * 1024;
/// Payload sizes measured.
const SIZES: [usize; 5] = [8, 64, 512, 4096, MAX_SIZE];
/// Receive slots per side; a ping-pong has at most one message in flight each way.
const RECV_SLOTS: usize = 16;
/// Bound on every wait, so a broken fabric fails the bench instead of hanging it (generous:
/// the lab's first contact can take seconds).
const WAIT: Duration = Duration::from_secs(30);

struct Side {
    pd: Arc<ProtectionDomain>,
    send_cq: Arc<CompletionQueue>,
    recv_cq: Arc<CompletionQueue>,
    region: MemoryRegion<AnonMemory>,
    src: MemoryRegion<AnonMemory>,
    gid_index: u8,
    gid: [u8; 16],
}

fn side(host: u8) -> Side {
    let ctx = Context::open(&format!("rxe{host}")).expect("device");
    let ip = std::net::Ipv4Addr::new(192, 0, 2, 10 + host);
    let e = select_roce_v2_gid(&ctx.gid_table(1).expect("gid table"), ip)
        .expect("RoCE v2 GID for the lab address");
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let send_cq = CompletionQueue::new(&ctx, 256).unwrap();
    let recv_cq = CompletionQueue::new(&ctx, 256).unwrap();
    let rw = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let region = MemoryRegion::register(&pd, AnonMemory::new(MAX_SIZE).unwrap(), rw).unwrap();
    let src = MemoryRegion::register(
        &pd,
        AnonMemory::new(MAX_SIZE).unwrap(),
        AccessFlags::LOCAL_WRITE,
    )
    .unwrap();
    Side {
        pd,
        send_cq,
        recv_cq,
        region,
        src,
        gid_index: e.index as u8,
        gid: e.gid,
    }
}

fn qp_config() -> QpConfig {
    QpConfig {
        access: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        signal: SignalPolicy::All,
        rq_depth: RECV_SLOTS as u32,
        ..QpConfig::default()
    }
}

/// One end of the ping-pong: its QP, memory, receive pool and the peer's region.
struct End {
    // Field order is drop order: the QP before the memory regions it uses.
    qp: QueuePair,
    pool: RecvPool,
    side: Side,
    remote: RemoteRegion,
}

impl End {
    fn wait_send(&self) {
        let mut out = [Completion::EMPTY; 4];
        let n = self
            .side
            .send_cq
            .wait(&mut out, PollMode::Busy, WAIT)
            .expect("send completion");
        for c in &out[..n] {
            assert_eq!(c.status, WcStatus::Success, "{c:?}");
            self.qp.retire(c);
        }
    }

    fn write(&self, size: usize, tag: u8) {
        self.side.src.write_at(size - 1, &[tag]).unwrap();
        // SAFETY: `src` is modified only here, after the previous write's completion was
        // polled in `wait_send`; it outlives the QP (field order).
        unsafe {
            self.qp
                .post_write(&self.side.src, 0, size, &self.remote, 0, None, true)
        }
        .unwrap();
        self.wait_send();
    }

    fn await_tag(&self, size: usize, tag: u8) {
        let start = Instant::now();
        let backoff = crossbeam_utils::Backoff::new();
        let mut b = [0u8; 1];
        loop {
            self.side.region.read_at(size - 1, &mut b).unwrap();
            if b[0] == tag {
                return;
            }
            assert!(start.elapsed() < WAIT, "tag {tag} never arrived");
            // Spin, then yield: on the 2-vCPU lab guest the kernel's rxe work must run too.
            backoff.snooze();
        }
    }

    fn send(&self, size: usize) {
        // SAFETY: as in `write`: `src` is never modified while a Send from it is outstanding.
        unsafe { self.qp.post_send(&self.side.src, 0, size, None, true) }.unwrap();
        self.wait_send();
    }

    fn await_recv(&mut self, size: usize) {
        let mut out = [Completion::EMPTY; 1];
        self.side
            .recv_cq
            .wait(&mut out, PollMode::Busy, WAIT)
            .expect("receive completion");
        let got = self
            .pool
            .with_received(&self.qp, &out[0], |b| b.len())
            .unwrap()
            .expect("receive ok");
        assert_eq!(got, size);
    }
}

#[derive(Clone, Copy)]
enum Kind {
    Write,
    Send,
}

enum Cmd {
    Run {
        kind: Kind,
        size: usize,
        iters: u64,
        first_tag: u64,
    },
    Stop,
}

fn tag_of(n: u64) -> u8 {
    (n % 255 + 1) as u8
}

fn responder(mut end: End, cmds: Receiver<Cmd>, done: Sender<()>) {
    while let Ok(Cmd::Run {
        kind,
        size,
        iters,
        first_tag,
    }) = cmds.recv()
    {
        for n in first_tag..first_tag + iters {
            match kind {
                Kind::Write => {
                    end.await_tag(size, tag_of(n));
                    end.write(size, tag_of(n));
                }
                Kind::Send => {
                    end.await_recv(size);
                    end.send(size);
                }
            }
        }
        done.send(()).unwrap();
    }
}

struct Bench {
    ping: End,
    cmds: Sender<Cmd>,
    done: Receiver<()>,
    next_tag: u64,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Bench {
    fn new() -> Bench {
        let (a, b) = (side(2), side(1));
        let mk = |s: &Side| QueuePair::new(&s.pd, &s.send_cq, &s.recv_cq, qp_config()).unwrap();
        let (qa, qb) = (mk(&a), mk(&b));
        let mut pa = RecvPool::new(&a.pd, RECV_SLOTS, MAX_SIZE).unwrap();
        let mut pb = RecvPool::new(&b.pd, RECV_SLOTS, MAX_SIZE).unwrap();
        qa.to_init(1).unwrap();
        qb.to_init(1).unwrap();
        pa.post_all(&qa).unwrap();
        pb.post_all(&qb).unwrap();
        let rtr = |q: &QueuePair, me: &Side, peer: &Side, peer_qpn: u32, psn: u32| {
            q.to_rtr(&RtrParams {
                dest_qp_num: peer_qpn,
                rq_psn: psn,
                dgid: peer.gid,
                sgid_index: me.gid_index,
                port: 1,
            })
            .unwrap();
        };
        rtr(&qb, &b, &a, qa.qp_num(), 0x10);
        rtr(&qa, &a, &b, qb.qp_num(), 0x20);
        qa.to_rts(0x10).unwrap();
        qb.to_rts(0x20).unwrap();
        let (ra, rb) = (b.region.remote(), a.region.remote());
        let ping = End {
            qp: qa,
            pool: pa,
            side: a,
            remote: ra,
        };
        let pong = End {
            qp: qb,
            pool: pb,
            side: b,
            remote: rb,
        };
        let (cmds, cmd_rx) = channel();
        let (done_tx, done) = channel();
        let thread = std::thread::spawn(move || responder(pong, cmd_rx, done_tx));
        Bench {
            ping,
            cmds,
            done,
            next_tag: 0,
            thread: Some(thread),
        }
    }

    /// Runs `iters` round trips; returns each one's duration.
    fn run(&mut self, kind: Kind, size: usize, iters: u64, mut each: impl FnMut(Duration)) {
        let first_tag = self.next_tag;
        self.next_tag += iters;
        self.cmds
            .send(Cmd::Run {
                kind,
                size,
                iters,
                first_tag,
            })
            .unwrap();
        for n in first_tag..first_tag + iters {
            let t = Instant::now();
            match kind {
                Kind::Write => {
                    self.ping.write(size, tag_of(n));
                    self.ping.await_tag(size, tag_of(n));
                }
                Kind::Send => {
                    self.ping.send(size);
                    self.ping.await_recv(size);
                }
            }
            each(t.elapsed());
        }
        self.done.recv_timeout(WAIT).expect("responder finished");
    }

    fn median_half_rtt_us(&mut self, kind: Kind, size: usize, iters: u64) -> f64 {
        let mut v = Vec::with_capacity(iters as usize);
        self.run(kind, size, iters, |d| v.push(d));
        v.sort();
        v[v.len() / 2].as_secs_f64() * 1e6 / 2.0
    }
}

impl Drop for Bench {
    fn drop(&mut self) {
        let _ = self.cmds.send(Cmd::Stop);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Runs perftest's `tool` for `size` between rxe1 (server) and rxe2 and returns t_typical.
fn perftest(tool: &str, size: usize, iters: u64, gid1: u8, gid2: u8) -> Option<f64> {
    let mut server = Command::new(tool)
        .args([
            "-d",
            "rxe1",
            "-x",
            &gid1.to_string(),
            "-s",
            &size.to_string(),
            "-n",
            &iters.to_string(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    std::thread::sleep(Duration::from_millis(1500));
    let out = Command::new("timeout")
        .args([
            "60",
            tool,
            "-d",
            "rxe2",
            "-x",
            &gid2.to_string(),
            "-s",
            &size.to_string(),
            "-n",
            &iters.to_string(),
        ])
        .arg("192.0.2.11")
        .output()
        .ok();
    let _ = server.kill();
    let _ = server.wait();
    let text = String::from_utf8_lossy(&out?.stdout).to_string();
    // The result row: "#bytes #iterations t_min t_max t_typical ...".
    text.lines().find_map(|l| {
        let w: Vec<&str> = l.split_whitespace().collect();
        if w.len() >= 5 && w[0] == size.to_string() && w[1] == iters.to_string() {
            w[4].parse().ok()
        } else {
            None
        }
    })
}

fn main() {
    let devices = match verbs::list_devices() {
        Ok(d) => d,
        Err(e) => {
            println!(
                "verbs bench: skipped, no RDMA here ({e}). Run it in the lab: ops/lab run -- <bench binary> --bench"
            );
            return;
        }
    };
    if !["rxe1", "rxe2"]
        .iter()
        .all(|n| devices.iter().any(|d| d.name == *n))
    {
        let names: Vec<_> = devices.iter().map(|d| d.name.clone()).collect();
        println!("verbs bench: skipped, needs lab devices rxe1 and rxe2 (found {names:?})");
        return;
    }
    let iters: u64 = std::env::var("RDMALOG_BENCH_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let mut bench = Bench::new();
    let gid1 = side_gid(1);
    let gid2 = side_gid(2);

    let mut report =
        String::from("kind   size_bytes  verbs_median_us  perftest_t_typical_us  ratio\n");
    for (kind, name, tool) in [
        (Kind::Write, "write", "ib_write_lat"),
        (Kind::Send, "send", "ib_send_lat"),
    ] {
        for size in SIZES {
            let ours = bench.median_half_rtt_us(kind, size, iters);
            let theirs = perftest(tool, size, iters, gid1, gid2);
            let line = match theirs {
                Some(t) => format!(
                    "{name:<6} {size:>10}  {ours:>15.2}  {t:>21.2}  {:>5.2}\n",
                    ours / t
                ),
                None => format!(
                    "{name:<6} {size:>10}  {ours:>15.2}  {:>21}  {:>5}\n",
                    "n/a", "n/a"
                ),
            };
            print!("{line}");
            report.push_str(&line);
        }
    }
    if let Ok(dir) = std::env::var("RDMALOG_LAB_OUT") {
        let _ = std::fs::write(format!("{dir}/verbs-bench.txt"), &report);
    }

    if std::env::var("RDMALOG_BENCH_SKIP_CRITERION").is_ok() {
        return;
    }
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(10)
        .configure_from_args();
    // The guest sees target/ read-only; keep criterion's files in the lab's out dir.
    if let Ok(dir) = std::env::var("RDMALOG_LAB_OUT") {
        c = c.output_directory(&std::path::Path::new(&dir).join("criterion"));
    }
    for (kind, name) in [
        (Kind::Write, "write_pingpong"),
        (Kind::Send, "send_pingpong"),
    ] {
        let mut g = c.benchmark_group(name);
        for size in SIZES {
            g.throughput(Throughput::Bytes(size as u64));
            g.bench_with_input(BenchmarkId::from_parameter(size), &size, |b, &size| {
                b.iter_custom(|n| {
                    let mut total = Duration::ZERO;
                    bench.run(kind, size, n, |d| total += d / 2);
                    total
                })
            });
        }
        g.finish();
    }
    c.final_summary();
}

fn side_gid(host: u8) -> u8 {
    let ctx = Context::open(&format!("rxe{host}")).unwrap();
    let ip = std::net::Ipv4Addr::new(192, 0, 2, 10 + host);
    select_roce_v2_gid(&ctx.gid_table(1).unwrap(), ip)
        .unwrap()
        .index as u8
}
