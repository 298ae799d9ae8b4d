//! Malformed configs make each binary exit at once naming file and key; escaping plugin names fail.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bson::{doc, Bson, DateTime, Document};
use disbatch_model::status;
use disbatch_tests::hostile::{crashes, nested_json, wait_done};
use disbatch_tests::{bin_path, server_uri, write_config, Den, TestDb};
use serde_json::{json, Value};

/// When to stop waiting for a binary to refuse a config (scaled by `DISBATCH_TEST_SLOWDOWN`):
/// one that accepted it would serve until killed, while a refusal exits, on a loaded machine
/// after its process start and no more. How soon is not the property.
const GIVE_UP: Duration = Duration::from_secs(30);

/// What to put at the config path.
enum Content {
    Json(Value),
    Text(String),
    Bytes(Vec<u8>),
    Directory,
    Missing,
}

struct Case {
    label: String,
    content: Content,
    /// Text the message must hold: the key it names (as `key`) when the problem is one key's,
    /// or what is wrong with the file.
    key: Option<&'static str>,
}

/// This process's database: a binary that wrongly accepts a config may write to it.
fn database() -> String {
    format!("t_hostile_config_{}", std::process::id())
}

async fn drop_database() {
    let client = mongodb::Client::with_uri_str(server_uri())
        .await
        .expect("client");
    let _ = client.database(&database()).drop().await;
}

/// A valid base config with `key` set to `value` (JSON text), or removed when it is empty.
fn with(key: &str, value: &str) -> Value {
    let mut base = json!({
        "mongohost": server_uri(),
        "database": database(),
        "plugins": {"echo": bin_path("disbatch-plugin-echo")},
        "task_runner": bin_path("disbatch-task-runner"),
    });
    if let Value::Object(map) = &mut base {
        if value.is_empty() {
            map.remove(key);
        } else {
            let v = serde_json::from_str(value).expect("case value is JSON");
            map.insert(key.to_string(), v);
        }
    }
    base
}

/// (case, key, value as JSON text or "" to remove the key, what the message must name).
#[rustfmt::skip]
const KEY_CASES: &[(&str, &str, &str, &str)] = &[
    ("mongohost missing", "mongohost", "", "mongohost"),
    ("mongohost number", "mongohost", "5", "mongohost"),
    ("mongohost empty", "mongohost", r#""""#, "mongohost"),
    ("mongohost not a URI", "mongohost", r#""http://x""#, "mongohost"),
    ("mongohost NUL", "mongohost", r#""\u0000""#, "mongohost"),
    ("database missing", "database", "", "database"),
    ("database number", "database", "5", "database"),
    ("database slash", "database", r#""a/b""#, "database"),
    ("database NUL", "database", r#""a\u0000b""#, "database"),
    ("database long", "database", r#""dddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd""#, "database"),
    ("plugins string", "plugins", r#""echo""#, "plugins"),
    ("plugins numbers", "plugins", "[1, 2]", "plugins"),
    ("plugins path number", "plugins", r#"{"echo": 5}"#, "plugins"),
    ("plugin name dotdot", "plugins", r#"{"../evil": "/bin/true"}"#, "plugins"),
    ("plugin name slash", "plugins", r#"{"a/b": "/bin/true"}"#, "plugins"),
    ("plugin name NUL", "plugins", r#"["echo\u0000"]"#, "plugins"),
    ("plugin name empty", "plugins", r#"[""]"#, "plugins"),
    ("plugin name dots", "plugins", r#"[".."]"#, "plugins"),
    ("plugin name space", "plugins", r#"["a b"]"#, "plugins"),
    ("plugin name FFFD", "plugins", r#"["ech\ufffd"]"#, "plugins"),
    ("plugin_dirs string", "plugin_dirs", r#""/tmp""#, "plugin_dirs"),
    ("plugin_env number", "plugin_env", "5", "plugin_env"),
    ("plugin_user unknown", "plugin_user", r#""no-such-user-disbatch""#, "plugin_user"),
    ("plugin_user root", "plugin_user", r#""root""#, "plugin_user"),
    ("plugin_user uid 0", "plugin_user", "0", "plugin_user"),
    ("plugin_user negative", "plugin_user", "-1", "plugin_user"),
    ("plugin_user object", "plugin_user", r#"{"name": "nobody"}"#, "plugin_user"),
    ("plugin_user colon", "plugin_user", r#""a:b""#, "plugin_user"),
    ("plugin_group alone", "plugin_group", r#""nogroup""#, "plugin_group"),
    ("task_runner number", "task_runner", "5", "task_runner"),
    ("gfs word", "gfs", r#""sometimes""#, "gfs"),
    ("gfs object", "gfs", r#"{"a": 1}"#, "gfs"),
    ("activequeues string", "activequeues", r#""abc""#, "activequeues"),
    ("activequeues names", "activequeues", r#"["not-hex"]"#, "activequeues"),
    ("ignorequeues numbers", "ignorequeues", "[5]", "ignorequeues"),
    ("monitoring word", "monitoring", r#""yes""#, "monitoring"),
    ("balance enabled word", "balance", r#"{"enabled": "yes"}"#, "balance"),
    ("web_root number", "web_root", "5", "web_root"),
    ("node spaces", "node", r#""bad name""#, "node"),
    ("node number", "node", "5", "node"),
    ("node empty", "node", r#""""#, "node"),
    ("loop string", "loop_interval_ms", r#""100""#, "loop_interval_ms"),
    ("loop negative", "loop_interval_ms", "-1", "loop_interval_ms"),
    ("loop zero", "loop_interval_ms", "0", "loop_interval_ms"),
    ("loop fraction", "loop_interval_ms", "150.5", "loop_interval_ms"),
    ("loop huge", "loop_interval_ms", "1e20", "loop_interval_ms"),
    ("loop u64 max", "loop_interval_ms", "18446744073709551615", "loop_interval_ms"),
    ("loop past u64", "loop_interval_ms", "18446744073709551616", "loop_interval_ms"),
    ("quiet word", "quiet", r#""no""#, "quiet"),
    ("web string", "web", r#""x""#, "web"),
    ("web body negative", "web", r#"{"max_body_bytes": -1}"#, "max_body_bytes"),
    ("web body tiny", "web", r#"{"max_body_bytes": 10}"#, "max_body_bytes"),
    ("web body word", "web", r#"{"max_body_bytes": "big"}"#, "max_body_bytes"),
    ("web window word", "web", r#"{"live_window_ms": "x"}"#, "live_window_ms"),
    ("web listen number", "web", r#"{"listen": 5}"#, "listen"),
    ("web namespaces string", "web", r#"{"namespaces": "x"}"#, "namespaces"),
    ("web namespace slash", "web", r#"{"namespaces": ["a/b"]}"#, "namespaces"),
    ("web tls empty", "web", r#"{"tls": {}}"#, "tls"),
    ("web tls blank", "web", r#"{"tls": {"cert_file": "", "key_file": "k"}}"#, "cert_file"),
    ("web tokens string", "web", r#"{"tokens": "x"}"#, "web.tokens"),
    ("web token no role", "web", r#"{"tokens": [{"name": "a", "token": "tttttttttttttttttttt"}]}"#, "role"),
    ("web token bad role", "web", r#"{"tokens": [{"name": "a", "role": "god", "token": "tttttttttttttttttttt"}]}"#, "role"),
    ("web token short", "web", r#"{"tokens": [{"name": "a", "role": "read", "token": "short"}]}"#, "token"),
    ("runtimes string", "runtimes", r#""x""#, "runtimes"),
    ("runtimes numbers", "runtimes", "[5]", "runtimes"),
    ("web_extensions array", "web_extensions", r#"["x"]"#, "web_extensions"),
    ("auth array", "auth", "[]", "auth"),
    ("auth number password", "auth", r#"{"disbatchd": 5}"#, "auth"),
    ("attributes string", "attributes", r#""x""#, "attributes"),
];

fn corpus() -> Vec<Case> {
    let mut cases: Vec<Case> = KEY_CASES
        .iter()
        .map(|(label, key, value, named)| Case {
            label: label.to_string(),
            content: Content::Json(with(key, value)),
            key: Some(named),
        })
        .collect();
    let long_name =
        json!({"mongohost": server_uri(), "database": database(), "plugins": ["p".repeat(201)]});
    let garbage: Vec<u8> = (0..4096u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let whole = [
        ("plugin name long", Content::Json(long_name)),
        ("not JSON", Content::Text("this is not json".into())),
        ("empty file", Content::Text(String::new())),
        ("only whitespace", Content::Text(" \n\t\n".into())),
        ("only a comment", Content::Text("// nothing here\n".into())),
        ("unterminated comment", Content::Text("{ /* open".into())),
        ("top-level array", Content::Text("[1, 2]".into())),
        ("top-level null", Content::Text("null".into())),
        ("top-level string", Content::Text("\"mongodb://x\"".into())),
        (
            "truncated",
            Content::Text("{\"mongohost\": \"mongodb://x\", \"datab".into()),
        ),
        ("NUL byte", Content::Bytes(b"{\"mongohost\":\0}".to_vec())),
        (
            "huge number",
            Content::Text("{\"loop_interval_ms\": 1e400}".into()),
        ),
        (
            "nested 1000 deep",
            Content::Text(format!("{{\"x\": {}}}", nested_json(1000, false))),
        ),
        ("binary garbage", Content::Bytes(garbage)),
        (
            "invalid UTF-8",
            Content::Bytes(b"{\"mongohost\": \"mongodb://\xff\xfe\"}".to_vec()),
        ),
        (
            "10 MB unterminated",
            Content::Text(format!("{{\"x\": \"{}\"", "x".repeat(10 << 20))),
        ),
        (
            "missing comma between members",
            Content::Text(format!(
                "{{\"mongohost\": \"{}\"\n \"database\": \"{}\"}}",
                server_uri(),
                database()
            )),
        ),
        (
            "missing comma between elements",
            Content::Text(format!(
                "{{\"mongohost\": \"{}\", \"database\": \"{}\", \"plugins\": [\"echo\" \"demo\"]}}",
                server_uri(),
                database()
            )),
        ),
        (
            "missing comma after an object, comments around",
            Content::Text(format!(
                "{{\"web\": {{\"listen\": \"127.0.0.1:0\",}} // no comma\n \"mongohost\": \"{}\", /* c */ \"database\": \"{}\",}}",
                server_uri(),
                database()
            )),
        ),
        ("a directory", Content::Directory),
        ("a missing file", Content::Missing),
    ];
    for (label, content) in whole {
        let key = match label {
            "plugin name long" => Some("plugins"),
            "missing comma between members" => {
                Some("expected a comma before this member on line 2 column 2")
            }
            _ if label.starts_with("missing comma") => Some("expected a comma"),
            _ => None,
        };
        cases.push(Case {
            label: label.to_string(),
            content,
            key,
        });
    }
    cases
}

/// The three binaries, each with the arguments it needs besides `--config`.
fn binaries() -> Vec<(&'static str, Vec<String>)> {
    vec![
        ("disbatchd", vec!["--node".into(), "hostile-node".into()]),
        (
            "disbatch-web",
            vec!["--listen".into(), "127.0.0.1:0".into()],
        ),
        (
            "disbatch-task-runner",
            vec![
                "--task".into(),
                "6b02626f79f4bc22b2fe7135".into(),
                "--node".into(),
                "n".into(),
            ],
        ),
    ]
}

/// Runs `binary` on `config`; Err when it is still running after GIVE_UP (it is then killed).
/// Blocks its thread: the tests calling it have nothing else running on their runtime.
fn run(binary: &str, args: &[String], config: &Path) -> Result<(Option<i32>, String), String> {
    let dir = config.parent().unwrap_or(Path::new("/tmp"));
    let out_path = dir.join(format!("{binary}.out"));
    let out = std::fs::File::create(&out_path).expect("output file");
    let err = out.try_clone().expect("output file");
    let mut child = Command::new(bin_path(binary))
        .arg("--config")
        .arg(config)
        .args(args)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .expect("spawn");
    let started = Instant::now();
    let give_up = disbatch_tests::scaled(GIVE_UP);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if started.elapsed() > give_up {
            let _ = child.kill();
            let _ = child.wait();
            let text = std::fs::read_to_string(&out_path).unwrap_or_default();
            return Err(format!("still running after {give_up:?}; output:\n{text}"));
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let bytes = std::fs::read(&out_path).unwrap_or_default();
    Ok((status.code(), String::from_utf8_lossy(&bytes).into_owned()))
}

fn write_case(dir: &Path, i: usize, content: &Content) -> PathBuf {
    let path = dir.join(format!("case-{i}.json"));
    match content {
        Content::Json(v) => std::fs::write(&path, serde_json::to_vec_pretty(v).expect("json")),
        Content::Text(t) => std::fs::write(&path, t),
        Content::Bytes(b) => std::fs::write(&path, b),
        Content::Directory => std::fs::create_dir(&path),
        Content::Missing => Ok(()),
    }
    .expect("write case");
    path
}

/// Runs every binary on every case; returns the failures and the number of runs.
fn check_cases(cases: &[Case]) -> (Vec<String>, usize) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut failures = Vec::new();
    let mut runs = 0;
    for (i, case) in cases.iter().enumerate() {
        let path = write_case(dir.path(), i, &case.content);
        for (binary, args) in binaries() {
            runs += 1;
            let what = format!("{binary} / {}", case.label);
            let (code, text) = match run(binary, &args, &path) {
                Ok(r) => r,
                Err(e) => {
                    failures.push(format!("{what}: {e}"));
                    continue;
                }
            };
            let last: String = text.lines().rev().take(3).collect::<Vec<_>>().join(" | ");
            if code == Some(0) || code.is_none() {
                failures.push(format!("{what}: exit {code:?}: {last}"));
            }
            if !crashes(&text).is_empty() {
                failures.push(format!("{what}: crashed: {last}"));
            }
            if !text.contains(&path.display().to_string()) {
                failures.push(format!(
                    "{what}: the message does not name the file: {last}"
                ));
            }
            if let Some(key) = case.key {
                if !text.contains(key) {
                    failures.push(format!("{what}: the message does not name `{key}`: {last}"));
                }
            }
        }
    }
    (failures, runs)
}

#[tokio::test]
async fn every_binary_refuses_each_malformed_config_at_once_naming_file_and_key() {
    let cases = corpus();
    let started = Instant::now();
    let (failures, runs) = check_cases(&cases);
    drop_database().await;
    println!(
        "{} configs × 3 binaries = {runs} runs in {:?}",
        cases.len(),
        started.elapsed()
    );
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// The relaxed-JSON parser recurses: a config nested 10 000 levels deep must be refused with
/// a message, not overflow the stack before anything is logged.
#[tokio::test]
async fn a_config_nested_10000_levels_deep_is_refused_not_a_stack_overflow() {
    let cases = vec![Case {
        label: "nested 10000 deep".into(),
        content: Content::Text(format!("{{\"x\": {}}}", nested_json(10_000, false))),
        key: None,
    }];
    let (failures, _) = check_cases(&cases);
    drop_database().await;
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// serde reads a struct from an array positionally, so `"balance": [true, true]` would turn
/// QueueBalance and its log on: settings objects given as arrays must be refused.
#[tokio::test]
async fn settings_objects_given_as_arrays_are_refused() {
    let cases = vec![
        Case {
            label: "balance empty array".into(),
            content: Content::Json(with("balance", "[]")),
            key: Some("balance"),
        },
        Case {
            label: "balance positional".into(),
            content: Content::Json(with("balance", "[true, true]")),
            key: Some("balance"),
        },
        Case {
            label: "web.tls positional".into(),
            content: Content::Json(with("web", r#"{"tls": ["c.pem", "k.pem"]}"#)),
            key: Some("tls"),
        },
    ];
    let (failures, _) = check_cases(&cases);
    drop_database().await;
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A DEN whose `task_runner` cannot be executed refuses to start; the message must say which
/// config key and file to fix.
#[test]
fn a_den_whose_task_runner_is_missing_names_the_key_and_the_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("den.json");
    let config = with("task_runner", r#""/nonexistent/disbatch-task-runner""#);
    std::fs::write(&path, serde_json::to_vec(&config).expect("json")).expect("write");
    let (code, text) = run("disbatchd", &binaries()[0].1, &path).expect("exits");
    assert_ne!(code, Some(0), "{text}");
    assert!(text.contains("/nonexistent/disbatch-task-runner"), "{text}");
    assert!(
        text.contains("task_runner") && text.contains(&path.display().to_string()),
        "the message should name `task_runner` and {}: {text}",
        path.display()
    );
}

/// Queue plugin names reach the file system (`plugin_dirs`/name): names with `/`, `..` or NUL
/// are refused by the DEN (logged skip naming the queue; the task never runs) and by the
/// task runner run by hand (the task fails saying why); the executables such names would
/// reach are never started.
#[tokio::test]
async fn queues_whose_plugin_names_escape_the_plugin_dirs_are_refused() {
    let db = TestDb::new("hostile_plugin_names").await;
    let plugin_dir = db.path("plugins");
    std::fs::create_dir_all(plugin_dir.join("a")).expect("mkdir");
    let marker = db.path("escaped-plugin-ran");
    let script = format!("#!/bin/sh\necho ran >> '{}'\n", marker.display());
    for exe in [db.path("evil"), plugin_dir.join("a").join("b")] {
        std::fs::write(&exe, &script).expect("write script");
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    let config = write_config(
        &db,
        "den.json",
        json!({"plugin_dirs": [plugin_dir], "plugins": {"echo": bin_path("disbatch-plugin-echo")}}),
    );
    let queues = db.db.collection::<Document>("queues");
    let good = db.insert_queue("good", "echo", 2).await;
    let mut bad = Vec::new();
    for (name, plugin) in [
        ("escape-dotdot", "../evil"),
        ("escape-slash", "a/b"),
        ("escape-absolute", "/bin/sh"),
        ("escape-nul", "evil\0"),
        ("escape-dots-only", ".."),
    ] {
        let id = bson::oid::ObjectId::new();
        queues
            .insert_one(doc! {"_id": id, "name": name, "plugin": plugin, "threads": 1})
            .await
            .expect("insert queue");
        let task = db.insert_tasks(id, vec![Bson::from(doc! {})]).await[0];
        bad.push((name, id, task));
    }
    let mut den = Den::start(&config, "plugin-node");
    let good_tasks = db
        .insert_tasks(good, (0..5).map(|n| Bson::from(doc! {"n": n})).collect())
        .await;
    wait_done(&db, &mut den, &good_tasks, Duration::from_secs(60)).await;
    den.stop();
    let log = den.log_text();
    for (name, id, task) in &bad {
        let t = db.task(*task).await;
        assert_eq!(
            t.get_i32("status"),
            Ok(status::QUEUED),
            "{name}: the task was touched: {t}"
        );
        assert!(
            log.lines().any(|l| l.contains("queue skipped")
                && l.contains("is not valid")
                && l.contains(&id.to_hex())
                && l.contains(name)),
            "no skip line for {name}:\n{log}"
        );
    }
    assert_eq!(crashes(&log), Vec::<String>::new(), "DEN log:\n{log}");

    // The runner checks again when handed such a task directly.
    for (name, _, task) in &bad {
        db.tasks()
            .update_one(
                doc! {"_id": task},
                doc! {"$set": {"status": -1, "node": "n1", "mtime": DateTime::now()}},
            )
            .await
            .expect("claim by hand");
        let out = Command::new(bin_path("disbatch-task-runner"))
            .arg("--config")
            .arg(&config)
            .args(["--task", &task.to_hex(), "--node", "n1"])
            .output()
            .expect("run the task runner");
        let text = String::from_utf8_lossy(&out.stderr);
        assert!(crashes(&text).is_empty(), "{name}: {text}");
        let t = db.task(*task).await;
        assert_eq!(
            t.get_i32("status"),
            Ok(status::FAILED),
            "{name}: {t}\n{text}"
        );
        let stderr = t.get_str("stderr").unwrap_or_default();
        assert!(stderr.contains("is not valid"), "{name}: stderr {stderr:?}");
    }
    assert!(
        !marker.exists(),
        "a plugin outside the plugin dirs was started: {}",
        std::fs::read_to_string(&marker).unwrap_or_default()
    );
    db.drop().await;
}
