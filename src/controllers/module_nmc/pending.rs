//! What the Module -> NMC controller still has to do, as `capstan sync --once` waits for
//! it: every NMC's spec is what the Modules ask for on its node ([`decide`] would change
//! nothing), and no Module is waiting on its finalizer.

use std::collections::BTreeMap;

use super::{EntryAction, ModuleFacts, decide};
use crate::controllers::node::NodeFacts;
use capstan_api::nmc::NodeModulesConfig;

/// One line per Module being deleted and per (node, Module) whose NMC entry is not as it
/// should be yet.
pub fn pending(
    modules: &[ModuleFacts],
    nodes: &[NodeFacts],
    nmcs: &BTreeMap<String, NodeModulesConfig>,
) -> Vec<String> {
    let mut pending = Vec::new();
    for module in modules {
        if module.deleting() {
            pending.push(format!("Module {} is being deleted", module.key));
            continue;
        }
        for node in nodes {
            let current = nmcs
                .get(&node.name)
                .and_then(|nmc| nmc.spec_module(&module.key));
            if let Ok(decision) = decide(module, node, current)
                && decision.action != EntryAction::Unchanged
            {
                pending.push(format!(
                    "NMC {} does not list Module {} as it should yet",
                    node.name, module.key
                ));
            }
        }
    }
    pending
}
