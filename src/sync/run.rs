//! One sync, and the loop that keeps syncing.
//!
//! A [`Syncer`] follows one branch into one cluster. Each [`Syncer::sync`]:
//!
//! 1. fetches the remote (nothing is downloaded when its head has not moved);
//! 2. when the head is a commit not seen before, loads and validates it (rejecting it whole,
//!    with every problem named, when anything is wrong: the last good commit stays applied);
//! 3. decides which objects need a write, dry-runs the writes, records in status that the
//!    commit is being applied, writes in stages, prunes what left the repository, and
//!    records the outcome: status, a history record, Events, metrics, one log line;
//! 4. with no new commit, checks the applied one for drift the same way, which costs reads
//!    only: a sync that finds nothing to do writes nothing at all.
//!
//! The status says which commit is applied and what the inventory holds, so a restarted
//! capstan resumes where it left off without writing again. A stop request (SIGTERM) is
//! honoured between writes; the interrupted commit is recorded as such and applied again by
//! the next start.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use super::apply::{self, Action, ApplyError};
use super::discovery::ClusterKinds;
use super::follow::{self, Attribution, Landed, MAX_REPLAY, Replay};
use super::impersonate;
use super::inventory::{self, Inventory};
use super::manifests::{DesiredState, DriftPolicy, ObjectId};
use super::mask::Scrub;
use super::metrics::Metrics;
use super::prune::{self, Pruned};
use super::pull_requests::{ProofError, Prover};
use super::reach;
use super::source::{CommitInfo, ReadBudget, Source, SourceError};
use super::status;
use crate::controllers::metrics::UpgradeMetrics;
use crate::history::recorder::Recorder;
use crate::history::{self, EventTarget};
use capstan_api::capstan::{MAX_RUNS, PullRequests, Reach, SYSTEM_NAMESPACE};
use capstan_api::clock::{Clock, SystemClock};
use capstan_api::{
    Change, CommitRef, GitSync, GitSyncSpec, GitSyncStatus, HistoryRecordSpec, InventoryEntry,
    RecordType, SyncRun, UpgradeConfig,
};
use kube::Resource as _;

/// Why a sync could not run at all (a rejected commit is an outcome, not an error).
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// The repository could not be read or fetched.
    #[error(transparent)]
    Source(#[from] SourceError),
    /// The cluster could not be read or written.
    #[error("cluster: {0}")]
    Cluster(#[from] kube::Error),
    /// Reading the cluster or the dry run failed (an API error that says nothing of the
    /// commit); retried at the next sync.
    #[error(transparent)]
    Apply(#[from] ApplyError),
    /// Applying failed part-way (an API error; its text scrubbed of the commit's Secret
    /// values); the commit is retried at the next sync.
    #[error("{0}")]
    Write(String),
    /// Which pull request merged a commit could not be asked (`spec.pullRequests`); the
    /// sync applies nothing and asks again.
    #[error(transparent)]
    Proof(#[from] ProofError),
}

/// How a [`Syncer`] behaves.
#[derive(Clone)]
pub struct SyncOptions {
    /// The `GitSync` name (several capstans can sync several branches into one cluster).
    pub name: String,
    /// Overrides the repository's `drift` setting.
    pub drift: Option<DriftPolicy>,
    /// "Now" of the sync's records and Events.
    pub clock: Arc<dyn Clock>,
    /// The repository's https token, which GitHub's API takes too (`spec.pullRequests`).
    pub github_token: Option<String>,
}

impl Default for SyncOptions {
    fn default() -> Self {
        SyncOptions {
            name: inventory::DEFAULT_SYNC_NAME.to_string(),
            drift: None,
            clock: Arc::new(SystemClock),
            github_token: None,
        }
    }
}

impl std::fmt::Debug for SyncOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SyncOptions")
            .field("name", &self.name)
            .field("drift", &self.drift)
            .finish_non_exhaustive()
    }
}

/// What one sync did.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// A new commit was applied.
    Applied(Report),
    /// The applied commit had drifted; the drift was reverted or reported.
    Drift(Report),
    /// Nothing to do.
    Unchanged,
    /// The head commit was rejected; the last good commit stays applied.
    Rejected {
        /// The rejected commit.
        commit: CommitInfo,
        /// Every problem, as `file:line: field: message`.
        errors: Vec<String>,
    },
    /// A stop request came during the apply; what was written is recorded.
    Interrupted(Report),
}

/// What a sync changed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Report {
    /// The commit applied (or checked for drift).
    pub commit: Option<CommitInfo>,
    /// Every object changed, pruned or found drifted, and how.
    pub changes: Vec<Change>,
    /// Objects left in place when pruning, with the reason.
    pub kept: Vec<(ObjectId, String)>,
    /// Time taken.
    pub duration: Duration,
}

impl Report {
    /// How many changes had `action` (`created`, `configured`, `pruned`, `released`,
    /// `drift-reverted`, `drift-detected`).
    pub fn count(&self, action: &str) -> usize {
        self.changes.iter().filter(|c| c.action == action).count()
    }

    /// `3 created, 1 configured, 0 pruned` and any drift or releases.
    pub fn summary(&self) -> String {
        let mut parts = vec![
            format!("{} created", self.count("created")),
            format!("{} configured", self.count("configured")),
            format!("{} pruned", self.count("pruned")),
        ];
        for extra in ["released", "drift-reverted", "drift-detected", "absent"] {
            let n = self.count(extra);
            if n > 0 {
                parts.push(format!("{n} {extra}"));
            }
        }
        parts.join(", ")
    }
}

/// The commit the cluster has, with its desired state.
struct AppliedCommit {
    commit: CommitInfo,
    desired: DesiredState,
}

/// Follows one branch into one cluster.
pub struct Syncer {
    /// capstan's own client: discovery, the `GitSync`, history.
    client: kube::Client,
    /// The client the repository's objects are read, applied and pruned through: capstan's
    /// own, or one acting as the ServiceAccount of the reach ([`impersonate`]).
    writer: kube::Client,
    /// What the repository may reach (`GitSync.spec.reach`), read again for every new head.
    reach: Reach,
    /// How commits' pull requests are proven (`GitSync.spec.pullRequests`), read with the
    /// reach, and the prover it makes.
    pull_requests: PullRequests,
    prover: Prover,
    /// Behind a lock only so that a sync can run on any thread (git2 repositories are
    /// `Send` but not `Sync`); it is never held across an await.
    source: std::sync::Mutex<Source>,
    options: SyncOptions,
    kinds: ClusterKinds,
    status: GitSyncStatus,
    inventory: Inventory,
    applied: Option<AppliedCommit>,
    /// The head last rejected, so it is reported once, not at every interval.
    rejected: Option<String>,
    /// Drift reported but not reverted (`drift: warn`), by the live resourceVersion it
    /// was seen at, so it is reported once, not at every interval.
    reported_drift: BTreeMap<ObjectId, String>,
    metrics: Arc<Metrics>,
    stop: Arc<AtomicBool>,
    recorder: Recorder,
}

impl Syncer {
    /// Prepares a sync of `source` into the cluster `client` talks to: installs capstan's
    /// CRDs and namespace when missing, creates or reads the `GitSync`, and takes the
    /// applied commit and inventory from its status.
    pub async fn start(
        client: kube::Client,
        source: Source,
        options: SyncOptions,
        metrics: Arc<Metrics>,
    ) -> Result<Syncer, SyncError> {
        let mut kinds = ClusterKinds::discover(&client).await?;
        let spec = GitSyncSpec {
            repo: source.location().to_string(),
            branch: source.branch().to_string(),
            path: source.path().to_string(),
            reach: Reach::default(),
            pull_requests: Default::default(),
            notifications: Default::default(),
        };
        let sync = status::ensure(&client, &mut kinds, &options.name, spec).await?;
        let status = sync.status.clone().unwrap_or_default();
        let inventory = inventory::inventory_of(&sync);
        let recorder = Recorder::new(client.clone(), history::COMPONENT, options.clock.clone());
        let reach = sync.spec.reach.clone();
        let writer = writer_for(&client, &reach);
        let pull_requests = sync.spec.pull_requests.clone();
        let prover = prover_for(&pull_requests, &source, &options)?;
        let mut syncer = Syncer {
            recorder,
            writer,
            reach,
            pull_requests,
            prover,
            client,
            source: std::sync::Mutex::new(source),
            options,
            kinds,
            status,
            inventory,
            applied: None,
            rejected: None,
            reported_drift: BTreeMap::new(),
            metrics,
            stop: Arc::new(AtomicBool::new(false)),
        };
        syncer.applied = syncer.reload_applied(&sync);
        syncer.rejected = rejected_head(&syncer.status);
        if let Some(applied) = &syncer.applied {
            syncer.metrics.set_applied_commit(
                &applied.commit.revision(),
                applied.commit.pull_request,
                &applied.commit.subject,
            );
        }
        Ok(syncer)
    }

    /// The flag that stops a sync between writes; set it to shut down cleanly.
    pub fn stop_flag(&self) -> Arc<AtomicBool> {
        self.stop.clone()
    }

    /// The commit the cluster has, if any.
    pub fn applied_commit(&self) -> Option<&CommitInfo> {
        self.applied.as_ref().map(|a| &a.commit)
    }

    /// The source followed.
    pub fn source(&self) -> std::sync::MutexGuard<'_, Source> {
        self.source
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The last applied commit of the status, loaded again from Git as the state the next
    /// commit follows: it was accepted once, so it is not judged again (see
    /// [`follow::load_accepted`]). A commit that no longer loads (history rewritten) leaves
    /// no applied state; the inventory still says what capstan owns.
    fn reload_applied(&self, sync: &GitSync) -> Option<AppliedCommit> {
        let applied = sync.status.as_ref()?.last_applied_commit.as_ref()?;
        let source = self.source();
        let mut commit = source.resolve(&applied.sha).ok()?;
        // As proven when it was applied (`spec.pullRequests`), not read from its subject again.
        commit.pull_request = applied.pull_request;
        let files = source.files_at(&commit.sha, &ReadBudget::COMMIT).ok()?;
        let desired = follow::load_accepted(&files, source.path(), &self.kinds).ok()?;
        Some(AppliedCommit { commit, desired })
    }

    /// Reads what the cluster's admin set on the `GitSync`: the reach (acting as its
    /// ServiceAccount from now on when it names one) and how pull requests are proven.
    async fn read_admin_spec(&mut self) -> Result<(), SyncError> {
        let syncs: kube::Api<GitSync> =
            kube::Api::namespaced(self.client.clone(), SYSTEM_NAMESPACE);
        let spec = syncs
            .get_opt(&self.options.name)
            .await?
            .map(|sync| sync.spec)
            .unwrap_or_default();
        if spec.pull_requests != self.pull_requests {
            let prover = prover_for(&spec.pull_requests, &self.source(), &self.options)?;
            tracing::info!(
                pull_requests = %serde_json::to_string(&spec.pull_requests).unwrap_or_default(),
                "the GitSync's pull request proof changed"
            );
            self.prover = prover;
            self.pull_requests = spec.pull_requests;
        }
        let reach = spec.reach;
        if reach != self.reach {
            tracing::info!(
                reach = %serde_json::to_string(&reach).unwrap_or_default(),
                "the GitSync's reach changed: commits are judged, applied and pruned within it"
            );
            self.writer = writer_for(&self.client, &reach);
            self.reach = reach;
        }
        Ok(())
    }

    /// Replaces the pull requests the replay's commits name by their subjects with the ones
    /// proven the admin's way, before anything is stamped with them.
    async fn prove_pull_requests(&self, replay: &mut Replay) -> Result<(), SyncError> {
        // Each commit is asked once: the prover keeps its answers.
        if let Some(accepted) = &mut replay.accepted {
            accepted.commit.pull_request = self.prover.prove(&accepted.commit).await?;
        }
        for commit in replay.changed_by.values_mut() {
            commit.pull_request = self.prover.prove(commit).await?;
        }
        Ok(())
    }

    /// The commits since the applied one up to `head`, judged in turn (see [`follow::replay`]).
    fn replay(&self, head: &CommitInfo) -> Replay {
        let source = self.source();
        let commits = self
            .applied
            .as_ref()
            .and_then(|applied| {
                source
                    .commits_since(&applied.commit.sha, &head.sha, MAX_REPLAY)
                    .ok()
                    .flatten()
            })
            .unwrap_or_else(|| vec![head.clone()]);
        let landed = commits.into_iter().map(|commit| Landed {
            files: source.files_at(&commit.sha, &ReadBudget::COMMIT),
            commit,
        });
        follow::replay(
            self.applied.as_ref().map(|a| &a.desired),
            landed,
            source.path(),
            &self.kinds,
            &self.reach,
        )
    }

    /// One sync: the head commit if it is new, else a drift check of the applied one.
    pub async fn sync(&mut self) -> Result<Outcome, SyncError> {
        let started = Instant::now();
        let result = self.sync_inner(started).await;
        let label = match &result {
            Ok(Outcome::Applied(_) | Outcome::Drift(_)) => "applied",
            Ok(Outcome::Unchanged) => "unchanged",
            Ok(Outcome::Rejected { .. }) | Err(_) => "failed",
            Ok(Outcome::Interrupted(_)) => "interrupted",
        };
        self.metrics.observe_sync(label, started.elapsed());
        result
    }

    async fn sync_inner(&mut self, started: Instant) -> Result<Outcome, SyncError> {
        let head = {
            let mut source = self.source();
            if source.is_remote() {
                tokio::task::block_in_place(|| source.fetch())?;
            }
            source.head()?
        };
        let applied_sha = self.applied.as_ref().map(|a| a.commit.sha.clone());
        let head_is_new =
            applied_sha.as_ref() != Some(&head.sha) && self.rejected.as_ref() != Some(&head.sha);
        if !head_is_new {
            let Some(applied) = self.applied.take() else {
                return Ok(Outcome::Unchanged);
            };
            let result = self
                .apply(
                    &applied.commit,
                    &applied.desired,
                    false,
                    Attribution::all(&applied.commit),
                    started,
                )
                .await;
            self.applied = Some(applied);
            return result.map(|(outcome, _)| outcome);
        }
        self.kinds = ClusterKinds::discover(&self.client).await?;
        match self.read_admin_spec().await {
            Err(err @ SyncError::Proof(_)) => {
                // The admin's proof cannot be set up (no GitHub repository to ask): said in
                // the status as any failure to apply.
                self.fail(&head, &err.to_string(), started).await?;
                return Err(err);
            }
            other => other?,
        }
        let mut replay = blocking(|| self.replay(&head));
        if let Err(err) = self.prove_pull_requests(&mut replay).await {
            self.fail(&head, &err.to_string(), started).await?;
            return Err(err);
        }
        self.report_campaigns(&replay);
        // A valid commit that landed before a rejected head is applied first, as a sync
        // that saw it would have.
        if let Some(accepted) = replay.accepted {
            let attribution = Attribution {
                applied: &accepted.commit,
                changed_by: &replay.changed_by,
            };
            let (outcome, applied) = self
                .apply(
                    &accepted.commit,
                    &accepted.desired,
                    true,
                    attribution,
                    started,
                )
                .await?;
            if applied {
                self.rejected = None;
                self.metrics.set_applied_commit(
                    &accepted.commit.revision(),
                    accepted.commit.pull_request,
                    &accepted.commit.subject,
                );
                self.applied = Some(AppliedCommit {
                    commit: accepted.commit,
                    desired: accepted.desired,
                });
            }
            if replay.rejected.is_none() || !applied {
                if matches!(outcome, Outcome::Rejected { .. }) {
                    // Refused by the API server: not tried again until the branch moves.
                    self.rejected = Some(head.sha.clone());
                }
                return Ok(outcome);
            }
        }
        let errors = replay.rejected.unwrap_or_default();
        let mut head = head;
        head.pull_request = match self.prover.prove(&head).await {
            Ok(pull_request) => pull_request,
            Err(err) => {
                self.fail(&head, &err.to_string(), started).await?;
                return Err(err.into());
            }
        };
        self.reject(&head, errors.clone(), started).await?;
        Ok(Outcome::Rejected {
            commit: head,
            errors,
        })
    }

    /// Applies `desired` (of `commit`; `new` when it is not the applied commit). Returns the
    /// outcome and whether the commit is now fully applied.
    async fn apply(
        &mut self,
        commit: &CommitInfo,
        desired: &DesiredState,
        new: bool,
        attribution: Attribution<'_>,
        started: Instant,
    ) -> Result<(Outcome, bool), SyncError> {
        let drift = self.options.drift.unwrap_or(desired.settings.drift);
        // The API server's messages may quote what it was sent: none of the commit's Secret
        // values reaches the status, a record, an Event or the log.
        let scrub = || Scrub::of(desired.manifests.iter().map(|m| &m.object));
        let scrubbed = |errors: Vec<String>| -> Vec<String> {
            let scrub = scrub();
            errors.iter().map(|error| scrub.text(error)).collect()
        };
        let live = match apply::read_live(&self.writer, &self.kinds, &desired.manifests).await {
            Ok(live) => live,
            Err(ApplyError::Refused(errors)) => {
                let errors = scrubbed(errors);
                self.reject(commit, errors.clone(), started).await?;
                let outcome = Outcome::Rejected {
                    commit: commit.clone(),
                    errors,
                };
                return Ok((outcome, false));
            }
            Err(other) => return Err(other.into()),
        };
        let writes = apply::decide(
            &self.writer,
            &self.kinds,
            &desired.manifests,
            &live,
            &self.inventory,
            attribution,
            drift,
        )
        .await?;
        let writes = self.unreported(writes, &live);
        let wanted: BTreeSet<ObjectId> = desired.manifests.iter().map(|m| m.id()).collect();
        // Objects outside the reach are never pruned: the repository could not declare them.
        let (leftovers, unreachable): (Vec<InventoryEntry>, Vec<InventoryEntry>) = self
            .inventory
            .iter()
            .filter(|(id, _)| !wanted.contains(id))
            .map(|(_, entry)| entry.clone())
            .partition(|entry| reach::allows(&self.reach, &inventory::id_of(entry)));
        if writes.is_empty() && leftovers.is_empty() && !new {
            return Ok((Outcome::Unchanged, true));
        }
        if let Err(err) = apply::dry_run(
            &self.writer,
            &self.kinds,
            &desired.manifests,
            &live,
            &writes,
        )
        .await
        {
            return match err {
                ApplyError::Refused(errors) => {
                    let errors = scrubbed(errors);
                    self.reject(commit, errors.clone(), started).await?;
                    Ok((
                        Outcome::Rejected {
                            commit: commit.clone(),
                            errors,
                        },
                        false,
                    ))
                }
                other => Err(other.into()),
            };
        }

        // The labels this commit writes are acted on under its own policy.
        let mut policy = desired.settings.upgrade_policy();
        policy.require_pull_request |= self.pull_requests.require;
        self.status.policy = Some(policy);
        let new_inventory: Inventory = desired
            .manifests
            .iter()
            .map(|m| (m.id(), inventory::entry_of(m)))
            .collect();
        let writing = writes.iter().any(|(_, action, _)| action.writes());
        if writing || (!leftovers.is_empty() && desired.settings.prune) {
            // Whatever happens next, everything that may get written is in the inventory, so
            // a crash leaves nothing capstan cannot prune. The digests stay those of what was
            // applied (none for a new object) until the writes are done: an object the crash
            // left unwritten still reads as changed in Git, and is written with the stamps of
            // the commit that changed it rather than put back as drift.
            for (id, entry) in &new_inventory {
                self.inventory
                    .entry(id.clone())
                    .or_insert_with(|| InventoryEntry {
                        digest: String::new(),
                        ..entry.clone()
                    });
            }
            self.status.phase = "Applying".into();
            self.status.last_attempted_commit = Some(commit.reference());
            self.put_inventory();
            status::set_ready(&mut self.status, false, "Applying", &applying(commit));
            status::write(&self.client, &self.options.name, &self.status).await?;
        }

        let written = apply::write(
            &self.writer,
            &mut self.kinds,
            &desired.manifests,
            writes,
            &self.stop,
        )
        .await;
        let written = match written {
            Ok(written) => written,
            Err(err) => {
                let message = scrub().text(&err.to_string());
                self.fail(commit, &message, started).await?;
                return Err(SyncError::Write(message));
            }
        };
        let mut report = Report {
            commit: Some(commit.clone()),
            ..Report::default()
        };
        for (id, action) in &written.changes {
            report.changes.push(change(action.as_str(), id));
        }
        let mut pruned_ids = BTreeSet::new();
        let mut waiting = Vec::new();
        if !written.interrupted && !leftovers.is_empty() {
            if desired.settings.prune {
                let pruned = prune::prune(
                    &self.writer,
                    &self.kinds,
                    &leftovers,
                    attribution,
                    &self.stop,
                )
                .await;
                let pruned = match pruned {
                    Ok(pruned) => pruned,
                    Err(err) => {
                        let message = scrub().text(&err.to_string());
                        self.fail(commit, &message, started).await?;
                        return Err(SyncError::Write(message));
                    }
                };
                for (id, outcome) in pruned {
                    match outcome {
                        Pruned::Deleted => report.changes.push(change("pruned", &id)),
                        Pruned::Released => report.changes.push(change("released", &id)),
                        Pruned::Gone => {}
                        Pruned::Kept(reason) => report.kept.push((id.clone(), reason)),
                        Pruned::Waiting(reason) => {
                            waiting.push(id.clone());
                            report.kept.push((id.clone(), reason));
                        }
                    }
                    pruned_ids.insert(id);
                }
            } else {
                pruned_ids.extend(leftovers.iter().map(inventory::id_of));
            }
        }
        for entry in &unreachable {
            report.kept.push((
                inventory::id_of(entry),
                "not pruned: outside this repository's reach (the GitSync's spec.reach), and \
                 no longer managed"
                    .to_string(),
            ));
        }
        report.duration = started.elapsed();
        let interrupted = written.interrupted
            || leftovers.iter().any(|entry| {
                desired.settings.prune && !pruned_ids.contains(&inventory::id_of(entry))
            });

        if interrupted {
            self.finish(commit, &report, "Interrupted", attribution, started)
                .await?;
            return Ok((Outcome::Interrupted(report), false));
        }
        // What waits to be pruned stays owned, and a later sync prunes it again.
        let mut new_inventory = new_inventory;
        for id in waiting {
            if let Some(entry) = self.inventory.get(&id) {
                new_inventory.insert(id, entry.clone());
            }
        }
        self.inventory = new_inventory;
        let drift_only = !new;
        if drift_only && report.changes.is_empty() && report.kept.is_empty() {
            return Ok((Outcome::Unchanged, true));
        }
        self.finish(commit, &report, "Applied", attribution, started)
            .await?;
        let outcome = if drift_only {
            Outcome::Drift(report)
        } else {
            Outcome::Applied(report)
        };
        Ok((outcome, true))
    }

    /// `writes` without drift already reported at the same live resourceVersion, nor Nodes
    /// already reported unregistered (the status keeps them, so a restart does not report
    /// them again); notes what is reported now.
    fn unreported(
        &mut self,
        writes: Vec<(ObjectId, Action, serde_json::Value)>,
        live: &apply::LiveObjects,
    ) -> Vec<(ObjectId, Action, serde_json::Value)> {
        let unregistered: Vec<String> = writes
            .iter()
            .filter(|(_, action, _)| *action == Action::Absent)
            .map(|(id, _, _)| id.name.clone())
            .collect();
        let reported = std::mem::replace(&mut self.status.unregistered_nodes, unregistered);
        let writes = writes
            .into_iter()
            .filter(|(id, action, _)| *action != Action::Absent || !reported.contains(&id.name))
            .collect();
        self.unreported_drift(writes, live)
    }

    /// `writes` without drift already reported at the same live resourceVersion; notes the
    /// drift reported now.
    fn unreported_drift(
        &mut self,
        writes: Vec<(ObjectId, Action, serde_json::Value)>,
        live: &apply::LiveObjects,
    ) -> Vec<(ObjectId, Action, serde_json::Value)> {
        let version = |id: &ObjectId| {
            live.get(id)
                .and_then(|o| o.pointer("/metadata/resourceVersion"))
                .and_then(serde_json::Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        self.reported_drift
            .retain(|id, seen| live.get(id).is_some() && *seen == version(id));
        writes
            .into_iter()
            .filter(|(id, action, _)| {
                if *action != Action::DriftDetected {
                    return true;
                }
                let now = version(id);
                self.reported_drift.insert(id.clone(), now.clone()) != Some(now)
            })
            .collect()
    }

    /// Records a finished (or interrupted) apply: status, history, events, metrics.
    async fn finish(
        &mut self,
        commit: &CommitInfo,
        report: &Report,
        result: &str,
        attribution: Attribution<'_>,
        started: Instant,
    ) -> Result<(), SyncError> {
        let reference = commit.reference();
        for change in &report.changes {
            if change.action == Action::Absent.as_str()
                && !self.status.unregistered_nodes.contains(&change.name)
            {
                self.status.unregistered_nodes.push(change.name.clone());
            }
        }
        self.status.unregistered_nodes.sort();
        self.status.phase = result.into();
        self.status.last_attempted_commit = Some(reference.clone());
        if result == "Applied" {
            self.status.last_applied_commit = Some(reference.clone());
            self.status.error.clear();
            status::set_ready(&mut self.status, true, "Applied", &applied_message(commit));
        } else {
            status::set_ready(
                &mut self.status,
                false,
                result,
                &format!(
                    "stopped while applying {}; the next start applies it again",
                    commit.short_sha()
                ),
            );
        }
        self.put_inventory();
        self.push_run(SyncRun {
            commit: reference.clone(),
            started_at: history::now(&*self.options.clock),
            duration_seconds: started.elapsed().as_secs_f64(),
            result: result.into(),
            created: report.count("created") as u32,
            configured: report.count("configured") as u32,
            pruned: (report.count("pruned") + report.count("released")) as u32,
            drifted: (report.count("drift-reverted") + report.count("drift-detected")) as u32,
            error: String::new(),
        });
        status::write(&self.client, &self.options.name, &self.status).await?;

        for (action, metric) in [
            ("created", "created"),
            ("configured", "configured"),
            ("pruned", "pruned"),
            ("released", "pruned"),
        ] {
            self.metrics
                .add_objects(metric, report.count(action) as u64);
        }
        let mut drift_by_kind: BTreeMap<(&str, &str), u64> = BTreeMap::new();
        for c in &report.changes {
            let action = match c.action.as_str() {
                "drift-reverted" => "reverted",
                "drift-detected" => "reported",
                _ => continue,
            };
            *drift_by_kind.entry((&c.kind, action)).or_default() += 1;
        }
        for ((kind, action), count) in drift_by_kind {
            self.metrics.add_drift(kind, action, count);
        }

        let message = format!(
            "{} {}: {}{}",
            if result == "Applied" {
                "applied"
            } else {
                "interrupted"
            },
            describe_commit(commit),
            report.summary(),
            list_changes(&report.changes),
        );
        let drift = report.count("drift-reverted") + report.count("drift-detected") > 0;
        let unregistered = report.count(Action::Absent.as_str()) > 0;
        let reason = match (result, drift, unregistered) {
            ("Applied", true, _) => "DriftFound",
            ("Applied", false, true) => "NodeAbsent",
            ("Applied", false, false) => "Synced",
            _ => "SyncInterrupted",
        };
        self.record(
            RecordType::Sync,
            &reference,
            &message,
            report.changes.clone(),
        )
        .await;
        self.event(
            drift || unregistered || result != "Applied",
            reason,
            &message,
            &reference,
        )
        .await;
        // Each Node's Event names the commit that changed its labels, which is the applied
        // one unless several commits landed since the last sync.
        let node_changes: Vec<&Change> = report
            .changes
            .iter()
            .filter(|c| c.kind == "Node" && c.action != Action::Absent.as_str())
            .collect();
        for node in node_changes {
            let id = ObjectId {
                group: String::new(),
                kind: node.kind.clone(),
                namespace: None,
                name: node.name.clone(),
            };
            let by = attribution.commit_of(&id);
            let target = EventTarget {
                api_version: "v1".into(),
                kind: "Node".into(),
                namespace: None,
                name: node.name.clone(),
                uid: None,
            };
            let message = format!("{} by {}", node.action, describe_commit(by));
            if let Err(err) = history::record_event(
                &self.recorder,
                &target,
                false,
                "LabelsFromGit",
                &message,
                &by.reference(),
                BTreeMap::new(),
            )
            .await
            {
                tracing::warn!(node = %node.name, error = %err, "could not record an event");
            }
        }
        Ok(())
    }

    /// The campaign gauges after `replay` (see [`report_campaigns`]).
    fn report_campaigns(&self, replay: &Replay) {
        report_campaigns(
            &self.metrics.controllers(),
            replay,
            self.applied.as_ref().map(|a| &a.desired),
        );
    }

    /// Records a rejected commit: nothing of it was applied.
    async fn reject(
        &mut self,
        commit: &CommitInfo,
        errors: Vec<String>,
        started: Instant,
    ) -> Result<(), SyncError> {
        let reference = commit.reference();
        // Capped: a commit can hold any number of problems, and a status too large to write
        // would leave the rejection unrecorded, judged again at every interval.
        let error = capped(&errors, "\n", STATUS_ERRORS, STATUS_ERROR_BYTES);
        self.status.phase = "Failed".into();
        self.status.last_attempted_commit = Some(reference.clone());
        self.status.error = error.clone();
        let message = format!(
            "{} rejected; {} stays applied",
            commit.short_sha(),
            self.applied_name()
        );
        status::set_ready(&mut self.status, false, "CommitRejected", &message);
        self.push_run(SyncRun {
            commit: reference.clone(),
            started_at: history::now(&*self.options.clock),
            duration_seconds: started.elapsed().as_secs_f64(),
            result: "Failed".into(),
            error: error.clone(),
            ..SyncRun::default()
        });
        status::write(&self.client, &self.options.name, &self.status).await?;
        // Only once the status says so: a rejection that could not be recorded is judged
        // again at the next sync.
        self.rejected = Some(commit.sha.clone());
        let message = format!(
            "rejected {}: {} problem(s), nothing applied: {}",
            describe_commit(commit),
            errors.len(),
            capped(&errors, "; ", RECORD_ERRORS, RECORD_ERROR_BYTES)
        );
        self.record(RecordType::Rejected, &reference, &message, Vec::new())
            .await;
        self.event(true, "CommitRejected", &message, &reference)
            .await;
        Ok(())
    }

    /// Records an apply that failed part-way (an API error): status only, so the next sync
    /// retries; the inventory already holds everything that may have been written.
    async fn fail(
        &mut self,
        commit: &CommitInfo,
        error: &str,
        started: Instant,
    ) -> Result<(), SyncError> {
        self.status.phase = "Failed".into();
        self.status.error = error.to_string();
        status::set_ready(&mut self.status, false, "ApplyFailed", error);
        self.push_run(SyncRun {
            commit: commit.reference(),
            started_at: history::now(&*self.options.clock),
            duration_seconds: started.elapsed().as_secs_f64(),
            result: "Failed".into(),
            error: error.to_string(),
            ..SyncRun::default()
        });
        status::write(&self.client, &self.options.name, &self.status).await?;
        Ok(())
    }

    fn applied_name(&self) -> String {
        self.applied
            .as_ref()
            .map_or("nothing".to_string(), |a| a.commit.short_sha().to_string())
    }

    fn put_inventory(&mut self) {
        self.status.inventory = self.inventory.values().cloned().collect();
        self.status.inventory_count = self.status.inventory.len() as u32;
    }

    fn push_run(&mut self, run: SyncRun) {
        self.status.runs.insert(0, run);
        self.status.runs.truncate(MAX_RUNS);
    }

    /// Writes a history record and enforces retention; failures are logged, not fatal:
    /// the status already has the outcome.
    async fn record(
        &self,
        type_: RecordType,
        commit: &CommitRef,
        message: &str,
        changes: Vec<Change>,
    ) {
        let spec = HistoryRecordSpec {
            time: history::now(&*self.options.clock),
            type_,
            sync: self.options.name.clone(),
            commit: commit.clone(),
            message: message.to_string(),
            changes,
            ..HistoryRecordSpec::default()
        };
        let retention = self
            .applied
            .as_ref()
            .map_or(1000, |a| a.desired.settings.history_retention);
        let result = async {
            history::write_record(&self.client, spec).await?;
            history::enforce_retention(&self.client, &self.options.name, retention).await
        }
        .await;
        if let Err(err) = result {
            tracing::warn!(error = %err, "could not write a history record");
        }
    }

    async fn event(&self, warning: bool, reason: &str, message: &str, commit: &CommitRef) {
        let target = EventTarget {
            api_version: "capstan.dev/v1alpha1".into(),
            kind: "GitSync".into(),
            namespace: Some(SYSTEM_NAMESPACE.into()),
            name: self.options.name.clone(),
            uid: None,
        };
        if let Err(err) = history::record_event(
            &self.recorder,
            &target,
            warning,
            reason,
            message,
            commit,
            BTreeMap::new(),
        )
        .await
        {
            tracing::warn!(error = %err, "could not record an event");
        }
    }
}

fn change(action: &str, id: &ObjectId) -> Change {
    Change {
        action: action.into(),
        kind: id.kind.clone(),
        namespace: id.namespace.clone(),
        name: id.name.clone(),
    }
}

/// Runs `work` (Git reads and YAML parsing) off the runtime's task threads where the
/// runtime allows it, so other tasks (the controllers) keep running meanwhile.
/// The prover of pull requests `spec` asks for, for the repository and branch `source`
/// follows.
fn prover_for(
    spec: &PullRequests,
    source: &Source,
    options: &SyncOptions,
) -> Result<Prover, ProofError> {
    Prover::new(
        spec,
        source.location(),
        source.branch(),
        options.github_token.clone(),
    )
}

/// The client the repository's objects go through under `reach`: capstan's own, or one
/// acting as the reach's ServiceAccount.
fn writer_for(client: &kube::Client, reach: &Reach) -> kube::Client {
    reach
        .service_account
        .as_ref()
        .and_then(|account| impersonate::as_service_account(client, account))
        .unwrap_or_else(|| client.clone())
}

fn blocking<T>(work: impl FnOnce() -> T) -> T {
    let multi_thread = tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
    if multi_thread {
        tokio::task::block_in_place(work)
    } else {
        work()
    }
}

/// The head a restarted sync must not judge again: the commit the status says was
/// rejected, unless it is the applied one.
fn rejected_head(status: &GitSyncStatus) -> Option<String> {
    let rejected = status
        .conditions
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == "False" && c.reason == "CommitRejected");
    let attempted = status.last_attempted_commit.as_ref()?;
    let applied = status.last_applied_commit.as_ref().map(|c| &c.sha);
    (rejected && status.phase == "Failed" && applied != Some(&attempted.sha))
        .then(|| attempted.sha.clone())
}

/// `a1b2c3d "Subject" (#42)`.
pub fn describe_commit(commit: &CommitInfo) -> String {
    match commit.pull_request {
        Some(pr) => format!("{} \"{}\" (#{pr})", commit.short_sha(), commit.subject),
        None => format!("{} \"{}\"", commit.short_sha(), commit.subject),
    }
}

fn applying(commit: &CommitInfo) -> String {
    format!("applying {}", describe_commit(commit))
}

fn applied_message(commit: &CommitInfo) -> String {
    format!("applied {}", describe_commit(commit))
}

/// `: created Module kmm/a, configured Node worker-1` (empty without changes).
fn list_changes(changes: &[Change]) -> String {
    if changes.is_empty() {
        return String::new();
    }
    let items: Vec<String> = changes.iter().map(history::describe_change).collect();
    format!(" ({})", items.join(", "))
}

/// How many of a rejected commit's problems the status keeps, and in how many bytes: the
/// status is one object, with the inventory beside it, under the API server's request limit.
const STATUS_ERRORS: usize = 100;
const STATUS_ERROR_BYTES: usize = 32 * 1024;
/// How many of a rejected commit's problems the log shows, as the status does.
pub const LOGGED_ERRORS: usize = STATUS_ERRORS;
/// The same for its history record and Event.
const RECORD_ERRORS: usize = 20;
const RECORD_ERROR_BYTES: usize = 4 * 1024;

/// The first of `errors` joined by `separator`, as many as fit in `max` items and
/// `max_bytes` bytes, then `and N more` for the rest. An error longer than the budget is
/// cut at a character boundary.
pub fn capped(errors: &[String], separator: &str, max: usize, max_bytes: usize) -> String {
    let mut text = String::new();
    let mut shown = 0;
    for error in errors.iter().take(max) {
        let needed = if shown == 0 { 0 } else { separator.len() } + error.len();
        if text.len() + needed > max_bytes {
            if shown == 0 {
                let mut end = max_bytes.min(error.len());
                while !error.is_char_boundary(end) {
                    end -= 1;
                }
                text.push_str(&error[..end]);
                text.push_str("...");
                shown = 1;
            }
            break;
        }
        if shown > 0 {
            text.push_str(separator);
        }
        text.push_str(error);
        shown += 1;
    }
    if shown < errors.len() {
        if shown > 0 {
            text.push_str(separator);
        }
        text.push_str(&format!("and {} more", errors.len() - shown));
    }
    text
}

/// What wakes the loop besides its interval.
pub struct Wakers {
    /// Local repositories: a message per change of the branch refs.
    pub refs: Option<tokio::sync::mpsc::Receiver<()>>,
    /// A verified webhook.
    pub webhook: Arc<Notify>,
}

/// Syncs at once, then whenever the branch moves (local ref change, webhook) or `interval`
/// passes, until `shutdown` is notified. Each outcome goes to `report` (the progress log).
/// `ready` is set once the first sync finished.
pub async fn follow(
    mut syncer: Syncer,
    interval: Duration,
    mut wakers: Wakers,
    shutdown: Arc<Notify>,
    ready: Arc<AtomicBool>,
    mut report: impl FnMut(&Result<Outcome, SyncError>),
) {
    // A shutdown stops a sync between writes (the flag) and ends the wait between syncs
    // (`stopped`, whose permit is kept if nobody waits yet).
    let stop = syncer.stop_flag();
    let stopped = Arc::new(Notify::new());
    let stopper = {
        let (stop, stopped) = (stop.clone(), stopped.clone());
        tokio::spawn(async move {
            shutdown.notified().await;
            stop.store(true, Ordering::SeqCst);
            stopped.notify_one();
        })
    };
    loop {
        let result = syncer.sync().await;
        // Ready once the first sync has run, before anyone hears of it.
        ready.store(true, Ordering::SeqCst);
        report(&result);
        if stop.load(Ordering::SeqCst) {
            break;
        }
        let refs = async {
            match wakers.refs.as_mut() {
                Some(rx) => {
                    if rx.recv().await.is_none() {
                        std::future::pending::<()>().await;
                    }
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = refs => {}
            _ = wakers.webhook.notified() => {}
            _ = stopped.notified() => break,
        }
    }
    stopper.abort();
}

/// `upgradeoperator_upgradeconfig_validation_failed`: 1 for each campaign of a rejected
/// head's failing files, 0 for each campaign of the commit accepted. The campaign gauges of
/// an `UpgradeConfig` that left Git (in neither the state the cluster follows, `replay`'s
/// accepted commit else `applied`, nor the head's failing files) are dropped, as MUO drops
/// them when its `UpgradeConfig` is gone.
fn report_campaigns(metrics: &UpgradeMetrics, replay: &Replay, applied: Option<&DesiredState>) {
    for name in &replay.invalid_campaigns {
        metrics.set_upgradeconfig_validation_failed(name, true);
    }
    let accepted = replay.accepted.as_ref().map(|a| &a.desired);
    for name in accepted.into_iter().flat_map(campaign_names) {
        if !replay
            .invalid_campaigns
            .iter()
            .any(|invalid| invalid == name)
        {
            metrics.set_upgradeconfig_validation_failed(name, false);
        }
    }
    // With nothing accepted nor applied, what the cluster holds is not known: keep all.
    let Some(followed) = accepted.or(applied) else {
        return;
    };
    let mut declared: BTreeSet<String> = campaign_names(followed).map(str::to_string).collect();
    declared.extend(replay.invalid_campaigns.iter().cloned());
    metrics.retain_campaigns(&declared);
}

/// The names of the `UpgradeConfig`s `state` declares.
fn campaign_names(state: &DesiredState) -> impl Iterator<Item = &str> {
    state
        .manifests
        .iter()
        .filter(|m| {
            m.api_version == UpgradeConfig::api_version(&()) && m.kind == UpgradeConfig::kind(&())
        })
        .map(|m| m.name.as_str())
}

/// Compiles only while the sync futures are `Send`, so a sync can be spawned on any
/// runtime thread (a lazy iterator of futures held across an await breaks that silently).
#[cfg(test)]
#[allow(dead_code, clippy::too_many_arguments)]
fn sync_futures_are_send(
    s: &mut Syncer,
    c: &kube::Client,
    k: &mut ClusterKinds,
    m: &[super::manifests::Manifest],
    l: &apply::LiveObjects,
    i: &Inventory,
    ci: &CommitInfo,
    stop: &AtomicBool,
    e: &[InventoryEntry],
) {
    fn is_send<T: Send>(_: &T) {}
    is_send(&apply::read_live(c, k, m));
    is_send(&apply::decide(
        c,
        k,
        m,
        l,
        i,
        Attribution::all(ci),
        DriftPolicy::Revert,
    ));
    is_send(&apply::dry_run(c, k, m, l, &[]));
    is_send(&apply::write(c, k, m, vec![], stop));
    is_send(&prune::prune(c, k, e, Attribution::all(ci), stop));
    is_send(&s.sync());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sync::manifests::StaticCatalog;
    use crate::sync::source::RepoFile;
    use capstan_testing::manifests::module;

    /// A commit of Module my-kmod at v1 and an `UpgradeConfig` for each of `campaigns`,
    /// rolling out the version given (v1 is valid, any other is not declared).
    fn commit(campaigns: &[(&str, &str)]) -> Vec<RepoFile> {
        let mut files = vec![RepoFile {
            path: "module.yaml".into(),
            contents: module("my-kmod", "v1").as_bytes().into(),
        }];
        for (name, version) in campaigns {
            let text = format!(
                "apiVersion: upgrade.managed.openshift.io/v1alpha1\nkind: UpgradeConfig\n\
                 metadata: {{name: {name}, namespace: kmm-demo}}\nspec:\n  type: OSD\n  \
                 upgradeAt: \"2026-01-01T00:00:00Z\"\n  PDBForceDrainTimeout: 60\n  \
                 desired: {{version: {version}}}\n"
            );
            files.push(RepoFile {
                path: format!("{name}.yaml"),
                contents: text.as_bytes().into(),
            });
        }
        files
    }

    /// Replays `files` as the head after `applied`, and reports the campaigns.
    fn sync(
        metrics: &UpgradeMetrics,
        applied: Option<&DesiredState>,
        files: Vec<RepoFile>,
    ) -> Replay {
        let head = CommitInfo {
            sha: "c0ffee".into(),
            branch: "main".into(),
            author: "Ada".into(),
            email: "ada@example.com".into(),
            time: jiff::Timestamp::UNIX_EPOCH,
            subject: "a commit".into(),
            pull_request: None,
        };
        let landed = [Landed {
            commit: head,
            files: Ok(files),
        }];
        let replay = follow::replay(
            applied,
            landed,
            "",
            &StaticCatalog::new(),
            &Reach::default(),
        );
        report_campaigns(metrics, &replay, applied);
        replay
    }

    #[test]
    fn error_lists_are_capped_in_count_and_bytes() {
        let errors = |n: usize, len: usize| -> Vec<String> {
            (0..n).map(|i| format!("{i}:{}", "x".repeat(len))).collect()
        };
        // (errors, max, max bytes, want)
        let rows = [
            (errors(2, 1), 5, 100, "0:x; 1:x".to_string()),
            (
                errors(7, 1),
                5,
                100,
                "0:x; 1:x; 2:x; 3:x; 4:x; and 2 more".to_string(),
            ),
            (
                errors(3, 10),
                5,
                30,
                "0:xxxxxxxxxx; 1:xxxxxxxxxx; and 1 more".to_string(),
            ),
            (errors(2, 10), 5, 5, "0:xxx...; and 1 more".to_string()),
            (Vec::new(), 5, 100, String::new()),
        ];
        for (errors, max, bytes, want) in rows {
            assert_eq!(capped(&errors, "; ", max, bytes), want);
        }
        let many = errors(100_000, 40);
        let text = capped(&many, "\n", STATUS_ERRORS, STATUS_ERROR_BYTES);
        assert!(text.len() <= STATUS_ERROR_BYTES + 32, "{}", text.len());
        assert!(
            text.ends_with("and 99900 more"),
            "{}",
            &text[text.len() - 40..]
        );
    }

    #[test]
    fn a_campaign_removed_from_git_takes_its_alerts_with_it() {
        let metrics = UpgradeMetrics::default();
        // The head breaks c (v9 is no Module's version): its validation alert fires.
        let replay = sync(&metrics, None, commit(&[("c", "v9")]));
        assert!(replay.accepted.is_none());
        assert_eq!(metrics.upgradeconfig_validation_failed("c"), Some(1));
        // The next commit deletes c.yaml and is accepted.
        let replay = sync(&metrics, None, commit(&[("kept", "v1")]));
        let applied = replay.accepted.expect("accepted").desired;
        assert_eq!(metrics.upgradeconfig_validation_failed("c"), None);
        assert_eq!(metrics.upgradeconfig_validation_failed("kept"), Some(0));

        // kept breached its window, then a commit deletes it: released, its alert goes.
        metrics.set_upgrade_window_breached("kept", true);
        let replay = sync(&metrics, Some(&applied), commit(&[]));
        assert!(replay.accepted.is_some());
        assert_eq!(metrics.upgrade_window_breached("kept"), None);
        assert_eq!(metrics.upgradeconfig_validation_failed("kept"), None);
    }

    #[test]
    fn a_rejected_head_keeps_the_applied_campaigns_and_its_own() {
        let metrics = UpgradeMetrics::default();
        let applied = sync(&metrics, None, commit(&[("kept", "v1")]))
            .accepted
            .expect("accepted")
            .desired;
        metrics.set_upgrade_window_breached("kept", true);
        // A rejected head breaks x; the one after it drops x.yaml but breaks y instead.
        sync(
            &metrics,
            Some(&applied),
            commit(&[("kept", "v1"), ("x", "v9")]),
        );
        assert_eq!(metrics.upgradeconfig_validation_failed("x"), Some(1));
        let replay = sync(&metrics, Some(&applied), commit(&[("y", "v9")]));
        assert!(replay.accepted.is_none() && replay.rejected.is_some());
        assert_eq!(metrics.upgradeconfig_validation_failed("x"), None);
        assert_eq!(metrics.upgradeconfig_validation_failed("y"), Some(1));
        // The cluster keeps the applied commit, and kept with it.
        assert_eq!(metrics.upgrade_window_breached("kept"), Some(1));
        assert_eq!(metrics.upgradeconfig_validation_failed("kept"), Some(0));
    }
}
