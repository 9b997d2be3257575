//! Whether a node is cordoned, and since when: MUO's `IsNodeCordoned`.
//!
//! A node is cordoned when `spec.unschedulable` is set AND it carries the taint
//! `node.kubernetes.io/unschedulable` with effect `NoSchedule` (what `kubectl cordon` leads
//! to: kubectl sets the flag, the node lifecycle controller adds the taint). The drain's
//! clock starts at that taint's `timeAdded`; a node that is uncordoned and cordoned again
//! starts a new clock. A cordoned node whose taint has no `timeAdded` is cordoned with an
//! unknown start, which the strategies cannot run on.

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;

use capstan_api::labels::UNSCHEDULABLE_TAINT;

/// A node's cordon, as the nodekeeper reads it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cordon {
    /// `spec.unschedulable` and the unschedulable `NoSchedule` taint are both there.
    pub cordoned: bool,
    /// The taint's `timeAdded`: when the drain began.
    pub since: Option<Timestamp>,
}

impl Cordon {
    /// The cordon of `node`.
    pub fn of(node: &Node) -> Cordon {
        let Some(spec) = node.spec.as_ref() else {
            return Cordon::default();
        };
        if spec.unschedulable != Some(true) {
            return Cordon::default();
        }
        // Other NoSchedule taints (a dedicated node's, say) say nothing about the drain.
        let taint = spec
            .taints
            .iter()
            .flatten()
            .find(|taint| taint.key == UNSCHEDULABLE_TAINT && taint.effect == "NoSchedule");
        match taint {
            Some(taint) => Cordon {
                cordoned: true,
                since: taint.time_added.as_ref().map(|time| time.0),
            },
            None => Cordon::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn node(spec: Value) -> Node {
        serde_json::from_value(json!({"metadata": {"name": "worker-1"}, "spec": spec}))
            .expect("a node")
    }

    fn at(text: &str) -> Option<Timestamp> {
        Some(text.parse().expect("a time"))
    }

    /// MUO's pkg/machinery tests of `IsNodeCordoned`, and the cases around them.
    #[test]
    fn cordon_table() {
        let cordon = json!({"key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule",
                            "timeAdded": "2026-11-26T09:00:00Z"});
        let other = json!({"key": "dedicated", "value": "gpu", "effect": "NoSchedule",
                           "timeAdded": "2026-11-20T00:00:00Z"});
        // (case, spec, cordoned, since)
        let rows: &[(&str, Value, bool, Option<Timestamp>)] = &[
            ("empty spec", json!({}), false, None),
            (
                "unschedulable, taint without timeAdded: cordoned, start unknown",
                json!({"unschedulable": true,
                       "taints": [{"key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule"}]}),
                true,
                None,
            ),
            (
                "the taint's timeAdded is the start",
                json!({"unschedulable": true, "taints": [cordon]}),
                true,
                at("2026-11-26T09:00:00Z"),
            ),
            (
                "two NoSchedule taints, the cordon's first",
                json!({"unschedulable": true, "taints": [cordon, other]}),
                true,
                at("2026-11-26T09:00:00Z"),
            ),
            (
                "two NoSchedule taints, the cordon's second",
                json!({"unschedulable": true, "taints": [other, cordon]}),
                true,
                at("2026-11-26T09:00:00Z"),
            ),
            (
                "unschedulable without the taint (not yet added)",
                json!({"unschedulable": true, "taints": [other]}),
                false,
                None,
            ),
            (
                "the taint without unschedulable (being uncordoned)",
                json!({"taints": [cordon]}),
                false,
                None,
            ),
            (
                "the unschedulable key with another effect",
                json!({"unschedulable": true,
                       "taints": [{"key": UNSCHEDULABLE_TAINT, "effect": "NoExecute",
                                   "timeAdded": "2026-11-26T09:00:00Z"}]}),
                false,
                None,
            ),
        ];
        for (case, spec, cordoned, since) in rows {
            let got = Cordon::of(&node(spec.clone()));
            assert_eq!(
                got,
                Cordon {
                    cordoned: *cordoned,
                    since: *since
                },
                "{case}"
            );
        }
        let bare: Node = serde_json::from_value(json!({"metadata": {"name": "n"}})).unwrap();
        assert_eq!(Cordon::of(&bare), Cordon::default(), "no spec at all");
    }
}
