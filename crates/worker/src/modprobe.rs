//! The `modprobe` command lines a worker runs, and the softdep file it writes, exactly as
//! upstream KMM's worker (`internal/worker/worker.go`) builds them.
//!
//! Every command is a full argv: `argv[0]` is `modprobe` (the program name the process
//! sees, which multi-call `kmod` binaries dispatch on), the rest are its arguments.
//! Upstream combines the short flags (`-vd DIR`, `-rvd DIR`, `-rv`); `modprobe` reads them
//! as `-v -d DIR`, `-r -v -d DIR` and `-r -v`. The module directory given to `-d` is the
//! module's `dirName` inside the directory the kmod image was extracted to; `modprobe`
//! then looks for modules under `<dir>/lib/modules/<kernel>/`.

use std::path::{Path, PathBuf};

use capstan_api::module::ModprobeSpec;

/// `argv[0]` of every command.
pub const PROGRAM: &str = "modprobe";

/// Where the worker writes the module loading order, as upstream's worker pod mounts it.
/// `modprobe` reads every `*.conf` file of `/etc/modprobe.d`, whatever `-d` says.
pub const SOFTDEP_PATH: &str = "/etc/modprobe.d/softdep.conf";

/// Loads the module: `modprobe -vd <dir> [args.load...] <moduleName> [parameters...]`, or
/// `modprobe <rawArgs.load...>` when `rawArgs` is set (everything else is then ignored).
pub fn load_command(spec: &ModprobeSpec, image_root: &Path) -> Vec<String> {
    if let Some(raw) = &spec.raw_args {
        return command(&[], &raw.load);
    }
    let mut argv = command(&["-vd", &image_path(image_root, &spec.dir_name)], &[]);
    if let Some(args) = &spec.args {
        argv.extend(args.load.iter().cloned());
    }
    argv.push(spec.module_name.clone());
    argv.extend(spec.parameters.iter().cloned());
    argv
}

/// Unloads the module: `modprobe -rvd <dir> [args.unload...] <modules...>`, where the
/// modules are `modulesLoadingOrder` when set (every module the load brought in), else
/// `moduleName`; or `modprobe <rawArgs.unload...>` when `rawArgs` is set.
pub fn unload_command(spec: &ModprobeSpec, image_root: &Path) -> Vec<String> {
    if let Some(raw) = &spec.raw_args {
        return command(&[], &raw.unload);
    }
    let mut argv = command(&["-rvd", &image_path(image_root, &spec.dir_name)], &[]);
    if let Some(args) = &spec.args {
        argv.extend(args.unload.iter().cloned());
    }
    if spec.modules_loading_order.is_empty() {
        argv.push(spec.module_name.clone());
    } else {
        argv.extend(spec.modules_loading_order.iter().cloned());
    }
    argv
}

/// Removes in-tree modules before an out-of-tree one is loaded: `modprobe -rv <modules...>`.
/// No `-d`: in-tree modules live in the node's own `/lib/modules`.
pub fn in_tree_removal_command(modules: &[String]) -> Vec<String> {
    command(&["-rv"], modules)
}

/// The softdep file for a module loading order: one `softdep A pre: B` line per adjacent
/// pair, so loading the first module loads the others first, last one first, and
/// removing it removes them after it. Empty for an order of fewer than two modules.
pub fn softdep_conf(order: &[String]) -> String {
    order
        .windows(2)
        .map(|pair| format!("softdep {} pre: {}\n", pair[0], pair[1]))
        .collect()
}

/// `path` (`dirName`, `firmwarePath`) inside the kmod image extracted at `image_root`,
/// cleaned as Go's `filepath.Join` does (`/` and `/opt/` make `/opt`).
pub fn image_path(image_root: &Path, path: &str) -> String {
    let joined: PathBuf = image_root
        .join(path.trim_start_matches('/'))
        .components()
        .collect();
    joined.to_string_lossy().into_owned()
}

/// The name the kernel knows a module by: `modprobe` treats `-` and `_` in module names
/// alike, and `/sys/module` spells them `_`.
pub fn canonical_name(module: &str) -> String {
    module.replace('-', "_")
}

fn command(flags: &[&str], rest: &[String]) -> Vec<String> {
    std::iter::once(PROGRAM)
        .chain(flags.iter().copied())
        .map(str::to_string)
        .chain(rest.iter().cloned())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use capstan_api::module::ModprobeArgs;

    fn strings(words: &[&str]) -> Vec<String> {
        words.iter().map(|w| w.to_string()).collect()
    }

    fn spec(module: &str) -> ModprobeSpec {
        ModprobeSpec {
            module_name: module.to_string(),
            ..ModprobeSpec::default()
        }
    }

    fn args(load: &[&str], unload: &[&str]) -> Option<ModprobeArgs> {
        Some(ModprobeArgs {
            load: strings(load),
            unload: strings(unload),
        })
    }

    /// (case, spec, image root, load argv, unload argv)
    type Case = (
        &'static str,
        ModprobeSpec,
        &'static str,
        Vec<&'static str>,
        Vec<&'static str>,
    );

    fn cases() -> Vec<Case> {
        vec![
            (
                "plain module, default dirName, image at /",
                spec("my_kmod"),
                "/",
                vec!["modprobe", "-vd", "/opt", "my_kmod"],
                vec!["modprobe", "-rvd", "/opt", "my_kmod"],
            ),
            (
                "image extracted elsewhere",
                ModprobeSpec {
                    dir_name: "/dir".to_string(),
                    ..spec("test")
                },
                "/tmp",
                vec!["modprobe", "-vd", "/tmp/dir", "test"],
                vec!["modprobe", "-rvd", "/tmp/dir", "test"],
            ),
            (
                "args and parameters: args before the module, parameters after it",
                ModprobeSpec {
                    dir_name: "/dir".to_string(),
                    parameters: strings(&["key0=value0", "key1=value1"]),
                    args: args(&["a", "b", "c"], &["x", "y"]),
                    ..spec("test")
                },
                "/tmp",
                vec![
                    "modprobe",
                    "-vd",
                    "/tmp/dir",
                    "a",
                    "b",
                    "c",
                    "test",
                    "key0=value0",
                    "key1=value1",
                ],
                vec!["modprobe", "-rvd", "/tmp/dir", "x", "y", "test"],
            ),
            (
                "only load args: unload gets none",
                ModprobeSpec {
                    args: args(&["--first-time"], &[]),
                    ..spec("test")
                },
                "/",
                vec!["modprobe", "-vd", "/opt", "--first-time", "test"],
                vec!["modprobe", "-rvd", "/opt", "test"],
            ),
            (
                "modulesLoadingOrder: unload names every module",
                ModprobeSpec {
                    modules_loading_order: strings(&["kmod_a", "kmod_b", "kmod_c"]),
                    parameters: strings(&["debug=1"]),
                    ..spec("kmod_a")
                },
                "/",
                vec!["modprobe", "-vd", "/opt", "kmod_a", "debug=1"],
                vec!["modprobe", "-rvd", "/opt", "kmod_a", "kmod_b", "kmod_c"],
            ),
            (
                "rawArgs replace everything else",
                ModprobeSpec {
                    raw_args: args(&["a", "b", "c"], &["-r", "d"]),
                    parameters: strings(&["ignored=1"]),
                    args: args(&["ignored"], &["ignored"]),
                    ..ModprobeSpec::default()
                },
                "/tmp",
                vec!["modprobe", "a", "b", "c"],
                vec!["modprobe", "-r", "d"],
            ),
            (
                "dirName without a leading slash or with a trailing one",
                ModprobeSpec {
                    dir_name: "opt/modules/".to_string(),
                    ..spec("m")
                },
                "/var/run/kmm/images/abc/",
                vec![
                    "modprobe",
                    "-vd",
                    "/var/run/kmm/images/abc/opt/modules",
                    "m",
                ],
                vec![
                    "modprobe",
                    "-rvd",
                    "/var/run/kmm/images/abc/opt/modules",
                    "m",
                ],
            ),
        ]
    }

    #[test]
    fn load_and_unload_commands_match_upstream() {
        for (case, spec, root, load, unload) in cases() {
            assert_eq!(load_command(&spec, Path::new(root)), load, "load: {case}");
            assert_eq!(
                unload_command(&spec, Path::new(root)),
                unload,
                "unload: {case}"
            );
        }
    }

    #[test]
    fn in_tree_removal_has_no_module_dir() {
        let cases = [
            (vec!["intree1"], vec!["modprobe", "-rv", "intree1"]),
            (
                vec!["irdma", "ice"],
                vec!["modprobe", "-rv", "irdma", "ice"],
            ),
        ];
        for (modules, want) in cases {
            assert_eq!(in_tree_removal_command(&strings(&modules)), want);
        }
    }

    #[test]
    fn softdep_lines_chain_adjacent_modules() {
        let cases = [
            (vec![], ""),
            (vec!["a"], ""),
            (vec!["a", "b"], "softdep a pre: b\n"),
            (
                vec!["kmod_a", "kmod_b", "kmod_c"],
                "softdep kmod_a pre: kmod_b\nsoftdep kmod_b pre: kmod_c\n",
            ),
        ];
        for (order, want) in cases {
            assert_eq!(softdep_conf(&strings(&order)), want, "{order:?}");
        }
    }

    #[test]
    fn canonical_names_use_underscores() {
        assert_eq!(canonical_name("my-kmod_x"), "my_kmod_x");
        assert_eq!(canonical_name("ice"), "ice");
    }
}
