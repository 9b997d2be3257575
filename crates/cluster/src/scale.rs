//! The `/scale` subresource: a workload seen as an autoscaling/v1 `Scale` (its desired
//! and observed replicas and the selector of its pods), and a `Scale` written back as
//! the workload's desired replicas. kube-apiserver serves it for Deployments,
//! ReplicaSets, StatefulSets and ReplicationControllers, and for the custom resources
//! whose CRD version declares `subresources.scale`, each through its own paths.
//!
//! What is here is pure: where a kind keeps its replicas and selector, the `Scale` an
//! object shows, the object a new replica count makes. The verbs are in
//! [`api`](crate::api); the managed fields of a scale write in
//! [`patch::apply`](crate::patch::apply).

use serde_json::{Map, Value, json};

use crate::pointer::Pointer;
use crate::selector::LabelSelector;

/// The `apiVersion` of a `Scale`.
pub const API_VERSION: &str = "autoscaling/v1";

/// `Scale.spec.replicas` upstream gives a custom resource without replicas at its
/// `specReplicasPath`, so that a write which sets none can be told apart and refused.
pub const UNSET_REPLICAS: i64 = i32::MIN as i64;

/// Where a kind keeps what its `Scale` shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScaleSubresource {
    /// The desired replicas, the one field a scale write changes (`.spec.replicas`).
    pub spec_replicas: FieldPath,
    /// The observed replicas (`.status.replicas`).
    pub status_replicas: FieldPath,
    /// The selector of the pods the replicas count.
    pub selector: PodSelector,
}

/// A field named by a CRD's dotted path, `.spec.replicas`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldPath {
    /// As the CRD writes it, for messages.
    pub text: String,
    /// The field names from the object's root.
    pub names: Vec<String>,
}

/// Where a kind keeps the selector of its pods, and in what form.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PodSelector {
    /// A `metav1.LabelSelector` at `spec.selector` (Deployment, ReplicaSet, StatefulSet).
    LabelSelector,
    /// A map of labels at `spec.selector` (ReplicationController).
    Labels,
    /// The selector as text at a CRD's `labelSelectorPath`; none without one.
    Text(Option<FieldPath>),
}

/// Why an object has no `Scale`, or a `Scale` makes no object.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScaleError {
    /// A custom resource without replicas at its `specReplicasPath`.
    #[error("the spec replicas field {path:?} does not exist")]
    NoSpecReplicas { path: String },
    /// A write that left a custom resource without replicas.
    #[error("the spec replicas field {path:?} cannot be empty")]
    EmptySpecReplicas { path: String },
    /// A field of the wrong type at one of the CRD's paths, in upstream's
    /// `unstructured.NestedInt64`/`NestedString` words.
    #[error("{path} accessor error: {value} is of the type {go_type}, expected {expected}")]
    WrongType {
        path: String,
        value: String,
        go_type: &'static str,
        expected: &'static str,
    },
    /// A parent of the replicas field that is not an object.
    #[error("value cannot be set because {path} is not a map[string]interface{{}}")]
    NotAnObject { path: String },
    /// A built-in workload's selector that does not parse.
    #[error("{0}")]
    Selector(String),
}

/// A `Scale` as a read shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct ScaleView {
    pub scale: Value,
    /// Whether the object has replicas at the spec path (custom resources may not).
    pub has_spec_replicas: bool,
}

impl FieldPath {
    /// Reads a CRD's path: a leading `.` is dropped and the rest split at each `.`.
    pub fn parse(text: &str) -> Self {
        FieldPath {
            text: text.to_string(),
            names: text
                .strip_prefix('.')
                .unwrap_or(text)
                .split('.')
                .map(str::to_string)
                .collect(),
        }
    }

    fn of(names: &[&str]) -> Self {
        FieldPath {
            text: format!(".{}", names.join(".")),
            names: names.iter().map(|name| (*name).to_string()).collect(),
        }
    }

    /// The value at the path, if every step is there.
    pub fn find<'a>(&self, object: &'a Value) -> Option<&'a Value> {
        self.names
            .iter()
            .try_fold(object, |value, name| value.as_object()?.get(name))
    }

    /// The names as `&str`, for the field set walkers.
    pub fn names(&self) -> Vec<&str> {
        self.names.iter().map(String::as_str).collect()
    }

    /// The integer at the path: `Ok(None)` when absent, as `unstructured.NestedInt64`.
    pub fn integer(&self, object: &Value) -> Result<Option<i64>, ScaleError> {
        match self.find(object) {
            None | Some(Value::Null) => Ok(None),
            Some(value) => value
                .as_i64()
                .map(Some)
                .ok_or_else(|| self.wrong_type(value, "int64")),
        }
    }

    /// The string at the path: `Ok(None)` when absent, as `unstructured.NestedString`.
    pub fn text(&self, object: &Value) -> Result<Option<String>, ScaleError> {
        match self.find(object) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(text)) => Ok(Some(text.clone())),
            Some(value) => Err(self.wrong_type(value, "string")),
        }
    }

    fn wrong_type(&self, value: &Value, expected: &'static str) -> ScaleError {
        let (go_type, value) = match value {
            Value::Bool(b) => ("bool", b.to_string()),
            Value::Number(n) if n.is_f64() => ("float64", n.to_string()),
            Value::Number(n) => ("int64", n.to_string()),
            Value::String(s) => ("string", s.clone()),
            Value::Array(_) => ("[]interface {}", value.to_string()),
            _ => ("map[string]interface {}", value.to_string()),
        };
        ScaleError::WrongType {
            path: format!(".{}", self.names.join(".")),
            value,
            go_type,
            expected,
        }
    }
}

impl ScaleSubresource {
    /// The scale subresource of a built-in kind, for those that have one.
    pub fn builtin(group: &str, plural: &str) -> Option<Self> {
        let selector = match (group, plural) {
            ("apps", "deployments" | "replicasets" | "statefulsets") => PodSelector::LabelSelector,
            ("", "replicationcontrollers") => PodSelector::Labels,
            _ => return None,
        };
        Some(ScaleSubresource {
            spec_replicas: FieldPath::of(&["spec", "replicas"]),
            status_replicas: FieldPath::of(&["status", "replicas"]),
            selector,
        })
    }

    /// The `subresources.scale` of one version of a CRD (`spec.versions[i]`), if it
    /// declares one with both replica paths.
    pub fn of_crd_version(version: &Value) -> Option<Self> {
        let scale = version.at("/subresources/scale")?;
        let path = |field: &str| scale.get(field).and_then(Value::as_str);
        Some(ScaleSubresource {
            spec_replicas: FieldPath::parse(path("specReplicasPath")?),
            status_replicas: FieldPath::parse(path("statusReplicasPath")?),
            selector: PodSelector::Text(
                path("labelSelectorPath")
                    .filter(|p| !p.is_empty())
                    .map(FieldPath::parse),
            ),
        })
    }

    /// The `Scale` of `object`, as kube-apiserver builds it: the object's name,
    /// namespace, uid, resourceVersion and creation time, `spec.replicas` (left out when
    /// 0, as Go omits it), `status.replicas` and `status.selector` (left out when empty).
    ///
    /// Fails when a field at one of the paths has the wrong type, or a built-in
    /// workload's selector does not parse.
    pub fn view(&self, object: &Value) -> Result<ScaleView, ScaleError> {
        let spec_replicas = self.spec_replicas.integer(object)?;
        let status_replicas = self.status_replicas.integer(object)?.unwrap_or(0);
        let selector = self.selector_text(object)?;
        let mut metadata = Map::new();
        for field in [
            "name",
            "namespace",
            "uid",
            "resourceVersion",
            "creationTimestamp",
        ] {
            if let Some(value) = object.at(&format!("/metadata/{field}"))
                && !value.is_null()
                && value != ""
            {
                metadata.insert(field.into(), value.clone());
            }
        }
        let mut spec = Map::new();
        let replicas = spec_replicas.unwrap_or(0);
        if replicas != 0 {
            spec.insert("replicas".into(), json!(go_int32(replicas)));
        }
        let mut status = Map::new();
        status.insert("replicas".into(), json!(go_int32(status_replicas)));
        if !selector.is_empty() {
            status.insert("selector".into(), json!(selector));
        }
        Ok(ScaleView {
            scale: json!({
                "kind": "Scale", "apiVersion": API_VERSION, "metadata": metadata,
                "spec": spec, "status": status,
            }),
            has_spec_replicas: spec_replicas.is_some(),
        })
    }

    /// `object` with `replicas` at the spec path, the objects on the way made as needed.
    ///
    /// Fails when a parent on the way is not an object.
    pub fn with_replicas(&self, mut object: Value, replicas: i64) -> Result<Value, ScaleError> {
        let mut target = &mut object;
        let (last, parents) =
            self.spec_replicas
                .names
                .split_last()
                .ok_or_else(|| ScaleError::NotAnObject {
                    path: self.spec_replicas.text.clone(),
                })?;
        for (depth, name) in parents.iter().enumerate() {
            let not_an_object = || ScaleError::NotAnObject {
                path: format!(".{}", self.spec_replicas.names[..=depth].join(".")),
            };
            let fields = target.as_object_mut().ok_or_else(not_an_object)?;
            let child = fields
                .entry(name.clone())
                .or_insert_with(|| Value::Object(Map::new()));
            if child.is_null() {
                *child = Value::Object(Map::new());
            }
            if !child.is_object() {
                return Err(not_an_object());
            }
            target = child;
        }
        let fields = target
            .as_object_mut()
            .ok_or_else(|| ScaleError::NotAnObject {
                path: self.spec_replicas.text.clone(),
            })?;
        fields.insert(last.clone(), json!(replicas));
        Ok(object)
    }

    /// The selector as `status.selector` shows it.
    fn selector_text(&self, object: &Value) -> Result<String, ScaleError> {
        match &self.selector {
            PodSelector::LabelSelector => LabelSelector::from_object(object.at("/spec/selector"))
                .map(|selector| selector.map(|s| s.to_string()).unwrap_or_default())
                .map_err(|err| ScaleError::Selector(err.to_string())),
            PodSelector::Labels => {
                let labels = object
                    .at("/spec/selector")
                    .filter(|labels| labels.is_object())
                    .cloned();
                LabelSelector::from_object(labels.map(|l| json!({"matchLabels": l})).as_ref())
                    .map(|selector| selector.map(|s| s.to_string()).unwrap_or_default())
                    .map_err(|err| ScaleError::Selector(err.to_string()))
            }
            PodSelector::Text(None) => Ok(String::new()),
            PodSelector::Text(Some(path)) => Ok(path.text(object)?.unwrap_or_default()),
        }
    }
}

/// `int32(n)` as Go converts it: the low 32 bits.
fn go_int32(n: i64) -> i32 {
    n as i32
}

/// `Scale.spec.replicas` of a `Scale` a client wrote: absent is 0, as Go reads it.
pub fn spec_replicas(scale: &Value) -> i64 {
    scale
        .at("/spec/replicas")
        .and_then(Value::as_i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lws() -> ScaleSubresource {
        ScaleSubresource::of_crd_version(&json!({"name": "v1", "subresources": {"scale": {
            "specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas",
            "labelSelectorPath": ".status.hpaPodSelector"}}}))
        .expect("declared")
    }

    fn deployments() -> ScaleSubresource {
        ScaleSubresource::builtin("apps", "deployments").expect("scalable")
    }

    #[test]
    fn kinds_with_a_scale_subresource() {
        let cases = [
            ("apps", "deployments", true),
            ("apps", "replicasets", true),
            ("apps", "statefulsets", true),
            ("", "replicationcontrollers", true),
            ("apps", "daemonsets", false),
            ("", "pods", false),
        ];
        for (group, plural, scalable) in cases {
            assert_eq!(
                ScaleSubresource::builtin(group, plural).is_some(),
                scalable,
                "{group}/{plural}"
            );
        }
        let declared = lws();
        assert_eq!(declared.spec_replicas.names, ["spec", "replicas"]);
        assert_eq!(
            declared.selector,
            PodSelector::Text(Some(FieldPath::parse(".status.hpaPodSelector")))
        );
        assert!(
            ScaleSubresource::of_crd_version(&json!({"subresources": {"status": {}}})).is_none()
        );
    }

    /// The `Scale` of each kind, as kube-apiserver answers it (checked against 1.36).
    #[test]
    fn scales_show_what_kube_apiserver_shows() {
        let meta = json!({"name": "web", "namespace": "default", "uid": "u1",
                          "resourceVersion": "7", "creationTimestamp": "2026-01-01T00:00:00Z",
                          "labels": {"a": "b"}, "generation": 3});
        let scale = |spec: Value, status: Value| {
            json!({"kind": "Scale", "apiVersion": "autoscaling/v1",
                   "metadata": {"name": "web", "namespace": "default", "uid": "u1",
                                "resourceVersion": "7", "creationTimestamp": "2026-01-01T00:00:00Z"},
                   "spec": spec, "status": status})
        };
        let rc = ScaleSubresource::builtin("", "replicationcontrollers").expect("scalable");
        #[rustfmt::skip]
        let cases: Vec<(&str, ScaleSubresource, Value, Result<Value, ScaleError>)> = vec![
            ("a deployment", deployments(),
             json!({"metadata": meta, "spec": {"replicas": 3, "selector": {
                 "matchLabels": {"app": "web"},
                 "matchExpressions": [{"key": "tier", "operator": "In", "values": ["b", "a"]}]}},
                 "status": {"replicas": 2}}),
             Ok(scale(json!({"replicas": 3}), json!({"replicas": 2, "selector": "app=web,tier in (a,b)"})))),
            ("zero replicas are left out of the spec, not the status", deployments(),
             json!({"metadata": meta, "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "web"}}}}),
             Ok(scale(json!({}), json!({"replicas": 0, "selector": "app=web"})))),
            ("a selector that selects everything is left out", deployments(),
             json!({"metadata": meta, "spec": {"replicas": 1, "selector": {}}}),
             Ok(scale(json!({"replicas": 1}), json!({"replicas": 0})))),
            ("a replication controller's selector is a map", rc,
             json!({"metadata": meta, "spec": {"replicas": 2, "selector": {"b": "2", "a": "1"}}}),
             Ok(scale(json!({"replicas": 2}), json!({"replicas": 0, "selector": "a=1,b=2"})))),
            ("a leader worker set", lws(),
             json!({"metadata": meta, "spec": {"replicas": 2},
                    "status": {"replicas": 1, "hpaPodSelector": "leaderworkerset.sigs.k8s.io/name=vllm"}}),
             Ok(scale(json!({"replicas": 2}),
                      json!({"replicas": 1, "selector": "leaderworkerset.sigs.k8s.io/name=vllm"})))),
            ("a custom resource's replicas of the wrong type", lws(),
             json!({"metadata": meta, "spec": {"replicas": "2"}}),
             Err(ScaleError::WrongType { path: ".spec.replicas".into(), value: "2".into(),
                                         go_type: "string", expected: "int64" })),
            ("a custom resource's selector of the wrong type", lws(),
             json!({"metadata": meta, "spec": {"replicas": 2}, "status": {"hpaPodSelector": 1}}),
             Err(ScaleError::WrongType { path: ".status.hpaPodSelector".into(), value: "1".into(),
                                         go_type: "int64", expected: "string" })),
        ];
        for (name, subresource, object, want) in cases {
            assert_eq!(
                subresource.view(&object).map(|view| view.scale),
                want,
                "{name}"
            );
        }
        let view = lws()
            .view(&json!({"metadata": meta, "spec": {}}))
            .expect("view");
        assert!(!view.has_spec_replicas);
        assert_eq!(view.scale["spec"], json!({}));
    }

    #[test]
    fn new_replicas_land_at_the_spec_path() {
        let deep = ScaleSubresource {
            spec_replicas: FieldPath::parse(".spec.size.count"),
            ..lws()
        };
        #[rustfmt::skip]
        let cases: Vec<(&ScaleSubresource, Value, Result<Value, ScaleError>)> = vec![
            (&deep, json!({"spec": {"x": 1}}), Ok(json!({"spec": {"x": 1, "size": {"count": 4}}}))),
            (&deep, json!({"spec": {"size": null}}), Ok(json!({"spec": {"size": {"count": 4}}}))),
            (&deep, json!({}), Ok(json!({"spec": {"size": {"count": 4}}}))),
            (&deep, json!({"spec": {"size": 3}}),
             Err(ScaleError::NotAnObject { path: ".spec.size".into() })),
        ];
        for (subresource, object, want) in cases {
            assert_eq!(
                subresource.with_replicas(object.clone(), 4),
                want,
                "{object}"
            );
        }
        assert_eq!(spec_replicas(&json!({"spec": {}})), 0);
        assert_eq!(spec_replicas(&json!({"spec": {"replicas": 5}})), 5);
    }
}
