//! Sets of field paths, as server-side apply records who owns what in
//! `metadata.managedFields`, and their `FieldsV1` encoding (`f:spec`,
//! `k:{"name":"app"}`, `v:"foo"`, and `.` for a path that is owned and also leads to
//! owned paths).

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::collections::btree_map::Entry;
use std::fmt;

use serde_json::{Map, Value};

/// One step into an object.
#[derive(Clone, Debug)]
pub enum PathElement {
    /// An object field (`f:replicas`).
    Field(String),
    /// An item of a keyed list, by its key fields sorted by name (`k:{"name":"app"}`).
    Key(Vec<(String, Value)>),
    /// An item of a set list, by its value (`v:"foo"`).
    Value(Value),
}

impl PathElement {
    /// An object field.
    pub fn field(name: &str) -> Self {
        PathElement::Field(name.to_string())
    }

    /// An item of a keyed list from its key fields, given in any order.
    pub fn key(mut fields: Vec<(String, Value)>) -> Self {
        fields.sort_by(|a, b| a.0.cmp(&b.0));
        PathElement::Key(fields)
    }

    /// The element's name inside `FieldsV1`: `f:spec`, `k:{"name":"app"}`, `v:"foo"`.
    pub fn encode(&self) -> String {
        match self {
            PathElement::Field(name) => prefixed("f:", name),
            PathElement::Key(fields) => {
                let key: Map<String, Value> = fields.iter().cloned().collect();
                prefixed("k:", &Value::Object(key).to_string())
            }
            PathElement::Value(value) => prefixed("v:", &value.to_string()),
        }
    }

    /// The encoding of the field element `name`, without building the element.
    pub fn encode_field(name: &str) -> String {
        prefixed("f:", name)
    }

    /// Reads an element's name inside `FieldsV1`; fails on anything but `f:`, `k:` and `v:`.
    fn decode(name: &str) -> Result<Self, String> {
        if let Some(field) = name.strip_prefix("f:") {
            return Ok(PathElement::field(field));
        }
        if let Some(key) = name.strip_prefix("k:") {
            return match serde_json::from_str(key) {
                Ok(Value::Object(fields)) => Ok(PathElement::key(fields.into_iter().collect())),
                _ => Err(format!("invalid key {key:?} in fieldsV1")),
            };
        }
        if let Some(value) = name.strip_prefix("v:") {
            return serde_json::from_str(value)
                .map(PathElement::Value)
                .map_err(|err| format!("invalid value {value:?} in fieldsV1: {err}"));
        }
        Err(format!("unsupported path element {name:?} in fieldsV1"))
    }

    // Upstream orders fields before keys before values.
    fn rank(&self) -> u8 {
        match self {
            PathElement::Field(_) => 0,
            PathElement::Key(_) => 1,
            PathElement::Value(_) => 2,
        }
    }
}

impl Ord for PathElement {
    fn cmp(&self, other: &Self) -> Ordering {
        match (self, other) {
            (PathElement::Field(a), PathElement::Field(b)) => a.cmp(b),
            (PathElement::Key(a), PathElement::Key(b)) => compare_sequences(
                a.iter(),
                b.iter(),
                |(name_a, value_a), (name_b, value_b)| {
                    name_a
                        .cmp(name_b)
                        .then_with(|| compare_values(value_a, value_b))
                },
            ),
            (PathElement::Value(a), PathElement::Value(b)) => compare_values(a, b),
            _ => self.rank().cmp(&other.rank()),
        }
    }
}

impl PartialOrd for PathElement {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for PathElement {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for PathElement {}

/// Upstream's notation: `.spec`, `[name="app"]`, `[="foo"]`.
impl fmt::Display for PathElement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PathElement::Field(name) => write!(f, ".{name}"),
            PathElement::Key(fields) => {
                let fields: Vec<String> = fields
                    .iter()
                    .map(|(name, value)| format!("{name}={}", value_text(value)))
                    .collect();
                write!(f, "[{}]", fields.join(","))
            }
            PathElement::Value(value) => write!(f, "[={}]", value_text(value)),
        }
    }
}

/// A path in upstream's notation, such as `.spec.containers[name="app"].image`.
pub fn path_text(path: &[PathElement]) -> String {
    path.iter().map(ToString::to_string).collect()
}

/// A value as upstream prints it inside a path: strings quoted, lists bracketed.
fn value_text(value: &Value) -> String {
    match value {
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(value_text).collect();
            format!("[{}]", items.join(","))
        }
        Value::Object(fields) => fields
            .iter()
            .map(|(name, value)| format!("{name}={}", value_text(value)))
            .collect(),
        other => other.to_string(),
    }
}

/// Whether two values are the same for ownership purposes: numbers compare by value
/// (`1` equals `1.0`) and object fields in any order.
pub fn same_value(a: &Value, b: &Value) -> bool {
    compare_values(a, b) == Ordering::Equal
}

/// Upstream's total order of values: numbers, strings, booleans, lists, objects, null.
fn compare_values(a: &Value, b: &Value) -> Ordering {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            if let (Some(x), Some(y)) = (x.as_i64(), y.as_i64()) {
                x.cmp(&y)
            } else if let (Some(x), Some(y)) = (x.as_u64(), y.as_u64()) {
                x.cmp(&y)
            } else {
                match (x.as_f64(), y.as_f64()) {
                    (Some(x), Some(y)) => x.total_cmp(&y),
                    _ => Ordering::Equal,
                }
            }
        }
        (Value::String(x), Value::String(y)) => x.cmp(y),
        (Value::Bool(x), Value::Bool(y)) => x.cmp(y),
        (Value::Array(x), Value::Array(y)) => compare_sequences(x.iter(), y.iter(), compare_values),
        (Value::Object(x), Value::Object(y)) => compare_sequences(
            sorted_fields(x).into_iter(),
            sorted_fields(y).into_iter(),
            |(name_a, value_a), (name_b, value_b)| {
                name_a
                    .cmp(name_b)
                    .then_with(|| compare_values(value_a, value_b))
            },
        ),
        _ => type_rank(a).cmp(&type_rank(b)),
    }
}

fn sorted_fields(fields: &Map<String, Value>) -> Vec<(&String, &Value)> {
    let mut fields: Vec<(&String, &Value)> = fields.iter().collect();
    fields.sort_by(|a, b| a.0.cmp(b.0));
    fields
}

fn type_rank(value: &Value) -> u8 {
    match value {
        Value::Number(_) => 0,
        Value::String(_) => 1,
        Value::Bool(_) => 2,
        Value::Array(_) => 3,
        Value::Object(_) => 4,
        Value::Null => 5,
    }
}

/// Lexicographic order; a sequence sorts before the longer sequences it starts.
fn compare_sequences<T>(
    mut a: impl Iterator<Item = T>,
    mut b: impl Iterator<Item = T>,
    compare: impl Fn(T, T) -> Ordering,
) -> Ordering {
    loop {
        match (a.next(), b.next()) {
            (Some(x), Some(y)) => match compare(x, y) {
                Ordering::Equal => {}
                unequal => return unequal,
            },
            (None, None) => return Ordering::Equal,
            (None, Some(_)) => return Ordering::Less,
            (Some(_), None) => return Ordering::Greater,
        }
    }
}

/// A set of field paths. Each node stands for the path leading to it; the path is in
/// the set when `member` is true, and its children lead further. The root is the
/// whole object, which is never a member.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldSet {
    member: bool,
    children: BTreeMap<PathElement, FieldSet>,
}

impl FieldSet {
    /// Whether the set holds no path.
    pub fn is_empty(&self) -> bool {
        !self.member && self.children.is_empty()
    }

    /// Adds `path`; the empty path (the whole object) is not tracked.
    pub fn insert(&mut self, path: &[PathElement]) {
        let Some((first, rest)) = path.split_first() else {
            return;
        };
        let child = self.children.entry(first.clone()).or_default();
        if rest.is_empty() {
            child.member = true;
        } else {
            child.insert(rest);
        }
    }

    /// The set holding only the path it stands for.
    pub fn member() -> FieldSet {
        FieldSet {
            member: true,
            children: BTreeMap::new(),
        }
    }

    /// Adds `set`, the paths below `path`, as [`insert`](Self::insert) would one by one:
    /// `path` itself is in the set when `set` is a member.
    pub fn graft(&mut self, path: &[PathElement], set: FieldSet) {
        if set.is_empty() {
            return;
        }
        match path.split_first() {
            // The root is never a member.
            None => {
                for (element, child) in set.children {
                    self.put_child(element, child);
                }
            }
            Some((first, [])) => self.put_child(first.clone(), set),
            Some((first, rest)) => self
                .children
                .entry(first.clone())
                .or_default()
                .graft(rest, set),
        }
    }

    /// Adds `child` under `element`, merged with what is there.
    pub fn put_child(&mut self, element: PathElement, child: FieldSet) {
        if child.is_empty() {
            return;
        }
        match self.children.entry(element) {
            Entry::Vacant(vacant) => {
                vacant.insert(child);
            }
            Entry::Occupied(mut occupied) => {
                let ours = occupied.get_mut();
                ours.member |= child.member;
                for (element, grandchild) in child.children {
                    ours.put_child(element, grandchild);
                }
            }
        }
    }

    /// The first elements of the set's paths.
    pub fn elements(&self) -> impl Iterator<Item = &PathElement> {
        self.children.keys()
    }

    /// The paths under `element`, for changing them.
    pub fn child_mut(&mut self, element: &PathElement) -> Option<&mut FieldSet> {
        self.children.get_mut(element)
    }

    /// Drops `element` and every path under it.
    pub fn remove_child(&mut self, element: &PathElement) {
        self.children.remove(element);
    }

    /// Puts the path this node stands for in the set, or takes it out.
    pub fn set_member(&mut self, member: bool) {
        self.member = member;
    }

    /// The paths under `element`, or `None` when the set holds none.
    pub fn child(&self, element: &PathElement) -> Option<&FieldSet> {
        self.children.get(element)
    }

    /// Whether the path this node stands for is in the set.
    pub fn is_member(&self) -> bool {
        self.member
    }

    /// Paths in either set.
    pub fn union(&self, other: &FieldSet) -> FieldSet {
        let mut out = self.clone();
        out.member |= other.member;
        for (element, theirs) in &other.children {
            let merged = match out.children.get(element) {
                Some(ours) => ours.union(theirs),
                None => theirs.clone(),
            };
            out.children.insert(element.clone(), merged);
        }
        out
    }

    /// Paths of `self` that are not in `other`; paths below a path of `other` stay.
    pub fn difference(&self, other: &FieldSet) -> FieldSet {
        let mut out = FieldSet {
            member: self.member && !other.member,
            children: BTreeMap::new(),
        };
        for (element, ours) in &self.children {
            let rest = match other.children.get(element) {
                Some(theirs) => ours.difference(theirs),
                None => ours.clone(),
            };
            out.put(element, rest);
        }
        out
    }

    /// Whether a path is in both sets ([`intersection`](Self::intersection) is not
    /// empty), without building anything.
    pub fn intersects(&self, other: &FieldSet) -> bool {
        (self.member && other.member)
            || self.children.iter().any(|(element, ours)| {
                other
                    .children
                    .get(element)
                    .is_some_and(|theirs| ours.intersects(theirs))
            })
    }

    /// Whether every path of `other` is in this set (their union is this set).
    pub fn contains(&self, other: &FieldSet) -> bool {
        (self.member || !other.member)
            && other.children.iter().all(|(element, theirs)| {
                self.children
                    .get(element)
                    .is_some_and(|ours| ours.contains(theirs))
            })
    }

    /// Paths in both sets.
    pub fn intersection(&self, other: &FieldSet) -> FieldSet {
        let mut out = FieldSet {
            member: self.member && other.member,
            children: BTreeMap::new(),
        };
        for (element, ours) in &self.children {
            if let Some(theirs) = other.children.get(element) {
                out.put(element, ours.intersection(theirs));
            }
        }
        out
    }

    /// The set plus every object field on the way to one of its paths, as upstream's
    /// `EnsureNamedFieldsAreMembers` (list items on the way are not added).
    pub fn with_field_ancestors(&self) -> FieldSet {
        let mut out = self.clone();
        out.mark_field_ancestors();
        out
    }

    fn mark_field_ancestors(&mut self) {
        for (element, child) in &mut self.children {
            if matches!(element, PathElement::Field(_)) && !child.children.is_empty() {
                child.member = true;
            }
            child.mark_field_ancestors();
        }
    }

    /// Every path in the set, in upstream's iteration order: the paths of one level
    /// first, then those below each of them.
    pub fn paths(&self) -> Vec<Vec<PathElement>> {
        let mut out = Vec::new();
        self.collect_paths(&mut Vec::new(), &mut out);
        out
    }

    fn collect_paths(&self, prefix: &mut Vec<PathElement>, out: &mut Vec<Vec<PathElement>>) {
        for (element, child) in &self.children {
            if child.member {
                let mut path = prefix.clone();
                path.push(element.clone());
                out.push(path);
            }
        }
        for (element, child) in &self.children {
            prefix.push(element.clone());
            child.collect_paths(prefix, out);
            prefix.pop();
        }
    }

    /// The `FieldsV1` encoding: `.` first, then elements in upstream's order.
    pub fn to_fields_v1(&self) -> Value {
        self.clone().into_fields_v1()
    }

    /// [`to_fields_v1`](Self::to_fields_v1), taking the set apart as it goes.
    pub fn into_fields_v1(self) -> Value {
        let mut out = Map::new();
        if self.member && !self.children.is_empty() {
            out.insert(".".to_string(), Value::Object(Map::new()));
        }
        for (element, child) in self.children {
            out.insert(element.encode(), child.into_fields_v1());
        }
        Value::Object(out)
    }

    /// Reads a `FieldsV1` encoding; fails on anything that is not one.
    pub fn from_fields_v1(fields: &Value) -> Result<FieldSet, String> {
        let mut set = Self::decode_node(fields)?;
        set.member = false;
        Ok(set)
    }

    fn decode_node(fields: &Value) -> Result<FieldSet, String> {
        let Value::Object(entries) = fields else {
            return Err(format!("expected an object in fieldsV1, got {fields}"));
        };
        let mut set = FieldSet {
            member: entries.is_empty(),
            children: BTreeMap::new(),
        };
        for (name, child) in entries {
            if name == "." {
                set.member = true;
            } else {
                set.children
                    .insert(PathElement::decode(name)?, Self::decode_node(child)?);
            }
        }
        Ok(set)
    }

    // Keeps the invariant that no node below the root is empty.
    fn put(&mut self, element: &PathElement, child: FieldSet) {
        if !child.is_empty() {
            self.children.insert(element.clone(), child);
        }
    }
}

/// `prefix` then `text`, in one allocation.
fn prefixed(prefix: &str, text: &str) -> String {
    let mut out = String::with_capacity(prefix.len() + text.len());
    out.push_str(prefix);
    out.push_str(text);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn fields_v1_round_trips_in_upstream_layout() {
        let fields = json!({
            "f:metadata": {"f:labels": {".": {}, "f:app": {}}},
            "f:spec": {
                "f:containers": {
                    "k:{\"name\":\"app\"}": {".": {}, "f:image": {}, "f:name": {}}
                },
                "f:replicas": {}
            }
        });
        let set = FieldSet::from_fields_v1(&fields).unwrap();
        let paths: Vec<String> = set.paths().iter().map(|path| path_text(path)).collect();
        assert_eq!(
            paths,
            [
                ".metadata.labels",
                ".metadata.labels.app",
                ".spec.replicas",
                ".spec.containers[name=\"app\"]",
                ".spec.containers[name=\"app\"].image",
                ".spec.containers[name=\"app\"].name",
            ],
            "upstream's order: one level's paths before those below them"
        );
        assert_eq!(set.to_fields_v1(), fields);
        assert_eq!(
            serde_json::to_string(&set.to_fields_v1()).unwrap(),
            serde_json::to_string(&fields).unwrap(),
            "key order matches upstream's"
        );
    }

    #[test]
    fn keys_sort_by_field_name_whatever_the_schema_order() {
        let element = PathElement::key(vec![
            ("protocol".to_string(), json!("TCP")),
            ("containerPort".to_string(), json!(80)),
        ]);
        assert_eq!(
            element.encode(),
            r#"k:{"containerPort":80,"protocol":"TCP"}"#
        );
        assert_eq!(element.to_string(), r#"[containerPort=80,protocol="TCP"]"#);
        assert_eq!(PathElement::Value(json!("a")).to_string(), r#"[="a"]"#);
    }

    #[test]
    fn malformed_fields_v1_is_rejected() {
        for bad in [
            json!([]),
            json!({"x:y": {}}),
            json!({"k:notjson": {}}),
            json!({"f:a": 1}),
        ] {
            assert!(FieldSet::from_fields_v1(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn set_operations_work_on_members() {
        let path = |names: &[&str]| -> Vec<PathElement> {
            names.iter().map(|n| PathElement::field(n)).collect()
        };
        let mut a = FieldSet::default();
        a.insert(&path(&["spec", "replicas"]));
        a.insert(&path(&["spec", "paused"]));
        let mut b = FieldSet::default();
        b.insert(&path(&["spec", "replicas"]));
        b.insert(&path(&["spec", "template"]));

        assert_eq!(
            a.intersection(&b).paths(),
            vec![path(&["spec", "replicas"])]
        );
        assert_eq!(a.difference(&b).paths(), vec![path(&["spec", "paused"])]);
        assert_eq!(a.union(&b).paths().len(), 3);
        assert!(a.difference(&a).is_empty());

        let mut spec = FieldSet::default();
        spec.insert(&path(&["spec"]));
        assert_eq!(a.difference(&spec), a, "difference leaves paths below");
        assert_eq!(a.with_field_ancestors().paths()[0], path(&["spec"]));
    }

    /// `intersects` and `contains` answer what `intersection` and `union` would build.
    #[test]
    fn intersects_and_contains_agree_with_the_sets_they_stand_for() {
        let set = |paths: &[&[&str]]| {
            let mut out = FieldSet::default();
            for names in paths {
                let path: Vec<PathElement> = names.iter().map(|n| PathElement::field(n)).collect();
                out.insert(&path);
            }
            out
        };
        let status = set(&[&["status", "phase"], &["status", "podIP"]]);
        let cases = [
            ("disjoint", set(&[&["spec", "replicas"]])),
            ("one shared path", set(&[&["status", "phase"]])),
            ("a parent, not its children", set(&[&["status"]])),
            ("a child below a path", set(&[&["status", "phase", "x"]])),
            ("the same set", status.clone()),
            (
                "a superset",
                set(&[&["status", "phase"], &["status", "podIP"], &["spec", "x"]]),
            ),
            ("nothing", FieldSet::default()),
        ];
        for (name, other) in cases {
            assert_eq!(
                status.intersects(&other),
                !status.intersection(&other).is_empty(),
                "{name}: intersects"
            );
            assert_eq!(
                status.contains(&other),
                status.union(&other) == status,
                "{name}: contains"
            );
        }
    }

    #[test]
    fn numbers_compare_by_value() {
        assert!(same_value(&json!(1), &json!(1.0)));
        assert!(same_value(
            &json!({"a": 1, "b": 2}),
            &json!({"b": 2, "a": 1})
        ));
        assert!(!same_value(&json!("1"), &json!(1)));
    }
}
