//! `capstan-cluster`: the embedded cluster served as a process, as `capstan cluster serve`
//! does, for the embedded cluster's own tests and benchmarks.

use clap::Parser as _;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Serve the embedded Kubernetes cluster until SIGINT or SIGTERM.
#[derive(Debug, clap::Parser)]
#[command(name = "capstan-cluster", version)]
struct Cli {
    #[command(flatten)]
    serve: capstan_cluster::cli::ServeArgs,
}

#[tokio::main]
async fn main() {
    capstan_api::install_crypto_provider();
    let cli = Cli::parse();
    let code = match capstan_cluster::cli::serve(cli.serve, interrupted()).await {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            1
        }
    };
    std::process::exit(code);
}

/// SIGINT or SIGTERM: the cluster has nothing to drain, so the first one stops it.
async fn interrupted() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
