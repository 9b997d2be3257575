//! Offline plans of real commits, one test per question a reviewer of a pull request asks.

use std::path::Path;

use serde_json::Value;

use super::*;
use crate::sync::source::Auth;
use capstan_testing::git::{FleetRepo, with_changes};
use capstan_testing::manifests::{config_map, module, node_label};

const VERSION_LABEL: &str = "kmm.node.kubernetes.io/version-module.kmm-demo.my-kmod";

/// The fleet at base: my-kmod v1 on three workers, two ConfigMaps.
fn base_fleet() -> Vec<(&'static str, String)> {
    vec![
        ("fleet/capstan.yaml", "maxNodesInFlight: 1\n".to_string()),
        (
            "fleet/config.yaml",
            config_map("kept", "1") + "---\n" + &config_map("old", "1"),
        ),
        ("fleet/modules/my-kmod.yaml", module("my-kmod", "v1")),
        (
            "fleet/nodes/worker-1.yaml",
            node_label("worker-1", "my-kmod", "v1"),
        ),
        (
            "fleet/nodes/worker-2.yaml",
            node_label("worker-2", "my-kmod", "v1"),
        ),
        (
            "fleet/nodes/worker-9.yaml",
            node_label("worker-9", "my-kmod", "v1"),
        ),
        ("README.md", "# fleet".to_string()),
    ]
}

/// Commits `base` on main and `head` on a branch from it; plans head against main.
fn plan_of(base: &[(&str, String)], head: &[(&str, String)], pull_request: Option<u64>) -> Plan {
    let repo = FleetRepo::proposal(base, head);
    let state = tempfile::tempdir().expect("state");
    let source = Source::open_allowing_new_path(
        repo.path().to_str().expect("utf-8"),
        "main",
        Some(Path::new("fleet")),
        state.path(),
        Auth::None,
    )
    .expect("open");
    let head = source.resolve("feature").expect("head");
    let base = source.merge_base(&head.sha, "main").expect("base");
    offline(&PlanInput::read(&source, base, head, pull_request).expect("read"))
}

/// The upgrade of the fleet: my-kmod v2, two workers moved, worker-9 leaves, a
/// ConfigMap replaced.
fn upgrade() -> Vec<(&'static str, String)> {
    with_changes(
        &base_fleet(),
        &[
            ("fleet/modules/my-kmod.yaml", Some(module("my-kmod", "v2"))),
            (
                "fleet/nodes/worker-1.yaml",
                Some(node_label("worker-1", "my-kmod", "v2")),
            ),
            (
                "fleet/nodes/worker-2.yaml",
                Some(node_label("worker-2", "my-kmod", "v2")),
            ),
            ("fleet/nodes/worker-9.yaml", None),
            (
                "fleet/config.yaml",
                Some(config_map("kept", "1") + "---\n" + &config_map("new", "1")),
            ),
        ],
    )
}

#[test]
fn an_unchanged_fleet_plans_no_changes() {
    let plan = plan_of(
        &base_fleet(),
        &with_changes(&base_fleet(), &[("README.md", Some("# edited".into()))]),
        None,
    );
    assert_eq!(plan.summary, Summary::default());
    assert!(plan.errors.is_empty() && plan.objects.is_empty() && plan.nodes.is_empty());
    assert_eq!(summary_line(&plan), "No changes.");
    assert_eq!((plan.exit_code(true), plan.exit_code(false)), (0, 0));
}

#[test]
fn an_upgrade_shows_objects_nodes_steps_and_waves() {
    let plan = plan_of(&base_fleet(), &upgrade(), Some(42));
    assert!(plan.errors.is_empty(), "{:?}", plan.errors);
    let objects: Vec<(String, ObjectAction)> = plan
        .objects
        .iter()
        .map(|o| (o.id.to_string(), o.action))
        .collect();
    assert_eq!(
        objects,
        [
            ("ConfigMap kmm-demo/new".to_string(), ObjectAction::Create),
            (
                "Module kmm-demo/my-kmod".to_string(),
                ObjectAction::Configure
            ),
            ("Node worker-1".to_string(), ObjectAction::Configure),
            ("Node worker-2".to_string(), ObjectAction::Configure),
            ("ConfigMap kmm-demo/old".to_string(), ObjectAction::Prune),
            ("Node worker-9".to_string(), ObjectAction::Release),
        ]
    );
    let module = &plan.objects[1];
    assert_eq!(module.file.as_deref(), Some("fleet/modules/my-kmod.yaml"));
    assert!(
        module
            .diff
            .contains("-      version: v1\n+      version: v2"),
        "{}",
        module.diff
    );

    let moves: Vec<String> = plan
        .nodes
        .iter()
        .map(|n| {
            format!(
                "{} {}: {} steps, order {}, wave {}",
                n.node,
                render::versions(n.from.as_deref(), n.to.as_deref()),
                n.steps.len(),
                n.order,
                n.wave
            )
        })
        .collect();
    assert_eq!(
        moves,
        [
            "worker-1 v1 → v2: 4 steps, order 1, wave 1",
            "worker-2 v1 → v2: 4 steps, order 2, wave 2",
            "worker-9 v1 → (none): 2 steps, order 3, wave 3",
        ]
    );
    assert_eq!(
        plan.policy.waves,
        [vec!["worker-1"], vec!["worker-2"], vec!["worker-9"]]
    );
    assert_eq!(plan.policy.require_pull_request.status, CheckStatus::Ok);
    assert_eq!(
        plan.summary,
        Summary {
            create: 1,
            configure: 3,
            prune: 1,
            release: 1,
            absent: 0,
            nodes: 3,
            errors: 0,
            has_changes: true,
        }
    );
    assert_eq!(
        summary_line(&plan),
        "1 to create, 3 to configure, 1 to prune, 1 to release; 3 node upgrades \
         (worker-1: kmm-demo/my-kmod v1 → v2, worker-2: kmm-demo/my-kmod v1 → v2, \
         worker-9: kmm-demo/my-kmod v1 → (none))"
    );
    assert_eq!((plan.exit_code(true), plan.exit_code(false)), (2, 0));
    assert_eq!(
        (plan.base.subject.as_str(), plan.head.subject.as_str()),
        ("Initial fleet", "Move workers to my-kmod v2")
    );
    assert_eq!(
        (plan.branch.as_str(), plan.path.as_str(), plan.mode),
        ("main", "fleet", Mode::Offline)
    );
}

#[test]
fn a_version_label_naming_an_old_version_is_an_error_at_its_line() {
    // The Module stays at v1 while worker-1 is moved to v2.
    let head = with_changes(
        &base_fleet(),
        &[(
            "fleet/nodes/worker-1.yaml",
            Some(node_label("worker-1", "my-kmod", "v2")),
        )],
    );
    let plan = plan_of(&base_fleet(), &head, None);
    let errors: Vec<String> = plan.errors.iter().map(ToString::to_string).collect();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].starts_with(&format!("fleet/nodes/worker-1.yaml:1: metadata.labels[{VERSION_LABEL}]: version label moves to \"v2\"")),
        "{}",
        errors[0]
    );
    assert_eq!(plan.exit_code(true), 1);
    assert!(
        summary_line(&plan)
            .starts_with("1 error: head would be rejected; 0 to create, 1 to configure")
    );
}

#[test]
fn an_invalid_head_is_all_errors_and_no_objects() {
    let head = with_changes(
        &base_fleet(),
        &[(
            "fleet/broken.yaml",
            Some("kind: ConfigMap\nmetadata: {name: x}\n".into()),
        )],
    );
    let plan = plan_of(&base_fleet(), &head, None);
    assert!(plan.objects.is_empty() && plan.nodes.is_empty());
    assert_eq!(plan.errors.len(), 1);
    assert_eq!(
        plan.errors[0].to_string(),
        "fleet/broken.yaml:1: apiVersion: required field is missing"
    );
    assert_eq!(summary_line(&plan), "1 error: head would be rejected");
    assert_eq!(plan.exit_code(false), 1);
}

#[test]
fn an_invalid_base_is_compared_as_empty_with_a_warning() {
    let base = with_changes(
        &base_fleet(),
        &[("fleet/broken.yaml", Some("kind: [".into()))],
    );
    let plan = plan_of(&base, &base_fleet(), None);
    assert!(plan.errors.is_empty(), "{:?}", plan.errors);
    assert_eq!(plan.summary.create, 6);
    assert!(
        plan.warnings[0].contains("does not validate (1 errors)"),
        "{:?}",
        plan.warnings
    );
}

#[test]
fn a_first_pull_request_adds_the_path() {
    let plan = plan_of(&[("README.md", "# fleet".to_string())], &base_fleet(), None);
    assert!(plan.warnings.is_empty(), "{:?}", plan.warnings);
    assert_eq!(plan.summary.create, 6);
    let firsts: Vec<(&str, Vec<usize>)> = plan
        .nodes
        .iter()
        .map(|n| (n.node.as_str(), n.steps.iter().map(|s| s.number).collect()))
        .collect();
    assert_eq!(
        firsts,
        [
            ("worker-1", vec![3, 4]),
            ("worker-2", vec![3, 4]),
            ("worker-9", vec![3, 4])
        ]
    );
}

#[test]
fn without_prune_departed_objects_stay_and_keep_their_labels() {
    let head = with_changes(
        &upgrade(),
        &[("fleet/capstan.yaml", Some("prune: false\n".into()))],
    );
    let plan = plan_of(&base_fleet(), &head, Some(7));
    assert_eq!((plan.summary.prune, plan.summary.release), (0, 0));
    assert!(plan.nodes.iter().all(|n| n.node != "worker-9"));
    assert_eq!(
        plan.warnings,
        [
            "2 objects left the repository and stay in the cluster (prune: false): ConfigMap kmm-demo/old, Node worker-9"
        ]
    );
}

#[test]
fn require_pull_request_warns_for_a_range_that_is_not_one() {
    let head = with_changes(
        &upgrade(),
        &[(
            "fleet/capstan.yaml",
            Some("requirePullRequest: true\nmaxNodesInFlight: 2\n".into()),
        )],
    );
    let plan = plan_of(&base_fleet(), &head, None);
    assert_eq!(
        plan.policy.require_pull_request.status,
        CheckStatus::Warning
    );
    assert_eq!(
        plan.policy.waves,
        [vec!["worker-1", "worker-2"], vec!["worker-9"]]
    );
    let for_pull_request = plan_of(&base_fleet(), &head, Some(42));
    assert_eq!(
        for_pull_request.policy.require_pull_request.status,
        CheckStatus::Ok
    );
    assert_eq!(for_pull_request.pull_request, Some(42));
}

/// Every key path of a JSON value, arrays written `[]`.
fn key_paths(value: &Value, prefix: &str, out: &mut std::collections::BTreeSet<String>) {
    match value {
        Value::Object(map) => {
            for (key, child) in map {
                let path = format!("{prefix}.{key}");
                out.insert(path.clone());
                key_paths(child, &path, out);
            }
        }
        Value::Array(items) => {
            for item in items {
                key_paths(item, &format!("{prefix}[]"), out);
            }
        }
        _ => {}
    }
}

#[test]
fn a_campaign_holds_its_nodes_until_upgrade_at_and_drains_them() {
    let campaign = "apiVersion: upgrade.managed.openshift.io/v1alpha1\nkind: UpgradeConfig\n\
                    metadata: {name: my-kmod-v2, namespace: kmm-demo}\nspec:\n  type: OSD\n  \
                    upgradeAt: \"2027-06-01T02:00:00Z\"\n  PDBForceDrainTimeout: 60\n  \
                    desired: {version: v2}\n";
    let head = with_changes(
        &upgrade(),
        &[("fleet/campaign.yaml", Some(campaign.to_string()))],
    );
    let plan = plan_of(&base_fleet(), &head, Some(42));
    assert!(plan.errors.is_empty(), "{:?}", plan.errors);
    assert_eq!(
        plan.campaigns,
        [PlannedCampaign {
            name: "kmm-demo/my-kmod-v2".into(),
            version: "v2".into(),
            upgrade_at: "2027-06-01T02:00:00Z".into(),
            pdb_force_drain_timeout: 60,
            phase: None,
        }]
    );
    let moves: Vec<(&str, Option<&str>, Option<&str>)> = plan
        .nodes
        .iter()
        .map(|n| {
            (
                n.node.as_str(),
                n.campaign.as_deref(),
                n.held_until.as_deref(),
            )
        })
        .collect();
    let held = (Some("kmm-demo/my-kmod-v2"), Some("2027-06-01T02:00:00Z"));
    assert_eq!(
        moves,
        [
            ("worker-1", held.0, held.1),
            ("worker-2", held.0, held.1),
            // Leaving the fleet is not a move to the campaign's version.
            ("worker-9", None, None),
        ]
    );
    let text = render_text(&plan, false);
    assert!(
        text.contains(
            "held until 2027-06-01T02:00:00Z (campaign kmm-demo/my-kmod-v2); cordoned and \
             drained first, uncordoned after step 4"
        ),
        "{text}"
    );
    assert!(text.contains("Campaigns:"), "{text}");
    let markdown = render_markdown(&plan).join("\n");
    assert!(markdown.contains("#### Campaigns"), "{markdown}");
}

#[test]
fn the_json_schema_keeps_its_names() {
    let plan = plan_of(&base_fleet(), &upgrade(), Some(42));
    let json: Value = serde_json::from_str(&render_json(&plan)).expect("JSON");
    assert_eq!(json["schemaVersion"], 1);
    let mut paths = std::collections::BTreeSet::new();
    key_paths(&json, "", &mut paths);
    let expected = [
        ".schemaVersion",
        ".repository",
        ".branch",
        ".path",
        ".mode",
        ".base",
        ".base.sha",
        ".base.shortSha",
        ".base.subject",
        ".base.author",
        ".base.pullRequest",
        ".head",
        ".head.sha",
        ".head.shortSha",
        ".head.subject",
        ".head.author",
        ".head.pullRequest",
        ".pullRequest",
        ".cluster",
        ".errors",
        ".warnings",
        ".objects",
        ".objects[].id",
        ".objects[].id.apiVersion",
        ".objects[].id.kind",
        ".objects[].id.namespace",
        ".objects[].id.name",
        ".objects[].action",
        ".objects[].file",
        ".objects[].line",
        ".objects[].diff",
        ".nodes",
        ".nodes[].node",
        ".nodes[].module",
        ".nodes[].from",
        ".nodes[].to",
        ".nodes[].steps",
        ".nodes[].steps[].number",
        ".nodes[].steps[].step",
        ".nodes[].steps[].description",
        ".nodes[].order",
        ".nodes[].wave",
        ".campaigns",
        ".leaderWorkerSets",
        ".policy",
        ".policy.maxNodesInFlight",
        ".policy.waves",
        ".policy.requirePullRequest",
        ".policy.requirePullRequest.required",
        ".policy.requirePullRequest.status",
        ".policy.requirePullRequest.message",
        ".policy.prune",
        ".summary",
        ".summary.create",
        ".summary.configure",
        ".summary.prune",
        ".summary.release",
        ".summary.absent",
        ".summary.nodes",
        ".summary.errors",
        ".summary.hasChanges",
    ];
    let expected: std::collections::BTreeSet<String> =
        expected.iter().map(|p| p.to_string()).collect();
    assert_eq!(paths, expected);
    assert_eq!(json["mode"], "offline");
    assert_eq!(
        json["nodes"][0]["steps"][0]["step"],
        "device-plugin-stopped"
    );
    assert_eq!(json["objects"][0]["action"], "create");
    assert_eq!(json["policy"]["requirePullRequest"]["status"], "ok");
}

#[test]
fn markdown_starts_with_the_summary_and_folds_each_diff() {
    let plan = plan_of(&base_fleet(), &upgrade(), Some(42));
    let parts = render_markdown(&plan);
    assert_eq!(parts.len(), 1);
    let markdown = &parts[0];
    assert!(
        markdown.starts_with("**capstan plan**: 1 to create, 3 to configure, 1 to prune"),
        "{markdown}"
    );
    assert!(
        markdown.contains("| + | `ConfigMap kmm-demo/new` | create | `fleet/config.yaml:9` |"),
        "{markdown}"
    );
    assert!(
        markdown.contains("**1. worker-1**: `kmm-demo/my-kmod` v1 → v2, wave 1"),
        "{markdown}"
    );
    assert!(
        markdown.contains("\n1. stop the device plugin of kmm-demo/my-kmod v1"),
        "{markdown}"
    );
    assert!(
        markdown.contains("\n4. start the device plugin of kmm-demo/my-kmod v2"),
        "{markdown}"
    );
    assert_eq!(markdown.matches("<details><summary>").count(), 6);
    assert!(
        markdown.contains("```diff\n--- base\n+++ head\n"),
        "{markdown}"
    );
    let text = render_text(&plan, false);
    assert!(
        text.ends_with(&format!("Plan: {}\n", summary_line(&plan))),
        "{text}"
    );
    assert!(!text.contains('\x1b'));
    assert!(render_text(&plan, true).contains("\x1b[32m+ ConfigMap kmm-demo/new"));
}

#[test]
fn a_plan_too_long_for_one_comment_is_split() {
    let big: String = (0..4_000)
        .map(|i| format!("  key-{i}: value-{i}\n"))
        .collect();
    let head = with_changes(
        &base_fleet(),
        &[(
            "fleet/big.yaml",
            Some(format!(
                "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: big}}\ndata:\n{big}"
            )),
        )],
    );
    let plan = plan_of(&base_fleet(), &head, None);
    let parts = render_markdown(&plan);
    assert!(parts.len() >= 2, "{} parts", parts.len());
    assert!(parts[0].starts_with("**capstan plan**: 1 to create"));
    for part in &parts {
        assert!(
            part.chars().count() < COMMENT_LIMIT,
            "{} characters",
            part.chars().count()
        );
        assert_eq!(part.lines().filter(|l| l.starts_with("```")).count() % 2, 0);
    }
}

/// LeaderWorkerSet `inference/vllm`: `replicas` groups of two pods on `version`, with
/// `rollout` (YAML of `rolloutStrategy`'s `rollingUpdateConfiguration`) when not empty.
fn leader_worker_set(replicas: i32, version: &str, rollout: &str) -> String {
    let strategy = if rollout.is_empty() {
        String::new()
    } else {
        format!(
            "  rolloutStrategy:\n    type: RollingUpdate\n    \
             rollingUpdateConfiguration: {rollout}\n"
        )
    };
    format!(
        "apiVersion: leaderworkerset.x-k8s.io/v1\nkind: LeaderWorkerSet\n\
         metadata: {{name: vllm, namespace: inference}}\nspec:\n  replicas: {replicas}\n\
         {strategy}  leaderWorkerTemplate:\n    size: 2\n    workerTemplate:\n      \
         metadata: {{labels: {{app: vllm}}}}\n      spec:\n        containers:\n          \
         - name: vllm\n            image: registry.example/vllm:{version}\n"
    )
}

/// The plan of a fleet whose LeaderWorkerSet goes from `base` to `head` (`None`: absent).
fn lws_plan(base: Option<String>, head: Option<String>) -> Plan {
    let with = |lws: Option<String>| with_changes(&base_fleet(), &[("fleet/vllm.yaml", lws)]);
    plan_of(&with(base), &with(head), Some(42))
}

/// The LWS line of the text plan, without its leading spaces.
fn lws_line(plan: &Plan) -> String {
    let text = render_text(plan, false);
    text.lines()
        .find(|line| line.starts_with("  inference/vllm  "))
        .unwrap_or_else(|| panic!("no LeaderWorkerSet line in:\n{text}"))
        .trim_start()
        .to_string()
}

#[test]
fn a_template_change_rolls_the_groups_from_the_highest_index_down() {
    let plan = lws_plan(
        Some(leader_worker_set(4, "v1", "")),
        Some(leader_worker_set(4, "v2", "")),
    );
    assert!(plan.errors.is_empty(), "{:?}", plan.errors);
    assert_eq!(
        plan.leader_worker_sets,
        [LeaderWorkerSetChange {
            namespace: "inference".into(),
            name: "vllm".into(),
            change: LeaderWorkerSetAction::Rolls,
            replicas: ReplicasChange {
                from: Some(4),
                to: Some(4)
            },
            changed_fields: vec!["leaderWorkerTemplate".into()],
            rollout: Some(PlannedRollout {
                groups: 4,
                order: vec![vec![3], vec![2], vec![1], vec![0]],
                partition: 0,
                max_unavailable: 1,
                max_surge: 0,
                new_groups: vec![],
                surge_groups: vec![],
                surge_remains: false,
            }),
        }]
    );
    assert_eq!(
        lws_line(&plan),
        "inference/vllm  rolls groups 3..0, 1 at a time (maxUnavailable 1, maxSurge 0)"
    );
    assert!(
        summary_line(&plan).ends_with("; 1 LeaderWorkerSet rollout (inference/vllm)"),
        "{}",
        summary_line(&plan)
    );
    let markdown = render_markdown(&plan).join("\n");
    assert!(
        markdown.contains(
            "#### LeaderWorkerSets\n\n- `inference/vllm`: rolls groups 3..0, 1 at a time \
             (maxUnavailable 1, maxSurge 0)\n"
        ),
        "{markdown}"
    );
    let json: Value = serde_json::from_str(&render_json(&plan)).expect("JSON");
    assert_eq!(
        json["leaderWorkerSets"][0],
        serde_json::json!({
            "namespace": "inference", "name": "vllm", "change": "rolls",
            "replicas": {"from": 4, "to": 4},
            "changedFields": ["leaderWorkerTemplate"],
            "rollout": {"groups": 4, "order": [[3], [2], [1], [0]], "partition": 0,
                        "maxUnavailable": 1, "maxSurge": 0, "newGroups": [],
                        "surgeGroups": [], "surgeRemains": false},
        })
    );
}

#[test]
fn a_replicas_change_alone_rolls_no_group() {
    let plan = lws_plan(
        Some(leader_worker_set(2, "v1", "")),
        Some(leader_worker_set(4, "v1", "{maxUnavailable: 2}")),
    );
    let set = &plan.leader_worker_sets[0];
    assert_eq!(
        (set.change, &set.rollout, &set.changed_fields),
        (
            LeaderWorkerSetAction::NoRollout,
            &None,
            &vec!["replicas".to_string(), "rolloutStrategy".to_string()]
        )
    );
    assert_eq!(
        lws_line(&plan),
        "inference/vllm  no rollout: only replicas 2 → 4 (groups 2..3 created), rolloutStrategy"
    );
    assert!(
        !summary_line(&plan).contains("LeaderWorkerSet"),
        "{}",
        summary_line(&plan)
    );
    // The LWS still shows among the objects configured.
    assert!(
        plan.objects
            .iter()
            .any(|o| o.id.kind == "LeaderWorkerSet" && o.action == ObjectAction::Configure)
    );
}

#[test]
fn a_partition_holds_the_lowest_groups_on_the_old_revision() {
    let plan = lws_plan(
        Some(leader_worker_set(4, "v1", "")),
        Some(leader_worker_set(4, "v2", "{partition: 2}")),
    );
    let rollout = plan.leader_worker_sets[0]
        .rollout
        .clone()
        .expect("a rollout");
    assert_eq!((rollout.groups, rollout.order), (2, vec![vec![3], vec![2]]));
    assert_eq!(
        lws_line(&plan),
        "inference/vllm  rolls groups 3..2, 1 at a time (maxUnavailable 1, maxSurge 0); \
         partition 2 keeps groups 1..0 on the old revision"
    );
}

#[test]
fn a_percentage_max_unavailable_rolls_that_share_of_the_groups_at_a_time() {
    let plan = lws_plan(
        Some(leader_worker_set(4, "v1", "")),
        Some(leader_worker_set(4, "v2", "{maxUnavailable: 50%}")),
    );
    let rollout = plan.leader_worker_sets[0]
        .rollout
        .clone()
        .expect("a rollout");
    assert_eq!(
        (rollout.max_unavailable, rollout.order),
        (2, vec![vec![3, 2], vec![1, 0]])
    );
    assert_eq!(
        lws_line(&plan),
        "inference/vllm  rolls groups 3..0, up to 2 at a time (maxUnavailable 2, maxSurge 0): \
         3+2 → 1+0"
    );
}

#[test]
fn a_surge_group_comes_first_and_goes_once_done() {
    let plan = lws_plan(
        Some(leader_worker_set(4, "v1", "")),
        Some(leader_worker_set(
            4,
            "v2",
            "{maxUnavailable: 0, maxSurge: 1}",
        )),
    );
    assert_eq!(
        lws_line(&plan),
        "inference/vllm  rolls groups 3..0, 1 at a time (maxUnavailable 0, maxSurge 1): \
         4 → 3 → 2 → 1 → 0; surge group 4 deleted once done"
    );
}

#[test]
fn a_new_leader_worker_set_is_created_and_a_departed_one_deleted() {
    let created = lws_plan(None, Some(leader_worker_set(3, "v1", "")));
    assert_eq!(
        created.leader_worker_sets[0].change,
        LeaderWorkerSetAction::Created
    );
    assert_eq!(lws_line(&created), "inference/vllm  created with 3 groups");
    let deleted = lws_plan(Some(leader_worker_set(3, "v1", "")), None);
    assert_eq!(
        deleted.leader_worker_sets[0].replicas,
        ReplicasChange {
            from: Some(3),
            to: None
        }
    );
    assert_eq!(
        lws_line(&deleted),
        "inference/vllm  deleted with its 3 groups"
    );
    // Without prune it stays, untouched.
    let kept = with_changes(
        &base_fleet(),
        &[("fleet/capstan.yaml", Some("prune: false\n".into()))],
    );
    let base = with_changes(
        &kept,
        &[("fleet/vllm.yaml", Some(leader_worker_set(3, "v1", "")))],
    );
    assert_eq!(plan_of(&base, &kept, None).leader_worker_sets, []);
}

#[test]
fn a_drain_names_the_leader_worker_set_groups_it_recreates() {
    let mut plan = plan_of(&base_fleet(), &upgrade(), Some(42));
    plan.nodes[0].drain = Some(DrainPreview {
        evicted: vec!["inference/vllm-1".into(), "inference/vllm-1-1".into()],
        recreated_groups: vec!["inference/vllm group 1".into()],
        ..DrainPreview::default()
    });
    let text = render_text(&plan, false);
    assert!(
        text.contains("       LeaderWorkerSet groups recreated: inference/vllm group 1\n"),
        "{text}"
    );
    let markdown = render_markdown(&plan).join("\n");
    assert!(
        markdown.contains(" LeaderWorkerSet groups recreated: `inference/vllm group 1`.\n"),
        "{markdown}"
    );
}

/// A Node is never created: offline (the cluster unknown) a Node new in the repository is
/// still a create, noted so; live, one the cluster does not have is absent, which is no
/// change and moves no version label.
#[test]
fn a_node_is_never_created() {
    let head = with_changes(
        &base_fleet(),
        &[(
            "fleet/nodes/worker-5.yaml",
            Some(node_label("worker-5", "my-kmod", "v1")),
        )],
    );
    let offline = plan_of(&base_fleet(), &head, None);
    let created: Vec<(&str, ObjectAction)> = offline
        .objects
        .iter()
        .map(|o| (o.id.name.as_str(), o.action))
        .collect();
    assert_eq!(created, [("worker-5", ObjectAction::Create)]);
    assert_eq!(offline.objects[0].note(), Some(model::NEW_NODE_NOTE));
    let text = render_text(&offline, false);
    assert!(
        text.contains(&format!(
            "+ Node worker-5  create     fleet/nodes/worker-5.yaml:1  ({})",
            model::NEW_NODE_NOTE
        )),
        "{text}"
    );
    let markdown = render_markdown(&offline).concat();
    assert!(
        markdown.contains("| + | `Node worker-5` | create (a Node is never created: "),
        "{markdown}"
    );

    // The same head live, on a cluster without worker-5: what `live` makes of it.
    let mut live = offline.clone();
    live.mode = Mode::Live;
    live.objects[0].action = ObjectAction::Absent;
    live.nodes.clear();
    live.summary = Summary::of(&live.objects, &live.nodes, &live.errors);
    assert_eq!(
        (
            live.summary.absent,
            live.summary.create,
            live.summary.has_changes
        ),
        (1, 0, false)
    );
    assert_eq!((live.exit_code(true), live.exit_code(false)), (0, 0));
    assert_eq!(
        summary_line(&live),
        "No changes. 1 Node not in the cluster, not created (worker-5)"
    );
    let text = render_text(&live, false);
    assert!(
        text.contains(
            "! Node worker-5  absent     fleet/nodes/worker-5.yaml:1  (not in the cluster: \
             not created; its labels apply when a kubelet registers it)"
        ),
        "{text}"
    );
    let markdown = render_markdown(&live).concat();
    assert!(
        markdown.starts_with(
            "**capstan plan**: No changes. 1 Node not in the cluster, not created (worker-5)\n"
        ),
        "{markdown}"
    );
    assert!(
        markdown.contains("| ! | `Node worker-5` | absent (not in the cluster: not created; "),
        "{markdown}"
    );
    let json: Value = serde_json::from_str(&render_json(&live)).expect("JSON");
    assert_eq!(json["objects"][0]["action"], "absent");
    assert_eq!(json["summary"]["absent"], 1);
    assert_eq!(json["summary"]["hasChanges"], false);

    // With other changes, the absent Node follows the counts.
    let mut both = live.clone();
    both.objects
        .extend(plan_of(&base_fleet(), &upgrade(), None).objects);
    both.summary = Summary::of(&both.objects, &both.nodes, &both.errors);
    assert_eq!(
        summary_line(&both),
        "1 to create, 3 to configure, 1 to prune, 1 to release; 1 Node not in the cluster, \
         not created (worker-5)"
    );
}

/// No Secret value reaches a plan, whatever shape it comes in: a map, a string, a list,
/// or the last-applied annotation of a Secret or of any object holding one.
#[test]
fn secret_values_never_show_in_any_rendering() {
    const VALUES: [&str; 4] = [
        "c3VwZXJzZWNyZXQ=",
        "supersecret",
        "hunter2-value",
        "b3RoZXJzZWNyZXQ=",
    ];
    let secret = |name: &str, body: &str| {
        format!(
            "apiVersion: v1\nkind: Secret\nmetadata:\n  name: {name}\n  namespace: kmm-demo\n{body}"
        )
    };
    let held = r#"{"apiVersion":"v1","kind":"Secret","metadata":{"name":"held"},"data":{"t":"c3VwZXJzZWNyZXQ="}}"#;
    let annotated = |kind: &str, name: &str, extra: &str| {
        format!(
            "apiVersion: v1\nkind: {kind}\nmetadata:\n  name: {name}\n  namespace: kmm-demo\n  annotations:\n    kubectl.kubernetes.io/last-applied-configuration: '{held}'\n{extra}"
        )
    };
    let base = with_changes(
        &base_fleet(),
        &[(
            "fleet/secrets.yaml",
            Some(
                secret("map", "data:\n  token: c3VwZXJzZWNyZXQ=\n")
                    + "---\n"
                    + &secret("gone", "stringData:\n  token: hunter2-value\n")
                    + "---\n"
                    + &annotated("Secret", "self", "data:\n  t: c3VwZXJzZWNyZXQ=\n"),
            ),
        )],
    );
    let head = with_changes(
        &base,
        &[(
            "fleet/secrets.yaml",
            Some(
                secret("map", "data:\n  token: b3RoZXJzZWNyZXQ=\n")
                    + "---\n"
                    + &annotated("Secret", "self", "data:\n  t: b3RoZXJzZWNyZXQ=\n")
                    + "---\n"
                    + &annotated("ConfigMap", "holder", "data:\n  k: v\n"),
            ),
        )],
    );
    let plan = plan_of(&base, &head, Some(7));
    let renderings = [
        render_text(&plan, false),
        render_markdown(&plan).join("\n"),
        render_json(&plan),
        format!("{plan:?}"),
    ];
    for rendering in &renderings {
        for value in VALUES {
            assert!(!rendering.contains(value), "{value} shows in:\n{rendering}");
        }
    }
    let names: Vec<&str> = plan.objects.iter().map(|o| o.id.name.as_str()).collect();
    for name in ["map", "holder", "self", "gone"] {
        assert!(names.contains(&name), "{name} not planned: {names:?}");
    }
    assert!(renderings[0].contains("(masked: may hold a Secret's values)"));

    // Sections that are not maps are refused, as the API server refuses them, without
    // quoting what they hold.
    let refused = with_changes(
        &base,
        &[(
            "fleet/secrets.yaml",
            Some(
                secret("string", "data: c3VwZXJzZWNyZXQ=\n")
                    + "---\n"
                    + &secret("list", "stringData:\n  - hunter2-value\n  - supersecret\n"),
            ),
        )],
    );
    let plan = plan_of(&base, &refused, Some(7));
    let fields: Vec<&str> = plan
        .errors
        .iter()
        .filter_map(|e| e.field.as_deref())
        .collect();
    assert_eq!(fields, ["data", "stringData"], "{:?}", plan.errors);
    for rendering in [
        render_text(&plan, false),
        render_markdown(&plan).join("\n"),
        render_json(&plan),
    ] {
        for value in VALUES {
            assert!(!rendering.contains(value), "{value} shows in:\n{rendering}");
        }
    }
}
