//! `rdmalog`: the command line client of an rdmalog cluster (append, tail, status, members,
//! bench, over the client protocol through the `client` library) and the offline tools for a
//! stopped node's data dir (dump, check, through `wal::inspect`).

#![deny(unsafe_code)]

mod bench;
mod offline;
mod status;

use std::fs::File;
use std::io::{self, BufRead, BufReader, BufWriter, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Args, Parser, Subcommand, ValueEnum};
use client::{Client, ClientConfig, ClientError, Entry, ReadConsistency, TlsConfig};

/// Payload bytes in one `read` request of `tail`.
const READ_BYTES: u32 = 1 << 20;
/// Payload bytes in one append batch, at most (half the default frame limit).
const BATCH_BYTES: usize = 8 << 20;
/// The slowest `bench --rate`: one append every ~28 hours.
const MIN_RATE: f64 = 1e-5;

const AFTER_HELP: &str = "\
Network commands (append, tail, status, members, bench) need --servers and --cluster-id (or
RDMALOG_SERVERS and RDMALOG_CLUSTER_ID), and either --ca (TLS) or --plaintext. Any member's
address is enough: appends are redirected to the leader, and broken connections, elections
and busy servers are retried until --timeout.

Exit status: 0 on success, 1 when `check` finds corruption, 2 on any error.";

#[derive(Parser, Debug)]
#[command(
    name = "rdmalog",
    version,
    about = "Client and offline tools for rdmalog, a replicated write-ahead log over RDMA",
    after_help = AFTER_HELP
)]
struct Cli {
    #[command(flatten)]
    conn: ConnArgs,
    #[command(subcommand)]
    cmd: Cmd,
}

/// How to reach the cluster (global: give them before or after the subcommand).
#[derive(Args, Debug)]
struct ConnArgs {
    /// Client addresses of cluster members, comma-separated (one is enough; more help when it
    /// is down)
    #[arg(
        long,
        env = "RDMALOG_SERVERS",
        value_delimiter = ',',
        global = true,
        value_name = "HOST:PORT,..."
    )]
    servers: Vec<String>,
    /// The cluster id the servers are configured with: decimal, or hex with 0x
    #[arg(long, env = "RDMALOG_CLUSTER_ID", value_parser = parse_u64, global = true, value_name = "ID")]
    cluster_id: Option<u64>,
    /// A file whose first line is the token that grants a role (read-only, read-write,
    /// admin); without it the servers' anonymous role applies
    #[arg(long, env = "RDMALOG_TOKEN_FILE", global = true, value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// Use TLS and trust the CAs in this PEM file to sign the servers' certificates
    #[arg(long, global = true, conflicts_with = "plaintext", value_name = "FILE")]
    ca: Option<PathBuf>,
    /// A client certificate (PEM) for servers that require one; with --key
    #[arg(long, global = true, requires = "key", value_name = "FILE")]
    cert: Option<PathBuf>,
    /// The client certificate's private key (PEM); with --cert
    #[arg(long, global = true, requires = "cert", value_name = "FILE")]
    key: Option<PathBuf>,
    /// The name the servers' certificates must carry (default: the host part of each address)
    #[arg(long, global = true, value_name = "NAME")]
    tls_server_name: Option<String>,
    /// Talk unencrypted TCP (only to servers configured with client.plaintext = true)
    #[arg(long, global = true)]
    plaintext: bool,
    /// Give up a command after retrying this long: 30, 30s, 500ms, 2m
    #[arg(long, global = true, default_value = "30s", value_parser = parse_duration, value_name = "DURATION")]
    timeout: Duration,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Append entries and print the index range each batch committed at
    #[command(after_help = "\
Examples:
  rdmalog ... append hello world        two entries
  printf 'a\\nb\\n' | rdmalog ... append  one entry per line of standard input
  rdmalog ... append --file events.txt  one entry per line of a file

Appends go through a client session: one retried after a broken connection or a change of
leader is in the log once (exactly once).")]
    Append(AppendArgs),
    /// Print committed entries as `index<TAB>payload`, up to the commit index or following
    Tail(TailArgs),
    /// Show every member: role, term, commit, lag, ring usage, peers, fenced writes
    Status(StatusArgs),
    /// Add or remove a voter (needs an admin token)
    Members(MembersArgs),
    /// Delete the entries below INDEX on every member (needs an admin token)
    #[command(after_help = "\
Each member deletes whole segments through a checkpoint, so it may keep some entries below
INDEX, and never deletes an entry it has not applied; the command prints each member's new
first index. Readers from below it then get Compacted. Servers can also trim by themselves:
see [retention] in the server configuration.")]
    Trim(TrimArgs),
    /// Offline: list a stopped node's segments and every entry of its log
    Dump(DumpArgs),
    /// Offline: verify every record of a stopped node's log; exit 1 on corruption
    Check(CheckArgs),
    /// Append load generator: latency percentiles (HdrHistogram) and throughput
    Bench(BenchArgs),
}

#[derive(Args, Debug)]
struct AppendArgs {
    /// The entries, one per argument; without any, each line of standard input (or of
    /// --file) is an entry
    #[arg(value_name = "ENTRY")]
    entries: Vec<String>,
    /// Append each line of this file
    #[arg(long, short, conflicts_with = "entries", value_name = "FILE")]
    file: Option<PathBuf>,
    /// Entries per append batch
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u16).range(1..=4096))]
    batch: u16,
    /// Plain appends without a session: one commit less per command, but a batch resent
    /// after a broken connection may be in the log twice
    #[arg(long)]
    at_least_once: bool,
    /// Conditional append: all the entries, as one batch, only if the log ends at INDEX (its
    /// last index, raft's own entries included); otherwise nothing is appended and the
    /// command fails naming where the log ends
    #[arg(long, value_name = "INDEX", conflicts_with = "at_least_once")]
    if_last: Option<u64>,
}

#[derive(Args, Debug)]
struct TailArgs {
    /// The first index to print
    #[arg(long, default_value_t = 1, value_name = "INDEX")]
    from: u64,
    /// Keep printing entries as they commit, until interrupted (resumes across reconnects)
    #[arg(short, long)]
    follow: bool,
    /// Print payloads as hex instead of UTF-8 (invalid UTF-8 shows as U+FFFD)
    #[arg(long)]
    hex: bool,
    /// Linearizable: include every entry committed before the command started (the leader
    /// answers, after a majority confirms it still leads)
    #[arg(long, conflicts_with_all = ["follow", "after"])]
    linearizable: bool,
    /// Read your writes: first wait until the node answering has committed INDEX (the last
    /// index an append printed)
    #[arg(long, conflicts_with = "follow", value_name = "INDEX")]
    after: Option<u64>,
}

#[derive(Args, Debug)]
struct StatusArgs {
    /// Print JSON instead of a table
    #[arg(long)]
    json: bool,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum MemberAction {
    /// Add a voter
    Add,
    /// Remove a voter
    Remove,
}

#[derive(Args, Debug)]
struct MembersArgs {
    /// add or remove
    #[arg(value_enum)]
    action: MemberAction,
    /// The node id
    node: u64,
}

#[derive(Args, Debug)]
struct TrimArgs {
    /// The first index to keep
    index: u64,
}

#[derive(Args, Debug)]
struct DumpArgs {
    /// The node's data dir (stopped node)
    data_dir: PathBuf,
    /// Also print each payload in hex
    #[arg(long)]
    payload: bool,
}

#[derive(Args, Debug)]
#[command(after_help = "\
Exit status: 0 when every record verifies (a torn tail, which recovery cuts at the next open,
is only a warning), 1 on corruption (the first one is printed with its file, byte offset and
Lsn), 2 when the directory cannot be read.")]
struct CheckArgs {
    /// The node's data dir (stopped node)
    data_dir: PathBuf,
}

#[derive(Args, Debug)]
#[command(after_help = "\
Closed loop (the default): --in-flight connections, each with one append in flight, as fast as
they complete. Open loop (--rate): appends are started at a fixed rate over --in-flight
connections, and each latency is measured from when it was meant to start, so that a stall
shows in the percentiles instead of being hidden (coordinated omission).")]
struct BenchArgs {
    /// Appends to make, warm-up included
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    entries: u64,
    /// Payload bytes of each append
    #[arg(long, default_value_t = 128, value_name = "BYTES")]
    size: usize,
    /// Connections, each with one append in flight
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=1024))]
    in_flight: u16,
    /// Open loop: start appends at this many per second
    #[arg(long, value_name = "PER_SECOND")]
    rate: Option<f64>,
    /// Appends left out of the results at the start [default: 5% of --entries]
    #[arg(long, value_name = "N")]
    warmup: Option<u64>,
    /// Print the results as JSON
    #[arg(long)]
    json: bool,
    /// No progress bar (it is drawn only when standard error is a terminal anyway)
    #[arg(long, short)]
    quiet: bool,
}

fn parse_u64(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let r = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(&hex.replace('_', ""), 16),
        None => s.replace('_', "").parse(),
    };
    r.map_err(|e| format!("{s:?} is not a decimal or 0x-hex number: {e}"))
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = match s.find(|c: char| !(c.is_ascii_digit() || c == '.')) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let n: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration such as 30, 30s, 500ms or 2m"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        _ => return Err(format!("{s:?}: the unit must be ms, s or m")),
    };
    if !(0.001..=365.0 * 86_400.0).contains(&secs) {
        return Err(format!("{s:?} must be 1ms to 365 days"));
    }
    Ok(Duration::from_secs_f64(secs))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rdmalog: error: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// Output cut short by the reader (`rdmalog tail | head`): not an error.
fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<io::Error>()
            .is_some_and(|io| io.kind() == io::ErrorKind::BrokenPipe)
    })
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let stdout = io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    let code = match cli.cmd {
        Cmd::Dump(a) => offline::dump(&a.data_dir, a.payload, &mut out)?,
        Cmd::Check(a) => offline::check(&a.data_dir, &mut out)?,
        Cmd::Append(a) => {
            let mut cfg = client_config(&cli.conn)?;
            cfg.exactly_once = !a.at_least_once;
            let client = Client::connect(cfg).context("cannot connect to the cluster")?;
            append(client, a, &mut out)?;
            ExitCode::SUCCESS
        }
        Cmd::Tail(a) => {
            tail(connect(&cli.conn)?, &a, &mut out)?;
            ExitCode::SUCCESS
        }
        Cmd::Status(a) => {
            status::run(&mut connect(&cli.conn)?, a.json, &mut out)?;
            ExitCode::SUCCESS
        }
        Cmd::Members(a) => {
            let add = matches!(a.action, MemberAction::Add);
            let index = connect(&cli.conn)?
                .members(add, a.node)
                .context("membership change")?;
            let what = if add { "added to" } else { "removed from" };
            writeln!(
                out,
                "node {} {what} the voters; the change committed at index {index}",
                a.node
            )?;
            ExitCode::SUCCESS
        }
        Cmd::Trim(a) => {
            let mut c = connect(&cli.conn)?;
            let members = c.status().context("asking for the members")?.members;
            if members.is_empty() {
                bail!("the server listed no members to trim (is it configured with its peers?)");
            }
            let mut failed = 0;
            for (m, r) in members.iter().zip(c.trim_members(&members, a.index)) {
                match r {
                    Ok(first) => writeln!(
                        out,
                        "node {} ({}): first index {first}",
                        m.id, m.client_addr
                    )?,
                    Err(e) => {
                        failed += 1;
                        writeln!(out, "node {} ({}): not trimmed: {e}", m.id, m.client_addr)?;
                    }
                }
            }
            if failed > 0 {
                out.flush()?;
                bail!("{failed} of {} members were not trimmed", members.len());
            }
            ExitCode::SUCCESS
        }
        Cmd::Bench(a) => {
            let cfg = client_config(&cli.conn)?;
            let warmup = a.warmup.unwrap_or(a.entries / 20);
            if warmup >= a.entries {
                bail!(
                    "--warmup {warmup} leaves nothing to measure of --entries {}",
                    a.entries
                );
            }
            if a.rate.is_some_and(|r| !(MIN_RATE..=1e9).contains(&r)) {
                bail!("--rate must be {MIN_RATE} to 1e9 appends per second");
            }
            let frame_limit = cfg.max_frame_bytes as usize;
            if a.size == 0 || a.size > frame_limit - 64 {
                bail!(
                    "--size must be 1 to {} bytes (the frame limit less the frame's own bytes)",
                    frame_limit - 64
                );
            }
            let opts = bench::Opts {
                entries: a.entries,
                size: a.size,
                in_flight: a.in_flight.into(),
                rate: a.rate,
                warmup,
                json: a.json,
                progress: !a.quiet && io::IsTerminal::is_terminal(&io::stderr()),
            };
            bench::run(cfg, &opts, &mut out)?;
            ExitCode::SUCCESS
        }
    };
    out.flush()?;
    Ok(code)
}

/// The client configuration the global flags describe.
fn client_config(a: &ConnArgs) -> anyhow::Result<ClientConfig> {
    if a.servers.iter().all(|s| s.trim().is_empty()) {
        bail!("no servers: give --servers HOST:PORT,... (or set RDMALOG_SERVERS)");
    }
    let Some(cluster_id) = a.cluster_id else {
        bail!("no cluster id: give --cluster-id (decimal or 0x-hex; or set RDMALOG_CLUSTER_ID)");
    };
    let tls = match (&a.ca, a.plaintext) {
        (Some(ca), _) => Some(TlsConfig {
            ca: ca.clone(),
            client_cert: a.cert.clone().zip(a.key.clone()),
            server_name: a.tls_server_name.clone(),
        }),
        (None, true) => {
            if a.cert.is_some() || a.tls_server_name.is_some() {
                bail!(
                    "--cert, --key and --tls-server-name need TLS: give --ca instead of --plaintext"
                );
            }
            None
        }
        (None, false) => bail!(
            "refusing to connect without TLS: give --ca FILE (the CA that signed the servers' \
             certificates; add --cert and --key if they require client certificates), or \
             --plaintext to use unencrypted TCP with servers configured for it"
        ),
    };
    let token = match &a.token_file {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read the token file {}", path.display()))?;
            let token = text.lines().next().unwrap_or("").trim().to_string();
            if token.is_empty() {
                bail!("the token file {} is empty", path.display());
            }
            Some(token)
        }
        None => None,
    };
    let mut cfg = ClientConfig::new(
        a.servers
            .iter()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect(),
        cluster_id,
    );
    cfg.tls = tls;
    cfg.token = token;
    cfg.deadline = a.timeout;
    cfg.connect_timeout = cfg.connect_timeout.min(a.timeout);
    Ok(cfg)
}

fn connect(a: &ConnArgs) -> anyhow::Result<Client> {
    let cfg = client_config(a)?;
    let c = Client::connect(cfg).context("cannot connect to the cluster")?;
    Ok(c)
}

/// Lines of `r` as byte strings, without the line end (`\n` or `\r\n`).
fn lines(r: impl BufRead) -> impl Iterator<Item = io::Result<Vec<u8>>> {
    r.split(b'\n').map(|l| {
        l.map(|mut l| {
            if l.last() == Some(&b'\r') {
                l.pop();
            }
            l
        })
    })
}

/// `append --if-last`: every entry as one conditional batch.
fn append_if(
    mut client: Client,
    a: AppendArgs,
    expected: u64,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let entries: Vec<Vec<u8>> = if !a.entries.is_empty() {
        a.entries.into_iter().map(String::into_bytes).collect()
    } else if let Some(path) = &a.file {
        let f = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
        lines(BufReader::new(f)).collect::<io::Result<_>>()?
    } else {
        lines(io::stdin().lock()).collect::<io::Result<_>>()?
    };
    let refs: Vec<&[u8]> = entries.iter().map(Vec::as_slice).collect();
    let (first, last) = client
        .append_if(&refs, expected)
        .context("conditional append")?;
    writeln!(
        out,
        "committed {first}..={last} ({})",
        plural(refs.len() as u64, "entry", "entries")
    )?;
    Ok(())
}

fn plural(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

fn append(mut client: Client, a: AppendArgs, out: &mut impl Write) -> anyhow::Result<()> {
    if let Some(expected) = a.if_last {
        return append_if(client, a, expected, out);
    }
    let source: Box<dyn Iterator<Item = io::Result<Vec<u8>>>> = if !a.entries.is_empty() {
        Box::new(a.entries.into_iter().map(|s| Ok(s.into_bytes())))
    } else if let Some(path) = &a.file {
        let f = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
        Box::new(lines(BufReader::new(f)))
    } else {
        Box::new(lines(io::stdin().lock()))
    };
    let max = usize::from(a.batch);
    let mut batch: Vec<Vec<u8>> = Vec::new();
    let mut bytes = 0;
    let (mut total, mut batches) = (0u64, 0u64);
    // Sends `batch` until every entry of it committed once. When a change of leader keeps
    // only a prefix of it, the rest (certainly not in the log) is sent again, alone.
    let mut send = |batch: &mut Vec<Vec<u8>>, out: &mut dyn Write| -> anyhow::Result<()> {
        while !batch.is_empty() {
            let refs: Vec<&[u8]> = batch.iter().map(Vec::as_slice).collect();
            let (at, n) = match client.append_at(&refs) {
                Ok(at) => (at, batch.len()),
                Err(ClientError::PartlyCommitted {
                    first,
                    last,
                    committed,
                    ..
                }) => ((first..=last).collect::<Vec<u64>>(), committed),
                Err(e) => {
                    return Err(e).with_context(|| {
                        format!(
                            "append failed after {} had committed",
                            plural(total, "entry", "entries")
                        )
                    });
                }
            };
            let (first, last) = (at[0], at[at.len() - 1]);
            if last - first + 1 == at.len() as u64 {
                writeln!(
                    out,
                    "committed {first}..={last} ({})",
                    plural(n as u64, "entry", "entries")
                )?;
            } else {
                // A resend found the first entries already in the log.
                let list: Vec<String> = at.iter().map(u64::to_string).collect();
                writeln!(
                    out,
                    "committed at {} ({})",
                    list.join(","),
                    plural(n as u64, "entry", "entries")
                )?;
            }
            out.flush()?;
            total += n as u64;
            batches += 1;
            batch.drain(..n);
        }
        Ok(())
    };
    for entry in source {
        let entry = entry.context("cannot read the entries")?;
        // Sent before it would take the batch past its bytes: a batch of entries that each
        // fit a frame stays within one.
        if !batch.is_empty() && bytes + entry.len() + 16 > BATCH_BYTES {
            send(&mut batch, out)?;
            bytes = 0;
        }
        bytes += entry.len() + 16;
        batch.push(entry);
        if batch.len() >= max || bytes >= BATCH_BYTES {
            send(&mut batch, out)?;
            bytes = 0;
        }
    }
    if !batch.is_empty() {
        send(&mut batch, out)?;
    }
    if batches == 0 {
        eprintln!("rdmalog: nothing to append (no arguments and no input lines)");
    } else {
        writeln!(
            out,
            "total: {} in {}",
            plural(total, "entry", "entries"),
            plural(batches, "batch", "batches")
        )?;
    }
    Ok(())
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

fn print_entry(out: &mut impl Write, e: &Entry, as_hex: bool) -> io::Result<()> {
    if as_hex {
        writeln!(out, "{}\t{}", e.index, hex(&e.data))
    } else {
        writeln!(out, "{}\t{}", e.index, String::from_utf8_lossy(&e.data))
    }
}

fn tail(mut client: Client, a: &TailArgs, out: &mut impl Write) -> anyhow::Result<()> {
    if !a.follow {
        // Up to the commit index as of the first answer.
        let consistency = match (a.linearizable, a.after) {
            (true, _) => ReadConsistency::Linearizable,
            (false, Some(index)) => ReadConsistency::AtLeast(index),
            (false, None) => ReadConsistency::Local,
        };
        let (mut entries, target) = match consistency {
            ReadConsistency::Local => client.read(a.from, READ_BYTES),
            c => client.read_with(a.from, READ_BYTES, c),
        }
        .context("read")?;
        while let Some(last) = entries.last().map(|e| e.index) {
            for e in entries.iter().filter(|e| e.index <= target) {
                print_entry(out, e, a.hex)?;
            }
            if last >= target {
                break;
            }
            // At least up to the target: after a reconnect to a follower that lags, an
            // empty answer would end the output short of it.
            entries = client
                .read_with(last + 1, READ_BYTES, ReadConsistency::AtLeast(target))
                .context("read")?
                .0;
        }
        return Ok(());
    }
    let mut tail = client.tail(a.from).context("tail")?;
    let mut flushed = Instant::now();
    loop {
        match tail.poll(Duration::from_millis(100)) {
            Ok(Some(e)) => {
                print_entry(out, &e, a.hex)?;
                if flushed.elapsed() > Duration::from_millis(100) {
                    out.flush()?;
                    flushed = Instant::now();
                }
            }
            Ok(None) => {
                out.flush()?;
                flushed = Instant::now();
            }
            Err(e) if e.is_transient() => {
                out.flush()?;
                eprintln!("rdmalog: warning: {e}; still trying");
            }
            Err(e) => return Err(e).context("tail"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_and_durations_parse() {
        assert_eq!(parse_u64("0xc1"), Ok(0xc1));
        assert_eq!(parse_u64("0X5EED_0001"), Ok(0x5eed_0001));
        assert_eq!(parse_u64("193"), Ok(193));
        assert!(parse_u64("c1").is_err());
        assert_eq!(parse_duration("30"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("0").is_err());
        assert!(parse_duration("5h").is_err());
        // Past what a client takes, or rounded to nothing: said as such.
        for s in ["99999999999s", "1e-10", "366d"] {
            assert!(parse_duration(s).is_err(), "{s}");
        }
        assert_eq!(
            parse_duration("99999999999s"),
            Err("\"99999999999s\" must be 1ms to 365 days".into())
        );
    }

    #[test]
    fn the_command_line_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn lines_drop_their_ends() {
        let got: Vec<Vec<u8>> = lines(&b"a\r\nb\n\nc"[..]).map(Result::unwrap).collect();
        assert_eq!(got, [&b"a"[..], b"b", b"", b"c"]);
    }
}
