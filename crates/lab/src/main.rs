//! `rdmalog-lab`: the Soft-RoCE lab's command line. See `ops/lab --help` and README.md.

#![deny(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use lab::config::{self, LabConfig};
use lab::guest::{self, Netem, Signal};
use lab::host::{self, Job};
use lab::{LabError, perftest};

/// Exit status for a failure of the lab itself (not of the job), distinct from any job status
/// a test runner uses (0, 1, 101).
const LAB_FAILURE: u8 = 125;

#[derive(Parser, Debug)]
#[command(
    name = "ops/lab",
    about = "The rdmalog Soft-RoCE lab: Debian's kernel under QEMU TCG with N rxe hosts on one bridge",
    long_about = "Boots Debian's own kernel under QEMU (TCG) with Soft-RoCE (rdma_rxe) and N RoCE \
                  hosts rxe1..rxeN at 192.0.2.11.. on one bridge, with the host's root shared \
                  read-only, so host-built binaries run inside unchanged."
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Install the Debian packages, fetch the kernel and build the initramfs (needs root the first time).
    Setup {
        #[arg(long, help = "Fail instead of installing missing packages")]
        no_install: bool,
    },
    /// Boot the lab, run a command inside, and exit with its status.
    Run {
        #[command(flatten)]
        boot: BootArgs,
        #[arg(
            long,
            help = "Treat the arguments as one bash script instead of a program and its arguments"
        )]
        sh: bool,
        #[arg(required = true, last = true, help = "The command (after --)")]
        command: Vec<String>,
    },
    /// Run ib_write_lat, ib_send_lat and ib_write_bw between two hosts and print the baseline.
    Perftest {
        #[command(flatten)]
        boot: BootArgs,
        #[command(flatten)]
        pt: PerftestArgs,
    },
    /// Inside the guest: inject or clear a fault.
    #[command(subcommand)]
    Fault(FaultCmd),
    /// Inside the guest: print the fabric's devices, port states and RoCE v2 GIDs.
    Info,
    /// Inside the guest: the perftest half of `perftest` (used by it).
    #[command(hide = true)]
    GuestPerftest {
        #[command(flatten)]
        pt: PerftestArgs,
    },
}

#[derive(Args, Debug, Clone)]
struct BootArgs {
    #[arg(long, default_value_t = config::DEFAULT_HOSTS, help = "Number of Soft-RoCE hosts (1-9)")]
    hosts: u8,
    #[arg(long, default_value_t = config::DEFAULT_MEM_MIB, help = "Guest memory in MiB")]
    mem: u32,
    #[arg(long, default_value_t = config::DEFAULT_SMP, help = "Guest vCPUs")]
    smp: u8,
    #[arg(long, default_value = "600", value_parser = config::parse_duration, help = "Limit for the whole run (e.g. 600, 10m)")]
    timeout: Duration,
    #[arg(long, default_value = "120", value_parser = config::parse_duration, help = "Limit for boot plus fabric bring-up")]
    boot_timeout: Duration,
    #[arg(long, value_parser = config::parse_duration, help = "Limit for the job alone, counted from when the fabric is up (e.g. 90, 5m)")]
    job_timeout: Option<Duration>,
    #[arg(
        long,
        help = "Attach a fresh ext4 disk image of this many MiB at /run/lab/disk"
    )]
    disk_mib: Option<u32>,
    #[arg(
        long,
        value_name = "PATH",
        help = "Keep the ext4 disk image at PATH across runs (created with --disk-mib when missing)"
    )]
    disk_image: Option<PathBuf>,
    #[arg(
        long,
        help = "Host directory shared writable at /mnt in the guest [default: target/lab/out]"
    )]
    out: Option<PathBuf>,
    #[arg(
        long = "env",
        value_name = "K=V",
        help = "Extra environment variable for the job (repeatable)"
    )]
    env: Vec<String>,
    #[arg(long, help = "Fail instead of installing missing packages")]
    no_install: bool,
}

#[derive(Args, Debug, Clone)]
struct PerftestArgs {
    #[arg(long, default_value_t = 1, help = "Server host")]
    server: u8,
    #[arg(long, default_value_t = 2, help = "Client host")]
    client: u8,
    #[arg(long, default_value_t = 64, help = "Message size of the latency tests")]
    lat_size: u64,
    #[arg(
        long,
        default_value_t = 4096,
        help = "Message size of the bandwidth test"
    )]
    bw_size: u64,
    #[arg(long, default_value_t = 1000, help = "Iterations per test")]
    iters: u64,
}

#[derive(Subcommand, Debug)]
enum FaultCmd {
    /// Apply netem loss and/or delay to what a host sends.
    Netem {
        #[arg(long)]
        host: u8,
        #[arg(long, default_value_t = 0.0, help = "Loss in percent")]
        loss: f64,
        #[arg(long, default_value_t = 0, help = "Added delay in microseconds")]
        delay_us: u64,
        #[arg(long, default_value_t = 0, help = "Delay jitter in microseconds")]
        jitter_us: u64,
    },
    /// Remove netem from a host.
    Clear {
        #[arg(long)]
        host: u8,
    },
    /// Take a host's link down or up.
    Link {
        #[arg(long)]
        host: u8,
        #[arg(value_parser = ["up", "down"])]
        state: String,
    },
    /// Cut a host's cable (drop all it sends and receives, link stays up), or restore it.
    Cable {
        #[arg(long)]
        host: u8,
        #[arg(value_parser = ["cut", "restore"])]
        state: String,
    },
    /// Drop everything one host sends to another (one direction), or lift that block.
    Block {
        #[arg(long)]
        from: u8,
        #[arg(long)]
        to: u8,
        #[arg(value_parser = ["on", "off"])]
        state: String,
    },
    /// Re-create a host's rxe device (the repair for a QP1 in the error state, after which
    /// rdma_cm on that host is dead); no process may hold the device open.
    Repair {
        #[arg(long)]
        host: u8,
    },
    /// Send kill, stop, cont or term to a process.
    Signal {
        #[arg(value_parser = ["kill", "stop", "cont", "term"])]
        signal: String,
        pid: u32,
    },
}

fn boot_config(b: &BootArgs) -> Result<(LabConfig, Vec<(String, String)>), LabError> {
    let cache = host::default_cache_dir();
    let default_out = match std::env::var_os("RDMALOG_REPO") {
        Some(repo) => PathBuf::from(repo).join("target/lab/out"),
        None => cache.join("out"),
    };
    let (out, ours) = match &b.out {
        Some(o) => (
            std::path::absolute(o).map_err(lab::io_err("cannot resolve --out"))?,
            false,
        ),
        None => (claim_default_out(default_out)?, true),
    };
    let mut cfg = LabConfig::new(out, cache);
    cfg.hosts = b.hosts;
    cfg.mem_mib = b.mem;
    cfg.smp = b.smp;
    cfg.timeout = b.timeout;
    cfg.boot_timeout = b.boot_timeout;
    cfg.job_timeout = b.job_timeout;
    cfg.disk_mib = b.disk_mib;
    cfg.disk_image = b
        .disk_image
        .as_deref()
        .map(std::path::absolute)
        .transpose()
        .map_err(lab::io_err("cannot resolve --disk-image"))?;
    cfg.validate()?;
    if ours {
        // Our own default directory holds only the last run.
        let _ = std::fs::remove_dir_all(&cfg.out_dir);
    }
    std::fs::create_dir_all(&cfg.out_dir).map_err(lab::io_err(format!(
        "cannot create {}",
        cfg.out_dir.display()
    )))?;
    let mut env = Vec::new();
    for kv in &b.env {
        let (k, v) = kv.split_once('=').ok_or_else(|| {
            LabError::Config(format!("--env `{kv}` is not of the form NAME=VALUE"))
        })?;
        if k.is_empty() || !k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(LabError::Config(format!(
                "--env name `{k}` is not a variable name"
            )));
        }
        env.push((k.to_string(), v.to_string()));
    }
    Ok((cfg, env))
}

/// Claims the default result directory for this run. When another live run holds it (its pid
/// is in `<dir>.pid`), this run uses `<dir>-<pid>` instead, so concurrent runs never clobber
/// each other's results.
fn claim_default_out(default_out: PathBuf) -> Result<PathBuf, LabError> {
    let me = std::process::id();
    let pid_file = default_out.with_extension("pid");
    if let Some(parent) = pid_file.parent() {
        std::fs::create_dir_all(parent)
            .map_err(lab::io_err(format!("cannot create {}", parent.display())))?;
    }
    let holder = std::fs::read_to_string(&pid_file)
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .filter(|pid| *pid != me && std::path::Path::new(&format!("/proc/{pid}")).exists());
    if holder.is_some() {
        let mut name = default_out.file_name().unwrap_or_default().to_os_string();
        name.push(format!("-{me}"));
        let alt = default_out.with_file_name(name);
        host::progress(format!(
            "{} is in use by another run; results go to {}",
            default_out.display(),
            alt.display()
        ));
        return Ok(alt);
    }
    std::fs::write(&pid_file, me.to_string())
        .map_err(lab::io_err(format!("cannot write {}", pid_file.display())))?;
    Ok(default_out)
}

fn boot_and_run(b: &BootArgs, job: Job) -> Result<u8, LabError> {
    let (cfg, env) = boot_config(b)?;
    let prepared = host::prepare(&cfg.cache_dir, !b.no_install)?;
    let cwd = std::env::current_dir().map_err(lab::io_err("cannot read the current directory"))?;
    let outcome = host::run(&cfg, &prepared, &job, &env, &cwd)?;
    host::progress(format!(
        "job exited with status {} (kernel {}; results in {})",
        outcome.exit_code,
        prepared.kernel.release,
        cfg.out_dir.display()
    ));
    Ok(u8::try_from(outcome.exit_code).unwrap_or(1))
}

fn perftest_args(pt: &PerftestArgs) -> Vec<String> {
    [
        "--server".to_string(),
        pt.server.to_string(),
        "--client".into(),
        pt.client.to_string(),
        "--lat-size".into(),
        pt.lat_size.to_string(),
        "--bw-size".into(),
        pt.bw_size.to_string(),
        "--iters".into(),
        pt.iters.to_string(),
    ]
    .to_vec()
}

fn guest_perftest(pt: &PerftestArgs) -> Result<u8, LabError> {
    let hosts = guest::hosts()?;
    for h in [pt.server, pt.client] {
        if h == 0 || h > hosts || pt.server == pt.client {
            return Err(LabError::Config(format!(
                "server {} and client {} must be two different hosts in 1..={hosts}",
                pt.server, pt.client
            )));
        }
    }
    eprintln!(
        "perftest: rxe{} <-> rxe{}, {} iterations, latency at {} B, bandwidth at {} B",
        pt.server, pt.client, pt.iters, pt.lat_size, pt.bw_size
    );
    let (summary, raw) =
        perftest::run_baseline(pt.server, pt.client, pt.lat_size, pt.bw_size, pt.iters)?;
    println!("{raw}");
    println!(
        "{:<14} {:>8} {:>16} {:>12} {:>14}",
        "test", "bytes", "t_typical[us]", "p99[us]", "avg[MiB/s]"
    );
    for (name, l) in [
        ("ib_write_lat", summary.write_lat),
        ("ib_send_lat", summary.send_lat),
    ] {
        println!(
            "{name:<14} {:>8} {:>16.2} {:>12.2} {:>14}",
            l.bytes, l.t_typical_us, l.p99_us, "-"
        );
    }
    println!(
        "{:<14} {:>8} {:>16} {:>12} {:>14.2}",
        "ib_write_bw", summary.write_bw.bytes, "-", "-", summary.write_bw.avg_mib_s
    );
    println!("{}", summary.line());
    let out = guest::out_dir()?;
    std::fs::write(out.join("perftest.json"), summary.json() + "\n")
        .map_err(lab::io_err("cannot write perftest.json"))?;
    std::fs::write(out.join("perftest-summary.txt"), summary.line() + "\n")
        .map_err(lab::io_err("cannot write perftest-summary.txt"))?;
    Ok(0)
}

fn info() -> Result<u8, LabError> {
    let hosts = guest::hosts()?;
    println!(
        "{:<6} {:<10} {:<14} {:>9} {:>6}",
        "device", "state", "address", "v2 gid", "qp1"
    );
    for h in 1..=hosts {
        let dev = config::device_name(h);
        let addr = config::host_addr(h);
        let state = guest::port_state(&dev)?;
        let gid = guest::require_gid_index(&dev, addr)?;
        let qp1 = guest::gsi_qp_state(h)?;
        println!(
            "{dev:<6} {state:<10} {:<14} {gid:>9} {qp1:>6}",
            addr.to_string()
        );
    }
    Ok(0)
}

fn fault(cmd: &FaultCmd) -> Result<u8, LabError> {
    match cmd {
        FaultCmd::Netem {
            host,
            loss,
            delay_us,
            jitter_us,
        } => guest::set_netem(
            *host,
            &Netem {
                loss_pct: *loss,
                delay: Duration::from_micros(*delay_us),
                jitter: Duration::from_micros(*jitter_us),
            },
        )?,
        FaultCmd::Clear { host } => guest::clear_netem(*host)?,
        FaultCmd::Link { host, state } => guest::set_link(*host, state == "up")?,
        FaultCmd::Cable { host, state } => guest::cut_cable(*host, state == "cut")?,
        FaultCmd::Block { from, to, state } => {
            if state == "on" {
                guest::block_path(*from, *to)?
            } else {
                guest::unblock_path(*from, *to)?
            }
        }
        FaultCmd::Repair { host } => guest::recreate_device(*host)?,
        FaultCmd::Signal { signal, pid } => {
            let s = match signal.as_str() {
                "kill" => Signal::Kill,
                "stop" => Signal::Stop,
                "cont" => Signal::Cont,
                _ => Signal::Term,
            };
            guest::signal(*pid, s)?
        }
    }
    Ok(0)
}

fn dispatch(cli: Cli) -> Result<u8, LabError> {
    match cli.command {
        Cmd::Setup { no_install } => {
            let cache = host::default_cache_dir();
            let p = host::prepare(&cache, !no_install)?;
            host::progress(format!(
                "ready: kernel {} ({}), initramfs {}",
                p.kernel.release,
                p.kernel.package,
                p.initrd.display()
            ));
            Ok(0)
        }
        Cmd::Run { boot, sh, command } => {
            let job = if sh {
                Job::Script(command.join(" "))
            } else {
                Job::Argv(command)
            };
            boot_and_run(&boot, job)
        }
        Cmd::Perftest { boot, pt } => {
            let exe =
                std::env::current_exe().map_err(lab::io_err("cannot find this executable"))?;
            let mut argv = vec![exe.display().to_string(), "guest-perftest".into()];
            argv.extend(perftest_args(&pt));
            boot_and_run(&boot, Job::Argv(argv))
        }
        Cmd::Fault(f) => fault(&f),
        Cmd::Info => info(),
        Cmd::GuestPerftest { pt } => guest_perftest(&pt),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match dispatch(cli) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("lab: error: {e}");
            ExitCode::from(LAB_FAILURE)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn run_takes_the_command_after_double_dash() {
        let cli =
            Cli::try_parse_from(["lab", "run", "--hosts", "2", "--", "ibv_devices", "-v"]).unwrap();
        match cli.command {
            Cmd::Run { boot, sh, command } => {
                assert_eq!(boot.hosts, 2);
                assert!(!sh);
                assert_eq!(command, ["ibv_devices", "-v"]);
                assert_eq!(boot.timeout, Duration::from_secs(600));
            }
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn run_without_a_command_is_an_error() {
        assert!(Cli::try_parse_from(["lab", "run"]).is_err());
    }

    #[test]
    fn timeouts_accept_units() {
        let cli = Cli::try_parse_from(["lab", "run", "--timeout", "5m", "--", "true"]).unwrap();
        let Cmd::Run { boot, .. } = cli.command else {
            panic!()
        };
        assert_eq!(boot.timeout, Duration::from_secs(300));
        assert!(Cli::try_parse_from(["lab", "run", "--timeout", "soon", "--", "true"]).is_err());
    }

    #[test]
    fn bad_env_and_host_counts_are_refused_before_booting() {
        let cli = Cli::try_parse_from([
            "lab",
            "run",
            "--env",
            "NOEQUALS",
            "--out",
            "/tmp/lab-test-out",
            "--",
            "true",
        ])
        .unwrap();
        let Cmd::Run { boot, .. } = cli.command else {
            panic!()
        };
        assert!(
            boot_config(&boot)
                .unwrap_err()
                .to_string()
                .contains("NAME=VALUE")
        );
        let cli = Cli::try_parse_from([
            "lab",
            "run",
            "--hosts",
            "12",
            "--out",
            "/tmp/lab-test-out",
            "--",
            "true",
        ])
        .unwrap();
        let Cmd::Run { boot, .. } = cli.command else {
            panic!()
        };
        assert!(
            boot_config(&boot)
                .unwrap_err()
                .to_string()
                .contains("hosts")
        );
    }

    #[test]
    fn fault_subcommands_parse() {
        let cli =
            Cli::try_parse_from(["lab", "fault", "netem", "--host", "2", "--loss", "5"]).unwrap();
        assert!(matches!(
            cli.command,
            Cmd::Fault(FaultCmd::Netem { host: 2, .. })
        ));
        let cli = Cli::try_parse_from(["lab", "fault", "link", "--host", "1", "down"]).unwrap();
        assert!(matches!(cli.command, Cmd::Fault(FaultCmd::Link { .. })));
        assert!(Cli::try_parse_from(["lab", "fault", "link", "--host", "1", "sideways"]).is_err());
        assert!(Cli::try_parse_from(["lab", "fault", "signal", "hup", "5"]).is_err());
        let cli = Cli::try_parse_from(["lab", "fault", "repair", "--host", "3"]).unwrap();
        assert!(matches!(
            cli.command,
            Cmd::Fault(FaultCmd::Repair { host: 3 })
        ));
    }

    #[test]
    fn perftest_forwards_its_options_to_the_guest_half() {
        let pt = PerftestArgs {
            server: 1,
            client: 3,
            lat_size: 8,
            bw_size: 65536,
            iters: 10,
        };
        let args = perftest_args(&pt);
        let cli = Cli::try_parse_from(
            ["lab", "guest-perftest"]
                .into_iter()
                .map(String::from)
                .chain(args),
        )
        .unwrap();
        let Cmd::GuestPerftest { pt: parsed } = cli.command else {
            panic!()
        };
        assert_eq!(
            (
                parsed.server,
                parsed.client,
                parsed.lat_size,
                parsed.bw_size,
                parsed.iters
            ),
            (1, 3, 8, 65536, 10)
        );
    }
}
