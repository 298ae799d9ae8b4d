//! What every handler shares: one store (one MongoDB client for the process) and the config.

use std::sync::Arc;

use disbatch_config::Config;
use disbatch_serve::readiness::Readiness;
use disbatch_store::Store;

use crate::access::Access;
use crate::observe::WebMetrics;
use crate::shared_counts::SharedCounts;

#[derive(Clone)]
pub struct AppState(Arc<Inner>);

pub struct Inner {
    pub store: Store,
    pub config: Config,
    /// The counts reading every viewer shares (all namespaces, one slot each).
    pub counts: SharedCounts,
    /// Request counters for the life of the process (all namespaces).
    pub web_metrics: WebMetrics,
    /// `/readyz`'s shared ping of the configured database.
    pub readiness: Readiness,
    /// The bearer tokens, shared with config reloads (SIGHUP).
    pub access: Arc<Access>,
}

impl AppState {
    /// `routes`: every route served, each counted by method and path in the request metrics.
    pub fn new(
        store: Store,
        config: Config,
        routes: &[(axum::http::Method, &'static str)],
    ) -> Self {
        // Fails only for a wrong definition in observe.rs, which its unit test catches.
        let web_metrics = WebMetrics::new(routes).expect("static metric definitions");
        let access = Arc::new(Access::new(&config.web.tokens));
        AppState(Arc::new(Inner {
            readiness: Readiness::with_store(store.clone()),
            store,
            config,
            counts: SharedCounts::default(),
            web_metrics,
            access,
        }))
    }

    /// The same state on another database of the server (a request's namespace).
    pub fn in_namespace(&self, database: &str) -> Self {
        AppState(Arc::new(Inner {
            store: self.0.store.with_database(database),
            config: self.0.config.clone(),
            counts: self.0.counts.clone(),
            web_metrics: self.0.web_metrics.clone(),
            readiness: self.0.readiness.clone(),
            access: self.0.access.clone(),
        }))
    }

    /// True when the legacy 4.0 task routes are loaded (`web_extensions` names them).
    pub fn legacy_routes(&self) -> bool {
        legacy_loaded(&self.0.config)
    }
}

impl std::ops::Deref for AppState {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.0
    }
}

pub fn legacy_loaded(config: &Config) -> bool {
    config
        .web_extensions
        .iter()
        .any(|e| e == "Disbatch::Web::Tasks")
}
