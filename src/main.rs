use clap::Parser as _;

#[tokio::main]
async fn main() {
    capstan::install_crypto_provider();
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
