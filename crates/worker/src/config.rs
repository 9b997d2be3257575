//! The worker's config file: the [`ModuleConfig`] a worker pod gets through its
//! `kmm.node.kubernetes.io/worker-config` annotation, mounted at
//! `/etc/kmm-worker/config.yaml`.
//!
//! Read strictly, as upstream's worker does: a field the NodeModulesConfig schema does not
//! declare is an error, not a silent no-op. Errors name the file, the line and column, and
//! the field. The modprobe rules of a Module are checked again here, because the worker
//! would otherwise run a broken command: either `moduleName` without `rawArgs`, or
//! `rawArgs.load` and `rawArgs.unload` both; a `modulesLoadingOrder` starts with
//! `moduleName`, has at least two modules and no module twice.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::LazyLock;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps, JSONSchemaPropsOrArray,
};
use kube::CustomResourceExt;
use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Value, json};
use serde_saphyr::Spanned;
use thiserror::Error;

use super::modprobe::canonical_name;
use capstan_api::nmc::{ModuleConfig, NodeModulesConfig};
use capstan_api::text_memo::Memo;

/// A place in the config file, 1-based.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Position {
    /// Line number.
    pub line: u64,
    /// Column number, in characters.
    pub column: u64,
}

/// A field the schema does not declare.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownField {
    /// Dotted path of the field (`modprobe.modulName`).
    pub path: String,
    /// Where its key is, when known.
    pub position: Option<Position>,
    /// The fields declared where it was found, to pick the intended one from.
    pub known: Vec<String>,
}

/// Why the worker config was refused. Each message is one line and starts with the file,
/// then `:line:column` when known.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read the worker config {}: {source}", path.display())]
    Read {
        /// The config file.
        path: PathBuf,
        /// Why it could not be read.
        #[source]
        source: io::Error,
    },
    /// The text is not YAML, or not a ModuleConfig (a value of the wrong type, a
    /// required field missing).
    #[error("{}: {}{message}", located(origin, *position), field_prefix(field.as_deref()))]
    Yaml {
        /// The file (or annotation) the text came from.
        origin: String,
        /// The field the error is at, when known.
        field: Option<String>,
        /// Where the error is, when known.
        position: Option<Position>,
        /// What the YAML reader reported.
        message: String,
    },
    /// Fields the schema does not declare.
    #[error("{}", describe_unknown(origin, fields))]
    UnknownFields {
        /// The file (or annotation) the text came from.
        origin: String,
        /// Every undeclared field, in document order.
        fields: Vec<UnknownField>,
    },
    /// A ModuleConfig the worker cannot act on.
    #[error("{}: {field}: {reason}", located(origin, *position))]
    Invalid {
        /// The file (or annotation) the text came from.
        origin: String,
        /// Dotted path of the offending field.
        field: String,
        /// Where it is (or its closest parent), when known.
        position: Option<Position>,
        /// What is wrong and what would be right.
        reason: String,
    },
}

fn located(origin: &str, position: Option<Position>) -> String {
    match position {
        Some(Position { line, column }) => format!("{origin}:{line}:{column}"),
        None => origin.to_string(),
    }
}

fn field_prefix(field: Option<&str>) -> String {
    field.map(|f| format!("{f}: ")).unwrap_or_default()
}

fn describe_unknown(origin: &str, fields: &[UnknownField]) -> String {
    fields
        .iter()
        .map(|field| {
            format!(
                "{}: unknown field {} (known fields there: {})",
                located(origin, field.position),
                field.path,
                field.known.join(", ")
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Reads and checks the worker config at `path`. Fails when the file cannot be read or
/// [`parse`] fails.
pub fn read(path: &Path) -> Result<ModuleConfig, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    parse(&text, &path.display().to_string())
}

/// Configs parsed so far, by their text: the worker pods of one module on one kernel all
/// carry the same, and the controllers (and the embedded cluster's kubelet) read them often.
static PARSED: Memo<ModuleConfig> = Memo::new(4096);

/// [`parse`], remembering what it parsed by text (errors are not remembered, so each
/// names its own `origin`).
pub fn parse_cached(text: &str, origin: &str) -> Result<ModuleConfig, ConfigError> {
    PARSED.get_or_try(text, || parse(text, origin))
}

/// Parses and checks a worker config; `origin` names where `text` came from in errors.
///
/// Fails when `text` is not YAML, has a field the NodeModulesConfig schema does not
/// declare, does not decode as a [`ModuleConfig`], or breaks a modprobe rule (see the
/// module docs).
pub fn parse(text: &str, origin: &str) -> Result<ModuleConfig, ConfigError> {
    let tree: Spanned<Tree> =
        serde_saphyr::from_str(text).map_err(|err| yaml_error(origin, None, &err))?;
    let value: Value =
        serde_saphyr::from_str(text).map_err(|err| yaml_error(origin, Some(&tree), &err))?;
    check_fields(&value, &tree, origin)?;
    let config: ModuleConfig =
        serde_saphyr::from_str(text).map_err(|err| yaml_error(origin, Some(&tree), &err))?;
    if let Err((field, reason)) = check_modprobe(&config) {
        return Err(ConfigError::Invalid {
            origin: origin.to_string(),
            position: closest_position(&tree, &field),
            field,
            reason,
        });
    }
    Ok(config)
}

fn yaml_error(
    origin: &str,
    tree: Option<&Spanned<Tree>>,
    err: &serde_saphyr::Error,
) -> ConfigError {
    let position = err.location().map(position);
    let mut message = err.without_snippet().to_string();
    if let Some(Position { line, column }) = position {
        // The position goes in front, as for every other error.
        let suffix = format!(" at line {line}, column {column}");
        if let Some(stripped) = message.strip_suffix(&suffix) {
            message = stripped.to_string();
        }
    }
    let field = tree.zip(position).and_then(|(tree, at)| path_at(tree, at));
    ConfigError::Yaml {
        origin: origin.to_string(),
        field,
        position,
        message,
    }
}

/// The NodeModulesConfig CRD, generated once: the NMC controller parses the config of
/// every worker pod it looks at, and generating the schema costs far more than the parse.
static NMC_CRD: LazyLock<CustomResourceDefinition> = LazyLock::new(NodeModulesConfig::crd);

/// Reports the fields of `value` the NodeModulesConfig schema does not declare for a
/// module's `config`.
fn check_fields(value: &Value, tree: &Spanned<Tree>, origin: &str) -> Result<(), ConfigError> {
    let crd: &CustomResourceDefinition = &NMC_CRD;
    // The config is checked where it sits in an NMC, so the CRD's schema is the one oracle.
    let object = json!({
        "apiVersion": "kmm.sigs.x-k8s.io/v1beta1",
        "kind": "NodeModulesConfig",
        "spec": {"modules": [{"config": value}]},
    });
    const PREFIX: &str = "spec.modules[0].config.";
    let mut fields: Vec<UnknownField> = capstan_api::schema::unknown_fields(crd, &object)
        .into_iter()
        .filter_map(|path| path.strip_prefix(PREFIX).map(str::to_string))
        .map(|path| UnknownField {
            position: position_of(tree, &path, true),
            known: config_schema(crd)
                .map(|s| known_fields(s, &path))
                .unwrap_or_default(),
            path,
        })
        .collect::<Vec<_>>();
    if fields.is_empty() {
        return Ok(());
    }
    // In the order they are written, those without a place last.
    fields.sort_by_key(|field| field.position.map_or((u64::MAX, 0), |p| (p.line, p.column)));
    Err(ConfigError::UnknownFields {
        origin: origin.to_string(),
        fields,
    })
}

/// The schema of `spec.modules[].config` in the NodeModulesConfig CRD.
fn config_schema(crd: &CustomResourceDefinition) -> Option<&JSONSchemaProps> {
    let root = crd
        .spec
        .versions
        .first()?
        .schema
        .as_ref()?
        .open_api_v3_schema
        .as_ref()?;
    let modules = root
        .properties
        .as_ref()?
        .get("spec")?
        .properties
        .as_ref()?
        .get("modules")?;
    let Some(JSONSchemaPropsOrArray::Schema(item)) = &modules.items else {
        return None;
    };
    item.properties.as_ref()?.get("config")
}

/// The declared fields of the object an unknown field `path` was found in.
fn known_fields(mut schema: &JSONSchemaProps, path: &str) -> Vec<String> {
    let mut rest = path;
    loop {
        let properties = schema.properties.as_ref();
        let next = properties.and_then(|props| {
            props.iter().find_map(|(name, property)| {
                let after = rest.strip_prefix(name.as_str())?;
                after.starts_with(['.', '[']).then_some((property, after))
            })
        });
        let Some((property, after)) = next else {
            return properties
                .map(|p| p.keys().cloned().collect())
                .unwrap_or_default();
        };
        schema = property;
        rest = after.trim_start_matches('.');
        while let Some(index_end) = rest.strip_prefix('[').and_then(|r| r.find(']')) {
            let Some(JSONSchemaPropsOrArray::Schema(item)) = &schema.items else {
                return Vec::new();
            };
            schema = item;
            rest = rest[index_end + 2..].trim_start_matches('.');
        }
    }
}

/// The modprobe rules. Err is (field path, reason).
fn check_modprobe(config: &ModuleConfig) -> Result<(), (String, String)> {
    let modprobe = &config.modprobe;
    let invalid = |field: &str, reason: String| Err((format!("modprobe.{field}"), reason));
    match (&modprobe.raw_args, modprobe.module_name.is_empty()) {
        (Some(_), false) => {
            return invalid(
                "rawArgs",
                "must not be set when moduleName is set: rawArgs replace moduleName, args and parameters".to_string(),
            );
        }
        (None, true) => {
            return invalid(
                "moduleName",
                "must be set, or else rawArgs.load and rawArgs.unload".to_string(),
            );
        }
        (Some(raw), true) if raw.load.is_empty() || raw.unload.is_empty() => {
            let missing = if raw.load.is_empty() {
                "load"
            } else {
                "unload"
            };
            return invalid(
                &format!("rawArgs.{missing}"),
                "must be set when moduleName is unset: rawArgs need both load and unload"
                    .to_string(),
            );
        }
        _ => {}
    }
    let order = &modprobe.modules_loading_order;
    if order.is_empty() {
        return Ok(());
    }
    if modprobe.module_name.is_empty() {
        return invalid(
            "modulesLoadingOrder",
            "needs moduleName, which must be its first entry".to_string(),
        );
    }
    if order.len() < 2 {
        return invalid(
            "modulesLoadingOrder",
            format!(
                "has {} entry; a loading order needs at least two modules, moduleName first",
                order.len()
            ),
        );
    }
    if canonical_name(&order[0]) != canonical_name(&modprobe.module_name) {
        return invalid(
            "modulesLoadingOrder[0]",
            format!(
                "is {:?}; the first entry must be moduleName {:?}",
                order[0], modprobe.module_name
            ),
        );
    }
    for (index, module) in order.iter().enumerate() {
        if let Some(first) = order[..index]
            .iter()
            .position(|m| canonical_name(m) == canonical_name(module))
        {
            return invalid(
                &format!("modulesLoadingOrder[{index}]"),
                format!("{module:?} is already entry {first}; each module may appear once"),
            );
        }
    }
    Ok(())
}

/// The YAML document as nodes with positions, to point errors at lines and fields.
enum Tree {
    Map(Vec<(Spanned<String>, Spanned<Tree>)>),
    Seq(Vec<Spanned<Tree>>),
    Scalar,
}

impl<'de> Deserialize<'de> for Tree {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(TreeVisitor)
    }
}

struct TreeVisitor;

impl<'de> Visitor<'de> for TreeVisitor {
    type Value = Tree;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a YAML value")
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Tree, E> {
        Ok(Tree::Scalar)
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Tree, E> {
        Ok(Tree::Scalar)
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Tree, E> {
        Ok(Tree::Scalar)
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Tree, E> {
        Ok(Tree::Scalar)
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<Tree, E> {
        Ok(Tree::Scalar)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Tree, E> {
        Ok(Tree::Scalar)
    }

    fn visit_none<E: de::Error>(self) -> Result<Tree, E> {
        Ok(Tree::Scalar)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Tree, D::Error> {
        Tree::deserialize(deserializer)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Tree, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Tree::Seq(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Tree, A::Error> {
        let mut entries = Vec::new();
        while let Some(entry) = map.next_entry()? {
            entries.push(entry);
        }
        Ok(Tree::Map(entries))
    }
}

fn position(location: serde_saphyr::Location) -> Position {
    Position {
        line: location.line(),
        column: location.column(),
    }
}

/// Where the field at dotted `path` (`a.b[2].c`) is: its key when `at_key`, else its value.
fn position_of(tree: &Spanned<Tree>, path: &str, at_key: bool) -> Option<Position> {
    match &tree.value {
        Tree::Map(entries) => entries.iter().find_map(|(key, value)| {
            let after = path.strip_prefix(key.value.as_str())?;
            if after.is_empty() {
                Some(position(if at_key {
                    key.referenced
                } else {
                    value.referenced
                }))
            } else if let Some(rest) = after.strip_prefix('.') {
                position_of(value, rest, at_key)
            } else if after.starts_with('[') {
                position_of(value, after, at_key)
            } else {
                None
            }
        }),
        Tree::Seq(items) => {
            let (index, after) = path.strip_prefix('[')?.split_once(']')?;
            let item = items.get(index.parse::<usize>().ok()?)?;
            match after.strip_prefix('.') {
                Some(rest) => position_of(item, rest, at_key),
                None if after.is_empty() => Some(position(item.referenced)),
                None => position_of(item, after, at_key),
            }
        }
        Tree::Scalar => None,
    }
}

/// The position of `path`, or of its closest parent that the document has.
fn closest_position(tree: &Spanned<Tree>, path: &str) -> Option<Position> {
    let mut path = path;
    loop {
        if let Some(found) = position_of(tree, path, true) {
            return Some(found);
        }
        path = &path[..path.rfind(['.', '['])?];
    }
}

/// The dotted path of the field whose value is at `at`.
fn path_at(tree: &Spanned<Tree>, at: Position) -> Option<String> {
    fn walk(tree: &Spanned<Tree>, at: Position, prefix: &str) -> Option<String> {
        match &tree.value {
            Tree::Map(entries) => entries.iter().find_map(|(key, value)| {
                let path = if prefix.is_empty() {
                    key.value.clone()
                } else {
                    format!("{prefix}.{}", key.value)
                };
                // Values only: a missing field is reported at a key, but not about it.
                if position(value.referenced) == at {
                    return Some(path);
                }
                walk(value, at, &path)
            }),
            Tree::Seq(items) => items.iter().enumerate().find_map(|(index, item)| {
                let path = format!("{prefix}[{index}]");
                if position(item.referenced) == at {
                    return Some(path);
                }
                walk(item, at, &path)
            }),
            Tree::Scalar => None,
        }
    }
    walk(tree, at, "")
}

#[cfg(test)]
mod tests {
    use super::*;
    use capstan_api::module::{ModprobeArgs, ModprobeSpec};

    const ORIGIN: &str = "/etc/kmm-worker/config.yaml";

    const VALID: &str = "\
kernelVersion: 6.0.15-300.fc37.x86_64
containerImage: registry.example/org/my-kmod:v1-6.0.15
insecurePull: false
imagePullPolicy: Always
inTreeModulesToRemove: [ice]
modprobe:
  moduleName: my_kmod
  dirName: /opt
  parameters: [param=1]
  args: {load: [--first-time], unload: [--wait=100]}
  firmwarePath: /firmware
  modulesLoadingOrder: [my_kmod, dep_a]
";

    #[test]
    fn a_full_config_parses() {
        let config = parse(VALID, ORIGIN).unwrap();
        assert_eq!(
            config,
            ModuleConfig {
                kernel_version: "6.0.15-300.fc37.x86_64".to_string(),
                container_image: "registry.example/org/my-kmod:v1-6.0.15".to_string(),
                insecure_pull: false,
                image_pull_policy: "Always".to_string(),
                in_tree_modules_to_remove: vec!["ice".to_string()],
                in_tree_module_to_remove: String::new(),
                modprobe: ModprobeSpec {
                    module_name: "my_kmod".to_string(),
                    dir_name: "/opt".to_string(),
                    parameters: vec!["param=1".to_string()],
                    args: Some(ModprobeArgs {
                        load: vec!["--first-time".to_string()],
                        unload: vec!["--wait=100".to_string()],
                    }),
                    raw_args: None,
                    firmware_path: "/firmware".to_string(),
                    modules_loading_order: vec!["my_kmod".to_string(), "dep_a".to_string()],
                },
            }
        );
    }

    #[test]
    fn a_remembered_config_is_the_parsed_one_and_errors_name_their_own_origin() {
        assert_eq!(
            parse_cached(VALID, ORIGIN).unwrap(),
            parse(VALID, ORIGIN).unwrap()
        );
        assert_eq!(
            parse_cached(VALID, "elsewhere").unwrap(),
            parse(VALID, ORIGIN).unwrap()
        );
        let broken = "kernelVersion: [";
        for origin in ["pod a", "pod b"] {
            let err = parse_cached(broken, origin).unwrap_err().to_string();
            assert!(err.starts_with(origin), "{err}");
        }
    }

    #[test]
    fn what_the_controller_writes_reads_back() {
        let config = parse(VALID, ORIGIN).unwrap();
        let yaml = serde_saphyr::to_string(&config).unwrap();
        assert_eq!(parse(&yaml, ORIGIN).unwrap(), config);
    }

    #[test]
    fn unknown_fields_are_named_with_their_line_and_the_known_ones() {
        let text = "\
kernelVersion: '6.0'
containerImage: img
insecurePull: false
modprobe:
  modulName: my_kmod
  args: {load: [a], unlod: [b]}
extra: 1
";
        let err = parse(text, ORIGIN).unwrap_err();
        let ConfigError::UnknownFields { fields, .. } = &err else {
            panic!("{err}");
        };
        let found: Vec<(&str, Option<Position>)> = fields
            .iter()
            .map(|f| (f.path.as_str(), f.position))
            .collect();
        assert_eq!(
            found,
            [
                ("modprobe.modulName", Some(Position { line: 5, column: 3 })),
                (
                    "modprobe.args.unlod",
                    Some(Position {
                        line: 6,
                        column: 21
                    })
                ),
                ("extra", Some(Position { line: 7, column: 1 })),
            ]
        );
        assert!(
            fields[0].known.contains(&"moduleName".to_string()),
            "{:?}",
            fields[0]
        );
        assert!(
            fields[1].known.contains(&"unload".to_string()),
            "{:?}",
            fields[1]
        );
        let message = err.to_string();
        assert!(
            message.contains("/etc/kmm-worker/config.yaml:5:3: unknown field modprobe.modulName (known fields there: "),
            "{message}"
        );
        assert!(!message.contains('\n'), "{message}");
    }

    #[test]
    fn type_errors_name_the_field_and_position() {
        let head = "kernelVersion: '6.0'\ncontainerImage: img\n";
        let cases = [
            (
                "insecurePull: maybe\nmodprobe: {moduleName: m}\n",
                "/etc/kmm-worker/config.yaml:3:15: insecurePull: invalid boolean",
            ),
            (
                "insecurePull: false\nmodprobe: {moduleName: m, parameters: {a: 1}}\n",
                "/etc/kmm-worker/config.yaml:4:39: modprobe.parameters: expected sequence start",
            ),
        ];
        for (tail, want) in cases {
            let err = parse(&format!("{head}{tail}"), ORIGIN).unwrap_err();
            assert_eq!(err.to_string(), want);
        }
    }

    #[test]
    fn a_missing_required_field_and_broken_yaml_are_yaml_errors() {
        let cases = [
            (
                "kernelVersion: '6.0'\ncontainerImage: img\nmodprobe: {moduleName: m}\n",
                "/etc/kmm-worker/config.yaml:3:1: missing field `insecurePull`",
            ),
            (
                "kernelVersion: [6.0\n",
                "/etc/kmm-worker/config.yaml:1:16: unclosed bracket '['",
            ),
            (
                "",
                "/etc/kmm-worker/config.yaml:1:1: unexpected end of input",
            ),
            (
                "- a\n",
                "/etc/kmm-worker/config.yaml:1:1: expected mapping start",
            ),
        ];
        for (text, want) in cases {
            let err = parse(text, ORIGIN).unwrap_err();
            assert!(matches!(err, ConfigError::Yaml { .. }), "{text:?}: {err}");
            assert_eq!(err.to_string(), want, "{text:?}");
        }
    }

    #[test]
    fn modprobe_rules() {
        let base = "kernelVersion: '6.0'\ncontainerImage: img\ninsecurePull: false\nmodprobe:\n";
        // (modprobe body, error field or None when valid, error position line)
        let cases: [(&str, Option<&str>, Option<u64>); 12] = [
            ("  moduleName: m\n", None, None),
            ("  rawArgs: {load: [-v, m], unload: [-r, m]}\n", None, None),
            (
                "  moduleName: m\n  rawArgs: {load: [a], unload: [b]}\n",
                Some("modprobe.rawArgs"),
                Some(6),
            ),
            (
                "  moduleName: m\n  rawArgs: {}\n",
                Some("modprobe.rawArgs"),
                Some(6),
            ),
            ("  dirName: /opt\n", Some("modprobe.moduleName"), Some(4)),
            (
                "  rawArgs: {load: [a]}\n",
                Some("modprobe.rawArgs.unload"),
                Some(5),
            ),
            (
                "  rawArgs: {unload: [a]}\n",
                Some("modprobe.rawArgs.load"),
                Some(5),
            ),
            (
                "  moduleName: a\n  modulesLoadingOrder: [a, b, c]\n",
                None,
                None,
            ),
            (
                "  moduleName: a\n  modulesLoadingOrder: [a]\n",
                Some("modprobe.modulesLoadingOrder"),
                Some(6),
            ),
            (
                "  moduleName: a\n  modulesLoadingOrder: [b, a]\n",
                Some("modprobe.modulesLoadingOrder[0]"),
                Some(6),
            ),
            (
                "  moduleName: a\n  modulesLoadingOrder:\n    - a\n    - b\n    - a\n",
                Some("modprobe.modulesLoadingOrder[2]"),
                Some(9),
            ),
            (
                "  rawArgs: {load: [a], unload: [b]}\n  modulesLoadingOrder: [a, b]\n",
                Some("modprobe.modulesLoadingOrder"),
                Some(6),
            ),
        ];
        for (body, field, line) in cases {
            let text = format!("{base}{body}");
            match (parse(&text, ORIGIN), field) {
                (Ok(_), None) => {}
                (
                    Err(ConfigError::Invalid {
                        field: got,
                        position,
                        ..
                    }),
                    Some(want),
                ) => {
                    assert_eq!(got, want, "{body}");
                    assert_eq!(position.map(|p| p.line), line, "{body}");
                }
                (result, want) => panic!("{body}: wanted {want:?}, got {result:?}"),
            }
        }
    }

    #[test]
    fn invalid_configs_say_what_is_wrong_on_one_line() {
        let text = "kernelVersion: '6.0'\ncontainerImage: img\ninsecurePull: false\nmodprobe:\n  moduleName: a\n  modulesLoadingOrder: [b, a]\n";
        let message = parse(text, ORIGIN).unwrap_err().to_string();
        assert_eq!(
            message,
            "/etc/kmm-worker/config.yaml:6:25: modprobe.modulesLoadingOrder[0]: is \"b\"; the first entry must be moduleName \"a\""
        );
    }

    #[test]
    fn read_names_a_missing_file() {
        let dir = tempfile::TempDir::new().unwrap();
        let path = dir.path().join("config.yaml");
        let err = read(&path).unwrap_err();
        assert!(matches!(err, ConfigError::Read { .. }));
        assert!(err.to_string().contains("config.yaml"), "{err}");
        std::fs::write(&path, VALID).unwrap();
        assert_eq!(read(&path).unwrap().modprobe.module_name, "my_kmod");
    }
}
