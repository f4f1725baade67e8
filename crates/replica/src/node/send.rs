//! Sending: raft's messages by the fast path or as frames, snapshots in chunks, and the
//! per-peer outboxes that hold frames while a connection has no send credits.

use super::*;

impl<F: Fabric> Replica<F> {
    pub(super) fn send_raft(&mut self, m: Message) {
        let to = m.to;
        if !self.peers.contains_key(&to) {
            return;
        }
        if m.get_msg_type() == MessageType::MsgAppendResponse && !m.reject {
            step!(self.cfg.id, "answered", m.index, m.index);
        }
        if m.get_msg_type() == MessageType::MsgSnapshot {
            if let Some(p) = self.peers.get_mut(&to) {
                p.fast.sent(Index(m.get_snapshot().get_metadata().index));
            }
            self.send_snapshot(m);
            return;
        }
        let is_append = m.get_msg_type() == MessageType::MsgAppend && !m.entries.is_empty();
        if is_append {
            if let (Some(p), Some(last)) = (self.peers.get_mut(&to), m.entries.last()) {
                p.fast.sent(Index(last.index));
            }
            if self.try_fast_append(&m) {
                step!(
                    self.cfg.id,
                    "sent",
                    m.index + 1,
                    m.index + m.entries.len() as u64
                );
                return;
            }
            if let Some(p) = self.peers.get_mut(&to) {
                p.fast.close();
            }
            self.stats.slow_appends += 1;
        }
        let ring = (self.raw.raft.state != StateRole::Leader).then(|| self.ring_info());
        let cluster_id = self.cfg.cluster_id;
        self.send_frame(to, |buf| {
            wire::encode_raft(cluster_id, &m, ring.as_ref(), buf)
        });
        if is_append {
            step!(
                self.cfg.id,
                "sent_slow",
                m.index + 1,
                m.index + m.entries.len() as u64
            );
        }
    }

    /// Sends raft's MsgSnapshot: the data in chunks, then the message with the metadata, all
    /// on one connection, so they arrive in order. raft learns at once whether everything was
    /// queued (`Finish`: it probes the follower from the snapshot on) or not (`Failure`).
    fn send_snapshot(&mut self, m: Message) {
        let to = m.to;
        let snap = m.get_snapshot();
        let meta = snap.get_metadata();
        let data = snap.data.clone();
        let dropped = self.stats.dropped_messages;
        for (k, chunk) in data.chunks(SNAPSHOT_CHUNK_BYTES).enumerate() {
            let body = Body::SnapshotChunk {
                index: meta.index,
                term: meta.term,
                offset: (k * SNAPSHOT_CHUNK_BYTES) as u64,
                total: data.len() as u64,
                data: chunk.to_vec(),
            };
            self.send_body(to, &body);
        }
        let cs = meta.get_conf_state();
        // A checkpoint records the membership as of its index, and raft-rs refuses to restore
        // a snapshot whose membership lacks the receiver. A node added after the checkpoint
        // (we send only to members) would then never catch up: it receives the snapshot as a
        // learner as of its index, and becomes a voter when it replays the entry that added it.
        let mut learners = cs.learners.clone();
        let listed = [
            &cs.voters,
            &cs.learners,
            &cs.voters_outgoing,
            &cs.learners_next,
        ]
        .iter()
        .any(|l| l.contains(&to));
        if !listed {
            learners.push(to);
        }
        let body = Body::Snapshot {
            msg: wire::to_wire(&m, false),
            meta: WireSnapshotMeta {
                index: meta.index,
                term: meta.term,
                voters: cs.voters.clone(),
                learners,
                voters_outgoing: cs.voters_outgoing.clone(),
                learners_next: cs.learners_next.clone(),
                auto_leave: cs.auto_leave,
                data_len: data.len() as u64,
            },
        };
        self.send_body(to, &body);
        let queued = self.stats.dropped_messages == dropped
            && self.fabric.conn_state(NodeId(to)) == ConnState::Up;
        self.stats.snapshots_sent += 1;
        self.raw.report_snapshot(
            to,
            if queued {
                SnapshotStatus::Finish
            } else {
                SnapshotStatus::Failure
            },
        );
    }

    fn send_body(&mut self, to: u64, body: &Body) {
        let cluster_id = self.cfg.cluster_id;
        self.send_frame(to, |buf| wire::encode(cluster_id, body, buf));
    }

    /// Sends the frame `encode` writes into the reused buffer (cleared by it) to `to`: at once
    /// when the connection has credit and nothing queued before it, else behind its outbox.
    pub(super) fn send_frame(
        &mut self,
        to: u64,
        encode: impl FnOnce(&mut Vec<u8>) -> Result<(), wire::WireError>,
    ) {
        let mut buf = std::mem::take(&mut self.encode_buf);
        if encode(&mut buf).is_err() {
            // Larger than a frame: raft's size limits should prevent it; drop, raft retries.
            self.stats.dropped_messages += 1;
            self.encode_buf = buf;
            return;
        }
        let peer = NodeId(to);
        let direct = self.peers.get(&to).is_some_and(|p| p.outbox.is_empty())
            && self.fabric.conn_state(peer) == ConnState::Up
            && self.fabric.send_credits(peer) > 0;
        if direct {
            let id = self.next_wr_id;
            self.next_wr_id += 1;
            if self.fabric.post_send(peer, id, &buf).is_ok() {
                self.encode_buf = buf;
                return;
            }
        }
        if let Some(p) = self.peers.get_mut(&to) {
            if p.outbox.len() < MAX_OUTBOX && self.fabric.conn_state(peer) == ConnState::Up {
                p.outbox.push_back(buf.clone());
                self.outboxes_queued = true;
            } else {
                self.stats.dropped_messages += 1;
            }
        }
        self.encode_buf = buf;
    }

    pub(super) fn flush_outboxes(&mut self) {
        if !self.outboxes_queued {
            return;
        }
        let mut queued = false;
        for (&id, p) in self.peers.iter_mut() {
            let peer = NodeId(id);
            while !p.outbox.is_empty() && self.fabric.send_credits(peer) > 0 {
                let msg = p.outbox.pop_front().expect("not empty");
                let wr = self.next_wr_id;
                self.next_wr_id += 1;
                if self.fabric.post_send(peer, wr, &msg).is_err() {
                    p.outbox.clear();
                    break;
                }
            }
            queued |= !p.outbox.is_empty();
        }
        self.outboxes_queued = queued;
    }
}
