//! The Events a LeaderWorkerSet controller writes are taken as kube-apiserver takes them:
//! events.k8s.io/v1 Events (capstan's recorder: created, then counted in their `series`)
//! and core/v1 Events (client-go's legacy recorder, which upstream LWS uses: created,
//! then patched with a higher `count`), each readable through the other API and found by
//! the field selectors `kubectl describe` uses.

use crate::common;

use k8s_openapi::api::core::v1::Event as CoreEvent;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

const LWS_UID: &str = "0b0e0e5e-3c52-4a8e-9d1b-2f6f0c6f7a10";

fn lws_reference() -> serde_json::Value {
    json!({"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
           "namespace": "default", "name": "demo", "uid": LWS_UID, "resourceVersion": "7"})
}

#[tokio::test]
async fn an_events_v1_event_and_its_series_are_taken() {
    let (_cluster, client) = common::start_default_simulated().await;
    let events = Api::<Event>::namespaced(client.clone(), "default");
    let event: Event = serde_json::from_value(json!({
        "metadata": {"name": "demo.18a2b3c4d5e6f7a8", "namespace": "default"},
        "eventTime": "2026-03-01T09:00:00.000000Z",
        "type": "Normal",
        "reason": "GroupsUpdating",
        "action": "Update",
        "note": "Updating replica 3",
        "regarding": lws_reference(),
        "reportingController": "lws",
        "reportingInstance": "lws",
    }))
    .expect("event");
    events
        .create(&PostParams::default(), &event)
        .await
        .expect("created");
    let series = json!({"series": {"count": 2, "lastObservedTime": "2026-03-01T09:00:05.000000Z"}});
    events
        .patch(
            "demo.18a2b3c4d5e6f7a8",
            &PatchParams::default(),
            &Patch::Merge(series),
        )
        .await
        .expect("series counted");

    let stored = events.get("demo.18a2b3c4d5e6f7a8").await.expect("stored");
    assert_eq!(stored.note.as_deref(), Some("Updating replica 3"));
    assert_eq!(stored.series.as_ref().map(|s| s.count), Some(2));
    assert_eq!(
        stored.regarding.as_ref().and_then(|r| r.kind.as_deref()),
        Some("LeaderWorkerSet")
    );

    let core = Api::<CoreEvent>::namespaced(client.clone(), "default");
    let selector = format!(
        "involvedObject.name=demo,involvedObject.namespace=default,involvedObject.uid={LWS_UID}"
    );
    let described = core
        .list(&ListParams::default().fields(&selector))
        .await
        .expect("listed as kubectl describe lists")
        .items;
    assert_eq!(described.len(), 1);
    let seen = &described[0];
    assert_eq!(
        (seen.reason.as_deref(), seen.message.as_deref()),
        (Some("GroupsUpdating"), Some("Updating replica 3"))
    );
    assert_eq!(seen.reporting_component.as_deref(), Some("lws"));
    assert_eq!(seen.involved_object.uid.as_deref(), Some(LWS_UID));
}

#[tokio::test]
async fn a_core_event_and_its_count_are_taken() {
    let (_cluster, client) = common::start_default_simulated().await;
    let core = Api::<CoreEvent>::namespaced(client.clone(), "default");
    let event: CoreEvent = serde_json::from_value(json!({
        "metadata": {"name": "demo-0.18a2b3c4d5e6f7a9", "namespace": "default"},
        "involvedObject": lws_reference(),
        "reason": "RecreateGroup",
        "message": "Worker pod demo-0-1 failed, deleted leader pod demo-0 to recreate group 0",
        "source": {"component": "lws"},
        "firstTimestamp": "2026-03-01T09:00:00Z",
        "lastTimestamp": "2026-03-01T09:00:00Z",
        "count": 1,
        "type": "Normal",
        "eventTime": null,
        "reportingComponent": "lws",
        "reportingInstance": "",
    }))
    .expect("event");
    core.create(&PostParams::default(), &event)
        .await
        .expect("created");
    let again = json!({"count": 2, "lastTimestamp": "2026-03-01T09:00:09Z",
                       "message": "Worker pod demo-0-1 failed, deleted leader pod demo-0 to recreate group 0"});
    core.patch(
        "demo-0.18a2b3c4d5e6f7a9",
        &PatchParams::default(),
        &Patch::Strategic(again),
    )
    .await
    .expect("count raised");

    let stored = core.get("demo-0.18a2b3c4d5e6f7a9").await.expect("stored");
    assert_eq!(stored.count, Some(2));
    assert_eq!(stored.reason.as_deref(), Some("RecreateGroup"));

    let events = Api::<Event>::namespaced(client.clone(), "default");
    let listed = events
        .list(&ListParams::default().fields("reason=RecreateGroup"))
        .await
        .expect("listed through events.k8s.io")
        .items;
    assert_eq!(listed.len(), 1);
    let seen = &listed[0];
    assert_eq!(seen.deprecated_count, Some(2));
    assert_eq!(
        seen.note.as_deref(),
        Some("Worker pod demo-0-1 failed, deleted leader pod demo-0 to recreate group 0")
    );
    assert_eq!(
        seen.regarding.as_ref().and_then(|r| r.name.as_deref()),
        Some("demo")
    );
}
