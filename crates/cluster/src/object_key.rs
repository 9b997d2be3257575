//! The address of a stored object, shared by the store and its write-ahead log.

/// Where an object lives: its storage bucket, namespace ("" for cluster-scoped) and name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    pub storage: String,
    pub namespace: String,
    pub name: String,
}

impl ObjectKey {
    pub fn new(storage: &str, namespace: &str, name: &str) -> Self {
        ObjectKey {
            storage: storage.into(),
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}
