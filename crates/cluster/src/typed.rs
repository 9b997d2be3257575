//! The types of the built-in kinds. kube-apiserver decodes a built-in object into its Go
//! type before anything else, so a field of the wrong type (`"replicas": "three"`) is a
//! 400 naming it instead of an object stored to break every typed client that lists its
//! namespace. The embedded server decodes a client's write into the k8s-openapi type
//! instead, once, on the object as it would be stored (after a patch, and after
//! defaults); server-side apply decodes its configuration first too.
//!
//! The same types give the kinds' OpenAPI schemas ([`define`]), as kube-apiserver
//! publishes those of its Go types.

use std::borrow::Cow;

use k8s_openapi::api::{apps, autoscaling, coordination, core, events, policy};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::errors::ApiError;
use super::events_v1;
use super::resources::{Conversion, Resource};
use super::sim::nodes::{KERNEL_GROUP, KERNELS};
use capstan_worker::simulated::ModuleTable;

/// Whether an object decodes as a kind's type; `Err` says where and why not.
type Decode = fn(&Value) -> Result<(), String>;

/// The object as the kind's type keeps it: decoded and encoded again, so that only the
/// fields the type knows are left; `None` when it does not decode.
type RoundTrip = fn(&Value) -> Option<Value>;

/// Adds the type's OpenAPI schema, and those it refers to, to the generator's
/// definitions; returns the name it is defined under (`io.k8s.api.apps.v1.Deployment`).
type Define = fn(&mut SchemaGenerator) -> String;

/// How the server reads a built-in kind's objects through its type.
#[derive(Clone, Copy)]
struct Typed {
    decode: Decode,
    round_trip: RoundTrip,
    define: Define,
}

const fn typed<T: DeserializeOwned + Serialize + JsonSchema>() -> Typed {
    Typed {
        decode: decodes::<T>,
        round_trip: round_trips::<T>,
        define: defines::<T>,
    }
}

/// The `Scale` of a `/scale` subresource, an autoscaling/v1 `Scale` whatever the kind.
const SCALE: Typed = typed::<autoscaling::v1::Scale>();

/// (group, resource, type) of every built-in kind the server serves.
const TYPES: &[(&str, &str, Typed)] = &[
    ("", "namespaces", typed::<core::v1::Namespace>()),
    ("", "nodes", typed::<core::v1::Node>()),
    ("", "pods", typed::<core::v1::Pod>()),
    ("", "configmaps", typed::<core::v1::ConfigMap>()),
    ("", "secrets", typed::<core::v1::Secret>()),
    ("", "serviceaccounts", typed::<core::v1::ServiceAccount>()),
    ("", "services", typed::<core::v1::Service>()),
    (
        "",
        "replicationcontrollers",
        typed::<core::v1::ReplicationController>(),
    ),
    ("", "events", typed::<core::v1::Event>()),
    ("events.k8s.io", "events", typed::<events::v1::Event>()),
    ("apps", "daemonsets", typed::<apps::v1::DaemonSet>()),
    ("apps", "deployments", typed::<apps::v1::Deployment>()),
    ("apps", "replicasets", typed::<apps::v1::ReplicaSet>()),
    ("apps", "statefulsets", typed::<apps::v1::StatefulSet>()),
    (
        "apps",
        "controllerrevisions",
        typed::<apps::v1::ControllerRevision>(),
    ),
    (
        "policy",
        "poddisruptionbudgets",
        typed::<policy::v1::PodDisruptionBudget>(),
    ),
    (
        "coordination.k8s.io",
        "leases",
        typed::<coordination::v1::Lease>(),
    ),
    (KERNEL_GROUP, KERNELS, typed::<NodeKernel>()),
    (
        "apiextensions.k8s.io",
        "customresourcedefinitions",
        typed::<CustomResourceDefinition>(),
    ),
];

/// A simulated node's loaded modules (see `sim::nodes`), the one built-in kind that is
/// capstan's own.
#[derive(Deserialize, Serialize)]
struct NodeKernel {
    #[serde(rename = "metadata", skip_serializing_if = "Option::is_none")]
    _metadata: Option<ObjectMeta>,
    #[serde(rename = "modules", skip_serializing_if = "Option::is_none")]
    _modules: Option<ModuleTable>,
}

/// The schema of [`NodeKernel`], named as a custom resource's model is (the group
/// reversed, `dev.capstan.sim.v1.NodeKernel`): its metadata and its module table.
impl JsonSchema for NodeKernel {
    fn schema_name() -> Cow<'static, str> {
        "dev.capstan.sim.v1.NodeKernel".into()
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        let mut metadata = generator.subschema_for::<ObjectMeta>();
        metadata
            .ensure_object()
            .insert("description".into(), "Standard object's metadata.".into());
        json_schema!({
            "description": "The kernel modules loaded on a simulated node, as the simulated kmod worker leaves them.",
            "type": "object",
            "properties": {
                "apiVersion": {"description": "APIVersion of this representation of the object.", "type": "string"},
                "kind": {"description": "The kind of the object, NodeKernel.", "type": "string"},
                "metadata": metadata,
                "modules": {
                    "description": "The loaded modules by name, `_` spelling, as `/sys/module` names them.",
                    "type": "object",
                    "additionalProperties": {
                        "description": "One loaded module.",
                        "type": "object",
                        "properties": {
                            "name": {"description": "The module's name.", "type": "string"},
                            "version": {"description": "The Module version whose worker loaded it; absent for modules the node booted with.", "type": "string"},
                            "parameters": {"description": "The `key=value` parameters it was loaded with.", "type": "array", "items": {"type": "string"}},
                            "firmwarePath": {"description": "The kernel's firmware search path when it was loaded.", "type": "string"},
                        },
                    },
                },
            },
        })
    }
}

/// Checks that `object`, in its stored form, decodes as `resource`'s type, as
/// kube-apiserver decodes a built-in kind on create, update and after a patch. Custom
/// resources pass (their schema prunes them instead).
///
/// Fails with 400 BadRequest naming the field in upstream's words:
/// `ConfigMap in version "v1" cannot be handled as a ConfigMap: data.a: invalid type: ...`.
pub fn check(resource: &Resource, object: &Value) -> Result<(), ApiError> {
    if resource.custom.is_some() {
        return Ok(());
    }
    let Some(decode) = decoder(&resource.group, &resource.plural) else {
        return Ok(());
    };
    let decoded = match resource.conversion {
        Conversion::None => decode(object),
        // In the served version, so that the message names the fields the client wrote.
        Conversion::EventsV1 => decode(&events_v1::from_core(object.clone())),
    };
    decoded.map_err(|why| refused(&resource.kind, &resource.version, &why))
}

/// [`check`] of a `Scale` a client wrote to a `/scale` subresource: it must decode as
/// autoscaling/v1 `Scale` (`Scale in version "v1" cannot be handled as a Scale: ...`).
pub fn check_scale(scale: &Value) -> Result<(), ApiError> {
    (SCALE.decode)(scale).map_err(|why| refused("Scale", "v1", &why))
}

/// [`round_trip`] of a `Scale`.
pub fn round_trip_scale(scale: &Value) -> Option<Value> {
    (SCALE.round_trip)(scale)
}

/// The 400 of an object that does not decode as its kind's type.
fn refused(kind: &str, version: &str, why: &str) -> ApiError {
    ApiError::bad_request(format!(
        "{kind} in version \"{version}\" cannot be handled as a {kind}: {why}"
    ))
}

/// Adds the OpenAPI schema of `resource`'s type (and of the types it refers to) to
/// `generator`, and returns the name it is defined under; `None` for custom resources,
/// whose schema is their CRD's.
pub fn define(resource: &Resource, generator: &mut SchemaGenerator) -> Option<String> {
    if resource.custom.is_some() {
        return None;
    }
    let typed = of(&resource.group, &resource.plural)?;
    Some((typed.define)(generator))
}

/// [`define`] of the autoscaling/v1 `Scale`, for the kinds with a `/scale` subresource.
pub fn define_scale(generator: &mut SchemaGenerator) -> String {
    (SCALE.define)(generator)
}

/// `object` as `resource`'s type keeps it (see [`RoundTrip`]): what
/// `fieldValidation` compares a client's object with to find the fields the kind does
/// not know. `None` for custom resources and objects that do not decode.
pub fn round_trip(resource: &Resource, object: &Value) -> Option<Value> {
    if resource.custom.is_some() {
        return None;
    }
    let typed = of(&resource.group, &resource.plural)?;
    (typed.round_trip)(object)
}

fn decoder(group: &str, plural: &str) -> Option<Decode> {
    of(group, plural).map(|typed| typed.decode)
}

fn of(group: &str, plural: &str) -> Option<Typed> {
    TYPES
        .iter()
        .find(|(g, p, _)| *g == group && *p == plural)
        .map(|(_, _, typed)| *typed)
}

/// Decodes `object` as `T`. Only a failure decodes again, tracking the path to name the
/// field: a valid object costs one plain decode.
fn decodes<T: DeserializeOwned>(object: &Value) -> Result<(), String> {
    if T::deserialize(object).is_ok() {
        return Ok(());
    }
    match serde_path_to_error::deserialize::<_, T>(object) {
        Ok(_) => Ok(()),
        Err(err) => Err(err.to_string()),
    }
}

fn round_trips<T: DeserializeOwned + Serialize>(object: &Value) -> Option<Value> {
    let decoded = T::deserialize(object).ok()?;
    serde_json::to_value(decoded).ok()
}

fn defines<T: JsonSchema>(generator: &mut SchemaGenerator) -> String {
    generator.subschema_for::<T>();
    T::schema_name().into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::Registry;
    use serde_json::json;

    /// Every built-in kind the registry serves has a type here, and nothing here is
    /// left over from a kind no longer served.
    #[test]
    fn every_built_in_kind_has_a_type() {
        let registry = Registry::with_builtins();
        let served: Vec<(String, String)> = registry
            .all()
            .iter()
            .map(|r| (r.group.clone(), r.plural.clone()))
            .collect();
        for (group, plural) in &served {
            assert!(decoder(group, plural).is_some(), "{group}/{plural}");
        }
        for (group, plural, _) in TYPES {
            assert!(
                served.iter().any(|(g, p)| g == group && p == plural),
                "{group}/{plural} is not served"
            );
        }
    }

    #[test]
    fn a_field_of_the_wrong_type_is_named() {
        let registry = Registry::with_builtins();
        #[rustfmt::skip]
        let cases: Vec<(&str, &str, Value, Option<&str>)> = vec![
            ("", "configmaps", json!({"metadata": {"name": "c"}, "data": {"a": "1"}}), None),
            ("", "configmaps", json!({"metadata": {"name": "c"}, "data": {"a": 1}}),
             Some("ConfigMap in version \"v1\" cannot be handled as a ConfigMap: data.a: invalid type: integer `1`, expected a string")),
            ("", "configmaps", json!({"metadata": "c"}), Some(": metadata: invalid type: string")),
            ("", "pods", json!({"spec": {"containers": [{"name": "a"}, {"name": 2}]}}),
             Some(": spec.containers[1].name: invalid type: integer")),
            // Quantities may be numbers, as upstream reads them.
            ("", "pods", json!({"spec": {"containers": [{"name": "a", "resources": {"limits": {"cpu": 1}}}]}}), None),
            // Fields upstream requires but omits when empty may be missing.
            ("", "pods", json!({"spec": {}}), None),
            ("apps", "statefulsets", json!({"spec": {"replicas": "three"}}),
             Some("StatefulSet in version \"v1\" cannot be handled as a StatefulSet: spec.replicas: invalid type: string \"three\", expected i32")),
            ("policy", "poddisruptionbudgets", json!({"spec": {"minAvailable": "50%"}}), None),
            ("sim.capstan.dev", "nodekernels", json!({"modules": {"m": {"version": "v1"}}}), None),
            ("sim.capstan.dev", "nodekernels", json!({"modules": {"m": {"version": 1}}}),
             Some(": modules.m.version: invalid type: integer")),
            ("events.k8s.io", "events", json!({"involvedObject": {}, "count": 1}), None),
            // Stored as core/v1, named as events.k8s.io/v1 names it.
            ("events.k8s.io", "events", json!({"involvedObject": {}, "count": "many"}),
             Some(": deprecatedCount: invalid type: string")),
        ];
        for (group, plural, object, want) in cases {
            let resource = registry
                .all()
                .into_iter()
                .find(|r| r.group == group && r.plural == plural)
                .expect("served");
            let got = check(&resource, &object).map_err(|e| (e.code, e.message));
            match want {
                None => assert_eq!(got, Ok(()), "{plural} {object}"),
                Some(part) => {
                    let (code, message) = got.expect_err(plural);
                    assert_eq!(code, 400, "{message}");
                    assert!(message.contains(part), "{plural} {object}: {message}");
                }
            }
        }
    }
}
