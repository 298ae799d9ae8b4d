//! disbatch-core: what the DEN, the task runner and the DCI share, in layers; each uses only
//! those below it (issue 53 regroups the rest the same way):
//! - `serve`: serving an axum app with bounded connections (the DCI, the DEN's metrics),
//!   readiness and the operational metrics;
//! - `store`: every MongoDB query, and the only code that knows collections, fields and
//!   indexes;
//! - `config`: node configs, the plugin allow-list and the plugins' environment;
//! - `process`: the process itself (`logging`, `isolation`, `open_files`, `backoff`);
//! - `wire`: the pipes between a DEN and its runners (`handoff`, `relay`, `result_batches`);
//! - `model`: the schema's values and the rules on them (queues, statuses, limits, schedules,
//!   workflows, retention, GridFS placement), bson only;
//! - `text`: bytes and text safe to show, store and log (`printable`, `redact`, `utf8`,
//!   `client_json`, `raw_doc`);
//! - at the ground: `error`, `driver_error`, and `fleet_time` (the database server's clock as
//!   this process knows it: every time another host judges).
//!
//! Still to move (issue 53): `durability` into the store. Still pointing up: the
//! field names (`store::schema`, read by `model` and `wire`, until they move to
//! `model/schema.rs`), the store's task types (`Unit`, `TaskEnd`, `AttemptRecord`, read by
//! `model::chaining` and `wire`, until `model/task.rs`), `model::work_spec`'s use of
//! `store::check_queue_fields`, and `process::logging`'s start from a config file (until
//! `config/startup.rs`).

pub mod config;
pub mod driver_error;
pub mod durability;
pub mod error;
pub mod fleet_time;
pub mod model;
pub mod process;
#[cfg(feature = "serve")]
pub mod serve;
pub mod store;
pub mod text;
pub mod wire;

pub use error::{Error, Result};

/// This build's version, reported on node documents.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The git commit of this build (abbreviated), "unknown" when built outside a git checkout
/// without `DISBATCH_GIT_SHA` set (see `build.rs`).
pub const GIT_SHA: &str = env!("DISBATCH_GIT_SHA");

/// What `--version` prints after each program's name: `0.1.0 (git abc1234def56)`.
pub const LONG_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (git ",
    env!("DISBATCH_GIT_SHA"),
    ")"
);
