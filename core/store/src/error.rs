//! The library's error type: every failure the core can report, with messages fit for an operator.

use std::path::PathBuf;

/// Errors from config loading, the store and output handling.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The config file could not be read, parsed or validated.
    #[error("config file {}: {message}", path.display())]
    Config { path: PathBuf, message: String },

    /// A MongoDB operation failed. The driver's error is kept whole for code that tells
    /// failures apart, but shown as one readable line (no `Kind: …, labels: {}` dump), and is
    /// not the error's `source`: `{:#}` chains would print the dump again.
    #[error("MongoDB {context}: {}", crate::driver_error::describe(driver))]
    Mongo {
        context: String,
        driver: mongodb::error::Error,
    },

    /// A document in the database does not have the shape the schema requires.
    #[error("bad {collection} document {id}: {message}")]
    BadDocument {
        collection: &'static str,
        id: String,
        message: String,
    },

    /// A local file (spooled output, result file) could not be read or written.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },

    /// Input from a caller (an id, a name) is not valid.
    #[error("{0}")]
    Invalid(String),
}

impl Error {
    /// Wraps a driver error with what we were doing, so logs say which operation failed.
    pub fn mongo(context: impl Into<String>, source: mongodb::error::Error) -> Self {
        Error::Mongo {
            context: context.into(),
            driver: source,
        }
    }

    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }

    /// True when the failure is a unique-index violation (E11000), which claims use as a signal.
    pub fn is_duplicate_key(&self) -> bool {
        match self {
            Error::Mongo { driver: source, .. } => crate::driver_error::is_duplicate_key(source),
            _ => false,
        }
    }

    /// For a unique-index refusal: the server's E11000 message as Disbatch reported it, or a
    /// plain "E11000 duplicate key error" when the server gave none.
    pub fn duplicate_key_message(&self) -> String {
        match self {
            Error::Mongo { driver: source, .. } => {
                crate::driver_error::duplicate_key_message(source)
            }
            _ => None,
        }
        .unwrap_or_else(|| "E11000 duplicate key error".to_string())
    }

    /// What we were doing and the server's own short message, for an error the server
    /// answered with; otherwise the whole error. Fit for a client: no reply dumps.
    pub fn short(&self) -> String {
        match self {
            Error::Mongo {
                context,
                driver: source,
            } => match crate::driver_error::server_message(source) {
                Some(message) => format!("MongoDB {context}: {message}"),
                None => format!("MongoDB {context}: {}", self.unavailable_reason()),
            },
            other => other.to_string(),
        }
    }

    /// Why the database could not serve a request, without addresses or server replies:
    /// what a client may be told (the log gets the whole error).
    pub fn unavailable_reason(&self) -> &'static str {
        match self {
            Error::Mongo { driver: source, .. } => crate::driver_error::unavailable_reason(source),
            _ => "the database failed",
        }
    }

    /// True when MongoDB (or the driver before sending) refused a document over 16 MiB.
    pub fn is_document_too_large(&self) -> bool {
        match self {
            Error::Mongo { driver: source, .. } => {
                crate::driver_error::is_document_too_large(source)
            }
            _ => false,
        }
    }

    /// True when the driver could not encode the request at all (a field name with a NUL
    /// byte, a value BSON cannot hold): the same request can never succeed, so it is not an
    /// outage to wait out.
    pub fn is_unencodable(&self) -> bool {
        match self {
            Error::Mongo { driver, .. } => matches!(
                driver.kind.as_ref(),
                mongodb::error::ErrorKind::BsonSerialization(_)
            ),
            _ => false,
        }
    }

    /// The server's reason when it answered and refused the request itself (a filter, a
    /// namespace or a document it will not take), as opposed to being unreachable or busy:
    /// asking again will not help, and other requests are not affected.
    pub fn refusal(&self) -> Option<String> {
        match self {
            Error::Mongo { driver: source, .. } => crate::driver_error::refusal(source),
            _ => None,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<disbatch_config::error::Error> for Error {
    fn from(e: disbatch_config::error::Error) -> Self {
        match e {
            disbatch_config::error::Error::Config { path, message } => {
                Error::Config { path, message }
            }
            disbatch_config::error::Error::Invalid(message) => Error::Invalid(message),
        }
    }
}
