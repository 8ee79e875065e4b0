//! The instance's own certificate authority, for the connections the proxy
//! intercepts (a host a credential is sent to): made fresh when the
//! instance starts, its key only in the supervisor's memory, name-constrained
//! to the credentials' hosts (so even its key could sign for no other name),
//! and the TLS settings both ways: towards the sandbox, a certificate for the
//! host signed by this CA and HTTP/1.1 only in ALPN (HTTP/2 clients fall
//! back); towards the upstream, the host's roots plus `[network]
//! upstream_ca`, verified as any client would.

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose,
    GeneralSubtree, IsCa, KeyPair, KeyUsagePurpose, NameConstraints,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// Why the TLS settings could not be made.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CaError {
    /// The CA or a host's certificate could not be made.
    #[error("making the instance's certificate authority: {0}")]
    Make(String),
    /// An `upstream_ca` file could not be read or holds no certificate.
    #[error("[network] upstream_ca {path}: {why}")]
    Upstream {
        /// The file.
        path: PathBuf,
        /// Why.
        why: String,
    },
    /// Neither the host nor the profile gives a root to verify upstreams by.
    #[error("no root certificates to verify upstream hosts: the host's store is empty or unreadable ({0}) and [network] upstream_ca names none")]
    NoRoots(String),
}

/// The CA and the TLS settings of intercepted connections.
pub(crate) struct Tls {
    ca: CertifiedIssuer<'static, KeyPair>,
    /// Towards the upstream: verified against the host's roots and
    /// `upstream_ca`.
    pub(crate) upstream: Arc<rustls::ClientConfig>,
    /// Towards the sandbox, per host (the hosts are the credentials', so
    /// this stays small).
    leaves: Mutex<HashMap<String, Arc<rustls::ServerConfig>>>,
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn make(e: impl std::fmt::Display) -> CaError {
    CaError::Make(e.to_string())
}

/// The current year, for certificates valid from a year ago to two years on
/// (the instance's life has no set end).
fn year() -> i32 {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    1970 + (secs / 31_556_952) as i32
}

impl Tls {
    /// A fresh CA for `hosts` (canonical names) and the upstream settings.
    pub(crate) fn new(hosts: &[String], upstream_ca: &[PathBuf]) -> Result<Tls, CaError> {
        let key = KeyPair::generate().map_err(make)?;
        let mut p = CertificateParams::new(Vec::<String>::new()).map_err(make)?;
        p.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        p.distinguished_name.push(
            DnType::CommonName,
            format!("sandmux instance CA {}", &crate::nonce::hex()[..8]),
        );
        p.distinguished_name
            .push(DnType::OrganizationName, "sandmux credential proxy");
        p.name_constraints = Some(NameConstraints {
            permitted_subtrees: hosts.iter().cloned().map(GeneralSubtree::DnsName).collect(),
            excluded_subtrees: vec![],
        });
        let y = year();
        p.not_before = rcgen::date_time_ymd(y - 1, 1, 1);
        p.not_after = rcgen::date_time_ymd(y + 2, 1, 1);
        let ca = CertifiedIssuer::self_signed(p, key).map_err(make)?;
        Ok(Tls {
            ca,
            upstream: upstream(upstream_ca)?,
            leaves: Mutex::default(),
        })
    }

    /// The CA's certificate (PEM): what the sandbox trusts.
    pub(crate) fn ca_pem(&self) -> String {
        self.ca.pem()
    }

    /// The server settings for `host` (made at its first connection).
    pub(crate) fn server_for(&self, host: &str) -> Result<Arc<rustls::ServerConfig>, CaError> {
        let mut g = self.leaves.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = g.get(host) {
            return Ok(c.clone());
        }
        let key = KeyPair::generate().map_err(make)?;
        let mut p = CertificateParams::new(vec![host.to_string()]).map_err(make)?;
        p.distinguished_name.push(DnType::CommonName, host);
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        p.use_authority_key_identifier_extension = true;
        let y = year();
        p.not_before = rcgen::date_time_ymd(y - 1, 1, 1);
        p.not_after = rcgen::date_time_ymd(y + 2, 1, 1);
        let leaf = p.signed_by(&key, &self.ca).map_err(make)?;
        let chain = vec![leaf.der().clone(), self.ca.der().clone()];
        let der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let mut cfg = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(make)?
            .with_no_client_auth()
            .with_single_cert(chain, der)
            .map_err(make)?;
        // HTTP/1.x only: a client offering h2 alone is refused in the
        // handshake, one offering h2 and HTTP/1.1 falls back.
        cfg.alpn_protocols = vec![b"http/1.1".to_vec(), b"http/1.0".to_vec()];
        let cfg = Arc::new(cfg);
        g.insert(host.to_string(), cfg.clone());
        Ok(cfg)
    }
}

/// The upstream settings: the host's roots (as `rustls-native-certs` finds
/// them) and `extra`, HTTP/1.1 in ALPN.
fn upstream(extra: &[PathBuf]) -> Result<Arc<rustls::ClientConfig>, CaError> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    let (added, _) = roots.add_parsable_certificates(native.certs);
    for path in extra {
        let up = |why: String| CaError::Upstream {
            path: path.clone(),
            why,
        };
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
            .map_err(|e| up(e.to_string()))?
            .collect::<Result<_, _>>()
            .map_err(|e| up(e.to_string()))?;
        if certs.is_empty() {
            return Err(up("no PEM certificate in it".into()));
        }
        for c in certs {
            roots.add(c).map_err(|e| up(e.to_string()))?;
        }
    }
    if roots.is_empty() {
        let why = native
            .errors
            .first()
            .map(|e| e.to_string())
            .unwrap_or_else(|| format!("{added} usable"));
        return Err(CaError::NoRoots(why));
    }
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(make)?
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}
