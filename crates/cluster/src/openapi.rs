//! A minimal OpenAPI v3 document per group/version. kubectl reads it to learn that the
//! server validates fields itself (`fieldValidation` on PATCH), so `kubectl apply` sends
//! `fieldValidation=Strict` instead of downloading schemas to validate client-side.

use serde_json::{Map, Value, json};

use super::resources::Registry;

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

/// `/openapi/v3/<path>`: the write operations of one group/version, with the query
/// parameters the server honours.
pub fn group_version(registry: &Registry, group: &str, version: &str) -> Option<Value> {
    let resources: Vec<_> = registry
        .all()
        .into_iter()
        .filter(|r| r.group == group && r.version == version)
        .collect();
    if resources.is_empty() {
        return None;
    }
    let parameters = json!([
        {"name": "dryRun", "in": "query", "schema": {"type": "string"}},
        {"name": "fieldManager", "in": "query", "schema": {"type": "string"}},
        {"name": "fieldValidation", "in": "query", "schema": {"type": "string"}},
        {"name": "force", "in": "query", "schema": {"type": "boolean"}},
    ]);
    let mut paths = Map::new();
    for resource in resources {
        let scope = if resource.namespaced {
            "namespaces/{namespace}/"
        } else {
            ""
        };
        let path = format!(
            "/{}/{scope}{}/{{name}}",
            path_of(group, version),
            resource.plural
        );
        let gvk = json!({"group": group, "version": version, "kind": resource.kind});
        let operation = |verb: &str| {
            json!({
                "operationId": format!("{verb}{}", resource.kind),
                "parameters": parameters,
                "x-kubernetes-action": verb,
                "x-kubernetes-group-version-kind": gvk,
                "responses": {"200": {"description": "OK"}},
            })
        };
        paths.insert(
            path,
            json!({"patch": operation("patch"), "put": operation("put")}),
        );
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.36.3"},
        "paths": paths,
        "components": {"schemas": {}},
    }))
}
