//! The operator console: HTML, script and styles compiled into the binary (nothing fetched).

use axum::http::header;
use axum::response::{IntoResponse, Response};

use crate::error::{ApiError, ApiResult};
use crate::path::Path;

/// Every console file: name, content type, content.
const ASSETS: &[(&str, &str, &str)] = &[
    ("app.js", JS, include_str!("../../ui/app.js")),
    ("access.js", JS, include_str!("../../ui/access.js")),
    ("queues.js", JS, include_str!("../../ui/queues.js")),
    (
        "queue_settings.js",
        JS,
        include_str!("../../ui/queue_settings.js"),
    ),
    ("tasks.js", JS, include_str!("../../ui/tasks.js")),
    ("limits.js", JS, include_str!("../../ui/limits.js")),
    (
        "live_output.js",
        JS,
        include_str!("../../ui/live_output.js"),
    ),
    ("attempts.js", JS, include_str!("../../ui/attempts.js")),
    ("balance.js", JS, include_str!("../../ui/balance.js")),
    // uPlot 1.6.32 (MIT), vendored: https://github.com/leeoniya/uPlot/tree/1.6.32/dist
    (
        "uPlot.iife.min.js",
        JS,
        include_str!("../../ui/uPlot.iife.min.js"),
    ),
    ("charts.js", JS, include_str!("../../ui/charts.js")),
    (
        "workflow_svg.js",
        JS,
        include_str!("../../ui/workflow_svg.js"),
    ),
    ("workflows.js", JS, include_str!("../../ui/workflows.js")),
    ("failures.js", JS, include_str!("../../ui/failures.js")),
    (
        "app.css",
        "text/css; charset=utf-8",
        include_str!("../../ui/app.css"),
    ),
    (
        "charts.css",
        "text/css; charset=utf-8",
        include_str!("../../ui/charts.css"),
    ),
    (
        "workflows.css",
        "text/css; charset=utf-8",
        include_str!("../../ui/workflows.css"),
    ),
    (
        "uPlot.min.css",
        "text/css; charset=utf-8",
        include_str!("../../ui/uPlot.min.css"),
    ),
    (
        "uPlot.LICENSE",
        "text/plain; charset=utf-8",
        include_str!("../../ui/uPlot.LICENSE"),
    ),
];

const JS: &str = "application/javascript; charset=utf-8";

const INDEX: &str = include_str!("../../ui/index.html");

pub async fn index() -> Response {
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], INDEX).into_response()
}

pub async fn asset(Path(file): Path<String>) -> ApiResult<Response> {
    let (_, kind, body) = ASSETS
        .iter()
        .find(|(name, _, _)| *name == file)
        .ok_or_else(|| ApiError::not_found(format!("no console file {file}")))?;
    Ok((
        [
            (header::CONTENT_TYPE, *kind),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        *body,
    )
        .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Server data (stored names, params, output) reaches the DOM as text only: the scripts
    /// use no sink that parses HTML or runs text as code.
    #[test]
    fn the_console_scripts_never_parse_html_or_eval() {
        const SINKS: &[&str] = &[
            "innerHTML",
            "outerHTML",
            "insertAdjacentHTML",
            "document.write",
            "createContextualFragment",
            "DOMParser",
            "srcdoc",
            "eval(",
            "new Function",
            "javascript:",
        ];
        for (name, _, body) in ASSETS.iter().filter(|(n, _, _)| n.ends_with(".js")) {
            for sink in SINKS {
                assert!(!body.contains(sink), "{name} uses {sink}");
            }
        }
    }

    /// A file added to dci/ui/ but not to ASSETS would 404 and break the console silently.
    #[test]
    fn every_console_file_is_served() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/ui");
        let mut missing = Vec::new();
        for entry in std::fs::read_dir(dir).expect("dci/ui exists") {
            let name = entry
                .expect("entry")
                .file_name()
                .to_string_lossy()
                .into_owned();
            if name != "index.html" && !ASSETS.iter().any(|(n, _, _)| *n == name) {
                missing.push(name);
            }
        }
        assert!(missing.is_empty(), "not in ASSETS: {missing:?}");
        for (name, _, _) in ASSETS {
            assert!(
                INDEX.contains(&format!("ui/{name}")),
                "index.html does not load {name}"
            );
        }
    }
}
