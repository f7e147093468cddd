//! Parts of a dataset's status that the server reports and the Rust client
//! reads: a step in progress and the individual filter's budgets (spec §7).
//! One definition, so a field the server adds is one the client reads.

use serde::{Deserialize, Serialize};

/// A step whose parts are still arriving.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PendingStatus {
    /// The step.
    pub step: u64,
    /// Parts received.
    pub received: u32,
    /// Parts announced.
    pub count: u32,
}

/// The individual filter's fixed parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FilterStatus {
    /// The individual budget's epsilon.
    pub epsilon: f64,
    /// The individual budget's delta.
    pub delta: f64,
    /// The Rényi order `alpha*` at which the budget is enforced.
    pub order: f64,
    /// The RDP budget at `alpha*`.
    pub rdp_budget: f64,
    /// The budgets of their own that some labels have (fixed at creation);
    /// every other example has the one above.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub label_budgets: Vec<LabelBudgetStatus>,
}

/// One label's budget under the individual filter, as enforced.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LabelBudgetStatus {
    /// The label.
    pub label: String,
    /// The budget's epsilon.
    pub epsilon: f64,
    /// The budget's delta.
    pub delta: f64,
    /// The Rényi order `alpha*` at which it is enforced.
    pub order: f64,
    /// The RDP budget at `alpha*`.
    pub rdp_budget: f64,
}
