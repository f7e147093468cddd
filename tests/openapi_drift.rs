//! The committed OpenAPI document must equal what the code generates (issue 5).

#[test]
fn committed_openapi_matches_the_code() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/openapi/openapi.json");
    let committed = std::fs::read_to_string(path).expect("openapi/openapi.json is committed");
    let generated = dpledger::api::routes::openapi_document();
    assert!(
        committed == generated,
        "openapi/openapi.json is out of date: run `cargo run -- openapi --output openapi/openapi.json`"
    );
}
