//! Per-task actions and output: cancel, retry (task or queue), delete-task, stdout, stderr.

use std::io::Write;

use anyhow::bail;
use reqwest::Method;
use serde_json::json;

use super::{shown, Ctx};
use crate::envelope::count;

const UPDATE: &str = "MongoDB::UpdateResult";

pub async fn cancel(ctx: &Ctx, task_id: &str, out: &mut dyn Write) -> anyhow::Result<()> {
    let reply = ctx
        .client
        .call(Method::POST, &["tasks", task_id, "cancel"], None)
        .await?;
    if ctx.raw(&reply, out)? {
        return Ok(());
    }
    if count(&reply.value, UPDATE, "modified_count")? > 0 {
        writeln!(out, "Cancelled task {}", shown(task_id))?;
    } else {
        writeln!(out, "No change to task {}", shown(task_id))?;
    }
    Ok(())
}

pub async fn retry(ctx: &Ctx, task_id: &str, out: &mut dyn Write) -> anyhow::Result<()> {
    let reply = ctx
        .client
        .call(Method::POST, &["tasks", task_id, "retry"], None)
        .await?;
    if ctx.raw(&reply, out)? {
        return Ok(());
    }
    if count(&reply.value, UPDATE, "modified_count")? > 0 {
        writeln!(out, "Requeued task {}", shown(task_id))?;
    } else {
        writeln!(out, "No change to task {}", shown(task_id))?;
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
pub async fn output(
    ctx: &Ctx,
    task_id: &str,
    which: &str,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    ctx.client.stream(&["tasks", task_id, which], out).await
}
