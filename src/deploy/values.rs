//! The install's settings: one table ([`SETTINGS`]) that is the Helm chart's values.yaml,
//! and what the kustomize base is written with (the defaults).
//!
//! The objects are built once ([`super::objects`]) through a [`Fill`]: with the defaults
//! for the kustomize base, or with markers (`@@image.tag@@`) that [`super::helm`] turns
//! into the chart's template expressions. Both outputs come from the same objects, so
//! they cannot drift apart.

use serde_json::{Value, json};

use crate::rbac;

/// The namespace capstan is installed in (and keeps its `GitSync` in).
pub const NAMESPACE: &str = capstan_api::capstan::SYSTEM_NAMESPACE;
/// The key standing for the chart's release namespace.
pub const RELEASE_NAMESPACE: &str = "Release.Namespace";

/// One value of values.yaml.
pub struct Setting {
    /// Its path in values.yaml: `image.tag`.
    pub key: &'static str,
    /// Its default, which the kustomize base is written with.
    pub default: fn() -> Value,
    /// The comment above it in values.yaml.
    pub comment: &'static str,
}

fn version() -> String {
    format!("v{}", env!("CARGO_PKG_VERSION"))
}

/// Every setting, in values.yaml's order.
pub const SETTINGS: &[Setting] = &[
    Setting {
        key: "image.repository",
        default: || json!("ghcr.io/capstan-dev/capstan"),
        comment: "The controller's image (non-root).",
    },
    Setting {
        key: "image.tag",
        default: || json!(version()),
        comment: "",
    },
    Setting {
        key: "image.pullPolicy",
        default: || json!("IfNotPresent"),
        comment: "",
    },
    Setting {
        key: "workerImage",
        default: || json!(format!("ghcr.io/capstan-dev/capstan-worker:{}", version())),
        comment: "The image of the KMM worker pods (`capstan worker kmod`, with kmod's modprobe).",
    },
    Setting {
        key: "repository.url",
        default: || json!("https://github.com/example/fleet.git"),
        comment: "The fleet repository capstan follows: an https or ssh URL.",
    },
    Setting {
        key: "repository.branch",
        default: || json!("main"),
        comment: "",
    },
    Setting {
        key: "repository.path",
        default: || json!("."),
        comment: "The folder inside the repository to sync; \".\" for all of it.",
    },
    Setting {
        key: "interval",
        default: || json!("1m"),
        comment: "How often capstan fetches the branch and looks for drift.",
    },
    Setting {
        key: "controllers",
        default: || json!("all"),
        comment: "The controllers to run: all, none, or a comma-separated list of module-nmc, nmc,\n\
                  device-plugin, dra, version-labels, campaigns, drain, nodekeeper, lws,\n\
                  notifications.",
    },
    Setting {
        key: "replicas",
        default: || json!(2),
        comment: "Replicas: one leads (syncs and runs the controllers), the others wait for its Lease.",
    },
    Setting {
        key: "leaderElection.enabled",
        default: || json!(true),
        comment: "Leader election on a Lease in the release namespace; without it run one replica only.",
    },
    Setting {
        key: "leaderElection.leaseDuration",
        default: || json!("15s"),
        comment: "How long a standby waits after the leader's last renewal (whole seconds).",
    },
    Setting {
        key: "leaderElection.leaseGrace",
        default: || json!("5s"),
        comment: "How long before the Lease expires the leader renews it.",
    },
    Setting {
        key: "credentials.type",
        default: || json!("none"),
        comment: "Git credentials: none (a public repository), token (the Secret's key `token`), or ssh\n\
                  (the Secret's keys `identity` and `known_hosts`).",
    },
    Setting {
        key: "credentials.secretName",
        default: || json!("capstan-git"),
        comment: "An existing Secret in the release namespace, mounted at /etc/capstan/git.",
    },
    Setting {
        key: "webhook.enabled",
        default: || json!(false),
        comment: "GitHub push webhooks at POST /hooks/github on the Service's port 9477.",
    },
    Setting {
        key: "webhook.secretName",
        default: || json!("capstan-webhook"),
        comment: "An existing Secret whose key `secret` is the webhook's secret, mounted at\n\
                  /etc/capstan/webhook.",
    },
    Setting {
        key: "resources",
        default: || {
            json!({
                "requests": {"cpu": "100m", "memory": "256Mi"},
                "limits": {"memory": "1Gi"},
            })
        },
        comment: "The controller container's resources.",
    },
    Setting {
        key: "rbac.repositoryRules",
        default: || serde_json::to_value(rbac::repository_rules()).unwrap_or(Value::Null),
        comment: "The rules of the capstan-repository ClusterRole: the kinds your repository holds beyond\n\
                  capstan's own (Modules, UpgradeConfigs, LeaderWorkerSets, Nodes' labels). The sync\n\
                  reads, applies, and prunes them: get, list, create, patch, delete. A kind it may not\n\
                  write rejects the commit that holds it, naming the object.",
    },
    Setting {
        key: "serviceMonitor.enabled",
        default: || json!(false),
        comment: "A Prometheus Operator ServiceMonitor for the `http-metrics` port.",
    },
    Setting {
        key: "serviceMonitor.interval",
        default: || json!("30s"),
        comment: "",
    },
];

/// The setting `key`.
///
/// # Panics
/// When no setting has that key: the generator names only settings of the table.
pub fn setting(key: &str) -> &'static Setting {
    SETTINGS
        .iter()
        .find(|setting| setting.key == key)
        .unwrap_or_else(|| panic!("no setting {key}"))
}

/// The defaults as one tree: values.yaml's content.
pub fn defaults() -> Value {
    let mut tree = json!({});
    for setting in SETTINGS {
        set(&mut tree, setting.key, (setting.default)());
    }
    tree
}

/// Sets `key` (dotted) in `tree` to `value`.
pub fn set(tree: &mut Value, key: &str, value: Value) {
    let mut node = tree;
    let mut parts = key.split('.').peekable();
    while let Some(part) = parts.next() {
        if !node.is_object() {
            *node = json!({});
        }
        let map = node.as_object_mut().expect("an object");
        if parts.peek().is_none() {
            map.insert(part.to_string(), value);
            return;
        }
        node = map.entry(part.to_string()).or_insert_with(|| json!({}));
    }
}

/// The value of `key` (dotted) in `tree`.
pub fn get<'a>(tree: &'a Value, key: &str) -> Option<&'a Value> {
    key.split('.').try_fold(tree, |node, part| node.get(part))
}

/// A condition on the settings, for the parts of an object only some settings have.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Condition {
    /// The setting is true.
    Enabled(&'static str),
    /// The setting is this string.
    Is(&'static str, &'static str),
}

impl Condition {
    /// Whether it holds in `values`.
    pub fn holds(self, values: &Value) -> bool {
        match self {
            Condition::Enabled(key) => get(values, key) == Some(&Value::Bool(true)),
            Condition::Is(key, wanted) => get(values, key).and_then(Value::as_str) == Some(wanted),
        }
    }

    /// As a marker writes it: `key` or `key=value`.
    pub fn marked(self) -> String {
        match self {
            Condition::Enabled(key) => key.to_string(),
            Condition::Is(key, wanted) => format!("{key}={wanted}"),
        }
    }
}

/// How the objects are filled.
pub enum Fill {
    /// With these values: the kustomize base (the defaults) or a chart rendered in a test.
    Values(Value),
    /// With markers for the chart's templates.
    Markers,
}

impl Fill {
    /// The kustomize base's: the defaults.
    pub fn defaults() -> Fill {
        Fill::Values(defaults())
    }

    /// The string setting `key`.
    pub fn text(&self, key: &str) -> String {
        match self.value(key) {
            Value::String(text) => text,
            other => other.to_string(),
        }
    }

    /// The setting `key`: its value, or its marker.
    pub fn value(&self, key: &str) -> Value {
        match self {
            Fill::Values(values) => get(values, key).cloned().unwrap_or(Value::Null),
            Fill::Markers => json!(format!("@@{key}@@")),
        }
    }

    /// The setting `key` that is a whole YAML block (a map or list): its value, or a
    /// marker the chart writes as `toYaml`.
    pub fn block(&self, key: &str) -> Value {
        match self {
            Fill::Values(_) => self.value(key),
            Fill::Markers => json!(format!("@@block:{key}@@")),
        }
    }

    /// The namespace: capstan's, or the chart's release namespace.
    pub fn namespace(&self) -> String {
        match self {
            Fill::Values(_) => NAMESPACE.to_string(),
            Fill::Markers => format!("@@{RELEASE_NAMESPACE}@@"),
        }
    }

    /// A list item that is there only when `condition` holds: with values, the item or
    /// nothing; with markers, the item marked with its condition.
    pub fn item_if(&self, condition: Condition, item: String) -> Option<String> {
        match self {
            Fill::Values(values) => condition.holds(values).then_some(item),
            Fill::Markers => Some(format!("@@if:{}@@{item}", condition.marked())),
        }
    }

    /// Whether an object that exists only when `condition` holds is written: always with
    /// markers (the chart's template holds the condition).
    pub fn includes(&self, condition: Condition) -> bool {
        match self {
            Fill::Values(values) => condition.holds(values),
            Fill::Markers => true,
        }
    }
}
