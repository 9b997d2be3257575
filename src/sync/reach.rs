//! The reach the cluster's admin gives a repository (`GitSync.spec.reach`): the namespaces
//! and kinds its objects may be in and of. A commit declaring an object outside it is
//! rejected, naming the file, line and field; the sync never prunes an object outside it.
//!
//! | object                          | checked against                          | field                |
//! |---------------------------------|------------------------------------------|----------------------|
//! | any                             | `kinds` (empty: all), then `deniedKinds` | `kind`               |
//! | namespaced                      | `namespaces` (empty: all), then `deniedNamespaces` | `metadata.namespace` |
//! | a `Namespace`                   | the same, by its name                     | `metadata.name`      |
//! | other cluster-scoped            | kinds only                               |                      |
//!
//! A denial wins over an allowance. Patterns are globs: `*` matches any run of characters.

use capstan_api::capstan::{KindPattern, Reach};

use super::manifests::{Manifest, ManifestError, ObjectId};

/// The problems of `manifests` against `reach`, one per field outside it.
pub fn check(reach: &Reach, manifests: &[Manifest]) -> Vec<ManifestError> {
    if reach.is_unbounded() {
        return Vec::new();
    }
    let mut errors = Vec::new();
    for manifest in manifests {
        let id = manifest.id();
        let error = |field: &str, message: String| {
            ManifestError::new(
                &manifest.file,
                Some(manifest.line),
                Some(field.to_string()),
                message,
            )
        };
        if !kind_allowed(reach, &id.group, &id.kind) {
            errors.push(error(
                "kind",
                format!(
                    "{} is outside this repository's reach: the cluster's admin {} it (the \
                     GitSync's spec.reach)",
                    kind_name(&id.group, &id.kind),
                    if denied_kind(reach, &id.group, &id.kind) {
                        "denies"
                    } else {
                        "does not allow"
                    }
                ),
            ));
        }
        let (field, namespace) = match (&id.namespace, is_namespace(&id)) {
            (Some(namespace), _) => ("metadata.namespace", namespace),
            (None, true) => ("metadata.name", &id.name),
            (None, false) => continue,
        };
        if !namespace_allowed(reach, namespace) {
            errors.push(error(
                field,
                format!(
                    "namespace {namespace} is outside this repository's reach: the cluster's \
                     admin {} it (the GitSync's spec.reach)",
                    if denied_namespace(reach, namespace) {
                        "denies"
                    } else {
                        "does not allow"
                    }
                ),
            ));
        }
    }
    errors
}

/// Whether the object `id` is within `reach`: one outside it is neither written nor pruned.
pub fn allows(reach: &Reach, id: &ObjectId) -> bool {
    let namespace = match (&id.namespace, is_namespace(id)) {
        (Some(namespace), _) => Some(namespace),
        (None, true) => Some(&id.name),
        (None, false) => None,
    };
    kind_allowed(reach, &id.group, &id.kind)
        && namespace.is_none_or(|namespace| namespace_allowed(reach, namespace))
}

fn is_namespace(id: &ObjectId) -> bool {
    id.group.is_empty() && id.kind == "Namespace"
}

fn kind_allowed(reach: &Reach, group: &str, kind: &str) -> bool {
    let allowed = reach.kinds.is_empty() || matches_any(&reach.kinds, group, kind);
    allowed && !denied_kind(reach, group, kind)
}

fn denied_kind(reach: &Reach, group: &str, kind: &str) -> bool {
    matches_any(&reach.denied_kinds, group, kind)
}

fn matches_any(patterns: &[KindPattern], group: &str, kind: &str) -> bool {
    patterns
        .iter()
        .any(|p| glob(&p.group, group) && glob(&p.kind, kind))
}

fn namespace_allowed(reach: &Reach, namespace: &str) -> bool {
    let allowed =
        reach.namespaces.is_empty() || reach.namespaces.iter().any(|p| glob(p, namespace));
    allowed && !denied_namespace(reach, namespace)
}

fn denied_namespace(reach: &Reach, namespace: &str) -> bool {
    reach.denied_namespaces.iter().any(|p| glob(p, namespace))
}

/// `Deployment.apps`, or `ConfigMap` for the core group, as kubectl names kinds.
fn kind_name(group: &str, kind: &str) -> String {
    if group.is_empty() {
        kind.to_string()
    } else {
        format!("{kind}.{group}")
    }
}

/// Whether `text` matches `pattern`, where `*` stands for any run of characters.
fn glob(pattern: &str, text: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = text.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        // No `*`: the whole text is the pattern.
        return rest.is_empty();
    };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

#[cfg(test)]
mod tests {
    use super::*;
    use capstan_api::capstan::ServiceAccountRef;
    use serde_json::json;

    fn manifest(api_version: &str, kind: &str, namespace: Option<&str>, name: &str) -> Manifest {
        Manifest {
            file: "fleet.yaml".into(),
            line: 7,
            api_version: api_version.into(),
            kind: kind.into(),
            namespace: namespace.map(str::to_string),
            name: name.into(),
            object: json!({}),
        }
    }

    fn kinds(patterns: &[(&str, &str)]) -> Vec<KindPattern> {
        patterns
            .iter()
            .map(|(group, kind)| KindPattern {
                group: group.to_string(),
                kind: kind.to_string(),
            })
            .collect()
    }

    #[test]
    fn globs_match_any_run_of_characters_where_a_star_stands() {
        let cases = [
            ("kmm-*", "kmm-demo", true),
            ("kmm-*", "kmm-", true),
            ("kmm-*", "kube-system", false),
            ("*", "", true),
            ("*-system", "kube-system", true),
            ("*-system", "system", false),
            ("a*b*c", "abc", true),
            ("a*b*c", "aXbYc", true),
            ("a*b*c", "acb", false),
            ("ab*ba", "aba", false),
            ("exact", "exact", true),
            ("exact", "exactly", false),
            ("", "", true),
            ("", "x", false),
        ];
        for (pattern, text, expected) in cases {
            assert_eq!(glob(pattern, text), expected, "{pattern:?} ~ {text:?}");
        }
    }

    #[test]
    fn an_object_outside_the_reach_is_an_error_at_its_kind_or_namespace() {
        let reach = Reach {
            namespaces: vec!["kmm-*".into(), "ml".into()],
            denied_namespaces: vec!["kmm-system".into()],
            kinds: kinds(&[("", "*"), ("kmm.sigs.x-k8s.io", "Module"), ("apps", "*")]),
            denied_kinds: kinds(&[("", "Secret"), ("apps", "DaemonSet")]),
            service_account: None,
        };
        // (manifest, the errors' fields and verbs)
        let cases = [
            (manifest("v1", "ConfigMap", Some("kmm-demo"), "c"), vec![]),
            (
                manifest("kmm.sigs.x-k8s.io/v1beta1", "Module", Some("ml"), "m"),
                vec![],
            ),
            (
                manifest("apps/v1", "Deployment", Some("kmm-a"), "d"),
                vec![],
            ),
            (manifest("v1", "Node", None, "worker-1"), vec![]),
            (manifest("v1", "Namespace", None, "kmm-demo"), vec![]),
            (
                manifest("v1", "Namespace", None, "kube-system"),
                vec![("metadata.name", "does not allow")],
            ),
            (
                manifest("v1", "ConfigMap", Some("kmm-system"), "c"),
                vec![("metadata.namespace", "denies")],
            ),
            (
                manifest("v1", "Secret", Some("kmm-demo"), "s"),
                vec![("kind", "denies")],
            ),
            (
                manifest(
                    "rbac.authorization.k8s.io/v1",
                    "ClusterRoleBinding",
                    None,
                    "x",
                ),
                vec![("kind", "does not allow")],
            ),
            (
                manifest("apps/v1", "DaemonSet", Some("default"), "ds"),
                vec![("kind", "denies"), ("metadata.namespace", "does not allow")],
            ),
        ];
        for (object, expected) in cases {
            let errors = check(&reach, std::slice::from_ref(&object));
            let found: Vec<(&str, bool)> = errors
                .iter()
                .map(|e| (e.field.as_deref().unwrap_or_default(), e.line == Some(7)))
                .collect();
            let wanted: Vec<(&str, bool)> = expected.iter().map(|(f, _)| (*f, true)).collect();
            assert_eq!(found, wanted, "{}", object.id());
            for (error, (_, verb)) in errors.iter().zip(&expected) {
                assert!(error.message.contains(verb), "{error}");
            }
            assert_eq!(
                allows(&reach, &object.id()),
                expected.is_empty(),
                "{}",
                object.id()
            );
        }
    }

    #[test]
    fn an_unbounded_reach_allows_everything_and_a_service_account_alone_bounds_nothing_here() {
        let everything = [
            manifest("v1", "Secret", Some("kube-system"), "s"),
            manifest("v1", "Namespace", None, "kube-system"),
        ];
        assert!(check(&Reach::default(), &everything).is_empty());
        let impersonating = Reach {
            service_account: Some(ServiceAccountRef {
                namespace: "capstan-system".into(),
                name: "fleet".into(),
            }),
            ..Reach::default()
        };
        assert!(check(&impersonating, &everything).is_empty());
    }
}
