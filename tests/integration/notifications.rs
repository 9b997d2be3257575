//! The pull request sees its rollout (docs/notifications.md): against a GitHub API on
//! loopback that records every request, a three-node rollout posts its commit statuses in
//! order, from pending to success, with the pull request's comment and the webhooks kept
//! beside it; a gate that fails posts a failure naming the node and the gate; a rejected
//! commit gets a failure with its first error; two clusters post side by side under their
//! own contexts, one as a token and one as a GitHub App; GitHub down for a while holds no
//! node, and the statuses catch up; a leader killed right after a post is replaced and
//! nothing is posted twice.

use crate::common;
use crate::high_availability::{Replica, folder, new_leader};
use crate::rollout_guardrails::{
    WORKERS, check_pod_gate, commit_v2_everywhere, fleet_at_v1, settings,
};
use crate::upgrade;

use capstan::sync::run::Outcome;
use capstan_api::GitSync;
use capstan_api::capstan::SYSTEM_NAMESPACE;
use common::git::FleetRepo;
use common::github::{self, FakeGitHub};
use common::wait_until;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use upgrade::driver::{Capstan, Mode};

const SIGNING_KEY: &str = "receivers-check-this";

/// How capstan authenticates to the fake.
#[derive(Clone, Copy)]
enum As {
    Token,
    App,
}

/// Puts the token (or the App's key) and the webhooks' signing key in Secrets, and sets
/// the `GitSync`'s notifications: GitHub statuses under `context` with the comment, a JSON
/// webhook and a Slack one.
async fn notify(client: &kube::Client, github: &FakeGitHub, context: &str, auth: As) {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), SYSTEM_NAMESPACE);
    let data = [
        ("token", github::TOKEN),
        ("private-key.pem", github::app_private_key_pem()),
        ("signing-key", SIGNING_KEY),
    ];
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some("github".into()),
            ..Default::default()
        },
        data: Some(
            data.iter()
                .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
                .collect(),
        ),
        ..Default::default()
    };
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .expect("the Secret");
    let credentials = match auth {
        As::Token => json!({"tokenSecret": {"name": "github", "key": "token"}}),
        As::App => json!({"app": {
            "appID": github::APP_ID,
            "installationID": github::INSTALLATION_ID,
            "privateKeySecret": {"name": "github", "key": "private-key.pem"},
        }}),
    };
    let mut github_spec = json!({
        "repository": "acme/fleet",
        "apiURL": github.url(),
        "comment": true,
    });
    github_spec
        .as_object_mut()
        .expect("an object")
        .extend(credentials.as_object().expect("an object").clone());
    let patch = json!({"spec": {"notifications": {
        "context": context,
        "github": github_spec,
        "webhooks": [
            {"name": "audit", "url": format!("{}/hooks/audit", github.url()),
             "signingSecret": {"name": "github", "key": "signing-key"}},
            {"name": "chat", "format": "slack", "url": format!("{}/hooks/chat", github.url())},
        ],
    }}});
    let syncs: Api<GitSync> = Api::namespaced(client.clone(), SYSTEM_NAMESPACE);
    syncs
        .patch("capstan", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("the GitSync's notifications");
}

/// The statuses of `context` on `sha`, oldest first: (state, description).
fn statuses(github: &FakeGitHub, sha: &str, context: &str) -> Vec<(String, String)> {
    github
        .statuses(sha)
        .iter()
        .filter(|s| s["context"] == context)
        .map(|s| {
            (
                s["state"].as_str().unwrap_or_default().to_string(),
                s["description"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

/// Waits until the last status of `context` on `sha` is `state`; returns its description.
async fn last_status(github: &FakeGitHub, sha: &str, context: &str, state: &str) -> String {
    common::wait_for(
        &format!("a {state} status of {context}"),
        async || match statuses(github, sha, context).last() {
            Some((s, description)) if s == state => Ok(description.clone()),
            last => Err(format!("{last:?}")),
        },
    )
    .await
}

/// No status follows one that says the same.
fn assert_none_twice(seen: &[(String, String)]) {
    for pair in seen.windows(2) {
        assert_ne!(pair[0], pair[1], "posted twice in a row: {seen:#?}");
    }
}

/// The `k` of "k of n nodes upgraded".
fn upgraded(description: &str) -> Option<usize> {
    description.split(" of ").next()?.parse().ok()
}

/// The `GitSync`'s notification status of `target`.
async fn target_status(
    client: &kube::Client,
    target: &str,
) -> Option<capstan_api::NotificationTarget> {
    let syncs: Api<GitSync> = Api::namespaced(client.clone(), SYSTEM_NAMESPACE);
    let sync = syncs.get("capstan").await.expect("the GitSync");
    sync.status?
        .notifications
        .into_iter()
        .find(|t| t.target == target)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_three_node_rollout_posts_its_statuses_in_order_with_its_comment_and_webhooks() {
    let github = FakeGitHub::start().await;
    let (_cluster, client, mut repo, mut capstan) = fleet_at_v1(&[]).await;
    notify(&client, &github, "capstan/eu", As::Token).await;
    let sha = commit_v2_everywhere(&mut repo, &[]);
    capstan.take_head().await;

    let done = last_status(&github, &sha, "capstan/eu", "success").await;
    assert_eq!(done, "3 of 3 nodes upgraded");
    let seen = statuses(&github, &sha, "capstan/eu");
    assert_none_twice(&seen);
    // Pending until the last, the count of nodes upgraded never going back.
    let (last, before) = seen.split_last().expect("statuses");
    assert!(
        before.iter().all(|(state, _)| state == "pending"),
        "{seen:#?}"
    );
    assert_eq!(last.0, "success");
    let counts: Vec<usize> = seen.iter().filter_map(|(_, d)| upgraded(d)).collect();
    assert!(counts.windows(2).all(|w| w[0] <= w[1]), "{seen:#?}");
    // Each node is named while it moves (one node at a time, each longer than a look).
    for node in WORKERS {
        assert!(
            before.iter().any(|(_, d)| d.contains(&format!("{node} "))),
            "{node} never named: {seen:#?}"
        );
    }
    eprintln!(
        "figure: {} statuses for a three-node rollout: {seen:#?}",
        seen.len()
    );

    // The comment: one, capstan's, on pull request #2, ending with every node upgraded.
    let comments = github.comments(2);
    assert_eq!(comments.len(), 1, "{comments:#?}");
    let comment = &comments[0];
    assert_eq!(comment.login, github::TOKEN_LOGIN);
    assert!(
        comment
            .body
            .starts_with("<!-- capstan-rollout: capstan/eu -->")
            && comment.body.contains("**success**: 3 of 3 nodes upgraded")
            && WORKERS
                .iter()
                .all(|n| comment.body.contains(&format!("`{n}`"))),
        "{}",
        comment.body
    );

    // The webhooks: the same reports, the JSON one signed, the last one the success.
    let audit = github.hooks("audit");
    let last_hook = audit.last().expect("audit deliveries");
    let body: Value = serde_json::from_str(&last_hook.body).expect("json");
    assert_eq!(body["state"], "success");
    assert_eq!(body["commit"]["sha"], sha.as_str());
    assert_eq!(body["commit"]["pullRequest"], 2);
    assert_eq!(body["done"], 3);
    assert_eq!(
        last_hook.header("x-capstan-signature-256"),
        Some(capstan::controllers::notifications::webhook::signature(
            SIGNING_KEY.as_bytes(),
            last_hook.body.as_bytes()
        ))
        .as_deref()
    );
    let chat = github.hooks("chat");
    let text: Value = serde_json::from_str(&chat.last().expect("chat").body).expect("json");
    assert!(
        text["text"]
            .as_str()
            .is_some_and(|t| t.contains("capstan/eu") && t.contains("3 of 3 nodes upgraded")),
        "{text}"
    );
    // No token in capstan's status.
    let status = serde_json::to_string(&target_status(&client, "github").await).expect("json");
    assert!(!status.contains(github::TOKEN), "{status}");
    capstan.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gate_that_fails_posts_a_failure_naming_the_node_and_the_gate() {
    let github = FakeGitHub::start().await;
    let policy = settings(&check_pod_gate("worker-2"));
    let (_cluster, client, mut repo, mut capstan) = fleet_at_v1(&[("capstan.yaml", policy)]).await;
    notify(&client, &github, "capstan/eu", As::Token).await;
    let sha = commit_v2_everywhere(&mut repo, &[]);
    capstan.apply_head().await;

    let failure = last_status(&github, &sha, "capstan/eu", "failure").await;
    assert!(
        failure.starts_with("worker-2: gate gpu-diagnostic failed: ")
            && failure.contains("exit code 1")
            && failure.ends_with("(1 of 3 nodes upgraded)"),
        "{failure}"
    );
    let audit = github.hooks("audit");
    let body: Value = serde_json::from_str(&audit.last().expect("audit").body).expect("json");
    assert_eq!(body["failure"]["node"], "worker-2");
    assert_eq!(body["failure"]["step"], "gate gpu-diagnostic");
    let comment = &github.comments(2)[0];
    assert!(
        comment
            .body
            .contains("**Failed:** `worker-2` gate gpu-diagnostic: check pod"),
        "{}",
        comment.body
    );
    capstan.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_commit_posts_a_failure_with_its_first_error() {
    let github = FakeGitHub::start().await;
    let (_cluster, client, mut repo, mut capstan) = fleet_at_v1(&[]).await;
    notify(&client, &github, "capstan/eu", As::Token).await;
    let sha = repo.commit(
        &[(
            "nodes/worker-1.yaml",
            Some("apiVersion: v1\nkind: Node\nmetadata:\n  name: worker-1\n  labels: [oops]\n"),
        )],
        "Merge pull request #3 from fleet/typo",
    );
    let outcome = capstan.sync_head().await;
    assert!(matches!(outcome, Outcome::Rejected { .. }), "{outcome:?}");

    let failure = last_status(&github, &sha, "capstan/eu", "failure").await;
    assert!(
        failure.starts_with("rejected: nodes/worker-1.yaml:5"),
        "{failure}"
    );
    assert_none_twice(&statuses(&github, &sha, "capstan/eu"));
    capstan.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_clusters_post_side_by_side_under_their_own_contexts() {
    let github = FakeGitHub::start().await;
    let mut repo = FleetRepo::new();
    upgrade::commit_initial_fleet(&mut repo, &[]);
    let (eu, eu_client) = common::start_default_simulated().await;
    let (us, us_client) = common::start_default_simulated().await;
    let mut capstans = Vec::new();
    for (cluster, client) in [(&eu, &eu_client), (&us, &us_client)] {
        let mut capstan = Capstan::new(
            Mode::LongRunning,
            client,
            &cluster.kubeconfig(),
            repo.path(),
        )
        .await;
        capstan.take_head().await;
        capstans.push(capstan);
    }
    notify(&eu_client, &github, "capstan/eu", As::Token).await;
    notify(&us_client, &github, "capstan/us", As::App).await;
    let sha = commit_v2_everywhere(&mut repo, &[]);
    for capstan in &mut capstans {
        capstan.take_head().await;
    }

    for context in ["capstan/eu", "capstan/us"] {
        let done = last_status(&github, &sha, context, "success").await;
        assert_eq!(done, "3 of 3 nodes upgraded", "{context}");
        assert_none_twice(&statuses(&github, &sha, context));
    }
    // Each as itself: the token's user and the App's bot, each with its own comment.
    let creators = |context: &str| -> Vec<String> {
        github
            .statuses(&sha)
            .iter()
            .filter(|s| s["context"] == context)
            .map(|s| {
                s["creator"]["login"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string()
            })
            .collect()
    };
    assert!(
        creators("capstan/eu")
            .iter()
            .all(|l| l == github::TOKEN_LOGIN)
    );
    assert!(
        creators("capstan/us")
            .iter()
            .all(|l| l == github::APP_LOGIN)
    );
    let mut authors: Vec<String> = github.comments(2).into_iter().map(|c| c.login).collect();
    authors.sort();
    assert_eq!(authors, [github::TOKEN_LOGIN, github::APP_LOGIN]);
    for capstan in capstans {
        capstan.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_github_down_the_rollout_finishes_and_the_statuses_catch_up() {
    let github = FakeGitHub::start().await;
    let (_cluster, client, mut repo, mut capstan) = fleet_at_v1(&[]).await;
    notify(&client, &github, "capstan/eu", As::Token).await;
    github.set_down(true);
    let sha = commit_v2_everywhere(&mut repo, &[]);
    // The rollout does not wait for GitHub.
    capstan.take_head().await;
    upgrade::converged(&client).await;
    let failing =
        common::wait_for(
            "the failures in the GitSync's status",
            async || match target_status(&client, "github").await {
                Some(t) if t.failures >= 2 && t.error.contains("502") => Ok(t),
                other => Err(format!("{other:?}")),
            },
        )
        .await;
    assert!(statuses(&github, &sha, "capstan/eu").is_empty());
    eprintln!(
        "figure: GitHub down, {} failed deliveries: {}",
        failing.failures, failing.error
    );

    github.set_down(false);
    let done = last_status(&github, &sha, "capstan/eu", "success").await;
    assert_eq!(done, "3 of 3 nodes upgraded");
    // Caught up at once to where the rollout is: no stale pending after it.
    assert_eq!(statuses(&github, &sha, "capstan/eu").len(), 1);
    wait_until("the failures cleared", async || {
        target_status(&client, "github")
            .await
            .is_some_and(|t| t.failures == 0 && t.error.is_empty())
    })
    .await;
    capstan.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_killed_right_after_a_post_is_replaced_and_nothing_is_posted_twice() {
    let github = FakeGitHub::start().await;
    let (cluster, client) = common::start_default_simulated().await;
    let mut repo = FleetRepo::new();
    let first = upgrade::commit_initial_fleet(&mut repo, &[]);
    let dir = folder(&cluster.kubeconfig());
    // The leader dies right after its second post to GitHub, before it wrote it down.
    let a = Replica::armed(
        dir.path(),
        "replica-a",
        repo.path(),
        Some("notify.status.after:2"),
    );
    a.wait_for_line("leading: holding the Lease").await;
    let b = Replica::start(dir.path(), "replica-b", repo.path());
    b.wait_for_line("waiting for the Lease").await;
    a.wait_for_line(" applied ").await;
    upgrade::converged(&client).await;
    notify(&client, &github, "capstan/eu", As::Token).await;
    last_status(&github, &first, "capstan/eu", "success").await;

    let sha = commit_v2_everywhere(&mut repo, &[]);
    let mut a = a;
    assert_eq!(a.exit_code().await, None, "killed: {}", a.log());
    new_leader(&client, &[&b]).await;
    let done = last_status(&github, &sha, "capstan/eu", "success").await;
    assert_eq!(done, "3 of 3 nodes upgraded");
    let seen = statuses(&github, &sha, "capstan/eu");
    for status in &seen {
        let times = seen.iter().filter(|s| *s == status).count();
        assert_eq!(times, 1, "{status:?} posted {times} times: {seen:#?}");
    }
    // The new leader asked GitHub what it held before its first post.
    let asked = github
        .requests()
        .iter()
        .any(|r| r.method == "GET" && r.path.contains(&format!("/commits/{sha}/statuses")));
    assert!(asked);
    assert_eq!(statuses(&github, &first, "capstan/eu").len(), 1);
}
