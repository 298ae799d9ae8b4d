//! The pipes to the node that started this runner: the handoff arrives on stdin, the ended
//! attempt goes back on stdout, and the node's answer arrives on `ANSWER_FD` once stored.

use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::fs::FileTypeExt;
use std::time::Duration;

use disbatch_core::handoff::Handoff;
use disbatch_core::relay::{read_frame, write_frame, Ack, Completion, ANSWER_FD};
use tokio::io::Stdout;

/// Reads the one frame the node writes on stdin before closing it.
pub async fn read_handoff() -> Result<Handoff, String> {
    let frame = read_frame(&mut tokio::io::stdin())
        .await
        .map_err(|e| format!("reading the handoff from stdin: {e}"))?
        .ok_or("stdin closed before the node handed over a task")?;
    Handoff::from_document(&frame)
}

pub struct NodeLink {
    stdout: Stdout,
    answers: tokio::fs::File,
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
        Some(NodeLink {
            stdout: tokio::io::stdout(),
            answers: tokio::fs::File::from_std(file),
        })
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
