//! A node on a new data dir proves it is not a member that lost its own: it asks every other
//! voter for its term before it votes (see [`crate::recovering::Unproven`]).

use super::*;
use crate::recovering::{self, Proven, Unproven};

/// The voters of `cs`, both halves of a joint membership.
fn all_voters(cs: &ConfState) -> Vec<u64> {
    let mut v: Vec<u64> = cs
        .voters
        .iter()
        .chain(&cs.voters_outgoing)
        .copied()
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

impl<F: Fabric> Replica<F> {
    /// The unproven state of a data dir: `None` unless `flagged`, or when this node is the
    /// only voter of `cs` (nothing to ask).
    pub(super) fn unproven(cfg: &ReplicaConfig, flagged: bool, cs: &ConfState) -> Option<Unproven> {
        flagged
            .then(|| Unproven::new(cfg.id, &all_voters(cs)))
            .flatten()
    }

    /// Whether a data dir created now starts unproven: this node is one of several configured
    /// voters, so a new data dir may be a member's emptied or replaced one, unless the caller
    /// said this is a new cluster's first start.
    pub(super) fn starts_unproven(cfg: &ReplicaConfig, cs: &ConfState) -> bool {
        let asserted = cfg.new_cluster || cfg.mutation == crate::Mutation::TrustNewDataDir;
        cs.voters.contains(&cfg.id) && Self::unproven(cfg, !asserted, cs).is_some()
    }

    /// Whether this node holds back its vote and its campaigns: recovering, or unproven.
    pub(super) fn holds_back_votes(&self) -> bool {
        self.recovering.is_some() || self.unproven.is_some()
    }

    /// Asks for terms if this node is unproven: `Some(peer)` (a new connection) asks that
    /// peer, member or not, unless it answered; `None` (each tick: a query sent while a
    /// connection was down is lost) every other voter it is connected to, those that answered
    /// too: the membership may change while the node waits (a voter that never answers, cut
    /// off or dead, may be removed), and only a later answer tells it so (simulator seed
    /// 505,669 of `--wipes`: a node waited for good for a removed voter).
    pub(super) fn ask_terms(&mut self, peer: Option<u64>) {
        let Some(u) = &self.unproven else {
            return;
        };
        let ask: Vec<u64> = match peer {
            Some(p) if !u.answered(p) => vec![p],
            Some(_) => Vec::new(),
            None => u
                .others()
                .filter(|&v| self.fabric.conn_state(NodeId(v)) == ConnState::Up)
                .collect(),
        };
        for v in ask {
            self.send_body(v, &Body::TermQuery);
        }
    }

    /// Answers a peer's term query with this node's current term and the membership it
    /// applied (an unproven node answers too: its term says it never voted, which is what the
    /// asker needs to know).
    pub(super) fn answer_term_query(&mut self, peer: u64) {
        let answer = Body::TermAnswer {
            term: self.raw.raft.term,
            conf_as_of: self.conf_history.as_of(),
            voters: self.voters(),
        };
        self.send_body(peer, &answer);
    }

    /// Takes `peer`'s answer. Once every other voter of the newest membership known answered,
    /// the node is proven: a normal voter at the cluster's first start, else recovering above
    /// the highest term, its own term moved past it in the same durable write.
    pub(super) fn on_term_answer(
        &mut self,
        peer: u64,
        term: u64,
        conf_as_of: u64,
        voters: &[u64],
    ) -> Result<(), ReplicaError> {
        let own = self.raw.raft.term;
        let Some(u) = self.unproven.as_mut() else {
            return Ok(());
        };
        u.answer(peer, term, conf_as_of, voters);
        match u.verdict(own) {
            Some(verdict) => self.prove(verdict),
            None => {
                // A newer membership may name voters this node does not know: it connects to
                // them (a peer that takes this node's link for alive may never dial it,
                // when the two never exchange a message), and asks them.
                let unknown: Vec<u64> = u
                    .waiting_for()
                    .filter(|v| !self.peers.contains_key(v))
                    .collect();
                if !unknown.is_empty() {
                    for v in unknown {
                        self.peers.entry(v).or_default();
                    }
                    self.maintain_connections();
                }
                // The voters still waited for, at once (the next tick asks every voter again:
                // asking those that answered here would make every answer a new query).
                let Some(u) = &self.unproven else {
                    return Ok(());
                };
                let waiting: Vec<u64> = u
                    .waiting_for()
                    .filter(|&v| self.fabric.conn_state(NodeId(v)) == ConnState::Up)
                    .collect();
                for v in waiting {
                    self.send_body(v, &Body::TermQuery);
                }
                Ok(())
            }
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
                let lost_term = top.max(self.recovering.map_or(0, |r| r.lost_term));
                // Revoke first, as for any higher term: a leader's grant on our ring ends
                // before the term that refuses it.
                self.fence_ring();
                let mut hs = self.raw.store().hard_state().clone();
                let guard = recovering::move_past(&mut hs, lost_term, guard);
                self.store_guard_with(guard, &hs)?;
                self.raw.mut_store().set_hard_state(hs.clone());
                self.persisted_hs = hs;
                let term = self.persisted_hs.term;
                self.raw.raft.become_follower(term, raft::INVALID_ID);
                self.recovering = Some(Recovering {
                    lost_term,
                    // A ring lost at this start says more than the data dir being new.
                    cause: self.recovering.map_or(LostRing::NewDataDir, |r| r.cause),
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
