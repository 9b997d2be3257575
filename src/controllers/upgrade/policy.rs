//! Which `GitSync` governs a node: its upgrade policy (`maxNodesInFlight`,
//! `requirePullRequest`), whether it is writing a commit, the name its records are filed
//! under, and what it knows of the commit that asked for a move.
//!
//! A node follows the `GitSync` whose inventory holds the Node. A node no `GitSync` applies
//! follows the strictest of them all (the smallest `maxNodesInFlight`, `requirePullRequest`
//! if any sets it), and with no `GitSync` the defaults; for everything else it follows the
//! only `GitSync`, when there is one.

use std::collections::HashMap;
use std::sync::Arc;

use kube::ResourceExt as _;

use super::progress::Stamp;
use crate::history;
use crate::sync::inventory::DEFAULT_SYNC_NAME;
use capstan_api::{CommitRef, GitSync, UpgradePolicy};

/// The `GitSync`s, indexed by the nodes their inventories hold.
#[derive(Clone, Debug, Default)]
pub struct Policies {
    syncs: Vec<Arc<GitSync>>,
    /// Node name -> index in `syncs` of the first `GitSync` whose inventory holds it.
    owners: HashMap<String, usize>,
}

impl Policies {
    /// The policies of the `GitSync`s `cache` holds once it has listed them, else (capstan's
    /// kinds may not be served yet) from the API server; a cluster without the kind has no
    /// `GitSync`.
    pub async fn read(
        cache: &kube::runtime::reflector::Store<GitSync>,
        client: &kube::Client,
    ) -> Result<Policies, kube::Error> {
        use futures::FutureExt as _;
        if let Some(Ok(())) = cache.wait_until_ready().now_or_never() {
            return Ok(Policies::of(cache.state()));
        }
        let api: kube::Api<GitSync> =
            kube::Api::namespaced(client.clone(), capstan_api::capstan::SYSTEM_NAMESPACE);
        match api.list(&kube::api::ListParams::default()).await {
            Ok(list) => Ok(Policies::of(list.items.into_iter().map(Arc::new).collect())),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(Policies::of(Vec::new())),
            Err(err) => Err(err),
        }
    }

    /// The policies `syncs` set.
    pub fn of(syncs: Vec<Arc<GitSync>>) -> Policies {
        let mut owners = HashMap::new();
        for (index, sync) in syncs.iter().enumerate() {
            for entry in sync.status.iter().flat_map(|status| &status.inventory) {
                if entry.kind == "Node" && entry.api_version == "v1" {
                    owners.entry(entry.name.clone()).or_insert(index);
                }
            }
        }
        Policies { syncs, owners }
    }

    /// The `GitSync` that applies `node`: its owner, else the only one.
    pub fn sync_for(&self, node: &str) -> Option<&GitSync> {
        match self.owners.get(node) {
            Some(index) => self.syncs.get(*index).map(Arc::as_ref),
            None if self.syncs.len() == 1 => self.syncs.first().map(Arc::as_ref),
            None => None,
        }
    }

    /// The policy that governs `node`: its owner's; for a node no `GitSync` applies, the
    /// strictest of them all; with no `GitSync`, the defaults.
    pub fn policy_for(&self, node: &str) -> UpgradePolicy {
        if let Some(index) = self.owners.get(node) {
            return self
                .syncs
                .get(*index)
                .map(|sync| policy_of(sync))
                .unwrap_or_default();
        }
        self.syncs
            .iter()
            .map(|sync| policy_of(sync))
            .reduce(|a, b| UpgradePolicy {
                max_nodes_in_flight: a.max_nodes_in_flight.min(b.max_nodes_in_flight),
                require_pull_request: a.require_pull_request || b.require_pull_request,
                ..a
            })
            .unwrap_or_default()
    }

    /// Whether the sync that applies `node` is writing a commit.
    pub fn applying(&self, node: &str) -> bool {
        self.sync_for(node).is_some_and(applying)
    }

    /// The name records of `node` are filed under.
    pub fn sync_name(&self, node: &str) -> String {
        self.sync_for(node)
            .map_or(DEFAULT_SYNC_NAME.to_string(), |sync| sync.name_any())
    }

    /// The commit of a step or wait on `node`, from the node's stamps, with author, time and
    /// subject when the `GitSync` that applies the node still lists it among its commits.
    pub fn commit_of(&self, node: &str, stamp: &Stamp) -> CommitRef {
        let mut commit = history::commit_ref_of_stamp(
            stamp.revision.as_deref().unwrap_or(""),
            stamp.pull_request,
        );
        let known = self.sync_for(node).and_then(|sync| {
            let status = sync.status.as_ref()?;
            status
                .last_applied_commit
                .iter()
                .chain(&status.last_attempted_commit)
                .chain(status.runs.iter().map(|run| &run.commit))
                .find(|known| !commit.sha.is_empty() && known.sha == commit.sha)
                .cloned()
        });
        if let Some(known) = known {
            commit.author = known.author;
            commit.time = known.time;
            commit.subject = known.subject;
        }
        commit
    }
}

/// The policy a `GitSync`'s status carries, the defaults before its first apply.
fn policy_of(sync: &GitSync) -> UpgradePolicy {
    sync.status
        .as_ref()
        .and_then(|status| status.policy.clone())
        .unwrap_or_default()
}

/// Whether a `GitSync` is writing a commit.
pub fn applying(sync: &GitSync) -> bool {
    sync.status
        .as_ref()
        .is_some_and(|status| status.phase == "Applying")
}

/// What of a `GitSync` the nodes wait on: its policy, and whether it is writing a commit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SyncState {
    /// `status.policy`.
    pub policy: Option<UpgradePolicy>,
    /// The `GitSync` is `Applying`.
    pub applying: bool,
}

impl SyncState {
    /// The state of `sync`.
    pub fn of(sync: &GitSync) -> SyncState {
        SyncState {
            policy: sync
                .status
                .as_ref()
                .and_then(|status| status.policy.clone()),
            applying: applying(sync),
        }
    }
}

/// Whether a change of a `GitSync` from `previous` (`None`: first seen) to `now` calls for
/// a look at every node: a new or changed policy may free or take slots, and moves wait for
/// the sync to finish writing a commit (see [`super::Gate::sync_applying`]).
pub fn wakes_every_node(previous: Option<&SyncState>, now: &SyncState) -> bool {
    match previous {
        None => true,
        Some(previous) => previous.policy != now.policy || (previous.applying && !now.applying),
    }
}

/// `, asked by 3cf3bea (#42)`, or nothing for an unstamped node.
pub fn asked_by(commit: &CommitRef) -> String {
    match (commit.short_sha.is_empty(), commit.pull_request) {
        (true, _) => String::new(),
        (false, Some(pr)) => format!(", asked by {} (#{pr})", commit.short_sha),
        (false, None) => format!(", asked by {}", commit.short_sha),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use capstan_api::capstan::{GitSyncSpec, GitSyncStatus, InventoryEntry, SyncRun};

    fn policy(max: u32, require_pull_request: bool) -> UpgradePolicy {
        UpgradePolicy {
            max_nodes_in_flight: max,
            require_pull_request,
            ..UpgradePolicy::default()
        }
    }

    /// A `GitSync` named `name` that applied `nodes`, under `policy`.
    fn sync(name: &str, nodes: &[&str], policy: Option<UpgradePolicy>) -> Arc<GitSync> {
        let mut sync = GitSync::new(name, GitSyncSpec::default());
        sync.status = Some(GitSyncStatus {
            inventory: nodes
                .iter()
                .map(|node| InventoryEntry {
                    api_version: "v1".into(),
                    kind: "Node".into(),
                    namespace: None,
                    name: node.to_string(),
                    digest: String::new(),
                })
                .collect(),
            policy,
            ..GitSyncStatus::default()
        });
        Arc::new(sync)
    }

    #[test]
    fn the_policy_that_governs_a_node() {
        let fleet = || {
            vec![
                sync("fleet", &["worker-1"], Some(policy(3, false))),
                sync("gpus", &["gpu-1"], Some(policy(1, true))),
            ]
        };
        // (name, GitSyncs, node, want)
        let rows = [
            (
                "no GitSync: the defaults",
                vec![],
                "worker-1",
                UpgradePolicy::default(),
            ),
            (
                "the GitSync whose inventory holds the node",
                fleet(),
                "worker-1",
                policy(3, false),
            ),
            ("another owner", fleet(), "gpu-1", policy(1, true)),
            (
                "a node no GitSync applies: the strictest of them",
                fleet(),
                "worker-9",
                policy(1, true),
            ),
            (
                "an owner without a policy yet: the defaults",
                vec![sync("fleet", &["worker-1"], None)],
                "worker-1",
                UpgradePolicy::default(),
            ),
            (
                "one GitSync that does not hold the node: its policy",
                vec![sync("fleet", &[], Some(policy(2, true)))],
                "worker-1",
                policy(2, true),
            ),
        ];
        for (name, syncs, node, want) in rows {
            assert_eq!(Policies::of(syncs).policy_for(node), want, "{name}");
        }
    }

    #[test]
    fn the_sync_a_node_is_filed_under() {
        let two = Policies::of(vec![
            sync("fleet", &["worker-1"], None),
            sync("gpus", &["gpu-1"], None),
        ]);
        let one = Policies::of(vec![sync("fleet", &[], None)]);
        // (name, policies, node, want)
        let rows = [
            ("the owner", &two, "gpu-1", "gpus"),
            (
                "no owner among several: the default name",
                &two,
                "worker-9",
                DEFAULT_SYNC_NAME,
            ),
            ("the only GitSync", &one, "worker-9", "fleet"),
            (
                "no GitSync",
                &Policies::default(),
                "worker-1",
                DEFAULT_SYNC_NAME,
            ),
        ];
        for (name, policies, node, want) in rows {
            assert_eq!(policies.sync_name(node), want, "{name}");
        }
    }

    #[test]
    fn a_node_waits_on_the_sync_that_applies_it() {
        let mut writing = (*sync("fleet", &["worker-1"], None)).clone();
        if let Some(status) = writing.status.as_mut() {
            status.phase = "Applying".into();
        }
        let policies = Policies::of(vec![Arc::new(writing), sync("gpus", &["gpu-1"], None)]);
        assert!(policies.applying("worker-1"));
        assert!(!policies.applying("gpu-1"));
        assert!(!policies.applying("worker-9"), "no sync applies it");
    }

    #[test]
    fn the_commit_of_a_move_is_completed_from_the_sync() {
        let sha = "3cf3bea0000000000000000000000000000000aa";
        let known = CommitRef {
            sha: sha.into(),
            short_sha: "3cf3bea".into(),
            revision: format!("main@sha1:{sha}"),
            author: "Ada".into(),
            time: "2026-11-21T10:00:00Z".into(),
            subject: "Move worker-1 to v2".into(),
            pull_request: Some(12),
        };
        let mut listed = (*sync("fleet", &["worker-1"], None)).clone();
        if let Some(status) = listed.status.as_mut() {
            status.runs = vec![SyncRun {
                commit: known.clone(),
                result: "Applied".into(),
                ..SyncRun::default()
            }];
        }
        let policies = Policies::of(vec![Arc::new(listed)]);
        let stamp = |revision: Option<String>, pull_request| Stamp {
            revision,
            pull_request,
        };
        // (name, stamp, want author, want short sha)
        let rows = [
            (
                "a commit the sync lists: author, time and subject added",
                stamp(Some(format!("main@sha1:{sha}")), Some(12)),
                "Ada",
                "3cf3bea",
            ),
            (
                "a commit it no longer lists: the stamps only",
                stamp(Some(format!("main@sha1:{}", "b".repeat(40))), None),
                "",
                "bbbbbbb",
            ),
            (
                "an unstamped node: an empty commit",
                stamp(None, None),
                "",
                "",
            ),
        ];
        for (name, stamp, author, short_sha) in rows {
            let commit = policies.commit_of("worker-1", &stamp);
            assert_eq!(
                (commit.author.as_str(), commit.short_sha.as_str()),
                (author, short_sha),
                "{name}"
            );
            assert_eq!(commit.pull_request, stamp.pull_request, "{name}");
        }
        assert_eq!(
            policies.commit_of("worker-1", &stamp(known.revision.clone().into(), Some(12))),
            known
        );
    }

    #[test]
    fn sync_changes_that_wake_every_node() {
        let state = |max: Option<u32>, applying| SyncState {
            policy: max.map(|max| policy(max, false)),
            applying,
        };
        // (name, previous, now, wakes)
        let rows = [
            ("first seen", None, state(Some(1), false), true),
            (
                "nothing changed",
                Some(state(Some(1), false)),
                state(Some(1), false),
                false,
            ),
            (
                "the policy changed",
                Some(state(Some(1), false)),
                state(Some(2), false),
                true,
            ),
            (
                "a first policy",
                Some(state(None, true)),
                state(Some(1), true),
                true,
            ),
            (
                "the sync finished a commit",
                Some(state(Some(1), true)),
                state(Some(1), false),
                true,
            ),
            (
                "the sync started a commit",
                Some(state(Some(1), false)),
                state(Some(1), true),
                false,
            ),
        ];
        for (name, previous, now, wakes) in rows {
            assert_eq!(wakes_every_node(previous.as_ref(), &now), wakes, "{name}");
        }
    }
}
