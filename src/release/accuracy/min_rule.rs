//! Training-like traces under the min rule: since the served epsilon
//! became `min(per-instance RDP, PLD worst case B)`, every example whose RDP is
//! above `B` sits exactly at `B`, a public atom holding 20-40% of a run, with a
//! dense region just below it (the hard examples that were clipped a little
//! less often, or sampled a little less often).

use super::{TIED_RATE, TIED_STEPS};
use rand::{Rng, SeedableRng};
use rand_distr::{Beta, Binomial, Distribution};

/// Number of example classes of a trace (the labels of the per-group benchmark).
pub const CLASSES: usize = 5;

/// Share of hard examples (gradients mostly clipped) per class: per-class atom
/// shares then differ by a factor of 3 or more, as in real runs where some
/// classes are much harder than others. More hard examples than the atom holds,
/// so that the hard examples not at `B` make a dense region just below it.
pub const HARD_SHARE: [f64; CLASSES] = [0.3, 0.45, 0.55, 0.65, 0.8];

/// Persistent norm ratios of [`Norms::Classes`], by example difficulty.
const PERSISTENT_RATIOS: [f64; 5] = [0.35, 0.6, 0.8, 0.9, 1.0];

/// How an example's clipped-norm ratio behaves over the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Norms {
    /// Varies from step to step: hard examples' root-mean-square ratio
    /// `a ~ U(0.75, 1)`, easy ones' `a ~ Beta(2, 3)`; values continuous.
    Varying,
    /// Persistent: an example's norm stays the same all run, so hard examples
    /// are clipped at every step (`a = 1`) and their epsilons depend only on
    /// how often they were sampled (runs of equal values, the ones below the
    /// atom a dense tied region just below `B`); easy ones keep their own
    /// ratio `a ~ Beta(2, 3)`.
    Persistent,
    /// Persistent, in five classes of ratio (hard 1.0, 0.9, 0.8; easy 0.6,
    /// 0.35): every value tied, in runs of a few hundred spread over the
    /// whole range (the grid's worst case: see docs/releases-quantiles.md).
    Classes,
}

/// A trace: served epsilons in units of `bound`, and each example's class.
#[derive(Debug, Clone)]
pub struct MinRuleTrace {
    /// `min(r_i, B)` for every example, in `[0, bound]`.
    pub values: Vec<f64>,
    /// Each example's class, in `0..CLASSES`.
    pub classes: Vec<usize>,
}

/// `n` per-example epsilons of a training-like run under the min rule, with
/// `share_at_bound` of them (at least) exactly at `bound`.
///
/// An example of class `c` is hard with probability `HARD_SHARE[c]`. It is
/// sampled `k ~ Binomial(TIED_STEPS, TIED_RATE)` times; its per-instance RDP
/// epsilon is `r = sqrt(k / E[k]) · a`, with `a` its root-mean-square clipped
/// norm ratio as [`Norms`] says. `B` is then the
/// `1 − share_at_bound` quantile of `r` (the PLD worst case sits below the RDP
/// epsilon of the always-clipped examples), and every value is `min(r, B)`
/// rescaled to `bound`.
pub fn min_rule_trace(
    seed: u64,
    n: usize,
    bound: f64,
    share_at_bound: f64,
    norms: Norms,
) -> MinRuleTrace {
    let mut rng = rand_pcg::Pcg64::seed_from_u64(seed);
    let binomial = Binomial::new(TIED_STEPS, TIED_RATE).expect("valid parameters");
    let easy = Beta::new(2.0, 3.0).expect("valid shape");
    let mean_k = TIED_STEPS as f64 * TIED_RATE;
    let mut classes = Vec::with_capacity(n);
    let rdp: Vec<f64> = (0..n)
        .map(|_| {
            let class = rng.random_range(0..CLASSES);
            classes.push(class);
            let hard = rng.random::<f64>() < HARD_SHARE[class];
            let a = match (norms, hard) {
                (Norms::Varying, true) => rng.random_range(0.75..1.0),
                (Norms::Persistent, true) => 1.0,
                (Norms::Classes, true) => PERSISTENT_RATIOS[rng.random_range(2..5)],
                (Norms::Classes, false) => PERSISTENT_RATIOS[usize::from(rng.random::<bool>())],
                (_, false) => easy.sample(&mut rng),
            };
            (binomial.sample(&mut rng) as f64 / mean_k).sqrt() * a
        })
        .collect();
    let mut sorted = rdp.clone();
    sorted.sort_by(f64::total_cmp);
    let at_bound = ((share_at_bound * n as f64).round() as usize).clamp(1, n);
    let worst = sorted[n - at_bound];
    let values = rdp
        .iter()
        .map(|&r| if r >= worst { bound } else { bound * r / worst })
        .collect();
    MinRuleTrace { values, classes }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traces_have_the_atom_and_a_dense_region_below_it() {
        for norms in [Norms::Varying, Norms::Persistent, Norms::Classes] {
            for share in [0.2, 0.3, 0.4] {
                let t = min_rule_trace(7, 50_000, 1.0, share, norms);
                let at = t.values.iter().filter(|&&x| x == 1.0).count() as f64 / 5e4;
                // Ties at the cut can only add to the atom.
                assert!(at >= share && at <= share + 0.03, "{norms:?} {share}: {at}");
                let below = t
                    .values
                    .iter()
                    .filter(|&&x| (0.9..1.0).contains(&x))
                    .count();
                // Dense: the 10% of the range below B holds more than twice
                // its share of the values below B.
                let interior = 50_000.0 * (1.0 - at);
                assert!(
                    below as f64 > 0.2 * interior,
                    "{norms:?} {share}: {below} in [0.9 B, B)"
                );
                assert!(t.classes.iter().all(|&c| c < CLASSES));
            }
        }
        for (norms, most) in [(Norms::Persistent, 40_000), (Norms::Classes, 1_000)] {
            let mut xs = min_rule_trace(7, 50_000, 1.0, 0.3, norms).values;
            xs.sort_by(f64::total_cmp);
            xs.dedup();
            assert!(xs.len() < most, "{norms:?}: {} distinct values", xs.len());
        }
    }
}
