//! `GET /openapi.json`: an OpenAPI 3.0 document generated from the route table.

use axum::response::Response;
use serde_json::{json, Map, Value};

use super::table;
use crate::error::ApiResult;
use crate::namespace::Ns;
use crate::render::json_response;

pub async fn document(Ns(state): Ns) -> ApiResult<Response> {
    Ok(json_response(&openapi(state.legacy_routes()), false))
}

/// Query parameters of `GET` routes: path, name, JSON type, what it does.
const QUERY_PARAMETERS: [(&str, &str, &str, &str); 5] = [
    (
        "/tasks/{id}/result",
        "attempt",
        "string",
        "That attempt's output (24 hex digits), whatever its outcome",
    ),
    (
        "/tasks/{id}/stdout",
        "offset",
        "integer",
        "The first byte to send",
    ),
    (
        "/tasks/{id}/stdout",
        "length",
        "integer",
        "At most this many bytes",
    ),
    (
        "/tasks/{id}/stderr",
        "offset",
        "integer",
        "The first byte to send",
    ),
    (
        "/tasks/{id}/stderr",
        "length",
        "integer",
        "At most this many bytes",
    ),
];

/// Routes whose role depends on the fields sent: the fields that need admin where the
/// route needs less (`x-disbatch-admin-fields`, and the 403's description).
type AdminFields = fn() -> Vec<&'static str>;
const FIELD_ROLES: [(&str, &str, AdminFields); 1] = [("POST", "/queues/{queue}", || {
    let mut fields = vec!["name", "plugin"];
    fields.extend(super::queue_settings::ADMIN);
    fields
})];

/// What a 409 means where a route has conflicts of its own, beside an unreadable document.
const CONFLICTS: [(&str, &str, &str); 9] = [
    (
        "DELETE",
        "/nodes/{node}",
        "The node is live, or still holds tasks: it is not forgotten",
    ),
    (
        "POST",
        "/queues/{queue}/pause",
        "The queue is already paused, or has no threads to pause",
    ),
    ("POST", "/queues/{queue}/resume", "The queue is not paused"),
    (
        "POST",
        "/queues/{queue}",
        "A flow limit asked for while live Perl nodes serve the queue (send \"force\": true)",
    ),
    (
        "POST",
        "/tasks/{id}/cancel",
        "The task's status does not allow it: it has ended",
    ),
    (
        "POST",
        "/tasks/{id}/retry",
        "The task's status does not allow it: it is queued, blocked or running",
    ),
    ("POST", "/tasks/{id}/discard", "The task has not failed"),
    (
        "DELETE",
        "/tasks/{id}",
        "The task is running, or other tasks wait on it (cancel it instead)",
    ),
    (
        "GET",
        "/tasks/{id}/result",
        "The result's GridFS file cannot be read",
    ),
];

/// Every answer an operation can give. Some come from the server before any route (a URI or
/// headers too long, a body too large, the cross-origin guard), so every operation lists them.
fn responses(method: &str, path: &str) -> Value {
    let conflict = CONFLICTS
        .iter()
        .find(|(m, p, _)| *m == method && *p == path)
        .map(|(_, _, why)| {
            format!("{why}; or a stored document it needs cannot be read (the log names it)")
        })
        .unwrap_or_else(|| {
            "A stored document it needs cannot be read (the log names it)".to_string()
        });
    let mut out = json!({
        "200": {"description": "Success", "content": {"application/json": {}}},
        "400": {"description": "Invalid input: {\"error\": …}"},
        "403": {"description": "A request the cross-origin guard refuses (another site's Origin, a Host that is not this server's, Host or Origin given twice)"},
        "404": {"description": if path == "/tasks/{id}/result" {
            "Unknown task or attempt, or no result: no attempt succeeded, or it wrote no output"
        } else {
            "Unknown node, queue, task, graph or batch, or no route for the path"
        }},
        "409": {"description": conflict},
        "413": {"description": "The body is larger than web.max_body_bytes, or what it would store exceeds MongoDB's 16 MiB document limit"},
        "414": {"description": "The URI is too long"},
        "431": {"description": "The request's header fields are too large or too many"},
        "500": {"description": "Internal error: the body says no more; the server log does"},
        "503": {"description": "Database unavailable"},
    });
    if method == "POST" && path == "/tasks/{id}/cancel" {
        out["202"] = json!({"description": "Asked: the task is running, and its runner stops the plugin and records the cancel (-5)"});
    }
    out
}

/// The document for the routes served (legacy ones only when loaded).
pub fn openapi(legacy: bool) -> Value {
    let mut paths = Map::new();
    for r in table().into_iter().filter(|r| legacy || !r.legacy) {
        let mut params: Vec<Value> = r
            .path
            .split('/')
            .filter_map(|seg| seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
            .map(|name| json!({"name": name, "in": "path", "required": true, "schema": {"type": "string"}}))
            .collect();
        params.extend(
            QUERY_PARAMETERS
                .iter()
                .filter(|(path, _, _, _)| *path == r.path && r.method == axum::http::Method::GET)
                .map(|(_, name, kind, description)| {
                    json!({"name": name, "in": "query", "required": false,
                           "schema": {"type": kind}, "description": description})
                }),
        );
        let mut op = json!({
            "summary": r.summary,
            "parameters": params,
            "responses": responses(r.method.as_str(), r.path),
        });
        if let Some((_, _, admin)) = FIELD_ROLES
            .iter()
            .find(|(m, path, _)| *m == r.method.as_str() && *path == r.path)
        {
            op["x-disbatch-admin-fields"] = json!(admin());
        }
        if let Value::Object(o) = &mut op {
            // The role matters only when web.tokens is set; without tokens every route is open.
            match r.role {
                Some(role) => {
                    o.insert("x-disbatch-role".into(), json!(role.as_str()));
                    o.insert("security".into(), json!([{"bearer": []}]));
                    if let Some(Value::Object(responses)) = o.get_mut("responses") {
                        responses.insert(
                            "401".into(),
                            json!({"description": "No valid bearer token (when web.tokens is set)"}),
                        );
                        let admin = FIELD_ROLES
                            .iter()
                            .find(|(m, path, _)| *m == r.method.as_str() && *path == r.path)
                            .map(|(_, _, fields)| {
                                format!(", or below admin for {}", fields().join(", "))
                            })
                            .unwrap_or_default();
                        responses.insert(
                            "403".into(),
                            json!({"description": format!(
                                "The token's role is below {role}{admin}; or a request the cross-origin guard refuses (another site's Origin, a Host that is not this server's, Host or Origin given twice)"
                            )}),
                        );
                    }
                }
                None => {
                    o.insert("x-disbatch-role".into(), json!("public"));
                    o.insert("security".into(), json!([]));
                }
            }
        }
        if r.method != axum::http::Method::GET && r.method != axum::http::Method::DELETE {
            if let Value::Object(o) = &mut op {
                o.insert(
                    "requestBody".into(),
                    json!({"required": false, "content": {
                        "application/json": {"schema": {"type": "object"}},
                        "application/x-www-form-urlencoded": {"schema": {"type": "object"}},
                    }}),
                );
            }
        }
        let method = r.method.as_str().to_ascii_lowercase();
        if let Some((_, _, request, answer)) = super::workflow_schemas::schemas()
            .into_iter()
            .find(|(m, p, _, _)| *m == method && *p == r.path)
        {
            op["responses"]["200"]["content"]["application/json"] = json!({"schema": answer});
            if let Some(request) = request {
                op["requestBody"] = json!({"required": true, "content": {
                    "application/json": {"schema": request}}});
            }
        }
        let entry = paths.entry(r.path.to_string()).or_insert_with(|| json!({}));
        if let Value::Object(m) = entry {
            m.insert(r.method.as_str().to_ascii_lowercase(), op);
        }
    }
    json!({
        "openapi": "3.0.3",
        "info": {"title": "disbatch-web", "version": disbatch_model::VERSION,
                 "description": "The Disbatch 4 REST API with disbatch-rs extensions. See the book's REST API reference, docs/src/reference/api.md."},
        "paths": paths,
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_parameters_name_routes_that_exist() {
        let doc = openapi(false);
        for (path, name, _, _) in QUERY_PARAMETERS {
            let params = &doc["paths"][path]["get"]["parameters"];
            let listed = params
                .as_array()
                .is_some_and(|ps| ps.iter().any(|p| p["name"] == name && p["in"] == "query"));
            assert!(listed, "GET {path} lacks ?{name}: {params}");
        }
    }
}
