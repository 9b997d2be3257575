//! Conflicts: the fields an apply would take from other managers, and the message
//! upstream answers a refused apply with.

use std::fmt;

use serde_json::{Map, Value, json};

use super::managed_fields::{ManagedEntry, Operation};
use crate::patch::fieldset::{FieldSet, path_text};

/// A field an apply would change that another manager owns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conflict {
    /// The manager that owns the field.
    pub manager: String,
    /// The field, in upstream notation: `.spec.replicas`, `.spec.containers[name="app"].image`.
    pub field: String,
    /// How the owner wrote the field.
    pub operation: Operation,
    /// The apiVersion the owner wrote the field with.
    pub api_version: String,
    /// The subresource the owner wrote through, if any.
    pub subresource: Option<String>,
}

impl Conflict {
    /// The owner as upstream names it in messages: `"kubectl-client-side-apply" using
    /// apps/v1` for an update, `"kubectl"` for an apply, with `with subresource
    /// "status"` after the name when written through one.
    pub fn owner(&self) -> String {
        let mut owner = format!("{:?}", self.manager);
        if let Some(subresource) = &self.subresource {
            owner.push_str(&format!(" with subresource {subresource:?}"));
        }
        if self.operation == Operation::Update {
            owner.push_str(&format!(" using {}", self.api_version));
        }
        owner
    }

    // Upstream groups and sorts conflicts by the JSON that identifies the owner.
    fn owner_identity(&self) -> String {
        let mut identity = Map::new();
        identity.insert("manager".into(), json!(self.manager));
        identity.insert("operation".into(), json!(self.operation.as_str()));
        if self.operation == Operation::Update {
            identity.insert("apiVersion".into(), json!(self.api_version));
        }
        if let Some(subresource) = &self.subresource {
            identity.insert("subresource".into(), json!(subresource));
        }
        Value::Object(identity).to_string()
    }
}

/// The message of the conflict's status cause (whose `field` is [`Conflict::field`]).
impl fmt::Display for Conflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "conflict with {}", self.owner())
    }
}

impl ManagedEntry {
    /// The fields of `written` this entry owns, as conflicts.
    pub(super) fn conflicts(&self, written: &FieldSet) -> Vec<Conflict> {
        self.fields
            .intersection(written)
            .paths()
            .iter()
            .map(|path| Conflict {
                manager: self.manager.clone(),
                field: path_text(path),
                operation: self.operation,
                api_version: self.api_version.clone(),
                subresource: self.subresource.clone(),
            })
            .collect()
    }
}

/// Why an apply was refused.
#[derive(Debug, thiserror::Error)]
pub enum ServerSideApplyError {
    /// The apply would change fields other managers own; retry with force to take them.
    #[error("{}", conflicts_message(.0))]
    Conflicts(Vec<Conflict>),
    /// The apply configuration or the stored managed fields cannot be used.
    #[error("{0}")]
    Invalid(String),
}

/// Upstream's message: one conflict inline, several grouped by owner.
fn conflicts_message(conflicts: &[Conflict]) -> String {
    if let [only] = conflicts {
        return format!(
            "Apply failed with 1 conflict: conflict with {}: {}",
            only.owner(),
            only.field
        );
    }
    let mut groups: Vec<(String, String, Vec<&str>)> = Vec::new();
    for conflict in conflicts {
        let identity = conflict.owner_identity();
        match groups.iter_mut().find(|group| group.0 == identity) {
            Some(group) => group.2.push(&conflict.field),
            None => groups.push((identity, conflict.owner(), vec![&conflict.field])),
        }
    }
    groups.sort_by(|a, b| a.0.cmp(&b.0));
    let lines: Vec<String> = groups
        .iter()
        .flat_map(|(_, owner, fields)| {
            std::iter::once(format!("conflicts with {owner}:"))
                .chain(fields.iter().map(|field| format!("- {field}")))
        })
        .collect();
    format!(
        "Apply failed with {} conflicts: {}",
        conflicts.len(),
        lines.join("\n")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::patch::apply::apply;
    use crate::patch::apply::tests::*;
    use crate::patch::apply::update::track_update;
    use crate::schema::BuiltinSchema;

    #[test]
    fn applying_a_field_another_manager_owns() {
        struct Case {
            scenario: &'static str,
            theirs: i64,
            mine: i64,
            force: bool,
            replicas: Option<i64>,
            owners: &'static [&'static str],
        }
        let cases = [
            Case {
                scenario: "the same value is shared",
                theirs: 3,
                mine: 3,
                force: false,
                replicas: Some(3),
                owners: &["alice", "bob"],
            },
            Case {
                scenario: "a different value conflicts",
                theirs: 3,
                mine: 5,
                force: false,
                replicas: None,
                owners: &[],
            },
            Case {
                scenario: "force takes the field",
                theirs: 3,
                mine: 5,
                force: true,
                replicas: Some(5),
                owners: &["bob"],
            },
        ];
        for case in cases {
            let live = applied_in_turn(&[("alice", deployment(json!({"replicas": case.theirs})))]);
            let config = deployment(json!({"replicas": case.mine}));

            let result = apply(
                Some(&live),
                &config,
                "bob",
                case.force,
                &BuiltinSchema,
                NOW,
                None,
            );

            match (result, case.replicas) {
                (Ok(object), Some(replicas)) => {
                    assert_eq!(
                        object["spec"]["replicas"],
                        json!(replicas),
                        "{}",
                        case.scenario
                    );
                    assert_eq!(
                        owners_of(&object, ".spec.replicas"),
                        case.owners,
                        "{}",
                        case.scenario
                    );
                }
                (Err(ServerSideApplyError::Conflicts(conflicts)), None) => {
                    let message = ServerSideApplyError::Conflicts(conflicts.clone()).to_string();
                    assert_eq!(
                        message,
                        r#"Apply failed with 1 conflict: conflict with "alice": .spec.replicas"#,
                        "{}",
                        case.scenario
                    );
                    assert_eq!(conflicts[0].manager, "alice");
                    assert_eq!(conflicts[0].to_string(), r#"conflict with "alice""#);
                }
                (other, _) => panic!("{}: unexpected {other:?}", case.scenario),
            }
        }
    }

    #[test]
    fn a_forced_apply_leaves_the_other_manager_its_other_fields() {
        let live =
            applied_in_turn(&[("alice", deployment(json!({"replicas": 3, "paused": false})))]);
        let config = deployment(json!({"replicas": 5}));

        let object = apply(Some(&live), &config, "bob", true, &BuiltinSchema, NOW, None).unwrap();

        assert_eq!(owned(&object, "alice"), [".spec.paused"]);
        assert_eq!(owned(&object, "bob"), [".spec.replicas"]);
    }

    #[test]
    fn kubectl_create_then_a_differing_server_side_apply_conflicts() {
        let created = track_update(
            None,
            deployment(json!({"replicas": 3, "minReadySeconds": 10})),
            "kubectl-client-side-apply",
            &BuiltinSchema,
            EARLIER,
            None,
        );

        let err = apply_as(
            Some(&created),
            &deployment(json!({"replicas": 5})),
            "kubectl",
        )
        .unwrap_err();

        assert_eq!(
            err.to_string(),
            r#"Apply failed with 1 conflict: conflict with "kubectl-client-side-apply" using apps/v1: .spec.replicas"#
        );
        let ServerSideApplyError::Conflicts(conflicts) = err else {
            panic!("expected conflicts");
        };
        assert_eq!(
            conflicts,
            [Conflict {
                manager: "kubectl-client-side-apply".into(),
                field: ".spec.replicas".into(),
                operation: Operation::Update,
                api_version: "apps/v1".into(),
                subresource: None,
            }]
        );
        assert_eq!(
            conflicts[0].to_string(),
            r#"conflict with "kubectl-client-side-apply" using apps/v1"#
        );
    }

    #[test]
    fn several_conflicts_are_grouped_by_owner_as_upstream_prints_them() {
        let created = track_update(
            None,
            deployment(json!({"replicas": 3, "minReadySeconds": 10})),
            "kubectl-client-side-apply",
            &BuiltinSchema,
            EARLIER,
            None,
        );
        let live = apply_as(
            Some(&created),
            &deployment(json!({"paused": true})),
            "other",
        )
        .unwrap();
        let config = deployment(json!({"replicas": 5, "minReadySeconds": 0, "paused": false}));

        let err = apply_as(Some(&live), &config, "kubectl").unwrap_err();

        assert_eq!(
            err.to_string(),
            "Apply failed with 3 conflicts: \
             conflicts with \"kubectl-client-side-apply\" using apps/v1:\n\
             - .spec.minReadySeconds\n\
             - .spec.replicas\n\
             conflicts with \"other\":\n\
             - .spec.paused"
        );
    }
}
