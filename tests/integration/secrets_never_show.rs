//! Credentials in a repository URL never show: a failing clone or fetch names the
//! repository without its token, in the library's errors and on `capstan plan`'s stderr.
//! The fetch tests need no cluster; the live plan runs against the embedded one.

use crate::fleet::capstan;

const TOKEN: &str = "secret-token";

/// Every form a token takes in a URL, at a port nothing listens on.
fn urls() -> [String; 4] {
    [
        format!("https://{TOKEN}@127.0.0.1:1/x.git"),
        format!("https://x-access-token:{TOKEN}@127.0.0.1:1/x.git"),
        format!("https://127.0.0.1:1/x.git?access_token={TOKEN}"),
        format!("http://127.0.0.1:1/x.git?token={TOKEN}"),
    ]
}

#[test]
fn a_failing_fetch_does_not_show_the_token() {
    for url in urls() {
        let state = tempfile::tempdir().expect("state dir");
        let error = capstan::sync::source::Source::open(
            &url,
            "main",
            None,
            state.path(),
            capstan::sync::source::Auth::None,
        )
        .expect_err("nothing listens on port 1");
        let shown = format!("{error} {error:?}");
        assert!(!shown.contains(TOKEN), "{url}: {shown}");
        assert!(
            shown.contains("127.0.0.1:1"),
            "names the repository: {shown}"
        );
        // The clone keeps the raw URL: the token is still there to authenticate with.
        let clone = git2::Repository::open_bare(state.path().join("repo")).expect("bare clone");
        let origin = clone.find_remote("origin").expect("origin");
        assert_eq!(origin.url_bytes(), url.as_bytes());
    }
}

#[test]
fn plan_errors_do_not_show_the_token() {
    for url in urls() {
        let dir = tempfile::tempdir().expect("tempdir");
        let output = capstan(dir.path(), &["plan", "--repo", &url, "--path", "fleet"]);
        assert_ne!(output.status.code(), Some(0));
        let stderr = String::from_utf8_lossy(&output.stderr);
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            !stderr.contains(TOKEN) && !stdout.contains(TOKEN),
            "{url}: {stderr}{stdout}"
        );
        assert!(stderr.contains("127.0.0.1:1"), "{stderr}");
    }
}

/// A live plan of Secrets whose live objects carry their values in the last-applied
/// annotation too (as `kubectl apply` leaves them), and of a ConfigMap whose annotation
/// holds a Secret: no value shows, in JSON or text.
#[tokio::test(flavor = "multi_thread")]
async fn a_live_plan_does_not_show_secret_values() {
    use crate::common;
    use crate::common::git::{FleetRepo, with_changes};
    use crate::fleet::fleet_v1;
    use k8s_openapi::api::core::v1::{ConfigMap, Secret};
    use kube::api::{Api, PostParams};

    const OLD: &str = "b2xkLXNlY3JldC12YWx1ZQ=="; // old-secret-value
    const NEW: &str = "bmV3LXNlY3JldC12YWx1ZQ=="; // new-secret-value
    let held = format!(
        r#"{{"apiVersion":"v1","kind":"Secret","metadata":{{"name":"s","namespace":"default"}},"data":{{"token":"{OLD}"}}}}"#
    );
    let (cluster, client) = common::start_with(capstan_cluster::ClusterOptions {
        capstan_crds: true,
        ..capstan_cluster::ClusterOptions::default()
    })
    .await;
    let kubeconfig_dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = kubeconfig_dir.path().join("kubeconfig");
    capstan_cluster::kubeconfig::write(&kubeconfig, &cluster.kubeconfig()).expect("kubeconfig");
    let annotated = serde_json::json!({
        "metadata": {"name": "s", "namespace": "default",
                     "annotations": {"kubectl.kubernetes.io/last-applied-configuration": held}},
        "data": {"token": OLD},
    });
    Api::<Secret>::namespaced(client.clone(), "default")
        .create(
            &PostParams::default(),
            &serde_json::from_value(annotated).expect("Secret"),
        )
        .await
        .expect("live Secret");
    let holder = serde_json::json!({
        "metadata": {"name": "holder", "namespace": "default",
                     "annotations": {"kubectl.kubernetes.io/last-applied-configuration": held}},
        "data": {"k": "v"},
    });
    Api::<ConfigMap>::namespaced(client.clone(), "default")
        .create(
            &PostParams::default(),
            &serde_json::from_value(holder).expect("ConfigMap"),
        )
        .await
        .expect("live ConfigMap");
    let head = with_changes(
        &fleet_v1(),
        &[(
            "fleet/secrets.yaml",
            Some(format!(
                "apiVersion: v1\nkind: Secret\nmetadata:\n  name: s\n  namespace: default\n  labels:\n    changed: here\ndata:\n  token: {NEW}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: holder\n  namespace: default\n  labels:\n    changed: here\ndata:\n  k: w\n---\napiVersion: v1\nkind: Secret\nmetadata:\n  name: refused\n  namespace: default\ntype: kubernetes.io/tls\ndata:\n  tls.crt: {NEW}\n"
            )),
        )],
    );
    let fleet = FleetRepo::proposal(&fleet_v1(), &head);
    for format in ["json", "text"] {
        let (dir, kubeconfig) = (fleet.path().to_path_buf(), kubeconfig.clone());
        let output = tokio::task::spawn_blocking(move || {
            let kubeconfig = kubeconfig.to_str().expect("utf-8").to_string();
            capstan(
                &dir,
                &[
                    "plan",
                    "--path",
                    "fleet",
                    "--format",
                    format,
                    "--kubeconfig",
                    &kubeconfig,
                ],
            )
        })
        .await
        .expect("plan");
        let shown = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        for value in [OLD, NEW, "old-secret-value", "new-secret-value"] {
            assert!(!shown.contains(value), "{value} shows in:\n{shown}");
        }
        assert!(shown.contains("holder"), "{shown}");
        assert!(
            shown.contains("(masked: may hold a Secret's values)"),
            "{shown}"
        );
    }
}

/// A Secret whose value is not base64, which the API server would refuse (the real one with a
/// 500): rejected before anything is applied, and the rejection the sync records (the
/// outcome, the `GitSync` status, the history record, the Event) names the file and field,
/// never the value. (A refusal that quotes a value, as an admission webhook's may, is
/// scrubbed of the commit's Secret values: `sync::mask`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_secret_does_not_show_its_value_where_the_rejection_is_recorded() {
    use crate::common;
    use crate::common::git::FleetRepo;
    use capstan::sync::run::Outcome;
    use capstan_api::capstan::SYSTEM_NAMESPACE;
    use capstan_api::{GitSync, HistoryRecord};
    use k8s_openapi::api::core::v1::Event;
    use kube::api::{Api, ListParams};

    const VALUE: &str = "bmV3LXNlY3JldC12YWx1ZQ=="; // new-secret-value
    let (_cluster, client) = common::start().await;
    let mut repo = FleetRepo::new();
    repo.commit(
        &[(
            "secret.yaml",
            Some(&format!(
                "apiVersion: v1\nkind: Secret\nmetadata:\n  name: refused\n  namespace: default\ndata:\n  token: not base64 {VALUE}\n"
            )),
        )],
        "A Secret the server refuses",
    );
    let mut syncer = common::syncer(&client, repo.path()).await;
    let outcome = syncer.sync().await.expect("sync");
    let Outcome::Rejected { errors, .. } = &outcome else {
        panic!("{outcome:?}")
    };
    let status = Api::<GitSync>::namespaced(client.clone(), SYSTEM_NAMESPACE)
        .get("capstan")
        .await
        .expect("GitSync")
        .status
        .expect("status");
    let records = Api::<HistoryRecord>::namespaced(client.clone(), SYSTEM_NAMESPACE)
        .list(&ListParams::default())
        .await
        .expect("records");
    let events = Api::<Event>::namespaced(client.clone(), SYSTEM_NAMESPACE)
        .list(&ListParams::default())
        .await
        .expect("events");
    let shown = format!(
        "{errors:?}\n{}\n{}\n{}",
        status.error,
        serde_json::to_string(&records.items).expect("json"),
        serde_json::to_string(&events.items).expect("json"),
    );
    assert!(
        shown.contains("secret.yaml:7: data.token: not valid base64"),
        "{shown}"
    );
    for value in [VALUE, "new-secret-value"] {
        assert!(!shown.contains(value), "{value} shows in:\n{shown}");
    }
}
