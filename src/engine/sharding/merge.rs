//! What the coordinator decides from the shards' prepared answers: whether a
//! request can be released across shards at all ([`check_interactive`],
//! [`check_sharded_request`]), and the one release their statistics make
//! ([`release_of_shards`]: checked to describe one step with one bound and one
//! budget, merged exactly, the mechanism run once). Pure: no shard is called.

use super::labels::dataset_label_names;
use super::protocol::{Prepared, PreparedRelease};
use crate::engine::error::{EngineError, EngineResult};
use crate::engine::releases::now_secs;
use crate::release::{QuantileMethod, Release, ReleaseRequest, ReleaseSummary, ReleaseTrigger};

/// Why the shards' statistics cannot make one release.
#[derive(Debug, Clone, PartialEq)]
pub enum Apart {
    /// The shards are at different steps (a step is in flight): try again.
    Steps(Vec<u64>),
    /// The shards disagree on what must be equal (budget, bound, releases).
    Disagree(String),
}

/// The release the shards' prepared statistics make: checked to describe one
/// step with one bound and one budget, merged exactly, the mechanism run once;
/// `trigger` says who asked (a curator, or the dataset's policy). `creation`
/// is the creation's label names (the layout's `label_names`); the groups
/// merge in the dataset's order derived from them and the shards' books
/// (`shard_labels::dataset_label_names`), labels after creation included.
pub fn release_of_shards(
    request: &ReleaseRequest,
    prepared: &[Prepared],
    creation: &[String],
    trigger: ReleaseTrigger,
) -> Result<Release, Apart> {
    let first = prepared
        .first()
        .ok_or_else(|| Apart::Disagree("no shard".into()))?;
    let names = &dataset_label_names(creation, prepared.iter().map(|p| p.labels.as_slice()))
        .ok_or_else(|| Apart::Disagree("the shards' label names differ".into()))?;
    if prepared.iter().any(|p| p.step != first.step) {
        return Err(Apart::Steps(prepared.iter().map(|p| p.step).collect()));
    }
    let same_budget = |p: &Prepared| {
        p.budget.releases == first.budget.releases
            && p.budget.rho_spent.to_bits() == first.budget.rho_spent.to_bits()
            && p.budget.rho_budget.map(f64::to_bits) == first.budget.rho_budget.map(f64::to_bits)
    };
    if !prepared.iter().all(same_budget) {
        return Err(Apart::Disagree("the shards' release budgets differ".into()));
    }
    // A shard without statistics could not describe the step asked (it is
    // past it, or did not reach it in time): ask again.
    let parts: Vec<&PreparedRelease> = prepared
        .iter()
        .map(|p| p.release.as_ref())
        .collect::<Option<_>>()
        .ok_or_else(|| Apart::Steps(prepared.iter().map(|p| p.step).collect()))?;
    let (delta, bound) = (parts[0].delta, parts[0].bound);
    if parts
        .iter()
        .any(|p| p.delta.to_bits() != delta.to_bits() || p.bound.to_bits() != bound.to_bits())
    {
        return Err(Apart::Disagree(
            "the shards' worst cases differ at the same step".into(),
        ));
    }
    let summaries: Vec<ReleaseSummary> = parts.iter().map(|p| p.summary.clone()).collect();
    let merged = ReleaseSummary::merge_all(request, &summaries, names, bound)
        .map_err(|m| Apart::Disagree(format!("the shards' statistics differ: {}", m.0)))?;
    let mut rng = crate::release::rng::release_rng(first.step);
    let values = merged.release(&mut rng, request, None, bound);
    Ok(Release {
        id: first.budget.releases + 1,
        step: first.step,
        released_at: now_secs(),
        trigger,
        request: request.clone(),
        delta,
        bound,
        rho: request.rho(),
        values,
    })
}

/// Refuse what a sharded dataset cannot release exactly: the interactive
/// gradient quantiles, and groups when the dataset has no labels (`names`:
/// the dataset's, `shard_labels::dataset_label_names`).
pub fn check_sharded_request(request: &ReleaseRequest, names: &[String]) -> EngineResult<()> {
    check_interactive(request)?;
    if request.by_group && names.is_empty() {
        return Err(EngineError::Conflict {
            detail: "by_group needs labels, and this sharded dataset has none: assign them \
                     with PUT /v1/datasets/{dataset}/labels"
                .into(),
            field: Some("by_group"),
        });
    }
    Ok(())
}

/// Refuse the interactive gradient quantiles (no sufficient statistics).
pub fn check_interactive(request: &ReleaseRequest) -> EngineResult<()> {
    if request
        .quantiles
        .as_ref()
        .is_some_and(|q| q.method == QuantileMethod::GradientDescent)
    {
        return Err(EngineError::Conflict {
            detail: "quantiles method gradient_descent is interactive and has no sufficient \
                     statistics to merge across shards: use kss"
                .into(),
            field: Some("quantiles.method"),
        });
    }
    Ok(())
}
