//! The command line of the embedded cluster: `capstan cluster serve --config` runs the
//! simulated nodes of a cluster.yaml over HTTPS, `capstan cluster node ...` operates them,
//! and `capstan crds` prints CRDs a server accepts.

use crate::common;

use std::path::Path;
use std::process::{Command, Stdio};

use k8s_openapi::api::core::v1::Node;
use kube::api::Api;

fn capstan(args: &[&str], kubeconfig: &Path) -> serde_json::Value {
    let output = Command::new(env!("CARGO_BIN_EXE_capstan"))
        .args(args)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .output()
        .expect("run capstan");
    assert!(
        output.status.success(),
        "capstan {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("JSON output")
}

#[tokio::test]
async fn serve_a_cluster_yaml_and_reboot_a_node_from_the_command_line() {
    common::requires_stand_in("`capstan cluster` command");
    capstan_api::install_crypto_provider();
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("cluster.yaml");
    std::fs::write(
        &config,
        "nodes:\n  - {name: cp, role: master}\n  - {name: w1, kernel: 6.1.4-200.fc37.x86_64}\n",
    )
    .expect("config");
    let kubeconfig = dir.path().join("kubeconfig");
    let mut server = Command::new(env!("CARGO_BIN_EXE_capstan"))
        .args(["cluster", "serve", "--config"])
        .arg(&config)
        .arg("--kubeconfig-out")
        .arg(&kubeconfig)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("serve");
    common::wait_until("the kubeconfig is written", || async {
        kubeconfig.exists()
    })
    .await;

    let shown = capstan(&["cluster", "node", "show", "w1"], &kubeconfig);
    assert_eq!(shown["kernel"], "6.1.4-200.fc37.x86_64");
    let rebooted = capstan(&["cluster", "node", "reboot", "w1"], &kubeconfig);
    assert_ne!(rebooted["bootID"], shown["bootID"]);
    assert_eq!(rebooted["ready"], true);
    let upgraded = capstan(
        &[
            "cluster",
            "node",
            "upgrade-kernel",
            "w1",
            "6.2.0-1.fc38.x86_64",
        ],
        &kubeconfig,
    );
    assert_eq!(upgraded["kernel"], "6.2.0-1.fc38.x86_64");
    let not_ready = capstan(&["cluster", "node", "not-ready", "w1"], &kubeconfig);
    assert_eq!(not_ready["ready"], false);

    let text = std::fs::read_to_string(&kubeconfig).expect("kubeconfig");
    let parsed: kube::config::Kubeconfig = serde_saphyr::from_str(&text).expect("kubeconfig");
    // As `cluster serve --help` says: always HTTPS, the cluster's own CA in the kubeconfig.
    let served = parsed.clusters[0].cluster.as_ref().expect("a cluster");
    let url = served.server.as_deref().unwrap_or_default();
    assert!(url.starts_with("https://127.0.0.1:"), "{url}");
    assert!(served.certificate_authority_data.is_some(), "{text}");
    let config = kube::Config::from_custom_kubeconfig(parsed, &Default::default())
        .await
        .expect("config");
    let client = kube::Client::try_from(config).expect("client");
    let node = Api::<Node>::all(client)
        .get("w1")
        .await
        .expect("node over the API");
    let labels = node.metadata.labels.expect("labels");
    assert!(labels.contains_key("node-role.kubernetes.io/worker"));

    let _ = capstan(&["cluster", "node", "remove", "w1"], &kubeconfig);
    server.kill().expect("kill");
    server.wait().expect("reaped");
}

#[test]
fn a_bad_cluster_yaml_is_refused_naming_the_field() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("cluster.yaml");
    std::fs::write(&config, "nodes:\n  - {name: w1, kernal: 6.1}\n").expect("config");
    let output = Command::new(env!("CARGO_BIN_EXE_capstan"))
        .args(["cluster", "serve", "--config"])
        .arg(&config)
        .output()
        .expect("run");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("cluster.yaml") && stderr.contains("kernal"),
        "{stderr}"
    );
}
