//! The dashboard's files, embedded at build time with `include_bytes!`.

/// One embedded file served under `/dashboard/`.
#[derive(Debug)]
pub struct Asset {
    /// File name under `/dashboard/`.
    pub name: &'static str,
    /// `Content-Type` header value.
    pub content_type: &'static str,
    /// The bytes.
    pub body: &'static [u8],
}

macro_rules! asset {
    ($name:literal, $path:literal, $ct:literal) => {
        Asset {
            name: $name,
            content_type: $ct,
            body: include_bytes!(concat!("assets/", $path)),
        }
    };
}

/// Every file of the dashboard; the first is the page itself.
pub static ASSETS: [Asset; 6] = [
    asset!("index.html", "index.html", "text/html; charset=utf-8"),
    asset!("app.js", "app.js", "text/javascript; charset=utf-8"),
    asset!("app.css", "app.css", "text/css; charset=utf-8"),
    asset!(
        "uPlot.iife.min.js",
        "vendor/uplot/uPlot.iife.min.js",
        "text/javascript; charset=utf-8"
    ),
    asset!(
        "uPlot.min.css",
        "vendor/uplot/uPlot.min.css",
        "text/css; charset=utf-8"
    ),
    asset!(
        "uPlot-LICENSE.txt",
        "vendor/uplot/LICENSE",
        "text/plain; charset=utf-8"
    ),
];
