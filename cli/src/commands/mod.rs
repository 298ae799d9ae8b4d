//! Runs one parsed command against the server and writes its output.

mod balance;
mod failures;
mod limits;
mod nodes;
mod queue_ops;
mod queues;
mod specs;
mod task_ops;
mod task_view;
mod tasks;
mod top;
pub mod users;
mod workflow_view;
mod workflows;

pub use queues::update_body;
pub use tasks::{task_params, tasks_body};

use std::borrow::Cow;
use std::io::Write;

use disbatch_model::text::printable;
use serde_json::Value;

use crate::args::{Command, SpecAction};
use crate::client::{Client, Reply};

/// What every command needs: the server and the output mode.
pub struct Ctx {
    pub client: Client,
    /// `--json`: print the server's JSON instead of human output.
    pub json: bool,
}

impl Ctx {
    /// In `--json` mode writes the reply as the server sent it and returns true, so the
    /// caller skips its human output.
    fn raw(&self, reply: &Reply, out: &mut dyn Write) -> anyhow::Result<bool> {
        if self.json {
            write_raw(out, &reply.raw)?;
        }
        Ok(self.json)
    }
}

/// Writes a JSON body as received, ending it with a newline if it has none. Control, bidi and
/// invisible characters in its strings become `\uXXXX` escapes: the same JSON value, but a
/// stored name cannot drive the terminal (ESC) or show itself reversed (U+202E).
pub(crate) fn write_raw(out: &mut dyn Write, raw: &[u8]) -> std::io::Result<()> {
    let text = String::from_utf8_lossy(raw);
    let text = printable::json_text(&text);
    out.write_all(text.as_bytes())?;
    if !text.ends_with('\n') {
        out.write_all(b"\n")?;
    }
    Ok(())
}

/// A name or other stored text for a line of human output: escaped and cut (see `printable`).
fn shown(text: &str) -> Cow<'_, str> {
    printable::shown(text)
}

/// A JSON value as a table cell or list line: strings bare, null blank, the rest as JSON.
fn cell(value: Option<&Value>) -> String {
    match value {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    }
}

/// "1 task", "2 tasks": a count with its noun.
fn plural(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// Splits KEY VALUE arguments into pairs; an odd count is a usage mistake worth a clear error.
fn pairs<'a>(args: &'a [String], names: &str) -> anyhow::Result<Vec<(&'a String, &'a String)>> {
    if args.len() % 2 == 1 {
        return Err(crate::exit::usage(format!(
            "expected {names} pairs, got an odd number of arguments ({}): {}",
            args.len(),
            args.join(" ")
        )));
    }
    Ok(args
        .chunks_exact(2)
        .map(|pair| (&pair[0], &pair[1]))
        .collect())
}

/// Queue names for the tables, read once per listing (one `GET /queues`, not one request per
/// row); without them (no access, an error) ids are shown instead.
async fn queue_names(ctx: &Ctx) -> workflow_view::QueueNames {
    let Ok(reply) = ctx
        .client
        .call(reqwest::Method::GET, &["queues"], None)
        .await
    else {
        return workflow_view::QueueNames::new();
    };
    reply
        .value
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|q| {
            let id = q
                .get("id")
                .or_else(|| q.get("_id"))
                .and_then(crate::envelope::oid)?;
            Some((id.to_string(), q.get("name")?.as_str()?.to_string()))
        })
        .collect()
}

/// The reply as an array, or an error naming what was expected.
fn array<'a>(reply: &'a Reply, what: &str) -> anyhow::Result<&'a Vec<Value>> {
    reply.value.as_array().ok_or_else(|| {
        anyhow::anyhow!("unexpected response from the server: expected a JSON array of {what}")
    })
}

/// Runs one command through its group. A group's last arm is for the commands this match
/// sends elsewhere: no input reaches it, and a mistake there is an error, not a panic.
pub async fn dispatch(ctx: &Ctx, command: Command, out: &mut dyn Write) -> anyhow::Result<()> {
    match command {
        command @ (Command::Plugins
        | Command::Queues
        | Command::CreateQueue { .. }
        | Command::UpdateQueue { .. }
        | Command::DeleteQueue { .. }
        | Command::Limits { .. }
        | Command::Pause { .. }
        | Command::Resume { .. }
        | Command::Units { .. }
        | Command::Summary
        | Command::Spec { .. }) => queue_command(ctx, command, out).await,
        command @ (Command::CreateTask { .. }
        | Command::CreateTasks { .. }
        | Command::Tasks { .. }
        | Command::Failures { .. }) => tasks_command(ctx, command, out).await,
        command @ (Command::Task { .. }
        | Command::Attempts { .. }
        | Command::Result { .. }
        | Command::Cancel { .. }
        | Command::Discard { .. }
        | Command::Retry { .. }
        | Command::DeleteTask { .. }
        | Command::Stdout { .. }
        | Command::Stderr { .. }) => one_task_command(ctx, command, out).await,
        command @ (Command::Nodes
        | Command::SetMaxthreads { .. }
        | Command::Balance { .. }
        | Command::Top { .. }) => fleet_command(ctx, command, out).await,
        command @ (Command::Graph { .. }
        | Command::Graphs { .. }
        | Command::Batch { .. }
        | Command::Batches { .. }) => workflow_command(ctx, command, out).await,
        // Handled before a client exists: it needs no server.
        Command::Completions { .. } => Ok(()),
        // Handled in main: it talks to MongoDB, not to the DCI.
        Command::CreateUsers { .. } => Ok(()),
    }
}

/// A command a group was handed but does not run: a slip in `dispatch`, never the user's input.
fn misrouted(command: &Command) -> anyhow::Error {
    anyhow::anyhow!("internal error: the command {command:?} was sent to the wrong group")
}

async fn queue_command(ctx: &Ctx, command: Command, out: &mut dyn Write) -> anyhow::Result<()> {
    match command {
        Command::Plugins => queues::plugins(ctx, out).await,
        Command::Queues => queues::list(ctx, out).await,
        Command::CreateQueue {
            name,
            plugin,
            threads,
            sort,
            retry,
        } => queues::create(ctx, &name, &plugin, threads, sort, retry.as_deref(), out).await,
        Command::UpdateQueue { queue, pairs } => queues::update(ctx, &queue, &pairs, out).await,
        Command::DeleteQueue { queue } => queues::delete(ctx, &queue, out).await,
        Command::Limits { queue, options } => limits::limits(ctx, &queue, &options, out).await,
        Command::Pause { queue } => queue_ops::pause_or_resume(ctx, &queue, "pause", out).await,
        Command::Resume { queue } => queue_ops::pause_or_resume(ctx, &queue, "resume", out).await,
        Command::Units {
            queue,
            data,
            file,
            update,
        } => queue_ops::add_units(ctx, &queue, data.as_deref(), file.as_deref(), update, out).await,
        Command::Summary => queues::summary(ctx, out).await,
        Command::Spec {
            action:
                SpecAction::Load {
                    file,
                    plugin,
                    dry_run,
                },
        } => specs::load(ctx, out, &file, plugin.as_deref(), dry_run).await,
        other => Err(misrouted(&other)),
    }
}

/// Commands that create tasks or find many at once.
async fn tasks_command(ctx: &Ctx, command: Command, out: &mut dyn Write) -> anyhow::Result<()> {
    match command {
        Command::CreateTask {
            queue,
            pairs,
            timing,
        } => tasks::create_one(ctx, &queue, &pairs, &timing, out).await,
        Command::CreateTasks {
            queue,
            data,
            collection,
            file,
            chunk_size,
            timing,
        } => match file {
            Some(path) => {
                tasks::create_from_file(ctx, &queue, &path, chunk_size, &timing, out).await
            }
            None => {
                let data = data.unwrap_or_default();
                tasks::create_many(ctx, &queue, &data, collection.as_deref(), &timing, out).await
            }
        },
        Command::Tasks {
            filter,
            search,
            count,
            limit,
            skip,
            fields,
            terse,
            full,
            epoch,
            pretty,
        } => {
            let options = tasks::QueryOptions {
                count,
                limit,
                skip,
                fields,
                terse,
                full,
                epoch,
                pretty,
            };
            tasks::query(ctx, filter.as_deref(), &search, &options, out).await
        }
        Command::Failures {
            queue,
            limit,
            retry,
            discard,
        } => {
            let action = match (retry, discard) {
                (true, _) => Some(failures::Action::Retry),
                (_, true) => Some(failures::Action::Discard),
                _ => None,
            };
            failures::list(ctx, queue.as_deref(), limit, action, out).await
        }
        other => Err(misrouted(&other)),
    }
}

/// Commands that read or act on one task (`retry --queue` too: it shares `retry`'s verb).
async fn one_task_command(ctx: &Ctx, command: Command, out: &mut dyn Write) -> anyhow::Result<()> {
    match command {
        Command::Task { task_id } => task_view::show(ctx, &task_id, out).await,
        Command::Attempts { task_id } => task_view::attempts(ctx, &task_id, out).await,
        Command::Result { task_id, attempt } => {
            task_view::result(ctx, &task_id, attempt.as_deref(), out).await
        }
        Command::Cancel { task_id } => task_ops::cancel(ctx, &task_id, out).await,
        Command::Discard { task_id } => task_ops::discard(ctx, &task_id, out).await,
        Command::Retry {
            task_id,
            queue,
            status,
        } => match (task_id, queue) {
            (_, Some(queue)) => task_ops::retry_queue(ctx, &queue, &status, out).await,
            (Some(task_id), None) => task_ops::retry(ctx, &task_id, out).await,
            // clap requires one of the two.
            (None, None) => anyhow::bail!("retry needs a TASK_ID or --queue QUEUE"),
        },
        Command::DeleteTask { task_id } => task_ops::delete(ctx, &task_id, out).await,
        Command::Stdout { task_id, follow } => {
            task_ops::output(ctx, &task_id, "stdout", follow, out).await
        }
        Command::Stderr { task_id, follow } => {
            task_ops::output(ctx, &task_id, "stderr", follow, out).await
        }
        other => Err(misrouted(&other)),
    }
}

/// Nodes, the QueueBalance and the live view of both.
async fn fleet_command(ctx: &Ctx, command: Command, out: &mut dyn Write) -> anyhow::Result<()> {
    match command {
        Command::Nodes => nodes::list(ctx, out).await,
        Command::SetMaxthreads { node, maxthreads } => {
            nodes::set_maxthreads(ctx, &node, maxthreads.0, out).await
        }
        Command::Balance { set } => balance::balance(ctx, set.as_deref(), out).await,
        Command::Top {
            interval,
            iterations,
        } => {
            let interval = std::time::Duration::from_secs_f64(interval);
            top::top(ctx, interval, iterations, out).await
        }
        other => Err(misrouted(&other)),
    }
}

async fn workflow_command(ctx: &Ctx, command: Command, out: &mut dyn Write) -> anyhow::Result<()> {
    match command {
        Command::Graph { options } => {
            workflows::run(ctx, workflows::Kind::Graph, &options, out).await
        }
        Command::Graphs { limit } => workflows::list(ctx, workflows::Kind::Graph, limit, out).await,
        Command::Batch { options } => {
            workflows::run(ctx, workflows::Kind::Batch, &options, out).await
        }
        Command::Batches { limit } => {
            workflows::list(ctx, workflows::Kind::Batch, limit, out).await
        }
        other => Err(misrouted(&other)),
    }
}
