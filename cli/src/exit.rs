//! Exit statuses by class of failure, so a script can tell a mistake in its command from a
//! missing task, a conflict, an outage or a server fault.

use std::fmt;

use reqwest::{Method, StatusCode};
use serde_json::Value;

/// Anything not below: a local file that cannot be read, a reply that makes no sense.
pub const OTHER: u8 = 1;
/// The command line, or a request made from it, is wrong (clap's own status for usage).
pub const USAGE: u8 = 2;
/// No such task, queue, node or route (404).
pub const NOT_FOUND: u8 = 3;
/// The request conflicts with the current state (409): already paused, still running, live.
pub const CONFLICT: u8 = 4;
/// No answer from the server: refused, unresolvable, timed out.
pub const UNREACHABLE: u8 = 5;
/// The server failed (5xx).
pub const SERVER_ERROR: u8 = 6;
/// The server refused the credentials or the role (401, 403).
pub const ACCESS_DENIED: u8 = 7;
/// `graph|batch ID --wait`: it ended with a task that did not succeed (failed, terminated,
/// orphaned, or cancelled because what it waited on failed; for a batch, its callback too).
pub const WORKFLOW_FAILED: u8 = 8;
/// `graph|batch ID --wait`: it ended because it was cancelled.
pub const WORKFLOW_CANCELLED: u8 = 9;

/// `create-task`, `create-tasks`: some inputs were duplicates of live tasks (the queue's
/// `unique`) and were not created; the rest were. Not a failure of the command, but a
/// script must be able to tell "made" from "already there" without parsing the output.
pub const DUPLICATES: u8 = 10;

/// Inputs that were not created as duplicates of live tasks; the output lists them.
#[derive(Debug)]
pub struct Duplicates {
    pub duplicates: u64,
    pub inputs: u64,
}

impl std::fmt::Display for Duplicates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} of {} not created: duplicates of live tasks (the queue's unique)",
            self.duplicates,
            match self.inputs {
                1 => "1 task".to_string(),
                n => format!("{n} tasks"),
            }
        )
    }
}

impl std::error::Error for Duplicates {}

/// A waited-for graph or batch ended without success: not a failure of the command, but a
/// script must be able to tell it apart from success and from the other classes.
#[derive(Debug)]
pub struct WorkflowEnded {
    pub message: String,
    pub cancelled: bool,
}

impl std::fmt::Display for WorkflowEnded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for WorkflowEnded {}

/// A mistake in the command's own arguments, found before anything is sent.
#[derive(Debug)]
pub struct UsageError(pub String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// A usage error with `message`.
pub fn usage(message: impl Into<String>) -> anyhow::Error {
    UsageError(message.into()).into()
}

/// The exit status for `e`, by the first cause in its chain that has a class.
pub fn status_for(e: &anyhow::Error) -> u8 {
    for cause in e.chain() {
        if let Some(http) = cause.downcast_ref::<HttpError>() {
            return for_http(http.status);
        }
        if cause.is::<Unreachable>() {
            return UNREACHABLE;
        }
        if cause.is::<Duplicates>() {
            return DUPLICATES;
        }
        if let Some(ended) = cause.downcast_ref::<WorkflowEnded>() {
            return if ended.cancelled {
                WORKFLOW_CANCELLED
            } else {
                WORKFLOW_FAILED
            };
        }
        // Only arguments and input files are parsed with serde_json's errors kept as a
        // cause; a server reply that is not JSON is reported without one.
        if cause.is::<UsageError>() || cause.is::<serde_json::Error>() {
            return USAGE;
        }
    }
    OTHER
}

fn for_http(status: StatusCode) -> u8 {
    match status.as_u16() {
        404 | 410 => NOT_FOUND,
        409 => CONFLICT,
        401 | 403 => ACCESS_DENIED,
        400 | 405 | 411 | 413 | 414 | 415 | 422 => USAGE,
        500..=599 => SERVER_ERROR,
        _ => OTHER,
    }
}

/// A non-2xx response. Kept as a type so `--json` can still print the server's JSON body.
#[derive(Debug)]
pub struct HttpError {
    pub method: Method,
    pub url: String,
    pub status: StatusCode,
    pub message: String,
    pub body: Option<Value>,
}

impl fmt::Display for HttpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: {}", self.method, self.url, self.status)?;
        if !self.message.is_empty() {
            write!(f, ": {}", self.message)?;
        }
        Ok(())
    }
}

impl std::error::Error for HttpError {}

/// The server could not be reached: no connection, no name, or no answer in time.
#[derive(Debug)]
pub struct Unreachable(pub String);

impl fmt::Display for Unreachable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Unreachable {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_statuses_map_to_classes() {
        assert_eq!(for_http(StatusCode::NOT_FOUND), NOT_FOUND);
        assert_eq!(for_http(StatusCode::CONFLICT), CONFLICT);
        assert_eq!(for_http(StatusCode::FORBIDDEN), ACCESS_DENIED);
        assert_eq!(for_http(StatusCode::BAD_REQUEST), USAGE);
        assert_eq!(for_http(StatusCode::SERVICE_UNAVAILABLE), SERVER_ERROR);
        assert_eq!(for_http(StatusCode::IM_A_TEAPOT), OTHER);
    }

    #[test]
    fn causes_are_found_through_context() {
        use anyhow::Context;
        let e = Err::<(), _>(usage("odd pairs"))
            .context("update-queue")
            .unwrap_err();
        assert_eq!(status_for(&e), USAGE);
        let bad: Result<serde_json::Value, _> = serde_json::from_str("{");
        let e = bad.context("invalid JSON argument").unwrap_err();
        assert_eq!(status_for(&e), USAGE);
        let e = anyhow::Error::new(Unreachable("GET x: connection refused".into()));
        assert_eq!(status_for(&e), UNREACHABLE);
        assert_eq!(status_for(&anyhow::anyhow!("other")), OTHER);
        let ended = |cancelled| {
            anyhow::Error::new(WorkflowEnded {
                message: "graph x failed".into(),
                cancelled,
            })
        };
        let dup = anyhow::Error::new(Duplicates {
            duplicates: 1,
            inputs: 3,
        });
        assert_eq!(
            dup.to_string(),
            "1 of 3 tasks not created: duplicates of live tasks (the queue's unique)"
        );
        assert_eq!(status_for(&dup), DUPLICATES);
        assert_eq!(status_for(&ended(false)), WORKFLOW_FAILED);
        assert_eq!(status_for(&ended(true)), WORKFLOW_CANCELLED);
    }
}
