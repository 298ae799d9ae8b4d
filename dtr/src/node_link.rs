//! The pipes to the node that started this runner: the handoff arrives on stdin, live
//! output copies and then the ended attempt go back on stdout, and the node's answer arrives
//! on `ANSWER_FD` once stored.

use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::fs::FileTypeExt;
use std::time::Duration;

use bson::Document;
use disbatch_model::wire::handoff::Handoff;
use disbatch_model::wire::relay::{read_frame, write_frame, Ack, Completion, LiveCopy, ANSWER_FD};
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::{mpsc, oneshot};

/// Frames waiting for stdout: a live copy that finds it full is skipped (the next one, a
/// second later, holds everything it held).
const PENDING_FRAMES: usize = 2;

/// Reads the one frame the node writes on stdin before closing it.
pub async fn read_handoff() -> Result<Handoff, String> {
    let frame = read_frame(&mut tokio::io::stdin())
        .await
        .map_err(|e| format!("reading the handoff from stdin: {e}"))?
        .ok_or("stdin closed before the node handed over a task")?;
    Handoff::from_document(&frame)
}

/// A frame for the node, and who waits to know it was written.
struct Outgoing {
    frame: Document,
    written: Option<oneshot::Sender<std::io::Result<()>>>,
}

pub struct NodeLink {
    frames: mpsc::Sender<Outgoing>,
    answers: tokio::fs::File,
}

/// Sends the running task's live copies to the node; clones share the pipe.
#[derive(Clone)]
pub struct LiveRelay {
    frames: mpsc::Sender<Outgoing>,
}

impl LiveRelay {
    /// Queues a copy for the node; false once the node no longer listens (the caller then
    /// writes its own copies).
    pub fn send(&self, copy: &LiveCopy) -> bool {
        let frame = Outgoing {
            frame: copy.encode(),
            written: None,
        };
        !matches!(self.frames.try_send(frame), Err(TrySendError::Closed(_)))
    }

    /// Whether the node is known to be gone: a write to it failed.
    pub fn is_closed(&self) -> bool {
        self.frames.is_closed()
    }
}

/// Owns stdout: frames go out whole, in order, however their senders are stopped. The first
/// failed write ends it (the node is gone), which senders see as a closed channel.
async fn write_frames(mut frames: mpsc::Receiver<Outgoing>) {
    let mut stdout = tokio::io::stdout();
    while let Some(out) = frames.recv().await {
        let wrote = write_frame(&mut stdout, &out.frame).await;
        let failed = wrote.is_err();
        if let Some(w) = out.written {
            let _ = w.send(wrote);
        }
        if failed {
            return;
        }
    }
}

impl NodeLink {
    /// Takes over the answer pipe the node opened as `ANSWER_FD`, closing that number so the
    /// plugin cannot inherit it. None when there is no pipe there (a node that promised one
    /// and did not): the runner then stores its own result.
    pub fn open() -> Option<NodeLink> {
        // SAFETY: only borrowed for the duration of one dup; a closed descriptor makes the
        // dup fail with EBADF.
        let borrowed = unsafe { BorrowedFd::borrow_raw(ANSWER_FD) };
        let owned: OwnedFd = borrowed.try_clone_to_owned().ok()?;
        let file = std::fs::File::from(owned);
        let is_pipe = file.metadata().is_ok_and(|m| m.file_type().is_fifo());
        if !is_pipe {
            tracing::warn!(
                fd = ANSWER_FD,
                "the node's answer pipe is missing; storing the result here"
            );
            return None;
        }
        // SAFETY: ANSWER_FD is the node's pipe (checked above through our copy); nothing in
        // this process owns that number.
        unsafe { nix::libc::close(ANSWER_FD) };
        let (frames, pending) = mpsc::channel(PENDING_FRAMES);
        tokio::spawn(write_frames(pending));
        Some(NodeLink {
            frames,
            answers: tokio::fs::File::from_std(file),
        })
    }

    /// For sending live copies while the task runs (when the handoff says the node takes
    /// them).
    pub fn live_relay(&self) -> LiveRelay {
        LiveRelay {
            frames: self.frames.clone(),
        }
    }

    /// Hands the ended attempt to the node and waits up to `patience` for its answer. A node
    /// that is gone, silent or garbled leaves the result to this runner: every write of it is
    /// fenced on the attempt, so the node's late write and the runner's cannot both count.
    pub async fn report(&mut self, completion: &Completion, patience: Duration) -> Ack {
        let task = completion.task();
        let (written, wrote) = oneshot::channel();
        let out = Outgoing {
            frame: completion.encode(),
            written: Some(written),
        };
        let wrote = match self.frames.send(out).await {
            Ok(()) => wrote
                .await
                .unwrap_or_else(|_| Err(std::io::Error::other("the writer stopped"))),
            Err(_) => Err(std::io::Error::other("an earlier write failed")),
        };
        if let Err(e) = wrote {
            tracing::info!(task = %task, error = %e, "the node is not listening; recording the result here");
            return Ack::RecordYourself;
        }
        match tokio::time::timeout(patience, read_frame(&mut self.answers)).await {
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

#[cfg(test)]
impl NodeLink {
    /// A link whose frames arrive on the returned receiver (each one written at once) and
    /// whose answers are read from `answers`.
    pub(crate) fn over(answers: std::fs::File) -> (NodeLink, mpsc::Receiver<Document>) {
        let (frames, mut pending) = mpsc::channel::<Outgoing>(PENDING_FRAMES);
        let (sent, received) = mpsc::channel(PENDING_FRAMES);
        tokio::spawn(async move {
            while let Some(out) = pending.recv().await {
                let _ = sent.send(out.frame).await;
                if let Some(w) = out.written {
                    let _ = w.send(Ok(()));
                }
            }
        });
        let answers = tokio::fs::File::from_std(answers);
        (NodeLink { frames, answers }, received)
    }
}
