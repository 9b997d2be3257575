//! What the verbs answer: an object as written (its bytes when the store holds exactly
//! them), what a delete did, an object as read, a page of a list.

use std::sync::Arc;

use bytes::Bytes;
use serde_json::Value;

use crate::object_key::ObjectKey;
use crate::store::Store;

/// What a delete did.
pub enum Deleted {
    /// The object is gone; this was its last state.
    Now(Answer),
    /// The object is marked for deletion (finalizers or grace period) and still exists.
    Pending(Answer),
}

/// An object as a caller read it from the store: its resourceVersion and its parse.
#[derive(Debug)]
pub struct Read {
    pub resource_version: u64,
    pub object: Value,
}

/// An object as a write answers it, in the resource's version.
#[derive(Clone, Debug)]
pub struct Answer {
    pub(super) value: Option<Value>,
    /// The object serialized, when the store holds exactly these bytes: an HTTP answer
    /// sends them as they are instead of serializing the object again.
    pub(super) bytes: Option<Bytes>,
    /// Where the parsed object goes when only its bytes are wanted: a store that keeps
    /// the bucket's objects parsed, and the object's place and resourceVersion there.
    pub(super) keep: Option<(Arc<Store>, ObjectKey, u64)>,
    /// What the server warns the client of, one `Warning` header each (the unknown
    /// fields a write dropped under `fieldValidation=Warn`).
    pub(super) warnings: Vec<String>,
}

impl Answer {
    pub(super) fn parsed(value: Value, bytes: Option<Bytes>) -> Answer {
        Answer {
            value: Some(value),
            bytes,
            keep: None,
            warnings: Vec::new(),
        }
    }

    pub(super) fn stored(bytes: Bytes) -> Answer {
        Answer {
            value: None,
            bytes: Some(bytes),
            keep: None,
            warnings: Vec::new(),
        }
    }

    pub(super) fn with_warnings(mut self, warnings: Vec<String>) -> Answer {
        self.warnings = warnings;
        self
    }

    /// The warnings to answer with, in order.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// The object, parsed (from its bytes, if it was not parsed yet).
    pub fn into_value(self) -> Value {
        match (self.value, self.bytes) {
            (Some(value), _) => value,
            (None, Some(bytes)) => serde_json::from_slice(&bytes).unwrap_or(Value::Null),
            (None, None) => Value::Null,
        }
    }

    /// The object as JSON.
    pub fn into_bytes(self) -> Bytes {
        match (self.bytes, self.value) {
            (Some(bytes), Some(value)) => {
                // The bytes are the stored object, so the parse is the stored object's.
                if let Some((store, key, resource_version)) = self.keep {
                    store.offer_parsed(&key, resource_version, value);
                }
                bytes
            }
            (Some(bytes), None) => bytes,
            (None, Some(value)) => Bytes::from(serde_json::to_vec(&value).unwrap_or_default()),
            (None, None) => Bytes::from_static(b"null"),
        }
    }
}

/// One page of a list, objects already in the served version.
pub struct ListPage {
    pub items: Vec<Bytes>,
    pub resource_version: u64,
    pub continue_token: Option<String>,
    /// How many objects follow the page; `None` when a selector filtered the list.
    pub remaining: Option<usize>,
}
