//! The DRA controller: a Module with `spec.dra` gets its DRA driver DaemonSet on the nodes
//! where the module is ready, one DaemonSet per version during an ordered upgrade, the
//! `dra-ready` label on the nodes where its driver runs ready, `status.dra`, and its
//! DeviceClasses where the cluster serves `resource.k8s.io/v1`. Only this controller runs;
//! the ready and version labels the other controllers would set are set here by hand.
//!
//! The embedded cluster serves no `resource.k8s.io` group: there the test checks that the
//! driver still runs and that the Module is told its DeviceClasses are not created. On a
//! real kube-apiserver (1.34 and later) it checks the DeviceClass, its driver parameters
//! kept whole.

use crate::common;
use crate::module_controller::{
    MODULE, NAMESPACE, Running, daemon_sets, field_managers, key, labelled_nodes, module_ready,
    module_status, modules, ready_pod_nodes, setup,
};

use std::collections::BTreeMap;

use capstan_api::managers;
use capstan_api::module::{DaemonSetStatus, Module};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::resource::v1::DeviceClass;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const CLASS: &str = "my-device-class";

/// KMM's docs Module "with DRA", at `version`.
fn module(version: &str) -> Module {
    serde_json::from_value(json!({
        "apiVersion": "kmm.sigs.x-k8s.io/v1beta1", "kind": "Module",
        "metadata": {"name": MODULE, "namespace": NAMESPACE},
        "spec": {
            "selector": {"node-role.kubernetes.io/worker": ""},
            "moduleLoader": {"container": {
                "version": version,
                "modprobe": {"moduleName": "my-kmod"},
                "kernelMappings": [{"regexp": "^.+$", "containerImage": "some.registry/org/my-kmod:${KERNEL_FULL_VERSION}"}],
            }},
            "dra": {
                "driverName": "dra.example.com",
                "container": {
                    "image": "some.registry/org/my-dra-driver:latest",
                    "env": [{"name": "MY_DRA_ENV_VAR", "value": "SOME_VALUE"}],
                },
                "deviceClasses": [{
                    "name": CLASS,
                    "selectors": [{"cel": {"expression": "device.driver == 'dra.example.com'"}}],
                    "config": [{"opaque": {
                        "driver": "dra.example.com",
                        "parameters": {"apiVersion": "dra.example.com/v1", "kind": "MyDeviceConfig", "spec": {"mode": "default"}},
                    }}],
                }],
            },
        },
    }))
    .expect("module")
}

/// The nodes carrying the Module's dra-ready label, sorted.
async fn dra_ready_nodes(client: &kube::Client) -> Vec<String> {
    labelled_nodes(client, &key().dra_ready_label()).await
}

/// The nodes running a ready DRA driver pod of `version`, sorted.
async fn driver_nodes(client: &kube::Client, version: &str) -> Vec<String> {
    let selector = format!(
        "kmm.node.kubernetes.io/role=dra,kmm.node.kubernetes.io/module.name={MODULE},{}={version}",
        key().version_device_plugin_label()
    );
    ready_pod_nodes(client, &selector).await
}

async fn dra_status(client: &kube::Client) -> Option<DaemonSetStatus> {
    module_status(client).await.map(|status| status.dra)
}

/// Whether the cluster serves `resource.k8s.io/v1` DeviceClasses.
async fn serves_device_classes(client: &kube::Client) -> bool {
    client
        .list_api_group_resources("resource.k8s.io/v1")
        .await
        .is_ok_and(|list| list.resources.iter().any(|r| r.name == "deviceclasses"))
}

async fn has_event(client: &kube::Client, reason: &str) -> bool {
    Api::<Event>::namespaced(client.clone(), NAMESPACE)
        .list(&ListParams::default())
        .await
        .expect("events")
        .items
        .iter()
        .any(|event| event.reason.as_deref() == Some(reason))
}

#[tokio::test]
async fn a_module_with_dra_runs_its_driver_per_version_with_its_status() {
    let (_cluster, client) = setup().await;
    let controller = Running::start(&client, "dra");
    modules(&client)
        .create(&PostParams::default(), &module("v1"))
        .await
        .expect("create module");
    module_ready(&client, "worker-1", Some("v1")).await;
    module_ready(&client, "worker-2", Some("v1")).await;

    common::wait_until("DaemonSet my-kmod-dra-v1", || async {
        daemon_sets(&client)
            .get_opt("my-kmod-dra-v1")
            .await
            .expect("get")
            .is_some()
    })
    .await;
    let ds = daemon_sets(&client)
        .get("my-kmod-dra-v1")
        .await
        .expect("DaemonSet");
    assert_eq!(
        ds.metadata.labels.clone().unwrap_or_default(),
        BTreeMap::from([
            ("kmm.node.kubernetes.io/role".to_string(), "dra".to_string()),
            (
                "kmm.node.kubernetes.io/module.name".to_string(),
                MODULE.to_string()
            ),
            (key().version_device_plugin_label(), "v1".to_string()),
        ])
    );
    let managers = field_managers(&ds);
    assert!(
        managers.contains(&managers::DRA.to_string()),
        "{managers:?}"
    );
    let pod = ds.spec.expect("spec").template.spec.expect("pod spec");
    assert_eq!(pod.host_network, Some(true));
    assert_eq!(
        pod.priority_class_name.as_deref(),
        Some("system-node-critical")
    );
    let driver = &pod.containers[0];
    assert_eq!(driver.name, "dra");
    let env: Vec<&str> = driver
        .env
        .iter()
        .flatten()
        .map(|var| var.name.as_str())
        .collect();
    assert_eq!(
        env,
        [
            "NODE_NAME",
            "POD_UID",
            "CDI_ROOT",
            "KUBELET_REGISTRAR_DIRECTORY_PATH",
            "KUBELET_PLUGINS_DIRECTORY_PATH",
            "HEALTHCHECK_PORT",
            "MY_DRA_ENV_VAR",
        ]
    );
    let probe = driver.liveness_probe.as_ref().and_then(|p| p.grpc.as_ref());
    assert_eq!(probe.map(|grpc| grpc.port), Some(51515));

    common::wait_until("DRA drivers ready on worker-1 and worker-2", || async {
        driver_nodes(&client, "v1").await == ["worker-1", "worker-2"]
    })
    .await;
    common::wait_until("dra-ready on worker-1 and worker-2", || async {
        dra_ready_nodes(&client).await == ["worker-1", "worker-2"]
    })
    .await;
    let want = DaemonSetStatus {
        nodes_matching_selector_number: 3,
        desired_number: 2,
        available_number: 2,
    };
    common::wait_until(&format!("status.dra {want:?}"), || async {
        dra_status(&client).await.as_ref() == Some(&want)
    })
    .await;

    if serves_device_classes(&client).await {
        let classes: Api<DeviceClass> = Api::all(client.clone());
        common::wait_until("DeviceClass my-device-class", || async {
            classes.get_opt(CLASS).await.expect("get").is_some()
        })
        .await;
        let class = classes.get(CLASS).await.expect("DeviceClass");
        let value = serde_json::to_value(&class).expect("json");
        assert_eq!(
            value["metadata"]["labels"]["kmm.node.kubernetes.io/module.namespace"],
            NAMESPACE
        );
        assert_eq!(
            value["spec"]["config"][0]["opaque"]["parameters"],
            json!({"apiVersion": "dra.example.com/v1", "kind": "MyDeviceConfig", "spec": {"mode": "default"}})
        );
    } else {
        // The embedded cluster has no resource.k8s.io: the driver runs all the same.
        common::wait_until("the DeviceClassesUnsupported Event", || async {
            has_event(&client, "DeviceClassesUnsupported").await
        })
        .await;
    }

    // v1 -> v2 on worker-1: the v2 driver starts there, the v1 DaemonSet stays for worker-2.
    modules(&client)
        .patch(
            MODULE,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"moduleLoader": {"container": {"version": "v2"}}}})),
        )
        .await
        .expect("version v2");
    module_ready(&client, "worker-1", Some("v2")).await;
    common::wait_until("DRA drivers: v2 on worker-1, v1 on worker-2", || async {
        driver_nodes(&client, "v2").await == ["worker-1"]
            && driver_nodes(&client, "v1").await == ["worker-2"]
    })
    .await;
    module_ready(&client, "worker-2", Some("v2")).await;
    common::wait_until("the v1 DaemonSet goes once it runs nowhere", || async {
        daemon_sets(&client)
            .get_opt("my-kmod-dra-v1")
            .await
            .expect("get")
            .is_none()
    })
    .await;
    common::wait_until("dra-ready on worker-1 and worker-2 at v2", || async {
        driver_nodes(&client, "v2").await == ["worker-1", "worker-2"]
            && dra_ready_nodes(&client).await == ["worker-1", "worker-2"]
    })
    .await;

    // spec.dra removed: the driver and its labels go, status.dra is zero.
    modules(&client)
        .patch(
            MODULE,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"dra": Value::Null}})),
        )
        .await
        .expect("remove dra");
    common::wait_until(
        "no DRA DaemonSet, no dra-ready label, status.dra zero",
        || async {
            let none = daemon_sets(&client)
                .list(&ListParams::default().labels("kmm.node.kubernetes.io/role=dra"))
                .await
                .expect("list")
                .items
                .is_empty();
            none && dra_ready_nodes(&client).await.is_empty()
                && dra_status(&client).await == Some(DaemonSetStatus::default())
        },
    )
    .await;
    if serves_device_classes(&client).await {
        let classes: Api<DeviceClass> = Api::all(client.clone());
        common::wait_until("DeviceClass my-device-class gone", || async {
            classes.get_opt(CLASS).await.expect("get").is_none()
        })
        .await;
    }

    modules(&client)
        .delete(MODULE, &DeleteParams::default())
        .await
        .expect("delete module");
    controller.stop().await;
}
