//! The shared test support under one name (waits, Git repositories and fleet manifests
//! from `capstan_testing`, the embedded cluster's test API from `capstan_cluster::testing`),
//! and what only capstan's own tests need.

pub use capstan_cluster::testing::*;
pub use capstan_testing::*;

/// A syncer of the repository at `repo` into the cluster of `client`.
pub async fn syncer(client: &kube::Client, repo: &std::path::Path) -> capstan::sync::run::Syncer {
    let state = tempfile::tempdir().expect("tempdir");
    let source = capstan::sync::source::Source::open(
        repo.to_str().expect("utf-8 path"),
        "main",
        None,
        state.path(),
        capstan::sync::source::Auth::None,
    )
    .expect("source opens");
    capstan::sync::run::Syncer::start(
        client.clone(),
        source,
        capstan::sync::run::SyncOptions::default(),
        std::sync::Arc::new(capstan::sync::metrics::Metrics::new()),
    )
    .await
    .expect("syncer starts")
}
