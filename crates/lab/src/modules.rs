//! Which kernel modules the guest loads, in which order.
//!
//! The order comes from `modprobe --show-depends` run on the host against the unpacked
//! kernel, so it follows the kernel's own dependency data instead of a hand-kept list that
//! would rot between kernel versions. Only the leaves are named here.

use std::path::{Path, PathBuf};

/// The modules the lab needs, leaves only; their dependencies are resolved by query.
///
/// From RDMA-NOTES §1: `crc32_generic` first (without it `rdma_rxe` fails to init crc32), the
/// 9p stack for the host root, `rdma_ucm` (without it `rdma_create_event_channel` fails),
/// `rdma_rxe`, veth/bridge for the hosts, `sch_netem` for fault injection, and virtio_blk plus
/// ext4 for the optional disk image. `virtio_pci` is built in on 6.12 but a module on 6.1.
pub const WANTED: &[&str] = &[
    "crc32_generic",
    "virtio_pci",
    "9pnet_virtio",
    "9p",
    "configfs",
    "ib_uverbs",
    "rdma_ucm",
    "rdma_rxe",
    "veth",
    "bridge",
    "sch_netem",
    "virtio_blk",
    "crc32c_generic",
    "ext4",
];

/// Modules whose failure to load is not fatal: CPU-specific accelerations that a soft
/// dependency pulls in and that a generic implementation replaces.
pub const OPTIONAL: &[&str] = &[
    "crc32c-intel",
    "crc32c_intel",
    "crc32_pclmul",
    "crct10dif_pclmul",
];

/// One module file to load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModuleFile {
    /// Module name as `insmod` sees it (file stem).
    pub name: String,
    /// Path of the (possibly compressed) `.ko` file on the host.
    pub path: PathBuf,
}

impl ModuleFile {
    /// Whether a failure to load this module may be ignored.
    pub fn optional(&self) -> bool {
        OPTIONAL.contains(&self.name.as_str())
    }
}

/// Strips `.ko`, `.ko.xz`, `.ko.zst` or `.ko.gz` from a module file name.
pub fn module_name(path: &Path) -> Option<String> {
    let file = path.file_name()?.to_str()?;
    let stem = file
        .strip_suffix(".ko.xz")
        .or_else(|| file.strip_suffix(".ko.zst"))
        .or_else(|| file.strip_suffix(".ko.gz"))
        .or_else(|| file.strip_suffix(".ko"))?;
    Some(stem.to_string())
}

/// Parses `modprobe --show-depends` output (`insmod PATH [params]` and `builtin NAME` lines),
/// appending new modules to `out` in load order and skipping ones already present.
pub fn merge_show_depends(output: &str, out: &mut Vec<ModuleFile>) {
    for line in output.lines() {
        let mut words = line.split_whitespace();
        if words.next() != Some("insmod") {
            continue;
        }
        let Some(path) = words.next() else { continue };
        let path = PathBuf::from(path);
        let Some(name) = module_name(&path) else {
            continue;
        };
        if out.iter().any(|m| m.name == name) {
            continue;
        }
        out.push(ModuleFile { name, path });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn show_depends_merges_in_order_without_duplicates() {
        let mut out = Vec::new();
        merge_show_depends(
            "insmod /k/lib/modules/v/kernel/fs/netfs/netfs.ko.xz \n\
             insmod /k/lib/modules/v/kernel/net/9p/9pnet.ko.xz \n\
             insmod /k/lib/modules/v/kernel/fs/9p/9p.ko.xz \n",
            &mut out,
        );
        merge_show_depends(
            "insmod /k/lib/modules/v/kernel/net/9p/9pnet.ko.xz \n\
             insmod /k/lib/modules/v/kernel/net/9p/9pnet_virtio.ko.xz \n\
             builtin virtio_pci\n",
            &mut out,
        );
        let names: Vec<_> = out.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names, ["netfs", "9pnet", "9p", "9pnet_virtio"]);
    }

    #[test]
    fn module_names_drop_every_compression_suffix() {
        for (f, n) in [
            ("/a/rdma_rxe.ko.xz", "rdma_rxe"),
            ("/a/veth.ko", "veth"),
            ("/a/ext4.ko.zst", "ext4"),
            ("/a/9p.ko.gz", "9p"),
        ] {
            assert_eq!(module_name(Path::new(f)).as_deref(), Some(n));
        }
        assert_eq!(module_name(Path::new("/a/readme.txt")), None);
    }

    #[test]
    fn only_cpu_accelerations_are_optional() {
        let m = |n: &str| ModuleFile {
            name: n.into(),
            path: PathBuf::new(),
        };
        assert!(m("crc32c-intel").optional());
        assert!(!m("rdma_rxe").optional());
        assert!(!m("crc32_generic").optional());
    }
}
