//! The pipes to the node that started this runner: the handoff arrives on stdin, the ended
//! attempt goes back on stdout, and the node's answer arrives on stdin once it is stored.

use std::time::Duration;

use disbatch_core::handoff::Handoff;
use disbatch_core::relay::{read_frame, write_frame, Ack, Completion};
use tokio::io::{Stdin, Stdout};

pub struct NodeLink {
    stdin: Stdin,
    stdout: Stdout,
}

impl NodeLink {
    pub fn open() -> NodeLink {
        NodeLink {
            stdin: tokio::io::stdin(),
            stdout: tokio::io::stdout(),
        }
    }

    /// The node writes exactly one frame, then keeps the pipe open only when it relays.
    pub async fn read_handoff(&mut self) -> Result<Handoff, String> {
        let frame = read_frame(&mut self.stdin)
            .await
            .map_err(|e| format!("reading the handoff from stdin: {e}"))?
            .ok_or("stdin closed before the node handed over a task")?;
        Handoff::from_document(&frame)
    }

    /// Hands the ended attempt to the node and waits up to `patience` for its answer. A node
    /// that is gone, silent or garbled leaves the result to this runner: every write of it is
    /// fenced on the attempt, so the node's late write and the runner's cannot both count.
    pub async fn report(&mut self, completion: &Completion, patience: Duration) -> Ack {
        let task = completion.task();
        if let Err(e) = write_frame(&mut self.stdout, &completion.encode()).await {
            tracing::info!(task = %task, error = %e, "the node is not listening; recording the result here");
            return Ack::RecordYourself;
        }
        match tokio::time::timeout(patience, read_frame(&mut self.stdin)).await {
            Ok(Ok(Some(answer))) => Ack::decode(&answer),
            Ok(Ok(None)) => {
                tracing::info!(task = %task, "the node went away before storing the result; recording it here");
                Ack::RecordYourself
            }
            Ok(Err(e)) => {
                tracing::warn!(task = %task, error = %e, "unreadable answer from the node; recording the result here");
                Ack::RecordYourself
            }
            Err(_) => {
                tracing::warn!(task = %task, ?patience, "the node did not store the result in time; recording it here");
                Ack::RecordYourself
            }
        }
    }
}
