//! The controllers' gauges, with managed-upgrade-operator's names and labels so that its
//! alerts and dashboards read capstan's (docs/metrics.md, docs/nodekeeper.md):
//!
//! | family | labels | set by | 1 when |
//! | --- | --- | --- | --- |
//! | `upgradeoperator_node_drain_timeout` | `node_name` | the nodekeeper | the node's drain failed while it upgrades |
//! | `upgradeoperator_upgradeconfig_validation_failed` | `upgradeconfig_name` | the campaigns | the `UpgradeConfig` is not valid |
//! | `upgradeoperator_upgrade_window_breached` | `upgradeconfig_name` | the campaigns | the campaign missed its upgrade window |
//!
//! Each is 0 otherwise, once set; as MUO's gauge vectors, a family shows once it has a
//! series. One [`UpgradeMetrics`] is shared by the controllers of a
//! process (on their `Context`) and registered in the registry `capstan sync` serves at
//! `/metrics` ([`UpgradeMetrics::register`]).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeLabels {
    node_name: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct UpgradeConfigLabels {
    upgradeconfig_name: String,
}

/// The `upgradeoperator_*` gauges. Cheap to share: updates are atomic.
#[derive(Clone, Debug, Default)]
pub struct UpgradeMetrics {
    node_drain_timeout: Family<NodeLabels, Gauge>,
    validation_failed: Family<UpgradeConfigLabels, Gauge>,
    window_breached: Family<UpgradeConfigLabels, Gauge>,
}

impl UpgradeMetrics {
    /// Adds the families to `registry`: what it encodes then shows them.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "upgradeoperator_node_drain_timeout",
            "1 when a cordoned node's drain failed while it upgrades (managed-upgrade-operator's nodekeeper)",
            self.node_drain_timeout.clone(),
        );
        registry.register(
            "upgradeoperator_upgradeconfig_validation_failed",
            "1 when an UpgradeConfig does not validate",
            self.validation_failed.clone(),
        );
        registry.register(
            "upgradeoperator_upgrade_window_breached",
            "1 when an upgrade campaign did not start a node within its upgrade window",
            self.window_breached.clone(),
        );
    }

    /// `upgradeoperator_node_drain_timeout{node_name=node}` = 1.
    pub fn set_node_drain_timeout(&self, node: &str) {
        self.node_drain_timeout
            .get_or_create(&node_labels(node))
            .set(1);
    }

    /// `upgradeoperator_node_drain_timeout{node_name=node}` = 0.
    pub fn reset_node_drain_timeout(&self, node: &str) {
        self.node_drain_timeout
            .get_or_create(&node_labels(node))
            .set(0);
    }

    /// Drops every `upgradeoperator_node_drain_timeout` series (MUO resets the whole
    /// vector when an upgrade ends or fails).
    pub fn clear_node_drain_timeouts(&self) {
        self.node_drain_timeout.clear();
    }

    /// The value of `upgradeoperator_node_drain_timeout{node_name=node}`, if it was set.
    pub fn node_drain_timeout(&self, node: &str) -> Option<i64> {
        self.node_drain_timeout
            .get(&node_labels(node))
            .map(|gauge| gauge.get())
    }

    /// `upgradeoperator_upgradeconfig_validation_failed{upgradeconfig_name=name}`: 1 when
    /// `failed`, else 0.
    pub fn set_upgradeconfig_validation_failed(&self, name: &str, failed: bool) {
        self.validation_failed
            .get_or_create(&config_labels(name))
            .set(i64::from(failed));
    }

    /// The value of `upgradeoperator_upgradeconfig_validation_failed{upgradeconfig_name=name}`.
    pub fn upgradeconfig_validation_failed(&self, name: &str) -> Option<i64> {
        self.validation_failed
            .get(&config_labels(name))
            .map(|gauge| gauge.get())
    }

    /// `upgradeoperator_upgrade_window_breached{upgradeconfig_name=name}`: 1 when
    /// `breached`, else 0.
    pub fn set_upgrade_window_breached(&self, name: &str, breached: bool) {
        self.window_breached
            .get_or_create(&config_labels(name))
            .set(i64::from(breached));
    }

    /// The value of `upgradeoperator_upgrade_window_breached{upgradeconfig_name=name}`.
    pub fn upgrade_window_breached(&self, name: &str) -> Option<i64> {
        self.window_breached
            .get(&config_labels(name))
            .map(|gauge| gauge.get())
    }
}

fn node_labels(node: &str) -> NodeLabels {
    NodeLabels {
        node_name: node.to_string(),
    }
}

fn config_labels(name: &str) -> UpgradeConfigLabels {
    UpgradeConfigLabels {
        upgradeconfig_name: name.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(metrics: &UpgradeMetrics) -> String {
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encoding");
        text
    }

    #[test]
    fn the_gauges_read_as_muo_names_them() {
        let metrics = UpgradeMetrics::default();
        // As MUO's gauge vectors, a family shows once it has a series.
        assert_eq!(encode(&metrics), "# EOF\n");
        metrics.set_node_drain_timeout("worker-1");
        metrics.reset_node_drain_timeout("worker-2");
        metrics.set_upgradeconfig_validation_failed("managed-upgrade-config", true);
        metrics.set_upgrade_window_breached("managed-upgrade-config", false);
        let text = encode(&metrics);
        for line in [
            "upgradeoperator_node_drain_timeout{node_name=\"worker-1\"} 1",
            "upgradeoperator_node_drain_timeout{node_name=\"worker-2\"} 0",
            "upgradeoperator_upgradeconfig_validation_failed{upgradeconfig_name=\"managed-upgrade-config\"} 1",
            "upgradeoperator_upgrade_window_breached{upgradeconfig_name=\"managed-upgrade-config\"} 0",
            "# TYPE upgradeoperator_node_drain_timeout gauge",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
        assert_eq!(metrics.node_drain_timeout("worker-1"), Some(1));
        assert_eq!(metrics.node_drain_timeout("worker-3"), None);
        assert_eq!(
            metrics.upgradeconfig_validation_failed("managed-upgrade-config"),
            Some(1)
        );
        assert_eq!(
            metrics.upgrade_window_breached("managed-upgrade-config"),
            Some(0)
        );
        metrics.clear_node_drain_timeouts();
        assert_eq!(metrics.node_drain_timeout("worker-1"), None);
    }
}
