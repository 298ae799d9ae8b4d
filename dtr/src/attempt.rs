//! One attempt as the runner carries it: what it runs as (`Run`), how its plugin ended
//! (`Ending`), what became of it (`Ran`), and the facts its record keeps (`RunFacts`).

use bson::oid::ObjectId;
use bson::Document;
use disbatch_config::Config;
use disbatch_store::StoredOutput;

use crate::connection::LazyStore;
use crate::node_link::LiveRelay;
use crate::outcome::Exit;
use crate::record::Finished;
use crate::supervisor::Stopped;
use crate::worker::Pool;

/// How the plugin process ended and what its result file said, for the attempt record.
#[derive(Debug, Default)]
pub(crate) struct RunFacts {
    pub exit: Option<Exit>,
    pub result: Option<Document>,
    /// The result's `output` as JSON text, too large for the record: the runner writes it to
    /// GridFS before the record, which then names the file (`output_file`).
    pub spilled_output: Option<Vec<u8>>,
    pub output_file: Option<StoredOutput>,
    /// The queue to chain into and the units the result's `output` names, when both exist.
    pub chain: Option<(String, Vec<disbatch_store::Unit>)>,
    /// How the supervisor ended the run, when it was not a plain exit.
    pub stopped: Option<Stopped>,
    /// Why the attempt ended so and what follows (a retry, a discard), for its record.
    pub reason: Option<String>,
    /// The attempt's end discarded the task.
    pub task_discarded: bool,
}

impl RunFacts {
    /// The facts of a run that never started, with the reason.
    pub(crate) fn because(reason: String) -> RunFacts {
        RunFacts {
            reason: Some(reason),
            ..RunFacts::default()
        }
    }
}

/// A run that has a result to record, or one whose task was taken away meanwhile.
pub(crate) enum Ran {
    Finished(Box<Finished>, RunFacts),
    LeaseLost(RunFacts),
}

/// The attempt being run and where it is recorded.
#[derive(Clone, Copy)]
pub(crate) struct Run<'a> {
    pub store: &'a LazyStore,
    pub config: &'a Config,
    pub task: ObjectId,
    pub attempt: ObjectId,
    pub attempts: i64,
    pub node: &'a str,
    /// Live output copies go to the node (the handoff said it takes them).
    pub live_relay: Option<&'a LiveRelay>,
    /// The persistent workers a worker host lends its attempts; None: plugins run as
    /// processes of their own.
    pub workers: Option<&'a Pool>,
}

/// How a run ended, as its supervisor saw it.
pub(crate) struct Ending {
    pub stopped: Stopped,
    /// What the plugin gave as its result (the result file, a worker's `done`).
    pub result: Option<Vec<u8>>,
    /// Why the result was not trusted, when it was not.
    pub refused: Option<String>,
    /// The supervisor's own account, when the plugin did not end as plugins should (a
    /// worker that died or broke the protocol): it leads the task's stderr note.
    pub lead: Option<String>,
    /// The queue's `on_lost: requeue` applies: the task goes back to the queue.
    pub requeue: bool,
}
