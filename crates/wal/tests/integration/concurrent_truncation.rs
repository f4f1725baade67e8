//! Appends racing the exclusive operations (defect 5): three threads append, one with
//! `Durability::Memory`, one with `Fsync` and one alternating, while a fourth thread cuts the
//! log's suffix, restarts it at a later position and truncates its prefix, 240 times.
//!
//! Method: the log runs on `FaultFs` behind a recording file system that stamps every write
//! (with its bytes, for those into a segment's data area that are not all zero) and every
//! fdatasync with a tick of one global clock, which the test threads tick too before and
//! after each call, and that sleeps 100 µs in each sync so that the calls overlap often
//! (about a fifth of the appends overlap an exclusive operation). At the end the test checks,
//! for every append that returned `Ok`:
//!
//! * under `Fsync`, that exactly its record (header and payload at the Lsn it was given) was
//!   written and then fdatasynced through the same file handle between the call and its
//!   return: an acknowledgement is never given for bytes that were not written;
//! * that the entry reads back at the index it was given, both right after the append (when
//!   no truncation overlapped the append and the read) and in the final log, unless a
//!   truncation that removes that index ran at or after the append (it returned after the
//!   append was called);
//!
//! and that nothing spins: every thread finishes within a deadline, the number of batches
//! written is at most the number of appends, and no fdatasync comes without a write before it
//! on its file (a flush with nothing to write, the spin of defect 5).

use crate::common;

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{DIR, small_config};
use wal::fs::{FaultFs, FileSystem, WalFile};
use wal::{Durability, Entry, Index, Lsn, Position, Term, Wal, format};

/// How many exclusive operations the truncating thread runs.
const ROUNDS: u64 = 240;
/// How long a sync takes: long enough that appends land inside an exclusive operation.
const SYNC_DELAY: Duration = Duration::from_micros(100);
/// How long the threads may take to finish once the truncating thread is done; a spinning
/// append never finishes.
const DEADLINE: Duration = Duration::from_secs(30);

/// One clock for the file system's events and the test threads' calls.
#[derive(Debug, Default)]
struct Clock(AtomicU64);

impl Clock {
    fn tick(&self) -> u64 {
        self.0.fetch_add(1, Ordering::SeqCst)
    }
}

#[derive(Debug)]
enum Event {
    Write {
        at: u64,
        handle: u64,
        /// Stream position of the first byte written (the handle's segment first Lsn plus the
        /// offset into its data area).
        lsn: u64,
        /// The bytes written into a segment's data area; empty for zeroes and other writes.
        bytes: Vec<u8>,
    },
    Sync {
        at: u64,
        handle: u64,
    },
}

#[derive(Debug)]
struct Recorder {
    inner: FaultFs,
    clock: Arc<Clock>,
    events: Mutex<Vec<Event>>,
    next_handle: AtomicU64,
}

#[derive(Debug)]
struct RecordedFile {
    inner: Arc<dyn WalFile>,
    id: u64,
    /// The first Lsn of the segment, if the file is one (`NAME.wal` or `NAME.wal.tmp`).
    first_lsn: Option<u64>,
    recorder: Arc<Recorder>,
}

fn segment_first_lsn(path: &Path) -> Option<u64> {
    let name = path.file_name()?.to_str()?;
    let name = name.strip_suffix(".tmp").unwrap_or(name);
    let digits = name.strip_suffix(".wal")?;
    (digits.len() == 20).then(|| digits.parse().ok())?
}

impl Recorder {
    fn wrap(self: &Arc<Self>, path: &Path, inner: Arc<dyn WalFile>) -> Arc<dyn WalFile> {
        Arc::new(RecordedFile {
            inner,
            id: self.next_handle.fetch_add(1, Ordering::SeqCst),
            first_lsn: segment_first_lsn(path),
            recorder: Arc::clone(self),
        })
    }

    fn record(&self, event: Event) {
        self.events.lock().unwrap().push(event);
    }
}

impl WalFile for RecordedFile {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.inner.read_exact_at(buf, offset)
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.inner.write_all_at(buf, offset)?;
        let data_offset = offset.checked_sub(format::SEGMENT_DATA_OFFSET);
        // Zeroes (zeroing ahead, undoing, truncating) acknowledge nothing, so they are kept
        // without their bytes; so is a segment's header.
        let bytes = if buf.iter().any(|&b| b != 0) && data_offset.is_some() {
            buf.to_vec()
        } else {
            Vec::new()
        };
        self.recorder.record(Event::Write {
            at: self.recorder.clock.tick(),
            handle: self.id,
            lsn: self.first_lsn.unwrap_or(0) + data_offset.unwrap_or(0),
            bytes,
        });
        Ok(())
    }

    fn sync_data(&self) -> std::io::Result<()> {
        std::thread::sleep(SYNC_DELAY);
        self.inner.sync_data()?;
        self.recorder.record(Event::Sync {
            at: self.recorder.clock.tick(),
            handle: self.id,
        });
        Ok(())
    }

    fn allocate(&self, len: u64) -> std::io::Result<()> {
        self.inner.allocate(len)
    }

    fn size_bytes(&self) -> std::io::Result<u64> {
        self.inner.size_bytes()
    }
}

/// The file system handed to the log: `Recorder` behind an `Arc`, so files can point back.
#[derive(Debug)]
struct RecordingFs(Arc<Recorder>);

impl FileSystem for RecordingFs {
    fn create_dir_all(&self, dir: &Path) -> std::io::Result<()> {
        self.0.inner.create_dir_all(dir)
    }
    fn list(&self, dir: &Path) -> std::io::Result<Vec<String>> {
        self.0.inner.list(dir)
    }
    fn open(&self, path: &Path) -> std::io::Result<Arc<dyn WalFile>> {
        let file = self.0.inner.open(path)?;
        Ok(self.0.wrap(path, file))
    }
    fn create(&self, path: &Path) -> std::io::Result<Arc<dyn WalFile>> {
        let file = self.0.inner.create(path)?;
        Ok(self.0.wrap(path, file))
    }
    fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()> {
        self.0.inner.rename(from, to)
    }
    fn remove(&self, path: &Path) -> std::io::Result<()> {
        self.0.inner.remove(path)
    }
    fn sync_dir(&self, dir: &Path) -> std::io::Result<()> {
        std::thread::sleep(SYNC_DELAY);
        self.0.inner.sync_dir(dir)
    }
}

/// One append call and what it returned.
#[derive(Debug)]
struct Append {
    payload: Vec<u8>,
    durability: Durability,
    call: u64,
    ret: u64,
    result: Result<Entry, String>,
}

/// One exclusive operation.
#[derive(Debug)]
struct Cut {
    kind: CutKind,
    call: u64,
    ret: u64,
}

#[derive(Debug)]
enum CutKind {
    Suffix { from: Index },
    Restart,
    Prefix { first: Index },
}

impl Cut {
    /// Whether this operation removes entry `index` if the log held it when it ran.
    fn removes(&self, index: Index) -> bool {
        match self.kind {
            CutKind::Suffix { from } => index >= from,
            // Entries up to the start are covered by the snapshot, the rest are thrown away.
            CutKind::Restart => true,
            CutKind::Prefix { first } => index < first,
        }
    }
}

/// Counts of exclusive operations begun and ended, for the read-after-append check.
#[derive(Debug, Default)]
struct Cuts {
    begun: AtomicU64,
    ended: AtomicU64,
}

fn append_loop(
    wal: &Wal,
    thread: u64,
    clock: &Clock,
    cuts: &Cuts,
    stop: &AtomicBool,
) -> Vec<Append> {
    let mut out = Vec::new();
    let mut buf = Vec::new();
    let mut k = 0u64;
    while !stop.load(Ordering::SeqCst) {
        let durability = match (thread, k % 2) {
            (0, _) | (2, 0) => Durability::Memory,
            _ => Durability::Fsync,
        };
        let payload = format!("thread {thread} append {k:06}").into_bytes();
        let ended_before = cuts.ended.load(Ordering::SeqCst);
        let call = clock.tick();
        let result = wal.append_next(Term(1), &payload, durability);
        let ret = clock.tick();
        if let Ok(entry) = &result {
            let read = wal.read(entry.index, &mut buf).map(|_| buf.clone());
            let begun_after = cuts.begun.load(Ordering::SeqCst);
            if begun_after == ended_before {
                // No exclusive operation overlapped the append and the read.
                assert_eq!(
                    read.as_deref().ok(),
                    Some(&payload[..]),
                    "thread {thread}: {entry:?} ({durability:?}) does not read back at once, \
                     and no truncation ran meanwhile: {read:?}"
                );
            }
        }
        out.push(Append {
            payload,
            durability,
            call,
            ret,
            result: result.map_err(|e| e.to_string()),
        });
        k += 1;
    }
    out
}

fn cut_loop(wal: &Wal, clock: &Clock, cuts: &Cuts) -> Vec<Cut> {
    let mut out = Vec::new();
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    for round in 0..ROUNDS {
        std::thread::sleep(Duration::from_micros(200 + next() % 800));
        let (first, last) = (wal.first_index(), wal.last_index());
        cuts.begun.fetch_add(1, Ordering::SeqCst);
        let call = clock.tick();
        let kind = match round % 4 {
            0 | 1 if last >= first => {
                let from = Index(last.0.saturating_sub(next() % 6).max(first.0));
                wal.truncate_suffix(from).map(|()| CutKind::Suffix { from })
            }
            2 => {
                // A snapshot install beyond the log's end, as a follower does it.
                let end = wal.position();
                let block = small_config().block_bytes;
                let mut lsn = end.lsn.0 + 8 * (next() % 64);
                // A position after an entry is a block start or a record header past one.
                if lsn % block != 0 && lsn % block < format::HEADER_BYTES as u64 {
                    lsn += format::HEADER_BYTES as u64 - lsn % block;
                }
                let start = Position {
                    lsn: Lsn(lsn),
                    last_index: Index(end.last_index.0 + 1 + next() % 4),
                    last_term: Term(1),
                };
                wal.restart_at(start).map(|()| CutKind::Restart)
            }
            _ => wal
                .truncate_prefix(Index(last.0.saturating_sub(4).max(1)))
                .map(|first| CutKind::Prefix { first }),
        };
        let ret = clock.tick();
        cuts.ended.fetch_add(1, Ordering::SeqCst);
        let kind = kind.unwrap_or_else(|e| panic!("round {round}: {e}"));
        out.push(Cut { kind, call, ret });
    }
    out
}

/// Whether `append`'s record was written exactly (through one handle) and then fdatasynced
/// through that handle, both between the call and its return.
fn written_and_synced(events: &[Event], append: &Append, entry: &Entry) -> bool {
    let mut record = vec![0u8; format::record_bytes(append.payload.len())];
    format::encode_entry(
        &mut record,
        entry.lsn,
        entry.index,
        entry.term,
        &append.payload,
    );
    let at = |e: &Event| match e {
        Event::Write { at, .. } | Event::Sync { at, .. } => *at,
    };
    let from = events.partition_point(|e| at(e) < append.call);
    let to = events.partition_point(|e| at(e) < append.ret);
    let window = &events[from..to];
    window.iter().enumerate().any(|(i, e)| {
        let Event::Write {
            handle, lsn, bytes, ..
        } = e
        else {
            return false;
        };
        let (start, end) = (entry.lsn.0, entry.lsn.0 + record.len() as u64);
        let holds = *lsn <= start
            && end <= lsn + bytes.len() as u64
            && bytes[(start - lsn) as usize..(end - lsn) as usize] == record[..];
        holds
            && window[i + 1..]
                .iter()
                .any(|later| matches!(later, Event::Sync { handle: h, .. } if h == handle))
    })
}

#[test]
fn appends_racing_truncations_and_restarts_are_never_lost_or_falsely_acknowledged() {
    let clock = Arc::new(Clock::default());
    let recorder = Arc::new(Recorder {
        inner: FaultFs::new(),
        clock: Arc::clone(&clock),
        events: Mutex::new(Vec::new()),
        next_handle: AtomicU64::new(0),
    });
    let fs: Arc<dyn FileSystem> = Arc::new(RecordingFs(Arc::clone(&recorder)));
    let (wal, _) = Wal::open(Arc::clone(&fs), Path::new(DIR), small_config()).unwrap();
    let wal = Arc::new(wal);
    let cuts = Arc::new(Cuts::default());
    let stop = Arc::new(AtomicBool::new(false));

    let appenders: Vec<_> = (0..3)
        .map(|thread| {
            let (wal, clock, cuts, stop) = (
                Arc::clone(&wal),
                Arc::clone(&clock),
                Arc::clone(&cuts),
                Arc::clone(&stop),
            );
            std::thread::spawn(move || append_loop(&wal, thread, &clock, &cuts, &stop))
        })
        .collect();
    let cutter = {
        let (wal, clock, cuts) = (Arc::clone(&wal), Arc::clone(&clock), Arc::clone(&cuts));
        std::thread::spawn(move || cut_loop(&wal, &clock, &cuts))
    };
    while !cutter.is_finished() {
        std::thread::sleep(Duration::from_millis(5));
    }
    stop.store(true, Ordering::SeqCst);
    let deadline = Instant::now() + DEADLINE;
    while !appenders.iter().all(|h| h.is_finished()) {
        assert!(
            Instant::now() < deadline,
            "an append has not returned {DEADLINE:?} after the last truncation: it spins \
             ({} batches written so far)",
            wal.batch_count()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let cuts: Vec<Cut> = cutter.join().unwrap();
    let appends: Vec<Append> = appenders
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    let mut events = std::mem::take(&mut *recorder.events.lock().unwrap());
    // Threads take their tick before they queue for the list.
    events.sort_by_key(|e| match e {
        Event::Write { at, .. } | Event::Sync { at, .. } => *at,
    });

    let failed: Vec<&Append> = appends.iter().filter(|a| a.result.is_err()).collect();
    assert!(failed.is_empty(), "appends failed: {failed:?}");
    let fsync = appends
        .iter()
        .filter(|a| a.durability == Durability::Fsync)
        .count();
    assert!(
        fsync > 100 && appends.len() > 300,
        "too few appends to mean anything: {} ({fsync} under Fsync)",
        appends.len()
    );
    assert!(
        wal.batch_count() <= appends.len() as u64,
        "{} batches for {} appends: flushes with nothing to write (a spin)",
        wal.batch_count(),
        appends.len()
    );

    // A flush with nothing to write still fdatasyncs the segment it would have written to.
    let mut wrote_since_sync = std::collections::HashMap::new();
    for event in &events {
        match event {
            Event::Write { handle, .. } => {
                wrote_since_sync.insert(*handle, true);
            }
            Event::Sync { at, handle } => assert!(
                wrote_since_sync.insert(*handle, false).unwrap_or(false),
                "an fdatasync at tick {at} with nothing written before it: a flush of nothing"
            ),
        }
    }

    let mut buf = Vec::new();
    for append in &appends {
        let entry = append.result.as_ref().expect("checked above");
        if append.durability == Durability::Fsync {
            assert!(
                written_and_synced(&events, append, entry),
                "{entry:?} was acknowledged under Fsync, but its record was not written and \
                 synced between the call (tick {}) and the return (tick {})",
                append.call,
                append.ret
            );
        }
        let now = wal.read(entry.index, &mut buf).map(|_| &buf[..]);
        if now.as_ref().ok() != Some(&&append.payload[..]) {
            let cut_by = cuts
                .iter()
                .find(|cut| cut.ret > append.call && cut.removes(entry.index));
            let overlapping: Vec<&Cut> = cuts
                .iter()
                .filter(|cut| cut.call <= append.ret && cut.ret >= append.call)
                .collect();
            assert!(
                cut_by.is_some(),
                "{entry:?} ({:?}, called at tick {}, returned at tick {}) is gone from the log \
                 ({now:?}), and no truncation that removes it ran after it was called; \
                 overlapping: {overlapping:?}",
                append.durability,
                append.call,
                append.ret
            );
        }
    }

    let held = common::read_all(&wal);
    wal.close().unwrap();
    drop(wal);
    let (wal, _) = Wal::open(fs, Path::new(DIR), small_config()).unwrap();
    assert_eq!(
        common::read_all(&wal),
        held,
        "the log reopens as it was closed"
    );
}
