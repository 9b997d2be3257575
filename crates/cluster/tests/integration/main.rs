//! The embedded cluster's integration tests: its Kubernetes API (`api_*`) and its node and
//! workload simulation (`sim_*`), in one test binary.

/// The shared test support under one name: waits from `capstan_testing`, the cluster's own
/// test API from `capstan_cluster::testing`.
mod common {
    pub use capstan_cluster::testing::*;
    pub use capstan_testing::*;
}

mod api_bad_input;
mod api_custom_resources;
mod api_deletion;
mod api_eviction;
mod api_field_validation;
mod api_null_merge_patch;
mod api_objects;
mod api_openapi_schemas;
mod api_patch;
mod api_persistence;
mod api_scale_subresource;
mod api_schema_validation;
mod api_secret_string_data;
mod api_selectors;
mod api_server_side_apply;
mod api_watch;
mod api_wrong_types;
mod kubectl_at_the_zero_setup_cluster;
mod requests;
mod sim_container_restart;
mod sim_controller_events;
mod sim_drain;
mod sim_foreground_deletion_of_pods;
mod sim_headless_service;
mod sim_kubelet;
mod sim_nodes;
mod sim_pod_status_written_by_a_client;
mod sim_statefulset_ordinals_and_partition;
mod sim_workloads;
