//! TLS on the TCP back-end's peer links: rustls with the `ring` provider, mutual
//! authentication against the cluster's CA.
//!
//! # What it protects
//!
//! - **Without TLS** the peer link is plain TCP. The cluster secret ([`crate::admission`])
//!   keeps out a peer that does not know it, but everything on the wire (log entries, raft
//!   messages, the admission exchange) can be read, and a machine on the path can change or
//!   inject bytes after admission. Use it only on a private network.
//! - **With TLS** every connection is encrypted and integrity-checked, and both ends prove a
//!   certificate signed by the configured CA: the dialing side checks that the accepting
//!   side's certificate names the address it dialled (or the name configured for that peer),
//!   and the accepting side requires a client certificate from the same CA. The cluster secret
//!   still runs inside the TLS session. Which node id a peer claims is authenticated no further
//!   than by the CA and the secret: every holder of a cluster certificate is trusted as a
//!   member, as every holder of the secret is without TLS.
//!
//! The session sits inside [`crate::tcp`]'s connection: the frames of docs/FORMAT.md §12 are
//! the TLS session's plaintext, unchanged.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use crate::NodeId;

/// Why TLS could not be set up; names the file or setting.
#[derive(Debug, thiserror::Error)]
#[error("TLS: {file}: {reason}")]
pub struct TlsError {
    /// The file at fault (or the setting).
    pub file: String,
    /// What is wrong.
    pub reason: String,
}

fn err(file: &Path, reason: impl std::fmt::Display) -> TlsError {
    TlsError {
        file: file.display().to_string(),
        reason: reason.to_string(),
    }
}

/// The crypto provider every rdmalog TLS configuration uses.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Reads every certificate of a PEM file.
pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs: Vec<_> = CertificateDer::pem_file_iter(path)
        .map_err(|e| err(path, e))?
        .collect::<Result<_, _>>()
        .map_err(|e| err(path, e))?;
    if certs.is_empty() {
        return Err(err(path, "holds no PEM certificate"));
    }
    Ok(certs)
}

/// Reads the private key of a PEM file, which must be its owner's only, as the cluster
/// secret and the token file ([`crate::admission::read_owner_only`]): whoever can read it can
/// pass for this node.
pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let pem = crate::admission::read_owner_only("the private key", path).map_err(|e| TlsError {
        file: path.display().to_string(),
        reason: e,
    })?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| err(path, e))
}

/// Reads a CA bundle into a root store.
pub fn load_roots(path: &Path) -> Result<rustls::RootCertStore, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    for c in load_certs(path)? {
        roots.add(c).map_err(|e| err(path, e))?;
    }
    Ok(roots)
}

/// One node's TLS settings for its peer links: its certificate and key (used both when it
/// dials and when it accepts) and the CA its peers' certificates must chain to.
#[derive(Clone)]
pub struct PeerTls {
    client: Arc<rustls::ClientConfig>,
    server: Arc<rustls::ServerConfig>,
    names: BTreeMap<NodeId, ServerName<'static>>,
}

impl std::fmt::Debug for PeerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerTls")
            .field("names", &self.names)
            .finish_non_exhaustive()
    }
}

impl PeerTls {
    /// From PEM files: this node's certificate chain `cert`, its private key `key`, and the
    /// cluster CA bundle `ca`.
    pub fn from_pem(cert: &Path, key: &Path, ca: &Path) -> Result<PeerTls, TlsError> {
        let chain = load_certs(cert)?;
        let key_der = load_key(key)?;
        let roots = load_roots(ca)?;
        Self::new(chain, key_der, roots).map_err(|e| TlsError {
            file: format!("{} / {}", cert.display(), key.display()),
            reason: e,
        })
    }

    /// From a certificate chain, its key and the CA roots.
    pub fn new(
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
        roots: rustls::RootCertStore,
    ) -> Result<PeerTls, String> {
        let roots = Arc::new(roots);
        let verifier =
            rustls::server::WebPkiClientVerifier::builder_with_provider(roots.clone(), provider())
                .build()
                .map_err(|e| format!("the CA bundle cannot verify peers: {e}"))?;
        let server = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain.clone(), key.clone_key())
            .map_err(|e| format!("the key does not match the certificate: {e}"))?;
        let client = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)
            .map_err(|e| format!("the key does not match the certificate: {e}"))?;
        Ok(PeerTls {
            client: Arc::new(client),
            server: Arc::new(server),
            names: BTreeMap::new(),
        })
    }

    /// The name `peer`'s certificate must carry (a DNS name or an IP address). Without one,
    /// the IP address dialled is checked.
    pub fn name_peer(&mut self, peer: NodeId, name: &str) -> Result<(), String> {
        let n = ServerName::try_from(name.to_string())
            .map_err(|e| format!("{name:?} is not a DNS name or IP address: {e}"))?;
        self.names.insert(peer, n);
        Ok(())
    }

    /// A client session for dialling `peer` at `addr`.
    pub(crate) fn dial(
        &self,
        peer: NodeId,
        addr: SocketAddr,
    ) -> Result<rustls::Connection, rustls::Error> {
        let name = self
            .names
            .get(&peer)
            .cloned()
            .unwrap_or_else(|| ServerName::IpAddress(addr.ip().into()));
        Ok(rustls::ClientConnection::new(self.client.clone(), name)?.into())
    }

    /// A server session for an accepted connection.
    pub(crate) fn accept(&self) -> Result<rustls::Connection, rustls::Error> {
        Ok(rustls::ServerConnection::new(self.server.clone())?.into())
    }
}
