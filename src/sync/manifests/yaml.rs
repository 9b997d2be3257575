//! The YAML side of manifests: the documents of one file as trees that remember the line of
//! every key and item, their JSON form, field paths into them, and the limits that keep
//! oversized or hostile input (alias bombs) from exhausting the process.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, Deserialize, DeserializeOwned, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};
use serde_saphyr::{Error as YamlError, Location, MessageFormatter, Spanned, UserMessageFormatter};

/// Largest manifest file accepted, in bytes (1 MiB). The API server stores objects of at
/// most about 1.5 MiB, so a bigger file is almost certainly committed by mistake.
pub const MAX_FILE_BYTES: usize = 1024 * 1024;

/// Largest total size of the manifest files of one commit, in bytes (64 MiB).
pub const MAX_COMMIT_BYTES: usize = 64 * 1024 * 1024;

/// Most nodes that aliases may expand to in one file. Manifests rarely use anchors at
/// all; a billion-laughs file stops here after a few milliseconds of work.
pub const MAX_ALIAS_EXPANSION: usize = 100_000;

/// Options every manifest and settings file is parsed with.
fn options() -> serde_saphyr::Options {
    serde_saphyr::options! {
        // YAML 1.2 booleans only: `on`, `y` and `no` stay strings, as label values need.
        strict_booleans: true,
        with_snippet: false,
        alias_limits: serde_saphyr::alias_limits! {
            max_total_replayed_events: MAX_ALIAS_EXPANSION,
        },
    }
}

/// A YAML node and the line it was written on (for an alias, the line of the alias).
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    /// 1-based line; 0 when the parser could not tell.
    pub line: usize,
    /// The node's content.
    pub value: NodeValue,
}

/// The content of a [`Node`], shaped like JSON.
#[derive(Clone, Debug, PartialEq)]
pub enum NodeValue {
    /// `~`, `null` or nothing.
    Null,
    /// `true` or `false`.
    Bool(bool),
    /// An integer or a finite float.
    Number(Number),
    /// Any other scalar.
    String(String),
    /// A sequence, in order.
    Sequence(Vec<Node>),
    /// A mapping, in the order of the file.
    Mapping(Vec<Entry>),
}

/// One key of a mapping.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    /// The key as a string (YAML `1:` becomes `"1"`, as in Kubernetes).
    pub key: String,
    /// 1-based line of the key.
    pub line: usize,
    /// The value.
    pub value: Node,
}

/// A file that is not valid YAML, or that breaks a parsing limit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SyntaxError {
    /// 1-based line, when known.
    pub line: Option<usize>,
    /// 1-based column, when known.
    pub column: Option<usize>,
    /// What is wrong, without the position.
    pub message: String,
}

impl Node {
    /// The JSON form of the node, as the API server would read the YAML.
    pub fn to_json(&self) -> Value {
        match &self.value {
            NodeValue::Null => Value::Null,
            NodeValue::Bool(b) => Value::Bool(*b),
            NodeValue::Number(n) => Value::Number(n.clone()),
            NodeValue::String(s) => Value::String(s.clone()),
            NodeValue::Sequence(items) => Value::Array(items.iter().map(Node::to_json).collect()),
            NodeValue::Mapping(entries) => Value::Object(
                entries
                    .iter()
                    .map(|entry| (entry.key.clone(), entry.value.to_json()))
                    .collect::<Map<_, _>>(),
            ),
        }
    }

    /// The line of the field at `path`: of its key inside a mapping, of the item inside a
    /// sequence. A path that leaves the tree gives the line of the last node it reached, so a
    /// missing field is reported where its parent is. `None` when no line is known.
    pub fn line_of(&self, path: &FieldPath) -> Option<usize> {
        let mut node = self;
        let mut line = self.line;
        for segment in &path.0 {
            let next = match (segment, &node.value) {
                (Segment::Field(name), NodeValue::Mapping(entries)) => entries
                    .iter()
                    .find(|entry| &entry.key == name)
                    .map(|entry| (entry.line, &entry.value)),
                (Segment::Index(index), NodeValue::Sequence(items)) => {
                    items.get(*index).map(|item| (item.line, item))
                }
                _ => None,
            };
            let Some((at, child)) = next else { break };
            line = at;
            node = child;
        }
        (line > 0).then_some(line)
    }

    /// Reads a dotted path as [`capstan_api::schema::unknown_fields`] writes it
    /// (`spec.a.b[0].c`) against this tree, so keys that contain dots are found whole.
    /// The unresolved rest, if any, becomes one last field.
    pub fn resolve(&self, dotted: &str) -> FieldPath {
        let mut path = FieldPath::root();
        let mut node = Some(self);
        let mut rest = dotted;
        while !rest.is_empty() {
            if let Some(after) = rest.strip_prefix('[')
                && let Some((digits, tail)) = after.split_once(']')
                && let Ok(index) = digits.parse::<usize>()
            {
                path = path.index(index);
                node = match node.map(|n| &n.value) {
                    Some(NodeValue::Sequence(items)) => items.get(index),
                    _ => None,
                };
                rest = tail.strip_prefix('.').unwrap_or(tail);
                continue;
            }
            // The longest key that the path continues from wins: `a.b` over `a`.
            let matched = match node.map(|n| &n.value) {
                Some(NodeValue::Mapping(entries)) => entries
                    .iter()
                    .filter(|entry| {
                        rest.strip_prefix(entry.key.as_str()).is_some_and(|tail| {
                            tail.is_empty() || tail.starts_with('.') || tail.starts_with('[')
                        })
                    })
                    .max_by_key(|entry| entry.key.len()),
                _ => None,
            };
            let Some(entry) = matched else {
                return path.field(rest);
            };
            path = path.field(&entry.key);
            node = Some(&entry.value);
            let tail = &rest[entry.key.len()..];
            rest = tail.strip_prefix('.').unwrap_or(tail);
        }
        path
    }
}

impl From<Spanned<NodeValue>> for Node {
    fn from(spanned: Spanned<NodeValue>) -> Self {
        Node {
            line: line(spanned.referenced),
            value: spanned.value,
        }
    }
}

fn line(location: Location) -> usize {
    usize::try_from(location.line()).unwrap_or(0)
}

/// Where a field is inside an object: keys and sequence indices from the root.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FieldPath(Vec<Segment>);

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Segment {
    Field(String),
    Index(usize),
}

impl FieldPath {
    /// The object itself.
    pub fn root() -> Self {
        FieldPath(Vec::new())
    }

    /// A path of plain field names: `FieldPath::of(&["spec", "selector"])`.
    pub fn of(names: &[&str]) -> Self {
        FieldPath(
            names
                .iter()
                .map(|name| Segment::Field((*name).to_string()))
                .collect(),
        )
    }

    /// The field `name` below this path.
    pub fn field(&self, name: &str) -> Self {
        let mut segments = self.0.clone();
        segments.push(Segment::Field(name.to_string()));
        FieldPath(segments)
    }

    /// The item `index` below this path.
    pub fn index(&self, index: usize) -> Self {
        let mut segments = self.0.clone();
        segments.push(Segment::Index(index));
        FieldPath(segments)
    }

    /// The path without its last segment, and the field name of that segment if it is one.
    pub fn split_last_field(&self) -> Option<(FieldPath, &str)> {
        match self.0.split_last() {
            Some((Segment::Field(name), parent)) => Some((FieldPath(parent.to_vec()), name)),
            _ => None,
        }
    }

    /// The field names along the path, `None` for sequence items.
    pub fn names(&self) -> impl Iterator<Item = Option<&str>> {
        self.0.iter().map(|segment| match segment {
            Segment::Field(name) => Some(name.as_str()),
            Segment::Index(_) => None,
        })
    }
}

/// `spec.kernelMappings[0].literal`; a key that is not a plain name is written in brackets,
/// as Kubernetes does for map keys: `metadata.labels[example.com/zone]`.
impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (position, segment) in self.0.iter().enumerate() {
            match segment {
                Segment::Index(index) => write!(f, "[{index}]")?,
                Segment::Field(name) if is_plain_name(name) => {
                    if position > 0 {
                        f.write_str(".")?;
                    }
                    f.write_str(name)?;
                }
                Segment::Field(name) => write!(f, "[{name}]")?,
            }
        }
        Ok(())
    }
}

fn is_plain_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '$')
}

/// The non-empty documents of a file, in order (empty and `null` documents are skipped).
///
/// Fails on a YAML syntax error, a duplicate key, a non-finite number, a mapping key that
/// is not a scalar, or aliases that expand beyond [`MAX_ALIAS_EXPANSION`] nodes.
pub fn documents(text: &str) -> Result<Vec<Node>, SyntaxError> {
    let documents: Vec<Spanned<NodeValue>> =
        serde_saphyr::from_multiple_with_options(text, options())
            .map_err(|err| syntax_error(&err))?;
    Ok(documents.into_iter().map(Node::from).collect())
}

/// Reads one document straight into a Rust type, with the same options and limits as
/// [`documents`].
pub fn typed<T: DeserializeOwned>(text: &str) -> Result<T, SyntaxError> {
    serde_saphyr::from_str_with_options(text, options()).map_err(|err| syntax_error(&err))
}

/// The text of a file, without a UTF-8 byte order mark. Fails, with the line of the first
/// bad byte, when the file is not UTF-8.
pub fn text(contents: &[u8]) -> Result<&str, SyntaxError> {
    let contents = contents.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(contents);
    std::str::from_utf8(contents).map_err(|err| {
        let valid = &contents[..err.valid_up_to()];
        let newlines = valid.iter().filter(|b| **b == b'\n').count();
        let column = valid.len() - valid.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
        SyntaxError {
            line: Some(newlines + 1),
            column: Some(column + 1),
            message: "the file is not UTF-8 text".to_string(),
        }
    })
}

fn syntax_error(err: &YamlError) -> SyntaxError {
    let position = err.location().filter(|at| at.line() > 0);
    let mut inner = err.without_snippet();
    // Alias errors wrap the original one together with where the alias was used.
    if let YamlError::AliasError { error, .. } = inner {
        inner = error.without_snippet();
    }
    let message: Cow<'_, str> = match inner {
        YamlError::AliasReplayLimitExceeded { .. }
        | YamlError::AliasExpansionLimitExceeded { .. }
        | YamlError::AliasReplayStackDepthExceeded { .. } => Cow::Owned(format!(
            "YAML aliases expand to more than {MAX_ALIAS_EXPANSION} nodes; the file looks like \
             an alias bomb and is rejected (write the values out instead of using anchors)"
        )),
        other => UserMessageFormatter.format_message(other),
    };
    SyntaxError {
        line: position.map(line),
        column: position.and_then(|at| usize::try_from(at.column()).ok()),
        // The message may quote the input; keep it on one line.
        message: message
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect(),
    }
}

impl<'de> Deserialize<'de> for NodeValue {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(NodeVisitor)
    }
}

struct NodeVisitor;

impl<'de> Visitor<'de> for NodeVisitor {
    type Value = NodeValue;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any YAML value")
    }

    fn visit_unit<E: de::Error>(self) -> Result<NodeValue, E> {
        Ok(NodeValue::Null)
    }

    fn visit_none<E: de::Error>(self) -> Result<NodeValue, E> {
        Ok(NodeValue::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<NodeValue, D::Error> {
        NodeValue::deserialize(deserializer)
    }

    fn visit_bool<E: de::Error>(self, value: bool) -> Result<NodeValue, E> {
        Ok(NodeValue::Bool(value))
    }

    fn visit_i64<E: de::Error>(self, value: i64) -> Result<NodeValue, E> {
        Ok(NodeValue::Number(value.into()))
    }

    fn visit_u64<E: de::Error>(self, value: u64) -> Result<NodeValue, E> {
        Ok(NodeValue::Number(value.into()))
    }

    fn visit_i128<E: de::Error>(self, value: i128) -> Result<NodeValue, E> {
        i64::try_from(value)
            .map(|v| NodeValue::Number(v.into()))
            .map_err(|_| E::custom(format!("integer {value} is out of range")))
    }

    fn visit_u128<E: de::Error>(self, value: u128) -> Result<NodeValue, E> {
        u64::try_from(value)
            .map(|v| NodeValue::Number(v.into()))
            .map_err(|_| E::custom(format!("integer {value} is out of range")))
    }

    fn visit_f64<E: de::Error>(self, value: f64) -> Result<NodeValue, E> {
        Number::from_f64(value)
            .map(NodeValue::Number)
            .ok_or_else(|| E::custom(format!("{value} is not a finite number")))
    }

    fn visit_str<E: de::Error>(self, value: &str) -> Result<NodeValue, E> {
        Ok(NodeValue::String(value.to_string()))
    }

    fn visit_string<E: de::Error>(self, value: String) -> Result<NodeValue, E> {
        Ok(NodeValue::String(value))
    }

    fn visit_bytes<E: de::Error>(self, _: &[u8]) -> Result<NodeValue, E> {
        Err(E::custom(
            "binary scalars (!!binary) are not supported; write base64 text as a string",
        ))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<NodeValue, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<Spanned<NodeValue>>()? {
            items.push(Node::from(item));
        }
        Ok(NodeValue::Sequence(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<NodeValue, A::Error> {
        let mut entries = Vec::new();
        while let Some(key) = map.next_key::<Spanned<String>>()? {
            let value = map.next_value::<Spanned<NodeValue>>()?;
            entries.push(Entry {
                key: key.value,
                line: line(key.referenced),
                value: Node::from(value),
            });
        }
        Ok(NodeValue::Mapping(entries))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(text: &str) -> Node {
        let mut docs = documents(text).unwrap();
        assert_eq!(docs.len(), 1);
        docs.remove(0)
    }

    #[test]
    fn lines_of_keys_items_and_missing_fields() {
        let tree = one("# comment\napiVersion: v1\nspec:\n  list:\n    - a\n    - {b: 1}\n");
        assert_eq!(tree.line, 2);
        let cases: &[(FieldPath, Option<usize>)] = &[
            (FieldPath::root(), Some(2)),
            (FieldPath::of(&["apiVersion"]), Some(2)),
            (FieldPath::of(&["spec", "list"]), Some(4)),
            (FieldPath::of(&["spec", "list"]).index(1), Some(6)),
            (
                FieldPath::of(&["spec", "list"]).index(1).field("b"),
                Some(6),
            ),
            // Missing fields are reported where their nearest parent is.
            (FieldPath::of(&["spec", "missing", "deeper"]), Some(3)),
            (FieldPath::of(&["spec", "list"]).index(7), Some(4)),
        ];
        for (path, expected) in cases {
            assert_eq!(tree.line_of(path), *expected, "{path}");
        }
    }

    #[test]
    fn json_form_keeps_types() {
        let tree = one("b: 1\na: [true, ~, 1.5, on, \"2\"]\n3: x\n");
        assert_eq!(
            serde_json::to_string(&tree.to_json()).unwrap(),
            r#"{"3":"x","a":[true,null,1.5,"on","2"],"b":1}"#
        );
    }

    #[test]
    fn empty_documents_and_separators_are_skipped() {
        let docs = documents("---\n---\n# only a comment\n---\nnull\n---\na: 1\n---\n").unwrap();
        assert_eq!(docs.len(), 1);
        assert_eq!(docs[0].line, 7);
        assert!(documents("").unwrap().is_empty());
    }

    #[test]
    fn resolve_finds_keys_with_dots() {
        let tree = one("metadata:\n  labels:\n    a.b/c: x\nspec:\n  items:\n  - x.y: 1\n");
        let cases = [
            ("metadata.labels.a.b/c", "metadata.labels[a.b/c]", Some(3)),
            ("spec.items[0].x.y", "spec.items[0][x.y]", Some(6)),
            ("spec.nope.deeper", "spec[nope.deeper]", Some(4)),
        ];
        for (dotted, shown, line) in cases {
            let path = tree.resolve(dotted);
            assert_eq!(path.to_string(), shown);
            assert_eq!(tree.line_of(&path), line, "{dotted}");
        }
    }

    #[test]
    fn syntax_errors_have_line_and_column() {
        let cases = [
            (
                "a: 1\nb:\n  c: 2\n   d: 3\n",
                4,
                "mapping values are not allowed",
            ),
            ("metadata:\n  name: [a\n", 2, "bracket"),
            ("a: 1\na: 2\n", 2, "duplicate"),
        ];
        for (text, line, words) in cases {
            let err = documents(text).unwrap_err();
            assert_eq!(err.line, Some(line), "{text:?}: {err:?}");
            assert!(err.column.is_some(), "{err:?}");
            assert!(err.message.contains(words), "{err:?}");
            assert!(!err.message.contains("at line"), "{err:?}");
        }
    }

    #[test]
    fn yaml_1_1_booleans_stay_strings() {
        let tree = one("a: yes\nb: off\nc: y\nd: true\n");
        assert_eq!(
            tree.to_json(),
            serde_json::json!({"a": "yes", "b": "off", "c": "y", "d": true})
        );
    }

    #[test]
    fn alias_bomb_is_rejected_quickly() {
        let mut bomb = String::from(
            "a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n",
        );
        for (name, previous) in ["b", "c", "d", "e", "f", "g", "h", "i"]
            .iter()
            .zip(["a", "b", "c", "d", "e", "f", "g", "h"])
        {
            let refs = vec![format!("*{previous}"); 9].join(",");
            bomb.push_str(&format!("{name}: &{name} [{refs}]\n"));
        }
        // Expanded, the bomb is 9^9 strings: refused by the expansion budget, not by
        // running out of memory (a time limit here would only measure the machine's load).
        let err = documents(&bomb).unwrap_err();
        assert!(err.message.contains("alias bomb"), "{err:?}");
        assert!(err.line.is_some());
    }

    #[test]
    fn modest_anchor_use_is_fine() {
        let tree = one("base: &base {a: 1}\none: *base\ntwo:\n  <<: *base\n  b: 2\n");
        assert_eq!(
            tree.to_json(),
            serde_json::json!({"base": {"a": 1}, "one": {"a": 1}, "two": {"a": 1, "b": 2}})
        );
    }

    #[test]
    fn non_utf8_files_are_rejected_with_their_line() {
        let err = text(b"a: 1\nb: \xff\n").unwrap_err();
        assert_eq!((err.line, err.column), (Some(2), Some(4)));
        assert_eq!(text(b"\xEF\xBB\xBFa: 1\n").unwrap(), "a: 1\n");
    }
}
