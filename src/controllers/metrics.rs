//! The controllers' gauges, with managed-upgrade-operator's names and labels so that its
//! alerts and dashboards read capstan's (docs/metrics.md, docs/nodekeeper.md):
//!
//! | family | labels | set by | 1 when |
//! | --- | --- | --- | --- |
//! | `upgradeoperator_node_drain_timeout` | `node_name` | the nodekeeper | the node's drain failed while it upgrades |
//! | `upgradeoperator_upgradeconfig_validation_failed` | `upgradeconfig_name` | the sync | the `UpgradeConfig` is in a rejected head commit |
//! | `upgradeoperator_upgrade_window_breached` | `upgradeconfig_name` | the campaigns | the campaign missed its upgrade window |
//! | `capstan_rollout_halted` | `sync` | the version-label controller | a gate failed on a node of the `GitSync` and its rollout halted |
//!
//! and the counters `capstan_rollout_gate_failures_total{sync}`, a gate that failed (after
//! its retries) on a node of the `GitSync`, and `capstan_notifications_total{sync, target,
//! result}`, the notifications controller's deliveries (`result` is `delivered` or `failed`).
//!
//! Each is 0 otherwise, once set; as MUO's gauge vectors, a family shows once it has a
//! series. As MUO drops them when its `UpgradeConfig` is gone, the two campaign series of
//! an `UpgradeConfig` that left Git are dropped ([`UpgradeMetrics::retain_campaigns`]),
//! and every drain series once no campaign is Upgrading. One [`UpgradeMetrics`] is shared
//! by the controllers of a process (on their `Context`) and registered in the registry
//! `capstan sync` serves at `/metrics` ([`UpgradeMetrics::register`]).
//!
//! Beside them, [`UpgradeMetrics::kmm`] holds upstream KMM's `kmm_*` gauges
//! ([`KmmMetrics`]), with its names and labels, which the device-plugin controller sets from
//! the Modules as upstream's device-plugin reconciler does ([`KmmGauges::of`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};

use capstan_api::module::{ModprobeArgs, Module};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeLabels {
    node_name: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SyncLabels {
    sync: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DeliveryLabels {
    sync: String,
    target: String,
    result: String,
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
    rollout_halted: Family<SyncLabels, Gauge>,
    gate_failures: Family<SyncLabels, Counter>,
    notifications: Family<DeliveryLabels, Counter>,
    /// The `upgradeconfig_name`s with a series in either campaign family: a family cannot
    /// list its series. Held while those families are written, so none is left unnamed.
    campaigns: Arc<Mutex<BTreeSet<String>>>,
    /// Upstream KMM's `kmm_*` gauges, registered with these.
    pub kmm: KmmMetrics,
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
        registry.register(
            "capstan_rollout_halted",
            "1 while a gate that failed on a node of the GitSync halts its rollout",
            self.rollout_halted.clone(),
        );
        registry.register(
            "capstan_rollout_gate_failures",
            "Gates that failed, after their retries, on nodes of the GitSync",
            self.gate_failures.clone(),
        );
        registry.register(
            "capstan_notifications",
            "Deliveries of rollout reports to a notification target, by result (delivered, failed)",
            self.notifications.clone(),
        );
        self.kmm.register(registry);
    }

    /// `capstan_notifications_total{sync, target, result}` + 1.
    pub fn notified(&self, sync: &str, target: &str, delivered: bool) {
        self.notifications
            .get_or_create(&DeliveryLabels {
                sync: sync.to_string(),
                target: target.to_string(),
                result: if delivered { "delivered" } else { "failed" }.to_string(),
            })
            .inc();
    }

    /// `capstan_rollout_halted{sync}`.
    pub fn set_rollout_halted(&self, sync: &str, halted: bool) {
        self.rollout_halted
            .get_or_create(&SyncLabels {
                sync: sync.to_string(),
            })
            .set(i64::from(halted));
    }

    /// `capstan_rollout_halted{sync}`, when set.
    pub fn rollout_halted(&self, sync: &str) -> Option<i64> {
        let labels = SyncLabels {
            sync: sync.to_string(),
        };
        self.rollout_halted.get(&labels).map(|gauge| gauge.get())
    }

    /// `capstan_rollout_gate_failures_total{sync}` + 1.
    pub fn gate_failed(&self, sync: &str) {
        self.gate_failures
            .get_or_create(&SyncLabels {
                sync: sync.to_string(),
            })
            .inc();
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
        let mut campaigns = self.campaigns();
        campaigns.insert(name.to_string());
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
        let mut campaigns = self.campaigns();
        campaigns.insert(name.to_string());
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

    /// Drops the `upgradeoperator_upgradeconfig_validation_failed` and
    /// `upgradeoperator_upgrade_window_breached` series of every `UpgradeConfig` not named
    /// in `names`: one that is gone must not keep its alert firing.
    pub fn retain_campaigns(&self, names: &BTreeSet<String>) {
        let mut campaigns = self.campaigns();
        campaigns.retain(|name| {
            let keep = names.contains(name);
            if !keep {
                let labels = config_labels(name);
                self.validation_failed.remove(&labels);
                self.window_breached.remove(&labels);
            }
            keep
        });
    }

    fn campaigns(&self) -> std::sync::MutexGuard<'_, BTreeSet<String>> {
        self.campaigns
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// The labels of `kmm_modprobe_args`, as upstream names them.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
#[allow(non_snake_case)] // Upstream's label name.
struct ModprobeArgsLabels {
    name: String,
    namespace: String,
    modprobeArgs: String,
}

/// The labels of `kmm_modprobe_raw_args`, as upstream names them.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
#[allow(non_snake_case)] // Upstream's label name.
struct ModprobeRawArgsLabels {
    name: String,
    namespace: String,
    modprobeRawArgs: String,
}

/// What upstream KMM's `kmm_*` gauges say of a set of Modules.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KmmGauges {
    /// `kmm_module_num`: the Modules.
    pub modules: i64,
    /// `kmm_in_cluster_build_num`: Modules with a module loader that declares a `build`
    /// (its container's or a kernel mapping's).
    pub in_cluster_build: i64,
    /// `kmm_in_cluster_sign_num`: Modules with a module loader that declares a `sign`.
    pub in_cluster_sign: i64,
    /// `kmm_device_plugin_num`: Modules with a `devicePlugin`.
    pub device_plugin: i64,
    /// `kmm_modprobe_args`: `(namespace, name)` of each Module whose modprobe sets `args`,
    /// with its load arguments joined by commas.
    pub modprobe_args: BTreeMap<(String, String), String>,
    /// `kmm_modprobe_raw_args`: the same for `rawArgs`.
    pub modprobe_raw_args: BTreeMap<(String, String), String>,
}

impl KmmGauges {
    /// The gauges of `modules`, counted as upstream's `setKMMOMetrics`: a Module declaring
    /// both `build` and `sign` on its container counts for both; otherwise each also counts
    /// when one of its kernel mappings declares it.
    pub fn of<'a>(modules: impl IntoIterator<Item = &'a Module>) -> KmmGauges {
        let mut gauges = KmmGauges::default();
        for module in modules {
            gauges.modules += 1;
            gauges.device_plugin += i64::from(module.spec.device_plugin.is_some());
            let Some(loader) = &module.spec.module_loader else {
                continue;
            };
            let container = &loader.container;
            let mappings = &container.kernel_mappings;
            let build = container.build.is_some() || mappings.iter().any(|m| m.build.is_some());
            let sign = container.sign.is_some() || mappings.iter().any(|m| m.sign.is_some());
            gauges.in_cluster_build += i64::from(build);
            gauges.in_cluster_sign += i64::from(sign);
            let id = (
                module.metadata.namespace.clone().unwrap_or_default(),
                module.metadata.name.clone().unwrap_or_default(),
            );
            let joined = |args: &ModprobeArgs| args.load.join(",");
            if let Some(args) = &container.modprobe.args {
                gauges.modprobe_args.insert(id.clone(), joined(args));
            }
            if let Some(args) = &container.modprobe.raw_args {
                gauges.modprobe_raw_args.insert(id, joined(args));
            }
        }
        gauges
    }
}

/// Upstream KMM's `kmm_*` gauges (v2.6.0's `internal/metrics`), but `kmm_preflight_num`:
/// capstan has no `PreflightValidation` kind. Cheap to share: updates are atomic.
#[derive(Clone, Debug, Default)]
pub struct KmmMetrics {
    modules: Gauge,
    in_cluster_build: Gauge,
    in_cluster_sign: Gauge,
    device_plugin: Gauge,
    modprobe_args: Family<ModprobeArgsLabels, Gauge>,
    modprobe_raw_args: Family<ModprobeRawArgsLabels, Gauge>,
    /// The series of the two args families, which a family cannot list. Held while they are
    /// written.
    args_series: Arc<Mutex<(Vec<ModprobeArgsLabels>, Vec<ModprobeRawArgsLabels>)>>,
}

impl KmmMetrics {
    /// Adds the gauges to `registry`, with upstream's names and help.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "kmm_module_num",
            "Number of existing KMMO Modules",
            self.modules.clone(),
        );
        registry.register(
            "kmm_in_cluster_build_num",
            "Number of existing KMMO Modules with in-cluster Build defined",
            self.in_cluster_build.clone(),
        );
        registry.register(
            "kmm_in_cluster_sign_num",
            "Number of existing KMMO Modules with in-cluster Sign defined",
            self.in_cluster_sign.clone(),
        );
        registry.register(
            "kmm_device_plugin_num",
            "Number of existing KMMO Modules with DevicePlugin defined",
            self.device_plugin.clone(),
        );
        registry.register(
            "kmm_modprobe_args",
            "for a given kernel version, describe which modprobe args used (if at all)",
            self.modprobe_args.clone(),
        );
        registry.register(
            "kmm_modprobe_raw_args",
            "for a given kernel version, describe which modprobe raw args used (if at all)",
            self.modprobe_raw_args.clone(),
        );
    }

    /// Sets every gauge to `gauges`. An args series is 1, as upstream's; the series of a
    /// Module that is gone, or whose arguments changed, is dropped.
    pub fn set(&self, gauges: &KmmGauges) {
        self.modules.set(gauges.modules);
        self.in_cluster_build.set(gauges.in_cluster_build);
        self.in_cluster_sign.set(gauges.in_cluster_sign);
        self.device_plugin.set(gauges.device_plugin);
        let args: Vec<ModprobeArgsLabels> = gauges
            .modprobe_args
            .iter()
            .map(|((namespace, name), args)| ModprobeArgsLabels {
                name: name.clone(),
                namespace: namespace.clone(),
                modprobeArgs: args.clone(),
            })
            .collect();
        let raw_args: Vec<ModprobeRawArgsLabels> = gauges
            .modprobe_raw_args
            .iter()
            .map(|((namespace, name), args)| ModprobeRawArgsLabels {
                name: name.clone(),
                namespace: namespace.clone(),
                modprobeRawArgs: args.clone(),
            })
            .collect();
        let mut series = self
            .args_series
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for gone in series.0.iter().filter(|labels| !args.contains(labels)) {
            self.modprobe_args.remove(gone);
        }
        for gone in series.1.iter().filter(|labels| !raw_args.contains(labels)) {
            self.modprobe_raw_args.remove(gone);
        }
        for labels in &args {
            self.modprobe_args.get_or_create(labels).set(1);
        }
        for labels in &raw_args {
            self.modprobe_raw_args.get_or_create(labels).set(1);
        }
        *series = (args, raw_args);
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
        assert!(!encode(&metrics).contains("upgradeoperator_"));
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

    fn kmm_module(name: &str, loader: serde_json::Value, device_plugin: bool) -> Module {
        let mut spec = serde_json::json!({"selector": {}});
        if !loader.is_null() {
            spec["moduleLoader"] = serde_json::json!({"container": loader});
        }
        if device_plugin {
            spec["devicePlugin"] = serde_json::json!({"container": {"image": "dp:v1"}});
        }
        serde_json::from_value(serde_json::json!({
            "apiVersion": "kmm.sigs.x-k8s.io/v1beta1", "kind": "Module",
            "metadata": {"name": name, "namespace": "kmm-demo"},
            "spec": spec,
        }))
        .expect("a Module")
    }

    /// A module loader container: `extra` merged into a plain one.
    fn loader(extra: serde_json::Value) -> serde_json::Value {
        let mut container = serde_json::json!({
            "modprobe": {"moduleName": "my_kmod"},
            "kernelMappings": [{"regexp": "^.+$", "containerImage": "kmod:${KERNEL_FULL_VERSION}"}],
        });
        if let (Some(container), serde_json::Value::Object(extra)) =
            (container.as_object_mut(), extra)
        {
            container.extend(extra);
        }
        container
    }

    #[test]
    fn kmm_gauges_count_the_modules_as_upstream() {
        let build = serde_json::json!({"dockerfileConfigMap": {"name": "dockerfile"}});
        let sign =
            serde_json::json!({"keySecret": {"name": "key"}, "certSecret": {"name": "cert"}});
        let mapping = |field: &str, value: &serde_json::Value| {
            serde_json::json!({"kernelMappings": [
                {"literal": "6.0.15", "containerImage": "kmod:v1"},
                {"regexp": "^.+$", "containerImage": "kmod:v1", field: value},
            ]})
        };
        // (name, Modules, modules, build, sign, device plugin)
        let rows = [
            ("none", vec![], (0, 0, 0, 0)),
            (
                "a plain Module",
                vec![kmm_module("a", loader(serde_json::json!({})), false)],
                (1, 0, 0, 0),
            ),
            (
                "a device plugin without a module loader",
                vec![kmm_module("a", serde_json::Value::Null, true)],
                (1, 0, 0, 1),
            ),
            (
                "build and sign on the container",
                vec![kmm_module(
                    "a",
                    loader(serde_json::json!({"build": build, "sign": sign})),
                    true,
                )],
                (1, 1, 1, 1),
            ),
            (
                "build on a kernel mapping",
                vec![kmm_module("a", loader(mapping("build", &build)), false)],
                (1, 1, 0, 0),
            ),
            (
                "sign on the container, build on a mapping",
                vec![kmm_module(
                    "a",
                    loader(serde_json::json!({
                        "sign": sign,
                        "kernelMappings": [{"regexp": "^.+$", "containerImage": "kmod:v1", "build": build}],
                    })),
                    false,
                )],
                (1, 1, 1, 0),
            ),
            (
                "three Modules",
                vec![
                    kmm_module("a", loader(mapping("sign", &sign)), true),
                    kmm_module("b", loader(serde_json::json!({})), true),
                    kmm_module("c", serde_json::Value::Null, false),
                ],
                (3, 0, 1, 2),
            ),
        ];
        for (name, modules, (count, build, sign, device_plugin)) in rows {
            let gauges = KmmGauges::of(&modules);
            assert_eq!(
                (
                    gauges.modules,
                    gauges.in_cluster_build,
                    gauges.in_cluster_sign,
                    gauges.device_plugin
                ),
                (count, build, sign, device_plugin),
                "{name}"
            );
        }
    }

    #[test]
    fn kmm_gauges_read_as_upstream_names_them_and_drop_what_went() {
        let metrics = UpgradeMetrics::default();
        let args = |load: &[&str], raw: Option<&[&str]>| {
            let mut modprobe = serde_json::json!({"moduleName": "my_kmod", "args": {"load": load}});
            if let Some(raw) = raw {
                modprobe["rawArgs"] = serde_json::json!({"load": raw});
            }
            loader(serde_json::json!({"modprobe": modprobe}))
        };
        let modules = [
            kmm_module("a", args(&["-v", "debug=1"], None), true),
            kmm_module("b", args(&[], Some(&["/opt/lib/modules/b.ko"])), false),
            kmm_module("c", loader(serde_json::json!({})), false),
        ];
        metrics.kmm.set(&KmmGauges::of(&modules));
        let text = encode(&metrics);
        for line in [
            "kmm_module_num 3",
            "kmm_in_cluster_build_num 0",
            "kmm_in_cluster_sign_num 0",
            "kmm_device_plugin_num 1",
            "kmm_modprobe_args{name=\"a\",namespace=\"kmm-demo\",modprobeArgs=\"-v,debug=1\"} 1",
            "kmm_modprobe_args{name=\"b\",namespace=\"kmm-demo\",modprobeArgs=\"\"} 1",
            "kmm_modprobe_raw_args{name=\"b\",namespace=\"kmm-demo\",modprobeRawArgs=\"/opt/lib/modules/b.ko\"} 1",
            "# TYPE kmm_module_num gauge",
            "# HELP kmm_device_plugin_num Number of existing KMMO Modules with DevicePlugin defined.",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
        assert!(!text.contains("name=\"c\""), "{text}");

        // a's arguments change and b goes: their old series go with them.
        let modules = [kmm_module("a", args(&["-v"], None), true)];
        metrics.kmm.set(&KmmGauges::of(&modules));
        let text = encode(&metrics);
        assert!(
            text.lines().any(|l| l
                == "kmm_modprobe_args{name=\"a\",namespace=\"kmm-demo\",modprobeArgs=\"-v\"} 1")
        );
        assert!(!text.contains("debug=1"), "{text}");
        assert!(!text.contains("name=\"b\""), "{text}");
        assert!(text.lines().any(|l| l == "kmm_module_num 1"), "{text}");
    }

    #[test]
    fn the_campaign_series_of_an_upgrade_config_that_left_are_dropped() {
        let metrics = UpgradeMetrics::default();
        for name in ["a", "b"] {
            metrics.set_upgradeconfig_validation_failed(name, true);
            metrics.set_upgrade_window_breached(name, true);
        }
        metrics.set_upgradeconfig_validation_failed("c", false);
        metrics.retain_campaigns(&BTreeSet::from(["b".to_string(), "d".to_string()]));
        for gone in ["a", "c"] {
            assert_eq!(
                metrics.upgradeconfig_validation_failed(gone),
                None,
                "{gone}"
            );
            assert_eq!(metrics.upgrade_window_breached(gone), None, "{gone}");
        }
        assert_eq!(metrics.upgradeconfig_validation_failed("b"), Some(1));
        assert_eq!(metrics.upgrade_window_breached("b"), Some(1));
        // A name kept without a series gets none.
        assert_eq!(metrics.upgradeconfig_validation_failed("d"), None);
        assert!(!encode(&metrics).contains("\"a\""));
        // A campaign that comes back is reported again.
        metrics.set_upgrade_window_breached("a", false);
        assert_eq!(metrics.upgrade_window_breached("a"), Some(0));
        metrics.retain_campaigns(&BTreeSet::new());
        assert_eq!(metrics.upgrade_window_breached("a"), None);
        assert_eq!(metrics.upgrade_window_breached("b"), None);
    }
}
