//! The repository settings a plan checks: how many nodes move at once, and whether
//! version-label changes must come through a pull request.

use super::model::{CheckStatus, Policy, PullRequestCheck};
use crate::sync::manifests::Settings;

/// The policy section of a plan: head's settings, the rollout's waves, and the
/// `requirePullRequest` check for a plan with version-label moves (`moves`) made for
/// `pull_request`.
pub fn policy(
    settings: &Settings,
    waves: Vec<Vec<String>>,
    moves: bool,
    pull_request: Option<u64>,
) -> Policy {
    Policy {
        max_nodes_in_flight: settings.max_nodes_in_flight,
        waves,
        require_pull_request: pull_request_check(
            settings.require_pull_request,
            moves,
            pull_request,
        ),
        prune: settings.prune,
        guardrails: None,
    }
}

/// A plan for a pull request satisfies `requirePullRequest`, since merging it makes a
/// pull-request merge commit; a plan of any other range does not, and its version-label
/// changes would be reported by the sync but not acted on.
pub fn pull_request_check(
    required: bool,
    moves: bool,
    pull_request: Option<u64>,
) -> PullRequestCheck {
    let (status, message) = match (required, moves, pull_request) {
        (false, _, _) => (CheckStatus::Ok, "not required".to_string()),
        (true, false, _) => (CheckStatus::Ok, "no version label changes".to_string()),
        (true, true, Some(number)) => (
            CheckStatus::Ok,
            format!("satisfied: merging pull request #{number} makes a pull-request merge commit"),
        ),
        (true, true, None) => (
            CheckStatus::Warning,
            "these version label changes will not be acted on: requirePullRequest is set and \
             this range is not a pull request; merge them through one"
                .to_string(),
        ),
    };
    PullRequestCheck {
        required,
        status,
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn require_pull_request_decision_table() {
        let cases = [
            (false, true, None, CheckStatus::Ok, "not required"),
            (
                true,
                false,
                None,
                CheckStatus::Ok,
                "no version label changes",
            ),
            (true, true, Some(42), CheckStatus::Ok, "pull request #42"),
            (
                true,
                true,
                None,
                CheckStatus::Warning,
                "will not be acted on",
            ),
        ];
        for (required, moves, pull_request, status, message) in cases {
            let check = pull_request_check(required, moves, pull_request);
            assert_eq!(check.status, status, "{required} {moves} {pull_request:?}");
            assert!(check.message.contains(message), "{}", check.message);
        }
    }
}
