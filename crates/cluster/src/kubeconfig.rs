//! The kubeconfig a running embedded cluster writes for `kubectl` and other clients.

use std::io;
use std::path::Path;

/// A kubeconfig with one cluster (trusting `ca_pem`), one user (the bearer token) and
/// one current context.
pub fn render(server: &str, ca_pem: &str, token: &str) -> String {
    use base64::Engine as _;
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    format!(
        "apiVersion: v1\n\
         kind: Config\n\
         clusters:\n\
         - name: capstan-embedded\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\n\
         users:\n\
         - name: capstan\n  user:\n    token: {token}\n\
         contexts:\n\
         - name: capstan-embedded\n  context:\n    cluster: capstan-embedded\n    user: capstan\n    namespace: default\n\
         current-context: capstan-embedded\n"
    )
}

/// Writes a rendered kubeconfig, readable by its owner only (it holds the token).
pub fn write(path: &Path, kubeconfig: &str) -> io::Result<()> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)?;
    }
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, kubeconfig)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))?;
    }
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubeconfig_parses_as_kube_config() {
        let text = render(
            "https://127.0.0.1:6443",
            "-----BEGIN CERTIFICATE-----\n",
            "secret-token",
        );
        let config: kube::config::Kubeconfig =
            serde_saphyr::from_str(&text).expect("valid kubeconfig");
        assert_eq!(config.current_context.as_deref(), Some("capstan-embedded"));
        assert_eq!(
            config.clusters[0]
                .cluster
                .as_ref()
                .and_then(|c| c.server.as_deref()),
            Some("https://127.0.0.1:6443")
        );
    }
}
