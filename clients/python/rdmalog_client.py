"""Python client for the rdmalog client protocol (protocol version 4).

Written from docs/PROTOCOL.md alone. Standard library only (Python 3.11).

Two layers:

* The codec: sections 2-5 of the document. Messages are plain dicts in the
  JSON form of section 9, except that byte strings (``Append.entries[i]``,
  ``AppendIf.entries[i]``, ``AppendInSession.entries[i]``, ``Entry.data``)
  are ``bytes`` instead of hex strings and the tuples of
  ``NodeStatus.peers`` are Python tuples instead of lists. ``to_json_form`` /
  ``from_json_form`` convert between that in-memory form and the JSON form.
  An enum with fields (``ReadConsistency``) is, in memory as in JSON, a dict
  ``{"variant": "AtLeast", "0": 70000}`` / ``{"variant": "Linearizable"}``.

      encode_request(msg) -> body            decode_request(body) -> msg
      encode_response(msg) -> body           decode_response(body) -> msg
      encode_frame(msg, kind) -> frame       decode_frame(frame, kind) -> msg
      read_frame(stream, max_frame_bytes) -> body
      write_frame(stream, body, max_frame_bytes)

* ``Client``: section 7 of the document (hello/welcome, learning the leader,
  following Redirect, retrying with backoff, an overall deadline per call).
  ``Client.read(from_index, max_bytes, consistency=...)`` reads with one of the
  consistencies of section 6.2 (``"local"``, ``"linearizable"``, at least an index).
  ``Client.append_if(entries, expected_last)`` appends only if the log ends at
  ``expected_last`` (section 6.1), else raises ``ConditionFailed``.
  ``Client.append(entries)`` is exactly once by default (``exactly_once=True``,
  section 7 step 7a): it appends through a session (``OpenSession``,
  ``AppendInSession``), so resending a batch never appends it twice.
"""

from __future__ import annotations

import json
import random
import select
import socket
import ssl
import struct
import time
from typing import Any, Callable, Iterator, Optional

__all__ = [
    "PROTOCOL_VERSION", "MIN_PROTOCOL_VERSION", "DEFAULT_MAX_FRAME_BYTES",
    "MIN_FRAME_LIMIT", "MAX_FRAME_LIMIT", "MAX_BATCH_ENTRIES", "DEFAULT_MAX_ENTRY_BYTES",
    "ROLES", "ERROR_CODES", "READ_CONSISTENCIES", "REQUEST_VARIANTS", "RESPONSE_VARIANTS",
    "RdmalogError", "ProtocolError", "ServerError", "ClientError", "DeadlineExceeded",
    "TailTimeout", "ConditionFailed",
    "encode_varint", "decode_varint", "encode_request", "decode_request",
    "encode_response", "decode_response", "encode_message", "decode_message",
    "encode_frame", "decode_frame", "read_frame", "write_frame",
    "to_json_form", "from_json_form", "parse_addr", "read_consistency", "Client",
]

# --------------------------------------------------------------------------
# Constants (sections 0 and 2)
# --------------------------------------------------------------------------

PROTOCOL_VERSION = 4
MIN_PROTOCOL_VERSION = 1
DEFAULT_MAX_FRAME_BYTES = 16 * 1024 * 1024  # 16777216
MIN_FRAME_LIMIT = 1024
MAX_FRAME_LIMIT = 64 * 1024 * 1024  # 67108864
MAX_BATCH_ENTRIES = 4096
U64_MAX = (1 << 64) - 1
# Most members a Status answer may list (a longer list is no real cluster's).
MAX_MEMBERS = 1024
# The most entries an Entries frame can hold (PROTOCOL.md 6.2, clamp): the server counts each
# as its payload plus 18 bytes against at most 16 MiB - 32. A frame of more is a protocol
# violation, refused before it is decoded (each entry would cost ~100 times its wire bytes).
MAX_FRAME_ENTRIES = (16 * 1024 * 1024 - 32) // 18
# The longest timeout a Client takes (as the Rust client).
MAX_TIMEOUT = 365 * 86400.0
DEFAULT_MAX_ENTRY_BYTES = 65536  # the replica's default; servers may differ


# --------------------------------------------------------------------------
# Exceptions
# --------------------------------------------------------------------------

class RdmalogError(Exception):
    """Base class of every error this module raises.

    ``maybe_committed``: set on the error of an exactly-once append (``Client``
    with ``exactly_once=True``, the default): True when some of the batch's
    entries may be in the log (a send's outcome is unknown, or the server said
    so), False when none is. None where the client does not say (every other
    call, and appends without a session). ``ConditionFailed`` has its own.
    """

    maybe_committed: Optional[bool] = None


class ProtocolError(RdmalogError):
    """A frame or body that does not decode, or a protocol violation by the peer
    (wrong response kind or id, oversized frame, ...)."""


class ServerError(RdmalogError):
    """The server answered ``Error { id, code, message }`` and the client gives up.

    ``code`` is the ErrorCode name (``"WrongCluster"``, ``"Timeout"``, ...),
    ``message`` the server's sentence (for people; do not parse it),
    ``id`` the request id or None for a connection-level error.
    """

    def __init__(self, code: str, message: str, id: Optional[int] = None):
        self.code = code
        self.message = message
        self.id = id
        # For Append: the indexes of the entries committed before the failure
        # (a PartlyAppended prefix), in entry order. Empty otherwise.
        self.committed: list[int] = []
        super().__init__(f"{code}: {message}")


class ClientError(RdmalogError):
    """A failure detected by the client itself (refused locally, unreachable...).

    ``code`` is an ErrorCode name when the local refusal mirrors one
    (``"TooLarge"``, ``"EntryTooLarge"``), else None.
    """

    def __init__(self, message: str, code: Optional[str] = None):
        self.code = code
        self.message = message
        self.committed: list[int] = []
        super().__init__(message if code is None else f"{code}: {message}")


class DeadlineExceeded(ClientError):
    """The call's deadline passed; ``last_failure`` is what went wrong last."""

    def __init__(self, message: str, last_failure: Optional[BaseException] = None):
        self.last_failure = last_failure
        if last_failure is not None:
            message = f"{message} (last failure: {last_failure!r})"
        super().__init__(message)


class TailTimeout(ClientError):
    """``tail(..., wait_timeout=t)``: no entry arrived within ``t`` seconds."""


class ConditionFailed(RdmalogError):
    """``append_if``: the server answered ``ConditionFailed { id, last }``: the
    leader's log did not end at ``expected`` when it ordered the batch, so
    nothing of that request was appended (PROTOCOL.md 6.1).

    ``expected``: the end that request expected (the caller's ``expected_last``,
    or, after a ``PartlyAppended``, the last index of the committed prefix: see
    ``committed``). ``last``: the log's actual end, as the leader reported it
    (raft's own entries included). ``id``: the request id of the answer.
    ``committed``: indexes of a prefix of the batch committed before (a
    ``PartlyAppended``), else empty. ``maybe_committed``: True when the request
    had been sent before with an unknown outcome (broken connection, no answer,
    ``ShuttingDown``) and then resent: the failed condition may then be the
    first send's own entries, so the batch may be in the log after all; read
    from ``expected + 1`` to see. False: that request appended nothing.
    """

    def __init__(self, expected: int, last: int, *, id: Optional[int] = None,
                 maybe_committed: bool = False):
        self.expected = expected
        self.last = last
        self.id = id
        self.maybe_committed = maybe_committed
        self.committed: list[int] = []
        msg = f"condition failed: expected the log to end at {expected}, it ends at {last}"
        if maybe_committed:
            msg += " (after a resend: the first send may have committed)"
        super().__init__(msg)


# --------------------------------------------------------------------------
# 3.1 Varints
# --------------------------------------------------------------------------

_BITS = {"u16": 16, "u32": 32, "u64": 64}


def encode_varint(value: int, bits: int = 64) -> bytes:
    """Shortest-form varint of an unsigned integer of ``bits`` bits (16, 32, 64)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProtocolError(f"varint: not an integer: {value!r}")
    if value < 0 or value >= (1 << bits):
        raise ProtocolError(f"varint: {value} out of range for u{bits}")
    if value <= 250:
        return bytes((value,))
    if value <= 0xFFFF:
        return b"\xfb" + struct.pack("<H", value)
    if value <= 0xFFFFFFFF:
        return b"\xfc" + struct.pack("<I", value)
    return b"\xfd" + struct.pack("<Q", value)


class _Reader:
    """A cursor over a body; every read checks the bytes left."""

    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes):
        self.buf = memoryview(buf)
        self.pos = 0

    def left(self) -> int:
        return len(self.buf) - self.pos

    def take(self, n: int, what: str) -> bytes:
        if n > self.left():
            raise ProtocolError(
                f"truncated body: {what} needs {n} bytes at offset {self.pos}, "
                f"{self.left()} left")
        out = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return out

    def u8(self, what: str) -> int:
        return self.take(1, what)[0]

    def varint(self, bits: int, what: str) -> int:
        start = self.pos
        marker = self.u8(what)
        if marker <= 250:
            return marker
        if marker == 0xFB:
            value = struct.unpack("<H", self.take(2, what))[0]
            minimum = 251
        elif marker == 0xFC:
            if bits < 32:
                raise ProtocolError(f"{what}: varint marker 0xFC too wide for u{bits} at offset {start}")
            value = struct.unpack("<I", self.take(4, what))[0]
            minimum = 1 << 16
        elif marker == 0xFD:
            if bits < 64:
                raise ProtocolError(f"{what}: varint marker 0xFD too wide for u{bits} at offset {start}")
            value = struct.unpack("<Q", self.take(8, what))[0]
            minimum = 1 << 32
        else:  # 0xFE (u128, unused by the protocol) or 0xFF (invalid)
            raise ProtocolError(f"{what}: invalid varint marker 0x{marker:02X} for u{bits} at offset {start}")
        if value < minimum:
            raise ProtocolError(
                f"{what}: non-shortest varint at offset {start} "
                f"(marker 0x{marker:02X} for value {value})")
        return value


def _varint_len(value: int) -> int:
    """Bytes of the shortest varint of ``value`` (3.1)."""
    return 1 if value <= 250 else 3 if value <= 0xFFFF else 5 if value <= 0xFFFFFFFF else 9


def decode_varint(data: bytes, bits: int = 64) -> tuple[int, int]:
    """Decode one varint at the start of ``data``: returns (value, bytes used).
    Non-shortest forms and markers wider than the field are refused."""
    r = _Reader(data)
    v = r.varint(bits, f"u{bits}")
    return v, r.pos


# --------------------------------------------------------------------------
# Section 4 and 5: the schema
# --------------------------------------------------------------------------
# A type is one of the strings "bool", "u16", "u32", "u64", "str", "bytes",
# or a tuple ("opt", T), ("vec", T), ("tuple", (T, ...)), ("struct", Name),
# ("enum", Name) for an enum without fields, ("fenum", Name) for an enum with
# fields in some variant (its value is a dict {"variant": ..., "0": ...}).

def _opt(t):
    return ("opt", t)


def _vec(t):
    return ("vec", t)


ROLES = ["ReadOnly", "ReadWrite", "Admin"]

ERROR_CODES = [
    "Malformed", "TooLarge", "WrongVersion", "WrongCluster", "Unauthorized",
    "EntryTooLarge", "Timeout", "Compacted", "Busy", "ShuttingDown", "Internal",
    "NotCommitted", "UnknownSession", "SessionSequence", "SessionTooOld",
]

_ENUMS = {"Role": ROLES, "ErrorCode": ERROR_CODES}

# 4.4 (version 3): variants in index order, each with its unnamed fields, keyed
# "0", "1", ... as in the JSON form of section 9.
READ_CONSISTENCIES: list[tuple[str, list[tuple[str, Any]]]] = [
    ("Local", []),
    ("Linearizable", []),
    ("AtLeast", [("0", "u64")]),
]

_FENUMS = {"ReadConsistency": READ_CONSISTENCIES}
_FENUM_INDEX = {
    name: {vname: (i, fields) for i, (vname, fields) in enumerate(table)}
    for name, table in _FENUMS.items()
}

_STRUCTS: dict[str, list[tuple[str, Any]]] = {
    "NodeInfo": [("id", "u64"), ("client_addr", "str")],
    "Entry": [("index", "u64"), ("data", "bytes")],
    "NodeStatus": [
        ("id", "u64"), ("role", "str"), ("term", "u64"), ("commit", "u64"),
        ("applied", "u64"), ("first_index", "u64"), ("last_index", "u64"),
        ("ring_used_bytes", "u64"), ("ring_bytes", "u64"), ("fenced_writes", "u64"),
        ("peers", _vec(("tuple", ("u64", "u64", "str")))),
    ],
}

_NODE_INFO = ("struct", "NodeInfo")

REQUEST_VARIANTS: list[tuple[str, list[tuple[str, Any]]]] = [
    ("Hello", [("version", "u16"), ("cluster_id", "u64"), ("token", _opt("str"))]),
    ("Append", [("id", "u64"), ("entries", _vec("bytes"))]),
    ("Read", [("id", "u64"), ("from", "u64"), ("max_bytes", "u32")]),
    ("Tail", [("id", "u64"), ("from", "u64")]),
    ("Status", [("id", "u64")]),
    ("Members", [("id", "u64"), ("add", "bool"), ("node", "u64")]),
    ("ReadWith", [("id", "u64"), ("from", "u64"), ("max_bytes", "u32"),
                  ("consistency", ("fenum", "ReadConsistency"))]),
    ("AppendIf", [("id", "u64"), ("expected_last", "u64"), ("entries", _vec("bytes"))]),
    ("OpenSession", [("id", "u64")]),
    ("AppendInSession", [("id", "u64"), ("session", "u64"), ("first_seq", "u64"),
                         ("entries", _vec("bytes"))]),
    ("Trim", [("id", "u64"), ("index", "u64")]),
]

RESPONSE_VARIANTS: list[tuple[str, list[tuple[str, Any]]]] = [
    ("Welcome", [("node_id", "u64"), ("leader", _opt(_NODE_INFO)), ("role", ("enum", "Role"))]),
    ("Appended", [("id", "u64"), ("first", "u64"), ("last", "u64")]),
    ("Entries", [("id", "u64"), ("commit", "u64"), ("entries", _vec(("struct", "Entry")))]),
    ("Status", [("id", "u64"), ("node", ("struct", "NodeStatus")),
                ("leader", _opt(_NODE_INFO)), ("members", _vec(_NODE_INFO))]),
    ("MembershipChanged", [("id", "u64"), ("index", "u64")]),
    ("Redirect", [("id", "u64"), ("leader", _opt(_NODE_INFO))]),
    ("Error", [("id", _opt("u64")), ("code", ("enum", "ErrorCode")), ("message", "str")]),
    ("PartlyAppended", [("id", "u64"), ("first", "u64"), ("last", "u64")]),
    ("ConditionFailed", [("id", "u64"), ("last", "u64")]),
    ("SessionOpened", [("id", "u64"), ("session", "u64")]),
    ("AppendedAt", [("id", "u64"), ("indexes", _vec("u64"))]),
    ("Trimmed", [("id", "u64"), ("first_index", "u64")]),
]

_VARIANTS = {"request": REQUEST_VARIANTS, "response": RESPONSE_VARIANTS}
_VARIANT_INDEX = {
    kind: {name: (i, fields) for i, (name, fields) in enumerate(table)}
    for kind, table in _VARIANTS.items()
}


# --------------------------------------------------------------------------
# 3.2 Encoding of values
# --------------------------------------------------------------------------

def _enc(t, v, out: bytearray, path: str) -> None:
    if isinstance(t, str):
        if t in _BITS:
            out += encode_varint(v, _BITS[t])
        elif t == "bool":
            if not isinstance(v, bool):
                raise ProtocolError(f"{path}: expected bool, got {v!r}")
            out.append(1 if v else 0)
        elif t == "str":
            if not isinstance(v, str):
                raise ProtocolError(f"{path}: expected str, got {type(v).__name__}")
            try:
                raw = v.encode("utf-8")
            except UnicodeEncodeError as e:  # lone surrogates
                raise ProtocolError(f"{path}: string is not valid UTF-8: {e}") from None
            out += encode_varint(len(raw), 64)
            out += raw
        elif t == "bytes":
            if not isinstance(v, (bytes, bytearray, memoryview)):
                raise ProtocolError(f"{path}: expected bytes, got {type(v).__name__}")
            raw = bytes(v)
            out += encode_varint(len(raw), 64)
            out += raw
        else:  # pragma: no cover - schema bug
            raise AssertionError(t)
        return
    tag = t[0]
    if tag == "opt":
        if v is None:
            out.append(0)
        else:
            out.append(1)
            _enc(t[1], v, out, path)
    elif tag == "vec":
        if not isinstance(v, (list, tuple)):
            raise ProtocolError(f"{path}: expected a list, got {type(v).__name__}")
        out += encode_varint(len(v), 64)
        for i, item in enumerate(v):
            _enc(t[1], item, out, f"{path}[{i}]")
    elif tag == "tuple":
        if not isinstance(v, (list, tuple)) or len(v) != len(t[1]):
            raise ProtocolError(f"{path}: expected a tuple of {len(t[1])}, got {v!r}")
        for i, (et, item) in enumerate(zip(t[1], v)):
            _enc(et, item, out, f"{path}[{i}]")
    elif tag == "struct":
        _enc_fields(_STRUCTS[t[1]], v, out, path, t[1])
    elif tag == "enum":
        names = _ENUMS[t[1]]
        if v not in names:
            raise ProtocolError(f"{path}: unknown {t[1]} {v!r}")
        out += encode_varint(names.index(v), 32)
    elif tag == "fenum":
        index, fields = _fenum_variant(t[1], v, path)
        out += encode_varint(index, 32)
        _enc_fields(fields, v, out, path, f"{t[1]}::{v['variant']}", extra=("variant",))
    else:  # pragma: no cover
        raise AssertionError(t)


def _fenum_variant(enum: str, v, path: str):
    """(index, fields) of the variant that the dict ``v`` names."""
    if not isinstance(v, dict) or "variant" not in v:
        raise ProtocolError(f"{path}: a {enum} is a dict with a 'variant' key, got {v!r}")
    try:
        return _FENUM_INDEX[enum][v["variant"]]
    except (KeyError, TypeError):
        raise ProtocolError(f"{path}: unknown {enum} variant {v['variant']!r}") from None


def _enc_fields(fields, obj, out: bytearray, path: str, what: str, extra=()) -> None:
    if not isinstance(obj, dict):
        raise ProtocolError(f"{path}: expected a dict for {what}, got {type(obj).__name__}")
    want = {name for name, _ in fields} | set(extra)
    have = set(obj)
    if have != want:
        missing = sorted(want - have)
        unknown = sorted(have - want)
        raise ProtocolError(f"{path}: {what}: missing fields {missing}, unknown fields {unknown}")
    for name, ft in fields:
        _enc(ft, obj[name], out, f"{path}.{name}")


def encode_message(msg: dict, kind: str) -> bytes:
    """Encode a Request (``kind="request"``) or Response (``"response"``) body."""
    if kind not in _VARIANT_INDEX:
        raise ValueError(f"kind must be 'request' or 'response', not {kind!r}")
    if not isinstance(msg, dict) or "variant" not in msg:
        raise ProtocolError(f"a message is a dict with a 'variant' key, got {msg!r}")
    name = msg["variant"]
    try:
        index, fields = _VARIANT_INDEX[kind][name]
    except (KeyError, TypeError):
        raise ProtocolError(f"unknown {kind} variant {name!r}") from None
    out = bytearray(encode_varint(index, 32))
    _enc_fields(fields, msg, out, name, name, extra=("variant",))
    return bytes(out)


def encode_request(msg: dict) -> bytes:
    return encode_message(msg, "request")


def encode_response(msg: dict) -> bytes:
    return encode_message(msg, "response")


# --------------------------------------------------------------------------
# 3.2 Decoding of values
# --------------------------------------------------------------------------

def _dec(t, r: _Reader, path: str):
    if isinstance(t, str):
        if t in _BITS:
            return r.varint(_BITS[t], path)
        if t == "bool":
            b = r.u8(path)
            if b > 1:
                raise ProtocolError(f"{path}: invalid bool byte 0x{b:02X}")
            return b == 1
        if t == "str":
            n = r.varint(64, path + " length")
            raw = r.take(n, path)
            try:
                return raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ProtocolError(f"{path}: invalid UTF-8: {e}") from None
        if t == "bytes":
            n = r.varint(64, path + " length")
            return r.take(n, path)
        raise AssertionError(t)  # pragma: no cover
    tag = t[0]
    if tag == "opt":
        b = r.u8(path)
        if b == 0:
            return None
        if b == 1:
            return _dec(t[1], r, path)
        raise ProtocolError(f"{path}: invalid Option tag 0x{b:02X}")
    if tag == "vec":
        n = r.varint(64, path + " count")
        # Every element takes at least one byte: never trust a count beyond that.
        if n > r.left():
            raise ProtocolError(
                f"truncated body: {path} claims {n} elements, {r.left()} bytes left")
        if t[1] == ("struct", "Entry") and n > MAX_FRAME_ENTRIES:
            raise ProtocolError(
                f"{path} claims {n} entries; a frame holds at most {MAX_FRAME_ENTRIES}")
        return [_dec(t[1], r, f"{path}[{i}]") for i in range(n)]
    if tag == "tuple":
        return tuple(_dec(et, r, f"{path}[{i}]") for i, et in enumerate(t[1]))
    if tag == "struct":
        return {name: _dec(ft, r, f"{path}.{name}") for name, ft in _STRUCTS[t[1]]}
    if tag == "enum":
        names = _ENUMS[t[1]]
        i = r.varint(32, path)
        if i >= len(names):
            raise ProtocolError(f"{path}: unknown {t[1]} variant index {i}")
        return names[i]
    if tag == "fenum":
        table = _FENUMS[t[1]]
        i = r.varint(32, path)
        if i >= len(table):
            raise ProtocolError(f"{path}: unknown {t[1]} variant index {i}")
        vname, fields = table[i]
        out: dict[str, Any] = {"variant": vname}
        for fname, ft in fields:
            out[fname] = _dec(ft, r, f"{path}.{fname}")
        return out
    raise AssertionError(t)  # pragma: no cover


def decode_message(body: bytes, kind: str) -> dict:
    """Decode one whole body; trailing bytes, truncation, non-shortest varints,
    unknown variants and invalid UTF-8 raise ProtocolError."""
    if kind not in _VARIANTS:
        raise ValueError(f"kind must be 'request' or 'response', not {kind!r}")
    if len(body) == 0:
        raise ProtocolError("empty body (len = 0)")
    r = _Reader(body)
    table = _VARIANTS[kind]
    index = r.varint(32, f"{kind} variant")
    if index >= len(table):
        raise ProtocolError(f"unknown {kind} variant index {index}")
    name, fields = table[index]
    msg: dict[str, Any] = {"variant": name}
    for fname, ft in fields:
        msg[fname] = _dec(ft, r, f"{name}.{fname}")
    if r.left():
        raise ProtocolError(f"{r.left()} trailing byte(s) after a {name} {kind}")
    return msg


def decode_request(body: bytes) -> dict:
    return decode_message(body, "request")


def decode_response(body: bytes) -> dict:
    return decode_message(body, "response")


# --------------------------------------------------------------------------
# Section 2: frames
# --------------------------------------------------------------------------

def _check_timeout(name: str, value: float) -> float:
    t = float(value)
    if not (0 < t <= MAX_TIMEOUT):  # also refuses NaN
        raise ValueError(f"{name} must be positive and at most 365 days, not {value!r}")
    return t


def _check_limit(max_frame_bytes: int) -> int:
    if not (MIN_FRAME_LIMIT <= max_frame_bytes <= MAX_FRAME_LIMIT):
        raise ValueError(
            f"max_frame_bytes must be in {MIN_FRAME_LIMIT}..={MAX_FRAME_LIMIT}, "
            f"not {max_frame_bytes}")
    return max_frame_bytes


def encode_frame(msg: dict, kind: str, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> bytes:
    body = encode_message(msg, kind)
    if len(body) > max_frame_bytes:
        raise ClientError(
            f"a {msg.get('variant')} of {len(body)} bytes exceeds the frame limit "
            f"{max_frame_bytes}", code="TooLarge")
    return struct.pack("<I", len(body)) + body


def decode_frame(frame: bytes, kind: str, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> dict:
    """Decode one whole frame (prefix included); the frame must be exactly one frame."""
    if len(frame) < 4:
        raise ProtocolError(f"truncated frame: {len(frame)} bytes, no whole length prefix")
    (n,) = struct.unpack_from("<I", frame)
    if n > max_frame_bytes:
        raise ProtocolError(f"frame length {n} exceeds the limit {max_frame_bytes}")
    if len(frame) - 4 < n:
        raise ProtocolError(f"truncated frame: length says {n}, {len(frame) - 4} bytes follow")
    if len(frame) - 4 > n:
        raise ProtocolError(f"{len(frame) - 4 - n} trailing byte(s) after the frame")
    return decode_message(frame[4:], kind)


class ConnectionClosed(RdmalogError):
    """The peer closed the stream (at a frame boundary or inside a frame)."""


def _read_exact(stream, n: int, what: str) -> bytes:
    parts = []
    got = 0
    while got < n:
        chunk = stream.read(n - got)
        if not chunk:
            if got == 0 and what == "length prefix":
                raise ConnectionClosed("connection closed by the peer")
            raise ConnectionClosed(f"connection closed inside a frame ({what}: {got} of {n} bytes)")
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


def read_frame(stream, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
               sniff_tls: bool = False) -> bytes:
    """Read one frame from ``stream`` (anything with ``read(n)``) and return its body.

    The length is checked against ``max_frame_bytes`` before any byte of the
    body is read. ``sniff_tls``: refuse a TLS record header (``0x15``/``0x16``
    then ``0x03``), which is what a TLS port sends to a plaintext client.
    """
    head = _read_exact(stream, 4, "length prefix")
    if sniff_tls and head[0] in (0x15, 0x16) and head[1] == 0x03:
        raise ProtocolError("the server requires TLS (it answered with a TLS record)")
    (n,) = struct.unpack("<I", head)
    if n == 0:
        raise ProtocolError("malformed frame: len = 0")
    if n > max_frame_bytes:
        raise ProtocolError(f"frame length {n} exceeds the limit {max_frame_bytes}; body not read")
    return _read_exact(stream, n, "body")


def write_frame(stream, body: bytes, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
    """Write one frame to ``stream`` (``sendall`` or ``write``)."""
    if len(body) > max_frame_bytes:
        raise ClientError(f"frame of {len(body)} bytes exceeds the limit {max_frame_bytes}",
                          code="TooLarge")
    frame = struct.pack("<I", len(body)) + body
    if hasattr(stream, "sendall"):
        stream.sendall(frame)
    else:
        stream.write(frame)


# --------------------------------------------------------------------------
# Section 9: JSON form
# --------------------------------------------------------------------------

def _infer_kind(obj: dict) -> str:
    name = obj.get("variant")
    in_req = name in _VARIANT_INDEX["request"]
    in_resp = name in _VARIANT_INDEX["response"]
    if in_req and in_resp:  # "Status": the response has a "node"
        return "response" if "node" in obj else "request"
    if in_req:
        return "request"
    if in_resp:
        return "response"
    raise ProtocolError(f"unknown variant {name!r}")


def _conv(t, v, to_json: bool, path: str):
    if isinstance(t, str):
        if t == "bytes":
            if to_json:
                if not isinstance(v, (bytes, bytearray, memoryview)):
                    raise ProtocolError(f"{path}: expected bytes, got {type(v).__name__}")
                return bytes(v).hex()
            if not isinstance(v, str):
                raise ProtocolError(f"{path}: expected a hex string, got {v!r}")
            try:
                return bytes.fromhex(v)
            except ValueError:
                raise ProtocolError(f"{path}: invalid hex string {v!r}") from None
        return v
    tag = t[0]
    if tag == "opt":
        return None if v is None else _conv(t[1], v, to_json, path)
    if tag == "vec":
        if not isinstance(v, (list, tuple)):
            raise ProtocolError(f"{path}: expected a list, got {v!r}")
        return [_conv(t[1], x, to_json, f"{path}[{i}]") for i, x in enumerate(v)]
    if tag == "tuple":
        if not isinstance(v, (list, tuple)) or len(v) != len(t[1]):
            raise ProtocolError(f"{path}: expected {len(t[1])} items, got {v!r}")
        items = [_conv(et, x, to_json, f"{path}[{i}]") for i, (et, x) in enumerate(zip(t[1], v))]
        return items if to_json else tuple(items)
    if tag == "struct":
        return _conv_fields(_STRUCTS[t[1]], v, to_json, path)
    if tag == "fenum":
        _, fields = _fenum_variant(t[1], v, path)
        return _conv_fields(fields, v, to_json, path)
    return v  # enum name


def _conv_fields(fields, obj, to_json: bool, path: str) -> dict:
    if not isinstance(obj, dict):
        raise ProtocolError(f"{path}: expected an object, got {obj!r}")
    out = dict(obj)
    for name, ft in fields:
        if name in obj:
            out[name] = _conv(ft, obj[name], to_json, f"{path}.{name}")
    return out


def to_json_form(msg: dict, kind: Optional[str] = None) -> dict:
    """In-memory message (bytes) -> JSON form of section 9 (hex strings, lists)."""
    kind = kind or _infer_kind(msg)
    _, fields = _VARIANT_INDEX[kind][msg["variant"]]
    return _conv_fields(fields, msg, True, msg["variant"])


def from_json_form(obj: dict, kind: Optional[str] = None) -> dict:
    """JSON form of section 9 -> in-memory message (bytes, tuples)."""
    kind = kind or _infer_kind(obj)
    try:
        _, fields = _VARIANT_INDEX[kind][obj["variant"]]
    except KeyError:
        raise ProtocolError(f"unknown {kind} variant {obj.get('variant')!r}") from None
    return _conv_fields(fields, obj, False, obj["variant"])


# --------------------------------------------------------------------------
# Section 7: the client
# --------------------------------------------------------------------------

def parse_addr(addr: str) -> tuple[str, int]:
    """``host:port`` -> (host, port); ``[v6]:port`` -> (v6, port)."""
    addr = addr.strip()
    if addr.startswith("["):
        end = addr.find("]")
        if end < 0 or not addr[end + 1:].startswith(":"):
            raise ValueError(f"bad address {addr!r}: expected [v6]:port")
        host, port = addr[1:end], addr[end + 2:]
    else:
        host, sep, port = addr.rpartition(":")
        if not sep or not host or ":" in host:
            raise ValueError(f"bad address {addr!r}: expected host:port or [v6]:port")
    try:
        p = int(port, 10)
    except ValueError:
        raise ValueError(f"bad port in address {addr!r}") from None
    if not 0 < p < 65536:
        raise ValueError(f"bad port in address {addr!r}")
    return host, p


# Codes after which the Rust client closes, backs off and retries (7.4).
_RETRY_CODES = {"Busy", "ShuttingDown", "NotCommitted"}

_MAX_REDIRECTS = 4  # 7.3: at most 4 redirects in a row; the fifth counts as "no leader"
_MIN_ATTEMPT = 0.5  # 7.2: the least a connection attempt gets while others wait their turn

# Which responses may answer which request (section 5.2), Error aside.
_ANSWERS = {
    "Append": {"Appended", "PartlyAppended", "Redirect"},
    # 5.2/6.1: every answer an Append gets answers an AppendIf the same way.
    "AppendIf": {"Appended", "PartlyAppended", "Redirect", "ConditionFailed"},
    "Read": {"Entries"},
    "ReadWith": {"Entries"},   # and Redirect, for Linearizable only (see Client.read)
    "Status": {"Status"},
    "Members": {"MembershipChanged", "Redirect"},
    # Version 4 (6.1, 7a): a session's requests go to the leader, as appends do.
    "OpenSession": {"SessionOpened", "Redirect"},
    "AppendInSession": {"AppendedAt", "Redirect"},
    # 6.7: an operator's trim, answered by the node it was sent to.
    "Trim": {"Trimmed"},
}

# Answers to an AppendInSession after which that send certainly appended
# nothing (4.3); any other (a broken connection, no answer, Timeout,
# NotCommitted, which in a session may follow a partial commit, SessionTooOld,
# ...) may leave some of the batch in the log. Redirect appends nothing either.
_SESSION_NOTHING_APPENDED = {"UnknownSession", "SessionSequence", "EntryTooLarge",
                             "Unauthorized"}


def read_consistency(consistency: Any = None) -> dict:
    """Normalise what ``Client.read(consistency=...)`` accepts into a
    ``ReadConsistency`` (4.4) in its dict form:

    * ``None`` or ``"local"``: ``{"variant": "Local"}`` (the default);
    * ``"linearizable"``: ``{"variant": "Linearizable"}``;
    * ``("at_least", i)`` or a plain int ``i``: ``{"variant": "AtLeast", "0": i}``;
    * a dict already in that form (validated and copied).

    The variant names themselves (``"Local"``, ``"Linearizable"``) are accepted
    too. Anything else raises ValueError.
    """
    if consistency is None:
        return {"variant": "Local"}
    if isinstance(consistency, str):
        name = consistency.strip().lower()
        if name == "local":
            return {"variant": "Local"}
        if name == "linearizable":
            return {"variant": "Linearizable"}
        raise ValueError(f"unknown read consistency {consistency!r} "
                         "(expected 'local', 'linearizable', ('at_least', index) or an index)")
    if isinstance(consistency, tuple) and len(consistency) == 2 \
            and isinstance(consistency[0], str) \
            and consistency[0].strip().lower() in ("at_least", "atleast"):
        consistency = consistency[1]
    if isinstance(consistency, int) and not isinstance(consistency, bool):
        if not 0 <= consistency < (1 << 64):
            raise ValueError(f"an AtLeast index is a u64, not {consistency}")
        return {"variant": "AtLeast", "0": consistency}
    if isinstance(consistency, dict):
        try:
            encode_request({"variant": "ReadWith", "id": 0, "from": 0, "max_bytes": 0,
                            "consistency": consistency})
        except ProtocolError as e:
            raise ValueError(f"invalid ReadConsistency {consistency!r}: {e}") from None
        return dict(consistency)
    raise ValueError(f"unknown read consistency {consistency!r} "
                     "(expected 'local', 'linearizable', ('at_least', index) or an index)")


class _Sends:
    """What ``Client._call`` tells its caller about the sends of one request:
    ``sent`` counts the frames sent (resends included); ``unknown`` counts the
    sends whose outcome is unknown (the connection broke or no answer came,
    ``ShuttingDown``), after which the request was resent or given up;
    ``redirected`` counts the sends answered ``Redirect`` (nothing proposed)."""

    __slots__ = ("sent", "unknown", "redirected")

    def __init__(self) -> None:
        self.sent = 0
        self.unknown = 0
        self.redirected = 0


class _Retry(Exception):
    """Internal: a failure after which the call backs off and retries."""

    def __init__(self, cause: BaseException | str, backoff: bool = True):
        self.cause = cause
        self.backoff = backoff
        super().__init__(str(cause))


class _Backoff:
    """7.4: the step starts at 20 ms and doubles up to 1 s; each wait is uniform
    in [step/2, step], cut at the deadline."""

    def __init__(self) -> None:
        self.step = 0.020

    def wait(self, deadline: float) -> None:
        delay = random.uniform(self.step / 2, self.step)
        delay = min(delay, max(0.0, deadline - time.monotonic()))
        if delay > 0:
            time.sleep(delay)
        self.step = min(self.step * 2, 1.0)


# TCP keepalive as the Rust client and the server set it (proto::KEEPALIVE): probes after
# 10 s of silence, every 5 s, 3 unanswered. The kernel's defaults (2 hours of silence) left a
# tail on a member whose machine died waiting for hours.
KEEPALIVE_IDLE_S, KEEPALIVE_INTERVAL_S, KEEPALIVE_PROBES = 10, 5, 3


def _set_keepalive(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", KEEPALIVE_IDLE_S), ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL_S),
                        ("TCP_KEEPCNT", KEEPALIVE_PROBES)):
        if hasattr(socket, name):  # Linux; elsewhere the system's defaults stay
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


class _Conn:
    """One connection: a socket (maybe TLS) and a read buffer."""

    def __init__(self, sock: socket.socket, addr: str, tls: bool, max_frame_bytes: int):
        self.sock = sock
        self.addr = addr
        self.tls = tls
        self.max_frame_bytes = max_frame_bytes
        self.buf = bytearray()
        self.frames_read = 0
        self.welcome: Optional[dict] = None
        self.last_used = time.monotonic()
        # When the frame being read must have arrived (None: wait for ever, a tail's wait).
        self.deadline: Optional[float] = None

    # read(n): up to n bytes, b"" at EOF (the interface read_frame expects). Each socket read
    # gets what is left until the frame's deadline, not the whole timeout again: a server
    # trickling a frame a byte at a time held a call for as long as the frame took.
    def read(self, n: int) -> bytes:
        if not self.buf:
            if self.deadline is not None:
                left = self.deadline - time.monotonic()
                if left <= 0:
                    raise socket.timeout("timed out")
                self.sock.settimeout(left)
            chunk = self.sock.recv(min(max(n, 65536), 1 << 20))
            if not chunk:
                return b""
            self.buf += chunk
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def send(self, msg: dict, timeout: float) -> None:
        frame = encode_frame(msg, "request", self.max_frame_bytes)
        self.sock.settimeout(max(timeout, 0.001))
        self.sock.sendall(frame)

    def recv(self, timeout: Optional[float]) -> dict:
        self.sock.settimeout(None if timeout is None else max(timeout, 0.001))
        self.deadline = None if timeout is None else time.monotonic() + max(timeout, 0.001)
        try:
            body = read_frame(self, self.max_frame_bytes,
                              sniff_tls=(not self.tls and self.frames_read == 0))
        finally:
            self.deadline = None
        self.frames_read += 1
        self.last_used = time.monotonic()
        return decode_response(body)

    def stale(self) -> bool:
        """True when something arrived unasked (only a connection-level Error or
        a close can: an idle close, a shutdown) or the socket is closed."""
        if self.buf:
            return True
        if isinstance(self.sock, ssl.SSLSocket) and self.sock.pending():
            return True
        try:
            readable, _, _ = select.select([self.sock], [], [], 0)
        except (OSError, ValueError):
            return True
        if not readable:
            return False
        prev = self.sock.gettimeout()
        try:
            self.sock.setblocking(False)
            data = self.sock.recv(65536)
        except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
            return False  # e.g. TLS 1.3 session tickets: no application data
        except OSError:
            return True
        finally:
            try:
                self.sock.settimeout(prev)
            except OSError:
                pass
        if not data:
            return True
        self.buf += data
        return True

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class Client:
    """A client of an rdmalog cluster (section 7 of docs/PROTOCOL.md).

    ``servers``: ``host:port`` client addresses (more are learned from the
    cluster). ``timeout``: the deadline of each call, retries included (30 s,
    as the Rust client's: above the servers' default append_timeout of 10 s,
    so that a server's ``Timeout`` is seen and retried before it passes).
    ``connect_timeout`` (TCP, TLS and hello together) and ``request_timeout``
    (the wait for one answer; keep it above the servers' append_timeout) are
    cut at that deadline. Not thread-safe: use one Client per thread.

    ``exactly_once`` (default True; PROTOCOL.md 6.1 and 7 step 7a): ``append``
    goes through a session, opened on the leader before the first append
    (``OpenSession``); each batch is sent as ``AppendInSession`` with the
    session's next numbers and resent, the same request, after any failure
    until the deadline, and each entry is in the log once. ``self.session`` is
    ``(session id, next number)`` while one is open, else None. With False,
    appends are plain ``Append`` requests: at least once.
    """

    def __init__(self, servers: list[str], cluster_id: int, token: Optional[str] = None,
                 tls: bool = False, ca_file: Optional[str] = None,
                 cert_file: Optional[str] = None, key_file: Optional[str] = None,
                 server_name: Optional[str] = None, timeout: float = 30.0, *,
                 connect_timeout: float = 3.0, request_timeout: float = 15.0,
                 max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES, exactly_once: bool = True):
        if isinstance(servers, str):
            servers = [servers]
        addrs: list[str] = []
        for s in servers:
            parse_addr(s)  # validate now
            if s not in addrs:
                addrs.append(s)
        if not addrs:
            raise ValueError("at least one server address is needed")
        if isinstance(cluster_id, bool) or not isinstance(cluster_id, int) \
                or not 0 <= cluster_id < (1 << 64):
            raise ValueError(f"cluster_id must be a u64, not {cluster_id!r}")
        self.addrs = addrs
        self.cluster_id = cluster_id
        self.token = token
        self.timeout = _check_timeout("timeout", timeout)
        self.connect_timeout = _check_timeout("connect_timeout", connect_timeout)
        self.request_timeout = _check_timeout("request_timeout", request_timeout)
        self.max_frame_bytes = _check_limit(max_frame_bytes)
        self.exactly_once = bool(exactly_once)
        self.tls = tls
        self.server_name = server_name
        self._ssl_ctx: Optional[ssl.SSLContext] = None
        if tls:
            ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca_file)
            ctx.minimum_version = ssl.TLSVersion.TLSv1_2
            if cert_file:
                ctx.load_cert_chain(cert_file, key_file)
            self._ssl_ctx = ctx
        elif cert_file or key_file or ca_file:
            raise ValueError("ca_file/cert_file/key_file need tls=True")
        self._conn: Optional[_Conn] = None
        self._rotation = 0
        self._preferred: Optional[str] = None
        self._next_id = 1
        # Observable state (read-only for callers).
        self.role: Optional[str] = None          # role granted by the last Welcome
        self.node_id: Optional[int] = None       # node of the current connection
        self.leader: Optional[dict] = None       # last NodeInfo learned for the leader
        self.last_commit: Optional[int] = None   # commit of the last Read answer
        self.redirects_followed = 0              # Redirect{Some} followed so far
        self.connects = 0                        # connections opened (hello done)
        # The session appends go through (exactly_once): (session id, number of
        # its next entry), or None until the first append and after a failure.
        self.session: Optional[tuple[int, int]] = None

    # ---- context manager ------------------------------------------------

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection (there is no goodbye message)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # ---- addresses ------------------------------------------------------

    def _learn(self, info: Optional[dict]) -> Optional[str]:
        if not info:
            return None
        addr = info.get("client_addr")
        if not addr:
            return None
        try:
            parse_addr(addr)
        except ValueError:
            return None
        if addr not in self.addrs:
            self.addrs.append(addr)
        return addr

    def _pick_addr(self) -> str:
        if self._preferred is not None:
            addr, self._preferred = self._preferred, None
            return addr
        addr = self.addrs[self._rotation % len(self.addrs)]
        self._rotation += 1
        return addr

    def _new_id(self) -> int:
        i = self._next_id
        self._next_id = 1 if i >= (1 << 64) - 1 else i + 1
        return i

    # ---- connecting -----------------------------------------------------

    def _open(self, addr: str, deadline: float) -> _Conn:
        """Connect, TLS, hello. Raises _Retry for what 7.4 retries, else the error."""
        host, port = parse_addr(addr)
        budget_end = min(time.monotonic() + self.connect_timeout, deadline)

        def left() -> float:
            t = budget_end - time.monotonic()
            if t <= 0:
                raise _Retry(f"connect to {addr}: connect timeout")
            return t

        sock = None
        try:
            try:
                sock = socket.create_connection((host, port), timeout=left())
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                _set_keepalive(sock)
                if self._ssl_ctx is not None:
                    sock.settimeout(left())
                    # server_hostname drives both verification and SNI; Python
                    # sends no SNI for an IP address, as the document wants.
                    sock = self._ssl_ctx.wrap_socket(
                        sock, server_hostname=self.server_name or host)
            except ssl.SSLCertVerificationError as e:
                raise ClientError(f"TLS verification of {addr} failed: {e}") from e
            except (OSError, ssl.SSLError) as e:  # refused, unreachable, TLS transport
                raise _Retry(e) from e
            except UnicodeError as e:  # a host name that does not encode (idna)
                raise _Retry(f"{addr}: not a host name: {e}") from e
            conn = _Conn(sock, addr, self._ssl_ctx is not None, self.max_frame_bytes)
            hello = {"variant": "Hello", "version": PROTOCOL_VERSION,
                     "cluster_id": self.cluster_id, "token": self.token}
            try:
                conn.send(hello, left())
                resp = conn.recv(left())
            except (OSError, ConnectionClosed) as e:
                raise _Retry(f"hello to {addr}: {e!r}") from e
            if resp["variant"] == "Error":
                if resp["id"] is not None:
                    raise ProtocolError(f"hello to {addr}: an Error with id {resp['id']}")
                err = ServerError(resp["code"], resp["message"], None)
                if resp["code"] in _RETRY_CODES:
                    raise _Retry(err)
                raise err
            if resp["variant"] != "Welcome":
                raise ProtocolError(f"hello to {addr}: answered {resp['variant']}, not Welcome")
            conn.welcome = resp
            self.role = resp["role"]
            self.node_id = resp["node_id"]
            if resp["leader"] is not None:
                self.leader = resp["leader"]
                self._learn(resp["leader"])
            self.connects += 1
            sock = None  # owned by conn now
            return conn
        finally:
            if sock is not None:
                try:
                    sock.close()
                except OSError:
                    pass

    def _connect(self, deadline: float, backoff: _Backoff, failure: list) -> _Conn:
        """A new connection, retrying per 7.4 until the deadline."""
        tried: set = set()
        while True:
            now = time.monotonic()
            if now >= deadline:
                raise DeadlineExceeded("deadline passed while connecting",
                                       failure[0] if failure else None)
            preferred = self._preferred is not None
            addr = self._pick_addr()
            # A member that accepts and never answers must not take the whole deadline
            # from the others: an address of the rotation gets an even share of what is
            # left among those not tried yet (at least _MIN_ATTEMPT); the last of them
            # and a redirect's target get all of it (as the Rust client does).
            untried = sum(1 for a in self.addrs if a not in tried)
            tried.add(addr)
            left = deadline - now
            budget = left if preferred or untried <= 1 else \
                max(left / untried, min(left, _MIN_ATTEMPT))
            try:
                return self._open(addr, min(deadline, now + budget))
            except _Retry as r:
                failure[:] = [r.cause if isinstance(r.cause, BaseException)
                              else ClientError(str(r.cause))]
                backoff.wait(deadline)

    def _drop(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # ---- one call -------------------------------------------------------

    def _call(self, variant: str, fields: dict, deadline: float,
              answers: Optional[set] = None, retry_timeout: bool = False,
              sends: Optional[_Sends] = None) -> dict:
        """Send one request until it gets a final answer (not Redirect, not a
        retryable error) or the deadline passes; returns that answer.

        ``answers``: the response variants allowed (default ``_ANSWERS[variant]``).
        ``retry_timeout``: an ``Error { Timeout }`` is safe to resend (a
        ReadWith, 6.2, where nothing happened; an AppendInSession, 7a, which
        cannot append twice; an OpenSession): retry it like ``Busy`` while the
        deadline allows, and raise that ServerError itself if the deadline
        passes after it.
        ``sends``: filled in with what became of the sends (see _Sends)."""
        if sends is None:
            sends = _Sends()
        allowed = _ANSWERS[variant] if answers is None else answers
        backoff = _Backoff()
        failure: list = []   # [last failure]
        redirects = 0
        idle_retry_used = False
        while True:
            now = time.monotonic()
            if now >= deadline:
                last = failure[0] if failure else None
                if retry_timeout and isinstance(last, ServerError) and last.code == "Timeout":
                    raise last  # the consistency was not met in time; nothing was read
                raise DeadlineExceeded(f"{variant}: deadline passed", last)
            if self._conn is not None and self._conn.stale():
                # An idle close or a shutdown notice arrived while we were away.
                self._drop()
            reused = self._conn is not None
            if self._conn is None:
                self._conn = self._connect(deadline, backoff, failure)
            conn = self._conn
            idle_for = time.monotonic() - conn.last_used
            rid = self._new_id()
            req = {"variant": variant, "id": rid, **fields}
            try:
                wait = min(self.request_timeout, deadline - time.monotonic())
                sends.sent += 1
                try:
                    conn.send(req, wait)  # a TooLarge ClientError propagates (local refusal)
                except ClientError:
                    sends.sent -= 1
                    raise
                resp = conn.recv(min(self.request_timeout, deadline - time.monotonic()))
            except (OSError, ConnectionClosed) as e:
                # Broken connection or no answer in time: unknown outcome; the
                # Rust client resends (an Append may then apply twice).
                sends.unknown += 1
                self._drop()
                failure[:] = [e]
                redirects = 0
                backoff.wait(deadline)
                continue
            except ProtocolError:
                self._drop()
                raise
            if resp["variant"] == "Error":
                code = resp["code"]
                err = ServerError(code, resp["message"], resp["id"])
                if code == "ShuttingDown":
                    # 4.3: pending appends "may or may not have committed".
                    sends.unknown += 1
                if resp["id"] is None:
                    # Connection-level: the server closes the connection.
                    self._drop()
                    failure[:] = [err]
                    redirects = 0
                    if code in _RETRY_CODES:
                        backoff.wait(deadline)
                        continue
                    if code == "Malformed" and reused and idle_for >= 1.0 and not idle_retry_used:
                        # Most likely the idle close racing our request: reconnect.
                        idle_retry_used = True
                        continue
                    raise err
                if resp["id"] != rid:
                    self._drop()
                    raise ProtocolError(f"{variant} id {rid} answered by an Error with id {resp['id']}")
                if code in _RETRY_CODES or (retry_timeout and code == "Timeout"):
                    # A read's Timeout: this node could not meet the consistency
                    # in time (a lagging follower, a leader without its majority);
                    # nothing was read, so try again, on the next node in rotation.
                    self._drop()
                    failure[:] = [err]
                    redirects = 0
                    backoff.wait(deadline)
                    continue
                raise err
            if resp["variant"] not in allowed:
                self._drop()
                raise ProtocolError(f"{variant} answered by {resp['variant']}")
            if resp["id"] != rid:
                self._drop()
                raise ProtocolError(f"{variant} id {rid} answered with id {resp['id']}")
            if resp["variant"] == "Redirect":
                sends.redirected += 1
                self._drop()
                leader = resp["leader"]
                addr = self._learn(leader)
                if addr is not None and redirects < _MAX_REDIRECTS:
                    redirects += 1
                    self.redirects_followed += 1
                    self.leader = leader
                    self._preferred = addr
                    failure[:] = [ClientError(f"redirected to {addr}")]
                    continue  # at once, no backoff
                redirects = 0
                failure[:] = [ClientError("no leader known (election under way?)")]
                backoff.wait(deadline)
                continue
            return resp

    def _deadline(self) -> float:
        return time.monotonic() + self.timeout

    # ---- public API -----------------------------------------------------

    def append_indexed(self, entries: list[bytes]) -> list[int]:
        """Append ``entries`` as one batch; returns the log index of each entry,
        in order (increasing).

        With ``exactly_once`` (the default): through the session, see
        ``append_at``.

        Without: a plain ``Append``, at least once (a resend after a broken
        connection, no answer or ``ShuttingDown`` may append the batch twice).
        After ``PartlyAppended`` the rest is resent as a new Append, so the
        indexes are increasing but need not be consecutive. Raises ServerError
        (``code == "Timeout"``: the entries may still commit; not resent), and
        the exception's ``committed`` lists the indexes of the prefix already
        committed, if any.
        """
        batch = [bytes(e) for e in entries]
        variant = "AppendInSession" if self.exactly_once else "Append"
        if not batch or len(batch) > MAX_BATCH_ENTRIES:
            raise ClientError(f"an {variant} holds 1..={MAX_BATCH_ENTRIES} entries, not {len(batch)}",
                              code="EntryTooLarge")
        if self.exactly_once:
            return self._append_in_session(batch)
        deadline = self._deadline()
        indexes: list[int] = []
        rest = batch
        try:
            while rest:
                resp = self._call("Append", {"entries": rest}, deadline)
                first, last = resp["first"], resp["last"]
                k = last - first + 1
                if resp["variant"] == "Appended":
                    if k != len(rest) or first < 1:
                        raise ProtocolError(
                            f"Appended {first}..={last} for a batch of {len(rest)} entries")
                    indexes.extend(range(first, last + 1))
                    rest = []
                else:  # PartlyAppended: only entries[:k] committed; resend entries[k:]
                    # A prefix of at least one entry (none committed is NotCommitted, and
                    # resending the same batch at once would loop until the deadline).
                    if not 1 <= k < len(rest) or first < 1:
                        raise ProtocolError(
                            f"PartlyAppended {first}..={last} for a batch of {len(rest)} entries")
                    indexes.extend(range(first, last + 1))
                    rest = rest[k:]
        except RdmalogError as e:
            e.committed = list(indexes)  # type: ignore[attr-defined]
            raise
        return indexes

    def append_at(self, entries: list[bytes]) -> list[int]:
        """Append ``entries`` as one batch; returns each entry's log index, in
        order (the ``indexes`` of ``AppendedAt``). The same as ``append_indexed``.

        With ``exactly_once`` (the default; PROTOCOL.md 6.1, 7 step 7a): the
        first append opens a session on the leader (``OpenSession``, following
        ``Redirect``); each batch is sent as ``AppendInSession`` numbered
        ``first_seq ..= first_seq + len(entries) - 1``, the session's next
        numbers. After a broken connection, no answer, ``Busy``,
        ``ShuttingDown``, ``NotCommitted``, ``Redirect`` or ``Error{Timeout}``
        the same request (same session, same ``first_seq``, a new id) is resent,
        with backoff, until the call's deadline: each entry is in the log once.
        The indexes are consecutive unless a resend found the first entries
        already in the log.

        ``UnknownSession`` (the cluster expired the session) for a batch that
        no earlier send could have appended: a new session is opened and the
        batch sent there, once more. Any other failure raises, and drops the
        session (``self.session`` becomes None; the next append opens a new
        one, so that an unknown outcome never leaves a gap in a session's
        numbers). The exception's ``maybe_committed`` says whether some of the
        batch may be in the log (``UnknownSession`` after a resend,
        ``SessionTooOld``, a deadline passed after an unknown outcome, ...).
        """
        return self.append_indexed(entries)

    def append(self, entries: list[bytes]) -> tuple[int, int]:
        """Append ``entries``; returns (index of the first, index of the last).
        Consecutive unless a resend in the session found the first entries
        already in the log, or a PartlyAppended split the batch (without a
        session): ``append_at`` gives each entry's index."""
        idx = self.append_indexed(entries)
        return idx[0], idx[-1]

    def _open_session(self, deadline: float) -> int:
        """``OpenSession`` on the leader (following Redirect); returns its id.
        Every failure that ``_call`` retries is retried, ``Timeout`` included:
        at worst an extra session is opened, never an entry appended twice."""
        resp = self._call("OpenSession", {}, deadline, retry_timeout=True)
        return resp["session"]

    def _append_in_session(self, batch: list[bytes]) -> list[int]:
        """7a: ``batch`` (already checked for its count) through the session."""
        n = len(batch)
        # Refuse locally what no server takes (section 2), before a session is
        # opened or numbers are used: the body with the widest id, session and
        # first_seq (9 bytes each).
        body = 1 + 3 * 9 + _varint_len(n) + sum(_varint_len(len(e)) + len(e) for e in batch)
        if body > self.max_frame_bytes:
            raise ClientError(
                f"an AppendInSession of {n} entries takes up to {body} bytes, more than the "
                f"frame limit {self.max_frame_bytes}; send fewer or smaller entries",
                code="TooLarge")
        deadline = self._deadline()
        for fresh in (False, True):
            sends = _Sends()
            try:
                if self.session is None or fresh:
                    self.session = None
                    session, first_seq = self._open_session(deadline), 1
                else:
                    session, first_seq = self.session
                # Taken now: whatever becomes of this batch, its numbers are used.
                self.session = (session, first_seq + n)
                resp = self._call("AppendInSession",
                                  {"session": session, "first_seq": first_seq, "entries": batch},
                                  deadline, retry_timeout=True, sends=sends)
                indexes = list(resp["indexes"])
                if len(indexes) != n or indexes[0] < 1 \
                        or any(b <= a for a, b in zip(indexes, indexes[1:])):
                    raise ProtocolError(
                        f"AppendedAt {indexes} for a batch of {n} entries "
                        f"(one increasing index per entry, from 1, expected)")
                return indexes
            except BaseException as e:
                self.session = None
                if not isinstance(e, RdmalogError):
                    raise
                # Could a send of this batch, in this session, have appended some of it?
                settled = sends.redirected
                if isinstance(e, ServerError) and e.id is not None \
                        and e.code in _SESSION_NOTHING_APPENDED:
                    settled += 1  # the answer to the last send appended nothing
                maybe = sends.sent > settled
                if not fresh and not maybe and isinstance(e, ServerError) \
                        and e.code == "UnknownSession":
                    continue  # never sent before with that session: a new one, once
                e.maybe_committed = maybe
                raise
        raise AssertionError("unreachable: the second pass returns or raises")  # pragma: no cover

    def append_if(self, entries: list[bytes], expected_last: int) -> tuple[int, int]:
        """Append ``entries`` only if the log ends at ``expected_last``
        (``AppendIf``, protocol version 3, PROTOCOL.md 6.1); returns (index of
        the first, index of the last), always ``expected_last + 1`` and
        ``expected_last + len(entries)``: nothing came between the end the
        caller saw and the batch.

        The condition is the leader's last index, committed or not, raft's own
        entries (leader no-ops, membership changes) included, checked when the
        leader orders the batch. The end to expect is the ``commit`` of a read
        (``read(..., consistency="linearizable")`` sets ``self.last_commit``)
        while nothing else is in flight. A leader change adds the new leader's
        own entry, which fails the condition once.

        Raises ``ConditionFailed`` (``.expected``, ``.last``: the log's actual
        end) when the log did not end there: nothing of that request was
        appended; read from ``expected_last + 1``, decide again.

        Every other answer is handled as by ``append``: a ``Redirect`` is
        followed, ``NotCommitted`` (and ``Busy``, ``ShuttingDown``, a broken
        connection, no answer) resends the same request (same
        ``expected_last``) with backoff; ``Error { Timeout }`` is raised as a
        ``ServerError`` and not resent (the batch may still commit).
        ``PartlyAppended`` (the first ``k`` entries committed right after
        ``expected_last``, a new leader replaced the rest): the rest is resent
        as a new ``AppendIf`` expecting the log to end at the prefix's last
        index, so that the batch stays contiguous. The new leader's own entry
        usually fails that condition: then ``ConditionFailed`` is raised with
        ``.expected`` the prefix's last index and ``.committed`` the prefix's
        indexes (any exception after a committed prefix carries ``.committed``).

        **A ConditionFailed after a resend.** A resent ``AppendIf`` cannot
        append twice (the condition fails the second time), so after a send
        whose outcome was unknown (the connection broke, no answer within the
        request timeout, ``ShuttingDown``) a ``ConditionFailed`` may mean the
        first send committed: the exception's ``maybe_committed`` is then True,
        and only a read from ``.expected + 1`` tells (look for the batch
        there). After a ``Redirect`` or ``NotCommitted`` nothing was appended,
        so those resends leave ``maybe_committed`` False.
        """
        batch = [bytes(e) for e in entries]
        if not batch or len(batch) > MAX_BATCH_ENTRIES:
            raise ClientError(f"an AppendIf holds 1..={MAX_BATCH_ENTRIES} entries, not {len(batch)}",
                              code="EntryTooLarge")
        if isinstance(expected_last, bool) or not isinstance(expected_last, int) \
                or not 0 <= expected_last < (1 << 64):
            raise ValueError(f"expected_last must be a u64, not {expected_last!r}")
        deadline = self._deadline()
        indexes: list[int] = []
        rest = batch
        expected = expected_last
        try:
            while rest:
                sends = _Sends()
                resp = self._call("AppendIf", {"expected_last": expected, "entries": rest},
                                  deadline, sends=sends)
                if resp["variant"] == "ConditionFailed":
                    raise ConditionFailed(expected, resp["last"], id=resp["id"],
                                          maybe_committed=sends.unknown > 0)
                first, last = resp["first"], resp["last"]
                k = last - first + 1
                if first != expected + 1:
                    raise ProtocolError(
                        f"{resp['variant']} {first}..={last} for an AppendIf expecting "
                        f"the log to end at {expected}")
                if resp["variant"] == "Appended":
                    if k != len(rest):
                        raise ProtocolError(
                            f"Appended {first}..={last} for a batch of {len(rest)} entries")
                    indexes.extend(range(first, last + 1))
                    rest = []
                else:  # PartlyAppended: entries[:k] committed; resend entries[k:] after them
                    if not 1 <= k < len(rest):
                        raise ProtocolError(
                            f"PartlyAppended {first}..={last} for a batch of {len(rest)} entries")
                    indexes.extend(range(first, last + 1))
                    rest = rest[k:]
                    expected = last
        except RdmalogError as e:
            e.committed = list(indexes)  # type: ignore[attr-defined]
            raise
        return indexes[0], indexes[-1]

    def read(self, from_index: int, max_bytes: int = 1 << 20, *,
             consistency: Any = None) -> list[tuple[int, bytes]]:
        """Committed entries from ``from_index`` on, as (index, data), in
        increasing index order (gaps are raft's own entries). An empty list:
        nothing committed there yet on the answering node. ``max_bytes`` is a
        budget (at least one entry comes back when one is committed); read on
        from the last index + 1. ``self.last_commit`` is set to the answering
        node's commit index.

        ``consistency`` (keyword only; PROTOCOL.md 4.4 and 6.2):

        * ``None`` or ``"local"`` (default): a plain ``Read``, answered at once
          by whichever node the connection reaches; a follower may lag.
        * ``"linearizable"``: ``ReadWith(Linearizable)``, answered by the leader
          only (a follower's ``Redirect`` is followed as for an append) after it
          confirmed its leadership; holds every entry whose append was
          answered before this call.
        * ``("at_least", i)`` or a plain int ``i``: ``ReadWith(AtLeast(i))``,
          answered by any node once it committed index ``i``. With the last
          index an append returned, this reads your own writes on a follower.
        * a ``ReadConsistency`` dict (``{"variant": "AtLeast", "0": i}``).

        An ``Error { Timeout }`` (the consistency was not met within the
        server's append_timeout) means nothing was read: the call retries it,
        with backoff and on the next node, until its deadline, then raises that
        ``ServerError`` (``code == "Timeout"``); reading again is always safe.
        ``"linearizable"`` and ``AtLeast`` need protocol version 3 servers.
        """
        c = read_consistency(consistency)
        fields = {"from": from_index, "max_bytes": max_bytes}
        if c["variant"] == "Local":
            resp = self._call("Read", fields, self._deadline())
        else:
            answers = {"Entries", "Redirect"} if c["variant"] == "Linearizable" else {"Entries"}
            resp = self._call("ReadWith", {**fields, "consistency": c}, self._deadline(),
                              answers=answers, retry_timeout=True)
        out = [(e["index"], e["data"]) for e in resp["entries"]]
        prev = max(from_index, 1) - 1
        for i, _ in out:
            if i <= prev:
                raise ProtocolError(f"Read from {from_index}: index {i} out of order")
            prev = i
        if out and out[-1][0] > resp["commit"]:
            raise ProtocolError(
                f"Read from {from_index}: index {out[-1][0]} past the commit index "
                f"{resp['commit']} the answer states")
        self.last_commit = resp["commit"]
        return out

    def status(self) -> dict:
        """The connected node's status: {"node": NodeStatus, "leader": NodeInfo
        or None, "members": [NodeInfo]} (dicts as in section 4)."""
        resp = self._call("Status", {}, self._deadline())
        if len(resp["members"]) > MAX_MEMBERS:
            raise ProtocolError(
                f"Status lists {len(resp['members'])} members (at most {MAX_MEMBERS})")
        for m in resp["members"]:
            self._learn(m)
        if resp["leader"] is not None:
            self.leader = resp["leader"]
            self._learn(resp["leader"])
        return {"node": resp["node"], "leader": resp["leader"], "members": resp["members"]}

    def members(self, add: bool, node: int) -> int:
        """Add or remove voter ``node`` (Admin role); returns the commit index."""
        resp = self._call("Members", {"add": bool(add), "node": node}, self._deadline())
        return resp["index"]

    def tail(self, from_index: int, wait_timeout: Optional[float] = None
             ) -> Iterator[tuple[int, bytes]]:
        """Yield (index, data) for every committed entry from ``from_index`` on,
        until the generator is closed. Runs on its own connection (closed with
        the generator). After a break it resumes with ``Tail { from: last + 1 }``
        on a new connection to any member; when no member can be reached for
        ``timeout`` (the client's), it raises DeadlineExceeded. ``wait_timeout``:
        raise TailTimeout when no entry arrives for that long (None: wait
        forever)."""
        if wait_timeout is not None:
            wait_timeout = _check_timeout("wait_timeout", wait_timeout)
        next_index = max(from_index, 1)
        conn: Optional[_Conn] = None
        backoff = _Backoff()
        failure: list = []
        deadline = self._deadline()
        last_progress = time.monotonic()
        try:
            while True:
                if conn is None:
                    conn = self._connect(deadline, backoff, failure)
                    tid = self._new_id()
                    try:
                        conn.send({"variant": "Tail", "id": tid, "from": next_index},
                                  max(deadline - time.monotonic(), 0.001))
                    except (OSError, ConnectionClosed) as e:
                        conn.close()
                        conn = None
                        failure[:] = [e]
                        backoff.wait(deadline)
                        continue
                try:
                    wait = None
                    if wait_timeout is not None:
                        wait = last_progress + wait_timeout - time.monotonic()
                        if wait <= 0:
                            raise TailTimeout(f"no entry for {wait_timeout} s")
                    resp = conn.recv(wait)
                except (socket.timeout, TimeoutError):
                    if wait_timeout is not None and \
                            time.monotonic() - last_progress >= wait_timeout:
                        raise TailTimeout(f"no entry for {wait_timeout} s") from None
                    conn.close()
                    conn = None
                    continue
                except (OSError, ConnectionClosed) as e:
                    conn.close()
                    conn = None
                    failure[:] = [e]
                    deadline = self._deadline()
                    backoff.wait(deadline)
                    continue
                v = resp["variant"]
                if v == "Entries" and resp["id"] == tid:
                    # Every entry of a frame is committed by the frame's own commit
                    # (PROTOCOL.md 6.3): one past it is not known to be in the log.
                    past = [e["index"] for e in resp["entries"] if e["index"] > resp["commit"]]
                    if past:
                        raise ProtocolError(
                            f"the tail sent an entry at index {past[0]} past the commit index "
                            f"{resp['commit']} it stated")
                    backoff = _Backoff()
                    deadline = self._deadline()
                    for e in resp["entries"]:
                        if e["index"] < next_index:
                            continue  # already delivered before a resume
                        if e["index"] >= U64_MAX:
                            raise ProtocolError(f"the tail sent an entry at index {e['index']}")
                        next_index = e["index"] + 1
                        last_progress = time.monotonic()
                        yield e["index"], e["data"]
                    continue
                if v == "Error" and (resp["id"] is None or resp["id"] == tid):
                    err = ServerError(resp["code"], resp["message"], resp["id"])
                    conn.close()
                    conn = None
                    if resp["code"] in _RETRY_CODES:
                        failure[:] = [err]
                        deadline = self._deadline()
                        backoff.wait(deadline)
                        continue
                    raise err
                raise ProtocolError(f"tail: unexpected {v} with id {resp.get('id')}")
        finally:
            if conn is not None:
                conn.close()


def _main(argv: list[str]) -> int:  # pragma: no cover - a small manual tool
    """python3 rdmalog_client.py ADDR[,ADDR...] CLUSTER_ID status|append TEXT...|append-if EXPECTED_LAST TEXT...|read FROM [local|linearizable|INDEX]"""
    if len(argv) < 3:
        print(_main.__doc__)
        return 2
    with Client(argv[0].split(","), int(argv[1], 0)) as c:
        if argv[2] == "status":
            print(json.dumps(c.status(), indent=1, default=list))
        elif argv[2] == "append":
            print(c.append([a.encode() for a in argv[3:]]))
        elif argv[2] == "append-if":
            try:
                print(c.append_if([a.encode() for a in argv[4:]], int(argv[3], 0)))
            except ConditionFailed as e:
                print(e)
                return 1
        elif argv[2] == "read":
            mode = argv[4] if len(argv) > 4 else None
            if mode is not None and mode.isdigit():
                mode = int(mode)
            for i, d in c.read(int(argv[3]), consistency=mode):
                print(i, d.hex())
    return 0


if __name__ == "__main__":  # pragma: no cover
    import sys
    sys.exit(_main(sys.argv[1:]))
