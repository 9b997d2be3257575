//! The OpenAPI v3 documents kube-apiserver publishes: `/openapi/v3` lists one document
//! per group/version, and each holds the operations on that group/version's kinds and,
//! under `components.schemas`, the schema of every kind it serves and of everything
//! those schemas refer to, named as kube-apiserver names them
//! (`io.k8s.api.apps.v1.Deployment`, `#/components/schemas/...` references, each kind
//! marked with `x-kubernetes-group-version-kind`). kubectl reads them for `kubectl
//! explain`, and to learn that the server validates fields itself (`fieldValidation` on
//! PATCH), so `kubectl apply` sends `fieldValidation=Strict` instead of validating
//! client-side.
//!
//! Built-in kinds' schemas are generated from their k8s-openapi types (schemars, OpenAPI
//! 3.0 settings); a custom resource's is its CRD's `openAPIV3Schema` as
//! apiextensions-apiserver publishes it. What k8s-openapi's schemas lack (`enum`s,
//! `default`s, list and patch extensions) is lacking here too. PATCH operations accept no strategic merge patch in their `requestBody`:
//! kubectl would compute a client-side apply's patch from these schemas, whose lists
//! carry no merge keys, instead of from its compiled-in types.
//!
//! A document is built when first asked for and kept, serialized, until the kinds of
//! its group/version change (a CRD registered, changed or removed).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use k8s_openapi::api::policy::v1::Eviction;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    APIResourceList, DeleteOptions, ListMeta, ObjectMeta, Patch, Status, WatchEvent,
};
use k8s_openapi::schemars::generate::{SchemaGenerator, SchemaSettings};
use serde_json::{Map, Value, json};

use super::resources::{Registry, Resource};
use crate::typed;

const SCHEMAS: &str = "#/components/schemas/";
const OBJECT_META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta";
const LIST_META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.ListMeta";
const STATUS: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.Status";
const DELETE_OPTIONS: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.DeleteOptions";
const PATCH: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.Patch";
const EVICTION: &str = "io.k8s.api.policy.v1.Eviction";
const API_RESOURCE_LIST: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.APIResourceList";
const WATCH_EVENT: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.WatchEvent";

/// `TypeMeta`'s descriptions, which every kind's `apiVersion` and `kind` carry.
const API_VERSION_DESCRIPTION: &str = "APIVersion defines the versioned schema of this representation of an object. Servers should convert recognized schemas to the latest internal value, and may reject unrecognized values. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#resources";
const KIND_DESCRIPTION: &str = "Kind is a string value representing the REST resource this object represents. Servers may infer this from the endpoint the client submits requests to. Cannot be updated. In CamelCase. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#types-kinds";
const METADATA_DESCRIPTION: &str = "Standard object's metadata. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata";
const LIST_METADATA_DESCRIPTION: &str = "Standard list metadata. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#types-kinds";

/// The group/version documents built so far, each with the kinds it was built from.
#[derive(Default)]
pub struct Documents {
    built: Mutex<BTreeMap<(String, String), Built>>,
}

struct Built {
    resources: Vec<Arc<Resource>>,
    body: Bytes,
}

impl Documents {
    /// `/openapi/v3/<api/v|apis/g/v>` as JSON: the one built before while the
    /// group/version serves the same kinds, else built now. `None` for a group/version
    /// the server does not serve.
    pub fn group_version(&self, registry: &Registry, group: &str, version: &str) -> Option<Bytes> {
        let resources: Vec<Arc<Resource>> = registry
            .all()
            .into_iter()
            .filter(|r| r.group == group && r.version == version)
            .collect();
        let key = (group.to_string(), version.to_string());
        if resources.is_empty() {
            // A CRD's group/version no longer served: its document goes too.
            self.lock().remove(&key);
            return None;
        }
        if let Some(built) = self.lock().get(&key)
            && same_kinds(&built.resources, &resources)
        {
            return Some(built.body.clone());
        }
        // Built outside the lock: a large group/version takes a while, and readers of
        // the others need not wait for it.
        let body = Bytes::from(document(group, version, &resources).to_string());
        self.lock().insert(
            key,
            Built {
                resources,
                body: body.clone(),
            },
        );
        Some(body)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<(String, String), Built>> {
        // A panic while holding the lock leaves the map whole: inserts are single calls.
        self.built
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Whether two lists hold the very same registered kinds: a CRD's kinds are registered
/// anew on every change of the CRD.
fn same_kinds(a: &[Arc<Resource>], b: &[Arc<Resource>]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(a, b)| Arc::ptr_eq(a, b))
}

fn path_of(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

/// `/openapi/v3`: where each group/version's document is.
pub fn root(registry: &Registry) -> Value {
    let mut paths = Map::new();
    let mut seen = std::collections::BTreeSet::new();
    for resource in registry.all() {
        if seen.insert((resource.group.clone(), resource.version.clone())) {
            let path = path_of(&resource.group, &resource.version);
            paths.insert(
                path.clone(),
                json!({"serverRelativeURL": format!("/openapi/v3/{path}")}),
            );
        }
    }
    json!({"paths": paths})
}

/// The document of one group/version serving `resources`.
fn document(group: &str, version: &str, resources: &[Arc<Resource>]) -> Value {
    let builtin = resources.iter().any(|r| r.custom.is_none());
    let mut generator = SchemaSettings::openapi3()
        .with(|settings| settings.meta_schema = None)
        .into_generator();
    let mut models = Vec::new();
    for resource in resources {
        let model = match typed::define(resource, &mut generator) {
            Some(name) => name,
            None if resource.custom.is_some() => custom_model_name(group, version, &resource.kind),
            None => continue,
        };
        models.push((resource.as_ref(), model));
    }
    let scale = resources
        .iter()
        .any(|r| r.scale.is_some())
        .then(|| typed::define_scale(&mut generator));
    let evicts = resources
        .iter()
        .any(|r| r.group.is_empty() && r.plural == "pods");
    define_shared(&mut generator, builtin, evicts);
    let mut schemas = generator.take_definitions(true);
    for (model, schema) in schemas.iter_mut() {
        require_as_upstream(model, schema);
    }
    for (resource, model) in &models {
        match &resource.custom {
            Some(custom) => {
                schemas.insert(
                    model.clone(),
                    custom_schema(&custom.open_api_schema, group, version, &resource.kind),
                );
                schemas.insert(format!("{model}List"), custom_list_schema(resource, model));
            }
            None => {
                if let Some(schema) = schemas.get_mut(model) {
                    mark_kind(schema, group, version, &resource.kind);
                }
                schemas.insert(format!("{model}List"), builtin_list_schema(resource, model));
            }
        }
    }
    mark_shared_kinds(&mut schemas, group, version, scale.as_deref());
    let paths = Operations::new(group, version, builtin).paths(&models, scale.as_deref());
    let mut components = json!({"schemas": schemas});
    let info = if builtin {
        components["securitySchemes"] = json!({"BearerToken": {
            "type": "apiKey", "description": "Bearer Token authentication",
            "name": "authorization", "in": "header",
        }});
        json!({"title": "Kubernetes", "version": "1.36"})
    } else {
        json!({"title": "Kubernetes CRD Swagger", "version": "v0.1.0"})
    };
    json!({"openapi": "3.0.0", "info": info, "paths": paths, "components": components})
}

/// Marks the kinds a document defines besides its group/version's own, as
/// kube-apiserver marks them: `Scale`, `Eviction`, the discovery list, and the options
/// and events every group shares (in the core group and in `group`).
fn mark_shared_kinds(
    schemas: &mut Map<String, Value>,
    group: &str,
    version: &str,
    scale: Option<&str>,
) {
    let own = [
        (scale, "autoscaling", "Scale"),
        (Some(EVICTION), "policy", "Eviction"),
        (Some(API_RESOURCE_LIST), "", "APIResourceList"),
    ];
    for (model, kind_group, kind) in own {
        if let Some(schema) = model.and_then(|model| schemas.get_mut(model)) {
            mark_kind(schema, kind_group, "v1", kind);
        }
    }
    for (model, kind) in [
        (STATUS, "Status"),
        (DELETE_OPTIONS, "DeleteOptions"),
        (WATCH_EVENT, "WatchEvent"),
    ] {
        if let Some(schema) = schemas.get_mut(model) {
            let mut kinds = vec![json!({"group": "", "version": "v1", "kind": kind})];
            if !group.is_empty() && kind != "Status" {
                kinds.push(json!({"group": group, "version": version, "kind": kind}));
            }
            schema["x-kubernetes-group-version-kind"] = json!(kinds);
        }
    }
}

/// The definitions the operations refer to besides the kinds': list and object
/// metadata, `Status`, `DeleteOptions`, `Patch`, and for built-in groups the
/// discovery list and watch events; `Eviction` where pods are served.
fn define_shared(generator: &mut SchemaGenerator, builtin: bool, evicts: bool) {
    generator.subschema_for::<ObjectMeta>();
    generator.subschema_for::<ListMeta>();
    generator.subschema_for::<Status>();
    generator.subschema_for::<DeleteOptions>();
    generator.subschema_for::<Patch>();
    if builtin {
        generator.subschema_for::<APIResourceList>();
        generator.subschema_for::<WatchEvent<Status>>();
    }
    if evicts {
        generator.subschema_for::<Eviction>();
    }
}

/// A top-level kind's schema marked with its group/version/kind, as kube-apiserver
/// marks it.
fn mark_kind(schema: &mut Value, group: &str, version: &str, kind: &str) {
    schema["x-kubernetes-group-version-kind"] =
        json!([{"group": group, "version": version, "kind": kind}]);
}

/// The models whose `metadata` kube-apiserver requires (their Go field has no
/// `omitempty`); k8s-openapi requires every kind's.
const METADATA_REQUIRED: &[&str] = &["io.k8s.api.core.v1.Event"];

/// Fields kube-apiserver requires and k8s-openapi does not.
const ALSO_REQUIRED: &[(&str, &str)] = &[("io.k8s.api.events.v1.Event", "eventTime")];

/// Other fields k8s-openapi requires (a Rust field that is not an `Option`) and
/// kube-apiserver does not: the `name` a `LocalObjectReference` embeds, which upstream
/// defaults to `""`.
const NOT_REQUIRED: &[(&str, &str)] = &[
    ("io.k8s.api.core.v1.LocalObjectReference", "name"),
    ("io.k8s.api.core.v1.ConfigMapEnvSource", "name"),
    ("io.k8s.api.core.v1.ConfigMapKeySelector", "name"),
    ("io.k8s.api.core.v1.ConfigMapProjection", "name"),
    ("io.k8s.api.core.v1.ConfigMapVolumeSource", "name"),
    ("io.k8s.api.core.v1.SecretEnvSource", "name"),
    ("io.k8s.api.core.v1.SecretKeySelector", "name"),
    ("io.k8s.api.core.v1.SecretProjection", "name"),
];

/// The `required` fields of `schema` (the model `model`) made kube-apiserver's: what
/// k8s-openapi requires beyond upstream dropped (see [`METADATA_REQUIRED`] and
/// [`NOT_REQUIRED`]), what it misses added ([`ALSO_REQUIRED`]).
fn require_as_upstream(model: &str, schema: &mut Value) {
    for (_, field) in ALSO_REQUIRED.iter().filter(|(m, _)| *m == model) {
        let required = schema
            .as_object_mut()
            .map(|fields| fields.entry("required").or_insert_with(|| json!([])));
        if let Some(Value::Array(required)) = required {
            required.push(json!(field));
        }
    }
    let Some(required) = schema.get_mut("required").and_then(Value::as_array_mut) else {
        return;
    };
    required.retain(|field| {
        let Some(field) = field.as_str() else {
            return true;
        };
        let optional = (field == "metadata" && !METADATA_REQUIRED.contains(&model))
            || NOT_REQUIRED.contains(&(model, field));
        !optional
    });
    if required.is_empty()
        && let Some(fields) = schema.as_object_mut()
    {
        fields.remove("required");
    }
}

/// A custom resource's model name: its group reversed, version and kind
/// (`io.x-k8s.sigs.kmm.v1beta1.NodeModulesConfig`).
fn custom_model_name(group: &str, version: &str, kind: &str) -> String {
    let group: Vec<&str> = group.split('.').rev().collect();
    format!("{}.{version}.{kind}", group.join("."))
}

fn reference(model: &str) -> Value {
    json!({"$ref": format!("{SCHEMAS}{model}")})
}

/// A custom resource's schema as apiextensions-apiserver publishes it: the CRD's
/// `openAPIV3Schema` with `x-kubernetes-int-or-string` unfolded into `anyOf`,
/// `metadata` a reference to `ObjectMeta`, `apiVersion` and `kind` described, embedded
/// resources given theirs, and the group/version/kind marked.
fn custom_schema(open_api_schema: &Value, group: &str, version: &str, kind: &str) -> Value {
    let mut schema = open_api_schema.clone();
    unfold_int_or_string(&mut schema);
    if !schema.is_object() {
        schema = json!({"type": "object"});
    }
    let properties = &mut schema["properties"];
    if !properties.is_object() {
        *properties = json!({});
    }
    properties["metadata"] =
        json!({"description": METADATA_DESCRIPTION, "allOf": [reference(OBJECT_META)]});
    properties["apiVersion"] = json!({"description": API_VERSION_DESCRIPTION, "type": "string"});
    properties["kind"] = json!({"description": KIND_DESCRIPTION, "type": "string"});
    add_embedded_properties(&mut schema);
    schema["x-kubernetes-group-version-kind"] =
        json!([{"group": group, "version": version, "kind": kind}]);
    schema
}

/// Upstream's `Unfold`: a node with `x-kubernetes-int-or-string` gets `anyOf: [integer,
/// string]` (wrapped in `allOf` when it has an `anyOf` of its own), unless it already
/// says so.
fn unfold_int_or_string(schema: &mut Value) {
    let Value::Object(fields) = schema else {
        return;
    };
    let int_or_string = json!([{"type": "integer"}, {"type": "string"}]);
    if fields.get("x-kubernetes-int-or-string") == Some(&json!(true)) {
        let first_all_of_any_of = fields
            .get("allOf")
            .and_then(Value::as_array)
            .and_then(|all_of| all_of.first())
            .and_then(|first| first.get("anyOf"));
        let said = fields.get("anyOf") == Some(&int_or_string)
            || first_all_of_any_of == Some(&int_or_string);
        if !said && !fields.contains_key("anyOf") {
            fields.insert("anyOf".into(), int_or_string);
        } else if !said {
            let unfolded = json!({"anyOf": int_or_string});
            match fields.get_mut("allOf") {
                Some(Value::Array(all_of)) => all_of.insert(0, unfolded),
                _ => {
                    fields.insert("allOf".into(), json!([unfolded]));
                }
            }
        }
    }
    for (name, child) in fields.iter_mut() {
        match name.as_str() {
            "properties" | "patternProperties" => {
                if let Value::Object(children) = child {
                    children.values_mut().for_each(unfold_int_or_string);
                }
            }
            "items" | "additionalProperties" | "not" => unfold_int_or_string(child),
            "allOf" | "anyOf" | "oneOf" => {
                if let Value::Array(children) = child {
                    children.iter_mut().for_each(unfold_int_or_string);
                }
            }
            _ => {}
        }
    }
}

/// Upstream's `addEmbeddedProperties`: every `x-kubernetes-embedded-resource` node
/// gets `apiVersion`, `kind` and `metadata`, and requires the first two.
fn add_embedded_properties(schema: &mut Value) {
    let Value::Object(fields) = schema else {
        return;
    };
    if let Some(Value::Object(properties)) = fields.get_mut("properties") {
        properties.values_mut().for_each(add_embedded_properties);
    }
    for nested in ["items", "additionalProperties"] {
        if let Some(child) = fields.get_mut(nested) {
            add_embedded_properties(child);
        }
    }
    if fields.get("x-kubernetes-embedded-resource") != Some(&json!(true)) {
        return;
    }
    let properties = fields
        .entry("properties")
        .or_insert_with(|| Value::Object(Map::new()));
    if !properties.is_object() {
        *properties = json!({});
    }
    properties["apiVersion"] = json!({"description": "apiVersion defines the versioned schema of this representation of an object. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#resources", "type": "string"});
    properties["kind"] = json!({"description": "kind is a string value representing the type of this object. In CamelCase. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#types-kinds", "type": "string"});
    properties["metadata"] =
        json!({"description": METADATA_DESCRIPTION, "allOf": [reference(OBJECT_META)]});
    let required = fields.entry("required").or_insert_with(|| json!([]));
    if let Value::Array(required) = required {
        for field in ["kind", "apiVersion"] {
            if !required.iter().any(|r| r == field) {
                required.push(json!(field));
            }
        }
    }
}

/// A custom resource's list, as apiextensions-apiserver publishes it.
fn custom_list_schema(resource: &Resource, model: &str) -> Value {
    let list_kind = format!("{}List", resource.kind);
    json!({
        "description": format!("{list_kind} is a list of {}", resource.kind),
        "type": "object",
        "required": ["items"],
        "properties": {
            "apiVersion": {"description": API_VERSION_DESCRIPTION, "type": "string"},
            "items": {
                "description": format!("List of {}. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md", resource.plural),
                "type": "array",
                "items": reference(model),
            },
            "kind": {"description": KIND_DESCRIPTION, "type": "string"},
            "metadata": {"description": LIST_METADATA_DESCRIPTION, "allOf": [reference(LIST_META)]},
        },
        "x-kubernetes-group-version-kind": [{"group": resource.group, "version": resource.version, "kind": list_kind}],
    })
}

/// A built-in kind's list (k8s-openapi has no schema of its lists), shaped as
/// kube-apiserver publishes them.
fn builtin_list_schema(resource: &Resource, model: &str) -> Value {
    let list_kind = format!("{}List", resource.kind);
    json!({
        "description": format!("{list_kind} is a list of {}.", resource.kind),
        "type": "object",
        "required": ["items"],
        "properties": {
            "apiVersion": {"description": API_VERSION_DESCRIPTION, "type": "string"},
            "items": {
                "description": format!("Items is the list of {}.", resource.kind),
                "type": "array",
                "items": {"default": {}, "allOf": [reference(model)]},
            },
            "kind": {"description": KIND_DESCRIPTION, "type": "string"},
            "metadata": {"description": "Standard list metadata.", "default": {}, "allOf": [reference(LIST_META)]},
        },
        "x-kubernetes-group-version-kind": [{"group": resource.group, "version": resource.version, "kind": list_kind}],
    })
}

/// What an operation does, as `x-kubernetes-action` names it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Action {
    List,
    Post,
    DeleteCollection,
    Get,
    Put,
    Delete,
    Patch,
}

impl Action {
    fn name(self) -> &'static str {
        match self {
            Action::List => "list",
            Action::Post => "post",
            Action::DeleteCollection => "deletecollection",
            Action::Get => "get",
            Action::Put => "put",
            Action::Delete => "delete",
            Action::Patch => "patch",
        }
    }

    /// The query parameters kube-apiserver declares for it, for a built-in kind's
    /// operations or (`custom`) as apiextensions-apiserver declares them.
    fn parameters(self, custom: bool) -> &'static [(&'static str, &'static str)] {
        const LIST: &[(&str, &str)] = &[
            ("allowWatchBookmarks", "boolean"),
            ("continue", "string"),
            ("fieldSelector", "string"),
            ("labelSelector", "string"),
            ("limit", "integer"),
            ("resourceVersion", "string"),
            ("resourceVersionMatch", "string"),
            ("sendInitialEvents", "boolean"),
            ("timeoutSeconds", "integer"),
            ("watch", "boolean"),
        ];
        const WRITE: &[(&str, &str)] = &[
            ("dryRun", "string"),
            ("fieldManager", "string"),
            ("fieldValidation", "string"),
        ];
        const PATCH: &[(&str, &str)] = &[
            ("dryRun", "string"),
            ("fieldManager", "string"),
            ("fieldValidation", "string"),
            ("force", "boolean"),
        ];
        const DELETE: &[(&str, &str)] = &[
            ("dryRun", "string"),
            ("gracePeriodSeconds", "integer"),
            (
                "ignoreStoreReadErrorWithClusterBreakingPotential",
                "boolean",
            ),
            ("orphanDependents", "boolean"),
            ("propagationPolicy", "string"),
        ];
        const DELETE_COLLECTION: &[(&str, &str)] = &[
            ("continue", "string"),
            ("dryRun", "string"),
            ("fieldSelector", "string"),
            ("gracePeriodSeconds", "integer"),
            (
                "ignoreStoreReadErrorWithClusterBreakingPotential",
                "boolean",
            ),
            ("labelSelector", "string"),
            ("limit", "integer"),
            ("orphanDependents", "boolean"),
            ("propagationPolicy", "string"),
            ("resourceVersion", "string"),
            ("resourceVersionMatch", "string"),
            ("sendInitialEvents", "boolean"),
            ("timeoutSeconds", "integer"),
        ];
        const GET: &[(&str, &str)] = &[("resourceVersion", "string")];
        match (self, custom) {
            (Action::List, _) => LIST,
            (Action::Post | Action::Put, _) => WRITE,
            (Action::Patch, _) => PATCH,
            (Action::Delete, _) => DELETE,
            (Action::DeleteCollection, false) => DELETE_COLLECTION,
            (Action::DeleteCollection, true) => LIST,
            (Action::Get, false) => &[],
            (Action::Get, true) => GET,
        }
    }
}

/// One operation of a path.
struct Operation<'a> {
    action: Action,
    /// The verb its id starts with (`list`, `create`, `read`, `replace`, ...).
    verb: &'static str,
    /// What its id says after the group/version (`NamespacedDeploymentScale`).
    subject: String,
    description: String,
    /// The group/version/kind it reads or writes.
    kind: (&'a str, &'a str, &'a str),
    /// The model of what it answers.
    answers: &'a str,
    /// The model of its body, if it takes one.
    body: Option<&'a str>,
    /// Whether its query parameters are declared on its path instead (an operation
    /// alone on its path, as upstream declares those).
    parameters_on_path: bool,
}

/// The operations of one group/version, named as kube-apiserver names them.
struct Operations<'a> {
    group: &'a str,
    version: &'a str,
    /// `AppsV1`, `CoreV1`, `KmmSigsXK8sIoV1beta1`: what operation ids carry.
    id: String,
    /// `apps_v1`: the tag of every operation.
    tag: String,
    builtin: bool,
}

impl<'a> Operations<'a> {
    fn new(group: &'a str, version: &'a str, builtin: bool) -> Self {
        let name = if group.is_empty() {
            "core"
        } else {
            group.strip_suffix(".k8s.io").unwrap_or(group)
        };
        Operations {
            group,
            version,
            id: format!(
                "{}{}",
                operation_id_part(name, true),
                operation_id_part(version, true)
            ),
            tag: format!(
                "{}_{}",
                operation_id_part(name, false),
                operation_id_part(version, false)
            ),
            builtin,
        }
    }

    /// Every path of the kinds `models` names, with `scale` the `Scale` model when a
    /// kind has a `/scale` subresource.
    fn paths(&self, models: &'a [(&'a Resource, String)], scale: Option<&'a str>) -> Value {
        let prefix = format!("/{}", path_of(self.group, self.version));
        let mut paths = Map::new();
        if self.builtin {
            let mut discovery = self.operation(Operation {
                action: Action::Get,
                verb: "get",
                subject: "APIResources".into(),
                description: "get available resources".into(),
                kind: ("", "", ""),
                answers: API_RESOURCE_LIST,
                body: None,
                parameters_on_path: false,
            });
            if let Some(fields) = discovery.as_object_mut() {
                fields.remove("x-kubernetes-action");
                fields.remove("x-kubernetes-group-version-kind");
            }
            paths.insert(format!("{prefix}/"), json!({"get": discovery}));
        }
        for (resource, model) in models {
            let kind = (
                resource.group.as_str(),
                resource.version.as_str(),
                resource.kind.as_str(),
            );
            let namespaced = if resource.namespaced {
                "Namespaced"
            } else {
                ""
            };
            let kind_name = &resource.kind;
            let list_model = format!("{model}List");
            let collection = if resource.namespaced {
                let all = self.operation(Operation {
                    action: Action::List,
                    verb: "list",
                    subject: format!("{kind_name}ForAllNamespaces"),
                    description: self.list_description(kind_name),
                    kind,
                    answers: &list_model,
                    body: None,
                    parameters_on_path: true,
                });
                paths.insert(
                    format!("{prefix}/{}", resource.plural),
                    json!({"get": all, "parameters": with_pretty(Action::List.parameters(!self.builtin))}),
                );
                format!("{prefix}/namespaces/{{namespace}}/{}", resource.plural)
            } else {
                format!("{prefix}/{}", resource.plural)
            };
            let scope: Vec<Value> = if resource.namespaced {
                vec![namespace_parameter(), pretty()]
            } else {
                vec![pretty()]
            };
            let article = article_for(kind_name);
            let mut collection_operations = json!({
                    "get": self.operation(Operation {
                        action: Action::List, verb: "list",
                        subject: format!("{namespaced}{kind_name}"),
                        description: self.list_description(kind_name),
                        kind, answers: &list_model, body: None, parameters_on_path: false,
                    }),
                    "post": self.operation(Operation {
                        action: Action::Post, verb: "create",
                        subject: format!("{namespaced}{kind_name}"),
                        description: format!("create{article}{kind_name}"),
                        kind, answers: model, body: Some(model), parameters_on_path: false,
                    }),
                    "delete": self.operation(Operation {
                        action: Action::DeleteCollection, verb: "delete",
                        subject: format!("Collection{namespaced}{kind_name}"),
                        description: format!("delete collection of {kind_name}"),
                        kind, answers: STATUS, body: Some(DELETE_OPTIONS), parameters_on_path: false,
                    }),
                    "parameters": scope,
            });
            // Namespaces are deleted one by one (upstream serves no deletecollection).
            if resource.group.is_empty()
                && resource.plural == "namespaces"
                && let Some(operations) = collection_operations.as_object_mut()
            {
                operations.remove("delete");
            }
            paths.insert(collection.clone(), collection_operations);
            let mut item_scope = vec![name_parameter(kind_name)];
            item_scope.extend(scope.iter().cloned());
            paths.insert(
                format!("{collection}/{{name}}"),
                json!({
                    "get": self.operation(Operation {
                        action: Action::Get, verb: "read",
                        subject: format!("{namespaced}{kind_name}"),
                        description: format!("read the specified {kind_name}"),
                        kind, answers: model, body: None, parameters_on_path: false,
                    }),
                    "put": self.operation(Operation {
                        action: Action::Put, verb: "replace",
                        subject: format!("{namespaced}{kind_name}"),
                        description: format!("replace the specified {kind_name}"),
                        kind, answers: model, body: Some(model), parameters_on_path: false,
                    }),
                    "delete": self.operation(Operation {
                        action: Action::Delete, verb: "delete",
                        subject: format!("{namespaced}{kind_name}"),
                        description: format!("delete{article}{kind_name}"),
                        kind, answers: STATUS, body: Some(DELETE_OPTIONS), parameters_on_path: false,
                    }),
                    "patch": self.operation(Operation {
                        action: Action::Patch, verb: "patch",
                        subject: format!("{namespaced}{kind_name}"),
                        description: format!("partially update the specified {kind_name}"),
                        kind, answers: model, body: Some(PATCH), parameters_on_path: false,
                    }),
                    "parameters": item_scope,
                }),
            );
            let mut subresources: Vec<(&str, (&str, &str, &str), &str)> = Vec::new();
            if resource.has_status {
                subresources.push(("status", kind, model));
            }
            if let (Some(_), Some(scale)) = (&resource.scale, scale) {
                // apiextensions-apiserver marks a custom resource's scale operations
                // with the custom resource's kind, kube-apiserver with `Scale`'s.
                let marked = if resource.custom.is_some() {
                    kind
                } else {
                    ("autoscaling", "v1", "Scale")
                };
                subresources.push(("scale", marked, scale));
            }
            for (subresource, kind, model) in subresources {
                let title = title_case(subresource);
                let subject = format!("{namespaced}{kind_name}{title}");
                paths.insert(
                    format!("{collection}/{{name}}/{subresource}"),
                    json!({
                        "get": self.operation(Operation {
                            action: Action::Get, verb: "read", subject: subject.clone(),
                            description: format!("read {subresource} of the specified {kind_name}"),
                            kind, answers: model, body: None, parameters_on_path: false,
                        }),
                        "put": self.operation(Operation {
                            action: Action::Put, verb: "replace", subject: subject.clone(),
                            description: format!("replace {subresource} of the specified {kind_name}"),
                            kind, answers: model, body: Some(model), parameters_on_path: false,
                        }),
                        "patch": self.operation(Operation {
                            action: Action::Patch, verb: "patch", subject,
                            description: format!("partially update {subresource} of the specified {kind_name}"),
                            kind, answers: model, body: Some(PATCH), parameters_on_path: false,
                        }),
                        "parameters": item_scope,
                    }),
                );
            }
            if resource.group.is_empty() && resource.plural == "pods" {
                let eviction = self.operation(Operation {
                    action: Action::Post,
                    verb: "create",
                    subject: format!("{namespaced}{kind_name}Eviction"),
                    description: format!("create eviction of{article}{kind_name}"),
                    kind: ("policy", "v1", "Eviction"),
                    answers: EVICTION,
                    body: Some(EVICTION),
                    parameters_on_path: true,
                });
                let mut scope = item_scope.clone();
                if let Value::Array(writes) = query_parameters(Action::Post.parameters(false)) {
                    scope.extend(writes);
                }
                sort_parameters(&mut scope);
                paths.insert(
                    format!("{collection}/{{name}}/eviction"),
                    json!({"post": eviction, "parameters": scope}),
                );
            }
        }
        Value::Object(paths)
    }

    fn list_description(&self, kind: &str) -> String {
        if self.builtin {
            format!("list or watch objects of kind {kind}")
        } else {
            format!("list objects of kind {kind}")
        }
    }

    fn operation(&self, operation: Operation) -> Value {
        let answer = json!({"application/json": {"schema": reference(operation.answers)}});
        let mut responses = Map::new();
        responses.insert(
            "200".into(),
            json!({"description": "OK", "content": answer}),
        );
        let more: &[(&str, &str)] = match operation.action {
            Action::Post => &[("201", "Created"), ("202", "Accepted")],
            Action::Put => &[("201", "Created")],
            // apiextensions-apiserver declares no 201 for a custom resource's patch.
            Action::Patch if self.builtin => &[("201", "Created")],
            Action::Delete => &[("202", "Accepted")],
            _ => &[],
        };
        for (code, description) in more {
            responses.insert(
                (*code).into(),
                json!({"description": description, "content": answer}),
            );
        }
        responses.insert("401".into(), json!({"description": "Unauthorized"}));
        let (group, version, kind) = operation.kind;
        let mut out = json!({
            "tags": [self.tag],
            "description": operation.description,
            "operationId": format!("{}{}{}", operation.verb, self.id, operation.subject),
            "responses": responses,
            "x-kubernetes-action": operation.action.name(),
            "x-kubernetes-group-version-kind": {"group": group, "version": version, "kind": kind},
        });
        let parameters = operation.action.parameters(!self.builtin);
        if !parameters.is_empty() && !operation.parameters_on_path {
            out["parameters"] = query_parameters(parameters);
        }
        // apiextensions-apiserver takes no body for a custom resource's deletecollection.
        let takes_body = self.builtin || operation.action != Action::DeleteCollection;
        if let Some(body) = operation.body.filter(|_| takes_body) {
            let content = match operation.action {
                // No strategic merge patch: see the module's documentation.
                Action::Patch => json!({
                    "application/apply-patch+yaml": {"schema": reference(body)},
                    "application/json-patch+json": {"schema": reference(body)},
                    "application/merge-patch+json": {"schema": reference(body)},
                }),
                _ if self.builtin => json!({"*/*": {"schema": reference(body)}}),
                _ => json!({
                    "application/json": {"schema": reference(body)},
                    "application/yaml": {"schema": reference(body)},
                }),
            };
            out["requestBody"] = match operation.action {
                Action::Delete | Action::DeleteCollection => json!({"content": content}),
                _ => json!({"content": content, "required": true}),
            };
        }
        out
    }
}

fn query_parameters(parameters: &[(&str, &str)]) -> Value {
    parameters
        .iter()
        .map(|(name, kind)| {
            json!({"name": name, "in": "query", "schema": {"type": kind, "uniqueItems": true}})
        })
        .collect()
}

/// The list parameters of a path with `pretty` among them, by name as upstream sorts
/// them.
fn with_pretty(parameters: &[(&str, &str)]) -> Value {
    let mut all = match query_parameters(parameters) {
        Value::Array(all) => all,
        _ => Vec::new(),
    };
    all.push(pretty());
    sort_parameters(&mut all);
    Value::Array(all)
}

fn sort_parameters(parameters: &mut [Value]) {
    parameters.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
}

fn pretty() -> Value {
    json!({"name": "pretty", "in": "query", "description": "If 'true', then the output is pretty printed. Defaults to 'false' unless the user-agent indicates a browser or command-line HTTP tool (curl and wget).", "schema": {"type": "string", "uniqueItems": true}})
}

fn namespace_parameter() -> Value {
    json!({"name": "namespace", "in": "path", "description": "object name and auth scope, such as for teams and projects", "required": true, "schema": {"type": "string", "uniqueItems": true}})
}

fn name_parameter(kind: &str) -> Value {
    json!({"name": "name", "in": "path", "description": format!("name of the {kind}"), "required": true, "schema": {"type": "string", "uniqueItems": true}})
}

/// Upstream's `ToValidOperationID`: letters and `_` kept, digits kept but first, any
/// other character dropped and the next letter capitalized.
fn operation_id_part(text: &str, capitalize_first: bool) -> String {
    let mut out = String::with_capacity(text.len());
    let mut capitalize = capitalize_first;
    for (index, c) in text.chars().enumerate() {
        if c.is_alphabetic() || c == '_' || (index != 0 && c.is_numeric()) {
            if capitalize {
                out.extend(c.to_uppercase());
                capitalize = false;
            } else {
                out.push(c);
            }
        } else {
            capitalize = true;
        }
    }
    out
}

fn title_case(word: &str) -> String {
    let mut chars = word.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}

/// Upstream's `GetArticleForNoun` with spaces around: ` a `, ` an `, or ` ` for plurals.
fn article_for(noun: &str) -> &'static str {
    if noun.ends_with('s') && !noun.ends_with("ss") {
        return " ";
    }
    match noun.chars().next().map(|c| c.to_ascii_lowercase()) {
        Some('a' | 'e' | 'i' | 'o' | 'u') => " an ",
        _ => " a ",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operation_ids_are_named_as_upstream_names_them() {
        let cases = [
            ("", "v1", "CoreV1", "core_v1"),
            ("apps", "v1", "AppsV1", "apps_v1"),
            (
                "coordination.k8s.io",
                "v1",
                "CoordinationV1",
                "coordination_v1",
            ),
            (
                "kmm.sigs.x-k8s.io",
                "v1beta1",
                "KmmSigsXK8sIoV1beta1",
                "kmmSigsXK8sIo_v1beta1",
            ),
        ];
        for (group, version, id, tag) in cases {
            let operations = Operations::new(group, version, true);
            assert_eq!((operations.id.as_str(), operations.tag.as_str()), (id, tag));
        }
        assert_eq!(
            [
                article_for("Pod"),
                article_for("Event"),
                article_for("Ingress"),
                article_for("Endpoints")
            ],
            [" a ", " an ", " an ", " "]
        );
        assert_eq!(
            custom_model_name("kmm.sigs.x-k8s.io", "v1beta1", "NodeModulesConfig"),
            "io.x-k8s.sigs.kmm.v1beta1.NodeModulesConfig"
        );
    }

    /// What k8s-openapi requires is made what kube-apiserver 1.36 requires.
    #[test]
    fn required_fields_are_upstreams() {
        #[rustfmt::skip]
        let cases: Vec<(&str, Value, Option<Value>)> = vec![
            ("io.k8s.api.apps.v1.Deployment", json!(["metadata"]), None),
            ("io.k8s.api.core.v1.Event", json!(["metadata", "involvedObject"]),
             Some(json!(["metadata", "involvedObject"]))),
            ("io.k8s.api.events.v1.Event", json!(["metadata"]), Some(json!(["eventTime"]))),
            ("io.k8s.api.core.v1.ConfigMapKeySelector", json!(["key", "name"]), Some(json!(["key"]))),
            ("io.k8s.api.core.v1.Container", json!(["name"]), Some(json!(["name"]))),
        ];
        for (model, required, want) in cases {
            let mut schema = json!({"type": "object", "required": required});
            require_as_upstream(model, &mut schema);
            assert_eq!(schema.get("required"), want.as_ref(), "{model}");
        }
    }

    /// A CRD's schema is published as apiextensions-apiserver publishes it (checked
    /// against kube-apiserver 1.36's document of capstan's CRDs).
    #[test]
    fn custom_schemas_are_published_as_apiextensions_publishes_them() {
        let crd_schema = json!({"type": "object", "description": "A widget.", "required": ["spec"],
            "properties": {
                "metadata": {"type": "object"},
                "spec": {"type": "object", "properties": {
                    "port": {"x-kubernetes-int-or-string": true},
                    "said": {"x-kubernetes-int-or-string": true, "anyOf": [{"type": "integer"}, {"type": "string"}]},
                    "ranged": {"x-kubernetes-int-or-string": true, "anyOf": [{"maximum": 3}]},
                    "template": {"type": "object", "x-kubernetes-embedded-resource": true,
                                 "x-kubernetes-preserve-unknown-fields": true}}}}});
        let schema = custom_schema(&crd_schema, "example.dev", "v1", "Widget");
        let int_or_string = json!([{"type": "integer"}, {"type": "string"}]);
        let spec = &schema["properties"]["spec"]["properties"];
        assert_eq!(spec["port"]["anyOf"], int_or_string);
        assert_eq!(spec["said"]["anyOf"], int_or_string);
        assert!(spec["said"].get("allOf").is_none());
        assert_eq!(spec["ranged"]["allOf"], json!([{"anyOf": int_or_string}]));
        assert_eq!(
            schema["properties"]["metadata"],
            json!({"description": METADATA_DESCRIPTION,
                   "allOf": [{"$ref": "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}]})
        );
        assert_eq!(
            schema["properties"]["kind"]["description"],
            json!(KIND_DESCRIPTION)
        );
        assert_eq!(
            schema["x-kubernetes-group-version-kind"],
            json!([{"group": "example.dev", "version": "v1", "kind": "Widget"}])
        );
        let template = &spec["template"];
        assert_eq!(template["required"], json!(["kind", "apiVersion"]));
        assert_eq!(
            template["properties"]["metadata"]["allOf"][0]["$ref"],
            json!(format!("{SCHEMAS}{OBJECT_META}"))
        );
    }

    /// The apps/v1 document: every kind's schema under kube-apiserver's name with its
    /// group/version/kind, the references resolved within the document, and the
    /// operations kubectl looks up by path.
    #[test]
    fn the_apps_document_has_every_kind_and_what_it_refers_to() {
        let registry = Registry::with_builtins();
        let documents = Documents::default();
        let body = documents
            .group_version(&registry, "apps", "v1")
            .expect("served");
        let document: Value = serde_json::from_slice(&body).expect("JSON");
        let schemas = document["components"]["schemas"]
            .as_object()
            .expect("schemas");
        for (model, kind) in [
            ("io.k8s.api.apps.v1.Deployment", "Deployment"),
            ("io.k8s.api.apps.v1.DeploymentList", "DeploymentList"),
            ("io.k8s.api.apps.v1.StatefulSet", "StatefulSet"),
            ("io.k8s.api.autoscaling.v1.Scale", "Scale"),
        ] {
            let schema = &schemas[model];
            assert_eq!(
                schema["x-kubernetes-group-version-kind"][0]["kind"],
                json!(kind),
                "{model}"
            );
        }
        let deployment = &schemas["io.k8s.api.apps.v1.Deployment"];
        assert!(deployment.get("required").is_none(), "{deployment}");
        assert_eq!(
            deployment["properties"]["metadata"]["allOf"],
            json!([{"$ref": "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}])
        );
        let mut unresolved = Vec::new();
        references(&document, &mut |target| {
            if !schemas.contains_key(target) {
                unresolved.push(target.to_string());
            }
        });
        assert!(unresolved.is_empty(), "{unresolved:?}");
        let item = &document["paths"]["/apis/apps/v1/namespaces/{namespace}/deployments/{name}"];
        assert_eq!(
            item["get"]["operationId"],
            json!("readAppsV1NamespacedDeployment")
        );
        assert_eq!(
            item["patch"]["x-kubernetes-group-version-kind"],
            json!({"group": "apps", "version": "v1", "kind": "Deployment"})
        );
        assert!(
            item["patch"]["parameters"]
                .as_array()
                .expect("parameters")
                .iter()
                .any(|p| p["name"] == "fieldValidation")
        );
        let scale =
            &document["paths"]["/apis/apps/v1/namespaces/{namespace}/deployments/{name}/scale"];
        assert_eq!(
            scale["put"]["operationId"],
            json!("replaceAppsV1NamespacedDeploymentScale")
        );
        assert_eq!(
            scale["get"]["x-kubernetes-group-version-kind"]["kind"],
            json!("Scale")
        );
        assert_eq!(
            document["paths"]["/apis/apps/v1/deployments"]["get"]["operationId"],
            json!("listAppsV1DeploymentForAllNamespaces")
        );
        // Asked again with the same kinds: the document built before.
        let again = documents
            .group_version(&registry, "apps", "v1")
            .expect("served");
        assert_eq!(again.as_ptr(), body.as_ptr());
    }

    /// Every `$ref` target in `value`, without its `#/components/schemas/` prefix.
    fn references(value: &Value, found: &mut dyn FnMut(&str)) {
        match value {
            Value::Object(fields) => {
                for (name, child) in fields {
                    match (name.as_str(), child) {
                        ("$ref", Value::String(target)) => {
                            found(target.strip_prefix(SCHEMAS).unwrap_or(target))
                        }
                        _ => references(child, found),
                    }
                }
            }
            Value::Array(items) => items.iter().for_each(|item| references(item, found)),
            _ => {}
        }
    }
}
