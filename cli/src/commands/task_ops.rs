//! Per-task actions and output: cancel, retry (task or queue), delete-task, stdout, stderr.

use std::io::Write;

use anyhow::bail;
use reqwest::Method;
use serde_json::json;

use super::{shown, Ctx};
use crate::envelope::count;

const UPDATE: &str = "MongoDB::UpdateResult";

pub async fn cancel(ctx: &Ctx, task_id: &str, out: &mut dyn Write) -> anyhow::Result<()> {
    let id = shown(task_id);
    let said = task_action(ctx, task_id, "cancel", out).await?;
    report(
        out,
        said,
        &format!("Cancelled task {id}"),
        &format!("No change to task {id}"),
    )
}

pub async fn discard(ctx: &Ctx, task_id: &str, out: &mut dyn Write) -> anyhow::Result<()> {
    let id = shown(task_id);
    let said = task_action(ctx, task_id, "discard", out).await?;
    let already = format!("Task {id} was already discarded");
    report(out, said, &format!("Discarded task {id}"), &already)
}

pub async fn retry(ctx: &Ctx, task_id: &str, out: &mut dyn Write) -> anyhow::Result<()> {
    let id = shown(task_id);
    let said = task_action(ctx, task_id, "retry", out).await?;
    report(
        out,
        said,
        &format!("Requeued task {id}"),
        &format!("No change to task {id}"),
    )
}

/// `POST /tasks/:id/<action>`: None when `--json` printed the answer as it came, else
/// whether the task changed.
async fn task_action(
    ctx: &Ctx,
    task_id: &str,
    action: &str,
    out: &mut dyn Write,
) -> anyhow::Result<Option<bool>> {
    let reply = ctx
        .client
        .call(Method::POST, &["tasks", task_id, action], None)
        .await?;
    if ctx.raw(&reply, out)? {
        return Ok(None);
    }
    Ok(Some(count(&reply.value, UPDATE, "modified_count")? > 0))
}

fn report(
    out: &mut dyn Write,
    said: Option<bool>,
    changed: &str,
    unchanged: &str,
) -> anyhow::Result<()> {
    match said {
        Some(true) => writeln!(out, "{changed}")?,
        Some(false) => writeln!(out, "{unchanged}")?,
        None => {}
    }
    Ok(())
}

/// Requeues a queue's tasks in `statuses`; none given leaves the choice to the server
/// (failed and orphaned), so the default lives in one place.
pub async fn retry_queue(
    ctx: &Ctx,
    queue: &str,
    statuses: &[i64],
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let body = (!statuses.is_empty()).then(|| json!({"status": statuses}));
    let reply = ctx
        .client
        .call(Method::POST, &["queues", queue, "retry"], body.as_ref())
        .await?;
    if ctx.raw(&reply, out)? {
        return Ok(());
    }
    let n = count(&reply.value, UPDATE, "modified_count")?;
    writeln!(
        out,
        "Requeued {} in queue {}",
        super::plural(n, "task", "tasks"),
        shown(queue)
    )?;
    Ok(())
}

pub async fn delete(ctx: &Ctx, task_id: &str, out: &mut dyn Write) -> anyhow::Result<()> {
    let reply = ctx
        .client
        .call(Method::DELETE, &["tasks", task_id], None)
        .await?;
    if ctx.raw(&reply, out)? {
        return Ok(());
    }
    if count(&reply.value, "MongoDB::DeleteResult", "deleted_count")? == 0 {
        bail!("task {task_id} was not deleted: {}", reply.value);
    }
    writeln!(out, "Deleted task {}", shown(task_id))?;
    Ok(())
}

/// Streams the task's stdout or stderr **raw**, byte for byte, control characters included:
/// it is the task's own output (colours, progress bars, binary), meant to be piped or saved
/// as the plugin wrote it; `| cat -v` shows what is in it. The body is text, not JSON, so
/// `--json` prints the same bytes.
///
/// With `follow`, the output so far is printed while the task runs and the new bytes as they
/// come (the server says `X-Disbatch-Output: live`), until it has ended (`final`): then the
/// rest of the stored output, and the command exits 0. A task that waits to run prints
/// nothing until it does. Bytes the live view no longer holds (it keeps the last 64 KiB of
/// a stream) are skipped with a note on stderr.
pub async fn output(
    ctx: &Ctx,
    task_id: &str,
    which: &str,
    follow: bool,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    if !follow {
        return ctx.client.stream(&["tasks", task_id, which], out).await;
    }
    let segments = ["tasks", task_id, which];
    // Bytes of the stream printed so far, in the stream's own offsets.
    let mut printed: u64 = 0;
    let mut was_live = false;
    loop {
        let query = [("offset", printed.to_string())];
        let (headers, body) = ctx.client.get_bytes(&segments, &query).await?;
        let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        let number = |name: &str| header(name).and_then(|v| v.parse::<u64>().ok());
        match header("x-disbatch-output") {
            Some("live") => {
                let skipped = number("x-disbatch-output-skipped").unwrap_or(0);
                if skipped > printed {
                    eprintln!(
                        "[disbatch: {} bytes of {which} are not kept while the task runs; skipped]",
                        skipped - printed
                    );
                    printed = skipped;
                }
                out.write_all(&body)?;
                out.flush()?;
                printed += body.len() as u64;
                was_live = true;
            }
            Some("waiting") => {
                if was_live {
                    eprintln!("[disbatch: the attempt ended; the task waits to run again]");
                    printed = 0;
                    was_live = false;
                }
            }
            // Ended, or a server without live output: what is stored is the whole output.
            _ => {
                let total = number("x-total-length").unwrap_or(0);
                if total < printed {
                    // The stored output is not what was shown (e.g. replaced by a note that
                    // it was too large): print it whole.
                    eprintln!("[disbatch: the stored {which} differs from the live view]");
                    return ctx.client.stream(&segments, out).await;
                }
                out.write_all(&body)?;
                out.flush()?;
                return Ok(());
            }
        }
        tokio::time::sleep(FOLLOW_EVERY).await;
    }
}

/// How often `--follow` asks: the runner copies the output about once a second.
const FOLLOW_EVERY: std::time::Duration = std::time::Duration::from_millis(500);
