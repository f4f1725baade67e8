//! Client sessions: exactly-once appends, decided by the log itself.
//!
//! A client opens a session with an entry of its own ([`TAG_SESSION_OPEN`]); its id is that
//! entry's index, so every replica names it the same. Each application entry appended in the
//! session carries the session id and a sequence number, 1 for the session's first entry and
//! one more for each next one ([`TAG_SESSION`]). The table of sessions is a deterministic
//! function of the committed log ([`Sessions::apply`], in log order), so it is the same on
//! every replica, survives restarts (replayed from the latest checkpoint, which records it)
//! and snapshot installs (the snapshot carries it).
//!
//! The leader decides before it proposes ([`Replica::propose_in_session`]), looking at its
//! whole log, committed or not:
//! - a sequence number already in the log is a **duplicate**: nothing is proposed, and the
//!   caller gets the ticket of the entry that has it (it resolves like any other);
//! - the session's next number is proposed;
//! - a number past the next one is refused (`SessionSequence`), so a batch lost on the way
//!   can never be skipped over by a later one.
//!
//! Why no copy commits twice: take two entries with the same session and number in the
//! committed log, at indexes p < q. The leader that proposed the one at q held, by raft's log
//! matching, every committed entry below q in its log when it proposed, the one at p
//! included; it checked its whole log ([`Sessions`] for the applied part, [`Pending`] for the
//! rest, rebuilt in each new term) and would have answered with p's ticket instead. The
//! simulator's session family (`sim/tests/sessions.rs`) checks "no (session, number) twice in
//! the committed log" under faults, and catches `Mutation::DedupCommittedOnly`, a leader that
//! forgets its uncommitted entries.
//!
//! **Expiry rule** (part of the log format: every replica applies it the same way): the
//! cluster keeps the [`SESSION_CAPACITY`] sessions used most recently, by the index of their
//! latest entry (their open entry counts). Opening one more expires the least recently used.
//! An expired or unknown session is refused with `UnknownSession`, never deduplicated
//! silently. Each session remembers where its latest [`SESSION_RUNS`] runs of entries went
//! (a run: consecutive numbers at consecutive indexes, as one batch is proposed); a retry of
//! an entry older than that is refused with `SessionTooOld`.
//!
//! [`Replica::propose_in_session`]: crate::Replica::propose_in_session
//! [`TAG_SESSION_OPEN`]: crate::storage::TAG_SESSION_OPEN
//! [`TAG_SESSION`]: crate::storage::TAG_SESSION

use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// Sessions the cluster keeps; opening one more expires the least recently used.
pub const SESSION_CAPACITY: usize = 1024;

/// Runs of entries a session remembers the indexes of (see the module documentation).
pub const SESSION_RUNS: usize = 16;

/// The largest encoded table: header, then per session its fields and its runs.
pub const MAX_ENCODED_BYTES: u64 = 12 + SESSION_CAPACITY as u64 * (28 + SESSION_RUNS as u64 * 24);

/// The most bytes a checkpoint's data adds to the application's state: its header
/// ([`crate::storage::CheckpointData`]) and the largest session table.
pub const MAX_CHECKPOINT_OVERHEAD: u64 =
    crate::storage::CheckpointData::HEADER_BYTES as u64 + MAX_ENCODED_BYTES;

/// The encoding's first bytes and version ([`Sessions::encode`]).
const MAGIC: &[u8; 4] = b"RLSE";
const VERSION: u32 = 1;

/// Consecutive sequence numbers at consecutive indexes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run {
    /// The first sequence number.
    pub seq: u64,
    /// Its index.
    pub index: u64,
    /// Entries in the run.
    pub len: u64,
}

impl Run {
    /// The index of sequence number `seq`, if the run holds it.
    fn index_of(&self, seq: u64) -> Option<u64> {
        (seq >= self.seq && seq - self.seq < self.len).then(|| self.index + (seq - self.seq))
    }
}

/// One session's state.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Session {
    /// The highest sequence number applied (0: none yet).
    pub last_seq: u64,
    /// The index of its latest entry (its open entry before any).
    pub last_used: u64,
    /// Where its latest entries went, oldest first.
    pub runs: VecDeque<Run>,
}

impl Session {
    /// Records sequence number `seq` at `index`.
    fn record(&mut self, seq: u64, index: u64) {
        self.last_seq = seq;
        self.last_used = index;
        if let Some(r) = self.runs.back_mut()
            && r.seq + r.len == seq
            && r.index + r.len == index
        {
            r.len += 1;
            return;
        }
        self.runs.push_back(Run { seq, index, len: 1 });
        if self.runs.len() > SESSION_RUNS {
            self.runs.pop_front();
        }
    }

    /// The index of sequence number `seq`, if remembered.
    pub fn index_of(&self, seq: u64) -> Option<u64> {
        self.runs.iter().rev().find_map(|r| r.index_of(seq))
    }
}

/// What applying a session entry found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Applied {
    /// The session's next entry (or a later one).
    New,
    /// The sequence number was applied before, at this index (if still remembered): the log
    /// holds it twice. The leader's check makes this impossible; it is counted, and the
    /// simulator fails a seed that shows it.
    Duplicate {
        /// The first copy's index, if remembered.
        first: Option<u64>,
    },
    /// The session is unknown (expired, or never opened): the entry is an ordinary entry.
    UnknownSession,
}

/// The sessions as of some index: a deterministic function of the committed log.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Sessions {
    by_id: BTreeMap<u64, Session>,
    /// (last_used, id), to expire the least recently used.
    by_use: BTreeSet<(u64, u64)>,
}

impl Sessions {
    /// Applies the open entry at `index`: session `index` exists from now on, and the least
    /// recently used one expires if there are more than [`SESSION_CAPACITY`].
    pub fn open(&mut self, index: u64) {
        if let Some(old) = self.by_id.insert(
            index,
            Session {
                last_used: index,
                ..Session::default()
            },
        ) {
            self.by_use.remove(&(old.last_used, index));
        }
        self.by_use.insert((index, index));
        while self.by_id.len() > SESSION_CAPACITY {
            let Some((_, id)) = self.by_use.pop_first() else {
                break;
            };
            self.by_id.remove(&id);
        }
    }

    /// Applies the entry at `index` with sequence number `seq` of session `id`.
    pub fn apply(&mut self, index: u64, id: u64, seq: u64) -> Applied {
        let Some(s) = self.by_id.get_mut(&id) else {
            return Applied::UnknownSession;
        };
        if seq <= s.last_seq {
            return Applied::Duplicate {
                first: s.index_of(seq),
            };
        }
        self.by_use.remove(&(s.last_used, id));
        s.record(seq, index);
        self.by_use.insert((index, id));
        Applied::New
    }

    /// Session `id`, if it exists.
    pub fn get(&self, id: u64) -> Option<&Session> {
        self.by_id.get(&id)
    }

    /// How many sessions exist.
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// The encoding a checkpoint records (`docs/FORMAT.md` section 10): magic `RLSE`,
    /// version u32, count u32, then per session by id: id, last_seq, last_used (u64 each),
    /// runs u32, and per run seq, index, len (u64 each). Little-endian.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&(self.by_id.len() as u32).to_le_bytes());
        for (id, s) in &self.by_id {
            for v in [*id, s.last_seq, s.last_used] {
                out.extend_from_slice(&v.to_le_bytes());
            }
            out.extend_from_slice(&(s.runs.len() as u32).to_le_bytes());
            for r in &s.runs {
                for v in [r.seq, r.index, r.len] {
                    out.extend_from_slice(&v.to_le_bytes());
                }
            }
        }
    }

    /// Decodes [`Sessions::encode`]'s bytes, checking every count against the bytes left.
    pub fn decode(bytes: &[u8]) -> Result<Sessions, String> {
        let mut r = Cursor(bytes);
        if r.take(4)? != MAGIC {
            return Err("the session table has a bad magic".into());
        }
        let version = r.u32()?;
        if version != VERSION {
            return Err(format!(
                "the session table has version {version}, expected {VERSION}"
            ));
        }
        let n = r.u32()? as usize;
        if n > SESSION_CAPACITY {
            return Err(format!(
                "the session table holds {n} sessions, more than {SESSION_CAPACITY}"
            ));
        }
        let mut t = Sessions::default();
        for _ in 0..n {
            let (id, last_seq, last_used) = (r.u64()?, r.u64()?, r.u64()?);
            let runs = r.u32()? as usize;
            if runs > SESSION_RUNS {
                return Err(format!(
                    "session {id} has {runs} runs, more than {SESSION_RUNS}"
                ));
            }
            let mut s = Session {
                last_seq,
                last_used,
                runs: VecDeque::with_capacity(runs),
            };
            for _ in 0..runs {
                s.runs.push_back(Run {
                    seq: r.u64()?,
                    index: r.u64()?,
                    len: r.u64()?,
                });
            }
            if t.by_id.insert(id, s).is_some() {
                return Err(format!("session {id} appears twice in the session table"));
            }
            t.by_use.insert((last_used, id));
        }
        if !r.0.is_empty() {
            return Err(format!(
                "the session table has {} bytes after its end",
                r.0.len()
            ));
        }
        Ok(t)
    }
}

struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.0.len() < n {
            return Err("the session table is truncated".into());
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
}

/// Where a session stands in a leader's log, committed or not: what the leader checks a
/// proposal against.
#[derive(Clone, Debug, Default)]
pub(crate) struct Pending {
    /// The term the view was built in; rebuilt when the leader's term differs.
    pub term: u64,
    /// Sessions opened by entries not applied yet.
    pub opened: BTreeSet<u64>,
    /// Per session, its entries not applied yet: (seq, index, term), in log order.
    pub entries: BTreeMap<u64, VecDeque<(u64, u64, u64)>>,
}

impl Pending {
    /// Whether session `id` still exists once every entry of this view is folded into
    /// `table` (the sessions as of `applied`): the opens among them expire the least recently
    /// used sessions, which may be `id`, before an entry proposed now is applied. Replays a
    /// copy of the table only when the opens can expire any session at all.
    pub fn survives(&self, table: &Sessions, id: u64) -> bool {
        let known = table.get(id).is_some() || self.opened.contains(&id);
        if !known {
            return false;
        }
        if table.len() + self.opened.len() <= SESSION_CAPACITY {
            return true;
        }
        // Each open expires at most one session, the least recently used. A session the
        // pending entries do not use that is older than `id` stays older than it, so while
        // one is left `id` is not the one expired: as many of them as there are opens, and
        // `id` survives them all. (A pending open is younger than every applied session.)
        let last_used = table.get(id).map_or(u64::MAX, |s| s.last_used);
        let need = self.opened.len();
        let older_untouched = table
            .by_use
            .range(..(last_used, id))
            .filter(|(_, other)| !self.entries.contains_key(other))
            .take(need)
            .count();
        if older_untouched >= need {
            return true;
        }
        // Otherwise replay the pending entries onto a copy of the table.
        let mut log: Vec<(u64, Option<(u64, u64)>)> = self
            .opened
            .iter()
            .map(|&index| (index, None))
            .chain(self.entries.iter().flat_map(|(&session, q)| {
                q.iter()
                    .map(move |&(seq, index, _)| (index, Some((session, seq))))
            }))
            .collect();
        log.sort_unstable_by_key(|&(index, _)| index);
        let mut t = table.clone();
        for (index, entry) in log {
            match entry {
                None => t.open(index),
                Some((session, seq)) => {
                    t.apply(index, session, seq);
                }
            }
        }
        t.get(id).is_some()
    }

    /// Forgets what is applied now (at or below `applied`).
    pub fn applied(&mut self, applied: u64) {
        if self.opened.is_empty() && self.entries.is_empty() {
            // The common case, appends outside sessions: no walk of empty collections.
            return;
        }
        self.opened.retain(|&i| i > applied);
        self.entries.retain(|_, q| {
            while q.front().is_some_and(|&(_, i, _)| i <= applied) {
                q.pop_front();
            }
            !q.is_empty()
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A leader's view of its unapplied entries says whether a session outlives the opens
    /// among them: the least recently used expire first, a pending use keeps one.
    #[test]
    fn pending_opens_expire_the_least_recently_used() {
        let mut t = Sessions::default();
        for i in 1..=SESSION_CAPACITY as u64 {
            t.open(i);
        }
        let mut p = Pending::default();
        assert!(p.survives(&t, 1) && !p.survives(&t, 9_999));
        p.opened.insert(5_000);
        assert!(!p.survives(&t, 1), "the oldest expires");
        assert!(p.survives(&t, 2) && p.survives(&t, 5_000));
        // A pending entry of session 1 before the open makes it recently used.
        p.entries.entry(1).or_default().push_back((1, 4_999, 1));
        assert!(p.survives(&t, 1) && !p.survives(&t, 2));
        // After the open it comes too late: session 1 expired at the open.
        p.entries.insert(1, [(1, 5_001, 1)].into());
        assert!(!p.survives(&t, 1));
        // Two opens expire the two oldest; the third oldest outlives them (counted without a
        // copy of the table), and so does a session opened by one of them.
        let mut p = Pending::default();
        p.opened.extend([5_000, 5_001]);
        assert!(!p.survives(&t, 1) && !p.survives(&t, 2));
        assert!(p.survives(&t, 3) && p.survives(&t, 5_001));
    }

    #[test]
    fn sequence_numbers_apply_once_and_remember_their_index() {
        let mut t = Sessions::default();
        t.open(5);
        assert_eq!(t.apply(6, 5, 1), Applied::New);
        assert_eq!(t.apply(7, 5, 2), Applied::New);
        assert_eq!(t.apply(9, 5, 3), Applied::New);
        assert_eq!(t.apply(10, 5, 2), Applied::Duplicate { first: Some(7) });
        assert_eq!(t.apply(11, 6, 1), Applied::UnknownSession);
        let s = t.get(5).unwrap();
        assert_eq!((s.last_seq, s.last_used), (3, 9));
        assert_eq!(
            s.runs,
            [
                Run {
                    seq: 1,
                    index: 6,
                    len: 2
                },
                Run {
                    seq: 3,
                    index: 9,
                    len: 1
                }
            ]
        );
    }

    #[test]
    fn opening_past_capacity_expires_the_least_recently_used() {
        let mut t = Sessions::default();
        for i in 1..=SESSION_CAPACITY as u64 {
            t.open(i);
        }
        // Session 1 is used again, so session 2 is now the least recently used.
        assert_eq!(t.apply(10_000, 1, 1), Applied::New);
        t.open(10_001);
        assert_eq!(t.len(), SESSION_CAPACITY);
        assert!(t.get(1).is_some());
        assert!(t.get(2).is_none());
        assert_eq!(t.apply(10_002, 2, 1), Applied::UnknownSession);
    }

    #[test]
    fn a_session_remembers_its_latest_runs_only() {
        let mut t = Sessions::default();
        t.open(1);
        for k in 0..SESSION_RUNS as u64 + 3 {
            // One entry every other index: each is a run of its own.
            assert_eq!(t.apply(2 + 2 * k, 1, k + 1), Applied::New);
        }
        let s = t.get(1).unwrap();
        assert_eq!(s.runs.len(), SESSION_RUNS);
        assert_eq!(s.index_of(1), None);
        assert_eq!(
            s.index_of(SESSION_RUNS as u64 + 3),
            Some(2 + 2 * (SESSION_RUNS as u64 + 2))
        );
    }

    #[test]
    fn the_encoding_round_trips_and_refuses_damage() {
        let mut t = Sessions::default();
        t.open(3);
        t.open(4);
        t.apply(5, 3, 1);
        t.apply(6, 3, 2);
        t.apply(8, 4, 1);
        let mut b = Vec::new();
        t.encode(&mut b);
        assert_eq!(Sessions::decode(&b).unwrap(), t);
        for cut in 0..b.len() {
            assert!(Sessions::decode(&b[..cut]).is_err(), "cut at {cut}");
        }
        let mut extra = b.clone();
        extra.push(0);
        assert!(Sessions::decode(&extra).is_err());
        let mut bad = b.clone();
        bad[0] = b'X';
        assert!(Sessions::decode(&bad).is_err());
        let mut empty = Vec::new();
        Sessions::default().encode(&mut empty);
        assert_eq!(Sessions::decode(&empty).unwrap(), Sessions::default());
    }

    #[test]
    fn pending_forgets_what_is_applied() {
        let mut p = Pending::default();
        p.opened.insert(4);
        p.opened.insert(9);
        p.entries.insert(4, VecDeque::from([(1, 5, 2), (2, 6, 2)]));
        p.entries.insert(9, VecDeque::from([(1, 10, 2)]));
        p.applied(6);
        assert_eq!(p.opened.iter().copied().collect::<Vec<_>>(), [9]);
        assert!(!p.entries.contains_key(&4));
        assert_eq!(p.entries[&9].len(), 1);
    }
}
