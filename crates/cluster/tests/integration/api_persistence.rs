//! With `--state-dir`, an acknowledged write survives kill -9: the restarted server has
//! the same objects at the same resourceVersions, and new writes continue above them.

use crate::common;

use std::path::Path;
use std::process::{Child, Command, Stdio};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;

fn serve(state_dir: &Path, kubeconfig: &Path) -> Child {
    let _ = std::fs::remove_file(kubeconfig);
    Command::new(env!("CARGO_BIN_EXE_capstan-cluster"))
        .args(["--listen", "127.0.0.1:0", "--state-dir"])
        .arg(state_dir)
        .arg("--kubeconfig-out")
        .arg(kubeconfig)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn capstan-cluster")
}

async fn client_from(kubeconfig: &Path) -> kube::Client {
    common::wait_until("the kubeconfig is written", || async {
        kubeconfig.exists()
    })
    .await;
    let text = std::fs::read_to_string(kubeconfig).expect("kubeconfig");
    let config: kube::config::Kubeconfig = serde_saphyr::from_str(&text).expect("parse kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(config, &Default::default())
        .await
        .expect("config");
    kube::Client::try_from(config).expect("client")
}

#[tokio::test]
async fn objects_and_versions_survive_kill_9() {
    capstan_api::install_crypto_provider();
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let kubeconfig = dir.path().join("kubeconfig");

    let mut first = serve(&state, &kubeconfig);
    let client = client_from(&kubeconfig).await;
    let maps = Api::<ConfigMap>::namespaced(client.clone(), "default");
    let mut written = Vec::new();
    for i in 0..20 {
        let cm = common::config_map(&format!("cm-{i}"), json!({"i": i.to_string()}));
        written.push(
            maps.create(&PostParams::default(), &cm)
                .await
                .expect("create"),
        );
    }
    maps.delete("cm-0", &DeleteParams::default())
        .await
        .expect("delete");
    first.kill().expect("kill -9");
    first.wait().expect("reaped");

    let mut second = serve(&state, &kubeconfig);
    let client = client_from(&kubeconfig).await;
    let maps = Api::<ConfigMap>::namespaced(client.clone(), "default");
    assert!(
        maps.get_opt("cm-0").await.expect("get").is_none(),
        "the delete survived"
    );
    for before in &written[1..] {
        let name = before.metadata.name.as_deref().expect("name");
        let after = maps.get(name).await.expect("object survived");
        assert_eq!(
            after.metadata.resource_version, before.metadata.resource_version,
            "{name}"
        );
        assert_eq!(after.metadata.uid, before.metadata.uid, "{name}");
        assert_eq!(after.data, before.data, "{name}");
    }
    let last_rv: u64 = written
        .last()
        .and_then(|o| o.metadata.resource_version.as_deref())
        .expect("rv")
        .parse()
        .expect("number");
    let next = maps
        .create(
            &PostParams::default(),
            &common::config_map("after", json!({})),
        )
        .await
        .expect("write after restart");
    let next_rv: u64 = next
        .metadata
        .resource_version
        .as_deref()
        .expect("rv")
        .parse()
        .expect("number");
    assert!(next_rv > last_rv + 1, "versions continue above the delete");
    second.kill().expect("kill");
    second.wait().expect("reaped");
}
