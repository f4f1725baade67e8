//! The host side: packages, kernel, initramfs, and one QEMU boot per run.
//!
//! A run is: make sure the Debian packages are there; resolve, download (once) and unpack the
//! kernel image into the cache; build (once per kernel and script version) an initramfs of
//! busybox, `ops/guest/init` and the needed modules; write the job into the result share; boot
//! QEMU TCG with the host root shared read-only; stream the console; enforce the boot and run
//! timeouts; and return the job's exit status. The guest reports progress and failures with
//! `@@LAB:` marker lines, which become progress lines and one-line errors here.

use std::collections::hash_map::DefaultHasher;
use std::fs;
use std::hash::{Hash, Hasher};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use crate::config::LabConfig;
use crate::kernel::{self, KernelPackage};
use crate::modules::{self, ModuleFile};
use crate::{LabError, Result, io_err};

/// The guest's PID 1, copied into the initramfs.
const GUEST_INIT: &str = include_str!("../../../ops/guest/init");
/// The guest's boot script, run in the chroot from the result share.
const GUEST_BOOT: &str = include_str!("../../../ops/guest/boot.sh");

/// Debian packages the lab needs at run time, with why.
pub const PACKAGES: &[(&str, &str)] = &[
    ("qemu-system-x86", "boots the guest (TCG)"),
    ("busybox-static", "the initramfs userland"),
    ("cpio", "packs the initramfs"),
    (
        "kmod",
        "depmod and modprobe --show-depends resolve module order",
    ),
    ("xz-utils", "decompresses .ko.xz modules"),
    ("zstd", "decompresses .ko.zst modules"),
    ("e2fsprogs", "mkfs.ext4 for the optional disk image"),
    ("iproute2", "ip, tc and rdma inside the guest"),
    ("procps", "kill inside the guest"),
    ("rdma-core", "rdma link and the kernel verbs user space"),
    (
        "ibverbs-providers",
        "librxe, the Soft-RoCE user-space provider",
    ),
    ("ibverbs-utils", "ibv_devices and ibv_devinfo"),
    ("rdmacm-utils", "rping, an rdma_cm check"),
    (
        "perftest",
        "the ib_write_lat/ib_send_lat/ib_write_bw baseline",
    ),
];

/// Prints a progress line on stderr, where it does not mix with the job's own output.
pub fn progress(msg: impl AsRef<str>) {
    eprintln!("lab: {}", msg.as_ref());
}

fn command_output(cmd: &mut Command) -> Result<String> {
    let rendered = format!("{cmd:?}").replace('"', "");
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(io_err(format!("cannot run {rendered}")))?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(3).collect();
        return Err(LabError::Command {
            command: rendered,
            detail: format!(
                "{}: {}",
                out.status,
                tail.into_iter().rev().collect::<Vec<_>>().join(" / ")
            ),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn is_root() -> bool {
    command_output(Command::new("id").arg("-u"))
        .map(|s| s.trim() == "0")
        .unwrap_or(false)
}

/// The packages from [`PACKAGES`] that are not installed.
pub fn missing_packages() -> Result<Vec<&'static str>> {
    let mut missing = Vec::new();
    for (pkg, _) in PACKAGES {
        let out = Command::new("dpkg-query")
            .args(["-W", "-f=${db:Status-Abbrev}", pkg])
            .stdin(Stdio::null())
            .output()
            .map_err(io_err("cannot run dpkg-query (is this Debian?)"))?;
        if !String::from_utf8_lossy(&out.stdout).starts_with("ii") {
            missing.push(*pkg);
        }
    }
    Ok(missing)
}

/// Runs `apt-get update` at most once per process.
fn apt_update(done: &mut bool) -> Result<()> {
    if !*done {
        progress("apt-get update");
        command_output(Command::new("apt-get").args(["update", "-q"]))?;
        *done = true;
    }
    Ok(())
}

/// Installs missing packages (as root), or says exactly what to install.
pub fn ensure_packages(install: bool, apt_updated: &mut bool) -> Result<()> {
    let missing = missing_packages()?;
    if missing.is_empty() {
        return Ok(());
    }
    let list = missing.join(" ");
    if !install {
        return Err(LabError::MissingPackages {
            packages: list,
            hint: "run `sudo ops/lab setup` to install them".into(),
        });
    }
    if !is_root() {
        return Err(LabError::MissingPackages {
            packages: list,
            hint: "installing them needs root: run `sudo ops/lab setup`".into(),
        });
    }
    apt_update(apt_updated)?;
    progress(format!("installing {list}"));
    command_output(
        Command::new("apt-get")
            .args(["install", "-y", "-q", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
    .map_err(|e| LabError::MissingPackages {
        packages: list.clone(),
        hint: format!("apt-get install failed: {e}"),
    })?;
    let still = missing_packages()?;
    if !still.is_empty() {
        return Err(LabError::MissingPackages {
            packages: still.join(" "),
            hint: "apt-get reported success but they are still not installed".into(),
        });
    }
    Ok(())
}

/// The default cache: `$RDMALOG_LAB_CACHE`, else `$XDG_CACHE_HOME/rdmalog-lab`, else
/// `~/.cache/rdmalog-lab`. It lives outside the repository so clean clones reuse it.
pub fn default_cache_dir() -> PathBuf {
    if let Some(p) = std::env::var_os("RDMALOG_LAB_CACHE") {
        return PathBuf::from(p);
    }
    if let Some(p) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(p).join("rdmalog-lab");
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/root"), PathBuf::from);
    home.join(".cache").join("rdmalog-lab")
}

/// An unpacked kernel in the cache.
#[derive(Debug, Clone)]
pub struct Kernel {
    /// The Debian package it came from.
    pub package: String,
    /// The kernel release (`uname -r` in the guest), the directory under `lib/modules`.
    pub release: String,
    /// The unpacked package root.
    pub root: PathBuf,
    /// The kernel image.
    pub vmlinuz: PathBuf,
}

fn resolve_kernel_package(apt_updated: &mut bool, can_update: bool) -> Result<String> {
    for attempt in 0..2 {
        let search = command_output(Command::new("apt-cache").args([
            "search",
            "--names-only",
            kernel::SEARCH_PATTERN_612,
        ]))
        .unwrap_or_default();
        if let Some(KernelPackage { name, .. }) = kernel::pick_newest_612(&search) {
            return Ok(name);
        }
        let depends =
            command_output(Command::new("apt-cache").args(["depends", kernel::FALLBACK_META]))
                .unwrap_or_default();
        if let Some(name) = kernel::parse_fallback_depends(&depends) {
            progress(format!(
                "no 6.12 kernel image in the package lists; falling back to {name}"
            ));
            return Ok(name);
        }
        // Empty package lists on a fresh machine: update once and ask again.
        if attempt == 0 && can_update && !*apt_updated {
            apt_update(apt_updated)?;
        } else {
            break;
        }
    }
    Err(LabError::NoKernel(
        "apt-cache finds neither linux-image-6.12.*-amd64-unsigned nor linux-image-amd64's \
         dependency; run `sudo apt-get update` and check the Debian sources"
            .into(),
    ))
}

fn unpacked_kernel(dir: &Path, package: &str) -> Result<Kernel> {
    let root = dir.join("root");
    let modules_dir = root.join("lib/modules");
    let release = fs::read_dir(&modules_dir)
        .map_err(io_err(format!("cannot list {}", modules_dir.display())))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .next()
        .ok_or_else(|| LabError::NoKernel(format!("{package} has no lib/modules")))?;
    let vmlinuz = root.join(format!("boot/vmlinuz-{release}"));
    if !vmlinuz.is_file() {
        return Err(LabError::NoKernel(format!(
            "{package} has no {}",
            vmlinuz.display()
        )));
    }
    Ok(Kernel {
        package: package.into(),
        release,
        root,
        vmlinuz,
    })
}

/// Resolves the kernel package, downloads and unpacks it once, and returns it.
pub fn ensure_kernel(cache: &Path, apt_updated: &mut bool, can_update: bool) -> Result<Kernel> {
    let kernels = cache.join("kernels");
    let package = match resolve_kernel_package(apt_updated, can_update) {
        Ok(p) => p,
        Err(e) => {
            // Offline but cached: use the newest kernel already unpacked.
            let mut cached: Vec<String> = fs::read_dir(&kernels)
                .into_iter()
                .flatten()
                .filter_map(|e| e.ok())
                .filter(|e| e.path().join(".ready").exists())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            cached.sort();
            match cached.pop() {
                Some(p) => {
                    progress(format!("{e}; using the cached {p}"));
                    p
                }
                None => return Err(e),
            }
        }
    };
    let dir = kernels.join(&package);
    if dir.join(".ready").exists() {
        return unpacked_kernel(&dir, &package);
    }
    let dl = cache.join("dl");
    fs::create_dir_all(&dl).map_err(io_err(format!("cannot create {}", dl.display())))?;
    progress(format!(
        "downloading {package} (about 100 MB, once; cached in {})",
        cache.display()
    ));
    command_output(
        Command::new("apt-get")
            .args(["download", "-q", &package])
            .current_dir(&dl),
    )?;
    let deb = fs::read_dir(&dl)
        .map_err(io_err(format!("cannot list {}", dl.display())))?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(&format!("{package}_")))
        })
        .ok_or_else(|| LabError::NoKernel(format!("apt-get download {package} left no .deb")))?;
    let tmp = kernels.join(format!(".{package}.tmp"));
    let _ = fs::remove_dir_all(&tmp);
    fs::create_dir_all(tmp.join("root"))
        .map_err(io_err(format!("cannot create {}", tmp.display())))?;
    progress(format!("unpacking {}", deb.display()));
    command_output(
        Command::new("dpkg-deb")
            .arg("-x")
            .arg(&deb)
            .arg(tmp.join("root")),
    )?;
    let k = unpacked_kernel(&tmp, &package)?;
    command_output(
        Command::new("depmod")
            .arg("-b")
            .arg(&k.root)
            .arg(&k.release),
    )?;
    fs::write(tmp.join(".ready"), &package).map_err(io_err("cannot mark the kernel ready"))?;
    let _ = fs::remove_dir_all(&dir);
    fs::rename(&tmp, &dir).map_err(io_err(format!(
        "cannot move the kernel to {}",
        dir.display()
    )))?;
    // The .deb is no longer needed once unpacked.
    let _ = fs::remove_file(&deb);
    unpacked_kernel(&dir, &package)
}

/// Resolves the module load order against the unpacked kernel.
pub fn resolve_modules(k: &Kernel) -> Result<Vec<ModuleFile>> {
    let mut mods = Vec::new();
    for leaf in modules::WANTED {
        let out = Command::new("modprobe")
            .arg("--show-depends")
            .arg("-d")
            .arg(&k.root)
            .arg("-S")
            .arg(&k.release)
            .arg(leaf)
            .stdin(Stdio::null())
            .output()
            .map_err(io_err("cannot run modprobe (package kmod)"))?;
        let text = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() && !text.contains("builtin") {
            return Err(LabError::NoKernel(format!(
                "kernel {} has no module {leaf}: {}",
                k.release,
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        modules::merge_show_depends(&text, &mut mods);
    }
    Ok(mods)
}

fn decompress_module(m: &ModuleFile, dest: &Path) -> Result<()> {
    let ext = m.path.extension().and_then(|e| e.to_str()).unwrap_or("");
    let tool = match ext {
        "xz" => Some("xz"),
        "zst" => Some("zstd"),
        "gz" => Some("gzip"),
        _ => None,
    };
    match tool {
        Some(tool) => {
            let out = Command::new(tool)
                .arg("-dc")
                .arg(&m.path)
                .stdin(Stdio::null())
                .output()
                .map_err(io_err(format!("cannot run {tool}")))?;
            if !out.status.success() {
                return Err(LabError::Command {
                    command: format!("{tool} -dc {}", m.path.display()),
                    detail: String::from_utf8_lossy(&out.stderr).trim().to_string(),
                });
            }
            fs::write(dest, out.stdout).map_err(io_err(format!("cannot write {}", dest.display())))
        }
        None => fs::copy(&m.path, dest)
            .map(|_| ())
            .map_err(io_err(format!("cannot copy {}", m.path.display()))),
    }
}

/// Builds (once per kernel, module list and init script) the initramfs and returns its path.
pub fn ensure_initrd(cache: &Path, k: &Kernel) -> Result<PathBuf> {
    let mods = resolve_modules(k)?;
    let mut list = String::new();
    for m in &mods {
        list.push_str(&format!(
            "{} {}.ko{}\n",
            m.name,
            m.name,
            if m.optional() { " optional" } else { "" }
        ));
    }
    let busybox = Path::new("/bin/busybox");
    let busybox_len = fs::metadata(busybox)
        .map_err(io_err("cannot find /bin/busybox (package busybox-static)"))?
        .len();
    let mut h = DefaultHasher::new();
    (GUEST_INIT, &list, &k.package, busybox_len).hash(&mut h);
    let path = cache.join(format!("initrd-{}-{:016x}.cpio.gz", k.release, h.finish()));
    if path.exists() {
        return Ok(path);
    }
    progress(format!(
        "building the initramfs for {} ({} modules)",
        k.release,
        mods.len()
    ));
    let stage = cache.join("initrd.stage");
    let _ = fs::remove_dir_all(&stage);
    let moddir = stage.join("lib/modules");
    fs::create_dir_all(&moddir).map_err(io_err(format!("cannot create {}", moddir.display())))?;
    fs::create_dir_all(stage.join("bin")).map_err(io_err("cannot create the initramfs bin"))?;
    fs::copy(busybox, stage.join("bin/busybox")).map_err(io_err("cannot copy busybox"))?;
    for m in &mods {
        decompress_module(m, &moddir.join(format!("{}.ko", m.name)))?;
    }
    fs::write(stage.join("modules.list"), &list).map_err(io_err("cannot write modules.list"))?;
    fs::write(stage.join("init"), GUEST_INIT).map_err(io_err("cannot write init"))?;
    command_output(Command::new("chmod").args(["755"]).arg(stage.join("init")))?;
    let tmp = path.with_extension("tmp");
    command_output(
        Command::new("sh")
            .arg("-c")
            .arg("find . | cpio -o -H newc --quiet | gzip -1 > \"$0\"")
            .arg(&tmp)
            .current_dir(&stage),
    )?;
    fs::rename(&tmp, &path).map_err(io_err("cannot move the initramfs into place"))?;
    let _ = fs::remove_dir_all(&stage);
    Ok(path)
}

/// What to run inside the guest.
#[derive(Debug, Clone)]
pub enum Job {
    /// A program and its arguments, run with `exec`.
    Argv(Vec<String>),
    /// A bash script.
    Script(String),
}

/// Quotes one word for bash.
pub fn shell_quote(word: &str) -> String {
    if !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c))
    {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// Environment variables passed from the host into the guest job when set.
pub const PASSED_ENV: &[&str] = &[
    "RUST_BACKTRACE",
    "RUST_LOG",
    "RUST_TEST_THREADS",
    "PROPTEST_CASES",
    "RDMALOG_LAB_LONG",
    "NO_COLOR",
];

/// Renders the job script: exported variables, stdin from /dev/null, then the command.
pub fn render_job(job: &Job, env: &[(String, String)]) -> String {
    let mut s =
        String::from("#!/bin/bash\n# Written by rdmalog-lab for one guest run.\nexec </dev/null\n");
    for name in PASSED_ENV {
        if let Ok(v) = std::env::var(name) {
            s.push_str(&format!("export {name}={}\n", shell_quote(&v)));
        }
    }
    for (k, v) in env {
        s.push_str(&format!("export {k}={}\n", shell_quote(v)));
    }
    match job {
        Job::Argv(argv) => {
            s.push_str("exec");
            for a in argv {
                s.push(' ');
                s.push_str(&shell_quote(a));
            }
            s.push('\n');
        }
        Job::Script(text) => {
            s.push_str(text);
            s.push('\n');
        }
    }
    s
}

/// Host paths the guest job must see even when they live under `/tmp`, which the guest
/// replaces with its own tmpfs: the repository, the cargo target dir and this executable.
pub fn keep_paths() -> Vec<String> {
    let mut keep: Vec<String> = ["RDMALOG_REPO", "CARGO_TARGET_DIR"]
        .iter()
        .filter_map(|k| std::env::var(k).ok())
        .collect();
    if let Ok(exe) = std::env::current_exe() {
        keep.push(exe.display().to_string());
    }
    keep.retain(|p| !p.contains(char::is_whitespace));
    keep
}

/// Everything needed to boot, prepared once.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// The kernel.
    pub kernel: Kernel,
    /// The initramfs.
    pub initrd: PathBuf,
}

/// Installs packages, fetches the kernel and builds the initramfs.
pub fn prepare(cache: &Path, install: bool) -> Result<Prepared> {
    let mut apt_updated = false;
    ensure_packages(install, &mut apt_updated)?;
    fs::create_dir_all(cache).map_err(io_err(format!("cannot create {}", cache.display())))?;
    let kernel = ensure_kernel(cache, &mut apt_updated, install && is_root())?;
    let initrd = ensure_initrd(cache, &kernel)?;
    Ok(Prepared { kernel, initrd })
}

/// The result of one guest run.
#[derive(Debug, Clone)]
pub struct RunOutcome {
    /// The job's exit status.
    pub exit_code: i32,
    /// Seconds from starting QEMU to the fabric being up.
    pub ready_secs: f64,
    /// The guest's uptime when the fabric was up.
    pub guest_uptime: String,
    /// Where the console output was saved.
    pub console_log: PathBuf,
}

enum Line {
    Console(String),
    Qemu(String),
}

/// The QEMU command line of one run.
pub fn qemu_args(cfg: &LabConfig, p: &Prepared, disk: Option<&Path>) -> Vec<String> {
    let mut a: Vec<String> = vec![
        "-accel".into(),
        "tcg".into(),
        // `max` gives TCG guests SSE4.2 and friends, so CPU-specific modules load.
        "-cpu".into(),
        "max".into(),
        "-m".into(),
        cfg.mem_mib.to_string(),
        "-smp".into(),
        cfg.smp.to_string(),
        "-nodefaults".into(),
        "-display".into(),
        "none".into(),
        "-monitor".into(),
        "none".into(),
        "-serial".into(),
        "stdio".into(),
        "-no-reboot".into(),
        "-kernel".into(),
        p.kernel.vmlinuz.display().to_string(),
        "-initrd".into(),
        p.initrd.display().to_string(),
        "-append".into(),
        // `tsc=reliable`: TCG derives the TSC from the host's monotonic clock, so it is
        // steady, but a loaded host delays vCPUs enough for the clocksource watchdog to call
        // it unstable; the switch that follows patches kernel text while other vCPUs run,
        // which under TCG ended a boot in an `int3` oops in `sched_clock_cpu` (an `ops/demo`
        // run on 2026-12-02). Without the watchdog the TSC stays the clocksource.
        "console=ttyS0 quiet panic=-1 tsc=reliable".into(),
        "-virtfs".into(),
        "local,path=/,mount_tag=host,security_model=none,readonly=on,multidevs=remap".into(),
        "-virtfs".into(),
        format!(
            "local,path={},mount_tag=out,security_model=none",
            cfg.out_dir.display()
        ),
    ];
    if let Some(d) = disk {
        a.push("-drive".into());
        a.push(format!("file={},format=raw,if=virtio", d.display()));
    }
    a
}

/// Creates a sparse ext4 image of `mib` MiB at `img`.
fn make_disk(img: &Path, mib: u32) -> Result<PathBuf> {
    let f = fs::File::create(img).map_err(io_err("cannot create the disk image"))?;
    f.set_len(u64::from(mib) << 20)
        .map_err(io_err("cannot size the disk image"))?;
    command_output(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(img))?;
    Ok(img.to_path_buf())
}

/// Boots the lab, runs `job` inside, and returns its outcome. Console lines of the job are
/// printed on stdout as they arrive; progress goes to stderr.
///
/// A guest kernel that panics while booting, before any of our code ran, is booted once more:
/// under TCG with two vCPUs Debian's kernel now and then dies of an `int3` Oops during early
/// boot (live code patching racing the emulated CPUs). The job never started, so nothing is
/// repeated; the retry is announced on stderr.
pub fn run(
    cfg: &LabConfig,
    p: &Prepared,
    job: &Job,
    env: &[(String, String)],
    cwd: &Path,
) -> Result<RunOutcome> {
    match run_once(cfg, p, job, env, cwd) {
        Err(LabError::Guest(why)) if is_early_boot_panic(&why) => {
            eprintln!(
                "lab: the guest kernel panicked while booting, before the job started (a TCG flake); booting again"
            );
            run_once(cfg, p, job, env, cwd)
        }
        other => other,
    }
}

/// Whether a guest failure is a kernel panic before the lab's init ran.
fn is_early_boot_panic(why: &str) -> bool {
    why.contains("while booting the kernel") && why.contains("Kernel panic")
}

fn run_once(
    cfg: &LabConfig,
    p: &Prepared,
    job: &Job,
    env: &[(String, String)],
    cwd: &Path,
) -> Result<RunOutcome> {
    cfg.validate()?;
    let control = cfg.out_dir.join(".lab");
    let _ = fs::remove_dir_all(&control);
    fs::create_dir_all(&control).map_err(io_err(format!("cannot create {}", control.display())))?;
    let write = |name: &str, text: &str| {
        fs::write(control.join(name), text).map_err(io_err(format!("cannot write .lab/{name}")))
    };
    write("boot.sh", GUEST_BOOT)?;
    write("job.sh", &render_job(job, env))?;
    write(
        "env.sh",
        &format!(
            "LAB_HOSTS={}\nLAB_CWD={}\nLAB_KEEP={}\nLAB_DISK={}\n",
            cfg.hosts,
            shell_quote(&cwd.display().to_string()),
            shell_quote(&keep_paths().join(" ")),
            if cfg.disk_mib.is_some() || cfg.disk_image.is_some() {
                "1"
            } else {
                ""
            }
        ),
    )?;
    let disk = match (&cfg.disk_image, cfg.disk_mib) {
        (Some(img), _) if img.exists() => Some(img.clone()),
        (Some(img), Some(mib)) => Some(make_disk(img, mib)?),
        (Some(img), None) => {
            return Err(LabError::Config(format!(
                "disk image {} does not exist: give --disk-mib to create it",
                img.display()
            )));
        }
        (None, Some(mib)) => Some(make_disk(&control.join("disk.img"), mib)?),
        (None, None) => None,
    };
    let console_log = control.join("console.log");
    let mut log = fs::File::create(&console_log).map_err(io_err("cannot create console.log"))?;

    let start = Instant::now();
    // `timeout` is a backstop that kills QEMU even if this process dies first.
    let backstop = cfg.timeout.as_secs() + 30;
    let mut child = Command::new("timeout")
        .args(["-s", "KILL", &backstop.to_string(), "qemu-system-x86_64"])
        .args(qemu_args(cfg, p, disk.as_deref()))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(io_err("cannot start qemu-system-x86_64"))?;
    let (tx, rx) = mpsc::channel::<Line>();
    let stdout = child.stdout.take().expect("stdout was piped");
    let stderr = child.stderr.take().expect("stderr was piped");
    let tx2 = tx.clone();
    thread::spawn(move || {
        let mut r = BufReader::new(stdout);
        let mut buf = Vec::new();
        while r
            .read_until(b'\n', &mut buf)
            .map(|n| n > 0)
            .unwrap_or(false)
        {
            let line = String::from_utf8_lossy(&buf)
                .trim_end_matches(['\r', '\n'])
                .to_string();
            if tx.send(Line::Console(line)).is_err() {
                break;
            }
            buf.clear();
        }
    });
    thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(|l| l.ok()) {
            if tx2.send(Line::Qemu(line)).is_err() {
                break;
            }
        }
    });

    let mut stage = String::from("while booting the kernel");
    let mut ready: Option<f64> = None;
    let mut uptime = String::new();
    let mut guest_error: Option<String> = None;
    let mut exit: Option<i32> = None;
    let mut qemu_lines: Vec<String> = Vec::new();
    let mut tail: Vec<String> = Vec::new();
    let stdout_handle = std::io::stdout();
    loop {
        // (limit to report, time left before it is hit)
        let (limit, left) = match ready {
            Some(ready_secs) => {
                let whole = cfg.timeout.saturating_sub(start.elapsed());
                match cfg.job_timeout {
                    Some(job) => {
                        let job_left = (Duration::from_secs_f64(ready_secs) + job)
                            .saturating_sub(start.elapsed());
                        if job_left < whole {
                            (job, job_left)
                        } else {
                            (cfg.timeout, whole)
                        }
                    }
                    None => (cfg.timeout, whole),
                }
            }
            None => {
                let limit = cfg.boot_timeout.min(cfg.timeout);
                (limit, limit.saturating_sub(start.elapsed()))
            }
        };
        match rx.recv_timeout(left) {
            Ok(Line::Console(line)) => {
                let _ = writeln!(log, "{line}");
                if let Some(marker) = line.strip_prefix("@@LAB:") {
                    let (kind, rest) = marker.split_once(' ').unwrap_or((marker, ""));
                    match kind {
                        "STAGE" => {
                            stage = format!("during {rest}");
                            progress(format!("guest: {rest}"));
                        }
                        "READY" => {
                            let secs = start.elapsed().as_secs_f64();
                            ready = Some(secs);
                            uptime = rest.trim_start_matches("uptime=").to_string();
                            stage = "while the job ran".into();
                            progress(format!(
                                "boot + fabric bring-up took {secs:.1} s ({} hosts, guest uptime {uptime} s)",
                                cfg.hosts
                            ));
                        }
                        "ERROR" => guest_error = Some(rest.to_string()),
                        "EXIT" => exit = rest.trim().parse().ok(),
                        _ => {}
                    }
                    continue;
                }
                if line.ends_with("reboot: Power down") {
                    continue;
                }
                tail.push(line.clone());
                if tail.len() > 5 {
                    tail.remove(0);
                }
                let mut out = stdout_handle.lock();
                let _ = writeln!(out, "{line}");
                let _ = out.flush();
            }
            Ok(Line::Qemu(line)) => {
                let _ = writeln!(log, "qemu: {line}");
                qemu_lines.push(line);
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(LabError::Timeout {
                    seconds: limit.as_secs(),
                    stage: if ready.is_none() {
                        format!("before the fabric was up ({stage})")
                    } else {
                        stage
                    },
                    log: console_log.display().to_string(),
                });
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    let status = child.wait().map_err(io_err("cannot wait for qemu"))?;
    if let Some(cause) = guest_error {
        return Err(LabError::Guest(cause));
    }
    let exit = exit.or_else(|| {
        fs::read_to_string(control.join("rc"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
    });
    match (exit, ready) {
        (Some(code), Some(ready_secs)) => Ok(RunOutcome {
            exit_code: code,
            ready_secs,
            guest_uptime: uptime,
            console_log,
        }),
        _ => {
            let why = if !qemu_lines.is_empty() {
                format!("qemu said: {}", qemu_lines.join(" / "))
            } else {
                format!(
                    "qemu exited with {status} {stage}; last console lines: {}",
                    tail.join(" / ")
                )
            };
            Err(LabError::Guest(format!(
                "the guest stopped before the command finished: {why} (console log: {})",
                console_log.display()
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_panic_while_booting_is_retried() {
        assert!(is_early_boot_panic(
            "the guest stopped before the command finished: qemu exited with exit status: 0 while booting the kernel; last console lines: [ 2.05] Kernel panic - not syncing: Fatal exception in interrupt"
        ));
        assert!(!is_early_boot_panic(
            "the guest stopped before the command finished: qemu exited with exit status: 0 while running the job; last console lines: Kernel panic"
        ));
        assert!(!is_early_boot_panic(
            "the guest stopped before the command finished: qemu exited with exit status: 0 while booting the kernel; last console lines: no init found"
        ));
    }

    #[test]
    fn words_are_quoted_only_when_needed() {
        assert_eq!(shell_quote("target/debug/x"), "target/debug/x");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote(""), "''");
        assert_eq!(shell_quote("$(rm -rf /)"), "'$(rm -rf /)'");
    }

    #[test]
    fn jobs_render_as_exec_or_script() {
        let argv = Job::Argv(vec!["ib_write_lat".into(), "-d".into(), "rxe 1".into()]);
        let s = render_job(&argv, &[("K".into(), "v w".into())]);
        assert!(s.contains("export K='v w'\n"));
        assert!(s.trim_end().ends_with("exec ib_write_lat -d 'rxe 1'"));
        assert!(s.contains("exec </dev/null"));
        let script = render_job(&Job::Script("echo hi; false".into()), &[]);
        assert!(script.trim_end().ends_with("echo hi; false"));
    }

    #[test]
    fn qemu_gets_tcg_the_two_shares_and_the_optional_disk() {
        let cfg = LabConfig::new("/tmp/out".into(), "/tmp/c".into());
        let p = Prepared {
            kernel: Kernel {
                package: "k".into(),
                release: "6.12".into(),
                root: "/r".into(),
                vmlinuz: "/r/boot/vmlinuz".into(),
            },
            initrd: "/c/initrd".into(),
        };
        let a = qemu_args(&cfg, &p, None).join(" ");
        assert!(a.contains("-accel tcg"));
        assert!(a.contains("mount_tag=host,security_model=none,readonly=on"));
        assert!(a.contains("local,path=/tmp/out,mount_tag=out"));
        assert!(!a.contains("-drive"));
        let a = qemu_args(&cfg, &p, Some(Path::new("/tmp/d.img"))).join(" ");
        assert!(a.contains("-drive file=/tmp/d.img,format=raw,if=virtio"));
    }

    #[test]
    fn the_guest_scripts_report_failures_with_markers() {
        assert!(GUEST_INIT.contains("@@LAB:ERROR"));
        assert!(GUEST_BOOT.contains("@@LAB:READY"));
        assert!(GUEST_BOOT.contains("@@LAB:EXIT"));
        assert!(GUEST_BOOT.contains("rdma link add"));
    }

    #[test]
    fn every_veth_end_boots_with_the_netem_the_fault_hooks_change() {
        let add = format!(
            "tc qdisc add dev \"$dev\" root netem limit {}",
            crate::guest::NETEM_LIMIT
        );
        assert!(GUEST_BOOT.contains(&add), "boot.sh lacks `{add}`");
        assert!(GUEST_BOOT.contains(r#"for dev in "v$i" "b$i"; do"#));
    }

    #[test]
    fn cache_dir_honours_the_override() {
        // Only reads the environment; RDMALOG_LAB_CACHE is set by callers, not by this test.
        let d = default_cache_dir();
        assert!(d.ends_with("rdmalog-lab") || std::env::var_os("RDMALOG_LAB_CACHE").is_some());
    }
}
