//! Repository settings: the optional `capstan.yaml` at the root of the synced path, read
//! strictly so that a misspelt setting is an error rather than a silent default.

use serde::{Deserialize, Serialize};

use super::yaml::{self, FieldPath, Node, NodeValue};
use super::{ManifestError, closest_name, rules, syntax_error};
use capstan_api::{NodeDrain, UpgradePolicy, UpgradeWindow};

/// Name of the settings file, at the root of the synced path. It is not a manifest.
pub const SETTINGS_FILE: &str = "capstan.yaml";

/// Repository-level settings, from `capstan.yaml`. Every field is optional:
///
/// ```yaml
/// maxNodesInFlight: 1        # nodes in an ordered upgrade at the same time
/// requirePullRequest: false  # act on version labels only from pull request merges
/// historyRetention: 1000     # history records kept in the cluster
/// prune: true                # delete objects that left the repository
/// drift: revert              # or warn
/// defaultNamespace: default  # for namespaced objects that set no namespace
/// nodeDrain:                 # drains under an UpgradeConfig campaign (minutes)
///   timeOut: 45
///   expectedNodeDrainTime: 8
///   disableDrainStrategies: false
///   ignoredNamespacePatterns: []
/// upgradeWindow:             # how soon a campaign's first node must start (minutes)
///   timeOut: 120
///   delayTrigger: 30
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Settings {
    /// `maxNodesInFlight` (default 1, at least 1): how many nodes go through an ordered
    /// upgrade at the same time. When a commit relabels more nodes, the rest wait their
    /// turn in a stable order.
    pub max_nodes_in_flight: u32,
    /// `requirePullRequest` (default false): act on version-label changes only when they
    /// arrive in a commit that merges or squashes a pull request; other commits are
    /// reported and not acted on.
    pub require_pull_request: bool,
    /// `historyRetention` (default 1000, at least 1): how many history records the cluster
    /// keeps; the oldest are deleted first.
    pub history_retention: u32,
    /// `prune` (default true): delete the objects that left the repository. Nodes are
    /// never deleted; they only lose the labels and annotations capstan set.
    pub prune: bool,
    /// `drift` (default `revert`): what happens when a field capstan owns was changed by
    /// hand.
    pub drift: DriftPolicy,
    /// `defaultNamespace` (default `default`): the namespace of namespaced objects whose
    /// manifest sets none.
    pub default_namespace: String,
    /// `nodeDrain`: MUO's drain settings (see [`NodeDrain`]).
    pub node_drain: NodeDrain,
    /// `upgradeWindow`: MUO's upgrade-window settings (see [`UpgradeWindow`]).
    pub upgrade_window: UpgradeWindow,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            max_nodes_in_flight: 1,
            require_pull_request: false,
            history_retention: 1000,
            prune: true,
            drift: DriftPolicy::Revert,
            default_namespace: "default".to_string(),
            node_drain: NodeDrain::default(),
            upgrade_window: UpgradeWindow::default(),
        }
    }
}

impl Settings {
    /// The ordered-upgrade part of the settings, as the `GitSync` status hands it to the
    /// version-label controller.
    pub fn upgrade_policy(&self) -> UpgradePolicy {
        UpgradePolicy {
            max_nodes_in_flight: self.max_nodes_in_flight,
            require_pull_request: self.require_pull_request,
            node_drain: self.node_drain.clone(),
            upgrade_window: self.upgrade_window.clone(),
        }
    }
}

/// What capstan does about a field it owns that was changed by hand.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DriftPolicy {
    /// `revert`: write the value from Git back at the next sync, and report it.
    #[default]
    Revert,
    /// `warn`: only report it.
    Warn,
}

/// The settings names, as written in `capstan.yaml`.
const FIELDS: [&str; 8] = [
    "maxNodesInFlight",
    "requirePullRequest",
    "historyRetention",
    "prune",
    "drift",
    "defaultNamespace",
    "nodeDrain",
    "upgradeWindow",
];

/// Reads `capstan.yaml` (`file` names it in errors); an empty file means the defaults.
///
/// Fails with every unknown setting (with a "did you mean"), else with the first value of
/// the wrong type, and with every value out of range.
pub fn parse(file: &str, text: &str) -> Result<Settings, Vec<ManifestError>> {
    let mut documents = yaml::documents(text).map_err(|err| vec![syntax_error(file, err)])?;
    if documents.len() > 1 {
        return Err(vec![ManifestError::new(
            file,
            Some(documents[1].line),
            None,
            "capstan.yaml holds one YAML document, the settings",
        )]);
    }
    let Some(tree) = documents.pop() else {
        return Ok(Settings::default());
    };
    let NodeValue::Mapping(entries) = &tree.value else {
        return Err(vec![ManifestError::new(
            file,
            Some(tree.line),
            None,
            format!("the settings must be a mapping of {}", FIELDS.join(", ")),
        )]);
    };
    let unknown: Vec<ManifestError> = entries
        .iter()
        .filter(|entry| !FIELDS.contains(&entry.key.as_str()))
        .map(|entry| {
            let message = match closest_name(&entry.key, FIELDS) {
                Some(meant) => format!("unknown setting; did you mean {meant}?"),
                None => format!("unknown setting; the settings are {}", FIELDS.join(", ")),
            };
            ManifestError::new(file, Some(entry.line), Some(entry.key.clone()), message)
        })
        .collect();
    if !unknown.is_empty() {
        return Err(unknown);
    }
    let settings: Settings = yaml::typed(text).map_err(|err| {
        let field = err.line.and_then(|line| setting_at(&tree, line));
        vec![ManifestError::new(file, err.line, field, err.message)]
    })?;
    let range_errors = out_of_range(&settings)
        .into_iter()
        .map(|(field, message)| {
            let path = field
                .split('.')
                .fold(FieldPath::root(), |path, part| match part.parse() {
                    Ok(index) => path.index(index),
                    Err(_) => path.field(part),
                });
            let line = tree.line_of(&path);
            ManifestError::new(file, line, Some(field), message)
        })
        .collect::<Vec<_>>();
    if range_errors.is_empty() {
        Ok(settings)
    } else {
        Err(range_errors)
    }
}

/// The setting written on or above `line`: the one a value error there belongs to.
fn setting_at(tree: &Node, line: usize) -> Option<String> {
    match &tree.value {
        NodeValue::Mapping(entries) => entries
            .iter()
            .rev()
            .find(|entry| entry.line <= line)
            .map(|entry| entry.key.clone()),
        _ => None,
    }
}

/// The settings whose values are allowed by their type but not by their meaning, each
/// with its dotted path (`nodeDrain.ignoredNamespacePatterns.0`).
fn out_of_range(settings: &Settings) -> Vec<(String, String)> {
    let mut problems = Vec::new();
    if settings.max_nodes_in_flight == 0 {
        problems.push((
            "maxNodesInFlight".to_string(),
            "must be at least 1: with 0, no node would ever be upgraded".to_string(),
        ));
    }
    if settings.history_retention == 0 {
        problems.push((
            "historyRetention".to_string(),
            "must be at least 1".to_string(),
        ));
    }
    if let Err(reason) = rules::dns_label(&settings.default_namespace) {
        problems.push((
            "defaultNamespace".to_string(),
            format!(
                "{:?} is not a valid namespace: {reason}",
                settings.default_namespace
            ),
        ));
    }
    for (index, pattern) in settings
        .node_drain
        .ignored_namespace_patterns
        .iter()
        .enumerate()
    {
        if let Err(err) = regex::Regex::new(pattern) {
            problems.push((
                format!("nodeDrain.ignoredNamespacePatterns.{index}"),
                format!("{pattern:?} is not a regular expression: {err}"),
            ));
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errors(text: &str) -> Vec<String> {
        parse("fleet/capstan.yaml", text)
            .unwrap_err()
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn absent_and_empty_settings_are_the_defaults() {
        let defaults = Settings::default();
        assert_eq!(defaults.max_nodes_in_flight, 1);
        assert!(!defaults.require_pull_request);
        assert_eq!(defaults.history_retention, 1000);
        assert!(defaults.prune);
        assert_eq!(defaults.drift, DriftPolicy::Revert);
        assert_eq!(defaults.default_namespace, "default");
        assert_eq!(parse("capstan.yaml", "").unwrap(), defaults);
        assert_eq!(parse("capstan.yaml", "# nothing yet\n").unwrap(), defaults);
    }

    #[test]
    fn every_setting_is_read() {
        let text = "maxNodesInFlight: 50\nrequirePullRequest: true\nhistoryRetention: 10\n\
                    prune: false\ndrift: warn\ndefaultNamespace: fleet\n\
                    nodeDrain: {timeOut: 30, expectedNodeDrainTime: 5, \
                    disableDrainStrategies: true, ignoredNamespacePatterns: [^kube-]}\n\
                    upgradeWindow: {timeOut: 60, delayTrigger: 0}\n";
        assert_eq!(
            parse("capstan.yaml", text).unwrap(),
            Settings {
                max_nodes_in_flight: 50,
                require_pull_request: true,
                history_retention: 10,
                prune: false,
                drift: DriftPolicy::Warn,
                default_namespace: "fleet".to_string(),
                node_drain: NodeDrain {
                    time_out: 30,
                    expected_node_drain_time: 5,
                    disable_drain_strategies: true,
                    ignored_namespace_patterns: vec!["^kube-".to_string()],
                },
                upgrade_window: UpgradeWindow {
                    time_out: 60,
                    delay_trigger: 0,
                },
            }
        );
    }

    #[test]
    fn the_field_list_matches_the_struct() {
        let json = serde_json::to_value(Settings::default()).unwrap();
        let keys: Vec<&str> = json
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        let mut fields = FIELDS.to_vec();
        fields.sort_unstable();
        assert_eq!(keys, fields);
    }

    #[test]
    fn decision_table() {
        let cases: &[(&str, &[&str])] = &[
            (
                "prune: true\nmaxNodesInFlite: 2\ncolour: red\n",
                &[
                    "fleet/capstan.yaml:2: maxNodesInFlite: unknown setting; did you mean maxNodesInFlight?",
                    "fleet/capstan.yaml:3: colour: unknown setting; the settings are maxNodesInFlight, \
                     requirePullRequest, historyRetention, prune, drift, defaultNamespace, \
                     nodeDrain, upgradeWindow",
                ],
            ),
            (
                "nodeDrain:\n  timeOut: 45\n  ignoredNamespacePatterns: [\"^kube-\", \"(open\"]\n",
                &[
                    "fleet/capstan.yaml:3: nodeDrain.ignoredNamespacePatterns.1: \"(open\" is not \
                   a regular expression",
                ],
            ),
            (
                "nodeDrain:\n  timeOut: -5\n",
                &["fleet/capstan.yaml:2: nodeDrain: "],
            ),
            (
                "upgradeWindow:\n  timeout: 5\n",
                &["fleet/capstan.yaml:2: upgradeWindow: "],
            ),
            (
                "prune: true\nmaxNodesInFlight: -1\n",
                &["fleet/capstan.yaml:2: maxNodesInFlight: "],
            ),
            ("prune: yes\n", &["fleet/capstan.yaml:1: prune: "]),
            ("drift: ignore\n", &["fleet/capstan.yaml:1: drift: "]),
            (
                "maxNodesInFlight: 0\nhistoryRetention: 0\n",
                &[
                    "fleet/capstan.yaml:1: maxNodesInFlight: must be at least 1",
                    "fleet/capstan.yaml:2: historyRetention: must be at least 1",
                ],
            ),
            (
                "defaultNamespace: Fleet\n",
                &["fleet/capstan.yaml:1: defaultNamespace: \"Fleet\" is not a valid namespace"],
            ),
            (
                "- prune\n",
                &["fleet/capstan.yaml:1: the settings must be a mapping"],
            ),
            (
                "prune: true\n---\nprune: false\n",
                &["fleet/capstan.yaml:3: capstan.yaml holds one YAML document"],
            ),
            (
                "prune: [\n",
                &["fleet/capstan.yaml:1: invalid YAML (column 8)"],
            ),
        ];
        for (text, expected) in cases {
            let found = errors(text);
            assert_eq!(found.len(), expected.len(), "{text:?}: {found:#?}");
            for (error, prefix) in found.iter().zip(expected.iter()) {
                assert!(
                    error.starts_with(prefix),
                    "{text:?}: {error} does not start with {prefix}"
                );
            }
        }
    }
}
