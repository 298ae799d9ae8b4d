//! The route table: every route once, feeding the router, `GET /info` and `/openapi.json`.

mod balance;
mod info;
mod legacy;
mod monitoring;
mod nodes;
pub mod openapi;
mod queues;
mod specs;
mod summary;
mod task_one;
mod tasks_create;
mod tasks_search;
mod ui;
mod units;

use axum::extract::DefaultBodyLimit;
use axum::http::{Method, Uri};
use axum::routing::{delete, get, post, MethodRouter};
use axum::Router;

use crate::error::ApiError;
use crate::state::AppState;

/// One route: method, axum path, a summary for the OpenAPI document, and whether it is a
/// legacy route (listed only when loaded).
pub struct Route {
    pub method: Method,
    pub path: &'static str,
    pub summary: &'static str,
    pub legacy: bool,
}

const fn route(method: Method, path: &'static str, summary: &'static str) -> Route {
    Route {
        method,
        path,
        summary,
        legacy: false,
    }
}

pub fn table() -> Vec<Route> {
    let mut routes = vec![
        route(Method::GET, "/", "The operator console (HTML)"),
        route(
            Method::GET,
            "/ui/{file}",
            "Console assets built into the server",
        ),
        route(Method::GET, "/info", "Database, web extensions and routes"),
        route(
            Method::GET,
            "/nodes",
            "Nodes with running counts and liveness",
        ),
        route(Method::GET, "/nodes/{node}", "One node by id or name"),
        route(Method::POST, "/nodes/{node}", "Set a node's maxthreads"),
        route(Method::GET, "/plugins", "Plugins allowed by the config"),
        route(
            Method::GET,
            "/queues",
            "Queues with queued, running and completed counts",
        ),
        route(Method::POST, "/queues", "Create a queue"),
        route(
            Method::POST,
            "/specs",
            "Load Coordinate work specs into queues",
        ),
        route(
            Method::GET,
            "/summary",
            "Task counts per queue in Coordinate's unit states",
        ),
        route(
            Method::POST,
            "/queues/{queue}/units",
            "Add work units by key (reject or update existing keys)",
        ),
        route(Method::GET, "/queues/{queue}", "One queue by id or name"),
        route(
            Method::POST,
            "/queues/{queue}",
            "Update a queue's name, plugin, threads or sort",
        ),
        route(
            Method::DELETE,
            "/queues/{queue}",
            "Delete a queue (its tasks are kept)",
        ),
        route(
            Method::POST,
            "/queues/{queue}/retry",
            "Requeue a queue's tasks in the given statuses",
        ),
        route(
            Method::POST,
            "/queues/{queue}/pause",
            "Pause a queue: threads to 0, remembered",
        ),
        route(
            Method::POST,
            "/queues/{queue}/resume",
            "Resume a paused queue with its old threads",
        ),
        route(
            Method::POST,
            "/tasks",
            "Create tasks: one, many, or from another collection",
        ),
        route(
            Method::GET,
            "/tasks",
            "Search or count tasks by indexed fields",
        ),
        route(
            Method::GET,
            "/tasks/{id}",
            "One task (JSON, or HTML for browsers)",
        ),
        route(
            Method::DELETE,
            "/tasks/{id}",
            "Delete a task that is not running, and its output files",
        ),
        route(Method::POST, "/tasks/{id}/cancel", "Cancel a queued task"),
        route(
            Method::POST,
            "/tasks/{id}/retry",
            "Requeue a finished, orphaned or cancelled task",
        ),
        route(
            Method::GET,
            "/tasks/{id}/stdout",
            "A task's stdout as text, inline or from GridFS",
        ),
        route(
            Method::GET,
            "/tasks/{id}/stderr",
            "A task's stderr as text, inline or from GridFS",
        ),
        route(Method::GET, "/balance", "The QueueBalance document"),
        route(Method::POST, "/balance", "Update QueueBalance settings"),
        route(
            Method::GET,
            "/monitoring",
            "Node and QueueBalance health checks",
        ),
        route(
            Method::GET,
            "/openapi.json",
            "This API as an OpenAPI 3.0 document",
        ),
    ];
    for (path, summary) in [
        (
            "/tasks/search",
            "Legacy 4.0 search with an arbitrary filter",
        ),
        (
            "/tasks/{id}",
            "Legacy 4.0: create tasks in a queue from a params array",
        ),
        (
            "/tasks/{id}/{collection}",
            "Legacy 4.0: create tasks from a collection",
        ),
    ] {
        routes.push(Route {
            method: Method::POST,
            path,
            summary,
            legacy: true,
        });
    }
    routes
}

/// The handler of each route in the table.
fn handler(method: &Method, path: &str) -> Option<MethodRouter<AppState>> {
    Some(match (method.as_str(), path) {
        ("GET", "/info") => get(info::info),
        ("GET", "/nodes") => get(nodes::list),
        ("GET", "/nodes/{node}") => get(nodes::get),
        ("POST", "/nodes/{node}") => post(nodes::set_maxthreads),
        ("GET", "/plugins") => get(info::plugins),
        ("GET", "/queues") => get(queues::list),
        ("POST", "/queues") => post(queues::create),
        ("POST", "/specs") => post(specs::load),
        ("GET", "/summary") => get(summary::get),
        ("POST", "/queues/{queue}/units") => post(units::add),
        ("GET", "/queues/{queue}") => get(queues::get),
        ("POST", "/queues/{queue}") => post(queues::update),
        ("DELETE", "/queues/{queue}") => delete(queues::delete),
        ("POST", "/queues/{queue}/retry") => post(queues::retry),
        ("POST", "/queues/{queue}/pause") => post(queues::pause),
        ("POST", "/queues/{queue}/resume") => post(queues::resume),
        ("GET", "/") => get(ui::index),
        ("GET", "/ui/{file}") => get(ui::asset),
        ("POST", "/tasks") => post(tasks_create::create),
        ("GET", "/tasks") => get(tasks_search::search),
        ("GET", "/tasks/{id}") => get(task_one::get),
        ("DELETE", "/tasks/{id}") => delete(task_one::delete),
        ("POST", "/tasks/{id}/cancel") => post(task_one::cancel),
        ("POST", "/tasks/{id}/retry") => post(task_one::retry),
        ("GET", "/tasks/{id}/stdout") => get(task_one::stdout),
        ("GET", "/tasks/{id}/stderr") => get(task_one::stderr),
        ("GET", "/balance") => get(balance::get),
        ("POST", "/balance") => post(balance::set),
        ("GET", "/monitoring") => get(monitoring::get),
        ("GET", "/openapi.json") => get(openapi::document),
        ("POST", "/tasks/search") => post(legacy::search),
        ("POST", "/tasks/{id}") => post(legacy::create_in_queue),
        ("POST", "/tasks/{id}/{collection}") => post(legacy::create_from_collection),
        _ => return None,
    })
}

/// Builds the router from the table; legacy routes answer 404 unless loaded.
pub fn router(state: AppState) -> Router {
    let max_body = state.config.web.max_body_bytes as usize;
    let mut by_path: Vec<(&'static str, MethodRouter<AppState>)> = Vec::new();
    for r in table() {
        let Some(h) = handler(&r.method, r.path) else {
            continue;
        };
        match by_path.iter_mut().find(|(p, _)| *p == r.path) {
            Some((_, existing)) => *existing = std::mem::take(existing).merge(h),
            None => by_path.push((r.path, h)),
        }
    }
    let mut app = Router::new();
    for (path, h) in by_path {
        app = app.route(path, h);
    }
    app.fallback(fallback)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(max_body))
        .with_state(state)
}

async fn fallback(method: Method, uri: Uri) -> ApiError {
    ApiError::not_found(format!("no route for {method} {}", uri.path()))
}

/// A known path with another method: JSON like every other error (axum's default is an empty body).
async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::with(
        axum::http::StatusCode::METHOD_NOT_ALLOWED,
        format!("method {method} not allowed for {}", uri.path()),
    )
}
