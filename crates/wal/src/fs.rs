//! The file-system trait in front of the disk: [`StdFs`] for real disks, [`FaultFs`] for crash
//! tests.
//!
//! The wal only needs positioned reads and writes, fdatasync, preallocation, rename, remove and
//! a directory fsync, so that is the whole trait. [`FaultFs`] keeps, per file, the bytes as the
//! process sees them and the bytes that an fdatasync made durable, and per directory the
//! entries as seen and as made durable by a directory fsync. A "crash" keeps only the durable
//! state, optionally with a random subset of the unsynced 512-byte sectors (a torn write) and
//! of the directory changes since each directory's last fsync (written back in any order).

use std::collections::BTreeMap;
use std::fmt;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

/// A file the wal reads and writes at positions.
pub trait WalFile: Send + Sync + fmt::Debug {
    /// Reads exactly `buf.len()` bytes at `offset`; reading past the end is an error.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Writes all of `buf` at `offset`.
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// fdatasync(2): makes the data and the size durable.
    fn sync_data(&self) -> io::Result<()>;
    /// Preallocates `len` bytes (fallocate(2)), extending the size; ENOSPC shows up here.
    fn allocate(&self, len: u64) -> io::Result<()>;
    /// Current size in bytes.
    fn size_bytes(&self) -> io::Result<u64>;
}

/// The directory operations the wal needs.
pub trait FileSystem: Send + Sync + fmt::Debug {
    /// Creates `dir` and its parents.
    fn create_dir_all(&self, dir: &Path) -> io::Result<()>;
    /// File names (not paths) in `dir`.
    fn list(&self, dir: &Path) -> io::Result<Vec<String>>;
    /// Opens an existing file for reading and writing.
    fn open(&self, path: &Path) -> io::Result<Arc<dyn WalFile>>;
    /// Opens an existing file for reading only, so that tools can inspect files they may not
    /// write (another user's, a read-only mount); writes through it fail. The default opens
    /// with [`FileSystem::open`] (the in-memory file systems have no permissions).
    fn open_read_only(&self, path: &Path) -> io::Result<Arc<dyn WalFile>> {
        self.open(path)
    }
    /// Creates a new file (truncating any old one) for reading and writing.
    fn create(&self, path: &Path) -> io::Result<Arc<dyn WalFile>>;
    /// Renames a file, replacing any file at `to`.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Removes a file.
    fn remove(&self, path: &Path) -> io::Result<()>;
    /// fsync(2) of a directory, which makes its entries (creations, renames, removals) durable.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
    /// Takes `dir` (which exists) for one user until the returned guard drops; a second take
    /// while it is held, by another process or in this one, fails with `WouldBlock`. The
    /// default takes nothing: the in-memory file systems have one user by construction.
    fn lock_dir(&self, dir: &Path) -> io::Result<DirLock> {
        let _ = dir;
        Ok(DirLock::unheld())
    }
}

/// A directory taken with [`FileSystem::lock_dir`]: held until dropped (or until the process
/// ends, however it ends).
#[derive(Debug)]
pub struct DirLock {
    _file: Option<File>,
}

impl DirLock {
    /// A lock that holds nothing (a file system with one user, or one that cannot lock).
    pub fn unheld() -> DirLock {
        DirLock { _file: None }
    }
}

/// The file in a directory that [`StdFs`] locks for [`FileSystem::lock_dir`].
pub const LOCK_FILE: &str = "LOCK";

/// The real file system through `std::fs` and rustix.
#[derive(Debug, Default, Clone, Copy)]
pub struct StdFs;

#[derive(Debug)]
struct StdFile(File);

impl WalFile for StdFile {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.0.read_exact_at(buf, offset)
    }
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.0.write_all_at(buf, offset)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.0.sync_data()
    }
    fn allocate(&self, len: u64) -> io::Result<()> {
        match rustix::fs::fallocate(&self.0, rustix::fs::FallocateFlags::empty(), 0, len) {
            Ok(()) => Ok(()),
            // Some file systems cannot preallocate; a sparse file still works, ENOSPC then
            // shows up at write time instead and is handled there too.
            Err(rustix::io::Errno::OPNOTSUPP) => self.0.set_len(len),
            Err(errno) => Err(errno.into()),
        }
    }
    fn size_bytes(&self) -> io::Result<u64> {
        Ok(self.0.metadata()?.len())
    }
}

impl FileSystem for StdFs {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        std::fs::create_dir_all(dir)
    }
    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(dir)? {
            if let Some(name) = entry?.file_name().to_str() {
                names.push(name.to_owned());
            }
        }
        Ok(names)
    }
    fn open(&self, path: &Path) -> io::Result<Arc<dyn WalFile>> {
        Ok(Arc::new(StdFile(
            OpenOptions::new().read(true).write(true).open(path)?,
        )))
    }
    fn open_read_only(&self, path: &Path) -> io::Result<Arc<dyn WalFile>> {
        let file = OpenOptions::new().read(true).open(path)?;
        // O_RDONLY also opens a directory, which O_RDWR refuses: keep `open`'s meaning.
        if !file.metadata()?.is_file() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} is not a regular file", path.display()),
            ));
        }
        Ok(Arc::new(StdFile(file)))
    }
    fn create(&self, path: &Path) -> io::Result<Arc<dyn WalFile>> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)?;
        Ok(Arc::new(StdFile(file)))
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }
    fn remove(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }
    /// An exclusive flock(2) of `dir/LOCK`, which the kernel releases when the process ends,
    /// kill -9 included: nothing to clean up after a crash.
    fn lock_dir(&self, dir: &Path) -> io::Result<DirLock> {
        let path = dir.join(LOCK_FILE);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)?;
        match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => Ok(DirLock { _file: Some(file) }),
            Err(e) if e == rustix::io::Errno::WOULDBLOCK => Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                format!(
                    "{} is in use: another process (or another open in this one) holds {}",
                    dir.display(),
                    path.display()
                ),
            )),
            Err(e) => Err(e.into()),
        }
    }
}

/// Sector size of the torn-write model: the unit that a crash keeps or loses.
pub const FAULT_SECTOR_BYTES: usize = 512;

/// A fault-injecting, in-memory file system. Cloning shares the same state.
#[derive(Clone, Debug, Default)]
pub struct FaultFs {
    state: Arc<Mutex<FaultState>>,
}

#[derive(Debug, Default)]
struct FaultState {
    files: BTreeMap<u64, FaultFile>,
    next_id: u64,
    /// Path → file id as the process sees it.
    entries: BTreeMap<PathBuf, u64>,
    /// Path → file id as made durable by directory fsyncs.
    durable_entries: BTreeMap<PathBuf, u64>,
    /// Bumped at every crash; handles from an older boot fail.
    boot: u64,
    /// Mutating operations performed this boot (writes, syncs, creations, renames, removals).
    ops: u64,
    /// Crash when `ops` reaches this number: that operation and all later ones fail.
    crash_at_op: Option<u64>,
    crashed: bool,
    /// Kill the process when `ops` reaches this number: that operation and all later ones
    /// fail until [`FaultFs::revive`], and nothing written is lost.
    kill_at_op: Option<u64>,
    killed: bool,
    /// Fail the next fdatasync with EIO.
    fail_next_sync: bool,
    /// Fail the next fdatasync of a file whose name ends with this, with EIO.
    fail_next_sync_of: Option<String>,
    /// Fail a read with EIO once this many more reads succeeded.
    fail_read_in: Option<u64>,
    /// While above zero, reads neither fail nor count towards `fail_read_in` (see
    /// [`FaultFs::without_read_faults`]).
    read_faults_held: u32,
    /// Fail the next write with EIO after this many of its bytes reached the file.
    fail_next_write: Option<usize>,
    /// The most bytes ever written but not yet durable at once (see
    /// [`FaultFs::track_unsynced`]), when tracked.
    unsynced_high: Option<u64>,
    /// Sectors written but not synced that a tearing reboot kept, over every reboot.
    torn_kept: u64,
    /// Total bytes of all files may not exceed this (ENOSPC).
    space_limit: Option<u64>,
}

#[derive(Debug, Default, Clone)]
struct FaultFile {
    data: Vec<u8>,
    durable: Vec<u8>,
    /// Sectors written since the last fdatasync.
    dirty_sectors: std::collections::BTreeSet<u64>,
    /// Sectors whose write-back failed (an fdatasync returned EIO): as on Linux, their pages
    /// were marked clean, so the process still reads the new bytes while the disk keeps the
    /// old ones, and no later fdatasync writes them: only a new write to the sector does.
    lost_sectors: std::collections::BTreeSet<u64>,
}

impl FaultState {
    fn used_bytes(&self) -> u64 {
        self.files.values().map(|f| f.data.len() as u64).sum()
    }

    /// Per file, the span of bytes written that differ from the disk's, summed: in sectors
    /// written since the last fdatasync and in sectors whose write-back failed (their bytes
    /// never reach the disk).
    fn unsynced_bytes(&self) -> u64 {
        let mut total = 0;
        for f in self.files.values() {
            let differs = |at: usize| f.data[at] != f.durable.get(at).copied().unwrap_or(0);
            let mut span: Option<(usize, usize)> = None;
            for &sector in f.dirty_sectors.union(&f.lost_sectors) {
                let start = sector as usize * FAULT_SECTOR_BYTES;
                let end = (start + FAULT_SECTOR_BYTES).min(f.data.len());
                for at in (start..end).filter(|&at| differs(at)) {
                    span = Some(span.map_or((at, at), |(lo, hi)| (lo.min(at), hi.max(at))));
                }
            }
            total += span.map_or(0, |(lo, hi)| (hi - lo + 1) as u64);
        }
        total
    }

    /// Counts one mutating operation and fails it if the machine has "crashed" or the process
    /// was "killed".
    fn step(&mut self) -> io::Result<()> {
        self.up()?;
        self.ops += 1;
        if self.crash_at_op.is_some_and(|at| self.ops >= at) {
            self.crashed = true;
            return Err(crashed());
        }
        if self.kill_at_op.is_some_and(|at| self.ops >= at) {
            self.killed = true;
            return Err(killed());
        }
        Ok(())
    }

    /// Fails if the machine is down or the process using the disk was killed.
    fn up(&self) -> io::Result<()> {
        if self.crashed {
            Err(crashed())
        } else if self.killed {
            Err(killed())
        } else {
            Ok(())
        }
    }

    fn gc(&mut self) {
        let live: std::collections::BTreeSet<u64> = self
            .entries
            .values()
            .chain(self.durable_entries.values())
            .copied()
            .collect();
        self.files.retain(|id, _| live.contains(id));
    }
}

fn crashed() -> io::Error {
    io::Error::other("simulated power loss: the machine is down")
}

fn killed() -> io::Error {
    io::Error::other("simulated kill -9: the process using this disk is dead")
}

fn no_space() -> io::Error {
    rustix::io::Errno::NOSPC.into()
}

impl FaultFs {
    /// An empty file system.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, FaultState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Mutating operations performed since the last boot.
    pub fn ops(&self) -> u64 {
        self.lock().ops
    }

    /// Simulates a power loss at the `op`-th mutating operation of this boot (1-based): that
    /// operation and every later one fail until [`FaultFs::reboot`].
    pub fn crash_at_op(&self, op: u64) {
        self.lock().crash_at_op = Some(op);
    }

    /// Simulates a power loss now.
    pub fn crash_now(&self) {
        self.lock().crashed = true;
    }

    /// Whether the simulated machine is down.
    pub fn is_crashed(&self) -> bool {
        self.lock().crashed
    }

    /// Simulates a kill -9 of the process using this disk at its `op`-th mutating operation of
    /// this boot (1-based), in the middle of whatever it was doing (a cut, a snapshot install,
    /// a checkpoint, an append): that operation and every later one, reads included, fail
    /// until [`FaultFs::revive`]. The machine stays up, so nothing written before is lost
    /// (the page cache survives).
    pub fn kill_at_op(&self, op: u64) {
        self.lock().kill_at_op = Some(op);
    }

    /// Whether the process using this disk was killed by [`FaultFs::kill_at_op`].
    pub fn is_killed(&self) -> bool {
        self.lock().killed
    }

    /// Whether nothing can use the disk now: its machine crashed or its process was killed.
    pub fn is_down(&self) -> bool {
        self.lock().up().is_err()
    }

    /// A new process takes the disk over after a kill: clears the kill, and one armed but not
    /// reached. Handles the dead process opened fail from now on, as after a reboot: nothing
    /// it left running can write behind the new process's back.
    pub fn revive(&self) {
        let mut state = self.lock();
        state.killed = false;
        state.kill_at_op = None;
        state.boot += 1;
    }

    /// Makes the next fdatasync fail with EIO.
    pub fn fail_next_sync(&self) {
        self.lock().fail_next_sync = true;
    }

    /// Makes the next fdatasync of a file whose name ends with `suffix` (a segment: `.wal`)
    /// fail with EIO; syncs of other files go through.
    pub fn fail_next_sync_of(&self, suffix: &str) {
        self.lock().fail_next_sync_of = Some(suffix.to_owned());
    }

    /// Makes a read fail with EIO (a bad sector, a flaky controller) once `reads` more reads
    /// succeeded (the next one for 0); later reads succeed.
    pub fn fail_read_after(&self, reads: u64) {
        self.lock().fail_read_in = Some(reads);
    }

    /// Makes the next write fail with EIO after its first `reached` bytes reached the file
    /// (the page cache: a short write, then the error), as a failing disk or controller may
    /// do. Later writes succeed.
    pub fn fail_next_write(&self, reached: usize) {
        self.lock().fail_next_write = Some(reached);
    }

    /// From now on, after every write, measures the bytes written but not durable yet: per
    /// file, the span from the first to the last byte whose content differs from the disk's,
    /// summed over the files (zeroes written over zeroes do not count). Costs a scan of the
    /// written sectors per write; for tests. See [`FaultFs::unsynced_high_water`].
    pub fn track_unsynced(&self) {
        self.lock().unsynced_high.get_or_insert(0);
    }

    /// The most bytes [`FaultFs::track_unsynced`] measured at once since it was called.
    pub fn unsynced_high_water(&self) -> u64 {
        self.lock().unsynced_high.unwrap_or(0)
    }

    /// Runs `f` with this disk's armed read failure held back: reads made meanwhile (a
    /// checker's, from outside the process under test) neither fail nor bring the failure
    /// nearer, so the failure still reaches the process's own read it was drawn for.
    pub fn without_read_faults<T>(&self, f: impl FnOnce() -> T) -> T {
        struct Held<'a>(&'a FaultFs);
        impl Drop for Held<'_> {
            fn drop(&mut self) {
                self.0.lock().read_faults_held -= 1;
            }
        }
        self.lock().read_faults_held += 1;
        let _held = Held(self);
        f()
    }

    /// Disarms a read failure no read has taken yet.
    pub fn clear_read_failure(&self) {
        self.lock().fail_read_in = None;
    }

    /// Whether a read failure is armed and no read has taken it yet.
    pub fn read_failure_armed(&self) -> bool {
        self.lock().fail_read_in.is_some()
    }

    /// Limits the total size of all files (ENOSPC beyond it); `None` lifts the limit.
    pub fn set_space_limit(&self, limit: Option<u64>) {
        self.lock().space_limit = limit;
    }

    /// Total bytes of all files.
    pub fn used_bytes(&self) -> u64 {
        self.lock().used_bytes()
    }

    /// Sectors written since their file's last fdatasync that tearing reboots
    /// ([`FaultFs::reboot`] with a seed) kept, over every reboot: zero means the tears so far
    /// left exactly the durable bytes, as a reboot without a tear would.
    pub fn unsynced_sectors_kept(&self) -> u64 {
        self.lock().torn_kept
    }

    /// Restarts the machine after a crash (or at any time, as a power loss): every file gets
    /// its durable bytes back and every directory its durable entries. With `tear_seed`, each
    /// sector written since the last fdatasync survives with probability one half, chosen by
    /// a xorshift generator from the seed, and so does each change of a directory entry since
    /// the directory's last fsync (a creation, a removal, a rename's new name), each on its
    /// own: a file system may write its directory changes back in any order. Handles from
    /// before fail from now on.
    pub fn reboot(&self, tear_seed: Option<u64>) {
        let mut state = self.lock();
        let mut rng = tear_seed.map(|seed| seed | 1);
        let mut kept_unsynced = 0;
        let mut entries = state.durable_entries.clone();
        if let Some(seed) = tear_seed {
            // A generator of its own (SplitMix64), so that the sectors a seed keeps are as they
            // were, and consecutive seeds draw unlike changes.
            let mut dir_rng = seed ^ 0x5eed_d1e5_0000_0001;
            let mut keep = move || {
                dir_rng = dir_rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
                let mut z = dir_rng;
                z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                (z ^ (z >> 31)) >> 63 == 1
            };
            let changed: std::collections::BTreeSet<&PathBuf> = state
                .entries
                .keys()
                .chain(state.durable_entries.keys())
                .filter(|p| state.entries.get(*p) != state.durable_entries.get(*p))
                .collect();
            for path in changed {
                if keep() {
                    match state.entries.get(path) {
                        Some(&id) => entries.insert(path.clone(), id),
                        None => entries.remove(path),
                    };
                }
            }
        }
        state.durable_entries = entries.clone();
        state.entries = entries;
        for file in state.files.values_mut() {
            let mut kept = std::mem::take(&mut file.durable);
            if let Some(rng) = rng.as_mut() {
                for &sector in &file.dirty_sectors {
                    *rng ^= *rng << 13;
                    *rng ^= *rng >> 7;
                    *rng ^= *rng << 17;
                    if *rng & 1 == 1 {
                        kept_unsynced += 1;
                        let start = sector as usize * FAULT_SECTOR_BYTES;
                        let end = (start + FAULT_SECTOR_BYTES).min(file.data.len());
                        if start < end {
                            if kept.len() < end {
                                kept.resize(end, 0);
                            }
                            kept[start..end].copy_from_slice(&file.data[start..end]);
                        }
                    }
                }
            }
            file.data = kept.clone();
            file.durable = kept;
            file.dirty_sectors.clear();
            file.lost_sectors.clear();
        }
        state.torn_kept += kept_unsynced;
        state.gc();
        state.boot += 1;
        state.ops = 0;
        state.crash_at_op = None;
        state.crashed = false;
        state.kill_at_op = None;
        state.killed = false;
        state.fail_next_sync = false;
        state.fail_next_sync_of = None;
        state.fail_read_in = None;
        state.fail_next_write = None;
    }

    /// The bytes of a file as the process sees them (for tests that corrupt files).
    pub fn read_file(&self, path: &Path) -> Option<Vec<u8>> {
        let state = self.lock();
        state
            .entries
            .get(path)
            .map(|id| state.files[id].data.clone())
    }

    /// Overwrites bytes of a file and makes them durable at once (for tests that corrupt
    /// files, as bit rot would).
    pub fn corrupt(&self, path: &Path, offset: u64, bytes: &[u8]) {
        let mut state = self.lock();
        let id = state.entries[path];
        let file = state.files.get_mut(&id).expect("file of a live entry");
        let end = offset as usize + bytes.len();
        if file.data.len() < end {
            file.data.resize(end, 0);
        }
        file.data[offset as usize..end].copy_from_slice(bytes);
        file.durable = file.data.clone();
    }

    /// Names of the files in `dir` as the process sees them.
    pub fn names(&self, dir: &Path) -> Vec<String> {
        FileSystem::list(self, dir).unwrap_or_default()
    }

    fn handle(&self, id: u64, boot: u64) -> Arc<dyn WalFile> {
        Arc::new(FaultHandle {
            fs: self.clone(),
            id,
            boot,
        })
    }
}

#[derive(Debug)]
struct FaultHandle {
    fs: FaultFs,
    id: u64,
    boot: u64,
}

impl FaultHandle {
    fn with<T>(
        &self,
        mutating: bool,
        f: impl FnOnce(&mut FaultState, u64) -> io::Result<T>,
    ) -> io::Result<T> {
        let mut state = self.fs.lock();
        if state.boot != self.boot {
            return Err(io::Error::other(
                "stale handle of a dead process (from before a simulated reboot or kill)",
            ));
        }
        if mutating {
            state.step()?;
        } else {
            state.up()?;
        }
        if !state.files.contains_key(&self.id) {
            return Err(io::Error::from(io::ErrorKind::NotFound));
        }
        f(&mut state, self.id)
    }
}

impl WalFile for FaultHandle {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.with(false, |state, id| {
            match state.fail_read_in.filter(|_| state.read_faults_held == 0) {
                Some(0) => {
                    state.fail_read_in = None;
                    return Err(rustix::io::Errno::IO.into());
                }
                Some(n) => state.fail_read_in = Some(n - 1),
                None => {}
            }
            let data = &state.files[&id].data;
            let start = offset as usize;
            let end = start
                .checked_add(buf.len())
                .filter(|&end| end <= data.len());
            let end = end.ok_or_else(|| io::Error::from(io::ErrorKind::UnexpectedEof))?;
            buf.copy_from_slice(&data[start..end]);
            Ok(())
        })
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.with(true, |state, id| {
            let end = offset as usize + buf.len();
            let current = state.files[&id].data.len();
            if end > current {
                let grow = (end - current) as u64;
                if state
                    .space_limit
                    .is_some_and(|limit| state.used_bytes() + grow > limit)
                {
                    return Err(no_space());
                }
            }
            // An armed failure is taken by the next write that gets this far.
            let failing = state.fail_next_write.take();
            let buf = &buf[..failing.map_or(buf.len(), |reached| reached.min(buf.len()))];
            let end = offset as usize + buf.len();
            let file = state.files.get_mut(&id).expect("checked above");
            if end > file.data.len() {
                file.data.resize(end, 0);
            }
            file.data[offset as usize..end].copy_from_slice(buf);
            let first = offset / FAULT_SECTOR_BYTES as u64;
            let last = (end as u64).div_ceil(FAULT_SECTOR_BYTES as u64);
            file.dirty_sectors.extend(first..last);
            file.lost_sectors.retain(|s| !(first..last).contains(s));
            if state.unsynced_high.is_some() {
                let now = state.unsynced_bytes();
                state.unsynced_high = state.unsynced_high.map(|h| h.max(now));
            }
            match failing {
                Some(_) => Err(rustix::io::Errno::IO.into()),
                None => Ok(()),
            }
        })
    }

    fn sync_data(&self) -> io::Result<()> {
        self.with(true, |state, id| {
            let named = state.fail_next_sync_of.as_deref().is_some_and(|suffix| {
                state
                    .entries
                    .iter()
                    .any(|(path, &file)| file == id && path.to_string_lossy().ends_with(suffix))
            });
            if named {
                state.fail_next_sync_of = None;
            }
            let fail = std::mem::take(&mut state.fail_next_sync) || named;
            let file = state.files.get_mut(&id).expect("checked above");
            if fail {
                // Like Linux after a failed writeback: the dirty pages are marked clean and
                // their bytes never reach the disk, not even at a later fdatasync.
                let dirty = std::mem::take(&mut file.dirty_sectors);
                file.lost_sectors.extend(dirty);
                return Err(io::Error::from_raw_os_error(
                    rustix::io::Errno::IO.raw_os_error(),
                ));
            }
            // Outside the dirty and the lost sectors the two copies agree (a write marks what
            // it changes dirty; growing a file adds zeros, as the disk would read): the size
            // and the dirty sectors are all there is to copy. Lost sectors keep the disk's old
            // bytes. (Copying the whole file made each fdatasync of a 64 MiB segment cost
            // milliseconds of memcpy in the tests.)
            let len = file.data.len();
            file.durable.resize(len, 0);
            for &sector in &file.dirty_sectors {
                if file.lost_sectors.contains(&sector) {
                    continue;
                }
                let start = sector as usize * FAULT_SECTOR_BYTES;
                let end = (start + FAULT_SECTOR_BYTES).min(len);
                if start < end {
                    file.durable[start..end].copy_from_slice(&file.data[start..end]);
                }
            }
            file.dirty_sectors.clear();
            Ok(())
        })
    }

    fn allocate(&self, len: u64) -> io::Result<()> {
        self.with(true, |state, id| {
            let current = state.files[&id].data.len() as u64;
            if len > current
                && state
                    .space_limit
                    .is_some_and(|limit| state.used_bytes() + len - current > limit)
            {
                return Err(no_space());
            }
            let file = state.files.get_mut(&id).expect("checked above");
            if len as usize > file.data.len() {
                file.data.resize(len as usize, 0);
            }
            Ok(())
        })
    }

    fn size_bytes(&self) -> io::Result<u64> {
        self.with(false, |state, id| Ok(state.files[&id].data.len() as u64))
    }
}

impl FileSystem for FaultFs {
    fn create_dir_all(&self, _dir: &Path) -> io::Result<()> {
        // Directories are implicit: a path's parent is its directory.
        self.lock().up()
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let state = self.lock();
        state.up()?;
        Ok(state
            .entries
            .keys()
            .filter(|path| path.parent() == Some(dir))
            .filter_map(|path| path.file_name()?.to_str().map(str::to_owned))
            .collect())
    }

    fn open(&self, path: &Path) -> io::Result<Arc<dyn WalFile>> {
        let state = self.lock();
        state.up()?;
        let id = *state
            .entries
            .get(path)
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
        let boot = state.boot;
        drop(state);
        Ok(self.handle(id, boot))
    }

    fn create(&self, path: &Path) -> io::Result<Arc<dyn WalFile>> {
        let mut state = self.lock();
        state.step()?;
        let id = state.next_id;
        state.next_id += 1;
        state.files.insert(id, FaultFile::default());
        state.entries.insert(path.to_owned(), id);
        state.gc();
        let boot = state.boot;
        drop(state);
        Ok(self.handle(id, boot))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut state = self.lock();
        state.step()?;
        let id = state
            .entries
            .remove(from)
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
        state.entries.insert(to.to_owned(), id);
        state.gc();
        Ok(())
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        let mut state = self.lock();
        state.step()?;
        state
            .entries
            .remove(path)
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
        state.gc();
        Ok(())
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let mut state = self.lock();
        state.step()?;
        let in_dir = |path: &PathBuf| path.parent() == Some(dir);
        state.durable_entries.retain(|path, _| !in_dir(path));
        let current: Vec<(PathBuf, u64)> = state
            .entries
            .iter()
            .filter(|(path, _)| in_dir(path))
            .map(|(p, id)| (p.clone(), *id))
            .collect();
        state.durable_entries.extend(current);
        state.gc();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crash_keeps_only_synced_bytes_and_entries() {
        let fs = FaultFs::new();
        let dir = Path::new("/log");
        let a = fs.create(&dir.join("a")).unwrap();
        a.write_all_at(b"durable", 0).unwrap();
        a.sync_data().unwrap();
        fs.sync_dir(dir).unwrap();
        a.write_all_at(b"lost", 7).unwrap();
        let b = fs.create(&dir.join("b")).unwrap();
        b.write_all_at(b"data", 0).unwrap();
        b.sync_data().unwrap(); // data durable, but the entry is not
        fs.reboot(None);
        assert_eq!(fs.names(dir), vec!["a".to_owned()]);
        assert_eq!(fs.read_file(&dir.join("a")).unwrap(), b"durable");
        assert!(
            a.size_bytes().is_err(),
            "old handles are stale after a reboot"
        );
    }

    /// An fdatasync copies only the size and the dirty sectors; what it leaves durable is what
    /// copying the whole file (the first implementation) left, lost sectors kept old, over
    /// random writes, partial writes, growths, failed syncs and reboots.
    #[test]
    fn a_sync_leaves_what_copying_the_whole_file_would() {
        let fs = FaultFs::new();
        let path = Path::new("/d/f");
        let mut f = fs.create(path).unwrap();
        fs.sync_dir(Path::new("/d")).unwrap();
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n
        };
        let sector = FAULT_SECTOR_BYTES as u64;
        let mut syncs = [0; 2];
        for step in 0..4000 {
            match next(10) {
                0..=4 => {
                    let at = next(16 * sector);
                    let byte = next(255) as u8 + 1;
                    let len = 1 + next(3 * sector) as usize;
                    if next(8) == 0 {
                        fs.fail_next_write(next(len as u64) as usize);
                    }
                    let _ = f.write_all_at(&vec![byte; len], at);
                }
                5 => {
                    let _ = f.allocate(next(24 * sector));
                }
                6..=8 => {
                    if next(4) == 0 {
                        fs.fail_next_sync();
                    }
                    let expected = {
                        let state = fs.lock();
                        let file = &state.files[&state.entries[path]];
                        let mut d = file.data.clone();
                        for &s in &file.lost_sectors {
                            let start = s as usize * FAULT_SECTOR_BYTES;
                            let end = (start + FAULT_SECTOR_BYTES).min(d.len());
                            for (at, b) in d.iter_mut().enumerate().take(end).skip(start) {
                                *b = file.durable.get(at).copied().unwrap_or(0);
                            }
                        }
                        (file.durable.clone(), d)
                    };
                    let ok = f.sync_data().is_ok();
                    let state = fs.lock();
                    let file = &state.files[&state.entries[path]];
                    syncs[usize::from(ok)] += 1;
                    let want = if ok { &expected.1 } else { &expected.0 };
                    assert_eq!(&file.durable, want, "step {step} (sync ok: {ok})");
                }
                _ => {
                    fs.reboot(Some(next(u64::MAX)).filter(|_| next(2) == 0));
                    f = fs.open(path).unwrap();
                }
            }
        }
        assert!(
            syncs[0] > 100 && syncs[1] > 500,
            "failed and good syncs: {syncs:?}"
        );
    }

    #[test]
    fn eio_and_enospc_are_injected() {
        let fs = FaultFs::new();
        let f = fs.create(Path::new("/d/f")).unwrap();
        fs.fail_next_sync();
        assert_eq!(f.sync_data().unwrap_err().raw_os_error(), Some(5));
        f.sync_data().unwrap();
        fs.set_space_limit(Some(100));
        assert!(crate::WalError::is_no_space(&f.allocate(200).unwrap_err()));
        f.allocate(100).unwrap();
        assert!(crate::WalError::is_no_space(
            &f.write_all_at(&[1], 100).unwrap_err()
        ));
    }

    #[test]
    fn unsynced_bytes_include_a_failed_write_back() {
        let fs = FaultFs::new();
        fs.track_unsynced();
        let f = fs.create(Path::new("/d/f")).unwrap();
        f.write_all_at(&[7; 100], 0).unwrap();
        assert_eq!(fs.unsynced_high_water(), 100);
        fs.fail_next_sync();
        assert!(f.sync_data().is_err());
        // The 100 bytes never reach the disk: a later write beside them is at risk with them.
        f.write_all_at(&[8; 10], 2 * FAULT_SECTOR_BYTES as u64)
            .unwrap();
        assert_eq!(
            fs.unsynced_high_water(),
            2 * FAULT_SECTOR_BYTES as u64 + 10,
            "the lost sector's bytes and the new ones, one span"
        );
        f.write_all_at(&[9; 100], 0).unwrap();
        f.sync_data().unwrap();
        f.write_all_at(&[1], 0).unwrap();
        assert_eq!(
            fs.lock().unsynced_bytes(),
            1,
            "a new write repairs a lost sector"
        );
    }

    #[test]
    fn kill_at_op_fails_that_op_and_later_ones_and_loses_nothing() {
        let fs = FaultFs::new();
        let f = fs.create(Path::new("/d/f")).unwrap();
        fs.kill_at_op(3);
        f.write_all_at(b"written", 0).unwrap();
        assert!(f.write_all_at(b"never", 0).is_err(), "the third op");
        assert!(fs.is_killed() && !fs.is_crashed());
        let mut buf = [0u8; 7];
        assert!(
            f.read_exact_at(&mut buf, 0).is_err(),
            "a dead process reads nothing"
        );
        fs.revive();
        let g = fs.open(Path::new("/d/f")).unwrap();
        g.read_exact_at(&mut buf, 0).unwrap();
        assert_eq!(&buf, b"written", "the page cache survives a kill");
        g.write_all_at(b"again", 0).unwrap();
        assert!(
            f.write_all_at(b"stale", 0).is_err(),
            "the dead process's handle must not write behind the new one's back"
        );
    }

    #[test]
    fn crash_at_op_fails_that_op_and_later_ones() {
        let fs = FaultFs::new();
        let f = fs.create(Path::new("/d/f")).unwrap();
        fs.crash_at_op(3);
        f.write_all_at(b"x", 0).unwrap();
        assert!(f.sync_data().is_err());
        assert!(f.write_all_at(b"y", 0).is_err());
        assert!(fs.is_crashed());
    }

    /// A tearing reboot keeps each directory change since the last directory fsync on its
    /// own (two removals and a creation reach the disk in every combination over the seeds);
    /// a reboot without a tear keeps none of them, and synced entries always stay.
    #[test]
    fn a_tearing_reboot_keeps_any_subset_of_the_unsynced_directory_changes() {
        let dir = Path::new("/log");
        let mut seen = std::collections::BTreeSet::new();
        for seed in 0..64u64 {
            let fs = FaultFs::new();
            for name in ["a", "b", "kept"] {
                fs.create(&dir.join(name)).unwrap().sync_data().unwrap();
            }
            fs.sync_dir(dir).unwrap();
            fs.remove(&dir.join("a")).unwrap();
            fs.remove(&dir.join("b")).unwrap();
            fs.create(&dir.join("c")).unwrap();
            fs.reboot((seed > 0).then_some(seed));
            let names = fs.names(dir);
            assert!(names.contains(&"kept".to_owned()), "{names:?}");
            if seed == 0 {
                assert_eq!(names, ["a", "b", "kept"], "without a tear");
            }
            seen.insert(names);
        }
        assert_eq!(seen.len(), 8, "not every subset of three changes: {seen:?}");
    }

    /// A read failure armed after `n` reads takes the read after them; reads made while
    /// faults are held back neither fail nor count.
    #[test]
    fn a_read_failure_takes_the_read_it_was_drawn_for() {
        let fs = FaultFs::new();
        let f = fs.create(Path::new("/d/f")).unwrap();
        f.write_all_at(b"bytes", 0).unwrap();
        let mut buf = [0u8; 5];
        fs.fail_read_after(2);
        for _ in 0..3 {
            fs.without_read_faults(|| f.read_exact_at(&mut buf, 0))
                .unwrap();
        }
        f.read_exact_at(&mut buf, 0).unwrap();
        f.read_exact_at(&mut buf, 0).unwrap();
        assert!(fs.read_failure_armed());
        assert!(
            f.read_exact_at(&mut buf, 0).is_err(),
            "the third read fails"
        );
        assert!(!fs.read_failure_armed());
        f.read_exact_at(&mut buf, 0).unwrap();
    }
}
