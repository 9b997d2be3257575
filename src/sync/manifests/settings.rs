//! Repository settings: the optional `capstan.yaml` at the root of the synced path, read
//! strictly so that a misspelt setting is an error rather than a silent default.

use serde::{Deserialize, Serialize};

use super::rollout::RolloutSettings;
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
/// notReadyTimeout: 10m       # an upgrading node NotReady this long gives up its slot
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
    /// `notReadyTimeout` (default `10m`, a duration): a node that stays NotReady this long
    /// in the middle of an upgrade gives up its `maxNodesInFlight` slot, so that the rest
    /// of the fleet moves on; it takes a slot again, in line, once it is Ready.
    #[serde(with = "duration_text")]
    pub not_ready_timeout: std::time::Duration,
    /// `rollout`: the guardrails (see [`RolloutSettings`]).
    pub rollout: RolloutSettings,
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
            not_ready_timeout: std::time::Duration::from_secs(
                capstan_api::capstan::DEFAULT_NOT_READY_TIMEOUT_SECONDS,
            ),
            rollout: RolloutSettings::default(),
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
            not_ready_timeout_seconds: self.not_ready_timeout.as_secs().max(1),
            rollout: self.rollout.policy(),
        }
    }
}

/// A duration written as `10m`, `30s` or `1h30m`.
pub(super) mod duration_text {
    use serde::{Deserialize as _, Deserializer, Serializer};
    use std::time::Duration;

    pub fn serialize<S: Serializer>(value: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
        let text = jiff::SignedDuration::try_from(*value)
            .map(|d| format!("{d:#}"))
            .unwrap_or_default();
        serializer.serialize_str(&text)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.trim()
            .parse::<jiff::SignedDuration>()
            .ok()
            .and_then(|d| Duration::try_from(d).ok())
            .ok_or_else(|| {
                serde::de::Error::custom(format!(
                    "{text:?} is not a duration: write one like 10m, 90s or 1h30m"
                ))
            })
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

/// A setting of `capstan.yaml`, and what it accepts: the table every value is checked
/// against before it is read, so that an error names the setting's whole path and says
/// what would do.
#[derive(Clone, Copy, Debug)]
struct Setting {
    /// The key, as written.
    key: &'static str,
    /// What its value may be.
    accepts: Accepts,
    /// What an absent value means, as written (empty for a section).
    default: &'static str,
    /// What a particular value means, when one does (`0: no window`).
    note: &'static str,
}

/// What a setting's value may be.
#[derive(Clone, Copy, Debug)]
enum Accepts {
    /// A whole number from `min` to `u32::MAX`, counting `unit`.
    Whole { unit: &'static str, min: u32 },
    /// `true` or `false`.
    Bool,
    /// One of these words.
    OneOf(&'static [&'static str]),
    /// A namespace's name (checked as one once read).
    Namespace,
    /// A duration such as `10m`.
    Duration,
    /// A list of regular expressions (each checked once read).
    Patterns,
    /// A mapping of these settings; empty means every default.
    Section(&'static [Setting]),
    /// A mapping its own reader checks field by field (`rollout`).
    Mapping(&'static str),
}

const MINUTES: Accepts = Accepts::Whole {
    unit: "minutes",
    min: 0,
};

/// `nodeDrain`'s settings (MUO's names and documented defaults).
const NODE_DRAIN: &[Setting] = &[
    Setting {
        key: "timeOut",
        accepts: MINUTES,
        default: "45",
        note: "0: forced at once",
    },
    Setting {
        key: "expectedNodeDrainTime",
        accepts: MINUTES,
        default: "8",
        note: "",
    },
    Setting {
        key: "disableDrainStrategies",
        accepts: Accepts::Bool,
        default: "false",
        note: "",
    },
    Setting {
        key: "ignoredNamespacePatterns",
        accepts: Accepts::Patterns,
        default: "[]",
        note: "",
    },
];

/// `upgradeWindow`'s settings.
const UPGRADE_WINDOW: &[Setting] = &[
    Setting {
        key: "timeOut",
        accepts: MINUTES,
        default: "120",
        note: "0: no window",
    },
    Setting {
        key: "delayTrigger",
        accepts: MINUTES,
        default: "30",
        note: "0: never said delayed",
    },
];

/// The settings, as written in `capstan.yaml`, in the order of [`Settings`].
const SETTINGS: &[Setting] = &[
    Setting {
        key: "maxNodesInFlight",
        accepts: Accepts::Whole {
            unit: "nodes",
            min: 1,
        },
        default: "1",
        note: "with 0, no node would ever be upgraded",
    },
    Setting {
        key: "requirePullRequest",
        accepts: Accepts::Bool,
        default: "false",
        note: "",
    },
    Setting {
        key: "historyRetention",
        accepts: Accepts::Whole {
            unit: "records",
            min: 1,
        },
        default: "1000",
        note: "",
    },
    Setting {
        key: "prune",
        accepts: Accepts::Bool,
        default: "true",
        note: "",
    },
    Setting {
        key: "drift",
        accepts: Accepts::OneOf(&["revert", "warn"]),
        default: "revert",
        note: "",
    },
    Setting {
        key: "defaultNamespace",
        accepts: Accepts::Namespace,
        default: "\"default\"",
        note: "",
    },
    Setting {
        key: "nodeDrain",
        accepts: Accepts::Section(NODE_DRAIN),
        default: "",
        note: "",
    },
    Setting {
        key: "upgradeWindow",
        accepts: Accepts::Section(UPGRADE_WINDOW),
        default: "",
        note: "",
    },
    Setting {
        key: "notReadyTimeout",
        accepts: Accepts::Duration,
        default: "10m",
        note: "",
    },
    Setting {
        key: "rollout",
        accepts: Accepts::Mapping(
            "a mapping of paused, onFailure, failedNode, preflight, canary, windows, gates \
             (docs/guardrails.md)",
        ),
        default: "",
        note: "",
    },
];

fn keys(settings: &[Setting]) -> impl Iterator<Item = &'static str> + '_ {
    settings.iter().map(|setting| setting.key)
}

fn key_list(settings: &[Setting]) -> String {
    keys(settings).collect::<Vec<_>>().join(", ")
}

impl Setting {
    /// What the setting accepts, in words: `a whole number of minutes, 0 or more`.
    fn accepted(&self) -> String {
        match self.accepts {
            Accepts::Whole { unit, min } => format!("a whole number of {unit}, {min} or more"),
            Accepts::Bool => "true or false".to_string(),
            Accepts::OneOf(words) => words.join(" or "),
            Accepts::Namespace => "a namespace's name".to_string(),
            Accepts::Duration => "a duration such as 10m, 90s or 1h30m".to_string(),
            Accepts::Patterns => "a list of regular expressions".to_string(),
            Accepts::Section(settings) => format!("a mapping of {}", key_list(settings)),
            Accepts::Mapping(what) => what.to_string(),
        }
    }

    /// What the setting accepts, what a value means and its default, for an error.
    fn help(&self) -> String {
        let mut extra: Vec<String> = Vec::new();
        if !self.note.is_empty() {
            extra.push(self.note.to_string());
        }
        if !self.default.is_empty() {
            extra.push(format!("default {}", self.default));
        }
        if extra.is_empty() {
            self.accepted()
        } else {
            format!("{} ({})", self.accepted(), extra.join("; "))
        }
    }

    /// Why `node` is not a value of this setting; `None` when it is one (a section's own
    /// settings are checked apart). Values are taken as the YAML reader takes them: a
    /// quoted `"5"` is a number, a quoted `"true"` a boolean.
    fn refuses(&self, node: &Node) -> Option<String> {
        let refused = |found: String| Some(format!("{found} is not {}", self.help()));
        let value = &node.value;
        match (self.accepts, value) {
            (_, NodeValue::Null)
                if matches!(
                    self.accepts,
                    Accepts::Section(_) | Accepts::Patterns | Accepts::Mapping(_)
                ) =>
            {
                None
            }
            (_, NodeValue::Null) => Some(format!("no value; write {}", self.help())),
            (Accepts::Whole { min, .. }, NodeValue::Number(number)) => match number.as_u64() {
                Some(n) if n > u64::from(u32::MAX) => Some(format!(
                    "{n} is too large: {}, at most {}",
                    self.help(),
                    u32::MAX
                )),
                Some(n) if n >= u64::from(min) => None,
                _ => refused(number.to_string()),
            },
            (Accepts::Whole { min, .. }, NodeValue::String(text)) => {
                match text.trim().parse::<u32>() {
                    Ok(n) if n >= min => None,
                    _ => refused(format!("{text:?}")),
                }
            }
            (Accepts::Bool, NodeValue::Bool(_)) => None,
            (Accepts::Bool, NodeValue::String(text))
                if text.eq_ignore_ascii_case("true") || text.eq_ignore_ascii_case("false") =>
            {
                None
            }
            (Accepts::OneOf(words), NodeValue::String(text)) if words.contains(&text.as_str()) => {
                None
            }
            (
                Accepts::Namespace,
                NodeValue::String(_) | NodeValue::Number(_) | NodeValue::Bool(_),
            ) => None,
            (Accepts::Duration, NodeValue::String(_) | NodeValue::Number(_)) => {
                let text = scalar_text(value);
                match duration_text::deserialize(serde_json::Value::String(text)) {
                    Ok(_) => None,
                    Err(_) => refused(found(value)),
                }
            }
            (Accepts::Patterns, NodeValue::Sequence(_)) => None,
            (Accepts::Section(_) | Accepts::Mapping(_), NodeValue::Mapping(_)) => None,
            _ => refused(found(value)),
        }
    }
}

/// A scalar's text, as the YAML reader gives it to a string field.
fn scalar_text(value: &NodeValue) -> String {
    match value {
        NodeValue::String(text) => text.clone(),
        NodeValue::Number(number) => number.to_string(),
        NodeValue::Bool(b) => b.to_string(),
        _ => String::new(),
    }
}

/// A value as an error quotes it: `-1`, `"yes"`, `a list`.
fn found(value: &NodeValue) -> String {
    match value {
        NodeValue::Null => "no value".to_string(),
        NodeValue::Bool(b) => b.to_string(),
        NodeValue::Number(number) => number.to_string(),
        NodeValue::String(text) => format!("{text:?}"),
        NodeValue::Sequence(_) => "a list".to_string(),
        NodeValue::Mapping(_) => "a mapping".to_string(),
    }
}

/// A value a setting refuses: where, and why.
struct Refusal {
    path: FieldPath,
    line: usize,
    message: String,
}

/// Checks every entry of the mapping `entries`, at `path`, against `settings`, appending
/// what is refused to `refusals`.
fn check_mapping(
    entries: &[yaml::Entry],
    path: &FieldPath,
    settings: &[Setting],
    refusals: &mut Vec<Refusal>,
) {
    for entry in entries {
        let at = path.field(&entry.key);
        let Some(setting) = settings.iter().find(|s| s.key == entry.key) else {
            let message = match (
                closest_name(&entry.key, keys(settings)),
                path.names().next(),
            ) {
                (Some(meant), _) => format!("unknown setting; did you mean {meant}?"),
                (None, None) => format!("unknown setting; the settings are {}", key_list(settings)),
                (None, Some(_)) => format!(
                    "unknown setting; the settings of {path} are {}",
                    key_list(settings)
                ),
            };
            refusals.push(Refusal {
                path: at,
                line: entry.line,
                message,
            });
            continue;
        };
        if let Some(message) = setting.refuses(&entry.value) {
            refusals.push(Refusal {
                path: at,
                line: entry.line,
                message,
            });
            continue;
        }
        match (&setting.accepts, &entry.value.value) {
            (Accepts::Section(inner), NodeValue::Mapping(entries)) => {
                check_mapping(entries, &at, inner, refusals);
            }
            (Accepts::Patterns, NodeValue::Sequence(items)) => {
                for (index, item) in items.iter().enumerate() {
                    let refused = match &item.value {
                        NodeValue::String(_) | NodeValue::Number(_) | NodeValue::Bool(_) => None,
                        other => Some(found(other)),
                    };
                    if let Some(found) = refused {
                        refusals.push(Refusal {
                            path: at.index(index),
                            line: item.line,
                            message: format!("{found} is not a regular expression"),
                        });
                    }
                }
            }
            _ => {}
        }
    }
}

/// Reads `capstan.yaml` (`file` names it in errors); an empty file means the defaults.
///
/// Fails with every unknown setting (with a "did you mean") and every value a setting does
/// not accept, each with its path (`nodeDrain.timeOut`), line, and what it accepts; then
/// with every namespace or pattern that does not parse.
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
            format!("the settings must be a mapping of {}", key_list(SETTINGS)),
        )]);
    };
    let mut refusals = Vec::new();
    check_mapping(entries, &FieldPath::root(), SETTINGS, &mut refusals);
    if !refusals.is_empty() {
        return Err(refusals
            .into_iter()
            .map(|refusal| {
                let line = (refusal.line > 0).then_some(refusal.line);
                ManifestError::new(file, line, Some(refusal.path.to_string()), refusal.message)
            })
            .collect());
    }
    let settings: Settings = yaml::typed(text).map_err(|err| {
        // The table above let through a value the reader refuses: the setting written on
        // or above the error's line says what it accepts.
        let at = err
            .line
            .and_then(|line| setting_at(entries, SETTINGS, line));
        let (field, message) = match at {
            Some((path, setting)) => (
                Some(path.to_string()),
                format!("{}; write {}", err.message, setting.help()),
            ),
            None => (None, err.message),
        };
        vec![ManifestError::new(file, err.line, field, message)]
    })?;
    let range_errors = out_of_range(&settings)
        .into_iter()
        .map(|(path, message)| {
            let line = tree.line_of(&path);
            ManifestError::new(file, line, Some(path.to_string()), message)
        })
        .collect::<Vec<_>>();
    if range_errors.is_empty() {
        Ok(settings)
    } else {
        Err(range_errors)
    }
}

/// The setting written on or above `line` among `entries`, inside a section when the line
/// is in one, with its path.
fn setting_at(
    entries: &[yaml::Entry],
    settings: &'static [Setting],
    line: usize,
) -> Option<(FieldPath, &'static Setting)> {
    let entry = entries.iter().rev().find(|entry| entry.line <= line)?;
    let setting = settings.iter().find(|s| s.key == entry.key)?;
    let path = FieldPath::root().field(&entry.key);
    if let (Accepts::Section(inner), NodeValue::Mapping(entries)) =
        (setting.accepts, &entry.value.value)
        && let Some((inner_path, inner)) = setting_at(entries, inner, line)
    {
        let names: Vec<&str> = inner_path.names().flatten().collect();
        let path = names.iter().fold(path, |path, name| path.field(name));
        return Some((path, inner));
    }
    Some((path, setting))
}

/// The settings whose values are allowed by their type but not by their meaning, each
/// with its path (`nodeDrain.ignoredNamespacePatterns[0]`).
fn out_of_range(settings: &Settings) -> Vec<(FieldPath, String)> {
    let mut problems = Vec::new();
    if let Err(reason) = rules::dns_label(&settings.default_namespace) {
        problems.push((
            FieldPath::of(&["defaultNamespace"]),
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
            // regex's message draws a caret under the error on lines of its own.
            let err = err.to_string();
            let why = err.lines().last().unwrap_or_default().trim();
            let why = why.strip_prefix("error: ").unwrap_or(why);
            problems.push((
                FieldPath::of(&["nodeDrain", "ignoredNamespacePatterns"]).index(index),
                format!("{pattern:?} is not a regular expression: {why}"),
            ));
        }
    }
    problems.extend(super::rollout::problems(&settings.rollout));
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
                    upgradeWindow: {timeOut: 60, delayTrigger: 0}\nnotReadyTimeout: 90s\n";
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
                not_ready_timeout: std::time::Duration::from_secs(90),
                rollout: RolloutSettings::default(),
            }
        );
    }

    /// The keys of a value's JSON form, sorted.
    fn json_keys(value: impl Serialize) -> Vec<String> {
        let json = serde_json::to_value(value).unwrap();
        json.as_object().unwrap().keys().cloned().collect()
    }

    fn sorted(settings: &[Setting]) -> Vec<String> {
        let mut keys: Vec<String> = keys(settings).map(str::to_string).collect();
        keys.sort_unstable();
        keys
    }

    #[test]
    fn the_table_lists_every_setting_of_the_structs() {
        assert_eq!(json_keys(Settings::default()), sorted(SETTINGS));
        let drain = NodeDrain {
            ignored_namespace_patterns: vec!["^kube-".into()],
            ..NodeDrain::default()
        };
        assert_eq!(json_keys(drain), sorted(NODE_DRAIN));
        assert_eq!(json_keys(UpgradeWindow::default()), sorted(UPGRADE_WINDOW));
    }

    #[test]
    fn the_defaults_the_errors_name_are_the_defaults() {
        for setting in SETTINGS {
            let texts: Vec<String> = match setting.accepts {
                Accepts::Section(inner) => inner
                    .iter()
                    .map(|s| format!("{}:\n  {}: {}\n", setting.key, s.key, s.default))
                    .collect(),
                _ => vec![format!("{}: {}\n", setting.key, setting.default)],
            };
            for text in texts {
                assert_eq!(
                    parse("capstan.yaml", &text).unwrap(),
                    Settings::default(),
                    "{text}"
                );
            }
        }
    }

    #[test]
    fn values_are_taken_as_the_yaml_reader_takes_them() {
        let text = "nodeDrain: {timeOut: \"5\", disableDrainStrategies: \"True\", \
                    ignoredNamespacePatterns: [5]}\nupgradeWindow: ~\nprune: \"false\"\n\
                    defaultNamespace: 42\n";
        let settings = parse("capstan.yaml", text).unwrap();
        assert_eq!(settings.node_drain.time_out, 5);
        assert!(settings.node_drain.disable_drain_strategies);
        assert_eq!(settings.node_drain.ignored_namespace_patterns, ["5"]);
        assert_eq!(settings.upgrade_window, UpgradeWindow::default());
        assert!(!settings.prune);
        assert_eq!(settings.default_namespace, "42");
    }

    #[test]
    fn a_bad_value_is_named_by_its_path_and_line_with_what_is_accepted() {
        let file = "fleet/capstan.yaml";
        // (capstan.yaml, every error, whole or, ending in `…`, its beginning)
        let cases: &[(&str, &[&str])] = &[
            // nodeDrain
            (
                "nodeDrain: {timeOut: -1}\n",
                &[
                    "1: nodeDrain.timeOut: -1 is not a whole number of minutes, 0 or more (0: \
                     forced at once; default 45)",
                ],
            ),
            (
                "prune: true\nnodeDrain:\n  timeOut: 1.5\n",
                &[
                    "3: nodeDrain.timeOut: 1.5 is not a whole number of minutes, 0 or more (0: \
                     forced at once; default 45)",
                ],
            ),
            (
                "nodeDrain:\n  timeOut:\n",
                &[
                    "2: nodeDrain.timeOut: no value; write a whole number of minutes, 0 or more \
                     (0: forced at once; default 45)",
                ],
            ),
            (
                "nodeDrain: {timeOut: \"soon\"}\n",
                &["1: nodeDrain.timeOut: \"soon\" is not a whole number of minutes, 0 or more …"],
            ),
            (
                "nodeDrain: {timeOut: 4294967296}\n",
                &[
                    "1: nodeDrain.timeOut: 4294967296 is too large: a whole number of minutes, 0 \
                     or more (0: forced at once; default 45), at most 4294967295",
                ],
            ),
            (
                "nodeDrain: {timeOut: true}\n",
                &["1: nodeDrain.timeOut: true is not a whole number of minutes, 0 or more …"],
            ),
            (
                "nodeDrain:\n  expectedNodeDrainTime: -8\n",
                &[
                    "2: nodeDrain.expectedNodeDrainTime: -8 is not a whole number of minutes, 0 \
                     or more (default 8)",
                ],
            ),
            (
                "nodeDrain:\n  disableDrainStrategies: yes\n",
                &[
                    "2: nodeDrain.disableDrainStrategies: \"yes\" is not true or false (default \
                     false)",
                ],
            ),
            (
                "nodeDrain:\n  disableDrainStrategies: 1\n",
                &["2: nodeDrain.disableDrainStrategies: 1 is not true or false (default false)"],
            ),
            (
                "nodeDrain:\n  ignoredNamespacePatterns: ^kube-\n",
                &[
                    "2: nodeDrain.ignoredNamespacePatterns: \"^kube-\" is not a list of regular \
                     expressions (default [])",
                ],
            ),
            (
                "nodeDrain:\n  ignoredNamespacePatterns:\n    - ^kube-\n    - [a]\n    -\n",
                &[
                    "4: nodeDrain.ignoredNamespacePatterns[1]: a list is not a regular expression",
                    "5: nodeDrain.ignoredNamespacePatterns[2]: no value is not a regular \
                     expression",
                ],
            ),
            (
                "nodeDrain:\n  timeOut: 45\n  ignoredNamespacePatterns: [\"^kube-\", \"(open\"]\n",
                &[
                    "3: nodeDrain.ignoredNamespacePatterns[1]: \"(open\" is not a regular \
                     expression: unclosed group",
                ],
            ),
            (
                "nodeDrain: 5\n",
                &[
                    "1: nodeDrain: 5 is not a mapping of timeOut, expectedNodeDrainTime, \
                     disableDrainStrategies, ignoredNamespacePatterns",
                ],
            ),
            (
                "nodeDrain:\n  timeout: 5\n  grace: 5\n",
                &[
                    "2: nodeDrain.timeout: unknown setting; did you mean timeOut?",
                    "3: nodeDrain.grace: unknown setting; the settings of nodeDrain are timeOut, \
                     expectedNodeDrainTime, disableDrainStrategies, ignoredNamespacePatterns",
                ],
            ),
            // upgradeWindow
            (
                "upgradeWindow:\n  timeOut: -1\n",
                &[
                    "2: upgradeWindow.timeOut: -1 is not a whole number of minutes, 0 or more (0: \
                     no window; default 120)",
                ],
            ),
            (
                "upgradeWindow: {delayTrigger: 2h}\n",
                &[
                    "1: upgradeWindow.delayTrigger: \"2h\" is not a whole number of minutes, 0 or \
                     more (0: never said delayed; default 30)",
                ],
            ),
            (
                "upgradeWindow:\n  timeout: 5\n",
                &["2: upgradeWindow.timeout: unknown setting; did you mean timeOut?"],
            ),
            (
                "upgradeWindow: []\n",
                &["1: upgradeWindow: a list is not a mapping of timeOut, delayTrigger"],
            ),
            // The top level.
            (
                "prune: true\nmaxNodesInFlite: 2\ncolour: red\n",
                &[
                    "2: maxNodesInFlite: unknown setting; did you mean maxNodesInFlight?",
                    "3: colour: unknown setting; the settings are maxNodesInFlight, \
                     requirePullRequest, historyRetention, prune, drift, defaultNamespace, \
                     nodeDrain, upgradeWindow, notReadyTimeout, rollout",
                ],
            ),
            (
                "maxNodesInFlight: 0\nhistoryRetention: 0\n",
                &[
                    "1: maxNodesInFlight: 0 is not a whole number of nodes, 1 or more (with 0, no \
                     node would ever be upgraded; default 1)",
                    "2: historyRetention: 0 is not a whole number of records, 1 or more (default \
                     1000)",
                ],
            ),
            (
                "prune: true\nmaxNodesInFlight: -1\n",
                &["2: maxNodesInFlight: -1 is not a whole number of nodes, 1 or more …"],
            ),
            (
                "requirePullRequest: \"no\"\n",
                &["1: requirePullRequest: \"no\" is not true or false (default false)"],
            ),
            (
                "prune: yes\n",
                &["1: prune: \"yes\" is not true or false (default true)"],
            ),
            (
                "drift: Warn\n",
                &["1: drift: \"Warn\" is not revert or warn (default revert)"],
            ),
            (
                "drift:\n",
                &["1: drift: no value; write revert or warn (default revert)"],
            ),
            (
                "defaultNamespace: Fleet\n",
                &["1: defaultNamespace: \"Fleet\" is not a valid namespace: …"],
            ),
            (
                "defaultNamespace: [fleet]\n",
                &["1: defaultNamespace: a list is not a namespace's name (default \"default\")"],
            ),
            (
                "notReadyTimeout: 10\n",
                &[
                    "1: notReadyTimeout: 10 is not a duration such as 10m, 90s or 1h30m (default \
                     10m)",
                ],
            ),
            (
                "notReadyTimeout: -5m\n",
                &["1: notReadyTimeout: \"-5m\" is not a duration such as 10m, 90s or 1h30m …"],
            ),
            // Every bad value at once.
            (
                "nodeDrain: {timeOut: -1, expectedNodeDrainTime: -1}\nprune: maybe\n",
                &[
                    "1: nodeDrain.timeOut: -1 is not …",
                    "1: nodeDrain.expectedNodeDrainTime: -1 is not …",
                    "2: prune: \"maybe\" is not …",
                ],
            ),
            // The file as a whole.
            (
                "- prune\n",
                &[
                    "1: the settings must be a mapping of maxNodesInFlight, requirePullRequest, \
                     historyRetention, prune, drift, defaultNamespace, nodeDrain, upgradeWindow, \
                     notReadyTimeout, rollout",
                ],
            ),
            (
                "prune: true\n---\nprune: false\n",
                &["3: capstan.yaml holds one YAML document, the settings"],
            ),
            ("prune: [\n", &["1: invalid YAML (column 8)…"]),
        ];
        for (text, expected) in cases {
            let found = errors(text);
            assert_eq!(found.len(), expected.len(), "{text:?}: {found:#?}");
            for (error, expected) in found.iter().zip(expected.iter()) {
                let expected = format!("{file}:{expected}");
                match expected.strip_suffix('…') {
                    Some(start) => assert!(
                        error.starts_with(start),
                        "{text:?}:\n{error}\ndoes not start with\n{start}"
                    ),
                    None => assert_eq!(error, &expected, "{text:?}"),
                }
            }
        }
    }
}
