//! `rdmalog bench`: an append load generator with HdrHistogram latencies.
//!
//! Closed loop: `in_flight` connections, each appending one entry at a time, as fast as the
//! appends complete. Open loop (`rate`): append `i` is meant to start at `start + i / rate`;
//! the connections take them in order, and each latency is measured from the *intended* start,
//! so time an append spends waiting for a free connection behind a slow one counts
//! (coordinated-omission correction). The first `warmup` appends are left out of the
//! histogram and of the throughput.

use std::io::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use client::{Client, ClientConfig, ClientError};
use hdrhistogram::Histogram;
use serde_json::json;

/// Highest latency the histogram holds, in µs (one hour); longer ones saturate.
const HIGHEST_US: u64 = 3_600_000_000;
/// Progress redraws, at most this often.
const REDRAW: Duration = Duration::from_millis(100);

/// What to run.
#[derive(Debug)]
pub(crate) struct Opts {
    pub entries: u64,
    pub size: usize,
    pub in_flight: usize,
    pub rate: Option<f64>,
    pub warmup: u64,
    pub json: bool,
    pub progress: bool,
}

struct Shared {
    next: AtomicU64,
    done: AtomicU64,
    stop: AtomicBool,
    error: Mutex<Option<(u64, ClientError)>>,
}

struct WorkerResult {
    hist: Histogram<u64>,
    measured: u64,
    first_start: Option<Instant>,
    last_end: Option<Instant>,
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1)
}

fn worker(mut c: Client, o: &Opts, sh: &Shared, start: Instant) -> WorkerResult {
    let mut r = WorkerResult {
        hist: Histogram::new_with_bounds(1, HIGHEST_US, 3).expect("valid histogram bounds"),
        measured: 0,
        first_start: None,
        last_end: None,
    };
    let mut payload = vec![b'x'; o.size];
    while !sh.stop.load(Ordering::Relaxed) {
        let i = sh.next.fetch_add(1, Ordering::Relaxed);
        if i >= o.entries {
            break;
        }
        let begin = match o.rate {
            Some(rate) => {
                let intended = start + Duration::from_secs_f64(i as f64 / rate);
                let now = Instant::now();
                if intended > now {
                    std::thread::sleep(intended - now);
                }
                intended
            }
            None => Instant::now(),
        };
        let stamp = i.to_le_bytes();
        let n = stamp.len().min(payload.len());
        payload[..n].copy_from_slice(&stamp[..n]);
        match c.append(&[&payload]) {
            Ok(_) => {
                let end = Instant::now();
                if i >= o.warmup {
                    r.hist.saturating_record(micros(end - begin));
                    r.measured += 1;
                    r.first_start = Some(r.first_start.map_or(begin, |f| f.min(begin)));
                    r.last_end = Some(r.last_end.map_or(end, |l| l.max(end)));
                }
                sh.done.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                sh.stop.store(true, Ordering::Relaxed);
                sh.error
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .get_or_insert((i, e));
                break;
            }
        }
    }
    r
}

fn draw(done: u64, total: u64, elapsed: Duration) {
    const WIDTH: u64 = 30;
    let filled = (done * WIDTH / total) as usize;
    let rate = done as f64 / elapsed.as_secs_f64().max(1e-9);
    eprint!(
        "\r[{}{}] {:3}% {done}/{total} {rate:.0}/s ",
        "#".repeat(filled),
        ".".repeat(WIDTH as usize - filled),
        done * 100 / total
    );
}

pub(crate) fn run(cfg: ClientConfig, o: &Opts, out: &mut impl Write) -> anyhow::Result<()> {
    let clients = (0..o.in_flight)
        .map(|_| Client::connect(cfg.clone()))
        .collect::<Result<Vec<_>, _>>()
        .context("cannot connect to the cluster")?;
    let sh = Shared {
        next: AtomicU64::new(0),
        done: AtomicU64::new(0),
        stop: AtomicBool::new(false),
        error: Mutex::new(None),
    };
    let start = Instant::now();
    let results: Vec<WorkerResult> = std::thread::scope(|s| {
        let handles: Vec<_> = clients
            .into_iter()
            .map(|c| {
                let sh = &sh;
                s.spawn(move || worker(c, o, sh, start))
            })
            .collect();
        while !handles.iter().all(|h| h.is_finished()) {
            std::thread::sleep(REDRAW);
            if o.progress {
                draw(sh.done.load(Ordering::Relaxed), o.entries, start.elapsed());
            }
        }
        if o.progress {
            draw(sh.done.load(Ordering::Relaxed), o.entries, start.elapsed());
            eprintln!();
        }
        handles
            .into_iter()
            .map(|h| h.join().expect("a bench worker panicked"))
            .collect()
    });
    if let Some((i, e)) = sh
        .error
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .take()
    {
        return Err(e).with_context(|| {
            format!(
                "append {i} failed after {} of {} had completed",
                sh.done.load(Ordering::Relaxed),
                o.entries
            )
        });
    }
    let mut hist: Histogram<u64> = Histogram::new_with_bounds(1, HIGHEST_US, 3)?;
    let mut measured = 0;
    let mut first: Option<Instant> = None;
    let mut last: Option<Instant> = None;
    for r in &results {
        hist.add(&r.hist)?;
        measured += r.measured;
        first = match (first, r.first_start) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        last = match (last, r.last_end) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
    }
    let window = match (first, last) {
        (Some(f), Some(l)) => l.saturating_duration_since(f),
        _ => Duration::ZERO,
    };
    let secs = window.as_secs_f64().max(1e-9);
    let throughput = measured as f64 / secs;
    let mib_s = throughput * o.size as f64 / f64::from(1 << 20);
    let q = |p: f64| hist.value_at_quantile(p);
    let mode = match o.rate {
        Some(r) => format!(
            "open loop at {r}/s over {} connections (latency from the intended start)",
            o.in_flight
        ),
        None => format!("closed loop, {} in flight", o.in_flight),
    };
    if o.json {
        let v = json!({
            "mode": if o.rate.is_some() { "open" } else { "closed" },
            "in_flight": o.in_flight,
            "rate": o.rate,
            "entries": o.entries,
            "warmup": o.warmup,
            "size": o.size,
            "count": hist.len(),
            "latency_us": {
                "p50": q(0.5),
                "p90": q(0.9),
                "p99": q(0.99),
                "p99_9": q(0.999),
                "max": hist.max(),
                "mean": hist.mean(),
                "min": hist.min(),
            },
            "throughput_per_s": throughput,
            "payload_mib_per_s": mib_s,
            "elapsed_s": window.as_secs_f64(),
        });
        serde_json::to_writer_pretty(&mut *out, &v)?;
        writeln!(out)?;
        return Ok(());
    }
    writeln!(
        out,
        "{measured} appends of {} B measured ({} warm-up left out); {mode}",
        o.size, o.warmup
    )?;
    writeln!(
        out,
        "{:<14}{:>9}{:>10}{:>10}{:>10}{:>10}{:>10}",
        "latency (µs)", "count", "p50", "p90", "p99", "p99.9", "max"
    )?;
    writeln!(
        out,
        "{:<14}{:>9}{:>10}{:>10}{:>10}{:>10}{:>10}",
        "append",
        hist.len(),
        q(0.5),
        q(0.9),
        q(0.99),
        q(0.999),
        hist.max()
    )?;
    writeln!(
        out,
        "throughput: {throughput:.1} appends/s, {mib_s:.2} MiB/s of payload, over {:.2} s",
        window.as_secs_f64()
    )?;
    if let Some(r) = o.rate {
        if throughput < r * 0.95 {
            writeln!(
                out,
                "note: the cluster kept up with only {:.0}% of the {r}/s asked for; add --in-flight or lower --rate",
                throughput * 100.0 / r
            )?;
        }
    }
    Ok(())
}
