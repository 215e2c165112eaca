//! The per-install certificate authority the guest trusts for intercepted
//! hosts, and the leaf certificates it signs (one per host, kept in memory).
//!
//! Files, in `<data dir>/ca/` (0700): `ca.pem` (the certificate the guest
//! trusts) and `ca.key` (0600, never leaves the host). Only hosts with a
//! credential rule are ever intercepted, and only inside the guest, whose
//! trust store is the only one that holds this CA.

use std::collections::HashMap;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use nix::fcntl::{Flock, FlockArg};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SerialNumber,
};
use rustls::ServerConfig;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use sha2::{Digest, Sha256};
use time::OffsetDateTime;

use super::ProxyError;
use super::tls;
use crate::policy::Host;

pub const CA_DIR: &str = "ca";
const CERT_FILE: &str = "ca.pem";
const KEY_FILE: &str = "ca.key";
const LOCK_FILE: &str = ".lock";

const CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// Leaves live in memory for one session; a month covers any session.
const LEAF_VALIDITY: Duration = Duration::from_secs(30 * 24 * 3600);
/// Clock skew between host and guest.
const BACKDATE: Duration = Duration::from_secs(24 * 3600);

pub struct CertificateAuthority {
    dir: PathBuf,
    cert_pem: String,
    cert_der: CertificateDer<'static>,
    issuer: Issuer<'static, KeyPair>,
    /// One key for every leaf of this process: generating a key per host
    /// would cost more than it protects (the leaves never leave the proxy).
    leaf_key: KeyPair,
    leaves: Mutex<HashMap<Host, Arc<ServerConfig>>>,
}

impl std::fmt::Debug for CertificateAuthority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertificateAuthority").field("dir", &self.dir).finish_non_exhaustive()
    }
}

impl CertificateAuthority {
    /// Loads the CA from `<data_dir>/ca`, creating it on first use. Two
    /// stockade processes starting at once agree on one CA (a file lock).
    pub fn load_or_create(data_dir: &Path) -> Result<CertificateAuthority, ProxyError> {
        let dir = data_dir.join(CA_DIR);
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|source| ProxyError::CaWrite { path: dir.clone(), source })?;
        let lock_path = dir.join(LOCK_FILE);
        let lock_file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&lock_path)
            .map_err(|source| ProxyError::CaWrite { path: lock_path.clone(), source })?;
        let _lock = Flock::lock(lock_file, FlockArg::LockExclusive)
            .map_err(|(_, errno)| ProxyError::CaWrite { path: lock_path, source: errno.into() })?;

        let key_path = dir.join(KEY_FILE);
        let cert_path = dir.join(CERT_FILE);
        if !key_path.exists() {
            create(&dir)?;
        }
        let read = |path: &Path| {
            fs::read_to_string(path).map_err(|source| ProxyError::CaRead { path: path.to_path_buf(), source })
        };
        let key_pem = read(&key_path)?;
        let cert_pem = read(&cert_path)?;
        tighten_permissions(&key_path);
        let damaged = |reason: &str| ProxyError::CaDamaged { path: dir.clone(), reason: reason.to_string() };
        let key = KeyPair::from_pem(&key_pem).map_err(|_| damaged("ca.key is not a private key"))?;
        let cert_der = pem_certificate(&cert_pem).ok_or_else(|| damaged("ca.pem holds no certificate"))?;
        if !cert_der.as_ref().windows(key.public_key_raw().len()).any(|w| w == key.public_key_raw()) {
            return Err(damaged("ca.pem and ca.key do not belong together"));
        }
        // The issuer needs only the name, key usages and key: the same
        // parameters that made the certificate give the same subject.
        let issuer = Issuer::new(ca_params(SystemTime::now()), key);
        let leaf_key =
            KeyPair::generate().map_err(|source| ProxyError::Certificate { host: "leaf key".into(), source })?;
        Ok(CertificateAuthority { dir, cert_pem, cert_der, issuer, leaf_key, leaves: Mutex::new(HashMap::new()) })
    }

    /// The CA certificate, PEM, for the guest's trust store.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    #[cfg(test)]
    pub(crate) fn cert_der(&self) -> &CertificateDer<'static> {
        &self.cert_der
    }

    /// The TLS server configuration that presents `host`'s leaf certificate
    /// to the guest, made once per host.
    pub(crate) fn server_config(&self, host: &Host) -> Result<Arc<ServerConfig>, ProxyError> {
        let mut leaves = self.leaves.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(config) = leaves.get(host) {
            return Ok(config.clone());
        }
        let cert_err = |source| ProxyError::Certificate { host: host.to_string(), source };
        let name = match host {
            Host::Name(name) => name.clone(),
            Host::Ip(ip) => ip.to_string(),
        };
        let mut params = CertificateParams::new(vec![name.clone()]).map_err(cert_err)?;
        let now = SystemTime::now();
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, name.as_str());
        params.not_before = offset(now - BACKDATE);
        params.not_after = offset(now + LEAF_VALIDITY);
        params.serial_number = Some(serial(&name));
        params.use_authority_key_identifier_extension = true;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let leaf = params.signed_by(&self.leaf_key, &self.issuer).map_err(cert_err)?;
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.leaf_key.serialize_der()));
        let config = tls::server_config(vec![leaf.der().clone(), self.cert_der.clone()], key)?;
        leaves.insert(host.clone(), config.clone());
        Ok(config)
    }
}

fn ca_params(now: SystemTime) -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params.distinguished_name.push(DnType::OrganizationName, "stockade");
    params.distinguished_name.push(DnType::CommonName, "stockade egress proxy CA (this machine only)");
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    params.not_before = offset(now - BACKDATE);
    params.not_after = offset(now + CA_VALIDITY);
    params
}

/// Makes a new key and certificate; files are written whole (temp file,
/// rename), the key 0600 from the start.
fn create(dir: &Path) -> Result<(), ProxyError> {
    let key = KeyPair::generate().map_err(|source| ProxyError::Certificate { host: "the CA".into(), source })?;
    let mut params = ca_params(SystemTime::now());
    params.serial_number = Some(serial("ca"));
    let cert = params.self_signed(&key).map_err(|source| ProxyError::Certificate { host: "the CA".into(), source })?;
    write_new(&dir.join(KEY_FILE), key.serialize_pem().as_bytes(), 0o600)?;
    write_new(&dir.join(CERT_FILE), cert.pem().as_bytes(), 0o644)?;
    tracing::info!("created the proxy CA in {}", dir.display());
    Ok(())
}

fn write_new(path: &Path, bytes: &[u8], mode: u32) -> Result<(), ProxyError> {
    let tmp = path.with_extension("tmp");
    let err = |source| ProxyError::CaWrite { path: path.to_path_buf(), source };
    let _ = fs::remove_file(&tmp);
    let mut file = fs::OpenOptions::new().write(true).create_new(true).mode(mode).open(&tmp).map_err(err)?;
    file.write_all(bytes).map_err(err)?;
    file.sync_all().map_err(err)?;
    fs::rename(&tmp, path).map_err(err)
}

/// A key readable by others is made private again, with a warning.
fn tighten_permissions(path: &Path) {
    if let Ok(meta) = fs::metadata(path) {
        if meta.permissions().mode() & 0o077 != 0 {
            tracing::warn!("{} was readable by others; setting it to 0600", path.display());
            let _ = fs::set_permissions(path, fs::Permissions::from_mode(0o600));
        }
    }
}

fn pem_certificate(pem: &str) -> Option<CertificateDer<'static>> {
    use rustls::pki_types::pem::PemObject;
    CertificateDer::pem_slice_iter(pem.as_bytes()).next()?.ok()
}

fn offset(t: SystemTime) -> OffsetDateTime {
    OffsetDateTime::from(t)
}

/// A serial unique per certificate (RFC 5280: positive, at most 20 bytes).
/// Uniqueness is what matters, not secrecy: time, process and a counter.
fn serial(name: &str) -> SerialNumber {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default().as_nanos();
    let mut hash = Sha256::new();
    hash.update(name.as_bytes());
    hash.update(nanos.to_le_bytes());
    hash.update(std::process::id().to_le_bytes());
    hash.update(COUNTER.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    let mut bytes = hash.finalize()[..16].to_vec();
    bytes[0] &= 0x7f;
    SerialNumber::from_slice(&bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("stockade-ca-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn creates_once_then_loads_the_same_ca_with_a_private_key() {
        let dir = temp("create");
        let first = CertificateAuthority::load_or_create(&dir).unwrap();
        let second = CertificateAuthority::load_or_create(&dir).unwrap();
        assert_eq!(first.cert_pem(), second.cert_pem());
        assert!(first.cert_pem().starts_with("-----BEGIN CERTIFICATE-----"));
        let mode = fs::metadata(dir.join("ca/ca.key")).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let mode = fs::metadata(dir.join("ca")).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_mismatched_key_is_reported_not_used() {
        let dir = temp("mismatch");
        CertificateAuthority::load_or_create(&dir).unwrap();
        fs::write(dir.join("ca/ca.key"), KeyPair::generate().unwrap().serialize_pem()).unwrap();
        let err = CertificateAuthority::load_or_create(&dir).unwrap_err().to_string();
        assert!(err.contains("do not belong together"), "{err}");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn leaf_certificates_chain_to_the_ca() {
        let dir = temp("leaf");
        let ca = CertificateAuthority::load_or_create(&dir).unwrap();
        let host = Host::parse("api.example.com").unwrap();
        let config = ca.server_config(&host).unwrap();
        assert!(Arc::ptr_eq(&config, &ca.server_config(&host).unwrap()), "leaves are cached");
        // A rustls client that trusts only this CA accepts the leaf.
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca.cert_der().clone()).unwrap();
        let client = tls::client_config(Arc::new(roots)).unwrap();
        let name = rustls::pki_types::ServerName::try_from("api.example.com").unwrap();
        let mut c = rustls::ClientConnection::new(client, name).unwrap();
        let mut s = rustls::ServerConnection::new(config).unwrap();
        for _ in 0..4 {
            let mut buf = Vec::new();
            c.write_tls(&mut buf).unwrap();
            s.read_tls(&mut buf.as_slice()).unwrap();
            s.process_new_packets().unwrap();
            let mut buf = Vec::new();
            s.write_tls(&mut buf).unwrap();
            c.read_tls(&mut buf.as_slice()).unwrap();
            c.process_new_packets().unwrap();
        }
        assert!(!c.is_handshaking(), "the handshake completed");
        fs::remove_dir_all(&dir).unwrap();
    }
}
