//! A task as the DEN, its runners and the store pass it around: how an attempt ends, its
//! record and live output, a stream's value as stored, and a work unit to add.

use bson::oid::ObjectId;
use bson::{Bson, DateTime, Document};

use crate::status;

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

    #[test]
    fn an_outcome_is_spelt_alike_as_text_bson_and_serde() {
        let names = [
            "succeeded",
            "failed",
            "retry",
            "cancelled",
            "timed_out",
            "discarded",
            "lost",
        ];
        assert_eq!(Outcome::ALL.map(Outcome::as_str), names);
        for o in Outcome::ALL {
            assert_eq!(Outcome::parse(o.as_str()), Some(o));
            assert_eq!(o.as_str().parse::<Outcome>(), Ok(o));
            assert_eq!(Bson::from(o), Bson::String(o.as_str().into()));
            assert_eq!(bson::to_bson(&o).ok(), Some(Bson::from(o)));
            assert_eq!(bson::from_bson::<Outcome>(Bson::from(o)).ok(), Some(o));
            assert_eq!(o.to_string(), o.as_str());
        }
        assert_eq!(Outcome::parse("exploded"), None);
        assert_eq!(Outcome::parse("running"), None);
        assert!("Succeeded".parse::<Outcome>().is_err());
        assert_eq!(Outcome::label(None), "unknown");
        assert_eq!(Outcome::label(Some(Outcome::TimedOut)), "timed_out");
    }
}

/// How an attempt ended, as its record's `outcome`, the runner's completion frame, the worker
/// host's report and the DEN's metric label spell it: one list, so none of them can name an
/// outcome the others do not know.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Succeeded,
    Failed,
    Retry,
    Cancelled,
    TimedOut,
    /// The task had changed hands: the result was not recorded.
    Discarded,
    /// Its lease passed and another node recovered the task (recovery writes it).
    Lost,
}

impl Outcome {
    /// Every outcome, in the order the DEN's metrics list them.
    pub const ALL: [Outcome; 7] = [
        Outcome::Succeeded,
        Outcome::Failed,
        Outcome::Retry,
        Outcome::Cancelled,
        Outcome::TimedOut,
        Outcome::Discarded,
        Outcome::Lost,
    ];

    /// What a report says of an attempt whose outcome its sender could not learn.
    pub const UNKNOWN: &'static str = "unknown";

    pub const fn as_str(self) -> &'static str {
        match self {
            Outcome::Succeeded => "succeeded",
            Outcome::Failed => "failed",
            Outcome::Retry => "retry",
            Outcome::Cancelled => "cancelled",
            Outcome::TimedOut => "timed_out",
            Outcome::Discarded => "discarded",
            Outcome::Lost => "lost",
        }
    }

    /// The outcome `name` spells; None for any other text (a newer version's, a hand edit).
    pub fn parse(name: &str) -> Option<Outcome> {
        Outcome::ALL.into_iter().find(|o| o.as_str() == name)
    }

    /// `outcome`'s name, or `unknown` when it was not learned.
    pub fn label(outcome: Option<Outcome>) -> &'static str {
        outcome.map_or(Outcome::UNKNOWN, Outcome::as_str)
    }
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Outcome {
    type Err = String;

    fn from_str(name: &str) -> Result<Outcome, String> {
        Outcome::parse(name).ok_or_else(|| format!("unknown outcome {name:?}"))
    }
}

impl From<Outcome> for Bson {
    fn from(o: Outcome) -> Bson {
        Bson::String(o.as_str().to_string())
    }
}

/// How an attempt ended.
#[derive(Debug, Clone, PartialEq)]
pub struct AttemptEnd {
    pub outcome: Outcome,
    pub status: Option<i32>,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    /// The plugin's result-file object.
    pub result: Option<Document>,
    /// Why it ended so and what follows: a failure's cause, and its retry or discard.
    pub reason: Option<String>,
    /// The attempt's task was discarded with it: a failure no retry follows.
    pub task_discarded: bool,
    /// Where the result's `output` is when it was too large to keep in `result`.
    pub output_file: Option<StoredOutput>,
}

/// A result `output` kept in GridFS, as JSON text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoredOutput {
    pub file: ObjectId,
    /// The JSON text's length.
    pub bytes: u64,
}

/// A result's `output` as an attempt record holds it.
#[derive(Debug, Clone, PartialEq)]
pub enum ResultOutput {
    Inline(Bson),
    /// In GridFS, as JSON text: read with `Store::stream_output_file`.
    File(StoredOutput),
}

/// A whole attempt record, written once when the attempt ends.
#[derive(Debug, Clone, PartialEq)]
pub struct AttemptRecord {
    pub id: ObjectId,
    pub task: ObjectId,
    pub queue: Option<ObjectId>,
    pub node: String,
    /// The runner's process id.
    pub pid: u32,
    pub start: DateTime,
    pub end: AttemptEnd,
}

/// The most of each stream a live copy holds: its last 64 KiB. Two streams stay far below
/// the 16 MiB a task document may hold, and a second's worth of most plugins' output.
pub const LIVE_TAIL: u64 = 64 * 1024;

/// What a live copy holds of one stream.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LiveStream {
    /// The stream's bytes `from..bytes`, as UTF-8 (a character cut by the tail's start is
    /// left out; one still being written waits for the next copy).
    pub text: String,
    /// Where `text` starts: this many bytes of the stream are not kept.
    pub from: u64,
    /// How many bytes of the stream `text` reaches.
    pub bytes: u64,
}

/// One live copy of a running attempt's output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveOutput {
    pub attempt: ObjectId,
    pub stdout: LiveStream,
    pub stderr: LiveStream,
}

/// A unit to add: its key, its params (Coordinate's data), and optional scheduling fields.
#[derive(Debug, Clone, PartialEq)]
pub struct Unit {
    pub key: String,
    pub params: Document,
    /// Coordinate's priorities are floats: 2.7 is stored and ordered as 2.7.
    pub priority: Option<f64>,
    pub not_before: Option<DateTime>,
}

/// A task as its claim returned it, with what every step after the claim keys on decoded
/// once: a claim only returns tasks with an ObjectId `_id`.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimedTask {
    pub id: ObjectId,
    /// None for a task stored without an ObjectId `queue` (by hand): its runner says so.
    pub queue: Option<ObjectId>,
    /// The document as the claim returned it: what the runner is handed, as Disbatch's was.
    pub raw: Document,
}

impl ClaimedTask {
    /// The claimed task in `raw`; None when its `_id` is no ObjectId.
    pub fn from_document(raw: Document) -> Option<ClaimedTask> {
        let id = raw.get_object_id(crate::schema::task::ID).ok()?;
        let queue = raw.get_object_id(crate::schema::task::QUEUE).ok();
        Some(ClaimedTask { id, queue, raw })
    }

    /// Its `params`, or Disbatch's older `parameters` when it has no `params`.
    pub fn params(&self) -> Option<&Bson> {
        use crate::schema::task::{LEGACY_PARAMS, PARAMS};
        self.raw.get(PARAMS).or_else(|| self.raw.get(LEGACY_PARAMS))
    }
}

/// A stored task's id, when it is an ObjectId (claim reads only return such tasks).
pub fn task_id(task: &Document) -> Option<ObjectId> {
    task.get_object_id(crate::schema::task::ID).ok()
}

/// The concurrency key slot a stored task holds (one waiting for its retry keeps it): its key
/// and slot, when both are readable.
pub fn held_key_slot(task: &Document) -> Option<(&Bson, u32)> {
    use crate::schema::task::{CONCURRENCY_KEY, CONCURRENCY_SLOT};
    let slot = match task.get(CONCURRENCY_SLOT)? {
        Bson::Int64(s) => u32::try_from(*s).ok()?,
        Bson::Int32(s) => u32::try_from(*s).ok()?,
        _ => return None,
    };
    Some((task.get(CONCURRENCY_KEY)?, slot))
}

/// A stored task's status code, read from any number type (ops write doubles by hand).
pub fn status_code(task: &Document) -> Option<i64> {
    match task.get(crate::schema::task::STATUS)? {
        Bson::Int32(n) => Some(i64::from(*n)),
        Bson::Int64(n) => Some(*n),
        Bson::Double(n) => Some(*n as i64),
        _ => None,
    }
}
