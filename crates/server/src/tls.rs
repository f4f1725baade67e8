//! TLS for the client port: rustls with the `ring` provider, certificate and key from PEM
//! files, and optional client-certificate authentication against a CA bundle. (The client
//! side is `client::tls`; the peer links' TLS is `fabric::tls`, whose PEM readers this uses.)

use std::path::Path;
use std::sync::Arc;

use fabric::tls::provider;
pub use fabric::tls::{TlsError, load_certs, load_key, load_roots};

fn err(file: &Path, reason: impl std::fmt::Display) -> TlsError {
    TlsError {
        file: file.display().to_string(),
        reason: reason.to_string(),
    }
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
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(load_roots(ca)?),
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
