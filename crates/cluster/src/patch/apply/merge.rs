//! Merging an apply configuration into the live object, and pruning what its manager
//! applied before and no longer does.

use std::collections::{BTreeSet, VecDeque};

use serde_json::{Map, Value};

use super::managed_fields::METADATA_ITSELF;
use super::walker::{Walker, first_duplicate, item_elements};
use crate::patch::fieldset::{FieldSet, PathElement};
use crate::schema::ListType;

impl Walker<'_> {
    /// `config` written over `live`: objects merge field by field, granular lists item
    /// by item, anything else is replaced.
    pub(super) fn merge(&mut self, live: Option<&Value>, config: &Value) -> Value {
        match (live, config) {
            (Some(Value::Object(live)), Value::Object(config)) => {
                let mut merged = live.clone();
                for (name, value) in config {
                    let value = self.in_field(name, |walker| walker.merge(live.get(name), value));
                    merged.insert(name.clone(), value);
                }
                Value::Object(merged)
            }
            (Some(Value::Array(live)), Value::Array(config)) => self.merge_lists(live, config),
            _ => config.clone(),
        }
    }

    fn merge_lists(&mut self, live: &[Value], config: &[Value]) -> Value {
        let list_type = self.list_type();
        let unique = |items: &[Value]| {
            item_elements(&list_type, items)
                .ok()
                .filter(|elements| first_duplicate(elements).is_none())
        };
        match (&list_type, unique(live), unique(config)) {
            (ListType::Atomic, _, _) => Value::Array(config.to_vec()),
            (_, Some(live_keys), Some(config_keys)) => {
                Value::Array(self.merge_items(live, &live_keys, config, &config_keys))
            }
            // A live list whose items cannot be told apart is replaced whole.
            _ => Value::Array(config.to_vec()),
        }
    }

    /// Upstream's item order: items in both lists follow the configuration's order,
    /// live-only items keep their place, configuration-only items come where the
    /// configuration puts them.
    fn merge_items(
        &mut self,
        live: &[Value],
        live_keys: &[PathElement],
        config: &[Value],
        config_keys: &[PathElement],
    ) -> Vec<Value> {
        let mut shared = config_keys
            .iter()
            .filter(|key| live_keys.contains(key))
            .collect::<VecDeque<_>>();
        let mut next_shared = shared.pop_front();
        let mut merged_config = BTreeSet::new();
        let mut out = Vec::with_capacity(live.len().max(config.len()));
        let (mut live_at, mut config_at) = (0, 0);
        while live_at < live.len() || config_at < config.len() {
            if live_at < live.len() && config_at < config.len() {
                let key = &live_keys[live_at];
                if *key == config_keys[config_at] {
                    merged_config.insert(key);
                    out.push(self.merge(Some(&live[live_at]), &config[config_at]));
                    live_at += 1;
                    config_at += 1;
                    next_shared = shared.pop_front();
                    continue;
                }
                // A shared item the configuration places later goes there instead.
                if config_keys.contains(key) && next_shared.is_some_and(|next| next != key) {
                    live_at += 1;
                    continue;
                }
            }
            if live_at < live.len() {
                let key = &live_keys[live_at];
                if !config_keys.contains(key) {
                    out.push(live[live_at].clone());
                    live_at += 1;
                    continue;
                }
                if merged_config.contains(key) {
                    live_at += 1;
                    continue;
                }
            }
            if config_at < config.len() {
                let key = &config_keys[config_at];
                merged_config.insert(key);
                let live_item = live_keys
                    .iter()
                    .position(|live_key| live_key == key)
                    .map(|index| &live[index]);
                out.push(self.merge(live_item, &config[config_at]));
                config_at += 1;
                if next_shared == Some(key) {
                    next_shared = shared.pop_front();
                }
            }
        }
        out
    }

    /// Drops from `merged` what `last_applied` held and `still_owned` does not, as
    /// upstream's prune: a field kept by nobody goes with everything under it.
    pub(super) fn prune(
        &mut self,
        merged: &Value,
        last_applied: &FieldSet,
        still_owned: &FieldSet,
    ) -> Value {
        let kept = still_owned.with_field_ancestors().union(&METADATA_ITSELF);
        let doomed = last_applied.with_field_ancestors().difference(&kept);
        self.remove(merged, &doomed)
    }

    /// `value` without the paths `doomed` holds (and everything under them).
    pub(super) fn remove(&mut self, value: &Value, doomed: &FieldSet) -> Value {
        match value {
            Value::Object(fields) => {
                let mut kept = Map::new();
                for (name, value) in fields {
                    match doomed.child(&PathElement::field(name)) {
                        Some(child) if child.is_member() => {}
                        Some(child) => {
                            let rest = self.in_field(name, |walker| walker.remove(value, child));
                            kept.insert(name.clone(), rest);
                        }
                        None => {
                            kept.insert(name.clone(), value.clone());
                        }
                    }
                }
                Value::Object(kept)
            }
            Value::Array(items) => self.remove_items(items, doomed),
            other => other.clone(),
        }
    }

    fn remove_items(&mut self, items: &[Value], doomed: &FieldSet) -> Value {
        let list_type = self.list_type();
        let elements = match list_type {
            ListType::Atomic => None,
            _ => item_elements(&list_type, items).ok(),
        };
        let Some(elements) = elements else {
            return Value::Array(items.to_vec());
        };
        items
            .iter()
            .zip(elements)
            .filter_map(|(item, element)| match doomed.child(&element) {
                Some(child) if child.is_member() => None,
                Some(child) => Some(self.remove(item, child)),
                None => Some(item.clone()),
            })
            .collect()
    }
}
