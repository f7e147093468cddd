//! FFT composition of discrete PLDs on one common grid and domain size.
//!
//! A [`Spectrum`] stores the real FFT of a PLD folded modulo the domain size `n`
//! in polar form `(ln |X|, arg X)`. Composing `c_i` copies of each PLD is then a
//! weighted SUM of those logs per frequency (integer powers: `e^{i c arg X}` is
//! exact for any branch of `arg`), one `exp`/`sincos` per frequency and ONE
//! inverse FFT. Folding index `k` to `k mod n` makes the result exactly the
//! circular (aliased) linear convolution; see `planner` for why that is safe.

use super::planner::Window;
use super::pmf::DiscretePld;
use realfft::num_complex::Complex;

/// One PLD's spectrum on a domain of size `n`.
#[derive(Debug, Clone)]
pub struct Spectrum {
    /// Natural log of each frequency's modulus (`-inf` where it is 0).
    pub log_modulus: Vec<f64>,
    /// Each frequency's argument.
    pub phase: Vec<f64>,
    /// `ln(1 - mass at infinity)`: the finite mass composes multiplicatively.
    pub ln_finite: f64,
}

impl Spectrum {
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
        Spectrum {
            log_modulus: out.iter().map(|z| log_modulus(*z)).collect(),
            phase: out.iter().map(|z| z.arg()).collect(),
            ln_finite: (-pld.infinity_mass).ln_1p(),
        }
    }

    /// Domain size this spectrum was built for.
    pub fn size(&self) -> usize {
        (self.log_modulus.len() - 1) * 2
    }
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

/// Below this composed `ln |X|`, `exp` underflows to exactly 0 (the smallest
/// subnormal is `e^-744.4`): such frequencies are set to 0 without `exp` and
/// `sincos`, which is what `from_polar` would give (bit for bit, up to the sign
/// of a zero). Composed spectra decay fast (each level's modulus is at most 1
/// and is raised to its count), so most frequencies of a long history are.
const UNDERFLOW_LOG_MODULUS: f64 = -746.0;

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
/// [`super::spectra`]).
pub fn compose(parts: &[(&Spectrum, u64)], window: &Window, step: f64) -> DiscretePld {
    let n = window.size;
    let bins = n / 2 + 1;
    let mut log_mod = vec![0.0f64; bins];
    let mut ln_finite = 0.0;
    let parts: Vec<(&Spectrum, f64, usize)> = parts
        .iter()
        .filter(|(_, c)| *c > 0)
        .map(|(s, c)| {
            let stride = s.size() / n;
            assert!(
                stride >= 1 && s.size() == stride * n,
                "a spectrum of size {} cannot serve size {n}",
                s.size()
            );
            (*s, *c as f64, stride)
        })
        .collect();
    for &(s, c, stride) in &parts {
        add_scaled(&mut log_mod, &s.log_modulus, c, stride);
        ln_finite += c * s.ln_finite;
    }
    // Phases only up to the last frequency that does not underflow.
    let live = log_mod
        .iter()
        .rposition(|&m| m >= UNDERFLOW_LOG_MODULUS)
        .map_or(0, |k| k + 1);
    let mut phase = vec![0.0f64; live];
    for &(s, c, stride) in &parts {
        add_scaled(&mut phase, &s.phase, c, stride);
    }
    let mut spec: Vec<Complex<f64>> = log_mod
        .iter()
        .enumerate()
        .map(|(k, &m)| {
            if m < UNDERFLOW_LOG_MODULUS {
                Complex::new(0.0, 0.0)
            } else {
                Complex::from_polar(m.exp(), phase[k])
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
