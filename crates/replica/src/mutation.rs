//! Test-only: the file system the wal gets under [`crate::Mutation::AckWithoutFsync`]. Its
//! fdatasync returns success without syncing, so the replica acknowledges appends that a power
//! loss then takes away. The simulator's mutation check proves its checkers notice.

use std::io;
use std::path::Path;
use std::sync::Arc;

use wal::fs::{FileSystem, WalFile};

/// A file system whose files never really sync.
#[derive(Debug)]
pub(crate) struct NoSyncFs(pub(crate) Arc<dyn FileSystem>);

#[derive(Debug)]
struct NoSyncFile(Arc<dyn WalFile>);

impl WalFile for NoSyncFile {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.0.read_exact_at(buf, offset)
    }
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.0.write_all_at(buf, offset)
    }
    fn sync_data(&self) -> io::Result<()> {
        Ok(())
    }
    fn allocate(&self, len: u64) -> io::Result<()> {
        self.0.allocate(len)
    }
    fn size_bytes(&self) -> io::Result<u64> {
        self.0.size_bytes()
    }
}

impl FileSystem for NoSyncFs {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        self.0.create_dir_all(dir)
    }
    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        self.0.list(dir)
    }
    fn open(&self, path: &Path) -> io::Result<Arc<dyn WalFile>> {
        Ok(Arc::new(NoSyncFile(self.0.open(path)?)))
    }
    fn create(&self, path: &Path) -> io::Result<Arc<dyn WalFile>> {
        Ok(Arc::new(NoSyncFile(self.0.create(path)?)))
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.0.rename(from, to)
    }
    fn remove(&self, path: &Path) -> io::Result<()> {
        self.0.remove(path)
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.0.sync_dir(dir)
    }
    fn lock_dir(&self, dir: &Path) -> io::Result<wal::fs::DirLock> {
        self.0.lock_dir(dir)
    }
}
