//! The `dpledger` binary: see `dpledger --help`.

use clap::Parser;

fn main() {
    let cli = dpledger::cli::Cli::parse();
    let default_filter = cli.default_log_filter();
    dpledger::cli::init_logging(cli.log_format, default_filter);
    if let Err(message) = dpledger::cli::run(cli) {
        eprintln!("error: {message}");
        std::process::exit(2);
    }
}
