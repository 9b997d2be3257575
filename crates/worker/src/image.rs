//! Pulling the kmod image from its registry into the worker's own filesystem.
//!
//! The worker pulls the image itself (seed 001): the manifest (for a multi-platform
//! index, the entry for Linux on the running architecture), then every layer, each
//! checked against the digest and size the manifest gives, then unpacked in order
//! ([`super::extract`]), each uncompressed layer checked against the image config's
//! `diff_id` when the config has them. Nothing is unpacked from a blob that failed a
//! check.
//!
//! The image lands in `<image dir>/<algorithm>-<hex of the manifest digest>`, written
//! under a temporary name and renamed when complete, so a directory of that name is
//! always a whole image; a later pull of the same digest reuses it.
//!
//! Registries are reached over HTTPS with verified certificates. An insecure pull (the
//! config's `insecurePull`, or a registry listed as insecure) tries HTTPS without
//! verifying the certificate, then plain HTTP, as container runtimes do for insecure
//! registries. Credentials come from the pull secret ([`super::pull_secret`]); without a
//! matching entry the pull is anonymous.

use std::path::{Path, PathBuf};
use std::time::Duration;

use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::errors::{DigestError, OciDistributionError};
use oci_client::manifest::{ImageIndexEntry, OciDescriptor, OciImageManifest, OciManifest};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use thiserror::Error;

use super::extract::{self, ExtractError};
use super::one_line;
use super::pull_secret::PullSecret;

/// How the worker may reach the registry, and as whom.
#[derive(Clone, Debug, Default)]
pub struct PullOptions {
    /// Allow plain HTTP and unverified certificates for this image's registry (the
    /// config's `insecurePull`).
    pub insecure: bool,
    /// Registries (`host[:port]`) allowed plain HTTP and unverified certificates for
    /// every image.
    pub insecure_registries: Vec<String>,
    /// Credentials by registry; empty for anonymous pulls.
    pub pull_secret: PullSecret,
}

/// An image pulled and unpacked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PulledImage {
    /// The directory holding the image's filesystem.
    pub root: PathBuf,
    /// The digest of the image manifest unpacked (for an index, the chosen entry's).
    pub digest: String,
    /// How many layers it has.
    pub layers: usize,
    /// True when `root` was there already, from an earlier pull of the same digest.
    pub reused: bool,
}

/// Why an image could not be pulled. Each message is one line and names the image.
#[derive(Debug, Error)]
pub enum PullError {
    /// The image reference does not parse.
    #[error("invalid image reference {image:?}: {reason}")]
    Reference {
        /// The reference as given.
        image: String,
        /// What the parser said.
        reason: String,
    },
    /// The registry could not be reached, refused the pull, or sent something that is
    /// not an image.
    #[error("cannot pull {image}: {reason}")]
    Registry {
        /// The image.
        image: String,
        /// What went wrong, with every cause.
        reason: String,
    },
    /// An index without an entry for this platform.
    #[error("cannot pull {image}: the image index has no {wanted} image (it has: {available})")]
    NoPlatform {
        /// The image.
        image: String,
        /// `os/architecture` looked for.
        wanted: String,
        /// The platforms the index lists, comma-separated.
        available: String,
    },
    /// A blob whose content is not what the manifest says.
    #[error(
        "cannot pull {image}: {blob} has digest {actual}, the manifest says {expected}: the registry sent corrupted or tampered content"
    )]
    Digest {
        /// The image.
        image: String,
        /// Which blob: `layer 2 (sha256:...)`, `the config (sha256:...)`.
        blob: String,
        /// The digest the manifest gives.
        expected: String,
        /// The digest of what arrived.
        actual: String,
    },
    /// A blob whose size is not what the manifest says.
    #[error("cannot pull {image}: {blob} has {actual} bytes, the manifest says {expected}")]
    Size {
        /// The image.
        image: String,
        /// Which blob.
        blob: String,
        /// The size the manifest gives.
        expected: i64,
        /// The size of what arrived.
        actual: u64,
    },
    /// A layer the worker cannot unpack (zstd, or not a tar archive).
    #[error(
        "cannot pull {image}: layer {index} ({digest}) is {media_type}, not a tar or tar+gzip layer"
    )]
    UnsupportedLayer {
        /// The image.
        image: String,
        /// The layer's position, from 1.
        index: usize,
        /// The layer's digest.
        digest: String,
        /// Its media type.
        media_type: String,
    },
    /// A layer that could not be unpacked.
    #[error("cannot unpack {image}: layer {index} ({digest}): {source}")]
    Layer {
        /// The image.
        image: String,
        /// The layer's position, from 1.
        index: usize,
        /// The layer's digest.
        digest: String,
        /// What went wrong.
        #[source]
        source: ExtractError,
    },
    /// The image directory could not be prepared.
    #[error("cannot {action} {}: {source}", path.display())]
    Directory {
        /// What was being done.
        action: &'static str,
        /// The directory.
        path: PathBuf,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
}

/// One way of reaching a registry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// HTTPS, the certificate verified.
    Https,
    /// HTTPS, any certificate accepted.
    HttpsUnverified,
    /// Plain HTTP.
    Http,
}

impl Transport {
    fn describe(self) -> &'static str {
        match self {
            Transport::Https => "over HTTPS",
            Transport::HttpsUnverified => "over HTTPS without certificate verification",
            Transport::Http => "over HTTP",
        }
    }
}

/// The ways to try, in order, for `registry` (`host[:port]`): verified HTTPS only, unless
/// the pull is `insecure` or the registry is one of `insecure_registries`.
pub fn transports(
    registry: &str,
    insecure: bool,
    insecure_registries: &[String],
) -> Vec<Transport> {
    let listed = insecure_registries
        .iter()
        .any(|listed| listed.trim().eq_ignore_ascii_case(registry));
    if insecure || listed {
        vec![Transport::HttpsUnverified, Transport::Http]
    } else {
        vec![Transport::Https]
    }
}

/// The OCI name (Go's `GOARCH`) of the architecture this process runs on.
pub fn running_architecture() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" if cfg!(target_endian = "little") => "ppc64le",
        other => other,
    }
}

/// The entry of an image index for `os`/`architecture`: the first one listed.
pub fn pick_platform<'a>(
    entries: &'a [ImageIndexEntry],
    os: &str,
    architecture: &str,
) -> Option<&'a ImageIndexEntry> {
    entries.iter().find(|entry| {
        entry.platform.as_ref().is_some_and(|platform| {
            platform.os.to_string() == os && platform.architecture.to_string() == architecture
        })
    })
}

const IMAGE_CONFIG_TYPES: [&str; 2] = [
    "application/vnd.oci.image.config.v1+json",
    "application/vnd.docker.container.image.v1+json",
];

/// Per read; a stalled registry fails the pull rather than the pod hanging.
const READ_TIMEOUT: Duration = Duration::from_secs(120);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// Pulls `image` and unpacks it under `image_dir` (created if missing), reusing an
/// earlier pull of the same manifest digest there. Installs the process's rustls crypto
/// provider if start-up has not ([`capstan_api::install_crypto_provider`]): the HTTP client
/// cannot be built without one.
///
/// Fails, with the reason on one line, when the reference does not parse, the registry
/// cannot be reached over any allowed transport or refuses the pull, an index has no
/// entry for this platform, a blob's digest or size differs from the manifest's, a layer
/// is not tar or tar+gzip, a layer is refused by [`extract::extract_layer`], or the
/// directory cannot be written.
pub async fn pull(
    image: &str,
    image_dir: &Path,
    options: &PullOptions,
) -> Result<PulledImage, PullError> {
    let (reference, repository, auth) = reach(image, options)?;
    let credentials = options.pull_secret.credentials_for(&repository);
    let registry_error = |reason: String| PullError::Registry {
        image: image.to_string(),
        reason,
    };
    let mut failures = Vec::new();
    for transport in transports(
        reference.registry(),
        options.insecure,
        &options.insecure_registries,
    ) {
        let client = client(transport).map_err(|err| registry_error(one_line(&err)))?;
        match resolve_manifest(&client, &reference, &auth).await {
            Ok((manifest, digest)) => {
                tracing::info!(%image, %digest, transport = transport.describe(), "pulling");
                let pull = Pull {
                    image,
                    client: &client,
                    reference: &reference,
                };
                return pull.fetch(&manifest, &digest, image_dir).await;
            }
            Err(Resolve::Registry(OciDistributionError::RequestError(err))) => {
                failures.push(format!("{}: {}", transport.describe(), one_line(&err)));
            }
            Err(Resolve::Registry(err)) => {
                let mut reason = one_line(&err);
                if let OciDistributionError::UnauthorizedError { .. } = err {
                    reason.push_str(&match credentials {
                        Some(c) => format!(
                            " (the pull secret's credentials of user {:?} for {repository} were refused)",
                            c.username
                        ),
                        None => format!(
                            " (pulled anonymously: no pull secret entry matches {repository})"
                        ),
                    });
                }
                return Err(registry_error(reason));
            }
            Err(Resolve::NoPlatform { wanted, available }) => {
                return Err(PullError::NoPlatform {
                    image: image.to_string(),
                    wanted,
                    available,
                });
            }
        }
    }
    Err(registry_error(failures.join("; ")))
}

/// Whether `image` exists in its registry, as KMM's `ImageExists` asks before it builds:
/// its manifest is fetched (a HEAD-like request, no layer is pulled) over each transport
/// the options allow, with the pull secret's credentials. `Ok(false)` when the registry
/// answers that the manifest is unknown; `Err` when the reference does not parse or the
/// registry cannot be asked (unreachable, credentials refused).
pub async fn exists(image: &str, options: &PullOptions) -> Result<bool, PullError> {
    let (reference, _, auth) = reach(image, options)?;
    let registry_error = |reason: String| PullError::Registry {
        image: image.to_string(),
        reason,
    };
    let mut failures = Vec::new();
    for transport in transports(
        reference.registry(),
        options.insecure,
        &options.insecure_registries,
    ) {
        let client = client(transport).map_err(|err| registry_error(one_line(&err)))?;
        match client.fetch_manifest_digest(&reference, &auth).await {
            Ok(_) => return Ok(true),
            Err(OciDistributionError::RequestError(err)) => {
                failures.push(format!("{}: {}", transport.describe(), one_line(&err)));
            }
            Err(OciDistributionError::ImageManifestNotFoundError(_)) => return Ok(false),
            Err(OciDistributionError::RegistryError { envelope, .. })
                if envelope.errors.iter().any(|e| {
                    matches!(
                        e.code,
                        oci_client::errors::OciErrorCode::ManifestUnknown
                            | oci_client::errors::OciErrorCode::NameUnknown
                    )
                }) =>
            {
                return Ok(false);
            }
            Err(OciDistributionError::ServerError { code: 404, .. }) => return Ok(false),
            Err(err) => return Err(registry_error(one_line(&err))),
        }
    }
    Err(registry_error(failures.join("; ")))
}

/// How `image` is reached: its reference, its repository (`registry/path`, as pull
/// secrets name it) and the credentials the pull secret has for it.
fn reach(
    image: &str,
    options: &PullOptions,
) -> Result<(Reference, String, RegistryAuth), PullError> {
    capstan_api::install_crypto_provider();
    let reference: Reference =
        image
            .parse()
            .map_err(|err: oci_client::ParseError| PullError::Reference {
                image: image.to_string(),
                reason: err.to_string(),
            })?;
    let repository = format!("{}/{}", reference.registry(), reference.repository());
    let auth = match options.pull_secret.credentials_for(&repository) {
        Some(c) => RegistryAuth::Basic(c.username.clone(), c.password.clone()),
        None => RegistryAuth::Anonymous,
    };
    Ok((reference, repository, auth))
}

fn client(transport: Transport) -> Result<Client, OciDistributionError> {
    let config = ClientConfig {
        protocol: match transport {
            Transport::Http => ClientProtocol::Http,
            Transport::Https | Transport::HttpsUnverified => ClientProtocol::Https,
        },
        accept_invalid_certificates: transport == Transport::HttpsUnverified,
        // Indexes are resolved here, to say which platforms an index has.
        platform_resolver: None,
        connect_timeout: Some(CONNECT_TIMEOUT),
        read_timeout: Some(READ_TIMEOUT),
        user_agent: concat!("capstan-worker/", env!("CARGO_PKG_VERSION")),
        ..ClientConfig::default()
    };
    Client::try_from(config)
}

enum Resolve {
    Registry(OciDistributionError),
    NoPlatform { wanted: String, available: String },
}

/// The image manifest of `reference` and its digest, through an index if need be.
async fn resolve_manifest(
    client: &Client,
    reference: &Reference,
    auth: &RegistryAuth,
) -> Result<(OciImageManifest, String), Resolve> {
    let (manifest, digest) = client
        .pull_manifest(reference, auth)
        .await
        .map_err(Resolve::Registry)?;
    let index = match manifest {
        OciManifest::Image(manifest) => return Ok((manifest, digest)),
        OciManifest::ImageIndex(index) => index,
    };
    let architecture = running_architecture();
    let Some(entry) = pick_platform(&index.manifests, "linux", architecture) else {
        let available: Vec<String> = index
            .manifests
            .iter()
            .filter_map(|entry| entry.platform.as_ref())
            .map(|p| format!("{}/{}", p.os, p.architecture))
            .collect();
        return Err(Resolve::NoPlatform {
            wanted: format!("linux/{architecture}"),
            available: if available.is_empty() {
                "no platforms".to_string()
            } else {
                available.join(", ")
            },
        });
    };
    // Pulled by digest, the manifest is checked against it.
    let by_digest = reference.clone_with_digest(entry.digest.clone());
    match client.pull_manifest(&by_digest, auth).await {
        Ok((OciManifest::Image(manifest), _)) => Ok((manifest, entry.digest.clone())),
        Ok((OciManifest::ImageIndex(_), _)) => Err(Resolve::Registry(
            OciDistributionError::ImageManifestNotFoundError(format!(
                "the index entry {} is another index",
                entry.digest
            )),
        )),
        Err(err) => Err(Resolve::Registry(err)),
    }
}

/// One pull in progress, its registry reached. The client keeps the credentials the
/// manifest was pulled with for the blobs.
struct Pull<'a> {
    image: &'a str,
    client: &'a Client,
    reference: &'a Reference,
}

impl Pull<'_> {
    async fn fetch(
        &self,
        manifest: &OciImageManifest,
        digest: &str,
        image_dir: &Path,
    ) -> Result<PulledImage, PullError> {
        let mut layers = Vec::new();
        for (at, layer) in manifest.layers.iter().enumerate() {
            let compression = extract::layer_compression(&layer.media_type).ok_or_else(|| {
                PullError::UnsupportedLayer {
                    image: self.image.to_string(),
                    index: at + 1,
                    digest: layer.digest.clone(),
                    media_type: layer.media_type.clone(),
                }
            })?;
            layers.push((layer, compression));
        }
        let name = digest.replace(':', "-");
        let root = image_dir.join(&name);
        if root.is_dir() {
            tracing::info!(root = %root.display(), "image already unpacked");
            return Ok(PulledImage {
                root,
                digest: digest.to_string(),
                layers: layers.len(),
                reused: true,
            });
        }
        let diff_ids = self.diff_ids(manifest, layers.len()).await?;
        let staging = Scratch::create(image_dir.join(format!(".partial-{name}")))?;
        let blobs = Scratch::create(image_dir.join(format!(".blobs-{name}")))?;
        for (at, (layer, compression)) in layers.iter().enumerate() {
            let index = at + 1;
            let blob = blobs.path.join(format!("layer-{index}"));
            self.download(layer, &format!("layer {index} ({})", layer.digest), &blob)
                .await?;
            let (into, diff_id) = (staging.path.clone(), diff_ids.get(at).cloned());
            let compression = *compression;
            let report = tokio::task::spawn_blocking(move || {
                extract::extract_layer(&blob, compression, &into, diff_id.as_deref())
            })
            .await
            .map_err(|err| PullError::Registry {
                image: self.image.to_string(),
                reason: format!("unpacking stopped: {err}"),
            })?
            .map_err(|source| PullError::Layer {
                image: self.image.to_string(),
                index,
                digest: layer.digest.clone(),
                source,
            })?;
            tracing::info!(layer = index, digest = %layer.digest, written = report.written,
                whiteouts = report.whiteouts, skipped = report.skipped, "unpacked layer");
        }
        std::fs::rename(&staging.path, &root).map_err(|source| PullError::Directory {
            action: "rename the unpacked image to",
            path: root.clone(),
            source,
        })?;
        Ok(PulledImage {
            root,
            digest: digest.to_string(),
            layers: layers.len(),
            reused: false,
        })
    }

    /// The config's `rootfs.diff_ids`, when it is an image config with one per layer.
    async fn diff_ids(
        &self,
        manifest: &OciImageManifest,
        layers: usize,
    ) -> Result<Vec<String>, PullError> {
        let config = &manifest.config;
        if !IMAGE_CONFIG_TYPES.contains(&config.media_type.as_str()) {
            return Ok(Vec::new());
        }
        let mut bytes = Vec::new();
        self.client
            .pull_blob(self.reference, config, &mut bytes)
            .await
            .map_err(|err| self.blob_error(&format!("the config ({})", config.digest), err))?;
        let diff_ids: Vec<String> = serde_json::from_slice::<serde_json::Value>(&bytes)
            .ok()
            .and_then(|value| {
                value["rootfs"]["diff_ids"].as_array().map(|ids| {
                    ids.iter()
                        .filter_map(|id| id.as_str().map(str::to_string))
                        .collect()
                })
            })
            .unwrap_or_default();
        Ok(if diff_ids.len() == layers {
            diff_ids
        } else {
            Vec::new()
        })
    }

    async fn download(&self, blob: &OciDescriptor, what: &str, to: &Path) -> Result<(), PullError> {
        let file = tokio::fs::File::create(to)
            .await
            .map_err(|source| PullError::Directory {
                action: "create",
                path: to.to_path_buf(),
                source,
            })?;
        let limited = SizeLimited {
            inner: file,
            left: u64::try_from(blob.size).unwrap_or(0),
            limit: blob.size,
        };
        self.client
            .pull_blob(self.reference, blob, limited)
            .await
            .map_err(|err| self.blob_error(what, err))?;
        let size = std::fs::metadata(to)
            .map_err(|source| PullError::Directory {
                action: "read",
                path: to.to_path_buf(),
                source,
            })?
            .len();
        if i64::try_from(size).ok() != Some(blob.size) {
            return Err(PullError::Size {
                image: self.image.to_string(),
                blob: what.to_string(),
                expected: blob.size,
                actual: size,
            });
        }
        Ok(())
    }

    fn blob_error(&self, what: &str, err: OciDistributionError) -> PullError {
        match err {
            OciDistributionError::DigestError(DigestError::VerificationError {
                expected,
                actual,
            }) => PullError::Digest {
                image: self.image.to_string(),
                blob: what.to_string(),
                expected,
                actual,
            },
            other => PullError::Registry {
                image: self.image.to_string(),
                reason: format!("{what}: {}", one_line(&other)),
            },
        }
    }
}

/// A blob file that takes no more bytes than the manifest announced, so a registry
/// cannot fill the disk with a blob that would fail its digest check anyway.
struct SizeLimited {
    inner: tokio::fs::File,
    left: u64,
    limit: i64,
}

impl tokio::io::AsyncWrite for SizeLimited {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        if buf.len() as u64 > self.left {
            let limit = self.limit;
            return std::task::Poll::Ready(Err(std::io::Error::other(format!(
                "the registry sent more than the manifest's {limit} bytes"
            ))));
        }
        let written = std::pin::Pin::new(&mut self.inner).poll_write(cx, buf);
        if let std::task::Poll::Ready(Ok(count)) = &written {
            self.left -= *count as u64;
        }
        written
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A directory of the pull's own, removed with what it holds when dropped.
struct Scratch {
    path: PathBuf,
}

impl Scratch {
    fn create(path: PathBuf) -> Result<Scratch, PullError> {
        let failed = |action: &'static str, path: &Path| {
            let path = path.to_path_buf();
            move |source| PullError::Directory {
                action,
                path,
                source,
            }
        };
        if path.exists() {
            // Left by a pull that was killed.
            std::fs::remove_dir_all(&path).map_err(failed("remove", &path))?;
        }
        std::fs::create_dir_all(&path).map_err(failed("create", &path))?;
        Ok(Scratch { path })
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // Gone already when the staging directory was renamed into place.
        if self.path.exists()
            && let Err(err) = std::fs::remove_dir_all(&self.path)
        {
            tracing::warn!(path = %self.path.display(), error = %err, "cannot remove");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insecure_pulls_try_unverified_https_then_http() {
        let listed = vec!["127.0.0.1:5000".to_string(), "Registry.Local".to_string()];
        let secure = vec![Transport::Https];
        let insecure = vec![Transport::HttpsUnverified, Transport::Http];
        // (registry, insecurePull, transports)
        let cases = [
            ("registry.example", false, &secure),
            ("registry.example", true, &insecure),
            ("127.0.0.1:5000", false, &insecure),
            ("127.0.0.1:5001", false, &secure),
            ("registry.local", false, &insecure),
        ];
        for (registry, insecure_pull, want) in cases {
            assert_eq!(
                &transports(registry, insecure_pull, &listed),
                want,
                "{registry} {insecure_pull}"
            );
        }
    }

    #[test]
    fn the_index_entry_for_the_platform_is_picked() {
        let index: Vec<ImageIndexEntry> = serde_json::from_value(serde_json::json!([
            {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": "sha256:arm", "size": 1,
             "platform": {"architecture": "arm64", "os": "linux", "variant": "v8"}},
            {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": "sha256:attestation", "size": 1},
            {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": "sha256:windows", "size": 1,
             "platform": {"architecture": "amd64", "os": "windows"}},
            {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": "sha256:amd64", "size": 1,
             "platform": {"architecture": "amd64", "os": "linux"}},
            {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": "sha256:amd64-again", "size": 1,
             "platform": {"architecture": "amd64", "os": "linux"}},
        ]))
        .unwrap();
        let cases = [
            ("linux", "amd64", Some("sha256:amd64")),
            ("linux", "arm64", Some("sha256:arm")),
            ("windows", "amd64", Some("sha256:windows")),
            ("linux", "s390x", None),
        ];
        for (os, architecture, want) in cases {
            let got = pick_platform(&index, os, architecture).map(|e| e.digest.as_str());
            assert_eq!(got, want, "{os}/{architecture}");
        }
    }

    #[test]
    fn the_running_architecture_has_its_oci_name() {
        let name = running_architecture();
        assert!(!name.is_empty());
        if cfg!(target_arch = "x86_64") {
            assert_eq!(name, "amd64");
        }
    }
}
