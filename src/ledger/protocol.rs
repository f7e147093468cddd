//! The messages of the step protocol and the answers of queries (spec §3).
//!
//! The step protocol's own messages and the answers of queries are defined
//! once, with the Rust client, in the workspace crate `dpledger-api`
//! (`dpledger_api::step`, `dpledger_api::views`) and re-exported here under
//! their usual paths.

use crate::accounting::InvalidArgument;

pub use dpledger_api::status::{FilterStatus, LabelBudgetStatus, PendingStatus};

pub use dpledger_api::step::{Part, RefreshDue, RefreshOutcome, StepOutcome, StepReport};

pub use dpledger_api::views::{
    Bound, ExamplePrivacy, LedgerKind, LedgerStatus, PrivacyKind, PrivacyPart, WorstCase,
};

/// Refuses a norm that is not a finite number >= 0 (field `norms`): the rule
/// every reported batch keeps, checked by the ledger and, before any shard
/// sees a step, where a sharded dataset's report is split.
pub fn check_norms(norms: &[f64]) -> Result<(), InvalidArgument> {
    match norms
        .iter()
        .enumerate()
        .find(|(_, g)| !(g.is_finite() && **g >= 0.0))
    {
        Some((j, g)) => Err(InvalidArgument::new(
            "norms",
            format!("norms[{j}] = {g}: every norm must be a finite number >= 0"),
        )),
        None => Ok(()),
    }
}
