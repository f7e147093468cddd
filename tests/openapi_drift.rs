//! The committed OpenAPI document must equal what the code generates.

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

/// Every `in: path` parameter names a `{placeholder}` of its path (query parameters
/// once came out as path parameters, which no client can send).
#[test]
fn path_parameters_are_in_the_path_template() {
    let doc: serde_json::Value =
        serde_json::from_str(&dpledger::api::routes::openapi_document()).unwrap();
    let mut checked = 0;
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            for p in op["parameters"].as_array().into_iter().flatten() {
                let name = p["name"].as_str().unwrap();
                if p["in"] == "path" {
                    assert!(
                        path.contains(&format!("{{{name}}}")),
                        "{method} {path}: path parameter {name} is not in the template"
                    );
                }
                checked += 1;
            }
        }
    }
    assert!(checked > 10);
}
