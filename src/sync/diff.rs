//! What applying an object would change, as server-side apply sees it: the object is
//! applied with `dryRun=All` under capstan's field manager and the result compared with
//! the live object, both without the fields the server owns (status, managedFields,
//! resourceVersion, generation, uid, timestamps). Defaults the server fills in are on both
//! sides, so they make no noise. Secret values are masked ([`mask_pair`]).

use capstan_api::managers;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::discovery::ApiResource;
use serde_json::Value;
use similar::TextDiff;

use super::mask::mask_pair;

use capstan_api::labels::{PULL_REQUEST_ANNOTATION, REVISION_ANNOTATION};

/// How an object would change.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    Create,
    Configure,
    Unchanged,
}

/// The outcome for one object.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ObjectDiff {
    pub action: Action,
    /// A unified diff of the object's YAML (empty when unchanged).
    pub diff: String,
}

/// Why a diff could not be computed.
#[derive(Debug, thiserror::Error)]
pub enum DiffError {
    #[error("{object}: the API server refused the dry run: {source}")]
    DryRun {
        object: String,
        #[source]
        source: kube::Error,
    },
    #[error("{object}: reading the live object: {source}")]
    Live {
        object: String,
        #[source]
        source: kube::Error,
    },
}

/// Diffs one desired object against the cluster through a server-side apply dry run.
pub async fn diff_object(
    client: &kube::Client,
    resource: &ApiResource,
    desired: &Value,
) -> Result<ObjectDiff, DiffError> {
    let name = desired
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    let namespace = desired
        .pointer("/metadata/namespace")
        .and_then(Value::as_str);
    let api: Api<DynamicObject> = match namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, resource),
        None => Api::all_with(client.clone(), resource),
    };
    let shown = format!(
        "{} {}",
        resource.kind,
        namespace
            .map(|ns| format!("{ns}/{name}"))
            .unwrap_or_else(|| name.to_string())
    );
    let live = api.get_opt(name).await.map_err(|source| DiffError::Live {
        object: shown.clone(),
        source,
    })?;
    let params = PatchParams::apply(managers::SYNC).force().dry_run();
    let applied = api
        .patch(name, &params, &Patch::Apply(desired))
        .await
        .map_err(|source| DiffError::DryRun {
            object: shown,
            source,
        })?;
    let after = comparable(&serde_json::to_value(&applied).unwrap_or(Value::Null));
    match live {
        None => {
            let (_, after) = mask_pair(&Value::Null, &after);
            Ok(ObjectDiff {
                action: Action::Create,
                diff: unified(&Value::Null, &after),
            })
        }
        Some(live) => {
            let before = comparable(&serde_json::to_value(&live).unwrap_or(Value::Null));
            if before == after {
                Ok(ObjectDiff {
                    action: Action::Unchanged,
                    diff: String::new(),
                })
            } else {
                let (before, after) = mask_pair(&before, &after);
                Ok(ObjectDiff {
                    action: Action::Configure,
                    diff: unified(&before, &after),
                })
            }
        }
    }
}

/// The object without what the server owns, for comparing desired with live. capstan's
/// own stamps ([`stamped`](super::inventory::stamped)) are left out too: they say which
/// commit last changed the object, not what the object is.
pub fn comparable(object: &Value) -> Value {
    let mut object = object.clone();
    if let Some(map) = object.as_object_mut() {
        map.remove("status");
    }
    if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        for field in [
            "managedFields",
            "resourceVersion",
            "generation",
            "uid",
            "creationTimestamp",
            "selfLink",
        ] {
            meta.remove(field);
        }
        if let Some(annotations) = meta.get_mut("annotations").and_then(Value::as_object_mut) {
            annotations.remove(REVISION_ANNOTATION);
            annotations.remove(PULL_REQUEST_ANNOTATION);
        }
        if meta
            .get("annotations")
            .and_then(Value::as_object)
            .is_some_and(|a| a.is_empty())
        {
            meta.remove("annotations");
        }
    }
    object
}

/// A unified diff of two objects' YAML, the live one against the desired one.
pub fn unified(before: &Value, after: &Value) -> String {
    unified_between(before, after, "live", "desired")
}

/// A unified diff of two objects' YAML under the headers `--- <old>` and `+++ <new>`;
/// `Null` stands for no object.
pub fn unified_between(before: &Value, after: &Value, old: &str, new: &str) -> String {
    let text = |v: &Value| {
        if v.is_null() {
            String::new()
        } else {
            serde_saphyr::to_string(v).unwrap_or_default()
        }
    };
    let (before, after) = (text(before), text(after));
    TextDiff::from_lines(&before, &after)
        .unified_diff()
        .context_radius(3)
        .header(old, new)
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn server_owned_fields_make_no_difference() {
        let live = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "a", "uid": "u", "resourceVersion": "7", "managedFields": [{}], "creationTimestamp": "t"},
            "data": {"k": "v"}});
        let desired = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}, "data": {"k": "v"}});
        assert_eq!(comparable(&live), comparable(&desired));
    }

    #[test]
    fn a_new_object_diffs_against_nothing() {
        let diff = unified(
            &Value::Null,
            &json!({"kind": "ConfigMap", "metadata": {"name": "a"}}),
        );
        assert!(diff.contains("+kind: ConfigMap"), "{diff}");
    }
}
