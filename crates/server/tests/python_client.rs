//! Host test: the Python client (`clients/python`, written from docs/PROTOCOL.md alone) against
//! three real `rdmalog-server` processes over TCP on loopback. First its codec against the test
//! vectors (`docs/protocol-vectors.json`); then its cluster tests in two phases: before, it
//! appends starting from each server (following redirects from the followers), reads, tails and
//! asks for the status; this test then kills the leader with kill -9; after, it appends through
//! the new leader and finds every entry it had acknowledged before, unchanged at its index.
//! Needs `python3` (the standard library only).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::servers::{Place, start_three};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs `python3 -m unittest -v <tests>` in `clients/python` with `env`, printing its output;
/// fails unless it passed, ran at least one test and skipped none.
fn unittest(tests: &str, env: &[(&str, String)]) -> String {
    let out = Command::new("python3")
        .current_dir(repo().join("clients/python"))
        .args(["-m", "unittest", "-v", tests])
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .expect("python3 (ops/install-deps installs it)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("$ python3 -m unittest {tests}\n{text}");
    assert!(out.status.success(), "the Python tests failed:\n{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("Ran ") && !l.starts_with("Ran 0 ")),
        "no Python test ran:\n{text}"
    );
    assert!(
        !text.contains("skipped"),
        "a Python test was skipped:\n{text}"
    );
    text
}

#[test]
fn the_python_client_speaks_the_protocol_to_a_three_server_cluster() {
    unittest("test_vectors", &[]);

    const PY_TCP: Place = Place {
        base: 12700,
        ..Place::HOST_TCP
    };
    let mut s = start_three(PY_TCP);
    let leader = s.leader(3);
    println!("leader: node {leader}");
    let env = |phase: &str| {
        vec![
            ("RDMALOG_SERVERS", s.client_addrs()),
            ("RDMALOG_CLUSTER_ID", s.cluster_id().to_string()),
            ("RDMALOG_PHASE", phase.to_string()),
            (
                "RDMALOG_STATE",
                s.dir().join("python-state.json").display().to_string(),
            ),
        ]
    };
    let (env_before, env_after) = (env("before"), env("after"));
    let before = unittest("test_cluster.ClusterTest.test_before", &env_before);
    assert!(before.contains("phase before"), "{before}");

    s.kill(leader);
    println!("injected: kill -9 of the leader, node {leader}");
    let after = unittest("test_cluster.ClusterTest.test_after", &env_after);
    assert!(after.contains("phase after"), "{after}");
}

/// The Python client over TLS (`tls=True`, the cluster's CA): appends, reads back and status,
/// and a plaintext client refused with the error that names TLS (test_cluster.py, `test_tls`).
#[test]
fn the_python_client_speaks_tls_to_a_three_server_cluster() {
    const PY_TLS: Place = Place {
        base: 15700,
        client_tls: true,
        ..Place::HOST_TCP
    };
    let s = start_three(PY_TLS);
    let leader = s.leader(3);
    println!("leader: node {leader}");
    let ca = s.client_ca().expect("a client CA");
    let out = unittest(
        "test_cluster.ClusterTest.test_tls",
        &[
            ("RDMALOG_SERVERS", s.client_addrs()),
            ("RDMALOG_CLUSTER_ID", s.cluster_id().to_string()),
            ("RDMALOG_PHASE", "tls".to_string()),
            ("RDMALOG_TLS_CA", ca.display().to_string()),
        ],
    );
    assert!(out.contains("phase tls"), "{out}");
}
