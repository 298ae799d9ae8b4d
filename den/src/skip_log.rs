//! Logs why a queue is skipped once per change of reason, not once per pass.

use std::collections::HashMap;

use bson::oid::ObjectId;

#[derive(Debug, Default)]
pub struct SkipLog {
    last: HashMap<ObjectId, String>,
}

impl SkipLog {
    /// Warns when a queue starts being skipped or its reason changes.
    pub fn skipped(&mut self, queue: ObjectId, name: &str, reason: String) {
        if self.last.get(&queue) != Some(&reason) {
            tracing::warn!(queue = %queue, name, "queue skipped: {reason}");
            self.last.insert(queue, reason);
        }
    }

    /// Notes that a queue is served again, logging the recovery if it had been skipped.
    pub fn served(&mut self, queue: ObjectId, name: &str) {
        if self.last.remove(&queue).is_some() {
            tracing::info!(queue = %queue, name, "queue is served again");
        }
    }
}
