//! The perftest baseline: `ib_write_lat`, `ib_send_lat` and `ib_write_bw` between two lab
//! hosts, parsed into numbers that later benchmarks divide by.
//!
//! perftest reports latency as half the round trip; `t_typical` is the median. Its "MB/sec"
//! figures are MiB/s (RDMA-NOTES §2). Both sides run with the same options and `-x <GID index>`,
//! the index chosen by query for the host's RoCE v2 IPv4 GID.

use std::fmt::Write as _;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use crate::config::host_addr;
use crate::guest;
use crate::{LabError, Result};

/// One latency test's result row.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Latency {
    /// Message size.
    pub bytes: u64,
    /// Iterations measured.
    pub iterations: u64,
    /// Minimum, µs.
    pub t_min_us: f64,
    /// Median ("typical"), µs.
    pub t_typical_us: f64,
    /// Mean, µs.
    pub t_avg_us: f64,
    /// 99th percentile, µs.
    pub p99_us: f64,
    /// 99.9th percentile, µs.
    pub p999_us: f64,
    /// Maximum, µs.
    pub t_max_us: f64,
}

/// One bandwidth test's result row.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bandwidth {
    /// Message size.
    pub bytes: u64,
    /// Iterations measured.
    pub iterations: u64,
    /// Peak bandwidth, MiB/s.
    pub peak_mib_s: f64,
    /// Average bandwidth, MiB/s.
    pub avg_mib_s: f64,
}

fn numbers_after_header(output: &str, header_marker: &str, what: &str) -> Result<Vec<f64>> {
    let mut lines = output.lines();
    lines
        .by_ref()
        .find(|l| l.contains(header_marker))
        .ok_or_else(|| LabError::Parse {
            what: what.into(),
            detail: format!("no result header containing `{header_marker}`"),
        })?;
    let row = lines
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with('-'))
        .ok_or_else(|| LabError::Parse {
            what: what.into(),
            detail: "no result row after the header".into(),
        })?;
    row.split_whitespace()
        .map(|w| {
            w.parse::<f64>().map_err(|_| LabError::Parse {
                what: what.into(),
                detail: format!("`{w}` in result row `{row}` is not a number"),
            })
        })
        .collect()
}

/// Parses the result table of `ib_write_lat` or `ib_send_lat`.
pub fn parse_latency(output: &str) -> Result<Latency> {
    let v = numbers_after_header(output, "t_typical[usec]", "perftest latency output")?;
    if v.len() < 9 {
        return Err(LabError::Parse {
            what: "perftest latency output".into(),
            detail: format!("expected 9 columns, found {}", v.len()),
        });
    }
    Ok(Latency {
        bytes: v[0] as u64,
        iterations: v[1] as u64,
        t_min_us: v[2],
        t_max_us: v[3],
        t_typical_us: v[4],
        t_avg_us: v[5],
        p99_us: v[7],
        p999_us: v[8],
    })
}

/// Parses the result table of `ib_write_bw`.
pub fn parse_bandwidth(output: &str) -> Result<Bandwidth> {
    let v = numbers_after_header(output, "BW average[MB/sec]", "perftest bandwidth output")?;
    if v.len() < 4 {
        return Err(LabError::Parse {
            what: "perftest bandwidth output".into(),
            detail: format!("expected at least 4 columns, found {}", v.len()),
        });
    }
    Ok(Bandwidth {
        bytes: v[0] as u64,
        iterations: v[1] as u64,
        peak_mib_s: v[2],
        avg_mib_s: v[3],
    })
}

/// The baseline of one boot.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    /// `ib_write_lat`.
    pub write_lat: Latency,
    /// `ib_send_lat`.
    pub send_lat: Latency,
    /// `ib_write_bw`.
    pub write_bw: Bandwidth,
}

impl Summary {
    /// The one machine-readable line (`perftest-summary: key=value ...`) that later
    /// benchmarks grep for and divide by.
    pub fn line(&self) -> String {
        let mut s = String::from("perftest-summary:");
        let _ = write!(
            s,
            " write_lat_bytes={} write_lat_t_typical_us={:.2} write_lat_p99_us={:.2}\
             \x20send_lat_t_typical_us={:.2} send_lat_p99_us={:.2}\
             \x20write_bw_bytes={} write_bw_avg_mib_s={:.2} write_bw_peak_mib_s={:.2}",
            self.write_lat.bytes,
            self.write_lat.t_typical_us,
            self.write_lat.p99_us,
            self.send_lat.t_typical_us,
            self.send_lat.p99_us,
            self.write_bw.bytes,
            self.write_bw.avg_mib_s,
            self.write_bw.peak_mib_s,
        );
        s
    }

    /// The same figures as a JSON object.
    pub fn json(&self) -> String {
        format!(
            "{{\"write_lat\":{{\"bytes\":{},\"t_typical_us\":{},\"p99_us\":{},\"p999_us\":{}}},\
             \"send_lat\":{{\"bytes\":{},\"t_typical_us\":{},\"p99_us\":{},\"p999_us\":{}}},\
             \"write_bw\":{{\"bytes\":{},\"avg_mib_s\":{},\"peak_mib_s\":{}}}}}",
            self.write_lat.bytes,
            self.write_lat.t_typical_us,
            self.write_lat.p99_us,
            self.write_lat.p999_us,
            self.send_lat.bytes,
            self.send_lat.t_typical_us,
            self.send_lat.p99_us,
            self.send_lat.p999_us,
            self.write_bw.bytes,
            self.write_bw.avg_mib_s,
            self.write_bw.peak_mib_s,
        )
    }
}

/// Parses a summary line back into key/value pairs (for benchmarks that divide by it).
pub fn parse_summary_line(line: &str) -> Option<Vec<(String, f64)>> {
    let rest = line.trim().strip_prefix("perftest-summary:")?;
    rest.split_whitespace()
        .map(|kv| {
            let (k, v) = kv.split_once('=')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

/// Which perftest program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tool {
    /// `ib_write_lat`.
    WriteLat,
    /// `ib_send_lat`.
    SendLat,
    /// `ib_write_bw`.
    WriteBw,
}

impl Tool {
    /// The program name.
    pub fn program(self) -> &'static str {
        match self {
            Tool::WriteLat => "ib_write_lat",
            Tool::SendLat => "ib_send_lat",
            Tool::WriteBw => "ib_write_bw",
        }
    }
}

/// How long one perftest pair may run. 1,000 round trips at a few ms each under a loaded TCG
/// guest take seconds; 180 s is far beyond a healthy run and still bounds a hang.
pub const PAIR_TIMEOUT: Duration = Duration::from_secs(180);

/// Arguments shared by both sides of a run (server side: no address).
pub fn tool_args(
    device: &str,
    gid_index: u32,
    size: u64,
    iterations: u64,
    port: u16,
) -> Vec<String> {
    vec![
        "-d".into(),
        device.into(),
        "-x".into(),
        gid_index.to_string(),
        "-s".into(),
        size.to_string(),
        "-n".into(),
        iterations.to_string(),
        "-p".into(),
        port.to_string(),
        "-F".into(),
    ]
}

/// Runs one perftest pair inside the lab: server on host `server`, client on host `client`.
/// Returns the client's output (the side that prints the result table for every tool used
/// here, with the server's output as a fallback).
pub fn run_pair(
    tool: Tool,
    server: u8,
    client: u8,
    size: u64,
    iterations: u64,
    port: u16,
) -> Result<String> {
    if !guest::in_lab() {
        return Err(LabError::NotInLab);
    }
    let sdev = crate::config::device_name(server);
    let cdev = crate::config::device_name(client);
    let sgid = guest::require_gid_index(&sdev, host_addr(server))?;
    let cgid = guest::require_gid_index(&cdev, host_addr(client))?;
    let spawn = |args: Vec<String>| {
        Command::new(tool.program())
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(crate::io_err(format!("cannot start {}", tool.program())))
    };
    let server_child = spawn(tool_args(&sdev, sgid, size, iterations, port))?;
    let deadline = Instant::now() + PAIR_TIMEOUT;
    // The server needs a moment to listen; the client fails fast with "Couldn't connect", so
    // retry it a bounded number of times.
    let mut client_out = None;
    for attempt in 0..20 {
        thread::sleep(Duration::from_millis(if attempt == 0 { 300 } else { 500 }));
        let mut args = tool_args(&cdev, cgid, size, iterations, port);
        args.push(host_addr(server).to_string());
        let child = spawn(args)?;
        let out = guest::wait_with_deadline(child, deadline, tool.program())?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if out.status.success() {
            client_out = Some(text);
            break;
        }
        if !text.contains("Couldn't connect") || Instant::now() >= deadline {
            let _ = guest::wait_with_deadline(server_child, Instant::now(), tool.program());
            return Err(LabError::Command {
                command: format!("{} (client on {cdev})", tool.program()),
                detail: format!("{}: {}", out.status, text.trim()),
            });
        }
    }
    let server_out = guest::wait_with_deadline(server_child, deadline, tool.program())?;
    let server_text = String::from_utf8_lossy(&server_out.stdout).into_owned();
    match client_out {
        Some(text) if text.contains("[usec]") || text.contains("[MB/sec]") => Ok(text),
        Some(_) => Ok(server_text),
        None => Err(LabError::Command {
            command: format!("{} (client on {cdev})", tool.program()),
            detail: format!("could not connect to the server on {sdev} after 20 attempts"),
        }),
    }
}

/// Runs the whole baseline between two hosts and returns the summary.
pub fn run_baseline(
    server: u8,
    client: u8,
    lat_size: u64,
    bw_size: u64,
    iterations: u64,
) -> Result<(Summary, String)> {
    let mut raw = String::new();
    let w = run_pair(Tool::WriteLat, server, client, lat_size, iterations, 18515)?;
    raw.push_str(&w);
    let s = run_pair(Tool::SendLat, server, client, lat_size, iterations, 18516)?;
    raw.push_str(&s);
    let b = run_pair(
        Tool::WriteBw,
        server,
        client,
        bw_size,
        iterations.max(1000),
        18517,
    )?;
    raw.push_str(&b);
    let summary = Summary {
        write_lat: parse_latency(&w)?,
        send_lat: parse_latency(&s)?,
        write_bw: parse_bandwidth(&b)?,
    };
    Ok((summary, raw))
}

#[cfg(test)]
mod tests {
    use super::*;

    const WRITE_LAT: &str = "\
---------------------------------------------------------------------------------------
                    RDMA_Write Latency Test
 Dual-port       : OFF\t\tDevice         : rxe2
 GID index       : 1
---------------------------------------------------------------------------------------
 #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] 
 64      500          115.29         8138.15      3989.99  \t       3685.82     \t1015.72\t\t6072.66 \t\t8138.15
---------------------------------------------------------------------------------------
";

    const WRITE_BW: &str = "\
 #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]
 4096       2000             24.39              23.05  \t\t   0.005900
---------------------------------------------------------------------------------------
";

    #[test]
    fn latency_table_is_parsed_by_position() {
        let l = parse_latency(WRITE_LAT).unwrap();
        assert_eq!(l.bytes, 64);
        assert_eq!(l.iterations, 500);
        assert_eq!(l.t_min_us, 115.29);
        assert_eq!(l.t_typical_us, 3989.99);
        assert_eq!(l.p99_us, 6072.66);
        assert_eq!(l.p999_us, 8138.15);
    }

    #[test]
    fn bandwidth_table_is_parsed() {
        let b = parse_bandwidth(WRITE_BW).unwrap();
        assert_eq!(b.bytes, 4096);
        assert_eq!(b.avg_mib_s, 23.05);
        assert_eq!(b.peak_mib_s, 24.39);
    }

    #[test]
    fn broken_output_gives_a_typed_error() {
        assert!(matches!(
            parse_latency("nothing here"),
            Err(LabError::Parse { .. })
        ));
        let truncated = "t_typical[usec]\n 64 500 1.0\n";
        assert!(
            parse_latency(truncated)
                .unwrap_err()
                .to_string()
                .contains("9 columns")
        );
        let garbage = "BW average[MB/sec]\n 4096 x 1 2\n";
        assert!(
            parse_bandwidth(garbage)
                .unwrap_err()
                .to_string()
                .contains("not a number")
        );
    }

    #[test]
    fn summary_line_round_trips() {
        let s = Summary {
            write_lat: parse_latency(WRITE_LAT).unwrap(),
            send_lat: parse_latency(WRITE_LAT).unwrap(),
            write_bw: parse_bandwidth(WRITE_BW).unwrap(),
        };
        let line = s.line();
        assert!(line.starts_with("perftest-summary: "));
        let kv = parse_summary_line(&line).unwrap();
        let get = |k: &str| kv.iter().find(|(key, _)| key == k).unwrap().1;
        assert_eq!(get("write_lat_t_typical_us"), 3989.99);
        assert_eq!(get("write_bw_avg_mib_s"), 23.05);
        assert_eq!(get("write_lat_bytes"), 64.0);
        assert!(s.json().contains("\"t_typical_us\":3989.99"));
    }

    #[test]
    fn both_sides_get_the_same_options() {
        let a = tool_args("rxe1", 1, 64, 1000, 18515);
        assert_eq!(a.join(" "), "-d rxe1 -x 1 -s 64 -n 1000 -p 18515 -F");
    }
}
