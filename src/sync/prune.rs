//! Pruning: the objects that left the repository are deleted, in the reverse of the apply
//! stages (Node labels, then objects, then Namespaces and CRDs). Nodes are never deleted:
//! capstan applies a manifest holding only the stamps of the commit that removed the Node
//! from the repository, which releases the labels and other annotations it owned, leaves
//! everything else on the Node alone, and tells the version-label controller which commit
//! asked for the module removals that follow.
//!
//! An object is deleted only while capstan still manages it (its field manager holds
//! fields of it): an object recreated or taken over by someone else is left in place and
//! reported. A Namespace that still holds Modules waits, in the inventory, until they are
//! unloaded and gone.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};

use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use serde_json::json;

use super::apply::{ApplyError, object_gone, pinned_to, stage_of};
use super::discovery::ClusterKinds;
use super::follow::Attribution;
use super::inventory::{id_of, stamped_by};
use super::manifests::ObjectId;
use capstan_api::InventoryEntry;
use capstan_api::managers;

/// The API version of KMM's Modules.
const MODULE_API_VERSION: &str = "kmm.sigs.x-k8s.io/v1beta1";

/// What pruning did to one object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Pruned {
    /// Deleted.
    Deleted,
    /// A Node: capstan's labels and annotations released.
    Released,
    /// Already gone.
    Gone,
    /// Left in place, with the reason.
    Kept(String),
    /// Not deleted yet, with the reason: it stays in the inventory, and a later sync
    /// deletes it.
    Waiting(String),
}

/// Prunes `leftovers` (inventory entries no longer in Git); a released Node carries the
/// stamps of the commit `attribution` names for it. Stops between objects once `stop` is
/// set; the objects not reached stay in the inventory for the next sync.
pub async fn prune(
    client: &kube::Client,
    kinds: &ClusterKinds,
    leftovers: &[InventoryEntry],
    attribution: Attribution<'_>,
    stop: &AtomicBool,
) -> Result<BTreeMap<ObjectId, Pruned>, ApplyError> {
    let mut ordered: Vec<&InventoryEntry> = leftovers.iter().collect();
    ordered.sort_by_key(|entry| {
        (
            std::cmp::Reverse(stage_of(&entry.kind, &entry.api_version)),
            id_of(entry),
        )
    });
    let mut done = BTreeMap::new();
    for entry in ordered {
        if stop.load(Ordering::SeqCst) {
            break;
        }
        let outcome = prune_one(client, kinds, entry, attribution).await?;
        done.insert(id_of(entry), outcome);
    }
    Ok(done)
}

async fn prune_one(
    client: &kube::Client,
    kinds: &ClusterKinds,
    entry: &InventoryEntry,
    attribution: Attribution<'_>,
) -> Result<Pruned, ApplyError> {
    let id = id_of(entry);
    let Some(api) = kinds.api(
        client,
        &entry.api_version,
        &entry.kind,
        entry.namespace.as_deref(),
    ) else {
        // The kind is no longer served (its CRD went first): its objects went with it.
        return Ok(Pruned::Gone);
    };
    let failed = |source| ApplyError::Write {
        object: id.to_string(),
        source,
    };
    let Some(live) = api.get_opt(&entry.name).await.map_err(failed)? else {
        return Ok(Pruned::Gone);
    };
    if entry.api_version == "v1" && entry.kind == "Node" {
        let empty = json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": entry.name},
        });
        // Pinned to the Node read: one deleted since is not created again.
        let live = serde_json::to_value(&live).unwrap_or_default();
        let released = pinned_to(stamped_by(&empty, attribution.commit_of(&id)), &live);
        return match api
            .patch(
                &entry.name,
                &PatchParams::apply(managers::SYNC).force(),
                &Patch::Apply(&released),
            )
            .await
        {
            Ok(_) => Ok(Pruned::Released),
            Err(err) if object_gone(&err) => Ok(Pruned::Gone),
            Err(err) => Err(failed(err)),
        };
    }
    let managed = live
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .any(|entry| entry.manager.as_deref() == Some(managers::SYNC));
    if !managed {
        return Ok(Pruned::Kept(format!(
            "not deleted: no field of it is managed by {} anymore",
            managers::SYNC
        )));
    }
    if entry.api_version == "v1" && entry.kind == "Namespace" {
        let modules = modules_in(client, kinds, &entry.name)
            .await
            .map_err(failed)?;
        if !modules.is_empty() {
            return Ok(Pruned::Waiting(format!(
                "not deleted yet: its Modules {} are still being unloaded, and their \
                 unloader pods could not be created in a namespace being deleted",
                modules.join(", ")
            )));
        }
        if let Some(reason) = holds_foreign_objects(client, kinds, &entry.name)
            .await
            .map_err(failed)?
        {
            return Ok(Pruned::Kept(reason));
        }
    }
    match api.delete(&entry.name, &DeleteParams::background()).await {
        Ok(_) => Ok(Pruned::Deleted),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(Pruned::Gone),
        Err(source) => Err(ApplyError::Write {
            object: id.to_string(),
            source,
        }),
    }
}

/// Why the Namespace `namespace` must not be deleted, if it holds objects capstan never
/// applied (deleting it would delete them), or capstan cannot tell: each namespaced kind
/// the cluster serves is listed in it. Not counted: Events and Endpoints; the `default`
/// ServiceAccount and the `kube-root-ca.crt` ConfigMap Kubernetes puts in every namespace;
/// objects owned by another (their owner counts); objects being deleted; and objects of
/// which capstan's field manager holds fields (its own, pruned before the Namespace).
async fn holds_foreign_objects(
    client: &kube::Client,
    kinds: &ClusterKinds,
    namespace: &str,
) -> Result<Option<String>, kube::Error> {
    const SHOWN: usize = 5;
    let mut foreign = Vec::new();
    let mut unlisted = Vec::new();
    for resource in kinds.namespaced_lists() {
        // Events, and the Endpoints the endpoints controller keeps beside each Service
        // (without an owner), are Kubernetes' record of other objects, not content.
        if resource.kind == "Event" || (resource.group.is_empty() && resource.kind == "Endpoints") {
            continue;
        }
        let api: kube::Api<kube::api::DynamicObject> =
            kube::Api::namespaced_with(client.clone(), namespace, resource);
        let objects = match api.list_metadata(&ListParams::default()).await {
            Ok(objects) => objects,
            Err(kube::Error::Api(status)) if status.code == 403 => {
                unlisted.push(resource.plural.clone());
                continue;
            }
            // Gone since discovery: it holds nothing.
            Err(kube::Error::Api(status)) if matches!(status.code, 404 | 405) => continue,
            // An aggregated API that is down may hold anything.
            Err(kube::Error::Api(status)) if status.code == 503 => {
                unlisted.push(resource.plural.clone());
                continue;
            }
            Err(err) => return Err(err),
        };
        for object in objects.items {
            let meta = object.metadata;
            let name = meta.name.unwrap_or_default();
            let kubernetes_own = matches!(
                (
                    resource.kind.as_str(),
                    resource.group.as_str(),
                    name.as_str()
                ),
                ("ServiceAccount", "", "default") | ("ConfigMap", "", "kube-root-ca.crt")
            );
            let owned = meta.owner_references.is_some_and(|o| !o.is_empty());
            let ours = meta
                .managed_fields
                .iter()
                .flatten()
                .any(|entry| entry.manager.as_deref() == Some(managers::SYNC));
            if !(kubernetes_own || owned || ours || meta.deletion_timestamp.is_some()) {
                foreign.push(format!("{} {name}", resource.kind));
            }
        }
    }
    if !foreign.is_empty() {
        let more = foreign.len().saturating_sub(SHOWN);
        foreign.truncate(SHOWN);
        let more = if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        };
        return Ok(Some(format!(
            "not deleted: it holds objects capstan never applied ({}{more}); delete them, or \
             the namespace by hand",
            foreign.join(", ")
        )));
    }
    if !unlisted.is_empty() {
        return Ok(Some(format!(
            "not deleted: capstan may not list {} in it, so cannot tell whether it holds \
             objects capstan never applied; grant capstan list on them, or delete the \
             namespace by hand",
            unlisted.join(", ")
        )));
    }
    Ok(None)
}

/// The Modules still in namespace `namespace` (being deleted or not), by name.
///
/// A Module's finalizer is released once its module is unloaded from every node, which
/// takes worker pods in the Module's namespace; a namespace being deleted refuses new pods,
/// so deleting it first would leave the module loaded and the namespace terminating for
/// ever (upstream KMM's webhook refuses such a deletion for the same reason).
async fn modules_in(
    client: &kube::Client,
    kinds: &ClusterKinds,
    namespace: &str,
) -> Result<Vec<String>, kube::Error> {
    let Some(api) = kinds.api(client, MODULE_API_VERSION, "Module", Some(namespace)) else {
        return Ok(Vec::new());
    };
    let modules = api.list_metadata(&ListParams::default()).await?;
    Ok(modules
        .items
        .into_iter()
        .map(|module| format!("{namespace}/{}", module.metadata.name.unwrap_or_default()))
        .collect())
}
