//! Command-line interface: `dpledger <command>`.

pub mod accountant;
pub mod cluster;
pub mod data_dependent;
pub mod demo;
pub mod loadgen;
mod loadgen_phase;
mod lock;
mod release_load;
pub mod server;

use crate::accounting::InvalidArgument as accounting_error;
use clap::{Parser, Subcommand};

/// Per-instance Rényi-DP privacy accounting for DP-SGD.
#[derive(Debug, Parser)]
#[command(name = "dpledger", version, about, after_help = LOGGING_HELP)]
pub struct Cli {
    /// How log lines are written to stderr: `text` (for people; coloured only
    /// when stderr is a terminal and NO_COLOR is unset) or `json` (one object
    /// per line, for a log collector).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text,
          env = "DPLEDGER_LOG_FORMAT")]
    pub log_format: LogFormat,
    /// The command to run.
    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    /// The log filter when `DPLEDGER_LOG` is unset: `info` for `serve` (one
    /// access line per request), `warn` for the commands a person runs in a
    /// terminal (the demo's in-process server would otherwise print a line
    /// per simulated request over its report).
    pub fn default_log_filter(&self) -> &'static str {
        match self.command {
            Command::Serve(_) => "info",
            _ => "warn",
        }
    }
}

/// What `--help` says about logging (the filter is an environment variable so
/// that it applies before the command line is read).
const LOGGING_HELP: &str =
    "Logging: DPLEDGER_LOG sets the filter (default `info` for serve: one access-log \
line per request, target dpledger::access; `warn` for the other commands; e.g. `warn`, `debug`, \
`info,dpledger::access=warn`, `info,postgres=info,tokio_postgres=info` for PostgreSQL's notices), \
DPLEDGER_LOG_FORMAT or --log-format `text`|`json` the format. Logs go to stderr; \
they never hold tokens, request bodies or per-example values. See docs/operations.md.";

/// Filter directives that keep PostgreSQL's NOTICEs below INFO.
const QUIET_NOTICES: &str = "postgres::config=warn,tokio_postgres::connection=warn";

/// Log line formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Install the process's log subscriber: `DPLEDGER_LOG`'s filter (default
/// `default_filter`: [`Cli::default_log_filter`]) in `format`, on stderr. PostgreSQL's NOTICEs (which the driver logs
/// at INFO, e.g. `relation ... already exists, skipping` at every start) are
/// kept below the default level unless the filter names `postgres` (the
/// blocking driver logs them under `postgres::config`, the async one under
/// `tokio_postgres::connection`).
pub fn init_logging(format: LogFormat, default_filter: &str) {
    use std::io::IsTerminal;
    let filter = std::env::var("DPLEDGER_LOG").unwrap_or_else(|_| default_filter.into());
    let filter = if filter.contains("postgres") {
        filter
    } else {
        format!("{filter},{QUIET_NOTICES}")
    };
    let filter = tracing_subscriber::EnvFilter::try_new(&filter).unwrap_or_else(|e| {
        eprintln!("warning: ignoring DPLEDGER_LOG ({e}); logging at info");
        tracing_subscriber::EnvFilter::new(format!("info,{QUIET_NOTICES}"))
    });
    let ansi = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.with_ansi(ansi).init(),
        LogFormat::Json => builder
            .json()
            .with_ansi(false)
            .with_current_span(true)
            .with_span_list(false)
            .init(),
    }
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
    /// Recompute per-example epsilons offline from a JSON-lines trace.
    Replay(JsonFlag<ReplayCmd>),
    /// Thudi et al.'s expected composition over several runs (an estimate).
    DataDependent(JsonFlag<data_dependent::DataDependentCmd>),
    /// Run the HTTP service.
    Serve(Box<server::ServeCmd>),
    /// Mint a bearer token with the server secret.
    Token(server::TokenCmd),
    /// Print or write the OpenAPI document.
    Openapi(server::OpenApiCmd),
    /// Simulate a DP-SGD run against a temporary service and show the epsilon spread.
    Demo(demo::DemoCmd),
    /// Load a running server and report throughput and latency against baselines.
    Loadgen(JsonFlag<loadgen::LoadgenCmd>),
    /// Rank errors of the DP quantile methods on the release accuracy benchmark's data.
    ReleaseAccuracy(JsonFlag<ReleaseAccuracyCmd>),
    /// Drop log payloads that a verified snapshot stands in for (keeps what an
    /// audit needs: the pinned snapshot, every later record, every checksum).
    Compact(CompactCmd),
    /// Operate a cluster of nodes: drain one, print the cluster map.
    Cluster(cluster::ClusterCmd),
}

/// `dpledger compact`.
#[derive(Debug, clap::Args)]
pub struct CompactCmd {
    /// `sqlite:PATH` or `postgres://...`; default `sqlite:<data-dir>/dpledger.sqlite`.
    #[arg(long, env = "DPLEDGER_STORE")]
    pub store: Option<String>,
    #[command(flatten)]
    pub data: server::DataDirArg,
    /// Compact only this dataset (default: every dataset).
    #[arg(long)]
    pub dataset: Option<String>,
}

impl CompactCmd {
    /// Compact and describe what was done (JSON).
    pub fn run(&self) -> anyhow::Result<String> {
        let store = self.data.open_store(self.store.as_deref())?;
        let outcomes = crate::engine::compact_store(store.as_ref(), self.dataset.as_deref())?;
        Ok(serde_json::to_string_pretty(&outcomes)? + "\n")
    }
}

/// `dpledger release-accuracy`: both quantile methods on `B·Beta(1.5, 6)` data,
/// without and with a share of values at `B`, like Table 2 of Yu et al. 2022, and on
/// heavily tied per-example epsilons, and on training-like
/// traces under the min rule, per group and for the histogram near B.
#[derive(Debug, clap::Args)]
pub struct ReleaseAccuracyCmd {
    /// Values drawn.
    #[arg(long, default_value_t = 50_000)]
    pub n: usize,
    /// zCDP cost of each method's release of all levels.
    #[arg(long, default_value_t = 0.00125)]
    pub rho: f64,
    /// Trials averaged.
    #[arg(long, default_value_t = 20)]
    pub trials: usize,
    /// Seed of the data and the noise.
    #[arg(long, default_value_t = 2022)]
    pub seed: u64,
    /// Share of values exactly at B in the second population.
    #[arg(long, default_value_t = 0.2)]
    pub share_at_bound: f64,
    /// Shares at B of the training-like min-rule traces (continuous and tied).
    #[arg(long, value_delimiter = ',', default_values_t = vec![0.2, 0.3, 0.4])]
    pub min_rule_shares: Vec<f64>,
}

impl ReleaseAccuracyCmd {
    fn run(&self) -> Result<(serde_json::Value, String), String> {
        if self.n == 0 || self.trials == 0 {
            return Err("invalid --n/--trials: must be at least 1".into());
        }
        crate::accounting::validate::positive("rho", self.rho).map_err(|e| e.to_string())?;
        if !(0.0..1.0).contains(&self.share_at_bound) {
            return Err("invalid --share-at-bound: must be in [0, 1)".into());
        }
        if self.min_rule_shares.iter().any(|s| !(*s > 0.0 && *s < 1.0)) {
            return Err("invalid --min-rule-shares: each must be in (0, 1)".into());
        }
        let levels = [0.1, 0.3, 0.5, 0.7, 0.9];
        use crate::release::accuracy::{Norms, Population};
        const NORMS: [Norms; 3] = [Norms::Varying, Norms::Persistent, Norms::Classes];
        let reports: Vec<_> = [
            Population::Beta {
                share_at_bound: 0.0,
            },
            Population::Beta {
                share_at_bound: self.share_at_bound,
            },
            Population::Tied,
        ]
        .into_iter()
        .chain(NORMS.into_iter().flat_map(|norms| {
            self.min_rule_shares
                .iter()
                .map(move |&share_at_bound| Population::MinRule {
                    share_at_bound,
                    norms,
                })
        }))
        .map(|population| {
            crate::release::accuracy::compare_methods(
                self.seed,
                self.n,
                population,
                &levels,
                self.rho,
                self.trials,
            )
        })
        .collect();
        use crate::release::accuracy::{compare_groups, histogram_near_bound};
        let share = self.min_rule_shares.get(1).copied().unwrap_or(0.3);
        let groups: Vec<_> = NORMS
            .into_iter()
            .map(|norms| {
                let (n, rho, trials) = (self.n, self.rho, self.trials);
                compare_groups(self.seed, n, share, norms, &levels, rho, trials)
            })
            .collect();
        let (n, rho, trials) = (self.n, self.rho, 10 * self.trials);
        let histogram =
            histogram_near_bound(self.seed, n, share, Norms::Varying, 20, 3, rho, trials);
        let text = reports
            .iter()
            .map(|r| r.to_text())
            .chain(groups.iter().map(|g| g.to_text()))
            .chain([histogram.to_text()])
            .collect::<Vec<_>>()
            .join("\n");
        let value = serde_json::json!({
            "quantiles": reports, "groups": groups, "histogram": histogram,
        });
        Ok((value, text))
    }
}

/// `dpledger replay`.
#[derive(Debug, clap::Args)]
pub struct ReplayCmd {
    /// The JSON-lines trace (first line: the dataset).
    #[arg(long)]
    pub trace: std::path::PathBuf,
    /// Delta in (0, 1).
    #[arg(long, allow_negative_numbers = true)]
    pub delta: f64,
    /// RDP to (epsilon, delta) conversion.
    #[arg(long, value_enum, default_value_t = accountant::ConversionArg::Improved)]
    pub conversion: accountant::ConversionArg,
}

impl ReplayCmd {
    fn run(&self) -> Result<(serde_json::Value, String), String> {
        let file = std::fs::File::open(&self.trace)
            .map_err(|e| format!("invalid --trace {}: {e}", self.trace.display()))?;
        let report = crate::ledger::replay(
            std::io::BufReader::new(file),
            self.delta,
            self.conversion.into(),
        )
        .map_err(|e| format!("{}: {e}", self.trace.display()))?;
        let value = serde_json::to_value(&report).map_err(|e| e.to_string())?;
        Ok((value, report.to_text()))
    }
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
    let err = |e: accounting_error| e.to_string();
    let (json, result) = match &cli.command {
        Command::Rdp(c) => (c.json, c.inner.run().map_err(err)),
        Command::Epsilon(c) => (c.json, c.inner.run().map_err(err)),
        Command::Noise(c) => (c.json, c.inner.run().map_err(err)),
        Command::Compare(c) => (c.json, c.inner.run().map_err(err)),
        Command::Schedule(c) => (c.json, c.inner.run().map_err(err)),
        Command::Replay(c) => (c.json, c.inner.run()),
        Command::DataDependent(c) => (c.json, c.inner.run()),
        Command::Serve(c) => return c.run().map_err(|e| format!("{e:#}")),
        Command::Token(c) => {
            let token = c.run().map_err(|e| format!("{e:#}"))?;
            return write_stdout(&format!("{token}\n"));
        }
        Command::Openapi(c) => {
            return match c.run().map_err(|e| format!("{e:#}"))? {
                Some(doc) => write_stdout(&doc),
                None => Ok(()),
            }
        }
        Command::Demo(c) => {
            let text = c.run().map_err(|e| format!("{e:#}"))?;
            return write_stdout(&text);
        }
        Command::Loadgen(c) => {
            let figures = if let Some(dataset) = &c.inner.dataset {
                loadgen_phase::run(&c.inner, dataset)
            } else if c.inner.during_releases {
                release_load::run(&c.inner)
            } else {
                c.inner.run()
            };
            (c.json, figures.map_err(|e| format!("{e:#}")))
        }
        Command::ReleaseAccuracy(c) => (c.json, c.inner.run()),
        Command::Cluster(c) => {
            return c
                .run()
                .map_err(|e| format!("{e:#}"))
                .and_then(|text| write_stdout(&text));
        }
        Command::Compact(c) => {
            return c
                .run()
                .map_err(|e| format!("{e:#}"))
                .and_then(|text| write_stdout(&text));
        }
    };
    let (value, text) = result?;
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
