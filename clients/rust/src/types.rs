//! Request and response bodies of the dataset, training and privacy endpoints,
//! field for field as in `openapi/openapi.json` (those of the release endpoints
//! are in [`crate::release`]). Most are defined once with the server in the
//! workspace crate `dpledger-api` and re-exported here. JSON has no infinity:
//! the server writes an unbounded epsilon or RDP as `null`, which these types
//! read back as `f64::INFINITY` so that no value is ever mistaken for a small
//! one.

use serde::{Deserialize, Serialize};

/// The step protocol's messages, defined once with the server in the workspace
/// crate `dpledger-api`, so that what this client sends and reads is what the
/// server accepts and answers, field for field.
pub use dpledger_api::step::{Part, RefreshDue, RefreshOutcome, StepOutcome, StepReport};

/// A dataset's configuration and the answers of the dataset and privacy
/// queries, defined once with the server in `dpledger-api`. The server's
/// configuration is strict (`deny_unknown_fields`, on both sides); an
/// unbounded epsilon, order or RDP arrives as `null` and reads as
/// `f64::INFINITY` (`dpledger_api::views`).
pub use dpledger_api::config::{
    Clipping, Conversion, DatasetConfig, ExPostOrders, IndividualBudget, RefreshSchedule, Sampling,
    ShardSpan, ThresholdMode,
};
pub use dpledger_api::views::{
    Bound, DatasetView, ExamplePrivacy, LedgerKind, LedgerStatus, LevelSteps, PldEstimate,
    PldWorstCase, PrivacyKind, PrivacyPart, PrivacyView, ShardView, Thresholds, WorstCase,
    WorstCaseBounds, WorstCaseMethod,
};

/// The storage report (`GET /v1/admin/storage`), defined once with the server.
pub use dpledger_api::storage::{
    DatasetStorageReport, EstimateCacheReport, SnapshotReport, StorageReport, TableCacheReport,
};

/// Body of `POST /v1/datasets`.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct CreateDataset<'a> {
    pub id: &'a str,
    pub config: &'a DatasetConfig,
    #[serde(flatten)]
    pub setup: &'a crate::release::DatasetSetup,
}

/// Dataset ids visible to the caller.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub(crate) struct DatasetList {
    pub datasets: Vec<String>,
}

pub use dpledger_api::status::{FilterStatus, LabelBudgetStatus, PendingStatus};

/// Body of `POST /v1/datasets/{d}/refresh`.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct RefreshRequest<'a> {
    pub ids: &'a [u64],
    pub norms: &'a [f64],
}

/// Optional parameters of the privacy queries; `Default` asks for the dataset's
/// delta and the improved conversion.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct PrivacyQuery {
    /// Delta in (0, 1); default the dataset's reporting delta.
    pub delta: Option<f64>,
    /// The conversion; default improved.
    pub conversion: Option<Conversion>,
}

impl PrivacyQuery {
    /// At a given delta.
    pub fn at_delta(delta: f64) -> Self {
        Self {
            delta: Some(delta),
            conversion: None,
        }
    }

    pub(crate) fn pairs(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        if let Some(d) = self.delta {
            out.push(("delta", format!("{d:e}")));
        }
        if let Some(c) = self.conversion {
            out.push(("conversion", c.as_str().to_string()));
        }
        out
    }
}

/// Liveness / readiness.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Health {
    /// `"ok"`.
    pub status: String,
}
