//! Watches: event types, resuming from a resourceVersion, 410 Gone past the history,
//! bookmarks, selector watches, and many watchers with a stalled one among them.

use crate::common;

use std::time::Duration;

use capstan_cluster::ClusterOptions;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use serde_json::json;
use tokio::io::AsyncWriteExt;

async fn next_event<S>(stream: &mut S) -> WatchEvent<ConfigMap>
where
    S: futures::Stream<Item = kube::Result<WatchEvent<ConfigMap>>> + Unpin,
{
    tokio::time::timeout(common::DEADLINE, stream.next())
        .await
        .expect("an event in time")
        .expect("stream open")
        .expect("event decodes")
}

fn name_of(event: &WatchEvent<ConfigMap>) -> (&'static str, String) {
    match event {
        WatchEvent::Added(o) => ("ADDED", o.metadata.name.clone().unwrap_or_default()),
        WatchEvent::Modified(o) => ("MODIFIED", o.metadata.name.clone().unwrap_or_default()),
        WatchEvent::Deleted(o) => ("DELETED", o.metadata.name.clone().unwrap_or_default()),
        WatchEvent::Bookmark(_) => ("BOOKMARK", String::new()),
        WatchEvent::Error(e) => panic!("watch error {e:?}"),
    }
}

#[tokio::test]
async fn watch_sees_added_modified_deleted_in_order() {
    let (_cluster, client) = common::start().await;
    let maps = Api::<ConfigMap>::namespaced(client.clone(), "default");
    let start = maps
        .list(&Default::default())
        .await
        .expect("list")
        .metadata
        .resource_version
        .expect("rv");
    let mut stream = maps
        .watch(&WatchParams::default(), &start)
        .await
        .expect("watch")
        .boxed();
    maps.create(
        &PostParams::default(),
        &common::config_map("w", json!({"a": "1"})),
    )
    .await
    .expect("create");
    maps.patch(
        "w",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"a": "2"}})),
    )
    .await
    .expect("patch");
    maps.delete("w", &DeleteParams::default())
        .await
        .expect("delete");
    let mut seen = Vec::new();
    for _ in 0..3 {
        seen.push(name_of(&next_event(&mut stream).await));
    }
    assert_eq!(
        seen,
        [
            ("ADDED", "w".into()),
            ("MODIFIED", "w".into()),
            ("DELETED", "w".into())
        ]
    );
}

#[tokio::test]
async fn watch_resumes_from_a_resource_version() {
    let (_cluster, client) = common::start().await;
    let maps = Api::<ConfigMap>::namespaced(client.clone(), "default");
    let first = maps
        .create(
            &PostParams::default(),
            &common::config_map("one", json!({})),
        )
        .await
        .expect("one");
    maps.create(
        &PostParams::default(),
        &common::config_map("two", json!({})),
    )
    .await
    .expect("two");
    maps.create(
        &PostParams::default(),
        &common::config_map("three", json!({})),
    )
    .await
    .expect("three");
    let from = first.metadata.resource_version.expect("rv");
    let mut stream = maps
        .watch(&WatchParams::default(), &from)
        .await
        .expect("watch")
        .boxed();
    assert_eq!(
        name_of(&next_event(&mut stream).await),
        ("ADDED", "two".into())
    );
    assert_eq!(
        name_of(&next_event(&mut stream).await),
        ("ADDED", "three".into())
    );
}

#[tokio::test]
async fn a_resource_version_older_than_the_history_is_gone() {
    let options = ClusterOptions {
        history: 5,
        ..ClusterOptions::default()
    };
    let (_cluster, client) = common::start_with(options).await;
    let maps = Api::<ConfigMap>::namespaced(client.clone(), "default");
    let first = maps
        .create(
            &PostParams::default(),
            &common::config_map("old", json!({})),
        )
        .await
        .expect("old");
    for i in 0..10 {
        maps.create(
            &PostParams::default(),
            &common::config_map(&format!("n{i}"), json!({})),
        )
        .await
        .expect("n");
    }
    let from = first.metadata.resource_version.expect("rv");
    // As kube-apiserver does, Gone is the event of an open stream: kube's watcher relists
    // on that event, and would retry an HTTP 410 forever.
    let mut stream = maps
        .watch(&WatchParams::default(), &from)
        .await
        .expect("the watch opens")
        .boxed();
    match stream.next().await {
        Some(Ok(WatchEvent::Error(e))) => assert_eq!(e.code, 410),
        other => panic!("expected 410, got {other:?}"),
    }
}

#[tokio::test]
async fn bookmarks_are_sent_when_asked() {
    let (_cluster, client) = common::start().await;
    let maps = Api::<ConfigMap>::namespaced(client.clone(), "default");
    let params = WatchParams::streaming_lists();
    let mut stream = maps.watch(&params, "0").await.expect("watch").boxed();
    // With sendInitialEvents the initial state ends with a bookmark carrying the marker.
    match next_event(&mut stream).await {
        WatchEvent::Bookmark(b) => assert_eq!(
            b.metadata
                .annotations
                .get("k8s.io/initial-events-end")
                .map(String::as_str),
            Some("true")
        ),
        other => panic!("expected a bookmark, got {:?}", name_of(&other)),
    }
}

#[tokio::test]
async fn selector_watch_sees_objects_enter_and_leave() {
    let (_cluster, client) = common::start().await;
    let maps = Api::<ConfigMap>::namespaced(client.clone(), "default");
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "s", "labels": {"team": "a"}}}))
            .expect("cm");
    let created = maps
        .create(&PostParams::default(), &cm)
        .await
        .expect("create");
    let rv = created.metadata.resource_version.expect("rv");
    let mut stream = maps
        .watch(&WatchParams::default().labels("team=b"), &rv)
        .await
        .expect("watch")
        .boxed();
    let relabel = |team: &str| Patch::Merge(json!({"metadata": {"labels": {"team": team}}}));
    maps.patch("s", &PatchParams::default(), &relabel("b"))
        .await
        .expect("enter");
    maps.patch("s", &PatchParams::default(), &relabel("c"))
        .await
        .expect("leave");
    assert_eq!(
        name_of(&next_event(&mut stream).await),
        ("ADDED", "s".into())
    );
    assert_eq!(
        name_of(&next_event(&mut stream).await),
        ("DELETED", "s".into())
    );
}

#[tokio::test]
async fn a_stalled_watcher_does_not_hold_up_the_others() {
    let (cluster, client) = common::start().await;
    let maps = Api::<ConfigMap>::namespaced(client.clone(), "default");
    // A client that starts a watch and never reads its socket.
    let mut stalled = common::connect_tls(&cluster).await;
    let request = format!(
        "GET /api/v1/namespaces/default/configmaps?watch=true&resourceVersion=1 HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {}\r\n\r\n",
        cluster.token()
    );
    stalled
        .write_all(request.as_bytes())
        .await
        .expect("request");
    let mut watchers = Vec::new();
    for _ in 0..20 {
        let rv = maps
            .list(&Default::default())
            .await
            .expect("list")
            .metadata
            .resource_version
            .expect("rv");
        watchers.push(
            maps.watch(&WatchParams::default(), &rv)
                .await
                .expect("watch")
                .boxed(),
        );
    }
    let payload = "p".repeat(64 * 1024);
    let total = 200;
    let writer = {
        let maps = maps.clone();
        tokio::spawn(async move {
            for i in 0..total {
                let cm = common::config_map(&format!("big-{i}"), json!({"payload": payload}));
                maps.create(&PostParams::default(), &cm)
                    .await
                    .expect("create");
            }
        })
    };
    for watcher in &mut watchers {
        let mut received = 0;
        while received < total {
            let events: Vec<_> = tokio::time::timeout(
                Duration::from_secs(60),
                watcher.by_ref().take(1).try_collect::<Vec<_>>(),
            )
            .await
            .expect("watchers keep receiving while one is stalled")
            .expect("event");
            received += events.len();
        }
    }
    writer.await.expect("writer");
    drop(stalled);
}

#[tokio::test]
async fn injected_faults_fail_writes_and_cut_watches_deterministically() {
    use capstan_cluster::faults::FaultSettings;
    let faults = FaultSettings {
        seed: 3,
        write_error_rate: 0.5,
        watch_drop_rate: 1.0,
        ..FaultSettings::default()
    };
    let (_cluster, client) = common::start_with(ClusterOptions {
        faults,
        ..ClusterOptions::default()
    })
    .await;
    let maps = Api::<ConfigMap>::namespaced(client.clone(), "default");
    let mut outcomes = Vec::new();
    for i in 0..20 {
        let result = maps
            .create(
                &PostParams::default(),
                &common::config_map(&format!("f{i}"), json!({})),
            )
            .await;
        outcomes.push(match result {
            Ok(_) => 0,
            Err(kube::Error::Api(status)) => status.code,
            Err(other) => panic!("{other}"),
        });
    }
    assert!(
        outcomes.contains(&0) && outcomes.contains(&500),
        "{outcomes:?}"
    );
    // Every watch is cut after its first event.
    let rv = maps
        .list(&Default::default())
        .await
        .expect("list")
        .metadata
        .resource_version
        .expect("rv");
    let mut stream = maps
        .watch(&WatchParams::default(), &rv)
        .await
        .expect("watch")
        .boxed();
    let writer = maps.clone();
    tokio::spawn(async move {
        for i in 0..50 {
            let _ = writer
                .create(
                    &PostParams::default(),
                    &common::config_map(&format!("g{i}"), json!({})),
                )
                .await;
        }
    });
    let mut events = 0;
    while let Ok(Some(_)) = tokio::time::timeout(common::DEADLINE, stream.next()).await {
        events += 1;
    }
    assert_eq!(events, 1, "the stream ends after one event");
}
