//! The protocol's test vectors, `docs/protocol-vectors.json` (docs/PROTOCOL.md, "Test
//! vectors"): request and response frames with their meaning, for other implementations to
//! check themselves against. This test holds the file to the Rust encoding: every vector's
//! frame is what `encode_frame` makes of its value, decodes back to it, and the file lists
//! exactly the vectors below. `RDMALOG_WRITE_VECTORS=1` rewrites the file from this list.
//!
//! The JSON form of a value (docs/PROTOCOL.md): the variant's name under `"variant"`, fields by
//! name, byte strings as lowercase hex, `Option` as `null` or the value, structs as objects,
//! tuples as arrays, field-less enums as their variant's name.

use proto::{
    ENTRIES_HEADER_BYTES, Entry, ErrorCode, NodeInfo, NodeStatus, PROTOCOL_VERSION,
    ReadConsistency, Request, Response, Role, decode_frame, encode_frame,
};
use serde_json::{Value, json};

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn node(n: &NodeInfo) -> Value {
    json!({"id": n.id, "client_addr": n.client_addr})
}

fn opt_node(n: &Option<NodeInfo>) -> Value {
    n.as_ref().map_or(Value::Null, node)
}

fn role(r: Role) -> Value {
    json!(format!("{r:?}"))
}

fn request_json(r: &Request) -> Value {
    match r {
        Request::Hello {
            version,
            cluster_id,
            token,
        } => {
            json!({"variant": "Hello", "version": version, "cluster_id": cluster_id, "token": token})
        }
        Request::Append { id, entries } => json!({
            "variant": "Append", "id": id,
            "entries": entries.iter().map(|e| hex(e)).collect::<Vec<_>>(),
        }),
        Request::Read {
            id,
            from,
            max_bytes,
        } => json!({"variant": "Read", "id": id, "from": from, "max_bytes": max_bytes}),
        Request::Tail { id, from } => json!({"variant": "Tail", "id": id, "from": from}),
        Request::Status { id } => json!({"variant": "Status", "id": id}),
        Request::Members { id, add, node } => {
            json!({"variant": "Members", "id": id, "add": add, "node": node})
        }
        Request::AppendIf {
            id,
            expected_last,
            entries,
        } => json!({
            "variant": "AppendIf", "id": id, "expected_last": expected_last,
            "entries": entries.iter().map(|e| hex(e)).collect::<Vec<_>>(),
        }),
        Request::ReadWith {
            id,
            from,
            max_bytes,
            consistency,
        } => json!({
            "variant": "ReadWith", "id": id, "from": from, "max_bytes": max_bytes,
            "consistency": match consistency {
                ReadConsistency::Local => json!({"variant": "Local"}),
                ReadConsistency::Linearizable => json!({"variant": "Linearizable"}),
                ReadConsistency::AtLeast(i) => json!({"variant": "AtLeast", "0": i}),
            },
        }),
        Request::OpenSession { id } => json!({"variant": "OpenSession", "id": id}),
        Request::Trim { id, index } => json!({"variant": "Trim", "id": id, "index": index}),
        Request::AppendInSession {
            id,
            session,
            first_seq,
            entries,
        } => json!({
            "variant": "AppendInSession", "id": id, "session": session, "first_seq": first_seq,
            "entries": entries.iter().map(|e| hex(e)).collect::<Vec<_>>(),
        }),
    }
}

fn status_json(s: &NodeStatus) -> Value {
    json!({
        "id": s.id, "role": s.role, "term": s.term, "commit": s.commit, "applied": s.applied,
        "first_index": s.first_index, "last_index": s.last_index,
        "ring_used_bytes": s.ring_used_bytes, "ring_bytes": s.ring_bytes,
        "fenced_writes": s.fenced_writes,
        "peers": s.peers.iter().map(|(id, m, st)| json!([id, m, st])).collect::<Vec<_>>(),
    })
}

fn response_json(r: &Response) -> Value {
    match r {
        Response::Welcome {
            node_id,
            leader,
            role: ro,
        } => {
            json!({"variant": "Welcome", "node_id": node_id, "leader": opt_node(leader), "role": role(*ro)})
        }
        Response::Appended { id, first, last } => {
            json!({"variant": "Appended", "id": id, "first": first, "last": last})
        }
        Response::Entries {
            id,
            commit,
            entries,
        } => json!({
            "variant": "Entries", "id": id, "commit": commit,
            "entries": entries.iter().map(|e| json!({"index": e.index, "data": hex(&e.data)})).collect::<Vec<_>>(),
        }),
        Response::Status {
            id,
            node: n,
            leader,
            members,
        } => json!({
            "variant": "Status", "id": id, "node": status_json(n), "leader": opt_node(leader),
            "members": members.iter().map(node).collect::<Vec<_>>(),
        }),
        Response::MembershipChanged { id, index } => {
            json!({"variant": "MembershipChanged", "id": id, "index": index})
        }
        Response::Redirect { id, leader } => {
            json!({"variant": "Redirect", "id": id, "leader": opt_node(leader)})
        }
        Response::Error { id, code, message } => json!({
            "variant": "Error", "id": id, "code": format!("{code:?}"), "message": message,
        }),
        Response::PartlyAppended { id, first, last } => {
            json!({"variant": "PartlyAppended", "id": id, "first": first, "last": last})
        }
        Response::ConditionFailed { id, last } => {
            json!({"variant": "ConditionFailed", "id": id, "last": last})
        }
        Response::SessionOpened { id, session } => {
            json!({"variant": "SessionOpened", "id": id, "session": session})
        }
        Response::AppendedAt { id, indexes } => {
            json!({"variant": "AppendedAt", "id": id, "indexes": indexes})
        }
        Response::Trimmed { id, first_index } => {
            json!({"variant": "Trimmed", "id": id, "first_index": first_index})
        }
    }
}

enum Msg {
    Req(Request),
    Resp(Response),
}

fn leader() -> Option<NodeInfo> {
    Some(NodeInfo {
        id: 2,
        client_addr: "10.0.0.2:7600".into(),
    })
}

/// Every vector: a name and its message. The integers cover each variable-length width
/// (1 byte below 251, then the 251/252/253 markers) and its edges.
fn vectors() -> Vec<(&'static str, Msg)> {
    use Msg::{Req, Resp};
    let error = |id, code, message: &str| {
        Resp(Response::Error {
            id,
            code,
            message: message.into(),
        })
    };
    let mut v = vec![
        (
            "hello",
            Req(Request::Hello {
                version: PROTOCOL_VERSION,
                cluster_id: 0x1ab,
                token: None,
            }),
        ),
        (
            "hello with a token",
            Req(Request::Hello {
                version: PROTOCOL_VERSION,
                cluster_id: u64::MAX,
                token: Some("s3cret-token-0123456789".into()),
            }),
        ),
        (
            "append of two entries",
            Req(Request::Append {
                id: 7,
                entries: vec![b"hello".to_vec(), b"world".to_vec()],
            }),
        ),
        (
            "append of an empty and a 300-byte entry",
            Req(Request::Append {
                id: 250,
                entries: vec![vec![], (0..300u32).map(|i| i as u8).collect()],
            }),
        ),
        (
            "append with an empty batch",
            Req(Request::Append {
                id: 251,
                entries: vec![],
            }),
        ),
        (
            "read",
            Req(Request::Read {
                id: 65_535,
                from: 65_536,
                max_bytes: 1 << 20,
            }),
        ),
        (
            "read at the u32 and u64 edges",
            Req(Request::Read {
                id: u64::from(u32::MAX),
                from: u64::from(u32::MAX) + 1,
                max_bytes: u32::MAX,
            }),
        ),
        (
            "tail",
            Req(Request::Tail {
                id: u64::MAX,
                from: 1,
            }),
        ),
        ("status request", Req(Request::Status { id: 0 })),
        (
            "members: add node 4",
            Req(Request::Members {
                id: 9,
                add: true,
                node: 4,
            }),
        ),
        (
            "members: remove node 3",
            Req(Request::Members {
                id: 10,
                add: false,
                node: 3,
            }),
        ),
        (
            "read, local",
            Req(Request::ReadWith {
                id: 12,
                from: 1,
                max_bytes: 4096,
                consistency: ReadConsistency::Local,
            }),
        ),
        (
            "read, linearizable",
            Req(Request::ReadWith {
                id: 13,
                from: 300,
                max_bytes: 1 << 20,
                consistency: ReadConsistency::Linearizable,
            }),
        ),
        (
            "read, at least an index",
            Req(Request::ReadWith {
                id: 14,
                from: 1,
                max_bytes: 1 << 20,
                consistency: ReadConsistency::AtLeast(70_000),
            }),
        ),
        (
            "conditional append",
            Req(Request::AppendIf {
                id: 15,
                expected_last: 300,
                entries: vec![b"if".to_vec(), b"still".to_vec()],
            }),
        ),
        (
            "condition failed",
            Resp(Response::ConditionFailed { id: 15, last: 302 }),
        ),
        ("open a session", Req(Request::OpenSession { id: 16 })),
        (
            "session opened",
            Resp(Response::SessionOpened {
                id: 16,
                session: 70_001,
            }),
        ),
        (
            "append in a session",
            Req(Request::AppendInSession {
                id: 17,
                session: 70_001,
                first_seq: 1,
                entries: vec![b"once".to_vec(), b"only".to_vec()],
            }),
        ),
        (
            "trim below an index",
            Req(Request::Trim {
                id: 18,
                index: 1_000_000,
            }),
        ),
        (
            "trimmed",
            Resp(Response::Trimmed {
                id: 18,
                first_index: 999_425,
            }),
        ),
        (
            "appended in a session, the first entry found already in the log",
            Resp(Response::AppendedAt {
                id: 17,
                indexes: vec![70_002, 70_250],
            }),
        ),
        (
            "welcome",
            Resp(Response::Welcome {
                node_id: 1,
                leader: leader(),
                role: Role::ReadWrite,
            }),
        ),
        (
            "welcome without a known leader",
            Resp(Response::Welcome {
                node_id: 3,
                leader: None,
                role: Role::Admin,
            }),
        ),
        (
            "appended",
            Resp(Response::Appended {
                id: 7,
                first: 1,
                last: 2,
            }),
        ),
        (
            "partly appended",
            Resp(Response::PartlyAppended {
                id: 8,
                first: 1_000_000,
                last: 1_000_003,
            }),
        ),
        (
            "entries",
            Resp(Response::Entries {
                id: 5,
                commit: 12,
                entries: vec![
                    Entry {
                        index: 10,
                        data: b"ten".to_vec(),
                    },
                    Entry {
                        index: 11,
                        data: vec![],
                    },
                ],
            }),
        ),
        (
            "status response",
            Resp(Response::Status {
                id: 4,
                node: NodeStatus {
                    id: 1,
                    role: "leader".into(),
                    term: 3,
                    commit: 300,
                    applied: 300,
                    first_index: 1,
                    last_index: 301,
                    ring_used_bytes: 4096,
                    ring_bytes: 8 << 20,
                    fenced_writes: 0,
                    peers: vec![(2, 300, "up".into()), (3, 299, "down".into())],
                },
                leader: leader(),
                members: vec![
                    NodeInfo {
                        id: 1,
                        client_addr: "10.0.0.1:7600".into(),
                    },
                    leader().unwrap(),
                ],
            }),
        ),
        (
            "membership changed",
            Resp(Response::MembershipChanged { id: 9, index: 77 }),
        ),
        (
            "redirect",
            Resp(Response::Redirect {
                id: 6,
                leader: leader(),
            }),
        ),
        (
            "redirect during an election",
            Resp(Response::Redirect {
                id: 6,
                leader: None,
            }),
        ),
    ];
    let codes = [
        ErrorCode::Malformed,
        ErrorCode::TooLarge,
        ErrorCode::WrongVersion,
        ErrorCode::WrongCluster,
        ErrorCode::Unauthorized,
        ErrorCode::EntryTooLarge,
        ErrorCode::Timeout,
        ErrorCode::Compacted,
        ErrorCode::Busy,
        ErrorCode::ShuttingDown,
        ErrorCode::Internal,
        ErrorCode::NotCommitted,
        ErrorCode::UnknownSession,
        ErrorCode::SessionSequence,
        ErrorCode::SessionTooOld,
    ];
    let names = [
        "error: Malformed",
        "error: TooLarge",
        "error: WrongVersion",
        "error: WrongCluster",
        "error: Unauthorized",
        "error: EntryTooLarge",
        "error: Timeout",
        "error: Compacted",
        "error: Busy",
        "error: ShuttingDown",
        "error: Internal",
        "error: NotCommitted",
        "error: UnknownSession",
        "error: SessionSequence",
        "error: SessionTooOld",
    ];
    for (k, (code, name)) in codes.into_iter().zip(names).enumerate() {
        // Connection-level errors carry no id (Busy is sent instead of the Welcome); the
        // others answer request k.
        let id = match code {
            ErrorCode::Malformed
            | ErrorCode::TooLarge
            | ErrorCode::WrongVersion
            | ErrorCode::WrongCluster
            | ErrorCode::Busy => None,
            _ => Some(k as u64),
        };
        v.push((
            name,
            error(id, code, &format!("{code:?}: a sentence for people")),
        ));
    }
    v
}

fn frame_of(m: &Msg) -> Vec<u8> {
    let mut buf = Vec::new();
    match m {
        Msg::Req(r) => encode_frame(r, &mut buf).unwrap(),
        Msg::Resp(r) => encode_frame(r, &mut buf).unwrap(),
    }
    buf
}

fn generated() -> Value {
    Value::Array(
        vectors()
            .iter()
            .map(|(name, m)| {
                let (kind, value) = match m {
                    Msg::Req(r) => ("request", request_json(r)),
                    Msg::Resp(r) => ("response", response_json(r)),
                };
                json!({"name": name, "kind": kind, "value": value, "frame": hex(&frame_of(m))})
            })
            .collect(),
    )
}

fn path() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/protocol-vectors.json")
}

#[test]
fn every_vector_decodes_to_its_value_and_the_file_matches_the_encoding() {
    let max = proto::MAX_FRAME_LIMIT;
    for (name, m) in vectors() {
        let frame = frame_of(&m);
        match &m {
            Msg::Req(r) => assert_eq!(&decode_frame::<Request>(&frame, max).unwrap(), r, "{name}"),
            Msg::Resp(r) => {
                assert_eq!(&decode_frame::<Response>(&frame, max).unwrap(), r, "{name}")
            }
        }
    }
    let want = generated();
    let text = serde_json::to_string_pretty(&want).unwrap() + "\n";
    if std::env::var_os("RDMALOG_WRITE_VECTORS").is_some() {
        std::fs::write(path(), &text).unwrap();
    }
    let on_file: Value = serde_json::from_str(
        &std::fs::read_to_string(path())
            .expect("docs/protocol-vectors.json (RDMALOG_WRITE_VECTORS=1 writes it)"),
    )
    .unwrap();
    let (want, got) = (want.as_array().unwrap(), on_file.as_array().unwrap());
    assert_eq!(
        got.len(),
        want.len(),
        "the file has another number of vectors"
    );
    let names: std::collections::BTreeSet<_> = want.iter().map(|v| v["name"].to_string()).collect();
    assert_eq!(names.len(), want.len(), "vector names must be unique");
    for (w, g) in want.iter().zip(got) {
        assert_eq!(g, w, "vector {} differs from the Rust encoding", w["name"]);
    }
    println!("{} vectors match docs/protocol-vectors.json", want.len());
}

/// The worked examples of docs/PROTOCOL.md, byte for byte.
#[test]
fn the_documents_worked_examples_are_the_encoding() {
    let info = |id, a: &str| NodeInfo {
        id,
        client_addr: a.into(),
    };
    let cases: Vec<(Msg, &str)> = vec![
        (
            Msg::Req(Request::Hello {
                version: 2,
                cluster_id: 0x1ab,
                token: None,
            }),
            "06000000 00 02 fbab01 00",
        ),
        (
            Msg::Req(Request::Append {
                id: 7,
                entries: vec![b"hello".to_vec(), b"world".to_vec()],
            }),
            "0f000000 01 07 02 05 68656c6c6f 05 776f726c64",
        ),
        (
            Msg::Resp(Response::Appended {
                id: 7,
                first: 1,
                last: 2,
            }),
            "04000000 01 07 01 02",
        ),
        (
            Msg::Resp(Response::Welcome {
                node_id: 1,
                leader: Some(info(2, "10.0.0.2:7600")),
                role: Role::ReadOnly,
            }),
            "13000000 00 01 01 02 0d 31302e302e302e323a37363030 00",
        ),
        (
            Msg::Req(Request::Read {
                id: 8,
                from: 1,
                max_bytes: 1 << 20,
            }),
            "08000000 02 08 01 fc00001000",
        ),
        (
            Msg::Resp(Response::Entries {
                id: 8,
                commit: 2,
                entries: vec![
                    Entry {
                        index: 1,
                        data: b"hello".to_vec(),
                    },
                    Entry {
                        index: 2,
                        data: b"world".to_vec(),
                    },
                ],
            }),
            "12000000 02 08 02 02 01 05 68656c6c6f 02 05 776f726c64",
        ),
        (
            Msg::Req(Request::Tail { id: 9, from: 3 }),
            "03000000 03 09 03",
        ),
        (Msg::Req(Request::Status { id: 7 }), "02000000 04 07"),
        (
            Msg::Req(Request::Members {
                id: 5,
                add: true,
                node: 4,
            }),
            "04000000 05 05 01 04",
        ),
        (
            Msg::Resp(Response::Redirect {
                id: 7,
                leader: None,
            }),
            "03000000 05 07 00",
        ),
        (
            Msg::Resp(Response::Error {
                id: None,
                code: ErrorCode::WrongCluster,
                message: "x".into(),
            }),
            "05000000 06 00 03 01 78",
        ),
        (
            Msg::Resp(Response::Error {
                id: Some(7),
                code: ErrorCode::NotCommitted,
                message: "retry".into(),
            }),
            "0a000000 06 01 07 0b 05 7265747279",
        ),
        (
            Msg::Resp(Response::PartlyAppended {
                id: 7,
                first: 1,
                last: 1,
            }),
            "04000000 07 07 01 01",
        ),
        (
            Msg::Req(Request::Append {
                id: 3,
                entries: vec![vec![9]],
            }),
            "05000000 01 03 01 01 09",
        ),
    ];
    for (m, want) in cases {
        let got = hex(&frame_of(&m));
        assert_eq!(
            got,
            want.replace(' ', ""),
            "docs/PROTOCOL.md §8 says {want}"
        );
    }
    // The bound the Entries header constant promises holds for the largest header.
    let r = Response::Entries {
        id: u64::MAX,
        commit: u64::MAX,
        entries: vec![],
    };
    let mut buf = Vec::new();
    encode_frame(&r, &mut buf).unwrap();
    assert!(buf.len() - 4 <= ENTRIES_HEADER_BYTES);
}
