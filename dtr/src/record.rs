//! Records a finished task: outputs inline or to GridFS per `gfs`, then the one final write.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bson::oid::ObjectId;
use disbatch_model::output::{
    dropped_output_text, plan_output, GfsMode, Placement, MAX_DOCUMENT_SIZE,
};
use disbatch_store::{Error, Result};
use disbatch_store::{FinishOutcome, OutputValue, Store, TaskEnd};

/// Spool files up to this size are read without leaving the runtime's thread.
const READ_IN_PLACE: u64 = 64 * 1024;

/// One captured stream: small enough to hold (and measure exactly), or left in its spool file.
#[derive(Debug)]
pub enum Captured {
    Text(String),
    /// Larger than any document could hold; its UTF-8 length is at least `raw_len`.
    File {
        path: PathBuf,
        raw_len: u64,
    },
}

impl Captured {
    /// Reads a spool file. Non-UTF-8 bytes become U+FFFD, which never shortens the text, so a
    /// file too big for a document stays on disk and is streamed. A spool file is a regular
    /// file in the runner's own directory: opening and measuring it, and reading it when it
    /// is small (a worker's output usually is), happen on this thread, as a thread hop would
    /// cost more than the read; a larger one is read on a blocking thread.
    pub async fn load(path: &Path) -> Result<Captured> {
        use std::io::Read;
        let context = |e| Error::io(format!("reading {}", path.display()), e);
        let mut file = crate::spool::open_read_std(path).map_err(context)?;
        let raw_len = file.metadata().map_err(context)?.len();
        if raw_len > MAX_DOCUMENT_SIZE {
            return Ok(Captured::File {
                path: path.to_path_buf(),
                raw_len,
            });
        }
        let bytes = if raw_len <= READ_IN_PLACE {
            let mut bytes = Vec::with_capacity(raw_len as usize);
            file.read_to_end(&mut bytes).map_err(context)?;
            bytes
        } else {
            tokio::task::spawn_blocking(move || {
                let mut bytes = Vec::new();
                file.read_to_end(&mut bytes).map(|_| bytes)
            })
            .await
            .map_err(|e| {
                Error::io(
                    format!("reading {}", path.display()),
                    std::io::Error::other(e),
                )
            })?
            .map_err(context)?
        };
        Ok(Captured::Text(match String::from_utf8(bytes) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        }))
    }

    pub fn from_text(text: impl Into<String>) -> Captured {
        Captured::Text(text.into())
    }

    fn len(&self) -> u64 {
        match self {
            Captured::Text(s) => s.len() as u64,
            Captured::File { raw_len, .. } => *raw_len,
        }
    }
}

/// A task's final status and captured output, ready to store.
pub struct Finished {
    pub task: ObjectId,
    pub node: String,
    /// The attempt's id: the result is written only while the task still runs as it.
    pub attempt: ObjectId,
    pub end: TaskEnd,
    pub stdout: Captured,
    pub stderr: Captured,
    /// Where the output is spooled, kept until the result is written.
    pub spool: Option<Spool>,
}

/// What holds a run's output files until its result is written.
pub enum Spool {
    /// A process plugin's own directory, removed once the result is written.
    Dir(tempfile::TempDir),
    /// The worker that ran the task: its output files are the task's until it is given back
    /// (its next task empties them), so it is lent until the result is written.
    Worker(Box<crate::worker::Lent>),
}

impl Spool {
    /// Keeps the output on disk for an operator when the result cannot be written; a worker
    /// is then retired, so its files are not emptied by another task.
    pub fn keep(self) -> PathBuf {
        match self {
            Spool::Dir(dir) => dir.keep(),
            Spool::Worker(lent) => lent.keep_output(),
        }
    }
}

/// Stores the outputs and the final status. If the server refuses the document as too large,
/// output moves to GridFS (or, with `gfs: false`, is replaced by an explanation) and the
/// write is tried again, so the task always finishes.
pub async fn record_result(store: &Store, gfs: GfsMode, done: &Finished) -> Result<FinishOutcome> {
    let mut plan = plan_output(gfs, done.stdout.len(), done.stderr.len());
    let mut stdout_file = None;
    let mut stderr_file = None;
    loop {
        let stdout = output_value(
            store,
            done,
            "stdout",
            &done.stdout,
            plan.stdout,
            &mut stdout_file,
        )
        .await?;
        let stderr = output_value(
            store,
            done,
            "stderr",
            &done.stderr,
            plan.stderr,
            &mut stderr_file,
        )
        .await?;
        let outcome = with_retries("recording the result", || {
            store.results().finish_task(
                done.task,
                &done.node,
                done.attempt,
                done.end,
                stdout.clone(),
                stderr.clone(),
            )
        })
        .await?;
        match outcome {
            FinishOutcome::TooLarge => match plan.after_too_large(gfs) {
                Some(next) => {
                    tracing::warn!(task = %done.task, "task document too large; moving output out of it");
                    plan = next;
                }
                None => {
                    return Err(Error::Invalid(format!(
                    "task {} cannot be completed: its document is too large even without output",
                    done.task
                )))
                }
            },
            other => return Ok(other),
        }
    }
}

/// The value to store for one stream, writing it to GridFS at most once.
async fn output_value(
    store: &Store,
    done: &Finished,
    name: &str,
    captured: &Captured,
    placement: Placement,
    written: &mut Option<ObjectId>,
) -> Result<OutputValue> {
    match placement {
        Placement::Inline => Ok(match captured {
            Captured::Text(s) => OutputValue::Text(s.clone()),
            // plan_output never inlines more than a document holds; be safe anyway.
            Captured::File { raw_len, .. } => {
                OutputValue::Text(dropped_output_text(name, *raw_len))
            }
        }),
        Placement::Dropped => Ok(OutputValue::Text(dropped_output_text(name, captured.len()))),
        Placement::GridFs => {
            if let Some(id) = written {
                return Ok(OutputValue::File(*id));
            }
            let info = with_retries("writing output to GridFS", || async {
                match captured {
                    Captured::Text(s) => {
                        store
                            .results()
                            .write_output_file(done.task, name, s.as_bytes())
                            .await
                    }
                    Captured::File { path, .. } => {
                        let file = crate::spool::open_read(path)
                            .await
                            .map_err(|e| Error::io(format!("opening {}", path.display()), e))?;
                        store
                            .results()
                            .write_output_file(done.task, name, file)
                            .await
                    }
                }
            })
            .await?;
            *written = Some(info.id);
            Ok(OutputValue::File(info.id))
        }
    }
}

/// How long a runner keeps trying to reach the database: a server restart or a failover
/// must not cost a finished task its result.
pub const PATIENCE: Duration = Duration::from_secs(15 * 60);
/// Longest wait between tries (before jitter, which may double it), so the result lands
/// within seconds of the server's return.
const MAX_DELAY: Duration = Duration::from_secs(5);

/// Retries database operations with capped exponential backoff and jitter for up to
/// `PATIENCE`: the runners of a fleet that lost the database do not retry in step. A request
/// the driver cannot encode fails at once: no server's return would let it through.
pub async fn with_retries<T, F, Fut>(what: &str, mut op: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let started = std::time::Instant::now();
    let mut delays =
        disbatch_config::process::backoff::Backoff::new(Duration::from_millis(100), MAX_DELAY);
    let mut attempt: u32 = 1;
    loop {
        match op().await {
            Err(e @ Error::Mongo { .. }) if started.elapsed() < PATIENCE && !e.is_unencodable() => {
                let delay = delays.next_delay();
                tracing::warn!(error = %e, attempt, retry_in = ?delay, failing_for = ?started.elapsed(), "{what} failed; retrying");
                tokio::time::sleep(delay).await;
                attempt = attempt.saturating_add(1);
            }
            Ok(v) => {
                if attempt > 1 {
                    tracing::info!(attempt, after = ?started.elapsed(), "{what} succeeded after the database came back");
                }
                return Ok(v);
            }
            other => return other,
        }
    }
}
