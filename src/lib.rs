//! capstan: a GitOps reconciler for ordered, node-level upgrades on Kubernetes.
//!
//! The crate holds the command line's implementation (`cli`), the Rust types of the
//! kinds capstan handles (`api`) and the embedded cluster it runs against by default
//! and in tests (`cluster`).

pub mod api;
pub mod cli;
pub mod clock;
pub mod cluster;
pub mod controllers;
pub mod memo;
pub mod sync;
pub mod worker;

/// mimalloc for every binary built on this crate (capstan, its tests and benches). The
/// embedded cluster and the controllers allocate and free small JSON values on every
/// request and watch event; glibc's allocator spent about a third of their CPU doing it
/// (docs/benchmarks.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Installs ring as the process's rustls crypto provider. kube and every other TLS
/// user must share one provider, or the first TLS connection panics; call this once
/// at start-up (later calls are harmless).
pub fn install_crypto_provider() {
    // Err means a provider is already installed, which is what we want.
    let _ = rustls::crypto::ring::default_provider().install_default();
}
