//! Lab test: three `rdmalog-server` processes over Soft-RoCE, and again over TCP (one per lab host), driven by the
//! `rdmalog` CLI as a user would: append, tail -f, status; the leader is killed with kill -9
//! and the CLI carries on through the redirect to the new leader; the old leader restarts and
//! catches up; a SIGINT (one) and SIGTERM (the others) stop every server cleanly; `rdmalog
//! check` passes on every data dir.
//!
//! Runs inside the lab (`ops/test` runs every `lab_*` binary with `--ignored`). The CLI binary
//! is the workspace's `rdmalog`, found beside this test's executable.
//!
//! The scenario lives in `common/servers.rs`; `tcp_server.rs` runs it on the host over TCP.

mod common;

use common::servers::{Place, three_servers_serve_the_cli_through_a_leader_crash as scenario};

#[test]
#[ignore = "lab: needs the Soft-RoCE lab; ops/test runs it"]
fn three_servers_serve_the_cli_through_a_leader_crash() {
    scenario(Place::LAB_RDMA);
}

#[test]
#[ignore = "lab: needs the Soft-RoCE lab; ops/test runs it"]
fn tcp_three_servers_serve_the_cli_through_a_leader_crash() {
    scenario(Place::LAB_TCP);
}
