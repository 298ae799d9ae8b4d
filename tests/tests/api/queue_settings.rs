//! Every queue setting changeable in one place: `POST /queues/:q` and `disbatch update-queue`
//! take each documented field, checked as nodes read it, each for its role; `GET /queues/:q`
//! shows them; `spec load` says what it changes, and `--dry-run` says it without writing; the
//! console's settings card changes them too, within the same roles.

use bson::{doc, Bson, Document};
use disbatch_tests::{bin_path, write_config, Browser, Dci, TestDb};
use serde_json::{json, Value};

const ADMIN: &str = "admin-token-0123456789abcdef";
const OPS: &str = "operate-token-0123456789abcdef";

fn config(db: &TestDb) -> std::path::PathBuf {
    let web = json!({"tokens": [
        {"name": "ops", "role": "operate", "token": OPS},
        {"name": "boss", "role": "admin", "token": ADMIN},
    ]});
    write_config(db, "web.json", json!({"web": web}))
}

/// Runs the CLI with `token`: (success, stdout and stderr).
fn cli(dci: &Dci, token: &str, args: &[&str]) -> (bool, String) {
    let out = std::process::Command::new(bin_path("disbatch"))
        .arg("--url")
        .arg(&dci.url)
        .env("DISBATCH_TOKEN", token)
        .args(args)
        .output()
        .expect("run disbatch");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr),
    )
}

/// One API request with `token`: (status, JSON body).
async fn call(dci: &Dci, method: reqwest::Method, path: &str, body: Option<Value>) -> (u16, Value) {
    let mut request = dci.http.request(method, dci.at(path)).bearer_auth(ADMIN);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let r = request.send().await.expect("request");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

async fn queue(db: &TestDb, name: &str) -> Document {
    db.db
        .collection::<Document>("queues")
        .find_one(doc! {"name": name})
        .await
        .expect("find queue")
        .expect("the queue")
}

#[tokio::test]
async fn update_queue_changes_every_setting_for_its_role_and_refuses_what_a_node_could_not_read() {
    let db = TestDb::new("queue_settings").await;
    let dci = Dci::start(&config(&db));
    check_every_setting_is_set_and_shown(&db, &dci).await;

    check_null_removes_and_the_operate_role_only_tunes(&db, &dci).await;

    check_unreadable_values_are_refused_and_creation_takes_them(&db, &dci).await;
    drop(dci);
    db.drop().await;
}

async fn check_every_setting_is_set_and_shown(db: &TestDb, dci: &Dci) {
    let (ok, text) = cli(
        dci,
        ADMIN,
        &["create-queue", "words", "echo", "--threads", "2"],
    );
    assert!(ok, "{text}");
    let (ok, text) = cli(
        dci,
        ADMIN,
        &[
            "update-queue",
            "words",
            "worker",
            "persistent",
            "worker_idle_s",
            "10",
            "worker_max_tasks",
            "100",
            "worker_max_rss_mb",
            "512",
            "worker_start_s",
            "5",
            "timeout",
            "30",
            "kill_grace",
            "2",
            "lease",
            "10",
            "on_lost",
            "requeue",
            "max_retries",
            "3",
            "on_dependency_failure",
            "run",
            "priority",
            "5",
            "weight",
            "3",
            "max_getwork",
            "4",
            "config",
            r#"{"lang": "en"}"#,
            "then",
            "counts",
            "retry",
            r#"{"max_attempts": 3}"#,
            "schedule",
            "*/5 * * * *",
            "schedule_tz",
            "Europe/Paris",
        ],
    );
    assert!(ok, "{text}");
    let q = queue(db, "words").await;
    let expected = doc! {
        "worker": "persistent", "worker_idle_s": 10_i64, "worker_max_tasks": 100_i64,
        "worker_max_rss_mb": 512_i64, "worker_start_s": 5_i64, "timeout": 30_i64,
        "kill_grace": 2_i64, "lease": 10_i64, "on_lost": "requeue", "max_retries": 3_i64,
        "on_dependency_failure": "run", "priority": 5_i64, "weight": 3_i64,
        "max_getwork": 4_i64, "config": {"lang": "en"}, "then": "counts",
        "retry": {"max_attempts": 3}, "schedule": "*/5 * * * *", "schedule_tz": "Europe/Paris",
    };
    for (k, v) in &expected {
        assert_eq!(q.get(k), Some(v), "{k} in {q}");
    }
    // The API shows them all.
    let (status, shown) = call(dci, reqwest::Method::GET, "/queues/words", None).await;
    assert_eq!(status, 200, "{shown}");
    for k in [
        "worker",
        "timeout",
        "max_retries",
        "on_lost",
        "on_dependency_failure",
        "retry",
    ] {
        assert!(!shown[k].is_null(), "{k} shown: {shown}");
    }
    assert_eq!(shown["retry"], json!({"max_attempts": 3}));
}

async fn check_null_removes_and_the_operate_role_only_tunes(db: &TestDb, dci: &Dci) {
    // `null` removes a field: its default applies again; `schedule null` removes the schedule.
    let (ok, text) = cli(
        dci,
        OPS,
        &[
            "update-queue",
            "words",
            "schedule",
            "null",
            "timeout",
            "null",
            "retry",
            "null",
        ],
    );
    assert!(ok, "{text}");
    let q = queue(db, "words").await;
    for k in ["schedule", "timeout", "retry"] {
        assert!(q.get(k).is_none(), "{k} removed: {q}");
    }

    // The operate role tunes; what changes what runs is the admin's.
    let (ok, text) = cli(
        dci,
        OPS,
        &["update-queue", "words", "timeout", "45", "max_getwork", "2"],
    );
    assert!(ok, "{text}");
    assert_eq!(
        queue(db, "words").await.get("timeout"),
        Some(&Bson::Int64(45))
    );
    for (field, value) in [("worker", "process"), ("config", "{}"), ("then", "other")] {
        let (ok, text) = cli(dci, OPS, &["update-queue", "words", field, value]);
        assert!(!ok, "{field}: {text}");
        assert!(
            text.contains(&format!("changing a queue's {field} needs role admin")),
            "{field}: {text}"
        );
    }
    assert_eq!(
        queue(db, "words").await.get_str("worker").ok(),
        Some("persistent")
    );
}

async fn check_unreadable_values_are_refused_and_creation_takes_them(db: &TestDb, dci: &Dci) {
    // A value a node could not read is refused, naming the field; nothing is written.
    for (field, value, says) in [
        ("timeout", "-1", "timeout"),
        ("worker", "sometimes", "worker"),
        ("on_lost", "retry", "on_lost"),
        ("on_dependency_failure", "maybe", "on_dependency_failure"),
        ("lease", "1", "lease must be at least"),
        ("config", "7", "config must be an object"),
    ] {
        let (ok, text) = cli(dci, ADMIN, &["update-queue", "words", field, value]);
        assert!(!ok && text.contains(says), "{field} {value}: {text}");
    }
    let q = queue(db, "words").await;
    assert_eq!(
        (
            q.get("timeout"),
            q.get_str("worker").ok(),
            q.get_str("on_lost").ok()
        ),
        (Some(&Bson::Int64(45)), Some("persistent"), Some("requeue")),
        "{q}"
    );

    // POST /queues takes them at creation too.
    let (status, body) = call(
        dci,
        reqwest::Method::POST,
        "/queues",
        Some(json!({"name": "workers", "plugin": "echo", "worker": "persistent", "timeout": 5})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let q = queue(db, "workers").await;
    assert_eq!(
        (q.get_str("worker").ok(), q.get("timeout")),
        (Some("persistent"), Some(&Bson::Int64(5)))
    );
}

#[tokio::test]
async fn spec_load_says_each_field_it_changes_and_a_dry_run_writes_nothing() {
    let db = TestDb::new("queue_settings_specs").await;
    let dci = Dci::start(&config(&db));
    let (ok, text) = cli(
        &dci,
        ADMIN,
        &["create-queue", "words", "echo", "--threads", "3"],
    );
    assert!(ok, "{text}");
    let before = queue(&db, "words").await;
    let spec = db.path("words.yaml");
    std::fs::write(
        &spec,
        "name: words\nplugin: echo\nmax_running: 5\npriority: 2\n",
    )
    .expect("spec file");
    let spec = spec.to_string_lossy().to_string();

    let (ok, dry) = cli(&dci, ADMIN, &["spec", "load", &spec, "--dry-run"]);
    assert!(ok, "{dry}");
    assert!(
        dry.starts_with("Would load 1 work specs: 0 created, 1 updated."),
        "{dry}"
    );
    assert!(dry.contains("updated words:"), "{dry}");
    assert!(dry.contains("  priority: (none) → 2"), "{dry}");
    let after_dry = queue(&db, "words").await;
    assert_eq!(after_dry, before, "a dry run writes nothing");

    let (ok, loaded) = cli(&dci, ADMIN, &["spec", "load", &spec]);
    assert!(ok, "{loaded}");
    assert!(loaded.starts_with("Loaded 1 work specs"), "{loaded}");
    // The same changes, now made: each line the dry run printed is printed again.
    let lines = |t: &str| -> Vec<String> { t.lines().skip(1).map(str::to_string).collect() };
    assert_eq!(lines(&loaded), lines(&dry));
    let after = queue(&db, "words").await;
    assert_eq!(after.get("priority"), Some(&Bson::Int64(2)), "{after}");
    assert_ne!(after, before);
    // The API's answer lists them with old and new values.
    let (status, body) = call(
        &dci,
        reqwest::Method::POST,
        "/specs",
        Some(
            json!({"specs": [{"name": "words", "plugin": "echo", "priority": 7}], "dry_run": true}),
        ),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let changes = body["changes"]["words"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        changes
            .iter()
            .any(|c| c == &json!({"field": "priority", "old": 2, "new": 7})),
        "{body}"
    );
    assert!(
        changes
            .iter()
            .any(|c| c["field"] == json!("max_running") && c["new"] == Value::Null),
        "a field the spec no longer sets is removed: {body}"
    );
    assert_eq!(body["dry_run"], json!(true));
    assert_eq!(
        queue(&db, "words").await.get("priority"),
        Some(&Bson::Int64(2))
    );
    drop(dci);
    db.drop().await;
}

/// Types `value` into the settings card's field for `field`, replacing what it shows.
async fn set_field(b: &Browser, field: &str, value: &str) {
    let input = b.find(&format!("#setting-{field}")).await;
    input.clear().await.expect("clear");
    if !value.is_empty() {
        input.send_keys(value).await.expect("type");
    }
}

async fn field_text(b: &Browser, field: &str) -> String {
    b.find(&format!("#setting-{field}"))
        .await
        .prop("value")
        .await
        .ok()
        .flatten()
        .unwrap_or_default()
}

/// Saves the card and waits for its message, which must contain `want`.
async fn save(b: &Browser, want: &str) -> String {
    b.client
        .execute(
            "document.getElementById('queue-settings-msg').textContent = ''",
            vec![],
        )
        .await
        .expect("clear the message");
    b.find("#settings-submit")
        .await
        .click()
        .await
        .expect("save");
    let msg = b
        .wait_text("#queue-settings-msg", "the settings message", |t| {
            !t.is_empty()
        })
        .await;
    assert!(msg.contains(want), "{msg}");
    msg
}

async fn open_as(b: &Browser, dci: &Dci, token: &str) {
    b.client
        .goto(&format!("{}/", dci.url))
        .await
        .expect("navigate");
    b.client
        .execute(
            &format!("sessionStorage.setItem('disbatch.token', '{token}')"),
            vec![],
        )
        .await
        .expect("token");
    b.client
        .goto(&format!("{}/#/queues", dci.url))
        .await
        .expect("navigate");
    b.client.refresh().await.expect("reload");
    b.wait_loaded("queues").await;
    b.select_option("#settings-queue", "words").await;
}

#[tokio::test]
async fn the_console_changes_every_setting_within_its_role_and_all_or_nothing() {
    let db = TestDb::new("queue_settings_ui").await;
    let dci = Dci::start(&config(&db));
    let (status, body) = call(
        &dci,
        reqwest::Method::POST,
        "/queues",
        Some(json!({"name": "words", "plugin": "echo", "threads": 1, "timeout": 60})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let b = Browser::start(1280, 1400).await;

    // The operate role: run settings and the schedule, each shown as stored.
    open_as(&b, &dci, OPS).await;
    assert_eq!(field_text(&b, "timeout").await, "60");
    assert!(field_text(&b, "retry")
        .await
        .contains("\"max_attempts\":20"));
    set_field(&b, "timeout", "30").await;
    set_field(&b, "retry", r#"{"max_attempts": 3}"#).await;
    set_field(&b, "schedule", "*/5 * * * *").await;
    set_field(&b, "on_lost", "requeue").await;
    save(&b, "saved").await;
    let q = queue(&db, "words").await;
    assert_eq!(q.get("timeout"), Some(&Bson::Int64(30)), "{q}");
    assert_eq!(q.get_str("schedule").ok(), Some("*/5 * * * *"), "{q}");
    assert_eq!(q.get_str("on_lost").ok(), Some("requeue"), "{q}");
    let retry = q.get_document("retry").cloned().unwrap_or_default();
    assert_eq!(
        retry
            .get("max_attempts")
            .and_then(Bson::as_i64)
            .or_else(|| retry.get_i32("max_attempts").ok().map(i64::from)),
        Some(3),
        "{q}"
    );
    // Shown back as the server stored it, read afresh after the save.
    assert_eq!(field_text(&b, "retry").await, r#"{"max_attempts":3}"#);
    assert_eq!(field_text(&b, "timeout").await, "30");
    b.screenshot("queue-settings").await;

    // A field for admin in the same request: refused as a whole, nothing written.
    set_field(&b, "worker", "persistent").await;
    set_field(&b, "timeout", "45").await;
    let msg = save(&b, "nothing was changed").await;
    assert!(msg.contains("role cannot do this"), "{msg}");
    let after = queue(&db, "words").await;
    assert_eq!(after, q, "a refused request changes nothing");

    // A value no node could read: refused naming the field.
    set_field(&b, "worker", "").await;
    set_field(&b, "on_lost", "bogus").await;
    let msg = save(&b, "on_lost").await;
    assert!(msg.contains("nothing was changed"), "{msg}");
    assert_eq!(queue(&db, "words").await, q);

    // The admin role: what changes what runs; an emptied field removes the setting.
    open_as(&b, &dci, ADMIN).await;
    set_field(&b, "worker", "persistent").await;
    set_field(&b, "config", r#"{"lang": "en"}"#).await;
    set_field(&b, "timeout", "").await;
    set_field(&b, "schedule", "").await;
    save(&b, "saved").await;
    let q = queue(&db, "words").await;
    assert_eq!(q.get_str("worker").ok(), Some("persistent"), "{q}");
    assert_eq!(
        q.get_document("config").ok(),
        Some(&doc! {"lang": "en"}),
        "{q}"
    );
    for gone in ["timeout", "schedule"] {
        assert!(!q.contains_key(gone), "{gone} left in {q}");
    }
    assert_eq!(
        q.get_str("on_lost").ok(),
        Some("requeue"),
        "untouched fields stay: {q}"
    );
    b.close().await;
    drop(dci);
    db.drop().await;
}
