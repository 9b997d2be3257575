//! The rules one commit's documents must follow: the header every object needs, kinds that
//! are objects the cluster serves, scopes and namespaces, names, labels and annotations,
//! strict checks of the kinds capstan understands (Module, UpgradeConfig, LeaderWorkerSet,
//! Node version labels), duplicates, and version labels that must name a declared Module.
//!
//! The fields of other kinds, built-in ones included, are taken as written: which fields a
//! kind has depends on the cluster's version, so its API server judges them when a live plan
//! or a sync dry-runs the commit (with strict field validation).

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, BTreeSet, HashMap};

use k8s_openapi::api::core::v1::Toleration;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps,
};
use kube::Resource;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use super::catalog::{Catalog, Scope, capstan_crds, scope_of};
use super::yaml::{FieldPath, Node, NodeValue};
use super::{Manifest, ManifestError, ObjectId, closest_name, schema};
use capstan_api::labels::{KMM_PREFIX, ModuleKey, ModuleLabel, validate_label_value};
use capstan_api::lws::{SubGroupPolicy, SubGroupPolicyType};
use capstan_api::module::{KernelMapping, ModprobeSpec, ModuleLoaderContainerSpec, Sign};
use capstan_api::names::{
    dns1123_label_errors, dns1123_subdomain_errors, label_key, label_value_errors,
    qualified_name_errors,
};
use capstan_api::{LeaderWorkerSet, Module, UpgradeConfig};
use capstan_worker::modprobe::canonical_name;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::controllers::kernel_mapping;
use crate::controllers::lws::labels::SUBGROUP_EXCLUSIVE_KEY_ANNOTATION;

/// A document with a valid header, and the tree it came from (for lines).
pub struct Parsed {
    /// The object and where it is.
    pub manifest: Manifest,
    /// The YAML it was read from.
    pub tree: Node,
}

/// A problem at a field of one document.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    /// The field.
    pub path: FieldPath,
    /// What is wrong with it.
    pub message: String,
}

fn finding(path: FieldPath, message: impl Into<String>) -> Finding {
    Finding {
        path,
        message: message.into(),
    }
}

impl Parsed {
    /// The error for `message` at `path` of this document, on the line of that field.
    pub fn error(&self, path: &FieldPath, message: impl Into<String>) -> ManifestError {
        located(&self.manifest.file, &self.tree, path, message)
    }
}

fn located(file: &str, tree: &Node, path: &FieldPath, message: impl Into<String>) -> ManifestError {
    let field = (*path != FieldPath::root()).then(|| path.to_string());
    let line = tree.line_of(path).or((tree.line > 0).then_some(tree.line));
    ManifestError::new(file, line, field, message)
}

/// Reads the header of a document: it must be a mapping with string `apiVersion`, `kind`
/// and `metadata.name`. Fails naming the first missing or mistyped of them.
pub fn header(file: &str, tree: Node) -> Result<Parsed, ManifestError> {
    let fail = |path: &[&str], message: &str| located(file, &tree, &FieldPath::of(path), message);
    let NodeValue::Mapping(_) = &tree.value else {
        return Err(fail(
            &[],
            "a manifest must be a mapping with apiVersion, kind and metadata",
        ));
    };
    let object = tree.to_json();
    let text = |path: &[&str]| -> Result<String, ManifestError> {
        let pointer = format!("/{}", path.join("/"));
        match object.pointer(&pointer) {
            None | Some(Value::Null) => Err(fail(path, "required field is missing")),
            Some(Value::String(text)) if text.is_empty() => {
                Err(fail(path, "required field is empty"))
            }
            Some(Value::String(text)) => Ok(text.clone()),
            Some(_) => Err(fail(path, "must be a string")),
        }
    };
    let api_version = text(&["apiVersion"])?;
    let kind = text(&["kind"])?;
    match object.get("metadata") {
        None | Some(Value::Null) => {
            return Err(fail(&["metadata", "name"], "required field is missing"));
        }
        Some(Value::Object(_)) => {}
        Some(_) => return Err(fail(&["metadata"], "must be a mapping")),
    }
    if object.pointer("/metadata/name").is_none()
        && object.pointer("/metadata/generateName").is_some()
    {
        return Err(fail(
            &["metadata", "name"],
            "required field is missing (generateName cannot be used: an object from Git needs a \
             stable name to be updated and pruned)",
        ));
    }
    let name = text(&["metadata", "name"])?;
    let namespace = match object.pointer("/metadata/namespace") {
        None | Some(Value::Null) => None,
        Some(Value::String(namespace)) if namespace.is_empty() => None,
        Some(Value::String(namespace)) => Some(namespace.clone()),
        Some(_) => return Err(fail(&["metadata", "namespace"], "must be a string")),
    };
    Ok(Parsed {
        manifest: Manifest {
            file: file.to_string(),
            line: tree.line,
            api_version,
            kind,
            namespace,
            name,
            object,
        },
        tree,
    })
}

/// Checks one document against the catalog and the per-kind rules, filling in
/// `default_namespace` for a namespaced kind without a namespace.
pub fn check(
    parsed: &mut Parsed,
    catalog: &dyn Catalog,
    default_namespace: &str,
) -> Vec<ManifestError> {
    let mut found = Vec::new();
    let manifest = &mut parsed.manifest;
    match scope_of(catalog, &manifest.api_version, &manifest.kind) {
        Err(reason) => found.push(finding(FieldPath::of(&["kind"]), reason)),
        Ok(Scope::Namespaced) if manifest.namespace.is_none() => {
            manifest.namespace = Some(default_namespace.to_string());
            if let Some(metadata) = manifest
                .object
                .get_mut("metadata")
                .and_then(Value::as_object_mut)
            {
                metadata.insert(
                    "namespace".to_string(),
                    Value::String(default_namespace.to_string()),
                );
            }
        }
        Ok(Scope::Cluster) if manifest.namespace.is_some() => found.push(finding(
            FieldPath::of(&["metadata", "namespace"]),
            format!(
                "{} is cluster-scoped: remove metadata.namespace",
                manifest.kind
            ),
        )),
        Ok(_) => {}
    }
    if manifest.api_version.split_once('/').map(|(group, _)| group) == Some("capstan.dev") {
        found.push(finding(
            FieldPath::of(&["kind"]),
            format!(
                "{} is one of capstan's own kinds, which a repository does not declare: a \
                 GitSync is the cluster admin's (its reach bounds the repository), history is \
                 capstan's",
                manifest.kind
            ),
        ));
    }
    found.extend(metadata(&manifest.object));
    found.extend(kind_rules(manifest, &parsed.tree));
    found
        .into_iter()
        .map(|f| parsed.error(&f.path, f.message))
        .collect()
}

/// The rules of the kinds capstan understands; other kinds are taken as they are.
fn kind_rules(manifest: &Manifest, tree: &Node) -> Vec<Finding> {
    let is = |api_version: &str, kind: &str| {
        manifest.api_version == api_version && manifest.kind == kind
    };
    if is_node(manifest) {
        node(&manifest.object)
    } else if is("v1", "Secret") {
        secret(&manifest.object)
    } else if is(&Module::api_version(&()), &Module::kind(&())) {
        match typed::<Module>(manifest, tree) {
            Ok(module) => self::module(&module, &manifest.object),
            Err(found) => found,
        }
    } else if is(&UpgradeConfig::api_version(&()), &UpgradeConfig::kind(&())) {
        typed::<UpgradeConfig>(manifest, tree)
            .err()
            .unwrap_or_default()
    } else if is(
        &LeaderWorkerSet::api_version(&()),
        &LeaderWorkerSet::kind(&()),
    ) {
        match typed::<LeaderWorkerSet>(manifest, tree) {
            Ok(lws) => leader_worker_set(&lws),
            Err(found) => found,
        }
    } else {
        Vec::new()
    }
}

/// Decodes a manifest of one of capstan's kinds after checking it strictly against the
/// kind's CRD: unknown fields (with a "did you mean"), then types and required fields.
fn typed<K>(manifest: &Manifest, tree: &Node) -> Result<K, Vec<Finding>>
where
    K: Resource<DynamicType = ()> + DeserializeOwned,
{
    let crd = capstan_crds()
        .iter()
        .find(|crd| crd.spec.group == K::group(&()) && crd.spec.names.kind == K::kind(&()));
    let schema = crd.and_then(|crd| schema::version_schema(crd, &manifest.api_version));
    let (Some(crd), Some(schema)) = (crd, schema) else {
        return decode(manifest);
    };
    let found = strict_fields(crd, schema, manifest, tree);
    if found.is_empty() {
        decode(manifest)
    } else {
        Err(found)
    }
}

fn strict_fields(
    crd: &CustomResourceDefinition,
    root: &JSONSchemaProps,
    manifest: &Manifest,
    tree: &Node,
) -> Vec<Finding> {
    let mut found: Vec<Finding> = capstan_api::schema::unknown_fields(crd, &manifest.object)
        .into_iter()
        .map(|dotted| {
            let path = tree.resolve(&dotted);
            let hint = path.split_last_field().and_then(|(parent, name)| {
                closest_name(name, schema::declared_fields(root, &parent))
            });
            match hint {
                Some(meant) => finding(path, format!("unknown field; did you mean {meant}?")),
                None => finding(path, "unknown field"),
            }
        })
        .collect();
    found.extend(
        schema::violations(root, &manifest.object)
            .into_iter()
            .map(|violation| finding(violation.path, violation.message)),
    );
    found
}

fn decode<K: DeserializeOwned>(manifest: &Manifest) -> Result<K, Vec<Finding>> {
    serde_json::from_value(manifest.object.clone()).map_err(|err| {
        vec![finding(
            FieldPath::root(),
            format!("does not decode as a {}: {err}", manifest.kind),
        )]
    })
}

/// Names, namespaces, labels and annotations, as the API server checks them.
fn metadata(object: &Value) -> Vec<Finding> {
    let mut found = Vec::new();
    let name = object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if let Err(reason) = object_name(name) {
        found.push(finding(FieldPath::of(&["metadata", "name"]), reason));
    } else if let Some(errors) = kind_name_errors(object, name) {
        found.push(finding(
            FieldPath::of(&["metadata", "name"]),
            format!("Invalid value: {name:?}: {}", errors.join("; ")),
        ));
    }
    if let Some(namespace) = object
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        && !namespace.is_empty()
        && let Err(reason) = dns_label(namespace)
    {
        found.push(finding(
            FieldPath::of(&["metadata", "namespace"]),
            format!("{namespace:?} is not a valid namespace: {reason}"),
        ));
    }
    for (field, values_are_labels) in [("labels", true), ("annotations", false)] {
        let path = FieldPath::of(&["metadata", field]);
        let entries = match object.pointer(&format!("/metadata/{field}")) {
            None | Some(Value::Null) => continue,
            Some(Value::Object(entries)) => entries,
            Some(_) => {
                found.push(finding(path, "must be a mapping of strings to strings"));
                continue;
            }
        };
        found.extend(key_values(&path, entries, values_are_labels));
    }
    found
}

fn key_values(
    path: &FieldPath,
    entries: &Map<String, Value>,
    values_are_labels: bool,
) -> Vec<Finding> {
    let mut found = Vec::new();
    for (key, value) in entries {
        let at = path.field(key);
        if let Err(reason) = label_key(key) {
            found.push(finding(at.clone(), format!("invalid key: {reason}")));
        }
        match value {
            Value::String(text) if values_are_labels => {
                if let Err(err) = validate_label_value(text) {
                    found.push(finding(at, err.to_string()));
                }
            }
            Value::String(_) => {}
            Value::Null => found.push(finding(
                at,
                "must be a string; write \"\" for an empty value",
            )),
            // YAML reads `1` or `true` as a number or boolean; Kubernetes wants text.
            other => found.push(finding(
                at,
                format!("must be a string; quote it: \"{other}\""),
            )),
        }
    }
    found
}

/// What a built-in kind's names must be, as the API server's validation of the kind has it
/// (Kubernetes 1.36): a DNS-1123 label for Namespaces, StatefulSets (their pods' hostnames
/// add a suffix) and Services (`RelaxedServiceNameValidation`, on by default since 1.36),
/// a path segment only for RBAC's kinds, a DNS-1123 subdomain for the others. `None`: the
/// kind is not a built-in one (its CRD's server decides), or the name passes.
fn kind_name_errors(object: &Value, name: &str) -> Option<Vec<String>> {
    let api_version = object.get("apiVersion").and_then(Value::as_str)?;
    let kind = object.get("kind").and_then(Value::as_str)?;
    let group = api_version.rsplit_once('/').map_or("", |(group, _)| group);
    let errors = match (group, kind) {
        ("", "Namespace" | "Service") | ("apps", "StatefulSet") => dns1123_label_errors(name),
        ("rbac.authorization.k8s.io", _) => return None,
        (
            "",
            "ConfigMap"
            | "Secret"
            | "ServiceAccount"
            | "Pod"
            | "Node"
            | "PersistentVolume"
            | "PersistentVolumeClaim"
            | "Endpoints"
            | "LimitRange"
            | "ResourceQuota"
            | "ReplicationController",
        )
        | ("apps", "Deployment" | "DaemonSet" | "ReplicaSet" | "ControllerRevision")
        | ("batch", "Job" | "CronJob")
        | ("networking.k8s.io", "Ingress" | "IngressClass" | "NetworkPolicy")
        | ("policy", "PodDisruptionBudget")
        | ("scheduling.k8s.io", "PriorityClass")
        | ("storage.k8s.io", "StorageClass") => dns1123_subdomain_errors(name),
        _ => return None,
    };
    (!errors.is_empty()).then_some(errors)
}

/// A name Kubernetes accepts in a URL path segment (the rule every kind shares).
fn object_name(name: &str) -> Result<(), String> {
    if name == "." || name == ".." {
        return Err(format!("{name:?} cannot be a name"));
    }
    if let Some(bad) = name.chars().find(|c| matches!(c, '/' | '%')) {
        return Err(format!("{name:?} may not contain {bad:?}"));
    }
    if name.len() > 253 {
        return Err(format!(
            "has {} characters, over the limit of 253",
            name.len()
        ));
    }
    Ok(())
}

/// RFC 1123 label, the shape of namespace names.
pub fn dns_label(name: &str) -> Result<(), String> {
    if name.len() > 63 {
        return Err(format!(
            "it has {} characters, over the limit of 63",
            name.len()
        ));
    }
    let allowed = name
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if !allowed || name.starts_with('-') || name.ends_with('-') {
        return Err(
            "use lowercase letters, digits and '-', starting and ending with a letter or digit"
                .to_string(),
        );
    }
    Ok(())
}

/// A Secret's `data` and `stringData` as the API server decodes them: maps of strings, each
/// key a config key, `data`'s values base64 (Go's decoder: padded, newlines skipped). The
/// findings never quote a value.
fn secret(object: &Value) -> Vec<Finding> {
    use base64::Engine as _;
    let base64 = base64::engine::GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        base64::engine::GeneralPurposeConfig::new().with_decode_allow_trailing_bits(true),
    );
    let mut found = Vec::new();
    for section in ["data", "stringData"] {
        let Some(values) = object.get(section) else {
            continue;
        };
        let Some(values) = values.as_object() else {
            if !values.is_null() {
                found.push(finding(
                    FieldPath::of(&[section]),
                    "must be a map of keys to values",
                ));
            }
            continue;
        };
        for (key, value) in values {
            let path = FieldPath::of(&[section, key.as_str()]);
            let config_key = !key.is_empty()
                && key.len() <= 253
                && key
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
                && key != "."
                && key != "..";
            if !config_key {
                found.push(finding(
                    path.clone(),
                    "a key must consist of alphanumeric characters, '-', '_' or '.'",
                ));
            }
            match value {
                Value::Null => {}
                Value::String(text) if section == "data" => {
                    let text: String = text.chars().filter(|c| !matches!(c, '\r' | '\n')).collect();
                    if base64.decode(text).is_err() {
                        found.push(finding(
                            path,
                            "not valid base64 (a Secret's data is base64-encoded; put plain text \
                             under stringData)",
                        ));
                    }
                }
                Value::String(_) => {}
                _ => found.push(finding(path, "must be a string")),
            }
        }
    }
    found
}

/// A Node manifest only declares labels and annotations: capstan applies what the file
/// sets and nothing else of the Node is Git's to own.
fn node(object: &Value) -> Vec<Finding> {
    const ONLY: &str = "a Node manifest may only set labels and annotations";
    let mut found = Vec::new();
    for key in object.as_object().into_iter().flat_map(Map::keys) {
        if !matches!(key.as_str(), "apiVersion" | "kind" | "metadata") {
            found.push(finding(FieldPath::of(&[key]), ONLY));
        }
    }
    let metadata = object.get("metadata").and_then(Value::as_object);
    for key in metadata.into_iter().flat_map(Map::keys) {
        // A namespace is reported by the scope check.
        if !matches!(
            key.as_str(),
            "name" | "labels" | "annotations" | "namespace"
        ) {
            found.push(finding(FieldPath::of(&["metadata", key]), ONLY));
        }
    }
    found
}

/// KMM's rules for a Module (upstream's webhook, `validateModule`): names short enough for
/// the per-module labels, tolerations the API server would take on a pod, a version that can
/// be a label value, kmod images with a tag or digest, one form of in-tree module removal,
/// a valid modprobe setup, kernel mappings that say what they match and name an image, and
/// files to sign under the module directory. `object` is the manifest as written, which
/// tells an absent list from an empty one.
fn module(module: &Module, object: &Value) -> Vec<Finding> {
    let mut found = Vec::new();
    let namespace = module.metadata.namespace.as_deref().unwrap_or_default();
    let name = module.metadata.name.as_deref().unwrap_or_default();
    if let Err(err) = ModuleKey::new(namespace, name) {
        found.push(finding(
            FieldPath::of(&["metadata", "name"]),
            err.to_string(),
        ));
    }
    found.extend(super::dra::module_rules(module));
    let tolerations = FieldPath::of(&["spec", "tolerations"]);
    for (index, toleration) in module.spec.tolerations.iter().enumerate() {
        let at = tolerations.index(index);
        found.extend(
            toleration_problems(toleration)
                .into_iter()
                .map(|(field, message)| finding(at.field(field), message)),
        );
    }
    let Some(loader) = &module.spec.module_loader else {
        return found;
    };
    let container = FieldPath::of(&["spec", "moduleLoader", "container"]);
    let version = &loader.container.version;
    if let Err(err) = validate_label_value(version) {
        found.push(finding(
            container.field("version"),
            format!("must be usable as a label value: {err}"),
        ));
    }
    let spec = &loader.container;
    // Upstream tells a list that is present, even empty, from an absent one.
    let container_list = object
        .pointer("/spec/moduleLoader/container/inTreeModulesToRemove")
        .is_some_and(|list| !list.is_null());
    if container_list && !spec.in_tree_module_to_remove.is_empty() {
        found.push(finding(
            container.field("inTreeModuleToRemove"),
            "cannot be set with inTreeModulesToRemove: list the module there \
             (inTreeModuleToRemove is deprecated)",
        ));
    }
    if let Some(message) = image_problem(&spec.container_image) {
        found.push(finding(container.field("containerImage"), message));
    }
    let mappings = container.field("kernelMappings");
    for (index, mapping) in spec.kernel_mappings.iter().enumerate() {
        let at = mappings.index(index);
        found.extend(
            kernel_mapping_problems(mapping, spec, container_list)
                .into_iter()
                .map(|(field, message)| finding(at.field(field), message)),
        );
    }
    let modprobe = container.field("modprobe");
    found.extend(
        modprobe_problems(&spec.modprobe)
            .into_iter()
            .map(|(field, message)| finding(modprobe.field(field), message)),
    );
    let signs = std::iter::once((container.clone(), &spec.sign)).chain(
        spec.kernel_mappings
            .iter()
            .enumerate()
            .map(|(index, mapping)| (mappings.index(index), &mapping.sign)),
    );
    for (at, sign) in signs {
        let Some(sign) = sign else { continue };
        let files = at.field("sign").field("filesToSign");
        found.extend(
            files_to_sign_problems(sign, &spec.modprobe.dir_name)
                .into_iter()
                .map(|(index, message)| {
                    let path = index.map_or_else(|| files.clone(), |index| files.index(index));
                    finding(path, message)
                }),
        );
    }
    found
}

/// What is wrong with a toleration, as (field, message), as upstream's
/// `validateTolerations` checks it: a key that is a qualified name, `Exists` for an empty key,
/// `tolerationSeconds` only with `NoExecute`, a label value for `Equal` and none for `Exists`,
/// and a known effect.
fn toleration_problems(toleration: &Toleration) -> Vec<(&'static str, String)> {
    let mut problems = Vec::new();
    let key = toleration.key.as_deref().unwrap_or_default();
    let operator = toleration.operator.as_deref().unwrap_or_default();
    let value = toleration.value.as_deref().unwrap_or_default();
    let effect = toleration.effect.as_deref().unwrap_or_default();
    if !key.is_empty() {
        let errors = qualified_name_errors(key);
        if !errors.is_empty() {
            problems.push(("key", format!("invalid key {key:?}: {}", errors.join("; "))));
        }
    } else if operator != "Exists" {
        problems.push((
            "operator",
            "must be Exists when key is empty (a toleration of every taint)".to_string(),
        ));
    }
    if toleration.toleration_seconds.is_some() && effect != "NoExecute" {
        problems.push((
            "tolerationSeconds",
            "can only be set with effect NoExecute".to_string(),
        ));
    }
    match operator {
        "Equal" | "" => {
            let errors = label_value_errors(value);
            if !errors.is_empty() {
                problems.push((
                    "value",
                    format!(
                        "invalid value {value:?} for operator Equal: {}",
                        errors.join("; ")
                    ),
                ));
            }
        }
        "Exists" if !value.is_empty() => {
            problems.push(("value", "must be empty when operator is Exists".to_string()))
        }
        "Exists" => {}
        other => problems.push((
            "operator",
            format!("{other:?} is not an operator: use Equal or Exists"),
        )),
    }
    if !matches!(effect, "" | "NoSchedule" | "PreferNoSchedule" | "NoExecute") {
        problems.push((
            "effect",
            format!("{effect:?} is not an effect: use NoSchedule, PreferNoSchedule or NoExecute"),
        ));
    }
    problems
}

/// Why a kmod image cannot be pulled as written: upstream insists on an explicit tag or
/// digest (a `:` or `@` anywhere), so that a node never loads whatever `latest` is today.
/// An empty image is no problem here.
fn image_problem(image: &str) -> Option<String> {
    (!image.is_empty() && !image.contains([':', '@'])).then(|| {
        format!(
            "{image:?} names no tag or digest: add one, such as {image}:v1 or {image}@sha256:..."
        )
    })
}

/// What is wrong with files to sign, as (index in `filesToSign`, message): there must be
/// some, each under the module directory `dir_name`.
fn files_to_sign_problems(sign: &Sign, dir_name: &str) -> Vec<(Option<usize>, String)> {
    if sign.files_to_sign.is_empty() {
        return vec![(None, "required when sign is set".to_string())];
    }
    let under = format!("{dir_name}/");
    sign.files_to_sign
        .iter()
        .enumerate()
        .filter(|(_, file)| !file.starts_with(&under))
        .map(|(index, file)| {
            (
                Some(index),
                format!("{file:?} must be under modprobe.dirName {dir_name:?}"),
            )
        })
        .collect()
}

/// What is wrong with a modprobe setup, as (field, message): either `moduleName` without
/// `rawArgs`, or `rawArgs.load` and `rawArgs.unload` both; a loading order starts with
/// `moduleName`, has at least two modules and no repeats.
fn modprobe_problems(modprobe: &ModprobeSpec) -> Vec<(&'static str, String)> {
    let mut problems = Vec::new();
    let named = !modprobe.module_name.is_empty();
    let raw = modprobe.raw_args.as_ref();
    let raw_load = raw.is_some_and(|raw| !raw.load.is_empty());
    let raw_unload = raw.is_some_and(|raw| !raw.unload.is_empty());
    match (named, raw.is_some()) {
        (true, true) => problems.push((
            "rawArgs",
            "must not be set with moduleName: rawArgs replace moduleName, args and parameters"
                .to_string(),
        )),
        (false, false) => problems.push((
            "moduleName",
            "must be set, or else rawArgs.load and rawArgs.unload".to_string(),
        )),
        (false, true) if !raw_load => problems.push((
            "rawArgs.load",
            "must be set when moduleName is not: rawArgs need both load and unload".to_string(),
        )),
        (false, true) if !raw_unload => problems.push((
            "rawArgs.unload",
            "must be set when moduleName is not: rawArgs need both load and unload".to_string(),
        )),
        _ => {}
    }
    let order = &modprobe.modules_loading_order;
    if order.is_empty() {
        return problems;
    }
    if !named {
        problems.push((
            "modulesLoadingOrder",
            "needs moduleName, which must be its first entry".to_string(),
        ));
    } else if order.len() < 2 {
        problems.push((
            "modulesLoadingOrder",
            "needs at least two modules, moduleName first".to_string(),
        ));
    } else if canonical_name(&order[0]) != canonical_name(&modprobe.module_name) {
        problems.push((
            "modulesLoadingOrder",
            format!(
                "starts with {:?}; the first entry must be moduleName {:?}",
                order[0], modprobe.module_name
            ),
        ));
    }
    let mut seen = BTreeSet::new();
    for module in order {
        if !seen.insert(canonical_name(module)) {
            problems.push((
                "modulesLoadingOrder",
                format!("lists {module:?} more than once"),
            ));
        }
    }
    problems
}

/// What is wrong with a kernel mapping of `container`, as (field, message): it matches by
/// `literal` or by a `regexp` that compiles, exactly one of them; it or the container names
/// an image, with a tag or digest; and it removes in-tree modules in the form the container
/// uses (`container_list`: the container's `inTreeModulesToRemove` is present).
fn kernel_mapping_problems(
    mapping: &KernelMapping,
    container: &ModuleLoaderContainerSpec,
    container_list: bool,
) -> Vec<(&'static str, String)> {
    let mut problems = Vec::new();
    match (mapping.literal.is_empty(), mapping.regexp.is_empty()) {
        (true, true) => problems.push((
            "literal",
            "set literal or regexp: a kernel mapping must say which kernels it matches".to_string(),
        )),
        (false, false) => problems.push((
            "regexp",
            "literal and regexp cannot both be set in one kernel mapping".to_string(),
        )),
        _ => {}
    }
    if let Some(reason) = kernel_mapping::regexp_problem(&mapping.regexp) {
        problems.push((
            "regexp",
            format!(
                "{:?} is not a valid regular expression: {reason}",
                mapping.regexp
            ),
        ));
    }
    if mapping.container_image.is_empty() {
        if container.container_image.is_empty() {
            problems.push((
                "containerImage",
                "required: neither this mapping nor spec.moduleLoader.container.containerImage \
                 names the kmod image"
                    .to_string(),
            ));
        }
    } else if let Some(message) = image_problem(&mapping.container_image) {
        problems.push(("containerImage", message));
    }
    let list = mapping.in_tree_modules_to_remove.is_some();
    let single = !mapping.in_tree_module_to_remove.is_empty();
    if list && single {
        problems.push((
            "inTreeModuleToRemove",
            "cannot be set with inTreeModulesToRemove: list the module there \
             (inTreeModuleToRemove is deprecated)"
                .to_string(),
        ));
    }
    if list && !container.in_tree_module_to_remove.is_empty() {
        problems.push((
            "inTreeModulesToRemove",
            "cannot be set while the container sets the deprecated inTreeModuleToRemove: use \
             inTreeModulesToRemove in both"
                .to_string(),
        ));
    }
    if single && container_list {
        problems.push((
            "inTreeModuleToRemove",
            "cannot be set while the container sets inTreeModulesToRemove: use \
             inTreeModulesToRemove in both"
                .to_string(),
        ));
    }
    problems
}

/// Upstream's validating webhook for a LeaderWorkerSet (`generalValidate`, which it runs on
/// create and on update), on the object with the defaults the webhook sees filled in:
/// a name that can name the headless Service, group counts and sizes in range, a rolling
/// update that can make progress, subgroups that divide the group, and the subgroup
/// exclusive topology only with subgroups. The rules that compare with the live object
/// (`ValidateUpdate`: subgroups cannot be turned on, off or resized) need the cluster.
fn leader_worker_set(lws: &LeaderWorkerSet) -> Vec<Finding> {
    let spec = &lws.spec;
    let template = &spec.leader_worker_template;
    let mut found = Vec::new();
    let name = lws.metadata.name.as_deref().unwrap_or_default();
    for reason in dns1035_label_errors(name) {
        found.push(finding(
            FieldPath::of(&["metadata", "name"]),
            format!("{name:?} cannot name a LeaderWorkerSet, which names its Service: {reason}"),
        ));
    }

    // `replicas` 0 to 1000000 is the CRD's bound (v0.10.0), checked with the schema.
    if template.size < 1 {
        found.push(finding(
            FieldPath::of(&["spec", "leaderWorkerTemplate", "size"]),
            not_allowed(template.size, "size must be equal or greater than 1"),
        ));
    }
    if i64::from(spec.replicas) * i64::from(template.size) > i64::from(i32::MAX) {
        found.push(finding(
            FieldPath::of(&["spec", "replicas"]),
            not_allowed(
                format!("{} groups of {} pods", spec.replicas, template.size),
                format!(
                    "the product of replicas and worker replicas must not exceed {}",
                    i32::MAX
                ),
            ),
        ));
    }

    let rolling = &spec.rollout_strategy.rolling_update_configuration;
    let rolling_path = FieldPath::of(&["spec", "rolloutStrategy", "rollingUpdateConfiguration"]);
    for (field, value) in [
        ("maxUnavailable", &rolling.max_unavailable),
        ("maxSurge", &rolling.max_surge),
    ] {
        if let Some(reason) = rolling_amount_problem(value) {
            found.push(finding(
                rolling_path.field(field),
                not_allowed(shown(value), reason),
            ));
        }
    }
    if rolling.partition < 0 {
        found.push(finding(
            rolling_path.field("partition"),
            not_allowed(rolling.partition, "must be greater than or equal to 0"),
        ));
    }
    let unavailable = scaled(&rolling.max_unavailable, spec.replicas, false);
    let surge = scaled(&rolling.max_surge, spec.replicas, true);
    if unavailable == Some(0) && surge == Some(0) && spec.replicas != 0 {
        let rounding = match &rolling.max_unavailable {
            IntOrString::String(_) => format!(" ({} groups round it down to 0)", spec.replicas),
            IntOrString::Int(_) => String::new(),
        };
        found.push(finding(
            rolling_path.field("maxUnavailable"),
            not_allowed(
                shown(&rolling.max_unavailable),
                format!("must not be 0 when `maxSurge` is 0{rounding}: no group could be updated"),
            ),
        ));
    }

    let sub_group_size = FieldPath::of(&[
        "spec",
        "leaderWorkerTemplate",
        "subGroupPolicy",
        "subGroupSize",
    ]);
    match &template.sub_group_policy {
        Some(policy) => found.extend(
            sub_group_problems(template.size, policy)
                .into_iter()
                .map(|message| finding(sub_group_size.clone(), message)),
        ),
        None => {
            if let Some(topology) = lws
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(SUBGROUP_EXCLUSIVE_KEY_ANNOTATION))
            {
                found.push(finding(
                    FieldPath::of(&["metadata", "annotations"])
                        .field(SUBGROUP_EXCLUSIVE_KEY_ANNOTATION),
                    not_allowed(
                        format!("{topology:?}"),
                        "cannot have subgroup-exclusive-topology without subGroupSize set",
                    ),
                ));
            }
        }
    }
    found
}

/// `<value> is not allowed: <why>`, as upstream's `field.Invalid` reads.
fn not_allowed(value: impl std::fmt::Display, why: impl std::fmt::Display) -> String {
    format!("{value} is not allowed: {why}")
}

/// An int-or-string as written: `1` or `"25%"`.
fn shown(value: &IntOrString) -> String {
    match value {
        IntOrString::Int(count) => count.to_string(),
        IntOrString::String(text) => format!("{text:?}"),
    }
}

/// What upstream's `ValidatePositiveIntOrPercent` and `IsNotMoreThan100Percent` refuse of
/// `maxUnavailable` or `maxSurge`: a negative count, a string that is not a percentage, a
/// percentage over 100.
fn rolling_amount_problem(value: &IntOrString) -> Option<String> {
    match value {
        IntOrString::Int(count) if *count < 0 => {
            Some("must be greater than or equal to 0".to_string())
        }
        IntOrString::Int(_) => None,
        IntOrString::String(text) => match percent(text) {
            None => Some(
                "a valid percent string must be a numeric string followed by an ending '%' \
                 (e.g. '1%', or '93%')"
                    .to_string(),
            ),
            Some(value) if value > 100 => Some("must not be greater than 100%".to_string()),
            Some(_) => None,
        },
    }
}

/// The number of a percentage such as `25%` (digits, then `%`); `None` for anything else.
fn percent(text: &str) -> Option<u64> {
    let digits = text.strip_suffix('%')?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Upstream `intstr.GetScaledValueFromIntOrPercent` (one implementation, the LWS
/// controller's); `None` for a string that is not a percentage as [`percent`] reads one.
fn scaled(value: &IntOrString, total: i32, round_up: bool) -> Option<i64> {
    if let IntOrString::String(text) = value {
        percent(text)?;
    }
    crate::controllers::lws::rolling::scaled(value, total, round_up)
        .ok()
        .map(i64::from)
}

/// Upstream's `validateUpdateSubGroupPolicy`: what is wrong with `policy` for groups of
/// `size` pods, each message about `subGroupSize`. Upstream's webhook fails on a policy
/// without a size (it reads a nil pointer) and on a size of 0 (it divides by it); here the
/// first is required, the second refused once.
fn sub_group_problems(size: i32, policy: &SubGroupPolicy) -> Vec<String> {
    let Some(sub_group_size) = policy.sub_group_size else {
        return vec![
            "required when subGroupPolicy is set: the number of pods per subgroup".to_string(),
        ];
    };
    let refused = |why: String| not_allowed(sub_group_size, why);
    if sub_group_size < 1 {
        return vec![refused(
            "subGroupSize must be equal or greater than 1".to_string(),
        )];
    }
    let mut problems = Vec::new();
    if size % sub_group_size != 0 && (size - 1) % sub_group_size != 0 {
        problems.push(refused(format!(
            "size or size - 1 must be divisible by subGroupSize (size is {size})"
        )));
    }
    if size < sub_group_size {
        problems.push(refused(format!(
            "subGroupSize cannot be larger than size ({size})"
        )));
    }
    if policy.sub_group_policy_type == SubGroupPolicyType::LeaderExcluded
        && (size - 1) % sub_group_size != 0
    {
        problems.push(refused(format!(
            "size-1 must be divisible by subGroupSize when using LeaderExcluded (size is {size})"
        )));
    }
    problems
}

/// Upstream `validation.IsDNS1035Label`, what a LeaderWorkerSet's name must be (it names a
/// headless Service): at most 63 lower-case alphanumerics and `-`, starting with a letter
/// and ending alphanumeric. Upstream's messages.
fn dns1035_label_errors(name: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if name.len() > 63 {
        errors.push("must be no more than 63 characters".to_string());
    }
    let bytes = name.as_bytes();
    let valid = bytes.first().is_some_and(u8::is_ascii_lowercase)
        && bytes
            .last()
            .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-');
    if !valid {
        errors.push(
            "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start \
             with an alphabetic character, and end with an alphanumeric character (e.g. \
             'my-name', or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')"
                .to_string(),
        );
    }
    errors
}

/// Documents that declare the same object as an earlier one, reported at the later one.
pub fn duplicates(documents: &[Parsed]) -> Vec<ManifestError> {
    let mut first: HashMap<ObjectId, &Manifest> = HashMap::with_capacity(documents.len());
    let mut errors = Vec::new();
    for parsed in documents {
        match first.entry(parsed.manifest.id()) {
            Entry::Occupied(earlier) => errors.push(parsed.error(
                &FieldPath::of(&["metadata", "name"]),
                format!(
                    "{} is declared twice: also at {}:{}; an object may be declared once",
                    earlier.key(),
                    earlier.get().file,
                    earlier.get().line
                ),
            )),
            Entry::Vacant(slot) => {
                slot.insert(&parsed.manifest);
            }
        }
    }
    errors
}

/// A node's version labels must each name a Module this commit declares, with a version
/// set; labels KMM's controllers own cannot be set from Git at all.
pub fn version_labels(documents: &[Parsed]) -> Vec<ManifestError> {
    let modules = modules_in(documents.iter().map(|parsed| &parsed.manifest));
    let mut errors = Vec::new();
    for parsed in documents.iter().filter(|p| is_node(&p.manifest)) {
        let labels = parsed
            .manifest
            .object
            .pointer("/metadata/labels")
            .and_then(Value::as_object);
        for (key, value) in labels.into_iter().flatten() {
            let Some(label) = classify(key, &modules) else {
                continue;
            };
            let path = FieldPath::of(&["metadata", "labels"]).field(key);
            let value = value.as_str().unwrap_or_default();
            match label {
                KmmLabel::Unreadable => errors.push(parsed.error(
                    &path,
                    format!(
                        "not a valid version label: expected \
                         {KMM_PREFIX}/version-module.<module namespace>.<module name>"
                    ),
                )),
                KmmLabel::ControllerOwned(label, module) => errors.push(parsed.error(
                    &path,
                    format!(
                        "is set by capstan's controllers ({label:?} of Module {module}); Git may \
                         only set {}",
                        module.version_module_label()
                    ),
                )),
                // KMM reads an empty version as no label at all.
                KmmLabel::Version(module) if value.is_empty() => errors.push(parsed.error(
                    &path,
                    format!(
                        "version label of Module {module} is empty, which KMM reads as no \
                         label; name the version to load, or remove the label"
                    ),
                )),
                KmmLabel::Version(module) => match modules.get(&module) {
                    None => errors.push(parsed.error(
                        &path,
                        format!(
                            "version label {value:?} names Module {module}, which no manifest \
                             of this commit declares; declare it or remove the label"
                        ),
                    )),
                    Some(declared) if declared.version.is_empty() => errors.push(parsed.error(
                        &path,
                        format!(
                            "version label {value:?} names Module {module} ({}:{}), which sets \
                             no spec.moduleLoader.container.version; ordered upgrades need one",
                            declared.file, declared.line
                        ),
                    )),
                    Some(_) => {}
                },
            }
        }
    }
    errors
}

/// An `UpgradeConfig` is a campaign rolling out one Module version: its
/// `spec.desired.version` must be the `spec.moduleLoader.container.version` of a Module this
/// commit declares, no other campaign may roll out the same version, and `spec.upgradeAt`
/// must be an RFC 3339 time (MUO's validation refuses anything else, and then never starts).
pub fn upgrade_configs(documents: &[Parsed]) -> Vec<ManifestError> {
    let modules = modules_in(documents.iter().map(|parsed| &parsed.manifest));
    let mut versions: Vec<&str> = modules
        .values()
        .map(|module| module.version)
        .filter(|version| !version.is_empty())
        .collect();
    versions.sort_unstable();
    versions.dedup();
    let mut campaigns: BTreeMap<String, String> = BTreeMap::new();
    let mut errors = Vec::new();
    for parsed in documents.iter().filter(|p| {
        p.manifest.api_version == UpgradeConfig::api_version(&())
            && p.manifest.kind == UpgradeConfig::kind(&())
    }) {
        // A manifest that does not decode is reported by the kind's own rules.
        let Ok(config) = serde_json::from_value::<UpgradeConfig>(parsed.manifest.object.clone())
        else {
            continue;
        };
        let spec_path = |fields: &[&str]| {
            fields
                .iter()
                .fold(FieldPath::of(&["spec"]), |path, field| path.field(field))
        };
        if let Err(err) = config.spec.upgrade_at.parse::<jiff::Timestamp>() {
            errors.push(parsed.error(
                &spec_path(&["upgradeAt"]),
                format!(
                    "{:?} is not an RFC 3339 time (such as \"2026-06-01T02:00:00Z\"): {err}",
                    config.spec.upgrade_at
                ),
            ));
        }
        let version = config.spec.desired.version.as_str();
        let path = spec_path(&["desired", "version"]);
        let declared = if versions.is_empty() {
            "no Module of this commit sets spec.moduleLoader.container.version".to_string()
        } else {
            format!("the Modules' versions are {}", versions.join(", "))
        };
        if version.is_empty() {
            errors.push(parsed.error(
                &path,
                format!("required: the Module version the campaign rolls out; {declared}"),
            ));
            continue;
        }
        if !versions.contains(&version) {
            errors.push(parsed.error(
                &path,
                format!("{version:?} is the version of no Module this commit declares; {declared}"),
            ));
        }
        let here = format!("{}:{}", parsed.manifest.file, parsed.manifest.line);
        if let Some(first) = campaigns.insert(version.to_string(), here.clone()) {
            campaigns.insert(version.to_string(), first.clone());
            errors.push(parsed.error(
                &path,
                format!(
                    "the UpgradeConfig at {first} rolls out {version:?} already; one campaign \
                     per version"
                ),
            ));
        }
    }
    errors
}

/// A Module a commit declares.
pub struct DeclaredModule<'a> {
    /// File of the Module.
    pub file: &'a str,
    /// Line of the Module.
    pub line: usize,
    /// `spec.moduleLoader.container.version`, empty when unset.
    pub version: &'a str,
}

/// The Modules among `manifests`, by key. Modules whose key is invalid are left out (they
/// are reported by the Module rules).
pub fn modules_in<'a>(
    manifests: impl Iterator<Item = &'a Manifest>,
) -> BTreeMap<ModuleKey, DeclaredModule<'a>> {
    manifests
        .filter(|m| m.api_version == Module::api_version(&()) && m.kind == Module::kind(&()))
        .filter_map(|m| {
            let key = ModuleKey::new(m.namespace.as_deref()?, m.name.as_str()).ok()?;
            let version = m
                .object
                .pointer("/spec/moduleLoader/container/version")
                .and_then(Value::as_str)
                .unwrap_or_default();
            Some((
                key,
                DeclaredModule {
                    file: &m.file,
                    line: m.line,
                    version,
                },
            ))
        })
        .collect()
}

/// Whether a manifest is a Node (a version-label declaration).
pub fn is_node(manifest: &Manifest) -> bool {
    manifest.api_version == "v1" && manifest.kind == "Node"
}

/// What a node label key means to KMM.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KmmLabel {
    /// `kmm.node.kubernetes.io/version-module.<ns>.<name>`: the version wanted on the node.
    Version(ModuleKey),
    /// A per-module label KMM's controllers set.
    ControllerOwned(ModuleLabel, ModuleKey),
    /// Looks like a version label but names no valid Module.
    Unreadable,
}

/// Reads a label key as a per-module KMM label; `None` for labels KMM does not own.
/// Ambiguous keys are read as naming a declared Module when one reading does.
pub fn classify<V>(key: &str, modules: &BTreeMap<ModuleKey, V>) -> Option<KmmLabel> {
    let readings = ModuleLabel::parse(key);
    if readings.is_empty() {
        let version_prefix = format!("{KMM_PREFIX}/version-module.");
        return key
            .starts_with(&version_prefix)
            .then_some(KmmLabel::Unreadable);
    }
    let declared = readings
        .iter()
        .find(|(_, module)| modules.contains_key(module));
    let version = readings
        .iter()
        .find(|(label, _)| *label == ModuleLabel::VersionModule);
    let (label, module) = declared.or(version).or(readings.first())?.clone();
    Some(match label {
        ModuleLabel::VersionModule => KmmLabel::Version(module),
        other => KmmLabel::ControllerOwned(other, module),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use capstan_api::module::ModprobeArgs;

    fn modprobe(name: &str, raw: Option<(&[&str], &[&str])>, order: &[&str]) -> ModprobeSpec {
        let strings = |items: &[&str]| items.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        ModprobeSpec {
            module_name: name.to_string(),
            raw_args: raw.map(|(load, unload)| ModprobeArgs {
                load: strings(load),
                unload: strings(unload),
            }),
            modules_loading_order: strings(order),
            ..ModprobeSpec::default()
        }
    }

    #[test]
    fn modprobe_decision_table() {
        let cases: &[(ModprobeSpec, &[&str])] = &[
            (modprobe("my_kmod", None, &[]), &[]),
            (modprobe("", Some((&["-v", "a"], &["-r", "a"])), &[]), &[]),
            (
                modprobe("my_kmod", Some((&["a"], &["a"])), &[]),
                &["rawArgs"],
            ),
            (modprobe("", None, &[]), &["moduleName"]),
            (modprobe("", Some((&[], &["a"])), &[]), &["rawArgs.load"]),
            (modprobe("", Some((&["a"], &[])), &[]), &["rawArgs.unload"]),
            (modprobe("my_kmod", None, &["my_kmod", "dep"]), &[]),
            // modprobe reads '-' and '_' alike.
            (modprobe("my-kmod", None, &["my_kmod", "dep"]), &[]),
            (
                modprobe("my_kmod", None, &["my_kmod"]),
                &["modulesLoadingOrder"],
            ),
            (
                modprobe("my_kmod", None, &["dep", "my_kmod"]),
                &["modulesLoadingOrder"],
            ),
            (
                modprobe("my_kmod", None, &["my_kmod", "dep", "dep"]),
                &["modulesLoadingOrder"],
            ),
            (
                modprobe("", Some((&["a"], &["a"])), &["a", "b"]),
                &["modulesLoadingOrder"],
            ),
        ];
        for (spec, expected) in cases {
            let fields: Vec<&str> = modprobe_problems(spec)
                .into_iter()
                .map(|(f, _)| f)
                .collect();
            assert_eq!(fields, *expected, "{spec:?}");
        }
    }

    fn mapping(literal: &str, regexp: &str, image: &str) -> KernelMapping {
        KernelMapping {
            literal: literal.to_string(),
            regexp: regexp.to_string(),
            container_image: image.to_string(),
            ..KernelMapping::default()
        }
    }

    fn mapping_fields(
        mapping: &KernelMapping,
        container: &ModuleLoaderContainerSpec,
        container_list: bool,
    ) -> Vec<&'static str> {
        kernel_mapping_problems(mapping, container, container_list)
            .into_iter()
            .map(|(field, _)| field)
            .collect()
    }

    #[test]
    fn kernel_mapping_decision_table() {
        let no_default = ModuleLoaderContainerSpec::default();
        let with_default = ModuleLoaderContainerSpec {
            container_image: "image-url:mytag".to_string(),
            ..ModuleLoaderContainerSpec::default()
        };
        let cases: &[(KernelMapping, &ModuleLoaderContainerSpec, &[&str])] = &[
            (mapping("6.0.15", "", "img:v1"), &no_default, &[]),
            (mapping("", "^.+$", "img:v1"), &no_default, &[]),
            (mapping("", "", "img:v1"), &no_default, &["literal"]),
            (
                mapping("6.0.15", "^.+$", "img:v1"),
                &no_default,
                &["regexp"],
            ),
            // Upstream's webhook tests.
            (
                mapping("", "valid-regexp", "image-url:mytag"),
                &no_default,
                &[],
            ),
            (mapping("", "valid-regexp", ""), &with_default, &[]),
            (mapping("any-value", "", ""), &with_default, &[]),
            (
                mapping("", "*-invalid-regexp", "img:v1"),
                &no_default,
                &["regexp"],
            ),
            (mapping("", "(", "img:v1"), &no_default, &["regexp"]),
            (
                mapping("", "valid-regexp", ""),
                &no_default,
                &["containerImage"],
            ),
            (
                mapping("", "valid-regexp", "image-url"),
                &no_default,
                &["containerImage"],
            ),
            (
                mapping("", "valid-regexp", "image-url"),
                &with_default,
                &["containerImage"],
            ),
            (mapping("", ".", "image-url@sha256:0123"), &no_default, &[]),
            // A registry port counts as the ':' upstream looks for.
            (mapping("", ".", "registry:5000/img"), &no_default, &[]),
        ];
        for (mapping, container, expected) in cases {
            assert_eq!(
                mapping_fields(mapping, container, false),
                *expected,
                "{mapping:?} {:?}",
                container.container_image
            );
        }
        let (_, message) =
            &kernel_mapping_problems(&mapping("", "valid-regexp", ""), &no_default, false)[0];
        assert!(
            message.starts_with("required: neither this mapping nor"),
            "{message}"
        );
    }

    #[test]
    fn in_tree_removal_uses_one_form() {
        let strings = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
        type Names = &'static [&'static str];
        // (container list present, container single, mapping list, mapping single, problems)
        type Case = (bool, &'static str, Option<Names>, &'static str, Names);
        let cases: &[Case] = &[
            (false, "", None, "", &[]),
            (true, "", Some(&["m"]), "", &[]),
            (false, "old", None, "mapped", &[]),
            (true, "", Some(&[]), "", &[]),
            (false, "", Some(&["m"]), "mapped", &["inTreeModuleToRemove"]),
            // Present but empty is present, as upstream's `!= nil`.
            (false, "", Some(&[]), "mapped", &["inTreeModuleToRemove"]),
            (false, "old", Some(&["m"]), "", &["inTreeModulesToRemove"]),
            (true, "", None, "mapped", &["inTreeModuleToRemove"]),
        ];
        for (container_list, container_single, mapping_list, mapping_single, expected) in cases {
            let container = ModuleLoaderContainerSpec {
                in_tree_module_to_remove: container_single.to_string(),
                ..ModuleLoaderContainerSpec::default()
            };
            let mapping = KernelMapping {
                in_tree_modules_to_remove: mapping_list.map(strings),
                in_tree_module_to_remove: mapping_single.to_string(),
                ..mapping("", "^.+$", "img:v1")
            };
            assert_eq!(
                mapping_fields(&mapping, &container, *container_list),
                *expected,
                "{container_list} {container_single:?} {mapping_list:?} {mapping_single:?}"
            );
        }
    }

    #[test]
    fn toleration_decision_table() {
        let toleration = |key: &str, operator: &str, value: &str, effect: &str| Toleration {
            key: (!key.is_empty()).then(|| key.to_string()),
            operator: (!operator.is_empty()).then(|| operator.to_string()),
            value: (!value.is_empty()).then(|| value.to_string()),
            effect: (!effect.is_empty()).then(|| effect.to_string()),
            toleration_seconds: None,
        };
        let seconds = |toleration: Toleration| Toleration {
            toleration_seconds: Some(30),
            ..toleration
        };
        // Upstream's validateTolerations tests, one toleration each.
        let cases: &[(Toleration, &[&str])] = &[
            (
                toleration("Test-Key1", "Exists", "", "PreferNoSchedule"),
                &[],
            ),
            (
                toleration("Test-Key2", "Equal", "Test-Value", "NoSchedule"),
                &[],
            ),
            (
                toleration("Test-Key3", "Equal", "Test-Value", "NoExecute"),
                &[],
            ),
            (
                toleration("Test-Key2", "Exists", "", "Invalid-Effect"),
                &["effect"],
            ),
            (
                toleration(
                    "Test-Key2",
                    "Invalid-operator-value",
                    "Test-Value2",
                    "NoExecute",
                ),
                &["operator"],
            ),
            (
                toleration("Test-Key2", "Exists", "Test-Value2", "NoExecute"),
                &["value"],
            ),
            (
                toleration("Invalid Key!", "Equal", "Test-Value", ""),
                &["key"],
            ),
            (toleration("", "Equal", "Test-Value", ""), &["operator"]),
            (
                seconds(toleration("Test-Key", "Equal", "Test-Value", "NoSchedule")),
                &["tolerationSeconds"],
            ),
            (
                seconds(toleration("Test-Key", "Equal", "Test-Value", "NoExecute")),
                &[],
            ),
            (
                toleration("Test-Key", "InvalidOperator", "Test-Value", ""),
                &["operator"],
            ),
            // No operator is Equal; an empty key needs Exists, which tolerates everything.
            (toleration("k", "", "v", ""), &[]),
            (toleration("", "", "", ""), &["operator"]),
            (toleration("", "Exists", "", ""), &[]),
            (
                toleration("k", "Equal", "not a label value", ""),
                &["value"],
            ),
            (toleration("example.com/k", "Exists", "", "NoExecute"), &[]),
        ];
        for (toleration, expected) in cases {
            let fields: Vec<&str> = toleration_problems(toleration)
                .into_iter()
                .map(|(field, _)| field)
                .collect();
            assert_eq!(fields, *expected, "{toleration:?}");
        }
    }

    #[test]
    fn images_name_a_tag_or_digest() {
        let cases = [
            ("image-url:tag", true),
            ("image-url@sha256:xxxxxxxxxxxx", true),
            (
                "registry.example/org/my-kmod:v1-${KERNEL_FULL_VERSION}",
                true,
            ),
            ("", true),
            ("image-ur", false),
            ("registry.example/org/my-kmod", false),
        ];
        for (image, fine) in cases {
            assert_eq!(image_problem(image).is_none(), fine, "{image:?}");
        }
        assert_eq!(
            image_problem("repo/img").as_deref(),
            Some(
                "\"repo/img\" names no tag or digest: add one, such as repo/img:v1 or repo/img@sha256:..."
            )
        );
    }

    #[test]
    fn files_to_sign_are_under_the_module_directory() {
        let sign = |files: &[&str]| Sign {
            files_to_sign: files.iter().map(|f| f.to_string()).collect(),
            ..Sign::default()
        };
        let cases: &[(&[&str], &[Option<usize>])] = &[
            (&["/opt/lib/modules/my_kmod.ko"], &[]),
            (&[], &[None]),
            (
                &["/opt/a.ko", "/lib/b.ko", "/optional/c.ko"],
                &[Some(1), Some(2)],
            ),
        ];
        for (files, expected) in cases {
            let found: Vec<Option<usize>> = files_to_sign_problems(&sign(files), "/opt")
                .into_iter()
                .map(|(index, _)| index)
                .collect();
            assert_eq!(found, *expected, "{files:?}");
        }
    }

    #[test]
    fn label_classification_table() {
        let demo = ModuleKey::new("kmm-demo", "my-kmod").unwrap();
        let modules: BTreeMap<ModuleKey, ()> = [(demo.clone(), ())].into();
        let cases = [
            (
                "kmm.node.kubernetes.io/version-module.kmm-demo.my-kmod",
                Some(KmmLabel::Version(demo.clone())),
            ),
            (
                "kmm.node.kubernetes.io/version-module.other.mod",
                Some(KmmLabel::Version(ModuleKey::new("other", "mod").unwrap())),
            ),
            (
                "kmm.node.kubernetes.io/version-module.x",
                Some(KmmLabel::Unreadable),
            ),
            (
                "beta.kmm.node.kubernetes.io/version-worker-pod.kmm-demo.my-kmod",
                Some(KmmLabel::ControllerOwned(
                    ModuleLabel::VersionWorkerPod,
                    demo.clone(),
                )),
            ),
            (
                "kmm.node.kubernetes.io/kmm-demo.my-kmod.ready",
                Some(KmmLabel::ControllerOwned(ModuleLabel::Ready, demo.clone())),
            ),
            (
                "kmm.node.kubernetes.io/kmm-demo.my-kmod.dra-ready",
                Some(KmmLabel::ControllerOwned(
                    ModuleLabel::DraReady,
                    demo.clone(),
                )),
            ),
            ("node-role.kubernetes.io/worker", None),
            ("example.com/version-module.a.b", None),
        ];
        for (key, expected) in cases {
            assert_eq!(classify(key, &modules), expected, "{key}");
        }
    }

    #[test]
    fn rolling_update_amounts_decision_table() {
        let percent_format = "a valid percent string";
        let text = |value: &str| IntOrString::String(value.to_string());
        // (value, problem, value for 10 groups rounded down and up)
        let cases: &[(IntOrString, Option<&str>, Scaled)] = &[
            (IntOrString::Int(1), None, (Some(1), Some(1))),
            (IntOrString::Int(0), None, (Some(0), Some(0))),
            (
                IntOrString::Int(-1),
                Some("must be greater than or equal to 0"),
                (Some(-1), Some(-1)),
            ),
            (text("25%"), None, (Some(2), Some(3))),
            (text("0%"), None, (Some(0), Some(0))),
            (text("100%"), None, (Some(10), Some(10))),
            (
                text("101%"),
                Some("must not be greater than 100%"),
                (Some(10), Some(11)),
            ),
            (text("25"), Some(percent_format), (None, None)),
            (text("-5%"), Some(percent_format), (None, None)),
            (text("%"), Some(percent_format), (None, None)),
            (text("2.5%"), Some(percent_format), (None, None)),
        ];
        for (value, problem, (down, up)) in cases {
            match (rolling_amount_problem(value), problem) {
                (None, None) => {}
                (Some(found), Some(prefix)) => {
                    assert!(found.starts_with(prefix), "{value:?}: {found}")
                }
                (found, expected) => panic!("{value:?}: {found:?}, expected {expected:?}"),
            }
            assert_eq!(scaled(value, 10, false), *down, "{value:?} down");
            assert_eq!(scaled(value, 10, true), *up, "{value:?} up");
        }
    }

    /// A rolling update amount for some groups, rounded down and up.
    type Scaled = (Option<i64>, Option<i64>);

    #[test]
    fn sub_group_decision_table() {
        use SubGroupPolicyType::{LeaderExcluded, LeaderWorker};
        let cases: &[(i32, Option<i32>, SubGroupPolicyType, &[&str])] = &[
            (4, Some(2), LeaderWorker, &[]),
            (5, Some(2), LeaderWorker, &[]),
            (4, Some(4), LeaderWorker, &[]),
            (1, Some(1), LeaderWorker, &[]),
            (
                5,
                Some(3),
                LeaderWorker,
                &["3 is not allowed: size or size - 1"],
            ),
            (
                1,
                Some(2),
                LeaderWorker,
                &["2 is not allowed: subGroupSize cannot be larger"],
            ),
            (
                4,
                Some(8),
                LeaderWorker,
                &[
                    "8 is not allowed: size or size - 1",
                    "8 is not allowed: subGroupSize cannot be larger",
                ],
            ),
            (5, Some(2), LeaderExcluded, &[]),
            (
                4,
                Some(2),
                LeaderExcluded,
                &[
                    "2 is not allowed: size-1 must be divisible by subGroupSize when using LeaderExcluded",
                ],
            ),
            (
                4,
                Some(0),
                LeaderWorker,
                &["0 is not allowed: subGroupSize must be equal or greater than 1"],
            ),
            (
                4,
                Some(-2),
                LeaderWorker,
                &["-2 is not allowed: subGroupSize must be equal or greater than 1"],
            ),
            (
                4,
                None,
                LeaderWorker,
                &["required when subGroupPolicy is set"],
            ),
        ];
        for (size, sub_group_size, type_, expected) in cases {
            let policy = SubGroupPolicy {
                sub_group_policy_type: *type_,
                sub_group_size: *sub_group_size,
            };
            let found = sub_group_problems(*size, &policy);
            assert_eq!(found.len(), expected.len(), "{size} {policy:?}: {found:?}");
            for (message, prefix) in found.iter().zip(*expected) {
                assert!(message.starts_with(prefix), "{size} {policy:?}: {message}");
            }
        }
    }

    #[test]
    fn dns_1035_labels() {
        let cases = [
            ("vllm", 0),
            ("a", 0),
            ("llama-70b", 0),
            ("1vllm", 1),
            ("Vllm", 1),
            ("vllm-", 1),
            ("v.llm", 1),
            ("", 1),
        ];
        for (name, errors) in cases {
            assert_eq!(dns1035_label_errors(name).len(), errors, "{name:?}");
        }
        assert_eq!(
            dns1035_label_errors(&"a".repeat(64)),
            ["must be no more than 63 characters"]
        );
    }

    #[test]
    fn names_and_namespaces() {
        assert!(object_name("worker-1").is_ok());
        assert!(object_name("system:nodes").is_ok());
        assert!(object_name("a/b").is_err());
        assert!(object_name("..").is_err());
        assert!(dns_label("kmm-demo").is_ok());
        assert!(dns_label("KMM").is_err());
        assert!(dns_label("-a").is_err());
        assert!(dns_label(&"a".repeat(64)).is_err());
    }
}
