//! Argument checks shared by the CLI, the ledger and the HTTP API, so that every
//! entry point refuses the same inputs with the same message.

use super::error::{InvalidArgument, Result};

/// A Poisson sampling rate must lie in `[0, 1]`.
pub fn sampling_rate(name: &str, q: f64) -> Result<f64> {
    if q.is_finite() && (0.0..=1.0).contains(&q) {
        Ok(q)
    } else {
        Err(InvalidArgument::new(
            name,
            format!("must be in [0, 1], got {q}"),
        ))
    }
}

/// A noise multiplier must be finite and `>= 0` (0 means no noise: infinite loss).
pub fn noise_multiplier(name: &str, sigma: f64) -> Result<f64> {
    if sigma.is_finite() && sigma >= 0.0 {
        Ok(sigma)
    } else {
        Err(InvalidArgument::new(
            name,
            format!("must be a finite number >= 0, got {sigma}"),
        ))
    }
}

/// A noise multiplier that must be strictly positive (ledgers: a noiseless step
/// would make every epsilon infinite, which is never what a trainer means).
pub fn positive_noise_multiplier(name: &str, sigma: f64) -> Result<f64> {
    if sigma.is_finite() && sigma > 0.0 {
        Ok(sigma)
    } else {
        Err(InvalidArgument::new(
            name,
            format!("must be a finite number > 0, got {sigma}"),
        ))
    }
}

/// A delta must lie in the open interval `(0, 1)`.
pub fn delta(name: &str, delta: f64) -> Result<f64> {
    dpledger_api::error::check_delta(name, delta)
}

/// A positive, finite number.
pub fn positive(name: &str, x: f64) -> Result<f64> {
    if x.is_finite() && x > 0.0 {
        Ok(x)
    } else {
        Err(InvalidArgument::new(
            name,
            format!("must be a finite number > 0, got {x}"),
        ))
    }
}

/// A non-negative, finite number.
pub fn non_negative(name: &str, x: f64) -> Result<f64> {
    if x.is_finite() && x >= 0.0 {
        Ok(x)
    } else {
        Err(InvalidArgument::new(
            name,
            format!("must be a finite number >= 0, got {x}"),
        ))
    }
}

/// Largest Rényi order accepted. The cost of an order grows with its value
/// (integer sums have `alpha + 1` terms), so an unbounded order would let one
/// request exhaust memory; optimal orders of real runs are far below this.
pub const MAX_ORDER: f64 = 10_000.0;

/// Most orders in one list (each is a column of every table and ledger).
pub const MAX_ORDER_COUNT: usize = 1024;

/// Rényi orders: each in `(1, MAX_ORDER]` (or `inf`), at most `MAX_ORDER_COUNT`,
/// returned sorted and without duplicates.
pub fn orders(name: &str, orders: &[f64]) -> Result<Vec<f64>> {
    if orders.is_empty() {
        return Err(InvalidArgument::new(name, "must list at least one order"));
    }
    if orders.len() > MAX_ORDER_COUNT {
        return Err(InvalidArgument::new(
            name,
            format!("at most {MAX_ORDER_COUNT} orders, got {}", orders.len()),
        ));
    }
    if let Some(bad) = orders.iter().find(|a| a.is_nan() || **a <= 1.0) {
        return Err(InvalidArgument::new(
            name,
            format!("every order must be > 1, got {bad}"),
        ));
    }
    if let Some(bad) = orders.iter().find(|a| a.is_finite() && **a > MAX_ORDER) {
        return Err(InvalidArgument::new(
            name,
            format!("every order must be at most {MAX_ORDER} (or inf), got {bad}"),
        ));
    }
    let mut sorted = orders.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted.dedup();
    Ok(sorted)
}

/// Parse a comma-separated order list such as `1.5,2,32,256`.
pub fn parse_orders(name: &str, text: &str) -> Result<Vec<f64>> {
    let parsed: std::result::Result<Vec<f64>, _> =
        text.split(',').map(|s| s.trim().parse::<f64>()).collect();
    let parsed = parsed.map_err(|e| {
        InvalidArgument::new(name, format!("expected comma-separated numbers: {e}"))
    })?;
    orders(name, &parsed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_out_of_range_inputs_by_name() {
        assert_eq!(sampling_rate("q", 1.5).unwrap_err().name, "q");
        assert!(sampling_rate("q", f64::NAN).is_err());
        assert!(noise_multiplier("sigma", -1.0).is_err());
        assert!(positive_noise_multiplier("sigma", 0.0).is_err());
        assert!(delta("delta", 0.0).is_err());
        assert!(delta("delta", 1.0).is_err());
        assert!(orders("orders", &[1.0, 2.0]).is_err());
        assert!(orders("orders", &[1e15]).is_err());
        assert!(orders("orders", &vec![2.0; 2000]).is_err());
        assert!(parse_orders("orders", "2,x").is_err());
        assert_eq!(
            parse_orders("orders", "32, 2,2,1.5").unwrap(),
            vec![1.5, 2.0, 32.0]
        );
    }
}
