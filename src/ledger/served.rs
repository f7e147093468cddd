//! What is served for one example (spec §10): the guarantee, the ex-post
//! bound and the estimate, each labelled, from the example's ledger and the
//! worst case. One function behind a live ledger's answer, an archived
//! dataset's and `dpledger replay`'s, so all three say the same thing.
//!
//! - `guarantee`: the worst case (RDP here; the PLD worst case is applied by
//!   [`ExamplePrivacy::bounded_by`](super::protocol::ExamplePrivacy)), or, in
//!   the predictable mode with the individual filter and an example never
//!   pushed over budget, `min(eps(B), worst case)`: the filter keeps the
//!   threshold ledger at or below `B` at its order almost surely, so Feldman
//!   & Zrnic's theorem makes the run `(alpha, B)`-RDP for the example.
//! - `ex_post`: only in the predictable mode, from the threshold ledger at the
//!   order set fixed at creation.
//! - `estimate`: the ledger's epsilon by the requested conversion, never more
//!   than an estimate (in the sampled mode its charges depend on hidden
//!   sampling bits; in either mode a realized sum is not a tail bound). In the
//!   predictable mode it reads the discounted ledger `R` (sampled steps at the
//!   actual clipped norm), which depends on hidden bits too.

use super::config::ExPostOrders;
use super::convert::{ex_post_epsilon_of, Converter};
use super::protocol::{Bound, ExamplePrivacy, LedgerKind, PrivacyKind, PrivacyPart};
use crate::accounting::conversion::Conversion;

/// What a served answer depends on besides the example's own ledger.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ServedContext<'a> {
    /// The ledger's orders (every RDP vector follows them).
    pub(crate) orders: &'a [f64],
    /// True in the predictable mode with per-example clipping.
    pub(crate) predictable: bool,
    /// The individual filter's `(order, RDP budget)`, when it has one.
    pub(crate) filter: Option<(f64, f64)>,
    /// The ex-post order set (predictable mode).
    pub(crate) ex_post: Option<&'a ExPostOrders>,
}

/// What an example's privacy reports besides its RDP.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ExampleFacts {
    pub(crate) steps: u64,
    pub(crate) retired: bool,
    pub(crate) over_budget: bool,
    pub(crate) threshold: f64,
}

/// The epsilon of the filter's budget `B` at its order `alpha`.
pub(crate) fn filter_epsilon(alpha: f64, budget: f64, delta: f64, conversion: Conversion) -> f64 {
    Converter::new(&[alpha], delta, conversion)
        .epsilon(&[budget])
        .epsilon
}

/// An example's two ledgers, releases included: the one its proven numbers
/// read (the threshold ledger in the predictable mode), and the discounted
/// ledger its estimate reads when it differs (spec §3 rule 4).
pub(crate) struct ExampleLedgers {
    pub(crate) rdp: Vec<f64>,
    pub(crate) discounted: Option<Vec<f64>>,
}

/// An example's privacy from its ledgers and the worst case's `worst_rdp`, at
/// a validated `delta`.
pub(crate) fn example_privacy(
    id: u64,
    ledgers: ExampleLedgers,
    worst_rdp: &[f64],
    delta: f64,
    conversion: Conversion,
    ctx: ServedContext<'_>,
    facts: ExampleFacts,
) -> ExamplePrivacy {
    let conv = Converter::new(ctx.orders, delta, conversion);
    let ExampleLedgers { rdp, discounted } = ledgers;
    let estimate = conv.epsilon(discounted.as_deref().unwrap_or(&rdp));
    let worst = conv.epsilon(worst_rdp).epsilon;
    let filtered = match ctx.filter {
        Some((alpha, budget)) if ctx.predictable && !facts.over_budget => {
            Some(filter_epsilon(alpha, budget, delta, conversion))
        }
        _ => None,
    };
    let (epsilon, bound, kind) = match filtered {
        Some(f) if f < worst => (f, Bound::IndividualFilter, PrivacyKind::IndividualFilter),
        _ => (worst, Bound::WorstCaseRdp, PrivacyKind::WorstCase),
    };
    let ex_post = match ctx.ex_post {
        Some(set) if ctx.predictable => Some(PrivacyPart {
            kind: PrivacyKind::ExPost,
            epsilon: ex_post_epsilon_of(ctx.orders, set, &rdp, delta),
            delta,
        }),
        _ => None,
    };
    ExamplePrivacy {
        id,
        epsilon,
        delta,
        bound,
        guarantee: PrivacyPart {
            kind,
            epsilon,
            delta,
        },
        ex_post,
        estimate: PrivacyPart {
            kind: PrivacyKind::Estimate,
            epsilon: estimate.epsilon,
            delta,
        },
        ledger: if ctx.predictable {
            LedgerKind::Threshold
        } else {
            LedgerKind::Sampled
        },
        rdp_epsilon: estimate.epsilon,
        worst_case_pld_epsilon: None,
        order: estimate.order,
        rdp,
        steps: facts.steps,
        retired: facts.retired,
        over_budget: facts.over_budget,
        threshold: facts.threshold,
    }
}
