//! The seam between the worker and the node it works on: the kernel (`modprobe`, the
//! firmware search path) and the files the kernel and `modprobe` read (modprobe.d, the
//! node's `/lib/modules`, the firmware directory).
//!
//! [`HostKernel`] is the real node; [`crate::simulated::SimulatedKernel`] is a
//! simulated one. The worker's decisions live in [`crate::run`], not here.

use std::ffi::OsStr;
use std::fs;
use std::io;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use thiserror::Error;

use super::modprobe::{self, canonical_name};

/// Where the kernel's firmware search path is read and written.
pub const FIRMWARE_CLASS_PATH: &str = "/sys/module/firmware_class/parameters/path";

/// The running kernel's release (`uname -r`), which names its module directory.
pub const OS_RELEASE_PATH: &str = "/proc/sys/kernel/osrelease";

/// The node's module directories, one per installed kernel.
pub const MODULES_DIR: &str = "/lib/modules";

/// What went wrong on the node. Each message is one line.
#[derive(Debug, Error)]
pub enum KernelError {
    /// `modprobe` ran and failed.
    #[error("`{command}` failed: {reason}")]
    Modprobe {
        /// The command line, space-separated.
        command: String,
        /// The last line `modprobe` wrote to stderr, or how it exited.
        reason: String,
    },
    /// `modprobe` could not be started.
    #[error("cannot run {program}: {source}")]
    Spawn {
        /// The program that was to run.
        program: String,
        /// Why it did not start.
        #[source]
        source: io::Error,
    },
    /// A file or directory could not be read or written.
    #[error("cannot {action} {}: {source}", path.display())]
    File {
        /// What was being done: `read`, `write`, `copy`...
        action: &'static str,
        /// The path, as the worker sees it.
        path: PathBuf,
        /// What the system said.
        #[source]
        source: io::Error,
    },
}

impl KernelError {
    /// A `modprobe` failure of `argv` with `reason`.
    pub fn modprobe(argv: &[String], reason: impl Into<String>) -> Self {
        KernelError::Modprobe {
            command: argv.join(" "),
            reason: reason.into(),
        }
    }

    fn file(action: &'static str, path: &Path) -> impl FnOnce(io::Error) -> Self {
        let path = path.to_path_buf();
        move |source| KernelError::File {
            action,
            path,
            source,
        }
    }
}

/// The node as the worker acts on it. Paths passed in are as the worker sees them.
pub trait Kernel {
    /// Runs `modprobe` with `argv` (`argv[0]` is `modprobe`, see
    /// [`crate::modprobe`]). Fails when `modprobe` fails, with its reason.
    fn modprobe(&mut self, argv: &[String]) -> Result<(), KernelError>;

    /// Replaces the softdep file `modprobe` reads (`/etc/modprobe.d/softdep.conf`) with
    /// `contents`. Fails when the file cannot be written.
    fn write_softdep(&mut self, contents: &str) -> Result<(), KernelError>;

    /// Whether the running kernel's module directory holds module `name` (`-` and `_`
    /// alike), so `modprobe -r` without `-d` can find it. Fails when the directory
    /// cannot be read.
    fn has_in_tree_module(&self, name: &str) -> Result<bool, KernelError>;

    /// The directory the kernel loads firmware from besides its built-in ones; empty when
    /// unset. Fails when it cannot be read.
    fn firmware_search_path(&self) -> Result<String, KernelError>;

    /// Sets the kernel's firmware search path. Fails when it cannot be written.
    fn set_firmware_search_path(&mut self, path: &str) -> Result<(), KernelError>;

    /// Copies the files and directories under `from` (the kmod image's firmware) into
    /// `to` (the node's firmware directory), keeping what `to` already holds. Fails on the
    /// first file that cannot be copied.
    fn install_firmware(&mut self, from: &Path, to: &Path) -> Result<(), KernelError>;

    /// Removes from `to` the files that `from` holds, and nothing else: directories and
    /// other modules' files stay. Files already gone are fine. Fails when `from` cannot be
    /// read or a file cannot be removed.
    fn remove_firmware(&mut self, from: &Path, to: &Path) -> Result<(), KernelError>;
}

/// The real node: runs the `modprobe` binary and reads and writes sysfs and files.
///
/// Every absolute path is taken under a root directory (`/` in production), so tests can
/// point the node at a temporary directory; the `modprobe` binary is configurable too.
#[derive(Clone, Debug)]
pub struct HostKernel {
    root: PathBuf,
    program: PathBuf,
}

impl Default for HostKernel {
    fn default() -> Self {
        HostKernel::new()
    }
}

impl HostKernel {
    /// The node the worker runs on: root `/`, `modprobe` from `PATH`.
    pub fn new() -> Self {
        HostKernel {
            root: PathBuf::from("/"),
            program: PathBuf::from(modprobe::PROGRAM),
        }
    }

    /// The same node with every path under `root` instead of `/`.
    pub fn with_root(mut self, root: impl Into<PathBuf>) -> Self {
        self.root = root.into();
        self
    }

    /// The same node running `program` for `modprobe` (a path, or a name looked up in
    /// `PATH`). The program still sees `modprobe` as its `argv[0]`.
    pub fn with_program(mut self, program: impl Into<PathBuf>) -> Self {
        self.program = program.into();
        self
    }

    /// Where `path` (absolute, as the worker sees it) is under this node's root.
    pub fn host_path(&self, path: impl AsRef<Path>) -> PathBuf {
        let path = path.as_ref();
        self.root.join(path.strip_prefix("/").unwrap_or(path))
    }

    /// The directory `modprobe` without `-d` searches: `/lib/modules/<release>` of the
    /// running kernel, or all of `/lib/modules` when the release cannot be read.
    fn in_tree_dir(&self) -> PathBuf {
        let modules = self.host_path(MODULES_DIR);
        match fs::read_to_string(self.host_path(OS_RELEASE_PATH)) {
            Ok(release) if !release.trim().is_empty() => modules.join(release.trim()),
            _ => modules,
        }
    }
}

impl Kernel for HostKernel {
    fn modprobe(&mut self, argv: &[String]) -> Result<(), KernelError> {
        let (arg0, args) = argv
            .split_first()
            .ok_or_else(|| KernelError::modprobe(argv, "empty command"))?;
        tracing::info!(command = argv.join(" "), "running modprobe");
        let output = Command::new(&self.program)
            .arg0(arg0)
            .args(args)
            .output()
            .map_err(|source| KernelError::Spawn {
                program: self.program.display().to_string(),
                source,
            })?;
        for line in String::from_utf8_lossy(&output.stdout).lines() {
            tracing::info!(target: "modprobe", "{line}");
        }
        let stderr = String::from_utf8_lossy(&output.stderr);
        for line in stderr.lines() {
            tracing::warn!(target: "modprobe", "{line}");
        }
        if output.status.success() {
            return Ok(());
        }
        let reason = match stderr.lines().rev().find(|l| !l.trim().is_empty()) {
            Some(line) => line.trim().to_string(),
            None => output.status.to_string(),
        };
        Err(KernelError::modprobe(argv, reason))
    }

    fn write_softdep(&mut self, contents: &str) -> Result<(), KernelError> {
        let path = self.host_path(modprobe::SOFTDEP_PATH);
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir).map_err(KernelError::file("create", dir))?;
        }
        fs::write(&path, contents).map_err(KernelError::file("write", &path))
    }

    fn has_in_tree_module(&self, name: &str) -> Result<bool, KernelError> {
        contains_module_file(&self.in_tree_dir(), &canonical_name(name))
    }

    fn firmware_search_path(&self) -> Result<String, KernelError> {
        let path = self.host_path(FIRMWARE_CLASS_PATH);
        let value = fs::read_to_string(&path).map_err(KernelError::file("read", &path))?;
        // sysfs prints string parameters with a trailing newline.
        Ok(value.trim_end_matches('\n').to_string())
    }

    fn set_firmware_search_path(&mut self, value: &str) -> Result<(), KernelError> {
        let path = self.host_path(FIRMWARE_CLASS_PATH);
        fs::write(&path, value).map_err(KernelError::file("write", &path))
    }

    fn install_firmware(&mut self, from: &Path, to: &Path) -> Result<(), KernelError> {
        copy_tree(&self.host_path(from), &self.host_path(to))
    }

    fn remove_firmware(&mut self, from: &Path, to: &Path) -> Result<(), KernelError> {
        remove_copied_files(&self.host_path(from), &self.host_path(to))
    }
}

/// Whether `dir` or a directory below it (symlinks not followed: `build` and `source`
/// point at kernel sources) holds `<module>.ko`, compressed or not.
fn contains_module_file(dir: &Path, module: &str) -> Result<bool, KernelError> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(err) => return Err(KernelError::file("read", dir)(err)),
    };
    for entry in entries {
        let entry = entry.map_err(KernelError::file("read", dir))?;
        let kind = entry
            .file_type()
            .map_err(KernelError::file("read", &entry.path()))?;
        if kind.is_dir() {
            if contains_module_file(&entry.path(), module)? {
                return Ok(true);
            }
        } else if is_module_file(&entry.file_name(), module) {
            return Ok(true);
        }
    }
    Ok(false)
}

/// `<module>.ko`, `<module>.ko.xz`, `.ko.zst` or `.ko.gz`, with `-` and `_` alike.
fn is_module_file(file: &OsStr, module: &str) -> bool {
    let file = canonical_name(&file.to_string_lossy());
    file.strip_prefix(module)
        .and_then(|rest| rest.strip_prefix(".ko"))
        .is_some_and(|compression| matches!(compression, "" | ".xz" | ".zst" | ".gz"))
}

/// Copies every file under `from` to the same place under `to`, creating directories.
fn copy_tree(from: &Path, to: &Path) -> Result<(), KernelError> {
    for (source, target) in files_under(from, to)? {
        if let Some(dir) = target.parent() {
            fs::create_dir_all(dir).map_err(KernelError::file("create", dir))?;
        }
        fs::copy(&source, &target).map_err(KernelError::file("copy", &source))?;
    }
    Ok(())
}

/// Removes from `to` the files `from` has; files already gone are fine.
fn remove_copied_files(from: &Path, to: &Path) -> Result<(), KernelError> {
    for (_, target) in files_under(from, to)? {
        match fs::remove_file(&target) {
            Err(err) if err.kind() != io::ErrorKind::NotFound => {
                return Err(KernelError::file("remove", &target)(err));
            }
            _ => {}
        }
    }
    Ok(())
}

/// Every file below `from` (following links, as a copy does), with the path it has when
/// `from` is placed at `to`.
fn files_under(from: &Path, to: &Path) -> Result<Vec<(PathBuf, PathBuf)>, KernelError> {
    let mut files = Vec::new();
    for entry in fs::read_dir(from).map_err(KernelError::file("read", from))? {
        let entry = entry.map_err(KernelError::file("read", from))?;
        let (source, target) = (entry.path(), to.join(entry.file_name()));
        let metadata = fs::metadata(&source).map_err(KernelError::file("read", &source))?;
        if metadata.is_dir() {
            files.extend(files_under(&source, &target)?);
        } else {
            files.push((source, target));
        }
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tempfile::TempDir;

    /// A fake `modprobe` that appends its arguments (one per line, then `--`) to `log`,
    /// prints `stderr` to stderr and exits with `code`.
    fn fake_modprobe(dir: &Path, stderr: &str, code: i32) -> (PathBuf, PathBuf) {
        let log = dir.join("modprobe.log");
        let script = dir.join(format!("modprobe-{code}"));
        let source = dir.join(format!("modprobe-{code}.src"));
        let body = format!(
            "#!/bin/sh\nprintf '%s\\n' \"$@\" -- >> '{}'\nprintf '%s' '{}' >&2\nexit {code}\n",
            log.display(),
            stderr
        );
        fs::write(&source, body).unwrap();
        // A child process writes the executable, so no descriptor of it is open in this
        // (multi-threaded) test process when it is executed ("text file busy").
        let status = Command::new("/bin/sh")
            .arg("-c")
            .arg(r#"cp "$1" "$2" && chmod +x "$2""#)
            .arg("sh")
            .arg(&source)
            .arg(&script)
            .status()
            .unwrap();
        assert!(status.success());
        (script, log)
    }

    fn invocations(log: &Path) -> Vec<Vec<String>> {
        let text = fs::read_to_string(log).unwrap_or_default();
        text.split_terminator("--\n")
            .map(|call| call.lines().map(str::to_string).collect())
            .collect()
    }

    fn argv(words: &[&str]) -> Vec<String> {
        words.iter().map(|w| w.to_string()).collect()
    }

    #[test]
    fn modprobe_runs_the_program_with_the_arguments() {
        let dir = TempDir::new().unwrap();
        let (program, log) = fake_modprobe(dir.path(), "", 0);
        let mut kernel = HostKernel::new().with_program(&program);
        let calls = [
            argv(&["modprobe", "-vd", "/opt", "my_kmod", "a=1", "b=two words"]),
            argv(&["modprobe", "-rvd", "/opt", "kmod_a", "kmod_b"]),
            argv(&["modprobe", "-rv", "ice"]),
        ];
        for call in &calls {
            kernel.modprobe(call).unwrap();
        }
        let want: Vec<Vec<String>> = calls.iter().map(|c| c[1..].to_vec()).collect();
        assert_eq!(invocations(&log), want);
    }

    #[test]
    fn modprobe_failure_carries_the_last_stderr_line() {
        let dir = TempDir::new().unwrap();
        let (program, _) = fake_modprobe(
            dir.path(),
            "insmod /opt/lib/modules/6.0/my_kmod.ko\nmodprobe: FATAL: Module my_kmod not found in directory /opt/lib/modules/6.0\n\n",
            1,
        );
        let mut kernel = HostKernel::new().with_program(&program);
        let err = kernel
            .modprobe(&argv(&["modprobe", "-vd", "/opt", "my_kmod"]))
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "`modprobe -vd /opt my_kmod` failed: modprobe: FATAL: Module my_kmod not found in directory /opt/lib/modules/6.0"
        );
    }

    #[test]
    fn modprobe_failure_without_stderr_reports_the_exit_status() {
        let dir = TempDir::new().unwrap();
        let (program, _) = fake_modprobe(dir.path(), "", 3);
        let err = HostKernel::new()
            .with_program(&program)
            .modprobe(&argv(&["modprobe", "-rv", "x"]))
            .unwrap_err();
        assert_eq!(err.to_string(), "`modprobe -rv x` failed: exit status: 3");
    }

    #[test]
    fn a_missing_program_is_a_spawn_error() {
        let dir = TempDir::new().unwrap();
        let program = dir.path().join("no-such-modprobe");
        let err = HostKernel::new()
            .with_program(&program)
            .modprobe(&argv(&["modprobe", "x"]))
            .unwrap_err();
        assert!(matches!(err, KernelError::Spawn { .. }), "{err}");
        assert!(err.to_string().contains("no-such-modprobe"), "{err}");
    }

    #[test]
    fn softdep_file_is_written_under_modprobe_d() {
        let root = TempDir::new().unwrap();
        let mut kernel = HostKernel::new().with_root(root.path());
        kernel.write_softdep("softdep a pre: b\n").unwrap();
        kernel.write_softdep("softdep c pre: d\n").unwrap();
        let written = fs::read_to_string(root.path().join("etc/modprobe.d/softdep.conf")).unwrap();
        assert_eq!(written, "softdep c pre: d\n");
    }

    #[test]
    fn firmware_search_path_reads_without_the_sysfs_newline_and_writes_the_value() {
        let root = TempDir::new().unwrap();
        let sysfs = root
            .path()
            .join("sys/module/firmware_class/parameters/path");
        fs::create_dir_all(sysfs.parent().unwrap()).unwrap();
        fs::write(&sysfs, "/var/lib/firmware\n").unwrap();
        let mut kernel = HostKernel::new().with_root(root.path());
        assert_eq!(kernel.firmware_search_path().unwrap(), "/var/lib/firmware");
        kernel
            .set_firmware_search_path("/lib/firmware/updates")
            .unwrap();
        assert_eq!(fs::read_to_string(&sysfs).unwrap(), "/lib/firmware/updates");
    }

    #[test]
    fn a_missing_firmware_class_parameter_is_an_error_naming_it() {
        let root = TempDir::new().unwrap();
        let err = HostKernel::new()
            .with_root(root.path())
            .firmware_search_path()
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("sys/module/firmware_class/parameters/path"),
            "{err}"
        );
    }

    #[test]
    fn in_tree_modules_are_found_in_the_running_kernels_directory() {
        let root = TempDir::new().unwrap();
        let running = root.path().join("lib/modules/6.0.1/kernel/drivers/net");
        let other = root.path().join("lib/modules/5.14.0/kernel");
        fs::create_dir_all(&running).unwrap();
        fs::create_dir_all(&other).unwrap();
        fs::write(running.join("ice.ko.xz"), "").unwrap();
        fs::write(running.join("irdma.ko"), "").unwrap();
        fs::write(running.join("my-nic.ko.zst"), "").unwrap();
        fs::write(running.join("ice_extra.ko"), "").unwrap();
        fs::write(other.join("old_only.ko"), "").unwrap();
        fs::create_dir_all(root.path().join("proc/sys/kernel")).unwrap();
        fs::write(root.path().join("proc/sys/kernel/osrelease"), "6.0.1\n").unwrap();
        let kernel = HostKernel::new().with_root(root.path());
        let cases = [
            ("ice", true),
            ("irdma", true),
            ("my_nic", true),
            ("my-nic", true),
            ("ice_extr", false),
            ("old_only", false),
            ("absent", false),
        ];
        for (module, present) in cases {
            assert_eq!(
                kernel.has_in_tree_module(module).unwrap(),
                present,
                "{module}"
            );
        }
        // Without a readable release every kernel's directory counts.
        fs::remove_file(root.path().join("proc/sys/kernel/osrelease")).unwrap();
        assert!(kernel.has_in_tree_module("old_only").unwrap());
    }

    #[test]
    fn firmware_files_are_copied_and_only_they_are_removed() {
        let root = TempDir::new().unwrap();
        let image = root.path().join("image/firmware");
        fs::create_dir_all(image.join("sub")).unwrap();
        fs::write(image.join("a.bin"), "a").unwrap();
        fs::write(image.join("sub/b.bin"), "b").unwrap();
        let host = root.path().join("var/lib/firmware");
        fs::create_dir_all(&host).unwrap();
        fs::write(host.join("other.bin"), "other module").unwrap();

        let mut kernel = HostKernel::new().with_root(root.path());
        let (from, to) = (Path::new("/image/firmware"), Path::new("/var/lib/firmware"));
        kernel.install_firmware(from, to).unwrap();
        assert_eq!(fs::read_to_string(host.join("a.bin")).unwrap(), "a");
        assert_eq!(fs::read_to_string(host.join("sub/b.bin")).unwrap(), "b");

        fs::remove_file(host.join("a.bin")).unwrap();
        kernel.remove_firmware(from, to).unwrap();
        assert!(!host.join("sub/b.bin").exists());
        assert!(host.join("sub").is_dir(), "directories stay");
        assert!(host.join("other.bin").exists(), "other files stay");
    }

    #[test]
    fn missing_image_firmware_is_an_error_naming_the_directory() {
        let root = TempDir::new().unwrap();
        let err = HostKernel::new()
            .with_root(root.path())
            .install_firmware(Path::new("/image/firmware"), Path::new("/var/lib/firmware"))
            .unwrap_err();
        assert!(err.to_string().contains("image/firmware"), "{err}");
    }
}
