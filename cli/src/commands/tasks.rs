//! Task creation and search: create-task, create-tasks (argument, collection, file) and tasks.

use std::io::Write;
use std::path::Path;

use anyhow::{anyhow, bail, Context};
use reqwest::Method;
use serde_json::{json, Map, Value};

use super::{pairs, plural, shown, write_raw, Ctx};
use crate::chunked;
use crate::client::Reply;
use crate::envelope::inserted_ids;

/// The `tasks` options, sent as Disbatch's dot options.
#[derive(Debug, Clone, Default)]
pub struct QueryOptions {
    pub count: bool,
    pub limit: u64,
    pub skip: Option<u64>,
    pub fields: Option<String>,
    pub terse: bool,
    pub full: bool,
    pub epoch: bool,
    pub pretty: bool,
}

impl QueryOptions {
    /// Options that shape the server's JSON (Disbatch's dot options): asked for, the JSON is
    /// the output, as in Disbatch's CLI.
    fn shapes_json(&self) -> bool {
        self.fields.is_some() || self.terse || self.full || self.epoch || self.pretty
    }
}

/// One task's params from KEY VALUE arguments, all values strings as in Disbatch.
pub fn task_params(args: &[String]) -> anyhow::Result<Map<String, Value>> {
    Ok(pairs(args, "KEY VALUE")?
        .into_iter()
        .map(|(k, v)| (k.clone(), json!(v)))
        .collect())
}

/// The GET /tasks body: the dot options, overridden by the filter's own keys (as Disbatch
/// merged them, so a filter may carry its own `.limit`).
pub fn tasks_body(
    filter: Option<&str>,
    options: &QueryOptions,
) -> anyhow::Result<Map<String, Value>> {
    let mut body = Map::new();
    body.insert(".limit".into(), json!(options.limit));
    if let Some(skip) = options.skip {
        body.insert(".skip".into(), json!(skip));
    }
    if let Some(fields) = &options.fields {
        let fields: Value = serde_json::from_str(fields)
            .with_context(|| format!("--fields is not valid JSON: '{fields}'"))?;
        body.insert(".fields".into(), fields);
    }
    // 1 rather than true: what Disbatch's CLI sent, so any server reads it.
    for (flag, key) in [
        (options.count, ".count"),
        (options.terse, ".terse"),
        (options.full, ".full"),
        (options.epoch, ".epoch"),
        (options.pretty, ".pretty"),
    ] {
        if flag {
            body.insert(key.into(), json!(1));
        }
    }
    if let Some(filter) = filter {
        match serde_json::from_str::<Value>(filter) {
            Ok(Value::Object(filter)) => body.extend(filter),
            _ => bail!("Invalid filter is not a JSON object: '{filter}'"),
        }
    }
    Ok(body)
}

pub async fn query(
    ctx: &Ctx,
    filter: Option<&str>,
    options: &QueryOptions,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let body = Value::Object(tasks_body(filter, options)?);
    let reply = ctx
        .client
        .call(Method::GET, &["tasks"], Some(&body))
        .await?;
    if options.count && !ctx.json {
        let count = reply
            .value
            .get("count")
            .and_then(Value::as_u64)
            .ok_or_else(|| {
                anyhow!(
                    "unexpected response from the server: no count in {}",
                    reply.value
                )
            })?;
        writeln!(out, "{}", plural(count, "task", "tasks"))?;
    } else if ctx.json || options.shapes_json() {
        // The server already applied .pretty; its text is the output.
        write_raw(out, &reply.raw)?;
    } else {
        let tasks = super::array(&reply, "tasks")?;
        let names = match tasks.is_empty() {
            true => Default::default(),
            false => super::queue_names(ctx).await,
        };
        super::task_view::write_tasks_table(tasks, &names, out)?;
    }
    Ok(())
}

pub async fn create_one(
    ctx: &Ctx,
    queue: &str,
    args: &[String],
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let body = json!({"queue": queue, "params": task_params(args)?});
    let reply = ctx
        .client
        .call(Method::POST, &["tasks"], Some(&body))
        .await?;
    report_created(ctx, queue, &reply, out)
}

/// `create-tasks QUEUE JSON`: an array of params, or with `--collection` a
/// `{"filter":…,"params":…}` template. The shape is left to the server to judge, so its
/// messages stay Disbatch's; only JSON syntax is checked here.
pub async fn create_many(
    ctx: &Ctx,
    queue: &str,
    data: &str,
    collection: Option<&str>,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let data: Value =
        serde_json::from_str(data).with_context(|| format!("invalid JSON argument: '{data}'"))?;
    let body = match collection {
        Some(collection) => {
            let Value::Object(mut body) = data else {
                bail!("with --collection the argument must be a JSON object {{\"filter\":{{…}},\"params\":{{…}}}}");
            };
            body.insert("collection".into(), json!(collection));
            body.insert("queue".into(), json!(queue));
            Value::Object(body)
        }
        None => json!({"queue": queue, "params": data}),
    };
    let reply = ctx
        .client
        .call(Method::POST, &["tasks"], Some(&body))
        .await?;
    report_created(ctx, queue, &reply, out)
}

fn report_created(
    ctx: &Ctx,
    queue: &str,
    reply: &Reply,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    if ctx.raw(reply, out)? {
        return Ok(());
    }
    let ids = inserted_ids(&reply.value)?;
    writeln!(
        out,
        "Created {} in queue {}",
        plural(ids.len() as u64, "task", "tasks"),
        shown(queue)
    )?;
    for id in ids {
        writeln!(out, "{id}")?;
    }
    Ok(())
}

/// `create-tasks QUEUE --file PATH`: JSON lines sent in chunks. Ids are not listed: a file
/// may hold millions of tasks, and `--json` gives every reply for those who need them.
pub async fn create_from_file(
    ctx: &Ctx,
    queue: &str,
    path: &Path,
    chunk_size: u64,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let name = if path == Path::new("-") {
        "stdin".to_string()
    } else {
        path.display().to_string()
    };
    let text = chunked::read_input(path)?;
    let entries =
        chunked::parse_json_lines(&text).map_err(|e| anyhow!("{name} {e}; nothing was sent"))?;
    if entries.is_empty() {
        bail!("{name} holds no tasks (every line is blank)");
    }
    let chunk_size = usize::try_from(chunk_size).unwrap_or(usize::MAX);
    let bar = chunked::progress_bar(entries.len() as u64, ctx.json);
    let json_out = if ctx.json { Some(&mut *out) } else { None };
    let created = chunked::upload(&ctx.client, queue, &entries, chunk_size, &bar, json_out).await?;
    if !ctx.json {
        writeln!(
            out,
            "Created {} in queue {}",
            plural(created, "task", "tasks"),
            shown(queue)
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options() -> QueryOptions {
        QueryOptions {
            limit: 20,
            ..QueryOptions::default()
        }
    }

    #[test]
    fn default_body_is_just_the_limit() {
        assert_eq!(
            Value::Object(tasks_body(None, &options()).unwrap()),
            json!({".limit": 20})
        );
    }

    #[test]
    fn filter_and_options_merge() {
        let opts = QueryOptions {
            count: true,
            skip: Some(5),
            fields: Some(r#"["status","node"]"#.into()),
            terse: true,
            full: true,
            epoch: true,
            pretty: true,
            ..options()
        };
        let body = tasks_body(Some(r#"{"queue":"demo","status":-2}"#), &opts).unwrap();
        assert_eq!(
            Value::Object(body),
            json!({"queue": "demo", "status": -2, ".limit": 20, ".skip": 5, ".count": 1,
                   ".fields": ["status", "node"], ".terse": 1, ".full": 1, ".epoch": 1, ".pretty": 1})
        );
    }

    #[test]
    fn the_filter_wins_over_options() {
        let body = tasks_body(Some(r#"{".limit": 3}"#), &options()).unwrap();
        assert_eq!(Value::Object(body), json!({".limit": 3}));
    }

    #[test]
    fn filters_must_be_objects() {
        for bad in ["[]", "3", "not json", ""] {
            let err = tasks_body(Some(bad), &options()).unwrap_err().to_string();
            assert_eq!(err, format!("Invalid filter is not a JSON object: '{bad}'"));
        }
        let opts = QueryOptions {
            fields: Some("[oops".into()),
            ..options()
        };
        assert!(tasks_body(None, &opts)
            .unwrap_err()
            .to_string()
            .contains("--fields"));
    }

    #[test]
    fn task_params_are_strings() {
        let args: Vec<String> = ["user", "ashley", "n", "1"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(
            Value::Object(task_params(&args).unwrap()),
            json!({"user": "ashley", "n": "1"})
        );
        assert_eq!(Value::Object(task_params(&[]).unwrap()), json!({}));
        assert!(task_params(&args[..3]).is_err());
    }
}
