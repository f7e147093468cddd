//! A dataset's release budget: total zCDP `rho` that releases
//! may spend, given directly or as an (epsilon, delta) target converted with the
//! exact zCDP → DP conversion, rounded down so the target is never exceeded.

use crate::accounting::conversion::zcdp_epsilon_exact;
use crate::accounting::error::{InvalidArgument, Result};

/// The budget's wire types, defined once with the Rust client in the
/// workspace crate `dpledger-api`.
pub use dpledger_api::release::{BudgetRequest, BudgetStatus};

/// The server's conversion of a budget as asked for into zCDP `rho`, beside
/// the type: it needs the exact zCDP-to-DP conversion of the accountants.
pub trait BudgetRequestExt {
    /// The budget in zCDP `rho`.
    fn to_rho(&self) -> Result<f64>;
}

impl BudgetRequestExt for BudgetRequest {
    fn to_rho(&self) -> Result<f64> {
        match (self.rho, self.epsilon, self.delta) {
            (Some(rho), None, None) => {
                if rho.is_finite() && rho >= 0.0 {
                    Ok(rho)
                } else {
                    Err(InvalidArgument::new(
                        "rho",
                        format!("{rho} is not a finite number >= 0"),
                    ))
                }
            }
            (None, Some(eps), Some(delta)) => {
                crate::accounting::validate::delta("delta", delta)?;
                if !(eps.is_finite() && eps >= 0.0) {
                    return Err(InvalidArgument::new(
                        "epsilon",
                        format!("{eps} is not a finite number >= 0"),
                    ));
                }
                Ok(rho_for_epsilon(eps, delta))
            }
            _ => Err(InvalidArgument::new(
                "budget",
                "give either rho, or epsilon together with delta",
            )),
        }
    }
}

/// The largest `rho` (to 1e-12 relative) whose exact conversion is at most
/// `epsilon` at `delta`: bisection, returning the feasible end.
pub fn rho_for_epsilon(epsilon: f64, delta: f64) -> f64 {
    if epsilon == 0.0 {
        return 0.0;
    }
    let feasible = |rho: f64| zcdp_epsilon_exact(rho, delta).epsilon <= epsilon;
    // rho <= epsilon always (epsilon >= rho for every delta < 1).
    let (mut lo, mut hi) = (0.0f64, epsilon);
    if feasible(hi) {
        return hi;
    }
    while hi - lo > 1e-12 * hi {
        let mid = 0.5 * (lo + hi);
        if feasible(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    lo
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epsilon_budget_converts_to_the_largest_feasible_rho() {
        let rho = rho_for_epsilon(1.0, 1e-6);
        assert!(zcdp_epsilon_exact(rho, 1e-6).epsilon <= 1.0);
        assert!(zcdp_epsilon_exact(rho * (1.0 + 1e-9), 1e-6).epsilon > 1.0 - 1e-9);
        // The simple conversion is looser, so the exact one allows more rho.
        let simple = {
            let l = (1e6f64).ln();
            (l.sqrt() - (l + 1.0).sqrt()).powi(2)
        };
        assert!(rho > simple, "{rho} vs {simple}");
    }

    #[test]
    fn exactly_one_form_is_accepted() {
        let ok = BudgetRequest {
            rho: Some(0.5),
            epsilon: None,
            delta: None,
        };
        assert_eq!(ok.to_rho().unwrap(), 0.5);
        for bad in [
            BudgetRequest {
                rho: None,
                epsilon: None,
                delta: None,
            },
            BudgetRequest {
                rho: Some(0.5),
                epsilon: Some(1.0),
                delta: Some(1e-5),
            },
            BudgetRequest {
                rho: None,
                epsilon: Some(1.0),
                delta: None,
            },
            BudgetRequest {
                rho: Some(-1.0),
                epsilon: None,
                delta: None,
            },
            BudgetRequest {
                rho: None,
                epsilon: Some(1.0),
                delta: Some(2.0),
            },
        ] {
            assert!(bad.to_rho().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn budget_allows_exact_splits_and_refuses_overdraft() {
        let mut s = BudgetStatus {
            rho_budget: Some(0.3),
            rho_spent: 0.0,
            releases: 0,
        };
        for _ in 0..3 {
            assert!(s.allows(0.1));
            s.rho_spent += 0.1;
        }
        assert!(!s.allows(1e-6));
        assert!(!BudgetStatus {
            rho_budget: None,
            rho_spent: 0.0,
            releases: 0
        }
        .allows(1e-9));
    }
}
