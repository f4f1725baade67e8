//! The client side of TLS: rustls with the `ring` provider, trusting the CAs of a PEM bundle,
//! optionally presenting a client certificate. The server's own tests use it too.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use crate::ClientError;

fn err(file: &Path, reason: impl std::fmt::Display) -> ClientError {
    ClientError::Config(format!("TLS: {}: {reason}", file.display()))
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, ClientError> {
    let certs: Vec<_> = CertificateDer::pem_file_iter(path)
        .map_err(|e| err(path, e))?
        .collect::<Result<_, _>>()
        .map_err(|e| err(path, e))?;
    if certs.is_empty() {
        return Err(err(path, "holds no PEM certificate"));
    }
    Ok(certs)
}

fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, ClientError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| err(path, e))
}

/// A rustls client configuration that trusts the CAs of `ca` (PEM) and, with
/// `cert_and_key`, presents that client certificate.
pub fn client_config(
    ca: &Path,
    cert_and_key: Option<(&Path, &Path)>,
) -> Result<Arc<rustls::ClientConfig>, ClientError> {
    let mut roots = rustls::RootCertStore::empty();
    for c in load_certs(ca)? {
        roots.add(c).map_err(|e| err(ca, e))?;
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| err(ca, e))?
        .with_root_certificates(roots);
    let cfg = match cert_and_key {
        Some((cert, key)) => builder
            .with_client_auth_cert(load_certs(cert)?, load_key(key)?)
            .map_err(|e| err(key, e))?,
        None => builder.with_no_client_auth(),
    };
    Ok(Arc::new(cfg))
}

/// The host part of `host:port` (`[v6]:port` too), the default TLS server name.
pub(crate) fn host_of(addr: &str) -> &str {
    let host = match addr.rsplit_once(':') {
        Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => host,
        _ => addr,
    };
    host.strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host)
}

/// The name to verify the server's certificate against.
pub(crate) fn server_name(
    configured: Option<&str>,
    addr: &str,
) -> Result<ServerName<'static>, ClientError> {
    let name = configured.unwrap_or_else(|| host_of(addr));
    ServerName::try_from(name.to_string()).map_err(|e| {
        ClientError::Config(format!(
            "TLS: {name:?} is not a valid server name ({e}); set the server name explicitly"
        ))
    })
}

/// Whether an I/O error is rustls reporting a TLS failure (an untrusted certificate, an
/// alert from the server, bytes that are not TLS).
pub(crate) fn is_tls_failure(e: &std::io::Error) -> bool {
    e.get_ref()
        .is_some_and(|inner| inner.downcast_ref::<rustls::Error>().is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_part_of_addresses() {
        assert_eq!(host_of("localhost:7000"), "localhost");
        assert_eq!(host_of("10.0.0.1:7000"), "10.0.0.1");
        assert_eq!(host_of("[::1]:7000"), "::1");
        assert_eq!(host_of("node-a"), "node-a");
        assert!(server_name(None, "127.0.0.1:1").is_ok());
        assert!(server_name(Some("log.example"), "127.0.0.1:1").is_ok());
        assert!(server_name(Some("not a name!"), "x:1").is_err());
    }
}
