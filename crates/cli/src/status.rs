//! `rdmalog status`: every member's state as a table or JSON.

use std::io::Write;

use anyhow::Context;
use client::{Client, ClientError, StatusReport};
use proto::NodeInfo;
use serde_json::{Value, json};

/// `bytes` in B, KiB, MiB or GiB.
fn human(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut v = bytes as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

fn ring_pct(r: &StatusReport) -> Option<f64> {
    (r.node.ring_bytes > 0)
        .then(|| r.node.ring_used_bytes as f64 * 100.0 / r.node.ring_bytes as f64)
}

/// One member and what it answered.
struct Member {
    info: NodeInfo,
    result: Result<StatusReport, ClientError>,
}

/// The cluster as the members describe it.
struct View {
    members: Vec<Member>,
    /// The leader: the reachable member that says it leads (the highest term wins), else the
    /// one the connected node names.
    leader: Option<NodeInfo>,
    /// The leader's commit index, when it answered.
    leader_commit: Option<u64>,
    leader_term: Option<u64>,
}

fn gather(client: &mut Client) -> anyhow::Result<View> {
    let me = client.status().context("status")?;
    let infos = if me.members.is_empty() {
        vec![NodeInfo {
            id: me.node.id,
            client_addr: me.addr.clone(),
        }]
    } else {
        me.members.clone()
    };
    let results = client.member_statuses(&infos);
    let members: Vec<Member> = infos
        .into_iter()
        .zip(results)
        .map(|(info, result)| {
            // The connected node answered already, if its second connection failed.
            let result = match result {
                Err(_) if info.client_addr == me.addr => Ok(me.clone()),
                r => r,
            };
            Member { info, result }
        })
        .collect();
    let leading = members
        .iter()
        .filter_map(|m| m.result.as_ref().ok())
        .filter(|r| r.node.role == "leader")
        .max_by_key(|r| r.node.term);
    let leader = match leading {
        Some(r) => members
            .iter()
            .find(|m| m.info.id == r.node.id)
            .map(|m| m.info.clone()),
        None => me.leader.clone(),
    };
    Ok(View {
        leader_commit: leading.map(|r| r.node.commit),
        leader_term: leading.map(|r| r.node.term),
        leader,
        members,
    })
}

pub(crate) fn run(client: &mut Client, json: bool, out: &mut impl Write) -> anyhow::Result<()> {
    let view = gather(client)?;
    if json {
        serde_json::to_writer_pretty(&mut *out, &to_json(&view))?;
        writeln!(out)?;
    } else {
        table(&view, out)?;
    }
    Ok(())
}

fn lag(view: &View, r: &StatusReport) -> Option<u64> {
    view.leader_commit.map(|c| c.saturating_sub(r.node.commit))
}

fn to_json(view: &View) -> Value {
    let members: Vec<Value> = view
        .members
        .iter()
        .map(|m| match &m.result {
            Ok(r) => {
                let n = &r.node;
                json!({
                    "id": m.info.id,
                    "addr": m.info.client_addr,
                    "reachable": true,
                    "role": n.role,
                    "term": n.term,
                    "commit": n.commit,
                    "applied": n.applied,
                    "lag": lag(view, r),
                    "first_index": n.first_index,
                    "last_index": n.last_index,
                    "ring_used_bytes": n.ring_used_bytes,
                    "ring_bytes": n.ring_bytes,
                    "ring_used_pct": ring_pct(r),
                    "fenced_writes": n.fenced_writes,
                    "leader": r.leader.as_ref().map(|l| l.id),
                    "peers": n.peers.iter().map(|(id, matched, state)| json!({
                        "id": id,
                        "matched": matched,
                        "state": state,
                    })).collect::<Vec<_>>(),
                })
            }
            Err(e) => json!({
                "id": m.info.id,
                "addr": m.info.client_addr,
                "reachable": false,
                "error": e.to_string(),
            }),
        })
        .collect();
    json!({
        "leader": view.leader.as_ref().map(|l| l.id),
        "leader_addr": view.leader.as_ref().map(|l| l.client_addr.clone()),
        "term": view.leader_term,
        "members": members,
    })
}

fn table(view: &View, out: &mut impl Write) -> std::io::Result<()> {
    let mut rows: Vec<Vec<String>> = vec![
        [
            "node", "address", "role", "term", "commit", "applied", "lag", "ring", "fenced",
            "peers",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
    ];
    for m in &view.members {
        let mut row = vec![m.info.id.to_string(), m.info.client_addr.clone()];
        match &m.result {
            Ok(r) => {
                let n = &r.node;
                let ring = match ring_pct(r) {
                    Some(p) => format!(
                        "{}/{} ({p:.0}%)",
                        human(n.ring_used_bytes),
                        human(n.ring_bytes)
                    ),
                    None => "-".into(),
                };
                let peers: Vec<String> = n
                    .peers
                    .iter()
                    .map(|(id, _, state)| format!("{id}:{state}"))
                    .collect();
                row.extend([
                    n.role.clone(),
                    n.term.to_string(),
                    n.commit.to_string(),
                    n.applied.to_string(),
                    lag(view, r).map_or_else(|| "-".into(), |l| l.to_string()),
                    ring,
                    n.fenced_writes.to_string(),
                    if peers.is_empty() {
                        "-".into()
                    } else {
                        peers.join(" ")
                    },
                ]);
            }
            Err(e) => {
                row.push("unreachable".into());
                row.extend((0..6).map(|_| "-".to_string()));
                row.push(e.to_string());
            }
        }
        rows.push(row);
    }
    let cols = rows[0].len();
    let widths: Vec<usize> = (0..cols)
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    for row in &rows {
        let mut line = String::new();
        for (c, cell) in row.iter().enumerate() {
            if c + 1 == cols {
                line.push_str(cell);
            } else {
                line.push_str(cell);
                line.extend(std::iter::repeat_n(
                    ' ',
                    widths[c] - cell.chars().count() + 2,
                ));
            }
        }
        writeln!(out, "{}", line.trim_end())?;
    }
    match (&view.leader, view.leader_term) {
        (Some(l), Some(t)) => {
            writeln!(out, "leader: node {} at {} (term {t})", l.id, l.client_addr)
        }
        (Some(l), None) => writeln!(
            out,
            "leader: node {} at {} (named by the node asked; it did not answer)",
            l.id, l.client_addr
        ),
        (None, _) => writeln!(
            out,
            "leader: none known (an election may be under way, or a majority is unreachable)"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::human;

    #[test]
    fn sizes_read_well() {
        assert_eq!(human(512), "512 B");
        assert_eq!(human(2 << 20), "2.0 MiB");
        assert_eq!(human(1536), "1.5 KiB");
    }
}
