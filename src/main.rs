//! The `dpledger` binary: see `dpledger --help`.

use clap::Parser;

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("DPLEDGER_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = dpledger::cli::Cli::parse();
    if let Err(message) = dpledger::cli::run(cli) {
        eprintln!("error: {message}");
        std::process::exit(2);
    }
}
