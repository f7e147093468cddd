//! The randomness of releases: from the operating system, or, for tests
//! only, a seed given by the server's explicit `--insecure-test-release-seed`
//! flag, so that a sharded and an unsharded ledger of one trace can be
//! compared value for value.

use rand::rngs::StdRng;
use rand::SeedableRng;
use std::sync::OnceLock;

/// The seed of the release randomness for tests, set only by the server's
/// explicit flag ([`set_test_release_seed`]); never from the environment,
/// which a deployment may inherit unawares.
static TEST_SEED: OnceLock<u64> = OnceLock::new();

/// Makes every later release's random stream `StdRng(seed + step)`: for tests
/// that compare a sharded and an unsharded ledger value for value. Predictable
/// noise is not private: the server logs a warning at start when it is set.
pub fn set_test_release_seed(seed: u64) {
    let _ = TEST_SEED.set(seed);
}

/// The randomness of a release describing `step`: from the operating system,
/// or seeded by the test seed and the step when one was set.
pub fn release_rng(step: u64) -> StdRng {
    match TEST_SEED.get() {
        Some(seed) => StdRng::seed_from_u64(seed.wrapping_add(step)),
        None => StdRng::from_os_rng(),
    }
}
