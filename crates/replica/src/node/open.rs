//! Opening a replica: its data dir, the wal, a snapshot, the ring it takes over, the amnesia
//! guard, and raft's configuration.

use super::*;

/// What an operator does with a node whose data dir lost a file no copy elsewhere restores.
const REPLACE_NODE: &str = "remove the node from the cluster (rdmalog members remove), clear the directory and add it back; or clear the directory and restart the node under its id: it then waits for every other voter's term before it votes, and catches up from the leader";

impl<F: Fabric> Replica<F> {
    /// Opens (or creates) the replica's data dir, recovers the log, registers the ring with
    /// the fabric once, and starts raft.
    pub fn open(
        cfg: ReplicaConfig,
        mut fabric: F,
        fs: Arc<dyn FileSystem>,
    ) -> Result<Self, ReplicaError> {
        cfg.validate()?;
        // raft-rs's own checks too, before the data dir is written: a first open that failed
        // after storing the initial membership would make the next one ignore corrected voters.
        Self::raft_config(&cfg, 0)?;
        let dir_lock = Self::lock_data_dir(&cfg, &fs)?;
        let (mut state_file, existed, hs, mut cs, mut conf_history) = Self::open_state(&cfg, &fs)?;
        let wal = Self::open_wal(&cfg, &fs)?;
        let (snapshot_file, snapshot) = Self::load_snapshot(&cfg, &fs)?;
        if snapshot.is_none() && wal.first_index().0 > 1 {
            // Entries are deleted only after the checkpoint covering them is stored (a trim,
            // retention, an installed snapshot): a log that starts later without one lost it,
            // and the state of every entry before the log with it.
            return Err(ReplicaError::Config {
                field: "data_dir",
                reason: format!(
                    "the log in {} starts at index {} but its snapshot file is missing: the \
                     checkpoint of the entries before it is lost. Restore it, or {REPLACE_NODE}",
                    cfg.data_dir.display(),
                    wal.first_index().0
                ),
            });
        }
        let persistent =
            cfg.durability.ring_in_shared_memory() && cfg.mutation != crate::Mutation::PrivateRing;
        // A ring left by a crashed process of this data dir holds the entries it accepted (and
        // may have acknowledged) past what reached the segment files: take them over first,
        // so that the snapshot check below sees the whole log. A new data dir never takes a
        // stale ring's records.
        let (ring, left) =
            Self::open_ring(&cfg, &mut fabric, &wal, persistent, existed, Term(hs.term))?;
        let recovered = match left {
            LeftRing::Recovered(n) => n,
            _ => 0,
        };
        let lost = match left {
            _ if !existed || !state_file.guard().ring_in_use => None,
            LeftRing::Missing => Some(LostRing::Missing),
            LeftRing::Corrupt => Some(LostRing::Corrupt),
            LeftRing::Ignored | LeftRing::Recovered(_) => None,
        };
        let ring_lost = lost.is_some();
        let OpenRing {
            fabric_memory,
            memory,
            mut producer,
            mut consumer,
        } = ring;
        // The latest checkpoint. If the log (ring included) does not reach it with the same
        // term, this node was installing a snapshot from the leader when it stopped (the
        // snapshot is stored first): finish, on a fresh ring at the snapshot's position.
        if let Some(snap) = &snapshot {
            if let Some((ring, snap_cs, history)) =
                Self::finish_snapshot_install(&cfg, &wal, &memory, snap, &hs, &mut state_file)?
            {
                (producer, consumer) = ring;
                cs = snap_cs;
                conf_history = history;
            }
        }
        let (hs, recovering) = Self::guard_amnesia(
            &cfg,
            &mut state_file,
            hs,
            &cs,
            &conf_history,
            lost,
            persistent,
        )?;
        let unproven = Self::unproven(&cfg, state_file.guard().unproven, &cs);
        let (ring_local, remote) = fabric.register(fabric_memory)?;
        let ring_files = persistent.then(|| {
            let ring = cfg.ring_file();
            let tail = ring.with_extension("tail");
            (ring, tail)
        });
        fabric.advertise(remote);
        let peers = members_of(&cs)
            .into_iter()
            .filter(|&id| id != cfg.id)
            .map(|id| (id, Peer::default()))
            .collect();
        let Started {
            raw,
            applied,
            sessions,
            sessions_through,
            hs,
        } = Self::start_raft(&cfg, &wal, hs, cs, snapshot, ring_lost)?;
        let dummy = Event::Disconnected {
            peer: NodeId(0),
            reason: fabric::DisconnectReason::Closed,
        };
        let mut r = Replica {
            dir_lock: Some(dir_lock),
            cfg,
            raw,
            fabric,
            wal,
            state_file,
            snapshot_file,
            conf_history,
            snapshot_rx: None,
            persisted_hs: hs,
            memory,
            ring_files,
            producer,
            consumer,
            ring_local,
            ring_entries: VecDeque::new(),
            fast_accepted_to: 0,
            deferred: Deferred::default(),
            direct_ring_to: 0,
            direct_targets: Vec::new(),
            peers,
            writes_in_flight: Inflight::default(),
            acks_unstepped: Vec::with_capacity(8),
            defer_nic_acks: false,
            quorum_scratch: Default::default(),
            quorum_memo: Default::default(),
            nic_promised: Default::default(),
            next_wr_id: 1,
            granted: None,
            ticks: 0,
            applied,
            sessions,
            sessions_through,
            pending_sessions: Pending::default(),
            stats: ReplicaStats {
                recovered_from_ring: recovered,
                ..ReplicaStats::default()
            },
            poisoned: None,
            events: vec![dummy; POLL_BATCH],
            fast_epoch: (0, false),
            recovering,
            unproven,
            work: 0,
            outboxes_queued: false,
            quiet: None,
            encode_buf: Vec::with_capacity(wire::MAX_BODY_BYTES),
            arena: PayloadArena::default(),
            placed_scratch: Vec::new(),
            ring_head_reported: Lsn(0),
            coalesce_sizes: Vec::new(),
            scratch: Vec::new(),
            reads: Reads::default(),
        };
        r.maintain_connections();
        Ok(r)
    }

    /// Starts raft-rs on the recovered log: the applied index at the log's first entry, the
    /// commit index clamped into what the log can be trusted to hold, the sessions as of the
    /// latest checkpoint, and the checkpoint as raft's snapshot.
    fn start_raft(
        cfg: &ReplicaConfig,
        wal: &Arc<Wal>,
        mut hs: HardState,
        cs: ConfState,
        snapshot: Option<Snapshot>,
        ring_lost: bool,
    ) -> Result<Started, ReplicaError> {
        let first = wal.first_index().0.max(1);
        let applied = first - 1;
        let prefix_term = wal
            .position_after(Index(applied))
            .map_or(0, |p| p.last_term.0);
        let rc = Self::raft_config(cfg, applied)?;
        // raft-rs refuses to start when the persisted commit index lies outside the log it
        // finds: below it after a prefix truncation (commit-only changes are not written to
        // raft-state), above it if a machine crash lost a Memory-durability tail. Commit is
        // re-learned from the leader, so clamping it into the log is safe.
        //
        // After a lost ring the log read back is not even known to be a prefix of the one the
        // commit index covered: the ring held entries the segment files did not, and the files
        // may hold entries of a branch the node had cut, when that cut's fdatasync failed and
        // a later process read the cut from the page cache (simulator seed 62767;
        // `stale_branch_after_a_failed_cut.rs`). So the commit goes back to what the latest
        // checkpoint covers, and the leader teaches the rest again.
        let trusted_end = if ring_lost && cfg.mutation != crate::Mutation::TrustLogAfterLostRing {
            applied
        } else {
            wal.last_index().0.max(applied)
        };
        hs.commit = hs.commit.clamp(applied, trusted_end);
        let mut storage = WalStorage::new(wal.clone(), hs.clone(), cs, (applied, prefix_term));
        storage.set_mutation(cfg.mutation);
        // The sessions as of the checkpoint; the entries after it are applied again, those
        // before it (from the log's first) skipped.
        let sessions_through = match &snapshot {
            Some(s) if cfg.mutation != crate::Mutation::SessionsFromLogStart => {
                s.get_metadata().index.max(applied)
            }
            _ => applied,
        };
        let sessions = match &snapshot {
            Some(snap) => CheckpointData::decode(&snap.data)
                .and_then(|d| d.session_table())
                .map_err(|e| {
                    ReplicaError::Poisoned(format!("the snapshot's session table: {e}"))
                })?,
            None => Sessions::default(),
        };
        if let Some(snap) = snapshot {
            storage.set_snapshot(snap);
        }
        let logger = crate::logging::raft_logger();
        let raw = RawNode::new(&rc, storage, &logger)?;
        Ok(Started {
            raw,
            applied,
            sessions,
            sessions_through,
            hs,
        })
    }

    /// Creates the data dir and takes it for this replica alone: two replicas writing one log
    /// (a second server started on the same `data_dir`, a restart while the old process still
    /// runs) would interleave their appends and their raft state, and lose what either
    /// acknowledged.
    fn lock_data_dir(
        cfg: &ReplicaConfig,
        fs: &Arc<dyn FileSystem>,
    ) -> Result<wal::fs::DirLock, ReplicaError> {
        let field = "data_dir";
        fs.create_dir_all(&cfg.data_dir)
            .map_err(|e| ReplicaError::Config {
                field,
                reason: format!("cannot create {}: {e}", cfg.data_dir.display()),
            })?;
        match fs.lock_dir(&cfg.data_dir) {
            Ok(lock) => Ok(lock),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Err(ReplicaError::Config {
                field,
                reason: e.to_string(),
            }),
            // A file system that cannot lock (some network ones): run, and say so.
            Err(e) => {
                tracing::warn!(
                    node = cfg.id,
                    dir = %cfg.data_dir.display(),
                    error = %e,
                    "cannot lock the data dir: nothing keeps a second replica from opening it"
                );
                Ok(wal::fs::DirLock::unheld())
            }
        }
    }

    /// Opens the data dir's raft-state (term, vote, commit, membership, guard), creating it
    /// with the configured voters on a first start. Also says whether it existed.
    fn open_state(
        cfg: &ReplicaConfig,
        fs: &Arc<dyn FileSystem>,
    ) -> Result<(StateFile, bool, HardState, ConfState, ConfHistory), ReplicaError> {
        // The directory exists: `lock_data_dir` created it.
        let mut state_file = StateFile::new(fs.clone(), &cfg.data_dir);
        let loaded = state_file.load().map_err(ReplicaError::Poisoned)?;
        let existed = loaded.is_some();
        let (hs, cs, history) = match loaded {
            Some(StoredState {
                hs, cs, history, ..
            }) => (hs, cs, history),
            None => {
                Self::refuse_a_log_without_state(cfg, fs)?;
                let hs = HardState::default();
                let mut cs = ConfState::default();
                cs.voters = cfg.voters.clone();
                let history = ConfHistory::new(0, cs.clone());
                // A new data dir cannot be told from a member's emptied one: the node is
                // unproven from the first write on, so a crash before it is proven comes back
                // unproven (see `crate::recovering::Unproven`).
                let guard = Guard {
                    unproven: Self::starts_unproven(cfg, &cs),
                    ..state_file.guard()
                };
                state_file
                    .store_guard(guard, &hs, &cs, &history)
                    .map_err(ReplicaError::Poisoned)?;
                (hs, cs, history)
            }
        };
        Ok((state_file, existed, hs, cs, history))
    }

    /// A data dir without `raft-state` is a new one, unless it holds a log: the first open
    /// stores `raft-state` before it creates any segment, so segments or a snapshot without
    /// it mean it was deleted or lost. Starting anew would keep a log whose terms and
    /// membership nothing vouches for beside a term and vote started over: refused, naming
    /// what to do (a cleared data dir starts unproven, see `crate::recovering::Unproven`).
    fn refuse_a_log_without_state(
        cfg: &ReplicaConfig,
        fs: &Arc<dyn FileSystem>,
    ) -> Result<(), ReplicaError> {
        let names = fs.list(&cfg.data_dir).unwrap_or_default();
        let mut log: Vec<&String> = names
            .iter()
            .filter(|n| n.ends_with(".wal") || *n == "snapshot")
            .collect();
        if log.is_empty() {
            return Ok(());
        }
        log.sort();
        Err(ReplicaError::Config {
            field: "data_dir",
            reason: format!(
                "{} holds a log ({} files, {:?} first) but no raft-state: this node's term and \
                 vote are lost, and the log cannot be trusted without them. Restore \
                 raft-state, or {REPLACE_NODE}",
                cfg.data_dir.display(),
                log.len(),
                log[0]
            ),
        })
    }

    /// Opens (recovers) the segment files.
    fn open_wal(cfg: &ReplicaConfig, fs: &Arc<dyn FileSystem>) -> Result<Arc<Wal>, ReplicaError> {
        let wal_cfg = WalConfig {
            cluster_id: cfg.cluster_id,
            block_bytes: cfg.block_bytes,
            segment_data_bytes: cfg.segment_bytes,
            max_batch_bytes: cfg.segment_bytes.min(4 << 20).max(cfg.block_bytes),
            max_batch_delay: std::time::Duration::ZERO,
            start: Position::default(),
            unchecked_reads: cfg.mutation == crate::Mutation::UncheckedReads,
        };
        let wal_fs: Arc<dyn FileSystem> = match cfg.mutation {
            crate::Mutation::AckWithoutFsync => Arc::new(crate::mutation::NoSyncFs(fs.clone())),
            _ => fs.clone(),
        };
        let (wal, _report) = Wal::open(wal_fs, &cfg.data_dir, wal_cfg)?;
        Ok(Arc::new(wal))
    }

    /// Loads the latest checkpoint, if any.
    fn load_snapshot(
        cfg: &ReplicaConfig,
        fs: &Arc<dyn FileSystem>,
    ) -> Result<(SnapshotFile, Option<Snapshot>), ReplicaError> {
        let snapshot_file = SnapshotFile::new(fs.clone(), &cfg.data_dir);
        let snapshot = snapshot_file.load().map_err(|e| {
            ReplicaError::Poisoned(format!(
                "cannot load {}: {e}",
                cfg.data_dir.join("snapshot").display()
            ))
        })?;
        Ok((snapshot_file, snapshot))
    }

    /// When the log (ring included) does not hold the checkpoint `snap` with its term, this
    /// node stopped while installing it: restarts the wal and a fresh ring at the snapshot's
    /// position and stores the snapshot's membership, returning the new ring ends, membership
    /// and history. `None` when the log holds the checkpoint.
    #[allow(clippy::type_complexity)]
    fn finish_snapshot_install(
        cfg: &ReplicaConfig,
        wal: &Wal,
        memory: &Arc<dyn RingMemory>,
        snap: &Snapshot,
        hs: &HardState,
        state_file: &mut StateFile,
    ) -> Result<Option<((Producer, Consumer), ConfState, ConfHistory)>, ReplicaError> {
        let meta = snap.get_metadata();
        let holds_it = wal.last_index().0 >= meta.index
            && wal.term(Index(meta.index)).map(|t| t.0) == Some(meta.term);
        if holds_it {
            return Ok(None);
        }
        let lsn = snapshot_lsn(snap).filter(|l| l % 8 == 0).ok_or_else(|| {
            ReplicaError::Poisoned("the snapshot file records no valid log position".into())
        })?;
        let start = Position {
            lsn: Lsn(lsn),
            last_index: Index(meta.index),
            last_term: Term(meta.term),
        };
        let ring_cfg = RingConfig {
            capacity_bytes: cfg.ring_bytes,
            block_bytes: cfg.block_bytes,
        };
        let cs = meta.get_conf_state().clone();
        let history = ConfHistory::new(meta.index, cs.clone());
        let mut hs = hs.clone();
        hs.commit = hs.commit.max(meta.index);
        // The snapshot's membership is durable before the log restarts at the snapshot, as in
        // `Replica::install_snapshot`: a stop in between leaves a log that does not hold the
        // snapshot, and the next start finishes again. The other way round, a start that
        // stopped after the restart (a failed write of the membership, a crash) left a log
        // that holds the snapshot, and the next start went on with the membership from
        // before it, for good (simulator seed 1,539 of `--stopped-installs --durability
        // fsync`).
        let late = cfg.mutation == crate::Mutation::MembershipAfterLogRestart;
        if !late {
            state_file
                .store(&hs, &cs, &history)
                .map_err(ReplicaError::Poisoned)?;
        }
        if cfg.mutation != crate::Mutation::CutWalBeforeRing {
            wal::clear_published(memory.as_ref());
        }
        wal.restart_at(start)?;
        let ring = wal::ring(memory.clone(), ring_cfg, start)?;
        if late {
            state_file
                .store(&hs, &cs, &history)
                .map_err(ReplicaError::Poisoned)?;
        }
        Ok(Some((ring, cs, history)))
    }

    /// raft-rs's configuration for this replica, starting from `applied`.
    fn raft_config(cfg: &ReplicaConfig, applied: u64) -> Result<raft::Config, ReplicaError> {
        let mut rc = raft::Config {
            id: cfg.id,
            election_tick: cfg.election_tick,
            heartbeat_tick: cfg.heartbeat_tick,
            applied,
            max_size_per_msg: cfg.max_size_per_msg,
            max_inflight_msgs: cfg.max_inflight_msgs,
            check_quorum: true,
            pre_vote: true,
            skip_bcast_commit: !cfg.broadcast_commit,
            // One append per follower for every proposal made between two driver passes;
            // `send::coalesce` bounds its size.
            batch_append: true,
            max_uncommitted_size: super::direct::max_uncommitted_bytes(cfg.ring_bytes),
            ..Default::default()
        };
        if let Some((min, max)) = cfg.election_window {
            rc.min_election_tick = min;
            rc.max_election_tick = max;
        }
        rc.validate()?;
        Ok(rc)
    }

    /// Allocates and registers-to-be the ring: shared memory under `Durability::Memory`
    /// (taking over the records a crashed process left there when `take_left`), anonymous
    /// memory otherwise. Says what became of a ring left behind.
    fn open_ring(
        cfg: &ReplicaConfig,
        fabric: &mut F,
        wal: &Wal,
        persistent: bool,
        take_left: bool,
        max_term: Term,
    ) -> Result<(OpenRing, LeftRing), ReplicaError> {
        let ring_cfg = RingConfig {
            capacity_bytes: cfg.ring_bytes,
            block_bytes: cfg.block_bytes,
        };
        if !persistent {
            let ring = fabric.alloc(cfg.ring_bytes)?;
            let memory: Arc<dyn RingMemory> = Arc::new(FabricRing {
                ring: ring.clone(),
                tail: None,
            });
            let (producer, consumer) = wal::ring(memory.clone(), ring_cfg, wal.position())?;
            let opened = OpenRing {
                fabric_memory: ring,
                memory,
                producer,
                consumer,
            };
            return Ok((opened, LeftRing::Missing));
        }
        let path = cfg.ring_file();
        let (ring, ring_found) = fabric.alloc_persistent(&path, cfg.ring_bytes)?;
        let (tail, tail_found) = fabric.alloc_persistent(&path.with_extension("tail"), 4096)?;
        let memory: Arc<dyn RingMemory> = Arc::new(FabricRing {
            ring: ring.clone(),
            tail: Some(tail),
        });
        let fresh =
            |memory: &Arc<dyn RingMemory>| wal::ring(memory.clone(), ring_cfg, wal.position());
        let (producer, consumer, left) = if !(ring_found && tail_found) {
            let (p, c) = fresh(&memory)?;
            (p, c, LeftRing::Missing)
        } else if !take_left {
            let (p, c) = fresh(&memory)?;
            (p, c, LeftRing::Ignored)
        } else {
            let published = wal::published_tail(memory.as_ref()).unwrap_or_default();
            let (mut producer, consumer) =
                wal::ring_recovering(memory.clone(), ring_cfg, wal.position())?;
            let placed = wal::open_to_remote(memory.as_ref());
            match producer.recover_published(published, max_term) {
                Ok((end, n)) => {
                    // Under Replicated the leader may have counted records it placed past
                    // the published end: take them too (only from a ring left open to
                    // remote writes, which a grant cleared first).
                    let (end, n) = if placed {
                        let (end, more) = producer.accept_placed(max_term);
                        (end, n + more)
                    } else {
                        (end, n)
                    };
                    if n > 0 {
                        persist_ring(wal, &mut producer, &consumer, wal::Durability::Fsync)?;
                        tracing::info!(
                            node = cfg.id,
                            entries = n,
                            last_index = end.last_index.0,
                            ring = %path.display(),
                            "recovered entries from the shared-memory ring after a crash"
                        );
                    }
                    if placed {
                        producer.set_open_to_remote(false);
                    }
                    (producer, consumer, LeftRing::Recovered(n))
                }
                Err(e) => {
                    // The entries past the segment files cannot be trusted: start without them,
                    // as a node that lost them (recovering), on a fresh ring.
                    tracing::error!(
                        node = cfg.id,
                        ring = %path.display(),
                        error = %e,
                        "the shared-memory ring holds entries this node accepted before a crash, and one of them is corrupt: starting without them, recovering"
                    );
                    drop((producer, consumer));
                    let (p, c) = fresh(&memory)?;
                    (p, c, LeftRing::Corrupt)
                }
            }
        };
        let opened = OpenRing {
            fabric_memory: ring,
            memory,
            producer,
            consumer,
        };
        Ok((opened, left))
    }

    /// The amnesia guard at open (see [`crate::recovering`]). `lost`: the node used a
    /// shared-memory ring before and does not have a usable one now (and why), so it may have
    /// lost entries it acknowledged. Then it comes back recovering, above the term it had,
    /// with its own term moved past it; either way the `ring_in_use` mark is durable before
    /// the ring is used.
    /// Returns the HardState raft starts from and the recovery state.
    fn guard_amnesia(
        cfg: &ReplicaConfig,
        state_file: &mut StateFile,
        mut hs: HardState,
        cs: &ConfState,
        history: &ConfHistory,
        lost: Option<LostRing>,
        persistent: bool,
    ) -> Result<(HardState, Option<Recovering>), ReplicaError> {
        let before = state_file.guard();
        let mut guard = Guard {
            ring_in_use: persistent,
            ..before
        };
        let lost_term = hs.term.max(before.recovering_above_term.unwrap_or(0));
        // Nothing is acknowledged in term 0 (no leader has it): a ring lost before any
        // election lost nothing, and recovering above 0 would only take a voter away from
        // the cluster's first election.
        let guarded =
            lost.is_some() && lost_term > 0 && cfg.mutation != crate::Mutation::NoRecoveringGuard;
        if guarded {
            guard = crate::recovering::move_past(&mut hs, lost_term, guard);
            tracing::warn!(
                node = cfg.id,
                lost_term,
                ring = %cfg.ring_file().display(),
                cause = ?lost,
                "this node used a shared-memory ring that is gone or failed its checks: it may have lost entries it acknowledged, so it comes back recovering and does not vote or campaign until it has caught up from a leader"
            );
        }
        if guarded || guard != before {
            state_file
                .store_guard(guard, &hs, cs, history)
                .map_err(|e| {
                    ReplicaError::Poisoned(poison_msg("cannot persist the raft state", e))
                })?;
        }
        Ok((
            hs,
            guard.recovering_above_term.map(|lost_term| Recovering {
                lost_term,
                cause: lost.filter(|_| guarded).unwrap_or(LostRing::Earlier),
            }),
        ))
    }
}

/// What [`Replica::start_raft`] gives [`Replica::open`].
struct Started {
    raw: RawNode<WalStorage>,
    /// The index before the log's first entry: applied (a checkpoint covers it).
    applied: u64,
    /// The sessions as of the latest checkpoint.
    sessions: Sessions,
    /// The latest checkpoint's index (at least `applied`): the last `sessions` covers.
    sessions_through: u64,
    /// The hard state raft started from (its commit clamped into the log).
    hs: HardState,
}
