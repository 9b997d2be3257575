//! `capstan plan` from the command line, on fleet repositories made in each test: exit
//! codes as Terraform's, errors naming file, line and field, markdown for pull requests,
//! JSON with the ordered-upgrade steps, and a live plan against the embedded cluster.

use crate::common;
use crate::fleet;

use capstan_cluster::{ClusterOptions, kubeconfig};
use common::TestCluster;
use common::git::{FleetRepo, with_changes};
use common::manifests::node_label;
use fleet::{VERSION_LABEL, capstan, fleet_v1, fleet_v2, stdout};
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

const PLAN: [&str; 4] = ["plan", "--path", "fleet", "--detailed-exitcode"];

#[test]
fn a_change_outside_the_fleet_plans_no_changes() {
    let head = with_changes(&fleet_v1(), &[("README.md", Some("# the fleet".into()))]);
    let fleet = FleetRepo::proposal(&fleet_v1(), &head);
    let output = capstan(fleet.path(), &PLAN);
    assert_eq!(output.status.code(), Some(0), "{}", stdout(&output));
    assert!(
        stdout(&output).ends_with("Plan: No changes.\n"),
        "{}",
        stdout(&output)
    );
}

#[test]
fn changes_exit_2_with_detailed_exitcode_and_0_without() {
    let fleet = FleetRepo::proposal(&fleet_v1(), &fleet_v2());
    let detailed = capstan(fleet.path(), &PLAN);
    assert_eq!(detailed.status.code(), Some(2), "{}", stdout(&detailed));
    let text = stdout(&detailed);
    assert!(
        text.contains("~ Module kmm-demo/my-kmod  configure  fleet/modules/my-kmod.yaml:1"),
        "{text}"
    );
    assert!(
        text.ends_with(
            "Plan: 0 to create, 2 to configure, 0 to prune; 1 node upgrade \
             (worker-1: kmm-demo/my-kmod v1 → v2)\n"
        ),
        "{text}"
    );
    let plain = capstan(fleet.path(), &PLAN[..3]);
    assert_eq!(plain.status.code(), Some(0));
    // Not a terminal: no colours.
    assert!(!stdout(&plain).contains('\x1b'));
}

#[test]
fn an_invalid_head_exits_1_naming_file_line_and_field() {
    // worker-2 moved to v3, a version no Module declares.
    let head = with_changes(
        &fleet_v2(),
        &[(
            "fleet/nodes/worker-2.yaml",
            Some(node_label("worker-2", "my-kmod", "v3")),
        )],
    );
    let fleet = FleetRepo::proposal(&fleet_v1(), &head);
    let output = capstan(fleet.path(), &PLAN);
    assert_eq!(output.status.code(), Some(1));
    let text = stdout(&output);
    assert!(
        text.contains(&format!(
            "fleet/nodes/worker-2.yaml:1: metadata.labels[{VERSION_LABEL}]: version label moves \
             to \"v3\", but Module kmm-demo/my-kmod (fleet/modules/my-kmod.yaml:1) declares \
             version \"v2\""
        )),
        "{text}"
    );
    assert!(
        text.contains("Plan: 1 error: head would be rejected"),
        "{text}"
    );
}

#[test]
fn markdown_for_a_pull_request_starts_with_the_summary_line() {
    let fleet = FleetRepo::proposal(&fleet_v1(), &fleet_v2());
    let out = fleet.path().join("plan.md");
    let output = capstan(
        fleet.path(),
        &[
            &PLAN[..],
            &["--format", "markdown", "--pull-request", "42", "--output"],
            &[out.to_str().expect("utf-8")],
        ]
        .concat(),
    );
    assert_eq!(output.status.code(), Some(2));
    let markdown = stdout(&output);
    assert_eq!(
        markdown.lines().next(),
        Some(
            "**capstan plan**: 0 to create, 2 to configure, 0 to prune; 1 node upgrade \
             (worker-1: kmm-demo/my-kmod v1 → v2)"
        )
    );
    assert!(markdown.contains("pull request \\#42"), "{markdown}");
    assert!(
        markdown.contains("<details><summary>~ Module kmm-demo/my-kmod (configure)</summary>"),
        "{markdown}"
    );
    assert!(
        markdown.contains("\n2. unload kmm-demo/my-kmod v1"),
        "{markdown}"
    );
    assert_eq!(std::fs::read_to_string(&out).expect("plan.md"), markdown);
    assert!(!fleet.path().join("plan.md.2").exists());
}

#[test]
fn json_lists_the_four_steps_of_worker_1() {
    let fleet = FleetRepo::proposal(&fleet_v1(), &fleet_v2());
    let output = capstan(fleet.path(), &[&PLAN[..], &["--format", "json"]].concat());
    assert_eq!(output.status.code(), Some(2));
    let plan: Value = serde_json::from_slice(&output.stdout).expect("JSON");
    assert_eq!(plan["schemaVersion"], 1);
    assert_eq!(plan["mode"], "offline");
    assert_eq!(plan["head"]["subject"], "Move workers to my-kmod v2");
    assert_eq!(plan["summary"]["nodes"], 1);
    let worker = &plan["nodes"][0];
    assert_eq!(
        (
            &worker["node"],
            &worker["module"],
            &worker["from"],
            &worker["to"]
        ),
        (
            &json!("worker-1"),
            &json!("kmm-demo/my-kmod"),
            &json!("v1"),
            &json!("v2")
        )
    );
    let steps: Vec<(u64, &str)> = worker["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .map(|s| (s["number"].as_u64().unwrap(), s["step"].as_str().unwrap()))
        .collect();
    assert_eq!(
        steps,
        [
            (1, "device-plugin-stopped"),
            (2, "old-module-unloaded"),
            (3, "new-module-loaded"),
            (4, "device-plugin-started"),
        ]
    );
    assert_eq!((&worker["order"], &worker["wave"]), (&json!(1), &json!(1)));
    assert_eq!(plan["policy"]["waves"], json!([["worker-1"]]));
}

/// An embedded cluster with capstan's kinds, and a kubeconfig file for it.
async fn cluster_with_kubeconfig() -> (TestCluster, kube::Client, tempfile::TempDir) {
    let (cluster, client) = common::start_with(ClusterOptions {
        capstan_crds: true,
        ..ClusterOptions::default()
    })
    .await;
    let dir = tempfile::tempdir().expect("tempdir");
    kubeconfig::write(&dir.path().join("kubeconfig"), &cluster.kubeconfig()).expect("kubeconfig");
    (cluster, client, dir)
}

/// Runs `capstan plan` against the cluster off the runtime's threads.
async fn live_plan(fleet: &FleetRepo, kubeconfig: &std::path::Path) -> (Option<i32>, Value) {
    let (dir, kubeconfig) = (fleet.path().to_path_buf(), kubeconfig.to_path_buf());
    let output = tokio::task::spawn_blocking(move || {
        let kubeconfig = kubeconfig.to_str().expect("utf-8").to_string();
        capstan(
            &dir,
            &[
                &PLAN[..],
                &["--format", "json", "--kubeconfig", &kubeconfig],
            ]
            .concat(),
        )
    })
    .await
    .expect("plan");
    let plan = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|_| panic!("not JSON: {}", String::from_utf8_lossy(&output.stderr)));
    (output.status.code(), plan)
}

fn actions(plan: &Value) -> Vec<String> {
    plan["objects"]
        .as_array()
        .expect("objects")
        .iter()
        .map(|o| {
            format!(
                "{} {} {}",
                o["action"].as_str().unwrap(),
                o["id"]["kind"].as_str().unwrap(),
                o["id"]["name"].as_str().unwrap()
            )
        })
        .collect()
}

#[tokio::test]
async fn a_live_plan_on_an_empty_cluster_creates_everything_but_its_nodes() {
    let (_cluster, _client, dir) = cluster_with_kubeconfig().await;
    let fleet = FleetRepo::proposal(&fleet_v1(), &fleet_v2());
    let (code, plan) = live_plan(&fleet, &dir.path().join("kubeconfig")).await;
    assert_eq!(code, Some(2), "{plan:#}");
    assert_eq!(plan["mode"], "live");
    assert_eq!(
        plan["cluster"],
        json!({"sync": "capstan", "found": false, "lastAppliedRevision": null,
               "unchanged": 0, "full": false})
    );
    // No kubelet registered worker-1 or worker-2: a sync never creates a Node.
    assert_eq!(
        actions(&plan),
        [
            "create Module my-kmod",
            "create Namespace kmm-demo",
            "absent Node worker-1",
            "absent Node worker-2",
            "create ConfigMap settings",
        ]
    );
    assert!(
        plan["objects"][0]["diff"]
            .as_str()
            .unwrap()
            .contains("+      version: v2"),
        "{plan:#}"
    );
    assert_eq!(
        (&plan["summary"]["create"], &plan["summary"]["absent"]),
        (&json!(3), &json!(2))
    );
    // Their labels apply once a kubelet registers them: no node moves now.
    assert_eq!(plan["nodes"], json!([]), "{plan:#}");
}

/// A Node in Git that no kubelet registered: the live plan says it is not in the cluster
/// and not created, in every format, and that is no change for `--detailed-exitcode`.
#[tokio::test(flavor = "multi_thread")]
async fn a_live_plan_shows_a_node_no_kubelet_registered_as_absent_not_created() {
    let (cluster, client) = common::start_default_simulated().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("kubeconfig");
    kubeconfig::write(&config, &cluster.kubeconfig()).expect("kubeconfig");
    // The cluster runs fleet_v1 (worker-1 and worker-2 registered and labelled); head
    // adds worker-9, which no kubelet registered.
    let head = with_changes(
        &fleet_v1(),
        &[(
            "fleet/nodes/worker-9.yaml",
            Some(node_label("worker-9", "my-kmod", "v1")),
        )],
    );
    let fleet = FleetRepo::proposal(&fleet_v1(), &head);
    let mut syncer = common::syncer(&client, fleet.path()).await;
    syncer.sync().await.expect("base syncs");
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    assert!(nodes.get_opt("worker-9").await.expect("nodes").is_none());

    let (code, plan) = live_plan(&fleet, &config).await;
    assert_eq!(code, Some(0), "an absent Node is no change: {plan:#}");
    assert_eq!(plan["errors"], json!([]), "{plan:#}");
    assert_eq!(actions(&plan), ["absent Node worker-9"], "{plan:#}");
    assert_eq!(plan["nodes"], json!([]), "{plan:#}");
    assert_eq!(
        (&plan["summary"]["absent"], &plan["summary"]["hasChanges"]),
        (&json!(1), &json!(false))
    );
    let diff = plan["objects"][0]["diff"].as_str().expect("a diff");
    assert!(
        diff.contains(&format!("+    {VERSION_LABEL}: v1")),
        "{diff}"
    );

    let kubeconfig = config.to_str().expect("utf-8");
    let run = |format: &'static str| {
        let (dir, kubeconfig) = (fleet.path().to_path_buf(), kubeconfig.to_string());
        tokio::task::spawn_blocking(move || {
            let args = [
                &PLAN[..],
                &["--format", format, "--kubeconfig", &kubeconfig],
            ]
            .concat();
            capstan(&dir, &args)
        })
    };
    let text = run("text").await.expect("plan");
    assert_eq!(text.status.code(), Some(0));
    let text = stdout(&text);
    assert!(
        text.contains(
            "! Node worker-9  absent     fleet/nodes/worker-9.yaml:1  (not in the cluster: not \
             created; its labels apply when a kubelet registers it)"
        ),
        "{text}"
    );
    assert!(
        text.ends_with("Plan: No changes. 1 Node not in the cluster, not created (worker-9)\n"),
        "{text}"
    );
    let markdown = stdout(&run("markdown").await.expect("plan"));
    assert_eq!(
        markdown.lines().next(),
        Some("**capstan plan**: No changes. 1 Node not in the cluster, not created (worker-9)"),
        "{markdown}"
    );
    assert!(
        markdown.contains("| ! | `Node worker-9` | absent (not in the cluster: not created; "),
        "{markdown}"
    );
    cluster.shutdown().await;
}

#[tokio::test]
async fn a_live_plan_moves_labels_from_the_cluster_and_prunes_from_the_inventory() {
    let (_cluster, client, dir) = cluster_with_kubeconfig().await;
    // What a sync of fleet_v1 left: the labels, applied by capstan, and an old ConfigMap
    // in the inventory.
    let apply = PatchParams::apply("capstan").force();
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    for name in ["worker-1", "worker-2"] {
        let node = json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {VERSION_LABEL: "v1"}}});
        nodes
            .patch(name, &apply, &Patch::Apply(&node))
            .await
            .expect("node");
    }
    let config_maps: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(client.clone(), "default");
    let old = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "old", "namespace": "default"}, "data": {"k": "v"}});
    config_maps
        .patch("old", &apply, &Patch::Apply(&old))
        .await
        .expect("old");
    let syncs: Api<capstan_api::GitSync> = Api::namespaced(client.clone(), "capstan-system");
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let namespace =
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "capstan-system"}});
    namespaces
        .patch("capstan-system", &apply, &Patch::Apply(&namespace))
        .await
        .expect("namespace");
    let sync = json!({"apiVersion": "capstan.dev/v1alpha1", "kind": "GitSync",
        "metadata": {"name": "capstan", "namespace": "capstan-system"},
        "spec": {"repo": "fleet", "branch": "main", "path": "fleet"}});
    syncs
        .patch("capstan", &apply, &Patch::Apply(&sync))
        .await
        .expect("sync");
    let status = json!({"apiVersion": "capstan.dev/v1alpha1", "kind": "GitSync",
        "metadata": {"name": "capstan", "namespace": "capstan-system"},
        "status": {"inventoryCount": 1, "inventory": [
            {"apiVersion": "v1", "kind": "ConfigMap", "namespace": "default", "name": "old", "digest": "0"}],
            "lastAppliedCommit": {"sha": "abc", "shortSha": "abc", "revision": "main@sha1:abc"}}});
    syncs
        .patch_status("capstan", &apply, &Patch::Apply(&status))
        .await
        .expect("status");

    let fleet = FleetRepo::proposal(&fleet_v1(), &fleet_v2());
    let (code, plan) = live_plan(&fleet, &dir.path().join("kubeconfig")).await;
    assert_eq!(code, Some(2), "{plan:#}");
    assert_eq!(plan["cluster"]["lastAppliedRevision"], "main@sha1:abc");
    let moves: Vec<String> = plan["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .map(|n| {
            format!(
                "{}: {} → {}",
                n["node"].as_str().unwrap(),
                n["from"],
                n["to"]
            )
        })
        .collect();
    assert_eq!(moves, ["worker-1: \"v1\" → \"v2\""]);
    let found = actions(&plan);
    assert!(
        found.contains(&"configure Node worker-1".to_string()),
        "{found:?}"
    );
    assert!(
        !found.iter().any(|a| a.ends_with("Node worker-2")),
        "{found:?}"
    );
    assert_eq!(
        found.last().map(String::as_str),
        Some("prune ConfigMap old")
    );
    let pruned = plan["objects"].as_array().unwrap().last().unwrap();
    assert!(
        pruned["diff"].as_str().unwrap().contains("-  k: v"),
        "{pruned:#}"
    );
}

#[test]
fn offline_plan_knows_every_built_in_kind() {
    let rbac = "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\n\
                metadata: {name: plugin-reader, namespace: kmm-demo}\n\
                rules: [{apiGroups: [\"\"], resources: [configmaps], verbs: [get, list]}]\n\
                ---\n\
                apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\n\
                metadata: {name: plugin-reader, namespace: kmm-demo}\n\
                roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: plugin-reader}\n\
                subjects: [{kind: ServiceAccount, name: plugin, namespace: kmm-demo}]\n";
    let hpa = "apiVersion: autoscaling/v2\nkind: HorizontalPodAutoscaler\n\
               metadata: {name: plugin, namespace: kmm-demo}\n\
               spec:\n  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: plugin}\n  \
               minReplicas: 1\n  maxReplicas: 3\n";
    let policy = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\n\
                  metadata: {name: deny-ingress, namespace: kmm-demo}\n\
                  spec: {podSelector: {}, policyTypes: [Ingress]}\n";
    let head = with_changes(
        &fleet_v1(),
        &[
            ("fleet/rbac.yaml", Some(rbac.to_string())),
            ("fleet/hpa.yaml", Some(hpa.to_string())),
            ("fleet/network-policy.yaml", Some(policy.to_string())),
        ],
    );
    let fleet = FleetRepo::proposal(&fleet_v1(), &head);
    let output = capstan(fleet.path(), &[&PLAN[..], &["--format", "json"]].concat());
    let plan: Value = serde_json::from_slice(&output.stdout).expect("JSON");
    assert_eq!(plan["errors"], json!([]), "{plan:#}");
    assert_eq!(output.status.code(), Some(2), "{plan:#}");
    assert_eq!(
        actions(&plan),
        [
            "create HorizontalPodAutoscaler plugin",
            "create NetworkPolicy deny-ingress",
            "create Role plugin-reader",
            "create RoleBinding plugin-reader",
        ]
    );
    let namespaces: Vec<&Value> = plan["objects"]
        .as_array()
        .expect("objects")
        .iter()
        .map(|o| &o["id"]["namespace"])
        .collect();
    assert_eq!(namespaces, [&json!("kmm-demo"); 4]);
}

/// `--head WORKTREE` plans the work tree as `git add -A` would commit it (changed and
/// untracked files, ignored ones left out) against HEAD, before anything is committed, and
/// leaves the repository as it was.
#[test]
fn a_plan_of_the_work_tree_shows_the_uncommitted_change() {
    let mut fleet = FleetRepo::new();
    let mut files = fleet_v1();
    files.push((".gitignore", "*.swp\n".to_string()));
    fleet.commit_set(&files, "Initial fleet");
    let args = |extra: &[&'static str]| {
        let mut args = vec![
            "plan",
            "--repo",
            ".",
            "--path",
            "fleet",
            "--detailed-exitcode",
        ];
        args.extend(extra);
        args
    };
    let clean = capstan(fleet.path(), &args(&["--head", "WORKTREE"]));
    assert_eq!(clean.status.code(), Some(0), "{}", stdout(&clean));
    assert!(
        stdout(&clean).ends_with("Plan: No changes.\n"),
        "{}",
        stdout(&clean)
    );

    // The change as docs/upgrade-campaigns.md makes it: edited files, a new one, and an
    // editor's swap file git ignores (it would not validate).
    for (path, text) in fleet_v2() {
        std::fs::write(fleet.path().join(path), text).expect("edit");
    }
    std::fs::write(
        fleet.path().join("fleet/new.yaml"),
        common::manifests::config_map("new", "1"),
    )
    .expect("untracked");
    std::fs::write(fleet.path().join("fleet/.new.yaml.swp"), "\0not: [yaml").expect("swap");
    let status = |fleet: &FleetRepo| -> Vec<(String, git2::Status)> {
        let mut options = git2::StatusOptions::new();
        options.include_untracked(true).include_ignored(true);
        let statuses = fleet.git.statuses(Some(&mut options)).expect("status");
        statuses
            .iter()
            .map(|entry| (entry.path().unwrap_or_default().to_string(), entry.status()))
            .collect()
    };
    let before = status(&fleet);
    let head_sha = fleet.git.head().expect("HEAD").target().expect("a commit");

    let output = capstan(
        fleet.path(),
        &args(&["--base", "HEAD", "--head", "WORKTREE", "--format", "json"]),
    );
    let plan: Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|_| panic!("not JSON: {}", String::from_utf8_lossy(&output.stderr)));
    assert_eq!(output.status.code(), Some(2), "{plan:#}");
    assert_eq!(plan["errors"], json!([]), "{plan:#}");
    assert_eq!(plan["base"]["sha"], head_sha.to_string());
    assert_eq!(
        plan["head"]["subject"],
        "Uncommitted changes in the work tree"
    );
    assert_eq!(
        actions(&plan),
        [
            "configure Module my-kmod",
            "create ConfigMap new",
            "configure Node worker-1",
        ]
    );
    assert_eq!(plan["nodes"][0]["node"], "worker-1", "{plan:#}");
    assert_eq!(plan["nodes"][0]["to"], "v2", "{plan:#}");
    // --base defaults to HEAD: the same plan.
    let default_base = capstan(
        fleet.path(),
        &args(&["--head", "WORKTREE", "--format", "json"]),
    );
    let again: Value = serde_json::from_slice(&default_base.stdout).expect("JSON");
    assert_eq!(again, plan);
    assert_eq!(
        status(&fleet),
        before,
        "the index and work tree are left as they were"
    );
    assert_eq!(fleet.git.head().expect("HEAD").target(), Some(head_sha));
}

#[test]
fn a_url_has_no_work_tree_to_plan() {
    let remote = FleetRepo::bare();
    remote.commit_files("main", &common::git::tree(&fleet_v1()), "Initial fleet");
    let url = format!("file://{}", remote.path().display());
    let dir = tempfile::tempdir().expect("tempdir");
    let output = capstan(
        dir.path(),
        &[
            "plan", "--repo", &url, "--path", "fleet", "--head", "WORKTREE",
        ],
    );
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("has no work tree to plan"), "{stderr}");
}
