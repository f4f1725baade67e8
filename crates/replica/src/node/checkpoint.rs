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
        match self.truncation_checkpoint(index) {
            Some(at) => self.checkpoint(at, &[]),
            None => Ok(self.wal.first_index().0),
        }
    }

    /// Where [`Replica::truncate_prefix`] checkpoints to delete the entries below `index`:
    /// at `index - 1`, clamped to the applied index; `None` when nothing is below.
    pub(crate) fn truncation_checkpoint(&self, index: u64) -> Option<u64> {
        let upto = index.min(self.applied + 1);
        (upto > 1).then(|| upto - 1)
    }

    /// Records a checkpoint: `state` is the application's state after applying every entry up
    /// to and including `index`, which must be applied. It is stored durably, then entries up
    /// to `index` are deleted (whole segments). A follower that needs deleted entries is sent
    /// the checkpoint as a raft snapshot, in chunks over send/recv, and installs it; its
    /// application restores from [`Replica::latest_checkpoint`] when a read reports
    /// [`ReplicaError::Compacted`]. Refused (with the reason) when `index` is not applied yet,
    /// when `state` exceeds `max_snapshot_bytes`, or when a membership change was applied
    /// after `index` (checkpoint at that change or later). An `index` at or below the latest
    /// checkpoint changes nothing. A failed write (of the checkpoint, the cut, the membership)
    /// poisons the replica: it stops, and the next start reads what the disk holds. Returns the
    /// new first index.
    pub fn checkpoint(&mut self, index: u64, state: &[u8]) -> Result<u64, ReplicaError> {
        loop {
            let plan = match self.plan_checkpoint(index, state.len())? {
                Plan::Nothing { first } => return Ok(first),
                Plan::Read(plan) => plan,
            };
            let table = match plan.read_sessions() {
                Ok(t) => t,
                Err(e) => {
                    self.after_failed_reading(&plan, e)?;
                    continue;
                }
            };
            if let Some(first) = self.finish_checkpoint(plan, table, state)? {
                return Ok(first);
            }
        }
    }

    /// The first step of a checkpoint at `index` (see [`Replica::checkpoint`]): its checks,
    /// and what the session table as of `index` needs read from the log. The reading
    /// ([`CheckpointPlan::read_sessions`]) needs no `&self`: [`crate::Log`] does it without
    /// the replica's lock, so that a checkpoint far behind the applied index (every trim and
    /// retention pass cuts at the start of the first segment it keeps) does not hold up the
    /// driver while it reads back every entry it deletes.
    pub(crate) fn plan_checkpoint(
        &self,
        index: u64,
        state_len: usize,
    ) -> Result<Plan, ReplicaError> {
        if let Some(p) = &self.poisoned {
            return Err(ReplicaError::Poisoned(p.clone()));
        }
        let refuse = |why: String| Err(ReplicaError::Checkpoint(why));
        if state_len as u64 > self.cfg.max_snapshot_bytes {
            return refuse(format!(
                "a state of {state_len} bytes exceeds max_snapshot_bytes ({})",
                self.cfg.max_snapshot_bytes
            ));
        }
        if index > self.applied {
            return refuse(format!(
                "entry {index} is not applied yet (applied up to {}); checkpoint only what the application applied",
                self.applied
            ));
        }
        let latest = self.latest_checkpoint_index();
        if index == 0 || index <= latest {
            return Ok(Plan::Nothing {
                first: self.wal.first_index().0,
            });
        }
        self.checkpoint_position(index)?;
        // The table as of the applied index is at hand; as of an earlier one, it is the latest
        // checkpoint's with the entries after it applied again.
        let (base, read_from) = if index == self.applied {
            (self.sessions.clone(), index + 1)
        } else {
            let base = match self.raw.store().latest_snapshot() {
                Some(snap) => CheckpointData::decode(&snap.data)
                    .and_then(|d| d.session_table())
                    .map_err(ReplicaError::Checkpoint)?,
                None => Sessions::default(),
            };
            (base, (latest + 1).max(self.wal.first_index().0))
        };
        Ok(Plan::Read(CheckpointPlan {
            index,
            latest,
            base,
            read_from,
            wal: self.wal.clone(),
        }))
    }

    /// The last step of a checkpoint: stores it and cuts the log, with the session table the
    /// plan's reading made. `None` when another checkpoint (taken here, or installed from the
    /// leader) came after the plan was made: plan again. (Going on would not store the older
    /// checkpoint over the newer one: the membership as of its index is forgotten by then,
    /// and the caller would get that refusal for a checkpoint it never asked to be older.)
    pub(crate) fn finish_checkpoint(
        &mut self,
        plan: CheckpointPlan,
        table: Sessions,
        state: &[u8],
    ) -> Result<Option<u64>, ReplicaError> {
        if let Some(p) = &self.poisoned {
            return Err(ReplicaError::Poisoned(p.clone()));
        }
        if self.latest_checkpoint_index() != plan.latest {
            self.stats.checkpoints_replanned += 1;
            return Ok(None);
        }
        let index = plan.index;
        let (conf, pos) = self.checkpoint_position(index)?;
        let mut sessions = Vec::new();
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
        match self.store_checkpoint(snap, pos.last_term.0) {
            Ok(first) => Ok(Some(first)),
            Err(why) => {
                // Stopped part way, the checkpoint leaves the disk in a state the replica no
                // longer knows (the snapshot file renamed in without its directory's fsync,
                // a wal that poisoned itself at its cut, a membership not stored): it stops,
                // as after a failed persist, and the next start reads what the disk holds.
                tracing::error!(node = self.cfg.id, error = %why, "a checkpoint failed: the replica stops (fail-stop)");
                self.poisoned.get_or_insert_with(|| why.clone());
                Err(ReplicaError::Poisoned(why))
            }
        }
    }

    /// The durable steps of a checkpoint: stores `snap`, cuts the log after its index, then
    /// stores the membership (its history forgets what the cut took). The new first index,
    /// or why a step failed.
    fn store_checkpoint(&mut self, snap: Snapshot, last_term: u64) -> Result<u64, String> {
        let index = snap.get_metadata().index;
        self.snapshot_file
            .store(&snap)
            .map_err(|e| poison_msg("cannot store the checkpoint", e))?;
        self.raw.mut_store().set_snapshot(snap);
        let first = self
            .wal
            .truncate_prefix(Index(index + 1))
            .map_err(|e| poison_msg("cannot cut the log after the checkpoint", e))?;
        let prefix_term = self
            .wal
            .position_after(Index(first.0 - 1))
            .map_or(last_term, |p| p.last_term.0);
        self.raw.mut_store().set_prefix(first.0, prefix_term);
        self.raw.mut_store().forget_below(first.0);
        self.conf_history.compact(index);
        self.store_state().map_err(|e| e.poison_cause())?;
        Ok(first.0)
    }

    /// What a failed reading of `plan` comes to: planned again (`Ok`) when another
    /// checkpoint came meanwhile (one installed from the leader restarts the log under the
    /// reading), the poisoning when the replica failed meanwhile, else the read's error.
    pub(crate) fn after_failed_reading(
        &mut self,
        plan: &CheckpointPlan,
        error: ReplicaError,
    ) -> Result<(), ReplicaError> {
        if let Some(p) = &self.poisoned {
            return Err(ReplicaError::Poisoned(p.clone()));
        }
        if self.latest_checkpoint_index() == plan.latest {
            return Err(error);
        }
        self.stats.checkpoints_replanned += 1;
        Ok(())
    }

    /// [`ReplicaError::Compacted`] when committed entry `index` is no longer held (deleted
    /// after a checkpoint); `None` when it is, or is not committed.
    pub(crate) fn compacted(&self, index: u64) -> Option<ReplicaError> {
        let first = self.first_index();
        (index > 0 && index < first && index <= self.commit_index()).then(|| {
            ReplicaError::Compacted {
                index,
                checkpoint_index: self.latest_checkpoint().map_or(first - 1, |c| c.index),
            }
        })
    }

    /// The index of the latest checkpoint, taken here or installed (0: none).
    pub(crate) fn latest_checkpoint_index(&self) -> u64 {
        self.raw
            .store()
            .latest_snapshot()
            .map_or(0, |s| s.get_metadata().index)
    }

    /// The membership as of `index` and the log's position after it, or the reason a
    /// checkpoint cannot be taken there.
    fn checkpoint_position(&self, index: u64) -> Result<(ConfState, Position), ReplicaError> {
        let refuse = |why: String| Err(ReplicaError::Checkpoint(why));
        let Some(conf) = self.conf_history.at(index).cloned() else {
            return refuse(format!(
                "the membership as of index {index} is no longer known (it is kept from index {} on); checkpoint at {} or later",
                self.conf_history.base_index, self.conf_history.base_index
            ));
        };
        if conf.voters.is_empty() && conf.voters_outgoing.is_empty() {
            // A node that joined by replaying the log knew no members before the change that
            // added them: a checkpoint there could never be restored (raft-rs refuses a
            // membership without voters), and a follower sent it would never catch up.
            return refuse(format!(
                "the membership as of index {index} has no voters (this node joined later and replayed the log); checkpoint at the change that added it or later"
            ));
        }
        let Some(pos) = self.wal.position_after(Index(index)) else {
            return refuse(format!(
                "entry {index} is no longer in the log (it starts at {})",
                self.wal.first_index().0
            ));
        };
        Ok((conf, pos))
    }

    /// The index the session table ([`Replica::sessions`]) is as of: the applied index, or,
    /// while a restart applies again the entries a checkpoint covers, the checkpoint's.
    pub fn sessions_index(&self) -> u64 {
        self.applied.max(self.sessions_through)
    }

    /// The client sessions table, as of [`Replica::sessions_index`].
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

/// What [`Replica::plan_checkpoint`] found.
pub(crate) enum Plan {
    /// The checkpoint is at or below the latest one: nothing to do; the log's first index.
    Nothing { first: u64 },
    /// Read the log as the plan says, then [`Replica::finish_checkpoint`].
    Read(CheckpointPlan),
}

/// A checkpoint under way: the session table as of `index` is `base` (as of `latest`) with
/// the log's entries `read_from..=index` applied to it, which [`CheckpointPlan::read_sessions`]
/// reads from the log on its own (the wal serves reads beside appends).
pub(crate) struct CheckpointPlan {
    index: u64,
    latest: u64,
    base: Sessions,
    read_from: u64,
    wal: Arc<Wal>,
}

impl CheckpointPlan {
    /// The session table as of the plan's index. A read that fails because a checkpoint
    /// installed meanwhile restarted the log shows in [`Replica::finish_checkpoint`]'s check.
    pub(crate) fn read_sessions(&self) -> Result<Sessions, ReplicaError> {
        let mut t = self.base.clone();
        let mut buf = Vec::new();
        for i in self.read_from..=self.index {
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
}
