//! The messages of the step protocol and the answers of queries (spec §3).
//!
//! The step protocol's own messages and the answers of queries are defined
//! once, with the Rust client, in the workspace crate `dpledger-api`
//! (`dpledger_api::step`, `dpledger_api::views`) and re-exported here under
//! their usual paths.

pub use dpledger_api::status::{FilterStatus, LabelBudgetStatus, PendingStatus};

pub use dpledger_api::step::{
    check_norms, Part, RefreshDue, RefreshOutcome, StepOutcome, StepReport,
};

pub use dpledger_api::views::{
    Bound, ExamplePrivacy, LedgerKind, LedgerStatus, PrivacyKind, PrivacyPart, WorstCase,
};
