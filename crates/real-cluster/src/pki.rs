//! The control plane's keys and certificates: a CA, the API
//! server's serving certificate for loopback and the in-cluster service names, one client
//! certificate per component (its user and groups are what RBAC and the Node authorizer
//! see), and the service-account signing key.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

/// A certificate and its key, as PEM files.
#[derive(Clone, Debug)]
pub struct Pair {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// Everything the components are started with.
#[derive(Clone, Debug)]
pub struct Pki {
    /// The CA certificate (PEM text), trusted by every client and by the API server for
    /// client certificates.
    pub ca_pem: String,
    pub ca: Pair,
    pub apiserver: Pair,
    /// `system:masters`: the administrator tests and capstan act as.
    pub admin: Pair,
    pub controller_manager: Pair,
    pub scheduler: Pair,
    /// The service-account token signing key (private) and its public half.
    pub service_account_key: PathBuf,
    pub service_account_pub: PathBuf,
}

impl Pki {
    /// Every file of it.
    pub fn files(&self) -> Vec<&Path> {
        let mut files = Vec::new();
        for pair in [
            &self.ca,
            &self.apiserver,
            &self.admin,
            &self.controller_manager,
            &self.scheduler,
        ] {
            files.extend([pair.cert.as_path(), pair.key.as_path()]);
        }
        files.extend([
            self.service_account_key.as_path(),
            self.service_account_pub.as_path(),
        ]);
        files
    }
}

/// Writes a fresh PKI into `dir`.
pub fn create(dir: &Path) -> anyhow::Result<Pki> {
    let ca_key = KeyPair::generate()?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "capstan real-cluster CA");
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca_params.self_signed(&ca_key)?;
    let ca_pem = ca_cert.pem();
    let ca = write_pair(dir, "ca", &ca_pem, &ca_key)?;
    let issuer = Issuer::new(ca_params, ca_key);

    let serving_names = [
        "127.0.0.1",
        "localhost",
        // The `kubernetes` Service's cluster IP: the first of --service-cluster-ip-range.
        "10.0.0.1",
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
    ];
    let apiserver = issue(
        dir,
        "apiserver",
        &issuer,
        "kube-apiserver",
        &[],
        &serving_names,
    )?;
    let admin = issue(dir, "admin", &issuer, "admin", &["system:masters"], &[])?;
    let controller_manager = issue(
        dir,
        "controller-manager",
        &issuer,
        "system:kube-controller-manager",
        &[],
        &[],
    )?;
    let scheduler = issue(dir, "scheduler", &issuer, "system:kube-scheduler", &[], &[])?;

    let service_account = KeyPair::generate()?;
    let service_account_key = dir.join("service-account.key");
    let service_account_pub = dir.join("service-account.pub");
    std::fs::write(&service_account_key, service_account.serialize_pem())?;
    std::fs::write(&service_account_pub, service_account.public_key_pem())?;

    Ok(Pki {
        ca_pem,
        ca,
        apiserver,
        admin,
        controller_manager,
        scheduler,
        service_account_key,
        service_account_pub,
    })
}

/// The PKI [`create`] wrote into `dir` (or a copy of it).
pub fn open(dir: &Path) -> anyhow::Result<Pki> {
    let pair = |file: &str| Pair {
        cert: dir.join(format!("{file}.crt")),
        key: dir.join(format!("{file}.key")),
    };
    let ca = pair("ca");
    let ca_pem = std::fs::read_to_string(&ca.cert)
        .map_err(|err| anyhow::anyhow!("{}: {err}", ca.cert.display()))?;
    Ok(Pki {
        ca_pem,
        ca,
        apiserver: pair("apiserver"),
        admin: pair("admin"),
        controller_manager: pair("controller-manager"),
        scheduler: pair("scheduler"),
        service_account_key: dir.join("service-account.key"),
        service_account_pub: dir.join("service-account.pub"),
    })
}

/// A certificate for `user` in `groups`, serving `names` when there are any, else a client
/// certificate.
fn issue(
    dir: &Path,
    file: &str,
    issuer: &Issuer<'_, KeyPair>,
    user: &str,
    groups: &[&str],
    names: &[&str],
) -> anyhow::Result<Pair> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name.push(DnType::CommonName, user);
    for group in groups {
        params
            .distinguished_name
            .push(DnType::OrganizationName, *group);
    }
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    if names.is_empty() {
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    } else {
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.subject_alt_names = names
            .iter()
            .map(|name| match name.parse() {
                Ok(ip) => Ok(SanType::IpAddress(ip)),
                Err(_) => name.to_string().try_into().map(SanType::DnsName),
            })
            .collect::<Result<_, _>>()?;
    }
    let cert = params.signed_by(&key, issuer)?;
    write_pair(dir, file, &cert.pem(), &key)
}

fn write_pair(dir: &Path, file: &str, cert_pem: &str, key: &KeyPair) -> anyhow::Result<Pair> {
    let cert = dir.join(format!("{file}.crt"));
    let key_path = dir.join(format!("{file}.key"));
    std::fs::write(&cert, cert_pem)?;
    std::fs::write(&key_path, key.serialize_pem())?;
    Ok(Pair {
        cert,
        key: key_path,
    })
}
