//! `dpledger demo`: start the service on a temporary store, simulate a realistic
//! DP-SGD run through its HTTP API, and show what each per-example number means.
//!
//! The simulated trainer follows the predictable protocol (spec §3): before
//! every step it sends the scheduled refresh (a round-robin block of `batch`
//! ids, their norms at the current model), then Poisson batches without the
//! retired examples, one binary step report per step with the unclipped norms
//! of the batch. Norms fall as training progresses and differ between easy
//! (70%) and hard (30%) examples. An individual budget (default epsilon 1.0,
//! below the run's worst case) makes the run (1.0, delta)-DP for every example:
//! hard examples retire when their threshold ledger reaches it, easy ones train
//! every epoch.

use crate::accounting::Conversion;
use crate::store::codec::StepPayload;
use anyhow::Context;
use clap::Args;
use serde_json::json;
use std::time::{Duration, Instant};

/// `dpledger demo`.
#[derive(Debug, Args)]
pub struct DemoCmd {
    /// Training examples.
    #[arg(long, default_value_t = 60_000)]
    pub examples: u64,
    /// Epochs (steps = epochs / sampling rate).
    #[arg(long, default_value_t = 20)]
    pub epochs: u64,
    /// Expected batch size (sampling rate = batch / examples).
    #[arg(long, default_value_t = 256)]
    pub batch_size: u64,
    /// Noise multiplier.
    #[arg(long, default_value_t = 1.0)]
    pub noise_multiplier: f64,
    /// Delta for reporting.
    #[arg(long, default_value_t = 1e-5)]
    pub delta: f64,
    /// Seed of the simulation.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Individual budget epsilon (at `--delta`) of every example: the run is
    /// (this, delta)-DP for each of them (0: no individual budget).
    #[arg(long, default_value_t = 1.0)]
    pub budget: f64,
}

/// splitmix64: small, fast, deterministic.
struct Rng(u64);
impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Unclipped gradient norm of example `i` at `epoch`: easy examples are learned
/// quickly, hard ones keep large gradients.
fn norm(i: u64, epoch: f64, u: f64) -> f64 {
    let hard = i % 10 < 3;
    let (scale, decay, floor) = if hard {
        (2.0, 0.05, 0.6)
    } else {
        (1.2, 0.35, 0.02)
    };
    (scale * (-decay * epoch).exp() + floor) * (0.6 + 0.8 * u)
}

impl DemoCmd {
    /// Run the demo; returns the text report.
    pub fn run(&self) -> anyhow::Result<String> {
        anyhow::ensure!(
            self.examples > 0 && self.batch_size > 0 && self.batch_size <= self.examples,
            "need 0 < --batch-size <= --examples"
        );
        let dir = std::env::temp_dir().join(format!(
            "dpledger-demo-{}-{}",
            std::process::id(),
            self.seed
        ));
        std::fs::create_dir_all(&dir)?;
        let result = self.run_in(&dir);
        let _ = std::fs::remove_dir_all(&dir);
        result
    }

    fn run_in(&self, dir: &std::path::Path) -> anyhow::Result<String> {
        let store = crate::store::open(&format!("sqlite:{}", dir.join("demo.sqlite").display()))
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let super::server::LocalService {
            runtime,
            base,
            token,
            engine,
        } = super::server::serve_locally(dir, store)?;
        let agent = ureq::AgentBuilder::new()
            .timeout(Duration::from_secs(60))
            .build();
        let auth = format!("Bearer {token}");
        let (n, q) = (self.examples, self.batch_size as f64 / self.examples as f64);
        let steps = (self.epochs as f64 / q).round() as u64;
        let mut config = json!({
            "examples": n, "max_grad_norm": 1.0, "rounding": 0.01, "noise_multiplier": self.noise_multiplier,
            "sampling": {"kind": "poisson", "rate": q}, "delta": self.delta, "planned_steps": steps,
            "refresh": {"block": self.batch_size}});
        if self.budget > 0.0 {
            config["individual_budget"] = json!({"epsilon": self.budget, "delta": self.delta});
        }
        agent
            .post(&format!("{base}/v1/datasets"))
            .set("Authorization", &auth)
            .send_json(json!({"id": "demo", "config": config, "release_budget": {"rho": 0.01}}))
            .context("creating the demo dataset")?;
        // The refresh due before step 0, as the service announces it.
        let first: serde_json::Value = agent
            .get(&format!("{base}/v1/datasets/demo/thresholds?start=0&end=0"))
            .set("Authorization", &auth)
            .call()?
            .into_json()?;
        let mut due = due_block(&first);
        let bar = indicatif::ProgressBar::new(steps);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{msg} [{bar:40}] {pos}/{len} steps ({per_sec}, eta {eta})",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        bar.set_message("training");
        let mut rng = Rng(self.seed);
        let started = Instant::now();
        let log_1mq = (-q).ln_1p();
        let mut reported = 0u64;
        let mut retired = vec![false; n as usize];
        for t in 0..steps {
            let epoch = t as f64 * q;
            // The scheduled refresh: the due block's norms at the current model.
            if let Some((first, count)) = due.take() {
                let ids: Vec<u64> = (0..count)
                    .map(|j| (first + j) % n)
                    .filter(|&i| !retired[i as usize])
                    .collect();
                let norms: Vec<f64> = ids.iter().map(|&i| norm(i, epoch, rng.uniform())).collect();
                let answer: serde_json::Value = agent
                    .post(&format!("{base}/v1/datasets/demo/refresh"))
                    .set("Authorization", &auth)
                    .send_json(json!({"ids": ids, "norms": norms}))
                    .with_context(|| format!("refreshing before step {t}"))?
                    .into_json()?;
                mark_retired(&answer["retired"], &mut retired);
            }
            // Poisson sampling by geometric skips: O(batch) per step.
            let (mut ids, mut norms) = (Vec::new(), Vec::new());
            let mut i = 0u64;
            loop {
                let skip = if q >= 1.0 {
                    0
                } else {
                    ((1.0 - rng.uniform()).ln() / log_1mq).floor() as u64
                };
                i = i.saturating_add(skip);
                if i >= n {
                    break;
                }
                if !retired[i as usize] {
                    ids.push(i);
                    norms.push(norm(i, epoch, rng.uniform()));
                }
                i += 1;
            }
            reported += ids.len() as u64;
            let body = StepPayload {
                step: t,
                part: None,
                noise_multiplier: None,
                sampling_rate: None,
                ids,
                norms,
            }
            .encode();
            let answer: serde_json::Value = agent
                .post(&format!("{base}/v1/datasets/demo/steps"))
                .set("Authorization", &auth)
                .set("Content-Type", "application/octet-stream")
                .send_bytes(&body)
                .with_context(|| format!("reporting step {t}"))?
                .into_json()?;
            mark_retired(&answer["retired"], &mut retired);
            due = due_block(&answer);
            bar.inc(1);
        }
        bar.finish_and_clear();
        let train_secs = started.elapsed().as_secs_f64();
        // Owners read their own privacy over HTTP; show a few, with the PLD
        // estimate over their own thresholds (an estimate, not a guarantee).
        let mut owners = String::new();
        for id in [0u64, 1, 3, 7] {
            let v: serde_json::Value = agent
                .get(&format!(
                    "{base}/v1/datasets/demo/examples/{id}/privacy?method=pld_estimate"
                ))
                .set("Authorization", &auth)
                .call()?
                .into_json()?;
            let ex = &v["example"];
            owners.push_str(&format!(
                "  example {id:>5} ({}, {}): guaranteed {:.3} ({}); in this run at most {:.3} with \
                 probability 1 - delta (ex post); estimate {:.3}, PLD estimate {:.3} (not guarantees)\n",
                if id % 10 < 3 { "hard" } else { "easy" },
                if ex["retired"].as_bool() == Some(true) { "retired" } else { "trained every epoch" },
                ex["epsilon"].as_f64().unwrap_or(f64::NAN),
                ex["guarantee"]["kind"].as_str().unwrap_or("?"),
                ex["ex_post"]["epsilon"].as_f64().unwrap_or(f64::NAN),
                ex["estimate"]["epsilon"].as_f64().unwrap_or(f64::NAN),
                v["pld_estimate"]["epsilon"].as_f64().unwrap_or(f64::NAN),
            ));
        }
        let wc: serde_json::Value = agent
            .get(&format!("{base}/v1/datasets/demo/worst-case"))
            .set("Authorization", &auth)
            .call()?
            .into_json()?;
        let worst = wc["epsilon"].as_f64().unwrap_or(f64::NAN);
        let worst_rdp = wc["rdp"]["epsilon"].as_f64().unwrap_or(f64::NAN);
        // The curator's view of the whole distribution, from the served ledger
        // itself: every example's ex-post bound (capped by the worst case), the
        // values a release reads.
        let mut eps = runtime.block_on(engine.with_ledger(
            "demo",
            |ds, ledger| -> anyhow::Result<Vec<f64>> {
                let worst = ds.worst_case_bounds(ledger, self.delta, Conversion::Improved)?;
                Ok(ds.bounded_epsilons(ledger, &worst, self.delta, Conversion::Improved)?)
            },
        ))?;
        // The release below reads the same values, with the examples it
        // leaves out (near their individual budget, spec §6) at 0.
        let (mean_rho, quantiles_rho) = (0.0025, 0.00125);
        let left_out = runtime.block_on(engine.with_ledger(
            "demo",
            |_, ledger| -> anyhow::Result<Vec<u32>> {
                let rdp = crate::release::rdp_of_rho(ledger.orders(), mean_rho + quantiles_rho);
                Ok(ledger.release_left_out(&rdp))
            },
        ))?;
        let mut release_input = eps.clone();
        for &i in &left_out {
            release_input[i as usize] = 0.0;
        }
        release_input.sort_by(f64::total_cmp);
        eps.sort_by(f64::total_cmp);
        // Each example's estimate (its discounted ledger by the improved
        // conversion: no proven statement), beside the ex-post bounds.
        let mut estimates = runtime.block_on(engine.with_ledger(
            "demo",
            |_, ledger| -> anyhow::Result<Vec<f64>> {
                (0..ledger.examples())
                    .map(|i| {
                        Ok(ledger
                            .privacy(i, self.delta, Conversion::Improved)?
                            .rdp_epsilon)
                    })
                    .collect()
            },
        ))?;
        estimates.sort_by(f64::total_cmp);
        let memory = runtime.block_on(
            engine.with_ledger("demo", |_, ledger| -> anyhow::Result<u64> {
                Ok(ledger.memory_bytes())
            }),
        )?;
        owners.push_str(&format!(
            "\nledger memory: {:.0} bytes per example (thresholds and each example's \
             level counts, from which its RDP and PLD estimate are computed)\n",
            memory as f64 / self.examples as f64
        ));
        // What a dashboard may show: a DP release, whose cost is charged to everyone.
        let levels = [0.1, 0.3, 0.5, 0.7, 0.9];
        // With an individual budget the release leaves out the examples it
        // would push past it (spec §6); a refusal is printed, not hidden.
        let released = match agent
            .post(&format!("{base}/v1/datasets/demo/releases"))
            .set("Authorization", &auth)
            .send_json(json!({"mean": {"rho": mean_rho},
                "quantiles": {"rho": quantiles_rho, "levels": levels}}))
        {
            Ok(answer) => {
                let outcome: serde_json::Value = answer.into_json()?;
                let after: serde_json::Value = agent
                    .get(&format!("{base}/v1/datasets/demo/worst-case"))
                    .set("Authorization", &auth)
                    .call()?
                    .into_json()?;
                render_release(
                    &outcome["release"],
                    &release_input,
                    left_out.len(),
                    &levels,
                    after["epsilon"].as_f64(),
                )
            }
            Err(ureq::Error::Status(status, answer)) => {
                let problem: serde_json::Value = answer.into_json().unwrap_or_default();
                format!(
                    "\nno DP release for dashboards: the service refused it ({status}: {})\n",
                    problem["detail"].as_str().unwrap_or("no detail")
                )
            }
            Err(e) => return Err(e).context("releasing the DP summary"),
        };
        let retired_count = retired.iter().filter(|&&r| r).count();
        let guaranteed = if self.budget > 0.0 {
            format!(
                "guaranteed for every example (individual budget): {:.3}; examples retired \
                 by the filter: {retired_count} ({:.1}%), the others trained every epoch\n",
                self.budget.min(worst),
                100.0 * retired_count as f64 / n as f64
            )
        } else {
            format!("guaranteed for every example: the worst case, {worst:.3}\n")
        };
        let head = format!("{worst:.3} by PLD (RDP alone: {worst_rdp:.3})\n{guaranteed}");
        Ok(render(
            self,
            steps,
            reported,
            train_secs,
            (worst, &head),
            (&eps, &estimates),
            &owners,
        ) + &released)
    }
}

fn render(
    cmd: &DemoCmd,
    steps: u64,
    reported: u64,
    secs: f64,
    (worst, worst_text): (f64, &str),
    (eps, estimates): (&[f64], &[f64]),
    owners: &str,
) -> String {
    let n = eps.len();
    let quantile = |p: f64| eps[((n as f64 - 1.0) * p).round() as usize];
    let estimate = |p: f64| estimates[((n as f64 - 1.0) * p).round() as usize];
    let at_worst = eps.iter().filter(|&&e| e >= worst * (1.0 - 1e-9)).count();
    let mut out = format!(
        "dpledger demo: {} examples, q = {:.5}, sigma = {}, {} epochs = {steps} steps, delta = {}\n\
         trained through the HTTP API: {reported} norms reported in {secs:.1} s (durable, SQLite)\n\n\
         worst-case epsilon (every example, data-independent): {worst_text}\
         per-example ex-post bound (this run, probability 1 - delta; capped at the worst case): \
         min {:.3}, q25 {:.3}, median {:.3}, q75 {:.3}, max {:.3}\n\
         share of examples at the cap: {:.1}%\n\
         per-example estimate (not a guarantee): min {:.3}, q25 {:.3}, median {:.3}, q75 {:.3}, max {:.3}\n\n",
        cmd.examples,
        cmd.batch_size as f64 / cmd.examples as f64,
        cmd.noise_multiplier,
        cmd.epochs,
        cmd.delta,
        eps[0],
        quantile(0.25),
        quantile(0.5),
        quantile(0.75),
        eps[n - 1],
        100.0 * at_worst as f64 / n as f64,
        estimates[0],
        estimate(0.25),
        estimate(0.5),
        estimate(0.75),
        estimates[n - 1],
    );
    let bins = 20usize;
    let mut counts = vec![0usize; bins];
    for &e in estimates {
        let b = ((e / worst) * bins as f64).floor() as usize;
        counts[b.min(bins - 1)] += 1;
    }
    let max = counts.iter().copied().max().unwrap_or(1).max(1);
    out.push_str("per-example estimate (bins of worst case / 20)\n");
    for (b, &c) in counts.iter().enumerate() {
        let lo = worst * b as f64 / bins as f64;
        let hi = worst * (b + 1) as f64 / bins as f64;
        let bar = "#".repeat((c * 50).div_ceil(max));
        out.push_str(&format!("  [{lo:6.3}, {hi:6.3}) {c:>7} {bar}\n"));
    }
    out.push_str(&format!(
        "\nowners asking for their own epsilon over HTTP:\n{owners}"
    ));
    out.push_str(
        "\nThe distribution above is the curator's view and must not be shown to viewers;\n\
         dashboards get the DP release below.\n",
    );
    out
}

/// The `(first id, count)` of the refresh an answer says is due next.
fn due_block(answer: &serde_json::Value) -> Option<(u64, u64)> {
    let due = &answer["refresh_due"];
    due["first_id"].as_u64().zip(due["count"].as_u64())
}

/// Note the ids an answer says were retired (the trainer leaves them out).
fn mark_retired(ids: &serde_json::Value, retired: &mut [bool]) {
    for id in ids
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_u64())
    {
        if let Some(slot) = retired.get_mut(id as usize) {
            *slot = true;
        }
    }
}

/// The DP release beside the exact values of its input (`eps`, sorted, with
/// the `left_out` examples near their individual budget at 0).
fn render_release(
    release: &serde_json::Value,
    eps: &[f64],
    left_out: usize,
    levels: &[f64],
    worst_after: Option<f64>,
) -> String {
    let pop = &release["values"]["population"];
    let exact_mean = eps.iter().sum::<f64>() / eps.len() as f64;
    let mut out = format!(
        "\nDP release #{} for dashboards (zCDP rho = {}, charged to the worst case and to every \
         example but the {left_out} it left out, whose terms are 0: their budgets had no room \
         for it):\n\
         \x20 statistic   released   exact input (curator only)\n\
         \x20 mean        {:<10.4} {exact_mean:.4}\n",
        release["id"],
        release["rho"].as_f64().unwrap_or(f64::NAN),
        pop["mean"]["mean"].as_f64().unwrap_or(f64::NAN),
    );
    let released = pop["quantiles"].as_array().cloned().unwrap_or_default();
    for (level, q) in levels.iter().zip(released) {
        let exact = crate::release::accuracy::exact_quantile(eps, *level);
        out.push_str(&format!(
            "  q{:<10} {:<10.4} {exact:.4}\n",
            level,
            q["value"].as_f64().unwrap_or(f64::NAN)
        ));
    }
    if let Some(w) = worst_after {
        out.push_str(&format!("worst-case epsilon after the release: {w:.3}\n"));
    }
    out
}
