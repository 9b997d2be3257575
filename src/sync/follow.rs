//! The state a commit follows: one notion for `capstan sync` and `capstan plan`.
//!
//! Some rules judge a commit against the one it follows (a version label that *moves* must
//! name the Module's current version; a Module's version and image change together; see
//! [`check_transition`]). Which commit that is must not depend on how long capstan has
//! lived, so:
//!
//! - a commit that was accepted once (the applied commit of a `GitSync` status, a plan's
//!   base) is loaded as a predecessor by [`load_accepted`]: parsed and checked alone, never
//!   judged again by rules that need its own predecessor;
//! - a new commit is judged by [`judge`] against the state it follows;
//! - when several commits landed since the applied one (capstan was down, or two merges
//!   came within one interval), [`replay`] judges each in turn, as a capstan that saw every
//!   commit would have, and says which commit last changed each object. That commit, not
//!   the head, is the one whose stamps (`capstan.dev/revision`, `capstan.dev/pull-request`)
//!   the object carries, so an ordered-upgrade step is recorded against the commit that
//!   relabelled its node however the sync ran.

use std::collections::BTreeMap;

use super::manifests::{
    Catalog, DesiredState, ManifestError, ManifestFile, ObjectId, campaigns_in_error,
    check_transition, load,
};
use super::reach;
use super::source::{CommitInfo, RepoFile, SourceError};
use capstan_api::canonical::digest;
use capstan_api::capstan::Reach;

/// At most this many commits since the applied one are replayed; a branch that moved
/// further (or was rewritten) is taken at its head alone, judged against the applied commit.
pub const MAX_REPLAY: usize = 500;

/// A commit the cluster has, or had, accepted, with its desired state.
#[derive(Clone, Debug)]
pub struct Accepted {
    /// The commit.
    pub commit: CommitInfo,
    /// Its desired state.
    pub desired: DesiredState,
}

/// Loads a commit that was accepted once, as the state a later commit follows: checked
/// alone (`load`), never judged by rules that compare it with its own predecessor.
pub fn load_accepted(
    files: &[RepoFile],
    path: &str,
    catalog: &dyn Catalog,
) -> Result<DesiredState, Vec<ManifestError>> {
    load(&manifest_files(files), path, catalog)
}

/// Loads `files` and judges them as the commit that follows `previous` (`None`: nothing
/// was ever accepted, so every version label must name its Module's current version).
pub fn judge(
    previous: Option<&DesiredState>,
    files: &[RepoFile],
    path: &str,
    catalog: &dyn Catalog,
    reach: &Reach,
) -> Result<DesiredState, Vec<ManifestError>> {
    let next = load(&manifest_files(files), path, catalog)?;
    let mut problems = reach::check(reach, &next.manifests);
    problems.extend(check_transition(previous, &next));
    if problems.is_empty() {
        Ok(next)
    } else {
        Err(problems)
    }
}

fn manifest_files(files: &[RepoFile]) -> Vec<ManifestFile<'_>> {
    files
        .iter()
        .map(|f| ManifestFile {
            path: &f.path,
            contents: &f.contents,
        })
        .collect()
}

/// One commit of a replay, with its files as Git gave them.
pub struct Landed {
    /// The commit.
    pub commit: CommitInfo,
    /// Its files under the synced path, or why they cannot be read.
    pub files: Result<Vec<RepoFile>, SourceError>,
}

/// What the commits since the applied one amount to.
#[derive(Debug, Default)]
pub struct Replay {
    /// The newest commit accepted: the head when it is valid after what it follows, else the
    /// last valid commit before it (`None` when no commit of the replay was valid).
    pub accepted: Option<Accepted>,
    /// The head's problems, when the head is rejected.
    pub rejected: Option<Vec<String>>,
    /// The names of the `UpgradeConfig`s in the head's files that have problems.
    pub invalid_campaigns: Vec<String>,
    /// For each object that changed since the applied state (added, modified or removed),
    /// the accepted commit that last did so. Objects not here did not change.
    pub changed_by: BTreeMap<ObjectId, CommitInfo>,
}

/// Judges `landed` (oldest first, the head last; read lazily) in turn, each after the last
/// one accepted, starting from `previous` (the applied state), and tracks which commit last
/// changed each object. A rejected commit changes nothing: what it changed is attributed to the next
/// accepted commit that still has it, as a sync that saw every commit would have applied it.
pub fn replay(
    previous: Option<&DesiredState>,
    landed: impl IntoIterator<Item = Landed>,
    path: &str,
    catalog: &dyn Catalog,
    reach: &Reach,
) -> Replay {
    let mut replay = Replay::default();
    // Commits that change nothing under the path are common (a monorepo's other folders):
    // the same files give the same verdict after the same accepted state.
    let mut seen: Option<Judged> = None;
    // Files are read as the walk reaches them: one commit's files at a time (and the next's,
    // peeked to tell the head), however far the branch moved.
    let mut landed = landed.into_iter().peekable();
    while let Some(Landed { commit, files }) = landed.next() {
        let is_head = landed.peek().is_none();
        let files = match files {
            Ok(files) => files,
            Err(error) => {
                if is_head {
                    replay.rejected = Some(vec![problem(&error)]);
                }
                continue;
            }
        };
        if let Some((seen_files, verdict)) = &seen
            && *seen_files == files
        {
            match verdict {
                Ok(()) => {
                    if let Some(accepted) = &mut replay.accepted {
                        accepted.commit = commit;
                    }
                }
                Err(errors) if is_head => replay.rejected = Some(errors.clone()),
                Err(_) => {}
            }
            continue;
        }
        let before = replay.accepted.as_ref().map(|a| &a.desired).or(previous);
        match judge(before, &files, path, catalog, reach) {
            Ok(desired) => {
                let old: BTreeMap<ObjectId, String> = before
                    .iter()
                    .flat_map(|state| &state.manifests)
                    .map(|m| (m.id(), digest(&m.object)))
                    .collect();
                let mut changed_by = BTreeMap::new();
                let mut present = std::collections::BTreeSet::new();
                for manifest in &desired.manifests {
                    let id = manifest.id();
                    present.insert(id.clone());
                    let by = if old.get(&id) == Some(&digest(&manifest.object)) {
                        replay.changed_by.remove(&id)
                    } else {
                        replay.changed_by.remove(&id);
                        Some(commit.clone())
                    };
                    if let Some(by) = by {
                        changed_by.insert(id, by);
                    }
                }
                // What is left in `replay.changed_by` is away from this commit: removed by it
                // (it was in the state before) or by the earlier commit already named.
                for id in old.into_keys().filter(|id| !present.contains(id)) {
                    replay.changed_by.insert(id, commit.clone());
                }
                changed_by.append(&mut replay.changed_by);
                replay.changed_by = changed_by;
                seen = Some((files, Ok(())));
                replay.accepted = Some(Accepted { commit, desired });
            }
            Err(errors) => {
                if is_head {
                    replay.invalid_campaigns = campaigns_in_error(&manifest_files(&files), &errors);
                }
                let errors: Vec<String> = errors.iter().map(ToString::to_string).collect();
                if is_head {
                    replay.rejected = Some(errors.clone());
                }
                seen = Some((files, Err(errors)));
            }
        }
    }
    replay
}

/// Why a commit's files cannot be read, as a rejection line: `file: message` when one file
/// is to blame, like the other problems of a commit.
fn problem(error: &SourceError) -> String {
    match error.in_commit() {
        Some((file, message)) => format!("{file}: {message}"),
        None => error.to_string(),
    }
}

/// A commit's files with the verdict on them.
type Judged = (Vec<RepoFile>, Result<(), Vec<String>>);

/// Which commit's stamps each object written by a sync carries.
#[derive(Clone, Copy, Debug)]
pub struct Attribution<'a> {
    /// The commit being applied; objects not in `changed_by` get its stamps.
    pub applied: &'a CommitInfo,
    /// The commit that last changed each object (see [`Replay::changed_by`]).
    pub changed_by: &'a BTreeMap<ObjectId, CommitInfo>,
}

impl<'a> Attribution<'a> {
    /// Every object attributed to `commit`.
    pub fn all(commit: &'a CommitInfo) -> Attribution<'a> {
        static NONE: BTreeMap<ObjectId, CommitInfo> = BTreeMap::new();
        Attribution {
            applied: commit,
            changed_by: &NONE,
        }
    }

    /// The commit that asked for `id`'s current content.
    pub fn commit_of(&self, id: &ObjectId) -> &'a CommitInfo {
        self.changed_by.get(id).unwrap_or(self.applied)
    }
}

#[cfg(test)]
mod tests;
