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

    /// Forgets queues that no longer exist (deleted while skipped).
    pub fn forget_except(&mut self, existing: impl Iterator<Item = ObjectId>) {
        let existing: std::collections::HashSet<ObjectId> = existing.collect();
        self.last.retain(|id, _| existing.contains(id));
    }

    /// How many queues are skipped now.
    pub fn skipped_now(&self) -> usize {
        self.last.len()
    }

    /// Notes that a queue is served again, logging the recovery if it had been skipped.
    pub fn served(&mut self, queue: ObjectId, name: &str) {
        if self.last.remove(&queue).is_some() {
            tracing::info!(queue = %queue, name, "queue is served again");
        }
    }
}
