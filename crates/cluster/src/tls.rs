//! HTTPS for the embedded API server. Kubernetes clients send bearer tokens only over
//! TLS (client-go refuses plain HTTP), so the server has a certificate authority of its
//! own: its certificate goes into the kubeconfig, and it signs the serving certificate
//! at every start. With a state dir the CA key is kept, so kubeconfigs stay valid
//! across restarts.

use std::fs;
use std::io;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// Why TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("generating certificates: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
}

/// The CA clients trust and the server's TLS configuration.
pub struct ServingCertificates {
    /// PEM of the CA certificate (for the kubeconfig's certificate-authority-data).
    pub ca_pem: String,
    /// DER of the CA certificate (for in-process clients).
    pub ca_der: Vec<u8>,
    pub server_config: Arc<rustls::ServerConfig>,
}

const CA_KEY: &str = "ca.key";
const CA_CERT: &str = "ca.crt";

fn ca_params() -> Result<CertificateParams, rcgen::Error> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(DnType::CommonName, "capstan embedded cluster CA");
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    // Fixed validity so a CA rebuilt from its kept key has the same identity.
    params.not_before = rcgen::date_time_ymd(2024, 1, 1);
    params.not_after = rcgen::date_time_ymd(2124, 1, 1);
    Ok(params)
}

/// Loads the CA from `state_dir` (creating it there the first time), or makes a
/// throw-away one without a state dir; then issues a serving certificate for
/// localhost and `listen_ip`.
pub fn serving_certificates(
    state_dir: Option<&Path>,
    listen_ip: IpAddr,
) -> Result<ServingCertificates, TlsError> {
    let (ca_key, ca_pem) = match state_dir {
        Some(dir) => load_or_create_ca(dir)?,
        None => {
            let key = KeyPair::generate()?;
            let pem = ca_params()?.self_signed(&key)?.pem();
            (key, pem)
        }
    };
    let ca_der = pem_to_der(&ca_pem).unwrap_or_default();
    let issuer = Issuer::new(ca_params()?, ca_key);
    let mut names = vec![
        "localhost".to_string(),
        "127.0.0.1".to_string(),
        "::1".to_string(),
    ];
    if !listen_ip.is_unspecified() {
        names.push(listen_ip.to_string());
    }
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params
        .distinguished_name
        .push(DnType::CommonName, "capstan embedded API server");
    params.subject_alt_names = names
        .iter()
        .map(|n| match n.parse::<IpAddr>() {
            Ok(ip) => Ok(SanType::IpAddress(ip)),
            Err(_) => n.clone().try_into().map(SanType::DnsName),
        })
        .collect::<Result<_, _>>()?;
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let server_key = KeyPair::generate()?;
    let server_cert = params.signed_by(&server_key, &issuer)?;
    let chain = vec![
        server_cert.der().clone(),
        CertificateDer::from(ca_der.clone()),
    ];
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(server_key.serialize_der()));
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_no_client_auth()
    .with_single_cert(chain, key)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(ServingCertificates {
        ca_pem,
        ca_der,
        server_config: Arc::new(config),
    })
}

fn load_or_create_ca(dir: &Path) -> Result<(KeyPair, String), TlsError> {
    let key_path = dir.join(CA_KEY);
    let cert_path = dir.join(CA_CERT);
    let io_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| TlsError::Io { path, source }
    };
    if key_path.exists() && cert_path.exists() {
        let key = KeyPair::from_pem(&fs::read_to_string(&key_path).map_err(io_err(&key_path))?)?;
        let pem = fs::read_to_string(&cert_path).map_err(io_err(&cert_path))?;
        return Ok((key, pem));
    }
    fs::create_dir_all(dir).map_err(io_err(dir))?;
    let key = KeyPair::generate()?;
    let pem = ca_params()?.self_signed(&key)?.pem();
    write_private(&key_path, &key.serialize_pem()).map_err(io_err(&key_path))?;
    fs::write(&cert_path, &pem).map_err(io_err(&cert_path))?;
    Ok((key, pem))
}

fn write_private(path: &Path, contents: &str) -> io::Result<()> {
    fs::write(path, contents)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        fs::set_permissions(path, fs::Permissions::from_mode(0o600))?;
    }
    Ok(())
}

fn pem_to_der(pem: &str) -> Option<Vec<u8>> {
    use base64::Engine as _;
    let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    base64::engine::general_purpose::STANDARD.decode(body).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_ca_signs_the_same_identity_after_a_restart() {
        let dir = tempfile::tempdir().expect("tempdir");
        let first = serving_certificates(Some(dir.path()), "127.0.0.1".parse().expect("ip"))
            .expect("first");
        let second = serving_certificates(Some(dir.path()), "127.0.0.1".parse().expect("ip"))
            .expect("second");
        assert_eq!(first.ca_pem, second.ca_pem);
        assert!(first.ca_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(!first.ca_der.is_empty());
    }
}
