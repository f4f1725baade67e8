//! Checkpoints and retention: cutting the log's prefix, storing a state machine's checkpoint
//! with its sessions, and the views retention decides from.

use super::*;

impl<F: Fabric> Replica<F> {
    /// Deletes entries below `index` after the application checkpointed them elsewhere,
    /// recording a checkpoint without state at `index - 1` (clamped to the applied index) so
    /// that a follower behind the cut can still be caught up: it gets a snapshot with an empty
    /// state (see [`Replica::checkpoint`] to ship the application's state with it). Returns
    /// the new first index (whole segments are deleted, so it may be lower than `index`).
    pub fn truncate_prefix(&mut self, index: u64) -> Result<u64, ReplicaError> {
        let upto = index.min(self.applied + 1);
        if upto <= 1 {
            return Ok(self.wal.first_index().0);
        }
        self.checkpoint(upto - 1, &[])
    }

    /// Records a checkpoint: `state` is the application's state after applying every entry up
    /// to and including `index`, which must be applied. It is stored durably, then entries up
    /// to `index` are deleted (whole segments). A follower that needs deleted entries is sent
    /// the checkpoint as a raft snapshot, in chunks over send/recv, and installs it; its
    /// application restores from [`Replica::latest_checkpoint`] when a read reports
    /// [`ReplicaError::Compacted`]. Refused (with the reason) when `index` is not applied yet,
    /// when `state` exceeds `max_snapshot_bytes`, or when a membership change was applied
    /// after `index` (checkpoint at that change or later). An `index` at or below the latest
    /// checkpoint changes nothing. Returns the new first index.
    pub fn checkpoint(&mut self, index: u64, state: &[u8]) -> Result<u64, ReplicaError> {
        if let Some(p) = &self.poisoned {
            return Err(ReplicaError::Poisoned(p.clone()));
        }
        let refuse = |why: String| Err(ReplicaError::Checkpoint(why));
        if state.len() as u64 > self.cfg.max_snapshot_bytes {
            return refuse(format!(
                "a state of {} bytes exceeds max_snapshot_bytes ({})",
                state.len(),
                self.cfg.max_snapshot_bytes
            ));
        }
        if index > self.applied {
            return refuse(format!(
                "entry {index} is not applied yet (applied up to {}); checkpoint only what the application applied",
                self.applied
            ));
        }
        let latest = self
            .raw
            .store()
            .latest_snapshot()
            .map_or(0, |s| s.get_metadata().index);
        if index == 0 || index <= latest {
            return Ok(self.wal.first_index().0);
        }
        let Some(conf) = self.conf_history.at(index).cloned() else {
            return refuse(format!(
                "the membership as of index {index} is no longer known (it is kept from index {} on); checkpoint at {} or later",
                self.conf_history.base_index, self.conf_history.base_index
            ));
        };
        let Some(pos) = self.wal.position_after(Index(index)) else {
            return refuse(format!(
                "entry {index} is no longer in the log (it starts at {})",
                self.wal.first_index().0
            ));
        };
        let mut sessions = Vec::new();
        let table = self.sessions_at(index, latest)?;
        if !table.is_empty() {
            table.encode(&mut sessions);
        }
        let mut snap = Snapshot::default();
        let meta = snap.mut_metadata();
        meta.index = index;
        meta.term = pos.last_term.0;
        *meta.mut_conf_state() = conf;
        snap.data = CheckpointData {
            lsn: pos.lsn.0,
            sessions: &sessions,
            state,
        }
        .encode()
        .into();
        self.snapshot_file
            .store(&snap)
            .map_err(|e| ReplicaError::Poisoned(poison_msg("cannot store the checkpoint", e)))?;
        self.raw.mut_store().set_snapshot(snap);
        let first = self.wal.truncate_prefix(Index(index + 1))?;
        let prefix_term = self
            .wal
            .position_after(Index(first.0 - 1))
            .map_or(pos.last_term.0, |p| p.last_term.0);
        self.raw.mut_store().set_prefix(first.0, prefix_term);
        self.raw.mut_store().forget_below(first.0);
        self.conf_history.compact(index);
        self.store_state()?;
        Ok(first.0)
    }

    /// The session table as of applied entry `index`: the latest checkpoint's (at
    /// `latest`), with the entries after it applied again from the log.
    pub(super) fn sessions_at(&self, index: u64, latest: u64) -> Result<Sessions, ReplicaError> {
        if index == self.applied {
            return Ok(self.sessions.clone());
        }
        let mut t = match self.raw.store().latest_snapshot() {
            Some(snap) => CheckpointData::decode(&snap.data)
                .and_then(|d| d.session_table())
                .map_err(ReplicaError::Checkpoint)?,
            None => Sessions::default(),
        };
        let mut buf = Vec::new();
        for i in (latest + 1).max(self.wal.first_index().0)..=index {
            self.wal.read(Index(i), &mut buf)?;
            match payload_kind(&buf) {
                PayloadKind::SessionOpen => t.open(i),
                PayloadKind::Application {
                    session: Some((id, seq)),
                    ..
                } => {
                    t.apply(i, id, seq);
                }
                _ => {}
            }
        }
        Ok(t)
    }

    /// The client sessions as of the applied index.
    pub fn sessions(&self) -> &Sessions {
        &self.sessions
    }

    /// Where the record of entry `index` starts in the log's stream (the end, past the last).
    pub(super) fn stream_start_of(&self, index: u64) -> u64 {
        self.wal
            .position_after(Index(index - 1))
            .map_or(self.wal.position().lsn.0, |p| p.lsn.0)
    }

    /// Bytes of the log's stream from the first entry held to the end.
    pub(super) fn log_bytes(&self) -> u64 {
        let first = self.wal.first_index().0.max(1);
        self.wal.position().lsn.0 - self.stream_start_of(first)
    }

    /// The first index from which the log holds at most `max_bytes` of its stream (one past
    /// the last when even the last entry is larger).
    pub fn first_within_bytes(&self, max_bytes: u64) -> u64 {
        let end = self.wal.position().lsn.0;
        let (mut lo, mut hi) = (self.wal.first_index().0.max(1), self.wal.last_index().0 + 1);
        // The bytes from `i` on fall as `i` grows: find the first `i` within the limit.
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if end - self.stream_start_of(mid) <= max_bytes {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        lo
    }

    /// What a retention policy looks at ([`crate::retention`]): the log's bounds, the applied
    /// index, and each segment's first index with its file's last write (`None` where the
    /// file system cannot tell, as in the simulator).
    pub fn retention_view(&self) -> crate::retention::Held {
        crate::retention::Held {
            first: self.wal.first_index().0.max(1),
            last: self.wal.last_index().0,
            applied: self.applied,
            segments: self
                .wal
                .segment_starts()
                .into_iter()
                .map(|(index, lsn)| {
                    let path = self.cfg.data_dir.join(Wal::segment_file_name(lsn));
                    let written = std::fs::metadata(path).and_then(|m| m.modified()).ok();
                    (index.0, written)
                })
                .collect(),
        }
    }

    /// The first index the log holds.
    pub fn first_index(&self) -> u64 {
        self.wal.first_index().0
    }

    /// The latest checkpoint, taken here or installed from the leader.
    pub fn latest_checkpoint(&self) -> Option<Checkpoint> {
        let snap = self.raw.store().latest_snapshot()?;
        let meta = snap.get_metadata();
        Some(Checkpoint {
            index: meta.index,
            term: meta.term,
            state: CheckpointData::decode(&snap.data)
                .map(|d| d.state.to_vec())
                .unwrap_or_default(),
        })
    }
}
