//! The route table: every route once, feeding the router, `GET /info` and `/openapi.json`.

mod attempts;
mod balance;
mod failures;
mod full_output;
mod graph_body;
mod health;
mod info;
mod legacy;
mod metrics;
mod monitoring;
mod nodes;
pub mod openapi;
mod queue_limits;
mod queue_schedule;
mod queue_settings;
mod queues;
mod result;
mod specs;
mod stats;
mod summary;
mod task_filters;
mod task_one;
mod tasks_create;
mod tasks_search;
mod ui;
mod units;
mod workflow_schemas;
mod workflows;

use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::http::{Method, Uri};
use axum::middleware::{from_fn_with_state, map_response};
use axum::routing::{delete, get, post, MethodRouter};
use axum::Router;
use disbatch_config::Role;

use crate::access::{gate, Gate};
use crate::error::ApiError;
use crate::headers::security_headers;
use crate::observe::observe;
use crate::origin::{guard, Policy};
use crate::state::AppState;

/// One route: method, axum path, the role a token needs for it, a summary for the OpenAPI
/// document, whether it is a legacy route (listed only when loaded), and its handler — in one
/// entry, so a listed route cannot lack a handler or a role.
pub struct Route {
    pub method: Method,
    pub path: &'static str,
    /// `None`: public. Only the console's shell is, and it holds no data.
    pub role: Option<Role>,
    pub summary: &'static str,
    pub legacy: bool,
    pub handler: fn() -> MethodRouter<AppState>,
}

const PUBLIC: Option<Role> = None;
const READ: Option<Role> = Some(Role::Read);
const OPERATE: Option<Role> = Some(Role::Operate);
const ADMIN: Option<Role> = Some(Role::Admin);

fn route(
    method: Method,
    path: &'static str,
    role: Option<Role>,
    summary: &'static str,
    handler: fn() -> MethodRouter<AppState>,
) -> Route {
    Route {
        method,
        path,
        role,
        summary,
        legacy: false,
        handler,
    }
}

fn legacy(
    method: Method,
    path: &'static str,
    role: Option<Role>,
    summary: &'static str,
    handler: fn() -> MethodRouter<AppState>,
) -> Route {
    Route {
        legacy: true,
        ..route(method, path, role, summary, handler)
    }
}

/// The routes this config serves (the legacy 4.0 task routes only when `web_extensions` names
/// them), by method and path.
pub fn served(config: &disbatch_config::Config) -> Vec<(Method, &'static str)> {
    let legacy = crate::state::legacy_loaded(config);
    table()
        .into_iter()
        .filter(|r| legacy || !r.legacy)
        .map(|r| (r.method, r.path))
        .collect()
}

/// Every route once, area by area. `GET /info` and `/openapi.json` list them in this order.
pub fn table() -> Vec<Route> {
    [
        console_probes_and_info(),
        nodes_and_plugins(),
        queues(),
        tasks(),
        workflows(),
        balance_monitoring_and_openapi(),
        legacy_4_0(),
    ]
    .into_iter()
    .flatten()
    .collect()
}

fn console_probes_and_info() -> Vec<Route> {
    vec![
        route(
            Method::GET,
            "/",
            PUBLIC,
            "The operator console (HTML)",
            || get(ui::index),
        ),
        route(
            Method::GET,
            "/ui/{file}",
            PUBLIC,
            "Console assets built into the server",
            || get(ui::asset),
        ),
        route(
            Method::GET,
            "/healthz",
            PUBLIC,
            "Liveness: 200 while the process serves (no token needed, reads nothing)",
            || get(health::healthz),
        ),
        route(
            Method::GET,
            "/readyz",
            PUBLIC,
            "Readiness: 200 when the database answers a ping, else 503 (no token needed)",
            || get(health::readyz),
        ),
        route(
            Method::GET,
            "/info",
            READ,
            "Database, web extensions and routes",
            || get(info::info),
        ),
    ]
}

fn nodes_and_plugins() -> Vec<Route> {
    vec![
        route(
            Method::GET,
            "/nodes",
            READ,
            "Nodes with running counts and liveness",
            || get(nodes::list),
        ),
        route(
            Method::GET,
            "/nodes/{node}",
            READ,
            "One node by id or name",
            || get(nodes::get),
        ),
        route(
            Method::POST,
            "/nodes/{node}",
            OPERATE,
            "Set a node's maxthreads",
            || post(nodes::set_maxthreads),
        ),
        route(
            Method::DELETE,
            "/nodes/{node}",
            OPERATE,
            "Forget a stale node's document (409 for a live node or one holding tasks)",
            || delete(nodes::forget),
        ),
        route(
            Method::GET,
            "/plugins",
            READ,
            "Plugins allowed by the config",
            || get(info::plugins),
        ),
    ]
}

/// `/specs` and `/summary` too: they fill and count queues.
fn queues() -> Vec<Route> {
    vec![
        route(
            Method::GET,
            "/queues",
            READ,
            "Queues with queued, running and completed counts",
            || get(queues::list),
        ),
        route(Method::POST, "/queues", ADMIN, "Create a queue", || {
            post(queues::create)
        }),
        route(
            Method::POST,
            "/specs",
            ADMIN,
            "Load Coordinate work specs into queues",
            || post(specs::load),
        ),
        route(
            Method::GET,
            "/summary",
            READ,
            "Task counts per queue in Coordinate's unit states",
            || get(summary::get),
        ),
        route(
            Method::POST,
            "/queues/{queue}/units",
            OPERATE,
            "Add work units by key (reject or update existing keys)",
            || post(units::add),
        ),
        route(
            Method::GET,
            "/queues/{queue}",
            READ,
            "One queue by id or name",
            || get(queues::get),
        ),
        route(
            Method::POST,
            "/queues/{queue}",
            OPERATE,
            "Update a queue's settings; its name, plugin and x-disbatch-admin-fields need admin",
            || post(queues::update),
        ),
        route(
            Method::DELETE,
            "/queues/{queue}",
            ADMIN,
            "Delete a queue (its tasks are kept)",
            || delete(queues::delete),
        ),
        route(
            Method::POST,
            "/queues/{queue}/retry",
            OPERATE,
            "Requeue a queue's tasks in the given statuses",
            || post(queues::retry),
        ),
        route(
            Method::POST,
            "/queues/{queue}/cancel",
            OPERATE,
            "Cancel a queue's queued (-2) and blocked (-4) tasks",
            || post(queues::cancel),
        ),
        route(
            Method::POST,
            "/queues/{queue}/pause",
            OPERATE,
            "Pause a queue: threads to 0, remembered",
            || post(queues::pause),
        ),
        route(
            Method::POST,
            "/queues/{queue}/resume",
            OPERATE,
            "Resume a paused queue with its old threads",
            || post(queues::resume),
        ),
    ]
}

fn tasks() -> Vec<Route> {
    vec![
        route(
            Method::POST,
            "/tasks",
            OPERATE,
            "Create tasks: one, many, or from another collection",
            || post(tasks_create::create),
        ),
        route(
            Method::GET,
            "/failures",
            READ,
            "The newest failed (status >= 2) and discarded tasks of every queue, newest first",
            || get(failures::list),
        ),
        route(
            Method::GET,
            "/tasks",
            READ,
            "Search or count tasks by indexed fields",
            || get(tasks_search::search),
        ),
        route(
            Method::GET,
            "/tasks/{id}",
            READ,
            "One task (JSON, or HTML for browsers)",
            || get(task_one::get),
        ),
        route(
            Method::DELETE,
            "/tasks/{id}",
            OPERATE,
            "Delete a task that is not running, and its output files",
            || delete(task_one::delete),
        ),
        route(
            Method::POST,
            "/tasks/{id}/cancel",
            OPERATE,
            "Cancel a task: at once if waiting, by stopping its plugin if running",
            || post(task_one::cancel),
        ),
        route(
            Method::POST,
            "/tasks/{id}/retry",
            OPERATE,
            "Requeue a finished, orphaned or cancelled task",
            || post(task_one::retry),
        ),
        route(
            Method::POST,
            "/tasks/{id}/discard",
            OPERATE,
            "Mark a failed task (status >= 2) discarded: given up on, as a retry policy marks one out of attempts",
            || post(task_one::discard),
        ),
        route(
            Method::GET,
            "/tasks/{id}/attempts",
            READ,
            "A task's attempts, oldest first (the newest 1000)",
            || get(attempts::list),
        ),
        route(
            Method::GET,
            "/tasks/{id}/result",
            READ,
            "The output of a task's last successful attempt's result file, whole, as JSON (?attempt=ID: that attempt's)",
            || get(result::get),
        ),
        route(
            Method::GET,
            "/tasks/{id}/stdout",
            READ,
            "A task's stdout as text, inline or from GridFS; a running task's so far (X-Disbatch-Output: live)",
            || get(task_one::stdout),
        ),
        route(
            Method::GET,
            "/tasks/{id}/stderr",
            READ,
            "A task's stderr as text, inline or from GridFS; a running task's so far (X-Disbatch-Output: live)",
            || get(task_one::stderr),
        ),
    ]
}

fn workflows() -> Vec<Route> {
    vec![
        route(
            Method::POST,
            "/graphs",
            OPERATE,
            "Create a graph of tasks that wait on each other (all or nothing)",
            || post(workflows::create_graph),
        ),
        route(
            Method::GET,
            "/graphs",
            READ,
            "The newest graphs (.limit, at most 1000)",
            || get(workflows::list_graphs),
        ),
        route(
            Method::GET,
            "/graphs/{id}",
            READ,
            "A graph: its state, counts and every task with what it waits on",
            || get(workflows::get_graph),
        ),
        route(
            Method::POST,
            "/graphs/{id}/cancel",
            OPERATE,
            "Cancel a graph's tasks that have not ended",
            || post(workflows::cancel_graph),
        ),
        route(
            Method::POST,
            "/batches",
            OPERATE,
            "Create a batch of tasks with an optional callback task run once all have ended",
            || post(workflows::create_batch),
        ),
        route(
            Method::GET,
            "/batches",
            READ,
            "The newest batches (.limit, at most 1000)",
            || get(workflows::list_batches),
        ),
        route(
            Method::GET,
            "/batches/{id}",
            READ,
            "A batch: its state, counts, first members and callback",
            || get(workflows::get_batch),
        ),
        route(
            Method::POST,
            "/batches/{id}/cancel",
            OPERATE,
            "Cancel a batch's members that have not ended, and its callback",
            || post(workflows::cancel_batch),
        ),
    ]
}

fn balance_monitoring_and_openapi() -> Vec<Route> {
    vec![
        route(
            Method::GET,
            "/balance",
            READ,
            "The QueueBalance document",
            || get(balance::get),
        ),
        route(
            Method::POST,
            "/balance",
            ADMIN,
            "Update QueueBalance settings",
            || post(balance::set),
        ),
        route(
            Method::GET,
            "/monitoring",
            READ,
            "Node and QueueBalance health checks",
            || get(monitoring::get),
        ),
        route(
            Method::GET,
            "/metrics",
            READ,
            "Queue, task and node gauges in Prometheus text format",
            || get(metrics::get),
        ),
        route(
            Method::GET,
            "/stats",
            READ,
            "Per-minute statistics per queue (?minutes=N, 1..=10080, default 60; &queue=Q, id or name)",
            || get(stats::get),
        ),
        route(
            Method::GET,
            "/openapi.json",
            READ,
            "This API as an OpenAPI 3.0 document",
            || get(openapi::document),
        ),
    ]
}

fn legacy_4_0() -> Vec<Route> {
    vec![
        legacy(
            Method::POST,
            "/tasks/search",
            READ,
            "Legacy 4.0 search with an arbitrary filter",
            || post(legacy::search),
        ),
        legacy(
            Method::POST,
            "/tasks/{id}",
            OPERATE,
            "Legacy 4.0: create tasks in a queue from a params array",
            || post(legacy::create_in_queue),
        ),
        legacy(
            Method::POST,
            "/tasks/{id}/{collection}",
            OPERATE,
            "Legacy 4.0: create tasks from a collection",
            || post(legacy::create_from_collection),
        ),
    ]
}

/// Builds the router from the table; legacy routes answer 404 unless loaded. Every request
/// first passes the Host and Origin checks of `policy`; each route but the public ones then
/// checks the caller's token against its role before its handler runs (and before any body
/// is read). Every answer, refusals included, carries the security headers.
pub fn router(state: AppState, policy: Policy) -> Router {
    let max_body = state.config.web.max_body_bytes as usize;
    let access = state.access.clone();
    let mut by_path: Vec<(&'static str, MethodRouter<AppState>)> = Vec::new();
    for r in table() {
        let mut h = (r.handler)();
        if let Some(role) = r.role {
            let g = Gate {
                access: access.clone(),
                role,
            };
            h = h.route_layer(from_fn_with_state(g, gate));
        }
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
        .layer(from_fn_with_state(state.clone(), fresh_counts_after_writes))
        .layer(from_fn_with_state(Arc::new(policy), guard))
        .layer(map_response(security_headers))
        .layer(from_fn_with_state(state.web_metrics.clone(), observe))
        .with_state(state)
}

/// A client that changed something sees its change in the next counts it reads, rather than
/// a shared reading from before it.
async fn fresh_counts_after_writes(
    axum::extract::State(state): axum::extract::State<AppState>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let writes = !matches!(
        *request.method(),
        Method::GET | Method::HEAD | Method::OPTIONS
    );
    let response = next.run(request).await;
    if writes {
        state.counts.invalidate();
    }
    response
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

#[cfg(test)]
mod tests;
