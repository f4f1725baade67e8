//! The benchmark harness: drives an operation (a replicated append, an etcd put, ...) in a
//! closed loop (a fixed number of operations in flight) or an open loop (a target rate), records
//! latency in an HdrHistogram with warm-up excluded, and reports p50/p90/p99/p99.9/max,
//! throughput and CPU time.
//!
//! **Open loop and coordinated omission.** Operation `i` is *intended* to start at
//! `t0 + i / rate`. Its latency is measured from that intended time, not from when a worker got
//! round to it, so a stall that delays later operations shows up in their latencies instead of
//! being omitted (the correction wrk2 and HdrHistogram's authors describe).

#![deny(unsafe_code)]

pub mod lab;
pub mod plot;
pub mod steps;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;

/// Longest latency the histogram holds: 60 s (longer ones are clamped and counted).
const MAX_LATENCY_US: u64 = 60_000_000;

/// How to drive the load.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Load {
    /// `in_flight` workers, each starting its next operation when the last one finished.
    Closed {
        /// Operations in flight.
        in_flight: usize,
    },
    /// Operations intended at a fixed `rate` per second, by `workers` threads.
    Open {
        /// Target operations per second.
        rate: f64,
        /// Worker threads (operations in flight at most).
        workers: usize,
    },
}

/// What a run measured.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Summary {
    /// What was measured.
    pub name: String,
    /// Operations measured (warm-up excluded).
    pub count: u64,
    /// Operations that failed (not in the histogram).
    pub errors: u64,
    /// Latency percentiles and extremes, µs.
    pub p50_us: f64,
    /// 90th percentile, µs.
    pub p90_us: f64,
    /// 99th percentile, µs.
    pub p99_us: f64,
    /// 99.9th percentile, µs.
    pub p999_us: f64,
    /// Maximum, µs.
    pub max_us: f64,
    /// Mean, µs.
    pub mean_us: f64,
    /// Measured operations per second (warm-up excluded).
    pub ops_per_s: f64,
    /// Payload bytes per second.
    pub bytes_per_s: f64,
    /// Wall time of the measured part, s.
    pub seconds: f64,
    /// Latency CDF points `(latency µs, fraction at or below)`, for plots.
    pub cdf: Vec<(f64, f64)>,
}

/// A latency recorder that skips the first `warmup` observations.
#[derive(Debug)]
pub struct Recorder {
    hist: Histogram<u64>,
    warmup: u64,
    seen: u64,
    errors: u64,
    first: Option<Instant>,
    last: Option<Instant>,
}

impl Recorder {
    /// A recorder that excludes the first `warmup` observations.
    pub fn new(warmup: u64) -> Recorder {
        Recorder {
            hist: Histogram::new_with_bounds(1, MAX_LATENCY_US, 3).expect("valid bounds"),
            warmup,
            seen: 0,
            errors: 0,
            first: None,
            last: None,
        }
    }

    /// Records one operation that ended at `end` after `latency`.
    pub fn record(&mut self, latency: Duration, end: Instant) {
        self.seen += 1;
        if self.seen <= self.warmup {
            return;
        }
        if self.first.is_none() {
            self.first = Some(end - latency.min(end.elapsed() + latency));
        }
        self.last = Some(end);
        let us = (latency.as_micros() as u64).clamp(1, MAX_LATENCY_US);
        self.hist.saturating_record(us);
    }

    /// Counts a failed operation.
    pub fn error(&mut self) {
        self.errors += 1;
    }

    /// The summary of what was recorded; `bytes` is the payload size of one operation.
    pub fn summary(&self, name: &str, bytes: u64) -> Summary {
        let h = &self.hist;
        let seconds = match (self.first, self.last) {
            (Some(a), Some(b)) if b > a => (b - a).as_secs_f64(),
            _ => 0.0,
        };
        let count = h.len();
        let ops = if seconds > 0.0 {
            count as f64 / seconds
        } else {
            0.0
        };
        let q = |p: f64| h.value_at_quantile(p) as f64;
        let cdf = [
            0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 0.995, 0.999, 1.0,
        ]
        .iter()
        .map(|&p| (q(p), p))
        .collect();
        Summary {
            name: name.into(),
            count,
            errors: self.errors,
            p50_us: q(0.5),
            p90_us: q(0.9),
            p99_us: q(0.99),
            p999_us: q(0.999),
            max_us: h.max() as f64,
            mean_us: h.mean(),
            ops_per_s: ops,
            bytes_per_s: ops * bytes as f64,
            seconds,
            cdf,
        }
    }
}

/// Runs `total` operations (the first `warmup` of them unmeasured) under `load`. `op(worker,
/// i)` performs operation `i` synchronously and returns whether it succeeded. `progress` is
/// called with the number of operations done, at most ten times a second.
pub fn run<F>(
    name: &str,
    bytes: u64,
    total: u64,
    warmup: u64,
    load: Load,
    op: F,
    progress: impl Fn(u64) + Sync,
) -> Summary
where
    F: Fn(usize, u64) -> bool + Sync,
{
    let rec = Mutex::new(Recorder::new(warmup));
    let next = AtomicU64::new(0);
    let done = AtomicU64::new(0);
    let t0 = Instant::now();
    let (workers, interval) = match load {
        Load::Closed { in_flight } => (in_flight.max(1), None),
        Load::Open { rate, workers } => (
            workers.max(1),
            Some(Duration::from_secs_f64(1.0 / rate.max(1e-3))),
        ),
    };
    let last_progress = Mutex::new(Instant::now());
    std::thread::scope(|s| {
        for w in 0..workers {
            let (rec, next, done, op, last_progress, progress) =
                (&rec, &next, &done, &op, &last_progress, &progress);
            s.spawn(move || {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= total {
                        break;
                    }
                    let start = match interval {
                        Some(iv) => {
                            let intended = t0 + iv * i as u32;
                            let now = Instant::now();
                            if intended > now {
                                std::thread::sleep(intended - now);
                            }
                            intended
                        }
                        None => Instant::now(),
                    };
                    let ok = op(w, i);
                    let end = Instant::now();
                    {
                        let mut r = rec
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner);
                        if ok {
                            r.record(end - start, end);
                        } else {
                            r.error();
                        }
                    }
                    let d = done.fetch_add(1, Ordering::Relaxed) + 1;
                    let mut lp = last_progress
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    if lp.elapsed() >= Duration::from_millis(100) || d == total {
                        *lp = Instant::now();
                        progress(d);
                    }
                }
            });
        }
    });
    rec.into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .summary(name, bytes)
}

/// The reference for `Fsync` commits on a disk: `warmup + count` appends of `size` bytes at
/// sequential 4 KiB-aligned offsets of a file in `dir`, each followed by fdatasync, as the
/// wal does. The file is written and synced in full first, so, like the wal's preallocated
/// segments, each fdatasync flushes data only, no file-size metadata. The file is removed
/// afterwards.
pub fn fdatasync_latency(
    dir: &std::path::Path,
    size: usize,
    count: u64,
    warmup: u64,
) -> std::io::Result<Summary> {
    use std::io::Write;
    use std::os::unix::fs::FileExt;
    std::fs::create_dir_all(dir)?;
    let path = dir.join("fdatasync-reference");
    let stride = size.max(1).div_ceil(4096) as u64 * 4096;
    let total = warmup + count;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(&path)?;
    let zeros = vec![0u8; stride as usize];
    for _ in 0..total {
        file.write_all(&zeros)?;
    }
    file.sync_all()?;
    let payload = vec![0x5au8; size];
    let failed = AtomicU64::new(0);
    let summary = run(
        &format!("fdatasync {size} B"),
        size as u64,
        total,
        warmup,
        Load::Closed { in_flight: 1 },
        |_, i| {
            let ok = file.write_all_at(&payload, i * stride).is_ok() && file.sync_data().is_ok();
            if !ok {
                failed.fetch_add(1, Ordering::Relaxed);
            }
            ok
        },
        |_| {},
    );
    drop(file);
    std::fs::remove_file(&path)?;
    match failed.load(Ordering::Relaxed) {
        0 => Ok(summary),
        n => Err(std::io::Error::other(format!(
            "{n} of {total} writes or fdatasyncs to {} failed",
            path.display()
        ))),
    }
}

/// This process's CPU seconds (user + system) from `/proc/self/stat` (USER_HZ = 100).
pub fn process_cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let t = |k: usize| f.get(k)?.parse::<u64>().ok();
    Some((t(11)? + t(12)?) as f64 / 100.0)
}

/// The whole machine's CPU time by kind, from the first line of `/proc/stat`, in seconds
/// (USER_HZ is 100 on Linux): what a transport costs in the kernel (system, softirq) shows here
/// and not in a process's own counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct MachineCpu {
    /// User time (with nice).
    pub user: f64,
    /// System time (the kernel on behalf of processes).
    pub system: f64,
    /// Hard and soft interrupt time (the network stack's receive path; Soft-RoCE's work).
    pub softirq: f64,
    /// Idle and I/O wait.
    pub idle: f64,
}

impl MachineCpu {
    /// Parses `/proc/stat`'s text.
    pub fn parse(stat: &str) -> Option<MachineCpu> {
        let line = stat.lines().find(|l| l.starts_with("cpu "))?;
        let f: Vec<f64> = line
            .split_whitespace()
            .skip(1)
            .map(|v| v.parse::<f64>().map(|j| j / 100.0))
            .collect::<Result<_, _>>()
            .ok()?;
        let at = |k: usize| f.get(k).copied().unwrap_or(0.0);
        Some(MachineCpu {
            user: at(0) + at(1),
            system: at(2),
            idle: at(3) + at(4),
            softirq: at(5) + at(6),
        })
    }

    /// Reads it now.
    pub fn now() -> Option<MachineCpu> {
        MachineCpu::parse(&std::fs::read_to_string("/proc/stat").ok()?)
    }

    /// The time spent since `earlier`.
    pub fn since(&self, earlier: &MachineCpu) -> MachineCpu {
        MachineCpu {
            user: self.user - earlier.user,
            system: self.system - earlier.system,
            softirq: self.softirq - earlier.softirq,
            idle: self.idle - earlier.idle,
        }
    }
}

/// A progress line on stderr, redrawn in place: `[#####.....] 50% 500/1000 1234/s`.
pub fn progress_line(label: &str, done: u64, total: u64, since: Instant) -> String {
    let frac = if total == 0 {
        1.0
    } else {
        done as f64 / total as f64
    };
    let bar = (frac * 30.0) as usize;
    let rate = done as f64 / since.elapsed().as_secs_f64().max(1e-9);
    format!(
        "\r{label} [{}{}] {:>3.0}% {done}/{total} {rate:.0}/s",
        "#".repeat(bar),
        ".".repeat(30 - bar.min(30)),
        frac * 100.0
    )
}

/// Shares a value between worker closures.
pub type SharedOp<T> = Arc<T>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn machine_cpu_reads_proc_stat_in_seconds_by_kind() {
        let text =
            "cpu  1000 50 300 9000 100 20 80 0 0 0\ncpu0 500 25 150 4500 50 10 40 0 0 0\nintr 1\n";
        let c = MachineCpu::parse(text).unwrap();
        assert_eq!(c.user, 10.5);
        assert_eq!(c.system, 3.0);
        assert_eq!(c.idle, 91.0);
        assert_eq!(c.softirq, 1.0);
        let later = MachineCpu { user: 12.5, ..c };
        assert_eq!(later.since(&c).user, 2.0);
        assert!(MachineCpu::parse("nothing").is_none());
    }

    #[test]
    fn warm_up_is_excluded_and_percentiles_come_from_the_rest() {
        let mut r = Recorder::new(2);
        let now = Instant::now();
        r.record(Duration::from_secs(9), now); // warm-up
        r.record(Duration::from_secs(9), now); // warm-up
        for us in 1..=100u64 {
            r.record(
                Duration::from_micros(us * 10),
                now + Duration::from_millis(us),
            );
        }
        r.error();
        let s = r.summary("t", 64);
        assert_eq!((s.count, s.errors), (100, 1));
        assert!((s.p50_us - 500.0).abs() <= 1.0, "{s:?}");
        assert!((s.p99_us - 990.0).abs() <= 1.0, "{s:?}");
        assert!((s.max_us - 1000.0).abs() <= 1.0, "{s:?}");
        assert_eq!(s.cdf.last().unwrap().1, 1.0);
    }

    #[test]
    fn closed_loop_runs_every_operation_once() {
        let seen = Mutex::new(vec![false; 50]);
        let s = run(
            "t",
            8,
            50,
            5,
            Load::Closed { in_flight: 4 },
            |_, i| {
                let mut v = seen.lock().unwrap();
                assert!(!v[i as usize], "operation {i} ran twice");
                v[i as usize] = true;
                true
            },
            |_| {},
        );
        assert!(seen.lock().unwrap().iter().all(|&b| b));
        assert_eq!(s.count, 45);
    }

    #[test]
    fn open_loop_charges_a_stall_to_the_operations_it_delays() {
        // One worker, 1000/s: operation 10 stalls 100 ms. With the correction the ones
        // intended during the stall wait for it, so about 100 operations see ≥ 10 ms; a
        // closed-loop measurement would have shown one slow operation.
        let s = run(
            "t",
            8,
            300,
            0,
            Load::Open {
                rate: 1000.0,
                workers: 1,
            },
            |_, i| {
                if i == 10 {
                    std::thread::sleep(Duration::from_millis(100));
                }
                true
            },
            |_| {},
        );
        // About a third of the operations were intended during the stall: p90 lands among
        // them. Measured from their actual start, p90 would be well under 1 ms.
        assert!(
            s.p90_us >= 10_000.0,
            "the stall was not charged: {:?}",
            s.cdf
        );
        assert!(s.max_us >= 99_000.0, "{s:?}");
        assert!(s.p50_us < 99_000.0, "{s:?}");
    }

    #[test]
    fn the_fdatasync_reference_measures_every_append_and_cleans_up() {
        let dir = std::env::temp_dir().join(format!("rdmalog-fdatasync-{}", std::process::id()));
        let s = fdatasync_latency(&dir, 4096, 20, 5).unwrap();
        assert_eq!((s.count, s.errors), (20, 0));
        assert!(s.p50_us >= 1.0 && s.p50_us <= s.p99_us, "{s:?}");
        assert!(!dir.join("fdatasync-reference").exists());
        std::fs::remove_dir(&dir).unwrap();
    }

    #[test]
    fn cpu_time_is_read() {
        assert!(process_cpu_seconds().is_some());
    }
}
