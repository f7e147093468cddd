//! JSON has no infinity: serde_json writes a non-finite `f64` as `null`. These
//! read such a `null` back as `+inf`, for the fields of the answers whose
//! value may be unbounded (an epsilon, an order, an RDP), so that reading an
//! answer and writing it again gives the same JSON.

use serde::{Deserialize, Deserializer};

/// `null` (the JSON of an infinite value) reads as `+inf`.
pub fn f64_or_inf<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::INFINITY))
}

/// A list whose `null` entries read as `+inf`.
pub fn vec_f64_or_inf<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<f64>, D::Error> {
    Ok(Vec::<Option<f64>>::deserialize(d)?
        .into_iter()
        .map(|x| x.unwrap_or(f64::INFINITY))
        .collect())
}
