//! The lab's configuration and its validation.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::Duration;

use crate::{LabError, Result};

/// Largest number of Soft-RoCE hosts. Host `i` gets `192.0.2.1i`, veth `v{i}` and routing
/// table `10{i}`, a numbering that stays readable and unambiguous up to 9.
pub const MAX_HOSTS: u8 = 9;

/// Default number of hosts: a 3-replica cluster, the motivating deployment.
pub const DEFAULT_HOSTS: u8 = 3;

/// Default guest memory. 2 GiB booted in about 7 s in the hand-checked recipe and leaves room
/// for rings and tmpfs scratch; the host has 24 GiB.
pub const DEFAULT_MEM_MIB: u32 = 2048;

/// Default guest vCPUs: the host has 2 cores, and TCG runs one thread per vCPU.
pub const DEFAULT_SMP: u8 = 2;

/// How long boot plus fabric bring-up may take before the lab gives up. A healthy boot takes
/// 10-20 s under TCG on this machine; 120 s covers a heavily loaded host.
pub const DEFAULT_BOOT_TIMEOUT: Duration = Duration::from_secs(120);

/// Default limit for the whole run, boot included.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

/// The first three octets of the lab's addresses: TEST-NET-1 (RFC 5737), which never routes
/// anywhere outside the guest.
pub const NET_PREFIX: [u8; 3] = [192, 0, 2];

/// Settings of one lab boot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabConfig {
    /// Number of Soft-RoCE hosts, 1..=[`MAX_HOSTS`].
    pub hosts: u8,
    /// Guest memory in MiB.
    pub mem_mib: u32,
    /// Guest vCPUs.
    pub smp: u8,
    /// Limit for boot plus fabric bring-up.
    pub boot_timeout: Duration,
    /// Limit for the whole run.
    pub timeout: Duration,
    /// Limit for the job alone, counted from the moment the fabric is up (the whole-run limit
    /// still applies). `None` means only the whole-run limit.
    pub job_timeout: Option<Duration>,
    /// Size of an ext4 disk image to attach at `/run/lab/disk`, if any.
    pub disk_mib: Option<u32>,
    /// Keep the disk image at this path across runs: created (with `disk_mib`) when missing,
    /// attached as it is when present, so a second boot sees what the first left on it.
    pub disk_image: Option<PathBuf>,
    /// Host directory shared writable with the guest at `/mnt`.
    pub out_dir: PathBuf,
    /// Where the kernel and initramfs are cached.
    pub cache_dir: PathBuf,
}

impl LabConfig {
    /// A configuration with the defaults, writing results to `out_dir`.
    pub fn new(out_dir: PathBuf, cache_dir: PathBuf) -> Self {
        LabConfig {
            hosts: DEFAULT_HOSTS,
            mem_mib: DEFAULT_MEM_MIB,
            smp: DEFAULT_SMP,
            boot_timeout: DEFAULT_BOOT_TIMEOUT,
            timeout: DEFAULT_TIMEOUT,
            job_timeout: None,
            disk_mib: None,
            disk_image: None,
            out_dir,
            cache_dir,
        }
    }

    /// Checks every field, naming the bad one.
    pub fn validate(&self) -> Result<()> {
        if self.hosts == 0 || self.hosts > MAX_HOSTS {
            return Err(LabError::Config(format!(
                "hosts = {} is out of range: the lab supports 1 to {MAX_HOSTS} hosts",
                self.hosts
            )));
        }
        if !(512..=16384).contains(&self.mem_mib) {
            return Err(LabError::Config(format!(
                "mem = {} MiB is out of range: use 512 to 16384",
                self.mem_mib
            )));
        }
        if self.smp == 0 || self.smp > 8 {
            return Err(LabError::Config(format!(
                "smp = {} is out of range: use 1 to 8",
                self.smp
            )));
        }
        if let Some(disk) = self.disk_mib {
            if !(16..=65536).contains(&disk) {
                return Err(LabError::Config(format!(
                    "disk = {disk} MiB is out of range: use 16 to 65536"
                )));
            }
        }
        if self.boot_timeout.is_zero()
            || self.timeout.is_zero()
            || self.job_timeout.is_some_and(|t| t.is_zero())
        {
            return Err(LabError::Config("timeouts must be positive".into()));
        }
        if self.boot_timeout > self.timeout {
            return Err(LabError::Config(format!(
                "boot timeout ({} s) is longer than the whole-run timeout ({} s)",
                self.boot_timeout.as_secs(),
                self.timeout.as_secs()
            )));
        }
        if let Some(img) = &self.disk_image {
            if !img.exists() && self.disk_mib.is_none() {
                return Err(LabError::Config(format!(
                    "disk image {} does not exist: give --disk-mib to create it",
                    img.display()
                )));
            }
        }
        if !self.out_dir.is_absolute() {
            return Err(LabError::Config(format!(
                "out dir {} must be an absolute path",
                self.out_dir.display()
            )));
        }
        Ok(())
    }
}

/// The IPv4 address of lab host `i` (1-based): `192.0.2.1i`.
pub fn host_addr(i: u8) -> Ipv4Addr {
    assert!(
        (1..=MAX_HOSTS).contains(&i),
        "lab host index {i} out of range"
    );
    Ipv4Addr::new(NET_PREFIX[0], NET_PREFIX[1], NET_PREFIX[2], 10 + i)
}

/// The rxe device name of lab host `i`.
pub fn device_name(i: u8) -> String {
    format!("rxe{i}")
}

/// The host-side veth of lab host `i`, where fault hooks act.
pub fn netdev_name(i: u8) -> String {
    format!("v{i}")
}

/// Parses a duration given in seconds, optionally with an `s` or `m` suffix (`90`, `90s`, `5m`).
pub fn parse_duration(text: &str) -> Result<Duration> {
    let t = text.trim();
    let (num, mult) = if let Some(n) = t.strip_suffix('m') {
        (n, 60)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1)
    } else {
        (t, 1)
    };
    let v: u64 = num.parse().map_err(|_| {
        LabError::Config(format!(
            "`{text}` is not a duration: use seconds, e.g. 90, 90s or 5m"
        ))
    })?;
    Ok(Duration::from_secs(v * mult))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> LabConfig {
        LabConfig::new("/tmp/out".into(), "/tmp/cache".into())
    }

    #[test]
    fn defaults_are_valid() {
        cfg().validate().unwrap();
        assert_eq!(cfg().hosts, 3);
    }

    #[test]
    fn host_count_is_bounded_and_named_in_the_error() {
        for bad in [0u8, 10, 200] {
            let mut c = cfg();
            c.hosts = bad;
            let err = c.validate().unwrap_err().to_string();
            assert!(err.contains("hosts"), "{err}");
        }
        let mut c = cfg();
        c.hosts = 9;
        c.validate().unwrap();
    }

    #[test]
    fn bad_memory_disk_and_timeouts_are_rejected() {
        let mut c = cfg();
        c.mem_mib = 100;
        assert!(c.validate().unwrap_err().to_string().contains("mem"));
        let mut c = cfg();
        c.disk_mib = Some(1);
        assert!(c.validate().unwrap_err().to_string().contains("disk"));
        let mut c = cfg();
        c.disk_image = Some(PathBuf::from("/nonexistent/rdmalog-lab-test.img"));
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("--disk-mib"), "{err}");
        c.disk_mib = Some(64);
        c.validate().unwrap();
        let mut c = cfg();
        c.job_timeout = Some(Duration::ZERO);
        assert!(c.validate().unwrap_err().to_string().contains("timeouts"));
        let mut c = cfg();
        c.boot_timeout = Duration::from_secs(700);
        assert!(
            c.validate()
                .unwrap_err()
                .to_string()
                .contains("boot timeout")
        );
        let mut c = cfg();
        c.out_dir = "relative".into();
        assert!(c.validate().unwrap_err().to_string().contains("absolute"));
    }

    #[test]
    fn addresses_follow_the_recipe() {
        assert_eq!(host_addr(1).to_string(), "192.0.2.11");
        assert_eq!(host_addr(3).to_string(), "192.0.2.13");
        assert_eq!(host_addr(9).to_string(), "192.0.2.19");
        assert_eq!(device_name(2), "rxe2");
        assert_eq!(netdev_name(2), "v2");
    }

    #[test]
    #[should_panic(expected = "out of range")]
    fn host_zero_is_a_bug() {
        let _ = host_addr(0);
    }

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("90").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("90s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("5m").unwrap(), Duration::from_secs(300));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("-3").is_err());
    }
}
