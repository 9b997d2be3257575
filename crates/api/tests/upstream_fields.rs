//! capstan's `Module` and `NodeModulesConfig` CRDs against those of the pinned KMM release,
//! field for field.
//!
//! `tests/upstream/kmm-v2.6.0-*-fields.txt` list every field of upstream's CRDs (derived
//! from the release's `config/crd/bases/`, see their headers). Every field listed must be in
//! capstan's schema with the same type, or a KMM manifest using it is refused. KMM's own
//! fields must also keep upstream's `required`, `default`, `enum` and `minItems`, apart from
//! the deviations listed below with their reasons. Fields of Kubernetes' own types
//! (tolerations, volumes, env, secret references...) get their schemas from k8s-openapi
//! rather than from KMM's controller-gen, so only their paths and types are compared.

use std::collections::BTreeMap;

use capstan_api::{Module, NodeModulesConfig};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps, JSONSchemaPropsOrArray, JSONSchemaPropsOrBool,
};
use kube::CustomResourceExt;

const MODULE_FIELDS: &str = include_str!("upstream/kmm-v2.6.0-module-fields.txt");
const NMC_FIELDS: &str = include_str!("upstream/kmm-v2.6.0-nodemodulesconfig-fields.txt");

/// Field names whose values are of a Kubernetes type (`LocalObjectReference`, `Toleration`,
/// `EnvVar`, `ResourceRequirements`, `VolumeMount`, `Volume`); the fields below them are
/// Kubernetes', not KMM's.
const KUBERNETES_TYPED: [&str; 10] = [
    "imageRepoSecret",
    "dockerfileConfigMap",
    "secrets",
    "certSecret",
    "keySecret",
    "tolerations",
    "env",
    "resources",
    "volumeMounts",
    "volumes",
];

/// Where capstan's schema of a KMM field knowingly differs from upstream's:
/// (CRD, path, capstan's declaration in the list format, why).
const DEVIATIONS: [(&str, &str, &str, &str); 12] = [
    (
        "Module",
        "spec",
        "object required",
        "kube's CustomResource derive requires spec; a Module without one has no selector",
    ),
    (
        "Module",
        "status.moduleLoader",
        r#"object default={"availableNumber":0,"desiredNumber":0,"nodesMatchingSelectorNumber":0}"#,
        "counts are written as zeros so that a status merge patch resets a count that fell to 0",
    ),
    (
        "Module",
        "status.moduleLoader.availableNumber",
        "integer default=0",
        "as status.moduleLoader",
    ),
    (
        "Module",
        "status.moduleLoader.desiredNumber",
        "integer default=0",
        "as status.moduleLoader",
    ),
    (
        "Module",
        "status.moduleLoader.nodesMatchingSelectorNumber",
        "integer default=0",
        "as status.moduleLoader",
    ),
    (
        "Module",
        "status.devicePlugin",
        r#"object default={"availableNumber":0,"desiredNumber":0,"nodesMatchingSelectorNumber":0}"#,
        "as status.moduleLoader",
    ),
    (
        "Module",
        "status.devicePlugin.availableNumber",
        "integer default=0",
        "as status.moduleLoader",
    ),
    (
        "Module",
        "status.devicePlugin.desiredNumber",
        "integer default=0",
        "as status.moduleLoader",
    ),
    (
        "Module",
        "status.devicePlugin.nodesMatchingSelectorNumber",
        "integer default=0",
        "as status.moduleLoader",
    ),
    (
        "NodeModulesConfig",
        "spec",
        "object required",
        "as Module spec",
    ),
    (
        "NodeModulesConfig",
        "spec.modules",
        "array default=[]",
        "written even when empty, so a merge patch that drops the last entry clears the list",
    ),
    (
        "NodeModulesConfig",
        "status.modules",
        "array default=[]",
        "as spec.modules",
    ),
];

/// Where capstan's schema of a KMM status entry is stricter than upstream's, which marks
/// the loaded config optional though its Go type always writes one:
/// (CRD, path, capstan's declaration, why).
const STRICTER: [(&str, &str, &str, &str); 1] = [(
    "NodeModulesConfig",
    "status.modules[].config",
    "object required",
    "every status entry capstan writes records the config the worker loaded",
)];

/// capstan's additions to KMM's fields (their subtrees included).
const ADDITIONS: [(&str, &str); 1] = [("Module", "status.conditions")];

/// One field as the list files state it.
#[derive(Debug, PartialEq)]
struct Field {
    path: String,
    declaration: String,
}

impl Field {
    fn type_(&self) -> &str {
        self.declaration.split(' ').next().unwrap_or_default()
    }
}

fn upstream(list: &str) -> Vec<Field> {
    list.lines()
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(|line| {
            let (path, declaration) = line.split_once(' ').expect("path and type");
            Field {
                path: path.to_string(),
                declaration: declaration.to_string(),
            }
        })
        .collect()
}

/// capstan's fields of `crd`, in the list format, by path.
fn capstan(crd: &CustomResourceDefinition) -> BTreeMap<String, String> {
    let root = crd.spec.versions[0]
        .schema
        .as_ref()
        .and_then(|schema| schema.open_api_v3_schema.as_ref())
        .expect("a schema");
    let mut fields = BTreeMap::new();
    collect(root, "", false, &mut fields);
    fields.remove("");
    fields
}

fn collect(
    schema: &JSONSchemaProps,
    path: &str,
    required: bool,
    out: &mut BTreeMap<String, String>,
) {
    let type_ = if schema.x_kubernetes_int_or_string == Some(true) {
        "int-or-string"
    } else {
        schema.type_.as_deref().unwrap_or_default()
    };
    let mut declaration = vec![type_.to_string()];
    if required {
        declaration.push("required".to_string());
    }
    if let Some(default) = &schema.default {
        let json = capstan_api::canonical::canonical_json(&default.0);
        declaration.push(format!("default={}", String::from_utf8_lossy(&json)));
    }
    if let Some(values) = &schema.enum_ {
        let values: Vec<String> = values
            .iter()
            .map(|value| match &value.0 {
                serde_json::Value::String(text) => text.clone(),
                other => other.to_string(),
            })
            .collect();
        declaration.push(format!("enum={}", values.join("|")));
    }
    if let Some(min_items) = schema.min_items {
        declaration.push(format!("minItems={min_items}"));
    }
    out.insert(path.to_string(), declaration.join(" "));

    let names = schema.required.clone().unwrap_or_default();
    for (name, property) in schema.properties.iter().flatten() {
        let child = if path.is_empty() {
            name.clone()
        } else {
            format!("{path}.{name}")
        };
        collect(property, &child, names.contains(name), out);
    }
    if let Some(JSONSchemaPropsOrArray::Schema(items)) = &schema.items {
        collect(items, &format!("{path}[]"), false, out);
    }
    if let Some(JSONSchemaPropsOrBool::Schema(values)) = &schema.additional_properties {
        collect(values, &format!("{path}.*"), false, out);
    }
}

/// True for a field strictly below a field of a Kubernetes type.
fn below_kubernetes_type(path: &str) -> bool {
    let segments: Vec<&str> = path.split('.').collect();
    segments[..segments.len() - 1]
        .iter()
        .any(|segment| KUBERNETES_TYPED.contains(&segment.trim_end_matches("[]")))
}

fn cases() -> [(&'static str, CustomResourceDefinition, Vec<Field>); 2] {
    [
        ("Module", Module::crd(), upstream(MODULE_FIELDS)),
        (
            "NodeModulesConfig",
            NodeModulesConfig::crd(),
            upstream(NMC_FIELDS),
        ),
    ]
}

#[test]
fn every_field_of_kmm_v2_6_is_declared_with_its_type() {
    for (kind, crd, fields) in cases() {
        assert!(fields.len() > 50, "{kind}: the list reads as {fields:?}");
        let ours = capstan(&crd);
        let mut problems = Vec::new();
        for field in &fields {
            match ours.get(&field.path) {
                None => problems.push(format!("{} missing", field.path)),
                Some(declaration) if declaration.split(' ').next() != Some(field.type_()) => {
                    problems.push(format!(
                        "{}: upstream {:?}, capstan {declaration:?}",
                        field.path,
                        field.type_()
                    ))
                }
                Some(_) => {}
            }
        }
        assert_eq!(problems, Vec::<String>::new(), "{kind}");
    }
}

#[test]
fn kmm_fields_keep_upstream_required_defaults_and_bounds() {
    let mut used = Vec::new();
    for (kind, crd, fields) in cases() {
        let ours = capstan(&crd);
        let mut problems = Vec::new();
        for field in fields
            .iter()
            .filter(|field| !below_kubernetes_type(&field.path))
        {
            let Some(declaration) = ours.get(&field.path) else {
                continue; // reported by every_field_of_kmm_v2_6_is_declared_with_its_type
            };
            let known = DEVIATIONS
                .iter()
                .chain(&STRICTER)
                .find(|(k, path, _, _)| *k == kind && *path == field.path);
            let expected = known.map_or(field.declaration.as_str(), |(_, _, ours, _)| ours);
            if *declaration != expected {
                problems.push(format!(
                    "{}: upstream {:?}, capstan {declaration:?}",
                    field.path, field.declaration
                ));
            }
            if known.is_some() && *declaration != field.declaration {
                used.push((kind, field.path.clone()));
            }
        }
        assert_eq!(problems, Vec::<String>::new(), "{kind}");
    }
    // Every listed deviation is still one.
    let mut listed: Vec<(&str, String)> = DEVIATIONS
        .iter()
        .chain(&STRICTER)
        .map(|(kind, path, _, _)| (*kind, path.to_string()))
        .collect();
    listed.sort();
    used.sort();
    assert_eq!(used, listed);
}

#[test]
fn capstan_adds_to_kmm_fields_only_its_module_conditions() {
    for (kind, crd, fields) in cases() {
        let theirs: Vec<&str> = fields.iter().map(|field| field.path.as_str()).collect();
        let added: Vec<String> = capstan(&crd)
            .into_keys()
            .filter(|path| !theirs.contains(&path.as_str()) && !below_kubernetes_type(path))
            .filter(|path| {
                !ADDITIONS.iter().any(|(k, root)| {
                    *k == kind
                        && path
                            .strip_prefix(root)
                            .is_some_and(|rest| rest.is_empty() || rest.starts_with(['.', '[']))
                })
            })
            .collect();
        assert_eq!(added, Vec::<String>::new(), "{kind}");
    }
}
