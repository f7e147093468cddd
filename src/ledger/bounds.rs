//! Which proven bound a reported epsilon comes from (spec §8).
//!
//! Two accountants bound the same dataset: RDP (per example and worst case,
//! spec §3–§5) and the PLD worst case (spec §8), which is tighter but
//! data-independent. Both are guarantees, so their minimum is one too:
//! - the worst case reported is `min(eps_PLD, eps_RDP)`, naming the method;
//! - an example's guarantee is bounded by the PLD worst case too, naming the bound;
//! - a value released for an example is capped by the public worst case.
//!
//! These pure functions are shared by the server and `dpledger replay`, so an
//! offline replay reproduces exactly what is served.

use super::protocol::{PrivacyPart, WorstCase};
use crate::accounting::pld::{self, PldEvent, PldOptions};

/// The worst-case views, defined once with the Rust client.
pub use dpledger_api::views::{PldWorstCase, WorstCaseBounds, WorstCaseMethod};

/// The discretisation every served PLD worst case uses.
pub fn pld_options() -> PldOptions {
    PldOptions::default()
}

/// The PLD worst case of `events` at `delta`.
pub fn pld_worst_case(events: &[PldEvent], delta: f64) -> Result<PldWorstCase, String> {
    let opts = pld_options();
    let epsilon = pld::worst_case_epsilon(events, delta, &opts).map_err(|e| e.to_string())?;
    Ok(PldWorstCase {
        epsilon,
        value_discretization: opts.value_discretization,
        guarantee: true,
    })
}

/// Both worst cases, the tighter as `epsilon` (RDP when the PLD is missing).
pub fn combine_worst_case(rdp: WorstCase, pld: Result<PldWorstCase, String>) -> WorstCaseBounds {
    let (pld, pld_error) = match pld {
        Ok(p) => (Some(p), None),
        Err(e) => (None, Some(e)),
    };
    let (epsilon, method) = match pld {
        Some(p) if p.epsilon <= rdp.epsilon => (p.epsilon, WorstCaseMethod::Pld),
        _ => (rdp.epsilon, WorstCaseMethod::Rdp),
    };
    WorstCaseBounds {
        epsilon,
        method,
        steps: rdp.steps,
        pld,
        pld_error,
        rdp,
    }
}

/// A value released for an example (spec §6), capped by the public worst
/// case `cap` (the PLD worst case when there is one).
pub fn capped_value(value: f64, cap: Option<f64>) -> f64 {
    match cap {
        Some(c) if c < value => c,
        _ => value,
    }
}

/// The value a release (and the data-dependent analysis) reads for an
/// example from its served parts: its ex-post bound with predictable
/// thresholds, its estimate otherwise, capped by the public worst case.
pub fn released_value(
    ex_post: Option<PrivacyPart>,
    estimate: PrivacyPart,
    cap: Option<f64>,
) -> f64 {
    capped_value(ex_post.map_or(estimate.epsilon, |e| e.epsilon), cap)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rdp(epsilon: f64) -> WorstCase {
        WorstCase {
            epsilon,
            order: 8.0,
            rdp: vec![],
            steps: 3,
        }
    }

    fn pld(epsilon: f64) -> PldWorstCase {
        PldWorstCase {
            epsilon,
            value_discretization: 1e-3,
            guarantee: true,
        }
    }

    #[test]
    fn the_tighter_worst_case_is_reported_and_named() {
        let w = combine_worst_case(rdp(2.0), Ok(pld(1.5)));
        assert_eq!((w.epsilon, w.method), (1.5, WorstCaseMethod::Pld));
        let w = combine_worst_case(rdp(1.0), Ok(pld(1.5)));
        assert_eq!((w.epsilon, w.method), (1.0, WorstCaseMethod::Rdp));
        let w = combine_worst_case(rdp(2.0), Err("too large".into()));
        assert_eq!((w.epsilon, w.method), (2.0, WorstCaseMethod::Rdp));
        assert_eq!(w.pld_error.as_deref(), Some("too large"));
    }

    #[test]
    fn a_released_value_is_capped_by_the_public_worst_case() {
        assert_eq!(capped_value(0.3, Some(1.5)), 0.3);
        assert_eq!(capped_value(1.7, Some(1.5)), 1.5);
        assert_eq!(capped_value(1.7, None), 1.7);
    }

    #[test]
    fn nothing_applied_costs_nothing() {
        assert_eq!(pld_worst_case(&[], 1e-5).unwrap().epsilon, 0.0);
        assert!(pld_worst_case(&[], 1.5).is_err());
    }
}
