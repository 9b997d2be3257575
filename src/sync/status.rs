//! The sync's state in the cluster: capstan's namespace, its CRDs (on a cluster that lacks
//! them), the `GitSync` object and its status.

use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, Patch, PatchParams};
use kube::{CustomResourceExt as _, Resource as _};
use serde_json::json;

use super::discovery::ClusterKinds;
use capstan_api::capstan::SYSTEM_NAMESPACE;
use capstan_api::managers;
use capstan_api::{GitSync, GitSyncSpec, GitSyncStatus, HistoryRecord};

/// How long capstan's own CRDs get to become served.
const CRD_DEADLINE: Duration = Duration::from_secs(60);

/// Makes sure the cluster serves capstan's kinds and has its namespace and `GitSync`:
/// applies what is missing (server-side apply, field manager `capstan`) and returns the
/// `GitSync` as it is, status included.
pub async fn ensure(
    client: &kube::Client,
    kinds: &mut ClusterKinds,
    name: &str,
    spec: GitSyncSpec,
) -> Result<GitSync, kube::Error> {
    let params = PatchParams::apply(managers::SYNC).force();
    let served = |kinds: &ClusterKinds| {
        [GitSync::api_version(&()), HistoryRecord::api_version(&())]
            .iter()
            .zip([GitSync::kind(&()), HistoryRecord::kind(&())])
            .all(|(api_version, kind)| kinds.resource(api_version, &kind).is_some())
    };
    if !served(kinds) {
        let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
            Api::all(client.clone());
        for crd in [GitSync::crd(), HistoryRecord::crd()] {
            let name = crd.metadata.name.clone().unwrap_or_default();
            crds.patch(&name, &params, &Patch::Apply(&crd)).await?;
        }
        let deadline = Instant::now() + CRD_DEADLINE;
        while !served(kinds) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(200)).await;
            *kinds = ClusterKinds::discover(client).await?;
        }
    }
    crate::runtime::ensure_namespace(client, SYSTEM_NAMESPACE, managers::SYNC).await?;
    let syncs: Api<GitSync> = Api::namespaced(client.clone(), SYSTEM_NAMESPACE);
    match syncs.get_opt(name).await? {
        // The reach is the admin's: only what capstan writes is compared, and applied.
        Some(existing)
            if (
                &existing.spec.repo,
                &existing.spec.branch,
                &existing.spec.path,
            ) == (&spec.repo, &spec.branch, &spec.path) =>
        {
            Ok(existing)
        }
        _ => {
            let object = json!({
                "apiVersion": GitSync::api_version(&()),
                "kind": GitSync::kind(&()),
                "metadata": {"name": name, "namespace": SYSTEM_NAMESPACE},
                "spec": spec,
            });
            syncs.patch(name, &params, &Patch::Apply(&object)).await
        }
    }
}

/// Replaces the `GitSync` status with `status` (one write), but for `notifications`, which
/// the notifications controller writes: the live one is carried over (read just before;
/// one the controller writes in between is written again by it, as it finds its own
/// missing).
pub async fn write(
    client: &kube::Client,
    name: &str,
    status: &GitSyncStatus,
) -> Result<(), kube::Error> {
    let syncs: Api<GitSync> = Api::namespaced(client.clone(), SYSTEM_NAMESPACE);
    let mut status = status.clone();
    status.notifications = match syncs.get_opt(name).await? {
        Some(live) => live.status.map(|s| s.notifications).unwrap_or_default(),
        None => Vec::new(),
    };
    let patch = json_patch::Patch(vec![json_patch::PatchOperation::Add(
        json_patch::AddOperation {
            path: json_patch::jsonptr::PointerBuf::parse("/status").expect("a valid pointer"),
            value: serde_json::to_value(&status).unwrap_or_default(),
        },
    )]);
    crate::crash::point("sync.status.before");
    syncs
        .patch_status(name, &PatchParams::default(), &Patch::<()>::Json(patch))
        .await?;
    crate::crash::point("sync.status.after");
    Ok(())
}

/// Sets the `Ready` condition: `True` with reason `Applied`, else `False` with `reason`.
pub fn set_ready(status: &mut GitSyncStatus, ready: bool, reason: &str, message: &str) {
    let value = if ready { "True" } else { "False" };
    let unchanged = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .is_some_and(|c| c.status == value);
    let transition = match status.conditions.iter().find(|c| c.type_ == "Ready") {
        Some(old) if unchanged => old.last_transition_time.clone(),
        _ => Time(jiff::Timestamp::now()),
    };
    status.conditions.retain(|c| c.type_ != "Ready");
    status.conditions.push(Condition {
        type_: "Ready".into(),
        status: value.into(),
        reason: reason.into(),
        message: message.into(),
        last_transition_time: transition,
        observed_generation: None,
    });
}
