//! The privacy scalars of a run, under the Python client's tags
//! (`clients/python/src/dpledger/tensorboard.py`): `privacy/worst_case_epsilon`,
//! `privacy/dp_mean_epsilon`, `privacy/dp_quantile/q{100 * level}` and
//! `privacy/retired_share`.

use crate::client::Client;
use crate::error::Result;
use crate::types::PrivacyQuery;

/// Tag prefix of every scalar.
pub const PREFIX: &str = "privacy";

/// `privacy/dp_quantile/q{100 * level}`, the level formatted as Python's `{:g}`
/// (six significant digits, no trailing zeros: `q50`, `q99.9`), so tags match the
/// Python client's exactly.
pub fn quantile_tag(level: f64) -> String {
    format!("{PREFIX}/dp_quantile/q{}", format_g(level * 100.0))
}

/// Python's `format(x, "g")` for finite `x`.
fn format_g(x: f64) -> String {
    if x == 0.0 {
        return "0".into();
    }
    // Round to 6 significant digits first: the exponent is the rounded one's.
    let sci = format!("{x:.5e}");
    let (mantissa, exp) = sci.split_once('e').expect("exponent");
    let exp: i32 = exp.parse().expect("integer exponent");
    let trim = |s: String| -> String {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s
        }
    };
    if (-4..6).contains(&exp) {
        trim(format!("{x:.*}", (5 - exp) as usize))
    } else {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{}e{sign}{:02}", trim(mantissa.to_string()), exp.abs())
    }
}

/// The scalars at the ledger's current step, sorted by tag: the worst-case
/// epsilon (at the dataset's delta), the latest DP release's population mean
/// and quantiles when there is one, and the share of examples retired
/// (`retired` of `examples`, as the trainer's mirror knows them). Reads only
/// what every role of the dataset may read; costs no privacy.
pub async fn privacy_scalars(
    client: &Client,
    dataset: &str,
    retired: u64,
    examples: u64,
) -> Result<Vec<(String, f64)>> {
    let mut out = Vec::new();
    let worst = client.worst_case(dataset, PrivacyQuery::default()).await?;
    out.push((format!("{PREFIX}/worst_case_epsilon"), worst.epsilon));
    let latest = match client.latest_release(dataset).await {
        Ok(release) => Some(release),
        Err(e) if e.status() == Some(404) => None,
        Err(e) => return Err(e),
    };
    if let Some(population) = latest.and_then(|r| r.values.population) {
        if let Some(mean) = population.mean {
            out.push((format!("{PREFIX}/dp_mean_epsilon"), mean.mean));
        }
        for q in population.quantiles.unwrap_or_default() {
            out.push((quantile_tag(q.level), q.value));
        }
    }
    let share = if examples == 0 {
        0.0
    } else {
        retired as f64 / examples as f64
    };
    out.push((format!("{PREFIX}/retired_share"), share));
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantile_tags_match_python_g_format() {
        // Expected strings from Python: f"q{level * 100:g}".
        for (level, want) in [
            (0.5, "q50"),
            (0.1, "q10"),
            (0.9, "q90"), // 90.00000000000001 in binary
            (0.05, "q5"),
            (0.999, "q99.9"),
            (0.25, "q25"),
            (0.123456789, "q12.3457"),
            (0.0000001, "q1e-05"),
            (0.00001, "q0.001"),
        ] {
            assert_eq!(quantile_tag(level), format!("privacy/dp_quantile/{want}"));
        }
    }
}
