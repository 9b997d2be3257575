//! How lists inside an object merge: the knowledge that strategic merge patch
//! (`patchStrategy`/`patchMergeKey`) and server-side apply (`x-kubernetes-list-type`,
//! `x-kubernetes-list-map-keys`) need about a kind's schema.
//!
//! Paths are the field names from the object root with list indices left out, so
//! `spec.containers[2].env[0]` is `["spec", "containers", "env"]`.

use serde_json::Value;

use crate::pointer::Pointer;

/// How a list field merges.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ListType {
    /// Replaced whole (`x-kubernetes-list-type: atomic`, or no patch strategy).
    Atomic,
    /// A set of scalars, merged by value (`x-kubernetes-list-type: set`, finalizers).
    Set,
    /// A list of objects keyed by these fields (`x-kubernetes-list-type: map`).
    Map(Vec<String>),
}

impl ListType {
    fn map(keys: &[&str]) -> Self {
        ListType::Map(keys.iter().map(|k| (*k).to_string()).collect())
    }
}

/// Answers how the list at `path` merges, for one kind.
pub trait FieldSchema: Send + Sync {
    /// The list type of the field at `path` (field names only, no indices).
    fn list_type(&self, path: &[&str]) -> ListType;

    /// The key strategic merge patch uses for a keyed list: upstream `patchMergeKey` is a
    /// single field, the first of the server-side apply keys.
    fn merge_key(&self, path: &[&str]) -> Option<String> {
        match self.list_type(path) {
            ListType::Map(keys) => keys.into_iter().next(),
            _ => None,
        }
    }
}

/// The list types of the built-in Kubernetes kinds the embedded cluster serves, as
/// their Go types declare them. Lists not named here are atomic, as upstream (for
/// example `tolerations` and node `taints` are replaced whole by every patch type).
#[derive(Clone, Copy, Debug, Default)]
pub struct BuiltinSchema;

impl FieldSchema for BuiltinSchema {
    fn list_type(&self, path: &[&str]) -> ListType {
        let Some((&last, parents)) = path.split_last() else {
            return ListType::Atomic;
        };
        let parent = parents.last().copied().unwrap_or("");
        match (parent, last) {
            ("metadata", "finalizers") => ListType::Set,
            ("metadata", "ownerReferences") => ListType::map(&["uid"]),
            // PodSpec, wherever it is embedded (Pod, templates of workloads).
            ("spec", "containers" | "initContainers" | "ephemeralContainers")
            | ("spec", "volumes" | "imagePullSecrets" | "resourceClaims" | "schedulingGates") => {
                ListType::map(&["name"])
            }
            ("spec", "hostAliases") => ListType::map(&["ip"]),
            ("spec", "topologySpreadConstraints") => {
                ListType::map(&["topologyKey", "whenUnsatisfiable"])
            }
            // Container fields.
            ("containers" | "initContainers" | "ephemeralContainers", "env") => {
                ListType::map(&["name"])
            }
            ("containers" | "initContainers" | "ephemeralContainers", "ports") => {
                ListType::map(&["containerPort", "protocol"])
            }
            ("containers" | "initContainers" | "ephemeralContainers", "volumeMounts") => {
                ListType::map(&["mountPath"])
            }
            ("containers" | "initContainers" | "ephemeralContainers", "volumeDevices") => {
                ListType::map(&["devicePath"])
            }
            // Service ports.
            ("spec", "ports") => ListType::map(&["port", "protocol"]),
            // Statuses: conditions by type everywhere, addresses and IPs by their key.
            ("status", "conditions") => ListType::map(&["type"]),
            ("status", "addresses") => ListType::map(&["type"]),
            ("status", "podIPs" | "hostIPs") => ListType::map(&["ip"]),
            _ => ListType::Atomic,
        }
    }
}

/// The list types of a custom resource, read from its CRD's `openAPIV3Schema`
/// (`x-kubernetes-list-type` and `x-kubernetes-list-map-keys`); lists the schema does
/// not describe are atomic, as on a real API server.
#[derive(Clone, Debug)]
pub struct CrdSchema {
    root: Value,
}

impl CrdSchema {
    /// Wraps a version's `schema.openAPIV3Schema`.
    pub fn new(open_api_v3_schema: Value) -> Self {
        CrdSchema {
            root: open_api_v3_schema,
        }
    }

    fn node(&self, path: &[&str]) -> Option<&Value> {
        let mut node = &self.root;
        for name in path {
            node = step_into_items(node);
            node = match node.at(&format!("/properties/{}", escape(name))) {
                Some(child) => child,
                None => node.get("additionalProperties").filter(|v| v.is_object())?,
            };
        }
        Some(node)
    }
}

fn step_into_items(mut node: &Value) -> &Value {
    while node.get("type").and_then(Value::as_str) == Some("array") {
        match node.get("items") {
            Some(items) => node = items,
            None => break,
        }
    }
    node
}

fn escape(name: &str) -> String {
    name.replace('~', "~0").replace('/', "~1")
}

impl FieldSchema for CrdSchema {
    fn list_type(&self, path: &[&str]) -> ListType {
        let Some(node) = self.node(path) else {
            return ListType::Atomic;
        };
        match node.get("x-kubernetes-list-type").and_then(Value::as_str) {
            Some("set") => ListType::Set,
            Some("map") => {
                let keys = node
                    .get("x-kubernetes-list-map-keys")
                    .and_then(Value::as_array)
                    .map(|keys| {
                        keys.iter()
                            .filter_map(Value::as_str)
                            .map(str::to_string)
                            .collect::<Vec<_>>()
                    })
                    .unwrap_or_default();
                if keys.is_empty() {
                    ListType::Atomic
                } else {
                    ListType::Map(keys)
                }
            }
            _ => ListType::Atomic,
        }
    }
}

/// A schema for custom resources that also knows the metadata lists every object has.
pub struct WithMetadata<S>(pub S);

impl<S: FieldSchema> FieldSchema for WithMetadata<S> {
    fn list_type(&self, path: &[&str]) -> ListType {
        match path {
            ["metadata", ..] => BuiltinSchema.list_type(path),
            _ => self.0.list_type(path),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn builtin_lists_merge_as_upstream_declares() {
        let cases: &[(&[&str], ListType)] = &[
            (&["spec", "containers"], ListType::map(&["name"])),
            (
                &["spec", "template", "spec", "containers"],
                ListType::map(&["name"]),
            ),
            (&["spec", "containers", "env"], ListType::map(&["name"])),
            (&["spec", "volumes"], ListType::map(&["name"])),
            (&["spec", "tolerations"], ListType::Atomic),
            (&["spec", "taints"], ListType::Atomic),
            (&["status", "conditions"], ListType::map(&["type"])),
            (&["metadata", "finalizers"], ListType::Set),
            (&["spec", "containers", "args"], ListType::Atomic),
        ];
        for (path, want) in cases {
            assert_eq!(&BuiltinSchema.list_type(path), want, "{path:?}");
        }
        assert_eq!(
            BuiltinSchema
                .merge_key(&["spec", "containers", "ports"])
                .as_deref(),
            Some("containerPort")
        );
    }

    #[test]
    fn crd_lists_follow_x_kubernetes_list_type() {
        let schema = CrdSchema::new(json!({
            "type": "object",
            "properties": {
                "spec": {"type": "object", "properties": {
                    "modules": {"type": "array", "x-kubernetes-list-type": "map",
                        "x-kubernetes-list-map-keys": ["name", "namespace"],
                        "items": {"type": "object", "properties": {
                            "tags": {"type": "array", "x-kubernetes-list-type": "set",
                                     "items": {"type": "string"}}}}},
                    "plain": {"type": "array", "items": {"type": "string"}}
                }}
            }
        }));
        assert_eq!(
            schema.list_type(&["spec", "modules"]),
            ListType::map(&["name", "namespace"])
        );
        assert_eq!(
            schema.list_type(&["spec", "modules", "tags"]),
            ListType::Set
        );
        assert_eq!(schema.list_type(&["spec", "plain"]), ListType::Atomic);
        assert_eq!(schema.list_type(&["spec", "missing"]), ListType::Atomic);
        assert_eq!(
            WithMetadata(schema).list_type(&["metadata", "finalizers"]),
            ListType::Set
        );
    }
}
