//! events.k8s.io/v1 Events are the same objects as core/v1 Events, shown with other
//! field names. They are stored in the core form (so `kubectl describe`, which reads
//! core Events, sees what `kube`'s event recorder writes through events.k8s.io).

use serde_json::{Map, Value, json};

/// (events.k8s.io/v1 field, core/v1 field) pairs that only differ by name.
const RENAMED: &[(&str, &str)] = &[
    ("regarding", "involvedObject"),
    ("note", "message"),
    ("deprecatedCount", "count"),
    ("deprecatedFirstTimestamp", "firstTimestamp"),
    ("deprecatedLastTimestamp", "lastTimestamp"),
    ("deprecatedSource", "source"),
    ("reportingController", "reportingComponent"),
];

const SHARED: &[&str] = &[
    "metadata",
    "reason",
    "type",
    "action",
    "related",
    "series",
    "eventTime",
    "reportingInstance",
];

/// core/v1 -> events.k8s.io/v1.
pub fn from_core(core: Value) -> Value {
    convert(core, "events.k8s.io/v1", |&(new, old)| (old, new))
}

/// events.k8s.io/v1 -> core/v1.
pub fn to_core(event: Value) -> Value {
    convert(event, "v1", |&(new, old)| (new, old))
}

type Direction = fn(&(&'static str, &'static str)) -> (&'static str, &'static str);

fn convert(source: Value, api_version: &str, direction: Direction) -> Value {
    let Value::Object(mut source) = source else {
        return source;
    };
    let mut out = Map::new();
    out.insert("apiVersion".into(), json!(api_version));
    out.insert("kind".into(), json!("Event"));
    for field in SHARED {
        if let Some(v) = source.remove(*field) {
            out.insert((*field).into(), v);
        }
    }
    for pair in RENAMED {
        let (from, to) = direction(pair);
        if let Some(v) = source.remove(from) {
            out.insert(to.into(), v);
        }
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_convert_both_ways_without_loss() {
        let v1 = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": "e", "namespace": "default"},
            "regarding": {"kind": "Node", "name": "worker-1"}, "note": "module loaded",
            "reason": "Loaded", "type": "Normal", "reportingController": "capstan",
            "reportingInstance": "capstan-1", "eventTime": "2026-11-20T22:35:42.000000Z",
            "series": {"count": 2, "lastObservedTime": "2026-11-20T22:36:42.000000Z"}});
        let core = to_core(v1.clone());
        assert_eq!(core["involvedObject"]["name"], "worker-1");
        assert_eq!(core["message"], "module loaded");
        assert_eq!(core["reportingComponent"], "capstan");
        assert_eq!(from_core(core), v1);
    }
}
