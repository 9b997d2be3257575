//! Decoding of Kubernetes protobuf request bodies (`application/vnd.kubernetes.protobuf`).
//!
//! client-go's typed clients, and so `kubectl create namespace|configmap|secret|
//! serviceaccount|poddisruptionbudget` and the eviction `kubectl drain` posts, send bodies
//! as the magic `k8s\0` followed by a `runtime.Unknown` envelope: its `typeMeta` names the
//! apiVersion and kind, its `raw` holds the object as written by the gogo-generated proto2
//! marshalers of `k8s.io/api`. [`decode`] turns such a body into the JSON object Go's
//! `encoding/json` would produce for the same value, so the rest of the server only sees JSON.
//!
//! Every supported message is a table of rows (field number, JSON name, kind) whose numbers
//! come from upstream `generated.proto`. Go's marshalers write value-typed fields even when
//! they are zero, so each row also says whether a zero scalar is dropped (a value field
//! tagged `omitempty`) or kept (a pointer field, or one without `omitempty`). Field numbers a
//! table does not list are skipped, as upstream decoders skip fields of newer versions.

use std::collections::BTreeMap;

use base64::Engine as _;
use serde_json::{Map, Value};

/// The prefix of every Kubernetes protobuf body.
const MAGIC: &[u8] = b"k8s\0";

/// The only content type an envelope may declare for its raw bytes.
const CONTENT_TYPE: &str = "application/vnd.kubernetes.protobuf";

/// Why a protobuf request body could not be decoded.
#[derive(Debug, thiserror::Error)]
pub enum ProtobufError {
    /// The body does not start with the `k8s\0` magic of Kubernetes protobuf.
    #[error("protobuf body: missing the k8s\\0 magic prefix")]
    MissingMagic,
    /// The envelope names a kind this server cannot decode from protobuf.
    #[error(
        "the embedded cluster reads protobuf bodies of Namespaces, ConfigMaps, Secrets, ServiceAccounts, PodDisruptionBudgets, Evictions and access reviews only, not of {api_version} {kind} (kubectl's `create <kind>` sends one): apply a manifest instead, e.g. `kubectl create deployment web --image=nginx --dry-run=client -o yaml | kubectl apply -f -`"
    )]
    UnsupportedKind {
        /// The envelope's apiVersion, e.g. `policy/v1`.
        api_version: String,
        /// The envelope's kind, e.g. `PodDisruptionBudget`.
        kind: String,
    },
    /// The envelope declares a content encoding or type other than plain protobuf,
    /// e.g. `content encoding gzip`.
    #[error("protobuf body: unsupported {0} (send JSON instead)")]
    UnsupportedEnvelope(String),
    /// A field's value runs past the end of the message holding it.
    #[error("protobuf body: truncated field {field} of {message}")]
    Truncated {
        /// The field's number.
        field: u32,
        /// The upstream name of the message holding the field.
        message: &'static str,
    },
    /// The bytes are not protobuf the message can hold, e.g. a field has the wrong wire type.
    #[error("protobuf body: malformed {message}: {detail}")]
    Malformed {
        /// The upstream name of the message being decoded.
        message: &'static str,
        /// What is wrong with it.
        detail: String,
    },
}

/// Decodes an `application/vnd.kubernetes.protobuf` request body (the magic `k8s\0`
/// followed by a `runtime.Unknown` envelope whose `typeMeta` gives apiVersion and kind and
/// whose `raw` bytes are the object) into the JSON object Kubernetes' JSON encoding of the
/// same object would give, including `apiVersion` and `kind`.
///
/// # Errors
///
/// Fails when the magic is missing, when the envelope names a kind this module has no table
/// for or a content encoding, and when the bytes are truncated or not valid for the message.
pub fn decode(body: &[u8]) -> Result<Value, ProtobufError> {
    let envelope = Envelope::parse(body)?;
    if !envelope.content_encoding.is_empty() {
        return Err(ProtobufError::UnsupportedEnvelope(format!(
            "content encoding {}",
            envelope.content_encoding
        )));
    }
    if !envelope.content_type.is_empty() && envelope.content_type != CONTENT_TYPE {
        return Err(ProtobufError::UnsupportedEnvelope(format!(
            "content type {}",
            envelope.content_type
        )));
    }
    if envelope.kind.is_empty() {
        return Err(ProtobufError::Malformed {
            message: "Unknown",
            detail: "typeMeta names no kind".to_owned(),
        });
    }
    let Some(&(_, _, message)) = KINDS.iter().find(|(api_version, kind, _)| {
        *api_version == envelope.api_version && *kind == envelope.kind
    }) else {
        return Err(ProtobufError::UnsupportedKind {
            api_version: envelope.api_version,
            kind: envelope.kind,
        });
    };
    let mut object = Map::new();
    object.insert("apiVersion".to_owned(), Value::String(envelope.api_version));
    object.insert("kind".to_owned(), Value::String(envelope.kind));
    object.extend(decode_message(envelope.raw, message)?);
    Ok(Value::Object(object))
}

/// Top-level kinds decodable from protobuf, by the apiVersion and kind their envelope names.
// Every API group registers DeleteOptions, so clients tag it with the group they talk to.
static KINDS: &[(&str, &str, &Message)] = &[
    ("v1", "Namespace", &NAMESPACE),
    ("v1", "ConfigMap", &CONFIG_MAP),
    ("v1", "Secret", &SECRET),
    ("v1", "ServiceAccount", &SERVICE_ACCOUNT),
    ("policy/v1", "PodDisruptionBudget", &POD_DISRUPTION_BUDGET),
    ("policy/v1", "Eviction", &EVICTION),
    ("policy/v1beta1", "Eviction", &EVICTION),
    ("meta.k8s.io/v1", "DeleteOptions", &DELETE_OPTIONS),
    ("v1", "DeleteOptions", &DELETE_OPTIONS),
    ("policy/v1", "DeleteOptions", &DELETE_OPTIONS),
    ("policy/v1beta1", "DeleteOptions", &DELETE_OPTIONS),
    (
        "authorization.k8s.io/v1",
        "SelfSubjectAccessReview",
        &SELF_SUBJECT_ACCESS_REVIEW,
    ),
];

/// A protobuf message: its upstream name (for errors) and the fields this server knows.
struct Message {
    name: &'static str,
    fields: &'static [Field],
}

/// One known field of a message.
struct Field {
    number: u32,
    json: &'static str,
    kind: Kind,
    zero: Zero,
}

/// What a decoded zero scalar (`""`, `0`, `false`) becomes in JSON.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Zero {
    /// Dropped: a value field tagged `omitempty`, which Go writes to protobuf even when zero.
    Omit,
    /// Kept: a pointer field (zero is a deliberate value) or a field without `omitempty`.
    Keep,
}

/// How a field is encoded and what JSON it becomes.
#[derive(Clone, Copy)]
enum Kind {
    String,
    /// Any varint integer (`int32` or `int64`); a JSON number.
    Int,
    Bool,
    /// `metav1.Time`, an RFC 3339 string in JSON.
    Time,
    /// `intstr.IntOrString`, a bare JSON number or string.
    IntOrString,
    Message(&'static Message),
    Strings,
    Messages(&'static Message),
    /// `map<string, V>`, written as repeated `{key = 1, value = 2}` entry messages.
    Map(MapValue),
}

/// The value type of a protobuf map.
#[derive(Clone, Copy)]
enum MapValue {
    String,
    /// `bytes`, a standard base64 string in JSON as Go's `[]byte` is.
    Bytes,
    Time,
}

/// A row for a field Go marshals to JSON whenever it is set.
const fn field(number: u32, json: &'static str, kind: Kind) -> Field {
    Field {
        number,
        json,
        kind,
        zero: Zero::Keep,
    }
}

/// A row for a value field tagged `omitempty`: its zero value is left out of the JSON.
const fn omitempty(number: u32, json: &'static str, kind: Kind) -> Field {
    Field {
        number,
        json,
        kind,
        zero: Zero::Omit,
    }
}

// k8s.io/apimachinery/pkg/apis/meta/v1/generated.proto

static OBJECT_META: Message = Message {
    name: "ObjectMeta",
    fields: &[
        omitempty(1, "name", Kind::String),
        omitempty(2, "generateName", Kind::String),
        omitempty(3, "namespace", Kind::String),
        omitempty(4, "selfLink", Kind::String),
        omitempty(5, "uid", Kind::String),
        omitempty(6, "resourceVersion", Kind::String),
        omitempty(7, "generation", Kind::Int),
        field(8, "creationTimestamp", Kind::Time),
        field(9, "deletionTimestamp", Kind::Time),
        field(10, "deletionGracePeriodSeconds", Kind::Int),
        field(11, "labels", Kind::Map(MapValue::String)),
        field(12, "annotations", Kind::Map(MapValue::String)),
        field(13, "ownerReferences", Kind::Messages(&OWNER_REFERENCE)),
        field(14, "finalizers", Kind::Strings),
    ],
};

static OWNER_REFERENCE: Message = Message {
    name: "OwnerReference",
    fields: &[
        field(5, "apiVersion", Kind::String),
        field(1, "kind", Kind::String),
        field(3, "name", Kind::String),
        field(4, "uid", Kind::String),
        field(6, "controller", Kind::Bool),
        field(7, "blockOwnerDeletion", Kind::Bool),
    ],
};

static LABEL_SELECTOR: Message = Message {
    name: "LabelSelector",
    fields: &[
        field(1, "matchLabels", Kind::Map(MapValue::String)),
        field(
            2,
            "matchExpressions",
            Kind::Messages(&LABEL_SELECTOR_REQUIREMENT),
        ),
    ],
};

static LABEL_SELECTOR_REQUIREMENT: Message = Message {
    name: "LabelSelectorRequirement",
    fields: &[
        field(1, "key", Kind::String),
        field(2, "operator", Kind::String),
        field(3, "values", Kind::Strings),
    ],
};

static CONDITION: Message = Message {
    name: "Condition",
    fields: &[
        field(1, "type", Kind::String),
        field(2, "status", Kind::String),
        omitempty(3, "observedGeneration", Kind::Int),
        field(4, "lastTransitionTime", Kind::Time),
        field(5, "reason", Kind::String),
        field(6, "message", Kind::String),
    ],
};

static DELETE_OPTIONS: Message = Message {
    name: "DeleteOptions",
    fields: &[
        field(1, "gracePeriodSeconds", Kind::Int),
        field(2, "preconditions", Kind::Message(&PRECONDITIONS)),
        field(3, "orphanDependents", Kind::Bool),
        field(4, "propagationPolicy", Kind::String),
        field(5, "dryRun", Kind::Strings),
    ],
};

static PRECONDITIONS: Message = Message {
    name: "Preconditions",
    fields: &[
        field(1, "uid", Kind::String),
        field(2, "resourceVersion", Kind::String),
    ],
};

// k8s.io/api/core/v1/generated.proto

static NAMESPACE: Message = Message {
    name: "Namespace",
    fields: &[
        field(1, "metadata", Kind::Message(&OBJECT_META)),
        field(2, "spec", Kind::Message(&NAMESPACE_SPEC)),
        field(3, "status", Kind::Message(&NAMESPACE_STATUS)),
    ],
};

static NAMESPACE_SPEC: Message = Message {
    name: "NamespaceSpec",
    fields: &[field(1, "finalizers", Kind::Strings)],
};

static NAMESPACE_STATUS: Message = Message {
    name: "NamespaceStatus",
    fields: &[
        omitempty(1, "phase", Kind::String),
        field(2, "conditions", Kind::Messages(&NAMESPACE_CONDITION)),
    ],
};

static NAMESPACE_CONDITION: Message = Message {
    name: "NamespaceCondition",
    fields: &[
        field(1, "type", Kind::String),
        field(2, "status", Kind::String),
        field(4, "lastTransitionTime", Kind::Time),
        omitempty(5, "reason", Kind::String),
        omitempty(6, "message", Kind::String),
    ],
};

static CONFIG_MAP: Message = Message {
    name: "ConfigMap",
    fields: &[
        field(1, "metadata", Kind::Message(&OBJECT_META)),
        field(4, "immutable", Kind::Bool),
        field(2, "data", Kind::Map(MapValue::String)),
        field(3, "binaryData", Kind::Map(MapValue::Bytes)),
    ],
};

static SECRET: Message = Message {
    name: "Secret",
    fields: &[
        field(1, "metadata", Kind::Message(&OBJECT_META)),
        field(5, "immutable", Kind::Bool),
        field(2, "data", Kind::Map(MapValue::Bytes)),
        field(4, "stringData", Kind::Map(MapValue::String)),
        omitempty(3, "type", Kind::String),
    ],
};

static SERVICE_ACCOUNT: Message = Message {
    name: "ServiceAccount",
    fields: &[
        field(1, "metadata", Kind::Message(&OBJECT_META)),
        field(2, "secrets", Kind::Messages(&OBJECT_REFERENCE)),
        field(
            3,
            "imagePullSecrets",
            Kind::Messages(&LOCAL_OBJECT_REFERENCE),
        ),
        field(4, "automountServiceAccountToken", Kind::Bool),
    ],
};

static OBJECT_REFERENCE: Message = Message {
    name: "ObjectReference",
    fields: &[
        omitempty(1, "kind", Kind::String),
        omitempty(2, "namespace", Kind::String),
        omitempty(3, "name", Kind::String),
        omitempty(4, "uid", Kind::String),
        omitempty(5, "apiVersion", Kind::String),
        omitempty(6, "resourceVersion", Kind::String),
        omitempty(7, "fieldPath", Kind::String),
    ],
};

static LOCAL_OBJECT_REFERENCE: Message = Message {
    name: "LocalObjectReference",
    fields: &[field(1, "name", Kind::String)],
};

// k8s.io/api/policy/v1/generated.proto (policy/v1beta1 shares the Eviction layout)

static POD_DISRUPTION_BUDGET: Message = Message {
    name: "PodDisruptionBudget",
    fields: &[
        field(1, "metadata", Kind::Message(&OBJECT_META)),
        field(2, "spec", Kind::Message(&POD_DISRUPTION_BUDGET_SPEC)),
        field(3, "status", Kind::Message(&POD_DISRUPTION_BUDGET_STATUS)),
    ],
};

static POD_DISRUPTION_BUDGET_SPEC: Message = Message {
    name: "PodDisruptionBudgetSpec",
    fields: &[
        field(1, "minAvailable", Kind::IntOrString),
        field(2, "selector", Kind::Message(&LABEL_SELECTOR)),
        field(3, "maxUnavailable", Kind::IntOrString),
        field(4, "unhealthyPodEvictionPolicy", Kind::String),
    ],
};

static POD_DISRUPTION_BUDGET_STATUS: Message = Message {
    name: "PodDisruptionBudgetStatus",
    fields: &[
        omitempty(1, "observedGeneration", Kind::Int),
        field(2, "disruptedPods", Kind::Map(MapValue::Time)),
        field(3, "disruptionsAllowed", Kind::Int),
        field(4, "currentHealthy", Kind::Int),
        field(5, "desiredHealthy", Kind::Int),
        field(6, "expectedPods", Kind::Int),
        field(7, "conditions", Kind::Messages(&CONDITION)),
    ],
};

static EVICTION: Message = Message {
    name: "Eviction",
    fields: &[
        field(1, "metadata", Kind::Message(&OBJECT_META)),
        field(2, "deleteOptions", Kind::Message(&DELETE_OPTIONS)),
    ],
};

// k8s.io/api/authorization/v1/generated.proto: what `kubectl auth can-i` asks.

static SELF_SUBJECT_ACCESS_REVIEW: Message = Message {
    name: "SelfSubjectAccessReview",
    fields: &[
        field(1, "metadata", Kind::Message(&OBJECT_META)),
        field(2, "spec", Kind::Message(&SELF_SUBJECT_ACCESS_REVIEW_SPEC)),
    ],
};

static SELF_SUBJECT_ACCESS_REVIEW_SPEC: Message = Message {
    name: "SelfSubjectAccessReviewSpec",
    fields: &[
        field(1, "resourceAttributes", Kind::Message(&RESOURCE_ATTRIBUTES)),
        field(
            2,
            "nonResourceAttributes",
            Kind::Message(&NON_RESOURCE_ATTRIBUTES),
        ),
    ],
};

static RESOURCE_ATTRIBUTES: Message = Message {
    name: "ResourceAttributes",
    fields: &[
        omitempty(1, "namespace", Kind::String),
        omitempty(2, "verb", Kind::String),
        omitempty(3, "group", Kind::String),
        omitempty(4, "version", Kind::String),
        omitempty(5, "resource", Kind::String),
        omitempty(6, "subresource", Kind::String),
        omitempty(7, "name", Kind::String),
    ],
};

static NON_RESOURCE_ATTRIBUTES: Message = Message {
    name: "NonResourceAttributes",
    fields: &[
        omitempty(1, "path", Kind::String),
        omitempty(2, "verb", Kind::String),
    ],
};

/// The `runtime.Unknown` envelope after the magic
/// (k8s.io/apimachinery/pkg/runtime/generated.proto).
struct Envelope<'a> {
    api_version: String,
    kind: String,
    raw: &'a [u8],
    content_encoding: String,
    content_type: String,
}

impl<'a> Envelope<'a> {
    fn parse(body: &'a [u8]) -> Result<Self, ProtobufError> {
        const UNKNOWN: &str = "Unknown";
        let bytes = body
            .strip_prefix(MAGIC)
            .ok_or(ProtobufError::MissingMagic)?;
        let mut envelope = Envelope {
            api_version: String::new(),
            kind: String::new(),
            raw: &[],
            content_encoding: String::new(),
            content_type: String::new(),
        };
        let mut reader = Reader::new(bytes, UNKNOWN);
        while let Some((number, wire)) = reader.next_field()? {
            match number {
                1 => envelope.read_type_meta(wire.bytes(1, UNKNOWN)?)?,
                2 => envelope.raw = wire.bytes(2, UNKNOWN)?,
                3 => envelope.content_encoding = text(wire.bytes(3, UNKNOWN)?),
                4 => envelope.content_type = text(wire.bytes(4, UNKNOWN)?),
                _ => {}
            }
        }
        Ok(envelope)
    }

    /// Reads `runtime.TypeMeta`, whose numbering (apiVersion 1, kind 2) is the reverse of
    /// `metav1.TypeMeta`'s.
    fn read_type_meta(&mut self, bytes: &[u8]) -> Result<(), ProtobufError> {
        const TYPE_META: &str = "TypeMeta";
        let mut reader = Reader::new(bytes, TYPE_META);
        while let Some((number, wire)) = reader.next_field()? {
            match number {
                1 => self.api_version = text(wire.bytes(1, TYPE_META)?),
                2 => self.kind = text(wire.bytes(2, TYPE_META)?),
                _ => {}
            }
        }
        Ok(())
    }
}

/// What has been decoded so far for one field of a message.
enum Slot {
    Unset,
    Single(Value),
    List(Vec<Value>),
    Map(BTreeMap<String, Value>),
}

impl Slot {
    fn push(&mut self, value: Value) {
        match self {
            Slot::List(items) => items.push(value),
            _ => *self = Slot::List(vec![value]),
        }
    }

    fn insert(&mut self, key: String, value: Value) {
        match self {
            Slot::Map(entries) => {
                entries.insert(key, value);
            }
            _ => *self = Slot::Map(BTreeMap::from([(key, value)])),
        }
    }

    /// The field's JSON value, or `None` when Go's JSON would leave the field out.
    fn into_json(self, field: &Field) -> Option<Value> {
        match self {
            Slot::Unset => None,
            Slot::Single(value) if field.zero == Zero::Omit && is_zero(&value) => None,
            Slot::Single(value) => Some(value),
            Slot::List(items) => Some(Value::Array(items)),
            // BTreeMap order matches Go, which writes JSON map keys sorted.
            Slot::Map(entries) => Some(Value::Object(entries.into_iter().collect())),
        }
    }
}

fn is_zero(value: &Value) -> bool {
    match value {
        Value::String(text) => text.is_empty(),
        Value::Bool(flag) => !flag,
        Value::Number(number) => number.as_i64() == Some(0),
        _ => false,
    }
}

/// Decodes the fields of `message` in `bytes` into a JSON object.
fn decode_message(bytes: &[u8], message: &Message) -> Result<Map<String, Value>, ProtobufError> {
    let mut slots: Vec<Slot> = message.fields.iter().map(|_| Slot::Unset).collect();
    let mut reader = Reader::new(bytes, message.name);
    while let Some((number, wire)) = reader.next_field()? {
        let Some(index) = message
            .fields
            .iter()
            .position(|field| field.number == number)
        else {
            continue;
        };
        let name = message.name;
        let slot = &mut slots[index];
        match message.fields[index].kind {
            Kind::String => *slot = Slot::Single(Value::String(text(wire.bytes(number, name)?))),
            // Reinterpreting the varint as i64 also restores sign-extended negative int32s.
            Kind::Int => *slot = Slot::Single(Value::from(wire.varint(number, name)? as i64)),
            Kind::Bool => *slot = Slot::Single(Value::Bool(wire.varint(number, name)? != 0)),
            Kind::Time => *slot = Slot::Single(time(wire.bytes(number, name)?)?),
            Kind::IntOrString => *slot = Slot::Single(int_or_string(wire.bytes(number, name)?)?),
            Kind::Message(inner) => {
                *slot = Slot::Single(Value::Object(decode_message(
                    wire.bytes(number, name)?,
                    inner,
                )?));
            }
            Kind::Strings => slot.push(Value::String(text(wire.bytes(number, name)?))),
            Kind::Messages(inner) => {
                slot.push(Value::Object(decode_message(
                    wire.bytes(number, name)?,
                    inner,
                )?));
            }
            Kind::Map(value) => {
                let (key, value) = map_entry(wire.bytes(number, name)?, value)?;
                slot.insert(key, value);
            }
        }
    }
    Ok(message
        .fields
        .iter()
        .zip(slots)
        .filter_map(|(field, slot)| Some((field.json.to_owned(), slot.into_json(field)?)))
        .collect())
}

/// Decodes one `{key = 1, value = 2}` map entry; an absent part is its zero value.
fn map_entry(bytes: &[u8], value_type: MapValue) -> Result<(String, Value), ProtobufError> {
    const ENTRY: &str = "map entry";
    let mut key = String::new();
    let mut value = None;
    let mut reader = Reader::new(bytes, ENTRY);
    while let Some((number, wire)) = reader.next_field()? {
        match number {
            1 => key = text(wire.bytes(1, ENTRY)?),
            2 => {
                let bytes = wire.bytes(2, ENTRY)?;
                value = Some(match value_type {
                    MapValue::String => Value::String(text(bytes)),
                    MapValue::Bytes => {
                        Value::String(base64::engine::general_purpose::STANDARD.encode(bytes))
                    }
                    MapValue::Time => time(bytes)?,
                });
            }
            _ => {}
        }
    }
    let value = value.unwrap_or_else(|| match value_type {
        MapValue::String | MapValue::Bytes => Value::String(String::new()),
        MapValue::Time => Value::Null,
    });
    Ok((key, value))
}

/// Decodes a `metav1.Time` `{seconds = 1, nanos = 2}` into RFC 3339 with second precision.
fn time(bytes: &[u8]) -> Result<Value, ProtobufError> {
    const TIME: &str = "Time";
    // Go writes the zero time as an empty message and marshals it to JSON as null.
    if bytes.is_empty() {
        return Ok(Value::Null);
    }
    let mut seconds = 0;
    let mut reader = Reader::new(bytes, TIME);
    while let Some((number, wire)) = reader.next_field()? {
        // Nanos are ignored: upstream drops them on decode to match second-precision JSON.
        if number == 1 {
            seconds = wire.varint(1, TIME)? as i64;
        }
    }
    let timestamp =
        jiff::Timestamp::from_second(seconds).map_err(|_| ProtobufError::Malformed {
            message: TIME,
            detail: format!("{seconds} seconds is outside the representable time range"),
        })?;
    Ok(Value::String(timestamp.to_string()))
}

/// Decodes an `intstr.IntOrString` `{type = 1, intVal = 2, strVal = 3}`.
fn int_or_string(bytes: &[u8]) -> Result<Value, ProtobufError> {
    const INT_OR_STRING: &str = "IntOrString";
    let (mut kind, mut int, mut string) = (0, 0, String::new());
    let mut reader = Reader::new(bytes, INT_OR_STRING);
    while let Some((number, wire)) = reader.next_field()? {
        match number {
            1 => kind = wire.varint(1, INT_OR_STRING)?,
            // intVal is an int32; truncating the varint is what Go's decoder does.
            2 => int = wire.varint(2, INT_OR_STRING)? as i32,
            3 => string = text(wire.bytes(3, INT_OR_STRING)?),
            _ => {}
        }
    }
    match kind {
        0 => Ok(Value::from(int)),
        1 => Ok(Value::String(string)),
        other => Err(ProtobufError::Malformed {
            message: INT_OR_STRING,
            detail: format!("type {other} is neither 0 (int) nor 1 (string)"),
        }),
    }
}

/// Protobuf strings as Go's JSON writes them: invalid UTF-8 becomes U+FFFD.
fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// One field value as it appears on the wire.
enum Wire<'a> {
    Varint(u64),
    Fixed64,
    Bytes(&'a [u8]),
    Fixed32,
}

impl<'a> Wire<'a> {
    fn wire_type(&self) -> u8 {
        match self {
            Wire::Varint(_) => 0,
            Wire::Fixed64 => 1,
            Wire::Bytes(_) => 2,
            Wire::Fixed32 => 5,
        }
    }

    fn varint(self, number: u32, message: &'static str) -> Result<u64, ProtobufError> {
        match self {
            Wire::Varint(value) => Ok(value),
            other => Err(other.mismatch(number, message, 0)),
        }
    }

    fn bytes(self, number: u32, message: &'static str) -> Result<&'a [u8], ProtobufError> {
        match self {
            Wire::Bytes(bytes) => Ok(bytes),
            other => Err(other.mismatch(number, message, 2)),
        }
    }

    fn mismatch(&self, number: u32, message: &'static str, expected: u8) -> ProtobufError {
        ProtobufError::Malformed {
            message,
            detail: format!(
                "field {number} has wire type {}, expected {expected}",
                self.wire_type()
            ),
        }
    }
}

/// Why a varint could not be read.
enum VarintError {
    Truncated,
    Overlong,
}

/// Reads the fields of one message in order.
struct Reader<'a> {
    bytes: &'a [u8],
    message: &'static str,
}

impl<'a> Reader<'a> {
    fn new(bytes: &'a [u8], message: &'static str) -> Self {
        Reader { bytes, message }
    }

    /// The next field's number and value, or `None` at the end of the message.
    fn next_field(&mut self) -> Result<Option<(u32, Wire<'a>)>, ProtobufError> {
        if self.bytes.is_empty() {
            return Ok(None);
        }
        let tag = self.varint().map_err(|error| {
            self.malformed(match error {
                VarintError::Truncated => "truncated field tag".to_owned(),
                VarintError::Overlong => "field tag longer than 10 bytes".to_owned(),
            })
        })?;
        let number = u32::try_from(tag >> 3)
            .ok()
            .filter(|number| (1..1 << 29).contains(number))
            .ok_or_else(|| self.malformed(format!("invalid field number {}", tag >> 3)))?;
        let wire = match tag & 7 {
            0 => Wire::Varint(
                self.varint()
                    .map_err(|error| self.value_error(number, error))?,
            ),
            1 => {
                self.take(8, number)?;
                Wire::Fixed64
            }
            2 => {
                let length = self
                    .varint()
                    .map_err(|error| self.value_error(number, error))?;
                let length = usize::try_from(length).map_err(|_| self.truncated(number))?;
                Wire::Bytes(self.take(length, number)?)
            }
            5 => {
                self.take(4, number)?;
                Wire::Fixed32
            }
            // Groups (3 and 4) are deprecated and never written by Kubernetes.
            other => {
                return Err(
                    self.malformed(format!("field {number} has unsupported wire type {other}"))
                );
            }
        };
        Ok(Some((number, wire)))
    }

    fn varint(&mut self) -> Result<u64, VarintError> {
        let mut value = 0;
        for (index, &byte) in self.bytes.iter().enumerate().take(10) {
            value |= u64::from(byte & 0x7f) << (7 * index);
            if byte & 0x80 == 0 {
                self.bytes = &self.bytes[index + 1..];
                return Ok(value);
            }
        }
        Err(if self.bytes.len() >= 10 {
            VarintError::Overlong
        } else {
            VarintError::Truncated
        })
    }

    fn take(&mut self, length: usize, number: u32) -> Result<&'a [u8], ProtobufError> {
        if length > self.bytes.len() {
            return Err(self.truncated(number));
        }
        let (taken, rest) = self.bytes.split_at(length);
        self.bytes = rest;
        Ok(taken)
    }

    fn value_error(&self, number: u32, error: VarintError) -> ProtobufError {
        match error {
            VarintError::Truncated => self.truncated(number),
            VarintError::Overlong => {
                self.malformed(format!("field {number} has a varint longer than 10 bytes"))
            }
        }
    }

    fn truncated(&self, field: u32) -> ProtobufError {
        ProtobufError::Truncated {
            field,
            message: self.message,
        }
    }

    fn malformed(&self, detail: String) -> ProtobufError {
        ProtobufError::Malformed {
            message: self.message,
            detail,
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// Writes protobuf field by field, in the ascending field order Go's generated
    /// marshalers produce.
    #[derive(Default)]
    struct Proto(Vec<u8>);

    impl Proto {
        fn new() -> Self {
            Proto::default()
        }

        fn raw_varint(mut self, mut value: u64) -> Self {
            while value >= 0x80 {
                self.0.push((value as u8) | 0x80);
                value >>= 7;
            }
            self.0.push(value as u8);
            self
        }

        fn key(self, number: u32, wire_type: u8) -> Self {
            self.raw_varint(u64::from(number) << 3 | u64::from(wire_type))
        }

        fn int(self, number: u32, value: i64) -> Self {
            self.key(number, 0).raw_varint(value as u64)
        }

        fn bool(self, number: u32, value: bool) -> Self {
            self.int(number, i64::from(value))
        }

        fn bytes(self, number: u32, value: &[u8]) -> Self {
            let mut this = self.key(number, 2).raw_varint(value.len() as u64);
            this.0.extend_from_slice(value);
            this
        }

        fn string(self, number: u32, value: &str) -> Self {
            self.bytes(number, value.as_bytes())
        }

        fn message(self, number: u32, value: Proto) -> Self {
            self.bytes(number, &value.0)
        }

        fn entry(self, number: u32, key: &str, value: &[u8]) -> Self {
            self.message(number, Proto::new().string(1, key).bytes(2, value))
        }

        fn fixed64(mut self, number: u32, value: u64) -> Self {
            self = self.key(number, 1);
            self.0.extend_from_slice(&value.to_le_bytes());
            self
        }

        fn fixed32(mut self, number: u32, value: u32) -> Self {
            self = self.key(number, 5);
            self.0.extend_from_slice(&value.to_le_bytes());
            self
        }
    }

    /// A request body as client-go's protobuf serializer writes it.
    fn body(api_version: &str, kind: &str, object: Proto) -> Vec<u8> {
        let envelope = Proto::new()
            .message(1, Proto::new().string(1, api_version).string(2, kind))
            .bytes(2, &object.0)
            .string(3, "")
            .string(4, "");
        [MAGIC, &envelope.0].concat()
    }

    /// `metav1.ObjectMeta` for a freshly built object: Go writes every value field, zero or not.
    fn object_meta(name: &str, namespace: &str) -> Proto {
        Proto::new()
            .string(1, name)
            .string(2, "")
            .string(3, namespace)
            .string(4, "")
            .string(5, "")
            .string(6, "")
            .int(7, 0)
            .message(8, Proto::new())
    }

    fn time(seconds: i64) -> Proto {
        Proto::new().int(1, seconds).int(2, 0)
    }

    /// 2026-01-02T03:04:05Z.
    const SECONDS: i64 = 1_767_323_045;

    #[test]
    fn config_map_with_labels_and_data() {
        let meta = object_meta("settings", "default")
            .entry(11, "tier", b"web")
            .entry(11, "app", b"shop");
        let object = Proto::new()
            .message(1, meta)
            .entry(2, "mode", b"fast")
            .entry(2, "level", b"3")
            .entry(3, "blob", &[0, 1, 2])
            .bool(4, true);
        let decoded = decode(&body("v1", "ConfigMap", object)).unwrap();
        assert_eq!(
            decoded,
            json!({
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {
                    "name": "settings",
                    "namespace": "default",
                    "creationTimestamp": null,
                    "labels": {"app": "shop", "tier": "web"},
                },
                "immutable": true,
                "data": {"level": "3", "mode": "fast"},
                "binaryData": {"blob": "AAEC"},
            })
        );
        let labels: Vec<&String> = decoded["metadata"]["labels"]
            .as_object()
            .unwrap()
            .keys()
            .collect();
        assert_eq!(
            labels,
            ["app", "tier"],
            "map keys come out sorted, as Go writes them"
        );
    }

    #[test]
    fn secret_with_binary_data() {
        let object = Proto::new()
            .message(1, object_meta("creds", "default"))
            .entry(2, "key", &[0x00, 0xff, 0x10, 0x80])
            .entry(2, "empty", b"")
            .string(3, "Opaque")
            .entry(4, "user", b"admin");
        assert_eq!(
            decode(&body("v1", "Secret", object)).unwrap(),
            json!({
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "creds", "namespace": "default", "creationTimestamp": null},
                "data": {"empty": "", "key": "AP8QgA=="},
                "stringData": {"user": "admin"},
                "type": "Opaque",
            })
        );
    }

    #[test]
    fn namespace_with_empty_spec_and_status() {
        let object = Proto::new()
            .message(1, object_meta("team-a", ""))
            .message(2, Proto::new())
            .message(3, Proto::new().string(1, ""));
        assert_eq!(
            decode(&body("v1", "Namespace", object)).unwrap(),
            json!({
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": "team-a", "creationTimestamp": null},
                "spec": {},
                "status": {},
            })
        );
    }

    #[test]
    fn namespace_status_conditions_and_finalizers() {
        let condition = Proto::new()
            .string(1, "NamespaceDeletionContentFailure")
            .string(2, "False")
            .message(4, Proto::new().int(1, SECONDS).int(2, 123_456))
            .string(5, "ContentDeleted")
            .string(6, "");
        let object = Proto::new()
            .message(1, object_meta("team-b", ""))
            .message(2, Proto::new().string(1, "kubernetes"))
            .message(
                3,
                Proto::new().string(1, "Terminating").message(2, condition),
            );
        let decoded = decode(&body("v1", "Namespace", object)).unwrap();
        assert_eq!(decoded["spec"], json!({"finalizers": ["kubernetes"]}));
        assert_eq!(
            decoded["status"],
            json!({
                "phase": "Terminating",
                "conditions": [{
                    "type": "NamespaceDeletionContentFailure",
                    "status": "False",
                    "lastTransitionTime": "2026-01-02T03:04:05Z",
                    "reason": "ContentDeleted",
                }],
            })
        );
    }

    #[test]
    fn object_meta_carries_every_field() {
        let owner = Proto::new()
            .string(1, "ReplicaSet")
            .string(3, "web-5d8f")
            .string(4, "0b6e-11")
            .string(5, "apps/v1")
            .bool(6, true)
            .bool(7, false);
        let meta = Proto::new()
            .string(1, "web-5d8f-abcde")
            .string(2, "web-5d8f-")
            .string(3, "shop")
            .string(4, "/api/v1/namespaces/shop/configmaps/web")
            .string(5, "4f0e-22")
            .string(6, "812")
            .int(7, 3)
            .message(8, time(SECONDS))
            .message(9, time(SECONDS + 30))
            .int(10, 30)
            .entry(12, "note", b"hello")
            .message(13, owner)
            .string(14, "example.com/cleanup")
            .string(14, "kubernetes");
        let decoded = decode(&body("v1", "ConfigMap", Proto::new().message(1, meta))).unwrap();
        assert_eq!(
            decoded["metadata"],
            json!({
                "name": "web-5d8f-abcde",
                "generateName": "web-5d8f-",
                "namespace": "shop",
                "selfLink": "/api/v1/namespaces/shop/configmaps/web",
                "uid": "4f0e-22",
                "resourceVersion": "812",
                "generation": 3,
                "creationTimestamp": "2026-01-02T03:04:05Z",
                "deletionTimestamp": "2026-01-02T03:04:35Z",
                "deletionGracePeriodSeconds": 30,
                "annotations": {"note": "hello"},
                "ownerReferences": [{
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": "web-5d8f",
                    "uid": "0b6e-11",
                    "controller": true,
                    "blockOwnerDeletion": false,
                }],
                "finalizers": ["example.com/cleanup", "kubernetes"],
            })
        );
    }

    #[test]
    fn service_account_with_secrets() {
        let object = Proto::new()
            .message(1, object_meta("builder", "ci"))
            .message(
                2,
                Proto::new()
                    .string(1, "")
                    .string(2, "")
                    .string(3, "builder-token"),
            )
            .message(3, Proto::new().string(1, "registry"))
            .bool(4, false);
        assert_eq!(
            decode(&body("v1", "ServiceAccount", object)).unwrap(),
            json!({
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": "builder", "namespace": "ci", "creationTimestamp": null},
                "secrets": [{"name": "builder-token"}],
                "imagePullSecrets": [{"name": "registry"}],
                "automountServiceAccountToken": false,
            })
        );
    }

    /// The status `kubectl create poddisruptionbudget` sends: Go writes its value fields.
    fn empty_pdb_status() -> Proto {
        Proto::new()
            .int(1, 0)
            .int(3, 0)
            .int(4, 0)
            .int(5, 0)
            .int(6, 0)
    }

    #[test]
    fn pdb_with_min_available_int_and_match_expressions() {
        let requirement = Proto::new()
            .string(1, "tier")
            .string(2, "In")
            .string(3, "web")
            .string(3, "api");
        let selector = Proto::new()
            .entry(1, "app", b"shop")
            .message(2, requirement);
        let spec = Proto::new()
            .message(1, Proto::new().int(1, 0).int(2, 2).string(3, ""))
            .message(2, selector);
        let object = Proto::new()
            .message(1, object_meta("shop-pdb", "default"))
            .message(2, spec)
            .message(3, empty_pdb_status());
        assert_eq!(
            decode(&body("policy/v1", "PodDisruptionBudget", object)).unwrap(),
            json!({
                "apiVersion": "policy/v1",
                "kind": "PodDisruptionBudget",
                "metadata": {"name": "shop-pdb", "namespace": "default", "creationTimestamp": null},
                "spec": {
                    "minAvailable": 2,
                    "selector": {
                        "matchLabels": {"app": "shop"},
                        "matchExpressions": [{"key": "tier", "operator": "In", "values": ["web", "api"]}],
                    },
                },
                "status": {"disruptionsAllowed": 0, "currentHealthy": 0, "desiredHealthy": 0, "expectedPods": 0},
            })
        );
    }

    #[test]
    fn pdb_with_max_unavailable_percent() {
        let spec = Proto::new()
            .message(2, Proto::new())
            .message(3, Proto::new().int(1, 1).int(2, 0).string(3, "50%"))
            .string(4, "AlwaysAllow");
        let status = Proto::new()
            .int(1, 4)
            .message(2, Proto::new().string(1, "web-1").message(2, time(SECONDS)))
            .int(3, 1)
            .int(4, 3)
            .int(5, 2)
            .int(6, 3);
        let object = Proto::new()
            .message(1, object_meta("half", "default"))
            .message(2, spec)
            .message(3, status);
        let decoded = decode(&body("policy/v1", "PodDisruptionBudget", object)).unwrap();
        assert_eq!(
            decoded["spec"],
            json!({"selector": {}, "maxUnavailable": "50%", "unhealthyPodEvictionPolicy": "AlwaysAllow"})
        );
        assert_eq!(
            decoded["status"],
            json!({
                "observedGeneration": 4,
                "disruptedPods": {"web-1": "2026-01-02T03:04:05Z"},
                "disruptionsAllowed": 1,
                "currentHealthy": 3,
                "desiredHealthy": 2,
                "expectedPods": 3,
            })
        );
    }

    #[test]
    fn eviction_with_delete_options() {
        let options = Proto::new().int(1, 0).string(5, "All");
        let object = Proto::new()
            .message(1, object_meta("web-0", "shop"))
            .message(2, options);
        let expected = |api_version: &str| {
            json!({
                "apiVersion": api_version,
                "kind": "Eviction",
                "metadata": {"name": "web-0", "namespace": "shop", "creationTimestamp": null},
                "deleteOptions": {"gracePeriodSeconds": 0, "dryRun": ["All"]},
            })
        };
        let raw = object.0;
        for api_version in ["policy/v1", "policy/v1beta1"] {
            let decoded = decode(&body(api_version, "Eviction", Proto(raw.clone()))).unwrap();
            assert_eq!(decoded, expected(api_version), "{api_version}");
        }
    }

    #[test]
    fn delete_options_with_preconditions_and_propagation_policy() {
        let object = Proto::new()
            .int(1, 30)
            .message(2, Proto::new().string(1, "4f0e-22").string(2, "812"))
            .bool(3, false)
            .string(4, "Foreground");
        for api_version in ["meta.k8s.io/v1", "v1"] {
            let decoded =
                decode(&body(api_version, "DeleteOptions", Proto(object.0.clone()))).unwrap();
            assert_eq!(
                decoded,
                json!({
                    "apiVersion": api_version,
                    "kind": "DeleteOptions",
                    "gracePeriodSeconds": 30,
                    "preconditions": {"uid": "4f0e-22", "resourceVersion": "812"},
                    "orphanDependents": false,
                    "propagationPolicy": "Foreground",
                })
            );
        }
    }

    #[test]
    fn negative_integers_survive_sign_extension() {
        let meta = Proto::new().string(1, "x").int(10, -1);
        let decoded = decode(&body("v1", "ConfigMap", Proto::new().message(1, meta))).unwrap();
        assert_eq!(decoded["metadata"]["deletionGracePeriodSeconds"], json!(-1));
        let spec = Proto::new().message(1, Proto::new().int(1, 0).int(2, -3));
        let decoded = decode(&body(
            "policy/v1",
            "PodDisruptionBudget",
            Proto::new().message(2, spec),
        ))
        .unwrap();
        assert_eq!(decoded["spec"]["minAvailable"], json!(-3));
    }

    #[test]
    fn unknown_field_numbers_are_skipped() {
        let meta = object_meta("cm", "default")
            .int(99, 7)
            .fixed64(98, u64::MAX)
            .fixed32(97, 1)
            .string(96, "from a newer release");
        let object = Proto::new()
            .message(1, meta)
            .entry(2, "k", b"v")
            .message(42, Proto::new().int(1, 1));
        assert_eq!(
            decode(&body("v1", "ConfigMap", object)).unwrap(),
            json!({
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "cm", "namespace": "default", "creationTimestamp": null},
                "data": {"k": "v"},
            })
        );
    }

    #[test]
    fn unknown_kind_is_rejected() {
        let error = decode(&body("policy/v1", "Foo", Proto::new())).unwrap_err();
        assert!(
            matches!(error, ProtobufError::UnsupportedKind { .. }),
            "{error:?}"
        );
        assert!(
            error.to_string().starts_with(
                "the embedded cluster reads protobuf bodies of Namespaces, ConfigMaps, Secrets, \
                 ServiceAccounts, PodDisruptionBudgets, Evictions and access reviews only, not \
                 of policy/v1 Foo (kubectl's `create <kind>` sends one): apply a manifest \
                 instead"
            ),
            "{error}"
        );
        let error = decode(&body("apps/v1", "Namespace", Proto::new())).unwrap_err();
        assert!(
            error.to_string().contains("not of apps/v1 Namespace"),
            "{error}"
        );
    }

    #[test]
    fn truncated_body_is_rejected() {
        // The namespace string claims 7 bytes but its message ends after 3.
        let mut raw = Proto::new()
            .message(1, Proto::new().string(1, "cm").string(3, "default"))
            .0;
        raw.truncate(raw.len() - 4);
        raw[1] -= 4;
        let error = decode(&body("v1", "ConfigMap", Proto(raw))).unwrap_err();
        assert_eq!(
            error.to_string(),
            "protobuf body: truncated field 3 of ObjectMeta"
        );

        let whole = body(
            "v1",
            "ConfigMap",
            Proto::new().message(1, object_meta("cm", "default")),
        );
        let error = decode(&whole[..whole.len() - 10]).unwrap_err();
        assert!(
            matches!(
                error,
                ProtobufError::Truncated {
                    field: 2,
                    message: "Unknown"
                }
            ),
            "{error:?}"
        );

        let error = decode(&body("v1", "ConfigMap", Proto(vec![0x38, 0x80]))).unwrap_err();
        assert!(
            matches!(
                error,
                ProtobufError::Truncated {
                    field: 7,
                    message: "ConfigMap"
                }
            ),
            "{error:?}"
        );
    }

    #[test]
    fn wrong_magic_is_rejected() {
        let mut bytes = body("v1", "ConfigMap", Proto::new());
        bytes[3] = b'!';
        let error = decode(&bytes).unwrap_err();
        assert_eq!(
            error.to_string(),
            "protobuf body: missing the k8s\\0 magic prefix"
        );
        assert!(matches!(
            decode(b"{\"kind\":\"ConfigMap\"}"),
            Err(ProtobufError::MissingMagic)
        ));
        assert!(matches!(decode(b""), Err(ProtobufError::MissingMagic)));
    }

    #[test]
    fn wrong_wire_type_is_rejected() {
        let object = Proto::new().message(1, Proto::new().int(1, 5));
        let error = decode(&body("v1", "ConfigMap", object)).unwrap_err();
        assert_eq!(
            error.to_string(),
            "protobuf body: malformed ObjectMeta: field 1 has wire type 0, expected 2"
        );
    }

    #[test]
    fn invalid_int_or_string_type_is_rejected() {
        let spec = Proto::new().message(3, Proto::new().int(1, 2));
        let error = decode(&body(
            "policy/v1",
            "PodDisruptionBudget",
            Proto::new().message(2, spec),
        ))
        .unwrap_err();
        assert_eq!(
            error.to_string(),
            "protobuf body: malformed IntOrString: type 2 is neither 0 (int) nor 1 (string)"
        );
    }

    #[test]
    fn compressed_envelope_is_rejected() {
        let envelope = Proto::new()
            .message(1, Proto::new().string(1, "v1").string(2, "ConfigMap"))
            .bytes(2, b"")
            .string(3, "gzip");
        let error = decode(&[MAGIC, &envelope.0].concat()).unwrap_err();
        assert_eq!(
            error.to_string(),
            "protobuf body: unsupported content encoding gzip (send JSON instead)"
        );
    }

    /// A Deployment as a v1.6 API server stored it in etcd, written by the same Go protobuf
    /// serializer client-go uses for request bodies (posted to the kubernetes-dev list,
    /// "etcd data format", March 2017).
    const STORED_DEPLOYMENT: &str = "azhzAAogChJleHRlbnNpb25zL3YxYmV0YTESCkRlcGxveW1lbnQSzQQKygEKCG1pY3JvYm90EgAaB2RlZmF1bHQiQC9hcGlzL2V4dGVuc2lvbnMvdjFiZXRhMS9uYW1lc3BhY2VzL2RlZmF1bHQvZGVwbG95bWVudHMvbWljcm9ib3QqJDU0NWYxMzJlLTBhY2MtMTFlNy1iYjFmLTA4MDAyN2Y5M2ZhOTIAOAFCDAiM063GBRCA+peZAVoPCgNydW4SCG1pY3JvYm90YiYKIWRlcGxveW1lbnQua3ViZXJuZXRlcy5pby9yZXZpc2lvbhIBMXoAEoACCAESEQoPCgNydW4SCG1pY3JvYm90GsEBCiMKABIAGgAiACoAMgA4AEIAWg8KA3J1bhIIbWljcm9ib3R6ABKZARJXCghtaWNyb2JvdBITcm90aGdhci9taWNyb2JvdDp2MSoAQgBqFC9kZXYvdGVybWluYXRpb24tbG9ncgxJZk5vdFByZXNlbnSAAQCIAQCQAQCiAQRGaWxlGgZBbHdheXMgHjIMQ2x1c3RlckZpcnN0QgBKAFIAWABgAGgAcgCCAQCKAQCaARFkZWZhdWx0LXNjaGVkdWxlciIhCg1Sb2xsaW5nVXBkYXRlEhAKBggAEAEaABIGCAAQARoAKAA4ABp7CAEQARgBIAEoADJtCglBdmFpbGFibGUSBFRydWUiGE1pbmltdW1SZXBsaWNhc0F2YWlsYWJsZSokRGVwbG95bWVudCBoYXMgbWluaW11bSBhdmFpbGFiaWxpdHkuMgwIjNOtxgUQ7/zAnwE6DAiM063GBRDd/cCfATgBGgAiAA==";

    #[test]
    fn real_go_bytes_decode() {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(STORED_DEPLOYMENT)
            .unwrap();
        let error = decode(&bytes).unwrap_err();
        assert!(
            error
                .to_string()
                .contains("not of extensions/v1beta1 Deployment"),
            "{error}"
        );

        // Its metadata (Deployment field 1) is an ObjectMeta like any other kind's, and
        // includes the since-removed clusterName (field 15), which must be skipped.
        let envelope = Envelope::parse(&bytes).unwrap();
        let mut deployment = Reader::new(envelope.raw, "Deployment");
        let (number, wire) = deployment.next_field().unwrap().unwrap();
        assert_eq!(number, 1);
        let metadata = decode_message(wire.bytes(1, "Deployment").unwrap(), &OBJECT_META).unwrap();
        assert_eq!(
            Value::Object(metadata),
            json!({
                "name": "microbot",
                "namespace": "default",
                "selfLink": "/apis/extensions/v1beta1/namespaces/default/deployments/microbot",
                "uid": "545f132e-0acc-11e7-bb1f-080027f93fa9",
                "generation": 1,
                "creationTimestamp": "2017-03-17T04:43:56Z",
                "labels": {"run": "microbot"},
                "annotations": {"deployment.kubernetes.io/revision": "1"},
            })
        );
    }
}
