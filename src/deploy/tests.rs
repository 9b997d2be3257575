//! The checked-in manifests are the generator's; the chart renders to the kustomize base
//! (with a component's setting, to the base with the component); what the Deployment
//! runs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::render::render;
use super::values::{NAMESPACE, SETTINGS, defaults};
use super::*;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Written once: generating the CRDs is slow in a debug build.
fn generated() -> Vec<File> {
    static FILES: std::sync::LazyLock<Vec<File>> =
        std::sync::LazyLock::new(|| files().expect("the manifests are written"));
    FILES.clone()
}

/// Every file under `dir`, relative to the workspace root.
fn existing(dir: &Path, found: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            existing(&path, found);
        } else if let Ok(relative) = path.strip_prefix(root()) {
            found.push(relative.to_string_lossy().into_owned());
        }
    }
}

#[test]
fn deploy_files_are_current() {
    let files = generated();
    let bless = std::env::var("CAPSTAN_BLESS").is_ok_and(|value| value == "1");
    let differing: Vec<&File> = files
        .iter()
        .filter(|file| {
            std::fs::read_to_string(root().join(&file.path))
                .ok()
                .as_ref()
                != Some(&file.text)
        })
        .collect();
    let mut found = Vec::new();
    existing(&root().join("deploy"), &mut found);
    existing(&root().join(CHART_DIR), &mut found);
    let stale: Vec<String> = found
        .into_iter()
        .filter(|path| !files.iter().any(|file| &file.path == path))
        .collect();
    if bless {
        for file in &differing {
            let path = root().join(&file.path);
            std::fs::create_dir_all(path.parent().expect("a parent")).expect("mkdir");
            std::fs::write(&path, &file.text).expect("write");
        }
        for path in &stale {
            std::fs::remove_file(root().join(path)).expect("remove");
        }
        return;
    }
    let differing: Vec<&str> = differing.iter().map(|file| file.path.as_str()).collect();
    assert!(
        differing.is_empty() && stale.is_empty(),
        "the install manifests are not those src/deploy.rs writes:\n  differing or missing: {differing:?}\n  \
         no longer written: {stale:?}\nwrite them with: CAPSTAN_BLESS=1 cargo test -p capstan --lib deploy"
    );
}

/// The object of a one-document YAML file; `None` for comments only.
fn document(text: &str, what: &str) -> Option<Value> {
    let content = text
        .lines()
        .any(|line| !line.trim().is_empty() && !line.trim_start().starts_with('#'));
    content
        .then(|| serde_saphyr::from_str(text).unwrap_or_else(|err| panic!("{what}: {err}\n{text}")))
}

/// The base's objects by file name (the CRDs and kustomization aside).
fn base_objects(files: &[File]) -> BTreeMap<String, Value> {
    files
        .iter()
        .filter_map(|file| {
            let name = file.path.strip_prefix(&format!("{BASE_DIR}/"))?;
            (!matches!(name, "kustomization.yaml" | "crds.yaml")).then(|| {
                (
                    name.to_string(),
                    document(&file.text, name).expect("an object"),
                )
            })
        })
        .collect()
}

/// The chart's templates rendered with `values` in `namespace`, by file name; templates
/// that render to nothing are left out.
fn chart_objects(
    files: &[File],
    values: &Value,
    namespace: &str,
) -> Result<BTreeMap<String, Value>, String> {
    let mut objects = BTreeMap::new();
    for file in files {
        let Some(name) = file.path.strip_prefix(&format!("{CHART_DIR}/templates/")) else {
            continue;
        };
        let rendered =
            render(&file.text, values, namespace).map_err(|err| format!("{name}: {err}"))?;
        if let Some(object) = document(&rendered, name) {
            objects.insert(name.to_string(), object);
        }
    }
    Ok(objects)
}

#[test]
fn the_chart_renders_to_the_kustomize_base() {
    let files = generated();
    let mut base = base_objects(&files);
    // The chart leaves the namespace to `helm install --create-namespace`.
    assert_eq!(
        base.remove("namespace.yaml").expect("a namespace")["metadata"]["name"],
        NAMESPACE
    );
    let chart = chart_objects(&files, &defaults(), NAMESPACE).expect("renders");
    assert_eq!(
        chart.keys().collect::<Vec<_>>(),
        base.keys().collect::<Vec<_>>()
    );
    for (name, object) in &base {
        assert_eq!(&chart[name], object, "{name}");
    }
    let text = |path: &str| {
        files
            .iter()
            .find(|f| f.path == path)
            .expect(path)
            .text
            .clone()
    };
    let crds = capstan_api::crds::to_yaml().expect("crds");
    assert_eq!(
        text(&format!("{BASE_DIR}/crds.yaml")),
        crds,
        "what `capstan crds` prints"
    );
    assert_eq!(text(&format!("{CHART_DIR}/crds/crds.yaml")), crds);
}

/// `objects` with the component's patches applied and its resources added.
fn with_component(
    files: &[File],
    name: &str,
    mut objects: BTreeMap<String, Value>,
) -> BTreeMap<String, Value> {
    let dir = format!("{COMPONENTS_DIR}/{name}/");
    let file = |rest: &str| {
        files
            .iter()
            .find(|f| f.path == format!("{dir}{rest}"))
            .unwrap_or_else(|| panic!("{dir}{rest}"))
            .text
            .clone()
    };
    let kustomization = document(&file("kustomization.yaml"), name).expect("kustomization");
    assert_eq!(kustomization["kind"], "Component");
    for resource in kustomization["resources"].as_array().into_iter().flatten() {
        let resource = resource.as_str().expect("a file");
        objects.insert(
            resource.to_string(),
            document(&file(resource), resource).expect("object"),
        );
    }
    for patch in kustomization["patches"].as_array().into_iter().flatten() {
        let target = &patch["target"];
        let operations: Value =
            serde_saphyr::from_str(patch["patch"].as_str().expect("text")).expect("ops");
        let operations: json_patch::Patch =
            serde_json::from_value(operations).expect("a JSON patch");
        let object = objects
            .values_mut()
            .find(|o| o["kind"] == target["kind"] && o["metadata"]["name"] == target["name"])
            .expect("the target");
        json_patch::patch(object, &operations).expect("applies");
    }
    objects
}

#[test]
fn each_chart_setting_renders_to_the_base_with_its_component() {
    let files = generated();
    let mut base = base_objects(&files);
    base.remove("namespace.yaml");
    for component in COMPONENTS {
        let name = component.name;
        let values = values_with(component.key, (component.value)());
        let chart = chart_objects(&files, &values, NAMESPACE).expect("renders");
        let expected = with_component(&files, name, base.clone());
        assert_eq!(
            chart.keys().collect::<Vec<_>>(),
            expected.keys().collect::<Vec<_>>(),
            "{name}"
        );
        for (file, object) in &expected {
            assert_eq!(&chart[file], object, "{name}: {file}");
        }
    }
}

fn deployment(values: &Value) -> Value {
    let files = generated();
    chart_objects(&files, values, NAMESPACE).expect("renders")["deployment.yaml"].clone()
}

fn args(deployment: &Value) -> Vec<String> {
    deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|arg| arg.as_str().expect("text").to_string())
        .collect()
}

#[test]
fn the_deployment_runs_capstan_sync_under_leader_election() {
    let deployment = deployment(&defaults());
    assert_eq!(
        args(&deployment),
        [
            "sync",
            "--repo=$(CAPSTAN_REPOSITORY)",
            "--branch=$(CAPSTAN_BRANCH)",
            "--path=$(CAPSTAN_PATH)",
            "--interval=$(CAPSTAN_INTERVAL)",
            "--controllers=$(CAPSTAN_CONTROLLERS)",
            "--worker-image=$(CAPSTAN_WORKER_IMAGE)",
            "--listen=0.0.0.0:9477",
            "--state-dir=/var/lib/capstan",
            "--leader-elect",
            "--lease-duration=15s",
            "--lease-grace=5s",
        ]
    );
    let spec = &deployment["spec"];
    let pod = &spec["template"]["spec"];
    let container = &pod["containers"][0];
    let version = env!("CARGO_PKG_VERSION");
    let cases: &[(&str, Value)] = &[
        ("replicas", spec["replicas"].clone()),
        ("image", container["image"].clone()),
        ("pod security", pod["securityContext"].clone()),
        ("container security", container["securityContext"].clone()),
        ("liveness", container["livenessProbe"]["httpGet"].clone()),
        ("readiness", container["readinessProbe"]["httpGet"].clone()),
        ("resources", container["resources"].clone()),
        ("service account", pod["serviceAccountName"].clone()),
        ("first env", container["env"][0].clone()),
        ("second env", container["env"][1].clone()),
        ("config env", container["env"][2].clone()),
    ];
    let expected: &[Value] = &[
        json!(2),
        json!(format!("ghcr.io/capstan-dev/capstan:v{version}")),
        json!({"fsGroup": 65532, "runAsGroup": 65532, "runAsNonRoot": true, "runAsUser": 65532,
               "seccompProfile": {"type": "RuntimeDefault"}}),
        json!({"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]},
               "readOnlyRootFilesystem": true, "runAsNonRoot": true}),
        json!({"path": "/healthz", "port": "http-metrics"}),
        json!({"path": "/readyz", "port": "http-metrics"}),
        json!({"limits": {"memory": "1Gi"}, "requests": {"cpu": "100m", "memory": "256Mi"}}),
        json!("capstan"),
        json!({"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}),
        json!({"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}),
        json!({"name": "CAPSTAN_REPOSITORY", "valueFrom": {"configMapKeyRef": {"name": "capstan", "key": "repository"}}}),
    ];
    for ((what, got), expected) in cases.iter().zip(expected) {
        assert_eq!(got, expected, "{what}");
    }
    let mounts: Vec<(String, String)> = container["volumeMounts"]
        .as_array()
        .expect("mounts")
        .iter()
        .map(|m| {
            (
                m["name"].as_str().unwrap_or("").into(),
                m["mountPath"].as_str().unwrap_or("").into(),
            )
        })
        .collect();
    assert_eq!(
        mounts,
        [
            ("state".to_string(), "/var/lib/capstan".to_string()),
            ("tmp".into(), "/tmp".into()),
            ("git-credentials".into(), "/etc/capstan/git".into()),
            ("webhook-secret".into(), "/etc/capstan/webhook".into()),
        ]
    );
}

#[test]
fn chart_values_reach_the_objects() {
    let with = |key: &str, value: Value| deployment(&values_with(key, value));
    let cases: &[(&str, Value, &str, Value)] = &[
        ("replicas", json!(3), "/spec/replicas", json!(3)),
        (
            "image.tag",
            json!("v9"),
            "/spec/template/spec/containers/0/image",
            json!("ghcr.io/capstan-dev/capstan:v9"),
        ),
        (
            "image.pullPolicy",
            json!("Always"),
            "/spec/template/spec/containers/0/imagePullPolicy",
            json!("Always"),
        ),
        (
            "credentials.secretName",
            json!("mine"),
            "/spec/template/spec/volumes/2/secret/secretName",
            json!("mine"),
        ),
        (
            "resources",
            json!({"limits": {"memory": "2Gi"}}),
            "/spec/template/spec/containers/0/resources",
            json!({"limits": {"memory": "2Gi"}}),
        ),
    ];
    for (key, value, pointer, expected) in cases {
        assert_eq!(
            with(key, value.clone()).pointer(pointer),
            Some(expected),
            "{key}"
        );
    }
    let without_election = args(&with("leaderElection.enabled", json!(false)));
    assert!(
        !without_election
            .iter()
            .any(|arg| arg.contains("lease") || arg.contains("leader")),
        "{without_election:?}"
    );
    let grace = args(&with("leaderElection.leaseGrace", json!("3s")));
    assert!(grace.contains(&"--lease-grace=3s".to_string()), "{grace:?}");

    let files = generated();
    let config = &chart_objects(
        &files,
        &values_with("repository.url", json!("ssh://git@example.com/fleet")),
        NAMESPACE,
    )
    .expect("renders")["config.yaml"];
    assert_eq!(config["data"]["repository"], "ssh://git@example.com/fleet");
    let rules = json!([{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]);
    let role = &chart_objects(
        &files,
        &values_with("rbac.repositoryRules", rules.clone()),
        NAMESPACE,
    )
    .expect("renders")["clusterrole-repository.yaml"];
    assert_eq!(role["rules"], rules);
}

#[test]
fn the_chart_installs_in_capstans_namespace_only() {
    let files = generated();
    let error = chart_objects(&files, &defaults(), "default").expect_err("refused");
    assert!(error.contains("install the chart there (helm install capstan charts/capstan --namespace capstan-system --create-namespace)"), "{error}");
}

#[test]
fn values_yaml_holds_every_setting_and_every_setting_is_used() {
    let files = generated();
    let text = |path: &str| {
        files
            .iter()
            .find(|f| f.path == path)
            .expect(path)
            .text
            .clone()
    };
    let parsed: Value =
        serde_saphyr::from_str(&text(&format!("{CHART_DIR}/values.yaml"))).expect("values.yaml");
    assert_eq!(parsed, defaults());
    let templates: String = files
        .iter()
        .filter(|f| f.path.starts_with(&format!("{CHART_DIR}/templates/")))
        .map(|f| f.text.as_str())
        .collect();
    for setting in SETTINGS {
        assert!(
            templates.contains(&format!(".Values.{} ", setting.key)),
            "{} is used by no template",
            setting.key
        );
    }
    let chart: Value =
        serde_saphyr::from_str(&text(&format!("{CHART_DIR}/Chart.yaml"))).expect("Chart.yaml");
    assert_eq!(chart["version"], env!("CARGO_PKG_VERSION"));
}

#[test]
fn the_cluster_role_is_the_rbac_table_with_its_parts_named() {
    let files = generated();
    let text = &files
        .iter()
        .find(|f| f.path == CLUSTER_ROLE_FILE)
        .expect("clusterrole")
        .text;
    let role: Value = serde_saphyr::from_str(text).expect("yaml");
    assert_eq!(
        role["rules"],
        serde_json::to_value(crate::rbac::rules_for(&crate::controllers::Selection::all()))
            .expect("rules")
    );
    assert!(
        text.contains(
            "# drain (create)\n- apiGroups:\n  - \"\"\n  resources:\n  - pods/eviction\n"
        ),
        "{text}"
    );
    let kustomization: Value = serde_saphyr::from_str(
        &files
            .iter()
            .find(|f| f.path == format!("{BASE_DIR}/kustomization.yaml"))
            .expect("kustomization")
            .text,
    )
    .expect("yaml");
    let listed: Vec<&str> = kustomization["resources"]
        .as_array()
        .expect("list")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let in_base: Vec<String> = files
        .iter()
        .filter_map(|f| {
            f.path
                .strip_prefix(&format!("{BASE_DIR}/"))
                .map(str::to_string)
        })
        .filter(|name| name != "kustomization.yaml")
        .collect();
    let mut sorted_listed: Vec<&str> = listed.clone();
    sorted_listed.sort();
    let mut sorted_base: Vec<&str> = in_base.iter().map(String::as_str).collect();
    sorted_base.sort();
    assert_eq!(
        sorted_listed, sorted_base,
        "kustomization.yaml lists every file of the base"
    );
}

#[test]
fn markers_become_template_expressions() {
    let cases: &[(&str, &str)] = &[
        ("  name: capstan\n", "  name: capstan\n"),
        (
            "  namespace: \"@@Release.Namespace@@\"\n",
            "  namespace: {{ .Release.Namespace | quote }}\n",
        ),
        (
            "  replicas: \"@@replicas@@\"\n",
            "  replicas: {{ .Values.replicas }}\n",
        ),
        (
            "  imagePullPolicy: \"@@image.pullPolicy@@\"\n",
            "  imagePullPolicy: {{ .Values.image.pullPolicy | quote }}\n",
        ),
        (
            "    image: \"@@image.repository@@:@@image.tag@@\"\n",
            "    image: \"{{ .Values.image.repository }}:{{ .Values.image.tag }}\"\n",
        ),
        (
            "    resources: \"@@block:resources@@\"\n",
            "    resources:\n      {{- toYaml .Values.resources | nindent 6 }}\n",
        ),
        (
            "    - \"@@if:webhook.enabled@@--webhook-secret-file=/etc/capstan/webhook/secret\"\n",
            "    {{- if .Values.webhook.enabled }}\n    - --webhook-secret-file=/etc/capstan/webhook/secret\n    {{- end }}\n",
        ),
        (
            "    - \"@@if:credentials.type=ssh@@--ssh-key=/etc/capstan/git/identity\"\n",
            "    {{- if eq .Values.credentials.type \"ssh\" }}\n    - --ssh-key=/etc/capstan/git/identity\n    {{- end }}\n",
        ),
        (
            "    - \"@@if:leaderElection.enabled@@--lease-grace=@@leaderElection.leaseGrace@@\"\n",
            "    {{- if .Values.leaderElection.enabled }}\n    - --lease-grace={{ .Values.leaderElection.leaseGrace }}\n    {{- end }}\n",
        ),
        (
            "    - \"@@if:leaderElection.enabled@@--leader-elect\"\n    - \"@@if:leaderElection.enabled@@--lease-grace=5s\"\n    - \"@@if:webhook.enabled@@--webhook\"\n",
            "    {{- if .Values.leaderElection.enabled }}\n    - --leader-elect\n    - --lease-grace=5s\n    {{- end }}\n    \
             {{- if .Values.webhook.enabled }}\n    - --webhook\n    {{- end }}\n",
        ),
    ];
    for (yaml, expected) in cases {
        assert_eq!(
            helm::template(yaml).expect("templated"),
            *expected,
            "{yaml}"
        );
    }
}
