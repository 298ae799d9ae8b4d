//! The client's errors.

use bson::oid::ObjectId;

/// What can go wrong enqueuing or reading a task.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request did not get an answer (connection, timeout, TLS).
    #[error("{context}: {source}")]
    Http {
        context: String,
        #[source]
        source: reqwest::Error,
    },
    /// The DCI answered with an error status; `message` is its `error` text.
    #[error("HTTP {status}: {message}")]
    Api { status: u16, message: String },
    /// The queue has `unique` and a task holding the same key exists (`matched`, when known).
    #[error("queue {queue:?} is unique and {} already holds this key", match .matched { Some(id) => format!("task {id}"), None => "another task".to_string() })]
    DuplicateTask {
        queue: String,
        matched: Option<ObjectId>,
    },
    /// No queue has the name given.
    #[error("no queue named {0:?}")]
    QueueNotFound(String),
    /// `wait` gave up before the task ended.
    #[error("task {id} did not end in time (status {status:?})")]
    TimedOut { id: ObjectId, status: Option<i64> },
    /// A database operation of the direct path failed.
    #[error("{context}: {source}")]
    Mongo {
        context: String,
        #[source]
        source: mongodb::error::Error,
    },
    /// The caller's input, refused before anything was sent.
    #[error("{0}")]
    Invalid(String),
    /// An answer this client cannot read.
    #[error("{0}")]
    Unexpected(String),
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub(crate) fn mongo(context: impl Into<String>, source: mongodb::error::Error) -> Error {
        Error::Mongo {
            context: context.into(),
            source,
        }
    }
}
