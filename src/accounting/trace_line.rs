//! One line of a JSON-lines trace, parsed with errors a person can act on.
//! JSON has no NaN or infinity and serde_json refuses a number that
//! overflows `f64` (`1e999`) while tokenising, so without help the reader of a
//! trace sees "number out of range" or "expected value". On failure the line is
//! parsed again (the fast path pays nothing) to find the field, and a non-finite
//! number is named as the HTTP API names it: `invalid norms: norms[2] = 1e999 is
//! not a finite number: ...`.

use serde::de::DeserializeOwned;

/// Parse one trace line; the error says what was wrong, where, and (for a
/// non-finite number) which field must be finite.
pub fn parse<T: DeserializeOwned>(text: &str) -> Result<T, String> {
    serde_json::from_str(text).map_err(|e| explain::<T>(text, &e))
}

/// The message for a line that `serde_json` refused with `error`.
fn explain<T: DeserializeOwned>(text: &str, error: &serde_json::Error) -> String {
    let mut de = serde_json::Deserializer::from_str(text);
    let path = match serde_path_to_error::deserialize::<_, T>(&mut de) {
        Err(e) => e.path().to_string(),
        Ok(_) => ".".to_string(),
    };
    if error.is_syntax() {
        if let Some(token) = non_finite_token(text, error.column()) {
            let field = last_field(&path);
            let rule = if field == "norms" {
                "every norm must be a finite number >= 0".to_string()
            } else {
                format!("{field} must be a finite number")
            };
            return format!(
                "invalid {field}: {path} = {token} is not a finite number: {rule} (JSON has no NaN or infinity, and numbers beyond 1.8e308 overflow)"
            );
        }
    }
    let message = error.to_string();
    let message = message
        .rsplit_once(" at line ")
        .map_or(message.as_str(), |(m, _)| m);
    if path == "." {
        format!("{message} (column {})", error.column())
    } else {
        format!("{message} at {path} (column {})", error.column())
    }
}

/// The last named field of a serde path (`refresh.norms[2]` -> `norms`).
fn last_field(path: &str) -> &str {
    let name = path.rsplit('.').next().unwrap_or(path);
    let name = name.split('[').next().unwrap_or(name);
    if name.is_empty() {
        "value"
    } else {
        name
    }
}

/// The number-like token at 1-based `column` if it is NaN, an infinity or a
/// number that overflows `f64`.
fn non_finite_token(text: &str, column: usize) -> Option<String> {
    let bytes = text.as_bytes();
    let part = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.');
    // The column is the last byte read: on the token, or just after it.
    let at = [column.saturating_sub(1), column.saturating_sub(2)]
        .into_iter()
        .find(|&i| i < bytes.len() && part(bytes[i]))?;
    let start = (0..=at).rev().take_while(|&i| part(bytes[i])).last()?;
    let end = (at..bytes.len()).take_while(|&i| part(bytes[i])).last()? + 1;
    let token = &text[start..end];
    let bare = token.trim_start_matches(['+', '-']).to_ascii_lowercase();
    let non_finite = matches!(bare.as_str(), "nan" | "inf" | "infinity")
        || token.parse::<f64>().is_ok_and(|x| !x.is_finite());
    non_finite.then(|| token.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct Line {
        step: Option<u64>,
        norms: Option<Vec<f64>>,
        refresh: Option<Refresh>,
    }

    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct Refresh {
        norms: Vec<f64>,
    }

    #[test]
    fn non_finite_norms_name_the_field_and_the_rule() {
        for (text, path, token) in [
            (r#"{"step": 0, "norms": [0.5, 1e999]}"#, "norms[1]", "1e999"),
            (r#"{"step": 0, "norms": [NaN]}"#, "norms[0]", "NaN"),
            (
                r#"{"step": 0, "norms": [0.1, -Infinity, 2]}"#,
                "norms[1]",
                "-Infinity",
            ),
            (
                r#"{"refresh": {"norms": [-1e400]}}"#,
                "refresh.norms[0]",
                "-1e400",
            ),
        ] {
            let err = parse::<Line>(text).unwrap_err();
            assert!(
                err.starts_with(&format!(
                    "invalid norms: {path} = {token} is not a finite number"
                )),
                "{text}: {err}"
            );
            assert!(
                err.contains("every norm must be a finite number >= 0"),
                "{err}"
            );
        }
    }

    #[test]
    fn other_errors_keep_serde_s_message_with_the_place() {
        let err = parse::<Line>(r#"{"step": "x"}"#).unwrap_err();
        assert!(
            err.contains("invalid type") && err.contains("at step"),
            "{err}"
        );
        let err = parse::<Line>("not json").unwrap_err();
        assert!(err.contains("expected") && err.contains("column"), "{err}");
        assert!(parse::<Line>(r#"{"step": 1, "norms": [1e300]}"#).is_ok());
    }
}
