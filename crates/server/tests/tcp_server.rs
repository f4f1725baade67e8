//! Host test: three `rdmalog-server` processes with `transport = "tcp"` on this host's
//! loopback (`127.0.1.1-3`), no RDMA and no lab, driven by the `rdmalog` CLI as a user would:
//! append, tail -f, status, kill -9 of the leader with the CLI carrying on through the
//! redirect, the old leader's restart and catch-up, `rdmalog bench`, SIGINT of one server and
//! SIGTERM of the others, and `rdmalog check` of every data dir. The same scenario runs over RDMA and TCP in the lab
//! (`lab_server.rs`). With `[peer_tls]` the same scenario runs with TLS on every peer link.
//! Under `memory` durability, a follower whose ring was lost shows `recovering` in
//! `rdmalog status`, `/status` and `rdmalog_recovering` until it caught up.

mod common;

use common::servers::{
    Place, a_node_that_lost_its_ring_shows_recovering,
    three_servers_serve_the_cli_through_a_leader_crash as scenario,
};

#[test]
fn three_tcp_servers_serve_the_cli_through_a_leader_crash() {
    scenario(Place::HOST_TCP);
}

#[test]
fn three_tcp_servers_with_peer_tls_serve_the_cli_through_a_leader_crash() {
    scenario(Place::HOST_TCP_TLS);
}

#[test]
fn a_node_that_lost_its_ring_shows_recovering_in_status_and_metrics() {
    a_node_that_lost_its_ring_shows_recovering(Place::HOST_TCP_MEMORY);
}
