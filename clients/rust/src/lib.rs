//! Typed async client for dpledger, the per-example Rényi-DP privacy accountant.
//!
//! * [`Client`]: one method per endpoint (datasets, step reports in JSON or the
//!   compact binary encoding, thresholds, refresh, per-example privacy, the worst
//!   case, DP releases and their budget, labels and policy ([`release`]), the
//!   stateless accountant, operations), bearer tokens, and retries where resending
//!   is safe ([`retry`]). Every refusal is an [`Error::Api`] carrying the server's
//!   problem document (with the budget of a refused release: [`Error::budget`]).
//! * [`ThresholdMirror`] and [`TrainingSession`]: what a DP-SGD trainer needs to
//!   clip each example at the threshold the ledger holds for it (spec §3), kept
//!   current from the answers of its own reports.
//! * [`trace::TraceWriter`]: a replayable copy of the reports, for an offline
//!   `dpledger replay`.
//! * [`tensorboard`]: the run's privacy scalars as a TensorBoard event file,
//!   under the Python client's tags.
//!
//! ```no_run
//! # async fn run() -> dpledger_client::Result<()> {
//! use dpledger_client::{Client, TrainingSession};
//! let client = Client::new("http://127.0.0.1:8080", "TRAINER-TOKEN")?;
//! let mut session = TrainingSession::open(client, "mnist-run-1").await?;
//! let ids = vec![7, 42];
//! let clip_at: Vec<f64> = ids.iter().map(|&i| session.mirror().threshold(i)).collect();
//! // ... clip example ids[j] at clip_at[j], add noise, step the optimizer ...
//! let outcome = session.report(ids, vec![0.31, 2.5]).await?; // unclipped norms
//! assert_eq!(outcome.step, 0);
//! # Ok(()) }
//! ```

pub mod accountant;
pub mod analysis;
mod client;
pub mod cluster;
pub mod codec;
mod error;
pub mod local;
mod mirror;
pub mod release;
pub mod retry;
mod session;
pub mod shard;
pub use dpledger_api::shard_rule;
pub use dpledger_api::split_step;
pub mod tensorboard;
pub mod trace;
mod types;

pub use analysis::{
    AnalysisQuery, DataDependentAnalysis, DataDependentExample, DataDependentExampleView,
    DataDependentInterval, DataDependentQuantiles, DataDependentSummary, DataIndependentEpsilon,
};
pub use client::{Client, ClientBuilder, Encoding};
pub use cluster::{ClusterNode, ClusterView, DatasetOwner, DrainAnswer};
pub use error::{Error, Problem, Result};
pub use mirror::ThresholdMirror;
pub use release::{
    BudgetRefusal, BudgetRequest, BudgetStatus, DatasetSetup, GroupStatistics, HistogramRequest,
    HistogramValue, LabelsView, MeanRequest, MeanValue, PolicyView, QuantileMethod, QuantileValue,
    QuantilesRequest, Release, ReleaseList, ReleaseOutcome, ReleasePolicy, ReleaseRequest,
    ReleaseTrigger, ReleaseValues, Statistics,
};
pub use retry::RetryPolicy;
pub use session::TrainingSession;
pub use types::{
    Bound, Clipping, Conversion, DatasetConfig, DatasetView, ExamplePrivacy, FilterStatus, Health,
    IndividualBudget, LabelBudgetStatus, LedgerStatus, LevelSteps, Part, PendingStatus,
    PldEstimate, PldWorstCase, PrivacyQuery, PrivacyView, RefreshOutcome, Sampling, ShardView,
    StepOutcome, StepReport, Thresholds, WorstCase, WorstCaseBounds, WorstCaseMethod,
};
pub use types::{
    DatasetStorageReport, EstimateCacheReport, SnapshotReport, StorageReport, TableCacheReport,
};
pub use types::{
    ExPostOrders, LedgerKind, PrivacyKind, PrivacyPart, RefreshDue, RefreshSchedule, ShardSpan,
    ThresholdMode,
};
