//! A trainer's view of one dataset: the client, the threshold mirror and the step
//! counter together, so that every report carries the right step number and every
//! answer reaches the mirror before the next step is clipped.
//!
//! In the predictable mode (spec §3.2) the session also follows the public
//! refresh schedule: every answer (step, refresh, thresholds read) says which
//! refresh is due before the next step, [`TrainingSession::due`] lists the ids
//! still to send (retired ids and ids this session already sent left out), and
//! a step sent before them is refused here ([`Error::RefreshDue`]) instead of
//! by the server with a 409 after a round trip. A trainer's loop:
//!
//! ```no_run
//! # async fn run(mut session: dpledger_client::TrainingSession,
//! #              norms_at_current_model: impl Fn(&[u64]) -> Vec<f64>) -> dpledger_client::Result<()> {
//! if let Some(ids) = session.due() {
//!     let norms = norms_at_current_model(&ids); // unclipped, one model state
//!     session.refresh(&ids, &norms).await?;
//! }
//! // ... draw the batch, clip at session.mirror(), then:
//! session.report(vec![7], vec![0.3]).await?;
//! # Ok(()) }
//! ```

use crate::client::{Client, Encoding};
use crate::error::{Error, Result};
use crate::mirror::ThresholdMirror;
use crate::trace::TraceWriter;
use crate::types::{DatasetConfig, RefreshDue, RefreshOutcome, StepOutcome, StepReport};
use std::collections::HashSet;
use std::path::Path;

/// The server's limit on thresholds per request.
const THRESHOLD_PAGE: u64 = 1 << 20;

/// One training run's connection to its ledger.
#[derive(Debug)]
pub struct TrainingSession {
    client: Client,
    dataset: String,
    config: DatasetConfig,
    mirror: ThresholdMirror,
    encoding: Encoding,
    trace: Option<TraceWriter>,
    /// The refresh the server last said is due before the next step.
    refresh_due: Option<RefreshDue>,
    /// Ids of `refresh_due` this session sent (accepted) since the server's
    /// answer that announced it.
    sent: HashSet<u64>,
}

impl TrainingSession {
    /// Open a session on an existing dataset (a trainer, curator or admin token):
    /// reads its configuration and current thresholds, so this also resumes a run
    /// after a crash. Refuses an archived dataset and one with a half-received
    /// multi-part step.
    pub async fn open(client: Client, dataset: &str) -> Result<Self> {
        let view = client.dataset(dataset).await?;
        if view.archived {
            return Err(Error::InvalidRequest(format!(
                "dataset {dataset:?} is archived"
            )));
        }
        if let Some(p) = &view.status.pending {
            return Err(Error::InvalidRequest(format!(
                "step {} of dataset {dataset:?} is half received ({} of {} parts): finish it first",
                p.step, p.received, p.count
            )));
        }
        let n = view.config.examples;
        let mut thresholds = Vec::with_capacity(n as usize);
        let mut retired = Vec::new();
        let mut next_step = None;
        let mut refresh_due = None;
        let mut start = 0;
        while start < n {
            let end = (start + THRESHOLD_PAGE).min(n);
            let page = client.thresholds(dataset, Some(start), Some(end)).await?;
            if page.start != start || page.thresholds.len() as u64 != end - start {
                return Err(Error::Mirror(format!(
                    "asked thresholds {start}..{end}, got {} from {}",
                    page.thresholds.len(),
                    page.start
                )));
            }
            if *next_step.get_or_insert(page.next_step) != page.next_step {
                return Err(Error::Mirror(
                    "the dataset advanced while its thresholds were read: a second trainer is reporting"
                        .into(),
                ));
            }
            thresholds.extend(page.thresholds);
            retired.extend(page.retired);
            refresh_due = refresh_due.or(page.refresh_due);
            start = end;
        }
        let mut mirror = ThresholdMirror::from_thresholds(
            view.config.max_grad_norm,
            thresholds,
            next_step.unwrap_or(view.status.steps),
        )?;
        mirror.mark_retired(&retired)?;
        Ok(Self {
            client,
            dataset: dataset.to_string(),
            config: view.config,
            mirror,
            encoding: Encoding::default(),
            trace: None,
            refresh_due,
            sent: HashSet::new(),
        })
    }

    /// Report in this encoding from now on (default binary).
    pub fn set_encoding(&mut self, encoding: Encoding) {
        self.encoding = encoding;
    }

    /// Write every accepted report to `path` in the `dpledger replay` trace format.
    /// Only from step 0: a replay needs the whole history.
    pub fn record_trace(&mut self, path: &Path) -> Result<()> {
        if self.mirror.next_step() != 0 {
            return Err(Error::InvalidRequest(format!(
                "a trace must start at step 0; the dataset is at step {}",
                self.mirror.next_step()
            )));
        }
        self.trace = Some(TraceWriter::create(path, &self.config)?);
        Ok(())
    }

    /// The client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The dataset id.
    pub fn dataset(&self) -> &str {
        &self.dataset
    }

    /// The dataset's configuration.
    pub fn config(&self) -> &DatasetConfig {
        &self.config
    }

    /// The thresholds for the next step.
    pub fn mirror(&self) -> &ThresholdMirror {
        &self.mirror
    }

    /// The next step's number.
    pub fn next_step(&self) -> u64 {
        self.mirror.next_step()
    }

    /// The refresh the server last announced as due before the next step
    /// (predictable mode; `None` outside it or when the schedule calls for
    /// nothing), as the server counts it (`received` includes other sessions').
    pub fn refresh_due(&self) -> Option<&RefreshDue> {
        self.refresh_due
            .as_ref()
            .filter(|d| d.before_step == self.mirror.next_step())
    }

    /// The ids whose unclipped norms, computed at the current model (the one
    /// the next step starts from), must be sent with [`Self::refresh`] before
    /// the next step: the due refresh's ids less retired ones (the server
    /// excuses them) and less those this session already sent. `None` when
    /// nothing is due. Ids another process sent before this session opened
    /// cannot be known here; sending them again is refused (409).
    pub fn due(&self) -> Option<Vec<u64>> {
        let due = self.refresh_due()?;
        if due.received >= due.count {
            return None;
        }
        let ids: Vec<u64> = due
            .ids(self.config.examples)
            .into_iter()
            .filter(|&i| !self.mirror.is_retired(i) && !self.sent.contains(&i))
            .collect();
        (!ids.is_empty()).then_some(ids)
    }

    /// Refuse a step while a refresh is due (what the server would refuse).
    fn check_nothing_due(&self, step: u64) -> Result<()> {
        if let Some(ids) = self.due() {
            let due = self.refresh_due().expect("due ids come from a due refresh");
            return Err(Error::RefreshDue {
                step,
                detail: format!(
                    "{} of the {} ids of the {} due before it not sent yet (first {}); send                      their norms at the current model with refresh() first",
                    ids.len(),
                    due.count,
                    if due.full {
                        "full pass"
                    } else {
                        "round-robin block"
                    },
                    ids[0]
                ),
            });
        }
        Ok(())
    }

    fn note_due(&mut self, due: Option<RefreshDue>) {
        let same = matches!(
            (&self.refresh_due, &due),
            (Some(a), Some(b)) if a.before_step == b.before_step
        );
        if !same {
            self.sent.clear();
        }
        self.refresh_due = due;
    }

    /// Report the next step: the sampled ids and their *unclipped* norms. On
    /// success the mirror holds the thresholds for the following step. On error
    /// (after the client's retries) nothing is applied locally; the step may or may
    /// not be in the ledger, and calling this again with the same report is safe.
    pub async fn report(&mut self, ids: Vec<u64>, norms: Vec<f64>) -> Result<StepOutcome> {
        let report = StepReport::new(self.mirror.next_step(), ids, norms);
        self.report_step(&report).await
    }

    /// Report a whole step built by the caller (e.g. with a per-step noise
    /// multiplier); its `step` must be the next one.
    pub async fn report_step(&mut self, report: &StepReport) -> Result<StepOutcome> {
        if report.step != self.mirror.next_step() || report.part.is_some() {
            return Err(Error::InvalidRequest(format!(
                "a session reports whole steps in order: expected step {}, got step {}{}",
                self.mirror.next_step(),
                report.step,
                if report.part.is_some() {
                    " (a part)"
                } else {
                    ""
                }
            )));
        }
        self.check_nothing_due(report.step)?;
        let outcome = self
            .client
            .report_step_with(&self.dataset, report, self.encoding)
            .await?;
        self.mirror.apply_step(&report.ids, &outcome)?;
        if outcome.complete {
            self.note_due(outcome.refresh_due.clone());
        }
        if let Some(trace) = &mut self.trace {
            trace.step(report)?;
        }
        Ok(outcome)
    }

    /// Refresh: the unclipped norms of `ids`, all at one model state (the
    /// model before the next step), set their thresholds from the next step on,
    /// charging nothing. In the predictable mode only the ids of [`Self::due`]
    /// are taken (in one or several calls); in the sampled mode any ids, at any
    /// time.
    pub async fn refresh(&mut self, ids: &[u64], norms: &[f64]) -> Result<RefreshOutcome> {
        let outcome = self.client.refresh(&self.dataset, ids, norms).await?;
        self.mirror.apply_refresh(ids, &outcome)?;
        let before = outcome.refresh_due.as_ref().map(|d| d.before_step);
        self.note_due(outcome.refresh_due.clone());
        if before == Some(self.mirror.next_step()) {
            self.sent.extend(ids.iter().copied());
        }
        if let Some(trace) = &mut self.trace {
            trace.refresh(ids, norms)?;
        }
        Ok(outcome)
    }
}
