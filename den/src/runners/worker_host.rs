//! The node's side of its worker host (plugins/PROTOCOL.md, dtr/src/worker/host.rs): started
//! lazily in its own session for the first persistent-queue task, fed handoffs over its
//! stdin, and read for ended tasks on its stdout. Retired (stdin closed: it drains) on a
//! config reload; a host that dies has its tasks recovered as a dead runner's are.

use std::os::unix::process::ExitStatusExt;
use std::process::Stdio;

use bson::oid::ObjectId;
use bson::{doc, Document};
use disbatch_config::process::isolation::CloexecRanges;
use disbatch_model::wire::handoff::host_frame::{self, WAKE};
use disbatch_model::wire::handoff::Handoff;
use disbatch_model::wire::relay::{read_frame, write_frames};
use tokio::io::BufReader;
use tokio::process::{ChildStdout, Command};
use tokio::sync::mpsc;

use crate::runners::executor::Executor;
use crate::runners::live::{HostHandle, LearnedEnd, Live};

/// At most this many frames to the host in one write.
const FRAMES_PER_WRITE: usize = 64;

impl Executor {
    /// Hands a claimed task of a persistent queue to this node's worker host, starting one
    /// first if there is none (or it died).
    pub(crate) fn hand_to_host(&self, handoff: &Handoff, slot: Option<u32>) -> std::io::Result<()> {
        let task = handoff.task_id();
        let queue = handoff
            .queue_id()
            .ok_or_else(|| std::io::Error::other("the claimed task has no queue id"))?;
        let frame = host_frame(handoff);
        let mut host = self
            .host
            .lock()
            .map_err(|_| std::io::Error::other("the worker host's lock is poisoned"))?;
        let alive = host.as_ref().is_some_and(|h| !h.frames.is_closed());
        if !alive {
            *host = Some(self.start_host()?);
        }
        let Some(handle) = host.as_ref() else {
            return Err(std::io::Error::other("no worker host"));
        };
        // Registered before the frame goes: the host may report it ended at once.
        if let Ok(mut live) = self.live.lock() {
            live.insert(
                handoff.attempt,
                Live {
                    task,
                    pid: handle.pid,
                    queue,
                    slot,
                    attempt: handoff.attempt,
                    started: std::time::Instant::now(),
                    hosted: true,
                },
            );
        }
        if handle.frames.send(frame).is_err() {
            if let Ok(mut live) = self.live.lock() {
                live.remove(&handoff.attempt);
            }
            return Err(std::io::Error::other("the worker host is gone"));
        }
        tracing::debug!(task = %task, host = handle.pid, "handed the task to the worker host");
        Ok(())
    }

    /// Tells the host to renew `task`'s lease now (a cancel request was seen).
    pub(crate) fn wake_hosted(&self, task: ObjectId) {
        if let Ok(Some(host)) = self.host.lock().as_deref() {
            let _ = host.frames.send(doc! {WAKE: task});
        }
    }

    /// Closes the current host's stdin: it takes no new task, finishes those it runs (their
    /// ends still reach this node), stops its workers and exits.
    pub fn retire_host(&self) {
        let old = self.host.lock().ok().and_then(|mut h| h.take());
        if let Some(old) = old {
            tracing::info!(host = old.pid, "retiring the worker host; it drains");
        }
    }

    fn start_host(&self) -> std::io::Result<HostHandle> {
        let (runner, config, node) = self.runner_command();
        let mut cmd = Command::new(runner);
        cmd.arg("--config")
            .arg(config)
            .arg("--node")
            .arg(node)
            .arg("--worker-host")
            .env_clear()
            .envs(self.runner_env().iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(false);
        let private = CloexecRanges::above_stderr_except(None);
        // SAFETY: setsid and close_range are async-signal-safe and touch no memory.
        unsafe {
            cmd.pre_exec(move || {
                // Its own session, as a runner's: a restart or kill of this node leaves it
                // running its tasks to their results.
                nix::unistd::setsid().map_err(std::io::Error::from)?;
                private.apply()?;
                Ok(())
            });
        }
        let mut child = cmd.spawn()?;
        let pid = child.id().unwrap_or(0);
        let (frames, mut to_send) = mpsc::unbounded_channel::<Document>();
        let mut stdin = child.stdin.take();
        tokio::spawn(async move {
            let mut burst = Vec::with_capacity(FRAMES_PER_WRITE);
            while to_send.recv_many(&mut burst, FRAMES_PER_WRITE).await > 0 {
                let Some(pipe) = stdin.as_mut() else { break };
                let written = write_frames(pipe, &burst).await;
                burst.clear();
                if let Err(e) = written {
                    tracing::warn!(host = pid, error = %e, "could not write to the worker host");
                    break;
                }
            }
            // Dropping stdin closes it: the host drains.
        });
        let stdout = child.stdout.take();
        let executor = self.clone();
        tokio::spawn(async move {
            if let Some(stdout) = stdout {
                // Buffered: a host reports ends in bursts, read in one call.
                read_ended(&executor, pid, BufReader::new(stdout)).await;
            }
            let status = match child.wait().await {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(host = pid, error = %e, "could not wait for the worker host");
                    std::process::ExitStatus::from_raw(1 << 8)
                }
            };
            executor.host_exited(pid, status).await;
        });
        tracing::info!(host = pid, "started a worker host");
        Ok(HostHandle { pid, frames })
    }

    /// A host exited: tasks it still held have no result coming; recover them at once.
    async fn host_exited(&self, pid: u32, status: std::process::ExitStatus) {
        if let Ok(mut host) = self.host.lock() {
            if host.as_ref().is_some_and(|h| h.pid == pid) {
                *host = None;
            }
        }
        let orphans: Vec<(ObjectId, ObjectId)> = self
            .live
            .lock()
            .map(|l| {
                l.values()
                    .filter(|r| r.hosted && r.pid == pid)
                    .map(|r| (r.task, r.attempt))
                    .collect()
            })
            .unwrap_or_default();
        if status.success() && orphans.is_empty() {
            tracing::info!(host = pid, "worker host exited");
            return;
        }
        tracing::warn!(host = pid, %status, tasks = orphans.len(), "worker host exited holding tasks");
        for (task, attempt) in orphans {
            let outcome = match &self.deaths {
                Some(deaths) => {
                    let exit = format!("worker host {status}");
                    deaths.runner_died(task, attempt, &exit, None).await
                }
                None => None,
            };
            self.task_ended(task, attempt, false, outcome.unwrap_or(LearnedEnd::UNKNOWN));
        }
    }
}

/// Reads the host's reports until it closes its stdout.
async fn read_ended(executor: &Executor, pid: u32, mut stdout: BufReader<ChildStdout>) {
    loop {
        match read_frame(&mut stdout).await {
            Ok(Some(d)) => {
                let Some(ended) = host_frame::Ended::from_document(&d) else {
                    tracing::warn!(
                        host = pid,
                        "an unreadable report from the worker host was skipped"
                    );
                    continue;
                };
                let outcome = LearnedEnd {
                    outcome: ended.outcome,
                    task_discarded: ended.task_discarded,
                    retry_at: ended.retry_at,
                };
                executor.task_ended(ended.task, ended.attempt, true, outcome);
            }
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(host = pid, error = %e, "the worker host's reports cannot be read");
                return;
            }
        }
    }
}

/// The frame that hands a task to the worker host: the handoff a runner would read, in the
/// same shape, but with the results left to the host (no relay, no live copies). It carries
/// the node's latest clock reading (the host is long-lived) and, for a rate-limited queue,
/// when the limit granted the start, at which the attempt's record starts.
fn host_frame(handoff: &Handoff) -> Document {
    Handoff {
        relay: false,
        live: false,
        ..handoff.clone()
    }
    .to_document()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The host reads the frame as a runner reads its handoff: the grant time and the clock
    /// reach it (the frame once left the grant out, and hosted attempts started at the host's
    /// "now").
    #[test]
    fn a_host_frame_carries_the_grant_and_the_clock() {
        let granted = bson::DateTime::from_millis(1_700_000_000_123);
        let handoff = Handoff {
            task: disbatch_model::task::ClaimedTask::from_document(
                doc! {"_id": ObjectId::new(), "queue": ObjectId::new(), "params": {}},
            )
            .expect("a claimed task"),
            attempt: ObjectId::new(),
            queue: doc! {"name": "q", "worker": "persistent"},
            relay: true,
            live: true,
            started_at: Some(granted),
            clock: Some(disbatch_model::fleet_time::Anchor {
                server_ms: 1_700_000_000_000,
                boot_ns: 42,
            }),
        };
        let read = Handoff::from_document(&host_frame(&handoff)).expect("a readable frame");
        assert_eq!(read.started_at, Some(granted));
        assert_eq!(read.clock, handoff.clock);
        assert_eq!(
            (read.task, read.attempt, read.queue),
            (handoff.task, handoff.attempt, handoff.queue)
        );
        assert!(!read.relay && !read.live, "the host records results itself");
    }
}
