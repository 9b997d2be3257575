//! `capstan plan` offline (base -> head) and live (cluster -> head) say the same thing about
//! every LeaderWorkerSet and every node when the cluster runs base: a base is synced with
//! capstan's LWS controller running and rolled out, both plans of one change are made, and
//! then the change is merged and synced to check that the groups do what the plans said.
//!
//! The reported case is the first: an image change while the LWS still runs the revision
//! made when it was created. The leader and worker StatefulSets' own ControllerRevisions
//! carry the LWS's name and revision-key labels and are numbered from 1 like the LWS's;
//! the live plan once took one of them for the revision the groups run, and said
//! `noRollout` where the merge rolled every group.

use crate::common;
use crate::fleet::{fleet_v1, fleet_v2};

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use capstan::controllers::{self, Context};
use capstan::sync::plan::{self, LeaderWorkerSetAction, Plan, PlanInput};
use capstan::sync::run::{Outcome, Syncer};
use capstan::sync::source::{Auth, Source};
use capstan_api::LeaderWorkerSet;
use common::git::FleetRepo;
use futures::StreamExt as _;
use k8s_openapi::api::apps::v1::{ControllerRevision, StatefulSet};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt as _;
use kube::api::{Api, ListParams};
use kube::runtime::{WatchStreamExt as _, watcher};
use tokio_util::sync::CancellationToken;

const NS: &str = "inference";
const NAME_LABEL: &str = "leaderworkerset.sigs.k8s.io/name";
const KEY_LABEL: &str = "leaderworkerset.sigs.k8s.io/template-revision-hash";
const NAMESPACE: &str = "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: inference\n";
/// The example fleet's LeaderWorkerSet: one group of two on `registry.example/vllm:v1`.
const EXAMPLE: &str = include_str!("../../examples/repo/workloads/vllm.yaml");

/// LeaderWorkerSet `inference/vllm`: `replicas` groups of `size` pods on `image`, with
/// `extra` lines added to its spec (indented by two).
fn vllm(replicas: i32, size: i32, image: &str, extra: &str) -> String {
    format!(
        "apiVersion: leaderworkerset.x-k8s.io/v1\nkind: LeaderWorkerSet\n\
         metadata:\n  name: vllm\n  namespace: {NS}\nspec:\n  replicas: {replicas}\n\
         {extra}  leaderWorkerTemplate:\n    size: {size}\n    workerTemplate:\n      \
         spec:\n        containers:\n          - name: vllm\n            \
         image: registry.example/vllm:{image}\n"
    )
}

/// The files of a fleet: my-kmod on worker-1 and worker-2 (`fleet_v1`, or `fleet_v2` with
/// worker-1 moved), the namespace and `workload` as `vllm.yaml`.
fn fleet(nodes: Vec<(&'static str, String)>, workload: &str) -> Vec<(&'static str, String)> {
    let mut files = nodes;
    files.push(("inference.yaml", NAMESPACE.to_string()));
    files.push(("vllm.yaml", workload.to_string()));
    files
}

/// A cluster running capstan's LWS controller, synced from `main` of a repository.
struct Synced {
    cluster: common::TestCluster,
    client: kube::Client,
    repo: FleetRepo,
    syncer: Syncer,
    stop: CancellationToken,
    controller: tokio::task::JoinHandle<()>,
    /// The commit the cluster runs.
    applied: String,
}

impl Synced {
    /// The default cluster with the LWS controller, `commits` merged into `main` in turn,
    /// each synced and rolled out before the next.
    async fn start(commits: &[Vec<(&'static str, String)>]) -> Synced {
        let (cluster, client) = common::start_default_simulated().await;
        let stop = CancellationToken::new();
        let ctx = Context::new(client.clone(), stop.clone());
        let controller = tokio::spawn(async move {
            controllers::run(ctx, &"lws".parse().expect("selection")).await;
        });
        let mut repo = FleetRepo::new();
        let (first, rest) = commits.split_first().expect("a base");
        let applied = repo.commit_set(first, "Initial fleet");
        let syncer = common::syncer(&client, repo.path()).await;
        let mut synced = Synced {
            cluster,
            client,
            repo,
            syncer,
            stop,
            controller,
            applied,
        };
        let base = synced.applied.clone();
        synced.sync(&base).await;
        for files in rest {
            let sha = synced.commit(files);
            synced.sync(&sha).await;
        }
        synced
    }

    /// Commits `files` on `main`, not synced yet; returns the SHA.
    fn commit(&mut self, files: &[(&'static str, String)]) -> String {
        self.repo.commit_set(files, "Change the fleet")
    }

    /// Syncs `main`, which must be at `sha`, and waits until vllm runs it.
    async fn sync(&mut self, sha: &str) {
        match self.syncer.sync().await.expect("sync") {
            Outcome::Applied(report) => {
                let commit = report.commit.expect("the applied commit");
                assert_eq!(commit.sha, sha, "the sync applies main's tip");
            }
            other => panic!("the sync applies {sha}: {other:?}"),
        }
        self.applied = sha.to_string();
        rolled_out(&self.client).await;
    }

    /// The offline plan (the applied commit -> `head`) and the live one (the cluster ->
    /// `head`) of commit `head`.
    async fn plans(&self, head: &str) -> (Plan, Plan) {
        let state = tempfile::tempdir().expect("tempdir");
        let source = Source::open_allowing_new_path(
            self.repo.path().to_str().expect("utf-8"),
            "main",
            None,
            state.path(),
            Auth::None,
        )
        .expect("the repository opens");
        let base = source.resolve(&self.applied).expect("base");
        let head = source.resolve(head).expect("head");
        let input = PlanInput::read(&source, base, head, None).expect("both commits read");
        let offline = plan::offline(&input);
        let live = plan::live(&input, &self.client, "capstan", Default::default())
            .await
            .expect("a live plan");
        for plan in [&offline, &live] {
            assert!(plan.errors.is_empty(), "{}", plan::render_text(plan, false));
        }
        (offline, live)
    }

    async fn stop(self) {
        self.stop.cancel();
        tokio::time::timeout(common::DEADLINE, self.controller)
            .await
            .expect("the LWS controller stops on shutdown")
            .expect("the LWS controller ends cleanly");
        self.cluster.shutdown().await;
    }
}

/// Waits until vllm has rolled out its spec: observed, Available, every group ready and
/// on its current revision, the leader StatefulSet at rest (partition 0) and one revision
/// left of the LWS's own.
async fn rolled_out(client: &kube::Client) {
    let lwss = Api::<LeaderWorkerSet>::namespaced(client.clone(), NS);
    let sets = Api::<StatefulSet>::namespaced(client.clone(), NS);
    common::wait_for("vllm rolled out", async || {
        let lws = lwss.get("vllm").await.map_err(|err| err.to_string())?;
        let status = lws.status.clone().unwrap_or_default();
        let replicas = lws.spec.replicas;
        let available = status
            .conditions
            .iter()
            .any(|c| c.type_ == "Available" && c.status == "True");
        let settled = available
            && status.observed_generation == lws.metadata.generation.unwrap_or(0)
            && status.ready_replicas == replicas
            && status.updated_replicas == replicas
            && status.replicas == replicas;
        let partition = sets
            .get_opt("vllm")
            .await
            .map_err(|err| err.to_string())?
            .and_then(|set| set.spec?.update_strategy?.rolling_update?.partition);
        let revisions = own_revisions(client).await.len();
        if settled && partition.unwrap_or(0) == 0 && revisions == 1 {
            Ok(())
        } else {
            Err(format!(
                "{status:?}, leader partition {partition:?}, {revisions} revisions"
            ))
        }
    })
    .await;
}

/// The LWS's own revisions (its StatefulSets' carry its name label too).
async fn own_revisions(client: &kube::Client) -> Vec<ControllerRevision> {
    Api::<ControllerRevision>::namespaced(client.clone(), NS)
        .list(&ListParams::default().labels(&format!("{NAME_LABEL}=vllm")))
        .await
        .expect("revisions")
        .items
        .into_iter()
        .filter(|revision| {
            revision
                .owner_references()
                .iter()
                .any(|owner| owner.kind == "LeaderWorkerSet" && owner.controller == Some(true))
        })
        .collect()
}

/// Both plans say the same about every LeaderWorkerSet (and its warnings) and every node;
/// returns the LWS change they agree on, if any.
fn assert_agree(offline: &Plan, live: &Plan) -> Option<plan::LeaderWorkerSetChange> {
    let shown = || {
        format!(
            "offline:\n{}\nlive:\n{}",
            plan::render_text(offline, false),
            plan::render_text(live, false)
        )
    };
    assert_eq!(
        offline.leader_worker_sets,
        live.leader_worker_sets,
        "LeaderWorkerSets\n{}",
        shown()
    );
    let lws_warnings = |plan: &Plan| -> Vec<String> {
        plan.warnings
            .iter()
            .filter(|warning| warning.starts_with("LeaderWorkerSet "))
            .cloned()
            .collect()
    };
    assert_eq!(lws_warnings(offline), lws_warnings(live), "{}", shown());
    assert_eq!(offline.nodes, live.nodes, "nodes\n{}", shown());
    assert!(
        offline.leader_worker_sets.len() <= 1,
        "one LWS: {:?}",
        offline.leader_worker_sets
    );
    offline.leader_worker_sets.first().cloned()
}

/// The group leaders of vllm, by group: their UID and revision key.
async fn leaders(client: &kube::Client) -> BTreeMap<String, (String, String)> {
    Api::<Pod>::namespaced(client.clone(), NS)
        .list(&ListParams::default().labels(&format!(
            "{NAME_LABEL}=vllm,leaderworkerset.sigs.k8s.io/worker-index=0"
        )))
        .await
        .expect("leader pods")
        .items
        .into_iter()
        .map(|pod| {
            let key = pod.labels().get(KEY_LABEL).cloned().unwrap_or_default();
            (pod.name_any(), (pod.uid().unwrap_or_default(), key))
        })
        .collect()
}

/// Every partition the leader StatefulSet vllm is given from now on, as a watch sees
/// each write.
struct Partitions {
    seen: Arc<Mutex<Vec<i32>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Partitions {
    fn follow(client: &kube::Client) -> Partitions {
        let api: Api<StatefulSet> = Api::namespaced(client.clone(), NS);
        let config = watcher::Config::default().fields("metadata.name=vllm");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let into = seen.clone();
        let task = tokio::spawn(async move {
            let mut stream = watcher(api, config).applied_objects().boxed();
            while let Some(Ok(set)) = stream.next().await {
                let partition = set
                    .spec
                    .and_then(|spec| spec.update_strategy?.rolling_update?.partition)
                    .unwrap_or(0);
                let mut seen = into.lock().expect("partitions");
                if seen.last() != Some(&partition) {
                    seen.push(partition);
                }
            }
        });
        Partitions { seen, task }
    }

    fn seen(&self) -> Vec<i32> {
        self.seen.lock().expect("partitions").clone()
    }
}

impl Drop for Partitions {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Merges `head` (synced until rolled out) and checks that vllm's groups did what the
/// plans said of `change`: a rollout recreates every group on a new revision, moving the
/// leader StatefulSet's partition down step by step in the plan's order; anything else
/// keeps every group and its revision, only adding or removing groups.
async fn merge_as_planned(
    synced: &mut Synced,
    head: &str,
    change: Option<&plan::LeaderWorkerSetChange>,
) {
    let before = leaders(&synced.client).await;
    let key_before = own_revisions(&synced.client).await[0].labels()[KEY_LABEL].clone();
    let partitions = Partitions::follow(&synced.client);
    common::wait_until(
        "the partition watch sees the leader StatefulSet",
        async || !partitions.seen().is_empty(),
    )
    .await;
    synced.sync(head).await;
    let after = leaders(&synced.client).await;
    let key_after = own_revisions(&synced.client).await[0].labels()[KEY_LABEL].clone();
    let replicas = change
        .and_then(|change| change.replicas.to)
        .unwrap_or(before.len() as i32);
    assert_eq!(after.len(), replicas as usize, "{after:?}");
    let rolls = change.is_some_and(|change| change.change == LeaderWorkerSetAction::Rolls);
    if rolls {
        let rollout = change
            .and_then(|change| change.rollout.as_ref())
            .expect("a planned rollout");
        assert_ne!(key_after, key_before, "a rollout makes a new revision");
        for (leader, (uid, key)) in &after {
            assert_eq!(key, &key_after, "{leader} runs the new revision");
            let old_uid = before.get(leader).map(|(uid, _)| uid);
            assert_ne!(Some(uid), old_uid, "{leader} was recreated");
        }
        // From rest, the update holds every group (partition R), then lowers the
        // partition to the lowest group of each step in turn.
        if rollout.new_groups.is_empty() && rollout.surge_groups.is_empty() {
            let mut expected = vec![0, replicas];
            expected.extend(
                rollout
                    .order
                    .iter()
                    .map(|step| *step.iter().min().expect("a step has groups")),
            );
            assert_eq!(
                partitions.seen(),
                expected,
                "the groups rolled in the planned steps {:?}",
                rollout.order
            );
        }
    } else {
        assert_eq!(key_after, key_before, "no new revision");
        for (leader, kept) in &after {
            if let Some(old) = before.get(leader) {
                assert_eq!(kept, old, "{leader} is kept, on its revision");
            }
        }
        assert_eq!(partitions.seen(), [0], "no group rolled");
    }
}

/// The reported case: the example's vllm, one group, still on the revision made when it
/// was created; its image changes.
#[tokio::test(flavor = "multi_thread")]
async fn an_image_change_on_the_creation_revision_rolls_in_both_plans() {
    let mut synced = Synced::start(&[fleet(fleet_v1(), EXAMPLE)]).await;
    assert_eq!(own_revisions(&synced.client).await[0].revision, 1);
    let head = synced.commit(&fleet(fleet_v1(), &EXAMPLE.replace("vllm:v1", "vllm:v2")));
    let (offline, live) = synced.plans(&head).await;
    let change = assert_agree(&offline, &live).expect("vllm changes");
    assert_eq!(change.change, LeaderWorkerSetAction::Rolls, "{change:?}");
    assert_eq!(change.changed_fields, ["leaderWorkerTemplate"]);
    assert_eq!(
        change.rollout.as_ref().map(|r| r.order.clone()),
        Some(vec![vec![0]])
    );
    merge_as_planned(&mut synced, &head, Some(&change)).await;
    synced.stop().await;
}

/// An image change on a LWS that has rolled out once already (its revision 2), three
/// groups: both plans roll them from the highest down, one at a time.
#[tokio::test(flavor = "multi_thread")]
async fn an_image_change_after_a_rollout_rolls_group_by_group_in_both_plans() {
    let mut synced = Synced::start(&[
        fleet(fleet_v1(), &vllm(3, 2, "v1", "")),
        fleet(fleet_v1(), &vllm(3, 2, "v2", "")),
    ])
    .await;
    assert_eq!(own_revisions(&synced.client).await[0].revision, 2);
    let head = synced.commit(&fleet(fleet_v1(), &vllm(3, 2, "v3", "")));
    let (offline, live) = synced.plans(&head).await;
    let change = assert_agree(&offline, &live).expect("vllm changes");
    assert_eq!(change.change, LeaderWorkerSetAction::Rolls, "{change:?}");
    assert_eq!(
        change.rollout.as_ref().map(|r| r.order.clone()),
        Some(vec![vec![2], vec![1], vec![0]])
    );
    merge_as_planned(&mut synced, &head, Some(&change)).await;
    synced.stop().await;
}

/// More groups of more pods: a new template (size) and more replicas roll every group and
/// add one, in both plans.
#[tokio::test(flavor = "multi_thread")]
async fn a_size_and_replicas_change_rolls_and_adds_groups_in_both_plans() {
    let mut synced = Synced::start(&[fleet(fleet_v1(), &vllm(2, 2, "v1", ""))]).await;
    let head = synced.commit(&fleet(fleet_v1(), &vllm(3, 3, "v1", "")));
    let (offline, live) = synced.plans(&head).await;
    let change = assert_agree(&offline, &live).expect("vllm changes");
    assert_eq!(change.change, LeaderWorkerSetAction::Rolls, "{change:?}");
    assert_eq!(change.changed_fields, ["replicas", "leaderWorkerTemplate"]);
    let rollout = change.rollout.as_ref().expect("a rollout");
    assert_eq!(rollout.new_groups, [2]);
    merge_as_planned(&mut synced, &head, Some(&change)).await;
    synced.stop().await;
}

/// More replicas, another rollout strategy and a label: no revision, so no rollout in
/// either plan, and the merge keeps every group; a node moving to another Module version
/// in the same change is the same move in both plans.
#[tokio::test(flavor = "multi_thread")]
async fn a_change_outside_the_revision_rolls_nothing_in_both_plans() {
    let mut synced = Synced::start(&[fleet(fleet_v1(), &vllm(2, 2, "v1", ""))]).await;
    let strategy = "  rolloutStrategy:\n    type: RollingUpdate\n    \
                    rollingUpdateConfiguration: {maxUnavailable: 2}\n";
    let labelled = vllm(3, 2, "v1", strategy).replace(
        "  namespace: inference\n",
        "  namespace: inference\n  labels: {team: inference}\n",
    );
    let head = synced.commit(&fleet(fleet_v2(), &labelled));
    let (offline, live) = synced.plans(&head).await;
    let change = assert_agree(&offline, &live).expect("vllm changes");
    assert_eq!(
        change.change,
        LeaderWorkerSetAction::NoRollout,
        "{change:?}"
    );
    assert_eq!(
        change.changed_fields,
        ["replicas", "rolloutStrategy", "metadata"]
    );
    let moves: Vec<(&str, Option<&str>)> = offline
        .nodes
        .iter()
        .map(|node| (node.node.as_str(), node.to.as_deref()))
        .collect();
    assert_eq!(moves, [("worker-1", Some("v2"))]);
    merge_as_planned(&mut synced, &head, Some(&change)).await;
    synced.stop().await;
}
