//! What the executor keeps of its runners: a live runner, one that exited, how an attempt
//! ended, and the worker host's handle.

use std::time::{Duration, Instant};

use bson::oid::ObjectId;
use bson::Document;
use disbatch_model::task::Outcome;
use tokio::sync::mpsc;

/// A runner this process started (or a task handed to its worker host), while it lives.
#[derive(Debug, Clone)]
pub(crate) struct Live {
    pub task: ObjectId,
    pub pid: u32,
    pub queue: ObjectId,
    pub slot: Option<u32>,
    pub attempt: ObjectId,
    pub started: Instant,
    /// Run by the worker host of this pid, not by a runner of its own.
    pub hosted: bool,
}

/// A runner that exited: the slot it held is free (unless another node took the task).
#[derive(Debug, Clone)]
pub struct Exited {
    pub task: ObjectId,
    pub queue: ObjectId,
    pub slot: Option<u32>,
    pub ran_for: Duration,
    /// The runner process exited 0 (it recorded a result, which may be a failure).
    pub success: bool,
    /// How the attempt ended; None: this node could not learn it.
    pub outcome: Option<Outcome>,
    /// The attempt's end discarded its task (its retry policy out of attempts).
    pub discarded: bool,
    /// The attempt queued a retry claimable from this time (the fleet's), as far as the node
    /// learned it.
    pub retry_at: Option<bson::DateTime>,
}

/// How an attempt ended, as its node learned it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LearnedEnd {
    /// None: the node could not learn it (its metric label is `unknown`).
    pub outcome: Option<Outcome>,
    /// The attempt's end discarded its task (its retry policy out of attempts).
    pub task_discarded: bool,
    /// The attempt queued a retry claimable from this time.
    pub retry_at: Option<bson::DateTime>,
}

impl LearnedEnd {
    pub const UNKNOWN: LearnedEnd = LearnedEnd {
        outcome: None,
        task_discarded: false,
        retry_at: None,
    };

    pub const fn plain(outcome: Outcome) -> LearnedEnd {
        LearnedEnd {
            outcome: Some(outcome),
            task_discarded: false,
            retry_at: None,
        }
    }
}

/// A running host: its pid and the sender of frames to its stdin.
#[derive(Debug)]
pub struct HostHandle {
    pub(crate) pid: u32,
    pub(crate) frames: mpsc::UnboundedSender<Document>,
}
