//! Sending: raft's messages by the fast path or as frames, snapshots in chunks, and the
//! per-peer outboxes that hold frames while a connection has no send credits.

use super::*;

impl<F: Fabric> Replica<F> {
    /// Sends a `Ready`'s messages, merged first where one can do the work of several
    /// ([`coalesce`]).
    pub(super) fn send_all(&mut self, mut msgs: Vec<Message>) {
        if self.cfg.mutation != crate::Mutation::UnrepairedRaftBatches {
            let log = &self.raw.raft.raft_log;
            // raft-rs answers term 0 for an index compacted away (or past the log): gone.
            repair_batched(&mut msgs, |index| {
                log.term(index).ok().filter(|&t| t != 0 || index == 0)
            });
        }
        coalesce(
            &mut msgs,
            self.cfg.max_size_per_msg,
            self.cfg.mutation,
            &mut self.coalesce_sizes,
        );
        for m in msgs {
            self.send_raft(m);
        }
    }

    pub(super) fn send_raft(&mut self, mut m: Message) {
        let to = m.to;
        if !self.peers.contains_key(&to) {
            return;
        }
        if m.get_msg_type() == MessageType::MsgAppendResponse && !m.reject {
            if self.cfg.mutation == crate::Mutation::QuietEveryAnswer
                && self.cfg.durability.commits_on_nic_ack()
            {
                // The mutation: every accepting answer is taken as one the leader counted.
                self.stats.answers_skipped += 1;
                return;
            }
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
        if is_append && !self.drop_direct_sent(&mut m) {
            return;
        }
        if is_append {
            if let (Some(p), Some(last)) = (self.peers.get_mut(&to), m.entries.last()) {
                p.fast.sent(Index(last.index));
            }
            if self.try_fast_append(&m, false) {
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
        if let Some(r) = ring.as_ref().filter(|_| to == self.raw.raft.leader_id) {
            self.ring_head_reported = Lsn(r.ring_head);
        }
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

    pub(super) fn send_body(&mut self, to: u64, body: &Body) {
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

/// Repairs the appends raft-rs's `batch_append` got wrong. raft-rs adds a follower's entries
/// to the first append to that follower already queued in the same round, and it takes any
/// entries as continuing an append that carries none (`util::is_continuous_ents`), whatever
/// their index: an empty append at 118 (a probe, a commit index going out) and then, after a
/// rejection, the entries from 100 leave as one message with index 118 and entries
/// 100..=118, which the follower refuses (simulator seed 1088). Such an append becomes what
/// raft sends for those entries on their own: the index and term of the entry before the
/// first (`term_of`, raft's log). Where that term is gone (compacted) the message is
/// dropped, a loss raft recovers from. The entries themselves always follow each other:
/// raft-rs checks that when the queued append carries entries.
fn repair_batched(msgs: &mut Vec<Message>, term_of: impl Fn(u64) -> Option<u64>) {
    msgs.retain_mut(|m| {
        let Some(first) = m.entries.first().map(|e| e.index) else {
            return true;
        };
        if m.get_msg_type() != MessageType::MsgAppend || first == m.index + 1 {
            return true;
        }
        let before = first - 1;
        match term_of(before) {
            Some(term) => {
                tracing::debug!(to = m.to, index = m.index, first, "raft-rs batch repaired");
                m.index = before;
                m.log_term = term;
                true
            }
            None => false,
        }
    });
}

/// What one entry counts for against `max_size_per_msg` when appends are merged: its bytes
/// and a fixed 32 for its framing, more than a slow-path frame (22) or a descriptor (30)
/// spends on it, so that a merged message fits wherever its parts did.
fn merged_size(e: &Entry) -> u64 {
    (e.data.len() + e.context.len()) as u64 + 32
}

/// Shapes raft's messages of one `Ready`, in place, so that a batch of entries costs one
/// RDMA Write and one descriptor per follower (and one answer back), not one per proposal,
/// and no message is larger than `max_bytes` (see [`merged_size`]).
///
/// raft-rs merges the appends of proposals made between two driver passes itself
/// (`batch_append`, on in [`Replica::open`]'s configuration), without a size bound: an
/// append over `max_bytes` is split here into appends that each continue the previous one.
/// raft-rs counted an in-flight slot per proposal; the answer to the merged message frees
/// them all (`Inflights::free_to`).
///
/// Then messages merge where one does the work of several. Only a message's last
/// predecessor to the same peer is a candidate, so what each peer receives keeps its order
/// (different peers' messages go over different connections).
/// - An append merges into the previous one if both carry entries, in the same term, and its
///   entries continue the previous one's exactly (its `index`/`log_term` are the previous
///   one's last entry) and together they stay within `max_bytes`. The merged message
///   carries the later commit index.
/// - An accepting append answer replaces the previous accepting answer of the same term if
///   its index is no lower: the leader takes the highest index it hears of, and dropping an
///   answer is a loss raft tolerates anyway (a follower answers each append of a batch that
///   reached it in one poll). Rejections and snapshot requests are kept.
///
/// `sizes` is scratch space the caller keeps between calls, so that merging allocates nothing.
pub(super) fn coalesce(
    msgs: &mut Vec<Message>,
    max_bytes: u64,
    mutation: crate::Mutation,
    sizes: &mut Vec<u64>,
) {
    split_oversized(msgs, max_bytes);
    // The common case at one append in flight, a message per peer, costs a scan, not a pass
    // that moves every message (a short `Ready` is checked pair by pair).
    let shares_a_peer = msgs.len() > 16
        || msgs
            .iter()
            .enumerate()
            .any(|(i, m)| msgs[..i].iter().any(|p| p.to == m.to));
    if !shares_a_peer {
        return;
    }
    // The merged size of each kept append so far (kept in step with the kept messages), so
    // that a run of merges costs one pass over its entries, not one per merge.
    sizes.clear();
    let mut kept = 0;
    for i in 0..msgs.len() {
        let m = std::mem::take(&mut msgs[i]);
        let prev = (0..kept).rev().find(|&j| msgs[j].to == m.to);
        let m = match prev {
            Some(j) => match merge(&mut msgs[j], sizes[j], m, max_bytes, mutation) {
                Merged::Into(size) => {
                    sizes[j] = size;
                    continue;
                }
                Merged::Not(m) => m,
            },
            None => m,
        };
        sizes.push(m.entries.iter().map(merged_size).sum());
        msgs[kept] = m;
        kept += 1;
    }
    msgs.truncate(kept);
}

/// Splits every append over `max_bytes` with more than one entry into appends within it,
/// each continuing the one before (raft-rs's own rule: at least one entry per message).
fn split_oversized(msgs: &mut Vec<Message>, max_bytes: u64) {
    let oversized = |m: &Message| {
        m.get_msg_type() == MessageType::MsgAppend
            && m.entries.len() > 1
            && m.entries.iter().map(merged_size).sum::<u64>() > max_bytes
    };
    if !msgs.iter().any(oversized) {
        return;
    }
    let mut out = Vec::with_capacity(msgs.len() + 1);
    for mut m in msgs.drain(..) {
        if !oversized(&m) {
            out.push(m);
            continue;
        }
        let entries: Vec<Entry> = m.take_entries().into();
        let (mut index, mut log_term) = (m.index, m.log_term);
        let mut part: Vec<Entry> = Vec::new();
        let mut size = 0;
        let mut flush = |part: &mut Vec<Entry>, out: &mut Vec<Message>| {
            let last = part.last().expect("a part holds an entry");
            let mut piece = m.clone();
            piece.index = index;
            piece.log_term = log_term;
            (index, log_term) = (last.index, last.term);
            piece.set_entries(std::mem::take(part).into());
            out.push(piece);
        };
        for e in entries {
            let s = merged_size(&e);
            if !part.is_empty() && size + s > max_bytes {
                flush(&mut part, &mut out);
                size = 0;
            }
            size += s;
            part.push(e);
        }
        flush(&mut part, &mut out);
    }
    *msgs = out;
}

/// What [`merge`] did.
enum Merged {
    /// `m` is part of the previous message now, which counts this many bytes.
    Into(u64),
    /// `m` stays a message of its own.
    Not(Message),
}

/// Merges `m` into `prev` (its peer's previous message, whose entries count `prev_size`
/// bytes) where [`coalesce`] allows it.
fn merge(
    prev: &mut Message,
    prev_size: u64,
    mut m: Message,
    max_bytes: u64,
    mutation: crate::Mutation,
) -> Merged {
    if m.get_msg_type() != prev.get_msg_type() || m.term != prev.term {
        return Merged::Not(m);
    }
    match m.get_msg_type() {
        MessageType::MsgAppend => {
            let Some(last) = prev.entries.last() else {
                return Merged::Not(m);
            };
            let continues = m.index == last.index && m.log_term == last.term;
            let continues = continues || mutation == crate::Mutation::MergeDisjointAppends;
            let size = prev_size + m.entries.iter().map(merged_size).sum::<u64>();
            if m.entries.is_empty() || !continues || size > max_bytes {
                return Merged::Not(m);
            }
            prev.commit = prev.commit.max(m.commit);
            for e in m.take_entries() {
                prev.mut_entries().push(e);
            }
            Merged::Into(size)
        }
        MessageType::MsgAppendResponse => {
            let accepts = |x: &Message| !x.reject && x.request_snapshot == raft::INVALID_INDEX;
            if accepts(prev) && accepts(&m) && m.index >= prev.index {
                *prev = m;
                return Merged::Into(0);
            }
            Merged::Not(m)
        }
        _ => Merged::Not(m),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Mutation;

    fn entry(index: u64, term: u64, bytes: usize) -> Entry {
        let mut e = Entry::default();
        e.index = index;
        e.term = term;
        e.data = vec![7u8; bytes].into();
        e
    }

    /// An append to `to` in `term` of entries `first..=last` (of term `term`), after an entry
    /// of `log_term`.
    fn append(to: u64, term: u64, log_term: u64, first: u64, last: u64, commit: u64) -> Message {
        let mut m = Message::default();
        m.set_msg_type(MessageType::MsgAppend);
        m.to = to;
        m.term = term;
        m.index = first - 1;
        m.log_term = log_term;
        m.commit = commit;
        m.set_entries(
            (first..=last)
                .map(|i| entry(i, term, 8))
                .collect::<Vec<_>>()
                .into(),
        );
        m
    }

    fn answer(to: u64, term: u64, index: u64, reject: bool) -> Message {
        let mut m = Message::default();
        m.set_msg_type(MessageType::MsgAppendResponse);
        m.to = to;
        m.term = term;
        m.index = index;
        m.reject = reject;
        m
    }

    fn indexes(m: &Message) -> Vec<u64> {
        m.entries.iter().map(|e| e.index).collect()
    }

    fn run(mut msgs: Vec<Message>, max: u64) -> Vec<Message> {
        coalesce(&mut msgs, max, Mutation::None, &mut Vec::new());
        msgs
    }

    #[test]
    fn appends_that_continue_each_other_become_one_per_peer_in_order() {
        let out = run(
            vec![
                append(2, 3, 3, 10, 10, 8),
                append(3, 3, 3, 10, 10, 8),
                append(2, 3, 3, 11, 11, 9),
                append(3, 3, 3, 11, 12, 9),
                append(2, 3, 3, 12, 12, 9),
            ],
            1 << 20,
        );
        assert_eq!(out.len(), 2);
        assert_eq!(
            (out[0].to, out[0].index, indexes(&out[0])),
            (2, 9, vec![10, 11, 12])
        );
        assert_eq!(
            (out[1].to, out[1].index, indexes(&out[1])),
            (3, 9, vec![10, 11, 12])
        );
        assert_eq!(
            (out[0].commit, out[1].commit),
            (9, 9),
            "the later commit index goes"
        );
    }

    #[test]
    fn appends_that_do_not_continue_stay_apart() {
        // A gap, a probe from lower down, a different term, a log term that does not match.
        for second in [
            append(2, 3, 3, 12, 12, 0),
            append(2, 3, 2, 5, 6, 0),
            append(2, 4, 3, 11, 11, 0),
            append(2, 3, 2, 11, 11, 0),
        ] {
            let out = run(vec![append(2, 3, 3, 10, 10, 0), second.clone()], 1 << 20);
            assert_eq!(out.len(), 2, "{second:?} merged");
            assert_eq!(indexes(&out[1]), indexes(&second));
        }
        // An empty append (a commit index going out) merges into nothing, nor anything into it.
        let mut empty = append(2, 3, 3, 11, 11, 9);
        empty.take_entries();
        assert_eq!(
            run(vec![append(2, 3, 3, 10, 10, 0), empty.clone()], 1 << 20).len(),
            2
        );
        assert_eq!(
            run(vec![empty, append(2, 3, 3, 11, 11, 0)], 1 << 20).len(),
            2
        );
        // Another message to the same peer in between keeps both where they are.
        let out = run(
            vec![
                append(2, 3, 3, 10, 10, 0),
                answer(2, 3, 4, false),
                append(2, 3, 3, 11, 11, 0),
            ],
            1 << 20,
        );
        assert_eq!(out.len(), 3);
    }

    #[test]
    fn merged_appends_stay_within_the_message_size_limit() {
        // Each 8-byte entry counts 40 against the limit: room for three.
        let msgs: Vec<Message> = (10..=16).map(|i| append(2, 3, 3, i, i, 0)).collect();
        let out = run(msgs, 120);
        let sizes: Vec<usize> = out.iter().map(|m| m.entries.len()).collect();
        assert_eq!(sizes, vec![3, 3, 1]);
        let all: Vec<u64> = out.iter().flat_map(indexes).collect();
        assert_eq!(all, (10..=16).collect::<Vec<_>>());
    }

    #[test]
    fn an_append_over_the_limit_is_split_into_appends_that_continue_each_other() {
        // raft-rs's batch_append merged seven proposals into one message; 40 bytes each.
        let big = append(2, 3, 2, 10, 16, 9);
        let out = run(vec![big, append(3, 3, 2, 10, 10, 9)], 120);
        let parts: Vec<(u64, u64, u64, Vec<u64>, u64)> = out
            .iter()
            .map(|m| (m.to, m.index, m.log_term, indexes(m), m.commit))
            .collect();
        assert_eq!(
            parts,
            vec![
                (2, 9, 2, vec![10, 11, 12], 9),
                (2, 12, 3, vec![13, 14, 15], 9),
                (2, 15, 3, vec![16], 9),
                (3, 9, 2, vec![10], 9),
            ]
        );
        // One entry over the limit goes as it is.
        let mut huge = append(2, 3, 3, 10, 10, 0);
        huge.mut_entries()[0].data = vec![0u8; 500].into();
        assert_eq!(run(vec![huge], 120).len(), 1);
    }

    #[test]
    fn a_later_accepting_answer_replaces_the_earlier_one() {
        let out = run(
            vec![
                answer(1, 3, 10, false),
                answer(1, 3, 11, false),
                answer(1, 3, 13, false),
            ],
            1 << 20,
        );
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].index, 13);
        // Rejections, snapshot requests, lower indexes and other terms are kept.
        let mut asks = answer(1, 3, 12, false);
        asks.request_snapshot = 12;
        for second in [
            answer(1, 3, 12, true),
            asks,
            answer(1, 3, 9, false),
            answer(1, 4, 12, false),
        ] {
            assert_eq!(
                run(vec![answer(1, 3, 10, false), second.clone()], 1 << 20).len(),
                2,
                "{second:?} replaced an answer"
            );
        }
        let out = run(
            vec![answer(1, 3, 10, true), answer(1, 3, 11, false)],
            1 << 20,
        );
        assert_eq!(
            out.len(),
            2,
            "an accepting answer does not replace a rejection"
        );
    }

    #[test]
    fn entries_batched_onto_an_empty_append_get_their_own_index() {
        // raft-rs queued an empty append at 118, then batched the entries from 100 onto it.
        let mut bad = append(2, 3, 3, 100, 118, 90);
        bad.index = 118;
        let good = append(3, 3, 3, 119, 119, 90);
        let mut msgs = vec![bad, good.clone()];
        repair_batched(&mut msgs, |i| (i == 99).then_some(2));
        assert_eq!(msgs.len(), 2);
        assert_eq!((msgs[0].index, msgs[0].log_term), (99, 2));
        assert_eq!(indexes(&msgs[0]), (100..=118).collect::<Vec<_>>());
        assert_eq!(msgs[0].commit, 90);
        assert_eq!(msgs[1], good, "a well-formed append is left alone");
        // The term before the first entry is gone: the message goes, nothing else.
        let mut bad = append(2, 3, 3, 100, 118, 90);
        bad.index = 118;
        let mut msgs = vec![bad, good.clone()];
        repair_batched(&mut msgs, |_| None);
        assert_eq!(msgs, vec![good]);
    }

    #[test]
    fn the_mutation_merges_appends_that_do_not_continue() {
        let mut msgs = vec![append(2, 3, 3, 10, 10, 0), append(2, 3, 2, 5, 6, 0)];
        coalesce(
            &mut msgs,
            1 << 20,
            Mutation::MergeDisjointAppends,
            &mut Vec::new(),
        );
        assert_eq!(msgs.len(), 1);
        assert_eq!(indexes(&msgs[0]), vec![10, 5, 6]);
    }
}
