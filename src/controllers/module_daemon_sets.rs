//! What the device-plugin and DRA controllers share about the DaemonSets they run for a
//! Module on the nodes where it is loaded: the labels that make a DaemonSet a Module's
//! ([`daemon_set_labels`], [`has_labels`]), its node selector ([`node_selector`]), its
//! privileged containers ([`container`]), the applied-digest annotation and whether a live
//! object is as applied ([`annotate_digest`], [`is_applied`]), when an old version's
//! DaemonSet may go ([`schedules_nothing`]), the counts of the Module's status
//! ([`status_counts`]) and their write ([`write_status`]), and the signal of node label
//! changes on which both recount every Module ([`follow_node_labels`]). [`owned_daemon_set`]
//! puts the DaemonSet together.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use futures::channel::mpsc;
use futures::{Stream, StreamExt};
use k8s_openapi::api::apps::v1::{DaemonSet, DaemonSetSpec};
use k8s_openapi::api::core::v1::{Container, Node, PodSpec, PodTemplateSpec, SecurityContext};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::{ObjectRef, Store};
use serde_json::{Value, json};

use super::context::Context;
use super::module_nmc::ModuleFacts;
use super::node::NodeFacts;
use capstan_api::canonical::digest;
use capstan_api::labels::{APPLIED_DIGEST_ANNOTATION, MODULE_NAME_LABEL, ModuleKey, ROLE_LABEL};
use capstan_api::module::{CommonContainerSpec, DaemonSetStatus, Module, ModuleSpec};

/// Why a Module's DaemonSet (a device plugin's, a DRA driver's) cannot be made.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DaemonSetError {
    /// The Module's version cannot be a label value, so no node selector can name it.
    #[error("Module {module}: version {version:?} cannot be a node label value: {source}")]
    InvalidVersion {
        /// `namespace/name` of the Module.
        module: String,
        /// The Module's `spec.moduleLoader.container.version`.
        version: String,
        /// Why it is not a label value.
        source: Box<capstan_api::labels::LabelError>,
    },
    /// The Module has no `metadata.uid`, so its DaemonSets cannot name it as their owner.
    #[error("Module {module} has no metadata.uid; it must be read from the cluster")]
    MissingUid {
        /// `namespace/name` of the Module.
        module: String,
    },
}

/// Fails when `version` of the Module `key` cannot be a label value: a DaemonSet's node
/// selector names it.
pub fn check_version(key: &ModuleKey, version: Option<&str>) -> Result<(), DaemonSetError> {
    if let Some(version) = version {
        capstan_api::labels::validate_label_value(version).map_err(|source| {
            DaemonSetError::InvalidVersion {
                module: key.to_string(),
                version: version.to_string(),
                source: Box::new(source),
            }
        })?;
    }
    Ok(())
}

/// The Module as the controller owner of its DaemonSets; as upstream's controller
/// reference, foreground deletion of the Module waits for them.
pub fn owner(module: &ModuleFacts) -> Result<OwnerReference, DaemonSetError> {
    use kube::Resource as _;
    let mut owner =
        module
            .object
            .controller_owner_ref(&())
            .ok_or_else(|| DaemonSetError::MissingUid {
                module: module.key.to_string(),
            })?;
    owner.block_owner_deletion = Some(true);
    Ok(owner)
}

/// The labels of the DaemonSet of `role` (device plugin, DRA driver) for `version`, which
/// are also its selector and its pods' labels: the role, the Module's name and, with a
/// version, the version-device-plugin label naming it (as upstream labels versioned
/// DaemonSets).
pub fn daemon_set_labels(
    role: &str,
    key: &ModuleKey,
    version: Option<&str>,
) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::from([
        (ROLE_LABEL.to_string(), role.to_string()),
        (MODULE_NAME_LABEL.to_string(), key.name().to_string()),
    ]);
    if let Some(version) = version {
        labels.insert(key.version_device_plugin_label(), version.to_string());
    }
    labels
}

/// True when the object of `metadata` is one of `role` of the Module `key`: in its
/// namespace, with the role and the Module's name label.
pub fn has_labels(metadata: &ObjectMeta, role: &str, key: &ModuleKey) -> bool {
    let label = |name: &str| {
        metadata
            .labels
            .as_ref()
            .and_then(|labels| labels.get(name))
            .map(String::as_str)
    };
    metadata.namespace.as_deref() == Some(key.namespace())
        && label(ROLE_LABEL) == Some(role)
        && label(MODULE_NAME_LABEL) == Some(key.name())
}

/// The node selector of the Module's DaemonSet for `version`: its `spec.selector`, plus,
/// when the Module loads a kernel module, the ready label and the version-device-plugin
/// label of its version, so the pods run only where that version is loaded.
pub fn node_selector(
    key: &ModuleKey,
    spec: &ModuleSpec,
    version: Option<&str>,
) -> BTreeMap<String, String> {
    let mut selector = spec.selector.clone();
    if spec.module_loader.is_some() {
        selector.insert(key.ready_label(), String::new());
        if let Some(version) = version {
            selector.insert(key.version_device_plugin_label(), version.to_string());
        }
    }
    selector
}

/// The DaemonSet `name` in the Module's namespace: owned by `owner`, selecting and labelling
/// its pods with `labels`, running `pod` in pods that carry `finalizers`, annotated with the
/// digest of its content (see [`annotate_digest`]).
pub fn owned_daemon_set(
    name: String,
    key: &ModuleKey,
    labels: BTreeMap<String, String>,
    owner: OwnerReference,
    finalizers: Option<Vec<String>>,
    pod: PodSpec,
) -> DaemonSet {
    let mut ds = DaemonSet {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(key.namespace().to_string()),
            labels: Some(labels.clone()),
            owner_references: Some(vec![owner]),
            ..ObjectMeta::default()
        },
        spec: Some(DaemonSetSpec {
            selector: LabelSelector {
                match_labels: Some(labels.clone()),
                ..LabelSelector::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    finalizers,
                    ..ObjectMeta::default()
                }),
                spec: Some(pod),
            },
            ..DaemonSetSpec::default()
        }),
        status: None,
    };
    let content = serde_json::to_value(&ds).unwrap_or(Value::Null);
    annotate_digest(&mut ds.metadata, &content);
    ds
}

/// A privileged container from the Module's spec, as given.
pub fn container(spec: &CommonContainerSpec, name: &str) -> Container {
    Container {
        name: name.to_string(),
        image: Some(spec.image.clone()),
        command: non_empty_list(&spec.command),
        args: non_empty_list(&spec.args),
        env: non_empty_list(&spec.env),
        image_pull_policy: non_empty(&spec.image_pull_policy),
        resources: spec.resources.clone(),
        security_context: Some(SecurityContext {
            privileged: Some(true),
            ..SecurityContext::default()
        }),
        volume_mounts: non_empty_list(&spec.volume_mounts),
        ..Container::default()
    }
}

/// Unset fields stay out of the applied object, as the Module leaves them out.
pub fn non_empty(value: &str) -> Option<String> {
    (!value.is_empty()).then(|| value.to_string())
}

/// An empty list stays out of the applied object, as the Module leaves it out.
pub fn non_empty_list<T: Clone>(values: &[T]) -> Option<Vec<T>> {
    (!values.is_empty()).then(|| values.to_vec())
}

/// Sets the digest of `content` as the applied-digest annotation, which changes when the
/// wanted object stops setting a field that [`is_applied`] cannot see go.
pub fn annotate_digest(metadata: &mut ObjectMeta, content: &impl serde::Serialize) {
    let content = serde_json::to_value(content).unwrap_or(Value::Null);
    metadata.annotations = Some(BTreeMap::from([(
        APPLIED_DIGEST_ANNOTATION.to_string(),
        digest(&content),
    )]));
}

/// True when applying `wanted` would change nothing in `live`: every field `wanted` sets
/// has the same value there (the server adds defaults and status of its own), including the
/// digest annotation, which changes when `wanted` stops setting a field.
pub fn is_applied<K: serde::Serialize>(wanted: &K, live: &K) -> bool {
    match (serde_json::to_value(wanted), serde_json::to_value(live)) {
        (Ok(wanted), Ok(live)) => covers(&live, &wanted),
        _ => false,
    }
}

/// True when `live` holds every field of `wanted` with the same value; lists must have the
/// same length, their items compared in order.
fn covers(live: &Value, wanted: &Value) -> bool {
    match (wanted, live) {
        (Value::Object(wanted), Value::Object(live)) => wanted
            .iter()
            .all(|(field, value)| live.get(field).is_some_and(|have| covers(have, value))),
        (Value::Array(wanted), Value::Array(live)) => {
            wanted.len() == live.len()
                && wanted
                    .iter()
                    .zip(live)
                    .all(|(want, have)| covers(have, want))
        }
        _ => wanted == live,
    }
}

/// True when the DaemonSet's status, observed at its current generation, shows no node
/// that should run its pod, runs it, or runs it though it should not.
pub fn schedules_nothing(ds: &DaemonSet) -> bool {
    let generation = ds.metadata.generation.unwrap_or(0);
    ds.status.as_ref().is_some_and(|status| {
        status.observed_generation.unwrap_or(0) >= generation
            && status.desired_number_scheduled == 0
            && status.current_number_scheduled == 0
            && status.number_misscheduled == 0
    })
}

/// The counts of a Module's status for its DaemonSets `owned` (every version):
/// `nodesMatchingSelectorNumber` counts the nodes its selector targets whose taints
/// `spec.tolerations` tolerate, `desiredNumber` and `availableNumber` add up
/// `desiredNumberScheduled` and `numberAvailable` of the DaemonSets.
pub fn status_counts<'a, 'b>(
    module: &ModuleFacts,
    nodes: impl IntoIterator<Item = &'a NodeFacts>,
    owned: impl IntoIterator<Item = &'b DaemonSet>,
) -> DaemonSetStatus {
    let targeted = nodes
        .into_iter()
        .filter(|node| {
            module.selects(&node.labels) && node.targetable(&module.object.spec.tolerations)
        })
        .count();
    let (mut desired, mut available) = (0i64, 0i64);
    for status in owned.into_iter().filter_map(|ds| ds.status.as_ref()) {
        desired += i64::from(status.desired_number_scheduled);
        available += i64::from(status.number_available.unwrap_or(0));
    }
    let count = |n: i64| i32::try_from(n).unwrap_or(i32::MAX);
    DaemonSetStatus {
        nodes_matching_selector_number: count(i64::try_from(targeted).unwrap_or(i64::MAX)),
        desired_number: count(desired),
        available_number: count(available),
    }
}

/// Writes `status.<field>` (`devicePlugin`, `dra`) of the Module `key` as `counts`, by a
/// JSON merge patch of the status subresource that touches nothing else (field manager
/// `manager`). Fails when the API server refuses it.
pub async fn write_status(
    client: &kube::Client,
    key: &ModuleKey,
    field: &str,
    manager: &str,
    counts: &DaemonSetStatus,
) -> Result<(), kube::Error> {
    let modules: Api<Module> = Api::namespaced(client.clone(), key.namespace());
    let params = PatchParams {
        field_manager: Some(manager.to_string()),
        ..PatchParams::default()
    };
    let patch = json!({"status": {field: counts}});
    modules
        .patch_status(key.name(), &params, &Patch::Merge(patch))
        .await?;
    tracing::debug!(module = %key, ?counts, "wrote status.{field}");
    Ok(())
}

/// Sends a signal whenever a node's labels change or a node goes; stops on shutdown. The
/// cache passes on every node it applies or deletes (all of them after a relist); a node
/// the store no longer holds was deleted.
pub async fn follow_node_labels(
    changes: impl Stream<Item = Arc<Node>>,
    nodes: Store<Node>,
    labels_changed: mpsc::UnboundedSender<()>,
    ctx: &Context,
) {
    let mut known: HashMap<String, BTreeMap<String, String>> = HashMap::new();
    let mut changes = std::pin::pin!(changes.take_until(ctx.shutdown.cancelled()));
    while let Some(node) = changes.next().await {
        let name = node.name_any();
        let changed = if nodes.get(&ObjectRef::new(&name)).is_none() {
            known.remove(&name).is_some()
        } else {
            let labels = node.labels().clone();
            known.insert(name, labels.clone()) != Some(labels)
        };
        if changed {
            // Fails only once the controller has stopped listening.
            let _ = labels_changed.unbounded_send(());
        }
    }
}

/// The write to one object a Module's DaemonSet controller owns (a DaemonSet, a
/// DeviceClass).
#[derive(Clone, Debug, PartialEq)]
pub enum Action<K> {
    /// Server-side apply this object (create or update).
    Apply(Box<K>),
    /// Delete the object, provided it is still the one the decision saw.
    Delete {
        /// `metadata.uid` of the object decided on.
        uid: Option<String>,
        /// `metadata.resourceVersion` of the object decided on.
        resource_version: Option<String>,
    },
    /// Leave it as it is.
    Unchanged,
}

/// What the DaemonSet `ds` of a Module (its `what`: device plugin, DRA driver) still waits
/// for, if anything: its controller to see its generation, or a pod ready on every node it
/// schedules.
pub fn rollout_pending(what: &str, ds: &DaemonSet) -> Option<String> {
    let status = ds.status.clone().unwrap_or_default();
    let current = status.observed_generation.unwrap_or(0) >= ds.metadata.generation.unwrap_or(0);
    (!current || status.number_ready != status.desired_number_scheduled).then(|| {
        format!(
            "{what} {}/{} is ready on {} of {} nodes",
            ds.namespace().unwrap_or_default(),
            ds.name_any(),
            status.number_ready,
            status.desired_number_scheduled
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::DaemonSetStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    /// A DaemonSet at generation 2 whose status saw `observed`, with `ready` of `desired`
    /// pods ready.
    fn daemon_set(observed: i64, ready: i32, desired: i32) -> DaemonSet {
        DaemonSet {
            metadata: ObjectMeta {
                name: Some("my-kmod-dra-v1".into()),
                namespace: Some("kmm-demo".into()),
                generation: Some(2),
                ..ObjectMeta::default()
            },
            status: Some(DaemonSetStatus {
                observed_generation: Some(observed),
                number_ready: ready,
                desired_number_scheduled: desired,
                ..DaemonSetStatus::default()
            }),
            ..DaemonSet::default()
        }
    }

    #[test]
    fn a_dra_driver_is_waited_for_until_it_is_ready_on_every_node_it_schedules() {
        // (name, DaemonSet, pending)
        let rows = [
            ("rolled out", daemon_set(2, 3, 3), None),
            ("schedules nothing", daemon_set(2, 0, 0), None),
            (
                "a pod not ready",
                daemon_set(2, 2, 3),
                Some("DRA driver kmm-demo/my-kmod-dra-v1 is ready on 2 of 3 nodes"),
            ),
            (
                "its generation not seen yet",
                daemon_set(1, 3, 3),
                Some("DRA driver kmm-demo/my-kmod-dra-v1 is ready on 3 of 3 nodes"),
            ),
            (
                "no status yet",
                DaemonSet {
                    status: None,
                    ..daemon_set(0, 0, 0)
                },
                Some("DRA driver kmm-demo/my-kmod-dra-v1 is ready on 0 of 0 nodes"),
            ),
        ];
        for (name, ds, pending) in rows {
            assert_eq!(
                rollout_pending("DRA driver", &ds).as_deref(),
                pending,
                "{name}"
            );
        }
        assert_eq!(
            rollout_pending("device plugin", &daemon_set(2, 2, 3)).as_deref(),
            Some("device plugin kmm-demo/my-kmod-dra-v1 is ready on 2 of 3 nodes")
        );
    }
}
