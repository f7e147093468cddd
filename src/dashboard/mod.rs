//! The built-in privacy dashboard (`/dashboard`): a static page whose
//! assets are embedded in the binary at build time. The page reads only the JSON
//! API with the bearer token the user pastes, so every role sees exactly what the
//! API grants it; a strict Content-Security-Policy keeps every request on this
//! origin.

mod assets;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

pub use assets::{Asset, ASSETS};

/// The Content-Security-Policy of every dashboard response: scripts, styles,
/// images and API calls from this origin only; no inline script, no frames, no
/// forms posting elsewhere.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
style-src 'self'; img-src 'self' data:; connect-src 'self'; font-src 'self'; \
base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The dashboard's routes: `/dashboard` (the page) and `/dashboard/{asset}`.
/// Generic over the router state so it merges into any app router.
pub fn router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    let mut r = Router::new()
        .route("/dashboard", get(|| async { serve(&ASSETS[0]) }))
        .route("/dashboard/", get(|| async { serve(&ASSETS[0]) }));
    for asset in ASSETS.iter().skip(1) {
        r = r.route(
            &format!("/dashboard/{}", asset.name),
            get(move || async move { serve(asset) }),
        );
    }
    r
}

/// One embedded asset with the dashboard's security headers.
fn serve(asset: &'static Asset) -> Response {
    let headers = [
        (
            header::CONTENT_TYPE,
            HeaderValue::from_static(asset.content_type),
        ),
        (
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(CONTENT_SECURITY_POLICY),
        ),
        (
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        ),
        (
            header::REFERRER_POLICY,
            HeaderValue::from_static("no-referrer"),
        ),
        (header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY")),
        (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
    ];
    (StatusCode::OK, headers, asset.body).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_comes_first_and_names_are_unique() {
        assert_eq!(ASSETS[0].name, "index.html");
        let mut names: Vec<_> = ASSETS.iter().map(|a| a.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), ASSETS.len());
    }

    #[test]
    fn the_page_loads_only_same_origin_assets() {
        let page = std::str::from_utf8(ASSETS[0].body).unwrap();
        for asset in ASSETS.iter().skip(1) {
            if asset.name.ends_with(".js") || asset.name.ends_with(".css") {
                assert!(
                    page.contains(&format!("/dashboard/{}", asset.name)),
                    "{} is not referenced by the page",
                    asset.name
                );
            }
        }
        assert!(!page.contains("http://") && !page.contains("https://"));
        assert!(
            !page.contains("<script>"),
            "inline script would break the CSP"
        );
        assert!(
            !page.contains("style=\""),
            "inline style would break the CSP"
        );
    }

    #[test]
    fn the_policy_allows_no_other_origin() {
        for directive in CONTENT_SECURITY_POLICY.split(';') {
            for source in directive.split_whitespace().skip(1) {
                assert!(
                    ["'self'", "'none'", "data:"].contains(&source),
                    "{directive}"
                );
            }
        }
    }
}
