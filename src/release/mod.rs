//! DP releases of aggregate statistics of per-example epsilons (spec §6).
//!
//! Per-instance epsilons correlate with an example's loss, so anyone but the
//! owner sees them only through releases that are themselves differentially
//! private, and whose zCDP cost `rho` is charged to every example and to the
//! worst case as RDP `alpha · rho`. Values lie in `[0, B]` with `B` the worst-case
//! epsilon, which bounds every statistic's sensitivity under add/remove
//! (spec §6). Pure computation: no I/O, randomness passed in.

pub mod accuracy;
pub mod budget;
pub mod exact_sum;
pub mod histogram;
pub mod labels;
pub mod mean;
pub mod noise;
pub mod pld;
pub mod quantiles;
pub mod record;
pub mod request;
pub mod rng;
pub mod summary;

pub use budget::{BudgetRequest, BudgetRequestExt, BudgetStatus};
pub use exact_sum::ExactSum;
pub use histogram::HistogramValue;
pub use labels::{check_label, LabelAssignment, LabelRecord, Labels};
pub use mean::MeanValue;
pub use pld::release_pld_events;
pub use record::{LeftOut, ReleaseRecord};
pub use request::{
    HistogramRequest, MeanRequest, QuantileMethod, QuantilesRequest, ReleaseRequest,
};
pub use summary::{ReleaseSummary, Summary};

use rand::Rng;

/// What a release published and the policy that asks for releases, defined
/// once with the Rust client in the workspace crate `dpledger-api`.
pub use dpledger_api::release::{
    GroupStatistics, QuantileValue, Release, ReleasePolicy, ReleaseTrigger, ReleaseValues,
    Statistics,
};

/// Compute one population's statistics: its sufficient statistics
/// ([`Summary`]), then the mechanisms on them, as a sharded release does with
/// its shards' merged statistics.
pub fn statistics<R: Rng + ?Sized>(
    rng: &mut R,
    request: &ReleaseRequest,
    values: &[f64],
    bound: f64,
) -> Statistics {
    Summary::of(request, values, bound).release(rng, request, Some(values), bound)
}

/// Compute a validated release of `values` (every example's epsilon, by id,
/// each in `[0, bound]`). With `by_group`, every label's statistics at the full
/// cost each: the groups are disjoint, so one example affects one group only.
pub fn compute<R: Rng + ?Sized>(
    rng: &mut R,
    request: &ReleaseRequest,
    values: &[f64],
    bound: f64,
    labels: &Labels,
) -> ReleaseValues {
    ReleaseSummary::of(request, values, bound, labels).release(
        rng,
        request,
        Some((values, labels)),
        bound,
    )
}

/// RDP at `orders` of a `rho`-zCDP release: `alpha · rho`, rounded up by one ulp
/// so the charge is never below the exact product.
pub fn rdp_of_rho(orders: &[f64], rho: f64) -> Vec<f64> {
    orders.iter().map(|&a| (a * rho).next_up()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn request() -> ReleaseRequest {
        ReleaseRequest {
            mean: Some(MeanRequest { rho: 0.01 }),
            quantiles: Some(QuantilesRequest {
                rho: 0.01,
                levels: vec![0.5, 0.1],
                method: QuantileMethod::Kss,
                steps: None,
            }),
            histogram: Some(HistogramRequest { rho: 0.01, bins: 4 }),
            by_group: true,
            delta: None,
        }
    }

    #[test]
    fn total_cost_is_the_sum_of_the_statistics() {
        let mut r = request();
        r.validate().unwrap();
        assert!((r.rho() - 0.03).abs() < 1e-17);
        assert_eq!(r.quantiles.unwrap().levels, vec![0.1, 0.5]);
    }

    #[test]
    fn groups_are_released_separately_with_the_unlabelled_last() {
        let mut r = request();
        r.validate().unwrap();
        let mut labels = Labels::default();
        labels
            .assign(
                4,
                &LabelAssignment {
                    ids: vec![0, 1],
                    labels: vec![Some("a".into()), Some("b".into())],
                },
            )
            .unwrap();
        let mut rng = rand_pcg::Pcg64::seed_from_u64(1);
        let out = compute(&mut rng, &r, &[1.0, 2.0, 3.0, 4.0], 4.0, &labels);
        let g = out.groups.unwrap();
        assert!(out.population.is_none());
        assert_eq!(
            g.iter().map(|g| g.label.clone()).collect::<Vec<_>>(),
            vec![Some("a".into()), Some("b".into()), None]
        );
        assert!(g.iter().all(|g| g.statistics.mean.is_some()
            && g.statistics.quantiles.as_ref().unwrap().len() == 2
            && g.statistics.histogram.as_ref().unwrap().counts.len() == 4));
    }

    #[test]
    fn release_rdp_never_below_alpha_rho() {
        let orders = [1.5, 2.0, 10.0, 1024.0];
        for (a, r) in orders.iter().zip(rdp_of_rho(&orders, 0.00123)) {
            assert!(r >= a * 0.00123);
        }
    }

    #[test]
    fn invalid_requests_name_the_field() {
        let cases: Vec<(&str, serde_json::Value)> = vec![
            ("release", serde_json::json!({})),
            ("mean.rho", serde_json::json!({"mean": {"rho": 0}})),
            (
                "quantiles.levels",
                serde_json::json!({"quantiles": {"rho": 1, "levels": [1.0]}}),
            ),
            (
                "quantiles.levels",
                serde_json::json!({"quantiles": {"rho": 1, "levels": [0.5, 0.5]}}),
            ),
            (
                "quantiles.steps",
                serde_json::json!({"quantiles": {"rho": 1, "levels": [0.5], "steps": 3}}),
            ),
            (
                "histogram.bins",
                serde_json::json!({"histogram": {"rho": 1, "bins": 0}}),
            ),
            (
                "delta",
                serde_json::json!({"mean": {"rho": 1}, "delta": 1.5}),
            ),
        ];
        for (field, body) in cases {
            let mut r: ReleaseRequest = serde_json::from_value(body).unwrap();
            assert_eq!(r.validate().unwrap_err().name, field);
        }
    }
}
