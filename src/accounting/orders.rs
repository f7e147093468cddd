//! Rényi orders.

/// dp-accounting's default list: 1.1, 1.2, ..., 10.9, then 11..=63, 128, 256, 512, 1024.
/// Using the same list makes our worst-case epsilon directly comparable to theirs.
pub fn default_orders() -> Vec<f64> {
    let mut orders: Vec<f64> = (1..100).map(|x| 1.0 + x as f64 / 10.0).collect();
    orders.extend((11..64).map(|x| x as f64));
    orders.extend([128.0, 256.0, 512.0, 1024.0]);
    orders
}

/// A compact list (64 orders) for per-example ledgers, where every order costs
/// 8 bytes per example: dense where optimal orders of DP-SGD runs fall
/// (1.25..=16), then sparser up to 1024.
pub fn ledger_orders() -> Vec<f64> {
    let mut orders: Vec<f64> = vec![1.25, 1.5, 1.75];
    orders.extend((0..26).map(|x| 2.0 + x as f64 * 0.5)); // 2.0 ..= 14.5
    orders.extend((15..=32).map(|x| x as f64)); // 15 ..= 32
    orders.extend([36.0, 40.0, 44.0, 48.0, 56.0, 64.0, 80.0, 96.0, 128.0, 192.0]);
    orders.extend([256.0, 320.0, 384.0, 448.0, 512.0, 768.0, 1024.0]);
    orders
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_list_matches_dp_accounting() {
        let o = default_orders();
        assert_eq!(o.len(), 99 + 53 + 4);
        assert!((o[0] - 1.1).abs() < 1e-15 && (o[98] - 10.9).abs() < 1e-12);
        assert_eq!(o[99], 11.0);
        assert_eq!(*o.last().unwrap(), 1024.0);
    }

    #[test]
    fn ledger_list_is_sorted_unique_and_64_long() {
        let o = ledger_orders();
        assert_eq!(o.len(), 64);
        assert!(o.windows(2).all(|w| w[0] < w[1]));
    }
}
