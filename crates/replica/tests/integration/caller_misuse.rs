//! What an embedding application can get wrong is refused by name, before anything is
//! written, and never panics or wedges the log: configurations the replica, the wal or raft-rs
//! cannot work with, driver options, membership changes that could never be applied, and
//! waits of `Duration::MAX` ("no limit").

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use fabric::NodeId;
use fabric::sim::{SimConfig, SimNet};
use replica::{Log, LogOptions, ReplicaConfig, ReplicaError, Role};
use wal::fs::{FaultFs, FileSystem};

fn config(voters: Vec<u64>) -> ReplicaConfig {
    let mut cfg = ReplicaConfig::new(1, voters, 9, "/n1".into());
    cfg.ring_bytes = 2 << 20;
    cfg.segment_bytes = 8 << 20;
    cfg.election_window = Some((10, 11));
    cfg
}

/// Opens node 1 of a fresh network with `cfg` and `opts` on `fs`.
fn open(
    cfg: ReplicaConfig,
    opts: LogOptions,
    fs: &FaultFs,
) -> Result<(SimNet, Arc<AtomicBool>, Log<fabric::sim::SimEndpoint>), ReplicaError> {
    let net = SimNet::new(SimConfig::default(), 3);
    let stop = Arc::new(AtomicBool::new(false));
    net.run_realtime(stop.clone());
    let disk: Arc<dyn FileSystem> = Arc::new(fs.clone());
    let log = Log::open(cfg, net.add_node(NodeId(1)), disk, opts)?;
    Ok((net, stop, log))
}

/// A single voter opened with `fs`, once it leads.
fn single_leader(fs: &FaultFs) -> (SimNet, Arc<AtomicBool>, Log<fabric::sim::SimEndpoint>) {
    leading(config(vec![1]), fs)
}

/// The single voter of `cfg` opened with `fs`, once it leads.
fn leading(
    cfg: ReplicaConfig,
    fs: &FaultFs,
) -> (SimNet, Arc<AtomicBool>, Log<fabric::sim::SimEndpoint>) {
    let (net, stop, log) = open(cfg, LogOptions::default(), fs).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while log.status().role != Role::Leader {
        assert!(Instant::now() < deadline, "a single voter never leads");
        std::thread::sleep(Duration::from_millis(10));
    }
    (net, stop, log)
}

/// Asserts that an open was refused for its data dir, with a reason that says each of `says`.
fn refused_data_dir(opened: Result<(), ReplicaError>, says: &[&str]) {
    match opened {
        Err(ReplicaError::Config {
            field: "data_dir",
            reason,
        }) => assert!(says.iter().all(|s| reason.contains(s)), "{reason}"),
        Err(e) => panic!("refused, but not for the data dir: {e}"),
        Ok(()) => panic!("opened; expected a refusal saying {says:?}"),
    }
}

/// Each bad field is an error naming it, with nothing written to the data dir; the same
/// directory then opens with the corrected configuration and takes its voters. (Before: a
/// zero or tiny block panicked in the check itself, a voter listed twice counted twice
/// towards a NIC quorum, a huge `max_inflight_msgs` aborted in raft-rs's allocation, sums of
/// huge limits wrapped past the checks, and a configuration that raft-rs refused was
/// refused after the initial membership was stored, so the next open ignored the corrected
/// voters.)
#[test]
fn a_bad_configuration_is_refused_by_name_before_anything_is_written() {
    type Spoil = fn(&mut ReplicaConfig);
    let cases: [(Spoil, &str); 12] = [
        (|c| c.block_bytes = 0, "block_bytes"),
        (|c| c.block_bytes = 16, "block_bytes"),
        (|c| c.voters = vec![1, 1, 2], "voters"),
        (|c| c.voters = vec![0, 1, 2], "voters"),
        (|c| c.voters = (1..=1025).collect(), "voters"),
        (|c| c.max_inflight_msgs = usize::MAX, "max_inflight_msgs"),
        (|c| c.max_inflight_msgs = 0, "max_inflight_msgs"),
        (|c| c.max_snapshot_bytes = u64::MAX, "max_snapshot_bytes"),
        (|c| c.max_size_per_msg = u64::MAX, "max_size_per_msg"),
        (|c| c.segment_bytes = (8 << 20) + 512, "segment_bytes"),
        (|c| c.ring_bytes = 128 << 30, "ring_bytes"),
        // raft-rs's own check: the window must start at the election timeout.
        (|c| c.election_window = Some((1, 2)), "election"),
    ];
    let fs = FaultFs::new();
    for (spoil, field) in cases {
        let mut cfg = config(vec![1, 2, 3]);
        spoil(&mut cfg);
        let e = match open(cfg, LogOptions::default(), &fs) {
            Ok(_) => panic!("a configuration with a bad {field} opened"),
            Err(e) => e,
        };
        let said = e.to_string();
        match &e {
            ReplicaError::Config { field: f, .. } => assert_eq!(*f, field, "{said}"),
            _ => assert!(said.contains(field), "{said} does not name {field}"),
        }
        assert!(
            fs.names(Path::new("/n1")).is_empty(),
            "a refused open (bad {field}) wrote {:?}",
            fs.names(Path::new("/n1"))
        );
    }
    // The same directory opens with the corrected configuration.
    let (_net, _stop, log) = single_leader(&fs);
    log.append(b"corrected")
        .unwrap()
        .wait(Duration::from_secs(10))
        .unwrap();
}

/// Driver options are checked at `Log::open`, not left to fail the driver after it returned
/// `Ok` (a tick too long for the clock's arithmetic, a core the process cannot run on).
#[test]
fn bad_driver_options_are_refused_at_open() {
    let fs = FaultFs::new();
    for (opts, field) in [
        (
            LogOptions {
                tick: Duration::from_secs(3600),
                ..LogOptions::default()
            },
            "tick",
        ),
        (
            LogOptions {
                pin_core: Some(1 << 20),
                ..LogOptions::default()
            },
            "pin_core",
        ),
        // In range, so the kernel is asked: no machine this runs on lets a thread run on
        // core 1,023 (the last the range admits).
        (
            LogOptions {
                pin_core: Some(1023),
                ..LogOptions::default()
            },
            "pin_core",
        ),
    ] {
        match open(config(vec![1]), opts, &fs) {
            Err(ReplicaError::Config { field: f, .. }) => assert_eq!(f, field),
            Err(e) => panic!("bad {field}: {e}"),
            Ok(_) => panic!("bad {field} opened"),
        }
    }
}

/// Removing the last voter, or a change naming node 0, is refused when proposed. Before,
/// raft-rs committed the removal and then failed to apply it ("removed all voters"): the log
/// stopped, and stopped again at every restart as it applied the change again.
#[test]
fn membership_changes_that_could_never_apply_are_refused() {
    let fs = FaultFs::new();
    let (_net, _stop, log) = single_leader(&fs);
    match log.remove_node(1) {
        Err(ReplicaError::Membership(why)) => assert!(why.contains("last voter"), "{why}"),
        Err(e) => panic!("removing the last voter: {e}"),
        Ok(h) => panic!(
            "removing the last voter was proposed: {:?}",
            h.wait(Duration::from_secs(5))
        ),
    }
    match log.add_node(0) {
        Err(ReplicaError::Membership(why)) => assert!(why.contains("start at 1"), "{why}"),
        Err(e) => panic!("adding node 0: {e}"),
        Ok(_) => panic!("adding node 0 was proposed"),
    }
    let index = log
        .append(b"still serving")
        .unwrap()
        .wait(Duration::from_secs(10))
        .unwrap();
    assert_eq!(
        log.read(index).unwrap().as_deref(),
        Some(&b"still serving"[..])
    );
    assert!(log.status().failure.is_none());
}

/// `Duration::MAX` is "no limit" to every wait of the API (it overflowed the deadline's
/// arithmetic and panicked on the caller's thread).
#[test]
fn waits_take_duration_max_as_no_limit() {
    let fs = FaultFs::new();
    let (_net, _stop, log) = single_leader(&fs);
    let handle = log.append(b"forever").unwrap();
    let index = handle.wait(Duration::MAX).unwrap();
    log.wait_for_commit(index, Duration::MAX).unwrap();
    let mut sub = log.subscribe(index);
    assert_eq!(
        sub.next_timeout(Duration::MAX).unwrap(),
        Some((index, b"forever".to_vec()))
    );
}

/// A `pin_core` outside the opening thread's affinity but one the kernel lets a thread move
/// to is accepted, as with a core `isolcpus` took out of every process's default mask (what
/// ops/GUIDE.md advises for `busy`): it was refused, and before that check failed the driver,
/// since the core was looked up in the process's current mask.
#[test]
fn a_pin_core_outside_the_current_mask_is_accepted() {
    if std::thread::available_parallelism().map_or(1, usize::from) < 2 {
        eprintln!("skipped: one core");
        return;
    }
    let accepted = std::thread::spawn(|| {
        // This thread, and the threads it starts, may run on core 0 only.
        assert!(core_affinity::set_for_current(core_affinity::CoreId {
            id: 0
        }));
        let opts = LogOptions {
            pin_core: Some(1),
            ..LogOptions::default()
        };
        opts.validate()
    })
    .join()
    .unwrap();
    assert!(accepted.is_ok(), "{accepted:?}");
}

/// A second open of a data dir in use is refused by name, before it writes anything: two
/// replicas writing one log (a second server on the same `data_dir`, a restart while the old
/// process still runs) would interleave their appends and raft state and lose what either
/// acknowledged. The lock goes when the log closes, or with the replica (and with its
/// process, however it ends).
#[test]
fn a_data_dir_in_use_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let open_real = |net: &SimNet| {
        let mut cfg = config(vec![1]);
        cfg.data_dir = dir.path().to_path_buf();
        let disk: Arc<dyn FileSystem> = Arc::new(wal::fs::StdFs);
        Log::open(cfg, net.add_node(NodeId(1)), disk, LogOptions::default())
    };
    let net = SimNet::new(SimConfig::default(), 3);
    let first = open_real(&net).unwrap();
    let net2 = SimNet::new(SimConfig::default(), 3);
    let listing = |d: &Path| {
        let mut v: Vec<_> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
    };
    let before = listing(dir.path());
    refused_data_dir(open_real(&net2).map(drop), &["in use"]);
    assert_eq!(listing(dir.path()), before, "the refused open wrote");
    // Closed, the first lets go of the directory even while a handle of its log lives on
    // (a subscription the application kept; it answers `Closed`).
    let sub = first.subscribe(1);
    first.close().unwrap();
    let net3 = SimNet::new(SimConfig::default(), 3);
    open_real(&net3).expect("reopened after the first closed");
    drop(sub);
}

/// A data dir whose `raft-state` was deleted but which still holds its log is refused, naming
/// what to do: the first open stores `raft-state` before any segment, so a log without it
/// means it was lost, and starting anew would forget the node's term and vote (it could vote
/// twice in one term). Nothing is written by the refused open.
#[test]
fn a_log_without_its_raft_state_is_refused() {
    let fs = FaultFs::new();
    {
        let (_net, _stop, log) = single_leader(&fs);
        log.append(b"before")
            .unwrap()
            .wait(Duration::from_secs(10))
            .unwrap();
        log.close().unwrap();
    }
    let dir = Path::new("/n1");
    let disk: &dyn FileSystem = &fs;
    disk.remove(&dir.join("raft-state")).unwrap();
    let before = fs.names(dir);
    let opened = open(config(vec![1]), LogOptions::default(), &fs).map(drop);
    refused_data_dir(opened, &["no raft-state", "members remove"]);
    assert_eq!(fs.names(dir), before, "the refused open wrote");
}

/// A log that starts past index 1 without its snapshot file is refused: entries are deleted
/// only after the checkpoint covering them is stored, so the file was lost, and with it the
/// state of every entry before the log (and the session table). It opened before, with
/// nothing to restore from and no snapshot for a follower that needs those entries.
#[test]
fn a_trimmed_log_without_its_snapshot_is_refused() {
    let fs = FaultFs::new();
    let small = || {
        let mut cfg = config(vec![1]);
        cfg.block_bytes = 4096;
        cfg.segment_bytes = 16 << 10;
        cfg.ring_bytes = 64 << 10;
        cfg.max_entry_bytes = 2048;
        cfg
    };
    {
        let (_net, _stop, log) = leading(small(), &fs);
        let mut last = 0;
        for i in 0..60u8 {
            last = log
                .append(&[i; 1000])
                .unwrap()
                .wait(Duration::from_secs(10))
                .unwrap();
        }
        let first = log.checkpoint(last - 5, b"state").unwrap();
        assert!(first > 1, "the checkpoint deleted no segment");
        log.close().unwrap();
    }
    let dir = Path::new("/n1");
    let disk: &dyn FileSystem = &fs;
    disk.remove(&dir.join("snapshot")).unwrap();
    let opened = open(small(), LogOptions::default(), &fs).map(drop);
    refused_data_dir(opened, &["snapshot file is missing"]);
}
