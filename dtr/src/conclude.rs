//! Turns how a run ended (a process's or a worker's) into the task's end, its retry or
//! chaining, and its captured output with the runner's notes.

use std::time::Duration;

use bson::oid::ObjectId;
use bson::DateTime;
use disbatch_model::fleet_time;
use disbatch_model::retry_policy::FailureKind;
use disbatch_model::status;
use disbatch_store::TaskEnd;
use disbatch_store::{Error, Result};

use crate::attempt::{Ending, Ran, Run, RunFacts};
use crate::outcome::Exit;
use crate::outcome::{decide, Verdict};
use crate::prepare::Prepared;
use crate::record::{Captured, Finished, Spool};
use crate::spool::SpoolPaths;
use crate::supervisor::Stopped;

/// The facts of a run whose task was recovered elsewhere meanwhile.
pub(crate) fn lease_lost(exit: Exit, stopped: Stopped) -> RunFacts {
    RunFacts {
        exit: Some(exit),
        stopped: Some(stopped),
        ..RunFacts::default()
    }
}

/// Results longer than this are judged off the runtime's thread.
const PARSED_IN_PLACE: usize = 64 * 1024;

/// Turns how a run ended into the task's end (status, retry, chaining) and its output,
/// with the runner's notes appended to its stderr: the same for a process and a worker.
pub(crate) async fn conclude(
    run: &Run<'_>,
    prepared: &Prepared,
    ending: Ending,
    paths: &SpoolPaths,
    spool: Spool,
) -> Result<Ran> {
    let Run {
        task,
        attempt,
        attempts,
        node,
        ..
    } = *run;
    let Ending {
        stopped,
        result,
        refused,
        lead,
        requeue,
    } = ending;
    let exit = stopped.exit();
    let Verdict {
        mut status,
        mut note,
        mut retry,
        refuses_retry,
        result,
        record,
        spilled_output,
    } = judge(exit, result, refused, task).await?;
    // A worker that died or broke the protocol crashed, as a plugin killed by a signal did.
    let crashed = lead.is_some() || matches!(exit, Exit::Signal(_));
    if let Some(why) = lead {
        put_first(&mut note, why);
        if requeue {
            retry = Some(Duration::ZERO);
        } else {
            status = status::FAILED;
            retry = None;
        }
    }
    let (end, failure) = end_of(
        stopped, retry, status, crashed, attempts, prepared, &mut note,
    );
    let (end, followed) = crate::outcome::follow_retry_policy(
        end,
        failure,
        refuses_retry,
        prepared.run.retry.as_ref(),
        attempts,
        task,
        fleet_time::now(),
    );
    let end = end.keeping_key_slot(prepared.ordered_keys);
    let reason = reason_of(&end, followed, &mut note);
    let chain = chain_of(
        prepared,
        end == TaskEnd::Status(status::SUCCEEDED),
        result.as_ref(),
        spilled_output.as_deref(),
        &mut note,
    );
    if let Some(note) = note {
        append_note(&paths.stderr, &note).await?;
    }
    let facts = RunFacts {
        reason,
        task_discarded: matches!(end, TaskEnd::Discarded(_)),
        exit: Some(exit),
        result: record,
        spilled_output,
        output_file: None,
        chain,
        stopped: (!matches!(stopped, Stopped::Exited(_))).then_some(stopped),
    };
    let done = Finished {
        task,
        node: node.to_string(),
        attempt,
        end,
        stdout: Captured::load(&paths.stdout).await?,
        stderr: Captured::load(&paths.stderr).await?,
        spool: Some(spool),
    };
    Ok(Ran::Finished(Box::new(done), facts))
}

/// The plugin's exit and its result judged; a result the runner refused (`refused`: why)
/// fails the task.
async fn judge(
    exit: Exit,
    result: Option<Vec<u8>>,
    refused: Option<String>,
    task: ObjectId,
) -> Result<Verdict> {
    // A long result is parsed off this thread, which in a worker host serves every worker.
    let mut verdict = match result {
        Some(bytes) if bytes.len() > PARSED_IN_PLACE => {
            tokio::task::spawn_blocking(move || decide(exit, Some(&bytes)))
                .await
                .map_err(|e| Error::io("judging the result", std::io::Error::other(e)))?
        }
        result => decide(exit, result.as_deref()),
    };
    if let Some(why) = refused {
        tracing::warn!(task = %task, "the plugin's result is ignored: {why}");
        verdict.refuse_result(&why);
    }
    Ok(verdict)
}

/// Puts `why` at the start of the runner's note: why the runner ended the plugin comes
/// first, the exit's own remark after it.
fn put_first(note: &mut Option<String>, why: String) {
    *note = Some(match note.take() {
        Some(n) => format!("{why}; {n}"),
        None => why,
    });
}

/// The task's end before its retry policy, and the failure the policy judges (None: the
/// policy does not apply), from how the run stopped and the retry the result asked for.
fn end_of(
    stopped: Stopped,
    retry: Option<Duration>,
    status: i32,
    crashed: bool,
    attempts: i64,
    prepared: &Prepared,
    note: &mut Option<String>,
) -> (TaskEnd, Option<FailureKind>) {
    let mut capped = false;
    let end = match (stopped, retry) {
        (Stopped::TimedOut(_, after), _) => {
            put_first(note, format!("timed out after {} s", after.as_secs_f64()));
            TaskEnd::Status(status::FAILED)
        }
        (Stopped::Cancelled(_), _) => {
            put_first(note, "cancelled by an operator while running".to_string());
            TaskEnd::Status(status::CANCELLED)
        }
        (_, Some(_)) if prepared.max_retries.is_some_and(|m| attempts >= m as i64) => {
            capped = true;
            let why = format!(
                "too many retries: attempt {attempts} asked for another, max_retries is {}",
                prepared.max_retries.unwrap_or(0)
            );
            add_line(note, why);
            TaskEnd::Status(status::FAILED)
        }
        (_, Some(delay)) if delay > Duration::ZERO => TaskEnd::Retry {
            not_before: Some(DateTime::from_millis(
                fleet_time::now().timestamp_millis() + delay.as_millis() as i64,
            )),
            keep_key_slot: false,
        },
        (_, Some(_)) => TaskEnd::Retry {
            not_before: None,
            keep_key_slot: false,
        },
        (_, None) => TaskEnd::Status(status),
    };
    let failure = match stopped {
        Stopped::Cancelled(_) => None,
        // Coordinate's `max_retries` already said no more: a policy does not overrule it.
        _ if capped => None,
        Stopped::TimedOut(..) => Some(FailureKind::Timeout),
        _ if crashed => Some(FailureKind::Crashed),
        _ => Some(FailureKind::Failed),
    };
    (end, failure)
}

/// Adds `line` to the end of the runner's note for the task's stderr.
fn add_line(note: &mut Option<String>, line: String) {
    *note = Some(match note.take() {
        Some(n) => format!("{n}; {line}"),
        None => line,
    });
}

/// The attempt's reason: why it ended so (the runner's note) and what follows (`followed`,
/// the retry policy's line, which the note gets too).
fn reason_of(end: &TaskEnd, followed: Option<String>, note: &mut Option<String>) -> Option<String> {
    // The attempt's reason: why it ended so (the runner's note) and what follows.
    let mut reason = match *end {
        TaskEnd::Status(status::SUCCEEDED) => None,
        TaskEnd::Retry { not_before, .. } if followed.is_none() => Some(match not_before {
            Some(at) => format!(
                "the plugin asked for a retry, not before {}",
                at.try_to_rfc3339_string().unwrap_or_default()
            ),
            None => "the plugin asked for a retry".to_string(),
        }),
        _ => note.clone(),
    };
    if let Some(line) = followed {
        reason = Some(match reason.take() {
            Some(r) => format!("{r}; {line}"),
            None => line.clone(),
        });
        add_line(note, line);
    }
    reason
}

/// The queue and units a success chains into (`then`), from its result's `output`. Units
/// are read now, so an output that cannot be chained is said in the task's stderr (`note`)
/// with its result, which stands. Only a success chains.
fn chain_of(
    prepared: &Prepared,
    succeeded: bool,
    result: Option<&serde_json::Map<String, serde_json::Value>>,
    spilled_output: Option<&[u8]>,
    note: &mut Option<String>,
) -> Option<(String, Vec<disbatch_model::task::Unit>)> {
    let output = match (&prepared.then, succeeded) {
        (Some(then), true) => crate::outcome::chained_output(result, spilled_output)
            .unwrap_or_else(|problem| {
                let line = format!("chaining to queue {then:?}: {problem}");
                add_line(note, line);
                None
            }),
        _ => None,
    };
    match (&prepared.then, output) {
        (Some(then), Some(output)) => {
            let chained = disbatch_model::chaining::units_from_output(&output, fleet_time::now());
            for problem in &chained.problems {
                let line = format!("chaining to queue {then:?}: {problem}");
                add_line(note, line);
            }
            Some((then.clone(), chained.units))
        }
        _ => None,
    }
}

/// A plugin that could not start: the task fails with the reason as its stderr.
pub(crate) fn unable_to_start(run: &Run<'_>, reason: String) -> Ran {
    // The reason may quote the plugin's stderr: escaped, it cannot forge lines in the log.
    tracing::warn!(task = %run.task, "{}", disbatch_model::text::printable::escape(&reason));
    let done = Finished {
        task: run.task,
        node: run.node.to_string(),
        attempt: run.attempt,
        end: TaskEnd::Status(status::FAILED),
        stdout: Captured::from_text("Unable to start"),
        stderr: Captured::from_text(reason.clone()),
        spool: None,
    };
    Ran::Finished(Box::new(done), RunFacts::because(reason))
}

/// The runner's own remarks go at the end of the task's stderr, on a line of their own.
async fn append_note(stderr: &std::path::Path, note: &str) -> Result<()> {
    use std::io::SeekFrom;
    use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};
    let context = |e| Error::io("appending to the task's stderr", e);
    // Never through a link: a plugin must not choose which file the runner appends to.
    let mut file = tokio::fs::OpenOptions::new()
        .read(true)
        .append(true)
        .create(true)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(stderr)
        .await
        .map_err(context)?;
    // Only the last byte decides whether the note needs its own line; stderr may be huge.
    let len = file.metadata().await.map_err(context)?.len();
    let mut last = [b'\n'];
    if len > 0 {
        file.seek(SeekFrom::Start(len - 1)).await.map_err(context)?;
        file.read_exact(&mut last).await.map_err(context)?;
    }
    let text = format!(
        "{}[disbatch] {note}\n",
        if last[0] == b'\n' { "" } else { "\n" }
    );
    file.write_all(text.as_bytes()).await.map_err(context)?;
    // A tokio file's write returns once handed to a blocking thread: flushed, the note is in
    // the file before the caller reads it back.
    file.flush().await.map_err(context)
}
