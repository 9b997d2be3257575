//! capstan's integration tests, one module per user-visible behaviour, in one test binary
//! (one link of the crate instead of one per module).

mod common;
mod fleet;
mod module_controller;
mod oracle;
mod registry;
mod upgrade;

mod action;
mod cluster_cli;
mod controllers_device_plugin;
mod high_availability;
mod install;
mod kmm_dra;
mod kmm_loading;
mod leaderworkersets;
mod nodekeeper;
mod nodes_that_leave;
mod ordered_upgrade;
mod ordered_upgrade_faults;
mod ordered_upgrade_kill;
mod ordered_upgrade_labels;
mod ordered_upgrade_restart;
mod plan_cli;
mod plan_fidelity;
mod plan_leaderworkersets;
mod plan_live_matches_offline;
mod rbac_requests;
mod sync_apply;
mod sync_bad_commits;
mod sync_cli;
mod sync_diff;
mod sync_drift;
mod sync_follow;
mod sync_invalid;
mod sync_restart;
mod sync_server;
mod sync_state_dir;
mod upgrade_campaigns;
mod upstream_oracle;
mod upstream_oracle_lws;
mod upstream_samples;
mod walkthroughs;
mod worker_cli;
mod worker_image;
