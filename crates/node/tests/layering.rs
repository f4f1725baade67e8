//! The layering of ARCHITECTURE.md and shared/LAYERS.md, stated as absences, checked against
//! the crates' manifests: a crate can only use what its `[dependencies]` name, so a dependency
//! that breaks a layer fails here before any code uses it.
//!
//! Method: each product crate's `Cargo.toml` is read, and the names in its `[dependencies]`
//! sections (target-specific ones included, not dev-dependencies) are compared with what the
//! layer forbids.

use std::collections::BTreeSet;
use std::path::Path;

/// The names in the `[dependencies]` section of crate `name`'s manifest.
fn dependencies(name: &str) -> BTreeSet<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(name)
        .join("Cargo.toml");
    let manifest = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let mut out = BTreeSet::new();
    let mut inside = false;
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            // A dependency as a table of its own: `[dependencies.name]`.
            if let Some(name) = line
                .strip_prefix("[dependencies.")
                .and_then(|rest| rest.strip_suffix(']'))
            {
                out.insert(name.trim_matches('"').to_owned());
                inside = false;
                continue;
            }
            // Target-specific dependencies count too; dev- and build-dependencies do not.
            inside = line == "[dependencies]"
                || (line.ends_with(".dependencies]") && line.starts_with("[target."));
            continue;
        }
        if !inside || line.is_empty() || line.starts_with('#') {
            continue;
        }
        let name = line
            .split(['=', '.'])
            .next()
            .expect("split yields at least one part")
            .trim();
        out.insert(name.to_owned());
    }
    assert!(
        !out.is_empty(),
        "{}: no [dependencies] found; the parser missed the manifest's shape",
        path.display()
    );
    out
}

fn assert_none(krate: &str, forbidden: &[&str], why: &str) {
    let deps = dependencies(krate);
    let bad: Vec<&&str> = forbidden.iter().filter(|f| deps.contains(**f)).collect();
    assert!(bad.is_empty(), "{krate} depends on {bad:?}: {why}");
}

#[test]
fn the_wal_touches_no_rdma_no_transport_and_no_raft() {
    assert_none(
        "wal",
        &[
            "rdma-sys",
            "verbs",
            "fabric",
            "raft",
            "raft-proto",
            "replica",
            "server",
            "lab",
        ],
        "the wal hands out plain memory that others register",
    );
}

#[test]
fn verbs_knows_no_log_format_and_no_raft() {
    assert_none(
        "verbs",
        &["wal", "raft", "raft-proto", "fabric", "replica", "lab"],
        "verbs is the safe layer over rdma-sys, nothing above it",
    );
}

#[test]
fn the_fabric_knows_no_raft() {
    assert_none(
        "fabric",
        &["raft", "raft-proto", "wal", "replica", "server", "lab"],
        "the fabric moves bytes and messages with verbs semantics",
    );
}

#[test]
fn the_replica_reaches_rdma_only_through_the_fabric() {
    assert_none(
        "replica",
        &["rdma-sys", "verbs", "server", "lab"],
        "the same replica code runs on the in-process fabric and on RDMA",
    );
}

#[test]
fn no_library_depends_on_the_server_and_no_product_crate_on_the_lab() {
    for krate in [
        "verbs", "wal", "fabric", "replica", "proto", "client", "cli",
    ] {
        assert_none(krate, &["server"], "no library crate depends on the server");
    }
    for krate in [
        "verbs", "wal", "fabric", "replica", "proto", "server", "client", "cli",
    ] {
        assert_none(
            krate,
            &["lab"],
            "the lab is test and measurement infrastructure",
        );
    }
}

/// The reader sees the dependencies that are there (else every absence above would hold
/// vacuously).
#[test]
fn the_manifests_are_read() {
    let replica = dependencies("replica");
    for d in ["fabric", "wal", "raft", "raft-proto", "crc32c"] {
        assert!(replica.contains(d), "replica's {d} not seen: {replica:?}");
    }
    assert!(dependencies("verbs").contains("rdma-sys"));
    let wal = dependencies("wal");
    assert!(wal.contains("rustix") && wal.contains("loom"), "{wal:?}");
}

/// "verbs is the only crate with `unsafe`" (ARCHITECTURE.md, verbs' crate doc): every other
/// crate's roots (`src/lib.rs`, `src/main.rs`, `src/bin/*.rs`) deny `unsafe_code` in an
/// attribute of their own line, so an `unsafe` block anywhere in them fails to build, and no
/// source lifts it (`allow` or `expect` naming `unsafe_code`). A new crate or binary without
/// the attribute, or a file that lifts it, fails here.
#[test]
fn only_verbs_may_hold_unsafe_code() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut checked = 0;
    for entry in std::fs::read_dir(&crates).expect("the crates directory") {
        let dir = entry.expect("a crate").path();
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        if name == "verbs" || !dir.join("Cargo.toml").is_file() {
            continue;
        }
        let mut roots = vec![dir.join("src/lib.rs"), dir.join("src/main.rs")];
        for e in std::fs::read_dir(dir.join("src/bin"))
            .into_iter()
            .flatten()
            .flatten()
        {
            roots.push(e.path());
        }
        for path in roots.into_iter().filter(|p| p.is_file()) {
            let text = std::fs::read_to_string(&path).unwrap();
            assert!(
                text.lines()
                    .map(str::trim)
                    .any(|l| { l == "#![deny(unsafe_code)]" || l == "#![forbid(unsafe_code)]" }),
                "{} does not deny unsafe_code: only verbs may hold unsafe code",
                path.display()
            );
            checked += 1;
        }
        let mut dirs = vec![dir.join("src")];
        while let Some(d) = dirs.pop() {
            for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
                let p = e.path();
                if p.is_dir() {
                    dirs.push(p);
                } else if p.extension().is_some_and(|x| x == "rs") {
                    let text = std::fs::read_to_string(&p).unwrap_or_default();
                    let lifted = text.lines().any(|l| {
                        l.contains("unsafe_code") && (l.contains("allow(") || l.contains("expect("))
                    });
                    assert!(
                        !lifted,
                        "{} lifts the denial of unsafe_code: only verbs may hold unsafe code",
                        p.display()
                    );
                }
            }
        }
    }
    assert!(checked >= 13, "only {checked} crate roots were found");
}
