//! Handling raft's `Ready` in its required order: the ring, the wal, the hard state,
//! snapshots, and applying committed entries.

use super::*;

impl<F: Fabric> Replica<F> {
    pub(super) fn handle_ready(&mut self) -> Result<(), ReplicaError> {
        self.quiet = None;
        self.step_deferred();
        let mut rd = self.raw.ready();
        self.reads.confirm(rd.take_read_states());
        if !rd.snapshot().is_empty() {
            let snap = rd.snapshot().clone();
            self.install_snapshot(&snap)?;
        }
        let entries = rd.take_entries();
        // The leader's entries must be in the ring before its messages go out: the fast path
        // writes them from there.
        self.write_entries_to_ring(&entries)?;
        let range = entries
            .first()
            .zip(entries.last())
            .map(|(a, b)| (a.index, b.index));
        if let Some((first, last)) = range {
            step!(self.cfg.id, "ready", first, last);
        }
        self.send_all(rd.take_messages());
        let committed = rd.take_committed_entries();
        self.apply(committed)?;
        if let Some((first, last)) = range {
            self.persist()?;
            step!(self.cfg.id, "persisted", first, last);
            self.raw.mut_store().remember(entries);
        }
        if let Some(hs) = rd.hs() {
            step!(self.cfg.id, "committed", hs.commit, hs.commit);
            self.store_hard_state(hs.clone())?;
        }
        // A new term is durable now: grant its leader before our answers to it leave.
        self.update_fencing();
        self.send_all(rd.take_persisted_messages());
        let mut light = self.raw.advance(rd);
        if let Some(commit) = light.commit_index() {
            step!(self.cfg.id, "committed", commit, commit);
        }
        self.send_all(light.take_messages());
        let committed = light.take_committed_entries();
        self.apply(committed)?;
        self.raw.advance_apply();
        self.raw.mut_store().forget_applied(self.applied);
        self.release_ring()?;
        self.check_nic_promises();
        Ok(())
    }

    /// Installs a snapshot raft accepted from the leader (this node's log does not hold its
    /// last entry): the snapshot is stored durably first, then the log restarts empty right
    /// after it (`Replica::open` finishes the job if this process stops in between), then the
    /// ring, raft's storage and the membership follow.
    pub(super) fn install_snapshot(&mut self, snap: &Snapshot) -> Result<(), ReplicaError> {
        let meta = snap.get_metadata();
        let lsn = snapshot_lsn(snap).filter(|l| l % 8 == 0).ok_or_else(|| {
            ReplicaError::Poisoned("a snapshot without a valid log position".into())
        })?;
        let sessions = CheckpointData::decode(&snap.data)
            .and_then(|d| d.session_table())
            .map_err(|e| ReplicaError::Poisoned(format!("a snapshot's session table: {e}")))?;
        self.snapshot_file
            .store(snap)
            .map_err(|e| ReplicaError::Poisoned(poison_msg("cannot store a snapshot", e)))?;
        let lsn = if self.cfg.mutation == crate::Mutation::SnapshotOwnLsn {
            // The mutation: go on from this node's own stream position, not the leader's.
            self.producer.position().lsn.0
        } else {
            lsn
        };
        let start = Position {
            lsn: Lsn(lsn),
            last_index: Index(meta.index),
            last_term: Term(meta.term),
        };
        // The snapshot's membership is durable before the log restarts at the snapshot: a
        // stop in between leaves a log that does not hold the snapshot, and the next start
        // finishes the install (`Replica::finish_snapshot_install`). The other way round, a
        // stop after the restart left a log that holds it, and the start went on with the
        // membership from before the snapshot, for good.
        let cs = meta.get_conf_state().clone();
        let mut hs = self.raw.store().hard_state().clone();
        hs.commit = hs.commit.max(meta.index);
        let history = ConfHistory::new(meta.index, cs.clone());
        let late = self.cfg.mutation == crate::Mutation::MembershipAfterLogRestart;
        if !late {
            self.state_file.store(&hs, &cs, &history).map_err(|e| {
                ReplicaError::Poisoned(poison_msg("cannot persist the membership", e))
            })?;
        }
        if self.cfg.durability.commits_on_nic_ack() {
            // The ring starts over: close it (the next grant clears and opens the new one).
            self.fence_ring();
        }
        let ring_cfg = RingConfig {
            capacity_bytes: self.cfg.ring_bytes,
            block_bytes: self.cfg.block_bytes,
        };
        // The ring lets go of its records before the wal does, as in a cut
        // (`Replica::truncate_from`): a crash inside the restart may leave the old log, an
        // empty one, or the new one, and the ring must claim nothing past any of them (the
        // next open then takes nothing from it instead of reading its records past an
        // emptied wal as corrupt and coming back recovering).
        if self.cfg.mutation != crate::Mutation::CutWalBeforeRing {
            wal::clear_published(self.memory.as_ref());
        }
        self.wal.restart_at(start)?;
        if late {
            self.state_file.store(&hs, &cs, &history).map_err(|e| {
                ReplicaError::Poisoned(poison_msg("cannot persist the membership", e))
            })?;
        }
        self.raw.mut_store().forget_all();
        let (p, c) = wal::ring(self.memory.clone(), ring_cfg, start)?;
        self.producer = p;
        self.consumer = c;
        self.ring_entries.clear();
        self.writes_in_flight = Inflight::default();
        self.fast_accepted_to = meta.index;
        self.conf_history = history;
        let store = self.raw.mut_store();
        store.set_prefix(meta.index + 1, meta.term);
        store.set_conf_state(cs.clone());
        store.set_hard_state(hs);
        store.set_snapshot(snap.clone());
        self.applied = meta.index;
        self.sessions = sessions;
        self.sessions_through = meta.index;
        self.pending_sessions = Pending::default();
        self.sync_peers(&members_of(&cs));
        self.stats.snapshots_installed += 1;
        tracing::info!(
            node = self.cfg.id,
            index = meta.index,
            term = meta.term,
            state_bytes = CheckpointData::decode(&snap.data).map_or(0, |d| d.state.len()),
            "installed a snapshot from the leader"
        );
        Ok(())
    }

    pub(super) fn store_hard_state(&mut self, hs: HardState) -> Result<(), ReplicaError> {
        // Term and vote must be durable before any message that depends on them leaves; the
        // commit index is re-learned after a restart, so it alone does not cost an fsync.
        let changed = hs.term != self.persisted_hs.term || hs.vote != self.persisted_hs.vote;
        self.raw.mut_store().set_hard_state(hs.clone());
        if changed {
            let cs = self.raw.store().conf_state().clone();
            self.state_file
                .store(&hs, &cs, &self.conf_history)
                .map_err(|e| {
                    ReplicaError::Poisoned(poison_msg("cannot persist the raft state", e))
                })?;
            self.persisted_hs = hs;
        }
        Ok(())
    }

    pub(super) fn write_entries_to_ring(&mut self, entries: &[Entry]) -> Result<(), ReplicaError> {
        for e in entries {
            let pos = self.producer.position();
            if e.index <= pos.last_index.0 {
                // Accepted from a leader's write, or (leader) put there ahead of raft.
                let same = (e.index <= self.fast_accepted_to || e.index <= self.direct_ring_to)
                    && self
                        .ring_entry(e.index)
                        .is_some_and(|(_, r)| r.term.0 == e.term);
                if same {
                    continue;
                }
                self.truncate_from(e.index)?;
            }
            let mut scratch = std::mem::take(&mut self.scratch);
            let payload = payload_of(e, &mut scratch);
            let result = self.producer.append(Index(e.index), Term(e.term), payload);
            let result = match result {
                Err(wal::WalError::RingFull { .. }) => {
                    self.stats.ring_full += 1;
                    // Persist what the ring holds and release it, even bytes that RDMA writes
                    // still in flight read from: a write whose source is overwritten delivers
                    // garbage, which the follower's checksum rejects, and that follower falls
                    // back to the slow path. Pinning is an optimisation, never a reason to stall.
                    self.persist()?;
                    if self.cfg.durability.ring_in_shared_memory() {
                        self.sync_wal()?;
                    }
                    self.unpin_writes();
                    self.release_ring()?;
                    self.producer.append(Index(e.index), Term(e.term), payload)
                }
                other => other,
            };
            self.scratch = scratch;
            let lsn = result?;
            self.ring_entries.push_back(RingEntry {
                index: Index(e.index),
                term: Term(e.term),
                start: lsn,
                end: self.producer.position().lsn,
            });
        }
        Ok(())
    }

    /// The ring's record of entry `index` and its position in `ring_entries`. The entries are
    /// consecutive, so this is arithmetic; the scan is a fallback that never runs while they
    /// are (the ring holds up to half a ring of unsynced entries under `Memory`, so a scan per
    /// append showed up in the commit cost).
    pub(super) fn ring_entry(&self, index: u64) -> Option<(usize, RingEntry)> {
        let front = self.ring_entries.front()?.index.0;
        let k = index.checked_sub(front)? as usize;
        match self.ring_entries.get(k) {
            Some(r) if r.index.0 == index => Some((k, *r)),
            _ => self
                .ring_entries
                .iter()
                .position(|r| r.index.0 == index)
                .map(|k| (k, self.ring_entries[k])),
        }
    }

    /// Removes entries from `index` on (a raft conflict), in the ring and durably in the wal.
    ///
    /// The ring goes back first, then the wal. After a process crash the next open checks
    /// the ring's records from the wal's end up to the ring's published end; records the
    /// ring already handed to the wal are gone from it (its free part is zeroed or written
    /// over). Cut the wal first and a crash (or a failed fdatasync of the cut) between the
    /// two leaves a published end past the wal's new end over bytes the ring no longer
    /// holds: the node reads its own intact ring as corrupt and comes back recovering,
    /// which with a second node down stalls the cluster (simulator seed 501055,
    /// `Durability::Replicated`). Rewound first, every crash point leaves a published end
    /// at or below the wal's end: the wal's old suffix, or the cut, and a prefix either way.
    pub(super) fn truncate_from(&mut self, index: u64) -> Result<(), ReplicaError> {
        // Under Replicated the cut records must not be taken back as placed ones: close the
        // ring first; the next grant clears its free part before it opens it again.
        if self.cfg.durability.commits_on_nic_ack() {
            self.fence_ring();
        }
        let wal_first = self.cfg.mutation == crate::Mutation::CutWalBeforeRing;
        if wal_first && index <= self.wal.last_index().0 {
            self.wal.truncate_suffix(Index(index))?;
        }
        self.rewind_ring_before(index)?;
        if !wal_first && index <= self.wal.last_index().0 {
            self.wal.truncate_suffix(Index(index))?;
        }
        self.raw.mut_store().forget_from(index);
        self.ring_entries.retain(|r| r.index.0 < index);
        self.fast_accepted_to = self.fast_accepted_to.min(index - 1);
        Ok(())
    }

    /// Moves the ring's end to right after entry `index - 1` ([`Replica::truncate_from`]).
    pub(super) fn rewind_ring_before(&mut self, index: u64) -> Result<(), ReplicaError> {
        let prev = self.ring_entry(index - 1).map(|(_, r)| r);
        let cut = (self.cfg.mutation == crate::Mutation::RewindToCutRecord)
            .then(|| self.ring_entry(index).map(|(_, r)| r.start.0))
            .flatten();
        // The log goes on right after entry `index - 1`: the end of its ring record, or, once
        // the ring released it, its end in the wal. Never the start of the cut record:
        // padding may lie between the two, and the leader places the next entry right after
        // `index - 1`, so a follower rewound past the padding would hold every later entry at
        // other Lsns than the leader's (and refuse every fast append).
        let (after, in_ring) = match prev {
            Some(p) => (
                Position {
                    lsn: p.end,
                    last_index: p.index,
                    last_term: p.term,
                },
                true,
            ),
            None => {
                let Some(after) = self.wal.position_after(Index(index - 1)) else {
                    return Err(ReplicaError::Poisoned(format!(
                        "cannot cut the log at entry {index}: neither the ring nor the wal holds entry {} (the wal holds {}..={})",
                        index - 1,
                        self.wal.first_index().0,
                        self.wal.last_index().0
                    )));
                };
                let head = self.consumer.head().0;
                let at = match cut {
                    Some(c) if c >= head => Lsn(c),
                    _ => after.lsn,
                };
                (Position { lsn: at, ..after }, at.0 >= head)
            }
        };
        if in_ring {
            self.producer.rewind(after)?;
        } else {
            // The cut is below the ring's window: start a fresh ring where the log goes on.
            let ring_cfg = RingConfig {
                capacity_bytes: self.cfg.ring_bytes,
                block_bytes: self.cfg.block_bytes,
            };
            let (p, c) = wal::ring(self.memory.clone(), ring_cfg, after)?;
            self.producer = p;
            self.consumer = c;
        }
        Ok(())
    }

    pub(super) fn persist(&mut self) -> Result<(), ReplicaError> {
        let end = self.producer.position().lsn;
        if end > self.wal.position().lsn {
            persist_ring(
                &self.wal,
                &mut self.producer,
                &self.consumer,
                self.cfg.durability.wal(),
            )
            .map_err(|e| ReplicaError::Poisoned(poison_msg("cannot persist the log", e)))?;
        }
        // Under Memory the ring keeps what is not yet fdatasynced (see `release_ring`): sync
        // once half of it waits, so the ring never fills with bytes it may not release.
        if self.cfg.durability.ring_in_shared_memory()
            && end.0.saturating_sub(self.wal.durable_lsn().0) > self.cfg.ring_bytes / 2
        {
            self.sync_wal()?;
        }
        Ok(())
    }

    pub(super) fn sync_wal(&mut self) -> Result<(), ReplicaError> {
        self.wal
            .sync()
            .map_err(|e| ReplicaError::Poisoned(poison_msg("cannot sync the log", e)))?;
        Ok(())
    }

    pub(super) fn release_ring(&mut self) -> Result<(), ReplicaError> {
        // Under Memory the ring is the copy of record until the segment files are synced:
        // after a crash of this process, recovery takes from it what the files lack.
        let persisted = if self.cfg.durability.ring_in_shared_memory() {
            self.wal.durable_lsn().0
        } else {
            self.wal.position().lsn.0
        };
        let pinned = self
            .writes_in_flight
            .pinned_from()
            .map_or(u64::MAX, |l| l.0);
        let up_to = persisted.min(pinned).min(self.producer.position().lsn.0);
        if up_to > self.consumer.head().0 {
            self.consumer.release(Lsn(up_to))?;
            while self.ring_entries.front().is_some_and(|r| r.end.0 <= up_to) {
                self.ring_entries.pop_front();
            }
        }
        Ok(())
    }

    pub(super) fn apply(&mut self, entries: Vec<Entry>) -> Result<(), ReplicaError> {
        for e in entries {
            if e.index <= self.applied {
                continue;
            }
            // A change the stored membership holds already: a restart starts raft with the
            // latest membership and applies again from the log's first entry. Applying such a
            // change again went back to the membership it made (an older one) until the
            // later changes were applied again, and could fail for good (removing a node the
            // latest membership had added back: "removed all voters" at every start).
            if e.get_entry_type() != EntryType::EntryNormal
                && e.index <= self.conf_history.as_of()
                && self.cfg.mutation != crate::Mutation::ReplayAppliedConfChanges
            {
                self.applied = e.index;
                continue;
            }
            match e.get_entry_type() {
                // In the session table already: a restart applies again from the log's
                // first entry, at or below the checkpoint's (`sessions_through`).
                EntryType::EntryNormal if e.index <= self.sessions_through => {}
                EntryType::EntryNormal => match payload_kind(&e.data) {
                    PayloadKind::SessionOpen => self.sessions.open(e.index),
                    PayloadKind::Application {
                        session: Some((id, seq)),
                        ..
                    } => {
                        if let Applied::Duplicate { first } = self.sessions.apply(e.index, id, seq)
                        {
                            self.stats.session_duplicates_applied += 1;
                            tracing::error!(
                                node = self.cfg.id,
                                index = e.index,
                                session = id,
                                seq,
                                ?first,
                                "a session entry is in the committed log twice"
                            );
                        }
                    }
                    _ => {}
                },
                EntryType::EntryConfChange => {
                    let cc = ConfChange::parse_from_bytes(&e.data)
                        .map_err(|err| ReplicaError::Membership(err.to_string()))?;
                    let knows_members = !self.raw.raft.prs().conf().voters().ids().is_empty();
                    match voters_after(&cc) {
                        // A joining node knows no members: adopt the voters the change
                        // records, one simple change at a time, instead of applying the change
                        // to an empty membership (which made a joiner a cluster of itself, or
                        // failed with "removed all voters").
                        Some(voters) if !knows_members => {
                            self.infer_membership_before(&cc, &voters);
                            for v in voters {
                                let mut add = ConfChange::default();
                                add.set_change_type(ConfChangeType::AddNode);
                                add.node_id = v;
                                self.apply_conf_change(&add)?;
                            }
                        }
                        _ => self.apply_conf_change(&cc)?,
                    }
                }
                EntryType::EntryConfChangeV2 => {
                    let cc = ConfChangeV2::parse_from_bytes(&e.data)
                        .map_err(|err| ReplicaError::Membership(err.to_string()))?;
                    self.apply_conf_change(&cc)?;
                }
            }
            if e.get_entry_type() != EntryType::EntryNormal {
                let cs = self.raw.store().conf_state().clone();
                self.conf_history.record(e.index, cs);
                // The commit index that covers the change goes with it: the stored one may
                // lag (a commit-only change is not written), and a restart from it would
                // take the change for uncommitted and go back to the configuration before,
                // which may count a node already removed and shut down: with one more node
                // lost the cluster can never elect again (simulator seed 9,950,157 of
                // `--conditional`, 8,000,412 of `--durability replicated`).
                let mut hs = self.raw.store().hard_state().clone();
                if hs.commit < e.index && self.cfg.mutation != crate::Mutation::ConfChangeCommitLags
                {
                    hs.commit = e.index;
                    self.raw.mut_store().set_hard_state(hs);
                }
                self.store_state()?;
            }
            self.applied = e.index;
        }
        self.pending_sessions.applied(self.applied);
        Ok(())
    }

    /// A node that joined and replays the log from its start knew no members before the
    /// first change it applies, `cc` (the voters after it: `after`). Every entry before it was
    /// under the membership that change changed: `after` with the change undone. The history
    /// takes that as its base, so that a checkpoint below the change records the membership it
    /// was under; one recording none could never be restored by a follower (raft-rs refuses
    /// a membership without voters, and panicked on it before `node::peer_input`).
    fn infer_membership_before(&mut self, cc: &ConfChange, after: &[u64]) {
        let h = &self.conf_history;
        if !(h.base.voters.is_empty() && h.base.voters_outgoing.is_empty() && h.changes.is_empty())
        {
            return;
        }
        let mut before: Vec<u64> = after.to_vec();
        match cc.get_change_type() {
            ConfChangeType::AddNode => before.retain(|&v| v != cc.node_id),
            ConfChangeType::RemoveNode if !before.contains(&cc.node_id) => before.push(cc.node_id),
            _ => {}
        }
        before.sort_unstable();
        if before.is_empty() {
            return;
        }
        let mut cs = ConfState::default();
        cs.voters = before;
        self.conf_history = ConfHistory::new(h.base_index, cs);
    }

    pub(super) fn apply_conf_change(
        &mut self,
        cc: &impl raft_proto::ConfChangeI,
    ) -> Result<(), ReplicaError> {
        let cs = self.raw.apply_conf_change(cc)?;
        let r = &self.raw.raft;
        if r.state == StateRole::Leader
            && !cs.voters.contains(&self.cfg.id)
            && self.cfg.mutation != crate::Mutation::RemovedLeaderLeads
        {
            // A leader the change removed (a node that won an election with a configuration
            // that still counted it, before it applied its own removal). raft-rs keeps it
            // leading without a progress of its own, and panics at the next response it
            // steps (`Raft::maybe_commit`; simulator seed 10,500,953 of `--durability
            // fsync`). It steps down, as etcd's leader does: a voter of the new configuration
            // takes over at its election timeout.
            tracing::info!(
                node = self.cfg.id,
                term = r.term,
                "removed from the voters while leading: steps down"
            );
            let term = r.term;
            self.raw.raft.become_follower(term, raft::INVALID_ID);
        }
        let members = members_of(&cs);
        self.raw.mut_store().set_conf_state(cs);
        self.sync_peers(&members);
        Ok(())
    }

    /// Persists the raft state with a new amnesia guard.
    pub(super) fn store_guard(&mut self, guard: Guard) -> Result<(), ReplicaError> {
        let hs = self.raw.store().hard_state().clone();
        self.store_guard_with(guard, &hs)
    }

    /// Persists the raft state with a new amnesia guard and hard state `hs`, in one write.
    pub(super) fn store_guard_with(
        &mut self,
        guard: Guard,
        hs: &HardState,
    ) -> Result<(), ReplicaError> {
        let cs = self.raw.store().conf_state().clone();
        self.state_file
            .store_guard(guard, hs, &cs, &self.conf_history)
            .map_err(|e| ReplicaError::Poisoned(poison_msg("cannot persist the raft state", e)))
    }

    /// Persists the hard state, the membership and its history.
    pub(super) fn store_state(&mut self) -> Result<(), ReplicaError> {
        let hs = self.raw.store().hard_state().clone();
        let cs = self.raw.store().conf_state().clone();
        self.state_file
            .store(&hs, &cs, &self.conf_history)
            .map_err(|e| ReplicaError::Poisoned(poison_msg("cannot persist the membership", e)))
    }
}
