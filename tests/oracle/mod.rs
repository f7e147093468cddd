//! Reading the committed oracle fixtures (`tests/fixtures/*.json`, written by
//! `scripts/gen-fixtures`): shared by the oracle tests.
#![allow(dead_code)]

use serde_json::Value;

/// The fixture `name`, parsed; a missing or malformed file names itself.
pub fn fixture(name: &str) -> Value {
    let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The number `key` of `v`; its absence is a broken fixture.
pub fn f(v: &Value, key: &str) -> f64 {
    v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("missing number {key} in {v}"))
}

/// The numbers of array `v`; a non-number is a broken fixture.
pub fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_f64().expect("number"))
        .collect()
}
