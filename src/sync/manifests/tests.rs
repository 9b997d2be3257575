//! `load` and `check_transition` on whole commits, one test per question a user would ask.

use serde_json::json;

use super::*;
use capstan_testing::manifests::{module, node_label};

const MODULE_V1: &str = r#"apiVersion: kmm.sigs.x-k8s.io/v1beta1
kind: Module
metadata: {name: my-kmod, namespace: kmm-demo}
spec:
  selector: {node-role.kubernetes.io/worker: ""}
  moduleLoader:
    container:
      version: "v1"
      modprobe: {moduleName: my_kmod, dirName: /opt, firmwarePath: /firmware, parameters: [param=1]}
      kernelMappings:
        - literal: 6.0.15-300.fc37.x86_64
          containerImage: registry.example/org/my-kmod:v1-6.0.15
        - regexp: '^.+$'
          containerImage: "registry.example/org/my-kmod:v1-${KERNEL_FULL_VERSION}"
  devicePlugin:
    container: {image: registry.example/org/device-plugin:v1}
"#;

/// The files of a commit: path and contents.
type Commit<'a> = Vec<(&'a str, String)>;

const VERSION_LABEL: &str = "kmm.node.kubernetes.io/version-module.kmm-demo.my-kmod";

fn files<'a>(list: &'a [(&'a str, String)]) -> Vec<ManifestFile<'a>> {
    list.iter()
        .map(|(path, text)| ManifestFile {
            path,
            contents: text.as_bytes(),
        })
        .collect()
}

fn load_all(list: &[(&str, String)]) -> Result<DesiredState, Vec<ManifestError>> {
    load(&files(list), "", &StaticCatalog::new())
}

/// The errors of a commit that must be rejected, as displayed.
fn rejected(list: &[(&str, String)]) -> Vec<String> {
    match load_all(list) {
        Ok(state) => panic!(
            "accepted: {:?}",
            state.manifests.iter().map(Manifest::id).collect::<Vec<_>>()
        ),
        Err(errors) => errors.iter().map(ToString::to_string).collect(),
    }
}

/// Asserts that `found` has exactly one error per expected prefix, in order.
fn assert_errors(found: &[String], expected: &[&str]) {
    assert_eq!(found.len(), expected.len(), "{found:#?}");
    for (error, prefix) in found.iter().zip(expected) {
        assert!(
            error.starts_with(prefix),
            "{error}\n  does not start with\n{prefix}"
        );
    }
}

#[test]
fn a_fleet_repository_loads_in_path_order() {
    let list = [
        (
            "fleet/nodes/worker-2.yaml",
            node_label("worker-2", "my-kmod", "v1"),
        ),
        ("fleet/modules/my-kmod.yaml", MODULE_V1.to_string()),
        (
            "fleet/nodes/worker-1.yaml",
            format!(
                "# first worker\n---\n{}---\n",
                node_label("worker-1", "my-kmod", "v1")
            ),
        ),
        (
            "fleet/config.yml",
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\ndata: {k: v}\n---\n\
             apiVersion: v1\nkind: Namespace\nmetadata: {name: kmm-demo}\n"
                .to_string(),
        ),
        (
            "fleet/capstan.yaml",
            "maxNodesInFlight: 2\ndefaultNamespace: fleet\n".to_string(),
        ),
    ];
    let state = load(&files(&list), "fleet/", &StaticCatalog::new()).unwrap();
    let ids: Vec<String> = state.manifests.iter().map(|m| m.id().to_string()).collect();
    assert_eq!(
        ids,
        [
            "ConfigMap fleet/a",
            "Namespace kmm-demo",
            "Module kmm-demo/my-kmod",
            "Node worker-1",
            "Node worker-2",
        ]
    );
    let lines: Vec<(&str, usize)> = state
        .manifests
        .iter()
        .map(|m| (m.file.as_str(), m.line))
        .collect();
    assert_eq!(
        lines,
        [
            ("fleet/config.yml", 1),
            ("fleet/config.yml", 6),
            ("fleet/modules/my-kmod.yaml", 1),
            ("fleet/nodes/worker-1.yaml", 3),
            ("fleet/nodes/worker-2.yaml", 1),
        ]
    );
    assert_eq!(state.settings.max_nodes_in_flight, 2);
    // The default namespace is written into the object that will be applied.
    assert_eq!(
        state.manifests[0].object["metadata"]["namespace"],
        json!("fleet")
    );
    assert_eq!(
        state.manifests[2].id(),
        ObjectId {
            group: "kmm.sigs.x-k8s.io".to_string(),
            kind: "Module".to_string(),
            namespace: Some("kmm-demo".to_string()),
            name: "my-kmod".to_string(),
        }
    );
    assert_eq!(
        state.manifests[3].object["metadata"]["labels"][VERSION_LABEL],
        json!("v1")
    );
}

#[test]
fn the_order_of_the_files_given_does_not_matter() {
    let list = [
        ("b.yaml", node_label("worker-1", "my-kmod", "v1")),
        ("a.yaml", MODULE_V1.to_string()),
        ("c/d.yaml", node_label("worker-2", "my-kmod", "v1")),
        (
            "c/capstan.yaml",
            "apiVersion: v1\nkind: Node\nmetadata: {name: worker-3}\n".to_string(),
        ),
    ];
    let forward = load_all(&list).unwrap();
    let mut reversed = list.clone();
    reversed.reverse();
    assert_eq!(load_all(&reversed).unwrap(), forward);

    let broken = [
        ("b.yaml", "kind: Node\n".to_string()),
        ("a.yaml", "apiVersion: v1\n".to_string()),
    ];
    let mut reversed = broken.clone();
    reversed.reverse();
    assert_eq!(
        load_all(&broken).unwrap_err(),
        load_all(&reversed).unwrap_err()
    );
}

#[test]
fn only_yaml_files_under_the_path_are_manifests() {
    let list = [
        ("fleet/a.yaml", node_label("worker-1", "my-kmod", "v1")),
        ("fleet/m.yaml", MODULE_V1.to_string()),
        ("fleet/README.md", "not yaml: [".to_string()),
        ("fleet/.github/workflows/ci.yml", "on: push\n".to_string()),
        ("fleet/.hidden.yaml", "garbage: [".to_string()),
        ("fleetwood/x.yaml", "garbage: [".to_string()),
        ("other/x.yaml", "garbage: [".to_string()),
        ("capstan.yaml", "garbage: [".to_string()),
        ("fleet/capstan.yaml", "prune: false\n".to_string()),
        // Only the settings file at the root of the path is special.
        (
            "fleet/sub/capstan.yaml",
            "apiVersion: v1\nkind: Node\nmetadata: {name: worker-2}\n".to_string(),
        ),
    ];
    for path in ["fleet", "fleet/", "./fleet", "/fleet/"] {
        let state = load(&files(&list), path, &StaticCatalog::new()).unwrap();
        let names: Vec<&str> = state.manifests.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names, ["worker-1", "my-kmod", "worker-2"], "{path}");
        assert!(!state.settings.prune);
    }
}

#[test]
fn documents_without_a_header_are_rejected_naming_the_field() {
    let cases: &[(&str, &str)] = &[
        ("- a\n- b\n", "x.yaml:1: a manifest must be a mapping"),
        ("just text\n", "x.yaml:1: a manifest must be a mapping"),
        (
            "kind: Node\nmetadata: {name: a}\n",
            "x.yaml:1: apiVersion: required field is missing",
        ),
        (
            "apiVersion: v1\nmetadata: {name: a}\n",
            "x.yaml:1: kind: required field is missing",
        ),
        (
            "apiVersion: v1\nkind: Node\n",
            "x.yaml:1: metadata.name: required field is missing",
        ),
        (
            "apiVersion: v1\nkind: Node\nmetadata:\n  labels: {}\n",
            "x.yaml:3: metadata.name: required field is missing",
        ),
        (
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  generateName: a-\n",
            "x.yaml:3: metadata.name: required field is missing (generateName cannot be used",
        ),
        (
            "apiVersion: 1\nkind: Node\nmetadata: {name: a}\n",
            "x.yaml:1: apiVersion: must be a string",
        ),
        (
            "apiVersion: v1\nkind: Node\nmetadata: [a]\n",
            "x.yaml:3: metadata: must be a mapping",
        ),
        (
            "apiVersion: v1\nkind: Node\nmetadata:\n  name: 7\n",
            "x.yaml:4: metadata.name: must be a string",
        ),
        (
            "apiVersion: v1\nkind: ''\nmetadata: {name: a}\n",
            "x.yaml:2: kind: required field is empty",
        ),
    ];
    for (text, expected) in cases {
        assert_errors(&rejected(&[("x.yaml", text.to_string())]), &[expected]);
    }
}

#[test]
fn yaml_syntax_errors_name_line_and_column() {
    let found = rejected(&[(
        "nodes.yaml",
        format!(
            "{}---\napiVersion: v1\nkind: Node\nmetadata:\n  name: [worker-2\n",
            node_label("worker-1", "my-kmod", "v1")
        ),
    )]);
    assert_errors(&found, &["nodes.yaml:11: invalid YAML (column "]);
    assert!(found[0].contains("bracket"), "{found:?}");
}

#[test]
fn oversized_files_and_commits_are_rejected() {
    let big = format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: big}}\ndata:\n  a: \"{}\"\n",
        "x".repeat(MAX_FILE_BYTES)
    );
    assert_errors(
        &rejected(&[("big.yaml", big)]),
        &["big.yaml: the file has 1048643 bytes, over the limit of 1048576 bytes (1 MiB)"],
    );

    let almost = format!("# {}\n", "x".repeat(MAX_FILE_BYTES - 4));
    let count = MAX_COMMIT_BYTES / MAX_FILE_BYTES + 1;
    let list: Vec<(String, String)> = (0..count)
        .map(|i| (format!("f{i:03}.yaml"), almost.clone()))
        .collect();
    let borrowed: Vec<(&str, String)> = list.iter().map(|(p, t)| (p.as_str(), t.clone())).collect();
    assert_errors(
        &rejected(&borrowed),
        &["f064.yaml: the manifest files reach "],
    );
}

#[test]
fn an_alias_bomb_is_rejected_quickly() {
    let mut bomb = String::from(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: lol}\nl0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n",
    );
    for level in 1..10 {
        let refs = vec![format!("*l{}", level - 1); 10].join(", ");
        bomb.push_str(&format!("l{level}: &l{level} [{refs}]\n"));
    }
    // Generating capstan's CRDs for the catalog is slow in debug builds; only the parse counts.
    let catalog = StaticCatalog::new();
    let list = [("bomb.yaml", bomb)];
    // The 10^10 nodes of the whole bomb would take hours: the expansion budget refuses it
    // first (a time limit here would only measure the machine's load).
    let errors = load(&files(&list), "", &catalog).unwrap_err();
    let found: Vec<String> = errors.iter().map(ToString::to_string).collect();
    assert_errors(&found, &["bomb.yaml:"]);
    assert!(found[0].contains("alias bomb"), "{found:?}");
}

#[test]
fn a_misspelt_module_field_is_named_with_its_line() {
    let text = MODULE_V1.replace("firmwarePath: /firmware", "firmwarepath: /firmware");
    assert_errors(
        &rejected(&[("modules/my-kmod.yaml", text)]),
        &[
            "modules/my-kmod.yaml:9: spec.moduleLoader.container.modprobe.firmwarepath: unknown field; did you mean firmwarePath?",
        ],
    );
    let text = MODULE_V1.replace("  devicePlugin:", "  nodeSelector: {a: b}\n  devicePlugin:");
    assert_errors(
        &rejected(&[("m.yaml", text)]),
        &["m.yaml:15: spec.nodeSelector: unknown field"],
    );
}

#[test]
fn wrong_types_in_a_module_are_named_with_their_line() {
    let cases: &[(&str, &str, &str)] = &[
        (
            "parameters: [param=1]",
            "parameters: param=1",
            "m.yaml:9: spec.moduleLoader.container.modprobe.parameters: expected a list, got string",
        ),
        (
            "version: \"v1\"",
            "version: 1",
            "m.yaml:8: spec.moduleLoader.container.version: expected a string, got number 1",
        ),
        (
            "        - regexp: '^.+$'\n",
            "        - regexp: 5\n",
            "m.yaml:13: spec.moduleLoader.container.kernelMappings[1].regexp: expected a string, got number 5",
        ),
        (
            "  selector: {node-role.kubernetes.io/worker: \"\"}\n",
            "",
            "m.yaml:4: spec.selector: required field is missing",
        ),
    ];
    for (from, to, expected) in cases {
        let text = MODULE_V1.replace(from, to);
        assert_ne!(text, MODULE_V1, "{from}");
        assert_errors(&rejected(&[("m.yaml", text)]), &[expected]);
    }
}

#[test]
fn module_rules_from_kmm() {
    let mappings = "      kernelMappings:\n        - literal: 6.0.15-300.fc37.x86_64\n          containerImage: registry.example/org/my-kmod:v1-6.0.15\n        - regexp: '^.+$'\n          containerImage: \"registry.example/org/my-kmod:v1-${KERNEL_FULL_VERSION}\"\n";
    let cases: &[(&str, &str, &str)] = &[
        (
            "metadata: {name: my-kmod, namespace: kmm-demo}",
            "metadata: {name: a-module-with-a-much-longer-name-here, namespace: kmm-demo}",
            "m.yaml:3: metadata.name: Module kmm-demo/a-module-with-a-much-longer-name-here: label",
        ),
        (
            mappings,
            "      kernelMappings: []\n",
            "m.yaml:10: spec.moduleLoader.container.kernelMappings: must have at least 1 item (has 0)",
        ),
        (
            "modprobe: {moduleName: my_kmod,",
            "modprobe: {moduleName: my_kmod, rawArgs: {load: [a], unload: [a]},",
            "m.yaml:9: spec.moduleLoader.container.modprobe.rawArgs: must not be set with moduleName",
        ),
        (
            "modprobe: {moduleName: my_kmod,",
            "modprobe: {",
            "m.yaml:9: spec.moduleLoader.container.modprobe.moduleName: must be set",
        ),
        (
            "parameters: [param=1]}",
            "parameters: [param=1], modulesLoadingOrder: [other, my_kmod]}",
            "m.yaml:9: spec.moduleLoader.container.modprobe.modulesLoadingOrder: starts with \"other\"",
        ),
        (
            "        - literal: 6.0.15-300.fc37.x86_64\n",
            "        - literal: 6.0.15-300.fc37.x86_64\n          regexp: '^6'\n",
            "m.yaml:12: spec.moduleLoader.container.kernelMappings[0].regexp: literal and regexp cannot both be set",
        ),
        (
            "version: \"v1\"",
            "version: \"v 1\"",
            "m.yaml:8: spec.moduleLoader.container.version: must be usable as a label value",
        ),
        (
            "- regexp: '^.+$'",
            "- regexp: '('",
            "m.yaml:13: spec.moduleLoader.container.kernelMappings[1].regexp: \"(\" is not a valid regular expression",
        ),
        (
            "containerImage: registry.example/org/my-kmod:v1-6.0.15",
            "containerImage: \"\"",
            "m.yaml:12: spec.moduleLoader.container.kernelMappings[0].containerImage: required: neither this mapping nor spec.moduleLoader.container.containerImage",
        ),
        (
            "containerImage: registry.example/org/my-kmod:v1-6.0.15",
            "containerImage: registry.example/org/my-kmod",
            "m.yaml:12: spec.moduleLoader.container.kernelMappings[0].containerImage: \"registry.example/org/my-kmod\" names no tag or digest",
        ),
        (
            "      version: \"v1\"\n",
            "      version: \"v1\"\n      containerImage: registry.example/org/my-kmod\n",
            "m.yaml:9: spec.moduleLoader.container.containerImage: \"registry.example/org/my-kmod\" names no tag or digest",
        ),
        (
            "  selector: {node-role.kubernetes.io/worker: \"\"}\n",
            "  selector: {node-role.kubernetes.io/worker: \"\"}\n  tolerations:\n    - operator: Equal\n      value: x\n",
            "m.yaml:7: spec.tolerations[0].operator: must be Exists when key is empty",
        ),
        (
            "  selector: {node-role.kubernetes.io/worker: \"\"}\n",
            "  selector: {node-role.kubernetes.io/worker: \"\"}\n  tolerations:\n    - {key: gpu, operator: Exists, effect: NoSchedule, tolerationSeconds: 30}\n",
            "m.yaml:7: spec.tolerations[0].tolerationSeconds: can only be set with effect NoExecute",
        ),
        (
            "          containerImage: registry.example/org/my-kmod:v1-6.0.15\n",
            "          containerImage: registry.example/org/my-kmod:v1-6.0.15\n          inTreeModulesToRemove: []\n          inTreeModuleToRemove: old_kmod\n",
            "m.yaml:14: spec.moduleLoader.container.kernelMappings[0].inTreeModuleToRemove: cannot be set with inTreeModulesToRemove",
        ),
        (
            "      version: \"v1\"\n",
            "      version: \"v1\"\n      inTreeModulesToRemove: []\n      inTreeModuleToRemove: old_kmod\n",
            "m.yaml:10: spec.moduleLoader.container.inTreeModuleToRemove: cannot be set with inTreeModulesToRemove",
        ),
        (
            "      version: \"v1\"\n",
            "      version: \"v1\"\n      sign:\n        keySecret: {name: key}\n        certSecret: {name: cert}\n        filesToSign:\n          - /lib/modules/my_kmod.ko\n",
            "m.yaml:13: spec.moduleLoader.container.sign.filesToSign[0]: \"/lib/modules/my_kmod.ko\" must be under modprobe.dirName \"/opt\"",
        ),
    ];
    for (from, to, expected) in cases {
        let text = MODULE_V1.replace(from, to);
        assert_ne!(text, MODULE_V1, "{from}");
        assert_errors(&rejected(&[("m.yaml", text)]), &[expected]);
    }
}

#[test]
fn a_mapping_may_remove_no_in_tree_modules_where_the_container_removes_some() {
    let text = MODULE_V1
        .replace(
            "      version: \"v1\"\n",
            "      version: \"v1\"\n      inTreeModulesToRemove: [old_kmod]\n",
        )
        .replace(
            "          containerImage: registry.example/org/my-kmod:v1-6.0.15\n",
            "          containerImage: registry.example/org/my-kmod:v1-6.0.15\n          inTreeModulesToRemove: []\n",
        );
    let desired = load_all(&[("m.yaml", text)]).expect("valid");
    let mapping = desired.manifests[0]
        .object
        .pointer("/spec/moduleLoader/container/kernelMappings/0/inTreeModulesToRemove");
    assert_eq!(mapping, Some(&json!([])));
}

#[test]
fn upgrade_configs_and_leader_worker_sets_are_strict_too() {
    let upgrade = "apiVersion: upgrade.managed.openshift.io/v1alpha1\nkind: UpgradeConfig\nmetadata: {name: managed-upgrade-config, namespace: openshift-managed-upgrade-operator}\nspec:\n  type: OSD\n  upgradeAt: \"2026-01-01T00:00:00Z\"\n  PDBForceDrainTimeout: 60\n  desired: {version: v1, channel: stable-4.15}\n";
    let module = ("m.yaml", MODULE_V1.to_string());
    load_all(&[module.clone(), ("u.yaml", upgrade.to_string())]).unwrap();
    assert_errors(
        &rejected(&[
            module.clone(),
            (
                "u.yaml",
                upgrade.replace("PDBForceDrainTimeout", "pdbForceDrainTimeout"),
            ),
        ]),
        &[
            "u.yaml:4: spec.PDBForceDrainTimeout: required field is missing",
            "u.yaml:7: spec.pdbForceDrainTimeout: unknown field; did you mean PDBForceDrainTimeout?",
        ],
    );

    let lws = "apiVersion: leaderworkerset.x-k8s.io/v1\nkind: LeaderWorkerSet\nmetadata: {name: vllm}\nspec:\n  replicas: 2\n  leaderWorkerTemplate:\n    size: 4\n    workerTemplate:\n      spec:\n        containers:\n          - name: vllm\n            image: registry.example/vllm:v1\n";
    let state = load_all(&[("l.yaml", lws.to_string())]).unwrap();
    assert_eq!(state.manifests[0].namespace.as_deref(), Some("default"));
    assert_errors(
        &rejected(&[("l.yaml", lws.replace("replicas: 2", "replicas: two"))]),
        &["l.yaml:5: spec.replicas: expected an integer, got string \"two\""],
    );
    assert_errors(
        &rejected(&[("l.yaml", lws.replace("image: registry", "imag: registry"))]),
        &[
            "l.yaml:12: spec.leaderWorkerTemplate.workerTemplate.spec.containers[0].imag: unknown field; did you mean image?",
        ],
    );
}

#[test]
fn an_upgrade_config_rolls_out_a_declared_module_version_from_a_valid_time() {
    let upgrade = |at: &str, version: &str| {
        format!(
            "apiVersion: upgrade.managed.openshift.io/v1alpha1\nkind: UpgradeConfig\n\
             metadata: {{name: my-kmod-v1, namespace: kmm-demo}}\nspec:\n  type: OSD\n  \
             upgradeAt: \"{at}\"\n  PDBForceDrainTimeout: 60\n  desired: {{version: {version}}}\n"
        )
    };
    let module = ("m.yaml", MODULE_V1.to_string());
    load_all(&[
        module.clone(),
        ("u.yaml", upgrade("2026-01-01T00:00:00Z", "v1")),
    ])
    .unwrap();
    assert_errors(
        &rejected(&[module.clone(), ("u.yaml", upgrade("tomorrow at two", "v1"))]),
        &["u.yaml:6: spec.upgradeAt: \"tomorrow at two\" is not an RFC 3339 time"],
    );
    assert_errors(
        &rejected(&[
            module.clone(),
            ("u.yaml", upgrade("2026-01-01T00:00:00Z", "v9")),
        ]),
        &[
            "u.yaml:8: spec.desired.version: \"v9\" is the version of no Module this commit \
           declares; the Modules' versions are v1",
        ],
    );
    assert_errors(
        &rejected(&[("u.yaml", upgrade("2026-01-01T00:00:00Z", "v1"))]),
        &[
            "u.yaml:8: spec.desired.version: \"v1\" is the version of no Module this commit \
           declares; no Module of this commit sets spec.moduleLoader.container.version",
        ],
    );
    assert_errors(
        &rejected(&[
            module.clone(),
            ("u.yaml", upgrade("2026-01-01T00:00:00Z", "v1")),
            (
                "w.yaml",
                upgrade("2026-01-01T00:00:00Z", "v1").replace("my-kmod-v1", "again"),
            ),
        ]),
        &[
            "w.yaml:8: spec.desired.version: the UpgradeConfig at u.yaml:1 rolls out \"v1\" \
           already; one campaign per version",
        ],
    );
}

#[test]
fn node_manifests_only_set_labels_and_annotations() {
    let ok = "apiVersion: v1\nkind: Node\nmetadata:\n  name: worker-1\n  labels: {zone: a}\n  annotations: {example.com/note: \"anything at all\"}\n";
    load_all(&[("n.yaml", ok.to_string())]).unwrap();
    let cases: &[(&str, &[&str])] = &[
        (
            "spec:\n  unschedulable: true\n",
            &["n.yaml:7: spec: a Node manifest may only set labels and annotations"],
        ),
        (
            "status: {}\n",
            &["n.yaml:7: status: a Node manifest may only set labels and annotations"],
        ),
        (
            "  finalizers: [x]\n  uid: abc\n",
            &[
                "n.yaml:7: metadata.finalizers: a Node manifest may only set labels and annotations",
                "n.yaml:8: metadata.uid: a Node manifest may only set labels and annotations",
            ],
        ),
        (
            "  namespace: default\n",
            &["n.yaml:7: metadata.namespace: Node is cluster-scoped: remove metadata.namespace"],
        ),
    ];
    for (extra, expected) in cases {
        assert_errors(&rejected(&[("n.yaml", format!("{ok}{extra}"))]), expected);
    }
}

#[test]
fn labels_and_annotations_are_checked_on_every_kind() {
    let base = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\n";
    let cases: &[(&str, &str)] = &[
        (
            "  labels:\n    bad key!: x\n",
            "c.yaml:6: metadata.labels[bad key!]: invalid key:",
        ),
        (
            "  labels:\n    zone: \"not valid\"\n",
            "c.yaml:6: metadata.labels.zone: label value \"not valid\" is invalid",
        ),
        (
            "  labels:\n    zone: 1\n",
            "c.yaml:6: metadata.labels.zone: must be a string; quote it: \"1\"",
        ),
        (
            "  labels: [a]\n",
            "c.yaml:5: metadata.labels: must be a mapping of strings to strings",
        ),
        (
            "  labels:\n    zone: ~\n",
            "c.yaml:6: metadata.labels.zone: must be a string; write \"\" for an empty value",
        ),
        (
            "  annotations:\n    example.com/n: 2\n",
            "c.yaml:6: metadata.annotations[example.com/n]: must be a string",
        ),
        (
            "  namespace: Kmm_Demo\n",
            "c.yaml:5: metadata.namespace: \"Kmm_Demo\" is not a valid namespace",
        ),
    ];
    for (extra, expected) in cases {
        assert_errors(
            &rejected(&[("c.yaml", format!("{base}{extra}"))]),
            &[expected],
        );
    }
    let long = format!("  labels:\n    zone: {}\n", "a".repeat(64));
    assert_errors(
        &rejected(&[("c.yaml", format!("{base}{long}"))]),
        &["c.yaml:6: metadata.labels.zone: label value"],
    );
}

#[test]
fn version_labels_need_a_declared_module_with_a_version() {
    let unversioned = MODULE_V1.replace("      version: \"v1\"\n", "");
    let cases: Vec<(Commit<'_>, Vec<&str>)> = vec![
        (
            vec![
                ("m.yaml", MODULE_V1.to_string()),
                ("n.yaml", node_label("worker-1", "my-kmod", "v1")),
            ],
            vec![],
        ),
        (
            vec![("n.yaml", node_label("worker-1", "my-kmod", "v1"))],
            vec![
                "n.yaml:6: metadata.labels[kmm.node.kubernetes.io/version-module.kmm-demo.my-kmod]: version label \"v1\" names Module kmm-demo/my-kmod, which no manifest of this commit declares; declare it or remove the label",
            ],
        ),
        (
            vec![
                ("m.yaml", unversioned),
                ("n.yaml", node_label("worker-1", "my-kmod", "v1")),
            ],
            vec![
                "n.yaml:6: metadata.labels[kmm.node.kubernetes.io/version-module.kmm-demo.my-kmod]: version label \"v1\" names Module kmm-demo/my-kmod (m.yaml:1), which sets no spec.moduleLoader.container.version",
            ],
        ),
        (
            vec![
                ("m.yaml", MODULE_V1.to_string()),
                ("n.yaml", node_label("worker-1", "my-kmod", "")),
            ],
            vec![
                "n.yaml:6: metadata.labels[kmm.node.kubernetes.io/version-module.kmm-demo.my-kmod]: version label of Module kmm-demo/my-kmod is empty, which KMM reads as no label",
            ],
        ),
        (
            vec![
                ("m.yaml", MODULE_V1.to_string()),
                (
                    "n.yaml",
                    node_label("worker-1", "my-kmod", "v1")
                        .replace("version-module.", "version-module.x"),
                ),
            ],
            vec![
                "n.yaml:6: metadata.labels[kmm.node.kubernetes.io/version-module.xkmm-demo.my-kmod]: version label \"v1\" names Module xkmm-demo/my-kmod",
            ],
        ),
        (
            vec![
                ("m.yaml", MODULE_V1.to_string()),
                (
                    "n.yaml",
                    node_label("worker-1", "my-kmod", "v1").replace(
                        "kmm.node.kubernetes.io/version-module",
                        "beta.kmm.node.kubernetes.io/version-worker-pod",
                    ),
                ),
            ],
            vec![
                "n.yaml:6: metadata.labels[beta.kmm.node.kubernetes.io/version-worker-pod.kmm-demo.my-kmod]: is set by capstan's controllers",
            ],
        ),
        (
            vec![
                ("m.yaml", MODULE_V1.to_string()),
                (
                    "n.yaml",
                    node_label("worker-1", "my-kmod", "").replace(
                        "kmm.node.kubernetes.io/version-module.kmm-demo.my-kmod",
                        "kmm.node.kubernetes.io/kmm-demo.my-kmod.dra-ready",
                    ),
                ),
            ],
            vec![
                "n.yaml:6: metadata.labels[kmm.node.kubernetes.io/kmm-demo.my-kmod.dra-ready]: is set by capstan's controllers (DraReady of Module kmm-demo/my-kmod)",
            ],
        ),
        (
            vec![
                ("m.yaml", MODULE_V1.to_string()),
                (
                    "n.yaml",
                    node_label("worker-1", "my-kmod", "v1").replace("kmm-demo.my-kmod", "nodot"),
                ),
            ],
            vec![
                "n.yaml:6: metadata.labels[kmm.node.kubernetes.io/version-module.nodot]: not a valid version label",
            ],
        ),
    ];
    for (list, expected) in cases {
        match load_all(&list) {
            Ok(_) => assert!(expected.is_empty(), "accepted, expected {expected:?}"),
            Err(errors) => {
                let found: Vec<String> = errors.iter().map(ToString::to_string).collect();
                assert_errors(&found, &expected);
            }
        }
    }
}

#[test]
fn an_object_declared_twice_names_both_places() {
    let found = rejected(&[
        (
            "a.yaml",
            node_label("worker-1", "my-kmod", "v1")
                .replace(&format!("    {VERSION_LABEL}: \"v1\"\n"), "    zone: a\n"),
        ),
        (
            "b.yaml",
            format!(
                "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: c}}\n---\n{}",
                node_label("worker-1", "my-kmod", "x")
                    .replace(&format!("    {VERSION_LABEL}: \"x\"\n"), "    zone: b\n")
            ),
        ),
    ]);
    assert_errors(
        &found,
        &["b.yaml:8: metadata.name: Node worker-1 is declared twice: also at a.yaml:1"],
    );
    // The same name in another namespace is another object.
    let config = |ns: &str| {
        format!("apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: c, namespace: {ns}}}\n")
    };
    load_all(&[("a.yaml", config("a")), ("b.yaml", config("b"))]).unwrap();
    assert_errors(
        &rejected(&[
            ("a.yaml", config("default")),
            (
                "b.yaml",
                "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n".to_string(),
            ),
        ]),
        &["b.yaml:3: metadata.name: ConfigMap default/c is declared twice: also at a.yaml:1"],
    );
}

#[test]
fn kinds_the_cluster_does_not_serve_are_rejected() {
    let found = rejected(&[(
        "d.yaml",
        "apiVersion: apps/v1beta1\nkind: Deployment\nmetadata: {name: web}\n".to_string(),
    )]);
    assert_errors(
        &found,
        &["d.yaml:2: kind: kind Deployment in apiVersion apps/v1beta1 is not served by Kubernetes"],
    );
    assert!(
        found[0].ends_with("; Deployment is served as apiVersion apps/v1"),
        "{found:?}"
    );
    let found = rejected(&[("m.yaml", MODULE_V1.replace("v1beta1", "v1"))]);
    assert_errors(
        &found,
        &["m.yaml:2: kind: kind Module in apiVersion kmm.sigs.x-k8s.io/v1 is not served by"],
    );
}

/// A manifest of `kind` in `api_version`, named `name`, with `rest` after its metadata.
fn object(api_version: &str, kind: &str, name: &str, rest: &str) -> String {
    format!(
        "apiVersion: {api_version}\nkind: {kind}\nmetadata:\n  name: {name}\n  labels: \
         {{app: fleet}}\n{rest}"
    )
}

#[test]
fn every_built_in_kind_of_the_release_is_accepted() {
    let list = [
        (
            "hpa.yaml",
            object(
                "autoscaling/v2",
                "HorizontalPodAutoscaler",
                "plugin",
                "spec:\n  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: plugin}\n  \
                 maxReplicas: 3\n",
            ),
        ),
        (
            "rbac.yaml",
            [
                object(
                    "rbac.authorization.k8s.io/v1",
                    "Role",
                    "reader",
                    "rules: [{apiGroups: [\"\"], resources: [configmaps], verbs: [get]}]\n",
                ),
                object(
                    "rbac.authorization.k8s.io/v1",
                    "ClusterRole",
                    "node-reader",
                    "rules: [{apiGroups: [\"\"], resources: [nodes], verbs: [get]}]\n",
                ),
                object(
                    "rbac.authorization.k8s.io/v1",
                    "RoleBinding",
                    "reader",
                    "roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: reader}\n",
                ),
            ]
            .join("---\n"),
        ),
        (
            "more.yaml",
            [
                object(
                    "networking.k8s.io/v1",
                    "NetworkPolicy",
                    "deny",
                    "spec: {podSelector: {}}\n",
                ),
                object(
                    "batch/v1",
                    "CronJob",
                    "clean",
                    "spec: {schedule: '@daily'}\n",
                ),
                object("networking.k8s.io/v1", "Ingress", "web", ""),
                object(
                    "storage.k8s.io/v1",
                    "StorageClass",
                    "fast",
                    "provisioner: x\n",
                ),
                object(
                    "scheduling.k8s.io/v1",
                    "PriorityClass",
                    "high",
                    "value: 1000\n",
                ),
                object(
                    "admissionregistration.k8s.io/v1",
                    "ValidatingWebhookConfiguration",
                    "check",
                    "",
                ),
            ]
            .join("---\n"),
        ),
    ];
    let state = load(&files(&list), "", &StaticCatalog::new()).unwrap();
    let ids: Vec<String> = state.manifests.iter().map(|m| m.id().to_string()).collect();
    assert_eq!(
        ids,
        [
            "HorizontalPodAutoscaler default/plugin",
            "NetworkPolicy default/deny",
            "CronJob default/clean",
            "Ingress default/web",
            "StorageClass fast",
            "PriorityClass high",
            "ValidatingWebhookConfiguration check",
            "Role default/reader",
            "ClusterRole node-reader",
            "RoleBinding default/reader",
        ]
    );
}

#[test]
fn built_in_kinds_are_checked_alike_whatever_their_kind() {
    // Each of these kinds, from the embedded cluster's (ConfigMap, DaemonSet) to those only
    // Kubernetes serves, gets the same checks and nothing more.
    let kinds = [
        ("v1", "ConfigMap"),
        ("apps/v1", "DaemonSet"),
        ("autoscaling/v2", "HorizontalPodAutoscaler"),
        ("rbac.authorization.k8s.io/v1", "Role"),
        ("rbac.authorization.k8s.io/v1", "RoleBinding"),
        ("networking.k8s.io/v1", "NetworkPolicy"),
    ];
    for (api_version, kind) in kinds {
        // Labels as the API server checks them.
        let bad_label = object(api_version, kind, "a", "").replace("app: fleet", "app: -fleet");
        assert_errors(
            &rejected(&[("a.yaml", bad_label)]),
            &["a.yaml:5: metadata.labels.app: "],
        );
        // A namespaced kind without a namespace gets the default one.
        let manifest = load_all(&[("a.yaml", object(api_version, kind, "a", ""))]).unwrap();
        assert_eq!(
            manifest.manifests[0].namespace.as_deref(),
            Some("default"),
            "{kind}"
        );
        // Fields are the API server's to judge (a live plan dry-runs them strictly): an
        // unknown one is taken as written, for every built-in kind alike.
        let unknown_field = object(api_version, kind, "a", "spce: {maxReplica: 3}\n");
        let state = load_all(&[("a.yaml", unknown_field)]).unwrap();
        assert_eq!(
            state.manifests[0].object["spce"],
            json!({"maxReplica": 3}),
            "{kind}"
        );
    }
    let namespaced_cluster_role = object("rbac.authorization.k8s.io/v1", "ClusterRole", "a", "")
        .replace("  name: a\n", "  name: a\n  namespace: kmm-demo\n");
    assert_errors(
        &rejected(&[("a.yaml", namespaced_cluster_role)]),
        &["a.yaml:5: metadata.namespace: ClusterRole is cluster-scoped: remove metadata.namespace"],
    );
    // capstan's own kinds are still checked field by field.
    let text = MODULE_V1.replace("  devicePlugin:", "  nodeSelector: {a: b}\n  devicePlugin:");
    assert_errors(
        &rejected(&[("m.yaml", text)]),
        &["m.yaml:15: spec.nodeSelector: unknown field"],
    );
}

#[test]
fn requests_cannot_be_declared() {
    let found = rejected(&[
        (
            "eviction.yaml",
            "apiVersion: policy/v1\nkind: Eviction\nmetadata: {name: p, namespace: default}\n"
                .to_string(),
        ),
        (
            "review.yaml",
            "apiVersion: authentication.k8s.io/v1\nkind: TokenReview\nmetadata: {name: r}\n\
             spec: {token: t}\n"
                .to_string(),
        ),
    ]);
    assert_errors(
        &found,
        &[
            "eviction.yaml:2: kind: kind Eviction in apiVersion policy/v1 is a request to the \
             eviction subresource of another object, not an object",
            "review.yaml:2: kind: kind TokenReview in apiVersion authentication.k8s.io/v1 is a \
             request (a create of tokenreviews)",
        ],
    );
}

#[test]
fn a_secret_holds_what_the_api_server_decodes_and_its_errors_quote_no_value() {
    let secret = |name: &str, body: &str| {
        format!(
            "apiVersion: v1\nkind: Secret\nmetadata: {{name: {name}, namespace: default}}\n{body}"
        )
    };
    let found = rejected(&[
        (
            "a.yaml",
            secret(
                "a",
                "data:\n  token: not base64 hunter2\n  'bad key': aGk=\n",
            ),
        ),
        ("b.yaml", secret("b", "data: aHVudGVyMg==\n")),
        ("c.yaml", secret("c", "stringData:\n  port: 8080\n")),
    ]);
    assert_errors(
        &found,
        &[
            "a.yaml:5: data.token: not valid base64 (a Secret's data is base64-encoded; put \
             plain text under stringData)",
            "a.yaml:6: data[bad key]: a key must consist of alphanumeric characters, '-', '_' \
             or '.'",
            "b.yaml:4: data: must be a map of keys to values",
            "c.yaml:5: stringData.port: must be a string",
        ],
    );
    assert!(found.iter().all(|e| !e.to_string().contains("hunter2")));
    // Go's decoder skips newlines and takes trailing bits; a null value is an empty one.
    load_all(&[(
        "ok.yaml",
        secret(
            "ok",
            "data:\n  a: \"aGVs\\nbG8=\"\n  b: aGk=\n  c: null\nstringData:\n  d: plain\n",
        ),
    )])
    .expect("a Secret as the API server takes it");
}

#[test]
fn capstans_own_kinds_cannot_be_declared() {
    let found = rejected(&[(
        "reach.yaml",
        "apiVersion: capstan.dev/v1alpha1\nkind: GitSync\nmetadata: {name: capstan, namespace: \
         capstan-system}\nspec: {repo: r, branch: main, reach: {namespaces: ['*']}}\n"
            .to_string(),
    )]);
    assert_errors(
        &found,
        &[
            "reach.yaml:2: kind: GitSync is one of capstan's own kinds, which a repository does \
           not declare: a GitSync is the cluster admin's (its reach bounds the repository), \
           history is capstan's",
        ],
    );
}

#[test]
fn a_crd_in_the_same_commit_serves_its_kind() {
    let crd = "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata: {name: widgets.example.com}\nspec:\n  group: example.com\n  names: {kind: Widget, plural: widgets}\n  scope: Namespaced\n  versions:\n    - name: v1\n      served: true\n      storage: true\n      schema:\n        openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}\n";
    let widget = "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w}\nspec: {size: 3}\n";
    let state = load_all(&[
        ("crd.yaml", crd.to_string()),
        ("widget.yaml", widget.to_string()),
    ])
    .unwrap();
    assert_eq!(state.manifests[1].id().to_string(), "Widget default/w");
    assert_errors(
        &rejected(&[("widget.yaml", widget.to_string())]),
        &["widget.yaml:2: kind: kind Widget in apiVersion example.com/v1 is not served by"],
    );
    assert_errors(
        &rejected(&[(
            "crd.yaml",
            crd.replace("scope: Namespaced", "scope: Global"),
        )]),
        &["crd.yaml:7: spec.scope: \"Global\" is not a scope"],
    );
}

#[test]
fn settings_errors_reject_the_commit() {
    let list = [
        (
            "fleet/capstan.yaml",
            "maxNodesInFlight: 2\ndrfit: warn\n".to_string(),
        ),
        ("fleet/m.yaml", MODULE_V1.to_string()),
    ];
    let errors = load(&files(&list), "fleet", &StaticCatalog::new()).unwrap_err();
    let found: Vec<String> = errors.iter().map(ToString::to_string).collect();
    assert_errors(
        &found,
        &["fleet/capstan.yaml:2: drfit: unknown setting; did you mean drift?"],
    );
}

#[test]
fn a_zero_drain_wait_forces_at_once_and_an_absent_one_is_muos_default() {
    // As MUO's nodekeeper takes its settings: only a negative wait is refused.
    let list = [
        (
            "fleet/capstan.yaml",
            "prune: true\nnodeDrain: {timeOut: 0, expectedNodeDrainTime: 0}\n".to_string(),
        ),
        ("fleet/m.yaml", MODULE_V1.to_string()),
    ];
    let desired = load(&files(&list), "fleet", &StaticCatalog::new()).expect("valid");
    assert_eq!(desired.settings.node_drain.time_out, 0);
    let list = [
        ("fleet/capstan.yaml", "nodeDrain: {}\n".to_string()),
        ("fleet/m.yaml", MODULE_V1.to_string()),
    ];
    let desired = load(&files(&list), "fleet", &StaticCatalog::new()).expect("valid");
    assert_eq!(desired.settings.node_drain.time_out, 45);
    assert_eq!(desired.settings.node_drain.expected_node_drain_time, 8);
}

#[test]
fn every_problem_of_a_commit_is_reported() {
    let found = rejected(&[
        (
            "a.yaml",
            "apiVersion: v1\nkind: Node\nmetadata: {name: n}\nspec: {}\n".to_string(),
        ),
        ("b.yaml", "key: [\n".to_string()),
        (
            "c.yaml",
            "apiVersion: v1\nkind: Gadget\nmetadata: {name: g}\n---\nkind: Node\n".to_string(),
        ),
    ]);
    assert_errors(
        &found,
        &[
            "a.yaml:4: spec: a Node manifest",
            "b.yaml:1: invalid YAML (column 6): unclosed bracket",
            "c.yaml:2: kind: kind Gadget in apiVersion v1 is not served",
            "c.yaml:5: apiVersion: required field is missing",
        ],
    );
}

#[test]
fn errors_and_ids_display_as_documented() {
    let full = ManifestError::new(
        "m.yaml",
        Some(12),
        Some("spec.a".to_string()),
        "unknown field",
    );
    assert_eq!(full.to_string(), "m.yaml:12: spec.a: unknown field");
    let bare = ManifestError::new("m.yaml", None, None, "too big");
    assert_eq!(bare.to_string(), "m.yaml: too big");
    let id = |namespace: Option<&str>| ObjectId {
        group: String::new(),
        kind: "Node".to_string(),
        namespace: namespace.map(str::to_string),
        name: "worker-1".to_string(),
    };
    assert_eq!(id(None).to_string(), "Node worker-1");
    assert_eq!(id(Some("ns")).to_string(), "Node ns/worker-1");
    assert_eq!(
        serde_json::to_value(&full).unwrap(),
        json!({"file": "m.yaml", "line": 12, "field": "spec.a", "message": "unknown field"})
    );
}

/// Seed 002 as commits: nodes on v1, the Module bumped to v2, then nodes relabelled.
#[test]
fn ordered_upgrade_commits_pass_the_transition_check() {
    let commit = |version: &str, labels: [&str; 3]| {
        load_all(&[
            ("modules/my-kmod.yaml", module("my-kmod", version)),
            (
                "nodes/worker-1.yaml",
                node_label("worker-1", "my-kmod", labels[0]),
            ),
            (
                "nodes/worker-2.yaml",
                node_label("worker-2", "my-kmod", labels[1]),
            ),
            (
                "nodes/worker-3.yaml",
                node_label("worker-3", "my-kmod", labels[2]),
            ),
        ])
        .unwrap()
    };
    let start = commit("v1", ["v1", "v1", "v1"]);
    assert_eq!(check_transition(None, &start), []);
    let bumped = commit("v2", ["v1", "v1", "v1"]);
    assert_eq!(check_transition(Some(&start), &bumped), []);
    let relabelled = commit("v2", ["v2", "v1", "v1"]);
    assert_eq!(check_transition(Some(&bumped), &relabelled), []);

    let typo = commit("v2", ["v2", "v3", "v1"]);
    let found: Vec<String> = check_transition(Some(&relabelled), &typo)
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        found,
        [format!(
            "nodes/worker-2.yaml:1: metadata.labels[{VERSION_LABEL}]: version label moves to \"v3\", but Module \
             kmm-demo/my-kmod (modules/my-kmod.yaml:1) declares version \"v2\"; a node can only be moved to the Module's version"
        )]
    );
    // Without a previous commit, every label must name the Module's version.
    assert_eq!(check_transition(None, &bumped).len(), 3);

    let version_only = load_all(&[(
        "modules/my-kmod.yaml",
        module("my-kmod", "v1").replace("version: \"v1\"", "version: \"v2\""),
    )])
    .unwrap();
    let found: Vec<String> = check_transition(Some(&start), &version_only)
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_errors(
        &found,
        &[
            "modules/my-kmod.yaml:1: spec.moduleLoader.container.version: changes from \"v1\" to \"v2\" but no kmod image changes",
        ],
    );
}

#[test]
fn a_namespace_cannot_leave_while_objects_of_the_commit_live_in_it() {
    let namespace = || {
        (
            "ns.yaml",
            "apiVersion: v1\nkind: Namespace\nmetadata: {name: kmm-demo}\n".to_string(),
        )
    };
    let settings = || {
        (
            "cm.yaml",
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: settings, namespace: kmm-demo}\n"
                .to_string(),
        )
    };
    let elsewhere = || {
        (
            "other.yaml",
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: other, namespace: default}\n"
                .to_string(),
        )
    };
    let previous = load_all(&[
        namespace(),
        settings(),
        ("m.yaml", MODULE_V1.to_string()),
        elsewhere(),
    ])
    .unwrap();
    let cases: Vec<(&str, Commit<'_>, Vec<&str>)> = vec![
        (
            "the namespace stays",
            vec![namespace(), settings(), elsewhere()],
            vec![],
        ),
        (
            "the namespace moves to another file",
            vec![("a/ns.yaml", namespace().1), settings()],
            vec![],
        ),
        (
            "the namespace leaves with everything in it",
            vec![elsewhere()],
            vec![],
        ),
        (
            "the namespace leaves, its objects stay",
            vec![settings(), ("m.yaml", MODULE_V1.to_string()), elsewhere()],
            vec![
                "cm.yaml:1: metadata.namespace: Namespace kmm-demo leaves the repository (the previous commit declared it at ns.yaml:1) but ConfigMap kmm-demo/settings stays in it: pruning the Namespace would delete the ConfigMap with it; keep the Namespace's manifest, or remove everything in it in the same commit",
                "m.yaml:1: metadata.namespace: Namespace kmm-demo leaves the repository (the previous commit declared it at ns.yaml:1) but Module kmm-demo/my-kmod stays in it",
            ],
        ),
        (
            "an object defaulted into the namespace",
            vec![
                ("capstan.yaml", "defaultNamespace: kmm-demo\n".to_string()),
                (
                    "cm.yaml",
                    "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: settings}\n".to_string(),
                ),
            ],
            vec![
                "cm.yaml:1: metadata.namespace: Namespace kmm-demo leaves the repository (the previous commit declared it at ns.yaml:1) but ConfigMap kmm-demo/settings stays in it",
            ],
        ),
        (
            "without pruning the namespace stays in the cluster",
            vec![("capstan.yaml", "prune: false\n".to_string()), settings()],
            vec![],
        ),
    ];
    for (case, list, expected) in cases {
        let next = load_all(&list).unwrap();
        let found: Vec<String> = check_transition(Some(&previous), &next)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(found.len(), expected.len(), "{case}: {found:#?}");
        for (error, prefix) in found.iter().zip(&expected) {
            assert!(error.starts_with(prefix), "{case}: {error}");
        }
        // A first commit removes nothing.
        assert_eq!(check_transition(None, &next), [], "{case}");
    }
}

#[test]
fn the_campaigns_of_the_failing_files_are_named() {
    let campaign = "apiVersion: upgrade.managed.openshift.io/v1alpha1\nkind: UpgradeConfig\n\
                    metadata: {name: my-kmod-v9, namespace: kmm-demo}\nspec:\n  type: OSD\n  \
                    upgradeAt: \"2026-01-01T00:00:00Z\"\n  PDBForceDrainTimeout: 0\n  \
                    desired: {version: v9}\n";
    let list = [
        ("m.yaml", MODULE_V1.to_string()),
        ("u.yaml", campaign.to_string()),
    ];
    let errors = load_all(&list).unwrap_err();
    assert_eq!(
        super::campaigns_in_error(&files(&list), &errors),
        ["my-kmod-v9"]
    );
    // A failing file without an UpgradeConfig names none.
    let broken = [("m.yaml", MODULE_V1.replace("selector", "selectr"))];
    let errors = load_all(&broken).unwrap_err();
    assert!(super::campaigns_in_error(&files(&broken), &errors).is_empty());
}

/// A LeaderWorkerSet upstream's webhook accepts; its lines are named in the tests below.
const LWS: &str = "apiVersion: leaderworkerset.x-k8s.io/v1
kind: LeaderWorkerSet
metadata: {name: vllm, namespace: ml}
spec:
  replicas: 2
  leaderWorkerTemplate:
    size: 4
    workerTemplate:
      spec:
        containers:
          - name: vllm
            image: registry.example/vllm:v1
";

/// [`LWS`] with `from` replaced by `to`.
fn lws_with(from: &str, to: &str) -> Commit<'static> {
    let text = LWS.replace(from, to);
    assert_ne!(text, LWS, "{from}");
    vec![("l.yaml", text)]
}

/// [`LWS`] with a rolling update configuration (on line 7).
fn lws_rolling(replicas: i32, configuration: &str) -> Commit<'static> {
    lws_with(
        "  replicas: 2\n",
        &format!(
            "  replicas: {replicas}\n  rolloutStrategy:\n    rollingUpdateConfiguration: {{{configuration}}}\n"
        ),
    )
}

/// [`LWS`] with groups of `size` and a subgroup policy (on line 8).
fn lws_sub_groups(size: i32, policy: &str) -> Commit<'static> {
    lws_with(
        "    size: 4\n",
        &format!("    size: {size}\n    subGroupPolicy: {{{policy}}}\n"),
    )
}

#[test]
fn a_leader_worker_set_upstream_accepts_loads() {
    load_all(&lws_with("replicas: 2", "replicas: 0")).unwrap();
    load_all(&lws_rolling(
        2,
        "maxUnavailable: 50%, maxSurge: 0, partition: 1",
    ))
    .unwrap();
    load_all(&lws_sub_groups(
        5,
        "subGroupSize: 2, subGroupPolicyType: LeaderExcluded",
    ))
    .unwrap();
    let exclusive_sub_groups = LWS
        .replace(
            "namespace: ml}",
            "namespace: ml, annotations: {leaderworkerset.sigs.k8s.io/subgroup-exclusive-topology: rack}}",
        )
        .replace("    size: 4\n", "    size: 4\n    subGroupPolicy: {subGroupSize: 2}\n");
    load_all(&[("l.yaml", exclusive_sub_groups)]).unwrap();
}

#[test]
fn a_leader_worker_set_name_must_be_a_dns_1035_label() {
    assert_errors(
        &rejected(&lws_with("name: vllm,", "name: 70b-vllm,")),
        &[
            "l.yaml:3: metadata.name: \"70b-vllm\" cannot name a LeaderWorkerSet, which names its Service: a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character",
        ],
    );
}

#[test]
fn leader_worker_set_replicas_are_between_0_and_a_million() {
    assert_errors(
        &rejected(&lws_with("replicas: 2", "replicas: -1")),
        &["l.yaml:5: spec.replicas: -1 is too small: must be at least 0"],
    );
    assert_errors(
        &rejected(&lws_with("replicas: 2", "replicas: 1000001")),
        &["l.yaml:5: spec.replicas: 1000001 is too large"],
    );
    load_all(&lws_with("replicas: 2", "replicas: 1000000")).unwrap();
}

#[test]
fn leader_worker_set_groups_have_at_least_one_pod() {
    assert_errors(
        &rejected(&lws_with("size: 4", "size: 0")),
        &[
            "l.yaml:7: spec.leaderWorkerTemplate.size: 0 is not allowed: size must be equal or greater than 1",
        ],
    );
}

#[test]
fn leader_worker_set_pods_in_all_fit_a_32_bit_count() {
    assert_errors(
        &rejected(&lws_with(
            "replicas: 2\n  leaderWorkerTemplate:\n    size: 4",
            "replicas: 1000000\n  leaderWorkerTemplate:\n    size: 3000",
        )),
        &[
            "l.yaml:5: spec.replicas: 1000000 groups of 3000 pods is not allowed: the product of replicas and worker replicas must not exceed 2147483647",
        ],
    );
}

#[test]
fn leader_worker_set_max_unavailable_and_max_surge_are_counts_or_percentages() {
    let field = "l.yaml:7: spec.rolloutStrategy.rollingUpdateConfiguration";
    let cases = [
        (
            "maxUnavailable: -1",
            format!(
                "{field}.maxUnavailable: -1 is not allowed: must be greater than or equal to 0"
            ),
        ),
        (
            "maxUnavailable: 1, maxSurge: -2",
            format!("{field}.maxSurge: -2 is not allowed: must be greater than or equal to 0"),
        ),
        (
            "maxSurge: half",
            format!(
                "{field}.maxSurge: \"half\" is not allowed: a valid percent string must be a numeric string followed by an ending '%'"
            ),
        ),
        (
            "maxUnavailable: 150%",
            format!(
                "{field}.maxUnavailable: \"150%\" is not allowed: must not be greater than 100%"
            ),
        ),
    ];
    for (configuration, expected) in cases {
        assert_errors(&rejected(&lws_rolling(2, configuration)), &[&expected]);
    }
}

#[test]
fn leader_worker_set_partition_is_not_negative() {
    assert_errors(
        &rejected(&lws_rolling(2, "partition: -1")),
        &[
            "l.yaml:7: spec.rolloutStrategy.rollingUpdateConfiguration.partition: -1 is not allowed: must be greater than or equal to 0",
        ],
    );
}

#[test]
fn a_leader_worker_set_rollout_must_be_able_to_update_a_group() {
    let field = "l.yaml:7: spec.rolloutStrategy.rollingUpdateConfiguration.maxUnavailable";
    assert_errors(
        &rejected(&lws_rolling(2, "maxUnavailable: 0, maxSurge: 0")),
        &[&format!(
            "{field}: 0 is not allowed: must not be 0 when `maxSurge` is 0: no group could be updated"
        )],
    );
    assert_errors(
        &rejected(&lws_rolling(3, "maxUnavailable: 30%")),
        &[&format!(
            "{field}: \"30%\" is not allowed: must not be 0 when `maxSurge` is 0 (3 groups round it down to 0)"
        )],
    );
    // No groups, nothing to update; a surge alone, or a percentage that stays above 0.
    load_all(&lws_rolling(0, "maxUnavailable: 0, maxSurge: 0")).unwrap();
    load_all(&lws_rolling(2, "maxUnavailable: 0, maxSurge: 1%")).unwrap();
    load_all(&lws_rolling(4, "maxUnavailable: 25%")).unwrap();
}

#[test]
fn leader_worker_set_subgroups_divide_the_group_or_its_workers() {
    assert_errors(
        &rejected(&lws_sub_groups(5, "subGroupSize: 3")),
        &[
            "l.yaml:8: spec.leaderWorkerTemplate.subGroupPolicy.subGroupSize: 3 is not allowed: size or size - 1 must be divisible by subGroupSize (size is 5)",
        ],
    );
    load_all(&lws_sub_groups(4, "subGroupSize: 2")).unwrap();
    load_all(&lws_sub_groups(5, "subGroupSize: 2")).unwrap();
}

#[test]
fn leader_worker_set_subgroups_are_no_larger_than_the_group() {
    assert_errors(
        &rejected(&lws_sub_groups(1, "subGroupSize: 2")),
        &[
            "l.yaml:8: spec.leaderWorkerTemplate.subGroupPolicy.subGroupSize: 2 is not allowed: subGroupSize cannot be larger than size (1)",
        ],
    );
}

#[test]
fn leader_worker_set_subgroups_have_at_least_one_pod() {
    assert_errors(
        &rejected(&lws_sub_groups(4, "subGroupSize: 0")),
        &[
            "l.yaml:8: spec.leaderWorkerTemplate.subGroupPolicy.subGroupSize: 0 is not allowed: subGroupSize must be equal or greater than 1",
        ],
    );
}

#[test]
fn leader_excluded_subgroups_divide_the_workers() {
    assert_errors(
        &rejected(&lws_sub_groups(
            4,
            "subGroupSize: 2, subGroupPolicyType: LeaderExcluded",
        )),
        &[
            "l.yaml:8: spec.leaderWorkerTemplate.subGroupPolicy.subGroupSize: 2 is not allowed: size-1 must be divisible by subGroupSize when using LeaderExcluded (size is 4)",
        ],
    );
}

#[test]
fn a_leader_worker_set_subgroup_policy_names_its_size() {
    assert_errors(
        &rejected(&lws_sub_groups(4, "subGroupPolicyType: LeaderWorker")),
        &[
            "l.yaml:8: spec.leaderWorkerTemplate.subGroupPolicy.subGroupSize: required when subGroupPolicy is set",
        ],
    );
}

#[test]
fn a_subgroup_exclusive_topology_needs_subgroups() {
    assert_errors(
        &rejected(&lws_with(
            "namespace: ml}",
            "namespace: ml, annotations: {leaderworkerset.sigs.k8s.io/subgroup-exclusive-topology: rack}}",
        )),
        &[
            "l.yaml:3: metadata.annotations[leaderworkerset.sigs.k8s.io/subgroup-exclusive-topology]: \"rack\" is not allowed: cannot have subgroup-exclusive-topology without subGroupSize set",
        ],
    );
}

#[test]
fn names_follow_their_kinds_rules_as_the_api_server_checks_them() {
    let ns = |name: &str| format!("  namespace: {name}\n");
    // (api version, kind, name, namespaced, accepted)
    let rows = [
        ("v1", "ConfigMap", "settings.v2", true, true),
        ("v1", "ConfigMap", "Bad_Name", true, false),
        ("v1", "ConfigMap", "x\n<!-- hidden", true, false),
        ("v1", "Secret", "tls.example.com", true, true),
        ("v1", "Secret", "UPPER", true, false),
        ("v1", "Service", "web", true, true),
        ("v1", "Service", "web.v2", true, false),
        ("v1", "Service", "70b-vllm", true, true),
        ("v1", "Namespace", "team-a", false, true),
        ("v1", "Namespace", "team.a", false, false),
        ("apps/v1", "StatefulSet", "db.v2", true, false),
        ("apps/v1", "Deployment", "web.v2", true, true),
        (
            "rbac.authorization.k8s.io/v1",
            "ClusterRole",
            "system:reader",
            false,
            true,
        ),
    ];
    for (api_version, kind, name, namespaced, accepted) in rows {
        let quoted = serde_json::to_string(name).unwrap();
        let rest = match kind {
            "ConfigMap" => "data: {a: b}\n",
            "Secret" => "stringData: {a: b}\n",
            "Service" => "spec:\n  ports: [{port: 80}]\n",
            "StatefulSet" | "Deployment" => {
                "spec:\n  selector: {matchLabels: {app: x}}\n  template:\n    metadata: \
                 {labels: {app: x}}\n    spec:\n      containers: [{name: c, image: i}]\n"
            }
            "ClusterRole" => "rules: []\n",
            _ => "",
        };
        let text = format!(
            "apiVersion: {api_version}\nkind: {kind}\nmetadata:\n  name: {quoted}\n{}{rest}",
            if namespaced {
                ns("default")
            } else {
                String::new()
            }
        );
        let result = load_all(&[("o.yaml", text)])
            .map_err(|errors| errors.iter().map(ToString::to_string).collect::<Vec<_>>());
        let named = |errors: &[String]| {
            errors
                .iter()
                .any(|e| e.starts_with("o.yaml:4: metadata.name: Invalid value"))
        };
        match (result, accepted) {
            (Ok(_), true) => {}
            (Err(errors), false) => assert!(named(&errors), "{kind} {name:?}: {errors:?}"),
            (Err(errors), true) => panic!("{kind} {name:?} refused: {errors:?}"),
            (Ok(_), false) => panic!("{kind} {name:?} accepted"),
        }
    }
}
