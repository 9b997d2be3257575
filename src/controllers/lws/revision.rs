//! Controller revisions of a LeaderWorkerSet (KEP-238; upstream
//! `pkg/utils/revision/revision_utils.go`).
//!
//! A revision remembers what a group is built from: the LWS's `leaderWorkerTemplate` and
//! `networkConfig`, stored as a strategic merge patch that replaces both ([`patch`]). Its key,
//! the `template-revision-hash` label, is a hash of that patch ([`key_of`]), unless the
//! revision was made for a leader StatefulSet that already carried a key, which is kept. The
//! leader StatefulSet, every leader pod and every worker StatefulSet carry the key of the
//! revision they were made from, so a group rebuilt in the middle of a rolling update is
//! rebuilt from its own revision ([`apply`]).
//!
//! A new revision is made only when the live spec's patch differs from the current
//! revision's ([`updated_revision`]): byte for byte ([`equal`]), and again after
//! re-serialising the stored patch through capstan's types ([`set_matches`]), so a revision
//! written by another serialisation of the same spec (`"creationTimestamp": null`, key
//! order, Go's `"resources": {}`) rolls nothing, and neither does writing or removing an
//! empty object or list. A spec change outside the two fields (`replicas`,
//! `rolloutStrategy`, `startupPolicy`) never makes a revision.
//!
//! Revision decisions read plain lists; the reconciler lists the revisions ([`belongs_to`])
//! and creates or deletes what these functions return.

use std::collections::BTreeMap;

use capstan_api::LeaderWorkerSet;
use capstan_api::canonical::{canonical_json, sorted_keys};
use capstan_api::lws::RestartPolicy;
use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use serde::Serialize;
use serde_json::{Map, Value, json};

use super::facts::revision_key;
use super::labels::{NAME_LABEL, REVISION_KEY_LABEL};

/// The strategic-merge directive every stored sub-object carries.
const PATCH_DIRECTIVE: &str = "$patch";
/// Its value: the sub-object replaces the live one whole.
const REPLACE: &str = "replace";
/// Revision names keep at most this many bytes of the LWS name, so that
/// `<prefix>-<key>-<number>` fits in 253 bytes (upstream `revisionName`).
const NAME_PREFIX_MAX: usize = 220;
/// `apiVersion` of the LeaderWorkerSet kind, in owner references.
pub const LWS_API_VERSION: &str = "leaderworkerset.x-k8s.io/v1";
/// The kind, in owner references.
pub const LWS_KIND: &str = "LeaderWorkerSet";

/// The patch a revision of `lws` stores (upstream `getPatch`):
/// `{"spec": {"leaderWorkerTemplate": {..., "$patch": "replace"}, "networkConfig": {...,
/// "$patch": "replace"}}}`, an absent `networkConfig` written as `{"subdomainPolicy":
/// "Shared"}` so that the webhook defaulting it later makes no new revision, and the
/// deprecated `restartPolicy: Default` written as `None`, as upstream's webhook stores it,
/// so that following the deprecation rolls nothing. Both are serialised through capstan's
/// types and every object's keys are sorted, so equal specs give equal patches whatever
/// form they were read in.
pub fn patch(lws: &LeaderWorkerSet) -> Value {
    let mut template = to_json(&lws.spec.leader_worker_template);
    if lws.spec.leader_worker_template.restart_policy == RestartPolicy::Default {
        template["restartPolicy"] = to_json(&RestartPolicy::None);
    }
    let mut network = to_json(&lws.spec.network_config_or_default());
    for part in [&mut template, &mut network] {
        if let Value::Object(fields) = part {
            fields.insert(PATCH_DIRECTIVE.to_string(), json!(REPLACE));
        }
    }
    sorted_keys(&json!({
        "spec": {"leaderWorkerTemplate": template, "networkConfig": network}
    }))
}

/// The content key of bytes (upstream `hashRevision`): the FNV-1 (not FNV-1a) 32-bit hash,
/// its decimal digits encoded as apimachinery's `rand.SafeEncodeString` encodes them, so
/// 1 to 10 characters of `[4-9bcdf]`.
pub fn key_of(bytes: &[u8]) -> String {
    safe_encode(&fnv1_32(bytes).to_string())
}

/// The content key of `lws`'s [`patch`].
pub fn content_key(lws: &LeaderWorkerSet) -> String {
    key_of(&canonical_json(&patch(lws)))
}

/// FNV-1, 32 bits (Go `hash/fnv.New32`): multiply, then xor.
fn fnv1_32(bytes: &[u8]) -> u32 {
    const OFFSET_BASIS: u32 = 2_166_136_261;
    const PRIME: u32 = 16_777_619;
    bytes.iter().fold(OFFSET_BASIS, |hash, byte| {
        hash.wrapping_mul(PRIME) ^ u32::from(*byte)
    })
}

/// apimachinery `rand.SafeEncodeString`: each character replaced by one of an alphabet
/// without vowels (no words, offensive or otherwise).
fn safe_encode(text: &str) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    text.chars()
        .map(|c| char::from(ALPHABET[(c as usize) % ALPHABET.len()]))
        .collect()
}

/// A new revision of `lws`'s live spec numbered `number` (upstream `NewRevision`): named
/// `<lws>-<content key>-<number>`, labelled with the LWS's name and `key` (the content key
/// when `key` is `None` or empty: a key read off an existing leader StatefulSet is kept so
/// that adopting it rolls nothing), controlled by the LWS, in its namespace.
pub fn new_revision(lws: &LeaderWorkerSet, key: Option<&str>, number: i64) -> ControllerRevision {
    let data = patch(lws);
    let content = key_of(&canonical_json(&data));
    let name = lws_name(lws);
    let key = key.filter(|key| !key.is_empty()).unwrap_or(&content);
    ControllerRevision {
        metadata: ObjectMeta {
            name: Some(revision_name(name, &content, number)),
            namespace: lws.metadata.namespace.clone(),
            labels: Some(BTreeMap::from([
                (NAME_LABEL.to_string(), name.to_string()),
                (REVISION_KEY_LABEL.to_string(), key.to_string()),
            ])),
            owner_references: Some(vec![controller_ref(lws)]),
            ..ObjectMeta::default()
        },
        data: Some(RawExtension(data)),
        revision: number,
    }
}

/// The controller reference every object the LWS controller makes for `lws` carries
/// (upstream `metav1.NewControllerRef`).
pub fn controller_ref(lws: &LeaderWorkerSet) -> OwnerReference {
    OwnerReference {
        api_version: LWS_API_VERSION.to_string(),
        kind: LWS_KIND.to_string(),
        name: lws_name(lws).to_string(),
        uid: lws.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// `<prefix>-<key>-<number>`, the prefix cut to 220 bytes (upstream `revisionName`).
fn revision_name(prefix: &str, key: &str, number: i64) -> String {
    let mut end = prefix.len().min(NAME_PREFIX_MAX);
    while !prefix.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}-{key}-{number}", &prefix[..end])
}

fn lws_name(lws: &LeaderWorkerSet) -> &str {
    lws.metadata.name.as_deref().unwrap_or_default()
}

/// Whether `revision` is one of `lws`'s (upstream `ListRevisions` with the name selector):
/// in its namespace, labelled with its name, and controlled by it or by nothing.
pub fn belongs_to(revision: &ControllerRevision, lws: &LeaderWorkerSet) -> bool {
    let labelled = revision
        .metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get(NAME_LABEL))
        .is_some_and(|name| name == lws_name(lws));
    let controller = revision
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|owner| owner.controller == Some(true));
    revision.metadata.namespace == lws.metadata.namespace
        && labelled
        && controller.is_none_or(|owner| Some(&owner.uid) == lws.metadata.uid.as_ref())
}

/// The revision with the highest number, the last of equals (upstream
/// `getHighestRevision`); `None` for no revision.
pub fn highest(revisions: &[ControllerRevision]) -> Option<&ControllerRevision> {
    revisions.iter().max_by_key(|revision| revision.revision)
}

/// The number a new revision gets: one above the highest, 1 for the first.
pub fn next_number(revisions: &[ControllerRevision]) -> i64 {
    highest(revisions).map_or(1, |revision| revision.revision + 1)
}

/// The revision of `lws` with key `key`, the one groups made with that key run (upstream
/// `GetRevision`): among `lws`'s own revisions ([`belongs_to`]), those labelled with the
/// key; `None` for an empty key or none labelled so; the highest when several are (only
/// one should be).
///
/// Only `lws`'s own count: the StatefulSet controller's revisions of the leader and worker
/// StatefulSets carry their pod templates' labels, `lws`'s name and key among them, and are
/// numbered from 1 like `lws`'s, so by labels alone one of those could be taken for the
/// revision the groups run.
pub fn find<'a>(
    revisions: &'a [ControllerRevision],
    lws: &LeaderWorkerSet,
    key: &str,
) -> Option<&'a ControllerRevision> {
    if key.is_empty() {
        return None;
    }
    revisions
        .iter()
        .filter(|revision| belongs_to(revision, lws) && revision_key(*revision) == key)
        .max_by_key(|revision| revision.revision)
}

/// The revisions of `lws` whose key is not `current_key`: what is deleted once a rolling
/// update is done (upstream `TruncateRevisions`). Only `lws`'s own ([`belongs_to`]): its
/// StatefulSets' revisions are theirs to keep.
pub fn to_truncate<'a>(
    revisions: &'a [ControllerRevision],
    lws: &LeaderWorkerSet,
    current_key: &str,
) -> Vec<&'a ControllerRevision> {
    revisions
        .iter()
        .filter(|revision| belongs_to(revision, lws) && revision_key(*revision) != current_key)
        .collect()
}

/// Whether two revisions store the same patch (upstream `EqualRevision`): the same bytes
/// and the same values. Keys and names are not compared.
pub fn equal(a: &ControllerRevision, b: &ControllerRevision) -> bool {
    let bytes =
        |revision: &ControllerRevision| revision.data.as_ref().map(|data| canonical_json(&data.0));
    bytes(a) == bytes(b) && a.data == b.data
}

/// `lws` with its `leaderWorkerTemplate` and `networkConfig` replaced by `revision`'s
/// (upstream `ApplyRevision`, the strategic merge of the stored patch onto the live
/// object): `replicas`, `rolloutStrategy`, `startupPolicy`, metadata and status stay live.
///
/// Fails when the revision has no data, carries a directive other than `replace`, or
/// the result is not a LeaderWorkerSet.
pub fn apply(
    lws: &LeaderWorkerSet,
    revision: &ControllerRevision,
) -> Result<LeaderWorkerSet, String> {
    let name = revision.metadata.name.as_deref().unwrap_or_default();
    let data = revision
        .data
        .as_ref()
        .ok_or_else(|| format!("revision {name} has no data"))?;
    let mut live = to_json(lws);
    merge(&mut live, &data.0).map_err(|error| format!("revision {name}: {error}"))?;
    serde_json::from_value(live).map_err(|error| {
        format!(
            "revision {name} does not apply to LeaderWorkerSet {}: {error}",
            lws_name(lws)
        )
    })
}

/// The strategic merge of `patch` onto `live`, for the maps revisions hold: an object
/// carrying `"$patch": "replace"` replaces the live value whole, another object merges key
/// by key (`null` deletes), anything else replaces.
fn merge(live: &mut Value, patch: &Value) -> Result<(), String> {
    let Value::Object(fields) = patch else {
        *live = patch.clone();
        return Ok(());
    };
    match fields.get(PATCH_DIRECTIVE) {
        None => {}
        Some(Value::String(directive)) if directive == REPLACE => {
            let mut replacement = fields.clone();
            replacement.remove(PATCH_DIRECTIVE);
            *live = without_nulls(Value::Object(replacement));
            return Ok(());
        }
        Some(other) => return Err(format!("unsupported patch directive {other}")),
    }
    if !live.is_object() {
        *live = Value::Object(Map::new());
    }
    if let Value::Object(target) = live {
        for (key, value) in fields {
            if value.is_null() {
                target.remove(key);
            } else {
                merge(target.entry(key.clone()).or_insert(Value::Null), value)?;
            }
        }
    }
    Ok(())
}

/// `value` without `null` members: Go decodes them as absent, and capstan's types fill
/// their defaults for absent fields only.
fn without_nulls(value: Value) -> Value {
    match value {
        Value::Object(fields) => Value::Object(
            fields
                .into_iter()
                .filter(|(_, value)| !value.is_null())
                .map(|(key, value)| (key, without_nulls(value)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.into_iter().map(without_nulls).collect()),
        other => other,
    }
}

/// Whether `revision` describes `lws`'s live spec though its bytes differ (upstream
/// `SetMatchesRevision`, without its cache): `revision` applied to `lws` and re-serialised
/// gives the patch of `lws`, empty objects and lists aside ([`without_empty`]). False when
/// the revision does not apply.
pub fn set_matches(lws: &LeaderWorkerSet, revision: &ControllerRevision) -> bool {
    apply(lws, revision)
        .is_ok_and(|restored| without_empty(patch(&restored)) == without_empty(patch(lws)))
}

/// `value` without object members whose value is `{}` or `[]`, innermost first, so a
/// member left empty by that goes too. Go re-serialises a struct field it holds by value
/// as `{}` whether it was written or not (a container's `resources`, a template's
/// `metadata`) and drops empty lists and maps (`omitempty`), so upstream cannot tell
/// either from absent; nor can a pod template, where an empty object or list means the
/// field's defaults (a volume without a source is an `emptyDir`). List items stay, empty
/// or not.
fn without_empty(value: Value) -> Value {
    let empty = |value: &Value| match value {
        Value::Object(fields) => fields.is_empty(),
        Value::Array(items) => items.is_empty(),
        _ => false,
    };
    match value {
        Value::Object(fields) => Value::Object(
            fields
                .into_iter()
                .map(|(key, value)| (key, without_empty(value)))
                .filter(|(_, value)| !empty(value))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.into_iter().map(without_empty).collect()),
        other => other,
    }
}

/// Whether `lws`'s live spec makes a new revision over `current`, the revision its groups
/// run (upstream `getUpdatedRevision`'s test): the revision of the spec is neither [`equal`]
/// to `current` nor matched by it once re-serialised ([`set_matches`]). This is when groups
/// roll; `replicas`, `rolloutStrategy`, `startupPolicy` and metadata never make one.
pub fn makes_new_revision(lws: &LeaderWorkerSet, current: &ControllerRevision) -> bool {
    let proposed = new_revision(lws, None, 1);
    !(equal(&proposed, current) || set_matches(lws, current))
}

/// The revision to create for `lws`'s live spec when it moved away from `current`
/// (upstream `getUpdatedRevision`, called once the leader StatefulSet exists): `None`
/// unless [`makes_new_revision`], else the live spec's revision, numbered `next_number`.
pub fn updated_revision(
    lws: &LeaderWorkerSet,
    current: &ControllerRevision,
    next_number: i64,
) -> Option<ControllerRevision> {
    makes_new_revision(lws, current).then(|| new_revision(lws, None, next_number))
}

/// `value` as JSON. capstan's and k8s-openapi's types have string keys only, so this
/// cannot fail.
fn to_json<T: Serialize>(value: &T) -> Value {
    serde_json::to_value(value).unwrap_or(Value::Null)
}

#[cfg(test)]
pub(super) mod tests;
