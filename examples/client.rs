//! The client library in a few lines: connect to a cluster, append a batch, read it back.
//!
//! Run against a plain-TCP cluster (the cluster id defaults to 0x1):
//!
//! ```text
//! cargo run -p client --example client -- [--cluster-id 0xc1] 10.0.0.1:7000 10.0.0.2:7000
//! ```
//!
//! Any member's address will do; the client follows redirects to the leader. For TLS and
//! tokens see `client::ClientConfig` (or use the `rdmalog` command line tool).

use std::time::Duration;

use client::{Client, ClientConfig};

fn parse_id(s: &str) -> Result<u64, std::num::ParseIntError> {
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => s.parse(),
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut cluster_id = 1;
    let mut servers = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--cluster-id" {
            let v = args.next().ok_or("--cluster-id needs a value")?;
            cluster_id = parse_id(&v)?;
        } else {
            servers.push(a);
        }
    }
    if servers.is_empty() {
        return Err("usage: client [--cluster-id ID] HOST:PORT...".into());
    }

    let mut cfg = ClientConfig::new(servers, cluster_id);
    cfg.deadline = Duration::from_secs(10);
    let mut c = Client::connect(cfg)?;
    if let Some((node, addr, role)) = c.connected_to() {
        println!("connected to node {node} at {addr} as {}", role.name());
    }

    let batch: [&[u8]; 3] = [b"hello", b"from the", b"client example"];
    let (first, last) = c.append(&batch)?;
    println!("appended {} entries at {first}..={last}", batch.len());

    let (entries, commit) = c.read(first, 1 << 20)?;
    for e in entries.iter().filter(|e| e.index <= last) {
        println!("{}\t{}", e.index, String::from_utf8_lossy(&e.data));
    }
    println!("commit index {commit}");

    let s = c.status()?;
    println!(
        "node {} is {} in term {}; leader {:?}",
        s.node.id,
        s.node.role,
        s.node.term,
        s.leader.map(|l| l.id)
    );
    Ok(())
}
