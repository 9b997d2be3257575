//! capstan's one Event recorder, for the sync and every controller: events.k8s.io/v1
//! Events stamped by the injected clock, an Event seen again within [`TTL`] counted in its
//! `series` instead of written anew.
//!
//! kube's `Recorder` is not used: it counts Events that differ only in their note as one
//! series (keeping the first note), keeps every Event of the last six minutes however many
//! (50,000 for a fleet of 5,000 nodes loading ten modules), scans them all on each
//! publish, and sends the whole Event as the series patch. This one keys on the note too,
//! as client-go does, remembers at most [`CAPACITY`] Events (client-go's bound), and
//! patches only the series.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Client;
use kube::Resource as _;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use capstan_api::clock::Clock;

/// How long an Event stays open for its series.
pub const TTL: SignedDuration = SignedDuration::from_mins(6);
/// How many Events are remembered for their series.
pub const CAPACITY: usize = 4096;

/// What an Event says, and about what: the same twice is one Event with a series.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct EventKey {
    pub warning: bool,
    pub reason: String,
    pub action: String,
    pub note: String,
    pub regarding: ObjectKey,
    pub related: Option<ObjectKey>,
    /// The Event's annotations: the commit and pull request that asked for what it
    /// reports, and the upgrade step's module, versions and step.
    pub annotations: BTreeMap<String, String>,
}

/// Which object an Event is about.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ObjectKey {
    kind: Option<String>,
    namespace: Option<String>,
    name: Option<String>,
    uid: Option<String>,
}

impl From<&ObjectReference> for ObjectKey {
    fn from(object: &ObjectReference) -> Self {
        ObjectKey {
            kind: object.kind.clone(),
            namespace: object.namespace.clone(),
            name: object.name.clone(),
            uid: object.uid.clone(),
        }
    }
}

/// What to write for an Event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Write {
    /// A new Event.
    Create,
    /// The series of the Event of this name, now `count` strong.
    Series {
        namespace: String,
        name: String,
        count: i32,
    },
}

#[derive(Clone, Debug)]
struct Open {
    namespace: String,
    name: String,
    count: i32,
    last: Timestamp,
    /// Which insertion into the order this entry is.
    seq: u64,
}

/// The Events written lately, oldest first.
#[derive(Debug, Default)]
pub struct Recent {
    open: HashMap<EventKey, Open>,
    order: VecDeque<(EventKey, u64)>,
    seq: u64,
}

impl Recent {
    /// What to write for `key` at `now`; a series is counted at once.
    pub fn write(&mut self, key: &EventKey, now: Timestamp) -> Write {
        match self.open.get_mut(key) {
            Some(open) if open.last + TTL > now => {
                open.count += 1;
                open.last = now;
                Write::Series {
                    namespace: open.namespace.clone(),
                    name: open.name.clone(),
                    count: open.count,
                }
            }
            _ => Write::Create,
        }
    }

    /// The Event for `key` was created as `namespace/name`.
    pub fn created(&mut self, key: EventKey, namespace: String, name: String, now: Timestamp) {
        self.seq += 1;
        self.order.push_back((key.clone(), self.seq));
        self.open.insert(
            key,
            Open {
                namespace,
                name,
                count: 1,
                last: now,
                seq: self.seq,
            },
        );
        while self.open.len() > CAPACITY {
            let Some((oldest, seq)) = self.order.pop_front() else {
                break;
            };
            // A key created again since is a later entry of the order.
            if self.open.get(&oldest).is_some_and(|open| open.seq == seq) {
                self.open.remove(&oldest);
            }
        }
        // Keys created again leave stale entries behind; drop them when they pile up.
        if self.order.len() > 2 * CAPACITY {
            let open = &self.open;
            self.order
                .retain(|(key, seq)| open.get(key).is_some_and(|o| o.seq == *seq));
        }
    }
}

/// Writes Events as one reporting controller.
pub struct Recorder {
    client: Client,
    controller: String,
    clock: Arc<dyn Clock>,
    recent: Mutex<Recent>,
    last_suffix: AtomicU64,
}

impl Recorder {
    /// A recorder reporting as `controller`, its Events stamped by `clock`.
    pub fn new(client: Client, controller: &str, clock: Arc<dyn Clock>) -> Recorder {
        Recorder {
            client,
            controller: controller.to_string(),
            clock,
            recent: Mutex::new(Recent::default()),
            last_suffix: AtomicU64::new(0),
        }
    }

    /// The wall clock in nanoseconds, as Event names end (kubectl's and client-go's
    /// convention), made unique within the process: the controllers' clock may stand
    /// still, and two Events about one object may come in the same nanosecond.
    fn unique_suffix(&self) -> u64 {
        let wall = u64::try_from(Timestamp::now().as_nanosecond()).unwrap_or_default();
        let previous = self
            .last_suffix
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |last| {
                Some(wall.max(last + 1))
            })
            .unwrap_or_default();
        wall.max(previous + 1)
    }

    /// Writes the Event: created, or counted in the series of the same Event.
    pub async fn publish(
        &self,
        key: EventKey,
        regarding: &ObjectReference,
        related: Option<ObjectReference>,
    ) -> Result<(), kube::Error> {
        let now = self.clock.now();
        let write = self.recent.lock().expect("recorder lock").write(&key, now);
        match write {
            Write::Series {
                namespace,
                name,
                count,
            } => {
                let events: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
                let patch = json!({"series": {"count": count, "lastObservedTime": MicroTime(now)}});
                events
                    .patch(&name, &PatchParams::default(), &Patch::Merge(patch))
                    .await?;
            }
            Write::Create => {
                let namespace = regarding
                    .namespace
                    .clone()
                    .unwrap_or_else(|| "default".to_string());
                let name = format!(
                    "{}.{:x}",
                    regarding.name.as_deref().unwrap_or(&self.controller),
                    self.unique_suffix()
                );
                let event = Event {
                    metadata: ObjectMeta {
                        name: Some(name.clone()),
                        namespace: Some(namespace.clone()),
                        annotations: (!key.annotations.is_empty()).then(|| key.annotations.clone()),
                        ..ObjectMeta::default()
                    },
                    event_time: Some(MicroTime(now)),
                    type_: Some(if key.warning { "Warning" } else { "Normal" }.into()),
                    reason: Some(key.reason.clone()),
                    action: Some(key.action.clone()),
                    note: Some(key.note.clone()),
                    regarding: Some(regarding.clone()),
                    related,
                    reporting_controller: Some(self.controller.clone()),
                    reporting_instance: Some(self.controller.clone()),
                    ..Event::default()
                };
                // The answer is not read: only whether the server took the Event.
                let body = serde_json::to_vec(&event).map_err(kube::Error::SerdeError)?;
                let request = kube::core::Request::new(Event::url_path(&(), Some(&namespace)))
                    .create(&PostParams::default(), body)
                    .map_err(kube::Error::BuildRequest)?;
                self.client.request_text(request).await?;
                self.recent
                    .lock()
                    .expect("recorder lock")
                    .created(key, namespace, name, now);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(reason: &str, note: &str, node: &str) -> EventKey {
        EventKey {
            warning: false,
            reason: reason.into(),
            action: "Load".into(),
            note: note.into(),
            regarding: ObjectKey::from(&ObjectReference {
                kind: Some("Node".into()),
                name: Some(node.into()),
                ..ObjectReference::default()
            }),
            related: None,
            annotations: BTreeMap::new(),
        }
    }

    fn at(seconds: i64) -> Timestamp {
        Timestamp::UNIX_EPOCH + SignedDuration::from_secs(seconds)
    }

    fn series(name: &str, count: i32) -> Write {
        Write::Series {
            namespace: "default".into(),
            name: name.into(),
            count,
        }
    }

    #[test]
    fn an_event_seen_again_within_the_ttl_is_counted_in_its_series() {
        let mut recent = Recent::default();
        let loaded = key("ModuleLoaded", "Module ns/a loaded", "n1");
        assert_eq!(recent.write(&loaded, at(0)), Write::Create);
        recent.created(loaded.clone(), "default".into(), "n1.1".into(), at(0));
        // (case, event, when, what is written)
        let rows = [
            ("the same again", loaded.clone(), 10, series("n1.1", 2)),
            ("and again", loaded.clone(), 20, series("n1.1", 3)),
            (
                "another note",
                key("ModuleLoaded", "Module ns/b loaded", "n1"),
                20,
                Write::Create,
            ),
            (
                "another node",
                key("ModuleLoaded", "Module ns/a loaded", "n2"),
                20,
                Write::Create,
            ),
            (
                "another reason",
                key("ModuleUnloaded", "Module ns/a loaded", "n1"),
                20,
                Write::Create,
            ),
            (
                "the TTL runs from the last time seen",
                loaded.clone(),
                20 + TTL.as_secs() - 1,
                series("n1.1", 4),
            ),
        ];
        for (case, event, when, expected) in rows {
            assert_eq!(recent.write(&event, at(when)), expected, "{case}");
        }
        let later = 20 + 2 * TTL.as_secs();
        assert_eq!(
            recent.write(&loaded, at(later)),
            Write::Create,
            "after the TTL"
        );
    }

    #[test]
    fn at_most_capacity_events_are_remembered_oldest_forgotten_first() {
        let mut recent = Recent::default();
        let keys: Vec<EventKey> = (0..=CAPACITY)
            .map(|i| key("ModuleLoaded", &format!("module {i}"), "n1"))
            .collect();
        for (i, key) in keys.iter().enumerate() {
            recent.created(key.clone(), "default".into(), format!("e{i}"), at(0));
        }
        assert_eq!(recent.open.len(), CAPACITY);
        assert_eq!(
            recent.write(&keys[0], at(1)),
            Write::Create,
            "the oldest is gone"
        );
        assert_eq!(recent.write(&keys[1], at(1)), series("e1", 2));
        assert_eq!(
            recent.write(&keys[CAPACITY], at(1)),
            series(&format!("e{CAPACITY}"), 2)
        );
    }

    #[test]
    fn an_event_created_again_is_not_forgotten_for_its_older_entry() {
        let mut recent = Recent::default();
        let first = key("ModuleLoaded", "first", "n1");
        let others: Vec<EventKey> = (0..CAPACITY)
            .map(|i| key("ModuleLoaded", &format!("other {i}"), "n1"))
            .collect();
        recent.created(first.clone(), "default".into(), "old".into(), at(0));
        for (i, other) in others[..CAPACITY - 1].iter().enumerate() {
            recent.created(other.clone(), "default".into(), format!("o{i}"), at(0));
        }
        let after_ttl = TTL.as_secs() + 1;
        assert_eq!(recent.write(&first, at(after_ttl)), Write::Create);
        recent.created(first.clone(), "default".into(), "new".into(), at(after_ttl));
        // One more: the oldest entry of the order is `first`'s stale one, which is
        // skipped; the oldest Event remembered, o0, goes.
        let last = others[CAPACITY - 1].clone();
        recent.created(last, "default".into(), "last".into(), at(after_ttl));
        assert_eq!(recent.open.len(), CAPACITY);
        assert_eq!(recent.write(&first, at(after_ttl + 1)), series("new", 2));
        assert_eq!(recent.write(&others[0], at(after_ttl + 1)), Write::Create);
    }
}
