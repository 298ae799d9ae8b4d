//! `disbatch failures`: the fleet's newest failed and discarded tasks, and requeueing them.

use std::io::Write;

use anyhow::anyhow;
use reqwest::Method;
use serde_json::{json, Map, Value};

use super::{cell, plural, Ctx};
use crate::envelope::count;
use crate::table::{Align, Table};

const UPDATE: &str = "MongoDB::UpdateResult";

/// What to do to each failure listed, instead of printing them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Retry,
    Discard,
}

impl Action {
    fn route(self) -> &'static str {
        match self {
            Action::Retry => "retry",
            Action::Discard => "discard",
        }
    }

    fn done(self) -> &'static str {
        match self {
            Action::Retry => "Requeued",
            Action::Discard => "Discarded",
        }
    }
}

pub async fn list(
    ctx: &Ctx,
    queue: Option<&str>,
    limit: Option<u64>,
    action: Option<Action>,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let mut body = Map::new();
    if let Some(q) = queue {
        body.insert("queue".into(), json!(q));
    }
    if let Some(n) = limit {
        body.insert("limit".into(), json!(n));
    }
    let reply = ctx
        .client
        .call(Method::GET, &["failures"], Some(&Value::Object(body)))
        .await?;
    if action.is_none() && ctx.raw(&reply, out)? {
        return Ok(());
    }
    let rows = reply
        .value
        .get("failures")
        .and_then(Value::as_array)
        .ok_or_else(|| {
            anyhow!("unexpected response from the server: expected {{\"failures\": [...]}}")
        })?;
    let Some(action) = action else {
        write!(out, "{}", table(rows).render())?;
        return Ok(());
    };
    // Each listed task by its own request: one that changed meanwhile is left as it is.
    let mut changed = 0;
    for row in rows {
        let Some(id) = row.get("id").and_then(Value::as_str) else {
            continue;
        };
        let reply = ctx
            .client
            .call(Method::POST, &["tasks", id, action.route()], None)
            .await?;
        if count(&reply.value, UPDATE, "modified_count")? > 0 {
            changed += 1;
            writeln!(out, "{} task {id}", action.done())?;
        } else {
            writeln!(out, "No change to task {id}")?;
        }
    }
    writeln!(
        out,
        "{} {}",
        action.done(),
        plural(changed, "task", "tasks")
    )?;
    Ok(())
}

/// One row per failure: when it ended, its queue by name, status, whether it was discarded,
/// attempts, the last attempt's reason.
fn table(rows: &[Value]) -> Table {
    let mut table = Table::new(&[
        ("Task", Align::Left),
        ("Queue", Align::Left),
        ("Status", Align::Right),
        ("Discarded", Align::Left),
        ("Attempts", Align::Right),
        ("Ended", Align::Left),
        ("Reason", Align::Left),
    ]);
    for row in rows {
        let discarded = match row.get("discarded") {
            Some(Value::Bool(true)) => "yes",
            _ => "no",
        };
        let queue = match row.get("queue") {
            Some(Value::String(name)) => name.clone(),
            _ => cell(row.get("queue_id")),
        };
        let ended = match row.get("last_attempt_end") {
            Some(Value::String(s)) => s.replace('T', " "),
            _ => cell(row.get("mtime")).replace('T', " "),
        };
        table.row(vec![
            cell(row.get("id")),
            queue,
            cell(row.get("status")),
            discarded.to_string(),
            cell(row.get("attempts")),
            ended,
            cell(row.get("reason")),
        ]);
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_show_names_and_reasons() {
        let rows = vec![json!({
            "id": "6b02626f79f4bc22b2fe7135", "queue": "words", "queue_id": "6b02626f79f4bc22b2fe7136",
            "status": 3, "discarded": true, "attempts": 2,
            "last_attempt_end": "2026-12-07T07:00:00", "reason": "exit code 1",
        })];
        let text = table(&rows).render();
        assert!(text.starts_with("Task"), "{text}");
        assert!(text.contains("words"), "{text}");
        assert!(text.contains("2026-12-07 07:00:00"), "{text}");
        assert!(text.contains("exit code 1"), "{text}");
        assert!(text.contains("yes"), "{text}");
    }
}
