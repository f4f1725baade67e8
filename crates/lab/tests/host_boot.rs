//! Host test of the lab tool itself: it boots real QEMU guests.
//!
//! Method: runs on the host (not in the guest), after `ops/lab setup` has cached the kernel and
//! initramfs; `ops/test` runs it with `--ignored`. Each test runs the built `rdmalog-lab` binary
//! the way a user would and checks its exit status, its one-line errors and its result share.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

fn lab() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_rdmalog-lab"));
    c.env(
        "RDMALOG_REPO",
        concat!(env!("CARGO_MANIFEST_DIR"), "/../.."),
    );
    c
}

fn out_dir(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[test]
#[ignore = "boots QEMU: ops/test runs it after ops/lab setup"]
fn job_status_results_and_disk_come_back() {
    let out = out_dir("lab-job");
    let script = "echo hello-from-guest; \
                  echo payload > \"$RDMALOG_LAB_OUT/result.txt\"; \
                  grep -q ' /run/lab/disk ext4 ' /proc/mounts || exit 3; \
                  echo durable > \"$RDMALOG_LAB_DISK/f\" && sync || exit 4; \
                  [ \"$RDMALOG_LAB_HOSTS\" = 2 ] || exit 5; \
                  exit 7";
    let o = lab()
        .args([
            "run",
            "--no-install",
            "--hosts",
            "2",
            "--disk-mib",
            "64",
            "--out",
        ])
        .arg(&out)
        .args(["--sh", "--", script])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(
        o.status.code(),
        Some(7),
        "stdout: {stdout}\nstderr: {stderr}"
    );
    assert!(stdout.contains("hello-from-guest"), "{stdout}");
    assert!(stderr.contains("boot + fabric bring-up took"), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(out.join("result.txt")).unwrap(),
        "payload\n"
    );
    assert!(out.join(".lab/console.log").exists());
}

#[test]
#[ignore = "boots QEMU: ops/test runs it after ops/lab setup"]
fn a_boot_that_overruns_its_limit_fails_with_one_line() {
    let out = out_dir("lab-timeout");
    let t = Instant::now();
    let o = lab()
        .args(["run", "--no-install", "--boot-timeout", "1", "--out"])
        .arg(&out)
        .args(["--", "true"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(125), "{stderr}");
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("lab: error: lab timed out after 1 s before the fabric was up"),
        "{stderr}"
    );
    assert!(
        t.elapsed() < Duration::from_secs(60),
        "took {:?}",
        t.elapsed()
    );
}

#[test]
#[ignore = "boots QEMU: ops/test runs it after ops/lab setup"]
fn a_job_that_overruns_is_killed_at_the_run_limit() {
    // The job limit counts from the moment the fabric is up, so a slow boot on a loaded
    // machine cannot eat into it.
    let out = out_dir("lab-run-timeout");
    let t = Instant::now();
    let o = lab()
        .args([
            "run",
            "--no-install",
            "--hosts",
            "1",
            "--job-timeout",
            "8",
            "--out",
        ])
        .arg(&out)
        .args(["--sh", "--", "echo job-started; sleep 600"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(125), "{stderr}");
    assert!(stdout.contains("job-started"), "{stdout}");
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("lab: error: lab timed out after 8 s while the job ran"),
        "{stderr}"
    );
    // Boot (at most the 120 s default) plus the 8 s job limit, never the 600 s sleep.
    assert!(
        t.elapsed() < Duration::from_secs(180),
        "took {:?}",
        t.elapsed()
    );
}

#[test]
fn invalid_settings_fail_before_any_boot() {
    let o = lab()
        .args(["run", "--hosts", "0", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(125));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        stderr.contains("lab: error: invalid lab configuration: hosts = 0"),
        "{stderr}"
    );
}

#[test]
fn guest_commands_refuse_to_run_on_the_host() {
    let o = lab()
        .args(["info"])
        .env_remove("RDMALOG_LAB")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(125));
    assert!(String::from_utf8_lossy(&o.stderr).contains("not inside the lab guest"));
}
