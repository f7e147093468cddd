//! The `dpledger` binary: see `dpledger --help`.

use clap::Parser;

fn main() {
    let cli = dpledger::cli::Cli::parse();
    dpledger::cli::init_logging(cli.log_format);
    if let Err(message) = dpledger::cli::run(cli) {
        eprintln!("error: {message}");
        std::process::exit(2);
    }
}
