//! Rules that compare a commit's desired state with the previous one, because a single
//! commit cannot tell: which version labels moved, how a Module's version changed, and
//! which Namespaces left the repository.
//!
//! A node still labelled with a Module's old version is normal during an ordered upgrade
//! (seed 002: nodes not relabelled keep the old version); a label that *changes* must name
//! the Module's current version, since that is the only version a node can move to.

use std::collections::BTreeMap;

use kube::Resource;
use serde_json::Value;

use super::rules::{KmmLabel, classify, is_node, modules_in};
use super::yaml::FieldPath;
use super::{DesiredState, Manifest, ManifestError, ObjectId};
use capstan_api::Module;

/// Checks the step from `previous` (the last applied or base commit; `None` when there is
/// none) to `next`:
///
/// - every version label of a Node that is new or changed (every one, without `previous`)
///   names the version its Module declares in `next`;
/// - a Module's `spec.moduleLoader.container.version` does not go from empty to set or
///   back (as KMM's webhook refuses);
/// - a Module's version and kmod images change together: a new version with the same
///   images, or a changed image under the same version, is refused (seed 002 step 2);
/// - with pruning on, a Namespace whose manifest `next` removes holds none of `next`'s
///   objects (pruning it would delete them with it).
///
/// Returns every problem, each naming the file and document line of `next`.
pub fn check_transition(
    previous: Option<&DesiredState>,
    next: &DesiredState,
) -> Vec<ManifestError> {
    let mut errors = version_label_moves(previous, next);
    if let Some(previous) = previous {
        errors.extend(module_updates(previous, next));
        errors.extend(namespaces_pruned_under_objects(previous, next));
    }
    errors.sort_by(|a, b| (&a.file, a.line).cmp(&(&b.file, b.line)));
    errors
}

fn version_label_moves(previous: Option<&DesiredState>, next: &DesiredState) -> Vec<ManifestError> {
    let modules = modules_in(next.manifests.iter());
    let before: BTreeMap<ObjectId, &Manifest> = previous
        .into_iter()
        .flat_map(|state| state.manifests.iter())
        .filter(|m| is_node(m))
        .map(|m| (m.id(), m))
        .collect();
    let mut errors = Vec::new();
    for node in next.manifests.iter().filter(|m| is_node(m)) {
        let old_labels = before.get(&node.id()).and_then(|old| labels(old));
        for (key, value) in labels(node).into_iter().flatten() {
            let Some(KmmLabel::Version(module)) = classify(key, &modules) else {
                continue;
            };
            // Missing Modules and versions are reported by `load`.
            let Some(declared) = modules.get(&module) else {
                continue;
            };
            let value = value.as_str().unwrap_or_default();
            let unchanged = old_labels.and_then(|old| old.get(key)) == Some(&Value::from(value));
            if unchanged || value == declared.version {
                continue;
            }
            errors.push(ManifestError::new(
                &node.file,
                Some(node.line),
                Some(
                    FieldPath::of(&["metadata", "labels"])
                        .field(key)
                        .to_string(),
                ),
                format!(
                    "version label moves to {value:?}, but Module {module} ({}:{}) declares \
                     version {:?}; a node can only be moved to the Module's version",
                    declared.file, declared.line, declared.version
                ),
            ));
        }
    }
    errors
}

fn labels(manifest: &Manifest) -> Option<&serde_json::Map<String, Value>> {
    manifest
        .object
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
}

fn module_updates(previous: &DesiredState, next: &DesiredState) -> Vec<ManifestError> {
    let is_module =
        |m: &&Manifest| m.api_version == Module::api_version(&()) && m.kind == Module::kind(&());
    let before: BTreeMap<ObjectId, &Manifest> = previous
        .manifests
        .iter()
        .filter(is_module)
        .map(|m| (m.id(), m))
        .collect();
    let mut errors = Vec::new();
    for module in next.manifests.iter().filter(is_module) {
        let Some(old) = before.get(&module.id()) else {
            continue;
        };
        if let Some((field, message)) =
            module_update_problem(&ModuleImages::of(old), &ModuleImages::of(module))
        {
            errors.push(ManifestError::new(
                &module.file,
                Some(module.line),
                Some(
                    FieldPath::of(&["spec", "moduleLoader", "container"])
                        .field(field)
                        .to_string(),
                ),
                message,
            ));
        }
    }
    errors
}

/// The objects of `next` that live in a Namespace `previous` declared and `next` no longer
/// does. Pruning deletes that Namespace, and the API server deletes everything in it, so
/// the commit would declare objects and delete them in one go. Without pruning the
/// Namespace stays, and so do they.
fn namespaces_pruned_under_objects(
    previous: &DesiredState,
    next: &DesiredState,
) -> Vec<ManifestError> {
    if !next.settings.prune {
        return Vec::new();
    }
    let declared = |state: &DesiredState| -> BTreeMap<String, String> {
        state
            .manifests
            .iter()
            .filter(|m| is_namespace(m))
            .map(|m| (m.name.clone(), format!("{}:{}", m.file, m.line)))
            .collect()
    };
    let kept = declared(next);
    let removed: BTreeMap<String, String> = declared(previous)
        .into_iter()
        .filter(|(name, _)| !kept.contains_key(name))
        .collect();
    let mut errors = Vec::new();
    for object in &next.manifests {
        let Some(namespace) = object.namespace.as_deref() else {
            continue;
        };
        let Some(was_at) = removed.get(namespace) else {
            continue;
        };
        let id = object.id();
        errors.push(ManifestError::new(
            &object.file,
            Some(object.line),
            Some(FieldPath::of(&["metadata", "namespace"]).to_string()),
            format!(
                "Namespace {namespace} leaves the repository (the previous commit declared it at \
                 {was_at}) but {id} stays in it: pruning the Namespace would delete the {kind} \
                 with it; keep the Namespace's manifest, or remove everything in it in the same \
                 commit",
                kind = id.kind
            ),
        ));
    }
    errors
}

fn is_namespace(manifest: &Manifest) -> bool {
    manifest.api_version == "v1" && manifest.kind == "Namespace"
}

/// The parts of a Module an update must change together.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct ModuleImages {
    version: String,
    /// `containerImage` of the container: the default of every mapping.
    default_image: String,
    /// `containerImage` of each kernel mapping, by what it matches.
    mapping_images: BTreeMap<String, String>,
}

impl ModuleImages {
    fn of(manifest: &Manifest) -> Self {
        let container = manifest.object.pointer("/spec/moduleLoader/container");
        let text = |value: Option<&Value>, field: &str| {
            value
                .and_then(|v| v.get(field))
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        let mappings = container
            .and_then(|c| c.get("kernelMappings"))
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .map(|mapping| {
                let matcher = format!(
                    "literal {} regexp {}",
                    text(Some(mapping), "literal"),
                    text(Some(mapping), "regexp")
                );
                (matcher, text(Some(mapping), "containerImage"))
            })
            .collect();
        ModuleImages {
            version: text(container, "version"),
            default_image: text(container, "containerImage"),
            mapping_images: mappings,
        }
    }
}

/// What is wrong with a Module update from `old` to `new`, as (field, message).
fn module_update_problem(old: &ModuleImages, new: &ModuleImages) -> Option<(&'static str, String)> {
    match (old.version.is_empty(), new.version.is_empty()) {
        (true, true) => return None,
        (true, false) => {
            return Some((
                "version",
                format!(
                    "cannot go from unset to {:?}: a Module without a version cannot start \
                     ordered upgrades; create a new Module instead",
                    new.version
                ),
            ));
        }
        (false, true) => {
            return Some((
                "version",
                format!(
                    "cannot go from {:?} to unset: nodes labelled with that version would lose \
                     their module; keep a version",
                    old.version
                ),
            ));
        }
        (false, false) => {}
    }
    let any_image_changed =
        old.default_image != new.default_image || old.mapping_images != new.mapping_images;
    // Adding a mapping for a new kernel leaves the nodes already served untouched.
    let served_image_changed = old.default_image != new.default_image
        || old.mapping_images.iter().any(|(matcher, image)| {
            new.mapping_images
                .get(matcher)
                .is_some_and(|new| new != image)
        });
    if old.version != new.version && !any_image_changed {
        return Some((
            "version",
            format!(
                "changes from {:?} to {:?} but no kmod image changes: change containerImage in \
                 the same commit (the update must be atomic)",
                old.version, new.version
            ),
        ));
    }
    if old.version == new.version && served_image_changed {
        return Some((
            "version",
            format!(
                "stays {:?} while a kmod image changes: change the version in the same commit, \
                 so nodes move to the new image one by one through their version labels",
                old.version
            ),
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn images(version: &str, default: &str, mappings: &[(&str, &str)]) -> ModuleImages {
        ModuleImages {
            version: version.to_string(),
            default_image: default.to_string(),
            mapping_images: mappings
                .iter()
                .map(|(matcher, image)| (matcher.to_string(), image.to_string()))
                .collect(),
        }
    }

    #[test]
    fn module_update_decision_table() {
        let v1 = images("v1", "", &[("6.0", "img:v1-6.0"), ("^.+$", "img:v1")]);
        let cases = [
            ("unchanged", v1.clone(), None),
            (
                "atomic bump",
                images("v2", "", &[("6.0", "img:v2-6.0"), ("^.+$", "img:v2")]),
                None,
            ),
            (
                "bump with one image",
                images("v2", "", &[("6.0", "img:v1-6.0"), ("^.+$", "img:v2")]),
                None,
            ),
            (
                "version only",
                images("v2", "", &[("6.0", "img:v1-6.0"), ("^.+$", "img:v1")]),
                Some("no kmod image changes"),
            ),
            (
                "image only",
                images("v1", "", &[("6.0", "img:v1-6.0"), ("^.+$", "img:v2")]),
                Some("stays \"v1\""),
            ),
            (
                "default image only",
                images("v1", "img:x", &[("6.0", "img:v1-6.0"), ("^.+$", "img:v1")]),
                Some("stays \"v1\""),
            ),
            (
                "new kernel mapping",
                images(
                    "v1",
                    "",
                    &[
                        ("6.0", "img:v1-6.0"),
                        ("6.1", "img:v1-6.1"),
                        ("^.+$", "img:v1"),
                    ],
                ),
                None,
            ),
            (
                "unset",
                images("", "", &[("6.0", "img:v1-6.0"), ("^.+$", "img:v1")]),
                Some("to unset"),
            ),
        ];
        for (case, new, expected) in cases {
            let problem = module_update_problem(&v1, &new).map(|(_, message)| message);
            match (problem, expected) {
                (None, None) => {}
                (Some(message), Some(words)) => {
                    assert!(message.contains(words), "{case}: {message}")
                }
                (problem, expected) => panic!("{case}: {problem:?}, expected {expected:?}"),
            }
        }
        let unversioned = images("", "img:a", &[]);
        assert_eq!(
            module_update_problem(&unversioned, &images("", "img:b", &[])),
            None
        );
        assert!(module_update_problem(&unversioned, &images("v1", "img:b", &[])).is_some());
    }
}
