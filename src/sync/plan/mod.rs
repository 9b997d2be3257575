//! `capstan plan`: what merging a change will do, before the merge.
//!
//! A plan compares head (by default the checked-out commit) with base (by default where
//! head left the tracked branch). Offline ([`offline`]), it compares the desired state of
//! the two commits and needs no cluster; live ([`live`]), it compares head with the
//! cluster through server-side apply dry runs and prunes from the `GitSync` inventory.
//! Either way it reports head's validation errors (those of [`load`] and
//! [`check_transition`] from base), the objects that change with their diffs (Secret
//! values masked), every node whose Module version labels move with the ordered-upgrade
//! steps it goes through (seed 002), in rollout order and waves of `maxNodesInFlight`,
//! what head does to each LeaderWorkerSet's groups ([`lws`]: whether they roll, in which
//! order), and the `requirePullRequest` check. Live, a node a campaign drains also lists
//! the pods the drain evicts and the LeaderWorkerSet groups it recreates. Base's own
//! errors are not the plan's concern: an invalid base is compared as an empty one, with a
//! warning.
//!
//! [`render_text`], [`render_markdown`] and [`render_json`] print it; [`Plan::exit_code`]
//! follows Terraform's `-detailed-exitcode`.

mod guardrails;
mod live;
mod lws;
mod model;
mod offline;
mod policy;
pub(crate) mod render;
mod steps;

use std::collections::BTreeSet;

pub use model::{
    CheckStatus, ClusterState, Commit, DrainPreview, Estimate, ForcedAfter, LeaderWorkerSetAction,
    LeaderWorkerSetChange, Mode, NodeMove, ObjectAction, ObjectChange, ObjectRef, Plan,
    PlannedCampaign, PlannedGate, PlannedGuardrails, PlannedRollout, PlannedStep, Policy,
    PullRequestCheck, ReplicasChange, SCHEMA_VERSION, Summary,
};
pub use render::{COMMENT_LIMIT, render_json, render_markdown, render_text, summary_line};

use crate::sync::diff::DiffError;
use crate::sync::discovery::ClusterKinds;
use crate::sync::follow;
use crate::sync::inventory::{Inventory, id_of, inventory_of, read_sync};
use crate::sync::manifests::Manifest;
use crate::sync::manifests::{
    Catalog, DesiredState, ManifestError, ManifestFile, Settings, StaticCatalog, check_transition,
    is_node, load,
};
use crate::sync::mask;
use crate::sync::reach;
use crate::sync::source::{CommitInfo, ReadBudget, RepoFile, Source, SourceError, redact_url};
use capstan_api::UpgradeConfig;
use kube::Resource as _;
use render::plural;
use steps::{LabelMove, declared_version_labels, label_moves};

/// Why no plan could be made (head's validation errors are not this: they are in the plan).
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// Head's files cannot be read (the path is missing, a symlink leads out, a file is
    /// too large).
    #[error("head commit {commit}: {source}")]
    Head {
        /// Short SHA of head.
        commit: String,
        #[source]
        source: SourceError,
    },
    /// A live object cannot be read for a diff.
    #[error(transparent)]
    Diff(#[from] DiffError),
    /// Any other request to the cluster failed.
    #[error("{what}: {source}")]
    Cluster {
        /// What was being read.
        what: String,
        #[source]
        source: kube::Error,
    },
}

/// How a live plan reads the cluster.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LiveOptions {
    /// Dry-run every object head declares (`capstan plan --full`), as `kubectl diff
    /// --server-side` does, rather than only those the inventory and the live objects do
    /// not show unchanged.
    pub full: bool,
}

/// The two commits a plan compares, with their files read from Git.
pub struct PlanInput {
    /// The repository, as messages name it.
    pub repository: String,
    /// The tracked branch.
    pub branch: String,
    /// The synced path ("" for the root).
    pub path: String,
    /// The commit compared with.
    pub base: CommitInfo,
    /// The commit planned.
    pub head: CommitInfo,
    /// The pull request the plan is for, when the caller knows it (a CI checkout's merge
    /// commit does not name it).
    pub pull_request: Option<u64>,
    base_files: Result<Vec<RepoFile>, SourceError>,
    /// Head's files, or the problem of its content that rejects it whole (a file or the
    /// commit over its budget, a symlink out of the repository).
    head_files: Result<Vec<RepoFile>, ManifestError>,
}

impl PlanInput {
    /// Reads the files of both commits under the source's path.
    ///
    /// Fails when head's files cannot be read; base's may not (a path that base does not
    /// have yet is an empty base).
    pub fn read(
        source: &Source,
        base: CommitInfo,
        head: CommitInfo,
        pull_request: Option<u64>,
    ) -> Result<PlanInput, PlanError> {
        let head_files = match source.files_at(&head.sha, &ReadBudget::COMMIT) {
            Ok(files) => Ok(files),
            Err(error) => match error.in_commit() {
                Some((file, message)) => Err(ManifestError::new(file, None, None, message)),
                None => {
                    return Err(PlanError::Head {
                        commit: head.short_sha().to_string(),
                        source: error,
                    });
                }
            },
        };
        Ok(PlanInput {
            repository: redact_url(source.location()),
            branch: source.branch().to_string(),
            path: source.path().to_string(),
            base_files: source.files_at(&base.sha, &ReadBudget::COMMIT),
            base,
            head,
            pull_request,
            head_files,
        })
    }
}

/// Head against base, without a cluster; kinds are checked against [`StaticCatalog`].
pub fn offline(input: &PlanInput) -> Plan {
    let states = States::load(input, &StaticCatalog::new());
    let mut findings = Findings::from(&states);
    let Some(head) = &states.head else {
        return assemble(input, Mode::Offline, None, &Settings::default(), findings);
    };
    let base = &states.base.manifests;
    findings.objects = offline::changes(base, &head.manifests);
    let departed = offline::departed(base, &head.manifests);
    let mut before = declared_version_labels(base);
    if head.settings.prune {
        findings
            .objects
            .extend(departed.into_iter().map(offline::departure));
    } else {
        findings.keep(departed.iter().map(|m| m.id().to_string()).collect());
        // Nodes that are not released keep their labels.
        let kept: BTreeSet<&str> = departed
            .iter()
            .filter(|m| is_node(m))
            .map(|m| m.name.as_str())
            .collect();
        before.retain(|(node, _), _| !kept.contains(node.as_str()));
    }
    findings.moves = label_moves(&before, &declared_version_labels(&head.manifests));
    findings.campaigns = campaigns_in(&head.manifests);
    let (leader_worker_sets, warnings) = lws::offline(base, &head.manifests, &findings.objects);
    findings.leader_worker_sets = leader_worker_sets;
    findings.warnings.extend(warnings);
    let mut plan = assemble(input, Mode::Offline, None, &head.settings, findings);
    guardrails::apply(
        &mut plan.nodes,
        &mut plan.policy,
        &head.settings.rollout.policy(),
        &[],
        jiff::Timestamp::now(),
    );
    let objects = base.iter().chain(&head.manifests).map(|m| &m.object);
    scrub(&mut plan, &mask::Scrub::of(objects));
    plan
}

/// A last pass over the texts of `plan` that may quote a value: the errors and warnings
/// scrubbed of every Secret value; the diffs, masked object by object when made ([`mask`]),
/// only of the last-applied annotation (scrubbing one object's diff of another's values
/// would mask unrelated words).
fn scrub(plan: &mut Plan, scrub: &mask::Scrub) {
    let annotation_only = mask::Scrub::default();
    for object in &mut plan.objects {
        object.diff = annotation_only.text(&object.diff);
    }
    for error in &mut plan.errors {
        error.message = scrub.text(&error.message);
    }
    for warning in &mut plan.warnings {
        *warning = scrub.text(warning);
    }
}

/// Head against the live cluster behind `client`: kinds from its discovery, objects by
/// server-side apply dry runs of head's objects as sync would stamp them, pruning from
/// the inventory of the `GitSync` named `sync_name`, node moves from the live labels.
///
/// An object whose manifest is the one capstan last applied (the inventory's digest) and
/// whose live fields are as it set them (one list per kind) is unchanged without a dry
/// run, as the sync judges it; `options.full` dry-runs every object.
///
/// Fails when the cluster cannot be reached or read; objects the API server refuses are
/// errors in the plan, at their manifests.
pub async fn live(
    input: &PlanInput,
    client: &kube::Client,
    sync_name: &str,
    options: LiveOptions,
) -> Result<Plan, PlanError> {
    let cluster_error = |what: &str| {
        let what = what.to_string();
        move |source| PlanError::Cluster { what, source }
    };
    let kinds = ClusterKinds::discover(client)
        .await
        .map_err(cluster_error("discovering the kinds the cluster serves"))?;
    let sync = read_sync(client, sync_name)
        .await
        .map_err(cluster_error(&format!("reading GitSync {sync_name}")))?;
    let mut cluster = ClusterState {
        sync: sync_name.to_string(),
        found: sync.is_some(),
        unchanged: 0,
        full: options.full,
        last_applied_revision: sync
            .as_ref()
            .and_then(|s| s.status.as_ref())
            .and_then(|status| status.last_applied_commit.as_ref())
            .map(|commit| commit.revision.clone()),
    };
    let states = States::load(input, &kinds);
    let mut findings = Findings::from(&states);
    let Some(head) = &states.head else {
        return Ok(assemble(
            input,
            Mode::Live,
            Some(cluster),
            &Settings::default(),
            findings,
        ));
    };
    // The reach the cluster's admin set rejects what the sync would.
    let reach = sync.as_ref().map(|s| &s.spec.reach);
    findings.errors.extend(reach::check(
        &reach.cloned().unwrap_or_default(),
        &head.manifests,
    ));
    let live_cluster = live::Cluster {
        client,
        kinds: &kinds,
    };
    let inventory = sync.as_ref().map(inventory_of).unwrap_or_default();
    // What the inventory and one list per kind show unchanged needs no dry run.
    let known = match options.full {
        true => None,
        false => live::Known::read(&live_cluster, &head.manifests, &inventory).await,
    };
    let (objects, refused, unchanged) =
        live::changes(&live_cluster, &head.manifests, &input.head, known.as_ref()).await?;
    findings.objects = objects;
    findings.errors.extend(refused);
    cluster.unchanged = unchanged;
    let released = prune_live(&live_cluster, &inventory, head, &mut findings).await?;
    let (leader_worker_sets, warnings) =
        live::leader_worker_sets(client, &head.manifests, &findings.objects)
            .await
            .map_err(cluster_error("reading the LeaderWorkerSets head declares"))?;
    findings.leader_worker_sets = leader_worker_sets;
    findings.warnings.extend(warnings);
    let before = live::version_labels(client, &head.manifests, &released).await?;
    let absent = live::absent_nodes(&findings.objects);
    let mut after = declared_version_labels(&head.manifests);
    after.retain(|(node, _), _| !absent.contains(node));
    findings.moves = label_moves(&before, &after);
    findings.campaigns = campaigns_in(&head.manifests);
    for campaign in &mut findings.campaigns {
        campaign.phase = live::campaign_phase(client, campaign)
            .await
            .map_err(cluster_error(&format!(
                "reading UpgradeConfig {}",
                campaign.name
            )))?;
    }
    let mut plan = assemble(input, Mode::Live, Some(cluster), &head.settings, findings);
    let rollout = head.settings.rollout.policy();
    if !rollout.is_default() {
        let recorded = live::recorded_upgrades(client)
            .await
            .map_err(cluster_error("reading the upgrades the cluster recorded"))?;
        guardrails::apply(
            &mut plan.nodes,
            &mut plan.policy,
            &rollout,
            &recorded,
            jiff::Timestamp::now(),
        );
    }
    live::drain_previews(client, &mut plan, &head.settings.node_drain)
        .await
        .map_err(cluster_error(
            "reading the pods of the nodes to drain and their LeaderWorkerSets",
        ))?;
    scrub(
        &mut plan,
        &mask::Scrub::of(head.manifests.iter().map(|m| &m.object)),
    );
    Ok(plan)
}

/// Adds what pruning the inventory's objects that left head does (or, without `prune`, a
/// warning that they stay); returns the nodes released.
async fn prune_live(
    cluster: &live::Cluster<'_>,
    inventory: &Inventory,
    head: &DesiredState,
    findings: &mut Findings,
) -> Result<Vec<String>, PlanError> {
    let departed = live::departed(inventory, &head.manifests);
    if !head.settings.prune {
        findings.keep(departed.iter().map(|e| id_of(e).to_string()).collect());
        return Ok(Vec::new());
    }
    let mut released = Vec::new();
    for entry in departed {
        if let Some(change) = live::departure(cluster, entry).await? {
            if change.action == ObjectAction::Release {
                released.push(entry.name.clone());
            }
            findings.objects.push(change);
        }
    }
    Ok(released)
}

/// The desired states of both commits, and what loading them found.
struct States {
    /// Base's desired state; empty when base lacks the path or does not validate.
    base: DesiredState,
    /// Head's; `None` when it does not validate.
    head: Option<DesiredState>,
    errors: Vec<ManifestError>,
    warnings: Vec<String>,
}

impl States {
    fn load(input: &PlanInput, catalog: &dyn Catalog) -> States {
        let mut warnings = Vec::new();
        let short = input.base.short_sha();
        let empty = || DesiredState {
            manifests: Vec::new(),
            settings: Settings::default(),
        };
        // Base is what the merge follows, loaded as sync restores its applied commit: checked
        // alone, not judged again against its own predecessor.
        let base = match &input.base_files {
            Ok(files) => {
                follow::load_accepted(files, &input.path, catalog).unwrap_or_else(|errors| {
                    warnings.push(format!(
                        "base commit {short} does not validate ({} errors); head is compared with \
                     an empty base",
                        errors.len()
                    ));
                    empty()
                })
            }
            // The change adds the path.
            Err(SourceError::PathNotFound { .. }) => empty(),
            Err(error) => {
                warnings.push(format!(
                    "base commit {short} cannot be read ({error}); head is compared with an \
                     empty base"
                ));
                empty()
            }
        };
        let loaded = match &input.head_files {
            Ok(files) => load_files(files, &input.path, catalog),
            Err(unreadable) => Err(vec![unreadable.clone()]),
        };
        let (head, errors) = match loaded {
            Ok(head) => {
                let errors = check_transition(Some(&base), &head);
                (Some(head), errors)
            }
            Err(errors) => (None, errors),
        };
        States {
            base,
            head,
            errors,
            warnings,
        }
    }
}

fn load_files(
    files: &[RepoFile],
    path: &str,
    catalog: &dyn Catalog,
) -> Result<DesiredState, Vec<ManifestError>> {
    let files: Vec<ManifestFile<'_>> = files
        .iter()
        .map(|file| ManifestFile {
            path: &file.path,
            contents: &file.contents,
        })
        .collect();
    load(&files, path, catalog)
}

/// What a plan found, before it is put in rollout order and counted.
struct Findings {
    campaigns: Vec<PlannedCampaign>,
    leader_worker_sets: Vec<LeaderWorkerSetChange>,
    objects: Vec<ObjectChange>,
    moves: Vec<LabelMove>,
    errors: Vec<ManifestError>,
    warnings: Vec<String>,
}

impl Findings {
    fn from(states: &States) -> Findings {
        Findings {
            campaigns: Vec::new(),
            leader_worker_sets: Vec::new(),
            objects: Vec::new(),
            moves: Vec::new(),
            errors: states.errors.clone(),
            warnings: states.warnings.clone(),
        }
    }

    /// Objects that left the repository but stay, since head's `prune` is false.
    fn keep(&mut self, objects: Vec<String>) {
        if !objects.is_empty() {
            self.warnings.push(format!(
                "{} left the repository and stay in the cluster (prune: false): {}",
                plural(objects.len(), "object"),
                objects.join(", ")
            ));
        }
    }
}

fn assemble(
    input: &PlanInput,
    mode: Mode,
    cluster: Option<ClusterState>,
    settings: &Settings,
    findings: Findings,
) -> Plan {
    let (mut nodes, waves) = steps::rollout(&findings.moves, settings.max_nodes_in_flight);
    for node in &mut nodes {
        if let Some(campaign) = findings
            .campaigns
            .iter()
            .find(|c| node.to.as_deref() == Some(c.version.as_str()))
        {
            node.campaign = Some(campaign.name.clone());
            node.held_until = Some(campaign.upgrade_at.clone());
        }
    }
    let pull_request = input.pull_request.or(input.head.pull_request);
    let policy = policy::policy(settings, waves, !nodes.is_empty(), pull_request);
    let summary = Summary::of(&findings.objects, &nodes, &findings.errors);
    Plan {
        schema_version: SCHEMA_VERSION,
        repository: input.repository.clone(),
        branch: input.branch.clone(),
        path: input.path.clone(),
        mode,
        base: Commit::from(&input.base),
        head: Commit::from(&input.head),
        pull_request,
        cluster,
        errors: findings.errors,
        warnings: findings.warnings,
        objects: findings.objects,
        nodes,
        campaigns: findings.campaigns,
        leader_worker_sets: findings.leader_worker_sets,
        policy,
        summary,
    }
}

/// The `UpgradeConfig`s among `manifests`, as the plan shows them.
fn campaigns_in(manifests: &[Manifest]) -> Vec<PlannedCampaign> {
    manifests
        .iter()
        .filter(|m| {
            m.api_version == UpgradeConfig::api_version(&()) && m.kind == UpgradeConfig::kind(&())
        })
        .filter_map(|m| {
            let config: UpgradeConfig = serde_json::from_value(m.object.clone()).ok()?;
            Some(PlannedCampaign {
                name: format!("{}/{}", m.namespace.as_deref().unwrap_or_default(), m.name),
                version: config.spec.desired.version,
                upgrade_at: config.spec.upgrade_at,
                pdb_force_drain_timeout: config.spec.pdb_force_drain_timeout,
                phase: None,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests;
