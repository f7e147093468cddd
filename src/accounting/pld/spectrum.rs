//! FFT composition of discrete PLDs on one common grid and domain size.
//!
//! A [`Spectrum`] stores the real FFT of a PLD folded modulo the domain size `n`
//! in polar form `(ln |X|, arg X)`. Composing `c_i` copies of each PLD is then a
//! weighted SUM of those logs per frequency (integer powers: `e^{i c arg X}` is
//! exact for any branch of `arg`), one `exp`/`sincos` per frequency and ONE
//! inverse FFT. Folding index `k` to `k mod n` makes the result exactly the
//! circular (aliased) linear convolution; see `planner` for why that is safe.
//!
//! **Only the frequencies a composition can see.** Every modulus is at most 1
//! (a sub-probability's transform), so a composition's `ln |Y_k|` is at most
//! `sum_i c_i ln |X_{i,k}|`, and where that is below [`UNDERFLOW_LOG_MODULUS`]
//! `exp` gives exactly 0: such frequencies are set to 0 without `exp` and
//! `sincos` (what `from_polar` would give). Composed spectra decay fast (each
//! level's modulus is raised to its count), so a spectrum may keep only its
//! first frequencies ([`Transform::spectrum`]) and a bound on the moduli of the
//! rest: a composition that finds every frequency beyond some spectrum's kept
//! ones below the underflow, by those bounds, is the same as with whole
//! spectra ([`live_bins`]); one that does not needs more kept.

use super::planner::Window;
use super::pmf::DiscretePld;
use realfft::num_complex::Complex;

/// Below this composed `ln |X|`, `exp` underflows to exactly 0 (the smallest
/// subnormal is `e^-744.4`).
pub const UNDERFLOW_LOG_MODULUS: f64 = -746.0;

/// One PLD's spectrum on a domain of size `n`, its first frequencies kept.
#[derive(Debug, Clone)]
pub struct Spectrum {
    /// Natural log of each kept frequency's modulus (`-inf` where it is 0).
    pub log_modulus: Vec<f64>,
    /// Each kept frequency's argument.
    pub phase: Vec<f64>,
    /// `ln(1 - mass at infinity)`: the finite mass composes multiplicatively.
    pub ln_finite: f64,
    /// Domain size (FFT length).
    pub size: usize,
    /// At least `ln |X_k|` of every frequency not kept (`-inf` if all are).
    pub tail_log_modulus: f64,
}

/// A PLD's transform with every frequency's `ln |X|` and no phases yet.
#[derive(Debug, Clone)]
pub struct Transform {
    out: Vec<Complex<f64>>,
    /// `ln |X_k|` of every frequency `k = 0 ..= n / 2`.
    pub log_modulus: Vec<f64>,
    ln_finite: f64,
    size: usize,
}

impl Transform {
    /// Fold `pld` modulo `n` and transform it.
    pub fn of(pld: &DiscretePld, n: usize) -> Self {
        let mut buf = vec![0.0f64; n];
        for (j, &p) in pld.probs.iter().enumerate() {
            let idx = (pld.first + j as i64).rem_euclid(n as i64) as usize;
            buf[idx] += p;
        }
        let fft = super::fft::forward(n);
        let mut out = fft.make_output_vec();
        fft.process(&mut buf, &mut out)
            .expect("buffer sizes come from the plan");
        Transform {
            log_modulus: out.iter().map(|z| log_modulus(*z)).collect(),
            out,
            ln_finite: (-pld.infinity_mass).ln_1p(),
            size: n,
        }
    }

    /// The spectrum keeping the first `keep` frequencies (all if more), with
    /// the largest `ln |X|` of the others as its tail bound.
    pub fn spectrum(mut self, keep: usize) -> Spectrum {
        let keep = keep.min(self.out.len());
        let tail = self.log_modulus[keep..]
            .iter()
            .copied()
            .fold(f64::NEG_INFINITY, f64::max);
        self.log_modulus.truncate(keep);
        self.log_modulus.shrink_to_fit();
        Spectrum {
            phase: self.out[..keep].iter().map(|z| z.arg()).collect(),
            log_modulus: self.log_modulus,
            ln_finite: self.ln_finite,
            size: self.size,
            tail_log_modulus: tail,
        }
    }
}

impl Spectrum {
    /// Fold `pld` modulo `n` and transform it, every frequency kept.
    pub fn of(pld: &DiscretePld, n: usize) -> Self {
        Transform::of(pld, n).spectrum(usize::MAX)
    }

    /// Domain size this spectrum was built for.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The `ln |X|` view a domain of size `n` (dividing `self.size`) sees.
    pub fn view(&self, n: usize) -> LogView<'_> {
        let stride = self.size / n;
        assert!(
            stride >= 1 && self.size == stride * n,
            "a spectrum of size {} cannot serve size {n}",
            self.size
        );
        LogView {
            log_modulus: &self.log_modulus,
            stride,
            tail: self.tail_log_modulus,
        }
    }

    /// How many frequencies of a domain of size `n` this one keeps.
    pub fn kept_for(&self, n: usize) -> usize {
        let stride = self.size / n;
        self.log_modulus.len().div_ceil(stride)
    }
}

/// A spectrum's `ln |X|` as a domain `stride` times smaller sees it: every
/// `stride`-th kept value, then at most `tail`.
#[derive(Debug, Clone, Copy)]
pub struct LogView<'a> {
    /// Kept `ln |X|` at the spectrum's own size.
    pub log_modulus: &'a [f64],
    /// Ratio of the spectrum's size to the domain's.
    pub stride: usize,
    /// Bound on the frequencies not kept.
    pub tail: f64,
}

impl Transform {
    /// This transform's view (every frequency known).
    pub fn view(&self) -> LogView<'_> {
        LogView {
            log_modulus: &self.log_modulus,
            stride: 1,
            tail: f64::NEG_INFINITY,
        }
    }
}

/// `sum_i c_i ln |X_{i,k}|` for `k = 0 ..= n / 2` (tails by their bounds,
/// hence an upper bound of the composed `ln |Y_k|`, exact where every part
/// keeps `k`), and the number of leading frequencies up to the last that
/// does not underflow: the ones the composition needs.
pub fn live_bins(parts: &[(LogView<'_>, f64)], n: usize) -> (Vec<f64>, usize) {
    let bins = n / 2 + 1;
    let mut acc = vec![0.0f64; bins];
    for (v, c) in parts {
        let kept = v.log_modulus.len().div_ceil(v.stride).min(bins);
        add_scaled(&mut acc[..kept], v.log_modulus, *c, v.stride);
        if kept < bins {
            let t = c * v.tail;
            acc[kept..].iter_mut().for_each(|a| *a += t);
        }
    }
    let live = acc
        .iter()
        .rposition(|&m| m >= UNDERFLOW_LOG_MODULUS)
        .map_or(0, |k| k + 1);
    (acc, live)
}

/// `ln |z|`, from `|z|^2` where that does not underflow (one `ln`, no `hypot`).
fn log_modulus(z: Complex<f64>) -> f64 {
    let n2 = z.norm_sqr();
    if n2 > 1e-300 {
        0.5 * n2.ln()
    } else {
        z.norm().ln()
    }
}

/// `acc[k] += c * v[k * stride]` for every `k` of `acc`.
fn add_scaled(acc: &mut [f64], v: &[f64], c: f64, stride: usize) {
    if stride == 1 {
        for (a, x) in acc.iter_mut().zip(v) {
            *a += c * x;
        }
    } else {
        for (k, a) in acc.iter_mut().enumerate() {
            *a += c * v[k * stride];
        }
    }
}

/// Compose `count` copies of each spectrum into a PLD on `window`; the window's
/// `mass_above` bound joins the mass at infinity. A spectrum of a size `s`
/// times the window's serves it by every `s`-th frequency (see
/// [`super::spectra`]). Panics when a spectrum keeps fewer frequencies than
/// the composition needs ([`live_bins`]; callers keep enough).
pub fn compose(parts: &[(&Spectrum, u64)], window: &Window, step: f64) -> DiscretePld {
    let n = window.size;
    let bins = n / 2 + 1;
    let parts: Vec<(&Spectrum, f64)> = parts
        .iter()
        .filter(|(_, c)| *c > 0)
        .map(|(s, c)| (*s, *c as f64))
        .collect();
    let views: Vec<(LogView<'_>, f64)> = parts.iter().map(|(s, c)| (s.view(n), *c)).collect();
    let (log_mod, live) = live_bins(&views, n);
    let mut phase = vec![0.0f64; live];
    let mut ln_finite = 0.0;
    for (s, c) in &parts {
        assert!(
            s.kept_for(n) >= live,
            "a spectrum keeps {} frequencies of the {live} needed",
            s.kept_for(n)
        );
        add_scaled(&mut phase, &s.phase, *c, s.size / n);
        ln_finite += c * s.ln_finite;
    }
    let mut spec: Vec<Complex<f64>> = (0..bins)
        .map(|k| {
            if k >= live || log_mod[k] < UNDERFLOW_LOG_MODULUS {
                Complex::new(0.0, 0.0)
            } else {
                Complex::from_polar(log_mod[k].exp(), phase[k])
            }
        })
        .collect();
    spec[0].im = 0.0;
    spec[bins - 1].im = 0.0;
    let ifft = super::fft::inverse(n);
    let mut out = ifft.make_output_vec();
    ifft.process(&mut spec, &mut out)
        .expect("buffer sizes come from the plan");
    let scale = 1.0 / n as f64;
    let start = window.lo.rem_euclid(n as i64) as usize;
    let probs: Vec<f64> = (0..n)
        .map(|j| (out[(start + j) % n] * scale).max(0.0))
        .collect();
    let infinity = -ln_finite.exp_m1();
    DiscretePld {
        step,
        first: window.lo,
        probs,
        infinity_mass: (infinity + window.mass_above).min(1.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_frequencies_give_the_whole_spectra_answer_or_ask_for_more() {
        // A smooth PLD (deviation 10 grid points, cut at 8), composed 50 times.
        let probs: Vec<f64> = (0..161)
            .map(|j| (-((j as f64 - 80.0) / 10.0).powi(2) / 2.0).exp())
            .collect();
        let total: f64 = probs.iter().sum();
        let pld = DiscretePld {
            step: 0.01,
            first: -80,
            probs: probs.iter().map(|p| p / total * 0.999).collect(),
            infinity_mass: 0.001,
        };
        let n = 4096;
        let t = Transform::of(&pld, n);
        let (_, live) = live_bins(&[(t.view(), 50.0)], n);
        assert!(live > 0 && live < n / 8, "composed spectra decay: {live}");
        let window = Window {
            lo: -2048,
            size: n,
            mass_above: 0.0,
        };
        let whole = compose(&[(&Spectrum::of(&pld, n), 50)], &window, 0.01);
        let kept = t.clone().spectrum(live);
        assert_eq!(kept.kept_for(n), live);
        assert!(kept.tail_log_modulus < 0.0 && kept.tail_log_modulus.is_finite());
        assert_eq!(compose(&[(&kept, 50)], &window, 0.01), whole);
        // One copy does not underflow where 50 do: by the kept spectrum's tail
        // bound the composition needs more than it keeps.
        let (_, live1) = live_bins(&[(kept.view(n), 1.0)], n);
        assert!(live1 > kept.kept_for(n), "{live1}");
        let short = std::panic::catch_unwind(|| compose(&[(&kept, 1)], &window, 0.01));
        assert!(short.is_err(), "too few kept frequencies are refused");
    }

    #[test]
    fn spectral_power_equals_repeated_convolution() {
        let pld = DiscretePld {
            step: 0.1,
            first: -2,
            probs: vec![0.2, 0.1, 0.3, 0.0, 0.35],
            infinity_mass: 0.05,
        };
        // direct 3-fold convolution
        let mut direct = vec![1.0];
        for _ in 0..3 {
            let mut next = vec![0.0; direct.len() + pld.probs.len() - 1];
            for (i, a) in direct.iter().enumerate() {
                for (j, b) in pld.probs.iter().enumerate() {
                    next[i + j] += a * b;
                }
            }
            direct = next;
        }
        let window = Window {
            lo: -6,
            size: 16,
            mass_above: 0.0,
        };
        let s = Spectrum::of(&pld, 16);
        let got = compose(&[(&s, 3)], &window, 0.1);
        for (j, d) in direct.iter().enumerate() {
            assert!((got.probs[j] - d).abs() < 1e-14, "{j}");
        }
        assert!((got.infinity_mass - (1.0 - 0.95f64.powi(3))).abs() < 1e-14);
        // A spectrum 4 times larger serves the same window by every 4th bin.
        let big = Spectrum::of(&pld, 64);
        let strided = compose(&[(&big, 3)], &window, 0.1);
        for (a, b) in strided.probs.iter().zip(&got.probs) {
            assert!((a - b).abs() < 1e-15, "{a} vs {b}");
        }
    }
}
