//! The runner's database connection, opened on first use: a task whose node records its
//! result, and that neither renews a lease nor chains, never connects at all.

use std::sync::Arc;

use disbatch_config::{Component, Config};
use disbatch_store::Result;
use disbatch_store::Store;
use tokio::sync::OnceCell;

/// A `Store` that connects when first asked for; clones share one connection.
#[derive(Clone)]
pub struct LazyStore(Arc<Inner>);

struct Inner {
    config: Config,
    store: OnceCell<Store>,
}

impl LazyStore {
    pub fn new(config: &Config) -> LazyStore {
        LazyStore(Arc::new(Inner {
            config: config.clone(),
            store: OnceCell::new(),
        }))
    }

    pub async fn get(&self) -> Result<&Store> {
        self.0
            .store
            .get_or_try_init(|| async {
                let store = Store::connect(&self.0.config, Component::TaskRunner).await?;
                // A runner started without its node's clock reading (by hand, or by an older
                // node) reads the server's clock once: its times are the fleet's too.
                if let Err(e) = store.keep_clock(std::time::Duration::MAX).await {
                    tracing::warn!(error = %e, "could not read the server's clock; using this host's");
                }
                Ok(store)
            })
            .await
    }

    /// Whether anything has needed the database yet.
    pub fn connected(&self) -> bool {
        self.0.store.initialized()
    }
}
