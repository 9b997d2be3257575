//! A simulated node's kernel: the table of its loaded modules, and a [`Kernel`] that
//! carries out the worker's `modprobe` commands against that table the way kmod's
//! `modprobe` would.
//!
//! What the simulation assumes, and why:
//! - A module is found when the command names a module directory (`-d`): the kmod image
//!   is assumed to hold every module it is asked for. Without `-d` (in-tree removal, raw
//!   arguments) only the modules the node has loaded are found: its `/lib/modules` holds
//!   what it booted with.
//! - Loading a loaded module changes nothing and succeeds, as `modprobe` does (its
//!   parameters stay as they were); with `--first-time` it fails.
//! - Removing a module that is found but not loaded succeeds, as `modprobe -r` does;
//!   with `--first-time` it fails. Removing a module that is not found fails with
//!   `Module X not found.`.
//! - Softdeps written by the worker apply: loading a module loads its `pre:` modules
//!   first and its `post:` modules after; removing it removes `post:` modules first and
//!   `pre:` modules after (failures there are not fatal, as in kmod).
//! - `-n`/`--dry-run` and the print-only options change nothing.
//! - The firmware search path lasts for one worker run and is recorded with each module
//!   loaded in that run; the simulated node keeps no firmware files.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::kernel::{Kernel, KernelError};
use super::modprobe::canonical_name;

/// A node's loaded kernel modules, by name (`_` spelling, as `/sys/module` has them).
/// Serialises as a map from name to module; a module may omit its name there.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(
    from = "BTreeMap<String, LoadedModule>",
    into = "BTreeMap<String, LoadedModule>"
)]
pub struct ModuleTable {
    modules: BTreeMap<String, LoadedModule>,
}

/// One loaded module.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LoadedModule {
    /// The module's name (`_` spelling).
    #[serde(default)]
    pub name: String,
    /// The Module version whose worker loaded it; `None` for modules the node booted with
    /// or Modules without a version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// The `key=value` parameters it was loaded with.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parameters: Vec<String>,
    /// The kernel's firmware search path when it was loaded, if one was set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub firmware_path: Option<String>,
}

impl From<BTreeMap<String, LoadedModule>> for ModuleTable {
    fn from(modules: BTreeMap<String, LoadedModule>) -> Self {
        let mut table = ModuleTable::default();
        for (name, mut module) in modules {
            module.name = name;
            table.insert(module);
        }
        table
    }
}

impl From<ModuleTable> for BTreeMap<String, LoadedModule> {
    fn from(table: ModuleTable) -> Self {
        table.modules
    }
}

impl ModuleTable {
    /// How many modules are loaded.
    pub fn len(&self) -> usize {
        self.modules.len()
    }

    /// Whether no module is loaded.
    pub fn is_empty(&self) -> bool {
        self.modules.is_empty()
    }

    /// The loaded module `name` (`-` and `_` alike).
    pub fn get(&self, name: &str) -> Option<&LoadedModule> {
        self.modules.get(&canonical_name(name))
    }

    /// Whether module `name` (`-` and `_` alike) is loaded.
    pub fn contains(&self, name: &str) -> bool {
        self.modules.contains_key(&canonical_name(name))
    }

    /// The loaded modules, by name.
    pub fn iter(&self) -> impl Iterator<Item = &LoadedModule> {
        self.modules.values()
    }

    /// Adds `module` (its name in `_` spelling), replacing a module of the same name.
    pub fn insert(&mut self, mut module: LoadedModule) {
        module.name = canonical_name(&module.name);
        self.modules.insert(module.name.clone(), module);
    }

    /// Removes module `name` (`-` and `_` alike), returning it if it was loaded.
    pub fn remove(&mut self, name: &str) -> Option<LoadedModule> {
        self.modules.remove(&canonical_name(name))
    }
}

/// The kernel of a simulated node, for one worker run: carries out `modprobe` commands
/// against the node's [`ModuleTable`]. See the module docs for the rules.
#[derive(Debug)]
pub struct SimulatedKernel<'a> {
    table: &'a mut ModuleTable,
    version: Option<String>,
    softdeps: BTreeMap<String, Softdep>,
    firmware_search_path: String,
}

/// The modules loaded before (`pre`) and after (`post`) one module.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Softdep {
    pre: Vec<String>,
    post: Vec<String>,
}

impl<'a> SimulatedKernel<'a> {
    /// The kernel of the node whose loaded modules are `table`, for a worker loading
    /// Module version `version`: every module loaded is recorded with that version.
    pub fn new(table: &'a mut ModuleTable, version: Option<String>) -> Self {
        SimulatedKernel {
            table,
            version,
            softdeps: BTreeMap::new(),
            firmware_search_path: String::new(),
        }
    }
}

impl Kernel for SimulatedKernel<'_> {
    fn modprobe(&mut self, argv: &[String]) -> Result<(), KernelError> {
        let invocation =
            Invocation::parse(argv).map_err(|line| KernelError::modprobe(argv, line))?;
        let loaded = LoadedWith {
            version: self.version.clone(),
            firmware_path: Some(self.firmware_search_path.clone()).filter(|p| !p.is_empty()),
        };
        let mut scratch;
        let table: &mut ModuleTable = if invocation.changes_nothing {
            scratch = self.table.clone();
            &mut scratch
        } else {
            self.table
        };
        let mut probe = Probe {
            table,
            softdeps: &self.softdeps,
            invocation: &invocation,
            loaded,
            visiting: BTreeSet::new(),
        };
        probe
            .run()
            .map_err(|line| KernelError::modprobe(argv, line))
    }

    fn write_softdep(&mut self, contents: &str) -> Result<(), KernelError> {
        self.softdeps = parse_softdeps(contents);
        Ok(())
    }

    fn has_in_tree_module(&self, name: &str) -> Result<bool, KernelError> {
        Ok(self.table.contains(name))
    }

    fn firmware_search_path(&self) -> Result<String, KernelError> {
        Ok(self.firmware_search_path.clone())
    }

    fn set_firmware_search_path(&mut self, path: &str) -> Result<(), KernelError> {
        self.firmware_search_path = path.to_string();
        Ok(())
    }

    fn install_firmware(&mut self, _from: &Path, _to: &Path) -> Result<(), KernelError> {
        // The simulated node keeps no files; the search path recorded per module stands in.
        Ok(())
    }

    fn remove_firmware(&mut self, _from: &Path, _to: &Path) -> Result<(), KernelError> {
        Ok(())
    }
}

/// `softdep <module> pre: <modules...> post: <modules...>` lines; others are ignored, as
/// `modprobe` ignores what it does not use.
fn parse_softdeps(contents: &str) -> BTreeMap<String, Softdep> {
    let mut softdeps = BTreeMap::new();
    for line in contents.lines() {
        let mut words = line.split_whitespace();
        if words.next() != Some("softdep") {
            continue;
        }
        let Some(module) = words.next() else { continue };
        let mut softdep = Softdep::default();
        let mut into_post = false;
        for word in words {
            match word {
                "pre:" => into_post = false,
                "post:" => into_post = true,
                dep if into_post => softdep.post.push(canonical_name(dep)),
                dep => softdep.pre.push(canonical_name(dep)),
            }
        }
        softdeps.insert(canonical_name(module), softdep);
    }
    softdeps
}

/// A `modprobe` command line, read as kmod's `getopt_long` reads it.
#[derive(Debug, Default, PartialEq, Eq)]
struct Invocation {
    remove: bool,
    all: bool,
    first_time: bool,
    /// `-n`, or an option that only prints (`-D`, `-R`, `-c`, `-V`, `-h`...).
    changes_nothing: bool,
    /// `-V`, `-h` or `-c`: no module needed.
    needs_no_module: bool,
    module_dir: Option<String>,
    /// The non-option arguments, in order: modules, then parameters.
    words: Vec<String>,
}

impl Invocation {
    /// Reads `argv` (`argv[0]` is the program). Err is `modprobe`'s complaint.
    fn parse(argv: &[String]) -> Result<Self, String> {
        let mut invocation = Invocation::default();
        let mut args = argv.iter().skip(1);
        while let Some(arg) = args.next() {
            if arg == "--" {
                invocation.words.extend(args.by_ref().cloned());
            } else if let Some(long) = arg.strip_prefix("--") {
                let (name, inline) = match long.split_once('=') {
                    Some((name, value)) => (name, Some(value.to_string())),
                    None => (long, None),
                };
                let value = if matches!(name, "dirname" | "config" | "set-version" | "wait") {
                    match inline {
                        Some(value) => Some(value),
                        None => Some(args.next().cloned().ok_or_else(|| {
                            format!("modprobe: option '--{name}' requires an argument")
                        })?),
                    }
                } else {
                    None
                };
                invocation.long_option(name, value)?;
            } else if let Some(cluster) = arg.strip_prefix('-').filter(|c| !c.is_empty()) {
                for (index, flag) in cluster.char_indices() {
                    if matches!(flag, 'd' | 'C' | 'S' | 'w') {
                        let rest = &cluster[index + flag.len_utf8()..];
                        let value = if rest.is_empty() {
                            args.next().cloned().ok_or_else(|| {
                                format!("modprobe: option requires an argument -- '{flag}'")
                            })?
                        } else {
                            rest.to_string()
                        };
                        if flag == 'd' {
                            invocation.module_dir = Some(value);
                        }
                        break;
                    }
                    invocation.short_flag(flag)?;
                }
            } else {
                invocation.words.push(arg.clone());
            }
        }
        Ok(invocation)
    }

    fn short_flag(&mut self, flag: char) -> Result<(), String> {
        match flag {
            'r' => self.remove = true,
            'a' => self.all = true,
            'n' | 'D' | 'R' => self.changes_nothing = true,
            'c' | 'V' | 'h' => {
                self.changes_nothing = true;
                self.needs_no_module = true;
            }
            'v' | 'q' | 'i' | 'b' | 'f' | 's' => {}
            other => return Err(format!("modprobe: invalid option -- '{other}'")),
        }
        Ok(())
    }

    fn long_option(&mut self, name: &str, value: Option<String>) -> Result<(), String> {
        match name {
            "remove" => self.remove = true,
            "all" => self.all = true,
            "first-time" => self.first_time = true,
            "dirname" => self.module_dir = value,
            "dry-run" | "show" | "show-depends" | "resolve-alias" | "show-modversions"
            | "dump-modversions" | "show-exports" => self.changes_nothing = true,
            "showconfig" | "show-config" | "version" | "help" => {
                self.changes_nothing = true;
                self.needs_no_module = true;
            }
            "verbose"
            | "quiet"
            | "ignore-install"
            | "ignore-remove"
            | "use-blacklist"
            | "force"
            | "force-vermagic"
            | "force-modversion"
            | "syslog"
            | "remove-dependencies"
            | "remove-holders"
            | "config"
            | "set-version"
            | "wait" => {}
            other => return Err(format!("modprobe: unrecognized option '--{other}'")),
        }
        Ok(())
    }
}

/// What a module loaded in this run is recorded with.
#[derive(Clone, Debug)]
struct LoadedWith {
    version: Option<String>,
    firmware_path: Option<String>,
}

/// One `modprobe` run against a table. Errors are `modprobe`'s last stderr line.
struct Probe<'t> {
    table: &'t mut ModuleTable,
    softdeps: &'t BTreeMap<String, Softdep>,
    invocation: &'t Invocation,
    loaded: LoadedWith,
    /// Modules being loaded or removed, so softdep cycles end.
    visiting: BTreeSet<String>,
}

impl Probe<'_> {
    fn run(&mut self) -> Result<(), String> {
        let words = &self.invocation.words;
        if words.is_empty() {
            return if self.invocation.needs_no_module {
                Ok(())
            } else {
                Err("modprobe: ERROR: missing parameters. See -h.".to_string())
            };
        }
        if self.invocation.remove {
            // Every name is removed; the last failure is what stderr ends with.
            let mut last_error = None;
            for module in words {
                if let Err(err) = self.remove(module) {
                    last_error = Some(err);
                }
            }
            return last_error.map_or(Ok(()), Err);
        }
        if self.invocation.all {
            let mut last_error = None;
            for module in words {
                if let Err(err) = self.load(module, &[]) {
                    last_error = Some(err);
                }
            }
            return last_error.map_or(Ok(()), Err);
        }
        self.load(&words[0], &words[1..])
    }

    /// Whether `modprobe` can find `module`: see the module docs.
    fn found(&self, module: &str) -> bool {
        self.invocation.module_dir.is_some() || self.table.contains(module)
    }

    fn load(&mut self, module: &str, parameters: &[String]) -> Result<(), String> {
        let name = canonical_name(module);
        if self.table.contains(&name) {
            if self.invocation.first_time {
                return Err(format!(
                    "modprobe: ERROR: could not insert '{name}': Module already in kernel"
                ));
            }
            return Ok(());
        }
        if !self.found(&name) {
            return Err(format!(
                "modprobe: FATAL: Module {module} not found in directory {}",
                self.invocation
                    .module_dir
                    .as_deref()
                    .unwrap_or("/lib/modules")
            ));
        }
        if !self.visiting.insert(name.clone()) {
            return Ok(());
        }
        let softdep = self.softdeps.get(&name).cloned().unwrap_or_default();
        for pre in &softdep.pre {
            self.load(pre, &[])?;
        }
        self.table.insert(LoadedModule {
            name: name.clone(),
            version: self.loaded.version.clone(),
            parameters: parameters.to_vec(),
            firmware_path: self.loaded.firmware_path.clone(),
        });
        for post in &softdep.post {
            self.load(post, &[])?;
        }
        self.visiting.remove(&name);
        Ok(())
    }

    fn remove(&mut self, module: &str) -> Result<(), String> {
        let name = canonical_name(module);
        if !self.table.contains(&name) {
            if !self.found(&name) {
                return Err(format!("modprobe: FATAL: Module {module} not found."));
            }
            if self.invocation.first_time {
                return Err(format!("modprobe: FATAL: Module {name} is not in kernel."));
            }
            return Ok(());
        }
        if !self.visiting.insert(name.clone()) {
            return Ok(());
        }
        let softdep = self.softdeps.get(&name).cloned().unwrap_or_default();
        self.remove_softdeps(&softdep.post);
        self.table.remove(&name);
        self.remove_softdeps(&softdep.pre);
        self.visiting.remove(&name);
        Ok(())
    }

    /// Removes loaded softdep modules, last first; failures are not fatal, as in kmod.
    fn remove_softdeps(&mut self, modules: &[String]) {
        for module in modules.iter().rev() {
            if self.table.contains(module) {
                // A softdep that cannot be removed stays loaded; kmod only warns.
                let _ = self.remove(module);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(words: &[&str]) -> Vec<String> {
        words.iter().map(|w| w.to_string()).collect()
    }

    fn table(names: &[&str]) -> ModuleTable {
        let mut table = ModuleTable::default();
        for name in names {
            table.insert(LoadedModule {
                name: name.to_string(),
                ..LoadedModule::default()
            });
        }
        table
    }

    fn names(table: &ModuleTable) -> Vec<String> {
        table.iter().map(|m| m.name.clone()).collect()
    }

    /// Runs `commands` in order on a kernel over `start` with `softdep` written first.
    fn run(
        start: &[&str],
        softdep: &str,
        commands: &[&[&str]],
    ) -> (ModuleTable, Vec<Result<(), String>>) {
        let mut modules = table(start);
        let mut kernel = SimulatedKernel::new(&mut modules, Some("v2".to_string()));
        kernel.write_softdep(softdep).unwrap();
        let results = commands
            .iter()
            .map(|c| kernel.modprobe(&argv(c)).map_err(|e| e.to_string()))
            .collect();
        (modules, results)
    }

    #[test]
    fn each_worker_command_changes_the_table_as_modprobe_would() {
        // (case, loaded before, softdep file, command, loaded after, error)
        type Case<'a> = (
            &'a str,
            Vec<&'a str>,
            &'a str,
            Vec<&'a str>,
            Vec<&'a str>,
            Option<&'a str>,
        );
        let cases: Vec<Case> = vec![
            (
                "load",
                vec![],
                "",
                vec!["modprobe", "-vd", "/opt", "my_kmod", "a=1"],
                vec!["my_kmod"],
                None,
            ),
            (
                "load a loaded module: nothing changes",
                vec!["my_kmod"],
                "",
                vec!["modprobe", "-vd", "/opt", "my_kmod"],
                vec!["my_kmod"],
                None,
            ),
            (
                "load with --first-time of a loaded module fails",
                vec!["my_kmod"],
                "",
                vec!["modprobe", "-vd", "/opt", "--first-time", "my_kmod"],
                vec!["my_kmod"],
                Some("Module already in kernel"),
            ),
            (
                "load with softdeps loads the chain",
                vec![],
                "softdep a pre: b\nsoftdep b pre: c\n",
                vec!["modprobe", "-vd", "/opt", "a"],
                vec!["a", "b", "c"],
                None,
            ),
            (
                "unload",
                vec!["my_kmod", "other"],
                "",
                vec!["modprobe", "-rvd", "/opt", "my_kmod"],
                vec!["other"],
                None,
            ),
            (
                "unload of a module that is not loaded succeeds",
                vec!["other"],
                "",
                vec!["modprobe", "-rvd", "/opt", "my_kmod"],
                vec!["other"],
                None,
            ),
            (
                "unload with the loading order removes every module",
                vec!["a", "b", "c", "other"],
                "softdep a pre: b\nsoftdep b pre: c\n",
                vec!["modprobe", "-rvd", "/opt", "a", "b", "c"],
                vec!["other"],
                None,
            ),
            (
                "unload follows softdeps from the first module",
                vec!["a", "b", "c"],
                "softdep a pre: b\nsoftdep b pre: c\n",
                vec!["modprobe", "-rvd", "/opt", "a"],
                vec![],
                None,
            ),
            (
                "in-tree removal",
                vec!["ice", "irdma", "other"],
                "",
                vec!["modprobe", "-rv", "irdma", "ice"],
                vec!["other"],
                None,
            ),
            (
                "in-tree removal of a module the node does not have",
                vec!["other"],
                "",
                vec!["modprobe", "-rv", "ice"],
                vec!["other"],
                Some("`modprobe -rv ice` failed: modprobe: FATAL: Module ice not found."),
            ),
            (
                "raw arguments: separate flags, --dirname=",
                vec![],
                "",
                vec!["modprobe", "-v", "--dirname=/opt", "raw-kmod", "x=1"],
                vec!["raw_kmod"],
                None,
            ),
            (
                "raw unload by another spelling",
                vec!["raw_kmod"],
                "",
                vec!["modprobe", "-r", "-d", "/opt", "raw-kmod"],
                vec![],
                None,
            ),
            (
                "dry run changes nothing",
                vec![],
                "",
                vec!["modprobe", "-n", "-vd", "/opt", "my_kmod"],
                vec![],
                None,
            ),
            (
                "no module",
                vec![],
                "",
                vec!["modprobe", "-vd", "/opt"],
                vec![],
                Some("missing parameters"),
            ),
            (
                "unknown option",
                vec![],
                "",
                vec!["modprobe", "--bogus", "x"],
                vec![],
                Some("unrecognized option '--bogus'"),
            ),
            (
                "-d without its directory",
                vec![],
                "",
                vec!["modprobe", "-vd"],
                vec![],
                Some("requires an argument -- 'd'"),
            ),
        ];
        for (case, before, softdep, command, after, error) in cases {
            let (modules, results) = run(&before, softdep, &[&command]);
            assert_eq!(names(&modules), after, "{case}");
            match (error, &results[0]) {
                (None, Ok(())) => {}
                (Some(want), Err(got)) => assert!(got.contains(want), "{case}: {got}"),
                (want, got) => panic!("{case}: wanted {want:?}, got {got:?}"),
            }
        }
    }

    #[test]
    fn loaded_modules_record_version_parameters_and_firmware_path() {
        let mut modules = table(&["ice"]);
        let mut kernel = SimulatedKernel::new(&mut modules, Some("v2".to_string()));
        kernel.write_softdep("softdep my_kmod pre: dep\n").unwrap();
        kernel
            .set_firmware_search_path("/var/lib/firmware")
            .unwrap();
        kernel
            .modprobe(&argv(&["modprobe", "-vd", "/opt", "my-kmod", "a=1", "b=2"]))
            .unwrap();
        assert_eq!(
            modules.get("my_kmod"),
            Some(&LoadedModule {
                name: "my_kmod".to_string(),
                version: Some("v2".to_string()),
                parameters: argv(&["a=1", "b=2"]),
                firmware_path: Some("/var/lib/firmware".to_string()),
            })
        );
        let dep = modules.get("dep").unwrap();
        assert!(dep.parameters.is_empty(), "softdeps get no parameters");
        assert_eq!(dep.version.as_deref(), Some("v2"));
        assert_eq!(modules.get("ice").unwrap().version, None, "untouched");
    }

    #[test]
    fn reloading_keeps_the_old_parameters_until_unloaded() {
        let (modules, results) = run(
            &[],
            "",
            &[
                &["modprobe", "-vd", "/opt", "m", "a=1"],
                &["modprobe", "-vd", "/opt", "m", "a=2"],
            ],
        );
        assert!(results.iter().all(Result::is_ok));
        assert_eq!(modules.get("m").unwrap().parameters, argv(&["a=1"]));
    }

    #[test]
    fn softdep_cycles_end() {
        let (modules, results) = run(
            &[],
            "softdep a pre: b\nsoftdep b pre: a\n",
            &[
                &["modprobe", "-vd", "/opt", "a"],
                &["modprobe", "-rvd", "/opt", "a"],
            ],
        );
        assert_eq!(results, vec![Ok(()), Ok(())]);
        assert!(modules.is_empty());
    }

    #[test]
    fn in_tree_modules_are_the_loaded_ones() {
        let mut modules = table(&["ice"]);
        let kernel = SimulatedKernel::new(&mut modules, None);
        assert!(kernel.has_in_tree_module("ice").unwrap());
        assert!(!kernel.has_in_tree_module("irdma").unwrap());
    }

    #[test]
    fn softdep_lines_parse_pre_and_post() {
        let softdeps =
            parse_softdeps("# comment\noptions x y=1\nsoftdep my-kmod pre: a b post: c\nsoftdep\n");
        assert_eq!(
            softdeps,
            BTreeMap::from([(
                "my_kmod".to_string(),
                Softdep {
                    pre: argv(&["a", "b"]),
                    post: argv(&["c"]),
                }
            )])
        );
    }

    #[test]
    fn tables_serialise_as_maps_and_take_names_from_keys() {
        let text = "ice: {}\nmy-kmod: {version: v1, parameters: [a=1]}\n";
        let table: ModuleTable = serde_saphyr::from_str(text).unwrap();
        assert_eq!(names(&table), ["ice", "my_kmod"]);
        let json = serde_json::to_value(&table).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "ice": {"name": "ice"},
                "my_kmod": {"name": "my_kmod", "version": "v1", "parameters": ["a=1"]},
            })
        );
        let back: ModuleTable = serde_json::from_value(json).unwrap();
        assert_eq!(back, table);
        assert_eq!(
            serde_json::to_string(&ModuleTable::default()).unwrap(),
            "{}"
        );
        assert!(serde_saphyr::from_str::<ModuleTable>("ice: {verison: v1}\n").is_err());
    }
}
