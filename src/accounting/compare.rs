//! Side-by-side accountants for one DP-SGD configuration (seed 002 §V, seed 004).
//!
//! The first two rows are what dpledger itself uses: PLD (the tightest, the default
//! of every worst case) and exact RDP (per-example ledgers); the others show how much
//! looser the classical composition theorems are, and one (seed 002's Theorem 3
//! with the conjectured `P(q, sigma) = q²/sigma²`) is an empirical estimate that
//! is labelled as such, never a guarantee.

use super::composition::{worst_case_epsilon, Event};
use super::conversion::{zcdp_epsilon_exact, zcdp_epsilon_simple, Conversion};
use super::error::Result;
use super::orders::default_orders;
use super::pld::{self, PldEvent, PldOptions};
use super::validate;
use serde::{Deserialize, Serialize};

/// One accountant's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ComparisonRow {
    /// Stable machine name of the method.
    pub method: String,
    /// What the method assumes and how it was computed.
    pub description: String,
    /// The epsilon at the requested delta (`null` in JSON where not applicable).
    pub epsilon: Option<f64>,
    /// Whether the number is a proven upper bound on the privacy loss.
    pub guarantee: bool,
}

fn row(
    method: &str,
    description: impl Into<String>,
    epsilon: Option<f64>,
    guarantee: bool,
) -> ComparisonRow {
    ComparisonRow {
        method: method.into(),
        description: description.into(),
        epsilon,
        guarantee,
    }
}

/// Epsilon of one Gaussian mechanism at `delta` (exact conversion of its zCDP curve).
fn gaussian_epsilon(sigma: f64, delta: f64) -> f64 {
    zcdp_epsilon_exact(1.0 / (2.0 * sigma * sigma), delta).epsilon
}

/// Per-step (epsilon, delta) of the Poisson-subsampled Gaussian via amplification by
/// subsampling: an (e, d) mechanism on a q-sample is (ln(1 + q(e^e - 1)), q d).
fn amplified_step_epsilon(q: f64, sigma: f64, step_delta: f64) -> f64 {
    let base = gaussian_epsilon(sigma, (step_delta / q).min(0.5));
    (q * base.exp_m1()).ln_1p()
}

/// Compare accountants for `steps` Poisson steps at rate `q`, noise `sigma`, at `delta`.
pub fn compare(q: f64, sigma: f64, steps: u64, delta: f64) -> Result<Vec<ComparisonRow>> {
    validate::sampling_rate("sampling_rate", q)?;
    validate::positive_noise_multiplier("noise_multiplier", sigma)?;
    validate::delta("delta", delta)?;
    let t = steps as f64;
    let orders = default_orders();
    let mut rows = Vec::new();

    let opts = PldOptions::default();
    let events = [PldEvent::PoissonGaussian {
        q,
        sigma,
        count: steps,
    }];
    let (pld_eps, pld_note) = match pld::worst_case_epsilon(&events, delta, &opts) {
        Ok(e) => (Some(e), String::new()),
        Err(e) => (None, format!("; not computed: {e}")),
    };
    rows.push(row(
        "pld",
        format!(
            "privacy loss distribution (add/remove), pessimistic connect-the-dots at grid {}, FFT composition; the tightest guarantee, dpledger's default{pld_note}",
            opts.value_discretization
        ),
        pld_eps,
        true,
    ));
    let rdp = worst_case_epsilon(
        &[Event::Poisson {
            q,
            sigma,
            count: steps,
        }],
        &orders,
        delta,
        Conversion::Improved,
    );
    rows.push(row(
        "rdp",
        "exact Poisson-subsampled Gaussian RDP (Mironov et al. 2019), improved conversion; what per-example ledgers and the filter use",
        Some(rdp.epsilon),
        true,
    ));

    let epochs = (t * q).ceil();
    let rho_shuffled = epochs / (2.0 * sigma * sigma);
    rows.push(row(
        "zcdp_shuffled",
        format!(
            "zCDP for shuffled batches of size q·n, no amplification (seed 002 Thm. 2): {epochs} epochs × 1/(2σ²), exact conversion"
        ),
        Some(zcdp_epsilon_exact(rho_shuffled, delta).epsilon),
        true,
    ));
    rows.push(row(
        "zcdp_shuffled_simple",
        "same rho, simple conversion rho + 2 sqrt(rho log 1/delta) (seed 002 Prop. 1)",
        Some(zcdp_epsilon_simple(rho_shuffled, delta)),
        true,
    ));

    // Seed 002 Theorem 3 with the empirical P(q, σ) = q²/σ², valid range α ≤ u.
    let rho_hat = t * q * q / (sigma * sigma);
    let u = sigma * sigma * (1.0 / (q * sigma)).ln() + 1.0;
    let theorem3 = if q > 0.0 && u > 1.0 {
        if delta >= (-rho_hat * (u - 1.0).powi(2)).exp() {
            Some(rho_hat + 2.0 * (rho_hat * (1.0 / delta).ln()).sqrt())
        } else {
            Some(rho_hat * u - delta.ln() / (u - 1.0))
        }
    } else {
        None
    };
    rows.push(row(
        "zcdp_theorem3_estimate",
        format!(
            "seed 002 Thm. 3 with conjectured P(q,σ)=q²/σ² (empirical estimate, not a guarantee; meant for q ≤ 1/(16σ){})",
            if q > 1.0 / (16.0 * sigma) { "; outside that range here" } else { "" }
        ),
        theorem3,
        false,
    ));

    if steps > 0 && q > 0.0 {
        let delta_prime = delta / 2.0;
        let step_delta = delta / (2.0 * t);
        let e0 = amplified_step_epsilon(q, sigma, step_delta);
        let advanced = e0 * (2.0 * t * (1.0 / delta_prime).ln()).sqrt() + t * e0 * e0.exp_m1();
        rows.push(row(
            "advanced_composition",
            "strong composition (Dwork–Rothblum–Vadhan) of amplified per-step (ε0, δ/(2T)) mechanisms, δ' = δ/2",
            Some(advanced),
            true,
        ));
        let basic = t * amplified_step_epsilon(q, sigma, delta / t);
        rows.push(row(
            "basic_composition",
            "basic composition of amplified per-step (ε0, δ/T) mechanisms",
            Some(basic),
            true,
        ));
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pld_is_the_tightest_guarantee_then_rdp() {
        let rows = compare(0.01, 1.1, 10_000, 1e-5).unwrap();
        assert_eq!(
            (rows[0].method.as_str(), rows[1].method.as_str()),
            ("pld", "rdp")
        );
        let pld = rows[0].epsilon.unwrap();
        let rdp = rows[1].epsilon.unwrap();
        assert!(pld < rdp * 0.95, "pld {pld} rdp {rdp}");
        for r in rows.iter().filter(|r| r.guarantee && r.method != "pld") {
            assert!(r.epsilon.unwrap() >= rdp * (1.0 - 1e-12), "{r:?}");
        }
        assert!(rows.iter().any(|r| !r.guarantee));
    }
}
