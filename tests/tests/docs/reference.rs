//! The book's reference pages against the code they describe: the config reference against
//! the keys the config reader accepts, the schema reference against the store's schema module,
//! and the metrics list and the Grafana dashboard against what a DEN and a DCI export.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use disbatch_tests::docs::{book_page, code_spans, repo_root, table_rows};
use disbatch_tests::{write_config, Dci, Den, TestDb};
use serde_json::{json, Value};

#[test]
fn the_config_reference_lists_exactly_the_keys_the_reader_accepts() {
    let page = book_page("operating/config.md");
    let mut documented = BTreeSet::new();
    let mut problems = Vec::new();
    for row in table_rows(&page, "Key") {
        let first = row.cells.first().cloned().unwrap_or_default();
        match code_spans(&first).as_slice() {
            [key] if first == format!("`{key}`") => {
                if !documented.insert(key.clone()) {
                    problems.push(format!("line {}: `{key}` is listed twice", row.line));
                }
            }
            _ => problems.push(format!(
                "line {}: a key row's first cell must be one key in backticks, not {first:?}",
                row.line
            )),
        }
    }
    let accepted: BTreeSet<String> = disbatch_config::accepted_keys().into_iter().collect();
    for key in accepted.difference(&documented) {
        problems.push(format!(
            "`{key}` is accepted by the config reader but missing from docs/src/operating/config.md"
        ));
    }
    for key in documented.difference(&accepted) {
        problems.push(format!(
            "`{key}` is in docs/src/operating/config.md but the config reader does not accept it"
        ));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Where each field module of `core/model/src/schema.rs` lives: (collection, path prefix).
fn module_collections(module: &str) -> Option<Vec<(&'static str, &'static str)>> {
    Some(match module {
        "task" => vec![("tasks", "")],
        "unrecorded" => vec![("tasks", "unrecorded_attempts.")],
        "live" => vec![("tasks", "live_output.")],
        "attempt" => vec![("attempts", "")],
        "queue" => vec![("queues", "")],
        "workflow" => vec![("graphs", ""), ("batches", "")],
        "rate" => vec![("rate_limits", "")],
        "node" => vec![("nodes", "")],
        "file" => vec![("tasks.files", "")],
        "chunk" => vec![("tasks.chunks", "")],
        "counts" => vec![("task_counts", "")],
        "lease" => vec![("leases", "")],
        "balance" => vec![("balance", "")],
        "stats" => vec![("stats_minutely", "")],
        _ => return None,
    })
}

/// Top-level string constants of the schema module that name no collection.
const NOT_COLLECTIONS: &[&str] = &["GRIDFS_BUCKET", "QUEUE_BALANCE_LEASE", "MAINTENANCE_LEASE"];

/// The schema module read as text: its collection constants and, per `pub mod`, its fields.
fn schema_module() -> (Vec<String>, BTreeMap<String, Vec<String>>) {
    let path = repo_root().join("core/model/src/schema.rs");
    let text = std::fs::read_to_string(&path).expect("core/model/src/schema.rs");
    let string_const = |line: &str| -> Option<(String, String)> {
        let rest = line.trim().strip_prefix("pub const ")?;
        let (name, rest) = rest.split_once(':')?;
        let value = rest.split_once("&str = \"")?.1.split('"').next()?;
        Some((name.trim().to_string(), value.to_string()))
    };
    let mut collections = Vec::new();
    let mut modules: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut module: Option<String> = None;
    for line in text.lines() {
        if let Some(name) = line.strip_prefix("pub mod ") {
            module = Some(name.trim_end_matches(" {").trim().to_string());
            continue;
        }
        if line == "}" {
            module = None;
            continue;
        }
        if let Some((name, value)) = string_const(line) {
            match &module {
                Some(m) => modules.entry(m.clone()).or_default().push(value),
                None if line.starts_with("pub const")
                    && !NOT_COLLECTIONS.contains(&name.as_str()) =>
                {
                    collections.push(value)
                }
                None => {}
            }
        }
    }
    (collections, modules)
}

#[test]
fn the_schema_reference_names_every_collection_and_field_of_the_store_schema() {
    let page = book_page("reference/schema.md");
    // Fields by collection section (`## `tasks``).
    let mut fields: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for row in table_rows(&page, "Field") {
        let Some(collection) = code_spans(&row.part).into_iter().next() else {
            continue;
        };
        if row.part != format!("`{collection}`") {
            continue;
        }
        if let Some(field) = row
            .cells
            .first()
            .and_then(|c| code_spans(c).into_iter().next())
        {
            fields.entry(collection).or_default().push(field);
        }
    }
    let sections: BTreeSet<String> = page
        .lines()
        .filter_map(|l| l.strip_prefix("## `"))
        .filter_map(|l| l.strip_suffix('`'))
        .map(str::to_string)
        .collect();

    let (collections, modules) = schema_module();
    let mut problems = Vec::new();
    assert!(
        collections.len() >= 10 && modules.len() >= 10,
        "schema.rs read as {collections:?} {modules:?}"
    );
    for collection in &collections {
        if !sections.contains(collection) {
            problems.push(format!(
                "collection `{collection}` has no `## `{collection}`` section in docs/src/reference/schema.md"
            ));
        }
    }
    for (module, consts) in &modules {
        let Some(places) = module_collections(module) else {
            problems.push(format!(
                "schema.rs has `pub mod {module}`: name its collection in this test's module_collections"
            ));
            continue;
        };
        for value in consts {
            let covered = places.iter().any(|(collection, prefix)| {
                fields.get(*collection).is_some_and(|fs| {
                    fs.iter().any(|f| {
                        *f == format!("{prefix}{value}")
                            || (f.starts_with(prefix) && f.ends_with(&format!(".{value}")))
                    })
                })
            });
            if !covered {
                let names: Vec<&str> = places.iter().map(|(c, _)| *c).collect();
                problems.push(format!(
                    "field `{value}` (schema.rs `{module}`) is missing from the `{}` section of docs/src/reference/schema.md",
                    names.join("` or `")
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Metric families in a Prometheus text exposition (its `# TYPE` lines), the text checked
/// against the format on the way.
fn families(exposition: &str) -> BTreeSet<String> {
    disbatch_tests::exposition::check(exposition)
        .unwrap_or_else(|e| panic!("not a valid exposition: {e}"))
        .types
        .into_keys()
        .collect()
}

/// Every family a DEN and a DCI export once a task has run.
async fn exported_families(test: &str) -> (TestDb, BTreeSet<String>) {
    let db = TestDb::new(test).await;
    let config = write_config(&db, "config.json", json!({}));
    let den = Den::start(&config, "docs");
    let dci = Dci::start(&config);
    let queue = db.insert_queue("docs", "echo", 1).await;
    let ids = db.insert_tasks(queue, vec![bson::bson!({"x": 1})]).await;
    db.wait_complete(&ids, Duration::from_secs(60)).await;
    // The DCI's request histogram has a series once a request has been answered.
    let (status, _) = dci.get("/queues").await;
    assert_eq!(status, 200);
    let mut all = families(&den.scrape().await);
    let text = reqwest::get(dci.at("/metrics"))
        .await
        .expect("GET /metrics")
        .text()
        .await
        .expect("metrics text");
    all.extend(families(&text));
    (db, all)
}

/// The source of the DEN, the DCI and core, where every family's name is written.
fn source_text() -> String {
    let mut text = String::new();
    for dir in ["den/src", "dci/src", "core"] {
        let mut stack = vec![repo_root().join(dir)];
        while let Some(d) = stack.pop() {
            for entry in std::fs::read_dir(&d).expect("read source dir").flatten() {
                let p = entry.path();
                if p.is_dir() {
                    stack.push(p);
                } else if p.extension().is_some_and(|e| e == "rs") {
                    text.push_str(&std::fs::read_to_string(&p).unwrap_or_default());
                }
            }
        }
    }
    text
}

#[tokio::test]
async fn the_metrics_list_and_the_grafana_dashboard_match_what_the_den_and_dci_export() {
    let (db, exported) = exported_families("docs_metrics").await;
    assert!(exported.contains("disbatch_den_passes_total") && exported.contains("disbatch_up"));

    let page = book_page("operating/monitoring.md");
    let mut documented = BTreeSet::new();
    let mut may_be_absent = BTreeSet::new();
    for row in table_rows(&page, "Metric") {
        let names = row.cells.first().map(|c| code_spans(c)).unwrap_or_default();
        let absent = row.cells.join(" ").to_lowercase().contains("absent until");
        for name in names {
            if absent {
                may_be_absent.insert(name.clone());
            }
            documented.insert(name);
        }
    }
    let mut problems = Vec::new();
    for name in exported.difference(&documented) {
        problems.push(format!(
            "`{name}` is exported but missing from docs/src/operating/monitoring.md"
        ));
    }
    let source = source_text();
    // What a DEN or DCI can export: what they did, and what appears only after an event
    // (documented so, and named in the code).
    let mut exportable = exported.clone();
    for name in documented.difference(&exported) {
        // A family that appears only after its first event (a skipped document, a database
        // error) must say so, and must at least be named in the code.
        if !may_be_absent.contains(name) {
            problems.push(format!(
                "`{name}` is in docs/src/operating/monitoring.md but was not exported (say \"absent until …\" if it appears only after an event)"
            ));
        } else if !source.contains(&format!("\"{name}\"")) {
            problems.push(format!(
                "`{name}` is in docs/src/operating/monitoring.md but no code names it"
            ));
        } else {
            exportable.insert(name.clone());
        }
    }

    let path = repo_root().join("packaging/grafana-dashboard.json");
    let dashboard: Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("dashboard"))
            .expect("the dashboard is JSON");
    let mut exprs = Vec::new();
    collect_exprs(&dashboard, &mut exprs);
    assert!(
        exprs.len() >= 8,
        "the dashboard has {} queries",
        exprs.len()
    );
    for expr in &exprs {
        for name in metric_names(expr) {
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s).filter(|f| exportable.contains(*f)))
                .unwrap_or(&name);
            if !exportable.contains(family) {
                problems.push(format!(
                    "the Grafana dashboard uses `{name}`, which neither the DEN nor the DCI exports: {expr}"
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    db.drop().await;
}

/// Every `expr` (a Prometheus query) and `query` of a template variable in the dashboard.
fn collect_exprs(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("expr", Value::String(s)) => out.push(s.clone()),
                    ("query", Value::String(s)) if s.contains('(') => out.push(s.clone()),
                    ("query", Value::Object(q)) => {
                        if let Some(Value::String(s)) = q.get("query") {
                            out.push(s.clone());
                        }
                    }
                    _ => collect_exprs(v, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| collect_exprs(v, out)),
        _ => {}
    }
}

/// The metric names a query reads: `disbatch_…` and `process_…` identifiers.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let bytes: Vec<char> = expr.chars().collect();
    let mut i = 0;
    while i < bytes.len() {
        let starts_word = i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == '_');
        if starts_word && bytes[i].is_ascii_alphabetic() {
            let mut j = i;
            while j < bytes.len() && (bytes[j].is_ascii_alphanumeric() || bytes[j] == '_') {
                j += 1;
            }
            let word: String = bytes[i..j].iter().collect();
            let quoted = i > 0 && bytes[i - 1] == '"';
            if !quoted && (word.starts_with("disbatch_") || word.starts_with("process_")) {
                names.insert(word);
            }
            i = j;
        } else {
            i += 1;
        }
    }
    names
}

#[test]
fn metric_names_are_read_from_queries_but_not_from_label_values() {
    let names = metric_names(
        r#"sum by (queue) (rate(disbatch_den_claim_latency_seconds_bucket{queue=~"$queue"}[5m])) / on() disbatch_up + present_over_time(disbatch_den_passes_total{x="disbatch_fake"}[1h])"#,
    );
    assert_eq!(
        names.into_iter().collect::<Vec<_>>(),
        [
            "disbatch_den_claim_latency_seconds_bucket",
            "disbatch_den_passes_total",
            "disbatch_up"
        ]
    );
}

/// The book's table of chores (concepts.md, "The chores") names every chore the DEN registers,
/// in the order a pass runs them, with who runs it and how its period is set.
#[tokio::test]
async fn the_book_lists_every_chore_in_the_order_a_pass_runs_them() {
    use disbatch_den::maintenance::chores::{Chores, Every, Phase, Settings};
    let chores = Chores::standard(Settings {
        name: "docs".into(),
        interval: Duration::from_secs(1),
        dead_node_after: Duration::from_secs(28),
        counts_reconcile: Duration::from_secs(600),
        stats_interval: Duration::from_secs(60),
        pruner: disbatch_den::maintenance::pruner::Pruner::new(Default::default()),
        balancer: disbatch_den::maintenance::balancer::Balancer::new(&Default::default()),
    });
    let catalog = chores.catalog();
    let rows = table_rows(&book_page("concepts.md"), "chore");
    let listed: Vec<String> = rows
        .iter()
        .filter_map(|r| {
            r.cells
                .first()
                .and_then(|c| code_spans(c).into_iter().next())
        })
        .collect();
    let registered: Vec<&str> = catalog.iter().map(|c| c.0).collect();
    assert_eq!(listed, registered, "the book's chores, in order");
    for ((name, every, leader_only, phase), row) in catalog.iter().zip(&rows) {
        let (who, how_often) = (&row.cells[1], &row.cells[2]);
        let expected_who = if *leader_only {
            "the leader"
        } else {
            "every node"
        };
        assert_eq!(who, expected_who, "{name}: runs on");
        let period_ok = match every {
            Every::Pass => how_often.starts_with("every pass"),
            Every::AsItSays => how_often.starts_with("as it says"),
            Every::Period(d) => {
                let secs = d.as_secs();
                how_often.starts_with(&format!("{secs} s"))
                    || how_often.starts_with(&format!("{secs} intervals"))
                    || (*name == "silent_nodes" && how_often.contains("`dead_node_after_s`"))
            }
        };
        assert!(
            period_ok,
            "{name}: {every:?} but the book says {how_often:?}"
        );
        assert_eq!(
            *phase == Phase::AfterClaim,
            how_often.contains("after claiming"),
            "{name}: {phase:?}, the book says {how_often:?}"
        );
    }
}

/// The development page's code map ("Where to start") names files and folders that exist.
#[test]
fn the_code_map_names_paths_that_exist() {
    let page = book_page("reference/development.md");
    let rows = table_rows(&page, "to change");
    assert!(rows.len() >= 10, "the code map has {} rows", rows.len());
    let mut missing = Vec::new();
    for row in &rows {
        let Some(start) = row.cells.get(1) else {
            continue;
        };
        for span in code_spans(start) {
            let path = span.trim_end_matches('/');
            if !path.contains('/') {
                continue;
            }
            if !repo_root().join(path).exists() {
                missing.push(format!("line {}: {span}", row.line));
            }
        }
    }
    assert!(missing.is_empty(), "paths that do not exist: {missing:?}");
}
