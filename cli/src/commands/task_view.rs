//! Reading tasks for people: `task ID`, `attempts ID`, `result ID`, and the `tasks` table.

use std::io::Write;

use reqwest::Method;
use serde_json::Value;

use super::workflow_view::QueueNames;
use super::{array, cell, plural, shown, write_raw, Ctx};
use crate::envelope::oid;
use crate::table::{Align, Table};

/// A status code's name, as the console and README name them.
pub fn status_name(status: Option<&Value>) -> String {
    let Some(code) = status.and_then(Value::as_i64) else {
        return cell(status);
    };
    let name = match code {
        -6 => "orphaned",
        -5 => "cancelled",
        -4 => "blocked",
        -3 => "terminated",
        -2 => "queued",
        -1 => "claimed",
        0 => "running",
        1 => "succeeded",
        c if c >= 2 => "failed",
        _ => return code.to_string(),
    };
    format!("{name} ({code})")
}

/// A date as the server rendered it: text as is, `{"$date": …}` unwrapped, epoch numbers kept.
fn date(value: Option<&Value>) -> String {
    match value {
        Some(Value::Object(o)) => cell(o.get("$date")),
        other => cell(other),
    }
}

fn id_of(value: &Value) -> String {
    value
        .get("_id")
        .or_else(|| value.get("id"))
        .map(|v| oid(v).map_or_else(|| cell(Some(v)), str::to_string))
        .unwrap_or_default()
}

/// Params as one line of JSON, for a table cell (the table cuts it).
fn params(task: &Value) -> String {
    task.get("params")
        .or_else(|| task.get("parameters"))
        .map_or_else(String::new, Value::to_string)
}

/// `tasks` in human mode: one row per task.
pub fn write_tasks_table(
    tasks: &[Value],
    queues: &QueueNames,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let mut table = Table::new(&[
        ("ID", Align::Left),
        ("Queue", Align::Left),
        ("Status", Align::Left),
        ("Node", Align::Left),
        ("Attempts", Align::Right),
        ("Modified", Align::Left),
        ("Params", Align::Left),
    ]);
    for t in tasks {
        // A queue deleted since (its tasks stay) or unreadable names: its id.
        let queue = t.get("queue").map(|q| match oid(q) {
            Some(id) => queues.get(id).map_or(id, String::as_str).to_string(),
            None => cell(Some(q)),
        });
        table.row(vec![
            id_of(t),
            queue.unwrap_or_default(),
            status_name(t.get("status")),
            cell(t.get("node")),
            cell(t.get("attempts")),
            date(t.get("mtime")),
            params(t),
        ]);
    }
    write!(out, "{}", table.render())?;
    writeln!(out, "{}.", plural(tasks.len() as u64, "task", "tasks"))?;
    Ok(())
}

/// `task ID`: one task, field by field.
pub async fn show(ctx: &Ctx, task_id: &str, out: &mut dyn Write) -> anyhow::Result<()> {
    let reply = ctx
        .client
        .call(Method::GET, &["tasks", task_id], None)
        .await?;
    if ctx.raw(&reply, out)? {
        return Ok(());
    }
    let t = &reply.value;
    let Some(fields) = t.as_object() else {
        anyhow::bail!("unexpected response from the server: expected a task object");
    };
    let mut lines: Vec<(String, String)> = vec![
        ("id".into(), id_of(t)),
        ("status".into(), status_name(t.get("status"))),
    ];
    for (key, value) in fields {
        match key.as_str() {
            "_id" | "id" | "status" => {}
            "ctime" | "mtime" | "not_before" | "lease_until" => {
                lines.push((key.clone(), date(Some(value))))
            }
            "queue" => {
                let shown = match oid(value) {
                    Some(id) => match queue_name(ctx, id).await {
                        Some(name) => format!("{name} ({id})"),
                        None => id.to_string(),
                    },
                    None => cell(Some(value)),
                };
                lines.push((key.clone(), shown));
            }
            "stdout" | "stderr" => lines.push((key.clone(), output_summary(value))),
            "held" => lines.push((key.clone(), held_line(value))),
            // Shown below the fields, as a block of pretty JSON.
            "output" | "output_omitted" | "output_attempt" => {}
            _ => lines.push((key.clone(), cell(Some(&plain_ids(value))))),
        }
    }
    let width = lines
        .iter()
        .map(|(k, _)| k.chars().count())
        .max()
        .unwrap_or(0);
    for (key, value) in lines {
        writeln!(out, "{:width$}  {}", shown(&key), shown(&value))?;
    }
    if let Some(attempt) = t.get("output_attempt") {
        let attempt = oid(attempt).map_or_else(|| cell(Some(attempt)), str::to_string);
        let whole = format!("disbatch result {} --attempt {attempt}", id_of(t));
        writeln!(out, "output (of attempt {}):", shown(&attempt))?;
        write_output(t.get("output"), t.get("output_omitted"), &whole, out)?;
    }
    Ok(())
}

/// The name of queue `id`, by one `GET /queues/:id`; None for a queue deleted since (or
/// one that cannot be read), which is then shown by its id.
async fn queue_name(ctx: &Ctx, id: &str) -> Option<String> {
    let reply = ctx
        .client
        .call(Method::GET, &["queues", id], None)
        .await
        .ok()?;
    reply.value.get("name")?.as_str().map(str::to_string)
}

/// Ids as the hex they are: the server writes an ObjectId as `{"$oid": "…"}`, at any depth.
fn plain_ids(value: &Value) -> Value {
    match value {
        Value::Object(o) if o.len() == 1 => match o.get("$oid") {
            Some(Value::String(hex)) => Value::String(hex.clone()),
            _ => Value::Object(o.iter().map(|(k, v)| (k.clone(), plain_ids(v))).collect()),
        },
        Value::Object(o) => {
            Value::Object(o.iter().map(|(k, v)| (k.clone(), plain_ids(v))).collect())
        }
        Value::Array(a) => Value::Array(a.iter().map(plain_ids).collect()),
        other => other.clone(),
    }
}

/// At most this many lines of a result's output are printed by `task` and `attempts`;
/// `disbatch result` prints it whole.
const OUTPUT_LINES: usize = 40;
/// At most this many characters of one printed line of output.
const OUTPUT_LINE_CHARS: usize = 200;

/// A result's output as pretty JSON, indented, at most `OUTPUT_LINES` lines; or, when the
/// server left it out (`output_omitted`), its size. `whole` is the command that prints it all.
fn write_output(
    output: Option<&Value>,
    omitted: Option<&Value>,
    whole: &str,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    if let Some(omitted) = omitted.filter(|o| !o.is_null()) {
        writeln!(
            out,
            "  ({} of JSON, too large to show here; {whole} prints it)",
            plural(
                omitted.get("bytes").and_then(Value::as_u64).unwrap_or(0),
                "byte",
                "bytes"
            )
        )?;
        return Ok(());
    }
    let pretty = serde_json::to_string_pretty(output.unwrap_or(&Value::Null))?;
    let pretty = disbatch_model::text::printable::json_text(&pretty);
    let total = pretty.lines().count();
    for line in pretty.lines().take(OUTPUT_LINES) {
        writeln!(
            out,
            "  {}",
            disbatch_model::text::printable::cut(line, OUTPUT_LINE_CHARS)
        )?;
    }
    if total > OUTPUT_LINES {
        writeln!(
            out,
            "  … ({} more lines; {whole} prints it whole)",
            total - OUTPUT_LINES
        )?;
    }
    Ok(())
}

/// `result ID`: the output of the task's last successful attempt (or of `attempt`), whole,
/// as the JSON the server sent, for scripts (`disbatch result ID | jq`).
pub async fn result(
    ctx: &Ctx,
    task_id: &str,
    attempt: Option<&str>,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let query: Vec<(&str, String)> = attempt
        .map(|a| ("attempt", a.to_string()))
        .into_iter()
        .collect();
    let (_, body) = ctx
        .client
        .get_bytes(&["tasks", task_id, "result"], &query)
        .await?;
    write_raw(out, &body)?;
    Ok(())
}

/// `held` (the DCI's: why a queued task waits on its queue's flow limits): the limit, the
/// reason, and until when.
fn held_line(value: &Value) -> String {
    let until = match value.get("until") {
        None | Some(Value::Null) => String::new(),
        Some(u) => format!(" (until {})", date(Some(u))),
    };
    format!(
        "{}: {}{until}",
        cell(value.get("limit")),
        cell(value.get("reason"))
    )
}

/// Output in a task document: inline text is summarised (the `stdout` verb prints it whole).
fn output_summary(value: &Value) -> String {
    match value {
        Value::Null => String::new(),
        Value::String(s) if s.chars().count() <= 60 && !s.contains('\n') => s.clone(),
        Value::String(s) => format!(
            "{} of text (disbatch stdout|stderr ID prints it)",
            plural(s.len() as u64, "byte", "bytes")
        ),
        other => match oid(other) {
            Some(id) => format!("GridFS file {id} (disbatch stdout|stderr ID prints it)"),
            None => other.to_string(),
        },
    }
}

/// `attempts ID`: the task's attempts, oldest first.
pub async fn attempts(ctx: &Ctx, task_id: &str, out: &mut dyn Write) -> anyhow::Result<()> {
    let reply = ctx
        .client
        .call(Method::GET, &["tasks", task_id, "attempts"], None)
        .await?;
    if ctx.raw(&reply, out)? {
        return Ok(());
    }
    let rows = array(&reply, "attempts")?;
    let mut table = Table::new(&[
        ("#", Align::Right),
        ("Node", Align::Left),
        ("PID", Align::Right),
        ("Start", Align::Left),
        ("End", Align::Left),
        ("Outcome", Align::Left),
        ("Status", Align::Left),
        ("Exit", Align::Left),
        ("Reason", Align::Left),
    ]);
    for (i, a) in rows.iter().enumerate() {
        let exit = match (a.get("exit_code"), a.get("signal")) {
            (Some(code), _) if !code.is_null() => format!("code {}", cell(Some(code))),
            (_, Some(signal)) if !signal.is_null() => format!("signal {}", cell(Some(signal))),
            _ => String::new(),
        };
        table.row(vec![
            (i + 1).to_string(),
            cell(a.get("node")),
            cell(a.get("pid")),
            date(a.get("start")),
            date(a.get("end")),
            cell(a.get("outcome")),
            a.get("status")
                .filter(|s| !s.is_null())
                .map_or_else(String::new, |s| status_name(Some(s))),
            exit,
            cell(a.get("reason")),
        ]);
    }
    write!(out, "{}", table.render())?;
    writeln!(out, "{}.", plural(rows.len() as u64, "attempt", "attempts"))?;
    for (i, a) in rows.iter().enumerate() {
        let (output, omitted) = (a.get("output"), a.get("output_omitted"));
        if output.is_none_or(Value::is_null) && omitted.is_none_or(Value::is_null) {
            continue;
        }
        let attempt = id_of(a);
        writeln!(out, "output of attempt {} ({}):", i + 1, shown(&attempt))?;
        let whole = format!("disbatch result {task_id} --attempt {attempt}");
        write_output(output, omitted, &whole, out)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn statuses_are_named_with_their_code() {
        assert_eq!(status_name(Some(&json!(-2))), "queued (-2)");
        assert_eq!(status_name(Some(&json!(0))), "running (0)");
        assert_eq!(status_name(Some(&json!(7))), "failed (7)");
        assert_eq!(status_name(Some(&json!(-9))), "-9");
        assert_eq!(status_name(Some(&json!("x"))), "x");
        assert_eq!(status_name(None), "");
    }

    #[test]
    fn the_table_counts_in_words() {
        let mut out = Vec::new();
        let names = QueueNames::from([("q1".to_string(), "demo".to_string())]);
        write_tasks_table(
            &[
                json!({"_id": {"$oid": "a"}, "queue": {"$oid": "q1"}, "status": 1, "params": {"k": "v"}}),
                json!({"_id": {"$oid": "b"}, "queue": {"$oid": "gone"}, "status": 1, "params": {}}),
            ],
            &names,
            &mut out,
        )
        .expect("table");
        let text = String::from_utf8(out).expect("utf-8");
        assert!(text.contains("succeeded (1)"), "{text}");
        assert!(text.contains(r#"{"k":"v"}"#), "{text}");
        assert!(text.contains(" demo "), "queues by name: {text}");
        assert!(
            text.contains(" gone "),
            "an unknown queue by its id: {text}"
        );
        assert!(text.ends_with("2 tasks.\n"), "{text}");
    }

    #[test]
    fn a_held_task_says_why_and_until_when() {
        let held =
            json!({"limit": "rate_limit", "reason": "used up", "until": "2026-01-01T00:00:10"});
        assert_eq!(
            held_line(&held),
            "rate_limit: used up (until 2026-01-01T00:00:10)"
        );
        let held = json!({"limit": "concurrency", "reason": "at max", "until": null});
        assert_eq!(held_line(&held), "concurrency: at max");
    }

    #[test]
    fn ids_are_shown_as_hex_at_any_depth() {
        let v = json!({"attempt": {"$oid": "ab12"}, "list": [{"attempt": {"$oid": "cd"}}]});
        assert_eq!(
            plain_ids(&v),
            json!({"attempt": "ab12", "list": [{"attempt": "cd"}]})
        );
        assert_eq!(plain_ids(&json!({"$oid": 1})), json!({"$oid": 1}));
    }

    #[test]
    fn a_result_output_is_printed_pretty_and_bounded() {
        let mut out = Vec::new();
        write_output(Some(&json!({"greeted": "Ada"})), None, "W", &mut out).expect("write");
        let text = String::from_utf8(out).expect("utf-8");
        assert_eq!(text, "  {\n    \"greeted\": \"Ada\"\n  }\n");
        let long: Vec<u32> = (0..100).collect();
        let mut out = Vec::new();
        write_output(Some(&json!(long)), None, "W", &mut out).expect("write");
        let text = String::from_utf8(out).expect("utf-8");
        assert_eq!(text.lines().count(), OUTPUT_LINES + 1, "{text}");
        assert!(
            text.ends_with("… (62 more lines; W prints it whole)\n"),
            "{text}"
        );
        let mut out = Vec::new();
        write_output(None, Some(&json!({"bytes": 9})), "W", &mut out).expect("write");
        let text = String::from_utf8(out).expect("utf-8");
        assert!(
            text.contains("9 bytes of JSON") && text.contains("W prints it"),
            "{text}"
        );
    }

    #[test]
    fn long_output_is_summarised() {
        assert_eq!(output_summary(&json!("ok")), "ok");
        assert!(output_summary(&json!("a\nb")).starts_with("3 bytes"));
        assert!(output_summary(&json!({"$oid": "abc"})).contains("GridFS file abc"));
    }
}
