"""The Python client against a real three-server rdmalog cluster.

A Rust test harness starts the cluster and runs this file twice:

    RDMALOG_SERVERS=127.0.0.1:7601,127.0.0.1:7602,127.0.0.1:7603 \
    RDMALOG_CLUSTER_ID=0x1ab RDMALOG_PHASE=before RDMALOG_STATE=/tmp/state.json \
    python3 -m unittest discover -s clients/python -p 'test_cluster.py' -v

then kills the leader with kill -9 and runs it again with RDMALOG_PHASE=after.

Environment:
  RDMALOG_SERVERS     comma-separated host:port client addresses (plaintext TCP)
  RDMALOG_CLUSTER_ID  the cluster id (decimal or 0x... hex)
  RDMALOG_PHASE       "before" or "after"
  RDMALOG_STATE       a JSON file carrying the acknowledged entries between phases
Without RDMALOG_SERVERS every test is skipped.
"""

import hashlib
import json
import os
import socket
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import rdmalog_client as rc  # noqa: E402

SERVERS_ENV = os.environ.get("RDMALOG_SERVERS", "").strip()
SKIP_MSG = "RDMALOG_SERVERS is not set: no cluster to test against (a Rust harness sets it)"

CALL_TIMEOUT = 30.0   # deadline per call: room for an election after a kill -9
WAIT_TIMEOUT = 60.0   # how long to wait for a leader / for followers to catch up
BIG = 60_000          # one entry of this size per batch


def servers() -> list[str]:
    return [s.strip() for s in SERVERS_ENV.split(",") if s.strip()]


def cluster_id() -> int:
    return int(os.environ["RDMALOG_CLUSTER_ID"].strip(), 0)


def state_path() -> str:
    path = os.environ.get("RDMALOG_STATE")
    if not path:
        raise unittest.SkipTest("RDMALOG_STATE is not set")
    return path


def big_entry(tag: str) -> bytes:
    """A distinct, reproducible 60,000-byte payload."""
    out = bytearray()
    counter = 0
    while len(out) < BIG:
        out += hashlib.sha256(f"{tag}/{counter}".encode()).digest()
        counter += 1
    return bytes(out[:BIG])


def make_batch(tag: str, n_small: int = 5) -> list[bytes]:
    batch = [b"", big_entry(tag)]
    batch += [f"python {tag} entry {j}".encode() for j in range(n_small)]
    return batch


def new_client(addrs: list[str], cid: int = None) -> rc.Client:
    return rc.Client(addrs, cluster_id() if cid is None else cid, timeout=CALL_TIMEOUT)


def wait_for_leader(client: rc.Client) -> dict:
    """Status until it names a leader (an election may be under way)."""
    end = time.monotonic() + WAIT_TIMEOUT
    while True:
        st = client.status()
        if st["leader"] is not None:
            return st
        if time.monotonic() > end:
            raise AssertionError(f"no leader known after {WAIT_TIMEOUT} s: {st}")
        time.sleep(0.2)


def read_range(client: rc.Client, first: int, last: int) -> dict[int, bytes]:
    """Every entry of first..=last that the node has, waiting while it lags."""
    out: dict[int, bytes] = {}
    idx = first
    end = time.monotonic() + WAIT_TIMEOUT
    while idx <= last:
        got = client.read(idx)
        if not got:
            if time.monotonic() > end:
                raise AssertionError(
                    f"read from {idx}: nothing committed up to {last} after {WAIT_TIMEOUT} s "
                    f"(node commit {client.last_commit})")
            time.sleep(0.05)
            continue
        prev = idx - 1
        for i, data in got:
            assert i > prev, f"read from {idx}: indexes not increasing ({prev}, {i})"
            prev = i
            out[i] = data
        idx = got[-1][0] + 1
    return out


def read_now(client: rc.Client, first: int, last: int, consistency) -> dict[int, bytes]:
    """Every entry of first..=last with a consistency that must already cover
    them (linearizable, or at least ``last``): no waiting, an empty answer
    before ``last`` is a failure."""
    out: dict[int, bytes] = {}
    idx = first
    while idx <= last:
        got = client.read(idx, consistency=consistency)
        if not got:
            raise AssertionError(
                f"{consistency!r} read from {idx}: empty, though {last} was acknowledged "
                f"(node {client.node_id}, commit {client.last_commit})")
        assert client.last_commit >= last, \
            f"{consistency!r} read: commit {client.last_commit} below the acknowledged {last}"
        prev = idx - 1
        for i, data in got:
            assert i > prev, f"read from {idx}: indexes not increasing ({prev}, {i})"
            prev = i
            out[i] = data
        idx = got[-1][0] + 1
    return out


def read_to_end(client: rc.Client, first: int, consistency) -> dict[int, bytes]:
    """Every application entry from ``first`` to the end the answering node has
    committed (until a read comes back empty)."""
    out: dict[int, bytes] = {}
    idx = first
    while True:
        got = client.read(idx, consistency=consistency)
        if not got:
            return out
        prev = idx - 1
        for i, data in got:
            assert i > prev, f"read from {idx}: indexes not increasing ({prev}, {i})"
            prev = i
            out[i] = data
        idx = got[-1][0] + 1


def roles(addrs: list[str]) -> dict[str, tuple[int, str]]:
    """addr -> (node id, role) as each node's own Status says."""
    out = {}
    for addr in addrs:
        with new_client([addr]) as c:
            st = c.status()
        out[addr] = (st["node"]["id"], st["node"]["role"])
    return out


def check_pairs(test: unittest.TestCase, have: dict[int, bytes], pairs: list) -> None:
    for index, data in pairs:
        test.assertIn(index, have, f"acknowledged entry {index} is missing")
        test.assertEqual(have[index], data,
                         f"entry {index} changed: {len(have[index])} bytes, expected {len(data)}")


@unittest.skipUnless(SERVERS_ENV, SKIP_MSG)
class ClusterTest(unittest.TestCase):
    def setUp(self):
        self.phase = os.environ.get("RDMALOG_PHASE", "").strip()
        self.addrs = servers()

    # ------------------------------------------------------------------ before

    def test_before(self):
        if self.phase != "before":
            self.skipTest(f"RDMALOG_PHASE is {self.phase!r}, not 'before'")
        self.assertEqual(len(self.addrs), 3, f"expected three servers: {self.addrs}")
        cid = cluster_id()
        nonce = os.urandom(4).hex()

        # 1. A wrong cluster id: WrongCluster, at once (no retries).
        wrong = (cid + 1) % (1 << 64)
        t0 = time.monotonic()
        with new_client(self.addrs, wrong) as c:
            with self.assertRaises(rc.ServerError) as cm:
                c.status()
        self.assertEqual(cm.exception.code, "WrongCluster", str(cm.exception))
        self.assertIsNone(cm.exception.id)
        self.assertLess(time.monotonic() - t0, 5.0, "WrongCluster must not be retried")

        # 2. Wait until the cluster has a leader.
        with new_client(self.addrs) as c:
            st = wait_for_leader(c)
        leader = st["leader"]

        # 3. One client per starting server; appends follow Redirect from followers.
        # Each client appends through a session of its own (exactly once, the
        # default: PROTOCOL.md 7a), opened before its first append.
        pairs: list[tuple[int, bytes]] = []
        sessions: set[int] = set()
        appends = 0
        began_at_follower = 0
        followed = 0
        for i in range(3):
            order = self.addrs[i:] + self.addrs[:i]
            with new_client(order) as c:
                first_status = c.status()  # answered by order[0], whatever its role
                batch = make_batch(f"before {nonce} run {i}")
                idx = c.append_indexed(batch)
                appends += 1
                self.assertEqual(len(idx), len(batch))
                self.assertEqual(idx, sorted(set(idx)), "indexes must increase")
                self.assertIsNotNone(c.session, "append did not go through a session")
                session_id, next_seq = c.session
                self.assertEqual(next_seq, 1 + len(batch),
                                 f"session {session_id}: next number after {len(batch)} entries")
                self.assertLess(session_id, idx[0], "the session opens before its entries")
                sessions.add(session_id)
                pairs += list(zip(idx, batch))
                if first_status["node"]["role"] != "leader":
                    began_at_follower += 1
                    self.assertGreaterEqual(
                        c.redirects_followed, 1,
                        f"run {i} began at a {first_status['node']['role']} "
                        f"({order[0]}) but followed no Redirect")
                followed += c.redirects_followed > 0
                if i == 2:
                    # A fourth append: many small entries on the same connection.
                    small = [f"python before {nonce} small {j}".encode() for j in range(200)]
                    idx = c.append_indexed(small)
                    appends += 1
                    self.assertEqual(len(idx), len(small))
                    self.assertEqual(c.session, (session_id, 1 + len(batch) + len(small)),
                                     "the second append must continue the same session")
                    pairs += list(zip(idx, small))
        self.assertGreaterEqual(began_at_follower, 2,
                                "at least two runs should begin at a follower")
        self.assertEqual(len(sessions), 3, f"one session per client: {sorted(sessions)}")
        indexes = [i for i, _ in pairs]
        self.assertEqual(len(indexes), len(set(indexes)), "an index was given twice")
        self.assertEqual(indexes, sorted(indexes), "later appends must get later indexes")
        first, last = indexes[0], indexes[-1]
        want = dict(pairs)

        # 3b. Read your own writes on every node: AtLeast(last) sent to each
        # server (followers included) returns the last entry; never redirected.
        at_least_nodes = set()
        for addr in self.addrs:
            with new_client([addr]) as c:
                got = c.read(last, consistency=("at_least", last))
                self.assertTrue(got, f"at-least read on {addr}: nothing at {last}")
                self.assertEqual(got[0][0], last, f"at-least read on {addr}: first index")
                self.assertEqual(got[0][1], want[last], f"at-least read on {addr}: entry differs")
                self.assertGreaterEqual(c.last_commit, last)
                self.assertEqual(c.redirects_followed, 0, "an at-least read is never redirected")
                at_least_nodes.add(c.node_id)
        self.assertEqual(len(at_least_nodes), 3,
                         f"at-least reads should be answered by three nodes: {at_least_nodes}")

        # 4. Read them back by index.
        with new_client(self.addrs) as c:
            have = read_range(c, first, last)
        check_pairs(self, have, pairs)

        # 4b. A linearizable read started at a follower follows the Redirect to
        # the leader and returns every entry appended so far, without waiting.
        node_roles = roles(self.addrs)
        followers = [a for a, (_, role) in node_roles.items() if role == "follower"]
        self.assertTrue(followers, f"no follower among {node_roles}")
        follower = followers[0]
        with new_client([follower]) as c:
            have = read_now(c, first, last, "linearizable")
            lin_redirects = c.redirects_followed
            lin_node = c.node_id
        check_pairs(self, have, pairs)
        self.assertGreaterEqual(lin_redirects, 1,
                                f"a linearizable read started at follower {follower} "
                                f"followed no Redirect")
        self.assertNotEqual(lin_node, node_roles[follower][0],
                            "the follower answered a linearizable read itself")

        # 5. Tail from the first index: in order, nothing twice.
        seen: list[int] = []
        with new_client(self.addrs) as c:
            gen = c.tail(first, wait_timeout=WAIT_TIMEOUT)
            try:
                for index, data in gen:
                    if seen:
                        self.assertGreater(index, seen[-1], "tail out of order or repeated")
                    seen.append(index)
                    if index in want:
                        self.assertEqual(data, want[index], f"tail: entry {index} differs")
                    if index >= last:
                        break
            finally:
                gen.close()
        self.assertTrue(set(want) <= set(seen), "tail missed acknowledged entries")

        # 6. Status names a leader.
        with new_client(self.addrs) as c:
            st = wait_for_leader(c)
        self.assertIn(st["node"]["role"], ("leader", "follower", "candidate", "recovering"))
        member_ids = {m["id"] for m in st["members"]}
        if member_ids:
            self.assertIn(st["leader"]["id"], member_ids)

        # 7. Conditional append (PROTOCOL.md 6.1). With nothing else in flight,
        # the commit of a linearizable read is the log's end E; append_if(.., E)
        # lands at E+1..; the same E again fails with the end after the first
        # batch, and the second batch is nowhere in the log.
        cond = [f"python before {nonce} conditional {j}".encode() for j in range(3)]
        refused = [f"python before {nonce} refused {j}".encode() for j in range(2)]
        cond_retries = 0   # conditions failed by raft's own entries only (a leader change)
        with new_client(self.addrs) as c:
            while True:
                c.read(last, consistency="linearizable")
                end = c.last_commit
                self.assertGreaterEqual(end, last)
                try:
                    cfirst, clast = c.append_if(cond, end)
                    break
                except rc.ConditionFailed as e:
                    # Only acceptable when no application entry follows E: the
                    # document's "a leader change adds the new leader's own
                    # entry, which fails the condition once".
                    after_end = read_to_end(c, end + 1, "linearizable")
                    if e.maybe_committed and [after_end.get(end + 1 + j)
                                              for j in range(len(cond))] == cond:
                        cfirst, clast = end + 1, end + len(cond)  # the first send committed
                        break
                    self.assertEqual(after_end, {},
                                     f"append_if({end}) failed ({e}) though only this test "
                                     f"appends: entries after {end}: {sorted(after_end)}")
                    cond_retries += 1
                    self.assertLessEqual(cond_retries, 2, f"append_if keeps failing: {e}")
            self.assertEqual((cfirst, clast), (end + 1, end + len(cond)),
                             f"append_if(expected_last={end}) landed at {cfirst}..={clast}")
            with self.assertRaises(rc.ConditionFailed) as cm:
                c.append_if(refused, end)
            failed = cm.exception
            self.assertEqual(failed.expected, end)
            self.assertEqual(failed.last, clast,
                             f"ConditionFailed names the end {failed.last}, not {clast} "
                             f"(the end after the first conditional append)")
            self.assertEqual(failed.committed, [])
            after_end = read_to_end(c, end + 1, "linearizable")
        check_pairs(self, after_end, list(zip(range(cfirst, clast + 1), cond)))
        self.assertEqual(sorted(after_end), list(range(cfirst, clast + 1)),
                         f"application entries after {end}: only the conditional batch")
        for data in refused:
            self.assertNotIn(data, after_end.values(), "a refused conditional entry is in the log")
        cond_pairs = list(zip(range(cfirst, clast + 1), cond))
        pairs += cond_pairs

        # 8. Membership (Admin; the harness makes anonymous clients admins): add a
        # voter that does not exist (the three live nodes are still a majority of
        # four), then remove it again, so the kill -9 of phase after leaves a
        # majority of three. Each call returns once its change is committed.
        with new_client(self.addrs) as c:
            added = c.members(True, 4)
            self.assertGreater(added, clast, "the added voter's change comes after the log's end")
            removed = c.members(False, 4)
            self.assertGreater(removed, added)
            c.read(removed, consistency="linearizable")
            self.assertGreaterEqual(c.last_commit, removed)
            # Nothing else appends now: a tail past the end waits, then gives up.
            t0 = time.monotonic()
            gen = c.tail(c.last_commit + 1, wait_timeout=1.0)
            try:
                with self.assertRaises(rc.TailTimeout):
                    for index, _ in gen:
                        self.fail(f"tail past the end yielded entry {index}")
            finally:
                gen.close()
            waited = time.monotonic() - t0
            self.assertGreaterEqual(waited, 1.0, "TailTimeout before its wait_timeout")
            self.assertLess(waited, 10.0, "TailTimeout long after its wait_timeout")

        # 9. A member that accepts and never answers, first in the list, with a
        # deadline of 3 s: each attempt gets a share of the deadline, so the
        # others are reached in time (PROTOCOL.md 7.2).
        hung = socket.socket()
        try:
            hung.bind(("127.0.0.1", 0))
            hung.listen(8)
            hung_addr = "127.0.0.1:%d" % hung.getsockname()[1]
            t0 = time.monotonic()
            with rc.Client([hung_addr] + self.addrs, cid, timeout=3.0) as c:
                c.status()
                self.assertNotEqual(c._conn.addr, hung_addr)
            self.assertLess(time.monotonic() - t0, 3.0)
        finally:
            hung.close()

        with open(state_path(), "w", encoding="utf-8") as f:
            json.dump({"cluster_id": cid, "leader": st["leader"],
                       "pairs": [[i, d.hex()] for i, d in pairs],
                       "conditional": [[i, d.hex()] for i, d in cond_pairs],
                       "refused": [d.hex() for d in refused]}, f)
        print(f"\npython client: phase before: {appends} appends ({len(pairs)} entries) verified, "
              f"in sessions {sorted(sessions)}; "
              f"{began_at_follower} of 3 runs began at a follower, {followed} followed a redirect; "
              f"read back and tailed {first}..={last}; at-least({last}) read on "
              f"{len(at_least_nodes)} nodes; linearizable read from follower "
              f"{node_roles[follower][0]} answered by node {lin_node} after "
              f"{lin_redirects} redirect(s); leader {st['leader']['id']} "
              f"at {st['leader']['client_addr']} (first seen {leader['id']}); "
              f"append_if at end {end} landed at {cfirst}..={clast}"
              f"{f' after {cond_retries} failed condition(s)' if cond_retries else ''}, "
              f"a second append_if({end}) failed with end {failed.last} and is not in the log; "
              f"voter 4 added at {added} and removed at {removed}; "
              f"a tail past the end timed out after {waited:.1f} s")

    # --------------------------------------------------------------------- tls

    def test_tls(self):
        if self.phase != "tls":
            self.skipTest(f"RDMALOG_PHASE is {self.phase!r}, not 'tls'")
        ca = os.environ["RDMALOG_TLS_CA"]
        cid = cluster_id()
        nonce = os.urandom(4).hex()
        batch = [f"python tls {nonce} {j}".encode() for j in range(5)] + [big_entry(nonce)]
        with rc.Client(self.addrs, cid, timeout=CALL_TIMEOUT, tls=True, ca_file=ca) as c:
            st = wait_for_leader(c)
            idx = c.append_indexed(batch)
            self.assertEqual(len(idx), len(batch))
            have = read_range(c, idx[0], idx[-1])
            check_pairs(self, have, list(zip(idx, batch)))
            got = c.read(idx[-1], consistency="linearizable")
            self.assertEqual(got[0], (idx[-1], batch[-1]))
        # A plaintext client at a TLS port: refused at once, naming TLS.
        with rc.Client(self.addrs[:1], cid, timeout=5.0) as c:
            with self.assertRaises(rc.ProtocolError) as cm:
                c.status()
        self.assertIn("TLS", str(cm.exception))
        print(f"\npython client: phase tls: {len(batch)} entries appended at "
              f"{idx[0]}..={idx[-1]} and read back over TLS through leader "
              f"{st['leader']['id']}; a plaintext client was refused: {cm.exception}")

    # ------------------------------------------------------------------- after

    def test_after(self):
        if self.phase != "after":
            self.skipTest(f"RDMALOG_PHASE is {self.phase!r}, not 'after'")
        with open(state_path(), encoding="utf-8") as f:
            state = json.load(f)
        old = [(int(i), bytes.fromhex(h)) for i, h in state["pairs"]]
        self.assertTrue(old, "the state file holds no entries")
        # The conditional entries are among "pairs" (checked like the others);
        # the refused batch must still be absent.
        conditional = [(int(i), bytes.fromhex(h)) for i, h in state.get("conditional", [])]
        refused = [bytes.fromhex(h) for h in state.get("refused", [])]
        self.assertLessEqual(set(conditional), set(old),
                             "the conditional entries are missing from the state's pairs")
        nonce = os.urandom(4).hex()

        with new_client(self.addrs) as c:
            batch = make_batch(f"after {nonce}")
            idx = c.append_indexed(batch)  # through whichever node leads now
            new = list(zip(idx, batch))
            self.assertGreater(idx[0], max(i for i, _ in old))
            self.assertIsNotNone(c.session, "append did not go through a session")
            session_id, next_seq = c.session
            self.assertEqual(next_seq, 1 + len(batch),
                             f"session {session_id}: next number after {len(batch)} entries")
            self.assertGreater(session_id, max(i for i, _ in old),
                               "the session opens after phase before's entries")
            self.assertLess(session_id, idx[0], "the session opens before its entries")
            last = idx[-1]
            have = read_range(c, 1, last)
            st = c.status()
        check_pairs(self, have, old)   # nothing acknowledged lost or changed
        check_pairs(self, have, new)
        values = set(have.values())
        for data in refused:
            self.assertNotIn(data, values, "a refused conditional entry appeared in the log")

        # A linearizable read through the new leader finds every entry of the state file.
        with new_client(self.addrs) as c:
            st = wait_for_leader(c)
        leader = st["leader"]
        old_leader = state.get("leader") or {}
        order = [leader["client_addr"]] + [a for a in self.addrs if a != leader["client_addr"]]
        lo, hi = min(i for i, _ in old), max(i for i, _ in old)
        with new_client(order) as c:
            lin = read_now(c, lo, hi, "linearizable")
            lin_node = c.node_id
        check_pairs(self, lin, old)
        self.assertEqual(lin_node, leader["id"], "the linearizable read was not answered by "
                         "the leader that Status names")
        print(f"\npython client: phase after: 1 append ({len(new)} entries) in session "
              f"{session_id} through leader "
              f"{leader['id']} (old leader {old_leader.get('id', '?')}); {len(old)} acknowledged "
              f"entries from phase before intact; read 1..={last} ({len(have)} entries) verified; "
              f"linearizable read {lo}..={hi} through leader {lin_node} found all {len(old)}"
              f" ({len(conditional)} conditional among them; {len(refused)} refused "
              f"conditional entries absent)")


if __name__ == "__main__":
    unittest.main()
