//! Queue commands: plugins, queues, create-queue, update-queue, delete-queue.

use std::io::Write;

use anyhow::{anyhow, bail};
use reqwest::Method;
use serde_json::{json, Map, Value};

use super::{array, cell, pairs, plural, shown, Ctx};
use crate::args::Sort;
use crate::envelope::{count, oid};
use crate::table::{Align, Table};

pub async fn plugins(ctx: &Ctx, out: &mut dyn Write) -> anyhow::Result<()> {
    let reply = ctx.client.call(Method::GET, &["plugins"], None).await?;
    if ctx.raw(&reply, out)? {
        return Ok(());
    }
    for name in array(&reply, "plugin names")? {
        writeln!(out, "{}", shown(&cell(Some(name))))?;
    }
    Ok(())
}

pub async fn list(ctx: &Ctx, out: &mut dyn Write) -> anyhow::Result<()> {
    let reply = ctx.client.call(Method::GET, &["queues"], None).await?;
    if ctx.raw(&reply, out)? {
        return Ok(());
    }
    let queues = array(&reply, "queues")?;
    let mut columns = vec![
        ("ID", Align::Left),
        ("Plugin", Align::Left),
        ("Name", Align::Left),
        ("Threads", Align::Right),
        ("Queued", Align::Right),
        ("Blocked", Align::Right),
        ("Running", Align::Right),
        ("Succeeded", Align::Right),
        ("Failed", Align::Right),
        ("Cancelled", Align::Right),
        ("Orphaned", Align::Right),
    ];
    // Only when a queue has a schedule: a Disbatch fleet's table is as it was.
    let any_scheduled = queues.iter().any(|q| q.get("scheduled").is_some());
    if any_scheduled {
        columns.push(("Next tick", Align::Left));
    }
    let mut table = Table::new(&columns);
    for queue in queues {
        let id = queue
            .get("id")
            .or_else(|| queue.get("_id"))
            .map(|v| oid(v).map_or_else(|| cell(Some(v)), str::to_string))
            .unwrap_or_default();
        let mut row = vec![id];
        for field in ["plugin", "name", "threads"] {
            row.push(cell(queue.get(field)));
        }
        row.extend(status_columns(queue));
        if any_scheduled {
            row.push(next_tick(queue));
        }
        table.row(row);
    }
    write!(out, "{}", table.render())?;
    writeln!(
        out,
        "{} total.",
        plural(queues.len() as u64, "queue", "queues")
    )?;
    Ok(())
}

/// A scheduled queue's next tick in UTC, and on its zone's wall clock when that is not UTC;
/// marked when the queue is paused (its ticks pass without tasks) or its schedule unreadable.
fn next_tick(queue: &Value) -> String {
    if queue.get("scheduled").is_none() {
        return String::new();
    }
    if let Some(problem) = queue.get("schedule_error").and_then(Value::as_str) {
        return format!("invalid: {problem}");
    }
    let next = queue.get("schedule_next");
    let text = |k: &str| next.and_then(|n| n.get(k)).and_then(Value::as_str);
    let mut shown = match (text("utc"), text("local"), text("zone")) {
        (Some(utc), Some(local), Some(zone)) if zone != "UTC" => {
            format!("{utc} ({local} {zone})")
        }
        (Some(utc), _, _) => utc.to_string(),
        _ => "none within a year".to_string(),
    };
    let paused = match queue.get("threads") {
        None | Some(Value::Null) => true,
        Some(t) => t.as_i64() == Some(0),
    };
    if paused {
        shown.push_str(" [paused: ticks pass]");
    }
    shown
}

/// Queued, blocked, running, succeeded, failed, cancelled and orphaned, each apart, from
/// `by_status`; a server without it (Disbatch 4) gives its own queued (every status ≤ -2),
/// running, succeeded and failed, and blanks for the rest rather than a wrong 0.
fn status_columns(queue: &Value) -> Vec<String> {
    let Some(groups) = queue.get("by_status").and_then(Value::as_object) else {
        return ["queued", "", "running", "succeeded", "failed", "", ""]
            .iter()
            .map(|f| {
                if f.is_empty() {
                    String::new()
                } else {
                    cell(queue.get(*f))
                }
            })
            .collect();
    };
    let n = |g: &str| groups.get(g).and_then(Value::as_u64).unwrap_or(0);
    [
        n("queued"),
        n("blocked"),
        n("claimed") + n("running"),
        n("succeeded"),
        n("failed"),
        n("cancelled"),
        n("orphaned"),
    ]
    .iter()
    .map(u64::to_string)
    .collect()
}

pub async fn create(
    ctx: &Ctx,
    name: &str,
    plugin: &str,
    threads: Option<u64>,
    sort: Option<Sort>,
    retry: Option<&str>,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let mut body = json!({"name": name, "plugin": plugin});
    if let Some(text) = retry {
        body["retry"] = serde_json::from_str::<Value>(text)
            .map_err(|e| anyhow!("--retry must be a JSON object or null ({e}): {text}"))?;
    }
    if let Some(threads) = threads {
        body["threads"] = json!(threads);
    }
    if let Some(sort) = sort {
        body["sort"] = json!(sort.as_str());
    }
    let reply = ctx
        .client
        .call(Method::POST, &["queues"], Some(&body))
        .await?;
    if ctx.raw(&reply, out)? {
        return Ok(());
    }
    let id = reply.value.get("id").and_then(oid).ok_or_else(|| {
        anyhow!(
            "unexpected response from the server: no queue id in {}",
            reply.value
        )
    })?;
    writeln!(out, "Created queue {}: {id}", shown(name))?;
    Ok(())
}

/// The POST /queues/:queue body from FIELD VALUE pairs. `threads` goes as a number (or null):
/// the API wants an integer, and Disbatch's form-encoded CLI stored a string there.
pub fn update_body(args: &[String]) -> anyhow::Result<Map<String, Value>> {
    let mut body = Map::new();
    for (field, value) in pairs(args, "FIELD VALUE")? {
        let value = match (field.as_str(), value.as_str()) {
            ("threads", "null") => Value::Null,
            ("threads", digits)
                if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) =>
            {
                // Too many digits for u64: send the text and let the server explain.
                digits
                    .parse::<u64>()
                    .map_or_else(|_| json!(digits), |n| json!(n))
            }
            // Text, for the server to explain (Disbatch's CLI sent every value as text).
            ("name" | "plugin" | "sort" | "threads", _) => json!(value),
            // Every other field is read as JSON where it parses (`30`, `null`, `{"max": 1}`,
            // `true`), as `jq --argjson` reads it; anything else goes as text (`persistent`,
            // a cron pattern), for the server to check. `null` removes the field.
            (_, text) => serde_json::from_str::<Value>(text).unwrap_or_else(|_| json!(text)),
        };
        body.insert(field.clone(), value);
    }
    Ok(body)
}

pub async fn update(
    ctx: &Ctx,
    queue: &str,
    args: &[String],
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let body = Value::Object(update_body(args)?);
    let reply = ctx
        .client
        .call(Method::POST, &["queues", queue], Some(&body))
        .await?;
    if ctx.raw(&reply, out)? {
        return Ok(());
    }
    // Disbatch's wording, with the fields sent, so a log shows what was asked for.
    let (queue, body) = (shown(queue), json_line(&body));
    if count(&reply.value, "MongoDB::UpdateResult", "modified_count")? > 0 {
        writeln!(out, "Updated queue {queue}: {body}")?;
    } else {
        writeln!(out, "No change to queue {queue}: {body}")?;
    }
    Ok(())
}

pub async fn delete(ctx: &Ctx, queue: &str, out: &mut dyn Write) -> anyhow::Result<()> {
    let reply = ctx
        .client
        .call(Method::DELETE, &["queues", queue], None)
        .await?;
    if ctx.raw(&reply, out)? {
        return Ok(());
    }
    if count(&reply.value, "MongoDB::DeleteResult", "deleted_count")? == 0 {
        bail!("queue {queue} was not deleted: {}", reply.value);
    }
    writeln!(out, "Deleted queue {}", shown(queue))?;
    Ok(())
}

/// A JSON value on one line with hidden characters as `\uXXXX` escapes.
fn json_line(value: &Value) -> String {
    disbatch_model::text::printable::json_text(&value.to_string()).into_owned()
}

/// `summary`: GET /summary as a table, one row per queue.
pub async fn summary(ctx: &Ctx, out: &mut dyn Write) -> anyhow::Result<()> {
    let reply = ctx.client.call(Method::GET, &["summary"], None).await?;
    if ctx.raw(&reply, out)? {
        return Ok(());
    }
    let columns = [
        "available",
        "delayed",
        "pending",
        "finished",
        "failed",
        "other",
    ];
    let mut header = vec![("Queue", Align::Left)];
    header.extend([
        ("Available", Align::Right),
        ("Delayed", Align::Right),
        ("Pending", Align::Right),
        ("Finished", Align::Right),
        ("Failed", Align::Right),
        ("Other", Align::Right),
    ]);
    let mut table = Table::new(&header);
    for row in array(&reply, "summary")? {
        let mut cells = vec![cell(row.get("queue"))];
        cells.extend(columns.iter().map(|c| cell(row.get(*c))));
        table.row(cells);
    }
    write!(out, "{}", table.render())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(args: &[&str]) -> Vec<String> {
        args.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn update_pairs_become_a_body() {
        let body = update_body(&strings(&["threads", "4", "name", "x", "sort", "lifo"])).unwrap();
        assert_eq!(
            Value::Object(body),
            json!({"threads": 4, "name": "x", "sort": "lifo"})
        );
        let body = update_body(&strings(&["threads", "null"])).unwrap();
        assert_eq!(Value::Object(body), json!({"threads": null}));
        // Only threads is numeric: a queue may well be named "12".
        let body = update_body(&strings(&["name", "12", "threads", "-1"])).unwrap();
        assert_eq!(Value::Object(body), json!({"name": "12", "threads": "-1"}));
        let body = update_body(&strings(&["threads", "99999999999999999999999"])).unwrap();
        assert_eq!(
            Value::Object(body),
            json!({"threads": "99999999999999999999999"})
        );
    }

    #[test]
    fn limit_fields_go_as_json() {
        let body = update_body(&strings(&[
            "rate_limit",
            r#"{"starts": 5, "per_s": 1}"#,
            "unique",
            "null",
            "concurrency",
            "soon",
        ]))
        .unwrap();
        assert_eq!(
            Value::Object(body),
            json!({"rate_limit": {"starts": 5, "per_s": 1}, "unique": null, "concurrency": "soon"})
        );
    }

    #[test]
    fn odd_update_arguments_are_refused() {
        let err = update_body(&strings(&["threads"])).unwrap_err().to_string();
        assert!(err.contains("odd number of arguments (1)"), "{err}");
        assert!(update_body(&strings(&["threads", "1", "name"])).is_err());
    }

    #[test]
    fn each_status_has_its_column() {
        let queue = json!({"queued": 9, "running": 2, "by_status": {
            "queued": 3, "claimed": 1, "running": 1, "succeeded": 4, "failed": 2,
            "terminated": 0, "blocked": 5, "cancelled": 6, "orphaned": 7, "other": 0}});
        assert_eq!(status_columns(&queue), ["3", "5", "2", "4", "2", "6", "7"]);
    }

    #[test]
    fn a_disbatch_server_leaves_the_new_columns_blank() {
        let queue = json!({"queued": 9, "running": 2, "succeeded": 4, "failed": 1});
        assert_eq!(status_columns(&queue), ["9", "", "2", "4", "1", "", ""]);
    }
}
