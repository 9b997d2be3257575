//! Upstream's LWS controller as the oracle. Every scenario runs under upstream LWS's manager
//! (`kubernetes-sigs/lws` at 060ab4d, with its admission webhooks) on one fresh real control
//! plane and under capstan's LWS controller on another, both with the same kwok nodes; the
//! pods are made by kube-controller-manager's StatefulSet controller in both. After each step
//! both clusters are left to settle, and what each wrote is compared after normalising names,
//! uids, times and revision keys: the leader and worker StatefulSets, the LWS's
//! ControllerRevisions, the pods' labels, annotations and environment (as their containers
//! see it) and the revisions each pod name was made from, the Services, the LWS as stored
//! and its status, and the leader StatefulSet's partitions and replicas over time (every
//! value a watch saw, repeats dropped).
//!
//! A difference fails the test unless it is named in [`NAMED`], whose every entry
//! docs/upstream-differences.md explains and which must each still be seen. Revision keys
//! differ by design (docs/leaderworkersets.md): each is said as the number of its revision.
//!
//! Upstream's manager is built by `hack/real-cluster/lws/build` from the source archive
//! beside the checkout; on the embedded cluster there is no upstream to run, and the test
//! says so and passes (hack/test runs it with the real server only).

use crate::common;
use crate::oracle::{Named, Running, Shown, Verdict};

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use capstan_api::LeaderWorkerSet;
use capstan_cluster::sim::config::NodeConfig;
use capstan_real_cluster::ControlPlane;
use futures::StreamExt;
use k8s_openapi::api::apps::v1::{ControllerRevision, StatefulSet};
use k8s_openapi::api::core::v1::{Container, Pod, Service};
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::discovery::ApiResource;
use kube::runtime::watcher;
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

const NAME_LABEL: &str = "leaderworkerset.sigs.k8s.io/name";
const KEY_LABEL: &str = "leaderworkerset.sigs.k8s.io/template-revision-hash";
/// How long a scenario's objects must stay as they are, once the LWS is done, before they
/// count as settled.
const QUIET: Duration = Duration::from_secs(4);
/// The same after a container restart, which changes nothing the LWS reports: a pod
/// controller with a backlog (upstream's runs one worker) gets this long to act on it.
const RESTART_QUIET: Duration = Duration::from_secs(10);
/// How long a step may take to settle.
const STEP_DEADLINE: Duration = Duration::from_secs(120);

/// Where capstan decides otherwise on purpose: (id in docs/upstream-differences.md,
/// scenario or `*` for every one, a part of the differing path). Each must be seen, or
/// leave the list.
const NAMED: &[Named] = &[
    // capstan runs no admission webhook: the LWS stays as written, with no `networkConfig`
    // (read as `Shared`) and the deprecated `restartPolicy: Default` (read as `None`) that
    // upstream's defaulting webhook writes out.
    (
        "LWS-webhook-defaults",
        "*",
        "/lws/spec/networkConfig/",
        Shown::Always,
    ),
    (
        "LWS-webhook-defaults",
        "restart-default",
        "/lws/spec/leaderWorkerTemplate/restartPolicy",
        Shown::Always,
    ),
    // The LWS variables are in the StatefulSets' pod templates rather than written into
    // each pod at admission; the pods' containers see the same values.
    ("LWS-env-in-template", "*", "/templateEnv/", Shown::Always),
    // Leader pods also see `LWS_LEADER_POD_NAME`, first: one leader template serves every
    // leader pod, and `LWS_LEADER_ADDRESS` is written from it.
    (
        "LWS-leader-pod-name-env",
        "*",
        "/env/main/LWS_LEADER_POD_NAME",
        Shown::Always,
    ),
    (
        "LWS-leader-pod-name-env",
        "*",
        "/envOrder/main",
        Shown::Always,
    ),
    // Under `UniquePerReplica` a leader pod keeps the leader StatefulSet's Service as its
    // subdomain: capstan runs no pod webhook to set it to the pod's own name.
    (
        "LWS-unique-leader-subdomain",
        "unique",
        "/subdomain",
        Shown::Always,
    ),
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum System {
    Upstream,
    Capstan,
}

/// One thing a scenario does to its cluster.
#[derive(Clone, Debug)]
enum Step {
    /// Creates the scenario's LWS.
    Create(Value),
    /// Merges this into the LWS's spec (a JSON merge patch: lists and templates are
    /// replaced whole).
    PatchSpec(Value),
    /// The first container of this pod restarts (its kubelet counts a restart).
    RestartContainer(&'static str),
}

struct Scenario {
    /// Also the namespace and the name of its LWS.
    name: &'static str,
    steps: Vec<Step>,
}

/// A worker template running `image`.
fn worker_template(image: &str) -> Value {
    json!({
        "metadata": {"labels": {"app": "model"}, "annotations": {"example.com/model": "llama"}},
        "spec": {"containers": [{"name": "main", "image": image}]},
    })
}

/// The LWS of scenario `name`: `replicas` groups of `size`, with `template_extra` merged
/// into its `leaderWorkerTemplate` and `spec_extra` into its `spec`.
fn lws(name: &str, replicas: i32, size: i32, template_extra: Value, spec_extra: Value) -> Value {
    let mut template =
        json!({"size": size, "workerTemplate": worker_template("registry.example/model:v1")});
    if let (Some(template), Value::Object(extra)) = (template.as_object_mut(), template_extra) {
        template.extend(extra);
    }
    let mut spec = json!({"replicas": replicas, "leaderWorkerTemplate": template});
    if let (Some(spec), Value::Object(extra)) = (spec.as_object_mut(), spec_extra) {
        spec.extend(extra);
    }
    json!({
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": name, "namespace": name, "labels": {"team": "inference"}},
        "spec": spec,
    })
}

/// The worker template's image becomes `image`.
fn new_image(image: &str) -> Step {
    Step::PatchSpec(json!({"leaderWorkerTemplate": {"workerTemplate": worker_template(image)}}))
}

fn scenarios() -> Vec<Scenario> {
    // A group of 3 under `policy`, whose `pod` restarts a container.
    let restart = |name: &'static str, policy: &str, pod: &'static str| Scenario {
        name,
        steps: vec![
            Step::Create(lws(name, 1, 3, json!({"restartPolicy": policy}), json!({}))),
            Step::RestartContainer(pod),
        ],
    };
    let rolling = |name: &'static str, replicas: i32, unavailable: Value, surge: Value| Scenario {
        name,
        steps: vec![
            Step::Create(lws(
                name,
                replicas,
                2,
                json!({}),
                json!({"rolloutStrategy": {
                    "type": "RollingUpdate",
                    "rollingUpdateConfiguration": {"maxUnavailable": unavailable, "maxSurge": surge},
                }}),
            )),
            new_image("registry.example/model:v2"),
        ],
    };
    vec![
        Scenario {
            name: "create",
            steps: vec![Step::Create(lws("create", 2, 3, json!({}), json!({})))],
        },
        // 10% of 3 rounds up to one surge group.
        rolling("rolling", 3, json!(1), json!("10%")),
        // 50% of 3 rounds down to one group at a time.
        rolling("rolling-percent", 3, json!("50%"), json!(0)),
        Scenario {
            name: "partition",
            steps: vec![
                Step::Create(lws(
                    "partition",
                    3,
                    2,
                    json!({}),
                    json!({"rolloutStrategy": {
                        "type": "RollingUpdate",
                        "rollingUpdateConfiguration": {"partition": 1, "maxUnavailable": 1},
                    }}),
                )),
                new_image("registry.example/model:v2"),
                Step::PatchSpec(json!({"rolloutStrategy": {
                    "rollingUpdateConfiguration": {"partition": 0},
                }})),
            ],
        },
        Scenario {
            name: "scale",
            steps: vec![
                Step::Create(lws("scale", 2, 2, json!({}), json!({}))),
                Step::PatchSpec(json!({"replicas": 4})),
                Step::PatchSpec(json!({"replicas": 1})),
            ],
        },
        restart(
            "restart-recreate",
            "RecreateGroupOnPodRestart",
            "restart-recreate-0-1",
        ),
        restart(
            "restart-leader",
            "RecreateGroupOnPodRestart",
            "restart-leader-0",
        ),
        restart("restart-none", "None", "restart-none-0-1"),
        restart("restart-default", "Default", "restart-default-0-1"),
        Scenario {
            name: "leader-ready",
            steps: vec![Step::Create(lws(
                "leader-ready",
                2,
                2,
                json!({}),
                json!({"startupPolicy": "LeaderReady"}),
            ))],
        },
        Scenario {
            name: "unique",
            steps: vec![Step::Create(lws(
                "unique",
                2,
                2,
                json!({}),
                json!({"networkConfig": {"subdomainPolicy": "UniquePerReplica"}}),
            ))],
        },
        Scenario {
            name: "subgroup",
            steps: vec![Step::Create(lws(
                "subgroup",
                1,
                4,
                json!({"subGroupPolicy": {"subGroupSize": 2}}),
                json!({}),
            ))],
        },
        Scenario {
            name: "subgroup-excluded",
            steps: vec![Step::Create(lws(
                "subgroup-excluded",
                1,
                3,
                json!({"subGroupPolicy": {"subGroupPolicyType": "LeaderExcluded", "subGroupSize": 2}}),
                json!({}),
            ))],
        },
    ]
}

/// What watches saw, by namespace: the leader StatefulSet's partitions and replicas, and
/// each pod name's incarnations (uid and revision key) in the order they came.
#[derive(Default)]
struct Seen {
    rollout: BTreeMap<String, Rollout>,
    pods: BTreeMap<String, BTreeMap<String, Vec<(String, String)>>>,
    /// Every revision key the LWS's revisions had, with its revision: a key stays known
    /// after its revision is deleted, for the pods that were made from it.
    keys: BTreeMap<String, String>,
}

/// The values the leader StatefulSet's partition and replicas took, in order, repeats
/// dropped. Each is a sequence of its own: when the last groups become ready together, a
/// controller may lower the partition and reclaim the surge groups in one write or in two.
#[derive(Clone, Debug, Default, serde::Serialize)]
struct Rollout {
    partitions: Vec<i32>,
    replicas: Vec<i32>,
}

/// One system's cluster, with what its watches saw.
struct Side {
    system: System,
    plane: ControlPlane,
    client: kube::Client,
    running: Running,
    seen: Arc<Mutex<Seen>>,
}

impl Side {
    async fn start(system: System, scenarios: &[Scenario]) -> Side {
        let nodes = (1..=3)
            .map(|i| {
                serde_json::from_value::<NodeConfig>(json!({"name": format!("node-{i}")}))
                    .expect("node config")
            })
            .collect();
        let (plane, client) = crate::oracle::start_plane(
            &format!("{system:?}"),
            nodes,
            scenarios.iter().map(|scenario| scenario.name),
        )
        .await;
        let seen = Arc::new(Mutex::new(Seen::default()));
        let running = match system {
            System::Capstan => Running::capstan(&client, "lws"),
            System::Upstream => {
                let log = std::env::temp_dir().join("capstan-upstream-oracle-lws.log");
                let kubeconfig = plane.dir().join("admin.kubeconfig");
                let manager =
                    capstan_real_cluster::lws::start(&client, &kubeconfig, plane.dir(), &log)
                        .await
                        .unwrap_or_else(|err| panic!("upstream LWS starts: {err:#}"));
                eprintln!(
                    "upstream LWS runs with the {:?} LeaderWorkerSet CRD; its log: {}",
                    manager.crd,
                    log.display()
                );
                Running::upstream(manager.child)
            }
        };
        // Started before any step, so they see every pod the steps make.
        tokio::spawn(watch_leader_sets(
            client.clone(),
            seen.clone(),
            running.stop.clone(),
        ));
        tokio::spawn(watch_pods(
            client.clone(),
            seen.clone(),
            running.stop.clone(),
        ));
        Side {
            system,
            plane,
            client,
            running,
            seen,
        }
    }

    async fn stop(self) {
        self.running.stop().await;
        self.plane.shutdown().await;
    }

    /// Runs `scenario`, and returns its snapshot after each step.
    async fn run(&self, scenario: &Scenario) -> Vec<Value> {
        let mut snapshots = Vec::new();
        for (index, step) in scenario.steps.iter().enumerate() {
            self.take(scenario.name, step).await;
            snapshots.push(self.settled(scenario, index).await);
        }
        snapshots
    }

    async fn take(&self, ns: &str, step: &Step) {
        let sets = Api::<DynamicObject>::namespaced_with(self.client.clone(), ns, &lws_resource());
        match step {
            Step::Create(object) => {
                let object: DynamicObject = serde_json::from_value(object.clone()).expect("an LWS");
                sets.create(&PostParams::default(), &object)
                    .await
                    .unwrap_or_else(|err| panic!("{:?}: creating LWS {ns}: {err}", self.system));
            }
            Step::PatchSpec(spec) => {
                sets.patch(
                    ns,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": spec})),
                )
                .await
                .unwrap_or_else(|err| panic!("{:?}: updating LWS {ns}: {err}", self.system));
            }
            Step::RestartContainer(name) => {
                let pods: Api<Pod> = Api::namespaced(self.client.clone(), ns);
                let pod = pods.get(name).await.expect("the pod to restart");
                let mut statuses = serde_json::to_value(
                    pod.status
                        .and_then(|status| status.container_statuses)
                        .unwrap_or_default(),
                )
                .expect("container statuses");
                statuses[0]["restartCount"] = json!(1);
                pods.patch_status(
                    name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": {"containerStatuses": statuses}})),
                )
                .await
                .expect("a container restart");
            }
        }
    }

    /// The scenario's snapshot once it has stayed the same for [`QUIET`].
    async fn settled(&self, scenario: &Scenario, step: usize) -> Value {
        let quiet = match scenario.steps[step] {
            Step::RestartContainer(_) => RESTART_QUIET,
            _ => QUIET,
        };
        let started = Instant::now();
        let mut last = self.snapshot(scenario.name).await;
        let mut since = Instant::now();
        loop {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let now = self.snapshot(scenario.name).await;
            if now != last || !done(&now) {
                last = now;
                since = Instant::now();
            } else if since.elapsed() >= quiet {
                return last;
            }
            assert!(
                started.elapsed() < STEP_DEADLINE,
                "{:?}: scenario {} step {step} did not settle: {last:#}",
                self.system,
                scenario.name
            );
        }
    }

    /// What the controllers (and the StatefulSet controller after them) made for the LWS
    /// of `ns`, normalised.
    async fn snapshot(&self, ns: &str) -> Value {
        let revisions: Api<ControllerRevision> = Api::namespaced(self.client.clone(), ns);
        let revisions: Vec<ControllerRevision> = revisions
            .list(&ListParams::default())
            .await
            .expect("revisions")
            .items
            .into_iter()
            .filter(|revision| owned_by(&revision.metadata, "LeaderWorkerSet"))
            .collect();
        let keys = {
            let mut seen = self.seen.lock().expect("seen");
            seen.keys.extend(Keys::of(&revisions).0);
            Keys(seen.keys.clone())
        };
        let mut revision_view: Vec<Value> = revisions
            .iter()
            .map(|revision| {
                json!({
                    "revision": revision.revision,
                    "labels": keys.labels(revision.metadata.labels.as_ref()),
                    "owners": owners(&revision.metadata),
                })
            })
            .collect();
        revision_view.sort_by_key(|revision| revision.to_string());

        let sets: Api<StatefulSet> = Api::namespaced(self.client.clone(), ns);
        let mut set_view = Map::new();
        for set in sets.list(&ListParams::default()).await.expect("sets").items {
            set_view.insert(
                set.metadata.name.clone().unwrap_or_default(),
                normalise_set(&set, &keys),
            );
        }

        let pods: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        let incarnations = self
            .seen
            .lock()
            .expect("seen")
            .pods
            .get(ns)
            .cloned()
            .unwrap_or_default();
        let mut pod_view = Map::new();
        for pod in pods.list(&ListParams::default()).await.expect("pods").items {
            let name = pod.metadata.name.clone().unwrap_or_default();
            let mut view = normalise_pod(&pod, &keys);
            // A pod made again from the same revision is dropped: when a group is rolled, the
            // garbage collector and the StatefulSet controller sometimes make a worker pod
            // twice under either controller. A group recreated after a restart shows in the
            // restarted pod's restart count instead.
            let mut revisions: Vec<Value> = Vec::new();
            for (_, key) in incarnations.get(&name).into_iter().flatten() {
                let revision = Value::String(keys.key(key));
                if revisions.last() != Some(&revision) {
                    revisions.push(revision);
                }
            }
            view["incarnations"] = Value::Array(revisions);
            pod_view.insert(name, view);
        }

        let services: Api<Service> = Api::namespaced(self.client.clone(), ns);
        let mut service_view = Map::new();
        for service in services
            .list(&ListParams::default())
            .await
            .expect("services")
            .items
        {
            let spec = service.spec.clone().unwrap_or_default();
            service_view.insert(
                service.metadata.name.clone().unwrap_or_default(),
                json!({
                    "labels": keys.labels(service.metadata.labels.as_ref()),
                    "owners": owners(&service.metadata),
                    "selector": spec.selector,
                    "clusterIP": spec.cluster_ip,
                    "publishNotReadyAddresses": spec.publish_not_ready_addresses,
                }),
            );
        }

        let sets = Api::<DynamicObject>::namespaced_with(self.client.clone(), ns, &lws_resource());
        let lws_view = match sets.get_opt(ns).await.expect("the LWS") {
            Some(lws) => normalise_lws(&lws, &keys),
            None => Value::Null,
        };
        let rollout = self
            .seen
            .lock()
            .expect("seen")
            .rollout
            .get(ns)
            .cloned()
            .unwrap_or_default();
        json!({
            "lws": lws_view,
            "revisions": {"count": revisions.len(), "each": revision_view},
            "statefulsets": set_view,
            "pods": pod_view,
            "services": service_view,
            "rollout": rollout,
        })
    }
}

/// Whether the LWS of a snapshot is done: its status describes its generation, it is
/// Available, and it has its groups' pods, each ready. A controller with a backlog may not
/// have started on a step for longer than the quiet time.
fn done(snapshot: &Value) -> bool {
    let lws = &snapshot["lws"];
    let status = &lws["status"];
    let available = status["conditions"].as_array().is_some_and(|conditions| {
        conditions
            .iter()
            .any(|c| c["type"] == "Available" && c["status"] == "True")
    });
    let spec = &lws["spec"];
    let pods = spec["replicas"].as_i64().unwrap_or(1)
        * spec["leaderWorkerTemplate"]["size"].as_i64().unwrap_or(1);
    let ready = snapshot["pods"].as_object().is_some_and(|all| {
        all.len() as i64 == pods && all.values().all(|pod| pod["ready"] == true)
    });
    lws["generation"] == status["observedGeneration"] && available && ready
}

fn lws_resource() -> ApiResource {
    ApiResource::erase::<LeaderWorkerSet>(&())
}

/// The LWS's revision keys, each said as `<revision N>`: the keys themselves differ by
/// design, their revisions' order does not.
struct Keys(BTreeMap<String, String>);

impl Keys {
    fn of(revisions: &[ControllerRevision]) -> Keys {
        Keys(
            revisions
                .iter()
                .filter_map(|revision| {
                    let key = revision.metadata.labels.as_ref()?.get(KEY_LABEL)?;
                    Some((key.clone(), format!("<revision {}>", revision.revision)))
                })
                .collect(),
        )
    }

    fn key(&self, key: &str) -> String {
        self.0
            .get(key)
            .cloned()
            .unwrap_or_else(|| "<a key of no revision>".into())
    }

    /// `labels` with revision keys said by revision, and the StatefulSet controller's own
    /// revision hash (of a template, which capstan writes otherwise) left as a mark.
    fn labels(&self, labels: Option<&BTreeMap<String, String>>) -> Value {
        labels
            .into_iter()
            .flatten()
            .map(|(name, value)| {
                let value = match name.as_str() {
                    KEY_LABEL => self.key(value),
                    "controller-revision-hash" => "<statefulset revision>".into(),
                    _ => value.clone(),
                };
                (name.clone(), Value::String(value))
            })
            .collect::<Map<_, _>>()
            .into()
    }
}

fn owned_by(meta: &kube::api::ObjectMeta, kind: &str) -> bool {
    meta.owner_references
        .iter()
        .flatten()
        .any(|owner| owner.kind == kind)
}

fn owners(meta: &kube::api::ObjectMeta) -> Vec<String> {
    meta.owner_references
        .iter()
        .flatten()
        .map(|owner| {
            format!(
                "{}/{}{}{}",
                owner.kind,
                owner.name,
                if owner.controller == Some(true) {
                    " controller"
                } else {
                    ""
                },
                if owner.block_owner_deletion == Some(true) {
                    " blocking"
                } else {
                    ""
                }
            )
        })
        .collect()
}

/// The environment of each template container, by container name: values, or where they
/// come from.
fn template_environment(containers: &[Container]) -> Value {
    containers
        .iter()
        .map(|container| {
            let env: Map<String, Value> = container
                .env
                .iter()
                .flatten()
                .map(|var| match (&var.value, &var.value_from) {
                    (_, Some(from)) => (var.name.clone(), json!({"from": from})),
                    (value, None) => (var.name.clone(), json!(value)),
                })
                .collect();
            (container.name.clone(), Value::Object(env))
        })
        .collect::<Map<_, _>>()
        .into()
}

/// The environment each container of `pod` runs with, as its kubelet would resolve it: a
/// field of the pod's metadata read, and `$(VAR)` of an earlier variable expanded. Upstream's
/// webhook writes values into the pod, capstan references into the template: the pod's
/// container sees the same either way. Also each container's variable names in order.
fn pod_environment(pod: &Pod) -> (Value, Value) {
    let meta = &pod.metadata;
    let field = |path: &str| -> Option<String> {
        let from_map = |map: Option<&BTreeMap<String, String>>, prefix: &str| {
            let key = path.strip_prefix(prefix)?.strip_suffix("']")?;
            map?.get(key).cloned()
        };
        match path {
            "metadata.name" => meta.name.clone(),
            "metadata.namespace" => meta.namespace.clone(),
            _ => from_map(meta.labels.as_ref(), "metadata.labels['")
                .or_else(|| from_map(meta.annotations.as_ref(), "metadata.annotations['")),
        }
    };
    let (mut values, mut orders) = (Map::new(), Map::new());
    for container in pod.spec.iter().flat_map(|spec| &spec.containers) {
        let mut resolved: Vec<(String, Value)> = Vec::new();
        for var in container.env.iter().flatten() {
            let value = match (&var.value, &var.value_from) {
                (_, Some(from)) => from
                    .field_ref
                    .as_ref()
                    .and_then(|selector| field(&selector.field_path))
                    .map_or_else(|| json!({"from": from}), Value::String),
                (value, None) => {
                    let mut text = value.clone().unwrap_or_default();
                    for (name, earlier) in &resolved {
                        if let Value::String(earlier) = earlier {
                            text = text.replace(&format!("$({name})"), earlier);
                        }
                    }
                    Value::String(text)
                }
            };
            resolved.push((var.name.clone(), value));
        }
        let order: Vec<&str> = resolved.iter().map(|(name, _)| name.as_str()).collect();
        orders.insert(container.name.clone(), Value::String(order.join(",")));
        values.insert(
            container.name.clone(),
            Value::Object(resolved.into_iter().collect()),
        );
    }
    (Value::Object(values), Value::Object(orders))
}

fn normalise_set(set: &StatefulSet, keys: &Keys) -> Value {
    let spec = set.spec.clone().unwrap_or_default();
    let template = spec.template.metadata.clone().unwrap_or_default();
    let pod = spec.template.spec.clone().unwrap_or_default();
    json!({
        "labels": keys.labels(set.metadata.labels.as_ref()),
        "annotations": set.metadata.annotations,
        "owners": owners(&set.metadata),
        "selector": spec.selector,
        "replicas": spec.replicas,
        "serviceName": spec.service_name,
        "podManagementPolicy": spec.pod_management_policy,
        "updateStrategy": spec.update_strategy,
        "ordinals": spec.ordinals,
        "templateLabels": keys.labels(template.labels.as_ref()),
        "templateAnnotations": template.annotations,
        "subdomain": pod.subdomain,
        "templateEnv": template_environment(&pod.containers),
        "images": pod.containers.iter().map(|c| c.image.clone()).collect::<Vec<_>>(),
    })
}

fn normalise_pod(pod: &Pod, keys: &Keys) -> Value {
    let spec = pod.spec.clone().unwrap_or_default();
    let (env, env_order) = pod_environment(pod);
    let restarts: i32 = pod
        .status
        .iter()
        .flat_map(|status| status.container_statuses.iter().flatten())
        .map(|status| status.restart_count)
        .sum();
    json!({
        "labels": keys.labels(pod.metadata.labels.as_ref()),
        "annotations": pod.metadata.annotations,
        "owners": owners(&pod.metadata),
        "subdomain": spec.subdomain,
        "hostname": spec.hostname,
        "env": env,
        "envOrder": env_order,
        "images": spec.containers.iter().map(|c| c.image.clone()).collect::<Vec<_>>(),
        "restarts": restarts,
        "ready": common::is_ready(pod),
    })
}

/// The LWS as stored (what defaulting made of it) and its status, times left out, and only
/// the conditions that hold: whether a false one was ever written depends on whether a
/// reconcile saw the state it denies (groups that became ready between two reconciles
/// never show `Progressing`).
fn normalise_lws(lws: &DynamicObject, keys: &Keys) -> Value {
    let mut status = lws.data.get("status").cloned().unwrap_or(Value::Null);
    if let Some(conditions) = status.get_mut("conditions").and_then(Value::as_array_mut) {
        conditions.retain(|condition| condition["status"] == "True");
        for condition in conditions.iter_mut() {
            if let Some(condition) = condition.as_object_mut() {
                condition.remove("lastTransitionTime");
            }
        }
        conditions.sort_by_key(|condition| condition["type"].to_string());
    }
    json!({
        "generation": lws.metadata.generation,
        "labels": keys.labels(lws.metadata.labels.as_ref()),
        "annotations": lws.metadata.annotations,
        "finalizers": lws.metadata.finalizers,
        "spec": lws.data.get("spec"),
        "status": status,
    })
}

/// Records every partition and replicas the leader StatefulSet of each scenario (named as
/// its namespace) shows, repeats dropped.
async fn watch_leader_sets(client: kube::Client, seen: Arc<Mutex<Seen>>, stop: CancellationToken) {
    let api: Api<StatefulSet> = Api::all(client);
    let mut events = watcher(api, watcher::Config::default().labels(NAME_LABEL)).boxed();
    loop {
        let event = tokio::select! {
            () = stop.cancelled() => return,
            event = events.next() => event,
        };
        let Some(Ok(watcher::Event::Apply(set) | watcher::Event::InitApply(set))) = event else {
            continue;
        };
        let ns = set.metadata.namespace.clone().unwrap_or_default();
        if set.metadata.name.as_deref() != Some(ns.as_str()) {
            continue;
        }
        let spec = set.spec.clone().unwrap_or_default();
        let partition = spec
            .update_strategy
            .and_then(|strategy| strategy.rolling_update)
            .and_then(|rolling| rolling.partition)
            .unwrap_or(0);
        let mut seen = seen.lock().expect("seen");
        let sequences = seen.rollout.entry(ns).or_default();
        for (values, value) in [
            (&mut sequences.partitions, partition),
            (&mut sequences.replicas, spec.replicas.unwrap_or(1)),
        ] {
            if values.last() != Some(&value) {
                values.push(value);
            }
        }
    }
}

/// Records each LWS pod name's incarnations: how often, and from which revision, a group
/// was made again.
async fn watch_pods(client: kube::Client, seen: Arc<Mutex<Seen>>, stop: CancellationToken) {
    let api: Api<Pod> = Api::all(client);
    let mut events = watcher(api, watcher::Config::default().labels(NAME_LABEL)).boxed();
    loop {
        let event = tokio::select! {
            () = stop.cancelled() => return,
            event = events.next() => event,
        };
        let Some(Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod))) = event else {
            continue;
        };
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let key = pod
            .metadata
            .labels
            .as_ref()
            .and_then(|labels| labels.get(KEY_LABEL))
            .cloned()
            .unwrap_or_default();
        let mut seen = seen.lock().expect("seen");
        let incarnations = seen.pods.entry(ns).or_default().entry(name).or_default();
        if !incarnations.iter().any(|(known, _)| *known == uid) {
            incarnations.push((uid, key));
        }
    }
}

/// Whether the scenario's LWS rolls with surge groups.
fn surges(scenario: &Scenario) -> bool {
    scenario.steps.iter().any(|step| {
        let Step::Create(lws) = step else {
            return false;
        };
        let surge = &lws["spec"]["rolloutStrategy"]["rollingUpdateConfiguration"]["maxSurge"];
        !(surge.is_null() || *surge == json!(0) || *surge == json!("0%"))
    })
}

/// A snapshot whose partitions are said as where the rollout started, how high it went,
/// where it ended and whether it only went down after that. While surge groups run, the
/// partition may drop by more than `maxUnavailable` (upstream's rolling step counts the
/// surge), so how far each reconcile lowers it depends on how many groups became ready
/// since the last, under either controller.
fn surge_partitions(snapshot: &Value) -> Value {
    let mut snapshot = snapshot.clone();
    let partitions: Vec<i64> = snapshot["rollout"]["partitions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_i64)
        .collect();
    let highest = partitions.iter().copied().max();
    let after_highest = partitions
        .iter()
        .position(|p| Some(*p) == highest)
        .map_or(&[][..], |at| &partitions[at..]);
    snapshot["rollout"]["partitions"] = json!({
        "first": partitions.first(),
        "highest": highest,
        "last": partitions.last(),
        "onlyDownFromHighest": after_highest.windows(2).all(|pair| pair[1] <= pair[0]),
    });
    snapshot
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capstan_decides_as_upstream_lws_does() {
    if !common::on_real_server() {
        eprintln!("upstream's LWS runs on the real control plane only: nothing to compare here");
        return;
    }
    let scenarios = scenarios();
    // Upstream's manager is started (and built when the cache lacks it) before the clock of
    // any step runs.
    let (upstream, capstan) = tokio::join!(
        Side::start(System::Upstream, &scenarios),
        Side::start(System::Capstan, &scenarios)
    );
    let (upstream_side, capstan_side) = (&upstream, &capstan);
    let runs = futures::future::join_all(scenarios.iter().map(|scenario| async move {
        let (a, b) = tokio::join!(upstream_side.run(scenario), capstan_side.run(scenario));
        (scenario, a, b)
    }))
    .await;
    upstream.stop().await;
    capstan.stop().await;
    let dump = std::env::temp_dir().join("capstan-upstream-oracle-lws.json");
    let snapshots: Map<String, Value> = runs
        .iter()
        .map(|(scenario, a, b)| {
            (
                scenario.name.to_string(),
                json!({"upstream": a, "capstan": b}),
            )
        })
        .collect();
    if std::fs::write(
        &dump,
        serde_json::to_string_pretty(&snapshots).unwrap_or_default(),
    )
    .is_ok()
    {
        eprintln!("every snapshot, both sides: {}", dump.display());
    }

    let mut verdict = Verdict::new(NAMED);
    for (scenario, upstream, capstan) in runs {
        // Under surge, a partition drops by as many groups as were ready at each reconcile:
        // only its first, highest and last values, and that it only goes down, are compared.
        let (upstream, capstan): (Vec<Value>, Vec<Value>) = if surges(scenario) {
            (
                upstream.iter().map(surge_partitions).collect(),
                capstan.iter().map(surge_partitions).collect(),
            )
        } else {
            (upstream, capstan)
        };
        let steps: Vec<String> = scenario
            .steps
            .iter()
            .map(|step| format!("{step:?}"))
            .collect();
        verdict.scenario(scenario.name, &steps, &upstream, &capstan);
    }
    verdict.finish("upstream LWS 060ab4d");
}
