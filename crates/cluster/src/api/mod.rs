//! What the API server does with each verb, independent of HTTP: create, update, patch
//! (four types), delete with finalizers, grace and propagation, and list with selectors
//! and paging. The HTTP layer parses requests into these calls; in-process code may call
//! them directly.
//!
//! The verbs live by kind: [`read`], [`write`] (create and update), [`patch`] and
//! [`delete`], and [`scale`] for the `/scale` subresource; [`options`] holds what they
//! take and [`answer`] what they answer.

mod answer;
mod delete;
mod options;
mod patch;
mod read;
mod scale;
mod write;

pub use answer::{Answer, Deleted, ListPage, Read};
pub use options::{DeleteOptions, ListOptions, PatchType, Propagation, WriteOptions};

use std::sync::Arc;

use bytes::Bytes;
use jiff::Timestamp;
use serde_json::{Value, json};

use crate::errors::ApiError;
use crate::events_v1;
use crate::object_key::ObjectKey;
use crate::resources::{CRD_STORAGE, Conversion, Registry, Resource};
use crate::store::{Store, StoredObject};
use capstan_api::clock::Clock;

/// The API server's semantics over the store.
pub struct Api {
    pub store: Arc<Store>,
    pub registry: Arc<Registry>,
    pub clock: Arc<dyn Clock>,
}

const DEFAULT_NAMESPACES: &[&str] = &["default", "kube-system", "kube-public", "kube-node-lease"];

impl Api {
    pub fn new(store: Arc<Store>, registry: Arc<Registry>, clock: Arc<dyn Clock>) -> Self {
        let api = Api {
            store,
            registry,
            clock,
        };
        api.restore_crds();
        api
    }

    /// Creates the namespaces every cluster has, if missing.
    pub fn ensure_default_namespaces(&self) -> Result<(), ApiError> {
        let Some(namespaces) = self.registry.get("", "v1", "namespaces") else {
            return Ok(());
        };
        for name in DEFAULT_NAMESPACES {
            let key = ObjectKey::new("namespaces", "", name);
            if self.store.get(&key).is_none() {
                let namespace =
                    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}});
                self.create(&namespaces, "", namespace, &WriteOptions::default())?;
            }
        }
        Ok(())
    }

    /// Serves again the CRDs found in a restored store.
    fn restore_crds(&self) {
        let page = self.store.list(CRD_STORAGE, None, None, None, None);
        for crd in page.items {
            self.registry.register_crd(&crd.value());
        }
    }

    fn now(&self) -> Timestamp {
        self.clock.now()
    }

    fn key(resource: &Resource, namespace: &str, name: &str) -> ObjectKey {
        let namespace = if resource.namespaced { namespace } else { "" };
        ObjectKey::new(&resource.storage, namespace, name)
    }

    /// The stored object as `resource`'s version shows it.
    pub fn present(&self, resource: &Resource, stored: &StoredObject) -> Bytes {
        let same_version = stored.projection.get("apiVersion").and_then(Value::as_str)
            == Some(resource.api_version().as_str());
        if resource.conversion == Conversion::None && same_version {
            return stored.bytes.clone();
        }
        let object = self.present_value(resource, stored.value());
        Bytes::from(serde_json::to_vec(&object).unwrap_or_default())
    }

    fn present_value(&self, resource: &Resource, object: Value) -> Value {
        match resource.conversion {
            Conversion::EventsV1 => events_v1::from_core(object),
            Conversion::None => {
                let mut object = object;
                object["apiVersion"] = json!(resource.api_version());
                object
            }
        }
    }

    /// `object` as `resource`'s version shows it, with the bytes `stored` holds when they
    /// are exactly that (no conversion, the same apiVersion).
    fn answer(&self, resource: &Resource, object: Value, stored: Option<&StoredObject>) -> Answer {
        let bytes = stored
            .filter(|stored| {
                resource.conversion == Conversion::None
                    && stored.projection.get("apiVersion").and_then(Value::as_str)
                        == Some(resource.api_version().as_str())
            })
            .map(|stored| stored.bytes.clone());
        Answer::parsed(self.present_value(resource, object), bytes)
    }

    /// Converts an object in `resource`'s served version to its stored form.
    fn intake(&self, resource: &Resource, object: Value) -> Value {
        match resource.conversion {
            Conversion::EventsV1 => events_v1::to_core(object),
            Conversion::None => object,
        }
    }

    /// Serves a CRD's kinds once it is stored.
    fn after_write(&self, resource: &Resource, stored: &StoredObject) {
        if resource.storage == CRD_STORAGE {
            self.registry.register_crd(&stored.value());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::patch::merge;

    /// An API over an in-memory store keeping `history` changes, with the built-in kinds
    /// and the default namespaces, at a fixed time.
    pub(super) fn started_api(history: usize) -> Api {
        use capstan_api::clock::ManualClock;
        let clock = ManualClock::new("2026-01-01T00:00:00Z".parse().expect("time"));
        let api = Api::new(
            Arc::new(Store::in_memory(history)),
            Arc::new(Registry::with_builtins()),
            Arc::new(clock),
        );
        api.ensure_default_namespaces().expect("namespaces");
        api
    }

    /// No write a client can send panics the server: every patch type and updates, with
    /// values of every JSON type wherever the engines look (the body itself, metadata,
    /// lists with merge keys, directives), on a built-in kind and a custom resource that
    /// keeps whatever it is sent, through the object and its status. Each ends in an
    /// answer or a 4xx error.
    #[test]
    fn no_write_body_panics_the_server() {
        use std::panic::{AssertUnwindSafe, catch_unwind};
        let api = started_api(100_000);
        let crds = api
            .registry
            .get("apiextensions.k8s.io", "v1", "customresourcedefinitions")
            .expect("crds");
        let crd = json!({"metadata": {"name": "widgets.example.dev"}, "spec": {
            "group": "example.dev", "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                          "subresources": {"status": {}},
                          "schema": {"openAPIV3Schema": {
                              "type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}});
        api.create(&crds, "", crd, &WriteOptions::default())
            .expect("crd");
        let pods = api.registry.get("", "v1", "pods").expect("pods");
        let maps = api.registry.get("", "v1", "configmaps").expect("maps");
        let widgets = api
            .registry
            .get("example.dev", "v1", "widgets")
            .expect("widgets");
        let objects = [
            (
                &pods,
                json!({"metadata": {"name": "p"},
                           "spec": {"containers": [{"name": "app", "image": "i",
                                                    "env": [{"name": "A", "value": "1"}]}]}}),
            ),
            (
                &maps,
                json!({"metadata": {"name": "p", "labels": {"a": "b"}}, "data": {"a": "1"}}),
            ),
            (
                &widgets,
                json!({"metadata": {"name": "p", "finalizers": ["f"]},
                              "spec": {"containers": [{"name": "app"}]}}),
            ),
        ];
        let values = [
            json!(null),
            json!(true),
            json!(3),
            json!(-1.5),
            json!("x"),
            json!([]),
            json!([1]),
            json!(["x", "x"]),
            json!([null]),
            json!([{}]),
            json!([[]]),
            json!({}),
            json!({"a": null}),
            json!({"name": 5}),
            json!({"$patch": "delete"}),
            json!({"$patch": 5}),
            json!([{"$patch": "replace"}]),
            json!({"f:spec": {}}),
            json!([{"manager": 5, "fieldsV1": []}]),
            json!([{"manager": "m", "operation": "Apply", "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:spec": {"k:{\"name\":5}": {}}}}]),
        ];
        // A patch of each shape, `value` in place of the body or of one field.
        let shapes: Vec<fn(&Value) -> Value> = vec![
            |v| v.clone(),
            |v| json!({"metadata": v}),
            |v| json!({"metadata": {"labels": v}}),
            |v| json!({"metadata": {"annotations": {"a": v}}}),
            |v| json!({"metadata": {"managedFields": v}}),
            |v| json!({"metadata": {"finalizers": v}}),
            |v| json!({"metadata": {"ownerReferences": v}}),
            |v| json!({"metadata": {"name": v, "resourceVersion": v, "generation": v}}),
            |v| json!({"metadata": {"$deleteFromPrimitiveList/finalizers": v}}),
            |v| json!({"metadata": {"$setElementOrder/finalizers": v}}),
            |v| json!({"apiVersion": v, "kind": v}),
            |v| json!({"spec": v}),
            |v| json!({"spec": {"containers": v}}),
            |v| json!({"spec": {"containers": [v]}}),
            |v| json!({"spec": {"containers": [{"name": v}]}}),
            |v| json!({"spec": {"containers": [{"name": "app", "env": v}]}}),
            |v| json!({"spec": {"containers": [{"name": "app", "env": [v]}]}}),
            |v| json!({"spec": {"$setElementOrder/containers": v, "containers": [{"name": "app"}]}}),
            |v| json!({"spec": {"containers": [{"name": "app", "$patch": v}]}}),
            |v| json!({"spec": {"$retainKeys": v, "containers": []}}),
            |v| json!({"spec": {"tolerations": v, "volumes": v}}),
            |v| json!({"status": v}),
            |v| json!({"status": {"conditions": v}}),
            |v| json!({"status": {"conditions": [v]}}),
            |v| json!({"data": v}),
            |v| json!({"$patch": v}),
        ];
        let json_patches: Vec<fn(&Value) -> Value> = vec![
            |v| v.clone(),
            |v| json!([v]),
            |v| json!([{"op": "replace", "path": "", "value": v}]),
            |v| json!([{"op": "add", "path": "/metadata/labels", "value": v}]),
            |v| json!([{"op": "replace", "path": "/metadata", "value": v}]),
            |v| json!([{"op": "add", "path": "/spec/containers/0", "value": v}]),
            |v| json!([{"op": "add", "path": "/status", "value": v}]),
            |v| json!([{"op": v, "path": "/spec"}]),
        ];
        let manager = WriteOptions {
            field_manager: Some("fuzz".into()),
            check_types: true,
            ..WriteOptions::default()
        };
        let mut panics = Vec::new();
        let mut run = |what: String, write: &dyn Fn() -> Result<Value, ApiError>| match catch_unwind(
            AssertUnwindSafe(write),
        ) {
            Ok(Ok(_)) => {}
            Ok(Err(err)) => assert!(err.code < 500, "{what}: {err:?}"),
            Err(_) => panics.push(what),
        };
        for (resource, object) in &objects {
            let kind = &resource.kind;
            let fresh = || {
                let _ = api.delete(
                    resource,
                    "default",
                    "p",
                    &DeleteOptions {
                        grace_period_seconds: Some(0),
                        ..DeleteOptions::default()
                    },
                );
                let _ = api.patch(
                    resource,
                    "default",
                    "p",
                    None,
                    PatchType::Merge,
                    json!({"metadata": {"finalizers": null}}),
                    &manager,
                );
                let _ = api.delete(resource, "default", "p", &DeleteOptions::default());
                api.create(resource, "default", object.clone(), &manager)
                    .expect("create");
            };
            fresh();
            for sub in [None, Some("status").filter(|_| resource.has_status)] {
                for value in &values {
                    for shape in &shapes {
                        let body = shape(value);
                        for patch_type in [PatchType::Merge, PatchType::Strategic] {
                            run(format!("{patch_type:?} {body} to {kind} {sub:?}"), &|| {
                                api.patch(
                                    resource,
                                    "default",
                                    "p",
                                    sub,
                                    patch_type,
                                    body.clone(),
                                    &manager,
                                )
                            });
                        }
                        let mut applied = json!({"apiVersion": resource.api_version(), "kind": kind,
                                                 "metadata": {"name": "p"}});
                        merge::merge_patch(&mut applied, &body);
                        run(format!("apply {applied} to {kind} {sub:?}"), &|| {
                            api.patch(
                                resource,
                                "default",
                                "p",
                                sub,
                                PatchType::Apply,
                                applied.clone(),
                                &manager,
                            )
                        });
                        run(format!("update {applied} to {kind} {sub:?}"), &|| {
                            api.update(resource, "default", "p", sub, applied.clone(), &manager)
                        });
                        if api.get(resource, "default", "p").is_err() {
                            fresh();
                        }
                    }
                    for shape in &json_patches {
                        let body = shape(value);
                        run(format!("JSON patch {body} to {kind} {sub:?}"), &|| {
                            api.patch(
                                resource,
                                "default",
                                "p",
                                sub,
                                PatchType::Json,
                                body.clone(),
                                &manager,
                            )
                        });
                    }
                }
            }
        }
        assert!(
            panics.is_empty(),
            "{} writes panicked: {panics:#?}",
            panics.len()
        );
    }
}
