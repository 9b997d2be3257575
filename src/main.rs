use clap::Parser as _;

#[tokio::main]
async fn main() {
    capstan::install_crypto_provider();
    capstan::cli::init_logging();
    let cli = capstan::cli::Cli::parse();
    let code = match capstan::cli::run(cli).await {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            1
        }
    };
    std::process::exit(code);
}
