//! TLS for the client port: rustls with the `ring` provider, certificate and key from PEM
//! files, and optional client-certificate authentication against a CA bundle. (The client
//! side is `client::tls`.)

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Why TLS could not be set up; names the file.
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

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
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

/// Reads the private key of a PEM file.
pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| err(path, e))
}

/// The server side: `cert` and `key` (PEM), and with `client_ca` every client must present a
/// certificate signed by one of its CAs.
pub fn server_config(
    cert: &Path,
    key: &Path,
    client_ca: Option<&Path>,
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let chain = load_certs(cert)?;
    let key_der = load_key(key)?;
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| err(cert, e))?;
    let builder = match client_ca {
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in load_certs(ca)? {
                roots.add(c).map_err(|e| err(ca, e))?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider(),
            )
            .build()
            .map_err(|e| err(ca, e))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let cfg = builder
        .with_single_cert(chain, key_der)
        .map_err(|e| err(key, format!("does not match the certificate: {e}")))?;
    Ok(Arc::new(cfg))
}
