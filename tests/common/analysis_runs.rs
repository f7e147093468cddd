//! Runs for Thudi et al.'s data-dependent analysis (one generator, so the
//! single-node and the cluster tests analyse the same kind of training), and
//! the comparison of two analyses' answers.

use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

/// One run's requests in order, as (path under the dataset, body): a refresh
/// of every example (but `skip_in_refresh`) every `checkpoint_every` steps,
/// Poisson batches at rate `q`; some examples always clipped at `C` = 1, the
/// others' norms shrinking over training.
pub fn run_requests(
    seed: u64,
    n: u64,
    q: f64,
    steps: u64,
    checkpoint_every: u64,
    skip_in_refresh: Option<u64>,
) -> Vec<(&'static str, Value)> {
    let mut rng = rand_pcg::Pcg64::seed_from_u64(seed);
    let scale: Vec<f64> = (0..n)
        .map(|i| {
            if i % 4 == 0 {
                3.0
            } else {
                0.2 + 0.1 * i as f64
            }
        })
        .collect();
    let mut out = Vec::new();
    for t in 0..steps {
        if t % checkpoint_every == 0 {
            let ids: Vec<u64> = (0..n).filter(|&i| Some(i) != skip_in_refresh).collect();
            let norms: Vec<f64> = ids
                .iter()
                .map(|&i| {
                    scale[i as usize] * (0.6 + 0.8 * rng.random::<f64>()) / (1.0 + t as f64 / 4.0)
                })
                .collect();
            out.push(("refresh", json!({"ids": ids, "norms": norms})));
        }
        let ids: Vec<u64> = (0..n).filter(|_| rng.random::<f64>() < q).collect();
        let norms: Vec<f64> = ids
            .iter()
            .map(|&i| scale[i as usize] * rng.random::<f64>())
            .collect();
        out.push(("steps", json!({"step": t, "ids": ids, "norms": norms})));
    }
    out
}

/// Every number of two answers agrees to `tol` (relative), everything else
/// exactly. Objects have the same keys unless `only_first_keys` names keys to
/// skip: then only `a`'s other keys are compared (an offline answer lacks
/// what only the server says, such as `datasets`).
pub fn assert_same_numbers(
    a: &Value,
    b: &Value,
    tol: f64,
    only_first_keys: Option<&[&str]>,
    at: &str,
) {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
            assert!(x == y || super::rel(x, y) <= tol, "{at}: {x} vs {y}");
        }
        (Value::Array(x), Value::Array(y)) => {
            assert_eq!(x.len(), y.len(), "{at}");
            for (i, (u, v)) in x.iter().zip(y).enumerate() {
                assert_same_numbers(u, v, tol, only_first_keys, &format!("{at}[{i}]"));
            }
        }
        (Value::Object(x), Value::Object(y)) => {
            if only_first_keys.is_none() {
                assert_eq!(x.len(), y.len(), "{at}: {x:?} vs {y:?}");
            }
            for (k, u) in x {
                if only_first_keys.is_some_and(|skip| skip.contains(&k.as_str())) {
                    continue;
                }
                assert_same_numbers(u, &y[k], tol, only_first_keys, &format!("{at}.{k}"));
            }
        }
        _ => assert_eq!(a, b, "{at}"),
    }
}
