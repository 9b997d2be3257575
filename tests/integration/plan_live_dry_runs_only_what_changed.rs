//! A live plan dry-runs only the objects that changed in Git or drifted in the cluster:
//! what the `GitSync` inventory and one list per kind show unchanged is counted, not sent
//! to the API server, and the plan says the same as one that dry-runs every object
//! (`--full`, as `kubectl diff --server-side`) about every object, node and count.

use crate::common;

use capstan::sync::plan::{self, LiveOptions, Plan, PlanInput};
use capstan::sync::source::{Auth, Source};
use common::git::FleetRepo;
use common::manifests::{NAMESPACE, config_map};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::json;

/// ConfigMaps in the fleet: more than the sync reads one by one, so they are listed.
const MAPS: usize = 12;

fn fleet(changed: Option<usize>) -> Vec<(String, String)> {
    let mut files = vec![("namespace.yaml".to_string(), NAMESPACE.to_string())];
    for i in 0..MAPS {
        let value = if Some(i) == changed { "b" } else { "a" };
        files.push((
            format!("maps/cm-{i}.yaml"),
            config_map(&format!("cm-{i}"), value),
        ));
    }
    files
}

/// The live plan of `head` against the cluster, by default and with `--full`.
async fn plans(repo: &FleetRepo, client: &kube::Client) -> (Plan, Plan) {
    let state = tempfile::tempdir().expect("tempdir");
    let source = Source::open(
        repo.path().to_str().expect("utf-8 path"),
        "main",
        None,
        state.path(),
        Auth::None,
    )
    .expect("the repository opens");
    let head = source.resolve("main").expect("head");
    let base = source.resolve("main~1").expect("base");
    let input = PlanInput::read(&source, base, head, None).expect("both commits read");
    let mut made = Vec::new();
    for full in [false, true] {
        let plan = plan::live(&input, client, "capstan", LiveOptions { full })
            .await
            .expect("a live plan");
        made.push(plan);
    }
    let full = made.pop().expect("the full plan");
    (made.pop().expect("the plan"), full)
}

/// The two plans say the same of every object, node and count.
fn assert_same(plan: &Plan, full: &Plan) {
    let text = |p: &Plan| plan::render_text(p, false);
    assert_eq!(
        plan.objects,
        full.objects,
        "{}\n---\n{}",
        text(plan),
        text(full)
    );
    assert_eq!(plan.nodes, full.nodes);
    assert_eq!(plan.errors, full.errors);
    assert_eq!(plan.summary, full.summary);
    assert_eq!(
        full.cluster.as_ref().map(|c| (c.unchanged, c.full)),
        Some((0, true))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_what_changed_in_git_or_drifted_is_dry_run_and_the_plan_says_the_same() {
    let (_cluster, client) = common::start_default_simulated().await;
    let mut repo = FleetRepo::new();
    repo.commit_set(&fleet(None), "Initial fleet");
    let mut syncer = common::syncer(&client, repo.path()).await;
    syncer.sync().await.expect("the fleet is applied");

    // One ConfigMap changed in Git: it alone is dry-run.
    repo.commit_set(&fleet(Some(3)), "Change cm-3");
    let (plan, full) = plans(&repo, &client).await;
    assert_same(&plan, &full);
    assert_eq!(
        plan.summary.configure,
        1,
        "{}",
        plan::render_text(&plan, false)
    );
    assert_eq!(plan.cluster.as_ref().map(|c| c.unchanged), Some(MAPS));
    assert!(plan::render_text(&plan, false).contains("12 objects unchanged since, not dry-run"));

    // Applied; then one ConfigMap changed by hand and one deleted: drift, dry-run too.
    syncer.sync().await.expect("the change is applied");
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), "kmm-demo");
    maps.patch(
        "cm-5",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"value": "by hand"}})),
    )
    .await
    .expect("a hand edit");
    maps.delete("cm-7", &DeleteParams::default())
        .await
        .expect("a hand delete");
    repo.commit_set(&fleet(Some(3)), "Nothing changes in Git");
    let (plan, full) = plans(&repo, &client).await;
    assert_same(&plan, &full);
    assert_eq!(
        (plan.summary.configure, plan.summary.create),
        (1, 1),
        "{}",
        plan::render_text(&plan, false)
    );
    assert_eq!(
        plan.cluster.as_ref().map(|c| c.unchanged),
        Some(MAPS + 1 - 2)
    );

    // A field another manager added is not drift: the object stays unchanged.
    maps.patch(
        "cm-1",
        &PatchParams::apply("someone-else"),
        &Patch::Apply(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "cm-1", "labels": {"team": "gpu"}}})),
    )
    .await
    .expect("another manager's label");
    let (plan, full) = plans(&repo, &client).await;
    assert_same(&plan, &full);
    assert_eq!(
        plan.cluster.as_ref().map(|c| c.unchanged),
        Some(MAPS + 1 - 2)
    );
}
