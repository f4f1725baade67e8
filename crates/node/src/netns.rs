//! Hosts without the lab: one network namespace per node on this machine, joined by a bridge,
//! so that TCP clusters meet network faults without QEMU (issue 15).
//!
//! Node `i` lives in namespace `<tag>h<i>` with two veth links: `eth0` (`10.<s>.0.<i>`) on the
//! data bridge, which faults touch, and `ctl0` (`10.<s>.1.<i>`) on a control bridge that also
//! holds this namespace's `10.<s>.1.254`, so the test reaches every node's driver port however
//! the data network is broken. Faults: a one-way block (the sender's neighbour entry for the
//! receiver points at a MAC nobody has, as in the lab) and a cable cut (the data veth's bridge
//! end goes down), and packet loss: every receiver's netfilter drops a random share of what
//! the sender's data address sends it (`iptables -m statistic`, Debian's iptables), so the
//! sender's TCP meets loss on the wire, not a local send error. Added delay needs `sch_netem`,
//! which not every host kernel has; the lab has it.

use std::net::Ipv4Addr;
use std::process::Command;

use anyhow::{Context, bail};

/// A MAC no host has: frames sent to it reach nobody.
const NOWHERE_MAC: &str = "02:00:5e:00:de:ad";

/// The namespaces, links and bridges of one cluster; dropping it removes them all.
#[derive(Debug)]
pub struct Netns {
    tag: String,
    subnet: u8,
    nodes: u8,
}

fn ip(args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .context("running ip (Debian's iproute2)")?;
    if !out.status.success() {
        bail!(
            "ip {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

impl Netns {
    /// Creates `nodes` namespaces on a fresh bridge pair. Needs root. Names and the subnet
    /// come from this process's id, so concurrent test processes do not meet.
    pub fn create(nodes: u8) -> anyhow::Result<Netns> {
        // The kernel removes a deleted namespace's links in the background, so a name is
        // never reused within a process: a counter follows the process id.
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let k = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let pid = std::process::id();
        let n = Netns {
            tag: format!("rl{}x{}", pid % 100_000, k % 100),
            subnet: 100 + ((pid + k) % 150) as u8,
            nodes,
        };
        n.build().with_context(|| {
            format!(
                "creating {nodes} network namespaces (needs root and iproute2): {}",
                n.tag
            )
        })?;
        Ok(n)
    }

    fn build(&self) -> anyhow::Result<()> {
        let (db, cb) = (self.data_bridge(), self.ctl_bridge());
        ip(&["link", "add", &db, "type", "bridge"])?;
        ip(&["link", "set", &db, "up"])?;
        ip(&["link", "add", &cb, "type", "bridge"])?;
        ip(&[
            "addr",
            "add",
            &format!("10.{}.1.254/24", self.subnet),
            "dev",
            &cb,
        ])?;
        ip(&["link", "set", &cb, "up"])?;
        for i in 1..=self.nodes {
            let ns = self.ns(u64::from(i));
            ip(&["netns", "add", &ns])?;
            for (end, inner, bridge, net) in [
                (self.data_link(i), "eth0", &db, 0),
                (format!("{}c{i}", self.tag), "ctl0", &cb, 1),
            ] {
                ip(&[
                    "link", "add", &end, "type", "veth", "peer", "name", inner, "netns", &ns,
                ])?;
                ip(&["link", "set", &end, "master", bridge, "up"])?;
                ip(&[
                    "-n",
                    &ns,
                    "addr",
                    "add",
                    &format!("10.{}.{net}.{i}/24", self.subnet),
                    "dev",
                    inner,
                ])?;
                ip(&["-n", &ns, "link", "set", inner, "up"])?;
            }
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        }
        Ok(())
    }

    fn data_bridge(&self) -> String {
        format!("{}db", self.tag)
    }

    fn ctl_bridge(&self) -> String {
        format!("{}cb", self.tag)
    }

    fn data_link(&self, i: u8) -> String {
        format!("{}d{i}", self.tag)
    }

    fn host(i: u64) -> u8 {
        u8::try_from(i).expect("node ids of a namespace cluster are small")
    }

    /// Node `i`'s namespace.
    pub fn ns(&self, i: u64) -> String {
        format!("{}h{i}", self.tag)
    }

    /// Node `i`'s address on the data network (replication).
    pub fn data_ip(&self, i: u64) -> Ipv4Addr {
        Ipv4Addr::new(10, self.subnet, 0, Self::host(i))
    }

    /// Node `i`'s address on the control network (its driver port).
    pub fn ctl_ip(&self, i: u64) -> Ipv4Addr {
        Ipv4Addr::new(10, self.subnet, 1, Self::host(i))
    }

    /// A command that runs `program` inside node `i`'s namespace (`ip netns exec` execs it, so
    /// the child's pid is the program's).
    pub fn command(&self, i: u64, program: &std::path::Path) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns(i)]).arg(program);
        c
    }

    /// Drops what node `from` sends to node `to` (`block`) or lets it through again.
    pub fn block(&self, from: u64, to: u64, block: bool) -> anyhow::Result<()> {
        let mac = if block {
            NOWHERE_MAC.to_string()
        } else {
            self.mac(to)?
        };
        ip(&[
            "-n",
            &self.ns(from),
            "neigh",
            "replace",
            &self.data_ip(to).to_string(),
            "lladdr",
            &mac,
            "dev",
            "eth0",
            "nud",
            "permanent",
        ])
    }

    /// Cuts node `i`'s data cable (`cut`) or restores it.
    pub fn cut_cable(&self, i: u64, cut: bool) -> anyhow::Result<()> {
        ip(&[
            "link",
            "set",
            &self.data_link(Self::host(i)),
            if cut { "down" } else { "up" },
        ])
    }

    fn mac(&self, i: u64) -> anyhow::Result<String> {
        let out = Command::new("ip")
            .args(["-n", &self.ns(i), "-o", "link", "show", "eth0"])
            .output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        text.split_whitespace()
            .skip_while(|w| *w != "link/ether")
            .nth(1)
            .map(str::to_string)
            .with_context(|| format!("no MAC address for node {i}'s eth0 in {text:?}"))
    }

    /// Drops `loss_pct` percent (0..=100) of the packets node `from` sends on the data
    /// network, at every other node's input (`on`), or stops dropping them (`!on`, with the
    /// same `loss_pct`). Needs Debian's iptables and the kernel's `xt_statistic`.
    pub fn loss(&self, from: u64, loss_pct: f64, on: bool) -> anyhow::Result<()> {
        if !(0.0..=100.0).contains(&loss_pct) {
            bail!("packet loss must be 0..=100 %, not {loss_pct}");
        }
        let probability = format!("{:.6}", loss_pct / 100.0);
        let source = self.data_ip(from).to_string();
        let comment = format!("rdmalog-loss-from-{from}");
        for to in (1..=u64::from(self.nodes)).filter(|&to| to != from) {
            let ns = self.ns(to);
            let mut args = vec!["netns", "exec", &ns, "iptables", "-w"];
            args.push(if on { "-A" } else { "-D" });
            args.extend([
                "INPUT",
                "-i",
                "eth0",
                "-s",
                &source,
                "-m",
                "statistic",
                "--mode",
                "random",
                "--probability",
                &probability,
                "-m",
                "comment",
                "--comment",
                &comment,
                "-j",
                "DROP",
            ]);
            ip(&args).context("dropping packets with iptables (`ops/install-deps` installs it)")?;
        }
        Ok(())
    }

    /// Packets of node `from` that [`Netns::loss`] has dropped so far, at every receiver.
    pub fn dropped(&self, from: u64) -> anyhow::Result<u64> {
        let comment = format!("rdmalog-loss-from-{from}");
        let mut total = 0;
        for to in (1..=u64::from(self.nodes)).filter(|&to| to != from) {
            let out = Command::new("ip")
                .args(["netns", "exec", &self.ns(to), "iptables", "-w"])
                .args(["-L", "INPUT", "-v", "-x", "-n"])
                .output()
                .context("reading iptables counters")?;
            let text = String::from_utf8_lossy(&out.stdout);
            for line in text.lines().filter(|l| l.contains(&comment)) {
                let pkts = line.split_whitespace().next().unwrap_or("0");
                total += pkts
                    .parse::<u64>()
                    .with_context(|| format!("an iptables counter line: {line:?}"))?;
            }
        }
        Ok(total)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        for i in 1..=self.nodes {
            let _ = ip(&["netns", "del", &self.ns(u64::from(i))]);
        }
        let _ = ip(&["link", "del", &self.data_bridge()]);
        let _ = ip(&["link", "del", &self.ctl_bridge()]);
    }
}
