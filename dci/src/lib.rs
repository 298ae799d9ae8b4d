//! The Disbatch command interface: the JSON REST API over the shared store.

pub mod access;
pub mod check_config;
pub mod envelope;
pub mod error;
pub mod headers;
pub mod json_stream;
pub mod namespace;
pub mod observe;
pub mod origin;
pub mod params;
pub mod path;
pub mod reload;
pub mod render;
pub mod request;
pub mod routes;
pub mod shared_counts;
pub mod state;
pub mod tls;

pub use routes::router;
pub use state::AppState;
