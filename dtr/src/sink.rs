//! Who stores an attempt's result: the node that handed the task over, the worker host's
//! batch writer, or this runner itself, which is also where the first two hand it back.

use std::time::Duration;

use disbatch_model::wire::relay::{Ack, Completion};

use crate::node_link::{LiveRelay, NodeLink};
use crate::worker::batch::BatchWriter;

/// Where the attempt's record and result go first.
pub enum ResultSink<'a> {
    /// The node that handed the task over stores them (in batches, on its own connections).
    Node(&'a mut NodeLink),
    /// The worker host's batch writer stores them with the results of its other tasks.
    Host(&'a BatchWriter),
    /// This runner writes them itself.
    Direct,
}

impl ResultSink<'_> {
    /// Where the running task's live output copies go besides its own writes: the node, when
    /// `live` (the handoff said it takes them).
    pub(crate) fn live_relay(&self, live: bool) -> Option<LiveRelay> {
        match self {
            ResultSink::Node(link) if live => Some(link.live_relay()),
            _ => None,
        }
    }

    /// Offers the ended attempt. `RecordYourself` whenever it stays with this runner: a
    /// `Direct` sink, a result the sink cannot carry (`completion` None), or a sink that
    /// said so, was gone, or was silent past `patience`.
    pub(crate) async fn offer(self, completion: Option<Completion>, patience: Duration) -> Ack {
        match (self, completion) {
            (ResultSink::Node(link), Some(c)) => link.report(&c, patience).await,
            (ResultSink::Host(batch), Some(c)) => batch.report(c).await,
            (ResultSink::Direct, _) | (_, None) => Ack::RecordYourself,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::os::unix::net::UnixStream;

    use bson::oid::ObjectId;
    use bson::DateTime;
    use disbatch_model::task::{AttemptEnd, AttemptRecord, Outcome, TaskEnd};

    use super::*;

    fn completion() -> Completion {
        Completion {
            record: AttemptRecord {
                id: ObjectId::new(),
                task: ObjectId::new(),
                queue: None,
                node: "n1".into(),
                pid: 7,
                start: DateTime::now(),
                end: AttemptEnd {
                    outcome: Outcome::Succeeded,
                    status: Some(1),
                    exit_code: Some(0),
                    signal: None,
                    result: None,
                    reason: None,
                    task_discarded: false,
                    output_file: None,
                },
            },
            end: TaskEnd::Status(1),
            stdout: "out".into(),
            stderr: String::new(),
        }
    }

    /// A node link and the node's end of its answer pipe.
    fn node() -> (
        NodeLink,
        tokio::sync::mpsc::Receiver<bson::Document>,
        UnixStream,
    ) {
        let (ours, theirs) = UnixStream::pair().expect("a socket pair");
        let (link, frames) = NodeLink::over(std::fs::File::from(std::os::fd::OwnedFd::from(ours)));
        (link, frames, theirs)
    }

    const PATIENCE: Duration = Duration::from_millis(200);

    #[tokio::test]
    async fn a_direct_sink_or_a_result_the_node_cannot_carry_stays_with_the_runner() {
        let ack = ResultSink::Direct.offer(Some(completion()), PATIENCE).await;
        assert_eq!(ack, Ack::RecordYourself);
        let (mut link, mut frames, _node) = node();
        let ack = ResultSink::Node(&mut link).offer(None, PATIENCE).await;
        assert_eq!(ack, Ack::RecordYourself);
        assert!(frames.try_recv().is_err(), "nothing was sent to the node");
    }

    #[tokio::test]
    async fn the_nodes_answer_stands_and_its_silence_leaves_the_result_to_the_runner() {
        let (mut link, mut frames, mut node) = node();
        let sent = completion();
        let mut answer = Vec::new();
        Ack::NotOurs
            .encode()
            .to_writer(&mut answer)
            .expect("an answer");
        node.write_all(&answer).expect("answered");
        let ack = ResultSink::Node(&mut link)
            .offer(Some(sent.clone()), PATIENCE)
            .await;
        assert_eq!(ack, Ack::NotOurs);
        assert_eq!(frames.recv().await, Some(sent.encode()));

        let ack = ResultSink::Node(&mut link)
            .offer(Some(completion()), PATIENCE)
            .await;
        assert_eq!(ack, Ack::RecordYourself, "the node did not answer in time");
        assert!(frames.recv().await.is_some());
        // The read that timed out waits on a blocking thread until the pipe closes.
        drop(node);
    }
}
