//! Task creation and search: create-task, create-tasks (argument, collection, file) and tasks.

use std::io::Write;
use std::path::Path;

use anyhow::{anyhow, bail, Context};
use reqwest::Method;
use serde_json::{json, Map, Value};

use super::{pairs, plural, shown, write_raw, Ctx};
use crate::args::{TaskSearch, TaskTiming};
use crate::chunked;
use crate::client::Reply;
use crate::envelope::inserted_ids;

impl TaskSearch {
    /// The filter keys the flags give.
    fn keys(&self) -> anyhow::Result<Map<String, Value>> {
        let mut keys = Map::new();
        for (key, value) in [
            ("queue", &self.queue),
            ("node", &self.node),
            ("since", &self.since),
            ("until", &self.until),
        ] {
            if let Some(v) = value {
                keys.insert(key.into(), json!(v));
            }
        }
        if let Some(s) = &self.status {
            // A code is sent as a number, as Disbatch searched it; a word as a word.
            let code = s.trim().parse::<i64>().ok();
            keys.insert("status".into(), code.map_or_else(|| json!(s), |c| json!(c)));
        }
        if let Some(n) = self.bound {
            keys.insert("limit".into(), json!(n));
        }
        for (path, value) in key_values(&self.params)? {
            keys.insert(format!("params.{path}"), value);
        }
        Ok(keys)
    }
}

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

/// One task's params from `create-task`'s arguments. KEY=VALUE arguments read each value as
/// JSON where it parses (as `jq --argjson`), else as text, so `id=1` is a number and matches
/// a `unique` key of 1. Disbatch's KEY VALUE pairs (the first argument has no `=`) keep
/// every value text, as its CLI sent them: a Perl-era script gets the params it always got.
pub fn task_params(args: &[String]) -> anyhow::Result<Map<String, Value>> {
    match args.first() {
        Some(first) if first.contains('=') => key_values(args),
        _ => Ok(pairs(args, "KEY VALUE")?
            .into_iter()
            .map(|(k, v)| (k.clone(), json!(v)))
            .collect()),
    }
}

fn key_values(args: &[String]) -> anyhow::Result<Map<String, Value>> {
    let mut params = Map::new();
    for arg in args {
        let Some((key, text)) = arg.split_once('=') else {
            return Err(crate::exit::usage(format!(
                "argument '{arg}' is not KEY=VALUE: give every argument as KEY=VALUE, or all as Disbatch's KEY VALUE pairs"
            )));
        };
        if key.is_empty() {
            return Err(crate::exit::usage(format!(
                "argument '{arg}' has no key before '='"
            )));
        }
        let value = serde_json::from_str(text).unwrap_or_else(|_| json!(text));
        if params.insert(key.to_string(), value).is_some() {
            return Err(crate::exit::usage(format!("key '{key}' is given twice")));
        }
    }
    Ok(params)
}

/// The GET /tasks body: the dot options, overridden by the filter's own keys (as Disbatch
/// merged them, so a filter may carry its own `.limit`).
pub fn tasks_body(
    filter: Option<&str>,
    search: &TaskSearch,
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
    let mut keys = Map::new();
    if let Some(filter) = filter {
        match serde_json::from_str::<Value>(filter) {
            Ok(Value::Object(filter)) => keys.extend(filter),
            _ => bail!("Invalid filter is not a JSON object: '{filter}'"),
        }
    }
    for (key, value) in search.keys()? {
        if keys.contains_key(&key) {
            return Err(crate::exit::usage(format!(
                "'{key}' is given both in the filter and by a flag: give it once"
            )));
        }
        keys.insert(key, value);
    }
    body.extend(keys);
    Ok(body)
}

pub async fn query(
    ctx: &Ctx,
    filter: Option<&str>,
    search: &TaskSearch,
    options: &QueryOptions,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let body = Value::Object(tasks_body(filter, search, options)?);
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

/// The body keys of `--not-before`, `--delay-s` and `--priority`, as given.
pub fn timing_keys(timing: &TaskTiming) -> Map<String, Value> {
    let mut keys = Map::new();
    if let Some(t) = &timing.not_before {
        keys.insert("not_before".into(), json!(t));
    }
    if let Some(s) = timing.delay_s {
        keys.insert("delay_s".into(), json!(s));
    }
    if let Some(p) = timing.priority {
        keys.insert("priority".into(), json!(p));
    }
    keys
}

fn with_timing(mut body: Value, timing: &TaskTiming) -> Value {
    if let Value::Object(m) = &mut body {
        m.extend(timing_keys(timing));
    }
    body
}

pub async fn create_one(
    ctx: &Ctx,
    queue: &str,
    args: &[String],
    timing: &TaskTiming,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let params = Value::Object(task_params(args)?);
    let body = with_timing(json!({"queue": queue, "params": params}), timing);
    let inputs = Inputs::Params(std::slice::from_ref(&params));
    create(ctx, queue, body, inputs, out).await
}

/// `create-tasks QUEUE JSON`: an array of params, or with `--collection` a
/// `{"filter":…,"params":…}` template. The shape is left to the server to judge, so its
/// messages stay Disbatch's; only JSON syntax is checked here.
pub async fn create_many(
    ctx: &Ctx,
    queue: &str,
    data: &str,
    collection: Option<&str>,
    timing: &TaskTiming,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let data: Value =
        serde_json::from_str(data).with_context(|| format!("invalid JSON argument: '{data}'"))?;
    let (body, inputs) = match collection {
        Some(collection) => {
            let Value::Object(mut body) = data else {
                bail!("with --collection the argument must be a JSON object {{\"filter\":{{…}},\"params\":{{…}}}}");
            };
            body.insert("collection".into(), json!(collection));
            body.insert("queue".into(), json!(queue));
            (with_timing(Value::Object(body), timing), Inputs::Documents)
        }
        None => {
            let inputs = match &data {
                Value::Array(items) => Inputs::Params(items.as_slice()),
                one => Inputs::Params(std::slice::from_ref(one)),
            };
            let body = with_timing(json!({"queue": queue, "params": &data}), timing);
            return create(ctx, queue, body, inputs, out).await;
        }
    };
    create(ctx, queue, body, inputs, out).await
}

/// What a creation's inputs were, to name a duplicate by what was sent.
#[derive(Clone, Copy)]
enum Inputs<'a> {
    Params(&'a [Value]),
    /// One task per document of a collection: only their order is known here.
    Documents,
}

impl Inputs<'_> {
    fn describe(&self, index: usize) -> String {
        match self {
            Inputs::Params([one]) if index == 0 => format!("params {}", shown(&one.to_string())),
            Inputs::Params(items) => match items.get(index) {
                Some(p) => format!("params[{index}] {}", shown(&p.to_string())),
                None => format!("params[{index}]"),
            },
            Inputs::Documents => format!("document {index}"),
        }
    }
}

/// Sends a creation and reports it. Human output asks for the `ids` answer, which lists every
/// input's task; `--json` keeps Disbatch's answer, which scripts already parse. Either way
/// duplicates end the command with `exit::DUPLICATES`.
async fn create(
    ctx: &Ctx,
    queue: &str,
    mut body: Value,
    inputs: Inputs<'_>,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    if !ctx.json {
        if let Value::Object(m) = &mut body {
            m.insert("answer".into(), json!("ids"));
        }
    }
    let reply = ctx
        .client
        .call(Method::POST, &["tasks"], Some(&body))
        .await?;
    let duplicates = crate::envelope::duplicates(&reply.value);
    let inputs_sent = if ctx.raw(&reply, out)? {
        inserted_ids(&reply.value)?.len() + duplicates.len()
    } else {
        report_created(queue, &reply, &duplicates, inputs, out)?
    };
    if duplicates.is_empty() {
        return Ok(());
    }
    Err(crate::exit::Duplicates {
        duplicates: duplicates.len() as u64,
        inputs: inputs_sent as u64,
    }
    .into())
}

/// Writes the new tasks' ids, then each duplicate with the task it matched; returns how many
/// inputs there were.
fn report_created(
    queue: &str,
    reply: &Reply,
    duplicates: &[(usize, String)],
    inputs: Inputs<'_>,
    out: &mut dyn Write,
) -> anyhow::Result<usize> {
    let Some(ids) = reply.value.get("ids").and_then(Value::as_array) else {
        bail!(
            "unexpected response from the server: no ids list in {}",
            reply.value
        );
    };
    let dup: std::collections::HashSet<usize> = duplicates.iter().map(|(i, _)| *i).collect();
    let new: Vec<&str> = ids
        .iter()
        .enumerate()
        .filter(|(i, _)| !dup.contains(i))
        .filter_map(|(_, id)| id.as_str())
        .collect();
    writeln!(
        out,
        "Created {} in queue {}",
        plural(new.len() as u64, "task", "tasks"),
        shown(queue)
    )?;
    for id in &new {
        writeln!(out, "{id}")?;
    }
    if !duplicates.is_empty() {
        writeln!(
            out,
            "Not created, {} of live tasks (the queue's unique):",
            plural(duplicates.len() as u64, "duplicate", "duplicates")
        )?;
        for (index, matched) in duplicates {
            writeln!(out, "{} matched task {matched}", inputs.describe(*index))?;
        }
    }
    Ok(ids.len())
}

/// `create-tasks QUEUE --file PATH`: JSON lines sent in chunks. Ids are not listed: a file
/// may hold millions of tasks, and `--json` gives every reply for those who need them.
pub async fn create_from_file(
    ctx: &Ctx,
    queue: &str,
    path: &Path,
    chunk_size: u64,
    timing: &TaskTiming,
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
    let extra = timing_keys(timing);
    let up = chunked::upload(
        &ctx.client,
        queue,
        &entries,
        chunk_size,
        &extra,
        &bar,
        json_out,
    )
    .await?;
    if !ctx.json {
        writeln!(
            out,
            "Created {} in queue {}",
            plural(up.created, "task", "tasks"),
            shown(queue)
        )?;
        if !up.duplicates.is_empty() {
            writeln!(
                out,
                "Not created, {} of live tasks (the queue's unique):",
                plural(up.duplicates.len() as u64, "duplicate", "duplicates")
            )?;
            for (line, matched) in &up.duplicates {
                writeln!(out, "line {line} matched task {matched}")?;
            }
        }
    }
    if up.duplicates.is_empty() {
        return Ok(());
    }
    Err(crate::exit::Duplicates {
        duplicates: up.duplicates.len() as u64,
        inputs: entries.len() as u64,
    }
    .into())
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
            Value::Object(tasks_body(None, &TaskSearch::default(), &options()).unwrap()),
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
        let body = tasks_body(
            Some(r#"{"queue":"demo","status":-2}"#),
            &TaskSearch::default(),
            &opts,
        )
        .unwrap();
        assert_eq!(
            Value::Object(body),
            json!({"queue": "demo", "status": -2, ".limit": 20, ".skip": 5, ".count": 1,
                   ".fields": ["status", "node"], ".terse": 1, ".full": 1, ".epoch": 1, ".pretty": 1})
        );
    }

    #[test]
    fn search_flags_add_filter_keys_and_may_not_repeat_one() {
        let search = TaskSearch {
            queue: Some("words".into()),
            status: Some("-2".into()),
            node: Some("n1".into()),
            since: Some("1h".into()),
            until: Some("2030-01-01T00:00:00Z".into()),
            params: vec!["text=\"a b\"".into(), "n=1".into(), "who=ada".into()],
            bound: Some(100),
        };
        let body = tasks_body(None, &search, &options()).unwrap();
        assert_eq!(
            Value::Object(body),
            json!({".limit": 20, "queue": "words", "status": -2, "node": "n1", "since": "1h",
                   "until": "2030-01-01T00:00:00Z", "limit": 100,
                   "params.text": "a b", "params.n": 1, "params.who": "ada"})
        );
        let word = TaskSearch {
            status: Some("failed".into()),
            ..TaskSearch::default()
        };
        let body = tasks_body(None, &word, &options()).unwrap();
        assert_eq!(body["status"], json!("failed"));
        let err = tasks_body(Some(r#"{"status": 1}"#), &word, &options())
            .unwrap_err()
            .to_string();
        assert!(err.contains("'status' is given both"), "{err}");
        let bad = TaskSearch {
            params: vec!["nokey".into()],
            ..TaskSearch::default()
        };
        assert!(tasks_body(None, &bad, &options()).is_err());
    }

    #[test]
    fn the_filter_wins_over_options() {
        let body =
            tasks_body(Some(r#"{".limit": 3}"#), &TaskSearch::default(), &options()).unwrap();
        assert_eq!(Value::Object(body), json!({".limit": 3}));
    }

    #[test]
    fn filters_must_be_objects() {
        for bad in ["[]", "3", "not json", ""] {
            let err = tasks_body(Some(bad), &TaskSearch::default(), &options())
                .unwrap_err()
                .to_string();
            assert_eq!(err, format!("Invalid filter is not a JSON object: '{bad}'"));
        }
        let opts = QueryOptions {
            fields: Some("[oops".into()),
            ..options()
        };
        assert!(tasks_body(None, &TaskSearch::default(), &opts)
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
        // Disbatch's form with a value that has '=' in it: still a pair.
        let args: Vec<String> = ["cmd", "a=b"].iter().map(|s| s.to_string()).collect();
        assert_eq!(
            Value::Object(task_params(&args).unwrap()),
            json!({"cmd": "a=b"})
        );
    }

    #[test]
    fn key_values_are_json_where_they_parse() {
        let args: Vec<String> = [
            "id=1",
            "flag=true",
            "name=Ada",
            r#"quoted="1""#,
            "list=[1,2]",
            "empty=",
            "eq=a=b",
            "n=null",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(
            Value::Object(task_params(&args).unwrap()),
            json!({"id": 1, "flag": true, "name": "Ada", "quoted": "1", "list": [1, 2],
                   "empty": "", "eq": "a=b", "n": null})
        );
        for bad in [&["id=1", "name"][..], &["=1"], &["a=1", "a=2"]] {
            let args: Vec<String> = bad.iter().map(|s| s.to_string()).collect();
            let e = task_params(&args).unwrap_err();
            assert_eq!(crate::exit::status_for(&e), crate::exit::USAGE, "{e}");
        }
    }
}
