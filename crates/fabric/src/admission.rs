//! Peer admission, shared by every back-end: a connected peer is acted on only after it proved
//! it knows the cluster secret.
//!
//! Each side sends a fresh nonce as a *challenge* over the new connection; the other answers
//! with a *proof*, an HMAC-SHA256 over the nonce, the cluster id and both node ids. A side
//! reports the connection (`Event::Connected`) only once the peer's proof checks. rkeys and TCP
//! ports are guessable; the secret is not. Without a configured secret nothing is exchanged and
//! every connection is admitted at once (a private network is then the only protection).
//!
//! The messages travel as the back-end's *control frames*; how a frame is marked as control is
//! the back-end's business, what it carries is this module's.

use std::time::{Duration, Instant};

use crate::{FabricError, NodeId};

/// Shortest accepted cluster secret: 128 bits.
pub const MIN_SECRET_BYTES: usize = 16;

/// Bytes of an admission nonce.
pub const NONCE_BYTES: usize = 16;

const CONTROL_CHALLENGE: u8 = 1;
const CONTROL_PROOF: u8 = 2;

/// A challenge message: its tag and the nonce.
pub const CHALLENGE_BYTES: usize = 1 + NONCE_BYTES;

/// A proof message: its tag and the HMAC.
pub const PROOF_BYTES: usize = 1 + 32;

/// The largest credential file [`read_owner_only`] reads: a secret, a token list or a PEM
/// private key is a few KiB; a longer file is a wrong path.
pub const MAX_CREDENTIAL_BYTES: u64 = 1 << 20;

/// Reads a file that holds a credential (`what`: "the secret file", "the token file", "the
/// private key"), which must be a regular file, its owner's only, and at most
/// [`MAX_CREDENTIAL_BYTES`]: opened once without blocking (a FIFO named by mistake would hang
/// the open until some writer came), its type, mode and size checked on the open file (no
/// window between the check and the read), then read whole.
pub fn read_owner_only(what: &str, path: &std::path::Path) -> Result<Vec<u8>, String> {
    use std::io::Read;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let cannot = |e: std::io::Error| format!("cannot read {what} {}: {e}", path.display());
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(cannot)?;
    let meta = file.metadata().map_err(cannot)?;
    if !meta.is_file() {
        return Err(format!(
            "{what} {} is not a regular file ({:?})",
            path.display(),
            meta.file_type()
        ));
    }
    let mode = meta.permissions().mode();
    if mode & 0o077 != 0 {
        return Err(format!(
            "{what} {} is open to group or others (mode {:o}); make it the server's user's \
             only: `chown <user> {}; chmod 600 {}`",
            path.display(),
            mode & 0o777,
            path.display(),
            path.display()
        ));
    }
    let mut bytes = Vec::new();
    // One byte past the limit tells a file that grew since the size was read.
    (&mut file)
        .take(MAX_CREDENTIAL_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(cannot)?;
    if meta.len() > MAX_CREDENTIAL_BYTES || bytes.len() as u64 > MAX_CREDENTIAL_BYTES {
        return Err(format!(
            "{what} {} holds more than {MAX_CREDENTIAL_BYTES} bytes: not a credential file",
            path.display()
        ));
    }
    Ok(bytes)
}

/// Reads a cluster secret file: at least [`MIN_SECRET_BYTES`] bytes (a trailing newline is
/// ignored), its owner's only ([`read_owner_only`]).
pub fn load_secret(path: &std::path::Path) -> Result<Vec<u8>, FabricError> {
    let bad = |reason: String| FabricError::Setup { reason };
    let mut bytes = read_owner_only("the secret file", path).map_err(bad)?;
    while bytes.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
        bytes.pop();
    }
    if bytes.len() < MIN_SECRET_BYTES {
        return Err(bad(format!(
            "the secret in {} has {} bytes; use at least {MIN_SECRET_BYTES} (e.g. `head -c 32 /dev/urandom | base64 > FILE`)",
            path.display(),
            bytes.len()
        )));
    }
    Ok(bytes)
}

fn mac(
    secret: &[u8],
    cluster_id: u64,
    prover: NodeId,
    verifier: NodeId,
    nonce: &[u8; NONCE_BYTES],
) -> hmac::Hmac<sha2::Sha256> {
    use hmac::Mac;
    let mut mac =
        hmac::Hmac::<sha2::Sha256>::new_from_slice(secret).expect("HMAC takes any key length");
    mac.update(b"rdmalog-admission-v1");
    mac.update(&cluster_id.to_le_bytes());
    mac.update(&prover.0.to_le_bytes());
    mac.update(&verifier.0.to_le_bytes());
    mac.update(nonce);
    mac
}

/// The proof that `prover` knows `secret`, answering `verifier`'s `nonce` in `cluster_id`.
pub fn admission_proof(
    secret: &[u8],
    cluster_id: u64,
    prover: NodeId,
    verifier: NodeId,
    nonce: &[u8; NONCE_BYTES],
) -> [u8; 32] {
    use hmac::Mac;
    mac(secret, cluster_id, prover, verifier, nonce)
        .finalize()
        .into_bytes()
        .into()
}

/// What the owner of a connection does after [`Admission::on_control`].
#[derive(Debug, PartialEq, Eq)]
pub enum ControlOutcome {
    /// Send this control message back (our proof).
    Reply([u8; PROOF_BYTES]),
    /// The peer is admitted now: report its connection.
    Admitted,
    /// Nothing to do (a proof repeated after admission).
    Nothing,
    /// Refuse the peer and break the connection, for this reason.
    Refuse(&'static str),
}

/// The admission state of one connection.
#[derive(Debug)]
pub struct Admission {
    admitted: bool,
    nonce: [u8; NONCE_BYTES],
    since: Instant,
}

impl Admission {
    /// A new connection's state: admitted at once when no secret is configured.
    pub fn new(secret: Option<&[u8]>) -> Self {
        Admission {
            admitted: secret.is_none(),
            nonce: [0; NONCE_BYTES],
            since: Instant::now(),
        }
    }

    /// Whether the peer has proved itself (always, without a secret).
    pub fn admitted(&self) -> bool {
        self.admitted
    }

    /// When the connection came up.
    pub fn since(&self) -> Instant {
        self.since
    }

    /// Whether an unadmitted peer has had longer than `limit` to prove itself.
    pub fn overdue(&self, limit: Duration) -> bool {
        !self.admitted && self.since.elapsed() > limit
    }

    /// Draws a fresh nonce and returns the challenge message to send.
    pub fn challenge(&mut self) -> Result<[u8; CHALLENGE_BYTES], String> {
        getrandom::fill(&mut self.nonce)
            .map_err(|e| format!("no randomness for an admission nonce: {e}"))?;
        let mut msg = [0u8; CHALLENGE_BYTES];
        msg[0] = CONTROL_CHALLENGE;
        msg[1..].copy_from_slice(&self.nonce);
        Ok(msg)
    }

    /// Handles a control message from `peer`: answers its challenge, or checks its proof of
    /// our nonce (in constant time, so a proof cannot be guessed byte by byte).
    pub fn on_control(
        &mut self,
        secret: Option<&[u8]>,
        cluster_id: u64,
        me: NodeId,
        peer: NodeId,
        msg: &[u8],
    ) -> ControlOutcome {
        let Some(secret) = secret else {
            return ControlOutcome::Refuse(
                "it demands admission but this node has no cluster secret configured",
            );
        };
        match (msg.first(), msg.len()) {
            (Some(&CONTROL_CHALLENGE), CHALLENGE_BYTES) => {
                let nonce: [u8; NONCE_BYTES] = msg[1..].try_into().expect("length checked");
                let mut out = [0u8; PROOF_BYTES];
                out[0] = CONTROL_PROOF;
                out[1..].copy_from_slice(&admission_proof(secret, cluster_id, me, peer, &nonce));
                ControlOutcome::Reply(out)
            }
            (Some(&CONTROL_PROOF), PROOF_BYTES) => {
                use hmac::Mac;
                if mac(secret, cluster_id, peer, me, &self.nonce)
                    .verify_slice(&msg[1..])
                    .is_err()
                {
                    return ControlOutcome::Refuse(
                        "its admission proof does not match: wrong cluster secret",
                    );
                }
                if self.admitted {
                    ControlOutcome::Nothing
                } else {
                    self.admitted = true;
                    ControlOutcome::Admitted
                }
            }
            _ => ControlOutcome::Refuse("it sent a malformed admission frame"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn secrets_must_be_long_and_private() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("secret");
        std::fs::write(&p, b"0123456789abcdef0123\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(
            load_secret(&p)
                .unwrap_err()
                .to_string()
                .contains("chmod 600")
        );
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(load_secret(&p).unwrap(), b"0123456789abcdef0123");
        std::fs::write(&p, b"short\n").unwrap();
        assert!(
            load_secret(&p)
                .unwrap_err()
                .to_string()
                .contains("at least 16")
        );
        assert!(load_secret(&dir.path().join("missing")).is_err());
    }

    /// A FIFO is refused at once (an open without `O_NONBLOCK` waited for a writer forever),
    /// and so are a directory and a file past the size limit (read whole before).
    #[test]
    fn credentials_are_small_regular_files() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let made = std::process::Command::new("mkfifo")
            .args(["-m", "600"])
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        let e = read_owner_only("the secret file", &fifo).unwrap_err();
        assert!(e.contains("not a regular file"), "{e}");
        let e = read_owner_only("the secret file", dir.path()).unwrap_err();
        assert!(e.contains("not a regular file"), "{e}");
        let big = dir.path().join("big");
        let f = std::fs::File::create(&big).unwrap();
        f.set_len(MAX_CREDENTIAL_BYTES + 1).unwrap();
        std::fs::set_permissions(&big, std::fs::Permissions::from_mode(0o600)).unwrap();
        let e = read_owner_only("the secret file", &big).unwrap_err();
        assert!(e.contains("more than"), "{e}");
        f.set_len(MAX_CREDENTIAL_BYTES).unwrap();
        assert_eq!(
            read_owner_only("the secret file", &big).unwrap().len() as u64,
            MAX_CREDENTIAL_BYTES
        );
    }

    #[test]
    fn proofs_bind_secret_cluster_both_ids_and_nonce() {
        let n = [7u8; NONCE_BYTES];
        let s = b"0123456789abcdef";
        let base = admission_proof(s, 1, NodeId(1), NodeId(2), &n);
        assert_eq!(base, admission_proof(s, 1, NodeId(1), NodeId(2), &n));
        assert_ne!(
            base,
            admission_proof(b"0123456789abcdeX", 1, NodeId(1), NodeId(2), &n)
        );
        assert_ne!(base, admission_proof(s, 2, NodeId(1), NodeId(2), &n));
        assert_ne!(base, admission_proof(s, 1, NodeId(2), NodeId(1), &n));
        assert_ne!(
            base,
            admission_proof(s, 1, NodeId(1), NodeId(2), &[8; NONCE_BYTES])
        );
    }

    /// Both sides of one connection, each challenging the other: both end admitted with the
    /// same secret; a wrong secret, a tampered proof or a missing secret is refused.
    #[test]
    fn a_handshake_admits_only_the_same_secret() {
        let (a, b) = (NodeId(1), NodeId(2));
        let run = |sa: Option<&[u8]>, sb: Option<&[u8]>, tamper: bool| {
            let (mut xa, mut xb) = (Admission::new(sa), Admission::new(sb));
            let ca = xa.challenge().unwrap();
            let reply = xb.on_control(sb, 9, b, a, &ca);
            let ControlOutcome::Reply(mut proof) = reply else {
                return reply;
            };
            if tamper {
                proof[5] ^= 1;
            }
            xa.on_control(sa, 9, a, b, &proof)
        };
        let s: &[u8] = b"0123456789abcdef";
        assert_eq!(run(Some(s), Some(s), false), ControlOutcome::Admitted);
        assert!(matches!(
            run(Some(s), Some(b"0123456789abcdeX"), false),
            ControlOutcome::Refuse(why) if why.contains("wrong cluster secret")
        ));
        assert!(matches!(
            run(Some(s), Some(s), true),
            ControlOutcome::Refuse(_)
        ));
        assert!(matches!(
            run(Some(s), None, false),
            ControlOutcome::Refuse(why) if why.contains("no cluster secret")
        ));
        let mut x = Admission::new(Some(s));
        assert!(!x.admitted());
        assert!(matches!(
            x.on_control(Some(s), 9, a, b, &[3, 1, 2]),
            ControlOutcome::Refuse(why) if why.contains("malformed")
        ));
        assert!(Admission::new(None).admitted());
    }
}
