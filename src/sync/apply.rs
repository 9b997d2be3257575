//! Applying a commit's desired state: decide which objects need a write, check every write
//! with a server-side dry run, then write them with server-side apply (field manager
//! `capstan`, forced, as Flux does) in stages: Namespaces and CRDs, then everything else,
//! then Node labels.
//!
//! Deciding is cheap and makes no writes: the live objects are read once per kind, and an
//! object needs a write when it is missing, when its manifest changed since it was last
//! applied (its inventory digest), or when a field it sets differs in the live object. The
//! last case, with an unchanged manifest, is drift: a change made by hand. Drift is
//! confirmed with a dry run before it is reported, so values the server merely normalises
//! (`1000m` for `1`) are not mistaken for it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::{FutureExt as _, StreamExt as _, TryStreamExt as _};
use kube::api::{DynamicObject, ListParams, Patch, PatchParams};
use serde_json::Value;

use super::diff::comparable;
use super::discovery::ClusterKinds;
use super::follow::Attribution;
use super::inventory::{Inventory, stamped, stamps_of};
use super::manifests::{DriftPolicy, Manifest, ObjectId};
use super::source::CommitInfo;
use capstan_api::canonical::digest;
use capstan_api::managers;

/// Writes in flight at once.
const CONCURRENCY: usize = 16;
/// Up to this many objects of one kind are read one by one; more are listed.
const GET_LIMIT: usize = 8;
/// How long newly applied CRDs get to show up in discovery.
const CRD_DEADLINE: Duration = Duration::from_secs(60);

/// What a sync did to one object.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Action {
    /// Created from Git.
    Created,
    /// Changed to match a changed manifest.
    Configured,
    /// Changed by hand, and written back.
    DriftReverted,
    /// Changed by hand, and only reported (`drift: warn`).
    DriftDetected,
    /// A Node in Git that no kubelet has registered: reported, never created. Nodes are
    /// registered by kubelets; a Node capstan made would have no kubelet behind it, and an
    /// upgrade started on it could never finish.
    Absent,
}

impl Action {
    /// The name records and events use.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Created => "created",
            Action::Configured => "configured",
            Action::DriftReverted => "drift-reverted",
            Action::DriftDetected => "drift-detected",
            Action::Absent => "absent",
        }
    }

    /// Whether the object is written (the others are only reported).
    pub fn writes(self) -> bool {
        !matches!(self, Action::DriftDetected | Action::Absent)
    }
}

/// Why a commit could not be applied.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// The dry run refused objects: nothing was written.
    #[error("the API server refuses {} object(s); nothing was applied:\n{}", .0.len(), .0.join("\n"))]
    Refused(Vec<String>),
    /// Reading the live objects failed.
    #[error("reading {what}: {source}")]
    Read {
        what: String,
        #[source]
        source: kube::Error,
    },
    /// A write failed after others had been made.
    #[error("{object}: {source}")]
    Write {
        object: String,
        #[source]
        source: kube::Error,
    },
    /// CRDs applied by the commit did not become served in time.
    #[error("the kinds of the commit's CRDs were not served within {CRD_DEADLINE:?}: {0}")]
    CrdsNotServed(String),
}

/// The decision for one manifest.
#[derive(Clone, Debug)]
struct Decision {
    index: usize,
    action: Action,
    /// The object to write, stamped.
    object: Value,
}

/// What applying did.
#[derive(Clone, Debug, Default)]
pub struct Applied {
    /// Every object written or reported, with what happened to it.
    pub changes: BTreeMap<ObjectId, Action>,
    /// Whether the apply stopped early because of a shutdown.
    pub interrupted: bool,
    /// Time spent.
    pub duration: Duration,
}

impl Applied {
    /// How many objects had `action`.
    pub fn count(&self, action: Action) -> usize {
        self.changes.values().filter(|a| **a == action).count()
    }
}

/// The live state the decisions are made from.
pub struct LiveObjects {
    objects: HashMap<ObjectId, Value>,
    /// Namespaces that exist.
    namespaces: BTreeSet<String>,
}

impl LiveObjects {
    /// The live object of `id`.
    pub fn get(&self, id: &ObjectId) -> Option<&Value> {
        self.objects.get(id)
    }
}

/// Reads the live objects the manifests declare: one list per kind (or a few gets, for a
/// kind with many objects in the cluster but few in Git, such as Nodes), and the
/// namespaces. Kinds the cluster does not serve yet have no live objects.
///
/// Fails with [`ApplyError::Refused`], naming each object, when the API server refuses to
/// let `client` read objects the commit declares (RBAC): such a commit is rejected.
pub async fn read_live(
    client: &kube::Client,
    kinds: &ClusterKinds,
    manifests: &[Manifest],
) -> Result<LiveObjects, ApplyError> {
    let mut by_kind: BTreeMap<(&str, &str), Vec<&Manifest>> = BTreeMap::new();
    for manifest in manifests {
        by_kind
            .entry((&manifest.api_version, &manifest.kind))
            .or_default()
            .push(manifest);
    }
    let mut objects = HashMap::new();
    let mut refused = Vec::new();
    for ((api_version, kind), wanted) in by_kind {
        let Some(api) = kinds.api(client, api_version, kind, None) else {
            continue;
        };
        let read_error = |source| ApplyError::Read {
            what: format!("{kind} objects"),
            source,
        };
        // One list for many objects; one get each for a few, or when the list is forbidden
        // (an identity whose RBAC is namespaced, as a reach's ServiceAccount may be).
        let listed = if wanted.len() > GET_LIMIT {
            match api.list(&ListParams::default()).await {
                Ok(list) => Some(list.items),
                Err(kube::Error::Api(status)) if status.code == 403 => None,
                Err(source) => return Err(read_error(source)),
            }
        } else {
            None
        };
        let found: Vec<DynamicObject> = match listed {
            Some(items) => items,
            None => {
                // Collected first: a lazy iterator of futures held across awaits makes the
                // future not `Send`.
                let gets: Vec<_> = wanted
                    .iter()
                    .map(|m| {
                        let api = kinds.api(client, api_version, kind, m.namespace.as_deref());
                        async move {
                            let got = match api {
                                Some(api) => api.get_opt(&m.name).await,
                                None => Ok(None),
                            };
                            match got {
                                Ok(found) => Ok((found, None)),
                                // Not readable by the writing identity: the commit reaches
                                // where it may not.
                                Err(err) if refuses(&err) => Ok((
                                    None,
                                    Some(format!(
                                        "{}:{}: {}: {}",
                                        m.file,
                                        m.line,
                                        m.id(),
                                        reason(&err)
                                    )),
                                )),
                                Err(err) => Err(err),
                            }
                        }
                        .boxed()
                    })
                    .collect();
                let results = futures::stream::iter(gets)
                    .buffer_unordered(CONCURRENCY)
                    .try_collect::<Vec<_>>()
                    .await
                    .map_err(read_error)?;
                let mut found = Vec::new();
                for (object, refusal) in results {
                    found.extend(object);
                    refused.extend(refusal);
                }
                found
            }
        };
        for mut object in found {
            // A list's items come without their kind on a real API server: what `contains`
            // compares with the manifest must have it.
            object.types.get_or_insert_with(|| kube::api::TypeMeta {
                api_version: api_version.to_string(),
                kind: kind.to_string(),
            });
            let value = serde_json::to_value(&object).unwrap_or(Value::Null);
            let id = ObjectId {
                group: group_of(api_version).to_string(),
                kind: kind.to_string(),
                namespace: object.metadata.namespace.clone(),
                name: object.metadata.name.clone().unwrap_or_default(),
            };
            objects.insert(id, value);
        }
    }
    let namespaces = match kinds.api(client, "v1", "Namespace", None) {
        Some(api) => api
            .list_metadata(&ListParams::default())
            .await
            .map_err(|source| ApplyError::Read {
                what: "namespaces".into(),
                source,
            })?
            .items
            .into_iter()
            .filter_map(|ns| ns.metadata.name)
            .collect(),
        None => BTreeSet::new(),
    };
    if !refused.is_empty() {
        refused.sort();
        return Err(ApplyError::Refused(refused));
    }
    Ok(LiveObjects {
        objects,
        namespaces,
    })
}

/// The group of an `apiVersion`.
fn group_of(api_version: &str) -> &str {
    api_version.split_once('/').map_or("", |(group, _)| group)
}

/// Whether every field `desired` sets has the same value in `live`. Lists compare item by
/// item, since the server may add defaults inside items; numbers compare by value.
pub fn contains(live: &Value, desired: &Value) -> bool {
    match (live, desired) {
        (Value::Object(live), Value::Object(desired)) => desired
            .iter()
            .all(|(key, value)| live.get(key).is_some_and(|l| contains(l, value))),
        (Value::Array(live), Value::Array(desired)) => {
            live.len() == desired.len() && live.iter().zip(desired).all(|(l, d)| contains(l, d))
        }
        (Value::Number(l), Value::Number(d)) => l == d || l.as_f64() == d.as_f64(),
        _ => live == desired,
    }
}

/// The stamps an object keeps when it is written back after drift: the live ones, when the
/// object still has them, else the commit that asked for its content.
fn drift_stamps(live: &Value, commit: &CommitInfo) -> (String, Option<u64>) {
    match stamps_of(live) {
        (Some(revision), pull_request) => (revision, pull_request),
        _ => (commit.revision(), commit.pull_request),
    }
}

/// Decides, without writing, which manifests need a write and why.
///
/// `inventory` is what the last apply left (empty on a first sync). Each object written is
/// stamped with the commit `attribution` names for it. With `drift` `Warn`, drift is
/// reported but not written back.
pub async fn decide(
    client: &kube::Client,
    kinds: &ClusterKinds,
    manifests: &[Manifest],
    live: &LiveObjects,
    inventory: &Inventory,
    attribution: Attribution<'_>,
    drift: DriftPolicy,
) -> Result<Vec<(ObjectId, Action, Value)>, ApplyError> {
    let mut decisions = Vec::new();
    let mut suspects = Vec::new();
    for (index, manifest) in manifests.iter().enumerate() {
        let id = manifest.id();
        let live_object = live.get(&id);
        let unchanged_in_git = inventory
            .get(&id)
            .is_some_and(|entry| entry.digest == digest(&manifest.object));
        let commit = attribution.commit_of(&id);
        let fresh = || stamped(&manifest.object, &commit.revision(), commit.pull_request);
        if is_node(manifest) {
            match decide_node(index, manifest, live_object, unchanged_in_git, fresh) {
                NodeRule::Decided(decision) => {
                    decisions.push(decision);
                    continue;
                }
                NodeRule::Settled => continue,
                NodeRule::CheckDrift => {}
            }
        }
        match (live_object, unchanged_in_git) {
            (None, false) => decisions.push(Decision {
                index,
                action: Action::Created,
                object: fresh(),
            }),
            (Some(_), false) => decisions.push(Decision {
                index,
                action: Action::Configured,
                object: fresh(),
            }),
            (None, true) => decisions.push(Decision {
                index,
                action: drift_action(drift),
                object: fresh(),
            }),
            (Some(live_object), true) => {
                let stamps_kept = stamps_of(live_object).0.is_some();
                if !stamps_kept || !contains(live_object, &manifest.object) {
                    let (revision, pr) = drift_stamps(live_object, commit);
                    let object = stamped(&manifest.object, &revision, pr);
                    suspects.push(Decision {
                        index,
                        action: drift_action(drift),
                        object: if is_node(manifest) {
                            pinned_to(object, live_object)
                        } else {
                            object
                        },
                    });
                }
            }
        }
    }
    // A suspect is drift only if applying it would change the live object.
    let confirmed = futures::stream::iter(suspects.into_iter().map(|decision| {
        async {
            let manifest = &manifests[decision.index];
            let live_object = live.get(&manifest.id());
            let changes =
                would_change(client, kinds, manifest, &decision.object, live_object).await?;
            Ok::<_, ApplyError>(changes.then_some(decision))
        }
        .boxed()
    }))
    .buffer_unordered(CONCURRENCY)
    .try_collect::<Vec<_>>()
    .await?;
    decisions.extend(confirmed.into_iter().flatten());
    decisions.sort_by_key(|d| d.index);
    Ok(decisions
        .into_iter()
        .map(|d| (manifests[d.index].id(), d.action, d.object))
        .collect())
}

fn is_node(manifest: &Manifest) -> bool {
    manifest.api_version == "v1" && manifest.kind == "Node"
}

/// The decision for a Node manifest, which only ever patches a Node a kubelet registered:
/// one the cluster does not have is [`Action::Absent`]; one registered afresh
/// (without capstan's stamps: a new machine, or one that left and came back) gets its
/// labels as a configuration, not as drift, whatever the drift policy; and every write is
/// pinned to the live Node's UID, so that a Node deleted after it was read is not created
/// again by the apply (the API server refuses an apply naming a UID it does not have).
/// Drift on a Node capstan wrote before is left to the general rules.
fn decide_node(
    index: usize,
    manifest: &Manifest,
    live: Option<&Value>,
    unchanged_in_git: bool,
    fresh: impl Fn() -> Value,
) -> NodeRule {
    let Some(live) = live else {
        return NodeRule::Decided(Decision {
            index,
            action: Action::Absent,
            object: fresh(),
        });
    };
    let configured = || {
        NodeRule::Decided(Decision {
            index,
            action: Action::Configured,
            object: pinned_to(fresh(), live),
        })
    };
    if !unchanged_in_git {
        return configured();
    }
    match stamps_of(live).0 {
        Some(_) => NodeRule::CheckDrift,
        None if contains(live, &manifest.object) => NodeRule::Settled,
        None => configured(),
    }
}

/// What [`decide_node`] leaves to the general rules.
enum NodeRule {
    /// This write (or report).
    Decided(Decision),
    /// Nothing to write.
    Settled,
    /// The Node is as capstan last wrote it, unless changed by hand.
    CheckDrift,
}

/// `object` with the UID of `live`: applied, it changes that object or nothing.
pub fn pinned_to(mut object: Value, live: &Value) -> Value {
    if let (Some(uid), Some(metadata)) = (
        live.pointer("/metadata/uid").cloned(),
        object.get_mut("metadata").and_then(Value::as_object_mut),
    ) {
        metadata.insert("uid".into(), uid);
    }
    object
}

/// Whether a write was refused because the object it was pinned to is gone (see
/// [`pinned_to`]).
pub fn object_gone(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(status)
        if (status.code == 409 && status.message.contains("uid mismatch")) || status.code == 404)
}

fn drift_action(policy: DriftPolicy) -> Action {
    match policy {
        DriftPolicy::Revert => Action::DriftReverted,
        DriftPolicy::Warn => Action::DriftDetected,
    }
}

/// Whether applying `object` would change `live` (a server-side apply dry run).
async fn would_change(
    client: &kube::Client,
    kinds: &ClusterKinds,
    manifest: &Manifest,
    object: &Value,
    live: Option<&Value>,
) -> Result<bool, ApplyError> {
    let Some(live) = live else { return Ok(true) };
    let after = ssa(client, kinds, manifest, object, true)
        .await
        .map_err(|source| ApplyError::Write {
            object: manifest.id().to_string(),
            source,
        })?;
    Ok(comparable(&after) != comparable(live) || stamps_of(&after) != stamps_of(live))
}

/// Server-side applies `object` under capstan's field manager, forced.
async fn ssa(
    client: &kube::Client,
    kinds: &ClusterKinds,
    manifest: &Manifest,
    object: &Value,
    dry_run: bool,
) -> Result<Value, kube::Error> {
    let api = kinds
        .api(
            client,
            &manifest.api_version,
            &manifest.kind,
            manifest.namespace.as_deref(),
        )
        .ok_or_else(|| not_served(manifest))?;
    // Strict: a field the server does not know is an error, not silently dropped.
    let mut params = PatchParams::apply(managers::SYNC)
        .force()
        .validation(kube::api::ValidationDirective::Strict);
    if dry_run {
        params = params.dry_run();
    }
    let applied = api
        .patch(&manifest.name, &params, &Patch::Apply(object))
        .await?;
    Ok(serde_json::to_value(applied).unwrap_or(Value::Null))
}

fn not_served(manifest: &Manifest) -> kube::Error {
    kube::Error::Api(
        kube::core::Status::failure(
            &format!(
                "the cluster does not serve {} {}",
                manifest.api_version, manifest.kind
            ),
            "NotFound",
        )
        .with_code(404)
        .boxed(),
    )
}

/// The stage of Nodes (their version labels), the last.
pub const NODE_STAGE: usize = 2;

/// The stage an object is written in: Namespaces and CRDs, then everything else, then Nodes.
pub fn stage_of(kind: &str, api_version: &str) -> usize {
    match (api_version, kind) {
        ("v1", "Namespace") | ("apiextensions.k8s.io/v1", "CustomResourceDefinition") => 0,
        ("v1", "Node") => NODE_STAGE,
        _ => 1,
    }
}

/// Checks every write with a server-side dry run, where the server can tell: objects of
/// kinds not served yet, or in namespaces the commit creates, are checked when written.
pub async fn dry_run(
    client: &kube::Client,
    kinds: &ClusterKinds,
    manifests: &[Manifest],
    live: &LiveObjects,
    writes: &[(ObjectId, Action, Value)],
) -> Result<(), ApplyError> {
    let by_id: HashMap<ObjectId, &Manifest> = manifests.iter().map(|m| (m.id(), m)).collect();
    let checks: Vec<_> = writes
        .iter()
        .filter(|(_, action, _)| action.writes())
        .filter_map(|(id, _, object)| {
            let manifest = *by_id.get(id)?;
            let served = kinds
                .resource(&manifest.api_version, &manifest.kind)
                .is_some();
            let namespace_exists = manifest
                .namespace
                .as_ref()
                .is_none_or(|ns| live.namespaces.contains(ns));
            (served && namespace_exists).then_some((manifest, object))
        })
        .map(|(manifest, object)| {
            async move {
                match ssa(client, kinds, manifest, object, true).await {
                    Ok(_) => Ok(None),
                    Err(err) if refuses(&err) => Ok(Some(format!(
                        "{}:{}: {}: {}",
                        manifest.file,
                        manifest.line,
                        manifest.id(),
                        reason(&err)
                    ))),
                    // A conflict, a server error or a lost connection says nothing of the
                    // commit: the sync fails and tries again.
                    Err(source) => Err(ApplyError::Write {
                        object: manifest.id().to_string(),
                        source,
                    }),
                }
            }
            .boxed()
        })
        .collect();
    let refused: Vec<String> = futures::stream::iter(checks)
        .buffer_unordered(CONCURRENCY)
        .try_filter_map(|refusal| async move { Ok(refusal) })
        .try_collect()
        .await?;
    if refused.is_empty() {
        Ok(())
    } else {
        let mut refused = refused;
        refused.sort();
        Err(ApplyError::Refused(refused))
    }
}

/// Whether the API server refused the object itself (it is invalid, forbidden, or names
/// something that does not exist), which rejects the commit; anything else is transient.
fn refuses(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(status) if matches!(status.code, 400 | 403 | 404 | 405 | 413 | 415 | 422))
}

/// The server's message for a failed request.
pub fn reason(err: &kube::Error) -> String {
    match err {
        kube::Error::Api(status) => status.message.clone(),
        other => other.to_string(),
    }
}

/// Writes the decided objects, stage by stage; within a stage, several at a time. After
/// CRDs are written, waits until the cluster serves their kinds (rediscovering `kinds`).
/// Stops between writes once `stop` is set, returning what was written so far with
/// `interrupted`.
pub async fn write(
    client: &kube::Client,
    kinds: &mut ClusterKinds,
    manifests: &[Manifest],
    writes: Vec<(ObjectId, Action, Value)>,
    stop: &AtomicBool,
) -> Result<Applied, ApplyError> {
    let started = Instant::now();
    let by_id: HashMap<ObjectId, &Manifest> = manifests.iter().map(|m| (m.id(), m)).collect();
    let mut stages: BTreeMap<usize, Vec<(ObjectId, Action, Value)>> = BTreeMap::new();
    for write in writes {
        let Some(manifest) = by_id.get(&write.0) else {
            continue;
        };
        stages
            .entry(stage_of(&manifest.kind, &manifest.api_version))
            .or_default()
            .push(write);
    }
    let mut applied = Applied::default();
    for (stage, mut writes) in stages {
        // Nodes are written one at a time in name order: the version-label controller moves
        // relabelled nodes in name order and must never see a later node's label first.
        let concurrency = if stage == NODE_STAGE {
            writes.sort_by(|a, b| a.0.cmp(&b.0));
            1
        } else {
            CONCURRENCY
        };
        let mut wrote_crds = Vec::new();
        let kinds_now: &ClusterKinds = kinds;
        let results = futures::stream::iter(writes.into_iter().map(|(id, action, object)| {
            let manifest = by_id[&id];
            async move {
                if !action.writes() {
                    return Ok(Some((id, action, false)));
                }
                if stop.load(Ordering::SeqCst) {
                    return Ok(None);
                }
                match ssa(client, kinds_now, manifest, &object, false).await {
                    Ok(_) => {}
                    // The Node left between the read and this write: the apply, pinned
                    // to its UID, created nothing.
                    Err(err) if is_node(manifest) && object_gone(&err) => {
                        return Ok(Some((id, Action::Absent, false)));
                    }
                    Err(source) => {
                        return Err(ApplyError::Write {
                            object: format!("{}:{}: {id}", manifest.file, manifest.line),
                            source,
                        });
                    }
                }
                Ok::<_, ApplyError>(Some((
                    id,
                    action,
                    manifest.kind == "CustomResourceDefinition",
                )))
            }
            .boxed()
        }))
        .buffered(concurrency)
        .collect::<Vec<_>>()
        .await;
        let mut first_error = None;
        for result in results {
            match result {
                Ok(Some((id, action, is_crd))) => {
                    if is_crd {
                        wrote_crds.push(id.clone());
                    }
                    applied.changes.insert(id, action);
                }
                Ok(None) => applied.interrupted = true,
                Err(err) => {
                    first_error.get_or_insert(err);
                }
            }
        }
        if let Some(err) = first_error {
            return Err(err);
        }
        if applied.interrupted {
            break;
        }
        if stage == 0 && !wrote_crds.is_empty() {
            wait_for_kinds(client, kinds, manifests).await?;
        }
    }
    applied.duration = started.elapsed();
    Ok(applied)
}

/// Rediscovers until every kind the manifests use is served (CRDs just applied).
async fn wait_for_kinds(
    client: &kube::Client,
    kinds: &mut ClusterKinds,
    manifests: &[Manifest],
) -> Result<(), ApplyError> {
    let deadline = Instant::now() + CRD_DEADLINE;
    loop {
        *kinds = ClusterKinds::discover(client)
            .await
            .map_err(|source| ApplyError::Read {
                what: "API discovery".into(),
                source,
            })?;
        let missing: BTreeSet<String> = manifests
            .iter()
            .filter(|m| kinds.resource(&m.api_version, &m.kind).is_none())
            .map(|m| format!("{} {}", m.api_version, m.kind))
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(ApplyError::CrdsNotServed(
                missing.into_iter().collect::<Vec<_>>().join(", "),
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_a_refusal_of_the_object_rejects_the_commit() {
        let status = |code: u16| {
            kube::Error::Api(
                kube::core::Status::failure(&format!("{code}"), "")
                    .with_code(code)
                    .boxed(),
            )
        };
        for (code, rejects) in [
            (400, true),
            (403, true),
            (404, true),
            (422, true),
            (409, false),
            (429, false),
            (500, false),
            (503, false),
        ] {
            assert_eq!(refuses(&status(code)), rejects, "{code}");
        }
    }

    #[test]
    fn containment_of_desired_in_live() {
        let live = json!({"metadata": {"name": "n", "labels": {"a": "1", "b": "2"}, "uid": "u"},
            "spec": {"replicas": 3, "items": [{"name": "x", "image": "i", "pull": "Always"}]}});
        let cases = [
            (
                json!({"metadata": {"name": "n", "labels": {"a": "1"}}}),
                true,
            ),
            (json!({"metadata": {"labels": {"a": "2"}}}), false),
            (json!({"metadata": {"labels": {"c": "1"}}}), false),
            (json!({"spec": {"replicas": 3.0}}), true),
            (json!({"spec": {"replicas": 4}}), false),
            (
                json!({"spec": {"items": [{"name": "x", "image": "i"}]}}),
                true,
            ),
            (
                json!({"spec": {"items": [{"name": "x", "image": "j"}]}}),
                false,
            ),
            (json!({"spec": {"items": []}}), false),
            (json!({}), true),
        ];
        for (desired, expected) in cases {
            assert_eq!(contains(&live, &desired), expected, "{desired}");
        }
    }

    #[test]
    fn a_node_manifest_only_ever_patches_the_node_a_kubelet_registered() {
        let labels = json!({"kmm.node.kubernetes.io/version-module.ns.m": "v2"});
        let manifest = Manifest {
            file: "nodes/worker-3.yaml".into(),
            line: 1,
            api_version: "v1".into(),
            kind: "Node".into(),
            namespace: None,
            name: "worker-3".into(),
            object: json!({"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": "worker-3", "labels": labels}}),
        };
        let registered = |labels: Value, stamped: bool| {
            let mut node = json!({"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": "worker-3", "uid": "u-3", "labels": labels}});
            if stamped {
                node["metadata"]["annotations"] =
                    json!({capstan_api::labels::REVISION_ANNOTATION: "main@sha1:abc"});
            }
            node
        };
        let with_labels = registered(labels.clone(), true);
        let fresh = registered(json!({"kubernetes.io/hostname": "worker-3"}), false);
        let fresh_labelled = registered(labels.clone(), false);
        #[derive(Debug)]
        enum Want {
            Write(Action),
            Settled,
            CheckDrift,
        }
        // (name, live, unchanged in Git, want)
        let rows = [
            (
                "not registered, new in Git",
                None,
                false,
                Want::Write(Action::Absent),
            ),
            (
                "not registered any more",
                None,
                true,
                Want::Write(Action::Absent),
            ),
            (
                "changed in Git",
                Some(&with_labels),
                false,
                Want::Write(Action::Configured),
            ),
            (
                "registered afresh",
                Some(&fresh),
                true,
                Want::Write(Action::Configured),
            ),
            (
                "registered afresh, labelled",
                Some(&fresh_labelled),
                true,
                Want::Settled,
            ),
            (
                "as capstan wrote it",
                Some(&with_labels),
                true,
                Want::CheckDrift,
            ),
        ];
        for (name, live, unchanged, want) in rows {
            let rule = decide_node(0, &manifest, live, unchanged, || manifest.object.clone());
            match (rule, want) {
                (NodeRule::Decided(decision), Want::Write(action)) => {
                    assert_eq!(decision.action, action, "{name}");
                    let uid = decision.object.pointer("/metadata/uid");
                    if action == Action::Absent {
                        assert_eq!(uid, None, "{name}");
                    } else {
                        assert_eq!(uid, Some(&json!("u-3")), "{name}: pinned to the Node read");
                    }
                }
                (NodeRule::Settled, Want::Settled) | (NodeRule::CheckDrift, Want::CheckDrift) => {}
                (_, want) => panic!("{name}: want {want:?}"),
            }
        }
        assert!(!Action::Absent.writes() && !Action::DriftDetected.writes());
        assert!(Action::Configured.writes());
    }

    #[test]
    fn stages_put_namespaces_and_crds_first_and_nodes_last() {
        let cases = [
            ("v1", "Namespace", 0),
            ("apiextensions.k8s.io/v1", "CustomResourceDefinition", 0),
            ("kmm.sigs.x-k8s.io/v1beta1", "Module", 1),
            ("v1", "ConfigMap", 1),
            ("v1", "Node", 2),
        ];
        for (api_version, kind, stage) in cases {
            assert_eq!(stage_of(kind, api_version), stage, "{kind}");
        }
    }
}
