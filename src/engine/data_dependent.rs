//! Thudi et al.'s data-dependent analysis over live ledgers: several
//! datasets that are runs of one configuration, whose trainers sent full-batch
//! refreshes at checkpoints. Read-only: nothing here changes a ledger or the log.
//!
//! Inputs come from where they are kept: each run's configuration, step count
//! and seed-000 per-instance epsilons from its ledger (read lock, then released);
//! its per-step `(q, sigma)` and its refreshes (the checkpoints) from the durable
//! log, which is the only place that keeps every refresh. The log is read up to
//! the step count seen in the ledger, so both describe the same steps. Between two
//! checkpoints an example's sensitivity is its norm at the last one (clipped at
//! `C`, rounded up to the grid); before the first, `C` (`docs/data-dependent.md`).
//! Several refresh records before the same step form one checkpoint; a later norm
//! of an example replaces an earlier one, as in the ledger.
//!
//! In a cluster any node answers over runs served anywhere: a run
//! this node does not serve is rebuilt, privately and read-only, from the shared
//! log (newest snapshot + records after it, the load a takeover does). The log
//! is the truth every owner's ledger is a prefix-image of (a node applies only
//! what it persisted, a fenced write never commits), so the copy is the ledger
//! a single node holding every run would have had at that point of the log;
//! nothing depends on which node owns a run, or on a lease moving meanwhile.
//! The caller's rights are checked per run by the HTTP layer, from the token,
//! identically on every node.
//!
//! A run that is a sharded dataset is read from its shards and
//! their logs, concatenated in id order (`data_dependent/shards.rs`): the analysis
//! itself runs once over all examples, so it is the unsharded one.
//!
//! Why one file of about 560 lines of code (the rest are its unit tests):
//! reading a run's log at a step and assembling the analysis's input are one
//! pass over the records; the sharded read lives in `data_dependent/shards.rs`
//! and the analysis itself in `accounting/data_dependent/`.

mod shards;

use super::bounds::blocking;
use super::error::{EngineError, EngineResult};
use super::Dataset;
use super::Engine;
use crate::accounting::data_dependent::{
    analyze, Analysis, Checkpoint, DataDependentError, Options, Rounding, RunSet, StepParams,
};
use crate::accounting::orders::ledger_orders;
use crate::accounting::{validate, BucketGrid, Conversion};
use crate::ledger::{DatasetConfig, Ledger, Sampling};
use crate::store::codec::StepPayload;
use crate::store::{RecordKind, StoreError, StoredRecord};
use shards::{combine_logs, combine_views};
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio::sync::RwLockReadGuard;

/// Most runs one analysis may name.
pub const MAX_RUNS: usize = 64;

/// One analysis at a time: each uses every core for seconds.
static ANALYSES: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(1);

/// What to analyse.
#[derive(Debug, Clone)]
pub struct DataDependentRequest {
    /// Dataset ids of the runs (at least 2, distinct).
    pub runs: Vec<String>,
    /// Rényi orders (default: the 64 ledger orders).
    pub orders: Option<Vec<f64>>,
    /// Hölder exponent `p > 1` (default `3 T`).
    pub holder: Option<f64>,
    /// Delta (default: the runs' reporting delta, when they agree).
    pub delta: Option<f64>,
    /// RDP to (epsilon, delta) conversion.
    pub conversion: Conversion,
    /// Rounding of step orders and levels.
    pub rounding: Rounding,
    /// Only this example (its owner's view; the cost of one example).
    pub example: Option<u64>,
}

/// A run's dataset: the one this node serves, or (cluster mode, a run served
/// elsewhere or by nobody right now) a private copy rebuilt from the shared log.
struct Run {
    ds: Arc<Dataset>,
    served: bool,
}

/// What a run's ledger says, read under its read lock.
#[derive(Debug)]
pub(super) struct RunView {
    pub(super) config: DatasetConfig,
    pub(super) grid: BucketGrid,
    pub(super) steps: u64,
}

/// What the log says of one run, up to its ledger's step count.
#[derive(Debug, Default)]
pub(super) struct RunLog {
    /// `(q, sigma)` overrides of each step (`None`: the dataset's defaults).
    pub(super) steps: Vec<Option<(Option<f64>, Option<f64>)>>,
    /// Checkpoint position -> level of every example (`u32::MAX`: not given).
    pub(super) checkpoints: BTreeMap<u64, Vec<u32>>,
    /// The first bad norm met, if any.
    pub(super) bad_norm: Option<String>,
}

impl From<DataDependentError> for EngineError {
    fn from(e: DataDependentError) -> Self {
        let detail = e.to_string();
        match e {
            DataDependentError::InvalidArgument(m) => EngineError::BadRequest {
                field: ["alpha", "holder", "delta", "order_ratio", "level_stride"]
                    .into_iter()
                    .find(|f| m.starts_with(f)),
                detail,
            },
            DataDependentError::TooFewRuns(_) => EngineError::BadRequest {
                detail,
                field: Some("runs"),
            },
            DataDependentError::ConfigMismatch(_)
            | DataDependentError::IncompleteCheckpoint(_)
            | DataDependentError::InvalidNorm(_) => EngineError::Conflict {
                detail,
                field: Some("runs"),
            },
            DataDependentError::Trace { .. } => EngineError::Internal(detail),
        }
    }
}

/// Refuse a run list that cannot be analysed whatever the ledgers hold.
pub fn check_run_ids(runs: &[String]) -> EngineResult<()> {
    if runs.len() < 2 {
        return Err(DataDependentError::TooFewRuns(runs.len()).into());
    }
    if runs.len() > MAX_RUNS {
        return Err(EngineError::BadRequest {
            detail: format!("at most {MAX_RUNS} runs, got {}", runs.len()),
            field: Some("runs"),
        });
    }
    for (i, r) in runs.iter().enumerate() {
        if runs[..i].contains(r) {
            return Err(EngineError::BadRequest {
                detail: format!(
                    "run {r:?} is named twice: each run is one independent sample of training"
                ),
                field: Some("runs"),
            });
        }
    }
    Ok(())
}

impl Engine {
    /// Seed 001's analysis of the runs `request.runs` (every example, or only
    /// `request.example`). Every number is an estimate (`guarantee: false`).
    pub async fn data_dependent(&self, request: DataDependentRequest) -> EngineResult<Analysis> {
        check_run_ids(&request.runs)?;
        request
            .rounding
            .check()
            .map_err(|m| EngineError::BadRequest {
                detail: m,
                field: Some("order_ratio"),
            })?;
        // One analysis at a time, and its copies of runs served elsewhere with it.
        let _permit = ANALYSES
            .acquire()
            .await
            .map_err(|_| EngineError::Internal("analysis queue closed".into()))?;
        // Each run, sharded or not, is read from its parts (its shards, in id
        // order, or itself): `runs[r][i]` is part `parts[r][i]` of run `r`.
        let mut parts = Vec::with_capacity(request.runs.len());
        let mut runs = Vec::with_capacity(request.runs.len());
        let mut part_views = Vec::with_capacity(request.runs.len());
        let mut views = Vec::with_capacity(request.runs.len());
        for id in &request.runs {
            let run_parts = self.run_parts(id).await?;
            let mut opened = Vec::with_capacity(run_parts.len());
            let mut seen = Vec::with_capacity(run_parts.len());
            for part in &run_parts {
                let run = self.run(&part.id).await?;
                let ledger = self.run_ledger(&run).await?;
                seen.push(RunView {
                    config: ledger.config().clone(),
                    grid: *ledger.grid(),
                    steps: ledger.next_step(),
                });
                drop(ledger);
                opened.push(run);
            }
            let own: Vec<RunView> = seen
                .iter()
                .map(|v| RunView {
                    config: v.config.clone(),
                    grid: v.grid,
                    steps: v.steps,
                })
                .collect();
            views.push(combine_views(id, &run_parts, own)?);
            part_views.push(seen);
            runs.push(opened);
            parts.push(run_parts);
        }
        let delta = match request.delta {
            Some(d) => d,
            None if views
                .iter()
                .all(|v| v.config.delta == views[0].config.delta) =>
            {
                views[0].config.delta
            }
            None => {
                return Err(EngineError::BadRequest {
                    detail: "the runs report at different deltas: give delta".into(),
                    field: Some("delta"),
                })
            }
        };
        validate::delta("delta", delta)?;
        same_configuration(&request.runs, &views)?;
        if let Some(id) = request.example {
            if id >= views[0].config.examples {
                return Err(EngineError::NotFound(format!(
                    "no example {id}: the runs have {} examples",
                    views[0].config.examples
                )));
            }
        }
        let flat_ids: Vec<String> = parts.iter().flatten().map(|p| p.id.clone()).collect();
        let flat_views: Vec<RunView> = part_views.into_iter().flatten().collect();
        let mut flat_logs = self.run_logs(&flat_ids, &flat_views).await?.into_iter();
        let mut logs = Vec::with_capacity(request.runs.len());
        let mut ends = Vec::with_capacity(request.runs.len());
        let mut k = 0;
        for (id, run_parts) in request.runs.iter().zip(&parts) {
            let n = run_parts.len();
            let sizes: Vec<usize> = flat_views[k..k + n]
                .iter()
                .map(|v| v.config.examples as usize)
                .collect();
            let own: Vec<RunLog> = flat_logs.by_ref().take(n).collect();
            ends.push(
                run_parts
                    .iter()
                    .zip(&sizes)
                    .map(|(p, &size)| p.start + size as u64)
                    .collect::<Vec<u64>>(),
            );
            logs.push(combine_logs(id, run_parts, &sizes, own)?);
            k += n;
        }
        let run_set = run_set(&request.runs, &views, logs, request.example)?;
        let options = Options {
            orders: request.orders.clone().unwrap_or_else(ledger_orders),
            holder: request.holder,
            delta,
            conversion: request.conversion,
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            rounding: request.rounding,
        };
        let mut analysis = tokio::task::spawn_blocking(move || analyze(&run_set, &options))
            .await
            .map_err(|_| EngineError::Internal("the analysis task failed".into()))??;
        analysis.datasets = request.runs.clone();
        // Seed-000 per-instance epsilons (min(RDP_i, PLD worst), as served).
        // (A sharded run's: each shard's own, concatenated in id order; an
        // example's from the shard holding it, as its example `x - start`.)
        let mut per_run = Vec::with_capacity(request.runs.len());
        for ((((id, view), opened), run_parts), run_ends) in request
            .runs
            .iter()
            .zip(&views)
            .zip(&runs)
            .zip(&parts)
            .zip(&ends)
        {
            let mut epsilons = Vec::new();
            for ((run, part), &end) in opened.iter().zip(run_parts).zip(run_ends) {
                if request
                    .example
                    .is_some_and(|x| !(part.start..end).contains(&x))
                {
                    continue;
                }
                let ds = &run.ds;
                let ledger = self.run_ledger(run).await?;
                if ledger.next_step() != view.steps {
                    return Err(EngineError::Unavailable(format!(
                        "run {id:?} took a step during the analysis: retry"
                    )));
                }
                match request.example {
                    Some(x) => {
                        let local = x - part.start;
                        let (p, _) =
                            ds.example_privacy(&ledger, local, delta, request.conversion)?;
                        // The value the whole analysis reads for it
                        // (`bounded_epsilons`): ex post, else the estimate,
                        // capped by the PLD worst case.
                        epsilons.push(crate::ledger::bounds::released_value(
                            p.ex_post,
                            p.estimate,
                            p.worst_case_pld_epsilon,
                        ));
                    }
                    None => {
                        let worst = ds.worst_case_bounds(&ledger, delta, request.conversion)?;
                        epsilons.extend(ds.bounded_epsilons(
                            &ledger,
                            &worst,
                            delta,
                            request.conversion,
                        )?);
                    }
                }
            }
            per_run.push(epsilons);
        }
        drop(_permit);
        analysis.attach_per_instance(&per_run);
        if let Some(x) = request.example {
            for e in &mut analysis.examples {
                e.id = x;
            }
        }
        Ok(analysis)
    }

    /// The run `id`: the dataset this node serves, or in a cluster, when this
    /// node does not serve it, a read-only copy rebuilt from the shared log
    /// (404 when the log has no such dataset).
    async fn run(&self, id: &str) -> EngineResult<Run> {
        match self.dataset(id) {
            Ok(ds) => Ok(Run { ds, served: true }),
            Err(EngineError::NotOwner(_)) if self.cluster.is_some() => {
                let ds = self.reload(id).await?;
                tracing::info!(dataset = id, "analysis: run read from the shared log");
                Ok(Run { ds, served: false })
            }
            Err(e) => Err(e),
        }
    }

    /// A run's ledger under its read lock (a served one through the paging
    /// and staleness checks; a private copy as it is: nothing writes to it).
    async fn run_ledger<'a>(&self, run: &'a Run) -> EngineResult<RwLockReadGuard<'a, Ledger>> {
        if run.served {
            self.read_ledger(&run.ds).await
        } else {
            Ok(run.ds.ledger.read().await)
        }
    }

    /// Read every run's steps and refreshes from the log, each run's own
    /// records through the store's per-dataset index (on a blocking thread).
    async fn run_logs(&self, runs: &[String], views: &[RunView]) -> EngineResult<Vec<RunLog>> {
        let store = self.store.clone();
        let runs = runs.to_vec();
        let limits: Vec<(u64, usize, BucketGrid)> = views
            .iter()
            .map(|v| (v.steps, v.config.examples as usize, v.grid))
            .collect();
        type Read = Result<Result<Vec<RunLog>, String>, StoreError>;
        let read = tokio::task::spawn_blocking(move || -> Read {
            // The analysis replays every step from the first: a compacted run's
            // early records are gone for good (no retry brings them back).
            let compacted: Vec<String> = store
                .compactions()?
                .into_iter()
                .map(|c| c.dataset)
                .filter(|d| runs.contains(d))
                .collect();
            if let Some(id) = compacted.into_iter().next() {
                return Ok(Err(id));
            }
            let mut logs = Vec::with_capacity(runs.len());
            for (id, limit) in runs.iter().zip(&limits) {
                let mut log = RunLog::default();
                store.load_dataset(id, 0, &mut |stored: StoredRecord| {
                    visit(&mut log, limit, &stored).map_err(|detail| StoreError::Replay {
                        seq: stored.seq,
                        detail,
                    })
                })?;
                logs.push(log);
            }
            Ok(Ok(logs))
        })
        .await
        .map_err(|_| EngineError::Internal("reading the log failed".into()))?;
        let read = read.map_err(|e| {
            tracing::error!(error = %e, "reading the log for a data-dependent analysis failed");
            EngineError::Unavailable("the store could not be read back: retry".into())
        })?;
        read.map_err(|id| {
            EngineError::conflict(format!(
                "run {id:?} was compacted (`dpledger compact`): its early steps and refreshes \
                 are no longer in the log, and the analysis replays every step from the first; \
                 analyse runs that were not compacted"
            ))
        })
    }
}

/// Fold one stored record of a run into its [`RunLog`].
fn visit(
    log: &mut RunLog,
    (steps, n, grid): &(u64, usize, BucketGrid),
    stored: &StoredRecord,
) -> Result<(), String> {
    let rec = &stored.record;
    match rec.kind {
        RecordKind::StepPart => {
            let t = rec.step.unwrap_or(u64::MAX);
            if t >= *steps {
                return Ok(());
            }
            let p = StepPayload::decode(&rec.payload).map_err(|e| format!("step payload: {e}"))?;
            let t = t as usize;
            if log.steps.len() <= t {
                log.steps.resize(t + 1, None);
            }
            log.steps[t].get_or_insert((p.sampling_rate, p.noise_multiplier));
        }
        RecordKind::Refresh => {
            let p =
                StepPayload::decode(&rec.payload).map_err(|e| format!("refresh payload: {e}"))?;
            if p.step >= *steps {
                return Ok(()); // affects no step the ledger had applied
            }
            let levels = log
                .checkpoints
                .entry(p.step)
                .or_insert_with(|| vec![u32::MAX; *n]);
            for (&id, &g) in p.ids.iter().zip(&p.norms) {
                if !(g.is_finite() && g >= 0.0) {
                    log.bad_norm.get_or_insert(format!(
                        "refresh before step {}: example {id} has norm {g}",
                        p.step
                    ));
                    continue;
                }
                if let Some(slot) = levels.get_mut(id as usize) {
                    *slot = grid.bucket_of(g);
                }
            }
        }
        _ => {}
    }
    Ok(())
}

/// Refuse runs that are not runs of one configuration (examples, `C`, rounding,
/// default noise and sampling, clipping) or that are not Poisson-sampled.
fn same_configuration(ids: &[String], views: &[RunView]) -> EngineResult<()> {
    let mismatch = |m: String| EngineError::from(DataDependentError::ConfigMismatch(m));
    for (id, v) in ids.iter().zip(views) {
        if !matches!(v.config.sampling, Sampling::Poisson { .. }) {
            return Err(mismatch(format!(
                "run {id:?} uses shuffled batches; the analysis is for Poisson sampling"
            )));
        }
    }
    let (first, c0) = (&ids[0], &views[0].config);
    for (id, v) in ids.iter().zip(views).skip(1) {
        let c = &v.config;
        let differs = [
            ("examples", c.examples != c0.examples),
            ("max_grad_norm", c.max_grad_norm != c0.max_grad_norm),
            (
                "rounding",
                c.effective_rounding() != c0.effective_rounding(),
            ),
            (
                "noise_multiplier",
                c.noise_multiplier != c0.noise_multiplier,
            ),
            ("sampling", c.sampling != c0.sampling),
            ("clipping", c.clipping != c0.clipping),
        ]
        .into_iter()
        .find(|(_, d)| *d);
        if let Some((field, _)) = differs {
            return Err(mismatch(format!(
                "run {id:?} differs from run {first:?} in {field}"
            )));
        }
        if v.steps != views[0].steps {
            return Err(mismatch(format!(
                "run {id:?} has {} steps, run {first:?} has {}",
                v.steps, views[0].steps
            )));
        }
    }
    Ok(())
}

/// Build the [`RunSet`] (all examples, or only `example`), refusing runs whose
/// steps differ, checkpoints that miss an example, and norms that are not finite.
fn run_set(
    ids: &[String],
    views: &[RunView],
    logs: Vec<RunLog>,
    example: Option<u64>,
) -> EngineResult<RunSet> {
    let c0 = &views[0].config;
    let default_q = match c0.sampling {
        Sampling::Poisson { rate } => rate,
        Sampling::Shuffle { .. } => 0.0, // refused by same_configuration
    };
    let params_of = |log: &RunLog, id: &str, steps: u64| -> EngineResult<Vec<StepParams>> {
        (0..steps as usize)
            .map(|t| match log.steps.get(t).copied().flatten() {
                Some((q, s)) => Ok(StepParams {
                    sampling_rate: q.unwrap_or(default_q),
                    noise_multiplier: s.unwrap_or(c0.noise_multiplier),
                }),
                None => Err(EngineError::Internal(format!(
                    "step {t} of run {id:?} is applied but not in the log"
                ))),
            })
            .collect()
    };
    let steps = params_of(&logs[0], &ids[0], views[0].steps)?;
    let mut runs = Vec::with_capacity(logs.len());
    for (r, (log, id)) in logs.into_iter().zip(ids).enumerate() {
        if r > 0 {
            let mine = params_of(&log, id, views[r].steps)?;
            if let Some(t) = mine.iter().zip(&steps).position(|(a, b)| a != b) {
                return Err(DataDependentError::ConfigMismatch(format!(
                    "run {id:?}'s step {t} has a different sampling rate or noise multiplier \
                     than run {:?}'s",
                    ids[0]
                ))
                .into());
            }
        }
        if let Some(m) = log.bad_norm {
            return Err(DataDependentError::InvalidNorm(format!("run {id:?}, {m}")).into());
        }
        let mut checkpoints = Vec::with_capacity(log.checkpoints.len());
        for (at, levels) in log.checkpoints {
            if let Some(missing) = levels.iter().position(|&k| k == u32::MAX) {
                return Err(DataDependentError::IncompleteCheckpoint(format!(
                    "run {id:?}, refresh before step {at}: example {missing} is missing (a \
                     checkpoint is the full-batch refresh of every example)"
                ))
                .into());
            }
            let levels = match example {
                Some(x) => vec![levels[x as usize]],
                None => levels,
            };
            checkpoints.push(Checkpoint {
                before_step: at,
                levels,
            });
        }
        runs.push(checkpoints);
    }
    let n = match example {
        Some(_) => 1,
        None => c0.examples as usize,
    };
    Ok(blocking(|| RunSet::new(views[0].grid, steps, n, runs))?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::DatasetConfigExt;
    use crate::store::Record;

    fn view(steps: u64) -> RunView {
        let config = DatasetConfig::poisson(3, 1.0, 1.0, 0.5, 1e-5);
        RunView {
            grid: config.grid().unwrap(),
            config,
            steps,
        }
    }

    fn stored(kind: RecordKind, step: Option<u64>, payload: StepPayload) -> StoredRecord {
        StoredRecord {
            seq: 1,
            record: Record {
                dataset: "r".into(),
                kind,
                step,
                part: None,
                payload: payload.encode(),
            },
        }
    }

    fn payload(step: u64, ids: Vec<u64>, norms: Vec<f64>) -> StepPayload {
        StepPayload {
            step,
            part: None,
            noise_multiplier: None,
            sampling_rate: None,
            ids,
            norms,
        }
    }

    /// A log with one step and a refresh before it; `norms` of the refresh.
    fn log_with(norms: Vec<f64>, ids: Vec<u64>) -> RunLog {
        let v = view(1);
        let limits = (v.steps, 3usize, v.grid);
        let mut log = RunLog::default();
        let refresh = stored(RecordKind::Refresh, None, payload(0, ids, norms));
        visit(&mut log, &limits, &refresh).unwrap();
        let step = stored(
            RecordKind::StepPart,
            Some(0),
            payload(0, vec![0], vec![0.5]),
        );
        visit(&mut log, &limits, &step).unwrap();
        // A step the ledger had not applied yet is left out.
        let later = stored(
            RecordKind::StepPart,
            Some(1),
            payload(1, vec![0], vec![0.5]),
        );
        visit(&mut log, &limits, &later).unwrap();
        log
    }

    fn build(logs: Vec<RunLog>) -> EngineResult<RunSet> {
        let ids = vec!["a".to_string(), "b".to_string()];
        run_set(&ids, &[view(1), view(1)], logs, None)
    }

    #[test]
    fn runs_from_the_log_and_their_refusals() {
        let good = || log_with(vec![0.1, 0.5, 2.0], vec![0, 1, 2]);
        let set = build(vec![good(), good()]).unwrap();
        assert_eq!((set.runs(), set.steps().len(), set.examples()), (2, 1, 3));
        assert_eq!(set.level(0, 2, 0), set.grid().top());
        for bad in [f64::NAN, f64::INFINITY, -1.0] {
            let e = build(vec![good(), log_with(vec![0.1, bad, 0.2], vec![0, 1, 2])]).unwrap_err();
            assert!(
                matches!(&e, EngineError::Conflict { detail, .. } if detail.contains("invalid norm")),
                "{e}"
            );
        }
        let e = build(vec![good(), log_with(vec![0.1, 0.2], vec![0, 2])]).unwrap_err();
        assert!(e.to_string().contains("example 1 is missing"), "{e}");
        assert!(check_run_ids(&["a".into()]).is_err());
        assert!(check_run_ids(&["a".into(), "a".into()]).is_err());
        assert!(check_run_ids(&["a".into(), "b".into()]).is_ok());
    }
}
