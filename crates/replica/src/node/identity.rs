//! A node on a new data dir proves it is not a member that lost its own: it asks every other
//! voter for its term before it votes (see [`crate::recovering::Unproven`]).

use super::*;
use crate::recovering::{Proven, Unproven};

impl<F: Fabric> Replica<F> {
    /// The unproven state a start finds: the guard's flag, with the voters of `cs` to ask.
    pub(super) fn unproven_at_open(
        cfg: &ReplicaConfig,
        guard: Guard,
        cs: &ConfState,
    ) -> Option<Unproven> {
        guard
            .unproven
            .then(|| Unproven::new(cfg.id, cs.voters.iter().copied()))
            .flatten()
    }

    /// Whether a data dir created now starts unproven: this node is one of several configured
    /// voters, so a new data dir may be a member's emptied or replaced one, unless the caller
    /// said this is a new cluster's first start.
    pub(super) fn starts_unproven(cfg: &ReplicaConfig, cs: &ConfState) -> bool {
        !cfg.new_cluster
            && cfg.mutation != crate::Mutation::TrustNewDataDir
            && cs.voters.contains(&cfg.id)
            && Unproven::new(cfg.id, cs.voters.iter().copied()).is_some()
    }

    /// Whether this node holds back its vote and its campaigns: recovering, or unproven.
    pub(super) fn holds_back_votes(&self) -> bool {
        self.recovering.is_some() || self.unproven.is_some()
    }

    /// Asks `peer` for its term if this node is unproven and still waits for that voter's
    /// answer; with `None`, every voter it waits for (at each tick: a query sent while the
    /// connection was down is lost).
    pub(super) fn ask_terms(&mut self, peer: Option<u64>) {
        let Some(u) = &self.unproven else {
            return;
        };
        let ask: Vec<u64> = u
            .waiting_for()
            .filter(|&v| peer.is_none_or(|p| p == v))
            .filter(|&v| self.fabric.conn_state(NodeId(v)) == ConnState::Up)
            .collect();
        for v in ask {
            self.send_body(v, &Body::TermQuery);
        }
    }

    /// Answers a peer's term query with this node's current term (an unproven node answers
    /// too: its term says it never voted, which is what the asker needs to know).
    pub(super) fn answer_term_query(&mut self, peer: u64) {
        let term = self.raw.raft.term;
        self.send_body(peer, &Body::TermAnswer { term });
    }

    /// Takes `peer`'s term. Once every other voter answered, the node is proven: a normal
    /// voter at the cluster's first start, else recovering above the highest term, its own
    /// term moved past it in the same durable write (see `prove`).
    pub(super) fn on_term_answer(&mut self, peer: u64, term: u64) -> Result<(), ReplicaError> {
        match self.unproven.as_mut().and_then(|u| u.answer(peer, term)) {
            Some(verdict) => self.prove(verdict),
            None => Ok(()),
        }
    }

    /// Follows a membership the log taught this node while it is unproven: it waits for that
    /// membership's voters (and may have none left to wait for: the pass's end proves it).
    pub(super) fn unproven_follows(&mut self, cs: &ConfState) {
        let me = self.cfg.id;
        if let Some(u) = self.unproven.as_mut() {
            u.follow(me, &cs.voters);
            self.ask_terms(None);
        }
    }

    /// After a `Ready`, where a term may change: proves the node if a membership it learned
    /// left no voter to wait for.
    pub(super) fn prove_if_answered(&mut self) -> Result<(), ReplicaError> {
        match self.unproven.as_ref().and_then(|u| u.verdict()) {
            Some(verdict) => self.prove(verdict),
            None => Ok(()),
        }
    }

    /// Ends the unproven state with the answers' verdict, durably.
    fn prove(&mut self, verdict: Proven) -> Result<(), ReplicaError> {
        let guard = Guard {
            unproven: false,
            ..self.state_file.guard()
        };
        match verdict {
            Proven::FirstStart => {
                self.store_guard(guard)?;
                tracing::info!(
                    node = self.cfg.id,
                    "every other voter is at term 0: the cluster's first start; this node votes"
                );
            }
            Proven::Above(top) => {
                let lost_term = top
                    .max(self.raw.raft.term)
                    .max(self.recovering.map_or(0, |r| r.lost_term));
                // Revoke first, as for any higher term: a leader's grant on our ring ends
                // before the term that refuses it.
                self.fence_ring();
                let mut hs = self.raw.store().hard_state().clone();
                hs.term = lost_term + 1;
                hs.vote = 0;
                let cs = self.raw.store().conf_state().clone();
                self.state_file
                    .store_guard(
                        Guard {
                            recovering_above_term: Some(lost_term),
                            ..guard
                        },
                        &hs,
                        &cs,
                        &self.conf_history,
                    )
                    .map_err(|e| {
                        ReplicaError::Poisoned(poison_msg("cannot persist the raft state", e))
                    })?;
                self.raw.mut_store().set_hard_state(hs.clone());
                self.persisted_hs = hs;
                self.raw
                    .raft
                    .become_follower(lost_term + 1, raft::INVALID_ID);
                self.recovering = Some(Recovering {
                    lost_term,
                    cause: LostRing::NewDataDir,
                });
                tracing::warn!(
                    node = self.cfg.id,
                    lost_term,
                    "this node's data dir was new while other voters had terms up to {lost_term}: it may be a member that lost its data dir, so it rejoins recovering and does not vote or campaign until it has caught up from a leader"
                );
            }
        }
        self.unproven = None;
        Ok(())
    }
}
