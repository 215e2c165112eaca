//! rustls configurations, all on the `ring` provider: the server side the
//! guest talks to when intercepted, the client side that verifies upstream
//! servers against the host's trust store, and that trust store as PEM.

use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore, ServerConfig};

use super::ProxyError;

/// ALPN we offer on both sides: the guest may speak h2 where it wants to,
/// and we speak h2 upstream where the server does.
const ALPN: [&[u8]; 2] = [b"h2", b"http/1.1"];

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

pub fn server_config(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<Arc<ServerConfig>, ProxyError> {
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(ProxyError::Tls)?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(ProxyError::Tls)?;
    config.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(config))
}

pub fn client_config(roots: Arc<RootCertStore>) -> Result<Arc<ClientConfig>, ProxyError> {
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(ProxyError::Tls)?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(config))
}

/// The host's trusted roots, as rustls-native-certs finds them (it honours
/// SSL_CERT_FILE and SSL_CERT_DIR).
pub fn native_roots() -> Result<RootCertStore, ProxyError> {
    let found = rustls_native_certs::load_native_certs();
    let mut roots = RootCertStore::empty();
    let (_added, _ignored) = roots.add_parsable_certificates(found.certs);
    if roots.is_empty() {
        let details = found.errors.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; ");
        return Err(ProxyError::NoRoots { details: if details.is_empty() { "none found".into() } else { details } });
    }
    for err in &found.errors {
        tracing::debug!("skipped part of the host trust store: {err}");
    }
    Ok(roots)
}

/// The host's trusted roots as DER, for the guest's bundle.
pub fn native_root_ders() -> Vec<CertificateDer<'static>> {
    rustls_native_certs::load_native_certs().certs
}

/// PEM text of certificates.
pub fn pem(certs: &[CertificateDer<'_>]) -> String {
    let mut out = String::new();
    for cert in certs {
        out.push_str("-----BEGIN CERTIFICATE-----\n");
        let encoded = base64(cert.as_ref());
        for line in encoded.as_bytes().chunks(64) {
            out.push_str(std::str::from_utf8(line).unwrap_or_default());
            out.push('\n');
        }
        out.push_str("-----END CERTIFICATE-----\n");
    }
    out
}

fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [chunk[0], chunk.get(1).copied().unwrap_or(0), chunk.get(2).copied().unwrap_or(0)];
        let n = u32::from(b[0]) << 16 | u32::from(b[1]) << 8 | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_the_rfc_vectors() {
        for (plain, encoded) in
            [("", ""), ("f", "Zg=="), ("fo", "Zm8="), ("foo", "Zm9v"), ("foob", "Zm9vYg=="), ("foobar", "Zm9vYmFy")]
        {
            assert_eq!(base64(plain.as_bytes()), encoded);
        }
    }

    #[test]
    fn pem_round_trips() {
        use rustls::pki_types::pem::PemObject;
        let der = CertificateDer::from((0u8..=200).collect::<Vec<u8>>());
        let text = pem(std::slice::from_ref(&der));
        let back: Vec<_> = CertificateDer::pem_slice_iter(text.as_bytes()).collect::<Result<_, _>>().unwrap();
        assert_eq!(back, vec![der]);
    }
}
