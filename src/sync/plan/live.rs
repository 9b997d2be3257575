//! Head against the live cluster: server-side apply dry runs for what head declares, the
//! `GitSync` inventory for what it no longer declares, the nodes' live version labels, the
//! revisions LeaderWorkerSets run, and the pods on the nodes a campaign drains.

use capstan_api::managers;
use std::collections::{BTreeMap, BTreeSet};

use capstan_api::LeaderWorkerSet;
use capstan_api::lws::RestartPolicy;
use k8s_openapi::api::apps::v1::{ControllerRevision, StatefulSet};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::api::ListParams;
use kube::{Api, ResourceExt as _};
use serde_json::{Map, Value, json};

use super::PlanError;
use super::lws;
use super::model::{LeaderWorkerSetChange, ObjectAction, ObjectChange, ObjectRef};
use super::offline::{bare_node, object_ref};
use super::steps::{VersionLabels, declared_version_labels, labels_of, version_labels_in};
use crate::controllers::lws::labels::NAME_LABEL;
use crate::sync::apply::{self, LiveObjects, contains};
use crate::sync::diff::{Action, DiffError, comparable, diff_object, unified};
use crate::sync::discovery::ClusterKinds;
use crate::sync::inventory::{Inventory, stamped_by, stamps_of};
use crate::sync::manifests::{Manifest, ManifestError, ObjectId, is_node, modules_in};
use crate::sync::mask::{Scrub, mask_pair};
use crate::sync::source::CommitInfo;
use capstan_api::InventoryEntry;
use capstan_api::canonical::digest;

/// The cluster a live plan reads.
pub struct Cluster<'a> {
    /// A client for it.
    pub client: &'a kube::Client,
    /// The kinds it serves.
    pub kinds: &'a ClusterKinds,
}

/// What a live plan knows without a dry run: what capstan applied (the `GitSync`
/// inventory's digests) and the live objects head declares (one list per kind, as the sync
/// reads them).
pub struct Known<'a> {
    inventory: &'a Inventory,
    live: LiveObjects,
}

impl<'a> Known<'a> {
    /// Reads the live objects `head` declares; `None` when they cannot all be read (the
    /// plan's identity may not list or get some): then every object is dry-run, and the
    /// dry runs say what is refused, as they did without this.
    pub async fn read(
        cluster: &Cluster<'_>,
        head: &[Manifest],
        inventory: &'a Inventory,
    ) -> Option<Known<'a>> {
        let live = apply::read_live(cluster.client, cluster.kinds, head)
            .await
            .ok()?;
        Some(Known { inventory, live })
    }

    /// Whether applying `manifest` surely changes nothing, as the sync judges it before
    /// writing: its manifest is the one capstan last applied (the inventory's digest), the
    /// live object carries capstan's stamps, and every field the manifest sets has the
    /// same value live (no drift). A server-side apply of such an object is a no-op: the
    /// fields are capstan's and already hold their values.
    pub fn unchanged(&self, manifest: &Manifest) -> bool {
        let id = manifest.id();
        let as_applied = self
            .inventory
            .get(&id)
            .is_some_and(|entry| entry.digest == digest(&manifest.object));
        as_applied
            && self
                .live
                .get(&id)
                .is_some_and(|live| stamps_of(live).0.is_some() && contains(live, &manifest.object))
    }
}

/// What applying head would do to each object it declares, the objects the API server
/// refuses (as errors at their manifests), and how many objects were found unchanged
/// without a dry run (`known`: without it, every object is dry-run).
pub async fn changes(
    cluster: &Cluster<'_>,
    head: &[Manifest],
    commit: &CommitInfo,
    known: Option<&Known<'_>>,
) -> Result<(Vec<ObjectChange>, Vec<ManifestError>, usize), PlanError> {
    let mut namespaces = BTreeMap::new();
    let (mut found, mut refused) = (Vec::new(), Vec::new());
    let mut unchanged = 0;
    for manifest in head {
        if known.is_some_and(|known| known.unchanged(manifest)) {
            unchanged += 1;
            continue;
        }
        let resource = cluster
            .kinds
            .resource(&manifest.api_version, &manifest.kind);
        let namespace_exists = match &manifest.namespace {
            Some(namespace) => namespace_exists(cluster.client, namespace, &mut namespaces).await?,
            None => true,
        };
        // The sync only ever patches a Node a kubelet registered: one the cluster does not
        // have is reported, never created, so there is nothing to dry-run.
        if is_node(manifest) && !node_registered(cluster.client, &manifest.name).await? {
            found.push(as_declared(manifest, ObjectAction::Absent));
            continue;
        }
        // A kind whose CRD, or a namespace that, this commit adds cannot be dry-run yet.
        let Some(resource) = resource.filter(|_| namespace_exists) else {
            found.push(as_declared(manifest, ObjectAction::Create));
            continue;
        };
        let desired = stamped_by(&manifest.object, commit);
        // The diff and the server's refusals are texts made elsewhere: scrub what they quote.
        let scrub = Scrub::of([&manifest.object, &desired]);
        match diff_object(cluster.client, resource, &desired).await {
            Ok(outcome) => {
                let action = match outcome.action {
                    Action::Create => ObjectAction::Create,
                    Action::Configure => ObjectAction::Configure,
                    Action::Unchanged => continue,
                };
                found.push(ObjectChange {
                    id: object_ref(manifest),
                    action,
                    file: Some(manifest.file.clone()),
                    line: Some(manifest.line),
                    diff: scrub.text(&outcome.diff),
                });
            }
            Err(DiffError::DryRun { source, .. }) => refused.push(ManifestError {
                file: manifest.file.clone(),
                line: Some(manifest.line),
                field: None,
                message: scrub.text(&format!(
                    "the API server refuses {}: {source}",
                    manifest.id()
                )),
            }),
            Err(error @ DiffError::Live { .. }) => return Err(PlanError::Diff(error)),
        }
    }
    Ok((found, refused, unchanged))
}

/// A change that cannot be dry-run (a create of a kind or in a namespace head adds, or a
/// Node the cluster does not have), shown as its manifest declares it.
fn as_declared(manifest: &Manifest, action: ObjectAction) -> ObjectChange {
    let (_, after) = mask_pair(&Value::Null, &comparable(&manifest.object));
    ObjectChange {
        id: object_ref(manifest),
        action,
        file: Some(manifest.file.clone()),
        line: Some(manifest.line),
        diff: unified(&Value::Null, &after),
    }
}

/// Whether Node `name` is registered.
/// The durations (seconds) of the upgrades the cluster recorded: each node's move, its
/// step records' durations added up, for the moves that reached their last step.
pub async fn recorded_upgrades(client: &kube::Client) -> Result<Vec<f64>, kube::Error> {
    use capstan_api::{HistoryRecord, RecordType, UpgradeStep};
    let records: Api<HistoryRecord> =
        Api::namespaced(client.clone(), capstan_api::capstan::SYSTEM_NAMESPACE);
    let params = ListParams::default().labels(&format!(
        "{}={}",
        capstan_api::labels::RECORD_TYPE_LABEL,
        RecordType::UpgradeStep.as_str()
    ));
    let listed = match records.list(&params).await {
        Ok(list) => list.items,
        // capstan's kinds are not served: nothing recorded.
        Err(kube::Error::Api(status)) if status.code == 404 => return Ok(Vec::new()),
        Err(err) => return Err(err),
    };
    // One move: its node, Module, versions and commit; its seconds so far, and whether
    // its last step is among them.
    let mut moves: BTreeMap<[String; 5], (f64, bool)> = BTreeMap::new();
    for record in listed {
        let spec = record.spec;
        let upgrade = spec.from_version.is_some() && spec.to_version.is_some();
        if !upgrade {
            continue;
        }
        let key = [
            spec.node.unwrap_or_default(),
            spec.module.unwrap_or_default(),
            spec.from_version.unwrap_or_default(),
            spec.to_version.unwrap_or_default(),
            spec.commit.sha,
        ];
        let entry = moves.entry(key).or_default();
        entry.0 += spec.duration_seconds.unwrap_or(0.0);
        entry.1 |= spec.step.as_deref() == Some(UpgradeStep::DevicePluginStarted.as_str());
    }
    Ok(moves
        .into_values()
        .filter(|(_, done)| *done)
        .map(|(seconds, _)| seconds)
        .collect())
}

async fn node_registered(client: &kube::Client, name: &str) -> Result<bool, PlanError> {
    let node = Api::<Node>::all(client.clone())
        .get_opt(name)
        .await
        .map_err(|source| PlanError::Cluster {
            what: format!("reading Node {name}"),
            source,
        })?;
    Ok(node.is_some())
}

/// The Nodes among `objects` that the cluster does not have: their labels apply only
/// when a kubelet registers them, so none of their version labels moves now.
pub fn absent_nodes(objects: &[ObjectChange]) -> BTreeSet<String> {
    objects
        .iter()
        .filter(|object| object.action == ObjectAction::Absent && object.is_node())
        .map(|object| object.id.name.clone())
        .collect()
}

async fn namespace_exists(
    client: &kube::Client,
    namespace: &str,
    known: &mut BTreeMap<String, bool>,
) -> Result<bool, PlanError> {
    if let Some(exists) = known.get(namespace) {
        return Ok(*exists);
    }
    let exists = Api::<Namespace>::all(client.clone())
        .get_opt(namespace)
        .await
        .map_err(|source| PlanError::Cluster {
            what: format!("reading Namespace {namespace}"),
            source,
        })?
        .is_some();
    known.insert(namespace.to_string(), exists);
    Ok(exists)
}

/// The inventory entries head no longer declares.
pub fn departed<'a>(inventory: &'a Inventory, head: &[Manifest]) -> Vec<&'a InventoryEntry> {
    let kept: BTreeSet<ObjectId> = head.iter().map(Manifest::id).collect();
    inventory
        .iter()
        .filter(|(id, _)| !kept.contains(id))
        .map(|(_, entry)| entry)
        .collect()
}

/// What pruning a departed object does: delete it, or release a Node from capstan's
/// labels and annotations. `None` when the object is gone already (or, for a Node,
/// holds nothing of capstan's).
pub async fn departure(
    cluster: &Cluster<'_>,
    entry: &InventoryEntry,
) -> Result<Option<ObjectChange>, PlanError> {
    let id = ObjectRef {
        api_version: entry.api_version.clone(),
        kind: entry.kind.clone(),
        namespace: entry.namespace.clone(),
        name: entry.name.clone(),
    };
    let Some(live) = read_live(cluster, &id).await? else {
        return Ok(None);
    };
    let (action, before, after) = if entry.api_version == "v1" && entry.kind == "Node" {
        let before = capstans_part(&live);
        if before["metadata"].as_object().is_some_and(|m| m.len() == 1) {
            return Ok(None);
        }
        let after = bare_node(&entry.api_version, &entry.name);
        (ObjectAction::Release, before, after)
    } else {
        (ObjectAction::Prune, comparable(&live), Value::Null)
    };
    let (before, after) = mask_pair(&before, &after);
    Ok(Some(ObjectChange {
        id,
        action,
        file: None,
        line: None,
        diff: unified(&before, &after),
    }))
}

async fn read_live(cluster: &Cluster<'_>, id: &ObjectRef) -> Result<Option<Value>, PlanError> {
    // A kind the cluster no longer serves has no objects left to prune.
    let Some(api) = cluster.kinds.api(
        cluster.client,
        &id.api_version,
        &id.kind,
        id.namespace.as_deref(),
    ) else {
        return Ok(None);
    };
    let live = api
        .get_opt(&id.name)
        .await
        .map_err(|source| PlanError::Cluster {
            what: format!("reading {id}"),
            source,
        })?;
    Ok(live.map(|object| serde_json::to_value(object).unwrap_or(Value::Null)))
}

/// A Node as far as capstan applied it: the labels and annotations its field manager owns.
fn capstans_part(live: &Value) -> Value {
    let mut metadata = Map::new();
    metadata.insert("name".into(), live["metadata"]["name"].clone());
    for field in ["labels", "annotations"] {
        let owned = applied_by_capstan(live, field);
        if !owned.is_empty() {
            metadata.insert(field.into(), Value::Object(owned));
        }
    }
    json!({"apiVersion": live["apiVersion"], "kind": "Node", "metadata": metadata})
}

/// The entries of `metadata.<field>` that capstan's field manager applied, with their
/// live values (read from `managedFields`).
fn applied_by_capstan(live: &Value, field: &str) -> Map<String, Value> {
    let entries = live
        .pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .into_iter()
        .flatten();
    let owned: BTreeSet<&str> = entries
        .filter(|entry| entry["manager"] == managers::SYNC && entry["operation"] == "Apply")
        .filter_map(|entry| {
            entry
                .pointer(&format!("/fieldsV1/f:metadata/f:{field}"))?
                .as_object()
        })
        .flat_map(|keys| keys.keys().filter_map(|key| key.strip_prefix("f:")))
        .collect();
    let values = live
        .pointer(&format!("/metadata/{field}"))
        .and_then(Value::as_object);
    owned
        .into_iter()
        .filter_map(|key| Some((key.to_string(), values?.get(key)?.clone())))
        .collect()
}

/// Fills in, for every node move under a campaign, what its drain will do: the node's
/// pods the drain evicts and those a PodDisruptionBudget protects (as the drain controller
/// and the nodekeeper classify them), the LeaderWorkerSet groups their eviction recreates,
/// and when the forcing strategies start.
pub async fn drain_previews(
    client: &kube::Client,
    plan: &mut super::Plan,
    drain: &capstan_api::NodeDrain,
) -> Result<(), kube::Error> {
    use crate::controllers::nodekeeper::{evictable, protected_by_pdb, strategy_times};
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;

    if plan.nodes.iter().all(|node| node.campaign.is_none()) {
        return Ok(());
    }
    let budgets = kube::Api::<PodDisruptionBudget>::all(client.clone())
        .list(&Default::default())
        .await?
        .items;
    let campaigns = plan.campaigns.clone();
    let mut policies = BTreeMap::new();
    for node in plan.nodes.iter_mut() {
        let Some(campaign) = campaigns
            .iter()
            .find(|c| node.campaign.as_deref() == Some(c.name.as_str()))
        else {
            continue;
        };
        let pods = kube::Api::<Pod>::all(client.clone())
            .list(&ListParams::default().fields(&format!("spec.nodeName={}", node.node)))
            .await?
            .items;
        let evicted: Vec<&Pod> = pods.iter().filter(|pod| evictable(pod)).collect();
        let mut preview = super::DrainPreview::default();
        for pod in &evicted {
            let name = format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any());
            if protected_by_pdb(pod, &budgets) {
                preview.protected.push(name);
            } else {
                preview.evicted.push(name);
            }
        }
        restart_policies(client, &evicted, &mut policies).await?;
        preview.recreated_groups = lws::recreated_groups(&evicted, &policies);
        let minutes = u64::try_from(campaign.pdb_force_drain_timeout).unwrap_or(0);
        let pdb_timeout = std::time::Duration::from_secs(minutes * 60);
        preview.forced_after = strategy_times(jiff::Timestamp::UNIX_EPOCH, drain, pdb_timeout)
            .into_iter()
            .map(|time| super::ForcedAfter {
                strategy: time.strategy.name().to_string(),
                minutes: u64::try_from(time.after.as_second()).unwrap_or(0) / 60,
            })
            .collect();
        node.drain = Some(preview);
    }
    Ok(())
}

/// Adds to `policies` the restart policy of every LeaderWorkerSet one of `pods` belongs
/// to and `policies` lacks. One the cluster does not have is left out: its pods are being
/// deleted with it.
async fn restart_policies(
    client: &kube::Client,
    pods: &[&Pod],
    policies: &mut BTreeMap<(String, String), RestartPolicy>,
) -> Result<(), kube::Error> {
    let owners: BTreeSet<(String, String)> = pods
        .iter()
        .filter_map(|pod| {
            let name = pod.labels().get(NAME_LABEL)?;
            Some((pod.namespace().unwrap_or_default(), name.clone()))
        })
        .collect();
    for (namespace, name) in owners {
        if policies.contains_key(&(namespace.clone(), name.clone())) {
            continue;
        }
        let api = Api::<LeaderWorkerSet>::namespaced(client.clone(), &namespace);
        if let Some(set) = get_if_served(&api, &name).await? {
            let policy = set.spec.leader_worker_template.restart_policy;
            policies.insert((namespace, name), policy);
        }
    }
    Ok(())
}

/// A LeaderWorkerSet as it runs in the cluster, as read: what [`lws::Current::in_cluster`]
/// decides from.
struct Running {
    lws: LeaderWorkerSet,
    /// Its leader StatefulSet, when it exists.
    leader: Option<StatefulSet>,
    /// The revisions labelled with its name: its own, and its StatefulSets'.
    revisions: Vec<ControllerRevision>,
}

/// Every LeaderWorkerSet head creates or changes, compared with what the cluster runs,
/// in head's order; then those pruned (among `objects`, the plan's object changes); and
/// the warnings.
pub async fn leader_worker_sets(
    client: &kube::Client,
    head: &[Manifest],
    objects: &[ObjectChange],
) -> Result<(Vec<LeaderWorkerSetChange>, Vec<String>), kube::Error> {
    let (mut changes, mut warnings) = (Vec::new(), Vec::new());
    for manifest in head {
        let Some(declared) = lws::declared(manifest) else {
            continue;
        };
        let namespace = manifest.namespace.as_deref().unwrap_or_default();
        let planned = match running(client, namespace, &manifest.name).await? {
            None => lws::planned(&declared, None),
            Some(running) => {
                let live = lws::as_declared(&running.lws, &declared);
                let current =
                    lws::Current::in_cluster(&live, running.leader.as_ref(), &running.revisions);
                lws::planned(&declared, Some(&current))
            }
        };
        if let Some(planned) = planned {
            changes.push(planned.change);
            warnings.extend(planned.warnings);
        }
    }
    for object in lws::pruned(objects) {
        let namespace = object.id.namespace.as_deref().unwrap_or_default();
        let api = Api::<LeaderWorkerSet>::namespaced(client.clone(), namespace);
        let replicas = get_if_served(&api, &object.id.name)
            .await?
            .map(|set| set.spec.replicas);
        changes.push(lws::deleted(namespace, &object.id.name, replicas));
    }
    Ok((changes, warnings))
}

/// The LeaderWorkerSet `namespace/name` as the cluster runs it: `None` when it does not
/// exist (or the cluster does not serve the kind yet); else with its leader StatefulSet and
/// the revisions labelled with its name, as the LWS controller lists them.
async fn running(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<Option<Running>, kube::Error> {
    let Some(lws) = get_if_served(
        &Api::<LeaderWorkerSet>::namespaced(client.clone(), namespace),
        name,
    )
    .await?
    else {
        return Ok(None);
    };
    let leader = Api::<StatefulSet>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await?
        .filter(|set| set.labels().get(NAME_LABEL).map(String::as_str) == Some(name));
    let revisions = match leader {
        Some(_) => {
            Api::<ControllerRevision>::namespaced(client.clone(), namespace)
                .list(&ListParams::default().labels(&format!("{NAME_LABEL}={name}")))
                .await?
                .items
        }
        None => Vec::new(),
    };
    Ok(Some(Running {
        lws,
        leader,
        revisions,
    }))
}

/// The object `name`; `None` when it does not exist or its kind is not served (a CRD head
/// brings).
async fn get_if_served<K>(api: &Api<K>, name: &str) -> Result<Option<K>, kube::Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.get_opt(name).await {
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(None),
        found => found,
    }
}

/// The phase of `campaign`'s history entry for its version in the cluster; `None` when the
/// cluster has no such campaign, or it has not been reconciled yet.
pub async fn campaign_phase(
    client: &kube::Client,
    campaign: &super::PlannedCampaign,
) -> Result<Option<String>, kube::Error> {
    let Some((namespace, name)) = campaign.name.split_once('/') else {
        return Ok(None);
    };
    let api: kube::Api<capstan_api::UpgradeConfig> =
        kube::Api::namespaced(client.clone(), namespace);
    let config = match api.get_opt(name).await {
        Ok(config) => config,
        // The kind is not served yet: head brings its CRD.
        Err(kube::Error::Api(status)) if status.code == 404 => None,
        Err(err) => return Err(err),
    };
    Ok(config.and_then(|config| config.status).and_then(|status| {
        status
            .history_for(&campaign.version)
            .map(|entry| format!("{:?}", entry.phase))
    }))
}

/// The live version labels that applying head may change: on the nodes head declares
/// and on `released` ones, each label head declares or capstan applied before.
pub async fn version_labels(
    client: &kube::Client,
    head: &[Manifest],
    released: &[String],
) -> Result<VersionLabels, PlanError> {
    let declared = declared_version_labels(head);
    let modules = modules_in(head.iter());
    let nodes: BTreeSet<&str> = declared
        .keys()
        .map(|(node, _)| node.as_str())
        .chain(released.iter().map(String::as_str))
        .collect();
    let api = Api::<Node>::all(client.clone());
    let mut found = VersionLabels::new();
    for name in nodes {
        let node = api
            .get_opt(name)
            .await
            .map_err(|source| PlanError::Cluster {
                what: format!("reading Node {name}"),
                source,
            })?;
        let Some(node) = node else { continue };
        let live = serde_json::to_value(node).unwrap_or(Value::Null);
        let owned = applied_by_capstan(&live, "labels");
        let Some(labels) = labels_of(&live) else {
            continue;
        };
        for (module, version) in version_labels_in(labels, &modules) {
            let key = (name.to_string(), module);
            let applied = owned.contains_key(&key.1.version_module_label());
            if applied || declared.contains_key(&key) {
                found.insert(key, version);
            }
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn live_node() -> Value {
        json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {
                "name": "worker-1",
                "labels": {
                    "kmm.node.kubernetes.io/version-module.kmm-demo.my-kmod": "v1",
                    "kubernetes.io/hostname": "worker-1",
                },
                "annotations": {"capstan.dev/revision": "main@sha1:abc", "other": "x"},
                "managedFields": [
                    {"manager": "capstan", "operation": "Apply", "fieldsV1": {"f:metadata": {
                        "f:labels": {"f:kmm.node.kubernetes.io/version-module.kmm-demo.my-kmod": {}},
                        "f:annotations": {"f:capstan.dev/revision": {}}}}},
                    {"manager": "kubelet", "operation": "Update", "fieldsV1": {"f:metadata": {
                        "f:labels": {"f:kubernetes.io/hostname": {}}}}},
                ],
            },
        })
    }

    #[test]
    fn only_what_capstan_applied_counts_as_its_part_of_a_node() {
        let owned = applied_by_capstan(&live_node(), "labels");
        assert_eq!(
            Value::Object(owned),
            json!({"kmm.node.kubernetes.io/version-module.kmm-demo.my-kmod": "v1"})
        );
        assert_eq!(
            capstans_part(&live_node()),
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {
                "name": "worker-1",
                "labels": {"kmm.node.kubernetes.io/version-module.kmm-demo.my-kmod": "v1"},
                "annotations": {"capstan.dev/revision": "main@sha1:abc"},
            }})
        );
    }
}
