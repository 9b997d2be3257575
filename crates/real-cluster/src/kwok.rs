//! kwok's configuration: its own stages for nodes (initialise, heartbeat with a lease) and
//! pods (ready, delete), copied from its module by the build, and capstan's stages for
//! pods that run to completion.
//!
//! kwok's own completion stage completes only pods a Job owns. A KMM worker pod is owned by
//! its NodeModulesConfig and runs once (`restartPolicy: Never`): on a real node its
//! container exits when modprobe is done. Here every pod that runs to completion exits 0
//! as soon as it runs, and the NMC controller reads it as upstream KMM does. A pod whose
//! [`FAIL_ON_NODES_ANNOTATION`] names its node (a check pod a test makes fail on chosen
//! nodes) exits 1 instead, as on the embedded cluster.

use std::path::Path;

use anyhow::Context as _;
use capstan_api::labels::WORKER_CONFIG_ANNOTATION;
use capstan_cluster::sim::kubelet::FAIL_ON_NODES_ANNOTATION;

/// A running pod whose containers are not restarted exits: `{code}`, its containers
/// terminated with `{reason}` (the template of kwok's `pod-complete`, without its Job
/// selector). `{selector}` adds match expressions.
const RUN_TO_COMPLETION: &str = r#"apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: {name}
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.status.phase'
      operator: 'In'
      values:
      - 'Running'
    - key: '.spec.restartPolicy'
      operator: 'In'
      values:
      - 'Never'
      - 'OnFailure'
{selector}  next:
    statusTemplate: |
      {{ $now := Now }}
      containerStatuses:
      {{ range $index, $item := .spec.containers }}
      - image: {{ $item.image | Quote }}
        name: {{ $item.name | Quote }}
        ready: false
        restartCount: 0
        started: false
        state:
          terminated:
            exitCode: {code}
            finishedAt: {{ $now | Quote }}
            reason: {reason}
            message: {message}
            startedAt: {{ $now | Quote }}
      {{ end }}
      phase: {phase}
"#;

/// A match expression: whether the worker config of a KMM worker pod names `image`.
fn names_image(image: &str, operator: &str) -> String {
    format!(
        "    - key: '.metadata.annotations[\"{WORKER_CONFIG_ANNOTATION}\"] // \"\" | contains(\"containerImage: {image}\")'\n      operator: '{operator}'\n      values:\n      - 'true'\n"
    )
}

/// A match expression: whether the pod's [`FAIL_ON_NODES_ANNOTATION`] (comma-separated
/// node names) names its node. kwok evaluates the key with gojq against the pod and
/// compares `true` as the string `'true'`; a pod without the annotation gives `false`.
fn fails_on_its_node(operator: &str) -> String {
    format!(
        "    - key: '.spec.nodeName as $n | (.metadata.annotations[\"{FAIL_ON_NODES_ANNOTATION}\"] // \"\") | split(\",\") | any(.[]; trim == $n)'\n      operator: '{operator}'\n      values:\n      - 'true'\n"
    )
}

/// The completion stages: KMM worker pods whose kmod image is one of `broken_images` fail
/// as the worker does when it cannot pull it (as the embedded cluster's `brokenImages`);
/// other pods whose [`FAIL_ON_NODES_ANNOTATION`] names their node fail with its message;
/// every other pod that runs to completion succeeds. Each pod matches one stage at most.
fn completion_stages(broken_images: &[String]) -> Vec<String> {
    let stage = |name: &str, selector: &str, code: u8, reason: &str, message: &str, phase: &str| {
        RUN_TO_COMPLETION
            .replace("{name}", name)
            .replace("{selector}", selector)
            .replace("{code}", &code.to_string())
            .replace("{reason}", reason)
            .replace("{message}", message)
            .replace("{phase}", phase)
    };
    let mut stages = Vec::new();
    let mut healthy = String::new();
    for (i, image) in broken_images.iter().enumerate() {
        stages.push(stage(
            &format!("pod-worker-image-broken-{i}"),
            &names_image(image, "In"),
            1,
            "Error",
            &format!("'pulling image {image}: manifest unknown'"),
            "Failed",
        ));
        healthy.push_str(&names_image(image, "NotIn"));
    }
    // Not a worker whose image is broken (`healthy` so far), and its node named. The
    // message is rendered within the template's range over containers: `$` is the pod.
    stages.push(stage(
        "pod-fail-on-nodes",
        &format!("{healthy}{}", fails_on_its_node("In")),
        1,
        "Error",
        &format!("'failed on {{{{ $.spec.nodeName }}}} ({FAIL_ON_NODES_ANNOTATION})'"),
        "Failed",
    ));
    healthy.push_str(&fails_on_its_node("NotIn"));
    stages.push(stage(
        "pod-run-to-completion",
        &healthy,
        0,
        "Completed",
        "''",
        "Succeeded",
    ));
    stages
}

/// The stage files the build copies from kwok's module (`kustomize/stage/...`).
pub const UPSTREAM_STAGES: [&str; 4] = [
    "node-initialize.yaml",
    "node-heartbeat-with-lease.yaml",
    "pod-ready.yaml",
    "pod-delete.yaml",
];

/// kwok's options: more stage workers than its defaults (4 pod, 4 node, 4 lease, 1
/// pods-on-node), which leave a fleet of a thousand nodes' pods waiting on kwok rather than
/// on the controllers under test.
const OPTIONS: &str = "apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokConfiguration
options:
  podPlayStageParallelism: 16
  nodePlayStageParallelism: 8
  nodeLeaseParallelism: 8
  podsOnNodeSyncParallelism: 4";

/// kwok's `--config`: its options, upstream's stages from `stages` and capstan's completion
/// stages, one YAML document each.
pub fn config(stages: &Path, broken_images: &[String]) -> anyhow::Result<String> {
    let mut documents = vec![OPTIONS.to_string()];
    for name in UPSTREAM_STAGES {
        let path = stages.join(name);
        let text = std::fs::read_to_string(&path).with_context(|| {
            format!(
                "reading {}: rebuild the control plane with hack/real-cluster/build",
                path.display()
            )
        })?;
        documents.push(text.trim_end().to_string());
    }
    documents.extend(
        completion_stages(broken_images)
            .into_iter()
            .map(|stage| stage.trim_end().to_string()),
    );
    Ok(documents.join("\n---\n") + "\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_broken_image_fails_its_workers_and_is_left_out_of_the_healthy_completion() {
        let stages = completion_stages(&["registry.example/broken:v1".to_string()]);
        assert_eq!(stages.len(), 3);
        let (broken, fail, healthy) = (&stages[0], &stages[1], &stages[2]);
        assert!(
            broken.contains("name: pod-worker-image-broken-0"),
            "{broken}"
        );
        assert!(broken.contains("phase: Failed") && broken.contains("exitCode: 1"));
        assert!(
            broken.contains(
                "contains(\"containerImage: registry.example/broken:v1\")'\n      operator: 'In'"
            ),
            "{broken}"
        );
        assert!(!broken.contains(FAIL_ON_NODES_ANNOTATION), "{broken}");
        // A worker of the broken image fails as such, whatever its annotations.
        assert!(
            fail.contains(
                "contains(\"containerImage: registry.example/broken:v1\")'\n      operator: 'NotIn'"
            ),
            "{fail}"
        );
        assert!(healthy.contains("name: pod-run-to-completion"));
        assert!(healthy.contains("phase: Succeeded") && healthy.contains("exitCode: 0"));
        assert!(
            healthy.contains(
                "contains(\"containerImage: registry.example/broken:v1\")'\n      operator: 'NotIn'"
            ),
            "{healthy}"
        );
    }

    #[test]
    fn a_pod_fails_on_the_nodes_its_annotation_names_and_only_there() {
        let stages = completion_stages(&[]);
        assert_eq!(stages.len(), 2);
        let (fail, healthy) = (&stages[0], &stages[1]);
        assert!(fail.contains("name: pod-fail-on-nodes"), "{fail}");
        assert_eq!(
            fails_on_its_node("In"),
            "    - key: '.spec.nodeName as $n | (.metadata.annotations[\"sim.capstan.dev/fail-on-nodes\"] // \"\") | split(\",\") | any(.[]; trim == $n)'\n      operator: 'In'\n      values:\n      - 'true'\n"
        );
        assert!(
            fail.contains(&format!(
                "- 'OnFailure'\n{}  next:",
                fails_on_its_node("In")
            )),
            "{fail}"
        );
        assert!(fail.contains("phase: Failed") && fail.contains("exitCode: 1"));
        assert!(fail.contains("reason: Error"), "{fail}");
        assert!(
            fail.contains(
                "message: 'failed on {{ $.spec.nodeName }} (sim.capstan.dev/fail-on-nodes)'"
            ),
            "{fail}"
        );
        assert!(
            healthy.contains(&format!(
                "- 'OnFailure'\n{}  next:",
                fails_on_its_node("NotIn")
            )),
            "{healthy}"
        );
    }

    #[test]
    fn without_broken_images_every_other_pod_that_runs_to_completion_succeeds() {
        let stages = completion_stages(&[]);
        assert!(
            stages.iter().all(|s| !s.contains("containerImage")),
            "{stages:?}"
        );
        let healthy = &stages[1];
        assert!(healthy.contains("name: pod-run-to-completion"), "{healthy}");
        assert!(healthy.contains("phase: Succeeded") && healthy.contains("exitCode: 0"));
    }

    #[test]
    fn the_stages_parse_as_yaml() {
        for stage in completion_stages(&["registry.example/broken:v1".to_string()]) {
            let parsed: serde_json::Value =
                serde_saphyr::from_str(&stage).unwrap_or_else(|e| panic!("{e}: {stage}"));
            assert_eq!(parsed["kind"], "Stage", "{stage}");
        }
    }
}
