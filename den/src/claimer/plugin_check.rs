//! Plugin validation for the claimer, cached briefly so a pass does not stat files per task.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use disbatch_config::plugins::{PluginError, PluginTable};

/// How long a verdict stands: long enough to spare the file system, short enough that an
/// installed or removed plugin is noticed within a few passes.
const RECHECK_AFTER: Duration = Duration::from_secs(5);

#[derive(Debug)]
pub struct PluginCheck {
    table: PluginTable,
    cache: HashMap<String, (Result<PathBuf, PluginError>, Instant)>,
}

impl PluginCheck {
    pub fn new(table: PluginTable) -> Self {
        PluginCheck {
            table,
            cache: HashMap::new(),
        }
    }

    pub fn check(&mut self, name: &str) -> Result<PathBuf, PluginError> {
        if let Some((verdict, at)) = self.cache.get(name) {
            if at.elapsed() < RECHECK_AFTER {
                return verdict.clone();
            }
        }
        let verdict = self.table.resolve(name);
        self.cache
            .insert(name.to_string(), (verdict.clone(), Instant::now()));
        verdict
    }
}
