//! Templates: what a control plane's first boot leaves on disk (its PKI, and in etcd the
//! objects a fresh cluster holds and the CRDs it was asked to serve), kept so that later
//! planes start from it instead of from nothing.
//!
//! On an empty etcd, kube-apiserver spends about 2 CPU seconds before it is ready (its
//! bootstrap writes, the OpenAPI of every built-in kind), and capstan's CRDs cost it
//! about 1.5 more as it rebuilds its OpenAPI documents CRD after CRD; started on a
//! template's data it is ready, the CRDs served, in about 1.7 (a test run starts some 150
//! planes on two cores). A plane started from a template is that first cluster restarted
//! on new ports: the same CA and keys, the same objects. Nothing of a test is ever in one:
//! the template is taken before any node registers.
//!
//! Templates live in the cache directory, one per set of binaries and CRDs, and are built
//! once per machine; within a process, planes that need one being built wait for it.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::fd::AsRawFd as _;
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::Context as _;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use tokio::sync::OnceCell;

use super::{Binaries, ControlPlane, Options, cache_dir, install_crds, pki};

/// Changes whenever what a template holds, or how it is laid out, does.
const LAYOUT: u32 = 1;

/// The template for `crds` on these binaries: found in the cache directory, or built.
pub(crate) async fn ready(
    binaries: &Binaries,
    crds: &[CustomResourceDefinition],
) -> anyhow::Result<PathBuf> {
    static BUILDS: Mutex<BTreeMap<String, Arc<OnceCell<PathBuf>>>> = Mutex::new(BTreeMap::new());
    let key = key(binaries, crds)?;
    let dir = cache_dir()
        .join("real-cluster")
        .join("templates")
        .join(&key);
    let build = BUILDS
        .lock()
        .expect("templates lock")
        .entry(key)
        .or_default()
        .clone();
    build
        .get_or_try_init(|| async {
            if !dir.is_dir() {
                self::build(binaries, crds, &dir)
                    .await
                    .context("building the control plane's template")?;
            }
            Ok(dir.clone())
        })
        .await
        .cloned()
}

/// Names a template by what makes it: the binaries that wrote its data and the CRDs.
fn key(binaries: &Binaries, crds: &[CustomResourceDefinition]) -> anyhow::Result<String> {
    let mut input = format!("layout {LAYOUT}\n");
    for name in ["etcd", "kube-apiserver", "kube-controller-manager"] {
        let path = binaries.path(name);
        let meta = std::fs::metadata(&path).with_context(|| path.display().to_string())?;
        input.push_str(&format!("{name} {} {:?}\n", meta.len(), meta.modified()?));
    }
    input.push_str(&serde_json::to_string(crds)?);
    Ok(capstan_api::canonical::sha256_hex(input.as_bytes(), 16))
}

/// Boots a plane from nothing, has it serve `crds`, stops it and keeps its files in `into`.
/// Another process building the same template at once is harmless: the first one there
/// stays.
async fn build(
    binaries: &Binaries,
    crds: &[CustomResourceDefinition],
    into: &Path,
) -> anyhow::Result<()> {
    let mut plane = ControlPlane::in_new_dir()?;
    let pki = pki::create(plane.dir.path())?;
    plane.run(binaries, &pki, &Options::default(), &[]).await?;
    install_crds(&plane.client().await?, crds.to_vec()).await?;
    plane.stop_gracefully().await?;

    let parent = into.parent().context("a template's folder")?;
    std::fs::create_dir_all(parent).with_context(|| parent.display().to_string())?;
    let staging = tempfile::Builder::new()
        .prefix(".building-")
        .tempdir_in(parent)?;
    copy(plane.dir.path(), staging.path())?;
    match std::fs::rename(staging.path(), into) {
        Ok(()) => {
            let _ = staging.keep();
            Ok(())
        }
        Err(_) if into.is_dir() => Ok(()),
        Err(err) => Err(err).with_context(|| format!("keeping {}", into.display())),
    }
}

/// Copies a plane's PKI and etcd's data from `from` to `to`.
pub(crate) fn copy(from: &Path, to: &Path) -> anyhow::Result<()> {
    for file in pki::open(from)?.files() {
        let name = file.file_name().context("a PKI file's name")?;
        std::fs::copy(file, to.join(name))
            .with_context(|| format!("copying {}", file.display()))?;
    }
    copy_tree(&from.join("etcd"), &to.join("etcd"))
}

fn copy_tree(from: &Path, to: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(to)?;
    // etcd refuses a data directory others may read.
    std::fs::set_permissions(to, std::fs::metadata(from)?.permissions())?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let (source, target) = (entry.path(), to.join(entry.file_name()));
        if entry.file_type()?.is_dir() {
            copy_tree(&source, &target)?;
        } else if source.extension().is_some_and(|e| e == "tmp") {
            // The next write-ahead log segment etcd allocated ahead; it makes it again.
            continue;
        } else {
            copy_sparse(&source, &target)
                .with_context(|| format!("copying {}", source.display()))?;
        }
    }
    Ok(())
}

/// Copies the data of `from`, leaving its holes holes: etcd allocates its write-ahead log
/// 64 MB at a time, mostly never written, and each plane's copy would write it in full.
fn copy_sparse(from: &Path, to: &Path) -> std::io::Result<()> {
    let input = File::open(from)?;
    let meta = input.metadata()?;
    let len = meta.len() as i64;
    let output = File::create(to)?;
    output.set_len(meta.len())?;
    let mut buffer = vec![0u8; 1 << 20];
    let mut offset = 0i64;
    while offset < len {
        // SAFETY: lseek on a descriptor `input` owns; a file system without holes answers
        // that everything is data.
        let data = unsafe { libc::lseek(input.as_raw_fd(), offset, libc::SEEK_DATA) };
        if data < 0 {
            // ENXIO: only a hole is left.
            break;
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(input.as_raw_fd(), data, libc::SEEK_HOLE) };
        let end = if hole < 0 { len } else { hole.min(len) };
        let mut at = data;
        while at < end {
            let want = buffer.len().min((end - at) as usize);
            let read = input.read_at(&mut buffer[..want], at as u64)?;
            if read == 0 {
                break;
            }
            output.write_all_at(&buffer[..read], at as u64)?;
            at += read as i64;
        }
        offset = end;
    }
    output.set_permissions(meta.permissions())
}
