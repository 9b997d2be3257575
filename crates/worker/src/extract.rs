//! Unpacking an image layer into a directory, safely, with OCI whiteouts.
//!
//! A layer is a tar archive, plain or gzip-compressed, whose paths are relative to the
//! image's root. Layers are applied in order over the same directory. What a layer may
//! not do, whoever built it:
//! - leave the root: an entry path with a `..` component is refused (the whole layer,
//!   before anything is written); a leading `/` is dropped, as `tar` does, so `/opt/x`
//!   and `opt/x` are the same entry;
//! - write through a symbolic link: every directory on an entry's path is resolved inside
//!   the root, a link in it read as if the root were `/` (so `lib -> /usr/lib` leads to
//!   `<root>/usr/lib`, and `..` stops at the root), and an entry's own name is replaced,
//!   never followed;
//! - point outside the root: a symbolic link is written relative, to where its target
//!   is inside the root (`/usr/lib/x` from `lib/y` becomes `../usr/lib/x`), so the
//!   extracted tree means what the image meant wherever it is extracted;
//! - link to a file outside the root: a hard link's target is an entry path too, and must
//!   be a regular file already extracted;
//! - create devices: character and block devices and FIFOs are skipped.
//!
//! Ownership, set-user-ID bits, timestamps and extended attributes are not kept:
//! `modprobe` reads the modules, nothing executes them. Whiteouts apply to the layers
//! below only: `.wh.<name>` deletes `<name>`, and `.wh..wh..opq` empties its directory;
//! both are applied before the layer's own entries are written. When the image config
//! gives the layer's uncompressed digest (`diff_id`), it is checked before anything is
//! written.

use std::borrow::Cow;
use std::collections::VecDeque;
use std::ffi::OsString;
use std::fs;
use std::io::{self, BufReader, Read};
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

use flate2::read::MultiGzDecoder;
use thiserror::Error;

/// How a layer blob is compressed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    /// A plain tar archive.
    None,
    /// A gzip-compressed tar archive.
    Gzip,
}

/// The compression of a layer of `media_type`, or `None` when it is not a layer the
/// worker can unpack (zstd, or not a tar archive at all).
pub fn layer_compression(media_type: &str) -> Option<Compression> {
    match media_type {
        "application/vnd.oci.image.layer.v1.tar"
        | "application/vnd.oci.image.layer.nondistributable.v1.tar"
        | "application/vnd.docker.image.rootfs.diff.tar" => Some(Compression::None),
        "application/vnd.oci.image.layer.v1.tar+gzip"
        | "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip"
        | "application/vnd.docker.image.rootfs.diff.tar.gzip"
        | "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip" => Some(Compression::Gzip),
        _ => None,
    }
}

/// Why a layer could not be unpacked. Each message is one line.
#[derive(Debug, Error)]
pub enum ExtractError {
    /// An entry would leave the root, or is not something a layer may hold.
    #[error("entry {path:?} refused: {reason}")]
    Refused {
        /// The entry's path as the archive has it.
        path: String,
        /// What it would have done.
        reason: String,
    },
    /// The blob is not a readable archive of the announced compression.
    #[error("cannot read the archive: {0}")]
    Archive(#[source] io::Error),
    /// The uncompressed layer is not the one the image config names.
    #[error("uncompressed content has digest {actual}, the image config says {expected}")]
    DiffId {
        /// The config's `rootfs.diff_ids` entry.
        expected: String,
        /// What the content hashes to.
        actual: String,
    },
    /// A file or directory could not be written.
    #[error("cannot {action} {}: {source}", path.display())]
    Write {
        /// What was being done.
        action: &'static str,
        /// The path in the extracted tree.
        path: PathBuf,
        /// What the system said.
        #[source]
        source: io::Error,
    },
}

/// What unpacking one layer did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LayerReport {
    /// Files, directories and links written.
    pub written: usize,
    /// Whiteouts applied (files and opaque directories).
    pub whiteouts: usize,
    /// Devices and FIFOs left out.
    pub skipped: usize,
}

/// What an entry path stands for, once cleaned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EntryPath {
    /// The root directory itself (`./`).
    Root,
    /// A file, directory or link at this path.
    Plain(PathBuf),
    /// `.wh.<name>`: delete this path of the layers below.
    Whiteout(PathBuf),
    /// `.wh..wh..opq`: empty this directory of the layers below (empty path: the root).
    Opaque(PathBuf),
    /// Other `.wh..wh.` names: aufs bookkeeping, not content.
    Ignored,
}

const WHITEOUT_PREFIX: &str = ".wh.";
const OPAQUE_MARKER: &str = ".wh..wh..opq";

/// Cleans an entry path and says what it stands for. A leading `/` and `.` components
/// are dropped; a `..` component is refused (Err is the reason).
pub fn classify(raw: &Path) -> Result<EntryPath, String> {
    let mut clean = PathBuf::new();
    for component in raw.components() {
        match component {
            Component::Normal(name) => clean.push(name),
            Component::RootDir | Component::CurDir => {}
            Component::ParentDir => {
                return Err("a `..` component would leave the image root".to_string());
            }
            Component::Prefix(_) => return Err("not a Unix path".to_string()),
        }
    }
    let Some(name) = clean.file_name().map(|n| n.to_string_lossy().into_owned()) else {
        return Ok(EntryPath::Root);
    };
    let Some(whited_out) = name.strip_prefix(WHITEOUT_PREFIX) else {
        return Ok(EntryPath::Plain(clean));
    };
    let dir = clean.parent().map(Path::to_path_buf).unwrap_or_default();
    if name == OPAQUE_MARKER {
        Ok(EntryPath::Opaque(dir))
    } else if whited_out.starts_with(WHITEOUT_PREFIX) {
        Ok(EntryPath::Ignored)
    } else if whited_out.is_empty() || whited_out == "." || whited_out == ".." {
        Err(format!("whiteout {name:?} names no file"))
    } else {
        Ok(EntryPath::Whiteout(dir.join(whited_out)))
    }
}

/// The target to write for a symbolic link in directory `link_dir` (relative to the
/// root, no links in it) pointing at `target`: where `target` leads when the root is
/// `/` and `..` stops at the root, written relative to `link_dir`.
pub fn confined_link_target(link_dir: &Path, target: &Path) -> PathBuf {
    let mut destination: Vec<OsString> = if target.is_absolute() {
        Vec::new()
    } else {
        normal_components(link_dir)
    };
    for component in target.components() {
        match component {
            Component::Normal(name) => destination.push(name.to_os_string()),
            Component::ParentDir => {
                destination.pop();
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    let from = normal_components(link_dir);
    let common = from
        .iter()
        .zip(&destination)
        .take_while(|(a, b)| a == b)
        .count();
    let mut relative = PathBuf::new();
    for _ in common..from.len() {
        relative.push("..");
    }
    for name in &destination[common..] {
        relative.push(name);
    }
    if relative.as_os_str().is_empty() {
        relative.push(".");
    }
    relative
}

fn normal_components(path: &Path) -> Vec<OsString> {
    path.components()
        .filter_map(|c| match c {
            Component::Normal(name) => Some(name.to_os_string()),
            _ => None,
        })
        .collect()
}

/// Unpacks the layer blob at `blob` into `root`, over the layers unpacked there before.
/// With `diff_id` (`sha256:<hex>` or `sha512:<hex>`), the uncompressed content must hash
/// to it.
///
/// The archive is read twice: first to check every entry path and the digest and to
/// collect the whiteouts, so a refused layer writes nothing; then to write. Fails on the
/// first refused entry, an unreadable archive, a digest mismatch or a write error.
pub fn extract_layer(
    blob: &Path,
    compression: Compression,
    root: &Path,
    diff_id: Option<&str>,
) -> Result<LayerReport, ExtractError> {
    let whiteouts = check_layer(blob, compression, diff_id)?;
    let mut report = LayerReport::default();
    for whiteout in &whiteouts {
        apply_whiteout(root, whiteout)?;
        report.whiteouts += 1;
    }
    let mut archive = tar::Archive::new(open(blob, compression)?);
    for entry in archive.entries().map_err(ExtractError::Archive)? {
        let mut entry = entry.map_err(ExtractError::Archive)?;
        let raw = entry_path(&entry)?;
        let Ok(EntryPath::Plain(path)) = classify(&raw) else {
            continue;
        };
        match write_entry(root, &path, &raw, &mut entry)? {
            Written::Yes => report.written += 1,
            Written::Skipped => report.skipped += 1,
        }
    }
    Ok(report)
}

fn open(blob: &Path, compression: Compression) -> Result<Box<dyn Read>, ExtractError> {
    let file = fs::File::open(blob).map_err(ExtractError::Archive)?;
    let reader = BufReader::new(file);
    Ok(match compression {
        Compression::None => Box::new(reader),
        Compression::Gzip => Box::new(MultiGzDecoder::new(reader)),
    })
}

fn entry_path<R: Read>(entry: &tar::Entry<'_, R>) -> Result<PathBuf, ExtractError> {
    entry
        .path()
        .map(Cow::into_owned)
        .map_err(ExtractError::Archive)
}

fn refused(raw: &Path, reason: impl Into<String>) -> ExtractError {
    ExtractError::Refused {
        path: raw.display().to_string(),
        reason: reason.into(),
    }
}

/// The first read: every path checked, the digest compared, the whiteouts collected.
fn check_layer(
    blob: &Path,
    compression: Compression,
    diff_id: Option<&str>,
) -> Result<Vec<EntryPath>, ExtractError> {
    let algorithm = diff_id.and_then(|id| match id.split_once(':') {
        Some(("sha256", _)) => Some(&ring::digest::SHA256),
        Some(("sha512", _)) => Some(&ring::digest::SHA512),
        _ => None,
    });
    let mut reader = HashingReader {
        inner: open(blob, compression)?,
        context: algorithm.map(ring::digest::Context::new),
    };
    let mut whiteouts = Vec::new();
    let mut archive = tar::Archive::new(&mut reader);
    for entry in archive.entries().map_err(ExtractError::Archive)? {
        let entry = entry.map_err(ExtractError::Archive)?;
        let raw = entry_path(&entry)?;
        let path = classify(&raw).map_err(|reason| refused(&raw, reason))?;
        match &path {
            EntryPath::Whiteout(_) | EntryPath::Opaque(_) => whiteouts.push(path),
            EntryPath::Plain(_) if entry.header().entry_type() == tar::EntryType::Link => {
                let target = entry
                    .link_name()
                    .map_err(ExtractError::Archive)?
                    .ok_or_else(|| refused(&raw, "a hard link without a target"))?;
                match classify(&target) {
                    Ok(EntryPath::Plain(_)) => {}
                    Ok(_) => return Err(refused(&raw, "a hard link to a directory or whiteout")),
                    Err(reason) => {
                        return Err(refused(&raw, format!("hard link target: {reason}")));
                    }
                }
            }
            _ => {}
        }
    }
    // The archive ends before the blob does (padding); the digest covers all of it.
    let reader = archive.into_inner();
    io::copy(reader, &mut io::sink()).map_err(ExtractError::Archive)?;
    if let (Some(expected), Some(context)) = (diff_id, reader.context.take()) {
        let algorithm = expected.split_once(':').map_or("", |(name, _)| name);
        let actual = format!("{algorithm}:{}", hex(context.finish().as_ref()));
        if actual != expected {
            return Err(ExtractError::DiffId {
                expected: expected.to_string(),
                actual,
            });
        }
    }
    Ok(whiteouts)
}

struct HashingReader {
    inner: Box<dyn Read>,
    context: Option<ring::digest::Context>,
}

impl Read for HashingReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let read = self.inner.read(buf)?;
        if let Some(context) = &mut self.context {
            context.update(&buf[..read]);
        }
        Ok(read)
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

fn apply_whiteout(root: &Path, whiteout: &EntryPath) -> Result<(), ExtractError> {
    match whiteout {
        EntryPath::Whiteout(path) => {
            if let Some(target) = existing_entry(root, path)? {
                remove(&target)?;
            }
        }
        EntryPath::Opaque(dir) => {
            let dir = if dir.as_os_str().is_empty() {
                Some(root.to_path_buf())
            } else {
                existing_entry(root, dir)?
            };
            let Some(dir) = dir else {
                return Ok(());
            };
            if !is_real_dir(&dir) {
                // The layer's own directory entry replaces whatever is there.
                return remove(&dir);
            }
            let children = fs::read_dir(&dir).map_err(write_error("read", &dir))?;
            for child in children {
                let child = child.map_err(write_error("read", &dir))?;
                remove(&child.path())?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// Where the entry at `path` is in the tree (its directories resolved, its own name
/// not followed), when its directory exists.
fn existing_entry(root: &Path, path: &Path) -> Result<Option<PathBuf>, ExtractError> {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Ok(None);
    };
    Ok(resolve_dir(root, parent, Missing::Stop)
        .map_err(|(reason, _)| refused(path, reason))?
        .map(|dir| root.join(dir).join(name)))
}

fn is_real_dir(path: &Path) -> bool {
    fs::symlink_metadata(path).is_ok_and(|m| m.is_dir())
}

enum Written {
    Yes,
    Skipped,
}

fn write_entry<R: Read>(
    root: &Path,
    path: &Path,
    raw: &Path,
    entry: &mut tar::Entry<'_, R>,
) -> Result<Written, ExtractError> {
    let kind = entry.header().entry_type();
    let mode = entry.header().mode().map_err(ExtractError::Archive)? & 0o777;
    // Old archives mark directories with a trailing slash only.
    let is_dir =
        kind.is_dir() || (kind.is_file() && raw.as_os_str().as_encoded_bytes().ends_with(b"/"));
    if matches!(
        kind,
        tar::EntryType::Char | tar::EntryType::Block | tar::EntryType::Fifo
    ) {
        tracing::debug!(path = %raw.display(), "skipping a device or FIFO");
        return Ok(Written::Skipped);
    }
    let parent = path.parent().unwrap_or(Path::new(""));
    let (Some(name), Some(dir)) = (
        path.file_name(),
        resolve_dir(root, parent, Missing::Create).map_err(|(reason, err)| match err {
            Some(err) => err,
            None => refused(raw, reason),
        })?,
    ) else {
        return Ok(Written::Skipped);
    };
    let target = root.join(&dir).join(name);
    if is_dir {
        if !is_real_dir(&target) {
            remove(&target)?;
            fs::create_dir(&target).map_err(write_error("create", &target))?;
        }
        return set_mode(&target, mode | 0o700).map(|()| Written::Yes);
    }
    match kind {
        tar::EntryType::Regular | tar::EntryType::Continuous | tar::EntryType::GNUSparse => {
            remove(&target)?;
            let mut file = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&target)
                .map_err(write_error("create", &target))?;
            io::copy(entry, &mut file).map_err(ExtractError::Archive)?;
            set_mode(&target, mode)?;
        }
        tar::EntryType::Symlink => {
            let link = entry
                .link_name()
                .map_err(ExtractError::Archive)?
                .ok_or_else(|| refused(raw, "a symbolic link without a target"))?;
            let relative = confined_link_target(&dir, &link);
            remove(&target)?;
            std::os::unix::fs::symlink(&relative, &target)
                .map_err(write_error("create the link", &target))?;
        }
        tar::EntryType::Link => {
            let link = entry
                .link_name()
                .map_err(ExtractError::Archive)?
                .ok_or_else(|| refused(raw, "a hard link without a target"))?;
            let source = match classify(&link) {
                Ok(EntryPath::Plain(source)) => existing_entry(root, &source)?,
                _ => None,
            };
            let source = source
                .filter(|s| fs::symlink_metadata(s).is_ok_and(|m| m.is_file()))
                .ok_or_else(|| {
                    refused(
                        raw,
                        format!(
                            "hard link to {}, which is not a regular file of the image",
                            link.display()
                        ),
                    )
                })?;
            remove(&target)?;
            fs::hard_link(&source, &target).map_err(write_error("link", &target))?;
        }
        _ => {
            tracing::debug!(path = %raw.display(), kind = ?kind, "skipping an entry of no known kind");
            return Ok(Written::Skipped);
        }
    }
    Ok(Written::Yes)
}

/// What to do about a directory on the path that does not exist.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Missing {
    Create,
    Stop,
}

/// How many symbolic links one path may go through, as Linux's `MAXSYMLINKS`.
const MAX_LINKS: usize = 40;

/// Resolves directory `dir` (relative) inside `root`: links read as if `root` were `/`,
/// `..` stopping at the root. Returns the path relative to `root` with no links in it,
/// or `None` with [`Missing::Stop`] when a directory does not exist or is not one. Err
/// is a reason (with the write error, if one happened).
fn resolve_dir(
    root: &Path,
    dir: &Path,
    missing: Missing,
) -> Result<Option<PathBuf>, (String, Option<ExtractError>)> {
    let mut pending: VecDeque<OsString> = normal_components(dir).into();
    let mut resolved = PathBuf::new();
    let mut links = 0;
    while let Some(name) = pending.pop_front() {
        if name == ".." {
            resolved.pop();
            continue;
        }
        let candidate = resolved.join(&name);
        let on_disk = root.join(&candidate);
        match fs::symlink_metadata(&on_disk) {
            Err(err) if err.kind() == io::ErrorKind::NotFound => {
                if missing == Missing::Stop {
                    return Ok(None);
                }
                fs::create_dir(&on_disk)
                    .and_then(|()| fs::set_permissions(&on_disk, fs::Permissions::from_mode(0o755)))
                    .map_err(|err| (String::new(), Some(write_error("create", &on_disk)(err))))?;
                resolved = candidate;
            }
            Err(err) => return Err((String::new(), Some(write_error("read", &on_disk)(err)))),
            Ok(meta) if meta.is_dir() => resolved = candidate,
            Ok(meta) if meta.is_symlink() => {
                links += 1;
                if links > MAX_LINKS {
                    return Err((
                        format!("more than {MAX_LINKS} symbolic links on its path"),
                        None,
                    ));
                }
                let target = fs::read_link(&on_disk)
                    .map_err(|err| (String::new(), Some(write_error("read", &on_disk)(err))))?;
                if target.is_absolute() {
                    resolved = PathBuf::new();
                }
                for component in target.components().rev() {
                    match component {
                        Component::Normal(part) => pending.push_front(part.to_os_string()),
                        Component::ParentDir => pending.push_front(OsString::from("..")),
                        _ => {}
                    }
                }
            }
            Ok(_) => {
                if missing == Missing::Stop {
                    return Ok(None);
                }
                return Err((
                    format!("{} is a file, not a directory", candidate.display()),
                    None,
                ));
            }
        }
    }
    Ok(Some(resolved))
}

/// Removes whatever is at `path` (a directory with its content), not following links.
fn remove(path: &Path) -> Result<(), ExtractError> {
    let result = match fs::symlink_metadata(path) {
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(err) => Err(err),
        Ok(meta) if meta.is_dir() => fs::remove_dir_all(path),
        Ok(_) => fs::remove_file(path),
    };
    result.map_err(write_error("remove", path))
}

fn set_mode(path: &Path, mode: u32) -> Result<(), ExtractError> {
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .map_err(write_error("set the mode of", path))
}

fn write_error(action: &'static str, path: &Path) -> impl FnOnce(io::Error) -> ExtractError {
    let path = path.to_path_buf();
    move |source| ExtractError::Write {
        action,
        path,
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;
    use tempfile::TempDir;

    #[test]
    fn entry_paths_are_cleaned_classified_or_refused() {
        let plain = |p: &str| Ok(EntryPath::Plain(PathBuf::from(p)));
        let cases: Vec<(&str, Result<EntryPath, String>)> = vec![
            (
                "opt/lib/modules/6.1/a.ko",
                plain("opt/lib/modules/6.1/a.ko"),
            ),
            ("./opt/a.ko", plain("opt/a.ko")),
            ("/opt/a.ko", plain("opt/a.ko")),
            ("opt//./a.ko", plain("opt/a.ko")),
            ("opt/", plain("opt")),
            ("./", Ok(EntryPath::Root)),
            ("/", Ok(EntryPath::Root)),
            ("", Ok(EntryPath::Root)),
            (
                "opt/.wh.a.ko",
                Ok(EntryPath::Whiteout(PathBuf::from("opt/a.ko"))),
            ),
            (".wh.opt", Ok(EntryPath::Whiteout(PathBuf::from("opt")))),
            (
                "opt/.wh..wh..opq",
                Ok(EntryPath::Opaque(PathBuf::from("opt"))),
            ),
            ("./.wh..wh..opq", Ok(EntryPath::Opaque(PathBuf::new()))),
            ("opt/.wh..wh.plnk", Ok(EntryPath::Ignored)),
            ("opt/a.wh.b", plain("opt/a.wh.b")),
            (
                "../etc/passwd",
                Err("a `..` component would leave the image root".to_string()),
            ),
            (
                "opt/../../etc",
                Err("a `..` component would leave the image root".to_string()),
            ),
            (
                "/../x",
                Err("a `..` component would leave the image root".to_string()),
            ),
            (
                "opt/.wh.",
                Err("whiteout \".wh.\" names no file".to_string()),
            ),
        ];
        for (raw, want) in cases {
            assert_eq!(classify(Path::new(raw)), want, "{raw:?}");
        }
    }

    #[test]
    fn link_targets_are_kept_inside_the_root() {
        // (directory of the link, target, target written)
        let cases = [
            ("lib", "../usr/lib", "../usr/lib"),
            ("lib", "/usr/lib/x", "../usr/lib/x"),
            ("", "/usr/lib", "usr/lib"),
            ("", "usr/lib", "usr/lib"),
            ("a/b", "c", "c"),
            ("a/b", "./c/./d", "c/d"),
            ("a/b", "../../../../etc/passwd", "../../etc/passwd"),
            ("", "../../etc/shadow", "etc/shadow"),
            ("a/b", "/", "../.."),
            ("a", "/a", "."),
            ("a/b", "/a/b/c", "c"),
            ("a/b", "..", ".."),
        ];
        for (dir, target, want) in cases {
            assert_eq!(
                confined_link_target(Path::new(dir), Path::new(target)),
                PathBuf::from(want),
                "{dir:?} -> {target:?}"
            );
        }
    }

    #[test]
    fn layer_media_types() {
        let cases = [
            (
                "application/vnd.oci.image.layer.v1.tar",
                Some(Compression::None),
            ),
            (
                "application/vnd.oci.image.layer.v1.tar+gzip",
                Some(Compression::Gzip),
            ),
            (
                "application/vnd.docker.image.rootfs.diff.tar.gzip",
                Some(Compression::Gzip),
            ),
            ("application/vnd.oci.image.layer.v1.tar+zstd", None),
            ("application/vnd.oci.image.config.v1+json", None),
        ];
        for (media_type, want) in cases {
            assert_eq!(layer_compression(media_type), want, "{media_type}");
        }
    }

    /// A tar entry as a test writes it; paths are written raw, unchecked.
    enum Item<'a> {
        File(&'a str, &'a str),
        Dir(&'a str),
        Symlink(&'a str, &'a str),
        HardLink(&'a str, &'a str),
        Device(&'a str),
    }

    fn layer(dir: &Path, name: &str, items: &[Item<'_>], gzip: bool) -> PathBuf {
        let mut builder = tar::Builder::new(Vec::new());
        for item in items {
            let mut header = tar::Header::new_gnu();
            let (path, kind, link, data): (&str, _, Option<&str>, &[u8]) = match item {
                Item::File(path, data) => (path, tar::EntryType::Regular, None, data.as_bytes()),
                Item::Dir(path) => (path, tar::EntryType::Directory, None, b""),
                Item::Symlink(path, to) => (path, tar::EntryType::Symlink, Some(to), b""),
                Item::HardLink(path, to) => (path, tar::EntryType::Link, Some(to), b""),
                Item::Device(path) => (path, tar::EntryType::Char, None, b""),
            };
            let name = &mut header.as_gnu_mut().unwrap().name;
            name[..path.len()].copy_from_slice(path.as_bytes());
            if let Some(link) = link {
                header.set_link_name(link).unwrap();
            }
            header.set_entry_type(kind);
            header.set_mode(if kind == tar::EntryType::Directory {
                0o755
            } else {
                0o644
            });
            header.set_size(data.len() as u64);
            header.set_cksum();
            builder.append(&header, data).unwrap();
        }
        let tar = builder.into_inner().unwrap();
        let path = dir.join(name);
        let bytes = if gzip {
            let mut encoder =
                flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            encoder.write_all(&tar).unwrap();
            encoder.finish().unwrap()
        } else {
            tar
        };
        fs::write(&path, bytes).unwrap();
        path
    }

    fn tree(root: &Path) -> Vec<String> {
        fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
            let mut entries: Vec<_> = fs::read_dir(dir).unwrap().map(|e| e.unwrap()).collect();
            entries.sort_by_key(|e| e.file_name());
            for entry in entries {
                let path = entry.path();
                let name = path.strip_prefix(root).unwrap().display().to_string();
                let meta = fs::symlink_metadata(&path).unwrap();
                if meta.is_symlink() {
                    out.push(format!(
                        "{name} -> {}",
                        fs::read_link(&path).unwrap().display()
                    ));
                } else if meta.is_dir() {
                    out.push(format!("{name}/"));
                    walk(root, &path, out);
                } else {
                    out.push(format!("{name} = {}", fs::read_to_string(&path).unwrap()));
                }
            }
        }
        let mut out = Vec::new();
        walk(root, root, &mut out);
        out
    }

    #[test]
    fn layers_apply_in_order_with_whiteouts_and_opaque_directories() {
        let work = TempDir::new().unwrap();
        let root = work.path().join("root");
        fs::create_dir(&root).unwrap();
        let lower = layer(
            work.path(),
            "lower.tar.gz",
            &[
                Item::Dir("opt/"),
                Item::File("opt/a.ko", "a1"),
                Item::File("opt/b.ko", "b1"),
                Item::Dir("firmware/"),
                Item::File("firmware/old.bin", "old"),
                Item::File("firmware/sub/x.bin", "x"),
            ],
            true,
        );
        let upper = layer(
            work.path(),
            "upper.tar",
            &[
                Item::File("opt/a.ko", "a2"),
                Item::File("opt/.wh.b.ko", ""),
                // Same-layer content survives the layer's own opaque marker.
                Item::File("firmware/new.bin", "new"),
                Item::File("firmware/.wh..wh..opq", ""),
                Item::File("opt/.wh..wh.plnk", ""),
            ],
            false,
        );
        let report = extract_layer(&lower, Compression::Gzip, &root, None).unwrap();
        assert_eq!(report.written, 6);
        let report = extract_layer(&upper, Compression::None, &root, None).unwrap();
        assert_eq!(
            report,
            LayerReport {
                written: 2,
                whiteouts: 2,
                skipped: 0
            }
        );
        assert_eq!(
            tree(&root),
            [
                "firmware/",
                "firmware/new.bin = new",
                "opt/",
                "opt/a.ko = a2"
            ]
        );
    }

    #[test]
    fn nothing_is_written_through_links_or_outside_the_root() {
        let work = TempDir::new().unwrap();
        let root = work.path().join("root");
        let outside = work.path().join("outside");
        fs::create_dir_all(&root).unwrap();
        fs::create_dir_all(&outside).unwrap();
        fs::write(outside.join("secret"), "secret").unwrap();
        let escape = outside.display().to_string();
        let first = layer(
            work.path(),
            "first.tar",
            &[
                Item::Symlink("out", &escape),
                Item::Symlink("up", "../../.."),
                Item::Symlink("lib", "usr/lib"),
                Item::File("usr/lib/m.ko", "m"),
                Item::Device("dev/null"),
            ],
            false,
        );
        let second = layer(
            work.path(),
            "second.tar",
            &[
                // Through a link to an absolute path: lands inside the root.
                Item::File("out/secret", "overwritten?"),
                Item::File("up/escaped", "escaped?"),
                // Through an in-root link: where the link leads.
                Item::File("lib/n.ko", "n"),
                // An entry replacing a link replaces the link, not its target.
                Item::File("lib", "file now"),
            ],
            false,
        );
        let report = extract_layer(&first, Compression::None, &root, None).unwrap();
        assert_eq!(report.skipped, 1);
        extract_layer(&second, Compression::None, &root, None).unwrap();
        // The real directory outside is untouched; the link led inside the root.
        assert_eq!(
            fs::read_to_string(outside.join("secret")).unwrap(),
            "secret"
        );
        let inside = escape.trim_start_matches('/');
        assert_eq!(fs::read_link(root.join("out")).unwrap(), Path::new(inside));
        assert_eq!(
            fs::read_to_string(root.join(inside).join("secret")).unwrap(),
            "overwritten?"
        );
        assert_eq!(fs::read_link(root.join("up")).unwrap(), Path::new("."));
        assert_eq!(
            fs::read_to_string(root.join("escaped")).unwrap(),
            "escaped?"
        );
        assert!(!work.path().join("escaped").exists());
        assert_eq!(fs::read_to_string(root.join("usr/lib/n.ko")).unwrap(), "n");
        assert_eq!(fs::read_to_string(root.join("lib")).unwrap(), "file now");
        assert!(!root.join("dev").exists());
    }

    #[test]
    fn refused_layers_write_nothing() {
        let cases: Vec<(&str, Vec<Item<'_>>, &str)> = vec![
            (
                "parent components",
                vec![Item::File("ok.ko", "ok"), Item::File("../escaped", "x")],
                "entry \"../escaped\" refused: a `..` component would leave the image root",
            ),
            (
                "a hard link out of the root",
                vec![
                    Item::File("ok.ko", "ok"),
                    Item::HardLink("passwd", "../../etc/passwd"),
                ],
                "entry \"passwd\" refused: hard link target: a `..` component would leave the image root",
            ),
        ];
        for (case, items, want) in cases {
            let work = TempDir::new().unwrap();
            let root = work.path().join("root");
            fs::create_dir(&root).unwrap();
            let blob = layer(work.path(), "layer.tar", &items, false);
            let err = extract_layer(&blob, Compression::None, &root, None).unwrap_err();
            assert_eq!(err.to_string(), want, "{case}");
            assert!(tree(&root).is_empty(), "{case}: {:?}", tree(&root));
            assert!(!work.path().join("escaped").exists(), "{case}");
        }
    }

    #[test]
    fn hard_links_need_a_regular_file_of_the_image() {
        let work = TempDir::new().unwrap();
        let root = work.path().join("root");
        fs::create_dir(&root).unwrap();
        let good = layer(
            work.path(),
            "good.tar",
            &[Item::File("a.ko", "a"), Item::HardLink("b.ko", "./a.ko")],
            false,
        );
        extract_layer(&good, Compression::None, &root, None).unwrap();
        assert_eq!(fs::read_to_string(root.join("b.ko")).unwrap(), "a");
        let through_link = layer(
            work.path(),
            "bad.tar",
            &[
                Item::Symlink("host", "/etc"),
                Item::HardLink("shadow", "host/shadow"),
            ],
            false,
        );
        let err = extract_layer(&through_link, Compression::None, &root, None).unwrap_err();
        assert_eq!(
            err.to_string(),
            "entry \"shadow\" refused: hard link to host/shadow, which is not a regular file of the image"
        );
    }

    #[test]
    fn the_uncompressed_digest_is_checked_before_writing() {
        let work = TempDir::new().unwrap();
        let root = work.path().join("root");
        fs::create_dir(&root).unwrap();
        let blob = layer(work.path(), "l.tar.gz", &[Item::File("a.ko", "a")], true);
        let mut decoded = Vec::new();
        MultiGzDecoder::new(fs::File::open(&blob).unwrap())
            .read_to_end(&mut decoded)
            .unwrap();
        let right = format!(
            "sha256:{}",
            hex(ring::digest::digest(&ring::digest::SHA256, &decoded).as_ref())
        );
        let wrong = format!("sha256:{}", "0".repeat(64));
        let err = extract_layer(&blob, Compression::Gzip, &root, Some(&wrong)).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("uncompressed content has digest {right}, the image config says {wrong}")
        );
        assert!(tree(&root).is_empty());
        extract_layer(&blob, Compression::Gzip, &root, Some(&right)).unwrap();
        assert_eq!(tree(&root), ["a.ko = a"]);
    }

    #[test]
    fn a_blob_of_the_wrong_compression_is_an_archive_error() {
        let work = TempDir::new().unwrap();
        let blob = layer(work.path(), "l.tar", &[Item::File("a.ko", "a")], false);
        let err = extract_layer(&blob, Compression::Gzip, work.path(), None).unwrap_err();
        assert!(matches!(err, ExtractError::Archive(_)), "{err}");
    }
}
