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

/// One route: method, axum path, a summary for the OpenAPI document, whether it is a legacy
/// route (listed only when loaded), and its handler — in one entry, so a listed route cannot
/// lack a handler.
pub struct Route {
    pub method: Method,
    pub path: &'static str,
    pub summary: &'static str,
    pub legacy: bool,
    pub handler: fn() -> MethodRouter<AppState>,
}

fn route(
    method: Method,
    path: &'static str,
    summary: &'static str,
    handler: fn() -> MethodRouter<AppState>,
) -> Route {
    Route {
        method,
        path,
        summary,
        legacy: false,
        handler,
    }
}

fn legacy(
    method: Method,
    path: &'static str,
    summary: &'static str,
    handler: fn() -> MethodRouter<AppState>,
) -> Route {
    Route {
        legacy: true,
        ..route(method, path, summary, handler)
    }
}

pub fn table() -> Vec<Route> {
    vec![
        route(Method::GET, "/", "The operator console (HTML)", || {
            get(ui::index)
        }),
        route(
            Method::GET,
            "/ui/{file}",
            "Console assets built into the server",
            || get(ui::asset),
        ),
        route(
            Method::GET,
            "/info",
            "Database, web extensions and routes",
            || get(info::info),
        ),
        route(
            Method::GET,
            "/nodes",
            "Nodes with running counts and liveness",
            || get(nodes::list),
        ),
        route(
            Method::GET,
            "/nodes/{node}",
            "One node by id or name",
            || get(nodes::get),
        ),
        route(
            Method::POST,
            "/nodes/{node}",
            "Set a node's maxthreads",
            || post(nodes::set_maxthreads),
        ),
        route(
            Method::GET,
            "/plugins",
            "Plugins allowed by the config",
            || get(info::plugins),
        ),
        route(
            Method::GET,
            "/queues",
            "Queues with queued, running and completed counts",
            || get(queues::list),
        ),
        route(Method::POST, "/queues", "Create a queue", || {
            post(queues::create)
        }),
        route(
            Method::POST,
            "/specs",
            "Load Coordinate work specs into queues",
            || post(specs::load),
        ),
        route(
            Method::GET,
            "/summary",
            "Task counts per queue in Coordinate's unit states",
            || get(summary::get),
        ),
        route(
            Method::POST,
            "/queues/{queue}/units",
            "Add work units by key (reject or update existing keys)",
            || post(units::add),
        ),
        route(
            Method::GET,
            "/queues/{queue}",
            "One queue by id or name",
            || get(queues::get),
        ),
        route(
            Method::POST,
            "/queues/{queue}",
            "Update a queue's name, plugin, threads or sort",
            || post(queues::update),
        ),
        route(
            Method::DELETE,
            "/queues/{queue}",
            "Delete a queue (its tasks are kept)",
            || delete(queues::delete),
        ),
        route(
            Method::POST,
            "/queues/{queue}/retry",
            "Requeue a queue's tasks in the given statuses",
            || post(queues::retry),
        ),
        route(
            Method::POST,
            "/queues/{queue}/pause",
            "Pause a queue: threads to 0, remembered",
            || post(queues::pause),
        ),
        route(
            Method::POST,
            "/queues/{queue}/resume",
            "Resume a paused queue with its old threads",
            || post(queues::resume),
        ),
        route(
            Method::POST,
            "/tasks",
            "Create tasks: one, many, or from another collection",
            || post(tasks_create::create),
        ),
        route(
            Method::GET,
            "/tasks",
            "Search or count tasks by indexed fields",
            || get(tasks_search::search),
        ),
        route(
            Method::GET,
            "/tasks/{id}",
            "One task (JSON, or HTML for browsers)",
            || get(task_one::get),
        ),
        route(
            Method::DELETE,
            "/tasks/{id}",
            "Delete a task that is not running, and its output files",
            || delete(task_one::delete),
        ),
        route(
            Method::POST,
            "/tasks/{id}/cancel",
            "Cancel a queued task",
            || post(task_one::cancel),
        ),
        route(
            Method::POST,
            "/tasks/{id}/retry",
            "Requeue a finished, orphaned or cancelled task",
            || post(task_one::retry),
        ),
        route(
            Method::GET,
            "/tasks/{id}/stdout",
            "A task's stdout as text, inline or from GridFS",
            || get(task_one::stdout),
        ),
        route(
            Method::GET,
            "/tasks/{id}/stderr",
            "A task's stderr as text, inline or from GridFS",
            || get(task_one::stderr),
        ),
        route(Method::GET, "/balance", "The QueueBalance document", || {
            get(balance::get)
        }),
        route(
            Method::POST,
            "/balance",
            "Update QueueBalance settings",
            || post(balance::set),
        ),
        route(
            Method::GET,
            "/monitoring",
            "Node and QueueBalance health checks",
            || get(monitoring::get),
        ),
        route(
            Method::GET,
            "/openapi.json",
            "This API as an OpenAPI 3.0 document",
            || get(openapi::document),
        ),
        legacy(
            Method::POST,
            "/tasks/search",
            "Legacy 4.0 search with an arbitrary filter",
            || post(legacy::search),
        ),
        legacy(
            Method::POST,
            "/tasks/{id}",
            "Legacy 4.0: create tasks in a queue from a params array",
            || post(legacy::create_in_queue),
        ),
        legacy(
            Method::POST,
            "/tasks/{id}/{collection}",
            "Legacy 4.0: create tasks from a collection",
            || post(legacy::create_from_collection),
        ),
    ]
}

/// Builds the router from the table; legacy routes answer 404 unless loaded.
pub fn router(state: AppState) -> Router {
    let max_body = state.config.web.max_body_bytes as usize;
    let mut by_path: Vec<(&'static str, MethodRouter<AppState>)> = Vec::new();
    for r in table() {
        let h = (r.handler)();
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
