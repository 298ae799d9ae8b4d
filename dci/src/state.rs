//! What every handler shares: one store (one MongoDB client for the process) and the config.

use std::sync::Arc;

use disbatch_core::config::Config;
use disbatch_core::store::Store;

use crate::access::Access;
use crate::shared_counts::SharedCounts;

#[derive(Clone)]
pub struct AppState(Arc<Inner>);

pub struct Inner {
    pub store: Store,
    pub config: Config,
    /// The counts reading every viewer shares (all namespaces, one slot each).
    pub counts: SharedCounts,
    /// The bearer tokens, shared with config reloads (SIGHUP).
    pub access: Arc<Access>,
}

impl AppState {
    pub fn new(store: Store, config: Config) -> Self {
        let access = Arc::new(Access::new(&config.web.tokens));
        AppState(Arc::new(Inner {
            store,
            config,
            counts: SharedCounts::default(),
            access,
        }))
    }

    /// The same state on another database of the server (a request's namespace).
    pub fn in_namespace(&self, database: &str) -> Self {
        AppState(Arc::new(Inner {
            store: self.0.store.with_database(database),
            config: self.0.config.clone(),
            counts: self.0.counts.clone(),
            access: self.0.access.clone(),
        }))
    }

    /// True when the legacy 4.0 task routes are loaded (`web_extensions` names them).
    pub fn legacy_routes(&self) -> bool {
        self.0
            .config
            .web_extensions
            .iter()
            .any(|e| e == "Disbatch::Web::Tasks")
    }
}

impl std::ops::Deref for AppState {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.0
    }
}
