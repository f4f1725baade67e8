//! Choosing the guest kernel: the newest Debian 6.12 image by query, falling back to 6.1.
//!
//! RDMA-NOTES §1: both `linux-image-6.12.N+debM-amd64-unsigned` and the 6.1 image that
//! `linux-image-amd64` depends on ship `rdma_rxe`. Version numbers change over time, so the
//! name is resolved at run time from `apt-cache`, never pinned.

use std::cmp::Ordering;

/// A Debian kernel image package the lab can boot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelPackage {
    /// The package name, e.g. `linux-image-6.12.107+deb12-amd64-unsigned`.
    pub name: String,
    /// Numeric version parts used for ordering, e.g. `[6, 12, 107, 12]`.
    pub version: Vec<u64>,
}

/// The `apt-cache search` pattern that lists 6.12 images.
pub const SEARCH_PATTERN_612: &str = r"^linux-image-6\.12\.[0-9]+\+deb[0-9]+-amd64-unsigned$";

/// The meta-package whose `Depends:` names the distribution's default (6.1) image.
pub const FALLBACK_META: &str = "linux-image-amd64";

/// Parses one package name of the form `linux-image-6.12.N+debM-amd64-unsigned`. Cloud, RT and
/// debug flavours are rejected: the cloud kernel lacks many drivers and RT is slower under TCG.
pub fn parse_612_name(name: &str) -> Option<KernelPackage> {
    let mid = name
        .strip_prefix("linux-image-")?
        .strip_suffix("-amd64-unsigned")?;
    if mid.contains('-') {
        return None;
    }
    let (upstream, deb) = mid.split_once("+deb")?;
    let mut version: Vec<u64> = Vec::new();
    for part in upstream.split('.') {
        version.push(part.parse().ok()?);
    }
    if version.len() != 3 || version[0] != 6 || version[1] != 12 {
        return None;
    }
    version.push(deb.parse().ok()?);
    Some(KernelPackage {
        name: name.to_string(),
        version,
    })
}

/// Picks the newest 6.12 image from `apt-cache search --names-only` output.
pub fn pick_newest_612(search_output: &str) -> Option<KernelPackage> {
    search_output
        .lines()
        .filter_map(|line| line.split(" - ").next())
        .filter_map(|name| parse_612_name(name.trim()))
        .max_by(|a, b| a.version.cmp(&b.version).then(Ordering::Equal))
}

/// Finds the default image in `apt-cache depends linux-image-amd64` output
/// (`  Depends: linux-image-6.1.0-57-amd64`).
pub fn parse_fallback_depends(depends_output: &str) -> Option<String> {
    depends_output.lines().find_map(|line| {
        let dep = line.trim().strip_prefix("Depends:")?.trim();
        (dep.starts_with("linux-image-") && dep.ends_with("-amd64")).then(|| dep.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEARCH: &str = "\
linux-image-6.12-amd64-dbg - Debugging symbols for Linux amd64 configuration (meta-package)
linux-image-6.12.38+deb12-amd64-unsigned - Linux 6.12 for 64-bit PCs
linux-image-6.12.107+deb12-amd64-dbg - Debug symbols for linux-image-6.12.107+deb12-amd64
linux-image-6.12.107+deb12-amd64-unsigned - Linux 6.12 for 64-bit PCs
linux-image-6.12.107+deb12-cloud-amd64-unsigned - Linux 6.12 for x86-64 cloud
linux-image-6.12.107+deb12-rt-amd64-unsigned - Linux 6.12 for 64-bit PCs, PREEMPT_RT
linux-image-6.12.99+deb12-amd64-unsigned - Linux 6.12 for 64-bit PCs
";

    #[test]
    fn newest_plain_612_wins_by_numeric_version() {
        let k = pick_newest_612(SEARCH).unwrap();
        assert_eq!(k.name, "linux-image-6.12.107+deb12-amd64-unsigned");
        assert_eq!(k.version, vec![6, 12, 107, 12]);
    }

    #[test]
    fn flavours_and_other_series_are_rejected() {
        assert!(parse_612_name("linux-image-6.12.107+deb12-cloud-amd64-unsigned").is_none());
        assert!(parse_612_name("linux-image-6.12.107+deb12-rt-amd64-unsigned").is_none());
        assert!(parse_612_name("linux-image-6.11.2+deb12-amd64-unsigned").is_none());
        assert!(parse_612_name("linux-image-6.12-amd64-dbg").is_none());
        assert!(parse_612_name("linux-image-6.12.x+deb12-amd64-unsigned").is_none());
    }

    #[test]
    fn empty_search_gives_none() {
        assert!(pick_newest_612("").is_none());
        assert!(pick_newest_612("something else - x\n").is_none());
    }

    #[test]
    fn fallback_comes_from_the_meta_package() {
        let out = "linux-image-amd64\n  Depends: linux-image-6.1.0-57-amd64\n";
        assert_eq!(
            parse_fallback_depends(out).as_deref(),
            Some("linux-image-6.1.0-57-amd64")
        );
        assert_eq!(parse_fallback_depends("linux-image-amd64\n"), None);
    }
}
