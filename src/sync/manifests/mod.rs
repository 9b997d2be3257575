//! Manifests: the files of one commit turned into the validated desired state, or the
//! reasons the whole commit is rejected, each naming the file, line and field.
//!
//! Every `*.yaml` / `*.yml` file under the synced path is read as a stream of YAML
//! documents; `<path>/capstan.yaml` holds the repository settings instead ([`Settings`]).
//! Files and folders whose names start with `.` (`.github/`) are not manifests. A commit is
//! rejected, never half-applied, when any document:
//!
//! - is not YAML, breaks the size limits ([`MAX_FILE_BYTES`], [`MAX_COMMIT_BYTES`]) or
//!   expands aliases beyond [`MAX_ALIAS_EXPANSION`] nodes (an alias bomb);
//! - is not a mapping with `apiVersion`, `kind` and `metadata.name`;
//! - has a kind the cluster does not serve ([`Catalog`]; CRDs declared in the same commit
//!   count) or a kind that is a request, not an object (`TokenReview`, `Eviction`), a
//!   namespace on a cluster-scoped kind, or invalid names, labels or annotations;
//! - is a `Module`, `UpgradeConfig` or `LeaderWorkerSet` with an unknown field, a value its
//!   schema does not allow, or (Modules) a name too long for KMM's labels or an invalid
//!   modprobe or kernel mapping setup;
//! - is a `Node` that sets anything but labels and annotations, or a version label for a
//!   Module the commit does not declare with a version;
//! - declares an object another document declares too.
//!
//! Whether a changed version label names the Module's current version, whether a Module's
//! version and image change together, and whether a Namespace leaves the repository while
//! objects still live in it depend on the previous commit too, so those rules are
//! [`check_transition`].

mod catalog;
mod dra;
mod rollout;
mod rules;
mod schema;
mod settings;
mod transition;
mod yaml;

use std::fmt;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::Value;

pub use catalog::{Catalog, Scope, StaticCatalog};
pub use settings::{DriftPolicy, SETTINGS_FILE, Settings};
pub use transition::check_transition;
pub use yaml::{MAX_ALIAS_EXPANSION, MAX_COMMIT_BYTES, MAX_FILE_BYTES};

pub(crate) use rules::{KmmLabel, classify, is_node, modules_in};

use catalog::CommitCatalog;
use rules::Parsed;

/// A committed file: its path relative to the repository root, and its contents.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ManifestFile<'a> {
    /// Path relative to the repository root, `/`-separated.
    pub path: &'a str,
    /// The committed bytes.
    pub contents: &'a [u8],
}

/// One object the repository declares.
#[derive(Clone, Debug, PartialEq)]
pub struct Manifest {
    /// Path of the file, relative to the repository root.
    pub file: String,
    /// 1-based line where the document's content starts (its first key).
    pub line: usize,
    /// `apiVersion`, as written.
    pub api_version: String,
    /// `kind`, as written.
    pub kind: String,
    /// The namespace: as written, or the default namespace for a namespaced kind that sets
    /// none; `None` for cluster-scoped kinds.
    pub namespace: Option<String>,
    /// `metadata.name`.
    pub name: String,
    /// The object as it will be applied (with the defaulted namespace filled in).
    pub object: Value,
}

impl Manifest {
    /// The identity of the object: group, kind, namespace and name.
    pub fn id(&self) -> ObjectId {
        ObjectId {
            group: group_of(&self.api_version).to_string(),
            kind: self.kind.clone(),
            namespace: self.namespace.clone(),
            name: self.name.clone(),
        }
    }
}

/// The group part of an `apiVersion`: `apps` for `apps/v1`, empty for `v1`.
fn group_of(api_version: &str) -> &str {
    api_version
        .split_once('/')
        .map_or("", |(group, _version)| group)
}

/// The identity of an object in the cluster: two manifests with the same id declare the
/// same object. Displayed as `Module kmm-demo/my-kmod` or `Node worker-1`.
#[derive(
    Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct ObjectId {
    /// API group, empty for the core group.
    pub group: String,
    /// Kind.
    pub kind: String,
    /// Namespace; `None` for cluster-scoped objects.
    pub namespace: Option<String>,
    /// Name.
    pub name: String,
}

impl fmt::Display for ObjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.namespace {
            Some(namespace) => write!(f, "{} {namespace}/{}", self.kind, self.name),
            None => write!(f, "{} {}", self.kind, self.name),
        }
    }
}

/// Everything a commit declares, validated.
#[derive(Clone, Debug, PartialEq)]
pub struct DesiredState {
    /// The objects, ordered by file path, then by their order in the file.
    pub manifests: Vec<Manifest>,
    /// The repository settings (defaults when there is no `capstan.yaml`).
    pub settings: Settings,
}

/// Why a commit is rejected: one problem in one file. Displayed as
/// `path/to/file.yaml:12: spec.moduleLoader.container.modprobe.firmwarepath: unknown field`,
/// leaving out the parts that are not known.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ManifestError {
    /// Path of the file, relative to the repository root.
    pub file: String,
    /// 1-based line, when known.
    pub line: Option<usize>,
    /// Path of the field inside the object (`spec.selector`), when the problem has one.
    pub field: Option<String>,
    /// What is wrong, and where it helps, what to do.
    pub message: String,
}

impl ManifestError {
    /// A problem at `file` (and `line`, `field` when known).
    pub fn new(
        file: &str,
        line: Option<usize>,
        field: Option<String>,
        message: impl Into<String>,
    ) -> Self {
        ManifestError {
            file: file.to_string(),
            line,
            field,
            message: message.into(),
        }
    }
}

impl fmt::Display for ManifestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.file)?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        f.write_str(": ")?;
        if let Some(field) = &self.field {
            write!(f, "{field}: ")?;
        }
        f.write_str(&self.message)
    }
}

impl std::error::Error for ManifestError {}

/// Loads the desired state of one commit: every `*.yaml` / `*.yml` file among `files` under
/// `path` (a repository-relative folder; `""` for the whole repository), each a stream of
/// documents, and `<path>/capstan.yaml` as the settings. `catalog` says which kinds the
/// cluster serves.
///
/// The result does not depend on the order of `files`. Fails with every problem found (not
/// only the first), sorted by file and line, when any file or document breaks a rule of the
/// module documentation; then nothing of the commit may be applied.
pub fn load(
    files: &[ManifestFile<'_>],
    path: &str,
    catalog: &dyn Catalog,
) -> Result<DesiredState, Vec<ManifestError>> {
    let root = path.trim_start_matches("./").trim_matches('/');
    let root = if root == "." { "" } else { root };
    let settings_path = if root.is_empty() {
        SETTINGS_FILE.to_string()
    } else {
        format!("{root}/{SETTINGS_FILE}")
    };

    let mut selected: Vec<&ManifestFile<'_>> = files
        .iter()
        .filter(|file| is_manifest_file(file.path, root))
        .collect();
    selected.sort_by(|a, b| a.path.cmp(b.path));
    selected.dedup_by(|a, b| a.path == b.path);

    let mut errors = Vec::new();
    let mut settings = Settings::default();
    let mut documents = Vec::new();
    let mut total_bytes = 0_usize;
    for file in selected {
        total_bytes = total_bytes.saturating_add(file.contents.len());
        if let Some(problem) = size_problem(file, total_bytes) {
            errors.push(problem);
            if total_bytes > MAX_COMMIT_BYTES {
                break;
            }
            continue;
        }
        let text = match yaml::text(file.contents) {
            Ok(text) => text,
            Err(err) => {
                errors.push(syntax_error(file.path, err));
                continue;
            }
        };
        if file.path == settings_path {
            match settings::parse(file.path, text) {
                Ok(parsed) => settings = parsed,
                Err(found) => errors.extend(found),
            }
            continue;
        }
        match yaml::documents(text) {
            Ok(trees) => {
                for tree in trees {
                    match rules::header(file.path, tree) {
                        Ok(parsed) => documents.push(parsed),
                        Err(err) => errors.push(err),
                    }
                }
            }
            Err(err) => errors.push(syntax_error(file.path, err)),
        }
    }

    let declared_crds = declared_crds(&documents, &mut errors);
    let catalog = CommitCatalog::new(catalog, &declared_crds);
    for document in &mut documents {
        errors.extend(rules::check(
            document,
            &catalog,
            &settings.default_namespace,
        ));
    }
    errors.extend(rules::duplicates(&documents));
    errors.extend(rules::version_labels(&documents));
    errors.extend(rules::upgrade_configs(&documents));
    errors.extend(dra::device_classes(&documents));

    if errors.is_empty() {
        Ok(DesiredState {
            manifests: documents
                .into_iter()
                .map(|parsed| parsed.manifest)
                .collect(),
            settings,
        })
    } else {
        // Stable: problems on the same line keep the order they were found in.
        errors.sort_by(|a, b| (&a.file, a.line).cmp(&(&b.file, b.line)));
        errors.dedup();
        Err(errors)
    }
}

/// A file over [`MAX_FILE_BYTES`], or the file with which the commit's manifests pass
/// [`MAX_COMMIT_BYTES`] (`total_bytes` counts it).
fn size_problem(file: &ManifestFile<'_>, total_bytes: usize) -> Option<ManifestError> {
    let size = file.contents.len();
    let message = if size > MAX_FILE_BYTES {
        format!(
            "the file has {size} bytes, over the limit of {MAX_FILE_BYTES} bytes (1 MiB) for one \
             manifest file; split it or leave generated data out of Git"
        )
    } else if total_bytes > MAX_COMMIT_BYTES {
        format!(
            "the manifest files reach {total_bytes} bytes with this file ({size} bytes), over \
             the limit of {MAX_COMMIT_BYTES} bytes (64 MiB) for one commit"
        )
    } else {
        return None;
    };
    Some(ManifestError::new(file.path, None, None, message))
}

/// Whether `path` is a YAML file below `root`, outside hidden files and folders.
fn is_manifest_file(path: &str, root: &str) -> bool {
    let below = if root.is_empty() {
        Some(path)
    } else {
        path.strip_prefix(root)
            .and_then(|rest| rest.strip_prefix('/'))
    };
    let Some(below) = below else {
        return false;
    };
    let hidden = below.split('/').any(|part| part.starts_with('.'));
    let yaml = below.ends_with(".yaml") || below.ends_with(".yml");
    yaml && !hidden
}

/// The CRDs the commit declares, decoded; a CRD that does not decode is reported and
/// serves nothing.
fn declared_crds(
    documents: &[Parsed],
    errors: &mut Vec<ManifestError>,
) -> Vec<CustomResourceDefinition> {
    let mut crds = Vec::new();
    for parsed in documents {
        let manifest = &parsed.manifest;
        if manifest.api_version != "apiextensions.k8s.io/v1"
            || manifest.kind != "CustomResourceDefinition"
        {
            continue;
        }
        match serde_json::from_value::<CustomResourceDefinition>(manifest.object.clone()) {
            Ok(crd) if Scope::from_crd_scope(&crd.spec.scope).is_none() => {
                errors.push(parsed.error(
                    &yaml::FieldPath::of(&["spec", "scope"]),
                    format!(
                        "{:?} is not a scope: use Namespaced or Cluster",
                        crd.spec.scope
                    ),
                ));
            }
            Ok(crd) => crds.push(crd),
            Err(err) => errors.push(ManifestError::new(
                &manifest.file,
                Some(manifest.line),
                None,
                format!("not a valid CustomResourceDefinition: {err}"),
            )),
        }
    }
    crds
}

fn syntax_error(file: &str, err: yaml::SyntaxError) -> ManifestError {
    let message = match err.column {
        Some(column) => format!("invalid YAML (column {column}): {}", err.message),
        None => format!("invalid YAML: {}", err.message),
    };
    ManifestError::new(file, err.line, None, message)
}

/// The declared name closest to a misspelt one (ignoring case, at most two edits away, or
/// one edit in five for long names), for "did you mean" hints.
fn closest_name<'a>(unknown: &str, declared: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let lower = unknown.to_ascii_lowercase();
    let tolerance = (lower.chars().count() / 5).max(2);
    declared
        .into_iter()
        .map(|name| (edit_distance(&lower, &name.to_ascii_lowercase()), name))
        .filter(|(distance, _)| *distance <= tolerance)
        .min_by_key(|(distance, name)| (*distance, *name))
        .map(|(_, name)| name)
}

/// Levenshtein distance between two short names.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut current = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let substitution = previous[j] + usize::from(ca != *cb);
            current.push(substitution.min(previous[j + 1] + 1).min(current[j] + 1));
        }
        previous = current;
    }
    previous[b.len()]
}

#[cfg(test)]
mod tests;

/// The names of the `UpgradeConfig`s declared in the files of
/// `files` that `errors` name: the campaigns a rejected commit leaves invalid, for
/// `upgradeoperator_upgradeconfig_validation_failed`. Files that do not parse name none.
pub fn campaigns_in_error(files: &[ManifestFile], errors: &[ManifestError]) -> Vec<String> {
    let failing: std::collections::BTreeSet<&str> =
        errors.iter().map(|e| e.file.as_str()).collect();
    let mut campaigns = Vec::new();
    for file in files.iter().filter(|f| failing.contains(f.path)) {
        let Ok(text) = yaml::text(file.contents) else {
            continue;
        };
        let Ok(documents) = yaml::documents(text) else {
            continue;
        };
        for document in documents {
            let object = document.to_json();
            let field = |name: &str| object.pointer(name).and_then(serde_json::Value::as_str);
            if field("/kind") == Some("UpgradeConfig")
                && field("/apiVersion") == Some("upgrade.managed.openshift.io/v1alpha1")
                && let Some(name) = field("/metadata/name")
            {
                campaigns.push(name.to_string());
            }
        }
    }
    campaigns
}
