//! The LeaderWorkerSet reconciler: one reconcile per `LeaderWorkerSet`, in upstream's order
//! (`LeaderWorkerSetReconciler.Reconcile`), as a read, decisions on what it read
//! ([`decision`]), and writes.
//!
//! **Read**: the LWS afresh (one gone or being deleted is left to the garbage
//! collector), its leader StatefulSet afresh (one being deleted is waited for, looked at
//! again after five seconds), its revisions listed afresh, and its leader pods and worker
//! StatefulSets from the caches. Revisions are not cached: a revision this process has
//! just created must count before its watch event arrives, or a second reconcile would
//! create it again.
//!
//! **Decide and write**, in this order, each write made only once those before it
//! succeeded:
//!
//! 1. [`current_revision`]: create the revision the groups run when none carries the
//!    leader StatefulSet's key (a new LWS, or a leader StatefulSet made before revisions
//!    existed: created with that key, so nothing rolls), with a `CreatingRevision` Event;
//! 2. [`update_revision`]: create the live spec's revision when it differs from that one:
//!    its key starts the rolling update; a `CreatingRevision` Event;
//! 3. [`decide`]: apply the leader StatefulSet (server-side apply, forced, field manager
//!    `capstan-lws`; a failure is a Warning Event and the reconcile's error), then its
//!    Events, then make the shared headless Service when missing (a failure likewise);
//! 4. [`decide_status`]: write the status when it changed (a JSON merge patch conditional
//!    on the LWS's resourceVersion: a conflict reconciles again at once and writes nothing
//!    more), its condition's Event, then delete the revisions of other keys once the
//!    update is done (one already gone is no error).
//!
//! It follows the LWS cache (the trigger), and the StatefulSets and pods of LWSs (mapped to
//! their LWS by the `leaderworkerset.sigs.k8s.io/name` label).

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

use super::facts::{self, revision_key};
use super::labels::{NAME_LABEL, WORKER_INDEX_LABEL};
use super::revision;
use crate::controllers::caches::Caches;
use crate::controllers::context::Context;
use crate::controllers::runner::Runner;
use capstan_api::LeaderWorkerSet;
use capstan_api::managers;
use decision::{
    Current, Facts, GroupFacts, Note, RevisionCause, WorkerSetFacts, current_revision, decide,
    decide_status, update_revision,
};

pub mod decision;

/// Next look while the leader StatefulSet is being deleted (upstream's 5 s).
const DELETING_RECHECK: Duration = Duration::from_secs(5);

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

/// One reconcile of the LWS `cached` names: read, then each decision followed by its
/// writes (see the module's documentation).
async fn reconcile(
    cached: Arc<LeaderWorkerSet>,
    shared: Arc<Shared>,
) -> Result<Action, kube::Error> {
    let mut facts = match read(&shared, &cached).await? {
        Read::Stop(action) => return Ok(action),
        Read::Facts(facts) => facts,
    };
    let writer = Writer::new(&shared.ctx, &facts.lws);

    // A created revision is the API server's answer (one of the same name that an earlier
    // reconcile made is read back instead), and its key and number are what the next
    // decisions are made on: each creation is decided and written before them.
    let current = match current_revision(&facts) {
        Current::Found(found) => found,
        Current::Create(new, cause) => {
            let created = writer.create_revision(new, cause).await?;
            facts.revisions.push(created.clone());
            created
        }
    };
    let (current, lws_updated) = match update_revision(&facts, &current) {
        Some(updated) => {
            let created = writer
                .create_revision(updated, RevisionCause::Updated)
                .await?;
            (created, true)
        }
        None => (current, false),
    };
    let key = revision_key(&current).to_string();

    let writes = decide(&facts, &key, lws_updated).map_err(invalid)?;
    let applied = writer
        .apply_leader_set(&writes.leader_set, writes.creates_leader_set)
        .await?;
    for note in &writes.events {
        writer.event(Some(&current), false, note).await;
    }
    if writes.shared_service {
        writer.ensure_shared_service(&facts.lws).await?;
    }

    // The status counts the leader StatefulSet's replicas as its apply answered them.
    let leader_replicas = applied
        .status
        .as_ref()
        .map(|status| status.replicas)
        .unwrap_or(0);
    let now = Time(shared.ctx.clock.now());
    let status = decide_status(&facts, &key, &writes.status_groups, leader_replicas, now);
    if let Some(patch) = &status.patch {
        if !writer.write_status(patch).await? {
            return Ok(Action::requeue(Duration::ZERO));
        }
        if let Some(note) = &status.event {
            writer.event(None::<&StatefulSet>, false, note).await;
        }
    }
    writer.delete_revisions(&status.stale_revisions).await?;
    Ok(writes.next_look)
}

/// What the read phase found.
enum Read {
    /// Nothing to write now: look again as said.
    Stop(Action),
    /// An LWS to reconcile.
    Facts(Box<Facts>),
}

/// Reads what one reconcile of the LWS `cached` names decides on: the LWS and its leader
/// StatefulSet afresh, its revisions listed afresh, its groups from the caches. Stops at
/// an LWS gone or being deleted (its objects go with it), and at a leader StatefulSet being
/// deleted (looked at again after [`DELETING_RECHECK`]).
async fn read(shared: &Shared, cached: &LeaderWorkerSet) -> Result<Read, kube::Error> {
    let client = &shared.ctx.client;
    let namespace = cached.namespace().unwrap_or_default();
    let name = cached.name_any();
    let lwss: Api<LeaderWorkerSet> = Api::namespaced(client.clone(), &namespace);
    let Some(lws) = lwss.get_opt(&name).await? else {
        return Ok(Read::Stop(Action::await_change()));
    };
    if lws.meta().deletion_timestamp.is_some() {
        return Ok(Read::Stop(Action::await_change()));
    }
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), &namespace);
    let leader_set = sets.get_opt(&name).await?;
    if leader_set
        .as_ref()
        .is_some_and(|set| set.meta().deletion_timestamp.is_some())
    {
        return Ok(Read::Stop(Action::requeue(DELETING_RECHECK)));
    }
    let revisions: Api<ControllerRevision> = Api::namespaced(client.clone(), &namespace);
    let revisions = revisions
        .list(&ListParams::default().labels(&format!("{NAME_LABEL}={name}")))
        .await?
        .items
        .into_iter()
        // The StatefulSets' own revisions carry the LWS's name label too.
        .filter(|found| revision::belongs_to(found, &lws))
        .collect();
    let groups = groups(shared, &lws);
    Ok(Read::Facts(Box::new(Facts {
        lws,
        leader_set,
        revisions,
        groups,
    })))
}

/// The groups of `lws` in the caches, by index: one per leader pod, with the worker
/// StatefulSet of its index.
fn groups(shared: &Shared, lws: &LeaderWorkerSet) -> Vec<GroupFacts> {
    let namespace = lws.namespace().unwrap_or_default();
    let name = lws.name_any();
    let mut groups: Vec<GroupFacts> = shared
        .pods
        .state()
        .into_iter()
        .filter(|pod| {
            pod.namespace().as_deref() == Some(namespace.as_str())
                && pod.labels().get(NAME_LABEL) == Some(&name)
                && pod.labels().get(WORKER_INDEX_LABEL).map(String::as_str) == Some("0")
        })
        .filter_map(|leader| {
            let index = facts::group_index(&leader)?;
            let workers = shared
                .sets
                .get(&ObjectRef::new(&format!("{name}-{index}")).within(&namespace))
                .map(|set| WorkerSetFacts {
                    ready: facts::set_ready(&set),
                    key: revision_key(set.as_ref()).to_string(),
                });
            Some(GroupFacts {
                index,
                leader_ready: facts::running_and_ready(&leader),
                leader_key: revision_key(leader.as_ref()).to_string(),
                workers,
            })
        })
        .collect();
    groups.sort_by_key(|group| group.index);
    groups
}

/// The writes of one reconcile of an LWS: each a call to the API server, and the Event
/// that says it.
struct Writer<'a> {
    ctx: &'a Context,
    /// The LWS, as its Events name it.
    lws: ObjectReference,
    name: String,
    namespace: String,
}

impl<'a> Writer<'a> {
    fn new(ctx: &'a Context, lws: &LeaderWorkerSet) -> Writer<'a> {
        Writer {
            ctx,
            lws: lws.object_ref(&()),
            name: lws.name_any(),
            namespace: lws.namespace().unwrap_or_default(),
        }
    }

    fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(self.ctx.client.clone(), &self.namespace)
    }

    /// Creates `revision` and records it in an Event saying its `cause`; one of the same
    /// name already there (this reconcile raced an earlier one whose watch event had not
    /// arrived) is read back instead, and not recorded again.
    async fn create_revision(
        &self,
        revision: ControllerRevision,
        cause: RevisionCause,
    ) -> Result<ControllerRevision, kube::Error> {
        let api: Api<ControllerRevision> = self.api();
        let params = PostParams {
            field_manager: Some(managers::LWS.to_string()),
            ..PostParams::default()
        };
        match api.create(&params, &revision).await {
            Ok(created) => {
                let note = Note {
                    reason: "CreatingRevision",
                    action: "Create",
                    note: cause.note(revision_key(&created)),
                };
                self.event(Some(&created), false, &note).await;
                Ok(created)
            }
            Err(kube::Error::Api(status)) if status.code == 409 => {
                api.get(&revision.name_any()).await
            }
            Err(err) => Err(err),
        }
    }

    /// Applies the leader StatefulSet `body` (server-side, forced); a failure is recorded
    /// as a failed create when it `creates` the StatefulSet, else as a failed update.
    async fn apply_leader_set(
        &self,
        body: &serde_json::Value,
        creates: bool,
    ) -> Result<StatefulSet, kube::Error> {
        let sets: Api<StatefulSet> = self.api();
        let params = PatchParams::apply(managers::LWS).force();
        match sets.patch(&self.name, &params, &Patch::Apply(body)).await {
            Ok(applied) => Ok(applied),
            Err(err) => {
                let failure = decision::apply_failure(&self.name, !creates, &err);
                self.event(None::<&StatefulSet>, true, &failure).await;
                Err(err)
            }
        }
    }

    /// Makes the headless Service `<lws>` selecting every pod of `lws` when it is missing;
    /// a failure is recorded.
    async fn ensure_shared_service(&self, lws: &LeaderWorkerSet) -> Result<(), kube::Error> {
        let selector = [(NAME_LABEL.to_string(), self.name.clone())].into();
        let made =
            ensure_headless_service(self.ctx, lws, &self.name, selector, owner_reference(lws))
                .await;
        if let Err(err) = &made {
            let failure = decision::service_failure(err);
            self.event(None::<&StatefulSet>, true, &failure).await;
        }
        made
    }

    /// Writes the status with the merge `patch`: `false` when the LWS changed since it was
    /// read (the patch carries its resourceVersion), and nothing was written.
    async fn write_status(&self, patch: &serde_json::Value) -> Result<bool, kube::Error> {
        let lwss: Api<LeaderWorkerSet> = self.api();
        let params = PatchParams {
            field_manager: Some(managers::LWS.into()),
            ..PatchParams::default()
        };
        match lwss
            .patch_status(&self.name, &params, &Patch::Merge(patch))
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
            Err(err) => Err(err),
        }
    }

    /// Deletes the revisions `names`, in order; one already gone is no error.
    async fn delete_revisions(&self, names: &[String]) -> Result<(), kube::Error> {
        let revisions: Api<ControllerRevision> = self.api();
        for name in names {
            match revisions.delete(name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(err) => return Err(err),
            }
        }
        Ok(())
    }

    /// Publishes `note` about the LWS, related to `related` when given.
    async fn event<R: kube::Resource<DynamicType = ()>>(
        &self,
        related: Option<&R>,
        warning: bool,
        note: &Note,
    ) {
        event(
            self.ctx,
            &self.lws,
            related,
            warning,
            note.reason,
            note.action,
            note.note.clone(),
        )
        .await;
    }
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
mod tests;
