//! Upstream's own sample manifests, as a user copies them into a fleet repository, are
//! accepted: KMM v2.6.0's Modules (the annotated example and the device-plugin-only Module
//! of its docs, its lab and CI Modules) and main's DRA Modules (the DRA-only Module and the
//! example with DRA of its docs), LWS v0.10.0's LeaderWorkerSets (`config/samples`)
//! and managed-upgrade-operator's UpgradeConfig (README at commit 3e662ecd). `capstan plan`
//! creates them all without an error, a sync puts them in the embedded cluster with every
//! field kept, and KMM's `config/samples` Module, which upstream's own CRD refuses (no
//! kernel mapping), is refused here too.
//!
//! The samples are verbatim but for what the notes at each one say. In capstan an
//! `UpgradeConfig` is a campaign rolling out a Module version, so MUO's sample (which names
//! an OpenShift release) comes with a Module of capstan's at that version.

use crate::common;
use crate::fleet::{capstan, stdout};

use capstan::sync::run::Outcome;
use capstan_api::{LeaderWorkerSet, Module, UpgradeConfig};
use common::git::FleetRepo;
use kube::api::Api;
use serde_json::{Value, json};

/// KMM `docs/mkdocs/documentation/deploy_kmod.md`, "Example resource": a namespace added
/// (the docs' Modules share a name); the `inTreeModulesToRemove` lines dropped, because
/// upstream's webhook refuses them next to the deprecated `inTreeModuleToRemove` kept here;
/// `automountServiceAccountToken: false` added, as the same page's "Device plugin" section
/// describes it.
const KMM_DOCS_EXAMPLE: &str = r#"
apiVersion: kmm.sigs.x-k8s.io/v1beta1
kind: Module
metadata:
  name: my-kmod
  namespace: kmm-docs
spec:
  moduleLoader:
    container:
      modprobe:
        moduleName: my-kmod  # Required

        dirName: /opt  # Optional

        # Optional. Will copy /firmware/* on the node into the path specified
        # in the `kmm-operator-manager-config` at `worker.setFirmwareClassPath`
        # before `modprobe` is called to insert the kernel module..
        firmwarePath: /firmware

        parameters:  # Optional
          - param=1

        modulesLoadingOrder:  # optional
          - my-kmod
          - my_dep_a
          - my_dep_b

      imagePullPolicy: Always  # optional

      inTreeModuleToRemove: my-intree-kmod  # optional and deprecated, use inTreeModulesToRemove

      kernelMappings:  # At least one item is required
        - literal: 6.0.15-300.fc37.x86_64
          containerImage: some.registry/org/my-kmod:6.0.15-300.fc37.x86_64

        # For each node running a kernel matching the regexp below,
        # KMM will create a DaemonSet running the image specified in containerImage
        # with ${KERNEL_FULL_VERSION} replaced with the kernel version.
        - regexp: '^.+\fc37\.x86_64$'
          containerImage: "some.other.registry/org/my-kmod:${KERNEL_FULL_VERSION}"

        # For any other kernel, build the image using the Dockerfile in the my-kmod ConfigMap.
        - regexp: '^.+$'
          containerImage: "some.registry/org/my-kmod:${KERNEL_FULL_VERSION}"
          inTreeModuleToRemove: my-intree-kmod  # optional and deprecated, use inTreeModulesToRemove
          build:
            buildArgs:  # Optional
              - name: ARG_NAME
                value: some-value
            secrets:  # Optional
              - name: some-kubernetes-secret  # Will be available in the build environment at /run/secrets/some-kubernetes-secret.
            baseImageRegistryTLS:
              # Optional and not recommended! If true, the build will be allowed to pull the image in the Dockerfile's
              # FROM instruction using plain HTTP.
              insecure: false
              # Optional and not recommended! If true, the build will skip any TLS server certificate validation when
              # pulling the image in the Dockerfile's FROM instruction using plain HTTP.
              insecureSkipTLSVerify: false
            dockerfileConfigMap:  # Required
              name: my-kmod-dockerfile
          sign:
            certSecret:
              name: cert-secret  # Required
            keySecret:
              name: key-secret  # Required
            # Required when sign is set. Use absolute paths or Ash shell absolute globs (e.g. /opt/lib/modules/<kernel-version>/*.ko), see Secure Boot docs.
            filesToSign:
              - /opt/lib/modules/${KERNEL_FULL_VERSION}/my-kmod.ko
          registryTLS:
            # Optional and not recommended! If true, KMM will be allowed to check if the container image already exists
            # using plain HTTP.
            insecure: false
            # Optional and not recommended! If true, KMM will skip any TLS server certificate validation when checking if
            # the container image already exists.
            insecureSkipTLSVerify: false

  devicePlugin:  # Optional
    automountServiceAccountToken: false
    container:
      image: some.registry/org/device-plugin:latest  # Required if the devicePlugin section is present

      env:  # Optional
        - name: MY_DEVICE_PLUGIN_ENV_VAR
          value: SOME_VALUE

      volumeMounts:  # Optional
        - mountPath: /some/mountPath
          name: device-plugin-volume

    volumes:  # Optional
      - name: device-plugin-volume
        configMap:
          name: some-configmap

    serviceAccountName: sa-device-plugin  # Optional; created automatically if not set

  imageRepoSecret:  # Optional. Used to pull kmod and device plugin images
    name: secret-name

  # Optional. Change this value to force KMM to re-verify and potentially rebuild all module images.
  # See "Forcing module image rebuilds" section for details.
  imageRebuildTriggerGeneration: 1

  selector:
    node-role.kubernetes.io/worker: ""
"#;

/// KMM `deploy_kmod.md`, "Supporting Modules without OOT kmods", a namespace added.
const KMM_DOCS_DEVICE_PLUGIN_ONLY: &str = r#"
apiVersion: kmm.sigs.x-k8s.io/v1beta1
kind: Module
metadata:
  name: my-kmod
  namespace: kmm-device-plugin
spec:
  selector:
    node-role.kubernetes.io/worker: ""
  devicePlugin:
    container:
      image: some.registry/org/my-device-plugin:latest
"#;

/// KMM main (de3f8c9) `deploy_kmod.md`, "Supporting Modules without OOT kmods", the DRA
/// variant, a namespace added.
const KMM_DOCS_DRA_ONLY: &str = r#"
apiVersion: kmm.sigs.x-k8s.io/v1beta1
kind: Module
metadata:
  name: my-kmod
  namespace: kmm-dra-only
spec:
  selector:
    node-role.kubernetes.io/worker: ""
  dra:
    driverName: dra.example.com
    container:
      image: some.registry/org/my-dra-driver:latest
"#;

/// KMM main (de3f8c9) `deploy_kmod.md`, "Example resource with DRA", a namespace added.
const KMM_DOCS_DRA_EXAMPLE: &str = r#"
apiVersion: kmm.sigs.x-k8s.io/v1beta1
kind: Module
metadata:
  name: my-kmod
  namespace: kmm-dra
spec:
  moduleLoader:
    container:
      modprobe:
        moduleName: my-kmod
      kernelMappings:
        - regexp: '^.+$'
          containerImage: "some.registry/org/my-kmod:${KERNEL_FULL_VERSION}"

  dra:
    driverName: dra.example.com  # Required; must be a valid DNS subdomain

    container:
      image: some.registry/org/my-dra-driver:latest  # Required

      env:  # Optional
        - name: MY_DRA_ENV_VAR
          value: SOME_VALUE

      volumeMounts:  # Optional; appended to the auto-mounted volumes
        - mountPath: /some/mountPath
          name: dra-extra-volume

    initContainer:  # Optional
      image: some.registry/org/my-dra-init:latest

    volumes:  # Optional; appended to the auto-mounted volumes
      - name: dra-extra-volume
        configMap:
          name: some-configmap

    serviceAccountName: sa-dra-driver  # Optional; defaults to the namespace's default ServiceAccount if not set

    deviceClasses:  # Optional; list of DeviceClass resources to create
      - name: my-device-class
        selectors:  # Optional; restrict which devices match this class
          - cel:
              expression: "device.driver == 'dra.example.com'"
        config:  # Optional; per-device configuration
          - opaque:
              driver: dra.example.com
              parameters:
                apiVersion: dra.example.com/v1
                kind: MyDeviceConfig
                spec:
                  mode: default

  imageRepoSecret:  # Optional
    name: secret-name

  selector:
    node-role.kubernetes.io/worker: ""
"#;

/// KMM `ci/module-kmm-ci-build-sign.yaml`: in-cluster build and signing settings.
const KMM_CI_BUILD_SIGN: &str = r#"
---
apiVersion: kmm.sigs.x-k8s.io/v1beta1
kind: Module
metadata:
  name: kmm-ci
spec:
  moduleLoader:
    container:
      inTreeModulesToRemove:
        - dummy
      modprobe:
        moduleName: kmm_ci_a
        modulesLoadingOrder: [kmm_ci_a, kmm_ci_b]
      kernelMappings:
        - regexp: '^.+$'
          containerImage: host.minikube.internal:5000/$MOD_NAMESPACE/$MOD_NAME:$KERNEL_FULL_VERSION
          registryTLS:
            insecure: true
          build:
            baseImageRegistryTLS:
              insecure: true
            secrets:
              - name: build-secret
            dockerfileConfigMap:
              name: kmm-kmod-dockerfile
            # Optional. If kanikoParams.tag is empty, the default value will be: 'latest'
            kanikoParams:
              tag: "debug"
          sign:
            certSecret:
              name: kmm-kmod-signing-cert
            keySecret:
              name: kmm-kmod-signing-key
            unsignedImageRegistryTLS:
              insecure: true
            filesToSign:
              - /opt/lib/modules/${KERNEL_FULL_VERSION}/kmm_ci_?.ko
  selector:
    kubernetes.io/hostname: minikube
"#;

/// KMM `docs/mkdocs/lab/ubuntu/kmm-kmod.yaml`.
const KMM_LAB_UBUNTU: &str = r#"
apiVersion: kmm.sigs.x-k8s.io/v1beta1
kind: Module
metadata:
  name: kmm-ci-a
spec:
  moduleLoader:
    container:
      modprobe:
        moduleName: kmm-ci-a

      kernelMappings:
        - regexp: '^.+.generic$'
          containerImage: myimage.registry/kmmo-lab:1.0
          build:
            dockerfileConfigMap:
              name: build-module

  imageRepoSecret:
    name: my-repo-secret

  selector:
    kubernetes.io/hostname: worker2
"#;

/// KMM `config/samples/kmm.sigs.x-k8s.io_modules.yaml`: no kernel mapping, which upstream's
/// CRD (`minItems: 1`) refuses.
const KMM_CONFIG_SAMPLE: &str = r#"
apiVersion: kmm.sigs.x-k8s.io/v1beta1
kind: Module
metadata:
  name: module-sample
spec:
  moduleLoader:
    container:
      kernelMappings: []
      modprobe:
        moduleName: sample
  selector:
    node-role.kubernetes.io/worker: ""
"#;

/// LWS `config/samples/leaderworkerset_v1_leaderworkerset.yaml`.
const LWS_SAMPLE: &str = r#"
apiVersion: leaderworkerset.x-k8s.io/v1
kind: LeaderWorkerSet
metadata:
  labels:
    app.kubernetes.io/name: leaderworkerset
    app.kubernetes.io/instance: leaderworkerset-sample
    app.kubernetes.io/part-of: lws
    app.kubernetes.io/managed-by: kustomize
    app.kubernetes.io/created-by: lws
  name: leaderworkerset-sample
spec:
  rolloutStrategy:
    rollingUpdateConfiguration:
      maxUnavailable: 1
    type: RollingUpdate
  replicas: 3
  leaderWorkerTemplate:
    size: 4
    restartPolicy: RecreateGroupOnPodRestart
    workerTemplate:
      spec:
        containers:
        - name: nginx
          image: nginxinc/nginx-unprivileged:1.27
          resources:
            limits:
              cpu: "100m"
            requests:
              cpu: "50m"
          ports:
          - containerPort: 8080
"#;

/// LWS `config/samples/leaderworkerset_multi_template.yaml`.
const LWS_MULTI_TEMPLATE: &str = r#"
apiVersion: leaderworkerset.x-k8s.io/v1
kind: LeaderWorkerSet
metadata:
  labels:
    app.kubernetes.io/name: leaderworkerset
    app.kubernetes.io/instance: leaderworkerset-multi-template
    app.kubernetes.io/part-of: lws
    app.kubernetes.io/managed-by: kustomize
    app.kubernetes.io/created-by: lws
  name: leaderworkerset-multi-template
spec:
  replicas: 3
  leaderWorkerTemplate:
    leaderTemplate:
      spec:
        containers:
        - name: nginx2
          image: nginxinc/nginx-unprivileged:1.27
          resources:
            limits:
              cpu: "100m"
            requests:
              cpu: "50m"
          ports:
          - containerPort: 8080
    size: 4
    workerTemplate:
      spec:
        containers:
        - name: nginx
          image: nginxinc/nginx-unprivileged:1.27
          resources:
            limits:
              cpu: "100m"
            requests:
              cpu: "50m"
          ports:
          - containerPort: 8080
"#;

/// managed-upgrade-operator `README.md`, "Example 1".
const MUO_UPGRADE_CONFIG: &str = r#"
apiVersion: upgrade.managed.openshift.io/v1alpha1
kind: UpgradeConfig
metadata:
  name: managed-upgrade-config
spec:
  type: "OSD"
  upgradeAt: "2020-01-01T00:00:00Z"
  PDBForceDrainTimeout: 60
  capacityReservation: true
  desired:
    channel: "fast-4.4"
    version: "4.4.6"
"#;

/// A Module at the version MUO's sample rolls out: without one, capstan refuses the
/// campaign (it would roll out nothing).
const MODULE_AT_MUO_VERSION: &str = r#"
apiVersion: kmm.sigs.x-k8s.io/v1beta1
kind: Module
metadata:
  name: kmod-4-4-6
spec:
  selector:
    node-role.kubernetes.io/worker: ""
  moduleLoader:
    container:
      version: "4.4.6"
      modprobe:
        moduleName: my_kmod
      kernelMappings:
        - regexp: '^.+$'
          containerImage: "registry.example/my-kmod:4.4.6-${KERNEL_FULL_VERSION}"
"#;

/// The namespaces of the docs' Modules.
const NAMESPACES: &str = r#"
apiVersion: v1
kind: Namespace
metadata:
  name: kmm-docs
---
apiVersion: v1
kind: Namespace
metadata:
  name: kmm-device-plugin
---
apiVersion: v1
kind: Namespace
metadata:
  name: kmm-dra
---
apiVersion: v1
kind: Namespace
metadata:
  name: kmm-dra-only
"#;

/// The samples that upstream accepts, under `fleet/`.
fn samples() -> Vec<(&'static str, String)> {
    [
        ("fleet/namespaces.yaml", NAMESPACES),
        ("fleet/kmm/docs-example.yaml", KMM_DOCS_EXAMPLE),
        (
            "fleet/kmm/docs-device-plugin-only.yaml",
            KMM_DOCS_DEVICE_PLUGIN_ONLY,
        ),
        ("fleet/kmm/docs-dra-only.yaml", KMM_DOCS_DRA_ONLY),
        ("fleet/kmm/docs-dra-example.yaml", KMM_DOCS_DRA_EXAMPLE),
        ("fleet/kmm/ci-build-sign.yaml", KMM_CI_BUILD_SIGN),
        ("fleet/kmm/lab-ubuntu.yaml", KMM_LAB_UBUNTU),
        ("fleet/lws/sample.yaml", LWS_SAMPLE),
        ("fleet/lws/multi-template.yaml", LWS_MULTI_TEMPLATE),
        ("fleet/muo/upgrade-config.yaml", MUO_UPGRADE_CONFIG),
        ("fleet/muo/module.yaml", MODULE_AT_MUO_VERSION),
    ]
    .into_iter()
    .map(|(path, text)| (path, text.to_string()))
    .collect()
}

/// Every object the samples declare, as `kind namespace/name`, sorted.
const OBJECTS: [&str; 14] = [
    "LeaderWorkerSet default/leaderworkerset-multi-template",
    "LeaderWorkerSet default/leaderworkerset-sample",
    "Module default/kmm-ci",
    "Module default/kmm-ci-a",
    "Module default/kmod-4-4-6",
    "Module kmm-device-plugin/my-kmod",
    "Module kmm-docs/my-kmod",
    "Module kmm-dra-only/my-kmod",
    "Module kmm-dra/my-kmod",
    "Namespace /kmm-device-plugin",
    "Namespace /kmm-docs",
    "Namespace /kmm-dra",
    "Namespace /kmm-dra-only",
    "UpgradeConfig default/managed-upgrade-config",
];

/// `capstan plan --format json` of a pull request whose head is `head`, from a fleet
/// without manifests.
fn plan(head: &[(&str, String)]) -> (Option<i32>, Value) {
    let base = [("README.md", "# fleet".to_string())];
    let fleet = FleetRepo::proposal(&base, head);
    let output = capstan(
        fleet.path(),
        &[
            "plan",
            "--path",
            "fleet",
            "--detailed-exitcode",
            "--format",
            "json",
        ],
    );
    let plan = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|_| panic!("not JSON: {}", stdout(&output)));
    (output.status.code(), plan)
}

#[test]
fn upstream_samples_plan_as_creations_without_errors() {
    let (code, plan) = plan(&samples());
    assert_eq!(plan["errors"], json!([]), "{plan:#}");
    assert_eq!(code, Some(2), "{plan:#}");
    assert_eq!(plan["mode"], "offline");
    let mut objects: Vec<String> = plan["objects"]
        .as_array()
        .expect("objects")
        .iter()
        .map(|object| {
            assert_eq!(object["action"], "create", "{object:#}");
            let id = &object["id"];
            format!(
                "{} {}/{}",
                id["kind"].as_str().unwrap(),
                id["namespace"].as_str().unwrap_or_default(),
                id["name"].as_str().unwrap()
            )
        })
        .collect();
    objects.sort();
    assert_eq!(objects, OBJECTS);
}

#[test]
fn kmm_config_sample_without_kernel_mappings_is_refused_as_upstream_refuses_it() {
    let head = [("fleet/module.yaml", KMM_CONFIG_SAMPLE.to_string())];
    let (code, plan) = plan(&head);
    assert_eq!(code, Some(1), "{plan:#}");
    let errors = plan["errors"].as_array().expect("errors");
    assert_eq!(errors.len(), 1, "{plan:#}");
    assert_eq!(errors[0]["file"], "fleet/module.yaml", "{plan:#}");
    assert_eq!(
        errors[0]["field"], "spec.moduleLoader.container.kernelMappings",
        "{plan:#}"
    );
}

#[tokio::test]
async fn upstream_samples_sync_into_the_cluster_with_every_field() {
    let (_cluster, client) = common::start().await;
    let mut repo = FleetRepo::new();
    repo.commit_set(&samples(), "Add upstream samples");
    let mut syncer = common::syncer(&client, repo.path()).await;
    let report = match syncer.sync().await.expect("sync") {
        Outcome::Applied(report) => report,
        other => panic!("expected an applied commit, got {other:?}"),
    };
    assert_eq!(report.count("created"), OBJECTS.len(), "{report:?}");

    let modules = |namespace: &str| Api::<Module>::namespaced(client.clone(), namespace);
    let docs = modules("kmm-docs")
        .get("my-kmod")
        .await
        .expect("docs example");
    assert_eq!(docs.spec.image_rebuild_trigger_generation, Some(1));
    let plugin = docs.spec.device_plugin.as_ref().expect("device plugin");
    assert_eq!(plugin.automount_service_account_token, Some(false));
    let container = &docs.spec.module_loader.as_ref().expect("loader").container;
    assert_eq!(container.in_tree_module_to_remove, "my-intree-kmod");
    assert_eq!(
        container.kernel_mappings[2].in_tree_module_to_remove,
        "my-intree-kmod"
    );
    assert_eq!(container.modprobe.modules_loading_order.len(), 3);

    let plugin_only = modules("kmm-device-plugin")
        .get("my-kmod")
        .await
        .expect("plugin only");
    assert_eq!(plugin_only.spec.module_loader, None);

    let dra_only = modules("kmm-dra-only")
        .get("my-kmod")
        .await
        .expect("DRA only");
    let dra = dra_only.spec.dra.as_ref().expect("dra");
    assert_eq!(dra.driver_name, "dra.example.com");
    assert_eq!(dra_only.spec.module_loader, None);

    let with_dra = modules("kmm-dra")
        .get("my-kmod")
        .await
        .expect("DRA example");
    let dra = with_dra.spec.dra.as_ref().expect("dra");
    assert_eq!(dra.service_account_name, "sa-dra-driver");
    assert_eq!(
        dra.init_container.as_ref().map(|init| init.image.as_str()),
        Some("some.registry/org/my-dra-init:latest")
    );
    assert_eq!(dra.container.env[0].name, "MY_DRA_ENV_VAR");
    assert_eq!(dra.volumes[0].name, "dra-extra-volume");
    let class = &dra.device_classes[0];
    assert_eq!(class.name, "my-device-class");
    assert_eq!(
        class.selectors[0]
            .cel
            .as_ref()
            .map(|cel| cel.expression.as_str()),
        Some("device.driver == 'dra.example.com'")
    );
    // The driver's parameters are kept whole, not pruned to `{}`.
    let parameters = &class.config[0].opaque.as_ref().expect("opaque").parameters;
    assert_eq!(
        serde_json::to_value(parameters).expect("parameters"),
        json!({"apiVersion": "dra.example.com/v1", "kind": "MyDeviceConfig", "spec": {"mode": "default"}})
    );

    let ci = modules("default").get("kmm-ci").await.expect("CI Module");
    let container = &ci.spec.module_loader.as_ref().expect("loader").container;
    assert_eq!(container.in_tree_modules_to_remove, ["dummy"]);
    let build = container.kernel_mappings[0].build.as_ref().expect("build");
    assert_eq!(
        build
            .kaniko_params
            .as_ref()
            .map(|params| params.tag.as_str()),
        Some("debug")
    );
    modules("default")
        .get("kmm-ci-a")
        .await
        .expect("lab Module");

    let sets: Api<LeaderWorkerSet> = Api::namespaced(client.clone(), "default");
    let sample = sets
        .get("leaderworkerset-sample")
        .await
        .expect("LWS sample");
    assert_eq!(sample.spec.replicas, 3);
    assert_eq!(sample.spec.leader_worker_template.size, 4);
    let multi = sets
        .get("leaderworkerset-multi-template")
        .await
        .expect("LWS multi-template sample");
    assert!(multi.spec.leader_worker_template.leader_template.is_some());

    let upgrades: Api<UpgradeConfig> = Api::namespaced(client.clone(), "default");
    let upgrade = upgrades
        .get("managed-upgrade-config")
        .await
        .expect("UpgradeConfig");
    assert!(upgrade.spec.capacity_reservation);
    assert_eq!(upgrade.spec.desired.version, "4.4.6");
    assert_eq!(upgrade.spec.pdb_force_drain_timeout, 60);
}
