//! raft-rs's view of the log: a [`raft::Storage`] over our wal, plus the durable raft state
//! (HardState and ConfState) in a small checksummed file.
//!
//! Entries live once, in the wal; raft-rs reads them back through [`WalStorage`]. A payload
//! carries its raft entry type in its first byte ([`TAG_NORMAL`], [`TAG_CONF_CHANGE_V2`], ...);
//! an empty payload is raft's own no-op entry. Session entries ([`TAG_SESSION_OPEN`],
//! [`TAG_SESSION`], see [`crate::sessions`]) are raft's normal entries.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use raft::prelude::{ConfState, Entry, EntryType, HardState, Snapshot};
use raft::{GetEntriesContext, RaftState, StorageError};
use wal::fs::FileSystem;
use wal::{Index, Wal};

use crate::MAX_MEMBERS;

/// First payload byte of an application entry.
pub const TAG_NORMAL: u8 = 1;
/// First payload byte of a ConfChangeV2 entry.
pub const TAG_CONF_CHANGE_V2: u8 = 2;
/// First payload byte of a (v1) ConfChange entry.
pub const TAG_CONF_CHANGE: u8 = 3;
/// First payload byte of an entry that opens a client session (no more bytes): the session's
/// id is the entry's index.
pub const TAG_SESSION_OPEN: u8 = 4;
/// First payload byte of an application entry appended in a session: then the session id
/// and the entry's sequence number (u64 little-endian each), then the application's bytes.
pub const TAG_SESSION: u8 = 5;
/// Bytes before the application's own in a [`TAG_SESSION`] payload.
pub const SESSION_HEADER_BYTES: usize = 17;
/// The most bytes a stored payload adds to the application's.
pub const MAX_ENTRY_OVERHEAD: usize = SESSION_HEADER_BYTES;

/// The first bytes of the payload of an application entry appended as number `seq` of session
/// `session` (the application's bytes follow).
pub fn session_header(session: u64, seq: u64) -> [u8; SESSION_HEADER_BYTES] {
    let mut h = [0u8; SESSION_HEADER_BYTES];
    h[0] = TAG_SESSION;
    h[1..9].copy_from_slice(&session.to_le_bytes());
    h[9..17].copy_from_slice(&seq.to_le_bytes());
    h
}

/// What a stored payload is, to the application.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PayloadKind {
    /// An application entry; its own bytes start at `skip`.
    Application {
        /// Bytes before the application's.
        skip: usize,
        /// The session and sequence number it was appended with, if any.
        session: Option<(u64, u64)>,
    },
    /// Opens session `index`.
    SessionOpen,
    /// raft's own: a no-op or a membership change.
    Internal,
}

/// Classifies a stored payload (its tag, and a session entry's header).
pub fn payload_kind(payload: &[u8]) -> PayloadKind {
    match payload.first() {
        Some(&TAG_NORMAL) => PayloadKind::Application {
            skip: 1,
            session: None,
        },
        Some(&TAG_SESSION) if payload.len() >= SESSION_HEADER_BYTES => {
            let id = u64::from_le_bytes(payload[1..9].try_into().expect("8 bytes"));
            let seq = u64::from_le_bytes(payload[9..17].try_into().expect("8 bytes"));
            PayloadKind::Application {
                skip: SESSION_HEADER_BYTES,
                session: Some((id, seq)),
            }
        }
        Some(&TAG_SESSION_OPEN) => PayloadKind::SessionOpen,
        _ => PayloadKind::Internal,
    }
}

/// Whether a normal entry's stored payload is well formed: an empty payload is raft's no-op.
fn normal_payload_ok(payload: &[u8]) -> bool {
    match payload.first() {
        Some(&TAG_NORMAL) => true,
        Some(&TAG_SESSION) => payload.len() >= SESSION_HEADER_BYTES,
        Some(&TAG_SESSION_OPEN) => payload.len() == 1,
        _ => false,
    }
}

/// Builds raft's entry from a stored payload it owns: an application entry's data is the
/// buffer itself (no copy; the wal reads into a buffer of the payload's size), a conf change's
/// is copied without its tag.
pub fn entry_from_owned(index: u64, term: u64, payload: Vec<u8>) -> Result<Entry, String> {
    if normal_payload_ok(&payload) {
        let mut e = Entry::default();
        e.index = index;
        e.term = term;
        e.data = Bytes::from(payload);
        return Ok(e);
    }
    entry_from_payload(index, term, &payload)
}

/// Bytes a [`PayloadArena`] takes from the allocator at a time.
const ARENA_CHUNK_BYTES: usize = 64 * 1024;

/// Entry payloads cut from shared chunks: each payload is a [`Bytes`] view of a chunk, so
/// building an entry allocates once per chunk instead of once per entry, and raft-rs's clones
/// of the entry (its unstable log, its messages, the recent-entries cache) count a reference
/// instead of first moving a `Vec`'s bytes behind a shared header (one more allocation per
/// entry). A chunk is freed when the last entry cut from it is dropped; entries are dropped
/// roughly in log order, so the memory held beyond the live entries is about one chunk. A
/// payload of half a chunk or more gets a buffer of its own.
#[derive(Debug, Default)]
pub struct PayloadArena {
    chunk: BytesMut,
}

impl PayloadArena {
    /// The concatenation of `parts` as one payload.
    pub fn copy(&mut self, parts: &[&[u8]]) -> Bytes {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if len >= ARENA_CHUNK_BYTES / 2 {
            let mut own = BytesMut::with_capacity(len);
            parts.iter().for_each(|p| own.extend_from_slice(p));
            return own.freeze();
        }
        if self.chunk.capacity() - self.chunk.len() < len {
            self.chunk = BytesMut::with_capacity(ARENA_CHUNK_BYTES);
        }
        parts.iter().for_each(|p| self.chunk.extend_from_slice(p));
        self.chunk.split().freeze()
    }
}

/// Builds raft's entry from a stored payload.
pub fn entry_from_payload(index: u64, term: u64, payload: &[u8]) -> Result<Entry, String> {
    build_entry(index, term, payload, Bytes::copy_from_slice)
}

/// [`entry_from_payload`] with the entry's data cut from `arena` (the fast path's accept).
pub fn entry_from_payload_in(
    arena: &mut PayloadArena,
    index: u64,
    term: u64,
    payload: &[u8],
) -> Result<Entry, String> {
    build_entry(index, term, payload, |data| arena.copy(&[data]))
}

fn build_entry(
    index: u64,
    term: u64,
    payload: &[u8],
    copy: impl FnOnce(&[u8]) -> Bytes,
) -> Result<Entry, String> {
    let mut e = Entry::default();
    e.index = index;
    e.term = term;
    match payload.first() {
        None => {}
        Some(_) if normal_payload_ok(payload) => e.data = copy(payload),
        Some(&TAG_CONF_CHANGE_V2) => {
            e.set_entry_type(EntryType::EntryConfChangeV2);
            e.data = copy(&payload[1..]);
        }
        Some(&TAG_CONF_CHANGE) => {
            e.set_entry_type(EntryType::EntryConfChange);
            e.data = copy(&payload[1..]);
        }
        Some(t) => {
            return Err(format!(
                "entry {index} has type tag {t}, unknown or with a malformed header"
            ));
        }
    }
    Ok(e)
}

/// The payload to store for raft's entry: application entries already carry their tag, so
/// only conf changes are copied (into `scratch`).
pub fn payload_of<'a>(e: &'a Entry, scratch: &'a mut Vec<u8>) -> &'a [u8] {
    let tag = match e.get_entry_type() {
        EntryType::EntryNormal => return &e.data,
        EntryType::EntryConfChangeV2 => TAG_CONF_CHANGE_V2,
        EntryType::EntryConfChange => TAG_CONF_CHANGE,
    };
    scratch.clear();
    scratch.push(tag);
    scratch.extend_from_slice(&e.data);
    scratch
}

const STATE_MAGIC: &[u8; 4] = b"RLRS";
/// Version 2 added the membership history; version 3 the amnesia guard ([`Guard`]). Version
/// 1 and 2 files are still read, with the guard's safe default (ring in use, not recovering).
const STATE_VERSION: u32 = 3;
/// Most membership changes the history keeps; older ones fold into its base.
pub const MAX_CONF_HISTORY: usize = 256;

/// The membership as of every index since the latest checkpoint: a checkpoint must record the
/// membership as of its own index, which differs from the current one when a change was
/// applied after it. Kept in the raft-state file.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ConfHistory {
    /// The index the base membership holds at (the latest checkpoint's, or 0).
    pub base_index: u64,
    /// The membership as of `base_index`.
    pub base: ConfState,
    /// The membership after each change applied since, by the change's index.
    pub changes: std::collections::BTreeMap<u64, ConfState>,
}

impl ConfHistory {
    /// A history that starts with `cs` at `index`.
    pub fn new(index: u64, cs: ConfState) -> Self {
        ConfHistory {
            base_index: index,
            base: cs,
            changes: Default::default(),
        }
    }

    /// The index of the latest change after the base, if any.
    pub fn last_change(&self) -> Option<u64> {
        self.changes.last_key_value().map(|(&i, _)| i)
    }

    /// The index the latest membership is as of: the latest change, or else the base.
    pub fn as_of(&self) -> u64 {
        self.last_change().unwrap_or(self.base_index)
    }

    /// The membership as of `index`, if the history reaches back that far.
    pub fn at(&self, index: u64) -> Option<&ConfState> {
        if index < self.base_index {
            return None;
        }
        Some(
            self.changes
                .range(..=index)
                .next_back()
                .map_or(&self.base, |(_, cs)| cs),
        )
    }

    /// Records the membership after the change at `index`, unless a change at or after it is
    /// known already (a restart replays applied changes, which must not rewrite history).
    pub fn record(&mut self, index: u64, after: ConfState) {
        let known = self
            .changes
            .keys()
            .next_back()
            .copied()
            .unwrap_or(self.base_index);
        if index > known {
            self.changes.insert(index, after);
        }
        while self.changes.len() > MAX_CONF_HISTORY {
            let (i, cs) = self.changes.pop_first().expect("not empty");
            self.base_index = i;
            self.base = cs;
        }
    }

    /// Forgets the history below `index` (a checkpoint at `index`).
    pub fn compact(&mut self, index: u64) {
        if let Some(cs) = self.at(index).cloned() {
            self.changes = self.changes.split_off(&(index + 1));
            self.base_index = index;
            self.base = cs;
        }
    }
}
/// The amnesia guard of `Durability::Memory` (ARCHITECTURE.md, "Recovering after a machine
/// crash"), kept in the raft-state file beside the HardState.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Guard {
    /// Written `true` (durably) before a process uses a shared-memory ring, `false` only by a
    /// clean close once the segment files hold everything the ring did. A start that finds it
    /// `true` and no ring has lost entries it may have acknowledged.
    pub ring_in_use: bool,
    /// `Some(t)` while this node is recovering from such a loss: every acknowledgement it may
    /// have lost was given in a term at or below `t`. It does not vote or campaign until its
    /// committed log holds an entry of a term above `t`.
    pub recovering_above_term: Option<u64>,
    /// Written `true` in the first store of a data dir that was new while this node is one of
    /// several voters, `false` once every other voter told it its term
    /// ([`crate::recovering::Unproven`]): until then it does not vote or campaign.
    pub unproven: bool,
}

impl Default for Guard {
    /// What a file written before the guard existed implies: the ring may be in use (so a
    /// missing ring is treated as lost), and the node is not recovering.
    fn default() -> Self {
        Guard {
            ring_in_use: true,
            recovering_above_term: None,
            unproven: false,
        }
    }
}

/// What the raft-state file holds.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StoredState {
    /// Term, vote, commit.
    pub hs: HardState,
    /// The current membership.
    pub cs: ConfState,
    /// The membership as of each index since the latest checkpoint.
    pub history: ConfHistory,
    /// The amnesia guard.
    pub guard: Guard,
}

/// The durable raft state: HardState, ConfState, the membership history and the amnesia
/// guard. The guard changes rarely, so the file keeps the latest one and every store writes
/// it again.
#[derive(Debug)]
pub struct StateFile {
    fs: Arc<dyn FileSystem>,
    dir: PathBuf,
    guard: Guard,
}

impl StateFile {
    /// The state file in `dir`.
    pub fn new(fs: Arc<dyn FileSystem>, dir: &Path) -> Self {
        StateFile {
            fs,
            dir: dir.to_path_buf(),
            guard: Guard {
                ring_in_use: false,
                recovering_above_term: None,
                unproven: false,
            },
        }
    }

    /// The guard the file holds (as loaded, or as last stored).
    pub fn guard(&self) -> Guard {
        self.guard
    }

    /// Stores the state with a new guard.
    pub fn store_guard(
        &mut self,
        guard: Guard,
        hs: &HardState,
        cs: &ConfState,
        history: &ConfHistory,
    ) -> Result<(), String> {
        let old = std::mem::replace(&mut self.guard, guard);
        let r = self.store(hs, cs, history);
        if r.is_err() {
            self.guard = old;
        }
        r
    }

    fn path(&self) -> PathBuf {
        self.dir.join("raft-state")
    }

    /// Reads the state, `None` when there is none yet; later stores keep the guard it read.
    pub fn load(&mut self) -> Result<Option<StoredState>, String> {
        let names = self
            .fs
            .list(&self.dir)
            .map_err(|e| format!("cannot list {}: {e}", self.dir.display()))?;
        if !names.iter().any(|n| n == "raft-state") {
            return Ok(None);
        }
        let f = self
            .fs
            .open(&self.path())
            .map_err(|e| format!("cannot open raft-state: {e}"))?;
        let len = f.size_bytes().map_err(|e| e.to_string())? as usize;
        if !(12..=12 + 64 + 16 + 16 * MAX_MEMBERS * (2 + MAX_CONF_HISTORY) + 16 * MAX_CONF_HISTORY)
            .contains(&len)
        {
            return Err(format!(
                "raft-state has an impossible length of {len} bytes"
            ));
        }
        let mut buf = vec![0u8; len];
        f.read_exact_at(&mut buf, 0)
            .map_err(|e| format!("cannot read raft-state: {e}"))?;
        if &buf[0..4] != STATE_MAGIC {
            return Err("raft-state has a bad magic".into());
        }
        let version = u32::from_le_bytes(buf[4..8].try_into().expect("4 bytes"));
        if !(1..=STATE_VERSION).contains(&version) {
            return Err(format!(
                "raft-state has version {version}, expected {STATE_VERSION}"
            ));
        }
        let crc = u32::from_le_bytes(buf[8..12].try_into().expect("4 bytes"));
        if crc32c::crc32c(&buf[12..]) != crc {
            return Err("raft-state fails its checksum".into());
        }
        let mut r = Reader { buf: &buf[12..] };
        let mut hs = HardState::default();
        hs.term = r.u64()?;
        hs.vote = r.u64()?;
        hs.commit = r.u64()?;
        let cs = decode_conf(&mut r)?;
        let history = if version == 1 {
            ConfHistory::new(0, cs.clone())
        } else {
            let base_index = r.u64()?;
            let base = decode_conf(&mut r)?;
            let n = r.u64()? as usize;
            if n > MAX_CONF_HISTORY {
                return Err(format!("raft-state lists {n} membership changes"));
            }
            let mut h = ConfHistory::new(base_index, base);
            for _ in 0..n {
                let index = r.u64()?;
                let cs = decode_conf(&mut r)?;
                h.changes.insert(index, cs);
            }
            h
        };
        let guard = if version >= 3 {
            let flags = r.u64()?;
            let term = r.u64()?;
            if flags & !7 != 0 {
                return Err(format!("raft-state has unknown guard flags {flags:#x}"));
            }
            Guard {
                ring_in_use: flags & 1 != 0,
                recovering_above_term: (flags & 2 != 0).then_some(term),
                unproven: flags & 4 != 0,
            }
        } else {
            Guard::default()
        };
        self.guard = guard;
        Ok(Some(StoredState {
            hs,
            cs,
            history,
            guard,
        }))
    }

    /// Writes the state durably: a new file, fdatasync, rename over the old one, directory
    /// fsync. A crash leaves the old or the new state, never a mix.
    pub fn store(
        &self,
        hs: &HardState,
        cs: &ConfState,
        history: &ConfHistory,
    ) -> Result<(), String> {
        let mut body = Vec::with_capacity(256);
        for v in [hs.term, hs.vote, hs.commit] {
            body.extend_from_slice(&v.to_le_bytes());
        }
        encode_conf(cs, &mut body);
        body.extend_from_slice(&history.base_index.to_le_bytes());
        encode_conf(&history.base, &mut body);
        body.extend_from_slice(&(history.changes.len() as u64).to_le_bytes());
        for (index, cs) in &history.changes {
            body.extend_from_slice(&index.to_le_bytes());
            encode_conf(cs, &mut body);
        }
        let g = self.guard;
        let flags = u64::from(g.ring_in_use)
            | (u64::from(g.recovering_above_term.is_some()) << 1)
            | (u64::from(g.unproven) << 2);
        body.extend_from_slice(&flags.to_le_bytes());
        body.extend_from_slice(&g.recovering_above_term.unwrap_or(0).to_le_bytes());
        let mut buf = Vec::with_capacity(body.len() + 12);
        buf.extend_from_slice(STATE_MAGIC);
        buf.extend_from_slice(&STATE_VERSION.to_le_bytes());
        buf.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
        buf.extend_from_slice(&body);
        write_atomically(&*self.fs, &self.dir, "raft-state", &buf)
    }
}

fn encode_conf(cs: &ConfState, body: &mut Vec<u8>) {
    for list in [
        &cs.voters,
        &cs.learners,
        &cs.voters_outgoing,
        &cs.learners_next,
    ] {
        body.extend_from_slice(&(list.len() as u64).to_le_bytes());
        for id in list {
            body.extend_from_slice(&id.to_le_bytes());
        }
    }
    body.extend_from_slice(&u64::from(cs.auto_leave).to_le_bytes());
}

fn decode_conf(r: &mut Reader<'_>) -> Result<ConfState, String> {
    let mut cs = ConfState::default();
    for list in 0..4 {
        let n = r.u64()? as usize;
        if n > MAX_MEMBERS {
            return Err(format!(
                "the membership lists {n} members (at most {MAX_MEMBERS})"
            ));
        }
        let ids: Vec<u64> = (0..n).map(|_| r.u64()).collect::<Result<_, _>>()?;
        match list {
            0 => cs.voters = ids,
            1 => cs.learners = ids,
            2 => cs.voters_outgoing = ids,
            _ => cs.learners_next = ids,
        }
    }
    cs.auto_leave = r.u64()? != 0;
    Ok(cs)
}

/// Replaces `dir/name` durably: a new file, fdatasync, rename over the old one, directory
/// fsync. A crash leaves the old or the new file, never a mix.
fn write_atomically(
    fs: &dyn FileSystem,
    dir: &Path,
    name: &str,
    bytes: &[u8],
) -> Result<(), String> {
    let tmp = dir.join(format!("{name}.tmp"));
    let f = fs
        .create(&tmp)
        .map_err(|e| format!("cannot create {name}.tmp: {e}"))?;
    f.write_all_at(bytes, 0)
        .map_err(|e| format!("cannot write {name}.tmp: {e}"))?;
    f.sync_data()
        .map_err(|e| format!("cannot sync {name}.tmp: {e}"))?;
    fs.rename(&tmp, &dir.join(name))
        .map_err(|e| format!("cannot rename {name}: {e}"))?;
    fs.sync_dir(dir)
        .map_err(|e| format!("cannot sync {}: {e}", dir.display()))
}

const SNAPSHOT_MAGIC: &[u8; 4] = b"RLSN";
/// Version 2 added the session table to the data ([`CheckpointData`]); a version 1 file
/// reads as having no sessions.
const SNAPSHOT_VERSION: u32 = 2;
/// Largest snapshot file this version reads: 1 GiB of application state, far above
/// `ReplicaConfig::max_snapshot_bytes`'s default.
pub const MAX_SNAPSHOT_FILE_BYTES: u64 = 1 << 30;

/// The latest snapshot (checkpoint): raft's snapshot metadata and its data, which is the log
/// position after the snapshot's last entry (an 8-byte little-endian Lsn) followed by the
/// application's state. Layout: magic `RLSN`, version u32 LE, crc32c u32 LE of the rest, then
/// index u64, term u64, the membership (as in raft-state), data length u64, data.
#[derive(Debug)]
pub struct SnapshotFile {
    fs: Arc<dyn FileSystem>,
    dir: PathBuf,
}

impl SnapshotFile {
    /// The snapshot file in `dir`.
    pub fn new(fs: Arc<dyn FileSystem>, dir: &Path) -> Self {
        SnapshotFile {
            fs,
            dir: dir.to_path_buf(),
        }
    }

    /// Reads the snapshot, `None` when there is none.
    pub fn load(&self) -> Result<Option<Snapshot>, String> {
        let names = self
            .fs
            .list(&self.dir)
            .map_err(|e| format!("cannot list {}: {e}", self.dir.display()))?;
        if !names.iter().any(|n| n == "snapshot") {
            return Ok(None);
        }
        let f = self
            .fs
            .open(&self.dir.join("snapshot"))
            .map_err(|e| format!("cannot open the snapshot: {e}"))?;
        let len = f.size_bytes().map_err(|e| e.to_string())?;
        if !(12 + 24..=12 + 80 + 16 * MAX_MEMBERS as u64 + MAX_SNAPSHOT_FILE_BYTES).contains(&len) {
            return Err(format!(
                "the snapshot file has an impossible length of {len} bytes"
            ));
        }
        let mut buf = vec![0u8; len as usize];
        f.read_exact_at(&mut buf, 0)
            .map_err(|e| format!("cannot read the snapshot: {e}"))?;
        if &buf[0..4] != SNAPSHOT_MAGIC {
            return Err("the snapshot file has a bad magic".into());
        }
        let version = u32::from_le_bytes(buf[4..8].try_into().expect("4 bytes"));
        if version != SNAPSHOT_VERSION && version != 1 {
            return Err(format!(
                "the snapshot file has version {version}, expected {SNAPSHOT_VERSION}"
            ));
        }
        let crc = u32::from_le_bytes(buf[8..12].try_into().expect("4 bytes"));
        if crc32c::crc32c(&buf[12..]) != crc {
            return Err("the snapshot file fails its checksum".into());
        }
        let mut r = Reader { buf: &buf[12..] };
        let mut snap = Snapshot::default();
        snap.mut_metadata().index = r.u64()?;
        snap.mut_metadata().term = r.u64()?;
        *snap.mut_metadata().mut_conf_state() = decode_conf(&mut r)?;
        let n = r.u64()? as usize;
        if n != r.buf.len() {
            return Err(format!(
                "the snapshot file claims {n} bytes of data but holds {}",
                r.buf.len()
            ));
        }
        snap.data = if version == 1 {
            // The Lsn, then the state: no session table yet.
            if r.buf.len() < 8 {
                return Err("the snapshot's data lacks its log position".into());
            }
            let mut d = Vec::with_capacity(r.buf.len() + 4);
            d.extend_from_slice(&r.buf[..8]);
            d.extend_from_slice(&0u32.to_le_bytes());
            d.extend_from_slice(&r.buf[8..]);
            d.into()
        } else {
            Bytes::copy_from_slice(r.buf)
        };
        Ok(Some(snap))
    }

    /// Writes the snapshot durably (see [`write_atomically`]).
    pub fn store(&self, snap: &Snapshot) -> Result<(), String> {
        let meta = snap.get_metadata();
        let mut body = Vec::with_capacity(snap.data.len() + 128);
        body.extend_from_slice(&meta.index.to_le_bytes());
        body.extend_from_slice(&meta.term.to_le_bytes());
        encode_conf(meta.get_conf_state(), &mut body);
        body.extend_from_slice(&(snap.data.len() as u64).to_le_bytes());
        body.extend_from_slice(&snap.data);
        let mut buf = Vec::with_capacity(body.len() + 12);
        buf.extend_from_slice(SNAPSHOT_MAGIC);
        buf.extend_from_slice(&SNAPSHOT_VERSION.to_le_bytes());
        buf.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
        buf.extend_from_slice(&body);
        write_atomically(&*self.fs, &self.dir, "snapshot", &buf)
    }
}

/// A checkpoint's data, as a raft snapshot carries it: the log position (u64 Lsn) right after
/// its last entry, the length (u32) of the session table as of its index, the table
/// ([`crate::sessions::Sessions::encode`], or nothing for an empty one), the application's
/// state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckpointData<'a> {
    /// The log position after the checkpoint's last entry.
    pub lsn: u64,
    /// The encoded session table (empty: no sessions).
    pub sessions: &'a [u8],
    /// The application's state.
    pub state: &'a [u8],
}

impl<'a> CheckpointData<'a> {
    /// Bytes before the session table.
    pub const HEADER_BYTES: usize = 12;

    /// The data's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut d = Vec::with_capacity(Self::HEADER_BYTES + self.sessions.len() + self.state.len());
        d.extend_from_slice(&self.lsn.to_le_bytes());
        d.extend_from_slice(&(self.sessions.len() as u32).to_le_bytes());
        d.extend_from_slice(self.sessions);
        d.extend_from_slice(self.state);
        d
    }

    /// Splits a snapshot's data, checking the session table's length against the bytes.
    pub fn decode(data: &'a [u8]) -> Result<Self, String> {
        if data.len() < Self::HEADER_BYTES {
            return Err(format!(
                "a checkpoint's data of {} bytes lacks its 12-byte header",
                data.len()
            ));
        }
        let lsn = u64::from_le_bytes(data[..8].try_into().expect("8 bytes"));
        let n = u32::from_le_bytes(data[8..12].try_into().expect("4 bytes")) as usize;
        let rest = &data[Self::HEADER_BYTES..];
        if n > rest.len() {
            return Err(format!(
                "a checkpoint's session table claims {n} bytes, and {} follow",
                rest.len()
            ));
        }
        Ok(CheckpointData {
            lsn,
            sessions: &rest[..n],
            state: &rest[n..],
        })
    }

    /// The session table it records.
    pub fn session_table(&self) -> Result<crate::sessions::Sessions, String> {
        if self.sessions.is_empty() {
            return Ok(Default::default());
        }
        crate::sessions::Sessions::decode(self.sessions)
    }
}

/// The log position a snapshot's data records (its first 8 bytes), if the data has one.
pub fn snapshot_lsn(snap: &Snapshot) -> Option<u64> {
    let head: [u8; 8] = snap.data.get(..8)?.try_into().ok()?;
    Some(u64::from_le_bytes(head))
}

struct Reader<'a> {
    buf: &'a [u8],
}

impl Reader<'_> {
    fn u64(&mut self) -> Result<u64, String> {
        if self.buf.len() < 8 {
            return Err("raft-state is truncated".into());
        }
        let (head, rest) = self.buf.split_at(8);
        self.buf = rest;
        Ok(u64::from_le_bytes(head.try_into().expect("8 bytes")))
    }
}

/// raft-rs's storage over the wal.
#[derive(Debug)]
pub struct WalStorage {
    wal: Arc<Wal>,
    hard_state: HardState,
    conf_state: ConfState,
    /// Index and term of the entry just before the first one held (0, 0 for a full log).
    prefix: (u64, u64),
    /// The latest snapshot, served to followers behind the first entry held.
    snapshot: Option<Snapshot>,
    /// The first read of the log that failed (EIO, a record that fails its checksum). raft-rs
    /// panics on any storage error it does not expect; the replica catches that panic and
    /// fails stop with this cause (see `Replica::process`).
    read_error: std::sync::Mutex<Option<String>>,
    /// The entries this node persisted and has not applied yet, as raft handed them over, so
    /// that raft's reads of them (the committed entries a `Ready` carries for applying, an
    /// append to a follower just behind) cost a clone, not a read, a decode and a checksum
    /// of the wal's copy. See [`RecentEntries`].
    recent: RecentEntries,
    /// Test-only: [`crate::Mutation::StaleEntryCache`].
    mutation: crate::Mutation,
}

/// A contiguous run of the entries at the end of this node's log, each the very entry the
/// wal holds at its index: filled only from raft's `Ready` entries once they are persisted,
/// in raft's own rule for its unstable log (entries from index `i` replace whatever was held
/// from `i` on), and cut wherever the wal is cut.
///
/// Served only where the wal holds the last entry served with the same term: by raft's log
/// matching (one leader per term, which never writes an index twice), two logs that agree
/// on an entry's index and term hold the same entries up to it. A run that does not agree
/// is read from the wal instead.
#[derive(Debug, Default)]
struct RecentEntries {
    entries: VecDeque<Entry>,
    /// The payload bytes held, bounded by [`RECENT_ENTRIES_BYTES`] (and their number by
    /// [`RECENT_ENTRIES`]).
    bytes: usize,
}

/// Payload bytes and entries [`RecentEntries`] holds at most (the oldest go first).
const RECENT_ENTRIES_BYTES: usize = 8 << 20;
const RECENT_ENTRIES: usize = 1 << 16;

impl RecentEntries {
    fn first(&self) -> Option<u64> {
        self.entries.front().map(|e| e.index)
    }

    fn forget_from(&mut self, index: u64) {
        while self.entries.back().is_some_and(|e| e.index >= index) {
            let e = self.entries.pop_back().expect("not empty");
            self.bytes -= e.data.len();
        }
    }

    fn forget_below(&mut self, index: u64) {
        while self.entries.front().is_some_and(|e| e.index < index) {
            let e = self.entries.pop_front().expect("not empty");
            self.bytes -= e.data.len();
        }
    }

    fn clear(&mut self) {
        self.entries.clear();
        self.bytes = 0;
    }

    fn remember(&mut self, entries: Vec<Entry>, keep_suffix: bool) {
        let Some(first) = entries.first().map(|e| e.index) else {
            return;
        };
        if keep_suffix {
            // Test-only: the entries already held stay, later ones go after them.
            let after = self.entries.back().map_or(0, |e| e.index);
            self.push(entries.into_iter().filter(|e| e.index > after));
            return;
        }
        self.forget_from(first);
        if self.entries.back().is_some_and(|e| e.index + 1 != first) {
            self.clear();
        }
        self.push(entries.into_iter());
    }

    fn push(&mut self, entries: impl Iterator<Item = Entry>) {
        for e in entries {
            self.bytes += e.data.len();
            self.entries.push_back(e);
        }
        while self.bytes > RECENT_ENTRIES_BYTES || self.entries.len() > RECENT_ENTRIES {
            let e = self.entries.pop_front().expect("not empty");
            self.bytes -= e.data.len();
        }
    }

    /// The entries `low..high` if all of them are held.
    fn get(&self, low: u64, high: u64) -> Option<std::collections::vec_deque::Iter<'_, Entry>> {
        let first = self.first()?;
        let last = self.entries.back()?.index;
        if low < first || high > last + 1 || low >= high {
            return None;
        }
        let k = (low - first) as usize;
        Some(self.entries.range(k..k + (high - low) as usize))
    }
}

impl WalStorage {
    /// Storage over `wal` with the given durable state.
    pub fn new(
        wal: Arc<Wal>,
        hard_state: HardState,
        conf_state: ConfState,
        prefix: (u64, u64),
    ) -> Self {
        WalStorage {
            wal,
            hard_state,
            conf_state,
            prefix,
            snapshot: None,
            read_error: std::sync::Mutex::new(None),
            recent: RecentEntries::default(),
            mutation: crate::Mutation::None,
        }
    }

    /// Test-only: breaks one rule on purpose (see [`crate::Mutation`]).
    pub fn set_mutation(&mut self, mutation: crate::Mutation) {
        self.mutation = mutation;
    }

    /// Keeps `entries`, which raft handed over in a `Ready` and the wal now holds, for raft's
    /// next reads of them ([`RecentEntries`]).
    pub fn remember(&mut self, entries: Vec<Entry>) {
        let keep_suffix = self.mutation == crate::Mutation::StaleEntryCache;
        self.recent.remember(entries, keep_suffix);
    }

    /// The wal was cut from `index` on (a conflicting suffix).
    pub fn forget_from(&mut self, index: u64) {
        if self.mutation != crate::Mutation::StaleEntryCache {
            self.recent.forget_from(index);
        }
    }

    /// Entries up to `index` are applied: raft reads them again only for a follower far
    /// behind, from the wal.
    pub fn forget_applied(&mut self, index: u64) {
        self.recent.forget_below(index + 1);
    }

    /// The wal lost its entries below `index` (a compaction).
    pub fn forget_below(&mut self, index: u64) {
        self.recent.forget_below(index);
    }

    /// The wal restarted empty (a snapshot installed).
    pub fn forget_all(&mut self) {
        self.recent.clear();
    }

    /// The entries `low..high` from [`RecentEntries`] within raft's size rule, if it holds
    /// them all and the wal agrees on the last one's term.
    fn recent_entries(&self, low: u64, high: u64, max_size: u64) -> Option<Vec<Entry>> {
        let run = self.recent.get(low, high)?;
        let last = run.clone().next_back()?;
        let trusted = self.mutation == crate::Mutation::StaleEntryCache;
        if !trusted && self.wal.term(Index(last.index)).map(|t| t.0) != Some(last.term) {
            return None;
        }
        let mut out = Vec::with_capacity((high - low).min(1024) as usize);
        let mut limit = SizeLimit::new(max_size);
        for e in run {
            if !limit.admits(e.data.len()) {
                break;
            }
            out.push(e.clone());
        }
        Some(out)
    }

    /// Records the latest snapshot (the caller persisted it).
    pub fn set_snapshot(&mut self, snap: Snapshot) {
        self.snapshot = Some(snap);
    }

    /// The latest snapshot.
    pub fn latest_snapshot(&self) -> Option<&Snapshot> {
        self.snapshot.as_ref()
    }

    /// The HardState raft-rs will start from.
    pub fn hard_state(&self) -> &HardState {
        &self.hard_state
    }

    /// Records a new HardState (the caller persists it).
    pub fn set_hard_state(&mut self, hs: HardState) {
        self.hard_state = hs;
    }

    /// The ConfState.
    pub fn conf_state(&self) -> &ConfState {
        &self.conf_state
    }

    /// Records a new ConfState (the caller persists it).
    pub fn set_conf_state(&mut self, cs: ConfState) {
        self.conf_state = cs;
    }

    /// Records that entries before `first` were truncated away; `term` is the term of
    /// `first - 1`.
    pub fn set_prefix(&mut self, first: u64, term: u64) {
        self.prefix = (first - 1, term);
    }

    /// Index and term of the entry just before the first one held ((0, 0) for a full log).
    pub fn prefix(&self) -> (u64, u64) {
        self.prefix
    }

    /// Why a read of the log failed, if one did.
    pub fn read_error(&self) -> Option<String> {
        self.read_error
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn read_failed(&self, index: u64, e: impl std::fmt::Display) -> raft::Error {
        let why = format!("cannot read entry {index} of the log: {e}");
        self.read_error
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get_or_insert_with(|| why.clone());
        store_err(why)
    }

    fn first(&self) -> u64 {
        self.wal.first_index().0.max(self.prefix.0 + 1)
    }
}

/// raft-rs's rule for how many entries a read returns: always the first, then each while the
/// total stays within `max_size` (an entry counts its data and 24 bytes).
struct SizeLimit {
    max_size: u64,
    size: u64,
    first: bool,
}

impl SizeLimit {
    fn new(max_size: u64) -> SizeLimit {
        SizeLimit {
            max_size,
            size: 0,
            first: true,
        }
    }

    /// Whether the next entry, of `data_len` bytes of data, goes in.
    fn admits(&mut self, data_len: usize) -> bool {
        self.size += data_len as u64 + 24;
        let first = std::mem::replace(&mut self.first, false);
        first || self.size <= self.max_size
    }
}

fn store_err(e: impl std::fmt::Display) -> raft::Error {
    raft::Error::Store(StorageError::Other(e.to_string().into()))
}

impl raft::Storage for WalStorage {
    fn initial_state(&self) -> raft::Result<RaftState> {
        Ok(RaftState::new(
            self.hard_state.clone(),
            self.conf_state.clone(),
        ))
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        _context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        let max_size = max_size.into().unwrap_or(u64::MAX);
        if low < self.first() {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        if high > self.wal.last_index().0 + 1 {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        if let Some(out) = self.recent_entries(low, high, max_size) {
            return Ok(out);
        }
        let mut out = Vec::with_capacity((high - low).min(1024) as usize);
        let mut limit = SizeLimit::new(max_size);
        for i in low..high {
            // A buffer per entry, which becomes the entry's data: one allocation and one
            // copy per entry read, not a growing scratch buffer and a second copy.
            let mut payload = Vec::new();
            let e = self
                .wal
                .read(Index(i), &mut payload)
                .map_err(|e| self.read_failed(i, e))?;
            if !limit.admits(payload.len()) {
                break;
            }
            let entry =
                entry_from_owned(i, e.term.0, payload).map_err(|e| self.read_failed(i, e))?;
            out.push(entry);
        }
        Ok(out)
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        if idx == self.prefix.0 {
            return Ok(self.prefix.1);
        }
        // One lock for both: raft asks for terms many times per message.
        let (term, wal_first) = self.wal.term_and_first(Index(idx));
        if idx < wal_first.0.max(self.prefix.0 + 1) {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        term.map(|t| t.0)
            .ok_or(raft::Error::Store(StorageError::Unavailable))
    }

    fn first_index(&self) -> raft::Result<u64> {
        Ok(self.first())
    }

    fn last_index(&self) -> raft::Result<u64> {
        Ok(self.wal.last_index().0.max(self.prefix.0))
    }

    fn snapshot(&self, _request_index: u64, _to: u64) -> raft::Result<Snapshot> {
        // The latest checkpoint always covers every entry the log no longer holds (it is
        // written before the prefix is truncated).
        match &self.snapshot {
            Some(s) if s.get_metadata().index + 1 >= self.first() => Ok(s.clone()),
            _ => Err(raft::Error::Store(
                StorageError::SnapshotTemporarilyUnavailable,
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wal::fs::FaultFs;

    #[test]
    fn the_size_limit_admits_the_first_entry_then_what_fits() {
        let mut l = SizeLimit::new(100);
        assert!(l.admits(500), "the first entry always goes in");
        assert!(!l.admits(0));
        let mut l = SizeLimit::new(100);
        assert!(l.admits(26)); // 50
        assert!(l.admits(26)); // 100: at the limit
        assert!(!l.admits(0)); // 124
        let mut l = SizeLimit::new(0);
        assert!(l.admits(0));
        assert!(!l.admits(0));
    }

    #[test]
    fn payload_tags_round_trip() {
        let mut scratch = Vec::new();
        let mut cc = Entry::default();
        cc.set_entry_type(EntryType::EntryConfChangeV2);
        cc.data = Bytes::from_static(b"cc");
        let p = payload_of(&cc, &mut scratch).to_vec();
        assert_eq!(p, b"\x02cc");
        let back = entry_from_payload(5, 2, &p).unwrap();
        assert_eq!(entry_from_owned(5, 2, p.clone()).unwrap(), back);
        assert_eq!(back.get_entry_type(), EntryType::EntryConfChangeV2);
        assert_eq!(&back.data[..], b"cc");
        let noop = entry_from_payload(6, 2, b"").unwrap();
        assert!(noop.data.is_empty());
        assert!(entry_from_payload(7, 2, b"\x09x").is_err());
        assert!(entry_from_owned(7, 2, b"\x09x".to_vec()).is_err());
        let app = entry_from_owned(8, 3, vec![TAG_NORMAL, 7, 7]).unwrap();
        assert_eq!(app, entry_from_payload(8, 3, &[TAG_NORMAL, 7, 7]).unwrap());
        assert_eq!(
            (app.index, app.term, &app.data[..]),
            (8, 3, &[TAG_NORMAL, 7, 7][..])
        );
    }

    #[test]
    fn an_arena_cuts_independent_payloads_from_shared_chunks() {
        let mut arena = PayloadArena::default();
        let a = arena.copy(&[&[TAG_NORMAL], b"first"]);
        let b = arena.copy(&[&[TAG_SESSION], &[9; 16], b"second"]);
        let empty = arena.copy(&[]);
        assert_eq!(&a[..], b"\x01first");
        assert_eq!(b.len(), 1 + 16 + 6);
        assert!(empty.is_empty());
        // Cut one after the other from one chunk: the second starts where the first ends.
        assert_eq!(a.as_ptr().wrapping_add(a.len()), b.as_ptr());
        // A clone is a view of the same bytes, not a copy.
        let a2 = a.clone();
        assert_eq!(a2.as_ptr(), a.as_ptr());
        drop(a);
        assert_eq!(&a2[..], b"\x01first");
        // Filling a chunk starts another; earlier payloads keep their bytes.
        let many: Vec<Bytes> = (0..200u32)
            .map(|k| arena.copy(&[&k.to_le_bytes(), &[k as u8; 1000]]))
            .collect();
        for (k, p) in many.iter().enumerate() {
            assert_eq!(&p[..4], &(k as u32).to_le_bytes());
            assert!(p[4..].iter().all(|&x| x == k as u8));
        }
        assert_eq!(b[0], TAG_SESSION);
        // A payload of half a chunk or more has a buffer of its own.
        let big = arena.copy(&[&vec![5u8; ARENA_CHUNK_BYTES]]);
        let next = arena.copy(&[b"x"]);
        assert_eq!(big.len(), ARENA_CHUNK_BYTES);
        assert_ne!(big.as_ptr().wrapping_add(big.len()), next.as_ptr());
        let e = entry_from_payload_in(&mut arena, 3, 2, &[TAG_NORMAL, 1, 2]).unwrap();
        assert_eq!(e, entry_from_payload(3, 2, &[TAG_NORMAL, 1, 2]).unwrap());
    }

    /// A hard state (term 4, vote 2, commit 17) and a membership of voters 1, 2 and 3.
    fn term_4_of_three_voters() -> (HardState, ConfState) {
        let mut hs = HardState::default();
        hs.term = 4;
        hs.vote = 2;
        hs.commit = 17;
        let mut cs = ConfState::default();
        cs.voters = vec![1, 2, 3];
        (hs, cs)
    }

    #[test]
    fn state_file_round_trips_and_detects_corruption() {
        let fs = Arc::new(FaultFs::new());
        let dir = Path::new("/d");
        fs.create_dir_all(dir).unwrap();
        let mut sf = StateFile::new(fs.clone(), dir);
        assert_eq!(sf.load().unwrap(), None);
        let (hs, cs) = term_4_of_three_voters();
        let mut history = ConfHistory::new(0, cs.clone());
        let mut four = cs.clone();
        four.voters.push(4);
        history.record(10, four.clone());
        history.record(5, cs.clone()); // a replayed older change rewrites nothing
        let guard = Guard {
            ring_in_use: true,
            recovering_above_term: Some(3),
            unproven: true,
        };
        sf.store_guard(guard, &hs, &four, &history).unwrap();
        let mut fresh = StateFile::new(fs.clone(), dir);
        assert_eq!(
            fresh.load().unwrap(),
            Some(StoredState {
                hs: hs.clone(),
                cs: four.clone(),
                history: history.clone(),
                guard,
            })
        );
        assert_eq!(fresh.guard(), guard);
        // A later store without a new guard keeps it.
        fresh.store(&hs, &four, &history).unwrap();
        assert_eq!(sf.load().unwrap().unwrap().guard, guard);
        assert_eq!(history.at(9), Some(&cs));
        assert_eq!(history.at(10), Some(&four));
        history.compact(12);
        assert_eq!((history.at(11), history.at(12)), (None, Some(&four)));
        fs.corrupt(&dir.join("raft-state"), 20, &[0xFF]);
        assert!(sf.load().unwrap_err().contains("checksum"));
    }

    /// Writes a file the way an older version did: `magic`, `version`, the crc of `body`,
    /// `body`.
    fn write_old(fs: &FaultFs, path: &Path, magic: &[u8; 4], version: u32, body: &[u8]) {
        let mut buf = Vec::new();
        buf.extend_from_slice(magic);
        buf.extend_from_slice(&version.to_le_bytes());
        buf.extend_from_slice(&crc32c::crc32c(body).to_le_bytes());
        buf.extend_from_slice(body);
        fs.create(path).unwrap().write_all_at(&buf, 0).unwrap();
    }

    /// A raft-state of version 1 (no history, no guard) or 2 (no guard) reads with the guard
    /// set to "the ring may be in use, not recovering", never the other way round: a missing
    /// ring then counts as lost (docs/FORMAT.md, section 10). A later store writes version 3
    /// and keeps that guard.
    #[test]
    fn old_state_files_read_with_the_ring_taken_to_be_in_use() {
        let (hs, cs) = term_4_of_three_voters();
        let mut v1 = Vec::new();
        for v in [hs.term, hs.vote, hs.commit] {
            v1.extend_from_slice(&v.to_le_bytes());
        }
        encode_conf(&cs, &mut v1);
        let mut v2 = v1.clone();
        v2.extend_from_slice(&0u64.to_le_bytes()); // the history's base index
        encode_conf(&cs, &mut v2);
        v2.extend_from_slice(&0u64.to_le_bytes()); // no changes since
        for (version, body) in [(1, v1), (2, v2)] {
            let fs = Arc::new(FaultFs::new());
            let dir = Path::new("/d");
            fs.create_dir_all(dir).unwrap();
            write_old(&fs, &dir.join("raft-state"), STATE_MAGIC, version, &body);
            let mut sf = StateFile::new(fs.clone(), dir);
            let loaded = sf.load().unwrap().expect("a state");
            assert_eq!(
                (loaded.hs, &loaded.cs),
                (hs.clone(), &cs),
                "version {version}"
            );
            assert_eq!(loaded.history, ConfHistory::new(0, cs.clone()));
            assert!(
                loaded.guard.ring_in_use,
                "version {version}: the ring not in use"
            );
            assert_eq!(loaded.guard.recovering_above_term, None);
            sf.store(&hs, &cs, &loaded.history).unwrap();
            let file = fs.read_file(&dir.join("raft-state")).unwrap();
            assert_eq!(&file[4..8], &STATE_VERSION.to_le_bytes());
            let again = StateFile::new(fs.clone(), dir).load().unwrap().unwrap();
            assert_eq!(again.guard, loaded.guard, "version {version}: rewritten");
        }
    }

    /// A version 1 snapshot (its data the Lsn, then the state) reads as a checkpoint without
    /// sessions, its state intact.
    #[test]
    fn an_old_snapshot_reads_as_having_no_sessions() {
        let fs = Arc::new(FaultFs::new());
        let dir = Path::new("/d");
        fs.create_dir_all(dir).unwrap();
        let (_, cs) = term_4_of_three_voters();
        let mut body = Vec::new();
        body.extend_from_slice(&9u64.to_le_bytes());
        body.extend_from_slice(&2u64.to_le_bytes());
        encode_conf(&cs, &mut body);
        let mut data = 4096u64.to_le_bytes().to_vec();
        data.extend_from_slice(b"the state");
        body.extend_from_slice(&(data.len() as u64).to_le_bytes());
        body.extend_from_slice(&data);
        write_old(&fs, &dir.join("snapshot"), SNAPSHOT_MAGIC, 1, &body);
        let snap = SnapshotFile::new(fs.clone(), dir).load().unwrap().unwrap();
        assert_eq!(
            (snap.get_metadata().index, snap.get_metadata().term),
            (9, 2)
        );
        let cp = CheckpointData::decode(&snap.data).unwrap();
        assert_eq!(cp.lsn, 4096);
        assert!(cp.sessions.is_empty());
        assert!(cp.session_table().unwrap().is_empty());
        assert_eq!(cp.state, b"the state");
    }
}
