//! Defaulting: the fields a real API server fills in on every write, so that objects
//! read back from the embedded cluster look like those from a real one (and a diff
//! against them shows no noise from defaults).

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};

use crate::pointer::Pointer;

use super::resources::Resource;

/// Fills in the defaults of `resource`'s kind.
pub fn apply(resource: &Resource, object: &mut Value) {
    if let Some(custom) = &resource.custom {
        schema_defaults(&custom.open_api_schema, object);
        return;
    }
    match (resource.group.as_str(), resource.plural.as_str()) {
        ("", "pods") => {
            if let Some(spec) = object.get_mut("spec") {
                pod_spec(spec);
            }
        }
        ("", "namespaces") => namespace(object),
        ("", "services") => service(object),
        ("", "secrets") => secret(object),
        ("", "replicationcontrollers") => replication_controller(object),
        ("apps", "daemonsets") => daemon_set(object),
        ("apps", "deployments") => deployment(object),
        ("apps", "replicasets") => replica_set(object),
        ("apps", "statefulsets") => stateful_set(object),
        ("apiextensions.k8s.io", "customresourcedefinitions") => crd(object),
        _ => {}
    }
}

fn set_default(object: &mut Value, field: &str, value: Value) {
    if let Some(map) = object.as_object_mut() {
        map.entry(field).or_insert(value);
    }
}

/// PodSpec defaults (pods and workload templates).
fn pod_spec(spec: &mut Value) {
    for (field, value) in [
        ("restartPolicy", json!("Always")),
        ("terminationGracePeriodSeconds", json!(30)),
        ("dnsPolicy", json!("ClusterFirst")),
        ("schedulerName", json!("default-scheduler")),
        ("securityContext", json!({})),
    ] {
        set_default(spec, field, value);
    }
    for list in ["containers", "initContainers"] {
        if let Some(Value::Array(containers)) = spec.get_mut(list) {
            containers.iter_mut().for_each(container);
        }
    }
}

fn container(container: &mut Value) {
    let image = container.get("image").and_then(Value::as_str).unwrap_or("");
    let pull =
        if image.ends_with(":latest") || !image.rsplit('/').next().unwrap_or("").contains(':') {
            "Always"
        } else {
            "IfNotPresent"
        };
    let pull = if image.contains('@') {
        "IfNotPresent"
    } else {
        pull
    };
    for (field, value) in [
        ("imagePullPolicy", json!(pull)),
        ("terminationMessagePath", json!("/dev/termination-log")),
        ("terminationMessagePolicy", json!("File")),
        ("resources", json!({})),
    ] {
        set_default(container, field, value);
    }
    if let Some(Value::Array(ports)) = container.get_mut("ports") {
        for port in ports {
            set_default(port, "protocol", json!("TCP"));
        }
    }
}

fn template(object: &mut Value) {
    if let Some(spec) = object.pointer_mut("/spec/template/spec") {
        pod_spec(spec);
    }
}

fn namespace(object: &mut Value) {
    let name = object.at("/metadata/name").cloned().unwrap_or(Value::Null);
    let meta = &mut object["metadata"];
    if !meta.get("labels").is_some_and(Value::is_object) {
        meta["labels"] = json!({});
    }
    meta["labels"]["kubernetes.io/metadata.name"] = name;
    if object.get("spec").is_none() {
        object["spec"] = json!({"finalizers": ["kubernetes"]});
    }
    if object.at("/status/phase").is_none() {
        object["status"] = json!({"phase": "Active"});
    }
}

fn service(object: &mut Value) {
    let Some(spec) = object.get_mut("spec") else {
        return;
    };
    set_default(spec, "type", json!("ClusterIP"));
    set_default(spec, "sessionAffinity", json!("None"));
    if spec["type"] != "ExternalName" {
        // The IP family fields as kube-apiserver sets them on a single-stack IPv4
        // cluster; a headless Service without a selector is dual-stack by default.
        if let Some(ip) = spec.get("clusterIP").filter(|ip| ip.is_string()).cloned() {
            set_default(spec, "clusterIPs", json!([ip]));
        }
        let selectorless_headless = spec["clusterIP"] == "None"
            && spec
                .get("selector")
                .and_then(Value::as_object)
                .is_none_or(|s| s.is_empty());
        if selectorless_headless {
            set_default(spec, "ipFamilyPolicy", json!("RequireDualStack"));
            set_default(spec, "ipFamilies", json!(["IPv4", "IPv6"]));
        } else {
            set_default(spec, "ipFamilyPolicy", json!("SingleStack"));
            set_default(spec, "ipFamilies", json!(["IPv4"]));
        }
        set_default(spec, "internalTrafficPolicy", json!("Cluster"));
    }
    if let Some(Value::Array(ports)) = spec.get_mut("ports") {
        for port in ports {
            set_default(port, "protocol", json!("TCP"));
            let number = port.get("port").cloned().unwrap_or(Value::Null);
            set_default(port, "targetPort", number);
        }
    }
    set_default(object, "status", json!({"loadBalancer": {}}));
}

/// A Secret as kube-apiserver converts it from v1: each `stringData` key written,
/// base64-encoded, into `data` (over a `data` key of the same name), and `stringData`
/// dropped, so it is never stored or returned. A `stringData` or `data` of the wrong
/// type is left for the typed check to refuse.
fn secret(object: &mut Value) {
    set_default(object, "type", json!("Opaque"));
    let Some(secret) = object.as_object_mut() else {
        return;
    };
    let strings_only = match secret.get("stringData") {
        None => return,
        Some(Value::Null) => true,
        Some(Value::Object(strings)) => strings.values().all(Value::is_string),
        Some(_) => false,
    };
    let data_fits = matches!(
        secret.get("data"),
        None | Some(Value::Null | Value::Object(_))
    );
    if !strings_only || !data_fits {
        return;
    }
    let Some(Value::Object(strings)) = secret.remove("stringData") else {
        return;
    };
    if strings.is_empty() {
        return;
    }
    let data = secret.entry("data").or_insert(Value::Null);
    if data.is_null() {
        *data = json!({});
    }
    if let Value::Object(data) = data {
        for (key, text) in strings {
            if let Value::String(text) = text {
                data.insert(key, json!(STANDARD.encode(text)));
            }
        }
    }
}

fn daemon_set(object: &mut Value) {
    if let Some(spec) = object.get_mut("spec") {
        set_default(spec, "revisionHistoryLimit", json!(10));
        set_default(
            spec,
            "updateStrategy",
            json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}}),
        );
    }
    template(object);
}

fn deployment(object: &mut Value) {
    if let Some(spec) = object.get_mut("spec").filter(|spec| spec.is_object()) {
        set_default(spec, "replicas", json!(1));
        set_default(spec, "revisionHistoryLimit", json!(10));
        set_default(spec, "progressDeadlineSeconds", json!(600));
        if !spec.get("strategy").is_some_and(Value::is_object) {
            spec["strategy"] = json!({});
        }
        let strategy = &mut spec["strategy"];
        set_default(strategy, "type", json!("RollingUpdate"));
        if strategy.get("type") == Some(&json!("RollingUpdate")) {
            if !strategy.get("rollingUpdate").is_some_and(Value::is_object) {
                strategy["rollingUpdate"] = json!({});
            }
            let rolling = &mut strategy["rollingUpdate"];
            set_default(rolling, "maxUnavailable", json!("25%"));
            set_default(rolling, "maxSurge", json!("25%"));
        }
    }
    template(object);
}

fn replica_set(object: &mut Value) {
    if let Some(spec) = object.get_mut("spec").filter(|spec| spec.is_object()) {
        set_default(spec, "replicas", json!(1));
    }
    template(object);
}

/// A ReplicationController's selector, and its own labels when it has none, default to
/// its pod template's labels, as upstream's v1 defaulting does.
fn replication_controller(object: &mut Value) {
    let template_labels = object
        .at("/spec/template/metadata/labels")
        .filter(|labels| labels.is_object())
        .cloned();
    if let Some(labels) = template_labels {
        let empty = |value: Option<&Value>| {
            value
                .and_then(Value::as_object)
                .is_none_or(|m| m.is_empty())
        };
        if empty(object.at("/spec/selector")) {
            object["spec"]["selector"] = labels.clone();
        }
        if empty(object.at("/metadata/labels"))
            && object.get("metadata").is_some_and(Value::is_object)
        {
            object["metadata"]["labels"] = labels;
        }
    }
    if let Some(spec) = object.get_mut("spec").filter(|spec| spec.is_object()) {
        set_default(spec, "replicas", json!(1));
    }
    template(object);
}

fn stateful_set(object: &mut Value) {
    if let Some(spec) = object.get_mut("spec") {
        set_default(spec, "replicas", json!(1));
        set_default(spec, "podManagementPolicy", json!("OrderedReady"));
        set_default(spec, "revisionHistoryLimit", json!(10));
        set_default(
            spec,
            "updateStrategy",
            json!({"type": "RollingUpdate", "rollingUpdate": {"partition": 0}}),
        );
        set_default(
            spec,
            "persistentVolumeClaimRetentionPolicy",
            json!({"whenDeleted": "Retain", "whenScaled": "Retain"}),
        );
    }
    template(object);
}

fn crd(object: &mut Value) {
    if let Some(spec) = object.get_mut("spec") {
        set_default(spec, "conversion", json!({"strategy": "None"}));
        if let Some(names) = spec.get_mut("names") {
            let kind = names
                .get("kind")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            set_default(names, "singular", json!(kind.to_lowercase()));
            set_default(names, "listKind", json!(format!("{kind}List")));
        }
    }
}

/// The status a CRD gets when it is accepted: names accepted and established at once
/// (the embedded server has no naming conflicts to wait out).
pub fn crd_status(object: &Value) -> Value {
    let mut names = object
        .at("/spec/names")
        .cloned()
        .unwrap_or_else(|| json!({}));
    if let Some(kind) = names
        .get("kind")
        .and_then(Value::as_str)
        .map(str::to_string)
    {
        set_default(&mut names, "singular", json!(kind.to_lowercase()));
        set_default(&mut names, "listKind", json!(format!("{kind}List")));
    }
    let stored: Vec<Value> = object
        .at("/spec/versions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
        .filter_map(|v| v.get("name").cloned())
        .collect();
    let condition = |kind: &str, reason: &str, message: &str| {
        json!({"type": kind, "status": "True", "reason": reason, "message": message,
               "lastTransitionTime": object.at("/metadata/creationTimestamp").cloned().unwrap_or(Value::Null)})
    };
    json!({
        "conditions": [
            condition("NamesAccepted", "NoConflicts", "no conflicts found"),
            condition("Established", "InitialNamesAccepted", "the initial names have been accepted"),
        ],
        "acceptedNames": names,
        "storedVersions": stored,
    })
}

/// Structural-schema defaulting: a missing property with a `default` gets it, in every
/// object the schema describes (including items of arrays and values of maps).
pub fn schema_defaults(schema: &Value, object: &mut Value) {
    match object {
        Value::Object(map) => {
            if let Some(Value::Object(properties)) = schema.get("properties") {
                for (name, property) in properties {
                    if !map.contains_key(name)
                        && let Some(default) = property.get("default")
                    {
                        map.insert(name.clone(), default.clone());
                    }
                    if let Some(child) = map.get_mut(name) {
                        schema_defaults(property, child);
                    }
                }
            } else if let Some(additional) =
                schema.get("additionalProperties").filter(|a| a.is_object())
            {
                for value in map.values_mut() {
                    schema_defaults(additional, value);
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for item in items {
                    schema_defaults(item_schema, item);
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_defaults_fill_missing_fields_at_every_depth() {
        let schema = json!({"type": "object", "properties": {
            "spec": {"type": "object", "properties": {
                "replicas": {"type": "integer", "default": 1},
                "items": {"type": "array", "items": {"type": "object", "properties": {
                    "dirName": {"type": "string", "default": "/opt"}}}}
            }}
        }});
        let mut object = json!({"spec": {"items": [{}, {"dirName": "/x"}]}});
        schema_defaults(&schema, &mut object);
        assert_eq!(
            object,
            json!({"spec": {"items": [{"dirName": "/opt"}, {"dirName": "/x"}], "replicas": 1}})
        );
    }

    /// Deployments, ReplicaSets and ReplicationControllers get what upstream's v1
    /// defaulting gives them (pod template defaults aside, checked with pods).
    #[test]
    fn replicated_workloads_get_upstream_defaults() {
        let template = json!({"metadata": {"labels": {"app": "web"}}});
        #[rustfmt::skip]
        // (what, the defaulting, the object, the object defaulted)
        type Case = (&'static str, fn(&mut Value), Value, Value);
        let cases: Vec<Case> = vec![
            (
                "a bare deployment",
                deployment,
                json!({"spec": {"template": template}}),
                json!({"spec": {"template": template, "replicas": 1, "revisionHistoryLimit": 10,
                             "progressDeadlineSeconds": 600,
                             "strategy": {"type": "RollingUpdate",
                                          "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": "25%"}}}}),
            ),
            (
                "a deployment's own values stay",
                deployment,
                json!({"spec": {"replicas": 0, "strategy": {"rollingUpdate": {"maxSurge": 1}}}}),
                json!({"spec": {"replicas": 0, "revisionHistoryLimit": 10, "progressDeadlineSeconds": 600,
                             "strategy": {"type": "RollingUpdate",
                                          "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": 1}}}}),
            ),
            (
                "a recreating deployment rolls nothing",
                deployment,
                json!({"spec": {"strategy": {"type": "Recreate"}}}),
                json!({"spec": {"replicas": 1, "revisionHistoryLimit": 10, "progressDeadlineSeconds": 600,
                             "strategy": {"type": "Recreate"}}}),
            ),
            (
                "a replica set",
                replica_set,
                json!({"spec": {}}),
                json!({"spec": {"replicas": 1}}),
            ),
            (
                "a replication controller takes its template's labels",
                replication_controller,
                json!({"metadata": {}, "spec": {"template": template}}),
                json!({"metadata": {"labels": {"app": "web"}},
                    "spec": {"template": template, "selector": {"app": "web"}, "replicas": 1}}),
            ),
            (
                "but keeps its own",
                replication_controller,
                json!({"metadata": {"labels": {"a": "b"}}, "spec": {"selector": {"c": "d"}, "replicas": 2,
                                                                "template": template}}),
                json!({"metadata": {"labels": {"a": "b"}}, "spec": {"selector": {"c": "d"}, "replicas": 2,
                                                                "template": template}}),
            ),
        ];
        for (name, default, mut object, want) in cases {
            default(&mut object);
            assert_eq!(object, want, "{name}");
        }
    }

    #[test]
    fn secret_string_data_is_merged_into_data() {
        let encoded = |text: &str| json!(STANDARD.encode(text));
        #[rustfmt::skip]
        let cases: Vec<(&str, Value, Value)> = vec![
            ("added to data",
             json!({"data": {"b": encoded("old")}, "stringData": {"a": "x"}}),
             json!({"data": {"a": encoded("x"), "b": encoded("old")}})),
            ("over a data key of the same name",
             json!({"data": {"a": encoded("old")}, "stringData": {"a": "new"}}),
             json!({"data": {"a": encoded("new")}})),
            ("without data",
             json!({"stringData": {"a": "x"}}),
             json!({"data": {"a": encoded("x")}})),
            ("with a null data",
             json!({"data": null, "stringData": {"a": "x"}}),
             json!({"data": {"a": encoded("x")}})),
            ("empty",
             json!({"data": {"b": encoded("old")}, "stringData": {}}),
             json!({"data": {"b": encoded("old")}})),
            ("null",
             json!({"stringData": null}),
             json!({})),
            ("not strings: left for the typed check",
             json!({"stringData": {"a": 1}}),
             json!({"stringData": {"a": 1}})),
            ("not a map: left for the typed check",
             json!({"stringData": ["a"]}),
             json!({"stringData": ["a"]})),
            ("data not a map: left for the typed check",
             json!({"data": "x", "stringData": {"a": "x"}}),
             json!({"data": "x", "stringData": {"a": "x"}})),
        ];
        for (name, mut object, mut want) in cases {
            secret(&mut object);
            want["type"] = json!("Opaque");
            assert_eq!(object, want, "{name}");
        }
    }

    #[test]
    fn image_pull_policy_follows_the_tag() {
        let cases = [
            ("nginx", "Always"),
            ("nginx:latest", "Always"),
            ("nginx:1.27", "IfNotPresent"),
            ("localhost:5000/kmod", "Always"),
            ("localhost:5000/kmod:v1", "IfNotPresent"),
            ("reg/kmod@sha256:abc", "IfNotPresent"),
        ];
        for (image, want) in cases {
            let mut c = json!({"name": "c", "image": image});
            container(&mut c);
            assert_eq!(c["imagePullPolicy"], want, "{image}");
        }
    }
}
