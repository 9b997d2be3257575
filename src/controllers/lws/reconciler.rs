//! The LeaderWorkerSet reconciler: one reconcile per `LeaderWorkerSet`, in upstream's order
//! (`LeaderWorkerSetReconciler.Reconcile`):
//!
//! 1. read the LWS and its leader StatefulSet afresh; a set being deleted is waited for;
//! 2. find the revision with the leader StatefulSet's key, or create it (a new LWS, or a
//!    leader StatefulSet made before revisions existed: created with that key, so nothing
//!    rolls);
//! 3. build the revision of the live spec; when it equals none, create it: that is an
//!    update, and its key starts the rolling update;
//! 4. [`rolling::decide`] the leader StatefulSet's partition and replicas from the groups'
//!    states, and apply the leader StatefulSet (server-side apply, forced, field manager
//!    `capstan-lws`);
//! 5. create the shared headless Service when `subdomainPolicy` is `Shared`, and look
//!    again every five minutes, Services not being watched;
//! 6. [`status::decide`] the status and conditions and write them when they changed
//!    (conditional on the LWS's resourceVersion; a conflict reconciles again);
//! 7. once the update is done, delete the revisions of other keys.
//!
//! It follows the LWS cache (the trigger), and the StatefulSets and pods of LWSs (mapped to
//! their LWS by the `leaderworkerset.sigs.k8s.io/name` label). Revisions are listed afresh in
//! each reconcile: a revision this process has just created must count before its watch
//! event arrives, or a second reconcile would create it again.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{ControllerRevision, StatefulSet};
use k8s_openapi::api::core::v1::{ObjectReference, Pod, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource as _, ResourceExt as _};
use serde_json::json;

use super::labels::{NAME_LABEL, REPLICAS_ANNOTATION, WORKER_INDEX_LABEL};
use super::rolling::{self, GroupState, LeaderSet};
use super::{facts, revision, statefulsets, status};
use crate::controllers::caches::Caches;
use crate::controllers::context::Context;
use crate::controllers::runner::Runner;
use capstan_api::LeaderWorkerSet;
use capstan_api::lws::SubdomainPolicy;
use capstan_api::managers;

/// Next look while the leader StatefulSet is being deleted (upstream's 5 s).
const DELETING_RECHECK: Duration = Duration::from_secs(5);
/// Next look at an LWS at rest whose groups share one headless Service, which is made
/// again if it was deleted.
const SERVICE_RECHECK: Duration = Duration::from_secs(5 * 60);

struct Shared {
    ctx: Arc<Context>,
    sets: Store<StatefulSet>,
    pods: Store<Pod>,
}

/// Runs the LWS reconciler until `ctx.shutdown`. Subscribes to `caches`; the caller starts
/// them.
pub fn run(
    ctx: Arc<Context>,
    caches: &Caches,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let (lwss, lwss_ready) = caches.leader_worker_sets.reader();
    let (sets, sets_ready) = caches.lws_stateful_sets.reader();
    let (pods, pods_ready) = caches.lws_pods.reader();
    let lws_changes = caches.leader_worker_sets.subscribe();
    let set_changes = caches.lws_stateful_sets.subscribe();
    let pod_changes = caches.lws_pods.subscribe();
    let shared = Arc::new(Shared {
        ctx: ctx.clone(),
        sets,
        pods,
    });
    let controller = Controller::for_shared_stream(lws_changes, lwss)
        .watches_shared_stream(set_changes, |set: Arc<StatefulSet>| owner_of(set.as_ref()))
        .watches_shared_stream(pod_changes, |pod: Arc<Pod>| {
            // Only leader pods count in the status and the rolling update; the worker
            // StatefulSets tell how their workers are.
            facts::is_leader(pod.as_ref())
                .then(|| owner_of(pod.as_ref()))
                .flatten()
        });
    Runner::new("lws", &ctx)
        .reads(lwss_ready)
        .reads(sets_ready)
        .reads(pods_ready)
        .run(controller, reconcile, shared)
}

/// The LWS an object of it names in its `leaderworkerset.sigs.k8s.io/name` label.
fn owner_of<K: kube::Resource>(object: &K) -> Option<ObjectRef<LeaderWorkerSet>> {
    let name = object.meta().labels.as_ref()?.get(NAME_LABEL)?;
    let namespace = object.meta().namespace.as_deref()?;
    Some(ObjectRef::new(name).within(namespace))
}

async fn reconcile(
    cached: Arc<LeaderWorkerSet>,
    shared: Arc<Shared>,
) -> Result<Action, kube::Error> {
    let ctx = &shared.ctx;
    let client = &ctx.client;
    let namespace = cached.namespace().unwrap_or_default();
    let name = cached.name_any();
    let lwss: Api<LeaderWorkerSet> = Api::namespaced(client.clone(), &namespace);
    let Some(lws) = lwss.get_opt(&name).await? else {
        return Ok(Action::await_change());
    };
    if lws.meta().deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), &namespace);
    let leader_set = sets.get_opt(&name).await?;
    if leader_set
        .as_ref()
        .is_some_and(|set| set.meta().deletion_timestamp.is_some())
    {
        return Ok(Action::requeue(DELETING_RECHECK));
    }
    let lws_ref = lws.object_ref(&());

    let revisions_api: Api<ControllerRevision> = Api::namespaced(client.clone(), &namespace);
    let mut revisions = revisions_api
        .list(&ListParams::default().labels(&format!("{NAME_LABEL}={name}")))
        .await?
        .items
        .into_iter()
        // The StatefulSets' own revisions carry the LWS's name label too.
        .filter(|found| revision::belongs_to(found, &lws))
        .collect::<Vec<_>>();
    let leader_key = leader_set.as_ref().map(facts::revision_key).unwrap_or("");
    let current = match revision::find(&revisions, &lws, leader_key) {
        Some(found) => found.clone(),
        None => {
            let number = revision::next_number(&revisions);
            let key = (!leader_key.is_empty()).then_some(leader_key);
            let note = if key.is_some() {
                missing_revision_note
            } else {
                new_revision_note
            };
            let created = create_revision(
                ctx,
                &lws_ref,
                &revisions_api,
                revision::new_revision(&lws, key, number),
                note,
            )
            .await?;
            revisions.push(created.clone());
            created
        }
    };
    let updated = match &leader_set {
        Some(_) => revision::updated_revision(&lws, &current, revision::next_number(&revisions)),
        None => None,
    };
    let lws_updated = updated.is_some();
    let current = match updated {
        Some(updated) => {
            create_revision(
                ctx,
                &lws_ref,
                &revisions_api,
                updated,
                updated_revision_note,
            )
            .await?
        }
        None => current,
    };
    let key = facts::revision_key(&current).to_string();

    let leader = leader_set.as_ref().map(leader_facts);
    let states = match &leader {
        Some(leader) => group_states(&shared, &lws, leader.replicas, &key),
        None => Vec::new(),
    };
    let parameters = rolling::decide(&name, &lws.spec, leader.as_ref(), &states, lws_updated)
        .map_err(invalid)?;
    tracing::debug!(lws = %name, %key, lws_updated, ?states, ?parameters, "lws decided");
    let lws_env = statefulsets::leader_env_wanted(leader_set.as_ref(), &key);
    let body = statefulsets::leader(
        &lws,
        parameters.partition,
        parameters.replicas,
        &key,
        lws_env,
    )
    .map_err(invalid)?;
    let applied = match sets
        .patch(
            &name,
            &PatchParams::apply(managers::LWS).force(),
            &Patch::Apply(&body),
        )
        .await
    {
        Ok(applied) => applied,
        Err(err) => {
            let failure = apply_failure(&name, leader_set.is_some(), &err);
            event(
                ctx,
                &lws_ref,
                None::<&StatefulSet>,
                true,
                failure.reason,
                failure.action,
                failure.note,
            )
            .await;
            return Err(err);
        }
    };
    if leader.is_none() {
        let note = format!("Created leader statefulset {name}");
        event(
            ctx,
            &lws_ref,
            Some(&current),
            false,
            "GroupsProgressing",
            "Create",
            note,
        )
        .await;
    }
    for note in &parameters.events {
        // Partition moves update groups; the other rolling events delete surge groups.
        let action = if note.reason == rolling::GROUPS_UPDATING {
            "Update"
        } else {
            "Delete"
        };
        event(
            ctx,
            &lws_ref,
            Some(&current),
            false,
            note.reason,
            action,
            note.note.clone(),
        )
        .await;
    }

    let shared_service =
        lws.spec.network_config_or_default().subdomain_policy == SubdomainPolicy::Shared;
    if shared_service {
        let selector = [(NAME_LABEL.to_string(), name.clone())].into();
        if let Err(err) =
            ensure_headless_service(ctx, &lws, &name, selector, owner_reference(&lws)).await
        {
            let note = format!("Failed to create headless service for error: {err}");
            event(
                ctx,
                &lws_ref,
                None::<&StatefulSet>,
                true,
                "FailedCreate",
                "Create",
                note,
            )
            .await;
            return Err(err);
        }
    }

    let leader_replicas = applied
        .status
        .as_ref()
        .map(|status| status.replicas)
        .unwrap_or(0);
    let groups = status_groups(&shared, &lws, &key);
    let decision = status::decide(&lws, leader_replicas, &groups, Time(ctx.clock.now()));
    if decision.changed {
        let patch = json!({
            "metadata": {"resourceVersion": lws.resource_version()},
            "status": decision.status,
        });
        match lwss
            .patch_status(
                &name,
                &PatchParams {
                    field_manager: Some(managers::LWS.into()),
                    ..PatchParams::default()
                },
                &Patch::Merge(&patch),
            )
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 409 => {
                return Ok(Action::requeue(Duration::ZERO));
            }
            Err(err) => return Err(err),
        }
        if let Some(note) = &decision.event {
            event(
                ctx,
                &lws_ref,
                None::<&StatefulSet>,
                false,
                note.reason,
                "Update",
                note.note.clone(),
            )
            .await;
        }
    }
    tracing::debug!(lws = %name, changed = decision.changed, done = decision.update_done, "lws status");
    if decision.update_done {
        for stale in revision::to_truncate(&revisions, &lws, &key) {
            match revisions_api
                .delete(&stale.name_any(), &DeleteParams::default())
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(err) => return Err(err),
            }
        }
    }
    Ok(at_rest(shared_service))
}

/// When an LWS that reconciled to the end is looked at again: on a change to it or its
/// StatefulSets and pods, and with a `shared_service` also after [`SERVICE_RECHECK`], since
/// nothing watches the Service and one deleted by hand must be made again.
fn at_rest(shared_service: bool) -> Action {
    if shared_service {
        Action::requeue(SERVICE_RECHECK)
    } else {
        Action::await_change()
    }
}

/// Creates `revision` and records it in an Event whose note `note` makes of its key; one
/// of the same name already there (this reconcile raced an earlier one whose watch event
/// had not arrived) is read back instead, and not recorded again.
async fn create_revision(
    ctx: &Context,
    lws: &ObjectReference,
    api: &Api<ControllerRevision>,
    revision: ControllerRevision,
    note: fn(&str) -> String,
) -> Result<ControllerRevision, kube::Error> {
    let params = PostParams {
        field_manager: Some(managers::LWS.to_string()),
        ..PostParams::default()
    };
    match api.create(&params, &revision).await {
        Ok(created) => {
            let note = note(facts::revision_key(&created));
            event(
                ctx,
                lws,
                Some(&created),
                false,
                "CreatingRevision",
                "Create",
                note,
            )
            .await;
            Ok(created)
        }
        Err(kube::Error::Api(status)) if status.code == 409 => api.get(&revision.name_any()).await,
        Err(err) => Err(err),
    }
}

fn new_revision_note(key: &str) -> String {
    format!("Creating revision with key {key} for a newly created LeaderWorkerSet")
}

fn missing_revision_note(key: &str) -> String {
    format!("Creating missing revision with key {key} for existing LeaderWorkerSet")
}

fn updated_revision_note(key: &str) -> String {
    format!("Creating revision with key {key} for updated LWS")
}

/// The Warning Event of a failed apply of the leader StatefulSet.
#[derive(Debug, PartialEq, Eq)]
struct ApplyFailure {
    reason: &'static str,
    action: &'static str,
    note: String,
}

/// What a failed apply of leader StatefulSet `name` records (upstream's reasons and
/// actions): a failed create when no such StatefulSet `existed`, else a failed update.
fn apply_failure(name: &str, existed: bool, err: &impl std::fmt::Display) -> ApplyFailure {
    if existed {
        ApplyFailure {
            reason: "FailedUpdate",
            action: "Update",
            note: format!("Failed to update leader statefulset {name}: {err}"),
        }
    } else {
        ApplyFailure {
            reason: "FailedCreate",
            action: "Create",
            note: format!("Failed to create leader statefulset {name}: {err}"),
        }
    }
}

/// The leader StatefulSet as the rolling update reads it.
fn leader_facts(set: &StatefulSet) -> LeaderSet {
    let spec = set.spec.as_ref();
    LeaderSet {
        replicas: spec.and_then(|spec| spec.replicas).unwrap_or(1),
        partition: spec
            .and_then(|spec| spec.update_strategy.as_ref())
            .and_then(|strategy| strategy.rolling_update.as_ref())
            .and_then(|rolling| rolling.partition)
            .unwrap_or(0),
        replicas_annotation: set
            .annotations()
            .get(REPLICAS_ANNOTATION)
            .and_then(|value| value.parse().ok()),
    }
}

/// The leader pods of `lws` in the cache, by group index.
fn leader_pods(shared: &Shared, lws: &LeaderWorkerSet) -> Vec<(i32, Arc<Pod>)> {
    let namespace = lws.namespace().unwrap_or_default();
    let name = lws.name_any();
    let mut leaders: Vec<(i32, Arc<Pod>)> = shared
        .pods
        .state()
        .into_iter()
        .filter(|pod| {
            pod.namespace().as_deref() == Some(namespace.as_str())
                && pod.labels().get(NAME_LABEL) == Some(&name)
                && pod.labels().get(WORKER_INDEX_LABEL).map(String::as_str) == Some("0")
        })
        .filter_map(|pod| Some((facts::group_index(&pod)?, pod)))
        .collect();
    leaders.sort_by_key(|(index, _)| *index);
    leaders
}

/// The worker StatefulSet of group `index` in the cache.
fn worker_set(shared: &Shared, lws: &LeaderWorkerSet, index: i32) -> Option<Arc<StatefulSet>> {
    let namespace = lws.namespace().unwrap_or_default();
    shared
        .sets
        .get(&ObjectRef::new(&format!("{}-{index}", lws.name_any())).within(&namespace))
}

/// Each leader-StatefulSet replica's state (upstream `getReplicaStates`): a group whose
/// leader pod or worker StatefulSet is missing is neither ready nor updated.
fn group_states(
    shared: &Shared,
    lws: &LeaderWorkerSet,
    replicas: i32,
    key: &str,
) -> Vec<GroupState> {
    let size_one = lws.spec.leader_worker_template.size == 1;
    let leaders = leader_pods(shared, lws);
    (0..replicas.max(0))
        .map(|index| {
            let Some((_, leader)) = leaders.iter().find(|(i, _)| *i == index) else {
                return GroupState::default();
            };
            let leader_ready = facts::running_and_ready(leader);
            let leader_updated = facts::revision_key(leader.as_ref()) == key;
            if size_one {
                return GroupState {
                    ready: leader_ready,
                    updated: leader_updated,
                };
            }
            match worker_set(shared, lws, index) {
                Some(set) => GroupState {
                    ready: leader_ready && facts::set_ready(&set),
                    updated: leader_updated && facts::revision_key(set.as_ref()) == key,
                },
                None => GroupState::default(),
            }
        })
        .collect()
}

/// Every leader pod's group as the status counts it (upstream `updateConditions`): groups
/// whose worker StatefulSet is missing are left out.
fn status_groups(shared: &Shared, lws: &LeaderWorkerSet, key: &str) -> Vec<status::Group> {
    let size_one = lws.spec.leader_worker_template.size == 1;
    leader_pods(shared, lws)
        .into_iter()
        .filter_map(|(index, leader)| {
            let set = if size_one {
                None
            } else {
                Some(worker_set(shared, lws, index)?)
            };
            let ready =
                set.as_deref().is_none_or(facts::set_ready) && facts::running_and_ready(&leader);
            let updated = set
                .as_deref()
                .is_none_or(|set| facts::revision_key(set) == key)
                && facts::revision_key(leader.as_ref()) == key;
            Some(status::Group {
                index,
                ready,
                updated,
            })
        })
        .collect()
}

/// A controller reference to `lws`.
fn owner_reference(lws: &LeaderWorkerSet) -> serde_json::Value {
    json!({
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "name": lws.name_any(),
        "uid": lws.uid().unwrap_or_default(),
        "controller": true,
        "blockOwnerDeletion": true,
    })
}

/// Creates the headless Service `service` of `lws` selecting `selector` and owned by
/// `owner`, unless it exists (upstream `CreateHeadlessServiceIfNotExists`).
pub async fn ensure_headless_service(
    ctx: &Context,
    lws: &LeaderWorkerSet,
    service: &str,
    selector: std::collections::BTreeMap<String, String>,
    owner: serde_json::Value,
) -> Result<(), kube::Error> {
    let namespace = lws.namespace().unwrap_or_default();
    let services: Api<Service> = Api::namespaced(ctx.client.clone(), &namespace);
    if services.get_opt(service).await?.is_some() {
        return Ok(());
    }
    let body: Service = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": service,
            "namespace": namespace,
            "labels": {NAME_LABEL: lws.name_any()},
            "ownerReferences": [owner],
        },
        "spec": {
            "clusterIP": "None",
            "selector": selector,
            "publishNotReadyAddresses": true,
        },
    }))
    .expect("a headless Service decodes");
    let params = PostParams {
        field_manager: Some(managers::LWS.to_string()),
        ..PostParams::default()
    };
    match services.create(&params, &body).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
        Err(err) => Err(err),
    }
}

/// Publishes an Event about `lws`, related to `related` when given.
pub async fn event<R: kube::Resource<DynamicType = ()>>(
    ctx: &Context,
    lws: &ObjectReference,
    related: Option<&R>,
    warning: bool,
    reason: &str,
    action: &str,
    note: String,
) {
    let related = related.map(|object| object.object_ref(&()));
    ctx.event(lws, related, warning, reason, action, note).await;
}

/// A decision that cannot be made from the LWS (an invalid percentage that slipped past
/// validation), as the error its reconcile reports.
fn invalid(message: String) -> kube::Error {
    kube::Error::Service(message.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shared_service_deleted_by_hand_is_made_again_without_a_change() {
        assert_eq!(at_rest(true), Action::requeue(SERVICE_RECHECK));
        assert_eq!(at_rest(false), Action::await_change());
    }

    #[test]
    fn a_failed_leader_statefulset_apply_says_create_or_update() {
        assert_eq!(
            apply_failure("vllm", false, &"quota exceeded"),
            ApplyFailure {
                reason: "FailedCreate",
                action: "Create",
                note: "Failed to create leader statefulset vllm: quota exceeded".to_string(),
            }
        );
        assert_eq!(
            apply_failure("vllm", true, &"conflict"),
            ApplyFailure {
                reason: "FailedUpdate",
                action: "Update",
                note: "Failed to update leader statefulset vllm: conflict".to_string(),
            }
        );
    }
}
