//! `dpledger data-dependent`: Thudi et al.'s expected-composition analysis over
//! several runs' traces. Every refusal is a one-line error (exit 2).

use crate::accounting::conversion::Conversion;
use crate::accounting::data_dependent::{analyze, read_run, Options, Rounding, RunSet};
use crate::accounting::orders::ledger_orders;
use crate::accounting::validate;
use std::path::PathBuf;

/// Arguments of `dpledger data-dependent`.
#[derive(Debug, clap::Args)]
pub struct DataDependentCmd {
    /// A run's JSON-lines trace (the `replay` format); give at least two.
    #[arg(long = "trace", required = true)]
    pub traces: Vec<PathBuf>,
    /// Rényi orders, comma-separated or repeated (default: the 64 ledger orders).
    #[arg(long = "alpha", value_delimiter = ',', allow_negative_numbers = true)]
    pub alpha: Vec<f64>,
    /// Hölder exponent p > 1 (default: 3 * steps, as the authors).
    #[arg(long, allow_negative_numbers = true)]
    pub holder: Option<f64>,
    /// Delta in (0, 1).
    #[arg(long, allow_negative_numbers = true)]
    pub delta: f64,
    /// RDP to (epsilon, delta) conversion.
    #[arg(long, value_enum, default_value_t = super::accountant::ConversionArg::Improved)]
    pub conversion: super::accountant::ConversionArg,
    /// Skip the per-instance epsilons of Yu et al. 2022 (a replay of every trace).
    #[arg(long)]
    pub no_per_instance: bool,
    /// Round step orders up to the geometric grid `R^k` (1 = exact); rounding
    /// only loosens the estimate and makes it much faster.
    #[arg(long, default_value_t = Rounding::FAST.order_ratio)]
    pub order_ratio: f64,
    /// Round sensitivity levels up to multiples of S (1 = the ledger's grid).
    #[arg(long, default_value_t = Rounding::FAST.level_stride)]
    pub level_stride: u32,
    /// The exact evaluation (same as --order-ratio 1 --level-stride 1).
    #[arg(long, conflicts_with_all = ["order_ratio", "level_stride"])]
    pub exact: bool,
}

impl DataDependentCmd {
    /// Run it: `(json, text)` or the error line.
    pub fn run(&self) -> Result<(serde_json::Value, String), String> {
        let conversion: Conversion = self.conversion.into();
        validate::delta("delta", self.delta).map_err(|e| e.to_string())?;
        if self.traces.len() < 2 {
            return Err(format!(
                "at least 2 --trace runs are needed for an expectation over runs, got {}",
                self.traces.len()
            ));
        }
        let open = |p: &PathBuf| {
            std::fs::File::open(p)
                .map(std::io::BufReader::new)
                .map_err(|e| format!("invalid --trace {}: {e}", p.display()))
        };
        let mut traces = Vec::with_capacity(self.traces.len());
        for (r, path) in self.traces.iter().enumerate() {
            let run = read_run(open(path)?, r).map_err(|e| format!("{}: {e}", path.display()))?;
            traces.push(run);
        }
        let runs = RunSet::from_traces(&traces).map_err(|e| e.to_string())?;
        let options = Options {
            orders: if self.alpha.is_empty() {
                ledger_orders()
            } else {
                self.alpha.clone()
            },
            holder: self.holder,
            delta: self.delta,
            conversion,
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            rounding: if self.exact {
                Rounding::EXACT
            } else {
                Rounding {
                    order_ratio: self.order_ratio,
                    level_stride: self.level_stride,
                }
            },
        };
        let mut analysis = analyze(&runs, &options).map_err(|e| e.to_string())?;
        analysis.datasets = self
            .traces
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        if !self.no_per_instance {
            let mut per_run = Vec::with_capacity(self.traces.len());
            for path in &self.traces {
                let report = crate::ledger::replay(open(path)?, self.delta, conversion)
                    .map_err(|e| format!("{}: {e}", path.display()))?;
                // As the server's analysis reads each run: the per-example
                // value a release would (the ex-post bound with predictable
                // thresholds, the estimate otherwise), capped by the PLD worst case.
                let cap = report.worst_case.pld.map(|p| p.epsilon);
                per_run.push(
                    report
                        .examples
                        .iter()
                        .map(|x| crate::ledger::bounds::released_value(x.ex_post, x.estimate, cap))
                        .collect(),
                );
            }
            analysis.attach_per_instance(&per_run);
        }
        let text = to_text(&analysis);
        let value = serde_json::to_value(&analysis).map_err(|e| e.to_string())?;
        Ok((value, text))
    }
}

fn to_text(a: &crate::accounting::data_dependent::Analysis) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "data-dependent analysis (Thudi et al.), an ESTIMATE from {} runs, not a guarantee",
        a.runs
    );
    let _ = writeln!(
        out,
        "{} steps, {} examples, Hölder p = {}, delta = {:e}",
        a.steps,
        a.examples.len(),
        a.holder,
        a.delta
    );
    let _ = writeln!(
        out,
        "data-independent epsilon = {:.6} at order {}",
        a.data_independent.epsilon, a.data_independent.order
    );
    if let Some(s) = &a.summary {
        let q = &s.epsilon;
        let _ = writeln!(
            out,
            "data-dependent epsilon: min {:.6}  p10 {:.6}  median {:.6}  p90 {:.6}  max {:.6}",
            q.min, q.p10, q.median, q.p90, q.max
        );
        let _ = writeln!(
            out,
            "below the data-independent epsilon: {} of {}",
            s.below_data_independent,
            a.examples.len()
        );
    }
    for i in &a.intervals {
        let _ = writeln!(
            out,
            "  steps {:>6}..{:<6} median contribution / data-independent = {:.4}",
            i.start_step, i.end_step, i.relative_contribution.median
        );
    }
    out
}
