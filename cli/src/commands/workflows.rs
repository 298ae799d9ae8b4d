//! `graph`, `graphs`, `batch`, `batches`: task graphs and batches created from a file, shown,
//! listed, cancelled, and waited for until they end, the exit status saying how they ended.

use std::io::{IsTerminal, Read, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use reqwest::Method;
use serde_json::{json, Value};

use super::workflow_view::{counts_line, write_batch, write_graph, write_list};
use super::{array, cell, plural, shown, Ctx};
use crate::args::WorkflowArgs;
use crate::client::Reply;
use crate::envelope::oid;
use crate::exit::WorkflowEnded;
use crate::exit::{HttpError, Unreachable};

/// How long `--wait` rides out a server it cannot reach or that fails (a DCI restarting):
/// a long wait should not be lost to a blip, nor hang on a server that is gone.
const OUTAGE_TOLERANCE: Duration = Duration::from_secs(60);

/// Task states after which a task never runs again on its own.
const ENDED: &[&str] = &["succeeded", "failed", "cancelled", "terminated", "orphaned"];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Graph,
    Batch,
}

impl Kind {
    fn noun(self) -> &'static str {
        match self {
            Kind::Graph => "graph",
            Kind::Batch => "batch",
        }
    }

    /// The route's collection segment.
    fn route(self) -> &'static str {
        match self {
            Kind::Graph => "graphs",
            Kind::Batch => "batches",
        }
    }
}

/// How a graph or batch that is no longer active ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Succeeded,
    Failed,
    Cancelled,
}

/// `graph …` / `batch …`: create, then cancel, then wait, as asked; or just show.
pub async fn run(
    ctx: &Ctx,
    kind: Kind,
    args: &WorkflowArgs,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    // With --wait, --json prints only the last state: one JSON document for a script.
    let quiet_json = ctx.json && args.wait;
    let id = match (&args.create, &args.id) {
        (Some(file), _) => create(ctx, kind, file, quiet_json, out).await?,
        (None, Some(id)) => id.clone(),
        (None, None) => return Err(crate::exit::usage("give an id or --create FILE")),
    };
    if args.cancel {
        cancel(ctx, kind, &id, quiet_json, out).await?;
    }
    if args.wait {
        let interval = Duration::from_secs_f64(args.interval);
        return wait(ctx, kind, &id, interval, out).await;
    }
    if args.create.is_some() || args.cancel {
        return Ok(());
    }
    let reply = get(ctx, kind, &id).await?;
    write_view(ctx, kind, &reply, out).await
}

/// The request body from a file's JSON: the body itself, or just its tasks array.
pub fn request_body(kind: Kind, value: Value) -> anyhow::Result<Value> {
    match value {
        Value::Array(tasks) => Ok(json!({"tasks": tasks})),
        v @ Value::Object(_) => Ok(v),
        _ => Err(crate::exit::usage(format!(
            "a {} file holds a JSON object {{\"tasks\": […]}} or an array of tasks",
            kind.noun()
        ))),
    }
}

fn read_file(file: &Path) -> anyhow::Result<String> {
    if file == Path::new("-") {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .context("reading stdin")?;
        return Ok(text);
    }
    std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))
}

/// POSTs the file's graph or batch and prints what was made; returns its id.
async fn create(
    ctx: &Ctx,
    kind: Kind,
    file: &Path,
    quiet: bool,
    out: &mut dyn Write,
) -> anyhow::Result<String> {
    let text = read_file(file)?;
    // serde_json's error stays in the chain: a bad file is a usage error (exit 2).
    let value: Value =
        serde_json::from_str(&text).with_context(|| format!("{}: not JSON", file.display()))?;
    let body = request_body(kind, value)?;
    let reply = ctx
        .client
        .call(Method::POST, &[kind.route()], Some(&body))
        .await?;
    let id = reply
        .value
        .get(kind.noun())
        .and_then(|v| oid(v).map(str::to_string))
        .ok_or_else(|| {
            anyhow!(
                "unexpected response from the server: no {} id in the answer",
                kind.noun()
            )
        })?;
    if quiet || ctx.raw(&reply, out)? {
        return Ok(id);
    }
    match kind {
        Kind::Graph => {
            let ids = reply.value.get("ids").and_then(Value::as_object);
            let n = ids.map_or(0, |m| m.len() as u64);
            writeln!(
                out,
                "Created graph {} with {}:",
                shown(&id),
                plural(n, "task", "tasks")
            )?;
            for (name, task) in ids.into_iter().flatten() {
                writeln!(out, "{}  {}", shown(&cell(Some(task))), shown(name))?;
            }
        }
        Kind::Batch => {
            let n = reply
                .value
                .get("ids")
                .and_then(Value::as_array)
                .map_or(0, |a| a.len() as u64);
            let callback = match reply.value.get("callback").filter(|c| !c.is_null()) {
                Some(c) => format!(", callback {}", shown(&cell(Some(c)))),
                None => String::new(),
            };
            writeln!(
                out,
                "Created batch {} with {}{callback}.",
                shown(&id),
                plural(n, "task", "tasks")
            )?;
        }
    }
    Ok(id)
}

async fn cancel(
    ctx: &Ctx,
    kind: Kind,
    id: &str,
    quiet: bool,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let reply = ctx
        .client
        .call(Method::POST, &[kind.route(), id, "cancel"], None)
        .await?;
    if quiet || ctx.raw(&reply, out)? {
        return Ok(());
    }
    let n = |k: &str| reply.value.get(k).and_then(Value::as_u64).unwrap_or(0);
    writeln!(
        out,
        "Cancelled {} {}: {} cancelled, {} asked to stop.",
        kind.noun(),
        shown(id),
        plural(n("cancelled"), "task", "tasks"),
        plural(n("requested"), "running task", "running tasks")
    )?;
    Ok(())
}

async fn get(ctx: &Ctx, kind: Kind, id: &str) -> anyhow::Result<Reply> {
    ctx.client
        .call(Method::GET, &[kind.route(), id], None)
        .await
}

async fn write_view(
    ctx: &Ctx,
    kind: Kind,
    reply: &Reply,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    if ctx.raw(reply, out)? {
        return Ok(());
    }
    let queues = super::queue_names(ctx).await;
    match kind {
        Kind::Graph => write_graph(&reply.value, &queues, out),
        Kind::Batch => write_batch(&reply.value, &queues, out),
    }
}

/// None while the graph or batch (and a batch's callback) may still change; else how it
/// ended. A batch whose members all succeeded but whose callback did not has failed.
pub fn outcome(kind: Kind, view: &Value) -> anyhow::Result<Option<Outcome>> {
    let state = view.get("state").and_then(Value::as_str).ok_or_else(|| {
        anyhow!(
            "unexpected response from the server: no state in the {}",
            kind.noun()
        )
    })?;
    let callback = view
        .get("callback")
        .filter(|c| kind == Kind::Batch && c.is_object());
    let callback_state = callback.map(|c| c.get("state").and_then(Value::as_str).unwrap_or(""));
    if state == "active" || callback_state.is_some_and(|s| !ENDED.contains(&s)) {
        return Ok(None);
    }
    Ok(Some(match state {
        "succeeded" if callback_state.is_none_or(|s| s == "succeeded") => Outcome::Succeeded,
        "succeeded" | "failed" => Outcome::Failed,
        "cancelled" => Outcome::Cancelled,
        other => bail!(
            "unexpected response from the server: the {} is {}",
            kind.noun(),
            shown(other)
        ),
    }))
}

/// A failure of the server that may pass: unreachable, or a 5xx (a DCI restarting, the
/// database failing over).
fn passing(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.is::<Unreachable>()
            || c.downcast_ref::<HttpError>()
                .is_some_and(|h| h.status.is_server_error())
    })
}

/// Polls every `interval` until the graph or batch has ended, prints it, and returns its
/// outcome: Ok when it succeeded, else a [`WorkflowEnded`] whose exit status says how.
async fn wait(
    ctx: &Ctx,
    kind: Kind,
    id: &str,
    interval: Duration,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    // Progress is for a person watching; a script reads the final state and the status.
    let progress = !ctx.json && std::io::stderr().is_terminal();
    let mut last_line = String::new();
    let mut outage: Option<Instant> = None;
    loop {
        match get(ctx, kind, id).await {
            Ok(reply) => {
                outage = None;
                if let Some(ended) = outcome(kind, &reply.value)? {
                    write_view(ctx, kind, &reply, out).await?;
                    return finish(kind, id, ended, &reply.value);
                }
                if progress {
                    let line = format!(
                        "{} {}: active: {}",
                        kind.noun(),
                        shown(id),
                        counts_line(reply.value.get("counts"))
                    );
                    if line != last_line {
                        eprintln!("{line}");
                        last_line = line;
                    }
                }
            }
            Err(e) if passing(&e) => {
                let since = *outage.get_or_insert_with(|| {
                    eprintln!("{}; trying again", shown(&format!("{e:#}")));
                    Instant::now()
                });
                if since.elapsed() >= OUTAGE_TOLERANCE {
                    return Err(e.context(format!(
                        "waiting for {} {}: no answer for {} s",
                        kind.noun(),
                        shown(id),
                        OUTAGE_TOLERANCE.as_secs()
                    )));
                }
            }
            Err(e) => return Err(e),
        }
        tokio::time::sleep(interval).await;
    }
}

fn finish(kind: Kind, id: &str, ended: Outcome, view: &Value) -> anyhow::Result<()> {
    let how = match ended {
        Outcome::Succeeded => return Ok(()),
        Outcome::Failed => "failed",
        Outcome::Cancelled => "was cancelled",
    };
    Err(WorkflowEnded {
        message: format!(
            "{} {} {how}: {}",
            kind.noun(),
            shown(id),
            counts_line(view.get("counts"))
        ),
        cancelled: ended == Outcome::Cancelled,
    }
    .into())
}

/// `graphs` / `batches`.
pub async fn list(ctx: &Ctx, kind: Kind, limit: u64, out: &mut dyn Write) -> anyhow::Result<()> {
    let (_, raw) = ctx
        .client
        .get_bytes(&[kind.route()], &[(".limit", limit.to_string())])
        .await?;
    // Formatted, not kept as a cause: a reply that is not JSON is no usage error.
    let value = serde_json::from_slice(&raw)
        .map_err(|e| anyhow!("GET {}: the response is not JSON ({e})", kind.route()))?;
    let reply = Reply { raw, value };
    if ctx.raw(&reply, out)? {
        return Ok(());
    }
    let rows = array(&reply, kind.route())?;
    write_list(rows, kind == Kind::Batch, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_holds_the_body_or_just_its_tasks() {
        let tasks = json!([{"queue": "q"}]);
        assert_eq!(
            request_body(Kind::Batch, tasks.clone()).expect("array"),
            json!({"tasks": tasks})
        );
        let body = json!({"tasks": tasks, "callback": {"queue": "q"}});
        assert_eq!(
            request_body(Kind::Batch, body.clone()).expect("object"),
            body
        );
        let e = request_body(Kind::Graph, json!("x")).expect_err("a string");
        assert_eq!(crate::exit::status_for(&e), crate::exit::USAGE);
    }

    #[test]
    fn outcomes_wait_for_the_callback_and_count_it() {
        let graph = |state: &str| json!({"state": state, "tasks": []});
        assert_eq!(outcome(Kind::Graph, &graph("active")).ok(), Some(None));
        assert_eq!(
            outcome(Kind::Graph, &graph("succeeded")).ok(),
            Some(Some(Outcome::Succeeded))
        );
        assert_eq!(
            outcome(Kind::Graph, &graph("failed")).ok(),
            Some(Some(Outcome::Failed))
        );
        assert_eq!(
            outcome(Kind::Graph, &graph("cancelled")).ok(),
            Some(Some(Outcome::Cancelled))
        );
        assert!(outcome(Kind::Graph, &graph("odd")).is_err());
        assert!(outcome(Kind::Graph, &json!({})).is_err());
        let batch = |state: &str, callback: &str| json!({"state": state, "callback": {"id": "c", "state": callback}});
        assert_eq!(
            outcome(Kind::Batch, &batch("succeeded", "blocked")).ok(),
            Some(None)
        );
        assert_eq!(
            outcome(Kind::Batch, &batch("succeeded", "succeeded")).ok(),
            Some(Some(Outcome::Succeeded))
        );
        assert_eq!(
            outcome(Kind::Batch, &batch("succeeded", "failed")).ok(),
            Some(Some(Outcome::Failed))
        );
        assert_eq!(
            outcome(Kind::Batch, &batch("failed", "succeeded")).ok(),
            Some(Some(Outcome::Failed))
        );
        let no_callback = json!({"state": "succeeded", "callback": null});
        assert_eq!(
            outcome(Kind::Batch, &no_callback).ok(),
            Some(Some(Outcome::Succeeded))
        );
    }

    #[test]
    fn an_ended_workflow_exits_by_how_it_ended() {
        let view = json!({"counts": {"succeeded": 2, "failed": 1}});
        assert!(finish(Kind::Graph, "g", Outcome::Succeeded, &view).is_ok());
        let e = finish(Kind::Graph, "g", Outcome::Failed, &view).expect_err("failed");
        assert_eq!(e.to_string(), "graph g failed: 2 succeeded, 1 failed");
        assert_eq!(crate::exit::status_for(&e), crate::exit::WORKFLOW_FAILED);
        let e = finish(Kind::Batch, "b", Outcome::Cancelled, &view).expect_err("cancelled");
        assert_eq!(crate::exit::status_for(&e), crate::exit::WORKFLOW_CANCELLED);
    }

    #[test]
    fn only_server_trouble_is_waited_out() {
        let unreachable = anyhow::Error::new(Unreachable("refused".into()));
        assert!(passing(&unreachable));
        let http = |code: u16| {
            anyhow::Error::new(HttpError {
                method: Method::GET,
                url: "u".into(),
                status: reqwest::StatusCode::from_u16(code).expect("status"),
                message: String::new(),
                body: None,
            })
        };
        assert!(passing(&http(503)));
        assert!(!passing(&http(404)));
        assert!(!passing(&anyhow!("other")));
    }
}
