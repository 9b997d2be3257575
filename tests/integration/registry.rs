//! Shared helpers for the worker's tests: Debian's `docker-registry` on loopback, kernel
//! modules compiled with `gcc` that `depmod` and `modprobe` accept, and kmod images
//! built from them and pushed with oci-client.
#![allow(dead_code)]

use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference, RegistryOperation};
use serde_json::json;
use tempfile::TempDir;

/// How long the registry may take to start on a loaded machine.
const START_DEADLINE: Duration = Duration::from_secs(60);

pub const REGISTRY_BINARY: &str = "/usr/bin/docker-registry";

/// The kernel release the test modules are built for.
pub const KERNEL: &str = "6.1.0-capstan-test";

/// A user name and password the registry requires, when it requires one.
pub const USER: &str = "kmm";
pub const PASSWORD: &str = "pull-secret-password";

#[derive(Clone, Copy, Debug, Default)]
pub struct RegistryOptions {
    /// Require `USER`/`PASSWORD` (htpasswd basic auth).
    pub basic_auth: bool,
    /// Serve HTTPS with a self-signed certificate.
    pub tls: bool,
}

/// A `docker-registry serve` process on a loopback port, killed when dropped.
pub struct Registry {
    child: Child,
    dir: TempDir,
    port: u16,
    options: RegistryOptions,
}

/// The Debian packages tests run: the registry, and kmod's `depmod` and `modprobe` (`gcc`
/// builds the modules) for the worker's; cmark-gfm, GitHub's markdown renderer, for the
/// plan comment's (`plan_markdown_hostile`).
const PACKAGES: [(&str, &str); 4] = [
    ("docker-registry", REGISTRY_BINARY),
    ("kmod", "/usr/bin/kmod"),
    ("gcc", "/usr/bin/gcc"),
    ("cmark-gfm", "/usr/bin/cmark-gfm"),
];

/// Installs the missing [`PACKAGES`] with apt-get when this runs as root on a Debian
/// machine, so `cargo test` alone passes on a fresh one; elsewhere the tests that need them
/// say what to install.
pub fn ensure_packages() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let missing: Vec<&str> = PACKAGES
            .iter()
            .filter(|(_, binary)| !Path::new(binary).exists())
            .map(|(package, _)| *package)
            .collect();
        let root = Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|out| out.stdout.trim_ascii() == b"0");
        if missing.is_empty() || !root || !Path::new("/usr/bin/apt-get").exists() {
            return;
        }
        eprintln!("installing {} with apt-get", missing.join(", "));
        let apt = |args: &[&str]| {
            Command::new("apt-get")
                .args(args)
                .env("DEBIAN_FRONTEND", "noninteractive")
                .status()
                .is_ok_and(|status| status.success())
        };
        let installed = apt(&["update", "-qq"])
            && apt(&[
                &["install", "-y", "-qq", "--no-install-recommends"],
                &missing[..],
            ]
            .concat());
        if !installed {
            eprintln!("apt-get could not install {}", missing.join(", "));
        }
    });
}

impl Registry {
    pub fn start(options: RegistryOptions) -> Registry {
        ensure_packages();
        // The pushing client needs the process's crypto provider, as capstan's own.
        capstan_api::install_crypto_provider();
        assert!(
            Path::new(REGISTRY_BINARY).exists(),
            "{REGISTRY_BINARY} is missing: install Debian's docker-registry package \
             (apt-get install docker-registry), as .ci/run does"
        );
        let dir = TempDir::new().expect("temp dir");
        let mut extra = String::new();
        if options.basic_auth {
            let hash = bcrypt::hash(PASSWORD, 4).expect("bcrypt");
            let htpasswd = dir.path().join("htpasswd");
            std::fs::write(&htpasswd, format!("{USER}:{hash}\n")).unwrap();
            extra.push_str(&format!(
                "auth:\n  htpasswd:\n    realm: capstan-test\n    path: {}\n",
                htpasswd.display()
            ));
        }
        let mut tls = String::new();
        if options.tls {
            let certified =
                rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).unwrap();
            let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
            std::fs::write(&cert, certified.cert.pem()).unwrap();
            std::fs::write(&key, certified.signing_key.serialize_pem()).unwrap();
            tls = format!(
                "  tls:\n    certificate: {}\n    key: {}\n",
                cert.display(),
                key.display()
            );
        }
        // A port picked by the kernel is free unless someone takes it in between: retry.
        for _ in 0..5 {
            let port = free_port();
            let config = dir.path().join("config.yml");
            std::fs::write(
                &config,
                format!(
                    "version: 0.1\nlog:\n  level: warn\n  accesslog:\n    disabled: true\n\
                     storage:\n  filesystem:\n    rootdirectory: {}\n\
                     http:\n  addr: 127.0.0.1:{port}\n{tls}{extra}",
                    dir.path().join("storage").display()
                ),
            )
            .unwrap();
            let log_path = dir.path().join("registry.log");
            let log = std::fs::File::create(&log_path).unwrap();
            let mut child = Command::new(REGISTRY_BINARY)
                .arg("serve")
                .arg(&config)
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .expect("start docker-registry");
            if wait_until_serving(&mut child, port, &log_path) {
                return Registry {
                    child,
                    dir,
                    port,
                    options,
                };
            }
        }
        panic!("docker-registry did not start; see its log above");
    }

    /// `127.0.0.1:<port>`.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The registry's storage, to tamper with.
    pub fn storage(&self) -> PathBuf {
        self.dir.path().join("storage")
    }

    /// Where the registry keeps the blob `digest` (`sha256:<hex>`).
    pub fn blob_file(&self, digest: &str) -> PathBuf {
        let hex = digest.strip_prefix("sha256:").expect("a sha256 digest");
        self.storage()
            .join("docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }

    fn client(&self) -> Client {
        let config = ClientConfig {
            protocol: if self.options.tls {
                ClientProtocol::Https
            } else {
                ClientProtocol::Http
            },
            accept_invalid_certificates: true,
            ..ClientConfig::default()
        };
        Client::try_from(config).expect("oci client")
    }

    fn auth(&self) -> RegistryAuth {
        if self.options.basic_auth {
            RegistryAuth::Basic(USER.to_string(), PASSWORD.to_string())
        } else {
            RegistryAuth::Anonymous
        }
    }

    /// Pushes an image of `layers` as `<registry>/<repository>:<tag>`; returns its
    /// manifest's digest.
    pub async fn push_image(&self, repository: &str, tag: &str, layers: &[Blob]) -> String {
        let manifest = self.push_manifest_parts(repository, layers).await;
        self.push_manifest(repository, tag, &manifest, OCI_MANIFEST)
            .await
    }

    /// Pushes an index of images, one per `(os, architecture, layers)`, as
    /// `<registry>/<repository>:<tag>`; returns the digests of the images, in order.
    pub async fn push_index(
        &self,
        repository: &str,
        tag: &str,
        images: &[(&str, &str, Vec<Blob>)],
    ) -> Vec<String> {
        let mut entries = Vec::new();
        let mut digests = Vec::new();
        for (os, architecture, layers) in images {
            let manifest = self.push_manifest_parts(repository, layers).await;
            let digest = sha256(&manifest);
            self.push_manifest(repository, &digest, &manifest, OCI_MANIFEST)
                .await;
            entries.push(json!({
                "mediaType": OCI_MANIFEST, "digest": digest, "size": manifest.len(),
                "platform": {"os": os, "architecture": architecture},
            }));
            digests.push(digest);
        }
        let index = serde_json::to_vec(&json!({
            "schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries,
        }))
        .unwrap();
        self.push_manifest(repository, tag, &index, OCI_INDEX).await;
        digests
    }

    /// Pushes the config and layers; returns the image manifest.
    async fn push_manifest_parts(&self, repository: &str, layers: &[Blob]) -> Vec<u8> {
        let reference = self.reference(repository, "unused");
        let client = self.client();
        client
            .auth(&reference, &self.auth(), RegistryOperation::Push)
            .await
            .expect("registry auth");
        let config = serde_json::to_vec(&json!({
            "architecture": "amd64", "os": "linux",
            "rootfs": {"type": "layers", "diff_ids": layers.iter().map(|l| l.diff_id.clone()).collect::<Vec<_>>()},
        }))
        .unwrap();
        let config_digest = sha256(&config);
        client
            .push_blob(&reference, config.clone(), &config_digest)
            .await
            .expect("push config");
        for layer in layers {
            client
                .push_blob(&reference, layer.data.clone(), &layer.digest)
                .await
                .expect("push layer");
        }
        serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                       "digest": config_digest, "size": config.len()},
            "layers": layers.iter().map(|l| json!({
                "mediaType": l.media_type, "digest": l.digest, "size": l.data.len(),
            })).collect::<Vec<_>>(),
        }))
        .unwrap()
    }

    async fn push_manifest(
        &self,
        repository: &str,
        tag: &str,
        manifest: &[u8],
        media_type: &str,
    ) -> String {
        let reference = self.reference(repository, tag);
        let client = self.client();
        client
            .auth(&reference, &self.auth(), RegistryOperation::Push)
            .await
            .expect("registry auth");
        client
            .push_manifest_raw(
                &reference,
                manifest.to_vec(),
                http::HeaderValue::from_str(media_type).unwrap(),
            )
            .await
            .expect("push manifest");
        sha256(manifest)
    }

    fn reference(&self, repository: &str, tag: &str) -> Reference {
        let text = if tag.starts_with("sha256:") {
            format!("{}/{repository}@{tag}", self.address())
        } else {
            format!("{}/{repository}:{tag}", self.address())
        };
        text.parse().expect("reference")
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls `GET /v2/` until the registry answers; false when it exits first.
fn wait_until_serving(child: &mut Child, port: u16, log: &Path) -> bool {
    let deadline = Instant::now() + START_DEADLINE;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            eprintln!(
                "docker-registry exited ({status}):\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
            return false;
        }
        if answers_v2(port) {
            return true;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("docker-registry did not answer GET /v2/ within {START_DEADLINE:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port()
}

/// Whether something on `port` answers `GET /v2/` with HTTP (a TLS server answers a plain
/// request with a 400, which is an answer too).
fn answers_v2(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    if stream
        .write_all(b"GET /v2/ HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut head = [0u8; 8];
    stream.read_exact(&mut head).is_ok() && head.starts_with(b"HTTP/")
}

pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const LAYER_TAR: &str = "application/vnd.oci.image.layer.v1.tar";
pub const LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
pub const DOCKER_LAYER_GZIP: &str = "application/vnd.docker.image.rootfs.diff.tar.gzip";

pub fn sha256(data: &[u8]) -> String {
    let hash = ring::digest::digest(&ring::digest::SHA256, data);
    let hex: String = hash.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// A layer blob ready to push.
#[derive(Clone, Debug)]
pub struct Blob {
    pub data: Vec<u8>,
    pub digest: String,
    pub diff_id: String,
    pub media_type: &'static str,
}

/// A layer's entries, written raw (no path checks), in order.
#[derive(Default)]
pub struct Layer {
    builder: Option<tar::Builder<Vec<u8>>>,
}

impl Layer {
    pub fn new() -> Layer {
        Layer {
            builder: Some(tar::Builder::new(Vec::new())),
        }
    }

    fn append(
        mut self,
        path: &str,
        kind: tar::EntryType,
        mode: u32,
        link: Option<&str>,
        data: &[u8],
    ) -> Layer {
        let mut header = tar::Header::new_gnu();
        let name = &mut header.as_gnu_mut().unwrap().name;
        assert!(path.len() < name.len(), "test paths fit the header");
        name[..path.len()].copy_from_slice(path.as_bytes());
        if let Some(link) = link {
            header.set_link_name(link).unwrap();
        }
        header.set_entry_type(kind);
        header.set_mode(mode);
        header.set_size(data.len() as u64);
        header.set_cksum();
        self.builder
            .as_mut()
            .unwrap()
            .append(&header, data)
            .unwrap();
        self
    }

    /// A file, and the directories on its path before it.
    pub fn file(mut self, path: &str, data: &[u8]) -> Layer {
        let mut dir = String::new();
        for part in path.split('/').collect::<Vec<_>>().split_last().unwrap().1 {
            dir.push_str(part);
            dir.push('/');
            self = self.append(&dir, tar::EntryType::Directory, 0o755, None, b"");
        }
        self.append(path, tar::EntryType::Regular, 0o644, None, data)
    }

    /// Every file under `dir`, at `prefix` in the layer.
    pub fn tree(mut self, dir: &Path, prefix: &str) -> Layer {
        let mut files = Vec::new();
        collect_files(dir, &mut files);
        files.sort();
        for file in files {
            let relative = file.strip_prefix(dir).unwrap().display().to_string();
            let data = std::fs::read(&file).unwrap();
            self = self.file(&format!("{prefix}{relative}"), &data);
        }
        self
    }

    /// A `.wh.` whiteout of `path`.
    pub fn whiteout(self, path: &str) -> Layer {
        let (dir, name) = path.rsplit_once('/').unwrap_or(("", path));
        let marker = if dir.is_empty() {
            format!(".wh.{name}")
        } else {
            format!("{dir}/.wh.{name}")
        };
        self.append(&marker, tar::EntryType::Regular, 0o644, None, b"")
    }

    /// An entry at a raw path, unchecked (`../x`).
    pub fn raw_file(self, path: &str, data: &[u8]) -> Layer {
        self.append(path, tar::EntryType::Regular, 0o644, None, data)
    }

    pub fn symlink(self, path: &str, target: &str) -> Layer {
        self.append(path, tar::EntryType::Symlink, 0o777, Some(target), b"")
    }

    pub fn tar(mut self) -> Blob {
        let data = self.builder.take().unwrap().into_inner().unwrap();
        let digest = sha256(&data);
        Blob {
            diff_id: digest.clone(),
            digest,
            data,
            media_type: LAYER_TAR,
        }
    }

    pub fn gzip(self, media_type: &'static str) -> Blob {
        let plain = self.tar();
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        encoder.write_all(&plain.data).unwrap();
        let data = encoder.finish().unwrap();
        Blob {
            digest: sha256(&data),
            diff_id: plain.diff_id,
            data,
            media_type,
        }
    }
}

fn collect_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            collect_files(&path, out);
        } else {
            out.push(path);
        }
    }
}

/// A test kernel module: `name`, depending on the modules whose symbols it `uses`.
pub struct Module<'a> {
    pub name: &'a str,
    /// The file name, when not `<name>.ko` (`kmod-b.ko` for `kmod_b`).
    pub file: Option<&'a str>,
    pub uses: &'a [&'a str],
}

/// Compiles `module` into a relocatable ELF object `depmod` and `modprobe` read as a
/// module for [`KERNEL`]: `.modinfo` with `name=` and `vermagic=`, an exported symbol
/// `<name>_fn` (in `__ksymtab_strings`), and an undefined reference to `<dep>_fn` for each
/// module it uses, from which `depmod` derives the dependency.
pub fn compile(module: &Module<'_>, into: &Path) -> PathBuf {
    ensure_packages();
    let dir = TempDir::new().unwrap();
    let name = module.name;
    let mut source = format!(
        "__attribute__((section(\".modinfo\"), used, aligned(1))) static const char info[] = \
         \"name={name}\\0depends={}\\0vermagic={KERNEL} SMP mod_unload \\0license=GPL\";\n\
         __attribute__((section(\"__ksymtab_strings\"), used, aligned(1))) static const char ksym[] = \"{name}_fn\";\n",
        module.uses.join(",")
    );
    for dep in module.uses {
        source.push_str(&format!("extern int {dep}_fn(void);\n"));
    }
    let calls: String = module.uses.iter().map(|d| format!(" + {d}_fn()")).collect();
    source.push_str(&format!(
        "int {name}_fn(void) {{ return 0; }}\nint init_module(void) {{ return 0{calls}; }}\n"
    ));
    let c = dir.path().join(format!("{name}.c"));
    std::fs::write(&c, source).unwrap();
    let file = module
        .file
        .map(str::to_string)
        .unwrap_or(format!("{name}.ko"));
    std::fs::create_dir_all(into).unwrap();
    let out = into.join(file);
    let status = Command::new("gcc")
        .arg("-c")
        .arg("-o")
        .arg(&out)
        .arg(&c)
        .status()
        .unwrap_or_else(|err| panic!("gcc is missing ({err}): install gcc, as .ci/run does"));
    assert!(status.success(), "gcc failed for {name}");
    out
}

/// The three modules of the tests: `kmod_a` uses `kmod_b` (file `kmod-b.ko`); `kmod_c`
/// stands alone. Compiled into `<root>/lib/modules/<KERNEL>/extra`.
pub fn compile_modules(root: &Path) -> PathBuf {
    let dir = root.join("lib/modules").join(KERNEL).join("extra");
    let modules = [
        Module {
            name: "kmod_a",
            file: None,
            uses: &["kmod_b"],
        },
        Module {
            name: "kmod_b",
            file: Some("kmod-b.ko"),
            uses: &[],
        },
        Module {
            name: "kmod_c",
            file: None,
            uses: &[],
        },
    ];
    for module in &modules {
        compile(module, &dir);
    }
    dir
}

/// Runs `depmod -b <base> <KERNEL>`.
pub fn depmod(base: &Path) {
    ensure_packages();
    let output = Command::new(tool("depmod"))
        .arg("-b")
        .arg(base)
        .arg(KERNEL)
        .output()
        .unwrap_or_else(|err| panic!("depmod is missing ({err}): install kmod, as .ci/run does"));
    assert!(
        output.status.success(),
        "depmod: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// `modprobe`, `depmod`: in `/usr/sbin` or `/sbin` on Debian, which a user's `PATH` may
/// not have.
pub fn tool(name: &str) -> PathBuf {
    ["/usr/sbin", "/sbin", "/usr/bin", "/bin"]
        .iter()
        .map(|dir| Path::new(dir).join(name))
        .find(|path| path.exists())
        .unwrap_or_else(|| PathBuf::from(name))
}
