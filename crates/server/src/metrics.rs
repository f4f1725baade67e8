//! Counters and latency histograms, and the HTTP endpoint that serves them: `GET /metrics`
//! (Prometheus text format 0.0.4) and `GET /status` (JSON).

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use fabric::Fabric;

use crate::Shared;

/// Upper bounds of the latency buckets, in seconds.
const BUCKETS: [f64; 16] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 10.0,
];

/// A latency histogram with fixed buckets (cumulative counts are computed when served).
#[derive(Debug, Default)]
pub struct Histogram {
    counts: [AtomicU64; BUCKETS.len() + 1],
    sum_ns: AtomicU64,
}

impl Histogram {
    /// Records one observation.
    pub fn observe(&self, d: Duration) {
        let s = d.as_secs_f64();
        let k = BUCKETS
            .iter()
            .position(|&b| s <= b)
            .unwrap_or(BUCKETS.len());
        self.counts[k].fetch_add(1, Ordering::Relaxed);
        self.sum_ns
            .fetch_add(d.as_nanos() as u64, Ordering::Relaxed);
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (k, b) in BUCKETS.iter().enumerate() {
            cumulative += self.counts[k].load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {cumulative}");
        }
        cumulative += self.counts[BUCKETS.len()].load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {cumulative}");
        let sum = self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
        let _ = writeln!(out, "{name}_sum {sum}\n{name}_count {cumulative}");
    }
}

/// The server's own counters (the replica's come from its status when served).
#[derive(Debug, Default)]
pub struct Metrics {
    /// Request arrival to `Appended` answer, per batch.
    pub append_latency: Histogram,
    /// Proposal to commit, per entry.
    pub commit_latency: Histogram,
    /// Entries appended (committed) through this server.
    pub appended_entries: AtomicU64,
    /// Requests answered with an error.
    pub request_errors: AtomicU64,
    /// Appends answered with a redirect.
    pub redirects: AtomicU64,
    /// Connections refused or closed for what the client sent or failed to send (malformed,
    /// oversized, wrong version or cluster, unauthorized, too slow); not idle closes, not
    /// `Busy` refusals, not shutdown.
    pub rejected_connections: AtomicU64,
    /// Connections refused `Busy` because `max_connections` were open.
    pub busy_refusals: AtomicU64,
    /// Connections accepted since start.
    pub connections_total: AtomicU64,
    /// Rounds of the retention policy that deleted segments.
    pub retention_trims: AtomicU64,
    /// Rounds of the retention policy that failed.
    pub retention_failures: AtomicU64,
}

/// Renders the Prometheus text.
pub fn render<F: Fabric + Send + 'static>(shared: &Shared<F>) -> String {
    let s = shared.log.status();
    let m = &shared.metrics;
    let mut out = String::with_capacity(8192);
    m.append_latency.render(
        &mut out,
        "rdmalog_append_latency_seconds",
        "Client append request to its commit, per batch, measured at the server.",
    );
    m.commit_latency.render(
        &mut out,
        "rdmalog_commit_latency_seconds",
        "Proposal to commit, per entry.",
    );
    let mut gauge = |name: &str, help: &str, kind: &str, v: u64| {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}"
        );
    };
    gauge("rdmalog_commit_index", "Commit index.", "gauge", s.commit);
    gauge(
        "rdmalog_applied_index",
        "Applied index.",
        "gauge",
        s.applied,
    );
    gauge(
        "rdmalog_last_index",
        "Last index in the log.",
        "gauge",
        s.last_index,
    );
    gauge(
        "rdmalog_first_index",
        "First index in the log.",
        "gauge",
        s.first_index,
    );
    gauge(
        "rdmalog_log_bytes",
        "Bytes of the log held: its stream from the first entry's record to the end.",
        "gauge",
        s.log_bytes,
    );
    gauge(
        "rdmalog_retention_trims_total",
        "Rounds of the retention policy that deleted old segments.",
        "counter",
        m.retention_trims.load(Ordering::Relaxed),
    );
    gauge(
        "rdmalog_retention_failures_total",
        "Rounds of the retention policy that failed (logged; retried next round).",
        "counter",
        m.retention_failures.load(Ordering::Relaxed),
    );
    gauge("rdmalog_term", "Current raft term.", "gauge", s.term);
    gauge(
        "rdmalog_is_leader",
        "1 when this node is the leader.",
        "gauge",
        u64::from(s.role == replica::Role::Leader),
    );
    gauge(
        "rdmalog_recovering",
        "1 while this node recovers from a start that lost entries it may have acknowledged (it does not vote).",
        "gauge",
        u64::from(s.recovering.is_some()),
    );
    gauge(
        "rdmalog_ring_used_bytes",
        "Bytes in use in the ring.",
        "gauge",
        s.ring_used_bytes,
    );
    gauge(
        "rdmalog_ring_bytes",
        "Ring size.",
        "gauge",
        s.ring_capacity_bytes,
    );
    gauge(
        "rdmalog_fenced_writes_total",
        "RDMA writes refused because a follower revoked this node (deposed leader).",
        "counter",
        s.stats.fenced_writes,
    );
    gauge(
        "rdmalog_reconnects_total",
        "Reconnects to peers.",
        "counter",
        s.stats.reconnects,
    );
    gauge(
        "rdmalog_fast_appends_total",
        "Appends sent by RDMA Write plus descriptor.",
        "counter",
        s.stats.fast_appends,
    );
    gauge(
        "rdmalog_slow_appends_total",
        "Appends sent with their payload over send/recv.",
        "counter",
        s.stats.slow_appends,
    );
    gauge(
        "rdmalog_appended_entries_total",
        "Entries appended through this server's clients.",
        "counter",
        m.appended_entries.load(Ordering::Relaxed),
    );
    gauge(
        "rdmalog_request_errors_total",
        "Client requests answered with an error.",
        "counter",
        m.request_errors.load(Ordering::Relaxed),
    );
    gauge(
        "rdmalog_redirects_total",
        "Client appends redirected to the leader.",
        "counter",
        m.redirects.load(Ordering::Relaxed),
    );
    gauge(
        "rdmalog_rejected_connections_total",
        "Client connections closed for bad input (not idle closes, not Busy refusals).",
        "counter",
        m.rejected_connections.load(Ordering::Relaxed),
    );
    gauge(
        "rdmalog_driver_stalls_total",
        "Times the replica's driver fell ten ticks or more behind (logged with behind_ms).",
        "counter",
        shared.log.driver_stalls(),
    );
    gauge(
        "rdmalog_busy_refusals_total",
        "Client connections refused Busy at max_connections.",
        "counter",
        m.busy_refusals.load(Ordering::Relaxed),
    );
    gauge(
        "rdmalog_client_connections",
        "Open client connections.",
        "gauge",
        shared.connections.load(Ordering::Relaxed) as u64,
    );
    let _ = writeln!(
        out,
        "# HELP rdmalog_work_completions_total RDMA work completions by status.\n# TYPE rdmalog_work_completions_total counter"
    );
    for (k, label) in replica::COMPLETION_STATUSES.iter().enumerate() {
        let _ = writeln!(
            out,
            "rdmalog_work_completions_total{{status=\"{label}\"}} {}",
            s.stats.completions[k]
        );
    }
    if let Some((user, system)) = process_cpu() {
        let _ = writeln!(
            out,
            "# HELP process_cpu_seconds_total CPU time of this process (user and system), for CPU per entry.\n# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total {}\nprocess_cpu_user_seconds_total {user}\nprocess_cpu_system_seconds_total {system}",
            user + system
        );
    }
    let _ = writeln!(
        out,
        "# HELP rdmalog_fsync_seconds The wal's group-commit flushes (writes and fdatasync).\n# TYPE rdmalog_fsync_seconds summary\nrdmalog_fsync_seconds_sum {}\nrdmalog_fsync_seconds_count {}\n# HELP rdmalog_fsync_max_seconds The longest flush.\n# TYPE rdmalog_fsync_max_seconds gauge\nrdmalog_fsync_max_seconds {}",
        s.stats.fsync_total_ns as f64 / 1e9,
        s.stats.fsyncs,
        s.stats.fsync_max_ns as f64 / 1e9
    );
    out
}

/// This process's user and system CPU seconds, from `/proc/self/stat` (fields 14 and 15, in
/// USER_HZ ticks, which Linux fixes at 100 for user space on every architecture we run on).
pub fn process_cpu() -> Option<(f64, f64)> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: split after it.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |k: usize| fields.get(k)?.parse::<u64>().ok();
    Some((ticks(11)? as f64 / 100.0, ticks(12)? as f64 / 100.0))
}

/// The `/status` JSON: this node, its peers, the members' client addresses.
pub fn status_json<F: Fabric + Send + 'static>(shared: &Shared<F>) -> String {
    let s = shared.log.status();
    let peers: Vec<serde_json::Value> = s
        .peers
        .iter()
        .map(|p| {
            serde_json::json!({
                "id": p.id,
                "conn": format!("{:?}", p.conn).to_lowercase(),
                "matched": p.matched,
                "fast_path": p.fast_path,
            })
        })
        .collect();
    let members: Vec<serde_json::Value> = shared
        .opts
        .members
        .iter()
        .map(|m| serde_json::json!({"id": m.id, "client": m.client_addr}))
        .collect();
    serde_json::json!({
        "id": s.id,
        "role": crate::conn::role_name(s.role),
        "term": s.term,
        "leader": s.leader,
        "commit": s.commit,
        "applied": s.applied,
        "first_index": s.first_index,
        "last_index": s.last_index,
        "log_bytes": s.log_bytes,
        "ring_used_bytes": s.ring_used_bytes,
        "ring_bytes": s.ring_capacity_bytes,
        "fenced_writes": s.stats.fenced_writes,
        "recovering": s.recovering,
        "cpu_seconds": process_cpu().map(|(u, k)| u + k),
        "peers": peers,
        "members": members,
    })
    .to_string()
}

/// Serves `/metrics` and `/status` until the server shuts down. One request per
/// connection, read with a timeout and a size bound.
/// How long one scrape may take to send its request line (and each write of the answer).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// The request line of `stream` (at most 8 KiB), read by `deadline` as a whole: the endpoint
/// serves one scrape at a time, and a client that trickles its request a byte at a time,
/// each read inside its own timeout, held it (and blinded monitoring) for hours.
fn request_line(mut stream: &std::net::TcpStream, deadline: Instant) -> Option<String> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    while !buf.contains(&b'\n') && buf.len() < 8192 {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || stream.set_read_timeout(Some(left)).is_err() {
            return None;
        }
        match stream.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
    let end = buf.iter().position(|&b| b == b'\n').unwrap_or(buf.len());
    Some(String::from_utf8_lossy(&buf[..end]).into_owned())
}

pub fn serve<F: Fabric + Send + 'static>(listener: TcpListener, shared: &Shared<F>) {
    let _ = listener.set_nonblocking(true);
    while !shared.shutting_down.load(Ordering::Acquire) {
        let (stream, _) = match listener.accept() {
            Ok(s) => s,
            Err(_) => {
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
        };
        let _ = stream.set_nonblocking(false);
        let _ = stream.set_write_timeout(Some(REQUEST_TIMEOUT));
        let Some(line) = request_line(&stream, Instant::now() + REQUEST_TIMEOUT) else {
            continue;
        };
        let path = line.split_whitespace().nth(1).unwrap_or("");
        let (status, kind, body) = match (line.split_whitespace().next(), path) {
            (Some("GET"), "/metrics") => ("200 OK", "text/plain; version=0.0.4", render(shared)),
            (Some("GET"), "/status") => ("200 OK", "application/json", status_json(shared)),
            _ => (
                "404 Not Found",
                "text/plain",
                "rdmalog serves GET /metrics and GET /status\n".to_string(),
            ),
        };
        let mut w = &stream;
        let _ = write!(
            w,
            "HTTP/1.0 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
    }
}
