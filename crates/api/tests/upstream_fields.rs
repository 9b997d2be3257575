//! capstan's CRDs against those of the pinned upstream releases, field for field: `Module`
//! against KMM main (de3f8c9, v2.6.0 and `spec.dra`), `NodeModulesConfig` against KMM
//! v2.6.0 (unchanged on main), `LeaderWorkerSet` against LWS v0.10.0.
//!
//! `tests/upstream/*-fields.txt` list every field of upstream's CRDs (derived from the
//! releases' `config/crd/bases/`, see their headers).
//!
//! KMM: every field listed must be in capstan's schema with the same type, or a KMM manifest
//! using it is refused. KMM's own fields must also keep upstream's `required`, `default`,
//! `enum` and `minItems`, apart from the deviations listed below with their reasons. Fields
//! of Kubernetes' own types (tolerations, volumes, env, secret references...) get their
//! schemas from k8s-openapi rather than from KMM's controller-gen, so only their paths and
//! types are compared.
//!
//! LWS: the whole CRD, the pod templates included, must declare what upstream's declares:
//! every field with its type, `required`, defaults, enums, bounds, formats, patterns, list
//! and map markers (which decide how server-side apply merges a pod template's containers,
//! ports, env...), and the CRD's names, subresources and printer columns. Only the
//! deviations listed below with their reasons differ, and descriptions, which are not
//! compared. Upstream's released CRD also names a conversion webhook, for its one version;
//! capstan serves no webhook and needs no conversion.

use std::collections::{BTreeMap, BTreeSet};

use capstan_api::{LeaderWorkerSet, Module, NodeModulesConfig};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps, JSONSchemaPropsOrArray, JSONSchemaPropsOrBool,
};
use kube::CustomResourceExt;

const MODULE_FIELDS: &str = include_str!("upstream/kmm-de3f8c9-module-fields.txt");
const NMC_FIELDS: &str = include_str!("upstream/kmm-v2.6.0-nodemodulesconfig-fields.txt");
const LWS_CRD: &str = include_str!("upstream/lws-v0.10.0-leaderworkerset-fields.txt");

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
const DEVIATIONS: [(&str, &str, &str, &str); 16] = [
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
        "Module",
        "status.dra",
        r#"object default={"availableNumber":0,"desiredNumber":0,"nodesMatchingSelectorNumber":0}"#,
        "as status.moduleLoader",
    ),
    (
        "Module",
        "status.dra.availableNumber",
        "integer default=0",
        "as status.moduleLoader",
    ),
    (
        "Module",
        "status.dra.desiredNumber",
        "integer default=0",
        "as status.moduleLoader",
    ),
    (
        "Module",
        "status.dra.nodesMatchingSelectorNumber",
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

/// capstan's declarations of the LeaderWorkerSet fields upstream's webhook defaults.
const ROLLOUT_DEFAULT: &str = r#"object default={"rollingUpdateConfiguration":{"maxSurge":0,"maxUnavailable":1,"partition":0},"type":"RollingUpdate"}"#;
const ROLLING_UPDATE_DEFAULT: &str =
    r#"object default={"maxSurge":0,"maxUnavailable":1,"partition":0}"#;
/// Why the status counts have a default.
const STATUS_COUNT: &str = "a count is decoded as 0 when absent (upstream's status omits zeros), \
     and schemars puts that serde default into the schema; an API server defaulting a status \
     count to 0 changes nothing a reader sees";

/// Where capstan's LeaderWorkerSet CRD knowingly differs from upstream's:
/// (path, capstan's declaration in the list format, why).
const LWS_DEVIATIONS: [(&str, &str, &str); 9] = [
    (
        "spec",
        "object required",
        "kube's CustomResource derive requires spec; a LeaderWorkerSet without one has no \
         worker template",
    ),
    (
        "spec.networkConfig.subdomainPolicy",
        r#"string default="Shared" enum=Shared|UniquePerReplica"#,
        "upstream requires it, but its defaulting webhook sets a missing one to Shared before \
         the schema is checked; capstan has no webhook, so the schema's default does that",
    ),
    (
        "spec.rolloutStrategy",
        ROLLOUT_DEFAULT,
        "upstream's defaulting webhook fills in the type and the rolling update \
         configuration; capstan has no webhook, so the schema's default does that",
    ),
    (
        "spec.rolloutStrategy.rollingUpdateConfiguration",
        ROLLING_UPDATE_DEFAULT,
        "as spec.rolloutStrategy",
    ),
    (
        "status",
        "object nullable",
        "kube's CustomResource derive declares the status an Option",
    ),
    (
        "status.observedGeneration",
        "integer default=0 format=int64",
        STATUS_COUNT,
    ),
    (
        "status.readyReplicas",
        "integer default=0 format=int32",
        STATUS_COUNT,
    ),
    (
        "status.replicas",
        "integer default=0 format=int32",
        STATUS_COUNT,
    ),
    (
        "status.updatedReplicas",
        "integer default=0 format=int32",
        STATUS_COUNT,
    ),
];

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

/// capstan's fields of `crd` by path, each declaration as the words of the list format
/// (the LWS list's header says which and in what order).
fn capstan(crd: &CustomResourceDefinition) -> BTreeMap<String, Vec<String>> {
    let root = crd.spec.versions[0]
        .schema
        .as_ref()
        .and_then(|schema| schema.open_api_v3_schema.as_ref())
        .expect("a schema");
    let mut fields = BTreeMap::new();
    collect(root, "", false, &mut fields);
    fields.remove("");
    for implicit in ["apiVersion", "kind", "metadata"] {
        fields.retain(|path, _| path != implicit && !path.starts_with(&format!("{implicit}.")));
    }
    fields
}

/// capstan's fields of `crd` in the words the KMM lists use: type, `required`, `default=`,
/// `enum=` and `minItems=`.
fn capstan_kmm(crd: &CustomResourceDefinition) -> BTreeMap<String, String> {
    capstan(crd)
        .into_iter()
        .map(|(path, words)| {
            let kept: Vec<String> = words
                .into_iter()
                .enumerate()
                .filter(|(index, word)| {
                    *index == 0
                        || word == "required"
                        || ["default=", "enum=", "minItems="]
                            .iter()
                            .any(|prefix| word.starts_with(prefix))
                })
                .map(|(_, word)| word)
                .collect();
            (path, kept.join(" "))
        })
        .collect()
}

fn collect(
    schema: &JSONSchemaProps,
    path: &str,
    required: bool,
    out: &mut BTreeMap<String, Vec<String>>,
) {
    out.insert(path.to_string(), declaration(schema, required));
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

/// What a schema node declares, in the words and order of the list format.
fn declaration(schema: &JSONSchemaProps, required: bool) -> Vec<String> {
    let type_ = if schema.x_kubernetes_int_or_string == Some(true) {
        "int-or-string"
    } else {
        schema.type_.as_deref().unwrap_or_default()
    };
    let flag = |set: Option<bool>, word: &str| (set == Some(true)).then(|| word.to_string());
    let named = |name: &str, value: Option<String>| value.map(|value| format!("{name}={value}"));
    let enum_ = schema.enum_.as_ref().map(|values| {
        values
            .iter()
            .map(|value| match &value.0 {
                serde_json::Value::String(text) => text.clone(),
                other => other.to_string(),
            })
            .collect::<Vec<_>>()
            .join("|")
    });
    let words = [
        Some(type_.to_string()),
        required.then(|| "required".to_string()),
        named("default", schema.default.as_ref().map(|d| json(&d.0))),
        named("enum", enum_),
        named("minimum", schema.minimum.map(number)),
        named("maximum", schema.maximum.map(number)),
        named(
            "exclusiveMinimum",
            schema.exclusive_minimum.map(|b| b.to_string()),
        ),
        named(
            "exclusiveMaximum",
            schema.exclusive_maximum.map(|b| b.to_string()),
        ),
        named("minItems", schema.min_items.map(|n| n.to_string())),
        named("maxItems", schema.max_items.map(|n| n.to_string())),
        named("minLength", schema.min_length.map(|n| n.to_string())),
        named("maxLength", schema.max_length.map(|n| n.to_string())),
        named(
            "minProperties",
            schema.min_properties.map(|n| n.to_string()),
        ),
        named(
            "maxProperties",
            schema.max_properties.map(|n| n.to_string()),
        ),
        named("multipleOf", schema.multiple_of.map(number)),
        flag(schema.nullable, "nullable"),
        named("format", schema.format.clone()),
        named("pattern", schema.pattern.clone()),
        named("listType", schema.x_kubernetes_list_type.clone()),
        named(
            "listMapKeys",
            schema
                .x_kubernetes_list_map_keys
                .as_ref()
                .map(|keys| keys.join(",")),
        ),
        named("mapType", schema.x_kubernetes_map_type.clone()),
        flag(
            schema.x_kubernetes_preserve_unknown_fields,
            "preserveUnknownFields",
        ),
        flag(schema.x_kubernetes_embedded_resource, "embeddedResource"),
    ];
    let rules = schema
        .x_kubernetes_validations
        .iter()
        .flatten()
        .map(|rule| {
            let rule = serde_json::to_value(rule).expect("a validation rule serialises");
            format!("validation={}", json(&rule))
        });
    words.into_iter().flatten().chain(rules).collect()
}

/// Canonical JSON: sorted keys, no spaces.
fn json(value: &serde_json::Value) -> String {
    String::from_utf8_lossy(&capstan_api::canonical::canonical_json(value)).into_owned()
}

/// A number as YAML writes it: `0`, not `0.0`.
fn number(value: f64) -> String {
    if value.fract() == 0.0 && value.abs() < 1e15 {
        format!("{}", value as i64)
    } else {
        value.to_string()
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
        let ours = capstan_kmm(&crd);
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
        let ours = capstan_kmm(&crd);
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
        let added: Vec<String> = capstan_kmm(&crd)
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

/// The `@` lines of the LWS list, as capstan's CRD states them.
fn crd_declarations(crd: &CustomResourceDefinition) -> Vec<String> {
    let names = &crd.spec.names;
    let list = |items: &Option<Vec<String>>| items.clone().unwrap_or_default().join(",");
    let version = &crd.spec.versions[0];
    // kube's derive leaves listKind out; the API server defaults it to `<kind>List`.
    let list_kind = names
        .list_kind
        .clone()
        .unwrap_or_else(|| format!("{}List", names.kind));
    let mut lines = vec![
        format!(
            "@names kind={} listKind={list_kind} plural={} singular={} shortNames={} categories={}",
            names.kind,
            names.plural,
            names.singular.clone().unwrap_or_default(),
            list(&names.short_names),
            list(&names.categories),
        ),
        format!("@scope {}", crd.spec.scope),
        format!(
            "@version {} served={} storage={}",
            version.name, version.served, version.storage
        ),
    ];
    let subresources = version.subresources.as_ref();
    if subresources.is_some_and(|s| s.status.is_some()) {
        lines.push("@subresource status".to_string());
    }
    if let Some(scale) = subresources.and_then(|s| s.scale.as_ref()) {
        lines.push(format!(
            "@subresource scale specReplicasPath={} statusReplicasPath={} labelSelectorPath={}",
            scale.spec_replicas_path,
            scale.status_replicas_path,
            scale.label_selector_path.clone().unwrap_or_default()
        ));
    }
    for column in version.additional_printer_columns.iter().flatten() {
        let format = column.format.as_ref().map(|f| format!(" format={f}"));
        let priority = column.priority.map(|p| format!(" priority={p}"));
        lines.push(format!(
            "@printerColumn {} {} {}{}{}",
            column.name,
            column.type_,
            column.json_path,
            format.unwrap_or_default(),
            priority.unwrap_or_default()
        ));
    }
    lines
}

#[test]
fn lws_crd_names_subresources_and_columns_are_upstreams() {
    let upstream: Vec<&str> = LWS_CRD
        .lines()
        .filter(|line| line.starts_with('@'))
        .collect();
    assert!(upstream.len() > 5, "the list reads as {upstream:?}");
    assert_eq!(crd_declarations(&LeaderWorkerSet::crd()), upstream);
}

#[test]
fn every_field_of_lws_v0_10_0_is_declared_as_upstream_declares_it() {
    let theirs: BTreeMap<String, String> = upstream(LWS_CRD)
        .into_iter()
        .filter(|field| !field.path.starts_with('@'))
        .map(|field| (field.path, field.declaration))
        .collect();
    assert!(theirs.len() > 2000, "the list reads as {theirs:?}");
    let ours: BTreeMap<String, String> = capstan(&LeaderWorkerSet::crd())
        .into_iter()
        .map(|(path, words)| (path, words.join(" ")))
        .collect();
    let mut problems = Vec::new();
    let mut used = BTreeSet::new();
    for path in theirs
        .keys()
        .chain(ours.keys().filter(|p| !theirs.contains_key(*p)))
    {
        let upstream = theirs.get(path).map(String::as_str);
        let deviation = LWS_DEVIATIONS.iter().find(|(p, _, _)| p == path);
        let expected = deviation.map(|(_, kept, _)| *kept).or(upstream);
        let declared = ours.get(path).map(String::as_str);
        if declared != expected {
            problems.push(format!(
                "{path}: upstream {upstream:?}, capstan {declared:?}"
            ));
        }
        if deviation.is_some() && declared != upstream {
            used.insert(path.as_str());
        }
    }
    assert_eq!(problems, Vec::<String>::new());
    // Every listed deviation is still one.
    let listed: BTreeSet<&str> = LWS_DEVIATIONS.iter().map(|(path, _, _)| *path).collect();
    assert_eq!(used, listed);
}

#[test]
fn pod_template_lists_merge_by_key_as_upstream_declares() {
    // The point of the markers: server-side apply merges these per entry.
    let ours = capstan(&LeaderWorkerSet::crd());
    let template = "spec.leaderWorkerTemplate.workerTemplate.spec";
    let cases = [
        ("containers", "listMapKeys=name"),
        ("containers[].ports", "listMapKeys=containerPort,protocol"),
        ("containers[].env", "listMapKeys=name"),
        ("containers[].volumeMounts", "listMapKeys=mountPath"),
        ("initContainers", "listMapKeys=name"),
        ("volumes", "listMapKeys=name"),
        ("imagePullSecrets", "listMapKeys=name"),
        ("tolerations", "listType=atomic"),
    ];
    for (field, keys) in cases {
        let path = format!("{template}.{field}");
        let words = ours.get(&path).unwrap_or_else(|| panic!("no {path}"));
        assert!(words.iter().any(|w| w == keys), "{path}: {words:?}");
    }
    let protocol = &ours[&format!("{template}.containers[].ports[].protocol")];
    assert!(
        protocol.contains(&r#"default="TCP""#.to_string()),
        "{protocol:?}"
    );
}
