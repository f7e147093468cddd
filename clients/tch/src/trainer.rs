//! DP-SGD with per-example accounting: Poisson batches, per-example gradient norms,
//! clipping of each example at its dpledger threshold, Gaussian noise of standard
//! deviation `noise_multiplier * C`, one step report per step.
//!
//! One step, in this order:
//! 0. in the predictable mode (the server's default), when the dataset's public
//!    refresh schedule calls for a refresh before this step (a full pass and/or
//!    a round-robin block), compute the due examples' unclipped norms at the
//!    current model, in chunks, and send them (spec §3.2): the server refuses
//!    the step until they arrived, and only a refresh moves a threshold; in the
//!    sampled mode, a full refresh every `refresh_every` steps instead;
//! 1. draw a Poisson batch (retired examples are left out);
//! 2. read each sampled example's threshold from the mirror (the ledger's current
//!    thresholds);
//! 3. compute every sampled example's unclipped gradient norm;
//! 4. **report** the step (ids and norms) and wait for the ledger to accept it;
//! 5. only then update the model: backward pass of the per-example losses weighted
//!    by the clipping factors (the sum of clipped gradients), plus noise, divided
//!    by the expected batch size `q n`, optimizer step.
//!
//! Reporting before updating means a step the ledger has not accepted never
//! reaches the model: a report that fails after the client's retries is an error
//! and the model is unchanged. A retry the ledger had already applied is answered
//! as a duplicate, which is a success.

use crate::data::Examples;
use crate::error::{Error, Result};
use crate::grad::{clip_factors, per_example_norms, per_layer_norms, reported_norm, NormMethod};
use crate::model::DpModule;
use crate::sampler::poisson_batch;
use dpledger_client::tensorboard::{privacy_scalars, SummaryWriter};
use dpledger_client::{
    Client, Encoding, RefreshOutcome, Sampling, StepOutcome, ThresholdMode, TrainingSession,
};
use rand::rngs::StdRng;
use rand::SeedableRng;
use rand_distr::{Distribution, Normal};
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tch::nn::Optimizer;
use tch::{Kind, Reduction, Tensor};

/// Options of a [`DpSgd`] trainer.
#[derive(Debug, Clone, Default)]
pub struct DpSgdConfig {
    /// Sampled mode only: refresh every example's threshold from full-batch
    /// norms every this many steps (before steps k, 2k, ...); `None` never. A
    /// predictable dataset refreshes on the schedule it declared at creation,
    /// so setting this for one is refused.
    pub refresh_every: Option<u64>,
    /// Seed of batch sampling and noise. `None` (the default) seeds both from the
    /// operating system; a fixed seed makes the noise predictable, so use one only
    /// for tests and reproductions.
    pub seed: Option<u64>,
    /// How reports travel (default binary).
    pub encoding: Encoding,
    /// How per-example norms are computed (default per-layer when possible).
    pub norm_method: NormMethod,
    /// Write every accepted report to this file in the `dpledger replay` format
    /// (only for a dataset at step 0). The replay's format has no threshold
    /// mode: it recomputes the sampled protocol's numbers, so it checks a
    /// predictable run's served numbers only where both agree.
    pub trace: Option<PathBuf>,
    /// Write the run's privacy scalars (worst-case epsilon, the latest DP mean and
    /// quantiles, share of examples retired; the Python client's tags) to a new
    /// event file in this TensorBoard log directory after steps
    /// (`tensorboard_every`). Costs two reads per write, no privacy.
    pub tensorboard_dir: Option<PathBuf>,
    /// Write the TensorBoard scalars after every this many steps (default every
    /// step); only with `tensorboard_dir`.
    pub tensorboard_every: Option<u64>,
}

/// What one step did.
#[derive(Debug, Clone, PartialEq)]
pub struct StepStats {
    /// The step number.
    pub step: u64,
    /// Examples in the Poisson batch.
    pub batch_size: usize,
    /// Mean loss over the batch (NaN for an empty batch).
    pub mean_loss: f64,
    /// Examples whose gradient was scaled down to their threshold.
    pub clipped: usize,
    /// True when the ledger answered the report as a retry of an applied step.
    pub duplicate: bool,
    /// Whether a refresh (full, or the scheduled block) ran before this step.
    pub refreshed: bool,
    /// Examples whose norms that refresh computed and sent.
    pub refreshed_examples: usize,
    /// Time that refresh took (norms at the current model and the request):
    /// what following the schedule adds to the step.
    pub refresh_time: Duration,
    /// Time of the step proper (batch, norms, report, update), without the
    /// refresh and the TensorBoard scalars.
    pub step_time: Duration,
}

/// A DP-SGD trainer bound to one dpledger dataset. Blocking: it drives the async
/// client on its own runtime, so do not call it from inside an async task.
#[derive(Debug)]
pub struct DpSgd {
    runtime: tokio::runtime::Runtime,
    session: TrainingSession,
    examples: u64,
    rate: f64,
    noise_multiplier: f64,
    max_grad_norm: f64,
    refresh_every: Option<u64>,
    norm_method: NormMethod,
    sampler: StdRng,
    noise: StdRng,
    tensorboard: Option<SummaryWriter>,
    tensorboard_every: u64,
}

/// The batch on the device of the model's parameters.
fn on_device(batch: Examples, params: &[Tensor]) -> Examples {
    match params.first().map(Tensor::device) {
        Some(device) if device != batch.xs.device() => Examples {
            xs: batch.xs.to_device(device),
            ys: batch.ys.to_device(device),
        },
        _ => batch,
    }
}

fn per_example_cross_entropy(logits: &Tensor, ys: &Tensor) -> Tensor {
    logits.cross_entropy_loss::<Tensor>(ys, None, Reduction::None, -100, 0.0)
}

impl DpSgd {
    /// Open `dataset` (a trainer token suffices) and read its configuration and
    /// current thresholds. The dataset must use Poisson sampling.
    pub fn new(client: Client, dataset: &str, config: DpSgdConfig) -> Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let mut session = runtime.block_on(TrainingSession::open(client, dataset))?;
        session.set_encoding(config.encoding);
        let ledger = session.config().clone();
        let Sampling::Poisson { rate } = ledger.sampling else {
            return Err(Error::Config(format!(
                "dataset {dataset:?} declares shuffled batches; this trainer draws Poisson batches"
            )));
        };
        if !(rate > 0.0 && rate <= 1.0) {
            return Err(Error::Config(format!(
                "dataset {dataset:?} has sampling rate {rate}; training needs 0 < q <= 1"
            )));
        }
        if let Some(path) = &config.trace {
            session.record_trace(path)?;
        }
        if config.refresh_every == Some(0) {
            return Err(Error::Config("refresh_every must be at least 1".into()));
        }
        let predictable = ledger.thresholds == Some(ThresholdMode::Predictable)
            && ledger.clipping == dpledger_client::Clipping::PerExample;
        if predictable && config.refresh_every.is_some() {
            return Err(Error::Config(format!(
                "dataset {dataset:?} has predictable thresholds: it refreshes on the schedule \
                 declared at creation (\"refresh\": {{\"full_every\": E, \"block\": m}}), \
                 not every refresh_every steps"
            )));
        }
        if config.tensorboard_every == Some(0) {
            return Err(Error::Config("tensorboard_every must be at least 1".into()));
        }
        let tensorboard = match &config.tensorboard_dir {
            Some(dir) => Some(SummaryWriter::new(dir).map_err(|e| {
                Error::Config(format!("TensorBoard log directory {}: {e}", dir.display()))
            })?),
            None => None,
        };
        let (sampler, noise) = match config.seed {
            Some(seed) => (
                StdRng::seed_from_u64(seed),
                StdRng::seed_from_u64(seed ^ 0x6e6f_6973_6520_7365),
            ),
            None => (StdRng::from_os_rng(), StdRng::from_os_rng()),
        };
        Ok(Self {
            runtime,
            examples: ledger.examples,
            rate,
            noise_multiplier: ledger.noise_multiplier,
            max_grad_norm: ledger.max_grad_norm,
            refresh_every: config.refresh_every,
            norm_method: config.norm_method,
            session,
            sampler,
            noise,
            tensorboard,
            tensorboard_every: config.tensorboard_every.unwrap_or(1),
        })
    }

    /// The session (mirror, configuration, next step).
    pub fn session(&self) -> &TrainingSession {
        &self.session
    }

    /// Run a future of the client (e.g. a privacy query) on the trainer's runtime.
    pub fn block_on<F: std::future::Future>(&self, future: F) -> F::Output {
        self.runtime.block_on(future)
    }

    /// Write the privacy scalars now, at step = steps applied (as the Python
    /// `LedgerRun.log_tensorboard`), to the `tensorboard_dir` writer; returns what
    /// was written (empty without a `tensorboard_dir`).
    pub fn log_tensorboard(&mut self) -> Result<Vec<(String, f64)>> {
        let Some(writer) = self.tensorboard.as_mut() else {
            return Ok(Vec::new());
        };
        let retired = self.session.mirror().retired_count() as u64;
        let scalars = self.runtime.block_on(privacy_scalars(
            self.session.client(),
            self.session.dataset(),
            retired,
            self.examples,
        ))?;
        let step = self.session.next_step();
        writer
            .add_scalars(&scalars, step)
            .and_then(|()| writer.flush())?;
        Ok(scalars)
    }

    /// The TensorBoard event file, with `tensorboard_dir`.
    pub fn tensorboard_file(&self) -> Option<&std::path::Path> {
        self.tensorboard.as_ref().map(SummaryWriter::path)
    }

    /// Steps in one expected pass over the data: `round(1 / q)`.
    pub fn steps_per_epoch(&self) -> u64 {
        (1.0 / self.rate).round().max(1.0) as u64
    }

    /// Per-example norms of `data`'s examples `ids` under the current model, and
    /// the per-example losses (graph kept).
    fn norms<M: DpModule>(
        &self,
        model: &M,
        batch: &Examples,
        params: &[Tensor],
    ) -> Result<(Tensor, Vec<f64>)> {
        let taped = match self.norm_method {
            NormMethod::Auto => model.forward_tape(&batch.xs),
            NormMethod::PerExample => None,
        };
        match taped {
            Some((logits, tape)) => {
                let losses = per_example_cross_entropy(&logits, &batch.ys);
                let norms = per_layer_norms(&losses, &tape, params)?;
                Ok((losses, norms))
            }
            None => {
                let logits = model.forward(&batch.xs);
                let losses = per_example_cross_entropy(&logits, &batch.ys);
                let norms = per_example_norms(&losses, params)?;
                Ok((losses, norms))
            }
        }
    }

    fn check_data(&self, data: &Examples) -> Result<()> {
        if data.len() as u64 != self.examples {
            return Err(Error::Model(format!(
                "the data has {} examples but the ledger {}: row i must be example i",
                data.len(),
                self.examples
            )));
        }
        Ok(())
    }

    /// Full-batch refresh (sampled mode): every non-retired example's current
    /// norm sets its threshold from the next step on (charges nothing).
    /// Computed in chunks. A predictable dataset refuses it unless a full pass
    /// is due; use [`Self::refresh_due`] there.
    pub fn refresh<M: DpModule>(&mut self, model: &M, data: &Examples) -> Result<RefreshOutcome> {
        self.check_data(data)?;
        let mirror = self.session.mirror();
        let ids: Vec<u64> = (0..self.examples)
            .filter(|&i| !mirror.is_retired(i))
            .collect();
        self.refresh_ids(model, data, &ids)
    }

    /// The refresh the schedule calls for before the next step (predictable
    /// mode): the due ids' unclipped norms at the current model, computed in
    /// chunks and sent. Returns how many examples it sent; 0 when nothing is
    /// due (or outside the predictable mode). [`Self::step`] calls it.
    pub fn refresh_due<M: DpModule>(&mut self, model: &M, data: &Examples) -> Result<usize> {
        self.check_data(data)?;
        let Some(ids) = self.session.due() else {
            return Ok(0);
        };
        self.refresh_ids(model, data, &ids)?;
        Ok(ids.len())
    }

    /// Norms of `ids` at the current model (chunks of 256), sent as one refresh.
    fn refresh_ids<M: DpModule>(
        &mut self,
        model: &M,
        data: &Examples,
        ids: &[u64],
    ) -> Result<RefreshOutcome> {
        let params = model.parameters();
        let mut norms = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(256) {
            let batch = on_device(data.select(chunk), &params);
            let (_, n) = self.norms(model, &batch, &params)?;
            norms.extend(n.into_iter().map(reported_norm));
        }
        let outcome = self.runtime.block_on(self.session.refresh(ids, &norms))?;
        Ok(outcome)
    }

    /// One DP-SGD step with the per-example cross-entropy loss of the logits.
    pub fn step<M: DpModule>(
        &mut self,
        model: &M,
        opt: &mut Optimizer,
        data: &Examples,
    ) -> Result<StepStats> {
        self.check_data(data)?;
        let started = Instant::now();
        let refreshed_examples = match self.refresh_every {
            Some(k) => {
                let t = self.session.next_step();
                if t > 0 && t % k == 0 {
                    self.refresh(model, data)?.thresholds.len()
                } else {
                    0
                }
            }
            None => self.refresh_due(model, data)?,
        };
        let refresh_time = started.elapsed();
        let started = Instant::now();
        let params = model.parameters();
        // 1. Poisson batch.
        let mirror = self.session.mirror();
        let ids = poisson_batch(&mut self.sampler, self.examples, self.rate, |i| {
            mirror.is_retired(i)
        });
        // 2. Thresholds in force for this step (before the report moves them).
        let thresholds: Vec<f64> = ids.iter().map(|&i| mirror.threshold(i)).collect();
        // 3. Unclipped per-example norms.
        let batch = on_device(data.select(&ids), &params);
        let (losses, norms) = self.norms(model, &batch, &params)?;
        let factors = clip_factors(&norms, &thresholds);
        let clipped = factors.iter().filter(|&&f| f < 1.0).count();
        let mean_loss = if ids.is_empty() {
            f64::NAN
        } else {
            losses.mean(Kind::Double).double_value(&[])
        };
        // 4. Report and wait for the ledger.
        let reported: Vec<f64> = norms.iter().copied().map(reported_norm).collect();
        let batch_size = ids.len();
        let outcome: StepOutcome = self.runtime.block_on(self.session.report(ids, reported))?;
        // 5. Sum of clipped gradients, noise, step.
        opt.zero_grad();
        let weights = Tensor::from_slice(&factors)
            .to_kind(losses.kind())
            .to_device(losses.device());
        (losses * weights).sum(Kind::Float).f_backward()?;
        self.check_optimizer(opt, &params)?;
        self.add_noise(&params)?;
        opt.step();
        let step_time = started.elapsed();
        let applied = self.session.next_step();
        if self.tensorboard.is_some() && applied % self.tensorboard_every == 0 {
            self.log_tensorboard()
                .map_err(|e| Error::TensorBoard(Box::new(e)))?;
        }
        Ok(StepStats {
            step: outcome.step,
            batch_size,
            mean_loss,
            clipped,
            duplicate: outcome.duplicate,
            refreshed: refreshed_examples > 0,
            refreshed_examples,
            refresh_time,
            step_time,
        })
    }

    /// Every variable the optimizer updates from a gradient must be one of the
    /// model's parameters, which receive noise; anything else would be updated from
    /// private data without noise.
    fn check_optimizer(&self, opt: &Optimizer, params: &[Tensor]) -> Result<()> {
        let noised: Vec<usize> = params.iter().map(|p| p.data_ptr() as usize).collect();
        for var in opt.trainable_variables() {
            let grad = var.grad();
            if grad.defined() && !noised.contains(&(var.data_ptr() as usize)) {
                return Err(Error::Model(format!(
                    "an optimizer variable of shape {:?} has a gradient but is not among the \
                     model's parameters, so it would be updated without noise",
                    var.size()
                )));
            }
        }
        Ok(())
    }

    /// `grad = (sum of clipped gradients + N(0, (sigma C)^2)) / (q n)`.
    fn add_noise(&mut self, params: &[Tensor]) -> Result<()> {
        let std = self.noise_multiplier * self.max_grad_norm;
        let normal = Normal::new(0.0, std)
            .map_err(|e| Error::Config(format!("noise standard deviation {std}: {e}")))?;
        let expected_batch = self.rate * self.examples as f64;
        tch::no_grad(|| -> Result<()> {
            for p in params {
                let mut grad = p.grad();
                if !grad.defined() {
                    return Err(Error::Model(format!(
                        "a parameter of shape {:?} got no gradient",
                        p.size()
                    )));
                }
                let values: Vec<f64> = (0..grad.numel())
                    .map(|_| normal.sample(&mut self.noise))
                    .collect();
                let noise = Tensor::from_slice(&values)
                    .view(grad.size().as_slice())
                    .to_kind(grad.kind())
                    .to_device(grad.device());
                let _ = grad.f_add_(&noise)?;
                let _ = grad.f_div_scalar_(expected_batch)?;
            }
            Ok(())
        })
    }
}
