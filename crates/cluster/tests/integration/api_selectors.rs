//! Lists filtered by label and field selectors, and paged with limit/continue.

use crate::common;

use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;

fn names(pods: &[Pod]) -> Vec<String> {
    let mut names: Vec<String> = pods
        .iter()
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn label_selectors_equality_and_sets() {
    let (_cluster, client) = common::start().await;
    for (name, labels) in [
        ("a", json!({"tier": "web", "zone": "x"})),
        ("b", json!({"tier": "db", "zone": "y"})),
        ("c", json!({"tier": "cache"})),
    ] {
        common::create_pod(&client, "default", &common::pod(name, labels)).await;
    }
    let pods = Api::<Pod>::namespaced(client.clone(), "default");
    let cases = [
        ("tier=web", vec!["a"]),
        ("tier!=web", vec!["b", "c"]),
        ("tier in (web,db)", vec!["a", "b"]),
        ("tier notin (web,db)", vec!["c"]),
        ("zone", vec!["a", "b"]),
        ("!zone", vec!["c"]),
        ("tier in (web,db),zone=y", vec!["b"]),
    ];
    for (selector, want) in cases {
        let got = pods
            .list(&ListParams::default().labels(selector))
            .await
            .expect(selector);
        assert_eq!(names(&got.items), want, "{selector}");
    }
    let err = pods
        .list(&ListParams::default().labels("tier in (web"))
        .await
        .expect_err("bad selector");
    assert!(matches!(err, kube::Error::Api(s) if s.code == 400));
}

#[tokio::test]
async fn field_selectors_on_name_namespace_node_and_phase() {
    let (_cluster, client) = common::start().await;
    let mut bound = common::pod("bound", json!({}));
    bound.spec.as_mut().expect("spec").node_name = Some("worker-1".into());
    common::create_pod(&client, "default", &bound).await;
    common::create_pod(&client, "default", &common::pod("free", json!({}))).await;
    common::create_pod(&client, "kube-system", &common::pod("system", json!({}))).await;
    let all = Api::<Pod>::all(client.clone());
    let cases = [
        ("metadata.name=free", vec!["free"]),
        ("metadata.namespace=kube-system", vec!["system"]),
        ("metadata.namespace!=kube-system", vec!["bound", "free"]),
        ("spec.nodeName=worker-1", vec!["bound"]),
        ("spec.nodeName=", vec!["free", "system"]),
        ("status.phase=Pending", vec!["bound", "free", "system"]),
        ("status.phase!=Pending", vec![]),
    ];
    for (selector, want) in cases {
        let got = all
            .list(&ListParams::default().fields(selector))
            .await
            .expect(selector);
        assert_eq!(names(&got.items), want, "{selector}");
    }
    let err = all
        .list(&ListParams::default().fields("spec.image=x"))
        .await
        .expect_err("unsupported");
    assert!(matches!(err, kube::Error::Api(s) if s.code == 400));
}

#[tokio::test]
async fn limit_and_continue_page_through_everything_once() {
    let (_cluster, client) = common::start().await;
    let maps = Api::<ConfigMap>::namespaced(client.clone(), "default");
    for i in 0..25 {
        maps.create(
            &PostParams::default(),
            &common::config_map(&format!("cm-{i:02}"), json!({})),
        )
        .await
        .expect("create");
    }
    let mut seen = Vec::new();
    let mut params = ListParams::default().limit(10);
    let mut pages = 0;
    loop {
        let page = maps.list(&params).await.expect("page");
        pages += 1;
        seen.extend(page.items.iter().filter_map(|c| c.metadata.name.clone()));
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => {
                assert!(page.metadata.remaining_item_count.is_some_and(|r| r > 0));
                params = params.continue_token(&token);
            }
            None => break,
        }
    }
    assert_eq!(pages, 3);
    let want: Vec<String> = (0..25).map(|i| format!("cm-{i:02}")).collect();
    assert_eq!(seen, want);
}

#[tokio::test]
async fn a_filtered_list_pages_through_its_matches_without_a_remaining_count() {
    let (_cluster, client) = common::start().await;
    let maps = Api::<ConfigMap>::namespaced(client.clone(), "default");
    for i in 0..25 {
        let mut map = common::config_map(&format!("cm-{i:02}"), json!({}));
        let parity = if i % 2 == 0 { "even" } else { "odd" };
        map.metadata.labels = Some([("parity".to_string(), parity.to_string())].into());
        maps.create(&PostParams::default(), &map)
            .await
            .expect("create");
    }
    let mut seen = Vec::new();
    let mut params = ListParams::default().labels("parity=even").limit(5);
    loop {
        let page = maps.list(&params).await.expect("page");
        // As kube-apiserver: a selector makes the count of what follows unknown.
        assert_eq!(page.metadata.remaining_item_count, None);
        seen.extend(page.items.iter().filter_map(|c| c.metadata.name.clone()));
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => break,
        }
    }
    let want: Vec<String> = (0..25).step_by(2).map(|i| format!("cm-{i:02}")).collect();
    assert_eq!(seen, want);
}
