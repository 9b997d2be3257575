use clap::Parser as _;

/// mimalloc: the controllers (and the embedded cluster, when capstan runs it) allocate and
/// free small JSON values on every request and watch event; glibc's allocator spent about
/// a third of their CPU doing it (docs/benchmarks.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() {
    capstan_api::install_crypto_provider();
    let cli = capstan::cli::Cli::parse();
    capstan::cli::init_logging(&cli);
    let code = match capstan::cli::run(cli).await {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            1
        }
    };
    std::process::exit(code);
}
