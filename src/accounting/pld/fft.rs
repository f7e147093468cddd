//! FFT plans shared by every composition: planning a real FFT of size `n`
//! costs about as much as running it once, so plans are made once per size
//! and reused (realfft's planner keeps them; it is shared behind a lock held
//! only while a plan is looked up, never while one runs).

use realfft::{ComplexToReal, RealFftPlanner, RealToComplex};
use std::sync::{Arc, Mutex, OnceLock};

fn planner() -> std::sync::MutexGuard<'static, RealFftPlanner<f64>> {
    static PLANNER: OnceLock<Mutex<RealFftPlanner<f64>>> = OnceLock::new();
    PLANNER
        .get_or_init(|| Mutex::new(RealFftPlanner::new()))
        .lock()
        // The planner only caches plans: a panic elsewhere leaves it usable.
        .unwrap_or_else(|e| e.into_inner())
}

/// The forward real FFT of size `n`.
pub fn forward(n: usize) -> Arc<dyn RealToComplex<f64>> {
    planner().plan_fft_forward(n)
}

/// The inverse real FFT of size `n`.
pub fn inverse(n: usize) -> Arc<dyn ComplexToReal<f64>> {
    planner().plan_fft_inverse(n)
}
