//! Inside the lab guest: facts about the fabric and fault hooks for tests.
//!
//! Everything here reads sysfs or runs `ip`, `tc` and `kill`, the same tools an operator would
//! use; tests call these functions instead of shelling out themselves, and the
//! `rdmalog-lab fault` subcommand exposes them to scripts.

use std::fs;
use std::io::Read;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use crate::config::{MAX_HOSTS, netdev_name};
use crate::{LabError, Result, io_err};

/// Where the kernel lists RDMA devices.
const SYSFS_IB: &str = "/sys/class/infiniband";

/// Whether this process runs inside the lab guest.
pub fn in_lab() -> bool {
    std::env::var_os("RDMALOG_LAB").is_some_and(|v| v == "1")
}

/// Number of lab hosts, from `RDMALOG_LAB_HOSTS`.
pub fn hosts() -> Result<u8> {
    if !in_lab() {
        return Err(LabError::NotInLab);
    }
    let raw = std::env::var("RDMALOG_LAB_HOSTS").unwrap_or_default();
    match raw.parse::<u8>() {
        Ok(n) if (1..=MAX_HOSTS).contains(&n) => Ok(n),
        _ => Err(LabError::Config(format!(
            "RDMALOG_LAB_HOSTS = `{raw}` is not a host count 1..={MAX_HOSTS}"
        ))),
    }
}

/// The writable directory that comes back to the host.
pub fn out_dir() -> Result<PathBuf> {
    if !in_lab() {
        return Err(LabError::NotInLab);
    }
    Ok(std::env::var_os("RDMALOG_LAB_OUT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/mnt")))
}

/// RDMA device names present, sorted.
pub fn devices() -> Result<Vec<String>> {
    let mut names = Vec::new();
    let dir = match fs::read_dir(SYSFS_IB) {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(names),
        Err(e) => return Err(io_err(format!("cannot list {SYSFS_IB}"))(e)),
    };
    for entry in dir {
        let entry = entry.map_err(io_err(format!("cannot list {SYSFS_IB}")))?;
        names.push(entry.file_name().to_string_lossy().into_owned());
    }
    names.sort();
    Ok(names)
}

/// The state of port 1 of `device`, e.g. `ACTIVE` (sysfs says `4: ACTIVE`).
pub fn port_state(device: &str) -> Result<String> {
    let path = format!("{SYSFS_IB}/{device}/ports/1/state");
    let raw = fs::read_to_string(&path).map_err(io_err(format!("cannot read {path}")))?;
    Ok(parse_port_state(&raw))
}

/// Extracts the name from a sysfs port state (`4: ACTIVE` → `ACTIVE`).
pub fn parse_port_state(raw: &str) -> String {
    raw.trim()
        .split_once(':')
        .map_or(raw.trim(), |(_, name)| name.trim())
        .to_string()
}

/// The textual GID sysfs shows for an IPv4-mapped address.
pub fn ipv4_mapped_gid(addr: Ipv4Addr) -> String {
    let o = addr.octets();
    format!(
        "0000:0000:0000:0000:0000:ffff:{:02x}{:02x}:{:02x}{:02x}",
        o[0], o[1], o[2], o[3]
    )
}

/// One row of a port's GID table: index, GID text, GID type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GidEntry {
    /// GID index.
    pub index: u32,
    /// The GID as sysfs prints it.
    pub gid: String,
    /// `RoCE v2`, `IB/RoCE v1`, ...
    pub kind: String,
}

/// Picks the RoCE v2 GID for `addr` from a GID table. The index differs between devices and
/// kernels, which is why it is chosen by query and never hard-coded.
pub fn find_roce_v2_gid(table: &[GidEntry], addr: Ipv4Addr) -> Option<u32> {
    let want = ipv4_mapped_gid(addr);
    table
        .iter()
        .filter(|e| e.gid == want && e.kind == "RoCE v2")
        .map(|e| e.index)
        .min()
}

/// Reads port 1's GID table of `device` from sysfs, skipping empty entries.
pub fn gid_table(device: &str) -> Result<Vec<GidEntry>> {
    let dir = format!("{SYSFS_IB}/{device}/ports/1/gids");
    let mut table = Vec::new();
    for entry in fs::read_dir(&dir).map_err(io_err(format!("cannot list {dir}")))? {
        let entry = entry.map_err(io_err(format!("cannot list {dir}")))?;
        let Ok(index) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let gid = fs::read_to_string(entry.path())
            .unwrap_or_default()
            .trim()
            .to_string();
        if gid.is_empty() || gid.chars().all(|c| c == '0' || c == ':') {
            continue;
        }
        let kind = fs::read_to_string(format!(
            "{SYSFS_IB}/{device}/ports/1/gid_attrs/types/{index}"
        ))
        .unwrap_or_default()
        .trim()
        .to_string();
        table.push(GidEntry { index, gid, kind });
    }
    table.sort_by_key(|e| e.index);
    Ok(table)
}

/// The RoCE v2 GID index of `device` for `addr`, or an error that says what was there.
pub fn require_gid_index(device: &str, addr: Ipv4Addr) -> Result<u32> {
    let table = gid_table(device)?;
    find_roce_v2_gid(&table, addr).ok_or_else(|| {
        LabError::Guest(format!(
            "{device} has no RoCE v2 GID for {addr}; its GIDs are {:?}",
            table
        ))
    })
}

/// Waits for `child` until `deadline`, collecting its output; kills it past the deadline.
pub fn wait_with_deadline(mut child: Child, deadline: Instant, name: &str) -> Result<Output> {
    let mut stdout = child.stdout.take();
    let mut stderr = child.stderr.take();
    let out_reader = thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(s) = stdout.as_mut() {
            let _ = s.read_to_end(&mut buf);
        }
        buf
    });
    let err_reader = thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(s) = stderr.as_mut() {
            let _ = s.read_to_end(&mut buf);
        }
        buf
    });
    let status = loop {
        if let Some(status) = child
            .try_wait()
            .map_err(io_err(format!("cannot wait for {name}")))?
        {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            // A process stuck in the kernel (state D) ignores SIGKILL: reap it if it goes
            // within a few seconds, and otherwise leave it rather than hang with it.
            let reap_by = Instant::now() + Duration::from_secs(5);
            let mut reaped = false;
            while !reaped && Instant::now() < reap_by {
                reaped = matches!(child.try_wait(), Ok(Some(_)));
                thread::sleep(Duration::from_millis(20));
            }
            return Err(LabError::Command {
                command: name.to_string(),
                detail: if reaped {
                    "did not finish before its deadline and was killed".into()
                } else {
                    format!(
                        "did not finish before its deadline and is stuck in the kernel \
                         (pid {}, unkillable)",
                        child.id()
                    )
                },
            });
        }
        thread::sleep(Duration::from_millis(20));
    };
    Ok(Output {
        status,
        stdout: out_reader.join().unwrap_or_default(),
        stderr: err_reader.join().unwrap_or_default(),
    })
}

fn run_tool(program: &str, args: &[String]) -> Result<()> {
    tool_output(program, args).map(drop)
}

/// Runs `program` (30 s at most) and returns its standard output.
fn tool_output(program: &str, args: &[String]) -> Result<String> {
    let child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(io_err(format!("cannot start {program}")))?;
    let out = wait_with_deadline(child, Instant::now() + Duration::from_secs(30), program)?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(LabError::Command {
            command: format!("{program} {}", args.join(" ")),
            detail: format!(
                "{}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        })
    }
}

/// A netem impairment for one host's link.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Netem {
    /// Packet loss in percent, 0..=100.
    pub loss_pct: f64,
    /// Added one-way delay.
    pub delay: Duration,
    /// Delay jitter.
    pub jitter: Duration,
}

/// How many packets a lab veth's netem qdisc holds before it drops (the kernel's default is
/// 1,000; a dropped packet at the qdisc is a local send error to rxe, see [`netem_args`]).
pub const NETEM_LIMIT: u32 = 10_000;

/// The `tc` arguments that set `dev`'s netem to `netem` (no impairment: pass-through).
///
/// Every lab veth end boots with a pass-through netem as its root qdisc (ops/guest/boot.sh),
/// and the hooks only ever `change` its parameters. Adding, replacing or deleting a root qdisc
/// grafts a new one, and while the kernel swaps them it drops every packet sent (the noop
/// qdisc). rxe turns such a local drop into an error of the sending QP: when the packet was a
/// MAD, the port's QP1 stays in the error state and rdma_cm on that host never connects again
/// (seen in a full lab run after the netem test; reproduced by churning qdiscs under rping
/// traffic). `change` edits the live qdisc in place and drops nothing.
pub fn netem_args(dev: &str, netem: &Netem) -> Result<Vec<String>> {
    if !(0.0..=100.0).contains(&netem.loss_pct) {
        return Err(LabError::Config(format!(
            "netem loss {}% is not a percentage",
            netem.loss_pct
        )));
    }
    let mut args: Vec<String> = ["qdisc", "change", "dev", dev, "root", "netem", "limit"]
        .map(String::from)
        .to_vec();
    args.push(NETEM_LIMIT.to_string());
    if netem.loss_pct > 0.0 {
        args.extend(["loss".into(), format!("{}%", netem.loss_pct)]);
    }
    if !netem.delay.is_zero() {
        args.extend(["delay".into(), format!("{}us", netem.delay.as_micros())]);
        if !netem.jitter.is_zero() {
            args.push(format!("{}us", netem.jitter.as_micros()));
        }
    }
    Ok(args)
}

/// Sets `dev`'s netem, with an error that says what is wrong when the veth has no netem root
/// to change (a lab not booted by ops/guest/boot.sh, or a qdisc someone replaced by hand).
fn change_netem(dev: &str, netem: &Netem) -> Result<()> {
    run_tool("tc", &netem_args(dev, netem)?).map_err(|e| match e {
        LabError::Command { command, detail } => LabError::Command {
            command,
            detail: format!(
                "{detail} (the lab's fault hooks change the pass-through netem qdisc that \
                 ops/guest/boot.sh puts on every veth end; they never add, replace or delete \
                 a root qdisc, because swapping qdiscs drops packets in flight and can leave \
                 rxe's QP1 dead)"
            ),
        },
        other => other,
    })
}

fn check_host(host: u8) -> Result<()> {
    let n = hosts()?;
    if host == 0 || host > n {
        return Err(LabError::Config(format!(
            "host {host} does not exist: this lab has hosts 1..={n}"
        )));
    }
    Ok(())
}

/// Applies loss/delay to everything host `host` sends (its veth's egress).
pub fn set_netem(host: u8, netem: &Netem) -> Result<()> {
    check_host(host)?;
    change_netem(&netdev_name(host), netem)
}

/// Removes any impairment from what host `host` sends (its netem passes everything again).
pub fn clear_netem(host: u8) -> Result<()> {
    check_host(host)?;
    change_netem(&netdev_name(host), &Netem::default())
}

/// Cuts (or restores) host `host`'s cable: every packet it sends and every packet sent to it is
/// dropped (netem loss 100% on both ends of its veth), while the link, its carrier and the rxe
/// port stay up. This is the partition the process-level tests use: taking the link down
/// instead makes rxe fail any MAD sent while the netdev is down, which moves the port's QP1 to
/// the error state for good and leaves rdma_cm on that host dead until the rxe device is
/// re-created (a Soft-RoCE artifact; see README.md, "The lab").
pub fn cut_cable(host: u8, cut: bool) -> Result<()> {
    check_host(host)?;
    let ends = [netdev_name(host), bridge_port_name(host)];
    let netem = Netem {
        loss_pct: if cut { 100.0 } else { 0.0 },
        ..Default::default()
    };
    for dev in &ends {
        change_netem(dev, &netem)?;
    }
    Ok(())
}

/// The bridge end of host `host`'s veth pair.
pub fn bridge_port_name(host: u8) -> String {
    format!("b{host}")
}

/// A root qdisc as `tc qdisc show` prints it (`qdisc netem 8001: root refcnt 2 limit 10000`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RootQdisc {
    /// `netem`, `noqueue`, ...: with the handle, says whether a hook swapped the qdisc.
    pub kind: String,
    /// `8001:`; a new qdisc gets a new one.
    pub handle: String,
    /// The whole line, parameters included: what the qdisc does now.
    pub line: String,
}

impl RootQdisc {
    /// Parses the first line of `tc qdisc show dev DEV root`.
    pub fn parse(line: &str) -> RootQdisc {
        let mut words = line.split_whitespace().skip(1);
        RootQdisc {
            kind: words.next().unwrap_or_default().to_string(),
            handle: words.next().unwrap_or_default().to_string(),
            line: line.trim().to_string(),
        }
    }
}

/// The root qdisc of `dev`.
pub fn root_qdisc(dev: &str) -> Result<RootQdisc> {
    let args: Vec<String> = ["qdisc", "show", "dev", dev, "root"]
        .map(String::from)
        .to_vec();
    let out = tool_output("tc", &args)?;
    Ok(RootQdisc::parse(out.lines().next().unwrap_or_default()))
}

/// Takes host `host`'s link down or up (its rxe port follows). Taking a link down flushes its
/// neighbour table and its policy route, so bringing it up reinstalls both as the lab boots
/// with them (without the neighbours the first host to transmit to an unresolved peer loses
/// its packets; without the route rdma_cm cannot resolve peers).
pub fn set_link(host: u8, up: bool) -> Result<()> {
    check_host(host)?;
    let args: Vec<String> = [
        "link",
        "set",
        &netdev_name(host),
        if up { "up" } else { "down" },
    ]
    .map(String::from)
    .to_vec();
    run_tool("ip", &args)?;
    if up {
        run_tool("ip", &policy_route_args(host))?;
        install_neighbours(host)?;
    }
    Ok(())
}

/// The `ip route` arguments of host `host`'s policy-routing table (`10<host>`), as the lab boots
/// with it (ops/guest/boot.sh). Taking the link down deletes that route, so bringing the link
/// up puts it back; without it rdma_cm cannot resolve a peer's address from that host.
pub fn policy_route_args(host: u8) -> Vec<String> {
    vec![
        "route".into(),
        "replace".into(),
        "192.0.2.0/24".into(),
        "dev".into(),
        netdev_name(host),
        "src".into(),
        crate::config::host_addr(host).to_string(),
        "table".into(),
        format!("10{host}"),
    ]
}

/// A locally administered MAC address no lab host has: frames sent to it reach nobody.
pub const NOWHERE_MAC: &str = "02:00:5e:00:de:ad";

/// The `ip neigh` arguments that make host `from` send its frames for host `to` to `mac`.
pub fn neigh_args(from: u8, to: u8, mac: &str) -> Vec<String> {
    vec![
        "neigh".into(),
        "replace".into(),
        crate::config::host_addr(to).to_string(),
        "lladdr".into(),
        mac.into(),
        "dev".into(),
        netdev_name(from),
        "nud".into(),
        "permanent".into(),
    ]
}

/// Drops everything host `from` sends to host `to` (a one-way partition), until
/// [`unblock_path`]: `from`'s neighbour entry for `to` points at [`NOWHERE_MAC`]. A route
/// cannot do this: rxe routes with its netdev as the output interface, and the kernel then
/// treats a blackhole route as "on link". `to`'s packets to `from` still flow, so the
/// acknowledgements and NAKs of `to`'s own operations arrive.
pub fn block_path(from: u8, to: u8) -> Result<()> {
    check_host(from)?;
    check_host(to)?;
    if from == to {
        return Err(LabError::Config(format!(
            "cannot block host {from} from itself"
        )));
    }
    run_tool("ip", &neigh_args(from, to, NOWHERE_MAC))
}

/// Lifts a [`block_path`] block (restores the real neighbour entry).
pub fn unblock_path(from: u8, to: u8) -> Result<()> {
    check_host(from)?;
    check_host(to)?;
    run_tool("ip", &neigh_args(from, to, &mac_of(to)?))
}

/// Host `host`'s MAC address (its veth's).
fn mac_of(host: u8) -> Result<String> {
    let path = format!("/sys/class/net/{}/address", netdev_name(host));
    let mac = fs::read_to_string(&path).map_err(io_err(format!("cannot read {path}")))?;
    Ok(mac.trim().to_string())
}

/// Installs permanent neighbour entries on host `host`'s veth for every other host.
pub fn install_neighbours(host: u8) -> Result<()> {
    let n = hosts()?;
    for other in (1..=n).filter(|&o| o != host) {
        run_tool("ip", &neigh_args(host, other, &mac_of(other)?))?;
    }
    Ok(())
}

/// The state of QP1 (the GSI QP that carries rdma_cm's MADs) of `device`, from an
/// `rdma res show qp` listing; `None` when the listing has no QP1 for it.
pub fn parse_gsi_state(listing: &str, device: &str) -> Option<String> {
    let link = format!("{device}/1");
    listing.lines().find_map(|line| {
        let words: Vec<&str> = line.split_whitespace().collect();
        let field = |name: &str| {
            words
                .iter()
                .position(|w| *w == name)
                .and_then(|i| words.get(i + 1))
                .copied()
        };
        if field("link") == Some(link.as_str()) && field("lqpn") == Some("1") {
            field("state").map(str::to_string)
        } else {
            None
        }
    })
}

/// The state of host `host`'s QP1 (`RTS` when its rdma_cm can talk). Soft-RoCE moves QP1 to
/// `ERR` for good when sending a MAD fails locally (a link taken down, a packet dropped by the
/// host's own qdisc), and from then on nothing connects to or from that host until its rxe
/// device is re-created ([`recreate_device`]).
pub fn gsi_qp_state(host: u8) -> Result<String> {
    check_host(host)?;
    let dev = crate::config::device_name(host);
    let listing = tool_output("rdma", &["res".into(), "show".into(), "qp".into()])?;
    parse_gsi_state(&listing, &dev)
        .ok_or_else(|| LabError::Guest(format!("`rdma res show qp` lists no QP1 for {dev}")))
}

/// How many packets host `host`'s rxe failed to hand to its netdev (its `send_err` counter).
pub fn send_errors(host: u8) -> Result<u64> {
    check_host(host)?;
    let path = format!(
        "{SYSFS_IB}/{}/ports/1/hw_counters/send_err",
        crate::config::device_name(host)
    );
    let raw = fs::read_to_string(&path).map_err(io_err(format!("cannot read {path}")))?;
    raw.trim()
        .parse()
        .map_err(|_| LabError::Guest(format!("{path} holds `{}`, not a count", raw.trim())))
}

/// Deletes and re-adds host `host`'s rxe device on its veth, then waits (15 s at most) until
/// its port is `ACTIVE` with its RoCE v2 GID, as the lab boots it. This is the only repair for
/// a QP1 in the error state. No process may hold the device open: the kernel waits for every
/// user of a device being removed, so call it between tests, never under running nodes.
pub fn recreate_device(host: u8) -> Result<()> {
    check_host(host)?;
    let dev = crate::config::device_name(host);
    let holders = device_holders(&dev)?;
    if !holders.is_empty() {
        return Err(LabError::Guest(format!(
            "cannot re-create {dev}: processes {holders:?} hold it open, and the kernel would \
             wait for them to exit (librdmacm opens every device in a process that used \
             rdma_cm, until that process exits)"
        )));
    }
    run_tool("rdma", &["link".into(), "delete".into(), dev.clone()])?;
    run_tool(
        "rdma",
        &[
            "link".into(),
            "add".into(),
            dev.clone(),
            "type".into(),
            "rxe".into(),
            "netdev".into(),
            netdev_name(host),
        ],
    )?;
    let addr = crate::config::host_addr(host);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let state = port_state(&dev).unwrap_or_default();
        if state == "ACTIVE" && require_gid_index(&dev, addr).is_ok() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(LabError::Guest(format!(
                "re-created {dev} on {}, but its port is `{state}` without a RoCE v2 GID \
                 for {addr} after 15 s",
                netdev_name(host)
            )));
        }
        thread::sleep(Duration::from_millis(100));
    }
}

/// The processes holding `device` open: those with an fd on its `/dev/infiniband/uverbsN`.
pub fn device_holders(device: &str) -> Result<Vec<u32>> {
    let class = "/sys/class/infiniband_verbs";
    let mut node = None;
    for entry in fs::read_dir(class).map_err(io_err(format!("cannot list {class}")))? {
        let entry = entry.map_err(io_err(format!("cannot list {class}")))?;
        let ibdev = fs::read_to_string(entry.path().join("ibdev")).unwrap_or_default();
        if ibdev.trim() == device {
            node = Some(format!(
                "/dev/infiniband/{}",
                entry.file_name().to_string_lossy()
            ));
        }
    }
    let Some(node) = node else {
        return Ok(Vec::new());
    };
    let mut pids = Vec::new();
    for proc_entry in fs::read_dir("/proc").map_err(io_err("cannot list /proc"))? {
        let Ok(proc_entry) = proc_entry else { continue };
        let Ok(pid) = proc_entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(fds) = fs::read_dir(proc_entry.path().join("fd")) else {
            continue; // gone, or not ours to read
        };
        let holds = fds
            .flatten()
            .any(|fd| fs::read_link(fd.path()).is_ok_and(|t| t.as_os_str() == node.as_str()));
        if holds {
            pids.push(pid);
        }
    }
    pids.sort_unstable();
    Ok(pids)
}

/// Checks every host's QP1 and re-creates the rxe device of each host whose QP1 is not `RTS`,
/// saying so on stderr; returns the hosts it repaired. Test harnesses call it before they
/// start processes, so a Soft-RoCE artifact left by one test cannot fail the tests after it
/// (the run still shows it). Same precondition as [`recreate_device`].
pub fn repair_dead_rdma_cm() -> Result<Vec<u8>> {
    let mut repaired = Vec::new();
    for host in 1..=hosts()? {
        let state = gsi_qp_state(host)?;
        if state == "RTS" {
            continue;
        }
        eprintln!(
            "lab: {}'s QP1 is in state {state}, so rdma_cm on host {host} can neither connect \
             nor accept; re-creating the device",
            crate::config::device_name(host)
        );
        recreate_device(host)?;
        repaired.push(host);
    }
    Ok(repaired)
}

/// A signal a fault hook sends to a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// SIGKILL: crash.
    Kill,
    /// SIGSTOP: pause, like a long GC; the NIC keeps acking one-sided writes.
    Stop,
    /// SIGCONT: resume a stopped process.
    Cont,
    /// SIGTERM: ask to shut down.
    Term,
}

impl Signal {
    /// The name `kill -s` takes.
    pub fn name(self) -> &'static str {
        match self {
            Signal::Kill => "KILL",
            Signal::Stop => "STOP",
            Signal::Cont => "CONT",
            Signal::Term => "TERM",
        }
    }
}

/// Sends `signal` to process `pid`.
pub fn signal(pid: u32, signal: Signal) -> Result<()> {
    if pid <= 1 {
        return Err(LabError::Config(format!("refusing to signal pid {pid}")));
    }
    run_tool(
        "kill",
        &["-s".into(), signal.name().into(), pid.to_string()],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_route_matches_boot() {
        assert_eq!(
            policy_route_args(3).join(" "),
            "route replace 192.0.2.0/24 dev v3 src 192.0.2.13 table 103"
        );
    }

    #[test]
    fn a_block_points_the_senders_neighbour_entry_nowhere() {
        assert_eq!(
            neigh_args(2, 1, NOWHERE_MAC).join(" "),
            "neigh replace 192.0.2.11 lladdr 02:00:5e:00:de:ad dev v2 nud permanent"
        );
    }

    #[test]
    fn port_state_names_are_extracted() {
        assert_eq!(parse_port_state("4: ACTIVE\n"), "ACTIVE");
        assert_eq!(parse_port_state("1: DOWN"), "DOWN");
        assert_eq!(parse_port_state("weird"), "weird");
    }

    #[test]
    fn ipv4_mapped_gid_matches_sysfs_text() {
        assert_eq!(
            ipv4_mapped_gid(Ipv4Addr::new(192, 0, 2, 11)),
            "0000:0000:0000:0000:0000:ffff:c000:020b"
        );
    }

    #[test]
    fn roce_v2_gid_is_chosen_by_type_and_address() {
        let addr = Ipv4Addr::new(192, 0, 2, 12);
        let mapped = ipv4_mapped_gid(addr);
        let table = vec![
            GidEntry {
                index: 0,
                gid: "fe80:0000:0000:0000:1c6d:0eff:fef6:bc0d".into(),
                kind: "IB/RoCE v1".into(),
            },
            GidEntry {
                index: 2,
                gid: mapped.clone(),
                kind: "IB/RoCE v1".into(),
            },
            GidEntry {
                index: 3,
                gid: mapped.clone(),
                kind: "RoCE v2".into(),
            },
            GidEntry {
                index: 5,
                gid: ipv4_mapped_gid(Ipv4Addr::new(192, 0, 2, 11)),
                kind: "RoCE v2".into(),
            },
        ];
        assert_eq!(find_roce_v2_gid(&table, addr), Some(3));
        assert_eq!(find_roce_v2_gid(&table, Ipv4Addr::new(10, 0, 0, 1)), None);
    }

    #[test]
    fn a_root_qdisc_line_gives_kind_handle_and_parameters() {
        let q = RootQdisc::parse("qdisc netem 8003: root refcnt 3 limit 10000 loss 5%\n");
        assert_eq!((q.kind.as_str(), q.handle.as_str()), ("netem", "8003:"));
        assert!(q.line.ends_with("loss 5%"));
        assert_eq!(RootQdisc::parse("").kind, "");
    }

    #[test]
    fn the_gsi_state_is_read_per_device() {
        let listing = "link rxe1/1 lqpn 1 type GSI state ERR sq-psn 160 comm [ib_core] \n\
                       link rxe1/1 lqpn 17 type RC state RTS rq-psn 1 sq-psn 9 pid 7 comm x\n\
                       link rxe2/1 lqpn 1 type GSI state RTS sq-psn 121 comm [ib_core] \n";
        assert_eq!(parse_gsi_state(listing, "rxe1").as_deref(), Some("ERR"));
        assert_eq!(parse_gsi_state(listing, "rxe2").as_deref(), Some("RTS"));
        assert_eq!(parse_gsi_state(listing, "rxe3"), None);
    }

    #[test]
    fn netem_arguments_are_built_and_checked() {
        let n = Netem {
            loss_pct: 5.0,
            delay: Duration::from_millis(2),
            jitter: Duration::from_micros(500),
        };
        assert_eq!(
            netem_args("v2", &n).unwrap().join(" "),
            "qdisc change dev v2 root netem limit 10000 loss 5% delay 2000us 500us"
        );
        let loss_only = Netem {
            loss_pct: 1.0,
            ..Netem::default()
        };
        assert_eq!(
            netem_args("v1", &loss_only).unwrap().join(" "),
            "qdisc change dev v1 root netem limit 10000 loss 1%"
        );
        assert_eq!(
            netem_args("b3", &Netem::default()).unwrap().join(" "),
            "qdisc change dev b3 root netem limit 10000",
            "no impairment is the pass-through the lab boots with"
        );
        let bad = Netem {
            loss_pct: 150.0,
            ..Netem::default()
        };
        assert!(netem_args("v1", &bad).is_err());
    }

    #[test]
    fn guest_only_calls_refuse_outside_the_lab() {
        if in_lab() {
            return; // The same binary also runs inside the guest, where these calls are legal.
        }
        assert!(matches!(hosts(), Err(LabError::NotInLab)));
        assert!(matches!(set_link(1, false), Err(LabError::NotInLab)));
        assert!(matches!(out_dir(), Err(LabError::NotInLab)));
    }

    #[test]
    fn signalling_init_is_refused() {
        assert!(signal(1, Signal::Kill).is_err());
        assert_eq!(Signal::Stop.name(), "STOP");
    }

    #[test]
    fn a_stuck_child_is_killed_at_its_deadline() {
        let child = Command::new("sleep")
            .arg("30")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let t = Instant::now();
        let err = wait_with_deadline(child, Instant::now() + Duration::from_millis(200), "sleep")
            .unwrap_err();
        assert!(t.elapsed() < Duration::from_secs(10));
        assert!(err.to_string().contains("deadline"), "{err}");
    }
}
