//! Head against base without a cluster: objects compared as their manifests declare them.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::model::{ObjectAction, ObjectChange, ObjectRef};
use crate::sync::diff::unified_between;
use crate::sync::manifests::{Manifest, ObjectId, is_node};
use crate::sync::mask::mask_pair;

/// The objects head creates or configures, in head's file order.
pub fn changes(base: &[Manifest], head: &[Manifest]) -> Vec<ObjectChange> {
    let before: BTreeMap<ObjectId, &Manifest> = base.iter().map(|m| (m.id(), m)).collect();
    head.iter()
        .filter_map(|manifest| match before.get(&manifest.id()) {
            None => Some(change(
                manifest,
                ObjectAction::Create,
                &Value::Null,
                &manifest.object,
            )),
            Some(old) if old.object == manifest.object => None,
            Some(old) => Some(change(
                manifest,
                ObjectAction::Configure,
                &old.object,
                &manifest.object,
            )),
        })
        .collect()
}

/// The manifests of base that head no longer declares, in base's file order.
pub fn departed<'a>(base: &'a [Manifest], head: &[Manifest]) -> Vec<&'a Manifest> {
    let kept: std::collections::BTreeSet<ObjectId> = head.iter().map(Manifest::id).collect();
    base.iter().filter(|m| !kept.contains(&m.id())).collect()
}

/// What happens to a manifest that left: a Node is released, anything else pruned.
pub fn departure(manifest: &Manifest) -> ObjectChange {
    if is_node(manifest) {
        let bare = bare_node(&manifest.api_version, &manifest.name);
        change(manifest, ObjectAction::Release, &manifest.object, &bare)
    } else {
        change(
            manifest,
            ObjectAction::Prune,
            &manifest.object,
            &Value::Null,
        )
    }
}

/// A Node without anything capstan declares on it: what release leaves of capstan's part.
pub fn bare_node(api_version: &str, name: &str) -> Value {
    json!({"apiVersion": api_version, "kind": "Node", "metadata": {"name": name}})
}

/// The identity of a manifest's object.
pub fn object_ref(manifest: &Manifest) -> ObjectRef {
    ObjectRef {
        api_version: manifest.api_version.clone(),
        kind: manifest.kind.clone(),
        namespace: manifest.namespace.clone(),
        name: manifest.name.clone(),
    }
}

fn change(
    manifest: &Manifest,
    action: ObjectAction,
    before: &Value,
    after: &Value,
) -> ObjectChange {
    let (before, after) = mask_pair(before, after);
    ObjectChange {
        id: object_ref(manifest),
        action,
        file: Some(manifest.file.clone()),
        line: Some(manifest.line),
        diff: unified_between(&before, &after, "base", "head"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(kind: &str, name: &str, object: Value) -> Manifest {
        Manifest {
            file: format!("fleet/{name}.yaml"),
            line: 1,
            api_version: "v1".into(),
            kind: kind.into(),
            namespace: (kind != "Node").then(|| "default".to_string()),
            name: name.into(),
            object,
        }
    }

    fn config_map(name: &str, value: &str) -> Manifest {
        manifest(
            "ConfigMap",
            name,
            json!({"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"name": name, "namespace": "default"}, "data": {"k": value}}),
        )
    }

    #[test]
    fn objects_are_created_configured_or_left_alone() {
        let base = [config_map("same", "1"), config_map("changed", "1")];
        let head = [
            config_map("same", "1"),
            config_map("changed", "2"),
            config_map("new", "1"),
        ];
        let found: Vec<(String, ObjectAction)> = changes(&base, &head)
            .into_iter()
            .map(|c| (c.id.name, c.action))
            .collect();
        assert_eq!(
            found,
            [
                ("changed".to_string(), ObjectAction::Configure),
                ("new".to_string(), ObjectAction::Create),
            ]
        );
        let configured = &changes(&base, &head)[0];
        assert!(
            configured.diff.starts_with("--- base\n+++ head\n"),
            "{}",
            configured.diff
        );
        assert!(configured.diff.contains("-  k: '1'") || configured.diff.contains("-  k: \"1\""));
        assert_eq!(configured.file.as_deref(), Some("fleet/changed.yaml"));
    }

    #[test]
    fn a_node_that_left_is_released_and_anything_else_pruned() {
        let node = manifest(
            "Node",
            "worker-9",
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "worker-9",
                   "labels": {"kmm.node.kubernetes.io/version-module.kmm-demo.my-kmod": "v1"}}}),
        );
        let base = [config_map("gone", "1"), node, config_map("kept", "1")];
        let head = [config_map("kept", "1")];
        let left: Vec<ObjectChange> = departed(&base, &head).into_iter().map(departure).collect();
        let actions: Vec<(&str, ObjectAction)> = left
            .iter()
            .map(|c| (c.id.name.as_str(), c.action))
            .collect();
        assert_eq!(
            actions,
            [
                ("gone", ObjectAction::Prune),
                ("worker-9", ObjectAction::Release)
            ]
        );
        assert!(
            left[1]
                .diff
                .contains("-    kmm.node.kubernetes.io/version-module.kmm-demo.my-kmod: v1"),
            "{}",
            left[1].diff
        );
        assert!(left[1].diff.contains(" kind: Node"), "{}", left[1].diff);
    }

    #[test]
    fn secret_values_never_show() {
        let secret = |value: &str| {
            manifest(
                "Secret",
                "token",
                json!({"apiVersion": "v1", "kind": "Secret",
                       "metadata": {"name": "token", "namespace": "default"}, "data": {"token": value}}),
            )
        };
        let created = changes(&[], &[secret("c2VjcmV0")]);
        let configured = changes(&[secret("c2VjcmV0")], &[secret("b3RoZXI=")]);
        let pruned = departure(&secret("c2VjcmV0"));
        for change in [&created[0], &configured[0], &pruned] {
            assert!(
                !change.diff.contains("c2VjcmV0") && !change.diff.contains("b3RoZXI="),
                "{}",
                change.diff
            );
        }
        assert!(
            configured[0].diff.contains("(after)"),
            "{}",
            configured[0].diff
        );
    }
}
