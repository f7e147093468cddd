//! What one ledger answers when it is read: the dataset's view, a range of
//! thresholds, an example's privacy and the worst case. The HTTP handlers
//! and the sharded datasets' scatter (`sharding::scatter`, for the shards
//! this node owns) ask the same functions, so that a shard answers its part
//! exactly as an unsharded dataset answers the whole.

use super::error::{EngineError, EngineResult};
use super::{Dataset, Engine};
use crate::accounting::{validate, Conversion};
use crate::ledger::{Ledger, WorstCaseBounds};
use dpledger_api::views::{DatasetView, PrivacyView, Thresholds};

/// How a privacy query asks for its bounds: at which delta (default: the
/// dataset's reporting delta) and with which conversion.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PrivacyQuery {
    /// Delta in (0, 1), or the dataset's.
    pub delta: Option<f64>,
    /// RDP-to-DP conversion.
    pub conversion: Conversion,
}

impl PrivacyQuery {
    /// The delta to use on `ledger`: the query's, validated, or the dataset's.
    fn delta_for(&self, default: f64) -> EngineResult<f64> {
        Ok(validate::delta("delta", self.delta.unwrap_or(default))?)
    }
}

/// An example's privacy query: its bounds, and whether to add the example's
/// PLD estimate (labelled as no guarantee).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ExampleQuery {
    /// Delta and conversion.
    pub bounds: PrivacyQuery,
    /// Whether to add the PLD estimate over the example's actual history.
    pub estimate: bool,
}

/// A range of example ids as asked for (`start` default 0, `end` default
/// every example).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IdRange {
    /// First id (inclusive).
    pub start: Option<u64>,
    /// Last id (exclusive).
    pub end: Option<u64>,
}

impl IdRange {
    /// The range on a dataset of `examples` examples, refused when it is
    /// inverted or longer than `max_range`.
    pub fn resolve(self, examples: u64, max_range: u64) -> EngineResult<std::ops::Range<u64>> {
        let start = self.start.unwrap_or(0);
        let end = self.end.unwrap_or(examples).min(examples);
        if start > end {
            return Err(EngineError::BadRequest {
                detail: format!("start {start} is after end {end}"),
                field: Some("start"),
            });
        }
        if end - start > max_range {
            return Err(EngineError::BadRequest {
                detail: format!("at most {max_range} thresholds per request"),
                field: Some("end"),
            });
        }
        Ok(start..end)
    }
}

/// The view of one ledger's dataset.
fn view_of(ds: &Dataset, ledger: &Ledger) -> EngineResult<DatasetView> {
    let config = ledger.config().clone();
    let worst_case = ds.worst_case_bounds(ledger, config.delta, Conversion::default())?;
    Ok(DatasetView {
        id: ds.id.clone(),
        archived: ds.is_archived(),
        status: ledger.status(),
        config,
        worst_case,
        shards: None,
    })
}

impl Engine {
    /// The view of dataset `id` held by this node (one ledger).
    pub async fn ledger_view(&self, id: &str) -> EngineResult<DatasetView> {
        self.with_ledger(id, view_of).await
    }

    /// The thresholds of ids `range` of dataset `id` held by this node, with
    /// the step they are for, the retired ids among them and what refresh is
    /// due.
    pub async fn ledger_thresholds(
        &self,
        id: &str,
        range: IdRange,
        max_range: u64,
    ) -> EngineResult<Thresholds> {
        self.with_ledger(id, |_, ledger| {
            let ids = range.resolve(ledger.examples(), max_range)?;
            Ok(Thresholds {
                start: ids.start,
                next_step: ledger.next_step(),
                thresholds: ledger.thresholds(ids.clone())?,
                retired: ledger.retired_in(ids),
                refresh_due: ledger.refresh_due(),
            })
        })
        .await
    }

    /// The worst case of dataset `id` held by this node.
    pub async fn ledger_worst_case(
        &self,
        id: &str,
        query: PrivacyQuery,
    ) -> EngineResult<WorstCaseBounds> {
        self.with_ledger(id, |ds, ledger| {
            let delta = query.delta_for(ledger.config().delta)?;
            ds.worst_case_bounds(ledger, delta, query.conversion)
        })
        .await
    }

    /// Example `example`'s privacy in dataset `id` held by this node: from
    /// the store's archive block when the dataset is archived and out of
    /// memory, else from the ledger; with its PLD estimate when asked.
    pub async fn ledger_example_privacy(
        &self,
        id: &str,
        example: u64,
        query: ExampleQuery,
    ) -> EngineResult<PrivacyView> {
        let no_estimate = |why: String| EngineError::Conflict {
            detail: format!("no PLD estimate for this example: {why}"),
            field: Some("method"),
        };
        let conversion = query.bounds.conversion;
        let mut from_archive = None;
        if let Some(archive) = self.archive_to_read(id)? {
            let delta = query.bounds.delta_for(archive.summary.config.delta)?;
            from_archive = self
                .archived_example_privacy(id, &archive, example, delta, conversion, query.estimate)
                .await?
                .map(|(example, worst_case, input)| -> EngineResult<_> {
                    let view = PrivacyView {
                        delta,
                        example,
                        worst_case,
                        pld_estimate: None,
                    };
                    Ok((view, input.transpose().map_err(no_estimate)?))
                })
                .transpose()?;
        }
        let (mut view, input) = match from_archive {
            Some(answer) => answer,
            None => {
                self.with_ledger(id, |ds, ledger| -> EngineResult<_> {
                    let delta = query.bounds.delta_for(ledger.config().delta)?;
                    let (example, worst_case) =
                        ds.example_privacy(ledger, example, delta, conversion)?;
                    // Read the counts under the lock; compose them after releasing it.
                    let input = if query.estimate {
                        Some(ledger.estimate_input(example.id)?.map_err(no_estimate)?)
                    } else {
                        None
                    };
                    let view = PrivacyView {
                        delta,
                        example,
                        worst_case,
                        pld_estimate: None,
                    };
                    Ok((view, input))
                })
                .await?
            }
        };
        if let Some(input) = input {
            let rdp = view.example.rdp_epsilon;
            view.pld_estimate = Some(self.pld_estimate(id, input, view.delta, rdp).await?);
        }
        Ok(view)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_defaults_to_every_id_and_refuses_what_it_cannot_answer() {
        assert_eq!(IdRange::default().resolve(10, 100).unwrap(), 0..10);
        let clipped = IdRange {
            start: Some(3),
            end: Some(50),
        };
        assert_eq!(clipped.resolve(10, 100).unwrap(), 3..10);
        let inverted = IdRange {
            start: Some(5),
            end: Some(4),
        };
        assert!(matches!(
            inverted.resolve(10, 100),
            Err(EngineError::BadRequest {
                field: Some("start"),
                ..
            })
        ));
        assert!(matches!(
            IdRange::default().resolve(10, 9),
            Err(EngineError::BadRequest {
                field: Some("end"),
                ..
            })
        ));
    }
}
