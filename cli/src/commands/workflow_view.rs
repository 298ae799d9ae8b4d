//! `graph ID` and `batch ID` for people: the outcome, the counts in words and one row per task;
//! and the `graphs` and `batches` tables.

use std::collections::HashMap;
use std::io::Write;

use anyhow::anyhow;
use serde_json::Value;

use super::{cell, plural, shown};
use crate::table::{Align, Table};

/// Count keys in the order a reader wants them: success, then the ways of not succeeding,
/// then what is still under way. Keys the server adds later follow, by name.
const COUNT_ORDER: &[&str] = &[
    "succeeded",
    "failed",
    "terminated",
    "orphaned",
    "cancelled",
    "running",
    "claimed",
    "queued",
    "blocked",
    "other",
];

/// Queue id → name, to show names where the API gives ids; an unknown id is shown as is.
pub type QueueNames = HashMap<String, String>;

/// "6 succeeded, 1 failed, 1 cancelled": the non-zero counts, or "none".
pub fn counts_line(counts: Option<&Value>) -> String {
    let Some(map) = counts.and_then(Value::as_object) else {
        return "none".into();
    };
    let n = |k: &str| map.get(k).and_then(Value::as_u64).unwrap_or(0);
    let mut extra: Vec<&String> = map
        .keys()
        .filter(|k| !COUNT_ORDER.contains(&k.as_str()))
        .collect();
    extra.sort();
    let parts: Vec<String> = COUNT_ORDER
        .iter()
        .copied()
        .chain(extra.into_iter().map(String::as_str))
        .filter(|k| n(k) > 0)
        .map(|k| format!("{} {k}", n(k)))
        .collect();
    if parts.is_empty() {
        "none".into()
    } else {
        parts.join(", ")
    }
}

fn tasks_of<'a>(view: &'a Value, noun: &str) -> anyhow::Result<&'a Vec<Value>> {
    view.get("tasks")
        .and_then(Value::as_array)
        .ok_or_else(|| anyhow!("unexpected response from the server: no task list in the {noun}"))
}

fn queue_of(task: &Value, queues: &QueueNames) -> String {
    let id = cell(task.get("queue"));
    queues.get(&id).cloned().unwrap_or(id)
}

/// The lines above the tasks: id and outcome, times and size, counts.
fn header(out: &mut dyn Write, noun: &str, view: &Value) -> anyhow::Result<()> {
    writeln!(
        out,
        "{noun} {}: {}",
        shown(&cell(view.get("id"))),
        shown(&cell(view.get("state")))
    )?;
    let size = view.get("size").and_then(Value::as_u64).unwrap_or(0);
    let mut when = format!(
        "{}, created {}",
        plural(size, "task", "tasks"),
        shown(&cell(view.get("ctime")))
    );
    for (key, label) in [("done", "done"), ("cancelled", "cancelled")] {
        if let Some(at) = view.get(key).filter(|v| !v.is_null()) {
            when.push_str(&format!(", {label} {}", shown(&cell(Some(at)))));
        }
    }
    writeln!(out, "{when}")?;
    writeln!(out, "counts: {}", counts_line(view.get("counts")))?;
    Ok(())
}

/// `graph ID`: one row per task, with what it still waits on by name where it is one of the
/// graph's (a dependency outside the graph is named by its id).
pub fn write_graph(view: &Value, queues: &QueueNames, out: &mut dyn Write) -> anyhow::Result<()> {
    let tasks = tasks_of(view, "graph")?;
    header(out, "graph", view)?;
    let names: HashMap<String, String> = tasks
        .iter()
        .filter_map(|t| Some((cell(t.get("id")), t.get("name")?.as_str()?.to_string())))
        .collect();
    let mut table = Table::new(&[
        ("Name", Align::Left),
        ("ID", Align::Left),
        ("Queue", Align::Left),
        ("State", Align::Left),
        ("Waiting on", Align::Left),
        ("Cancel reason", Align::Left),
    ]);
    for t in tasks {
        let waiting: Vec<String> = t
            .get("waiting_on")
            .and_then(Value::as_array)
            .map(|ids| {
                ids.iter()
                    .map(|id| {
                        let id = cell(Some(id));
                        names.get(&id).cloned().unwrap_or(id)
                    })
                    .collect()
            })
            .unwrap_or_default();
        table.row(vec![
            cell(t.get("name")),
            cell(t.get("id")),
            queue_of(t, queues),
            cell(t.get("state")),
            waiting.join(", "),
            cell(t.get("cancel_reason")),
        ]);
    }
    write!(out, "{}", table.render())?;
    writeln!(out, "{}.", plural(tasks.len() as u64, "task", "tasks"))?;
    Ok(())
}

/// `batch ID`: the callback, then one row per member the server listed (its first 1000).
pub fn write_batch(view: &Value, queues: &QueueNames, out: &mut dyn Write) -> anyhow::Result<()> {
    let tasks = tasks_of(view, "batch")?;
    header(out, "batch", view)?;
    match view.get("callback").filter(|c| c.is_object()) {
        Some(c) => {
            let mut line = format!(
                "callback: {} {} in {}",
                cell(c.get("id")),
                cell(c.get("state")),
                queue_of(c, queues)
            );
            if let Some(reason) = c.get("cancel_reason").filter(|r| !r.is_null()) {
                line.push_str(&format!(" ({})", cell(Some(reason))));
            }
            writeln!(out, "{}", shown(&line))?;
        }
        None => writeln!(out, "callback: none")?,
    }
    let mut table = Table::new(&[
        ("ID", Align::Left),
        ("Queue", Align::Left),
        ("State", Align::Left),
        ("Cancel reason", Align::Left),
    ]);
    for t in tasks {
        table.row(vec![
            cell(t.get("id")),
            queue_of(t, queues),
            cell(t.get("state")),
            cell(t.get("cancel_reason")),
        ]);
    }
    write!(out, "{}", table.render())?;
    let size = view.get("size").and_then(Value::as_u64).unwrap_or(0);
    if (tasks.len() as u64) < size {
        writeln!(
            out,
            "The first {} of {} (the counts cover them all).",
            tasks.len(),
            plural(size, "task", "tasks")
        )?;
    } else {
        writeln!(out, "{}.", plural(tasks.len() as u64, "task", "tasks"))?;
    }
    Ok(())
}

/// `graphs` and `batches`: one row per workflow, newest first as the server sends them.
pub fn write_list(rows: &[Value], batches: bool, out: &mut dyn Write) -> anyhow::Result<()> {
    let mut columns = vec![
        ("ID", Align::Left),
        ("Created", Align::Left),
        ("Size", Align::Right),
    ];
    if batches {
        columns.extend([("Done", Align::Left), ("Callback", Align::Left)]);
    }
    columns.push(("Cancelled", Align::Left));
    let mut table = Table::new(&columns);
    for r in rows {
        let mut row = vec![cell(r.get("id")), cell(r.get("ctime")), cell(r.get("size"))];
        if batches {
            row.extend([cell(r.get("done")), cell(r.get("callback"))]);
        }
        row.push(cell(r.get("cancelled")));
        table.row(row);
    }
    write!(out, "{}", table.render())?;
    let (one, many) = if batches {
        ("batch", "batches")
    } else {
        ("graph", "graphs")
    };
    writeln!(out, "{}.", plural(rows.len() as u64, one, many))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn text(f: impl FnOnce(&mut Vec<u8>) -> anyhow::Result<()>) -> String {
        let mut out = Vec::new();
        f(&mut out).expect("written");
        String::from_utf8(out).expect("utf-8")
    }

    #[test]
    fn counts_read_in_words_success_first() {
        let counts = json!({"queued": 0, "blocked": 2, "failed": 1, "succeeded": 5, "zz": 1});
        assert_eq!(
            counts_line(Some(&counts)),
            "5 succeeded, 1 failed, 2 blocked, 1 zz"
        );
        assert_eq!(counts_line(Some(&json!({}))), "none");
        assert_eq!(counts_line(None), "none");
    }

    #[test]
    fn a_graph_names_what_its_tasks_wait_on() {
        let view = json!({
            "id": "g1", "ctime": "2026-01-01T00:00:00", "size": 2, "cancelled": null,
            "state": "active", "counts": {"running": 1, "blocked": 1},
            "tasks": [
                {"id": "a1", "queue": "q1", "name": "fetch", "state": "running",
                 "depends_on": [], "waiting_on": [], "cancel_reason": null},
                {"id": "b2", "queue": "q1", "name": "merge", "state": "blocked",
                 "depends_on": ["a1", "x9"], "waiting_on": ["a1", "x9"], "cancel_reason": null},
            ]
        });
        let queues = QueueNames::from([("q1".to_string(), "work".to_string())]);
        let shown = text(|out| write_graph(&view, &queues, out));
        let lines: Vec<&str> = shown.lines().collect();
        assert_eq!(lines[0], "graph g1: active", "{shown}");
        assert_eq!(lines[2], "counts: 1 running, 1 blocked", "{shown}");
        let merge = lines
            .iter()
            .find(|l| l.starts_with("merge"))
            .expect("merge row");
        let cells: Vec<&str> = merge.split_whitespace().collect();
        assert_eq!(cells, ["merge", "b2", "work", "blocked", "fetch,", "x9"]);
        assert!(shown.ends_with("2 tasks.\n"), "{shown}");
    }

    #[test]
    fn a_batch_shows_its_callback_and_how_many_members_it_lists() {
        let view = json!({
            "id": "b1", "ctime": "t0", "size": 3, "cancelled": "t2", "done": "t1",
            "state": "cancelled", "counts": {"cancelled": 3},
            "callback": {"id": "c1", "queue": "q9", "state": "cancelled",
                         "cancel_reason": "its batch was cancelled"},
            "tasks": [{"id": "m1", "queue": "q9", "state": "cancelled"}], "tasks_shown": 1
        });
        let shown = text(|out| write_batch(&view, &QueueNames::new(), out));
        assert!(
            shown.contains("3 tasks, created t0, done t1, cancelled t2"),
            "{shown}"
        );
        assert!(
            shown.contains("callback: c1 cancelled in q9 (its batch was cancelled)"),
            "{shown}"
        );
        assert!(shown.ends_with("The first 1 of 3 tasks (the counts cover them all).\n"));
        let none = json!({"id": "b2", "state": "succeeded", "callback": null, "tasks": []});
        assert!(text(|out| write_batch(&none, &QueueNames::new(), out)).contains("callback: none"));
        assert!(write_batch(&json!({"id": "x"}), &QueueNames::new(), &mut Vec::new()).is_err());
    }

    #[test]
    fn lists_have_a_row_per_workflow() {
        let rows = [
            json!({"id": "b1", "ctime": "t0", "size": 4, "done": null, "callback": "c1",
                          "cancelled": null}),
        ];
        let shown = text(|out| write_list(&rows, true, out));
        assert!(shown.starts_with("ID"), "{shown}");
        assert!(shown.contains("Callback"), "{shown}");
        assert!(shown.ends_with("1 batch.\n"), "{shown}");
        assert!(text(|out| write_list(&[], false, out)).ends_with("0 graphs.\n"));
    }
}
