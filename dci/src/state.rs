//! What every handler shares: one store (one MongoDB client for the process) and the config.

use std::collections::HashMap;
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
    /// The state of each other namespace the config allows (`web.namespaces`), made once: a
    /// namespace's store keeps what it learned (the indexes it made) from one request to the
    /// next. Empty in those states themselves.
    namespaces: HashMap<String, AppState>,
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
        let readiness = Readiness::with_store(store.clone());
        let counts = SharedCounts::default();
        let namespaces = config
            .web
            .namespaces
            .iter()
            .filter(|ns| **ns != config.database)
            .map(|ns| {
                let state = AppState(Arc::new(Inner {
                    store: store.with_database(ns),
                    config: config.clone(),
                    counts: counts.clone(),
                    web_metrics: web_metrics.clone(),
                    readiness: readiness.clone(),
                    access: access.clone(),
                    namespaces: HashMap::new(),
                }));
                (ns.clone(), state)
            })
            .collect();
        AppState(Arc::new(Inner {
            readiness,
            store,
            config,
            counts,
            web_metrics,
            access,
            namespaces,
        }))
    }

    /// The state on another database of the server (a request's namespace), when the config
    /// allows it.
    pub fn in_namespace(&self, database: &str) -> Option<Self> {
        self.0.namespaces.get(database).cloned()
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A namespace's state, and so its store and what the store learned (the indexes it made),
    /// is made once, not for every request: the same one each time.
    #[tokio::test]
    async fn each_namespace_has_one_state_made_once() {
        let text = r#"{"mongohost": "127.0.0.1:1", "database": "main",
            "web": {"namespaces": ["main", "east", "west"]}}"#;
        let config = disbatch_config::Config::parse(std::path::Path::new("/c.json"), text)
            .expect("config")
            .config;
        let store = Store::connect(&config, disbatch_config::Component::Web)
            .await
            .expect("a client is made without connecting");
        let state = AppState::new(store, config, &[]);
        let east = state.in_namespace("east").expect("east is allowed");
        let again = state.in_namespace("east").expect("east is allowed");
        assert!(Arc::ptr_eq(&east.0, &again.0), "one state for east");
        let west = state.in_namespace("west").expect("west is allowed");
        assert!(!Arc::ptr_eq(&east.0, &west.0));
        assert_eq!(east.store.database_name(), "east");
        assert_eq!(west.store.database_name(), "west");
        assert!(state.in_namespace("north").is_none(), "not listed");
        // The configured database is served by the state itself.
        assert!(state.in_namespace("main").is_none());
    }
}
