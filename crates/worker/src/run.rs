//! The worker's two flows, `load` and `unload`, shared by the worker process and the
//! simulated kubelet. The steps and their order are upstream KMM's worker's.

use std::path::{Path, PathBuf};

use thiserror::Error;

use super::kernel::{Kernel, KernelError};
use super::modprobe;
use capstan_api::module::ModprobeSpec;
use capstan_api::nmc::ModuleConfig;

/// The node's firmware directory KMM installs firmware into by default.
pub const DEFAULT_FIRMWARE_DIR: &str = "/var/lib/firmware";

/// Where the worker finds the kmod image's files and puts firmware.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Paths {
    /// The directory the kmod image's filesystem is at: `dirName` and `firmwarePath` are
    /// inside it. `/` when the image is the worker's own filesystem.
    pub image_root: PathBuf,
    /// The node's firmware directory as the worker sees it (`--firmware-path`): a
    /// module's firmware files are installed there, and it becomes the kernel's firmware
    /// search path.
    pub firmware_dir: PathBuf,
}

impl Default for Paths {
    fn default() -> Self {
        Paths {
            image_root: PathBuf::from("/"),
            firmware_dir: PathBuf::from(DEFAULT_FIRMWARE_DIR),
        }
    }
}

/// Why a worker failed; the worker process exits non-zero with this one-line reason.
#[derive(Debug, Error)]
pub enum WorkerError {
    /// The in-tree modules to replace could not be removed.
    #[error("could not remove in-tree modules {modules}: {source}")]
    InTreeRemoval {
        /// The modules, comma-separated.
        modules: String,
        /// What the node reported.
        #[source]
        source: KernelError,
    },
    /// The kernel's firmware search path could not be read or set.
    #[error("could not set the firmware search path: {0}")]
    FirmwareSearchPath(#[source] KernelError),
    /// The module's firmware files could not be installed.
    #[error("could not install the firmware of {module}: {source}")]
    FirmwareInstall {
        /// The module, as [`describe`] names it.
        module: String,
        /// What the node reported.
        #[source]
        source: KernelError,
    },
    /// The softdep file with the module loading order could not be written.
    #[error("could not write the module loading order: {0}")]
    LoadingOrder(#[source] KernelError),
    /// `modprobe` could not load the module.
    #[error("could not load {module}: {source}")]
    Load {
        /// The module, as [`describe`] names it.
        module: String,
        /// What the node reported.
        #[source]
        source: KernelError,
    },
    /// `modprobe -r` could not unload the module.
    #[error("could not unload {module}: {source}")]
    Unload {
        /// The module, as [`describe`] names it.
        module: String,
        /// What the node reported.
        #[source]
        source: KernelError,
    },
}

/// Loads the module of `config` on the node of `kernel`:
/// 1. removes `inTreeModulesToRemove` (else the deprecated `inTreeModuleToRemove`) that
///    the node's module directory holds (`modprobe -rv`), skipping the others, which
///    `modprobe` could not find;
/// 2. with a `firmwarePath`, makes the firmware directory the kernel's firmware search
///    path (written only when it differs) and installs the image's firmware files there;
/// 3. with a `modulesLoadingOrder`, writes it as the softdep file;
/// 4. loads the module (`modprobe -vd ...`, or `rawArgs.load`).
///
/// Stops at the first step that fails, with why.
pub fn load(
    config: &ModuleConfig,
    kernel: &mut dyn Kernel,
    paths: &Paths,
) -> Result<(), WorkerError> {
    let spec = &config.modprobe;
    remove_in_tree_modules(&config.in_tree_modules(), kernel)?;
    if !spec.firmware_path.is_empty() {
        set_firmware_search_path(kernel, &paths.firmware_dir)?;
        let from = firmware_source(spec, paths);
        tracing::info!(from = %from.display(), to = %paths.firmware_dir.display(), "installing firmware");
        kernel
            .install_firmware(&from, &paths.firmware_dir)
            .map_err(|source| WorkerError::FirmwareInstall {
                module: describe(spec),
                source,
            })?;
    }
    write_loading_order(spec, kernel)?;
    tracing::info!(module = %describe(spec), "loading");
    kernel
        .modprobe(&modprobe::load_command(spec, &paths.image_root))
        .map_err(|source| WorkerError::Load {
            module: describe(spec),
            source,
        })
}

/// Unloads the module of `config` from the node of `kernel`:
/// 1. with a `modulesLoadingOrder`, writes it as the softdep file;
/// 2. unloads the module, and every module of the loading order (`modprobe -rvd ...`, or
///    `rawArgs.unload`); a module that is not loaded is fine, as for `modprobe -r`;
/// 3. with a `firmwarePath`, removes the image's firmware files from the firmware
///    directory. The module is unloaded by then, so files left behind are only logged.
///
/// Fails when the softdep file cannot be written or `modprobe` fails.
pub fn unload(
    config: &ModuleConfig,
    kernel: &mut dyn Kernel,
    paths: &Paths,
) -> Result<(), WorkerError> {
    let spec = &config.modprobe;
    write_loading_order(spec, kernel)?;
    tracing::info!(module = %describe(spec), "unloading");
    kernel
        .modprobe(&modprobe::unload_command(spec, &paths.image_root))
        .map_err(|source| WorkerError::Unload {
            module: describe(spec),
            source,
        })?;
    if !spec.firmware_path.is_empty() {
        let from = firmware_source(spec, paths);
        if let Err(err) = kernel.remove_firmware(&from, &paths.firmware_dir) {
            tracing::warn!(error = %err, "could not remove every firmware file");
        }
    }
    Ok(())
}

/// How errors name the module: `module <moduleName>`, or the raw arguments' module.
pub fn describe(spec: &ModprobeSpec) -> String {
    if spec.module_name.is_empty() {
        "the module of rawArgs".to_string()
    } else {
        format!("module {}", spec.module_name)
    }
}

fn remove_in_tree_modules(modules: &[String], kernel: &mut dyn Kernel) -> Result<(), WorkerError> {
    let mut present = Vec::new();
    for module in modules {
        match kernel.has_in_tree_module(module) {
            Ok(true) => present.push(module.clone()),
            Ok(false) => {
                tracing::info!(%module, "in-tree module not on the node; not removing it");
            }
            // As upstream: a module that cannot be checked is not removed.
            Err(err) => tracing::warn!(%module, error = %err, "cannot check for in-tree module"),
        }
    }
    if present.is_empty() {
        return Ok(());
    }
    tracing::info!(modules = ?present, "removing in-tree modules");
    kernel
        .modprobe(&modprobe::in_tree_removal_command(&present))
        .map_err(|source| WorkerError::InTreeRemoval {
            modules: present.join(", "),
            source,
        })
}

fn set_firmware_search_path(kernel: &mut dyn Kernel, dir: &Path) -> Result<(), WorkerError> {
    let wanted = dir.to_string_lossy();
    let current = kernel
        .firmware_search_path()
        .map_err(WorkerError::FirmwareSearchPath)?;
    if current == wanted {
        return Ok(());
    }
    tracing::info!(%current, %wanted, "setting the firmware search path");
    kernel
        .set_firmware_search_path(&wanted)
        .map_err(WorkerError::FirmwareSearchPath)
}

fn firmware_source(spec: &ModprobeSpec, paths: &Paths) -> PathBuf {
    PathBuf::from(modprobe::image_path(&paths.image_root, &spec.firmware_path))
}

fn write_loading_order(spec: &ModprobeSpec, kernel: &mut dyn Kernel) -> Result<(), WorkerError> {
    if spec.modules_loading_order.is_empty() {
        return Ok(());
    }
    kernel
        .write_softdep(&modprobe::softdep_conf(&spec.modules_loading_order))
        .map_err(WorkerError::LoadingOrder)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simulated::{LoadedModule, ModuleTable, SimulatedKernel};
    use capstan_api::module::ModprobeArgs;

    /// One call the worker made on the node.
    #[derive(Clone, Debug, PartialEq, Eq)]
    enum Call {
        Modprobe(Vec<String>),
        Softdep(String),
        SetFirmwareSearchPath(String),
        InstallFirmware(PathBuf, PathBuf),
        RemoveFirmware(PathBuf, PathBuf),
    }

    /// A node that records calls, has the `in_tree` modules on disk, and fails the
    /// `modprobe` calls whose argument list contains `fail_on`.
    #[derive(Default)]
    struct Recorder {
        calls: Vec<Call>,
        in_tree: Vec<&'static str>,
        search_path: String,
        fail_on: Option<&'static str>,
        fail_firmware_removal: bool,
    }

    impl Kernel for Recorder {
        fn modprobe(&mut self, argv: &[String]) -> Result<(), KernelError> {
            self.calls.push(Call::Modprobe(argv.to_vec()));
            match self.fail_on {
                Some(word) if argv.iter().any(|a| a == word) => Err(KernelError::modprobe(
                    argv,
                    "modprobe: FATAL: Module x is in use.",
                )),
                _ => Ok(()),
            }
        }

        fn write_softdep(&mut self, contents: &str) -> Result<(), KernelError> {
            self.calls.push(Call::Softdep(contents.to_string()));
            Ok(())
        }

        fn has_in_tree_module(&self, name: &str) -> Result<bool, KernelError> {
            Ok(self.in_tree.contains(&name))
        }

        fn firmware_search_path(&self) -> Result<String, KernelError> {
            Ok(self.search_path.clone())
        }

        fn set_firmware_search_path(&mut self, path: &str) -> Result<(), KernelError> {
            self.search_path = path.to_string();
            self.calls
                .push(Call::SetFirmwareSearchPath(path.to_string()));
            Ok(())
        }

        fn install_firmware(&mut self, from: &Path, to: &Path) -> Result<(), KernelError> {
            self.calls
                .push(Call::InstallFirmware(from.into(), to.into()));
            Ok(())
        }

        fn remove_firmware(&mut self, from: &Path, to: &Path) -> Result<(), KernelError> {
            self.calls
                .push(Call::RemoveFirmware(from.into(), to.into()));
            if self.fail_firmware_removal {
                return Err(KernelError::File {
                    action: "remove",
                    path: to.join("a.bin"),
                    source: std::io::Error::from(std::io::ErrorKind::PermissionDenied),
                });
            }
            Ok(())
        }
    }

    fn modprobe(words: &[&str]) -> Call {
        Call::Modprobe(words.iter().map(|w| w.to_string()).collect())
    }

    fn strings(words: &[&str]) -> Vec<String> {
        words.iter().map(|w| w.to_string()).collect()
    }

    fn config(modprobe: ModprobeSpec) -> ModuleConfig {
        ModuleConfig {
            kernel_version: "6.0.1".to_string(),
            container_image: "registry.example/kmod:v1".to_string(),
            modprobe,
            ..ModuleConfig::default()
        }
    }

    fn spec(module: &str) -> ModprobeSpec {
        ModprobeSpec {
            module_name: module.to_string(),
            ..ModprobeSpec::default()
        }
    }

    #[test]
    fn load_runs_the_steps_in_upstream_order() {
        let paths = Paths {
            image_root: PathBuf::from("/var/run/kmm/images/kmod"),
            firmware_dir: PathBuf::from("/var/lib/firmware"),
        };
        let mut full = config(ModprobeSpec {
            firmware_path: "/firmware".to_string(),
            modules_loading_order: strings(&["my_kmod", "dep"]),
            parameters: strings(&["a=1"]),
            ..spec("my_kmod")
        });
        full.in_tree_modules_to_remove = strings(&["irdma", "absent", "ice"]);
        // (case, config, calls)
        let cases = vec![
            (
                "plain",
                config(spec("my_kmod")),
                vec![modprobe(&[
                    "modprobe",
                    "-vd",
                    "/var/run/kmm/images/kmod/opt",
                    "my_kmod",
                ])],
            ),
            (
                "everything",
                full,
                vec![
                    modprobe(&["modprobe", "-rv", "irdma", "ice"]),
                    Call::SetFirmwareSearchPath("/var/lib/firmware".to_string()),
                    Call::InstallFirmware(
                        "/var/run/kmm/images/kmod/firmware".into(),
                        "/var/lib/firmware".into(),
                    ),
                    Call::Softdep("softdep my_kmod pre: dep\n".to_string()),
                    modprobe(&[
                        "modprobe",
                        "-vd",
                        "/var/run/kmm/images/kmod/opt",
                        "my_kmod",
                        "a=1",
                    ]),
                ],
            ),
            (
                "deprecated single in-tree module",
                {
                    let mut config = config(spec("my_kmod"));
                    config.in_tree_module_to_remove = "ice".to_string();
                    config
                },
                vec![
                    modprobe(&["modprobe", "-rv", "ice"]),
                    modprobe(&["modprobe", "-vd", "/var/run/kmm/images/kmod/opt", "my_kmod"]),
                ],
            ),
            (
                "raw arguments",
                config(ModprobeSpec {
                    raw_args: Some(ModprobeArgs {
                        load: strings(&["-v", "raw"]),
                        unload: strings(&["-rv", "raw"]),
                    }),
                    ..ModprobeSpec::default()
                }),
                vec![modprobe(&["modprobe", "-v", "raw"])],
            ),
        ];
        for (case, config, want) in cases {
            let mut node = Recorder {
                in_tree: vec!["ice", "irdma"],
                ..Recorder::default()
            };
            load(&config, &mut node, &paths).unwrap();
            assert_eq!(node.calls, want, "{case}");
        }
    }

    #[test]
    fn in_tree_removal_is_skipped_when_the_node_has_none_of_them() {
        let mut config = config(spec("ice"));
        config.in_tree_modules_to_remove = strings(&["ice"]);
        let mut node = Recorder::default();
        load(&config, &mut node, &Paths::default()).unwrap();
        assert_eq!(node.calls, [modprobe(&["modprobe", "-vd", "/opt", "ice"])]);
    }

    #[test]
    fn the_firmware_search_path_is_written_only_when_it_differs() {
        let config = config(ModprobeSpec {
            firmware_path: "/firmware".to_string(),
            ..spec("m")
        });
        let mut node = Recorder {
            search_path: "/var/lib/firmware".to_string(),
            ..Recorder::default()
        };
        load(&config, &mut node, &Paths::default()).unwrap();
        assert!(
            !node
                .calls
                .iter()
                .any(|c| matches!(c, Call::SetFirmwareSearchPath(_))),
            "{:?}",
            node.calls
        );
    }

    #[test]
    fn unload_runs_the_steps_in_upstream_order() {
        let cases = vec![
            (
                "plain",
                config(spec("my_kmod")),
                vec![modprobe(&["modprobe", "-rvd", "/opt", "my_kmod"])],
            ),
            (
                "loading order and firmware",
                config(ModprobeSpec {
                    firmware_path: "/firmware".to_string(),
                    modules_loading_order: strings(&["my_kmod", "dep"]),
                    args: Some(ModprobeArgs {
                        load: vec![],
                        unload: strings(&["--wait=1000"]),
                    }),
                    ..spec("my_kmod")
                }),
                vec![
                    Call::Softdep("softdep my_kmod pre: dep\n".to_string()),
                    modprobe(&["modprobe", "-rvd", "/opt", "--wait=1000", "my_kmod", "dep"]),
                    Call::RemoveFirmware("/firmware".into(), "/var/lib/firmware".into()),
                ],
            ),
        ];
        for (case, config, want) in cases {
            let mut node = Recorder::default();
            unload(&config, &mut node, &Paths::default()).unwrap();
            assert_eq!(node.calls, want, "{case}");
        }
    }

    #[test]
    fn leftover_firmware_files_do_not_fail_an_unload() {
        let config = config(ModprobeSpec {
            firmware_path: "/firmware".to_string(),
            ..spec("m")
        });
        let mut node = Recorder {
            fail_firmware_removal: true,
            ..Recorder::default()
        };
        assert!(unload(&config, &mut node, &Paths::default()).is_ok());
    }

    #[test]
    fn failures_stop_the_flow_with_a_one_line_reason() {
        let mut with_in_tree = config(spec("my_kmod"));
        with_in_tree.in_tree_modules_to_remove = strings(&["ice"]);
        let cases = [
            (
                with_in_tree,
                "ice",
                true,
                "could not remove in-tree modules ice: `modprobe -rv ice` failed: modprobe: FATAL: Module x is in use.",
            ),
            (
                config(spec("my_kmod")),
                "my_kmod",
                true,
                "could not load module my_kmod: `modprobe -vd /opt my_kmod` failed: modprobe: FATAL: Module x is in use.",
            ),
            (
                config(spec("my_kmod")),
                "my_kmod",
                false,
                "could not unload module my_kmod: `modprobe -rvd /opt my_kmod` failed: modprobe: FATAL: Module x is in use.",
            ),
        ];
        for (config, fail_on, loading, want) in cases {
            let mut node = Recorder {
                in_tree: vec!["ice"],
                fail_on: Some(fail_on),
                ..Recorder::default()
            };
            let result = if loading {
                load(&config, &mut node, &Paths::default())
            } else {
                unload(&config, &mut node, &Paths::default())
            };
            let err = result.unwrap_err();
            assert_eq!(err.to_string(), want);
            // Nothing runs after the failing step.
            assert_eq!(node.calls.len(), 1, "{:?}", node.calls);
        }
    }

    #[test]
    fn a_simulated_node_goes_through_replace_load_and_unload() {
        let mut modules = ModuleTable::default();
        for name in ["ice", "irdma", "other"] {
            modules.insert(LoadedModule {
                name: name.to_string(),
                ..LoadedModule::default()
            });
        }
        let mut config = config(ModprobeSpec {
            firmware_path: "/firmware".to_string(),
            modules_loading_order: strings(&["ice", "ice_aux"]),
            parameters: strings(&["debug=1"]),
            ..spec("ice")
        });
        config.in_tree_modules_to_remove = strings(&["irdma", "ice"]);

        let mut kernel = SimulatedKernel::new(&mut modules, Some("v2".to_string()));
        load(&config, &mut kernel, &Paths::default()).unwrap();
        let names: Vec<&str> = modules.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names, ["ice", "ice_aux", "other"]);
        let ice = modules.get("ice").unwrap();
        assert_eq!(ice.version.as_deref(), Some("v2"));
        assert_eq!(ice.parameters, ["debug=1"]);
        assert_eq!(ice.firmware_path.as_deref(), Some("/var/lib/firmware"));

        let mut kernel = SimulatedKernel::new(&mut modules, Some("v2".to_string()));
        unload(&config, &mut kernel, &Paths::default()).unwrap();
        let names: Vec<&str> = modules.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names, ["other"]);

        // Unloading again: nothing is loaded, and that is fine.
        let mut kernel = SimulatedKernel::new(&mut modules, Some("v2".to_string()));
        unload(&config, &mut kernel, &Paths::default()).unwrap();
    }
}
