//! A task as the DEN, its runners and the store pass it around: how an attempt ends, and a
//! stream's value as stored.

use bson::oid::ObjectId;
use bson::{Bson, DateTime};

use crate::model::status;

/// A stream's value as stored on the task: inline text, a GridFS file id, or nothing.
#[derive(Debug, Clone, PartialEq)]
pub enum OutputValue {
    Null,
    Text(String),
    File(ObjectId),
}

impl From<OutputValue> for Bson {
    fn from(v: OutputValue) -> Bson {
        match v {
            // Disbatch's runner stores a plugin's absent output as null, and Perl tools test
            // `defined`: an empty stream is stored the same way (GridFS files stay files,
            // empty or not, as with `gfs: true` in Disbatch).
            OutputValue::Null => Bson::Null,
            OutputValue::Text(s) if s.is_empty() => Bson::Null,
            OutputValue::Text(s) => Bson::String(s),
            OutputValue::File(id) => Bson::ObjectId(id),
        }
    }
}

/// How an attempt leaves its task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskEnd {
    /// Finished with this status (1 succeeded, ≥ 2 failed).
    Status(i32),
    /// Back to queued for another attempt, not before the given time. `keep_key_slot`: it
    /// keeps its per-key concurrency slot meanwhile, and so its place among its key's tasks
    /// (an `ordered` queue's); otherwise the slot is free for the key's next task.
    Retry {
        not_before: Option<DateTime>,
        keep_key_slot: bool,
    },
    /// Finished with this failed status, and no retry will follow: its queue's `retry`
    /// policy is out of attempts, or the plugin refused one (`discarded_at` is set).
    Discarded(i32),
}

impl TaskEnd {
    /// This end, a retry keeping its key slot when `keep` (its queue's keys are `ordered`).
    pub fn keeping_key_slot(self, keep: bool) -> TaskEnd {
        match self {
            TaskEnd::Retry { not_before, .. } => TaskEnd::Retry {
                not_before,
                keep_key_slot: keep,
            },
            other => other,
        }
    }

    /// The status the task shows once this end is recorded.
    pub fn status(self) -> i32 {
        match self {
            TaskEnd::Status(s) | TaskEnd::Discarded(s) => s,
            TaskEnd::Retry { .. } => status::QUEUED,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_inline_output_is_stored_as_null_like_disbatch() {
        assert_eq!(Bson::from(OutputValue::Text(String::new())), Bson::Null);
        assert_eq!(Bson::from(OutputValue::Null), Bson::Null);
        assert_eq!(
            Bson::from(OutputValue::Text("x".into())),
            Bson::String("x".into())
        );
        let file = ObjectId::new();
        assert_eq!(Bson::from(OutputValue::File(file)), Bson::ObjectId(file));
    }
}
