//! Objects decoded without what no controller reads.
//!
//! Every object the API server sends carries `metadata.managedFields`, which no
//! controller reads, and decoding them is costly: each entry's `fieldsV1` becomes a tree
//! of JSON values, for every object of every watch (docs/benchmarks.md). [`Lean<K>`]
//! decodes a `K` with those entries read past (validated as JSON, never built), so a watch
//! of `Lean<K>` gives the objects the caches keep, as if the server had sent them without
//! managedFields. `Lean<K, L>` reads past what [`LeftOut`] `L` names besides: most of a
//! worker pod ([`WorkerPodParts`]) and a Node's image list ([`NodeParts`]).

use std::borrow::Cow;
use std::marker::PhantomData;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use serde::Deserialize;
use serde::de::{
    DeserializeOwned, DeserializeSeed, Deserializer, IgnoredAny, IntoDeserializer, MapAccess,
    SeqAccess, Visitor,
};

/// A `K` decoded with what `L` names left out (by default its managedFields).
#[derive(Clone, Debug)]
pub struct Lean<K, L = ManagedFields>(pub K, PhantomData<L>);

impl<K, L> Lean<K, L> {
    /// The object decoded.
    pub fn into_inner(self) -> K {
        self.0
    }
}

/// What of a value a decode reads: all of it, none of it, or some of a map's entries
/// (the elements of an array are read as the array is).
#[derive(Debug)]
pub enum Part {
    /// Decoded whole.
    Whole,
    /// Read past: checked to be JSON, never decoded.
    Out,
    /// Every entry, those listed read as they say.
    Except(&'static [(&'static str, Part)]),
    /// Only the entries listed, read as they say; the others are read past.
    Only(&'static [(&'static str, Part)]),
}

impl Part {
    /// How this map's entry `key` is read.
    fn entry(&self, key: &str) -> &'static Part {
        let (listed, unlisted) = match self {
            Part::Whole => return &Part::Whole,
            Part::Out => return &Part::Out,
            Part::Except(entries) => (entries, &Part::Whole),
            Part::Only(entries) => (entries, &Part::Out),
        };
        listed
            .iter()
            .find(|(name, _)| *name == key)
            .map_or(unlisted, |(_, part)| part)
    }
}

/// What a [`Lean`] decode leaves out.
pub trait LeftOut {
    /// What of the object is read.
    const READ: &'static Part;
}

/// The managed fields, and nothing else.
#[derive(Clone, Debug)]
pub struct ManagedFields;

impl LeftOut for ManagedFields {
    const READ: &'static Part =
        &Part::Except(&[("metadata", Part::Except(&[("managedFields", Part::Out)]))]);
}

/// Of a worker pod, what the controllers read of it: metadata; the node, service
/// account, pull secrets and tolerations; the phase, and how its containers terminated.
/// The rest (containers, volumes, conditions) is most of a pod, and a fleet-wide rollout
/// holds one per node and module.
#[derive(Clone, Debug)]
pub struct WorkerPodParts;

impl LeftOut for WorkerPodParts {
    const READ: &'static Part = &Part::Except(&[
        ("metadata", Part::Except(&[("managedFields", Part::Out)])),
        (
            "spec",
            Part::Only(&[
                ("nodeName", Part::Whole),
                ("serviceAccountName", Part::Whole),
                ("imagePullSecrets", Part::Whole),
                ("tolerations", Part::Whole),
            ]),
        ),
        (
            "status",
            Part::Only(&[
                ("phase", Part::Whole),
                ("message", Part::Whole),
                ("reason", Part::Whole),
                (
                    "containerStatuses",
                    Part::Only(&[
                        ("name", Part::Whole),
                        ("state", Part::Only(&[("terminated", Part::Whole)])),
                    ]),
                ),
            ]),
        ),
    ]);
}

/// Of a Node, all but the list of images it holds, which nothing here reads and which is
/// most of a busy node's status.
#[derive(Clone, Debug)]
pub struct NodeParts;

impl LeftOut for NodeParts {
    const READ: &'static Part = &Part::Except(&[
        ("metadata", Part::Except(&[("managedFields", Part::Out)])),
        ("status", Part::Except(&[("images", Part::Out)])),
    ]);
}

impl<K: Resource, L> Resource for Lean<K, L> {
    type DynamicType = K::DynamicType;
    type Scope = K::Scope;

    fn kind(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::kind(dt)
    }

    fn group(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::group(dt)
    }

    fn version(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::version(dt)
    }

    fn api_version(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::api_version(dt)
    }

    fn plural(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::plural(dt)
    }

    fn url_path(dt: &Self::DynamicType, namespace: Option<&str>) -> String {
        K::url_path(dt, namespace)
    }

    fn meta(&self) -> &ObjectMeta {
        self.0.meta()
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        self.0.meta_mut()
    }
}

impl<'de, K: DeserializeOwned, L: LeftOut> Deserialize<'de> for Lean<K, L> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        K::deserialize(Skipping {
            inner: deserializer,
            part: L::READ,
        })
        .map(|object| Lean(object, PhantomData))
    }
}

/// A deserializer of a value of which only `part` is decoded; the rest is read past.
struct Skipping<D> {
    inner: D,
    part: &'static Part,
}

/// Forwards `Deserializer` methods to the inner deserializer, with the visitor wrapped.
macro_rules! wrap_visitor {
    ($($method:ident($($arg:ident: $ty:ty),*)),* $(,)?) => {
        $(
            fn $method<V: Visitor<'de>>(
                self,
                $($arg: $ty,)*
                visitor: V,
            ) -> Result<V::Value, Self::Error> {
                match self.part {
                    Part::Whole => self.inner.$method($($arg,)* visitor),
                    part => self.inner.$method($($arg,)* Skip { inner: visitor, part }),
                }
            }
        )*
    };
}

/// Forwards `Deserializer` methods to the inner deserializer as they are.
macro_rules! forward {
    ($($method:ident($($arg:ident: $ty:ty),*)),* $(,)?) => {
        $(
            fn $method<V: Visitor<'de>>(
                self,
                $($arg: $ty,)*
                visitor: V,
            ) -> Result<V::Value, Self::Error> {
                self.inner.$method($($arg,)* visitor)
            }
        )*
    };
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for Skipping<D> {
    type Error = D::Error;

    wrap_visitor!(
        deserialize_any(),
        deserialize_map(),
        deserialize_struct(name: &'static str, fields: &'static [&'static str]),
        // Generated decoders read fields as options (k8s-openapi's `metadata` too).
        deserialize_option(),
        deserialize_newtype_struct(name: &'static str),
        // The maps in an array are read as the array is.
        deserialize_seq(),
    );

    // Anything else is not a map, so nothing in it is left out.
    forward!(
        deserialize_bool(),
        deserialize_i8(),
        deserialize_i16(),
        deserialize_i32(),
        deserialize_i64(),
        deserialize_i128(),
        deserialize_u8(),
        deserialize_u16(),
        deserialize_u32(),
        deserialize_u64(),
        deserialize_u128(),
        deserialize_f32(),
        deserialize_f64(),
        deserialize_char(),
        deserialize_str(),
        deserialize_string(),
        deserialize_bytes(),
        deserialize_byte_buf(),
        deserialize_unit(),
        deserialize_unit_struct(name: &'static str),
        deserialize_tuple(len: usize),
        deserialize_tuple_struct(name: &'static str, len: usize),
        deserialize_enum(name: &'static str, variants: &'static [&'static str]),
        deserialize_identifier(),
        deserialize_ignored_any(),
    );

    fn is_human_readable(&self) -> bool {
        self.inner.is_human_readable()
    }
}

/// The visitor of a [`Skipping`] value: its maps, and the maps in its arrays, are read as
/// `part` says.
struct Skip<V> {
    inner: V,
    part: &'static Part,
}

impl<'de, V: Visitor<'de>> Visitor<'de> for Skip<V> {
    type Value = V::Value;

    fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
        self.inner.expecting(formatter)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        self.inner.visit_map(SkipEntries {
            inner: map,
            part: self.part,
            next: &Part::Whole,
        })
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        self.inner.visit_seq(SkipElements {
            inner: seq,
            part: self.part,
        })
    }

    fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<Self::Value, E> {
        self.inner.visit_bool(v)
    }

    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Self::Value, E> {
        self.inner.visit_i64(v)
    }

    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Self::Value, E> {
        self.inner.visit_u64(v)
    }

    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Self::Value, E> {
        self.inner.visit_f64(v)
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
        self.inner.visit_str(v)
    }

    fn visit_borrowed_str<E: serde::de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
        self.inner.visit_borrowed_str(v)
    }

    fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Self::Value, E> {
        self.inner.visit_string(v)
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
        self.inner.visit_unit()
    }

    fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
        self.inner.visit_none()
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        self.inner.visit_some(Skipping {
            inner: deserializer,
            part: self.part,
        })
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<Self::Value, D::Error> {
        self.inner.visit_newtype_struct(Skipping {
            inner: deserializer,
            part: self.part,
        })
    }
}

/// A map's entries as `part` says: those left out are read past, the others read as
/// their part says.
struct SkipEntries<A> {
    inner: A,
    part: &'static Part,
    /// How the value of the key just read is read.
    next: &'static Part,
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for SkipEntries<A> {
    type Error = A::Error;

    fn next_key_seed<S: DeserializeSeed<'de>>(
        &mut self,
        seed: S,
    ) -> Result<Option<S::Value>, Self::Error> {
        loop {
            let Some(key) = self.inner.next_key::<Cow<'de, str>>()? else {
                return Ok(None);
            };
            let part = self.part.entry(&key);
            if let Part::Out = part {
                self.inner.next_value::<IgnoredAny>()?;
                continue;
            }
            self.next = part;
            return seed.deserialize(key.into_deserializer()).map(Some);
        }
    }

    fn next_value_seed<S: DeserializeSeed<'de>>(
        &mut self,
        seed: S,
    ) -> Result<S::Value, Self::Error> {
        match std::mem::replace(&mut self.next, &Part::Whole) {
            Part::Whole => self.inner.next_value_seed(seed),
            part => self
                .inner
                .next_value_seed(SkippingSeed { inner: seed, part }),
        }
    }

    fn size_hint(&self) -> Option<usize> {
        self.inner.size_hint()
    }
}

/// An array's elements, each read as `part` says.
struct SkipElements<A> {
    inner: A,
    part: &'static Part,
}

impl<'de, A: SeqAccess<'de>> SeqAccess<'de> for SkipElements<A> {
    type Error = A::Error;

    fn next_element_seed<S: DeserializeSeed<'de>>(
        &mut self,
        seed: S,
    ) -> Result<Option<S::Value>, Self::Error> {
        self.inner.next_element_seed(SkippingSeed {
            inner: seed,
            part: self.part,
        })
    }

    fn size_hint(&self) -> Option<usize> {
        self.inner.size_hint()
    }
}

/// Deserializes a value of which only `part` is read.
struct SkippingSeed<S> {
    inner: S,
    part: &'static Part,
}

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for SkippingSeed<S> {
    type Value = S::Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        self.inner.deserialize(Skipping {
            inner: deserializer,
            part: self.part,
        })
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{Node, Pod};
    use serde_json::json;

    use super::*;
    use capstan_api::nmc::NodeModulesConfig;

    fn managed_fields() -> serde_json::Value {
        json!([{"manager": "kubelet", "operation": "Update", "apiVersion": "v1",
                "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {"f:phase": {}}}}])
    }

    /// Every kind a cache watches decodes as it would whole, less its managedFields; the
    /// same key deeper in the object is kept.
    #[test]
    fn leaves_out_managed_fields_and_nothing_else() {
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "ns", "labels": {"a": "b"},
                         "managedFields": managed_fields(), "uid": "u"},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i",
                     "env": [{"name": "managedFields", "value": "kept"}]}]},
            "status": {"phase": "Running"},
        });
        let node = json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"managedFields": managed_fields(), "name": "n1"},
            "status": {"nodeInfo": {"kernelVersion": "6.1", "bootID": "b", "machineID": "",
                       "systemUUID": "", "osImage": "", "containerRuntimeVersion": "",
                       "kubeletVersion": "", "kubeProxyVersion": "", "operatingSystem": "",
                       "architecture": ""}},
        });
        let nmc = json!({
            "apiVersion": "kmm.sigs.x-k8s.io/v1beta1", "kind": "NodeModulesConfig",
            "metadata": {"name": "n1", "managedFields": managed_fields()},
            "spec": {"modules": []},
        });
        fn check<K>(object: serde_json::Value)
        where
            K: DeserializeOwned + serde::Serialize + Resource + PartialEq + std::fmt::Debug,
        {
            let text = object.to_string();
            let lean = serde_json::from_str::<Lean<K>>(&text)
                .expect("lean decodes")
                .into_inner();
            let mut whole: K = serde_json::from_str(&text).expect("whole decodes");
            assert!(whole.meta().managed_fields.is_some());
            whole.meta_mut().managed_fields = None;
            assert_eq!(lean, whole);
        }
        check::<Pod>(pod);
        check::<Node>(node);
        check::<NodeModulesConfig>(nmc);
    }

    #[test]
    fn broken_json_in_the_left_out_entry_is_still_an_error() {
        let text = r#"{"metadata": {"name": "p", "managedFields": [{"manager": }]}}"#;
        assert!(serde_json::from_str::<Lean<Pod>>(text).is_err());
        let wrong_type = r#"{"metadata": "not a map"}"#;
        assert!(serde_json::from_str::<Lean<Pod>>(wrong_type).is_err());
    }
}
