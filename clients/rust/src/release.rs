//! Request and response bodies of the DP-release endpoints (tag `releases` of
//! `openapi/openapi.json`): releases of aggregate statistics of the per-example
//! epsilons, the release budget, group labels and the automatic release policy.
//!
//! A release's zCDP cost `rho` is charged to every example and to the worst case,
//! as RDP `alpha * rho` at every Rényi order, and is checked against the dataset's
//! release budget before any data is touched.
//!
//! ```
//! use dpledger_client::ReleaseRequest;
//! let r = ReleaseRequest::default()
//!     .mean(0.001)
//!     .quantiles(0.001, vec![0.1, 0.5, 0.9])
//!     .histogram(0.001, 10);
//! assert!((r.rho() - 0.003).abs() < 1e-15);
//! ```

use serde::Serialize;

/// The releases' wire, defined once with the server in the workspace crate
/// `dpledger-api`: what a release asks for (with its validation and cost, as
/// the server applies them) and publishes, the budget and the policy. A
/// budget as asked for is the server's one object with optional fields:
/// build it with [`BudgetRequest::rho`] or [`BudgetRequest::epsilon`].
pub use dpledger_api::release::{
    BudgetRequest, BudgetStatus, GroupStatistics, HistogramRequest, HistogramValue, LabelsView,
    MeanRequest, MeanValue, PolicyView, QuantileMethod, QuantileValue, QuantilesRequest, Release,
    ReleaseList, ReleaseOutcome, ReleasePolicy, ReleaseRequest, ReleaseTrigger, ReleaseValues,
    Statistics,
};

/// Body of `PUT /v1/datasets/{d}/release-policy`: `null` removes the policy, so
/// it is always written.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct PolicyUpdate<'a> {
    pub policy: Option<&'a ReleasePolicy>,
}

/// Body of `PUT /v1/datasets/{d}/labels`.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct LabelAssignment<'a> {
    pub ids: &'a [u64],
    pub labels: &'a [Option<String>],
}

/// The release settings that may be given when a dataset is created (see
/// [`crate::Client::create_dataset_with`]); `Default` gives none.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct DatasetSetup {
    /// Budget for releases (default none: no release is possible until a curator
    /// sets one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub release_budget: Option<BudgetRequest>,
    /// Group labels of examples `0, 1, ...` (`None`: unlabelled), for per-group
    /// releases; at most one per example.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub labels: Option<Vec<Option<String>>>,
    /// Release automatically every N steps.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub release_policy: Option<ReleasePolicy>,
}

/// A refused release's budget state: the `budget` extension of the problem
/// document of a 409 (see [`crate::Error::budget`]), defined with the server
/// in the workspace crate `dpledger-api`.
pub use dpledger_api::problem::BudgetRefusal;

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn requests_serialize_as_the_server_reads_them() {
        let r = ReleaseRequest::default()
            .mean(0.001)
            .quantiles(0.002, vec![0.9, 0.1])
            .histogram(0.003, 5);
        assert_eq!(
            serde_json::to_value(&r).unwrap(),
            json!({
                "mean": {"rho": 0.001},
                "quantiles": {"rho": 0.002, "levels": [0.9, 0.1], "method": "kss"},
                "histogram": {"rho": 0.003, "bins": 5},
                "by_group": false,
            })
        );
        assert_eq!(
            serde_json::to_value(BudgetRequest::rho(0.5)).unwrap(),
            json!({"rho": 0.5})
        );
        assert_eq!(
            serde_json::to_value(BudgetRequest::epsilon(1.0, 1e-6)).unwrap(),
            json!({"epsilon": 1.0, "delta": 1e-6})
        );
        assert_eq!(
            serde_json::to_value(PolicyUpdate { policy: None }).unwrap(),
            json!({"policy": null})
        );
        assert_eq!(
            serde_json::to_value(DatasetSetup::default()).unwrap(),
            json!({})
        );
    }

    #[test]
    fn group_statistics_are_flattened() {
        let v: ReleaseValues = serde_json::from_value(json!({
            "groups": [
                {"label": "a", "mean": {"mean": 1.5, "count": 10.0}},
                {"label": null, "histogram": {"edges": [0.0, 1.0], "counts": [3.0]}},
            ]
        }))
        .unwrap();
        assert!(v.population.is_none());
        assert_eq!(v.group(Some("a")).unwrap().mean.unwrap().mean, 1.5);
        let none = v.group(None).unwrap();
        assert!(none.mean.is_none());
        assert_eq!(none.histogram.as_ref().unwrap().counts, vec![3.0]);
        assert!(v.group(Some("b")).is_none());
    }
}
