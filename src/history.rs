//! Commit-linked history: what capstan did, and the commit and pull request that asked for
//! it.
//!
//! Every record is written twice: as a Kubernetes Event (annotated with
//! `capstan.dev/revision` and `capstan.dev/pull-request`, as Flux annotates its events),
//! which `kubectl get events` shows and which expires; and as a durable `HistoryRecord` in
//! `capstan-system`, bounded by the `historyRetention` setting, which `capstan history`
//! reads. The ordered-upgrade controller writes its steps to the same store.
//!
//! Records of upgrade steps have names derived from what they record (node, module,
//! versions, step, commit), so writing one twice (after a restart) keeps one record.

#[cfg(test)]
pub mod log_lines;
pub mod recorder;

use std::collections::BTreeMap;
use std::fmt::Write as _;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde::Serialize;

use crate::controllers::drain::DrainStep;
use crate::controllers::upgrade::policy::asked_by;
use capstan_api::canonical::sha256_hex;
use capstan_api::capstan::SYSTEM_NAMESPACE;
use capstan_api::clock::rfc3339_micros;
use capstan_api::labels::{
    PULL_REQUEST_ANNOTATION, RECORD_COMMIT_LABEL, RECORD_MODULE_LABEL, RECORD_NODE_LABEL,
    RECORD_SYNC_LABEL, RECORD_TYPE_LABEL, REVISION_ANNOTATION,
};
use capstan_api::{Change, CommitRef, HistoryRecord, HistoryRecordSpec, RecordType, UpgradeStep};
use recorder::{EventKey, Recorder};

/// The component name on capstan's Events.
pub const COMPONENT: &str = "capstan";
/// Longest Event message; longer ones are cut with a note of how much was left out.
const MAX_EVENT_MESSAGE: usize = 1024;

/// A commit as records name it, from its `capstan.dev/revision` (`<branch>@sha1:<sha>`) and
/// `capstan.dev/pull-request` stamps: what an object applied from Git says of the commit
/// that last changed it. Author, time and subject are left empty; an empty revision gives an
/// empty reference (an object no commit stamped).
pub fn commit_ref_of_stamp(revision: &str, pull_request: Option<u64>) -> CommitRef {
    let sha = revision
        .rsplit_once("@sha1:")
        .map_or(revision, |(_, sha)| sha)
        .to_string();
    CommitRef {
        short_sha: sha.get(..7).unwrap_or(&sha).to_string(),
        sha,
        revision: revision.to_string(),
        pull_request,
        ..CommitRef::default()
    }
}

/// The name of a record. Upgrade steps: `step-` and a hash of node, module, versions, step
/// and commit, so the same step of the same commit is one record however often it is
/// written. Other records: type, short SHA and a hash of the time.
pub fn record_name(spec: &HistoryRecordSpec) -> String {
    let hash = |parts: &[&str]| sha256_hex(parts.join("\n").as_bytes(), 6);
    match spec.type_ {
        // A step, or a gate's attempt that ended (its gate, result and attempt are in
        // `step`): one record per move of the node and commit.
        RecordType::UpgradeStep | RecordType::Gate => format!(
            "{}-{}-{}",
            if spec.type_ == RecordType::Gate {
                "gate"
            } else {
                "step"
            },
            spec.commit.short_sha,
            hash(&[
                &spec.sync,
                spec.node.as_deref().unwrap_or(""),
                spec.module.as_deref().unwrap_or(""),
                spec.from_version.as_deref().unwrap_or(""),
                spec.to_version.as_deref().unwrap_or(""),
                spec.step.as_deref().unwrap_or(""),
                &spec.commit.sha,
            ])
        ),
        RecordType::Drain => format!(
            "drain-{}-{}",
            spec.commit.short_sha,
            hash(&[
                &spec.sync,
                spec.node.as_deref().unwrap_or(""),
                spec.to_version.as_deref().unwrap_or(""),
                spec.step.as_deref().unwrap_or(""),
                &spec.commit.sha,
            ])
        ),
        // A strategy's message names the drain it belongs to (the cordon's time) and the
        // pods it acts on, so the same action after a restart finds its record.
        RecordType::DrainStrategy => format!(
            "strategy-{}",
            hash(&[
                &spec.sync,
                spec.node.as_deref().unwrap_or(""),
                spec.step.as_deref().unwrap_or(""),
                &spec.message,
            ])
        ),
        // One release per upgrade and reason: the upgrade is named by its start.
        RecordType::SlotReleased => format!(
            "released-{}-{}",
            spec.commit.short_sha,
            hash(&[
                &spec.sync,
                spec.node.as_deref().unwrap_or(""),
                spec.module.as_deref().unwrap_or(""),
                spec.to_version.as_deref().unwrap_or(""),
                spec.step.as_deref().unwrap_or(""),
                &spec.message,
            ])
        ),
        RecordType::Sync => format!(
            "sync-{}-{}",
            spec.commit.short_sha,
            hash(&[&spec.sync, &spec.time])
        ),
        RecordType::Rejected => format!(
            "rejected-{}-{}",
            spec.commit.short_sha,
            hash(&[&spec.sync, &spec.time])
        ),
    }
}

/// The labels a record is found by.
fn labels_of(spec: &HistoryRecordSpec) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::from([
        (
            RECORD_TYPE_LABEL.to_string(),
            spec.type_.as_str().to_string(),
        ),
        (RECORD_COMMIT_LABEL.to_string(), spec.commit.sha.clone()),
        (RECORD_SYNC_LABEL.to_string(), spec.sync.clone()),
    ]);
    if let Some(node) = &spec.node {
        labels.insert(RECORD_NODE_LABEL.to_string(), node.clone());
    }
    if let Some(module) = &spec.module {
        labels.insert(RECORD_MODULE_LABEL.to_string(), module.replace('/', "."));
    }
    labels
}

/// Writes a record. Returns `false` when a record of the same name exists already (an
/// upgrade step written again after a restart).
pub async fn write_record(
    client: &kube::Client,
    spec: HistoryRecordSpec,
) -> Result<bool, kube::Error> {
    let api: Api<HistoryRecord> = Api::namespaced(client.clone(), SYSTEM_NAMESPACE);
    let (before, after) = match spec.type_ {
        RecordType::UpgradeStep | RecordType::SlotReleased => {
            ("upgrade.record.before", "upgrade.record.after")
        }
        RecordType::Drain | RecordType::DrainStrategy => {
            ("drain.record.before", "drain.record.after")
        }
        RecordType::Sync | RecordType::Rejected => ("sync.record.before", "sync.record.after"),
        RecordType::Gate => ("gate.record.before", "gate.record.after"),
    };
    let mut record = HistoryRecord::new(&record_name(&spec), spec);
    record.metadata.labels = Some(labels_of(&record.spec));
    record.metadata.annotations = Some(stamp_annotations(&record.spec.commit));
    crate::crash::point(before);
    match api.create(&PostParams::default(), &record).await {
        Ok(_) => {
            // Logged where it is created: a record is one state change, created once.
            if let Some(line) = log_line(&record.spec) {
                tracing::info!(
                    record = %record.metadata.name.as_deref().unwrap_or_default(),
                    node = %record.spec.node.as_deref().unwrap_or_default(),
                    commit = %short_or_unknown(&record.spec.commit),
                    pull_request = %pull_request(&record.spec.commit),
                    "{line}"
                );
            }
            crate::crash::point(after);
            Ok(true)
        }
        // Only "already exists" says the record is there: another 409 (a conflict) is an
        // error to retry, or the step would be taken as recorded when it is not.
        Err(kube::Error::Api(status)) if status.code == 409 && status.reason == "AlreadyExists" => {
            Ok(false)
        }
        Err(err) => Err(err),
    }
}

/// [`write_record`] from a controller, which may record before any sync made capstan's
/// namespace: the namespace is made (server-side apply as `manager`) and the write tried
/// again.
pub async fn write_record_making_namespace(
    client: &kube::Client,
    spec: HistoryRecordSpec,
    manager: &str,
) -> Result<bool, kube::Error> {
    match write_record(client, spec.clone()).await {
        Err(kube::Error::Api(status)) if status.code == 404 => {
            crate::runtime::ensure_namespace(client, SYSTEM_NAMESPACE, manager).await?;
            write_record(client, spec).await
        }
        other => other,
    }
}

fn stamp_annotations(commit: &CommitRef) -> BTreeMap<String, String> {
    let mut annotations = BTreeMap::new();
    if !commit.revision.is_empty() {
        annotations.insert(REVISION_ANNOTATION.to_string(), commit.revision.clone());
    }
    if let Some(pr) = commit.pull_request {
        annotations.insert(PULL_REQUEST_ANNOTATION.to_string(), pr.to_string());
    }
    annotations
}

/// Deletes the oldest records of `sync` beyond `keep`. Returns how many went.
pub async fn enforce_retention(
    client: &kube::Client,
    sync: &str,
    keep: u32,
) -> Result<usize, kube::Error> {
    let api: Api<HistoryRecord> = Api::namespaced(client.clone(), SYSTEM_NAMESPACE);
    let mut records = api
        .list(&ListParams::default().labels(&format!("{RECORD_SYNC_LABEL}={sync}")))
        .await?
        .items;
    let keep = keep.max(1) as usize;
    if records.len() <= keep {
        return Ok(0);
    }
    records.sort_by(|a, b| a.spec.time.cmp(&b.spec.time));
    let excess = records.len() - keep;
    for record in &records[..excess] {
        let name = record.metadata.name.as_deref().unwrap_or_default();
        match api.delete(name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(err) => return Err(err),
        }
    }
    Ok(excess)
}

/// Which records `capstan history` shows.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    /// Records about this node: its upgrade steps, and syncs that changed its labels.
    pub node: Option<String>,
    /// Records about this Module (`namespace/name`): its upgrade steps, and syncs that
    /// changed it.
    pub module: Option<String>,
    /// Records of commits whose SHA starts with this.
    pub commit: Option<String>,
}

impl Filter {
    /// Whether `spec` is one of the records asked for.
    pub fn matches(&self, spec: &HistoryRecordSpec) -> bool {
        let node_ok = self.node.as_ref().is_none_or(|node| {
            spec.node.as_ref() == Some(node)
                || spec
                    .changes
                    .iter()
                    .any(|c| c.kind == "Node" && &c.name == node)
        });
        let module_ok = self.module.as_ref().is_none_or(|module| {
            spec.module.as_ref() == Some(module)
                || spec.changes.iter().any(|c| {
                    c.kind == "Module"
                        && c.namespace
                            .as_ref()
                            .is_some_and(|ns| format!("{ns}/{}", c.name) == *module)
                })
        });
        let commit_ok = self
            .commit
            .as_ref()
            .is_none_or(|sha| spec.commit.sha.starts_with(&sha.to_ascii_lowercase()));
        node_ok && module_ok && commit_ok
    }
}

/// The records `filter` selects, oldest first.
pub async fn list(
    client: &kube::Client,
    filter: &Filter,
) -> Result<Vec<HistoryRecord>, kube::Error> {
    let api: Api<HistoryRecord> = Api::namespaced(client.clone(), SYSTEM_NAMESPACE);
    let mut params = ListParams::default();
    if let Some(sha) = filter.commit.as_ref().filter(|sha| sha.len() == 40) {
        params = params.labels(&format!("{RECORD_COMMIT_LABEL}={sha}"));
    }
    let mut records: Vec<HistoryRecord> = api
        .list(&params)
        .await?
        .items
        .into_iter()
        .filter(|record| filter.matches(&record.spec))
        .collect();
    sort_chronologically(&mut records);
    Ok(records)
}

/// Sorts records oldest first: by time, records of the same time in the order of the steps
/// of an upgrade (cordoned, forced, drained, steps 1-4, uncordoned), then by name.
pub fn sort_chronologically(records: &mut [HistoryRecord]) {
    records.sort_by(|a, b| {
        (&a.spec.time, step_rank(&a.spec), &a.metadata.name).cmp(&(
            &b.spec.time,
            step_rank(&b.spec),
            &b.metadata.name,
        ))
    });
}

/// Where a record stands among the records of one upgrade of a node: a campaign's drain
/// around the four steps. Records written in one reconcile share a time (step 4 and the
/// uncordon), so the time alone does not order them.
fn step_rank(spec: &HistoryRecordSpec) -> usize {
    let step = spec.step.as_deref().unwrap_or_default();
    match spec.type_ {
        RecordType::Drain => match DrainStep::parse(step) {
            Some(DrainStep::Cordoned) => 1,
            Some(DrainStep::Drained) => 3,
            Some(DrainStep::Uncordoned) => 8,
            None => 9,
        },
        // The nodekeeper forces a drain between its cordon and its end.
        RecordType::DrainStrategy => 2,
        RecordType::UpgradeStep => UpgradeStep::ALL
            .iter()
            .find(|s| s.as_str() == step)
            .map_or(7, |s| 3 + s.number()),
        // A sync comes before what it asked for.
        _ => 0,
    }
}

/// The log line of a record just created: the controllers' state changes (upgrade steps,
/// drains, forced drains) reach the log once each, as they reach the history, naming the
/// node, the step, the commit and its pull request. `None` for syncs and rejected commits,
/// which `capstan sync` prints itself.
pub fn log_line(spec: &HistoryRecordSpec) -> Option<String> {
    match spec.type_ {
        RecordType::Sync | RecordType::Rejected => None,
        // The message names what was forced; the record's name is a hash of it, so the
        // commit is added here.
        RecordType::DrainStrategy => Some(format!(
            "the nodekeeper forced a drain: {}{}",
            spec.message,
            asked_by(&spec.commit)
        )),
        _ => Some(spec.message.clone()),
    }
}

/// A record as `capstan history --format json` prints it.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RecordView<'a> {
    /// The record's object name.
    pub name: &'a str,
    /// For an upgrade step: the upgrade it belongs to (see [`upgrade_id`]), the same for
    /// every step of one upgrade.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upgrade: Option<String>,
    /// The record.
    #[serde(flatten)]
    pub spec: &'a HistoryRecordSpec,
}

impl<'a> RecordView<'a> {
    /// The view of `record`.
    pub fn of(record: &'a HistoryRecord) -> RecordView<'a> {
        RecordView {
            name: record.metadata.name.as_deref().unwrap_or_default(),
            upgrade: upgrade_id(&record.spec),
            spec: &record.spec,
        }
    }
}

/// Which upgrade an upgrade-step record belongs to: node, module, versions and commit, as
/// `worker-1 kmm-demo/my-kmod v1->v2 3cf3bea` (`none` for a missing version). `None` for
/// other records.
pub fn upgrade_id(spec: &HistoryRecordSpec) -> Option<String> {
    (spec.type_ == RecordType::UpgradeStep).then(|| {
        format!(
            "{} {} {}->{} {}",
            spec.node.as_deref().unwrap_or("?"),
            spec.module.as_deref().unwrap_or("?"),
            spec.from_version.as_deref().unwrap_or("none"),
            spec.to_version.as_deref().unwrap_or("none"),
            spec.commit.short_sha,
        )
    })
}

/// The steps of one ordered upgrade: one Module on one node, between two versions, asked
/// for by one commit; under a campaign, with the drain around them.
#[derive(Clone, Debug)]
pub struct Upgrade<'a> {
    /// Its [`upgrade_id`].
    pub id: String,
    /// The step records, oldest first.
    pub steps: Vec<&'a HistoryRecord>,
    /// The records of the drain around the steps (cordoned, forced by the nodekeeper,
    /// drained, uncordoned), oldest first; none outside a campaign ([`attach_drains`]).
    pub drain: Vec<&'a HistoryRecord>,
}

impl Upgrade<'_> {
    /// The first step's record (an upgrade has at least one).
    fn first(&self) -> &HistoryRecordSpec {
        &self.steps[0].spec
    }

    /// How many steps the move has in all (4; 2 for a first label or a removed one).
    pub fn expected_steps(&self) -> usize {
        let spec = self.first();
        UpgradeStep::for_move(spec.from_version.as_deref(), spec.to_version.as_deref()).len()
    }
}

/// The upgrade-step records of `records` grouped by upgrade, in the order each upgrade's
/// first step happened (`records` oldest first, as [`list`] returns them).
pub fn upgrades(records: &[HistoryRecord]) -> Vec<Upgrade<'_>> {
    let mut grouped: Vec<Upgrade<'_>> = Vec::new();
    for record in records {
        let Some(id) = upgrade_id(&record.spec) else {
            continue;
        };
        match grouped.iter_mut().find(|upgrade| upgrade.id == id) {
            Some(upgrade) => upgrade.steps.push(record),
            None => grouped.push(Upgrade {
                id,
                steps: vec![record],
                drain: Vec::new(),
            }),
        }
    }
    grouped
}

/// Gives each of `upgrades` the drain records of `records` that belong to it: of the same
/// node, towards the same version, asked for by the same commit (a forced drain names no
/// version: the same node and commit). One drain moves every Module of its node that goes
/// to the version, so its records go with the first such upgrade. Returns the records that
/// are neither steps nor attached, in their order.
pub fn attach_drains<'a>(
    upgrades: &mut [Upgrade<'a>],
    records: &'a [HistoryRecord],
) -> Vec<&'a HistoryRecord> {
    let mut others = Vec::new();
    for record in records {
        let spec = &record.spec;
        let drain = match spec.type_ {
            RecordType::Drain | RecordType::DrainStrategy => true,
            RecordType::UpgradeStep => continue,
            _ => false,
        };
        let owner = upgrades.iter_mut().find(|upgrade| {
            let first = upgrade.first();
            drain
                && first.node == spec.node
                && first.commit.sha == spec.commit.sha
                && (spec.type_ == RecordType::DrainStrategy || first.to_version == spec.to_version)
        });
        match owner {
            Some(upgrade) => upgrade.drain.push(record),
            None => others.push(record),
        }
    }
    others
}

/// Upgrades as text: a heading per upgrade (node, module, versions, commit and pull
/// request, steps done, total time), then each step with its time, commit, pull request and
/// duration (since the step before, or since the upgrade started).
pub fn render_upgrades_text(upgrades: &[Upgrade<'_>]) -> String {
    let mut out = String::new();
    for upgrade in upgrades {
        let first = upgrade.first();
        let total: f64 = upgrade
            .steps
            .iter()
            .filter_map(|record| record.spec.duration_seconds)
            .sum();
        let subject = if first.commit.subject.is_empty() {
            String::new()
        } else {
            format!(" \"{}\"", first.commit.subject)
        };
        let _ = writeln!(
            out,
            "{} {} {} -> {}, commit {}{}{}: {} of {} steps, {total:.1}s",
            first.node.as_deref().unwrap_or("?"),
            first.module.as_deref().unwrap_or("?"),
            first.from_version.as_deref().unwrap_or("none"),
            first.to_version.as_deref().unwrap_or("none"),
            short_or_unknown(&first.commit),
            subject,
            first
                .commit
                .pull_request
                .map_or(String::new(), |pr| format!(" (#{pr})")),
            upgrade.steps.len(),
            upgrade.expected_steps(),
        );
        out.push_str(
            "  TIME                  STEP                       COMMIT   PR     DURATION\n",
        );
        let mut rows: Vec<&HistoryRecord> = upgrade
            .steps
            .iter()
            .chain(&upgrade.drain)
            .copied()
            .collect();
        rows.sort_by(|a, b| {
            (&a.spec.time, step_rank(&a.spec)).cmp(&(&b.spec.time, step_rank(&b.spec)))
        });
        let mut before: Option<&str> = None;
        for record in rows {
            let spec = &record.spec;
            let step = spec.step.as_deref().unwrap_or("?");
            let (number, duration) = if spec.type_ == RecordType::UpgradeStep {
                let number = UpgradeStep::ALL
                    .iter()
                    .find(|s| s.as_str() == step)
                    .map_or("?".to_string(), |s| s.number().to_string());
                (number, spec.duration_seconds)
            } else {
                // A drain's record has no duration of its own: the time since the row
                // before is how long the cordon, the drain or the steps took.
                (
                    " ".to_string(),
                    before.and_then(|at| seconds_between(at, &spec.time)),
                )
            };
            let duration = duration.map_or("-".to_string(), |seconds| format!("{seconds:.1}s"));
            let _ = writeln!(
                out,
                "  {:<21} {number} {step:<24} {:<8} {:<6} {duration}",
                short_time(&spec.time),
                short_or_unknown(&spec.commit),
                pull_request(&spec.commit),
            );
            before = Some(&spec.time);
        }
        out.push('\n');
    }
    out
}

fn short_or_unknown(commit: &CommitRef) -> &str {
    if commit.short_sha.is_empty() {
        "-"
    } else {
        &commit.short_sha
    }
}

/// `#12`, or `-` for a commit that merged no pull request (as the tables and log lines
/// show it).
pub fn pull_request(commit: &CommitRef) -> String {
    commit
        .pull_request
        .map_or("-".to_string(), |pr| format!("#{pr}"))
}

/// Seconds from one RFC 3339 time to another; `None` when either does not parse.
fn seconds_between(from: &str, to: &str) -> Option<f64> {
    let from: jiff::Timestamp = from.parse().ok()?;
    let to: jiff::Timestamp = to.parse().ok()?;
    Some(to.duration_since(from).as_secs_f64())
}

/// `2026-11-21 10:14:13` of an RFC 3339 time.
fn short_time(time: &str) -> String {
    time.get(..19).unwrap_or(time).replace('T', " ")
}

/// Records as a text table: time, type, commit, pull request, and what happened.
pub fn render_text(records: &[HistoryRecord]) -> String {
    if records.is_empty() {
        return "No history records.\n".to_string();
    }
    let mut out = String::from("TIME                  TYPE          COMMIT   PR     WHAT\n");
    for record in records {
        let spec = &record.spec;
        let _ = writeln!(
            out,
            "{:<21} {:<13} {:<8} {:<6} {}",
            short_time(&spec.time),
            spec.type_.as_str(),
            short_or_unknown(&spec.commit),
            pull_request(&spec.commit),
            describe(spec)
        );
    }
    out
}

/// `configured Module kmm-demo/my-kmod`, `released Node worker-2`.
pub fn describe_change(change: &Change) -> String {
    match &change.namespace {
        Some(ns) => format!("{} {} {ns}/{}", change.action, change.kind, change.name),
        None => format!("{} {} {}", change.action, change.kind, change.name),
    }
}

/// One line for a record.
fn describe(spec: &HistoryRecordSpec) -> String {
    match spec.type_ {
        RecordType::UpgradeStep => {
            let mut line = format!(
                "{} {} {} -> {}: {}",
                spec.node.as_deref().unwrap_or("?"),
                spec.module.as_deref().unwrap_or("?"),
                spec.from_version.as_deref().unwrap_or("none"),
                spec.to_version.as_deref().unwrap_or("none"),
                spec.step.as_deref().unwrap_or("?"),
            );
            if let Some(seconds) = spec.duration_seconds {
                let _ = write!(line, " ({seconds:.1}s)");
            }
            line
        }
        _ => spec.message.clone(),
    }
}

/// What an Event is about.
#[derive(Clone, Debug)]
pub struct EventTarget {
    /// `apiVersion` of the object.
    pub api_version: String,
    /// Kind.
    pub kind: String,
    /// Namespace; Events about cluster-scoped objects go to `default`, as kubectl expects.
    pub namespace: Option<String>,
    /// Name.
    pub name: String,
    /// UID, when known (kubectl describe matches on it).
    pub uid: Option<String>,
}

impl EventTarget {
    /// A Node, as the Events of its upgrade steps, drains and strategies name it.
    pub fn node(node: &k8s_openapi::api::core::v1::Node) -> EventTarget {
        use kube::ResourceExt as _;
        EventTarget {
            api_version: "v1".into(),
            kind: "Node".into(),
            namespace: None,
            name: node.name_any(),
            uid: node.uid(),
        }
    }
}

/// Publishes an Event about `target` through `recorder`, annotated with the commit's
/// revision and pull request and with `annotations` (an upgrade step's module, versions
/// and step). `warning` makes it a Warning event.
pub async fn record_event(
    recorder: &Recorder,
    target: &EventTarget,
    warning: bool,
    reason: &str,
    message: &str,
    commit: &CommitRef,
    annotations: BTreeMap<String, String>,
) -> Result<(), kube::Error> {
    let mut all_annotations = annotations;
    all_annotations.extend(stamp_annotations(commit));
    let regarding = ObjectReference {
        api_version: Some(target.api_version.clone()),
        kind: Some(target.kind.clone()),
        // Events about cluster-scoped objects go to `default`, as kubectl expects.
        namespace: target.namespace.clone(),
        name: Some(target.name.clone()),
        uid: target.uid.clone(),
        ..ObjectReference::default()
    };
    let key = EventKey {
        warning,
        reason: reason.to_string(),
        action: reason.to_string(),
        note: truncate(message),
        regarding: (&regarding).into(),
        related: None,
        annotations: all_annotations,
    };
    recorder.publish(key, &regarding, None).await
}

/// `message` cut to [`MAX_EVENT_MESSAGE`] bytes at a character boundary.
fn truncate(message: &str) -> String {
    if message.len() <= MAX_EVENT_MESSAGE {
        return message.to_string();
    }
    let note = " … (more in `capstan history`)";
    let mut end = MAX_EVENT_MESSAGE - note.len();
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{note}", &message[..end])
}

/// The time records are stamped with: `clock`'s now, RFC 3339 with microseconds.
pub fn now(clock: &dyn capstan_api::clock::Clock) -> String {
    rfc3339_micros(clock.now())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(type_: RecordType) -> HistoryRecordSpec {
        HistoryRecordSpec {
            time: "2026-11-21T10:00:00.000000Z".into(),
            type_,
            sync: "capstan".into(),
            commit: CommitRef {
                sha: "a".repeat(40),
                short_sha: "aaaaaaa".into(),
                revision: format!("main@sha1:{}", "a".repeat(40)),
                pull_request: Some(42),
                ..CommitRef::default()
            },
            message: "applied".into(),
            ..HistoryRecordSpec::default()
        }
    }

    #[test]
    fn step_records_are_named_by_what_they_record() {
        let mut step = spec(RecordType::UpgradeStep);
        step.node = Some("worker-1".into());
        step.module = Some("kmm/a".into());
        step.step = Some("old-module-unloaded".into());
        let mut later = step.clone();
        later.time = "2026-11-21T11:00:00.000000Z".into();
        assert_eq!(record_name(&step), record_name(&later));
        let mut other = step.clone();
        other.node = Some("worker-2".into());
        assert_ne!(record_name(&step), record_name(&other));
        assert!(record_name(&step).starts_with("step-aaaaaaa-"));
        let sync = spec(RecordType::Sync);
        let mut sync_later = sync.clone();
        sync_later.time = "2026-11-21T11:00:00.000000Z".into();
        assert_ne!(record_name(&sync), record_name(&sync_later));
    }

    #[test]
    fn filters_by_node_module_and_commit() {
        let mut sync = spec(RecordType::Sync);
        sync.changes = vec![
            Change {
                action: "configured".into(),
                kind: "Node".into(),
                namespace: None,
                name: "worker-1".into(),
            },
            Change {
                action: "configured".into(),
                kind: "Module".into(),
                namespace: Some("kmm".into()),
                name: "a".into(),
            },
        ];
        let mut step = spec(RecordType::UpgradeStep);
        step.node = Some("worker-2".into());
        step.module = Some("kmm/b".into());
        let filter = |node: Option<&str>, module: Option<&str>, commit: Option<&str>| Filter {
            node: node.map(str::to_string),
            module: module.map(str::to_string),
            commit: commit.map(str::to_string),
        };
        let cases = [
            (filter(None, None, None), true, true),
            (filter(Some("worker-1"), None, None), true, false),
            (filter(Some("worker-2"), None, None), false, true),
            (filter(None, Some("kmm/a"), None), true, false),
            (filter(None, Some("kmm/b"), None), false, true),
            (filter(None, None, Some("AAAA")), true, true),
            (filter(None, None, Some("b")), false, false),
        ];
        for (f, sync_shown, step_shown) in cases {
            assert_eq!(f.matches(&sync), sync_shown, "{f:?} sync");
            assert_eq!(f.matches(&step), step_shown, "{f:?} step");
        }
    }

    fn step_record(
        node: &str,
        step: UpgradeStep,
        to: &str,
        sha: char,
        time: &str,
    ) -> HistoryRecord {
        let mut spec = spec(RecordType::UpgradeStep);
        spec.time = time.into();
        spec.commit.sha = sha.to_string().repeat(40);
        spec.commit.short_sha = sha.to_string().repeat(7);
        spec.node = Some(node.into());
        spec.module = Some("kmm-demo/my-kmod".into());
        spec.step = Some(step.as_str().into());
        spec.from_version = Some("v1".into());
        spec.to_version = Some(to.into());
        spec.duration_seconds = Some(1.5);
        HistoryRecord::new(&record_name(&spec), spec)
    }

    #[test]
    fn steps_are_grouped_by_upgrade_and_shown_step_by_step() {
        use UpgradeStep::*;
        let records = vec![
            step_record(
                "worker-1",
                DevicePluginStopped,
                "v2",
                'b',
                "2026-11-21T10:00:01.000000Z",
            ),
            spec_record(spec(RecordType::Sync)),
            step_record(
                "worker-1",
                OldModuleUnloaded,
                "v2",
                'b',
                "2026-11-21T10:00:02.500000Z",
            ),
            step_record(
                "worker-1",
                DevicePluginStopped,
                "v3",
                'c',
                "2026-11-21T11:00:00.000000Z",
            ),
        ];
        let upgrades = upgrades(&records);
        assert_eq!(upgrades.len(), 2);
        assert_eq!(upgrades[0].id, "worker-1 kmm-demo/my-kmod v1->v2 bbbbbbb");
        assert_eq!(upgrades[0].steps.len(), 2);
        assert_eq!(upgrades[0].expected_steps(), 4);
        let text = render_upgrades_text(&upgrades);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "worker-1 kmm-demo/my-kmod v1 -> v2, commit bbbbbbb (#42): 2 of 4 steps, 3.0s"
        );
        assert!(lines[1].contains("STEP") && lines[1].contains("DURATION"));
        assert_eq!(
            lines[2],
            "  2026-11-21 10:00:01   1 device-plugin-stopped    bbbbbbb  #42    1.5s"
        );
        assert!(lines[3].contains("2 old-module-unloaded"), "{text}");
        assert!(text.contains("v1 -> v3, commit ccccccc"), "{text}");
        let view = serde_json::to_value(RecordView::of(&records[0])).unwrap();
        assert_eq!(view["upgrade"], "worker-1 kmm-demo/my-kmod v1->v2 bbbbbbb");
        assert_eq!(view["step"], "device-plugin-stopped");
        let sync = serde_json::to_value(RecordView::of(&records[1])).unwrap();
        assert!(sync.get("upgrade").is_none());
    }

    fn spec_record(spec: HistoryRecordSpec) -> HistoryRecord {
        HistoryRecord::new("sync-record", spec)
    }

    #[test]
    fn records_of_one_time_are_in_the_order_of_the_steps() {
        use UpgradeStep::*;
        let time = "2026-11-21T10:00:05.000000Z";
        let drain = |step: DrainStep| {
            let mut spec = spec(RecordType::Drain);
            spec.time = time.into();
            spec.node = Some("worker-1".into());
            spec.to_version = Some("v2".into());
            spec.step = Some(step.as_str().into());
            HistoryRecord::new(&record_name(&spec), spec)
        };
        let mut strategy = spec(RecordType::DrainStrategy);
        strategy.time = time.into();
        strategy.step = Some("PDB-DELETE".into());
        let mut sync = spec(RecordType::Sync);
        sync.time = time.into();
        let mut records = vec![
            drain(DrainStep::Uncordoned),
            step_record("worker-1", DevicePluginStarted, "v2", 'b', time),
            step_record("worker-1", NewModuleLoaded, "v2", 'b', time),
            step_record("worker-1", OldModuleUnloaded, "v2", 'b', time),
            step_record("worker-1", DevicePluginStopped, "v2", 'b', time),
            drain(DrainStep::Drained),
            HistoryRecord::new(&record_name(&strategy), strategy),
            drain(DrainStep::Cordoned),
            spec_record(sync),
            // Earlier than the rest: first whatever its step.
            step_record(
                "worker-1",
                DevicePluginStarted,
                "v2",
                'a',
                "2026-11-21T10:00:04.999999Z",
            ),
        ];
        sort_chronologically(&mut records);
        let steps: Vec<String> = records
            .iter()
            .map(|r| {
                format!(
                    "{} {}",
                    r.spec.type_.as_str(),
                    r.spec.step.as_deref().unwrap_or("")
                )
            })
            .collect();
        assert_eq!(
            steps,
            [
                "UpgradeStep device-plugin-started",
                "Sync ",
                "Drain cordoned",
                "DrainStrategy PDB-DELETE",
                "Drain drained",
                "UpgradeStep device-plugin-stopped",
                "UpgradeStep old-module-unloaded",
                "UpgradeStep new-module-loaded",
                "UpgradeStep device-plugin-started",
                "Drain uncordoned",
            ]
        );
    }

    #[test]
    fn the_controllers_records_are_logged_syncs_are_not() {
        let mut step = spec(RecordType::UpgradeStep);
        step.message = "kmm/a v1 -> v2 on worker-1: step 1 device-plugin-stopped after 1.5s, \
                        asked by aaaaaaa (#42)"
            .into();
        let mut drain = spec(RecordType::Drain);
        drain.message = "worker-1 cordoned and marked upgrading for its upgrade to v2 (campaign \
                         kmm/c), asked by aaaaaaa (#42)"
            .into();
        let mut strategy = spec(RecordType::DrainStrategy);
        strategy.message = "DELETE (Default pod deletion) on worker-1, draining since \
                            2026-11-21T09:00:00Z: apps/web deleted"
            .into();
        let mut unstamped = strategy.clone();
        unstamped.commit = CommitRef::default();
        // (record, line)
        let rows = [
            (spec(RecordType::Sync), None),
            (spec(RecordType::Rejected), None),
            (step.clone(), Some(step.message.clone())),
            (drain.clone(), Some(drain.message.clone())),
            (
                strategy,
                Some(
                    "the nodekeeper forced a drain: DELETE (Default pod deletion) on worker-1, \
                     draining since 2026-11-21T09:00:00Z: apps/web deleted, asked by aaaaaaa (#42)"
                        .to_string(),
                ),
            ),
            (
                unstamped,
                Some(
                    "the nodekeeper forced a drain: DELETE (Default pod deletion) on worker-1, \
                     draining since 2026-11-21T09:00:00Z: apps/web deleted"
                        .to_string(),
                ),
            ),
        ];
        for (spec, line) in rows {
            assert_eq!(log_line(&spec), line, "{:?}", spec.type_);
        }
    }

    #[test]
    fn commits_are_read_from_stamps() {
        let sha = "0123456789abcdef0123456789abcdef01234567";
        let commit = commit_ref_of_stamp(&format!("main@sha1:{sha}"), Some(7));
        assert_eq!(commit.sha, sha);
        assert_eq!(commit.short_sha, "0123456");
        assert_eq!(commit.revision, format!("main@sha1:{sha}"));
        assert_eq!(commit.pull_request, Some(7));
        assert_eq!(commit_ref_of_stamp("", None), CommitRef::default());
        assert!(stamp_annotations(&CommitRef::default()).is_empty());
    }

    #[test]
    fn long_event_messages_are_cut_at_a_character_boundary() {
        let long = "é".repeat(2000);
        let cut = truncate(&long);
        assert!(cut.len() <= MAX_EVENT_MESSAGE);
        assert!(cut.ends_with("(more in `capstan history`)"));
        assert_eq!(truncate("short"), "short");
    }
}
