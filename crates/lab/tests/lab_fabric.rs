//! Lab test: the fabric the lab brings up is real.
//!
//! Method: runs inside the Soft-RoCE lab guest (`ops/test` boots it with 3 hosts and runs every
//! `lab_*` test binary with `--ignored`). It reads the kernel's own view of the devices from
//! sysfs, and runs perftest's `ib_write_lat` between two hosts, so traffic crosses the bridge
//! from one veth to another. Outside the lab these tests are ignored; run alone they fail
//! with `NotInLab`.

use lab::config::{device_name, host_addr};
use lab::guest;
use lab::perftest::{self, Tool};

#[test]
#[ignore = "lab: needs the Soft-RoCE lab; ops/test runs it"]
fn every_host_has_an_active_rxe_device() {
    let hosts = guest::hosts().expect("inside the lab");
    assert!(hosts >= 3, "the default lab has 3 hosts, got {hosts}");
    let devices = guest::devices().unwrap();
    for h in 1..=hosts {
        let dev = device_name(h);
        assert!(devices.contains(&dev), "{dev} missing from {devices:?}");
        assert_eq!(guest::port_state(&dev).unwrap(), "ACTIVE", "{dev} port 1");
    }
}

#[test]
#[ignore = "lab: needs the Soft-RoCE lab; ops/test runs it"]
fn every_host_has_a_roce_v2_ipv4_gid() {
    let hosts = guest::hosts().unwrap();
    for h in 1..=hosts {
        let dev = device_name(h);
        let table = guest::gid_table(&dev).unwrap();
        let idx = guest::find_roce_v2_gid(&table, host_addr(h));
        assert!(
            idx.is_some(),
            "{dev} has no RoCE v2 GID for {}: {table:?}",
            host_addr(h)
        );
        // The GID of one host must not appear on another: each device sits on its own veth.
        for other in (1..=hosts).filter(|&o| o != h) {
            assert_eq!(guest::find_roce_v2_gid(&table, host_addr(other)), None);
        }
    }
}

#[test]
#[ignore = "lab: needs the Soft-RoCE lab; ops/test runs it"]
fn ib_write_lat_between_two_hosts_completes() {
    let out = perftest::run_pair(Tool::WriteLat, 1, 3, 64, 200, 18600).expect("ib_write_lat ran");
    let lat = perftest::parse_latency(&out).expect("a result table");
    assert_eq!(lat.bytes, 64);
    assert_eq!(lat.iterations, 200);
    assert!(
        lat.t_min_us > 0.0 && lat.t_min_us <= lat.t_typical_us && lat.t_typical_us <= lat.t_max_us,
        "{lat:?}"
    );
}

#[test]
#[ignore = "lab: needs the Soft-RoCE lab; ops/test runs it"]
fn a_downed_link_takes_the_rxe_port_down_and_back() {
    guest::set_link(2, false).unwrap();
    let mut state = String::new();
    for _ in 0..100 {
        state = guest::port_state("rxe2").unwrap();
        if state != "ACTIVE" {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_ne!(state, "ACTIVE", "rxe2 stayed ACTIVE with v2 down");
    guest::set_link(2, true).unwrap();
    for _ in 0..200 {
        state = guest::port_state("rxe2").unwrap();
        if state == "ACTIVE" {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(state, "ACTIVE", "rxe2 did not come back after v2 up");
    let neigh = std::process::Command::new("ip")
        .args(["neigh", "show", "dev", "v2"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&neigh.stdout);
    assert!(
        text.contains("192.0.2.11") && text.contains("PERMANENT"),
        "static neighbours not restored: {text}"
    );
}

#[test]
#[ignore = "lab: needs the Soft-RoCE lab; ops/test runs it"]
fn netem_applies_and_clears() {
    guest::set_netem(
        3,
        &guest::Netem {
            loss_pct: 5.0,
            ..Default::default()
        },
    )
    .unwrap();
    let set = guest::root_qdisc("v3").unwrap();
    let text = &set.line;
    assert!(text.contains("netem") && text.contains("loss 5%"), "{text}");
    guest::clear_netem(3).unwrap();
    guest::clear_netem(3).unwrap(); // idempotent
    let after = guest::root_qdisc("v3").unwrap();
    let cleared = &after.line;
    // Cleared is the pass-through netem the lab boots with, the same qdisc (same handle):
    // the hooks change it in place and never swap it.
    assert!(
        cleared.contains("netem") && !cleared.contains("loss"),
        "{cleared}"
    );
    assert_eq!(after.handle, set.handle, "{text} then {cleared}");
}
