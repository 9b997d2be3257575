//! The table's invariants, the merged rules, the check's expansion and message, and the
//! check against an API server that is the test.

use std::collections::BTreeSet;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use http_body_util::BodyExt as _;
use serde_json::{Value, json};

use super::*;

fn selection(text: &str) -> Selection {
    text.parse().expect("selection")
}

/// `(group, resource, verbs)` of each rule, for comparing with a table.
fn flat(rules: &[PolicyRule]) -> Vec<(String, String, String)> {
    rules
        .iter()
        .map(|rule| {
            (
                rule.api_groups.clone().unwrap_or_default().join(","),
                rule.resources.clone().unwrap_or_default().join(","),
                rule.verbs.join(","),
            )
        })
        .collect()
}

fn verbs_of(rules: &[PolicyRule], group: &str, resource: &str) -> Option<String> {
    flat(rules)
        .into_iter()
        .find(|(g, r, _)| g == group && r == resource)
        .map(|(_, _, verbs)| verbs)
}

#[test]
fn rows_merge_into_one_rule_per_group_and_resource() {
    let row = |group, resource, verbs| Need {
        part: Part::Sync,
        group,
        resource,
        verbs,
        scope: Scope::Cluster,
        why: "",
        code: "",
    };
    /// (group, resource, verbs) of a merged rule.
    type Rule<'a> = (&'a str, &'a str, &'a str);
    let cases: &[(&str, Vec<Need>, &[Rule])] = &[
        ("nothing", vec![], &[]),
        (
            "verbs of two rows on one resource are joined, in VERBS order",
            vec![
                row("", "nodes", &["patch", "watch"]),
                row("", "nodes", &["list", "get"]),
            ],
            &[("", "nodes", "get,list,watch,patch")],
        ),
        (
            "a verb two rows share is listed once",
            vec![
                row("", "pods", &["list", "watch"]),
                row("", "pods", &["list"]),
            ],
            &[("", "pods", "list,watch")],
        ),
        (
            "a subresource is a resource of its own",
            vec![
                row("", "pods", &["list"]),
                row("", "pods/eviction", &["create"]),
            ],
            &[("", "pods", "list"), ("", "pods/eviction", "create")],
        ),
        (
            "the core group first, then by group",
            vec![
                row("kmm.sigs.x-k8s.io", "modules", &["get"]),
                row("apps", "daemonsets", &["get"]),
                row("", "nodes", &["get"]),
            ],
            &[
                ("", "nodes", "get"),
                ("apps", "daemonsets", "get"),
                ("kmm.sigs.x-k8s.io", "modules", "get"),
            ],
        ),
    ];
    for (name, rows, expected) in cases {
        let got = flat(&merged(rows.iter()));
        let expected: Vec<(String, String, String)> = expected
            .iter()
            .map(|(g, r, v)| (g.to_string(), r.to_string(), v.to_string()))
            .collect();
        assert_eq!(got, expected, "{name}");
    }
}

#[test]
fn the_shipped_cluster_role_grants_what_the_code_uses_and_no_more() {
    let rules = rules_for(&Selection::all());
    let cases: &[(&str, &str, Option<&str>)] = &[
        ("", "nodes", Some("get,list,watch,patch")),
        ("", "pods", Some("get,list,watch,create,patch,delete")),
        ("", "pods/eviction", Some("create")),
        ("", "pods/finalizers", Some("update")),
        ("", "services", Some("get,create")),
        ("", "namespaces", Some("get,list,patch")),
        ("apps", "daemonsets", Some("list,watch,create,patch,delete")),
        ("apps", "statefulsets", Some("get,list,watch,create,patch")),
        (
            "apps",
            "controllerrevisions",
            Some("get,list,create,delete"),
        ),
        ("policy", "poddisruptionbudgets", Some("list")),
        ("events.k8s.io", "events", Some("create,patch")),
        (
            "capstan.dev",
            "gitsyncs",
            Some("get,list,watch,create,patch"),
        ),
        ("capstan.dev", "gitsyncs/status", Some("patch")),
        (
            "capstan.dev",
            "historyrecords",
            Some("get,list,create,delete"),
        ),
        (
            "kmm.sigs.x-k8s.io",
            "modules",
            Some("get,list,watch,create,patch,delete"),
        ),
        ("kmm.sigs.x-k8s.io", "modules/status", Some("patch")),
        ("kmm.sigs.x-k8s.io", "modules/finalizers", Some("update")),
        (
            "kmm.sigs.x-k8s.io",
            "nodemodulesconfigs",
            Some("get,list,watch,create,patch"),
        ),
        (
            "upgrade.managed.openshift.io",
            "upgradeconfigs",
            Some("get,list,watch,create,patch,delete"),
        ),
        (
            "leaderworkerset.x-k8s.io",
            "leaderworkersets",
            Some("get,list,watch,create,patch,delete"),
        ),
        // A Module's pull secret, read by the preflight only.
        ("", "secrets", Some("get")),
        // Never used: nodes are never created, node status never written, core Events
        // never written (capstan writes events.k8s.io/v1 Events).
        ("", "nodes/status", None),
        ("", "events", None),
        ("", "configmaps", None),
        // The bootstrap and the Lease are not in the ClusterRole.
        ("apiextensions.k8s.io", "customresourcedefinitions", None),
        ("coordination.k8s.io", "leases", None),
    ];
    for (group, resource, expected) in cases {
        assert_eq!(
            verbs_of(&rules, group, resource).as_deref(),
            *expected,
            "{group}/{resource}"
        );
    }
    assert!(
        flat(&rules)
            .iter()
            .all(|(_, _, verbs)| !verbs.contains('*')),
        "no wildcard"
    );
    let updates: Vec<String> = flat(&rules)
        .into_iter()
        .filter(|(_, _, verbs)| verbs.contains("update"))
        .map(|(_, resource, _)| resource)
        .collect();
    assert!(
        updates
            .iter()
            .all(|resource| resource.ends_with("/finalizers")),
        "capstan patches, never updates: {updates:?}"
    );
    assert_eq!(
        flat(&election_rules()),
        [(
            "coordination.k8s.io".to_string(),
            "leases".to_string(),
            "get,create,patch".to_string()
        )]
    );
}

#[test]
fn every_row_is_well_formed() {
    for need in NEEDS {
        let name = format!("{} {}/{}", need.part.short(), need.group, need.resource);
        assert!(!need.verbs.is_empty(), "{name}: no verb");
        for verb in need.verbs {
            assert!(VERBS.contains(verb), "{name}: unknown verb {verb}");
        }
        assert!(!need.why.is_empty() && !need.code.is_empty(), "{name}");
        assert!(
            need.code.split(", ").all(|file| file.starts_with("src/")),
            "{name}: {}",
            need.code
        );
        assert!(
            need.scope == Scope::Cluster || need.part == Part::LeaderElection,
            "{name}: only the Lease is namespaced"
        );
    }
}

#[test]
fn every_controller_has_rows_and_every_crd_is_covered() {
    for name in ControllerName::ALL {
        assert!(
            NEEDS.iter().any(|n| n.part == Part::Controller(name)),
            "{name} has no row"
        );
    }
    let rules = rules_for(&Selection::all());
    for crd in capstan_api::crds::all() {
        let group = &crd.spec.group;
        let plural = &crd.spec.names.plural;
        assert!(
            verbs_of(&rules, group, plural).is_some(),
            "{group}/{plural} is in no rule"
        );
    }
}

#[test]
fn what_a_selection_needs() {
    // The sync alone: its own kinds, history, namespaces; no controller's.
    let sync_only = rules_for(&Selection::none());
    assert_eq!(
        verbs_of(&sync_only, "", "nodes").as_deref(),
        Some("get,list,patch")
    );
    assert_eq!(verbs_of(&sync_only, "", "pods"), None);
    assert_eq!(verbs_of(&sync_only, "apps", "daemonsets"), None);
    assert_eq!(
        verbs_of(&sync_only, "kmm.sigs.x-k8s.io", "nodemodulesconfigs"),
        None
    );
    let drain = rules_for(&selection("drain"));
    assert_eq!(
        verbs_of(&drain, "", "pods/eviction").as_deref(),
        Some("create")
    );
    assert_eq!(verbs_of(&drain, "", "pods").as_deref(), Some("list"));
    // The device-plugin-ready labeller: its pods' finalizer and their nodes' label.
    let device_plugin = rules_for(&selection("device-plugin"));
    assert_eq!(
        verbs_of(&device_plugin, "", "pods").as_deref(),
        Some("list,watch,patch")
    );
    for resource in ["pods", "nodes"] {
        let parts = parts_needing(&selection("device-plugin"), "", resource);
        assert!(
            parts.contains(&("device-plugin", vec!["list", "watch", "patch"])),
            "{resource}: {parts:?}"
        );
    }
    // --once adds nothing to every controller: each controller lists what it checks.
    let all = Selection::all();
    let usage = |once| Usage {
        controllers: &all,
        once,
        lease_namespace: None,
    };
    assert_eq!(merged(needs(&usage(true))), merged(needs(&usage(false))));
    // The Lease only with leader election, in its namespace; the bootstrap never.
    let elected = Usage {
        lease_namespace: Some("capstan-system"),
        ..usage(false)
    };
    assert!(
        needs(&elected)
            .iter()
            .any(|n| n.part == Part::LeaderElection)
    );
    assert!(
        !needs(&usage(false))
            .iter()
            .any(|n| matches!(n.part, Part::LeaderElection | Part::Bootstrap))
    );
}

#[test]
fn rule_comments_name_the_parts() {
    let parts = parts_needing(&Selection::all(), "", "pods/eviction");
    assert_eq!(parts, [("drain", vec!["create"])]);
    let parts = parts_needing(&Selection::all(), "capstan.dev", "historyrecords");
    assert_eq!(
        parts,
        [
            ("history", vec!["list", "create", "delete"]),
            ("version-labels", vec!["get", "create"]),
            ("drain", vec!["create"]),
            ("nodekeeper", vec!["create"]),
            ("notifications", vec!["list"]),
        ]
    );
}

#[test]
fn permissions_are_one_per_verb_with_every_row_needing_it() {
    let lease = NEEDS
        .iter()
        .find(|n| n.resource == "leases")
        .expect("lease row");
    let eviction = NEEDS
        .iter()
        .find(|n| n.resource == "pods/eviction")
        .expect("eviction row");
    let asked = permissions([lease, eviction], Some("capstan-system"));
    let shown: Vec<String> = asked
        .iter()
        .map(|(permission, needs)| format!("{permission} x{}", needs.len()))
        .collect();
    assert_eq!(
        shown,
        [
            "create pods/eviction (group \"\", cluster-wide) x1",
            "create leases (group \"coordination.k8s.io\", namespace capstan-system) x1",
            "get leases (group \"coordination.k8s.io\", namespace capstan-system) x1",
            "patch leases (group \"coordination.k8s.io\", namespace capstan-system) x1",
        ]
    );
    let usage = Usage {
        controllers: &Selection::all(),
        once: false,
        lease_namespace: None,
    };
    let all = permissions(needs(&usage), None);
    let list_nodes = all
        .iter()
        .find(|(p, _)| p.verb == "list" && p.resource == "nodes")
        .expect("list nodes");
    let parts: BTreeSet<&str> = list_nodes.1.iter().map(|n| n.part.short()).collect();
    assert!(parts.contains("sync") && parts.contains("module-nmc") && parts.contains("drain"));
    // The review asks for the subresource apart.
    let review = asked[0].0.review();
    let attributes = review.spec.resource_attributes.expect("attributes");
    assert_eq!(attributes.resource.as_deref(), Some("pods"));
    assert_eq!(attributes.subresource.as_deref(), Some("eviction"));
    assert_eq!(attributes.namespace, None);
}

#[test]
fn the_error_names_each_verb_resource_and_why() {
    let permission = |verb, group, resource, namespace: Option<&str>| Permission {
        verb,
        group,
        resource,
        namespace: namespace.map(str::to_string),
    };
    let nodes = Denied {
        permission: permission("list", "", "nodes", None),
        needed_by: vec![
            (
                Part::Controller(ControllerName::ModuleNmc),
                "watches every Node",
            ),
            (Part::Sync, "applies the version labels"),
        ],
    };
    let lease = Denied {
        permission: permission(
            "create",
            "coordination.k8s.io",
            "leases",
            Some("capstan-system"),
        ),
        needed_by: vec![(Part::LeaderElection, "creates its Lease")],
    };
    let cases: &[(Option<&str>, Vec<Denied>, &str)] = &[
        (
            Some("system:serviceaccount:capstan-system:capstan"),
            vec![nodes.clone()],
            "the cluster denies capstan (system:serviceaccount:capstan-system:capstan) 1 permission(s) it needs:\n  \
             list nodes (group \"\", cluster-wide): the module-nmc controller watches every Node; the sync applies the version labels\n\
             the ClusterRole capstan ships (deploy/base/clusterrole.yaml, or the Helm chart charts/capstan) grants them",
        ),
        (
            None,
            vec![lease.clone()],
            "the cluster denies capstan 1 permission(s) it needs:\n  \
             create leases (group \"coordination.k8s.io\", namespace capstan-system): leader election creates its Lease\n\
             the Role capstan ships (deploy/base/role-leader-election.yaml, or the Helm chart charts/capstan) grants them",
        ),
        (
            None,
            vec![nodes, lease],
            "the cluster denies capstan 2 permission(s) it needs:\n  \
             list nodes (group \"\", cluster-wide): the module-nmc controller watches every Node; the sync applies the version labels\n  \
             create leases (group \"coordination.k8s.io\", namespace capstan-system): leader election creates its Lease\n\
             the ClusterRole and Role capstan ships (deploy/base/clusterrole.yaml and deploy/base/role-leader-election.yaml, or the Helm chart charts/capstan) grant them",
        ),
    ];
    for (user, denied, expected) in cases {
        let error = MissingPermissions {
            user: user.map(str::to_string),
            denied: denied.clone(),
        };
        assert_eq!(error.to_string(), *expected);
    }
}

#[test]
fn denied_keeps_the_permissions_not_allowed() {
    let usage = Usage {
        controllers: &Selection::none(),
        once: false,
        lease_namespace: None,
    };
    let asked = permissions(needs(&usage), None);
    let allowed: Vec<bool> = asked
        .iter()
        .map(|(p, _)| !(p.resource == "gitsyncs/status" || p.verb == "delete"))
        .collect();
    let shown: Vec<String> = denied(&asked, &allowed)
        .iter()
        .map(|d| d.permission.to_string())
        .collect();
    assert_eq!(
        shown,
        [
            "patch gitsyncs/status (group \"capstan.dev\", cluster-wide)",
            "delete historyrecords (group \"capstan.dev\", cluster-wide)",
            "delete modules (group \"kmm.sigs.x-k8s.io\", cluster-wide)",
            "delete leaderworkersets (group \"leaderworkerset.x-k8s.io\", cluster-wide)",
            "delete upgradeconfigs (group \"upgrade.managed.openshift.io\", cluster-wide)",
        ]
    );
}

/// How the test API server answers.
#[derive(Clone, Copy)]
enum Server {
    /// Allows all but `(verb, resource)`; answers `SelfSubjectReview` when `who` is set.
    Denying {
        verb: &'static str,
        resource: &'static str,
        who: bool,
    },
    /// Serves no review at all.
    WithoutReviews,
}

/// A client whose API server is `server`; the second value counts the reviews asked.
fn client(server: Server) -> (kube::Client, Arc<Mutex<usize>>) {
    let asked = Arc::new(Mutex::new(0));
    let counter = asked.clone();
    let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
        let counter = counter.clone();
        async move {
            let path = request.uri().path().to_string();
            let body = request
                .into_body()
                .collect()
                .await
                .expect("body")
                .to_bytes();
            let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let (status, answer) = match (server, path.as_str()) {
                (Server::WithoutReviews, _) => (
                    404,
                    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                           "reason": "NotFound", "code": 404, "message": "not found"}),
                ),
                (
                    Server::Denying { who, .. },
                    "/apis/authentication.k8s.io/v1/selfsubjectreviews",
                ) => {
                    if who {
                        (
                            201,
                            json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview",
                            "metadata": {}, "status": {"userInfo": {"username": "system:serviceaccount:capstan-system:capstan"}}}),
                        )
                    } else {
                        (
                            404,
                            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                               "reason": "NotFound", "code": 404, "message": "not found"}),
                        )
                    }
                }
                (
                    Server::Denying { verb, resource, .. },
                    "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
                ) => {
                    *counter.lock().expect("counter") += 1;
                    let attributes = &body["spec"]["resourceAttributes"];
                    let asked = match attributes["subresource"].as_str() {
                        Some(sub) => {
                            format!("{}/{sub}", attributes["resource"].as_str().unwrap_or(""))
                        }
                        None => attributes["resource"].as_str().unwrap_or("").to_string(),
                    };
                    let allowed = !(attributes["verb"] == verb && asked == resource);
                    let mut review = body.clone();
                    review["status"] = json!({"allowed": allowed});
                    (201, review)
                }
                (_, other) => panic!("unexpected request to {other}"),
            };
            let response = http::Response::builder()
                .status(status)
                .header("content-type", "application/json")
                .body(kube::client::Body::from(answer.to_string().into_bytes()))
                .expect("response");
            Ok::<_, Infallible>(response)
        }
    });
    (kube::Client::new(service, "default"), asked)
}

#[tokio::test]
async fn the_check_passes_when_everything_is_granted_and_names_what_is_denied() {
    let all = Selection::all();
    let usage = Usage {
        controllers: &all,
        once: false,
        lease_namespace: Some("capstan-system"),
    };
    let expected = permissions(needs(&usage), usage.lease_namespace).len();

    let (granted, asked) = client(Server::Denying {
        verb: "none",
        resource: "none",
        who: true,
    });
    check(&granted, &usage)
        .await
        .expect("every permission granted");
    assert_eq!(
        *asked.lock().expect("asked"),
        expected,
        "one review per permission"
    );

    let (denying, _) = client(Server::Denying {
        verb: "create",
        resource: "pods/eviction",
        who: true,
    });
    let error = check(&denying, &usage).await.expect_err("eviction denied");
    assert_eq!(
        error.to_string(),
        "the cluster denies capstan (system:serviceaccount:capstan-system:capstan) 1 permission(s) it needs:\n  \
         create pods/eviction (group \"\", cluster-wide): the drain controller evicts them, as kubectl drain does (PodDisruptionBudgets honoured)\n\
         the ClusterRole capstan ships (deploy/base/clusterrole.yaml, or the Helm chart charts/capstan) grants them"
    );

    let (anonymous, _) = client(Server::Denying {
        verb: "patch",
        resource: "leases",
        who: false,
    });
    let error = check(&anonymous, &usage).await.expect_err("lease denied");
    assert!(
        error
            .to_string()
            .starts_with("the cluster denies capstan 1 permission(s) it needs:\n  patch leases (group \"coordination.k8s.io\", namespace capstan-system): leader election"),
        "{error}"
    );
}

#[tokio::test]
async fn a_server_without_access_reviews_is_not_checked() {
    let (client, _) = client(Server::WithoutReviews);
    let none = Selection::none();
    let usage = Usage {
        controllers: &none,
        once: false,
        lease_namespace: None,
    };
    check(&client, &usage).await.expect("skipped");
}

#[tokio::test]
async fn the_embedded_cluster_grants_everything() {
    let (cluster, client) = capstan_cluster::testing::start().await;
    let all = Selection::all();
    let usage = Usage {
        controllers: &all,
        once: true,
        lease_namespace: Some("capstan-system"),
    };
    check(&client, &usage)
        .await
        .expect("no authorization, nothing denied");
    // Answered, not skipped as a server without reviews would be.
    let permission = Permission {
        group: "",
        resource: "pods/eviction",
        verb: "create",
        namespace: None,
    };
    let reviews: kube::Api<k8s_openapi::api::authorization::v1::SelfSubjectAccessReview> =
        kube::Api::all(client.clone());
    let answered = reviews
        .create(&Default::default(), &permission.review())
        .await
        .expect("reviewed");
    let status = answered.status.expect("a status");
    assert!(status.allowed);
    assert_eq!(
        status.reason.as_deref(),
        Some(capstan_cluster::access_review::REASON)
    );
    cluster.shutdown().await;
}
