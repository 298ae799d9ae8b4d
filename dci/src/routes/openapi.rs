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
            "responses": {
                "200": {"description": "Success", "content": {"application/json": {}}},
                "400": {"description": "Invalid input: {\"error\": …}"},
                "404": {"description": if r.path == "/tasks/{id}/result" {
                    "Unknown task or attempt, or no result: no attempt succeeded, or it wrote no output"
                } else {
                    "Unknown node, queue or task"
                }},
                "503": {"description": "Database unavailable"},
            },
        });
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
                        responses.insert(
                            "403".into(),
                            json!({"description": format!("The token's role is below {role}")}),
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
        "info": {"title": "disbatch-web", "version": disbatch_core::VERSION,
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
