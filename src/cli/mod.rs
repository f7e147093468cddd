//! Command-line interface: `dpledger <command>`.

pub mod accountant;

use clap::{Parser, Subcommand};

/// Per-instance Rényi-DP privacy accounting for DP-SGD.
#[derive(Debug, Parser)]
#[command(name = "dpledger", version, about)]
pub struct Cli {
    /// The command to run.
    #[command(subcommand)]
    pub command: Command,
}

/// Every subcommand.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// RDP of one Poisson-subsampled Gaussian step at each order.
    Rdp(JsonFlag<accountant::RdpCmd>),
    /// Worst-case epsilon of T identical steps.
    Epsilon(JsonFlag<accountant::EpsilonCmd>),
    /// Noise multiplier that reaches a target epsilon.
    Noise(JsonFlag<accountant::NoiseCmd>),
    /// Exact RDP next to zCDP and classical composition theorems.
    Compare(JsonFlag<accountant::CompareCmd>),
    /// Noise decay schedule and the epoch at which a budget runs out.
    Schedule(JsonFlag<accountant::ScheduleCmd>),
}

/// A command's own arguments plus `--json`.
#[derive(Debug, clap::Args)]
pub struct JsonFlag<T: clap::Args> {
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub inner: T,
}

/// Run the parsed command; `Err` carries the one-line message for stderr.
pub fn run(cli: Cli) -> Result<(), String> {
    let (json, result) = match &cli.command {
        Command::Rdp(c) => (c.json, c.inner.run()),
        Command::Epsilon(c) => (c.json, c.inner.run()),
        Command::Noise(c) => (c.json, c.inner.run()),
        Command::Compare(c) => (c.json, c.inner.run()),
        Command::Schedule(c) => (c.json, c.inner.run()),
    };
    let (value, text) = result.map_err(|e| e.to_string())?;
    let out = if json { format!("{value}\n") } else { text };
    write_stdout(&out)
}

/// Write to stdout; a closed pipe (`dpledger ... | head`) is not an error.
pub fn write_stdout(text: &str) -> Result<(), String> {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|_| stdout.flush())
    {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(format!("writing output: {e}")),
        _ => Ok(()),
    }
}
