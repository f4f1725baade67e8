"""Check rdmalog_client's codec against docs/protocol-vectors.json (PROTOCOL.md section 9),
and Client.read's consistencies, Client.append_if and exactly-once appends in a session
(7a) against loopback fake nodes (no cluster needed).

    python3 -m unittest discover -s clients/python -p 'test_vectors.py' -v

The vectors file is ../../docs/protocol-vectors.json relative to this file,
or the path in the environment variable RDMALOG_VECTORS.
"""

import io
import json
import os
import socket
import struct
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import rdmalog_client as rc  # noqa: E402

VECTORS_PATH = os.environ.get("RDMALOG_VECTORS") or os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs", "protocol-vectors.json")


def load_vectors():
    with open(VECTORS_PATH, encoding="utf-8") as f:
        return json.load(f)


class CountingStream:
    """A stream that records how many bytes were read from it."""

    def __init__(self, data: bytes):
        self.inner = io.BytesIO(data)
        self.consumed = 0

    def read(self, n):
        out = self.inner.read(n)
        self.consumed += len(out)
        return out


class VectorTests(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.vectors = load_vectors()

    def test_file_shape(self):
        self.assertIsInstance(self.vectors, list)
        self.assertGreater(len(self.vectors), 0)
        # PROTOCOL.md section 9: every name is unique.
        names = [v["name"] for v in self.vectors]
        dups = sorted({n for n in names if names.count(n) > 1})
        self.assertEqual(dups, [], "vector names must be unique")
        kinds = {v["kind"] for v in self.vectors}
        self.assertLessEqual(kinds, {"request", "response"})
        self.assertIn("request", kinds)
        self.assertIn("response", kinds)

    def test_every_variant_covered(self):
        seen = {(v["kind"], v["value"]["variant"]) for v in self.vectors}
        for kind, table in (("request", rc.REQUEST_VARIANTS), ("response", rc.RESPONSE_VARIANTS)):
            for name, _ in table:
                self.assertIn((kind, name), seen, f"no vector for {kind} {name}")
        consistencies = {v["value"]["consistency"]["variant"] for v in self.vectors
                         if v["value"]["variant"] == "ReadWith"}
        for name, _ in rc.READ_CONSISTENCIES:
            self.assertIn(name, consistencies, f"no vector for ReadConsistency {name}")
        codes = {v["value"]["code"] for v in self.vectors if v["value"]["variant"] == "Error"}
        for name in rc.ERROR_CODES:
            self.assertIn(name, codes, f"no vector for ErrorCode {name}")

    def test_version_4_indexes(self):
        # 4.3, 5.1, 5.2: the indexes version 4 added, each as the last variant.
        self.assertEqual(rc.PROTOCOL_VERSION, 4)
        self.assertEqual([n for n, _ in rc.REQUEST_VARIANTS][8:],
                         ["OpenSession", "AppendInSession", "Trim"])
        self.assertEqual([n for n, _ in rc.RESPONSE_VARIANTS][9:],
                         ["SessionOpened", "AppendedAt", "Trimmed"])
        self.assertEqual(rc.ERROR_CODES[11:],
                         ["NotCommitted", "UnknownSession", "SessionSequence", "SessionTooOld"])

    def test_decode_frame_gives_value(self):
        for v in self.vectors:
            with self.subTest(v["name"]):
                frame = bytes.fromhex(v["frame"])
                msg = rc.decode_frame(frame, v["kind"])
                self.assertEqual(rc.to_json_form(msg, v["kind"]), v["value"])
                self.assertEqual(msg, rc.from_json_form(v["value"], v["kind"]))
                # and through the stream reader
                stream = CountingStream(frame)
                body = rc.read_frame(stream)
                self.assertEqual(stream.consumed, len(frame))
                self.assertEqual(rc.decode_message(body, v["kind"]), msg)

    def test_encode_value_gives_frame(self):
        for v in self.vectors:
            with self.subTest(v["name"]):
                msg = rc.from_json_form(v["value"], v["kind"])
                frame = rc.encode_frame(msg, v["kind"])
                self.assertEqual(frame.hex(), v["frame"])
                # kind inference of the JSON converters agrees
                self.assertEqual(rc.from_json_form(v["value"]), msg)
                self.assertEqual(rc.to_json_form(msg), v["value"])

    def test_read_consistency_json_form(self):
        # Section 9: an enum with fields in some variant is an object like a message.
        for c in ({"variant": "Local"}, {"variant": "Linearizable"},
                  {"variant": "AtLeast", "0": 70000}):
            msg = {"variant": "ReadWith", "id": 1, "from": 2, "max_bytes": 3, "consistency": c}
            self.assertEqual(rc.to_json_form(msg), msg)
            self.assertEqual(rc.from_json_form(msg), msg)
            self.assertEqual(rc.decode_request(rc.encode_request(msg)), msg)

    def test_json_form_uses_hex_for_bytes(self):
        msg = {"variant": "Append", "id": 7, "entries": [b"hello", b""]}
        self.assertEqual(rc.to_json_form(msg),
                         {"variant": "Append", "id": 7, "entries": ["68656c6c6f", ""]})
        msg = {"variant": "AppendIf", "id": 7, "expected_last": 2 ** 64 - 1,
               "entries": [b"\x00\xff", b""]}
        js = {"variant": "AppendIf", "id": 7, "expected_last": 2 ** 64 - 1,
              "entries": ["00ff", ""]}
        self.assertEqual(rc.to_json_form(msg), js)
        self.assertEqual(rc.from_json_form(js), msg)

    def test_conditional_append_by_hand(self):
        # 5.1: AppendIf is Request 7: id, expected_last, entries (Vec<Vec<u8>>)
        msg = {"variant": "AppendIf", "id": 3, "expected_last": 0, "entries": [b"\x09"]}
        self.assertEqual(rc.encode_request(msg).hex(), "0703000101" + "09")
        msg = {"variant": "AppendIf", "id": 1, "expected_last": 70000, "entries": [b"", b"ab"]}
        body = bytes.fromhex("0701" + "fc70110100" + "02" + "00" + "026162")
        self.assertEqual(rc.encode_request(msg), body)
        self.assertEqual(rc.decode_request(body), msg)
        # 5.2: ConditionFailed is Response 8: id, last
        resp = {"variant": "ConditionFailed", "id": 2 ** 32, "last": 251}
        body = bytes.fromhex("08" + "fd0000000001000000" + "fbfb00")
        self.assertEqual(rc.encode_response(resp), body)
        self.assertEqual(rc.decode_response(body), resp)
        # the same indexes do not exist in the other direction
        with self.assertRaises(rc.ProtocolError):
            rc.encode_response(msg)
        with self.assertRaises(rc.ProtocolError):
            rc.encode_request(resp)
        # expected_last is a u64: FE refused, non-shortest refused, missing entries truncated
        with self.assertRaises(rc.ProtocolError):
            rc.decode_request(bytes.fromhex("0701fe" + "00" * 16 + "00"))
        with self.assertRaises(rc.ProtocolError):
            rc.decode_request(bytes.fromhex("0701fb0500" + "00"))
        with self.assertRaises(rc.ProtocolError):
            rc.decode_request(bytes.fromhex("070105"))
        with self.assertRaises(rc.ProtocolError):
            rc.encode_request({"variant": "AppendIf", "id": 1, "expected_last": -1,
                               "entries": [b"x"]})
        with self.assertRaises(rc.ProtocolError):
            rc.encode_request({"variant": "AppendIf", "id": 1, "entries": [b"x"]})
        with self.assertRaises(rc.ProtocolError):  # ConditionFailed without its last
            rc.decode_response(bytes.fromhex("0801"))

    def test_session_messages_by_hand(self):
        # 5.1: OpenSession is Request 8 (id); AppendInSession Request 9 (id,
        # session, first_seq, entries)
        self.assertEqual(rc.encode_request({"variant": "OpenSession", "id": 300}).hex(),
                         "08fb2c01")
        msg = {"variant": "AppendInSession", "id": 1, "session": 70001, "first_seq": 251,
               "entries": [b"", b"ab"]}
        body = bytes.fromhex("0901" + "fc71110100" + "fbfb00" + "02" + "00" + "026162")
        self.assertEqual(rc.encode_request(msg), body)
        self.assertEqual(rc.decode_request(body), msg)
        js = {**msg, "entries": ["", "6162"]}
        self.assertEqual(rc.to_json_form(msg), js)
        self.assertEqual(rc.from_json_form(js), msg)
        # 5.2: SessionOpened is Response 9 (id, session); AppendedAt 10 (id, indexes)
        resp = {"variant": "SessionOpened", "id": 2, "session": 2 ** 64 - 1}
        self.assertEqual(rc.encode_response(resp).hex(), "0902fdffffffffffffffff")
        resp = {"variant": "AppendedAt", "id": 3, "indexes": [5, 251, 2 ** 32]}
        body = bytes.fromhex("0a03" + "03" + "05" + "fbfb00" + "fd0000000001000000")
        self.assertEqual(rc.encode_response(resp), body)
        self.assertEqual(rc.decode_response(body), resp)
        self.assertEqual(rc.to_json_form(resp), resp)   # a Vec<u64> is a JSON array
        self.assertEqual(rc.decode_response(bytes.fromhex("0a0300")),
                         {"variant": "AppendedAt", "id": 3, "indexes": []})
        # truncated, an index count beyond the body, u64 fields refuse FE
        for bad in ("0901fc7111010001", "0a0305", "0a03050102", "0901fe" + "00" * 16 + "0100"):
            with self.subTest(bad=bad), self.assertRaises(rc.ProtocolError):
                rc.decode_message(bytes.fromhex(bad), "request" if bad[:2] == "09" else "response")
        # 4.3: the error codes 12 to 14
        for code, index in (("UnknownSession", 12), ("SessionSequence", 13),
                            ("SessionTooOld", 14)):
            err = {"variant": "Error", "id": 4, "code": code, "message": "m"}
            body = bytes.fromhex("060104") + bytes((index,)) + b"\x01m"
            self.assertEqual(rc.encode_response(err), body)
            self.assertEqual(rc.decode_response(body), err)
        with self.assertRaises(rc.ProtocolError):  # missing first_seq
            rc.encode_request({"variant": "AppendInSession", "id": 1, "session": 1,
                               "entries": [b"x"]})

    # ---- negative tests --------------------------------------------------

    def test_truncated_frames_rejected(self):
        for v in self.vectors:
            frame = bytes.fromhex(v["frame"])
            with self.subTest(v["name"]):
                # frame cut short (prefix still says the full length)
                for cut in sorted({1, 3, 4, 5, len(frame) - 1}):
                    if cut >= len(frame):
                        continue
                    with self.assertRaises(rc.ProtocolError):
                        rc.decode_frame(frame[:cut], v["kind"])
                    with self.assertRaises(rc.RdmalogError):
                        rc.read_frame(io.BytesIO(frame[:cut]))
                # body cut short with a matching prefix: a truncated body
                body = frame[4:]
                for cut in range(0, len(body)):
                    short = struct.pack("<I", cut) + body[:cut]
                    with self.assertRaises(rc.ProtocolError, msg=f"cut at {cut}"):
                        rc.decode_frame(short, v["kind"])

    def test_trailing_byte_rejected(self):
        for v in self.vectors:
            frame = bytes.fromhex(v["frame"])
            body = frame[4:] + b"\x00"
            with self.subTest(v["name"]):
                with self.assertRaises(rc.ProtocolError):
                    rc.decode_message(body, v["kind"])
                with self.assertRaises(rc.ProtocolError):
                    rc.decode_frame(struct.pack("<I", len(body)) + body, v["kind"])
                with self.assertRaises(rc.ProtocolError):  # bytes after the frame
                    rc.decode_frame(frame + b"\x00", v["kind"])

    def test_empty_body_rejected(self):
        with self.assertRaises(rc.ProtocolError):
            rc.decode_frame(b"\x00\x00\x00\x00", "request")
        with self.assertRaises(rc.ProtocolError):
            rc.read_frame(io.BytesIO(b"\x00\x00\x00\x00\x04\x07"))

    def test_non_shortest_varint_rejected(self):
        # Status { id: 5 } with id as FB 05 00 instead of 05
        with self.assertRaises(rc.ProtocolError):
            rc.decode_request(bytes.fromhex("04fb0500"))
        # Tail { id: 1, from: 300 } with from as FC 2C 01 00 00
        with self.assertRaises(rc.ProtocolError):
            rc.decode_request(bytes.fromhex("0301fc2c010000"))
        # Read { id: 1, from: 70000 as FD ..., max_bytes: 0 }
        with self.assertRaises(rc.ProtocolError):
            rc.decode_request(bytes.fromhex("0201fd7011010000000000" + "00"))
        # variant index as FB 01 00
        with self.assertRaises(rc.ProtocolError):
            rc.decode_request(bytes.fromhex("fb010007"))
        # string length non-shortest: Error { None, Malformed, "x" } with FB 01 00
        with self.assertRaises(rc.ProtocolError):
            rc.decode_response(bytes.fromhex("060000fb010078"))
        # the shortest forms of the same values decode
        self.assertEqual(rc.decode_request(bytes.fromhex("0405")), {"variant": "Status", "id": 5})
        self.assertEqual(rc.decode_request(bytes.fromhex("0301fb2c01")),
                         {"variant": "Tail", "id": 1, "from": 300})

    def test_varint_marker_wider_than_field_rejected(self):
        # Hello version (u16) given with marker FC
        with self.assertRaises(rc.ProtocolError):
            rc.decode_request(bytes.fromhex("00fc0000010000" + "0100"))
        # Read max_bytes (u32) given with marker FD
        with self.assertRaises(rc.ProtocolError):
            rc.decode_request(bytes.fromhex("020101fd0000000001000000"))
        # u64 with marker FE, and FF anywhere
        with self.assertRaises(rc.ProtocolError):
            rc.decode_request(bytes.fromhex("04fe" + "00" * 16))
        with self.assertRaises(rc.ProtocolError):
            rc.decode_request(bytes.fromhex("04ff"))

    def test_varint_encoding_table(self):
        cases = [(0, "00"), (250, "fa"), (251, "fbfb00"), (427, "fbab01"), (65535, "fbffff"),
                 (65536, "fc00000100"), (1048576, "fc00001000"),
                 (2 ** 32, "fd0000000001000000"), (2 ** 64 - 1, "fdffffffffffffffff")]
        for value, hexs in cases:
            with self.subTest(value):
                self.assertEqual(rc.encode_varint(value).hex(), hexs)
                self.assertEqual(rc.decode_varint(bytes.fromhex(hexs)), (value, len(hexs) // 2))
        with self.assertRaises(rc.ProtocolError):
            rc.encode_varint(2 ** 64)
        with self.assertRaises(rc.ProtocolError):
            rc.encode_varint(-1)
        with self.assertRaises(rc.ProtocolError):
            rc.encode_varint(65536, bits=16)

    def test_unknown_variant_rejected(self):
        with self.assertRaises(rc.ProtocolError):
            rc.decode_request(bytes.fromhex("0b0100"))    # Request index 11
        with self.assertRaises(rc.ProtocolError):
            rc.decode_response(bytes.fromhex("0c0100"))   # Response index 12
        # (indexes 7 and 8 are AppendIf and ConditionFailed since version 3,
        # 8 and 9 OpenSession, AppendInSession, 9 and 10 SessionOpened,
        # AppendedAt since version 4, and Trim 10, Trimmed 11)
        self.assertEqual(rc.decode_request(bytes.fromhex("0a0102"))["variant"], "Trim")
        self.assertEqual(rc.decode_response(bytes.fromhex("0b0102"))["variant"], "Trimmed")
        self.assertEqual(rc.decode_request(bytes.fromhex("0701000100"))["variant"], "AppendIf")
        self.assertEqual(rc.decode_response(bytes.fromhex("080101"))["variant"],
                         "ConditionFailed")
        self.assertEqual(rc.decode_request(bytes.fromhex("0801"))["variant"], "OpenSession")
        self.assertEqual(rc.decode_response(bytes.fromhex("0a0100"))["variant"], "AppendedAt")
        self.assertEqual(rc.decode_response(bytes.fromhex("06000e0178"))["code"],
                         "SessionTooOld")
        with self.assertRaises(rc.ProtocolError):          # ErrorCode index 15
            rc.decode_response(bytes.fromhex("06000f0178"))
        with self.assertRaises(rc.ProtocolError):          # Role index 3
            rc.decode_response(bytes.fromhex("00010003"))
        with self.assertRaises(rc.ProtocolError):
            rc.encode_request({"variant": "Goodbye", "id": 1})
        # ReadConsistency index 3 (ReadWith { id 1, from 1, max_bytes 0, ? })
        with self.assertRaises(rc.ProtocolError):
            rc.decode_request(bytes.fromhex("0601010003"))
        with self.assertRaises(rc.ProtocolError):
            rc.encode_request({"variant": "ReadWith", "id": 1, "from": 1, "max_bytes": 0,
                               "consistency": {"variant": "Eventually"}})

    def test_read_with_rejects_bad_consistency(self):
        base = {"variant": "ReadWith", "id": 1, "from": 1, "max_bytes": 0}
        for bad in ("Local", {"variant": "AtLeast"}, {"variant": "Local", "0": 1},
                    {"variant": "AtLeast", "0": -1}, {"variant": "AtLeast", "0": 2 ** 64},
                    {"0": 5}, None):
            with self.subTest(bad=bad):
                with self.assertRaises(rc.ProtocolError):
                    rc.encode_request({**base, "consistency": bad})
        # AtLeast's index is a u64: marker FE refused, a non-shortest form refused
        with self.assertRaises(rc.ProtocolError):
            rc.decode_request(bytes.fromhex("06010100" + "02fe" + "00" * 16))
        with self.assertRaises(rc.ProtocolError):
            rc.decode_request(bytes.fromhex("06010100" + "02fb0500"))
        # a missing consistency is a truncated body
        with self.assertRaises(rc.ProtocolError):
            rc.decode_request(bytes.fromhex("06010100"))
        self.assertEqual(rc.decode_request(bytes.fromhex("06010100" + "02fd0000000001000000")),
                         {**base, "consistency": {"variant": "AtLeast", "0": 2 ** 32}})

    def test_read_consistency_argument(self):
        # Client.read(consistency=...) accepts these spellings (see read_consistency).
        local, lin = {"variant": "Local"}, {"variant": "Linearizable"}
        cases = [(None, local), ("local", local), ("Local", local),
                 ("linearizable", lin), ("Linearizable", lin),
                 (("at_least", 7), {"variant": "AtLeast", "0": 7}),
                 (0, {"variant": "AtLeast", "0": 0}),
                 (2 ** 64 - 1, {"variant": "AtLeast", "0": 2 ** 64 - 1}),
                 ({"variant": "AtLeast", "0": 9}, {"variant": "AtLeast", "0": 9}),
                 (lin, lin)]
        for arg, want in cases:
            with self.subTest(arg=arg):
                self.assertEqual(rc.read_consistency(arg), want)
        for bad in ("eventual", True, -1, 2 ** 64, ("at_least", "7"), ("at_most", 7),
                    {"variant": "AtLeast"}, 1.5):
            with self.subTest(bad=bad):
                with self.assertRaises(ValueError):
                    rc.read_consistency(bad)

    def test_invalid_tags_rejected(self):
        with self.assertRaises(rc.ProtocolError):  # Option tag 2 (Hello token)
            rc.decode_request(bytes.fromhex("000201" + "02"))
        with self.assertRaises(rc.ProtocolError):  # bool byte 2 (Members add)
            rc.decode_request(bytes.fromhex("05050204"))

    def test_invalid_utf8_rejected(self):
        # Error { None, Malformed, <ff fe> }
        with self.assertRaises(rc.ProtocolError):
            rc.decode_response(bytes.fromhex("06000002fffe"))
        # Hello token with a lone continuation byte
        with self.assertRaises(rc.ProtocolError):
            rc.decode_request(bytes.fromhex("00020101" + "0180"))

    def test_count_beyond_body_rejected(self):
        # Append { id: 1, entries: count 2^32 } with a 3-byte rest: refused, not allocated
        with self.assertRaises(rc.ProtocolError):
            rc.decode_request(bytes.fromhex("0101fd0000000001000000" + "000000"))

    def test_oversized_length_refused_before_body(self):
        limit = 1024
        body = b"\x04\x07" + b"\x00" * limit  # garbage: must never be read
        stream = CountingStream(struct.pack("<I", limit + 1) + body)
        with self.assertRaises(rc.ProtocolError):
            rc.read_frame(stream, max_frame_bytes=limit)
        self.assertEqual(stream.consumed, 4, "only the length prefix may be read")
        # the default limit: 16 MiB + 1 refused, without a body present at all
        stream = CountingStream(struct.pack("<I", rc.DEFAULT_MAX_FRAME_BYTES + 1))
        with self.assertRaises(rc.ProtocolError):
            rc.read_frame(stream)
        self.assertEqual(stream.consumed, 4)
        # exactly at the limit is accepted by the length check
        msg = {"variant": "Append", "id": 1, "entries": [b"\x00" * (limit - 6)]}
        frame = rc.encode_frame(msg, "request", max_frame_bytes=limit)
        self.assertEqual(len(frame), 4 + limit)
        self.assertEqual(rc.decode_request(rc.read_frame(io.BytesIO(frame), limit)), msg)
        with self.assertRaises(rc.ProtocolError):
            rc.decode_frame(struct.pack("<I", limit + 1) + b"\x00" * (limit + 1), "request", limit)

    def test_encoder_refuses_oversized_frame(self):
        msg = {"variant": "Append", "id": 1, "entries": [b"\x00" * 2000]}
        with self.assertRaises(rc.ClientError) as cm:
            rc.encode_frame(msg, "request", max_frame_bytes=1024)
        self.assertEqual(cm.exception.code, "TooLarge")
        # 256 entries of 65536 bytes: a 16778501-byte body (PROTOCOL.md section 2)
        self.assertEqual(len(rc.encode_request(
            {"variant": "Append", "id": 7, "entries": [bytes(65536)] * 256})), 16778501)

    def test_tls_record_detected(self):
        with self.assertRaises(rc.ProtocolError):
            rc.read_frame(io.BytesIO(bytes.fromhex("150303000202")), sniff_tls=True)

    def test_encoder_validates_fields(self):
        with self.assertRaises(rc.ProtocolError):
            rc.encode_request({"variant": "Status"})                        # missing id
        with self.assertRaises(rc.ProtocolError):
            rc.encode_request({"variant": "Status", "id": 1, "x": 2})       # unknown field
        with self.assertRaises(rc.ProtocolError):
            rc.encode_request({"variant": "Read", "id": 1, "from": 1, "max_bytes": 2 ** 32})
        with self.assertRaises(rc.ProtocolError):
            rc.encode_request({"variant": "Hello", "version": 65536, "cluster_id": 1, "token": None})
        with self.assertRaises(rc.ProtocolError):
            rc.encode_request({"variant": "Members", "id": 1, "add": 1, "node": 2})

    def test_doc_examples(self):
        # PROTOCOL.md section 8
        examples = [
            ("request", {"variant": "Hello", "version": 2, "cluster_id": 0x1AB, "token": None},
             "06000000 00 02 FBAB01 00"),
            ("request", {"variant": "Append", "id": 7, "entries": [b"hello", b"world"]},
             "0F000000 01 07 02 05 68656C6C6F 05 776F726C64"),
            ("response", {"variant": "Appended", "id": 7, "first": 1, "last": 2}, "04000000 01070102"),
            ("response", {"variant": "Welcome", "node_id": 1,
                          "leader": {"id": 2, "client_addr": "10.0.0.2:7600"}, "role": "ReadOnly"},
             "13000000 00 01 01 02 0D 31302E302E302E323A37363030 00"),
            ("request", {"variant": "Read", "id": 8, "from": 1, "max_bytes": 1048576},
             "08000000 02 08 01 FC00001000"),
            ("response", {"variant": "Entries", "id": 8, "commit": 2,
                          "entries": [{"index": 1, "data": b"hello"}, {"index": 2, "data": b"world"}]},
             "12000000 02 08 02 02 01 05 68656C6C6F 02 05 776F726C64"),
            ("request", {"variant": "Tail", "id": 9, "from": 3}, "03000000 03 09 03"),
            ("request", {"variant": "Status", "id": 7}, "02000000 04 07"),
            ("request", {"variant": "Members", "id": 5, "add": True, "node": 4}, "04000000 05050104"),
            ("response", {"variant": "Redirect", "id": 7, "leader": None}, "03000000 05 07 00"),
            ("response", {"variant": "Error", "id": None, "code": "WrongCluster", "message": "x"},
             "05000000 06 00 03 01 78"),
            ("response", {"variant": "Error", "id": 7, "code": "NotCommitted", "message": "retry"},
             "0A000000 06 01 07 0B 05 7265747279"),
            ("response", {"variant": "PartlyAppended", "id": 7, "first": 1, "last": 1},
             "04000000 07070101"),
            ("request", {"variant": "Append", "id": 3, "entries": [b"\x09"]}, "05000000 0103010109"),
            # 4.4: AtLeast(70000) encodes as 02 FC 70 11 01 00
            ("request", {"variant": "ReadWith", "id": 1, "from": 1, "max_bytes": 0,
                         "consistency": {"variant": "AtLeast", "0": 70000}},
             "0A000000 06 01 01 00 02FC70110100"),
        ]
        for kind, msg, hexs in examples:
            with self.subTest(msg["variant"]):
                frame = bytes.fromhex(hexs)
                self.assertEqual(rc.encode_frame(msg, kind), frame)
                self.assertEqual(rc.decode_frame(frame, kind), msg)


class FakeNode:
    """A loopback server speaking the protocol from a script: ``answer(req, node)``
    returns the response dict for each request after the hello (Welcome is
    automatic, unless ``hello(req, node)`` returns another answer). Records
    every request it decoded in ``self.requests``."""

    def __init__(self, node_id: int, answer, leader=None, hello=None):
        self.node_id = node_id
        self.answer = answer
        self.hello = hello
        self.leader = leader          # a FakeNode, or None (this one leads)
        self.requests = []
        self.lock = threading.Lock()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.addr = "127.0.0.1:%d" % self.sock.getsockname()[1]
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def info(self):
        return {"id": self.node_id, "client_addr": self.addr}

    def _accept(self):
        while not self.closed:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        stream = conn.makefile("rb")
        try:
            while True:
                try:
                    req = rc.decode_request(rc.read_frame(stream))
                except (rc.RdmalogError, OSError):
                    return
                with self.lock:
                    self.requests.append(req)
                if req["variant"] == "Hello":
                    leader = (self.leader or self).info()
                    resp = {"variant": "Welcome", "node_id": self.node_id, "leader": leader,
                            "role": "ReadOnly"}
                    if self.hello is not None:
                        resp = self.hello(req, self) or resp
                else:
                    resp = self.answer(req, self)
                if resp is None:
                    return  # the script breaks the connection without an answer
                conn.sendall(rc.encode_frame(resp, "response"))
        finally:
            stream.close()
            conn.close()

    def close(self):
        self.closed = True
        self.sock.close()


def entries_for(req, commit=5):
    first = max(req["from"], 1)
    return {"variant": "Entries", "id": req["id"], "commit": commit,
            "entries": [{"index": i, "data": b"e%d" % i} for i in range(first, commit + 1)]}


class ClientReadTests(unittest.TestCase):
    """Client.read with each consistency, against loopback fake nodes."""

    def setUp(self):
        self.nodes = []

    def tearDown(self):
        for n in self.nodes:
            n.close()

    def node(self, node_id, answer, leader=None):
        n = FakeNode(node_id, answer, leader)
        self.nodes.append(n)
        return n

    def test_hello_is_version_4_and_local_read_is_plain_read(self):
        n = self.node(1, lambda req, node: entries_for(req))
        with rc.Client([n.addr], 7, timeout=5) as c:
            self.assertEqual(c.read(4), [(4, b"e4"), (5, b"e5")])
            self.assertEqual(c.read(5, consistency="local"), [(5, b"e5")])
        self.assertEqual(n.requests[0], {"variant": "Hello", "version": 4, "cluster_id": 7,
                                         "token": None})
        self.assertEqual([r["variant"] for r in n.requests[1:]], ["Read", "Read"])

    @unittest.skipUnless(hasattr(socket, "TCP_KEEPIDLE"), "Linux keepalive options")
    def test_the_connection_runs_keepalive_at_the_protocols_timing(self):
        # PROTOCOL.md 7: probes after 10 s of silence, every 5 s, 3 unanswered, as the Rust
        # client and the server; the kernel's default (2 hours) left a tail on a member whose
        # machine died waiting for hours.
        n = self.node(1, lambda req, node: entries_for(req))
        with rc.Client([n.addr], 7, timeout=5) as c:
            c.read(4)
            sock = c._conn.sock
            self.assertEqual(sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE), 1)
            self.assertEqual(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE), 10)
            self.assertEqual(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL), 5)
            self.assertEqual(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT), 3)

    def test_a_server_trickling_an_answer_does_not_hold_a_call_past_its_deadline(self):
        # PROTOCOL.md 7: the deadline is the call's. Each socket read used to get the whole
        # request timeout again, so an answer sent a byte every 0.2 s took the call as long
        # as the frame took (a 49-byte frame at 0.3 s a byte: 14.7 s with a 1.5 s deadline).
        srv = socket.create_server(("127.0.0.1", 0))
        addr = "127.0.0.1:%d" % srv.getsockname()[1]
        stop = threading.Event()

        def serve():
            while not stop.is_set():
                try:
                    conn, _ = srv.accept()
                except OSError:
                    return
                stream = conn.makefile("rb")
                try:
                    rc.read_frame(stream)  # the hello
                    conn.sendall(rc.encode_frame(
                        {"variant": "Welcome", "node_id": 1,
                         "leader": {"id": 1, "client_addr": addr}, "role": "ReadOnly"},
                        "response"))
                    req = rc.decode_request(rc.read_frame(stream))
                    for b in rc.encode_frame(entries_for(req), "response"):
                        if stop.is_set():
                            break
                        conn.sendall(bytes([b]))
                        time.sleep(0.2)
                except (rc.RdmalogError, OSError):
                    pass
                finally:
                    stream.close()
                    conn.close()

        threading.Thread(target=serve, daemon=True).start()
        try:
            with rc.Client([addr], 7, timeout=1.5, request_timeout=0.5,
                           connect_timeout=0.5) as c:
                t = time.monotonic()
                with self.assertRaises(rc.RdmalogError):
                    c.read(1)
                took = time.monotonic() - t
            self.assertLess(took, 3.0, "the call took %.1f s with a 1.5 s deadline" % took)
        finally:
            stop.set()
            srv.close()

    def test_an_idle_close_crossing_a_request_is_retried_once(self):
        # PROTOCOL.md 3, Malformed: a request answered by the idle close on a connection that
        # answered before and then sat unused for a second or more is resent once, on a new
        # connection; a Malformed otherwise (or a second time) is the caller's.
        calls = []

        def answer(req, node):
            calls.append(req)
            if len(calls) in (2, 4, 6, 7):
                return {"variant": "Error", "id": None, "code": "Malformed",
                        "message": "idle for longer than idle_timeout"}
            return entries_for(req)
        n = self.node(1, answer)
        with rc.Client([n.addr], 7, timeout=5) as c:
            self.assertEqual(c.read(4), [(4, b"e4"), (5, b"e5")])
            c._conn.last_used -= 2  # as if unused for two seconds
            self.assertEqual(c.read(4), [(4, b"e4"), (5, b"e5")])
            hellos = [r for r in n.requests if r["variant"] == "Hello"]
            self.assertEqual(len(hellos), 2, "resent on a new connection")
            # Fresh from its answer: not the idle close, not resent.
            with self.assertRaises(rc.ServerError) as cm:
                c.read(4)
            self.assertEqual(cm.exception.code, "Malformed")
            # Idle again, answered Malformed twice: resent once only.
            self.assertEqual(c.read(4), [(4, b"e4"), (5, b"e5")])
            c._conn.last_used -= 2
            with self.assertRaises(rc.ServerError):
                c.read(4)
        self.assertEqual(len(calls), 7)

    def test_linearizable_read_follows_redirect(self):
        leader = self.node(2, lambda req, node: entries_for(req))

        def follower_answer(req, node):
            if req["variant"] == "ReadWith" and req["consistency"]["variant"] == "Linearizable":
                return {"variant": "Redirect", "id": req["id"], "leader": leader.info()}
            return entries_for(req, commit=3)
        follower = self.node(1, follower_answer, leader=leader)
        with rc.Client([follower.addr], 7, timeout=5) as c:
            got = c.read(1, consistency="linearizable")
            self.assertEqual([i for i, _ in got], [1, 2, 3, 4, 5])
            self.assertEqual(c.redirects_followed, 1)
            self.assertEqual(c.node_id, 2)
            self.assertEqual(c.last_commit, 5)
        self.assertEqual(leader.requests[1]["variant"], "ReadWith")
        self.assertEqual(leader.requests[1]["consistency"], {"variant": "Linearizable"})

    def test_at_least_read_is_sent_and_never_redirected(self):
        seen = []

        def answer(req, node):
            seen.append(req)
            if len(seen) == 1:
                return entries_for(req)
            return {"variant": "Redirect", "id": req["id"], "leader": None}
        n = self.node(1, answer)
        with rc.Client([n.addr], 7, timeout=5) as c:
            self.assertEqual(c.read(5, 100, consistency=("at_least", 5)), [(5, b"e5")])
            # a Redirect is no answer to an AtLeast read: a protocol violation
            with self.assertRaises(rc.ProtocolError):
                c.read(5, consistency=5)
        self.assertEqual(seen[0], {"variant": "ReadWith", "id": seen[0]["id"], "from": 5,
                                   "max_bytes": 100,
                                   "consistency": {"variant": "AtLeast", "0": 5}})

    def test_read_timeout_is_retried_then_reported(self):
        calls = []

        def answer(req, node):
            calls.append(req)
            if len(calls) == 1:
                return {"variant": "Error", "id": req["id"], "code": "Timeout",
                        "message": "Timeout: not met"}
            return entries_for(req)
        n = self.node(1, answer)
        with rc.Client([n.addr], 7, timeout=5) as c:
            self.assertEqual(c.read(5, consistency=("at_least", 5)), [(5, b"e5")])
        self.assertEqual(len(calls), 2)
        self.assertNotEqual(calls[0]["id"], calls[1]["id"], "a retry uses a new id")

        def always_timeout(req, node):
            return {"variant": "Error", "id": req["id"], "code": "Timeout",
                    "message": "Timeout: not met"}
        m = self.node(2, always_timeout)
        with rc.Client([m.addr], 7, timeout=0.5) as c:
            with self.assertRaises(rc.ServerError) as cm:
                c.read(1, consistency="linearizable")
        self.assertEqual(cm.exception.code, "Timeout")
        self.assertGreater(len(m.requests), 2, "retried within the deadline")


class FakeLog:
    """The leader's log for append_if tests: ``end`` is its last index."""

    def __init__(self, end):
        self.end = end
        self.batches = []   # (first, entries) of every batch appended

    def append_if(self, req):
        if req["expected_last"] != self.end:
            return {"variant": "ConditionFailed", "id": req["id"], "last": self.end}
        first = self.end + 1
        self.end += len(req["entries"])
        self.batches.append((first, list(req["entries"])))
        return {"variant": "Appended", "id": req["id"], "first": first, "last": self.end}


class ClientAppendIfTests(unittest.TestCase):
    """Client.append_if against loopback fake nodes."""

    def setUp(self):
        self.nodes = []

    def tearDown(self):
        for n in self.nodes:
            n.close()

    def node(self, node_id, answer, leader=None):
        n = FakeNode(node_id, answer, leader)
        self.nodes.append(n)
        return n

    def appends(self, node):
        return [r for r in node.requests if r["variant"] == "AppendIf"]

    def test_appended_then_condition_failed(self):
        log = FakeLog(41)
        n = self.node(1, lambda req, node: log.append_if(req))
        with rc.Client([n.addr], 7, timeout=5) as c:
            self.assertEqual(c.append_if([b"a", b"b", b"c"], 41), (42, 44))
            with self.assertRaises(rc.ConditionFailed) as cm:
                c.append_if([b"d"], 41)
        e = cm.exception
        self.assertIsInstance(e, rc.RdmalogError)
        self.assertEqual((e.expected, e.last, e.maybe_committed, e.committed), (41, 44, False, []))
        self.assertEqual(log.batches, [(42, [b"a", b"b", b"c"])])
        sent = self.appends(n)
        self.assertEqual(len(sent), 2, "a ConditionFailed is not resent")
        self.assertEqual(sent[0], {"variant": "AppendIf", "id": sent[0]["id"],
                                   "expected_last": 41, "entries": [b"a", b"b", b"c"]})
        self.assertEqual(e.id, sent[1]["id"])

    def test_redirect_followed(self):
        log = FakeLog(0)
        leader = self.node(2, lambda req, node: log.append_if(req))
        follower = self.node(1, lambda req, node: {"variant": "Redirect", "id": req["id"],
                                                   "leader": leader.info()}, leader=leader)
        with rc.Client([follower.addr], 7, timeout=5) as c:
            self.assertEqual(c.append_if([b"x"], 0), (1, 1))
            self.assertEqual(c.redirects_followed, 1)
        self.assertEqual(len(self.appends(follower)), 1)
        self.assertEqual(self.appends(leader)[0]["expected_last"], 0)

    def test_not_committed_resent_then_condition_failed_is_certain(self):
        # NotCommitted: nothing is in the log; the new leader's own entry then
        # fails the resent condition, and that failure is certain.
        log = FakeLog(10)
        calls = []

        def answer(req, node):
            calls.append(req)
            if len(calls) == 1:
                log.end += 1  # a new leader's no-op replaced the batch
                return {"variant": "Error", "id": req["id"], "code": "NotCommitted",
                        "message": "retry"}
            return log.append_if(req)
        n = self.node(1, answer)
        with rc.Client([n.addr], 7, timeout=5) as c:
            with self.assertRaises(rc.ConditionFailed) as cm:
                c.append_if([b"x", b"y"], 10)
        e = cm.exception
        self.assertEqual((e.expected, e.last, e.maybe_committed), (10, 11, False))
        self.assertEqual([r["expected_last"] for r in calls], [10, 10])
        self.assertEqual(calls[1]["entries"], [b"x", b"y"], "the whole batch is resent")
        self.assertNotEqual(calls[0]["id"], calls[1]["id"])

    def test_condition_failed_after_unknown_outcome_may_mean_committed(self):
        # The first send commits but its answer is lost (the connection breaks):
        # the resend's condition fails on the batch's own entries.
        log = FakeLog(5)
        calls = []

        def answer(req, node):
            calls.append(req)
            resp = log.append_if(req)
            return None if len(calls) == 1 else resp
        n = self.node(1, answer)
        with rc.Client([n.addr], 7, timeout=5) as c:
            with self.assertRaises(rc.ConditionFailed) as cm:
                c.append_if([b"x", b"y"], 5)
        e = cm.exception
        self.assertEqual((e.expected, e.last, e.maybe_committed), (5, 7, True))
        self.assertIn("may have committed", str(e))
        self.assertEqual(log.batches, [(6, [b"x", b"y"])], "appended once, not twice")

        # ShuttingDown with an id: outcome unknown too.
        log2 = FakeLog(5)
        calls2 = []

        def answer2(req, node):
            calls2.append(req)
            resp = log2.append_if(req)
            if len(calls2) == 1:
                return {"variant": "Error", "id": req["id"], "code": "ShuttingDown",
                        "message": "stopping"}
            return resp
        m = self.node(2, answer2)
        with rc.Client([m.addr], 7, timeout=5) as c:
            with self.assertRaises(rc.ConditionFailed) as cm:
                c.append_if([b"z"], 5)
        self.assertTrue(cm.exception.maybe_committed)
        self.assertEqual(cm.exception.last, 6)

    def test_partly_appended_rest_resent_on_the_prefix(self):
        log = FakeLog(20)
        calls = []

        def answer(req, node):
            calls.append(req)
            if len(calls) == 1:  # two of three committed at 21..22
                log.end = 22
                return {"variant": "PartlyAppended", "id": req["id"], "first": 21, "last": 22}
            return log.append_if(req)
        n = self.node(1, answer)
        with rc.Client([n.addr], 7, timeout=5) as c:
            self.assertEqual(c.append_if([b"a", b"b", b"c"], 20), (21, 23))
        self.assertEqual([(r["expected_last"], r["entries"]) for r in calls],
                         [(20, [b"a", b"b", b"c"]), (22, [b"c"])])

        # The usual case: a new leader's own entry follows the prefix, so the
        # rest fails its condition; the prefix is reported in .committed.
        log2 = FakeLog(20)
        calls2 = []

        def answer2(req, node):
            calls2.append(req)
            if len(calls2) == 1:
                log2.end = 23  # prefix 21..22, then the new leader's no-op
                return {"variant": "PartlyAppended", "id": req["id"], "first": 21, "last": 22}
            return log2.append_if(req)
        m = self.node(2, answer2)
        with rc.Client([m.addr], 7, timeout=5) as c:
            with self.assertRaises(rc.ConditionFailed) as cm:
                c.append_if([b"a", b"b", b"c"], 20)
        e = cm.exception
        self.assertEqual((e.expected, e.last, e.committed, e.maybe_committed),
                         (22, 23, [21, 22], False))

    def test_other_answers(self):
        def timeout(req, node):
            return {"variant": "Error", "id": req["id"], "code": "Timeout", "message": "slow"}
        n = self.node(1, timeout)
        with rc.Client([n.addr], 7, timeout=5) as c:
            with self.assertRaises(rc.ServerError) as cm:
                c.append_if([b"x"], 3)
        self.assertEqual(cm.exception.code, "Timeout")
        self.assertEqual(len(self.appends(n)), 1, "a Timeout is not resent")

        def misplaced(req, node):  # the condition ignored: a protocol violation
            return {"variant": "Appended", "id": req["id"], "first": 9, "last": 9}
        m = self.node(2, misplaced)
        with rc.Client([m.addr], 7, timeout=5) as c:
            with self.assertRaises(rc.ProtocolError):
                c.append_if([b"x"], 3)

        def condition_failed(req, node):  # not an answer to a plain Append
            return {"variant": "ConditionFailed", "id": req["id"], "last": 1}
        k = self.node(3, condition_failed)
        with rc.Client([k.addr], 7, timeout=5, exactly_once=False) as c:
            with self.assertRaises(rc.ProtocolError):
                c.append([b"x"])
            with self.assertRaises(ValueError):
                c.append_if([b"x"], -1)
            with self.assertRaises(rc.ClientError):
                c.append_if([], 0)


class FakeSessionLog:
    """The leader's log for session tests, deduplicating as PROTOCOL.md 6.1 says:
    ``end`` is its last index, ``sessions`` maps a session id (the index of its
    opening entry) to {number: index}, ``entries`` lists (index, session,
    number, data) of every application entry appended."""

    def __init__(self, end=0):
        self.end = end
        self.sessions = {}
        self.entries = []

    def open(self, req):
        self.end += 1
        self.sessions[self.end] = {}
        return {"variant": "SessionOpened", "id": req["id"], "session": self.end}

    def error(self, req, code):
        return {"variant": "Error", "id": req["id"], "code": code, "message": f"{code}: m"}

    def append(self, req, limit=None):
        """Appends the request's new numbers (at most ``limit`` of them, to
        play a leader change that replaced the rest) and answers AppendedAt."""
        numbers = self.sessions.get(req["session"])
        if numbers is None:
            return self.error(req, "UnknownSession")
        if req["first_seq"] > len(numbers) + 1:
            return self.error(req, "SessionSequence")
        indexes = []
        for k, data in enumerate(req["entries"]):
            seq = req["first_seq"] + k
            if seq not in numbers:
                if limit is not None and limit <= 0:
                    return self.error(req, "NotCommitted")
                limit = None if limit is None else limit - 1
                self.end += 1
                numbers[seq] = self.end
                self.entries.append((self.end, req["session"], seq, data))
            indexes.append(numbers[seq])
        return {"variant": "AppendedAt", "id": req["id"], "indexes": indexes}

    def answer(self, req, node=None):
        if req["variant"] == "OpenSession":
            return self.open(req)
        if req["variant"] == "AppendInSession":
            return self.append(req)
        raise AssertionError(f"unexpected {req}")


class ClientSessionTests(unittest.TestCase):
    """Exactly-once appends (PROTOCOL.md 6.1, 7 step 7a) against loopback fake nodes."""

    def setUp(self):
        self.nodes = []

    def tearDown(self):
        for n in self.nodes:
            n.close()

    def node(self, node_id, answer, leader=None):
        n = FakeNode(node_id, answer, leader)
        self.nodes.append(n)
        return n

    def sent(self, node, variant="AppendInSession"):
        return [r for r in node.requests if r["variant"] == variant]

    def assertOnceEach(self, log):
        keys = [(s, q) for _, s, q, _ in log.entries]
        self.assertEqual(len(keys), len(set(keys)), f"a (session, number) twice: {log.entries}")

    def test_numbers_advance_by_the_batch_size(self):
        log = FakeSessionLog(end=10)
        n = self.node(1, log.answer)
        with rc.Client([n.addr], 7, timeout=5) as c:
            self.assertTrue(c.exactly_once)
            self.assertIsNone(c.session, "opened lazily")
            self.assertEqual(c.append([b"a", b"b", b"c"]), (12, 14))
            self.assertEqual(c.session, (11, 4))
            self.assertEqual(c.append_at([b"d", b"e"]), [15, 16])
            self.assertEqual(c.session, (11, 6))
            self.assertEqual(c.append_indexed([b"f"]), [17])
            self.assertEqual(c.session, (11, 7))
        self.assertEqual([r["variant"] for r in n.requests[1:]],
                         ["OpenSession"] + ["AppendInSession"] * 3)
        self.assertEqual([(r["session"], r["first_seq"], r["entries"]) for r in self.sent(n)],
                         [(11, 1, [b"a", b"b", b"c"]), (11, 4, [b"d", b"e"]), (11, 6, [b"f"])])
        self.assertEqual([(i, q, d) for i, _, q, d in log.entries],
                         [(12, 1, b"a"), (13, 2, b"b"), (14, 3, b"c"), (15, 4, b"d"),
                          (16, 5, b"e"), (17, 6, b"f")])

    def test_resend_after_broken_connection_reuses_session_and_first_seq(self):
        # The first send commits, but the connection breaks before its answer.
        log = FakeSessionLog()
        broke = []

        def answer(req, node):
            resp = log.answer(req)
            if req["variant"] == "AppendInSession" and not broke:
                broke.append(req)
                return None
            return resp
        n = self.node(1, answer)
        with rc.Client([n.addr], 7, timeout=5) as c:
            self.assertEqual(c.append_at([b"x", b"y"]), [2, 3])
            self.assertEqual(c.session, (1, 3))
            self.assertEqual(c.connects, 2)
        sent = self.sent(n)
        self.assertEqual(len(sent), 2)
        self.assertEqual([(r["session"], r["first_seq"], r["entries"]) for r in sent],
                         [(1, 1, [b"x", b"y"])] * 2, "the same request is resent")
        self.assertNotEqual(sent[0]["id"], sent[1]["id"], "with a new id")
        self.assertEqual(len(self.sent(n, "OpenSession")), 1, "in the same session")
        self.assertEqual(len(log.entries), 2, "each entry once")

    def test_retryable_failures_resend_the_same_request(self):
        # Timeout (committed meanwhile), NotCommitted after a partial commit (a
        # new leader's no-op follows the first entry), ShuttingDown with an id,
        # Busy with none: each resent, the same numbers, until AppendedAt.
        log = FakeSessionLog()
        script = ["Timeout", "NotCommitted", "ShuttingDown", "Busy"]

        def answer(req, node):
            if req["variant"] != "AppendInSession" or not script:
                return log.answer(req)
            what = script.pop(0)
            if what == "Timeout":
                log.append({**req, "entries": req["entries"][:1]})
                return log.error(req, "Timeout")
            if what == "NotCommitted":
                log.end += 1  # the new leader's own entry
                return log.append(req, limit=0)
            if what == "Busy":
                return {"variant": "Error", "id": None, "code": "Busy", "message": "full"}
            return log.error(req, what)
        n = self.node(1, answer)
        with rc.Client([n.addr], 7, timeout=5) as c:
            self.assertEqual(c.append_at([b"a", b"b", b"c"]), [2, 4, 5])
            self.assertEqual(c.append([b"d"]), (6, 6))
            self.assertEqual(c.session, (1, 5))
        sent = self.sent(n)
        self.assertEqual([(r["session"], r["first_seq"]) for r in sent], [(1, 1)] * 5 + [(1, 4)])
        self.assertEqual(len({r["id"] for r in sent}), 6)
        self.assertEqual(len(self.sent(n, "OpenSession")), 1)
        self.assertOnceEach(log)
        self.assertEqual([d for *_, d in log.entries], [b"a", b"b", b"c", b"d"])

    def test_redirect_followed_for_open_and_append(self):
        log = FakeSessionLog()
        leader = self.node(2, log.answer)
        follower = self.node(1, lambda req, node: {"variant": "Redirect", "id": req["id"],
                                                   "leader": leader.info()}, leader=leader)
        with rc.Client([follower.addr], 7, timeout=5) as c:
            c.append([b"x"])
            self.assertEqual(c.redirects_followed, 1)
            self.assertEqual(c.node_id, 2)
        self.assertEqual([r["variant"] for r in follower.requests], ["Hello", "OpenSession"])
        self.assertEqual([r["variant"] for r in leader.requests],
                         ["Hello", "OpenSession", "AppendInSession"])

        # A Redirect of the append itself: the same numbers at the leader.
        log2 = FakeSessionLog()
        redirected = []

        def stale(req, node):
            if req["variant"] == "AppendInSession" and not redirected:
                redirected.append(req)
                return {"variant": "Redirect", "id": req["id"], "leader": leader2.info()}
            return log2.answer(req)
        leader2 = self.node(4, log2.answer)
        old = self.node(3, stale, leader=None)
        with rc.Client([old.addr], 7, timeout=5) as c:
            self.assertEqual(c.append_at([b"p", b"q"]), [2, 3])
            self.assertEqual(c.session, (1, 3))
        self.assertEqual((redirected[0]["session"], redirected[0]["first_seq"]), (1, 1))
        self.assertEqual([(r["session"], r["first_seq"]) for r in self.sent(leader2)], [(1, 1)])

    def test_unknown_session_on_first_send_opens_a_new_session(self):
        log = FakeSessionLog()
        n = self.node(1, log.answer)
        with rc.Client([n.addr], 7, timeout=5) as c:
            self.assertEqual(c.append([b"a", b"b"]), (2, 3))
            self.assertEqual(c.session, (1, 3))
            del log.sessions[1]  # the cluster expired it
            self.assertEqual(c.append_at([b"c"]), [5])
            self.assertEqual(c.session, (4, 2))
            self.assertEqual(c.append_at([b"d"]), [6])
            self.assertEqual(c.session, (4, 3))
        self.assertEqual([(r["variant"], r.get("session"), r.get("first_seq"))
                          for r in n.requests[1:]],
                         [("OpenSession", None, None), ("AppendInSession", 1, 1),
                          ("AppendInSession", 1, 3), ("OpenSession", None, None),
                          ("AppendInSession", 4, 1), ("AppendInSession", 4, 2)])

    def test_unknown_session_after_a_redirect_opens_a_new_session(self):
        # A Redirect appends nothing: the batch still counts as never sent.
        log = FakeSessionLog()
        leader = self.node(2, log.answer)
        redirected = []

        def answer(req, node):
            if req["variant"] == "AppendInSession" and not redirected:
                redirected.append(req)
                del log.sessions[req["session"]]  # expired meanwhile
                return {"variant": "Redirect", "id": req["id"], "leader": leader.info()}
            return log.answer(req)
        first = self.node(1, answer, leader=None)
        with rc.Client([first.addr], 7, timeout=5) as c:
            self.assertEqual(c.append_at([b"x"]), [3])
            self.assertEqual(c.session, (2, 2))
        self.assertEqual([(r["variant"], r.get("session")) for r in leader.requests[1:]],
                         [("AppendInSession", 1), ("OpenSession", None),
                          ("AppendInSession", 2)])

    def test_unknown_session_after_a_send_that_may_have_committed_is_reported(self):
        # The first send commits, its answer is lost, then the session expires:
        # the resend's UnknownSession may hide a committed batch: no new session.
        log = FakeSessionLog()
        calls = []

        def answer(req, node):
            resp = log.answer(req)
            if req["variant"] == "AppendInSession":
                calls.append(req)
                if len(calls) == 1:
                    del log.sessions[req["session"]]
                    return None
            return resp
        n = self.node(1, answer)
        with rc.Client([n.addr], 7, timeout=5) as c:
            with self.assertRaises(rc.ServerError) as cm:
                c.append([b"x"])
            self.assertEqual(cm.exception.code, "UnknownSession")
            self.assertIs(cm.exception.maybe_committed, True)
            self.assertIsNone(c.session, "the session is dropped")
            self.assertEqual(len(self.sent(n, "OpenSession")), 1, "not resent in a new session")
            self.assertEqual(len(log.entries), 1)
            # the next append opens a new session
            self.assertEqual(c.append_at([b"y"]), [4])
            self.assertEqual(c.session, (3, 2))

    def test_unknown_session_twice_is_reported(self):
        # A new session's first send refused UnknownSession too: sent there once only.
        def answer(req, node):
            if req["variant"] == "OpenSession":
                return {"variant": "SessionOpened", "id": req["id"], "session": 9}
            return {"variant": "Error", "id": req["id"], "code": "UnknownSession", "message": "m"}
        n = self.node(1, answer)
        with rc.Client([n.addr], 7, timeout=5) as c:
            with self.assertRaises(rc.ServerError) as cm:
                c.append([b"x"])
            self.assertEqual(cm.exception.code, "UnknownSession")
            self.assertIs(cm.exception.maybe_committed, False)
            self.assertIsNone(c.session)
        self.assertEqual([r["variant"] for r in n.requests[1:]],
                         ["OpenSession", "AppendInSession"] * 2)

    def test_other_failures_drop_the_session(self):
        log = FakeSessionLog()
        script = {}

        def answer(req, node):
            code = script.pop(req["variant"], None)
            return log.error(req, code) if code else log.answer(req)
        n = self.node(1, answer)
        with rc.Client([n.addr], 7, timeout=5) as c:
            c.append([b"a"])
            self.assertEqual(c.session, (1, 2))
            for code, maybe in (("SessionSequence", False), ("Unauthorized", False),
                                ("SessionTooOld", True), ("Internal", True)):
                with self.subTest(code=code):
                    script["AppendInSession"] = code
                    with self.assertRaises(rc.ServerError) as cm:
                        c.append([b"b"])
                    self.assertEqual(cm.exception.code, code)
                    self.assertIs(cm.exception.maybe_committed, maybe)
                    self.assertIsNone(c.session)
                    c.append([b"c"])  # a new session, numbered from 1
                    self.assertEqual(self.sent(n)[-1]["first_seq"], 1)
                    self.assertEqual(c.session, (self.sent(n)[-1]["session"], 2))
            # a failed OpenSession: nothing sent, no session
            script["OpenSession"] = "Unauthorized"
            c.session = None
            with self.assertRaises(rc.ServerError) as cm:
                c.append([b"d"])
            self.assertEqual(cm.exception.code, "Unauthorized")
            self.assertIs(cm.exception.maybe_committed, False)
            self.assertIsNone(c.session)
        self.assertEqual(len(self.sent(n, "OpenSession")), 6)

    def test_refused_hello_after_an_unknown_outcome_may_have_committed(self):
        # The batch's send commits, the connection breaks, and the reconnect's
        # hello is refused (id None): that refusal says nothing of the batch.
        log = FakeSessionLog()
        hellos = []

        def hello(req, node):
            hellos.append(req)
            if len(hellos) > 1:
                return {"variant": "Error", "id": None, "code": "Unauthorized",
                        "message": "token revoked"}
            return None

        def answer(req, node):
            resp = log.answer(req)
            return None if req["variant"] == "AppendInSession" else resp
        n = FakeNode(1, answer, hello=hello)
        self.nodes.append(n)
        with rc.Client([n.addr], 7, timeout=5) as c:
            with self.assertRaises(rc.ServerError) as cm:
                c.append([b"x"])
            self.assertEqual((cm.exception.code, cm.exception.id), ("Unauthorized", None))
            self.assertIs(cm.exception.maybe_committed, True)
            self.assertIsNone(c.session)
        self.assertEqual(len(log.entries), 1)

    def test_timeouts_resent_until_the_deadline(self):
        log = FakeSessionLog()

        def answer(req, node):
            if req["variant"] == "OpenSession":
                return log.open(req)
            return log.error(req, "Timeout")
        n = self.node(1, answer)
        with rc.Client([n.addr], 7, timeout=0.6) as c:
            with self.assertRaises(rc.ServerError) as cm:
                c.append([b"x", b"y"])
            self.assertEqual(cm.exception.code, "Timeout")
            self.assertIs(cm.exception.maybe_committed, True)
            self.assertIsNone(c.session)
        sent = self.sent(n)
        self.assertGreater(len(sent), 2, "resent within the deadline")
        self.assertEqual({(r["session"], r["first_seq"]) for r in sent}, {(1, 1)})

        # A plain Append's Timeout is not resent (exactly_once=False: as before).
        m = self.node(2, lambda req, node: log.error(req, "Timeout"))
        with rc.Client([m.addr], 7, timeout=5, exactly_once=False) as c:
            with self.assertRaises(rc.ServerError) as cm:
                c.append([b"x"])
            self.assertEqual(cm.exception.code, "Timeout")
            self.assertIsNone(cm.exception.maybe_committed)
        self.assertEqual([r["variant"] for r in m.requests], ["Hello", "Append"])

    def test_exactly_once_off_sends_plain_appends(self):
        def answer(req, node):
            return {"variant": "Appended", "id": req["id"], "first": 5,
                    "last": 4 + len(req["entries"])}
        n = self.node(1, answer)
        with rc.Client([n.addr], 7, timeout=5, exactly_once=False) as c:
            self.assertEqual(c.append([b"a", b"b"]), (5, 6))
            self.assertEqual(c.append_at([b"c"]), [5])
            self.assertIsNone(c.session)
        self.assertEqual([r["variant"] for r in n.requests], ["Hello", "Append", "Append"])

    def test_local_refusals_open_no_session(self):
        log = FakeSessionLog()
        n = self.node(1, log.answer)
        with rc.Client([n.addr], 7, timeout=5, max_frame_bytes=1024) as c:
            for bad in ([], [b"x"] * (rc.MAX_BATCH_ENTRIES + 1)):
                with self.assertRaises(rc.ClientError) as cm:
                    c.append(bad)
                self.assertEqual(cm.exception.code, "EntryTooLarge")
            with self.assertRaises(rc.ClientError) as cm:
                c.append([b"\x00" * 1000])
            self.assertEqual(cm.exception.code, "TooLarge")
            self.assertIsNone(c.session)
            self.assertEqual(c.append_at([b"\x00" * 900]), [2])
        self.assertEqual([r["variant"] for r in n.requests],
                         ["Hello", "OpenSession", "AppendInSession"])

    def test_wrong_answers_are_protocol_errors(self):
        for name, resp in (
                ("PartlyAppended", lambda req: {"variant": "PartlyAppended", "id": req["id"],
                                                "first": 2, "last": 2}),
                ("Appended", lambda req: {"variant": "Appended", "id": req["id"],
                                          "first": 2, "last": 3}),
                ("too few indexes", lambda req: {"variant": "AppendedAt", "id": req["id"],
                                                 "indexes": [2]}),
                ("not increasing", lambda req: {"variant": "AppendedAt", "id": req["id"],
                                                "indexes": [3, 3]})):
            with self.subTest(name):
                log = FakeSessionLog()

                def answer(req, node, resp=resp, log=log):
                    return log.open(req) if req["variant"] == "OpenSession" else resp(req)
                n = self.node(len(self.nodes) + 1, answer)
                with rc.Client([n.addr], 7, timeout=5) as c:
                    with self.assertRaises(rc.ProtocolError) as cm:
                        c.append([b"x", b"y"])
                    self.assertIs(cm.exception.maybe_committed, True)
                    self.assertIsNone(c.session)


class HostileAnswerTests(unittest.TestCase):
    """Answers no correct server gives: a ProtocolError naming them, never an index the
    server did not give each entry, a loop, a hang or a foreign exception (as the Rust
    client, crates/client/tests/hostile_server.rs)."""

    def setUp(self):
        self.nodes = []

    def tearDown(self):
        for n in self.nodes:
            n.close()

    def node(self, answer):
        n = FakeNode(len(self.nodes) + 1, answer)
        self.nodes.append(n)
        return n

    def test_appends_answered_at_index_0_or_with_no_prefix(self):
        for name, resp in (
                ("Appended from 0", {"variant": "Appended", "first": 0, "last": 1}),
                # Nothing committed: resending the same batch at once looped to the deadline.
                ("PartlyAppended of none", {"variant": "PartlyAppended", "first": 7, "last": 6}),
                ("PartlyAppended from 0", {"variant": "PartlyAppended", "first": 0, "last": 0})):
            with self.subTest(name):
                n = self.node(lambda req, node, resp=resp: {**resp, "id": req["id"]})
                start = time.monotonic()
                with rc.Client([n.addr], 7, timeout=5, exactly_once=False) as c:
                    with self.assertRaises(rc.ProtocolError):
                        c.append([b"x", b"y"])
                self.assertLess(time.monotonic() - start, 2)
        log = FakeSessionLog()

        def answer(req, node):
            if req["variant"] == "OpenSession":
                return log.open(req)
            return {"variant": "AppendedAt", "id": req["id"], "indexes": [0, 1]}
        n = self.node(answer)
        with rc.Client([n.addr], 7, timeout=5) as c:
            with self.assertRaises(rc.ProtocolError):
                c.append([b"x", b"y"])

    def test_read_entries_past_the_commit_index(self):
        n = self.node(lambda req, node: {
            "variant": "Entries", "id": req["id"], "commit": 3,
            "entries": [{"index": 5, "data": b"x"}, {"index": 9, "data": b"y"}]})
        with rc.Client([n.addr], 7, timeout=5) as c:
            with self.assertRaises(rc.ProtocolError):
                c.read(5)
            self.assertIsNone(c.last_commit)

    def test_a_status_of_absurd_members(self):
        members = [{"id": i, "client_addr": "10.0.%d.%d:7600" % (i // 256, i % 256)}
                   for i in range(1, 2001)]
        node = {"id": 1, "role": "leader", "term": 1, "commit": 0, "applied": 0,
                "first_index": 1, "last_index": 0, "ring_used_bytes": 0, "ring_bytes": 0,
                "fenced_writes": 0, "peers": []}
        n = self.node(lambda req, n_: {"variant": "Status", "id": req["id"], "node": node,
                                       "leader": None, "members": members})
        with rc.Client([n.addr], 7, timeout=5) as c:
            with self.assertRaises(rc.ProtocolError):
                c.status()
            self.assertEqual(c.addrs, [n.addr])

    def test_a_tail_entry_at_the_last_index(self):
        n = self.node(lambda req, node: {
            "variant": "Entries", "id": req["id"], "commit": (1 << 64) - 1,
            "entries": [{"index": 4, "data": b"ok"}, {"index": (1 << 64) - 1, "data": b"x"}]})
        with rc.Client([n.addr], 7, timeout=5) as c:
            t = c.tail(4)
            self.assertEqual(next(t), (4, b"ok"))
            with self.assertRaises(rc.ProtocolError):
                next(t)

    def test_an_entries_frame_past_the_servers_clamp(self):
        # One more entry than the server's clamp allows (each counted as payload + 18 bytes
        # against 16 MiB - 32): refused before the entries are built, which cost ~100 times
        # their wire bytes in memory.
        one = rc.encode_response({"variant": "Entries", "id": 1, "commit": 5,
                                  "entries": [{"index": 1, "data": b""}]})
        n = rc.MAX_FRAME_ENTRIES
        tail = rc.encode_varint(1) + b"\x01\x00"
        self.assertTrue(one.endswith(tail))
        ok = one[:-len(tail)] + rc.encode_varint(n) + b"\x01\x00" * n
        self.assertEqual(len(rc.decode_response(ok)["entries"]), n)
        bad = one[:-len(tail)] + rc.encode_varint(n + 1) + b"\x01\x00" * (n + 1)
        with self.assertRaisesRegex(rc.ProtocolError, "at most"):
            rc.decode_response(bad)

    def test_a_tail_entry_past_its_frames_commit(self):
        # Not known to be in the log: the frame is refused whole, none of it yielded.
        n = self.node(lambda req, node: {
            "variant": "Entries", "id": req["id"], "commit": 4,
            "entries": [{"index": 4, "data": b"ok"}, {"index": 5, "data": b"not committed"}]})
        with rc.Client([n.addr], 7, timeout=5) as c:
            t = c.tail(4)
            with self.assertRaisesRegex(rc.ProtocolError, "index 5 past the commit index 4"):
                next(t)

    def test_a_redirect_to_a_name_that_does_not_encode(self):
        # idna refuses an empty label: a connect failure like any other, not a UnicodeError.
        n = self.node(lambda req, node: {"variant": "Redirect", "id": req["id"],
                                         "leader": {"id": 2, "client_addr": "a..b:7600"}})
        with rc.Client([n.addr], 7, timeout=1, exactly_once=False) as c:
            with self.assertRaises(rc.DeadlineExceeded):
                c.append([b"x"])

    def test_timeouts_the_clock_cannot_take(self):
        for kw in ({"timeout": float("nan")}, {"timeout": 0}, {"timeout": 1e12},
                   {"connect_timeout": float("inf")}, {"request_timeout": -1}):
            with self.subTest(kw):
                with self.assertRaises(ValueError):
                    rc.Client(["127.0.0.1:1"], 7, **kw)


if __name__ == "__main__":
    unittest.main()
