//! What capstan does with the schemas of its kinds: the schemars transforms the kinds'
//! derives use on fields of Kubernetes' own types, and the strict field check that
//! manifests from Git go through against a CRD's structural schema.
//!
//! k8s-openapi's schemas of Kubernetes' types have the fields and their types, but not
//! what Kubernetes' OpenAPI adds from the Go markers: list and map types (how server-side
//! apply merges a list: `containers` by name, `ports` by port and protocol), defaults,
//! quantity patterns, the fields of an embedded `ObjectMeta`. [`kubernetes_markers`] adds
//! them from [`KUBERNETES_MARKERS`], so a CRD embedding a pod template declares it as the
//! CRD controller-gen makes for the same Go type.
//!
//! Nothing here knows a kind: the kinds use it, and the CRD list gathers the kinds.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps, JSONSchemaPropsOrArray, JSONSchemaPropsOrBool,
};
use schemars::transform::{RecursiveTransform, transform_subschemas};
use serde_json::{Map, Value, json};

/// Schema transform for fields of Kubernetes' own types (pod templates, volumes, env...):
/// drops the descriptions below the field, keeping the field's own.
///
/// Upstream's descriptions of those types would make the LeaderWorkerSet CRD about 690 kB,
/// too big for the `last-applied-configuration` annotation of a client-side
/// `kubectl apply` (256 kB); `kubectl explain` on the built-in kinds still has them.
pub(crate) fn drop_nested_descriptions(schema: &mut schemars::Schema) {
    let mut drop_description = RecursiveTransform(|schema: &mut schemars::Schema| {
        schema.remove("description");
    });
    transform_subschemas(&mut drop_description, schema);
}

/// What Kubernetes' OpenAPI declares of a field beyond its type and properties.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Marker {
    /// `x-kubernetes-list-type: atomic`: server-side apply replaces the list whole.
    AtomicList,
    /// `x-kubernetes-list-type: set`: apply merges the list as a set of scalars.
    SetList,
    /// `x-kubernetes-list-type: map` with these `x-kubernetes-list-map-keys`: apply merges
    /// the entries by key, so two managers can own different containers or ports.
    KeyedList(&'static [&'static str]),
    /// `x-kubernetes-map-type: atomic`: apply replaces the object whole.
    AtomicObject,
    /// `x-kubernetes-map-type: granular`: apply merges the object key by key.
    GranularObject,
    /// A default; a defaulted field is optional even where the Rust type is not.
    Default(Literal),
    /// A resource quantity: int-or-string, a string matching [`QUANTITY_PATTERN`].
    Quantity,
    /// A `metav1.ObjectMeta` inside a template: only `annotations`, `finalizers`, `labels`,
    /// `name` and `namespace`, and optional, as controller-gen's `generateEmbeddedObjectMeta`
    /// declares it (the API server sets the rest on the objects made from the template).
    EmbeddedObjectMeta,
    /// `minLength`.
    MinLength(i64),
    /// `maxLength`.
    MaxLength(i64),
    /// `pattern`.
    Pattern(&'static str),
    /// `minimum`.
    Minimum(i64),
    /// `enum` of strings.
    Enum(&'static [&'static str]),
    /// `x-kubernetes-preserve-unknown-fields: true`: an object of any fields, kept as
    /// written (a `runtime.RawExtension`), which the API server would otherwise prune empty.
    PreserveUnknownFields,
}

/// The value of a [`Marker::Default`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Literal {
    /// A string.
    Text(&'static str),
    /// A boolean.
    Bool(bool),
}

/// Kubernetes' pattern of a resource quantity (`500m`, `2Gi`, `1e3`).
pub(crate) const QUANTITY_PATTERN: &str = r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$";

/// The fields of a `metav1.ObjectMeta` inside a template, as controller-gen declares them.
const EMBEDDED_OBJECT_META_FIELDS: [&str; 5] =
    ["annotations", "finalizers", "labels", "name", "namespace"];

/// What Kubernetes' OpenAPI (v1.36) declares on the fields of a pod template, a
/// persistent volume claim and a claim retention policy that k8s-openapi's schemas leave
/// out. A row applies wherever its key ends the field's path: a key is a field name, or
/// the names above it where the name alone means different things (`values` is a set of
/// exit codes, but an atomic list in a selector requirement); `[]` is a list's entries and
/// `*` a map's values. Every row applies where it matches.
pub(crate) const KUBERNETES_MARKERS: &[(&str, &[Marker])] = {
    use Literal::{Bool, Text};
    use Marker::*;
    &[
        // Lists merged by key.
        ("containers", &[KeyedList(&["name"])]),
        ("initContainers", &[KeyedList(&["name"])]),
        ("ephemeralContainers", &[KeyedList(&["name"])]),
        ("env", &[KeyedList(&["name"])]),
        ("ports", &[KeyedList(&["containerPort", "protocol"])]),
        ("volumeMounts", &[KeyedList(&["mountPath"])]),
        ("volumeDevices", &[KeyedList(&["devicePath"])]),
        ("volumes", &[KeyedList(&["name"])]),
        ("imagePullSecrets", &[KeyedList(&["name"])]),
        ("hostAliases", &[KeyedList(&["ip"])]),
        ("resourceClaims", &[KeyedList(&["name"])]),
        ("resources.claims", &[KeyedList(&["name"])]),
        ("schedulingGates", &[KeyedList(&["name"])]),
        (
            "topologySpreadConstraints",
            &[KeyedList(&["topologyKey", "whenUnsatisfiable"])],
        ),
        ("status.conditions", &[KeyedList(&["type"])]),
        // Lists replaced whole.
        ("accessModes", &[AtomicList]),
        ("args", &[AtomicList]),
        ("capabilities.add", &[AtomicList]),
        ("capabilities.drop", &[AtomicList]),
        ("command", &[AtomicList]),
        ("dnsConfig.options", &[AtomicList]),
        ("envFrom", &[AtomicList]),
        ("hostnames", &[AtomicList]),
        ("httpHeaders", &[AtomicList]),
        ("items", &[AtomicList]),
        ("matchExpressions", &[AtomicList]),
        ("matchExpressions[].values", &[AtomicList]),
        ("matchFields", &[AtomicList]),
        ("matchFields[].values", &[AtomicList]),
        ("matchLabelKeys", &[AtomicList]),
        ("mismatchLabelKeys", &[AtomicList]),
        ("monitors", &[AtomicList]),
        ("nameservers", &[AtomicList]),
        ("namespaces", &[AtomicList]),
        ("nodeSelectorTerms", &[AtomicList]),
        ("portals", &[AtomicList]),
        (
            "preferredDuringSchedulingIgnoredDuringExecution",
            &[AtomicList],
        ),
        (
            "podAffinity.requiredDuringSchedulingIgnoredDuringExecution",
            &[AtomicList],
        ),
        (
            "podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution",
            &[AtomicList],
        ),
        ("readinessGates", &[AtomicList]),
        ("resizePolicy", &[AtomicList]),
        ("restartPolicyRules", &[AtomicList]),
        ("searches", &[AtomicList]),
        ("sources", &[AtomicList]),
        ("supplementalGroups", &[AtomicList]),
        ("sysctls", &[AtomicList]),
        ("targetWWNs", &[AtomicList]),
        ("tolerations", &[AtomicList]),
        ("wwids", &[AtomicList]),
        // Lists merged as sets.
        ("exitCodes.values", &[SetList]),
        // Objects replaced whole.
        ("configMap", &[AtomicObject]),
        ("configMapKeyRef", &[AtomicObject]),
        ("configMapRef", &[AtomicObject]),
        ("dataSource", &[AtomicObject]),
        ("fieldRef", &[AtomicObject]),
        ("fileKeyRef", &[AtomicObject]),
        ("imagePullSecrets[]", &[AtomicObject]),
        ("labelSelector", &[AtomicObject]),
        ("namespaceSelector", &[AtomicObject]),
        (
            "nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution",
            &[AtomicObject],
        ),
        ("nodePublishSecretRef", &[AtomicObject]),
        ("nodeSelector", &[AtomicObject]),
        ("nodeSelectorTerms[]", &[AtomicObject]),
        ("preference", &[AtomicObject]),
        ("resourceFieldRef", &[AtomicObject]),
        ("secretKeyRef", &[AtomicObject]),
        ("secretRef", &[AtomicObject]),
        ("selector", &[AtomicObject]),
        ("sources[].secret", &[AtomicObject]),
        // Objects merged key by key.
        ("allocatedResourceStatuses", &[GranularObject]),
        // Names of local object references, which Kubernetes defaults to "".
        ("configMap.name", &[Default(Text(""))]),
        ("configMapKeyRef.name", &[Default(Text(""))]),
        ("configMapRef.name", &[Default(Text(""))]),
        ("imagePullSecrets[].name", &[Default(Text(""))]),
        ("nodePublishSecretRef.name", &[Default(Text(""))]),
        ("secret.name", &[Default(Text(""))]),
        ("secretKeyRef.name", &[Default(Text(""))]),
        ("secretRef.name", &[Default(Text(""))]),
        // Other defaults.
        ("ports[].protocol", &[Default(Text("TCP"))]),
        ("grpc.service", &[Default(Text(""))]),
        ("fileKeyRef.optional", &[Default(Bool(false))]),
        ("azureDisk.fsType", &[Default(Text("ext4"))]),
        ("azureDisk.readOnly", &[Default(Bool(false))]),
        ("iscsi.iscsiInterface", &[Default(Text("default"))]),
        ("rbd.keyring", &[Default(Text("/etc/ceph/keyring"))]),
        ("rbd.pool", &[Default(Text("rbd"))]),
        ("rbd.user", &[Default(Text("admin"))]),
        ("scaleIO.fsType", &[Default(Text("xfs"))]),
        ("scaleIO.storageMode", &[Default(Text("ThinProvisioned"))]),
        // Quantities.
        ("allocatedResources.*", &[Quantity]),
        ("capacity.*", &[Quantity]),
        ("divisor", &[Quantity]),
        ("limits.*", &[Quantity]),
        ("overhead.*", &[Quantity]),
        ("requests.*", &[Quantity]),
        ("sizeLimit", &[Quantity]),
        // Object metadata of pod and claim templates.
        ("metadata", &[EmbeddedObjectMeta]),
    ]
};

/// What controller-gen declares on the fields of a `metav1.Condition` (its kubebuilder
/// markers), keyed as [`KUBERNETES_MARKERS`] below a list of conditions.
pub(crate) const CONDITION_MARKERS: &[(&str, &[Marker])] = {
    use Marker::*;
    &[
        ("message", &[MaxLength(32768)]),
        ("observedGeneration", &[Minimum(0)]),
        (
            "reason",
            &[
                MinLength(1),
                MaxLength(1024),
                Pattern("^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"),
            ],
        ),
        ("status", &[Enum(&["True", "False", "Unknown"])]),
        (
            "type",
            &[
                MaxLength(316),
                Pattern(
                    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$",
                ),
            ],
        ),
    ]
};

/// What Kubernetes' OpenAPI declares on a DeviceClass's `spec.config` that k8s-openapi's
/// schema leaves out: the opaque driver parameters are a `RawExtension`.
pub(crate) const DEVICE_CLASS_CONFIG_MARKERS: &[(&str, &[Marker])] =
    &[("opaque.parameters", &[Marker::PreserveUnknownFields])];

/// Schema transform for a list of DeviceClass configurations: adds the markers of
/// [`DEVICE_CLASS_CONFIG_MARKERS`], so the driver parameters survive the API server.
pub(crate) fn device_class_markers(schema: &mut schemars::Schema) {
    if let Some(node) = schema.as_object_mut() {
        mark(node, &mut Vec::new(), DEVICE_CLASS_CONFIG_MARKERS);
    }
}

/// Schema transform for fields of Kubernetes' own types: adds the markers of
/// [`KUBERNETES_MARKERS`] wherever they apply below the field.
pub(crate) fn kubernetes_markers(schema: &mut schemars::Schema) {
    if let Some(node) = schema.as_object_mut() {
        mark(node, &mut Vec::new(), KUBERNETES_MARKERS);
    }
}

/// Schema transform for a list of `metav1.Condition`: adds the markers of
/// [`CONDITION_MARKERS`] to its entries.
pub(crate) fn condition_markers(schema: &mut schemars::Schema) {
    if let Some(node) = schema.as_object_mut() {
        mark(node, &mut Vec::new(), CONDITION_MARKERS);
    }
}

/// The markers of `table` whose keys end `path`.
fn markers_at<'t>(
    path: &[String],
    table: &'t [(&str, &[Marker])],
) -> impl Iterator<Item = &'t Marker> {
    table
        .iter()
        .filter(|(key, _)| key_ends(path, key))
        .flat_map(|(_, markers)| markers.iter())
}

/// Whether the segments of `key` (`ports[].protocol`) are the last ones of `path`.
pub(crate) fn key_ends(path: &[String], key: &str) -> bool {
    let segments: Vec<&str> = key.split('.').collect();
    path.len() >= segments.len()
        && path[path.len() - segments.len()..]
            .iter()
            .zip(&segments)
            .all(|(have, want)| have == want)
}

/// Applies the markers of `table` to `node`, whose path is `path`, and below it.
fn mark(node: &mut Map<String, Value>, path: &mut Vec<String>, table: &[(&str, &[Marker])]) {
    for marker in markers_at(path, table) {
        apply(*marker, node);
    }
    // kube's derive marks every optional int-or-string nullable unless it says otherwise;
    // Kubernetes' are not nullable, so a null is dropped and defaulted, not kept.
    if node.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true)) {
        node.insert("nullable".to_string(), Value::Bool(false));
    }
    let mut optional = Vec::new();
    if let Some(Value::Object(properties)) = node.get_mut("properties") {
        for (name, property) in properties.iter_mut() {
            let Value::Object(property) = property else {
                continue;
            };
            path.push(name.clone());
            if markers_at(path, table)
                .any(|marker| matches!(marker, Marker::Default(_) | Marker::EmbeddedObjectMeta))
            {
                optional.push(name.clone());
            }
            mark(property, path, table);
            path.pop();
        }
    }
    if let Some(Value::Array(required)) = node.get_mut("required") {
        required.retain(|name| !optional.iter().any(|o| Some(o.as_str()) == name.as_str()));
        if required.is_empty() {
            node.remove("required");
        }
    }
    if let Some(Value::Object(items)) = node.get_mut("items") {
        let list = path.pop();
        path.push(format!("{}[]", list.as_deref().unwrap_or_default()));
        mark(items, path, table);
        path.pop();
        path.extend(list);
    }
    if let Some(Value::Object(values)) = node.get_mut("additionalProperties") {
        path.push("*".to_string());
        mark(values, path, table);
        path.pop();
    }
}

fn apply(marker: Marker, node: &mut Map<String, Value>) {
    let mut set = |key: &str, value: Value| {
        node.insert(key.to_string(), value);
    };
    match marker {
        Marker::AtomicList => set("x-kubernetes-list-type", json!("atomic")),
        Marker::SetList => set("x-kubernetes-list-type", json!("set")),
        Marker::KeyedList(keys) => {
            set("x-kubernetes-list-type", json!("map"));
            set("x-kubernetes-list-map-keys", json!(keys));
        }
        Marker::AtomicObject => set("x-kubernetes-map-type", json!("atomic")),
        Marker::GranularObject => set("x-kubernetes-map-type", json!("granular")),
        Marker::Default(Literal::Text(text)) => set("default", json!(text)),
        Marker::Default(Literal::Bool(value)) => set("default", json!(value)),
        Marker::Quantity => set("pattern", json!(QUANTITY_PATTERN)),
        Marker::MinLength(length) => set("minLength", json!(length)),
        Marker::MaxLength(length) => set("maxLength", json!(length)),
        Marker::Pattern(pattern) => set("pattern", json!(pattern)),
        Marker::Minimum(minimum) => set("minimum", json!(minimum)),
        Marker::Enum(values) => set("enum", json!(values)),
        Marker::PreserveUnknownFields => set("x-kubernetes-preserve-unknown-fields", json!(true)),
        Marker::EmbeddedObjectMeta => {
            if let Some(Value::Object(properties)) = node.get_mut("properties") {
                properties.retain(|name, _| EMBEDDED_OBJECT_META_FIELDS.contains(&name.as_str()));
            }
        }
    }
}

/// The fields of `object` that `crd`'s schema does not declare, as dotted paths
/// (`spec.moduleLoader.container.kernelMapping`, `spec.modules[0].confg`).
///
/// An API server would silently drop these (pruning); capstan reports them instead so a
/// misspelt field in Git is an error, not a no-op. The schema of the version named by the
/// object's `apiVersion` is used, else the storage version. `apiVersion`, `kind` and
/// `metadata` at the root are not checked here, nor anything below a field whose schema
/// preserves unknown fields. An empty result means the object is clean.
pub fn unknown_fields(crd: &CustomResourceDefinition, object: &Value) -> Vec<String> {
    let api_version = object.get("apiVersion").and_then(Value::as_str);
    let versions = &crd.spec.versions;
    let version = versions
        .iter()
        .find(|v| api_version == Some(format!("{}/{}", crd.spec.group, v.name).as_str()))
        .or_else(|| versions.iter().find(|v| v.storage))
        .or_else(|| versions.first());
    let Some(schema) = version
        .and_then(|v| v.schema.as_ref())
        .and_then(|s| s.open_api_v3_schema.as_ref())
    else {
        return Vec::new();
    };
    let mut unknown = Vec::new();
    collect_unknown(schema, object, "", true, &mut unknown);
    unknown
}

/// Walks `value` along `schema`, pushing the paths of undeclared object fields.
pub(crate) fn collect_unknown(
    schema: &JSONSchemaProps,
    value: &Value,
    path: &str,
    resource_root: bool,
    unknown: &mut Vec<String>,
) {
    if schema.x_kubernetes_int_or_string == Some(true) {
        return;
    }
    let preserves = schema.x_kubernetes_preserve_unknown_fields == Some(true);
    // Resource roots carry apiVersion/kind/metadata, which the API server checks itself.
    let implicit = resource_root || schema.x_kubernetes_embedded_resource == Some(true);
    match value {
        Value::Object(fields) => {
            let additional = match &schema.additional_properties {
                Some(JSONSchemaPropsOrBool::Schema(additional)) => Some(additional.as_ref()),
                _ => None,
            };
            for (name, field) in fields {
                let field_path = if path.is_empty() {
                    name.clone()
                } else {
                    format!("{path}.{name}")
                };
                if implicit && matches!(name.as_str(), "apiVersion" | "kind" | "metadata") {
                    continue;
                }
                match (
                    schema.properties.as_ref().and_then(|p| p.get(name)),
                    additional,
                ) {
                    (Some(property), _) | (None, Some(property)) => {
                        collect_unknown(property, field, &field_path, false, unknown)
                    }
                    // An object schema without properties is free-form, as for `metadata`.
                    (None, None) if preserves || schema.properties.is_none() => {}
                    (None, None) => unknown.push(field_path),
                }
            }
        }
        Value::Array(items) => {
            if let Some(JSONSchemaPropsOrArray::Schema(item_schema)) = &schema.items {
                for (index, item) in items.iter().enumerate() {
                    collect_unknown(
                        item_schema,
                        item,
                        &format!("{path}[{index}]"),
                        false,
                        unknown,
                    );
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LeaderWorkerSet;
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSONSchemaPropsOrArray;
    use kube::CustomResourceExt;

    #[test]
    fn nested_descriptions_go_and_the_fields_own_stays() {
        let mut schema = schemars::Schema::try_from(json!({
            "description": "the field",
            "type": "object",
            "properties": {
                "image": {"description": "nested", "type": "string"},
                "env": {"type": "array", "items": {"description": "nested too", "type": "object"}}
            }
        }))
        .expect("a schema object");
        drop_nested_descriptions(&mut schema);
        assert_eq!(
            schema.as_value(),
            &json!({
                "description": "the field",
                "type": "object",
                "properties": {
                    "image": {"type": "string"},
                    "env": {"type": "array", "items": {"type": "object"}}
                }
            })
        );
    }

    #[test]
    fn keys_match_the_end_of_a_path() {
        let path: Vec<String> = ["spec", "containers[]", "ports[]", "protocol"]
            .map(String::from)
            .to_vec();
        let cases = [
            ("protocol", true),
            ("ports[].protocol", true),
            ("spec.containers[].ports[].protocol", true),
            ("ports.protocol", false),
            ("port", false),
            ("containers[].protocol", false),
            ("x.spec.containers[].ports[].protocol", false),
        ];
        for (key, expected) in cases {
            assert_eq!(key_ends(&path, key), expected, "{key}");
        }
    }

    #[test]
    fn markers_are_added_where_their_keys_end_the_path() {
        let mut schema = schemars::Schema::try_from(json!({
            "type": "object",
            "properties": {
                "metadata": {
                    "type": "object",
                    "properties": {"name": {"type": "string"}, "uid": {"type": "string"}}
                },
                "containers": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "name": {"type": "string"},
                            "ports": {
                                "type": "array",
                                "items": {
                                    "type": "object",
                                    "properties": {
                                        "containerPort": {"type": "integer"},
                                        "protocol": {"type": "string"}
                                    },
                                    "required": ["containerPort", "protocol"]
                                }
                            },
                            "resources": {
                                "type": "object",
                                "properties": {
                                    "limits": {
                                        "type": "object",
                                        "additionalProperties": {"x-kubernetes-int-or-string": true}
                                    }
                                }
                            }
                        },
                        "required": ["name"]
                    }
                }
            },
            "required": ["metadata"]
        }))
        .expect("a schema object");
        kubernetes_markers(&mut schema);
        assert_eq!(
            schema.as_value(),
            &json!({
                "type": "object",
                "properties": {
                    "metadata": {
                        "type": "object",
                        "properties": {"name": {"type": "string"}}
                    },
                    "containers": {
                        "type": "array",
                        "x-kubernetes-list-type": "map",
                        "x-kubernetes-list-map-keys": ["name"],
                        "items": {
                            "type": "object",
                            "properties": {
                                "name": {"type": "string"},
                                "ports": {
                                    "type": "array",
                                    "x-kubernetes-list-type": "map",
                                    "x-kubernetes-list-map-keys": ["containerPort", "protocol"],
                                    "items": {
                                        "type": "object",
                                        "properties": {
                                            "containerPort": {"type": "integer"},
                                            "protocol": {"type": "string", "default": "TCP"}
                                        },
                                        "required": ["containerPort"]
                                    }
                                },
                                "resources": {
                                    "type": "object",
                                    "properties": {
                                        "limits": {
                                            "type": "object",
                                            "additionalProperties": {
                                                "x-kubernetes-int-or-string": true,
                                                "nullable": false,
                                                "pattern": QUANTITY_PATTERN
                                            }
                                        }
                                    }
                                }
                            },
                            "required": ["name"]
                        }
                    }
                }
            })
        );
    }

    /// Every path of `schema` and below, in the segments the marker keys use.
    fn paths(schema: &JSONSchemaProps, path: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
        out.push(path.clone());
        for (name, property) in schema.properties.iter().flatten() {
            path.push(name.clone());
            paths(property, path, out);
            path.pop();
        }
        if let Some(JSONSchemaPropsOrArray::Schema(items)) = &schema.items {
            let list = path.pop();
            path.push(format!("{}[]", list.as_deref().unwrap_or_default()));
            paths(items, path, out);
            path.pop();
            path.extend(list);
        }
        if let Some(JSONSchemaPropsOrBool::Schema(values)) = &schema.additional_properties {
            path.push("*".to_string());
            paths(values, path, out);
            path.pop();
        }
    }

    #[test]
    fn every_marker_row_applies_somewhere_in_the_lws_crd() {
        let crd = LeaderWorkerSet::crd();
        let root = crd.spec.versions[0]
            .schema
            .as_ref()
            .and_then(|s| s.open_api_v3_schema.as_ref())
            .expect("a schema");
        let mut all = Vec::new();
        paths(root, &mut Vec::new(), &mut all);
        let unused: Vec<&str> = KUBERNETES_MARKERS
            .iter()
            .chain(CONDITION_MARKERS)
            .map(|(key, _)| *key)
            .filter(|key| !all.iter().any(|path| key_ends(path, key)))
            .collect();
        assert_eq!(unused, Vec::<&str>::new());
    }
}
