//! Access control on the real `disbatch-web`: bearer tokens and roles, and the console's token
//! prompt (HTTPS with a private CA: `dci_https.rs`).

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use bson::doc;
use bson::oid::ObjectId;
use disbatch_tests::api::error;
use disbatch_tests::{bin_path, wait_for, write_config, Browser, Dci, Launch, TestDb};
use reqwest::header::WWW_AUTHENTICATE;
use reqwest::Method;
use serde_json::{json, Value};

pub(super) const READ: &str = "read-token-0123456789abcdef";
pub(super) const OPERATE: &str = "operate-token-0123456789abcdef";
/// Given through a token file, to cover `token_file`.
const ADMIN: &str = "admin-token-0123456789abcdef";
const WRONG: &str = "wrong-token-0123456789abcdef";

/// A config with one token per role; `extra` keys are merged into `web`.
pub(super) fn tokens_config(db: &TestDb, file: &str, extra: Value) -> PathBuf {
    std::fs::write(db.path("admin.token"), format!("{ADMIN}\n")).expect("token file");
    let mut web = json!({"tokens": [
        {"name": "viewer", "role": "read", "token": READ},
        {"name": "ops", "role": "operate", "token": OPERATE},
        {"name": "boss", "role": "admin", "token_file": "admin.token"},
    ]});
    if let (Some(web), Value::Object(extra)) = (web.as_object_mut(), extra) {
        web.extend(extra);
    }
    write_config(db, file, json!({ "web": web }))
}

/// One request: (status, `WWW-Authenticate`, JSON body or the text as a string).
pub(super) async fn call(
    dci: &Dci,
    method: Method,
    path: &str,
    token: Option<&str>,
    body: Option<Value>,
) -> (u16, Option<String>, Value) {
    let mut request = dci.http.request(method, dci.at(path));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.expect("request");
    let status = response.status().as_u16();
    let challenge = response
        .headers()
        .get(WWW_AUTHENTICATE)
        .map(|v| v.to_str().expect("header text").to_string());
    let text = response.text().await.expect("body");
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, challenge, body)
}

async fn task_count(db: &TestDb) -> u64 {
    db.count(doc! {}).await
}

#[tokio::test]
async fn tokens_guard_each_route_by_its_role() {
    let db = TestDb::new("access_roles").await;
    let queue = db.insert_queue("work", "echo", 0).await;
    let dci = Dci::start(&tokens_config(&db, "web.json", json!({})));
    let create_task = || Some(json!({"queue": "work", "params": [{"n": 1}]}));

    check_no_wrong_or_other_scheme_tokens_get_401(&dci, &create_task).await;

    check_read_gets_every_get_and_no_write(&db, &dci, &create_task).await;

    let q = check_operate_makes_tasks_and_threads_but_not_a_plugin(&db, &dci, queue, &create_task)
        .await;
    let new_queue = || Some(json!({"name": "fresh", "plugin": "echo"}));
    let (status, _, body) = call(&dci, Method::POST, "/queues", Some(OPERATE), new_queue()).await;
    assert_eq!(
        (status, body),
        (
            403,
            error("forbidden: POST /queues needs role admin; token \"ops\" has role operate")
        )
    );
    let (status, _, _) = call(&dci, Method::DELETE, &q, Some(OPERATE), None).await;
    assert_eq!(status, 403);
    let queues = db.db.collection::<bson::Document>("queues");
    let stored = queues
        .find_one(doc! {"_id": queue})
        .await
        .expect("find")
        .expect("queue kept");
    assert_eq!(stored.get_str("plugin").ok(), Some("echo"));
    assert!(queues
        .find_one(doc! {"name": "fresh"})
        .await
        .expect("find")
        .is_none());

    // admin (from the token file): everything.
    let (status, _, body) = call(&dci, Method::POST, "/queues", Some(ADMIN), new_queue()).await;
    assert_eq!(status, 200, "{body}");
    let (status, _, body) = call(
        &dci,
        Method::POST,
        &q,
        Some(ADMIN),
        Some(json!({"plugin": "Disbatch::Plugin::Demo"})),
    )
    .await;
    assert_eq!(status, 200, "{body}");

    // The console shell is public (it holds no data); unknown paths stay 404.
    for path in ["/", "/ui/app.js"] {
        let (status, _, _) = call(&dci, Method::GET, path, None, None).await;
        assert_eq!(status, 200, "GET {path}");
    }
    let (status, _, _) = call(&dci, Method::GET, "/nowhere", None, None).await;
    assert_eq!(status, 404);

    check_the_openapi_document_carries_each_role(&dci, &q).await;
    drop(dci);
    db.drop().await;
}

async fn check_no_wrong_or_other_scheme_tokens_get_401(
    dci: &Dci,
    create_task: &impl Fn() -> Option<Value>,
) {
    // No token, a wrong one, or another scheme: 401 in the API's error shape, with a challenge.
    let (status, challenge, body) = call(dci, Method::GET, "/queues", None, None).await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(
        body,
        error("authentication required: send Authorization: Bearer <token>")
    );
    assert_eq!(challenge.as_deref(), Some("Bearer realm=\"disbatch\""));
    let (status, challenge, body) =
        call(dci, Method::POST, "/tasks", Some(WRONG), create_task()).await;
    assert_eq!((status, body), (401, error("invalid token")));
    assert!(
        challenge
            .as_deref()
            .is_some_and(|c| c.starts_with("Bearer ") && c.contains("invalid_token")),
        "{challenge:?}"
    );
    let basic = dci
        .http
        .get(dci.at("/queues"))
        .basic_auth("ops", Some(OPERATE))
        .send()
        .await
        .expect("request");
    assert_eq!(basic.status().as_u16(), 401);
    let head = dci.http.head(dci.at("/queues")).send().await.expect("HEAD");
    assert_eq!(head.status().as_u16(), 401, "HEAD is guarded like GET");
}

async fn check_read_gets_every_get_and_no_write(
    db: &TestDb,
    dci: &Dci,
    create_task: &impl Fn() -> Option<Value>,
) {
    // read: every GET; not a write, which is refused before anything is written.
    for path in [
        "/queues",
        "/nodes",
        "/tasks?queue=work",
        "/summary",
        "/info",
        "/openapi.json",
    ] {
        let (status, _, body) = call(dci, Method::GET, path, Some(READ), None).await;
        assert_eq!(status, 200, "GET {path}: {body}");
    }
    let (status, _, body) = call(dci, Method::POST, "/tasks", Some(READ), create_task()).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(
        body,
        error("forbidden: POST /tasks needs role operate; token \"viewer\" has role read")
    );
    assert_eq!(task_count(db).await, 0, "a refused request writes nothing");
}

async fn check_operate_makes_tasks_and_threads_but_not_a_plugin(
    db: &TestDb,
    dci: &Dci,
    queue: ObjectId,
    create_task: &impl Fn() -> Option<Value>,
) -> String {
    // operate: tasks and threads, but not admin routes or a queue's plugin.
    let (status, _, body) = call(dci, Method::POST, "/tasks", Some(OPERATE), create_task()).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(task_count(db).await, 1);
    let q = format!("/queues/{}", queue.to_hex());
    let (status, _, body) = call(
        dci,
        Method::POST,
        &q,
        Some(OPERATE),
        Some(json!({"threads": 3})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (status, _, body) = call(
        dci,
        Method::POST,
        &q,
        Some(OPERATE),
        Some(json!({"plugin": "Disbatch::Plugin::Demo"})),
    )
    .await;
    assert_eq!(
        (status, body),
        (
            403,
            error("forbidden: changing a queue's name or plugin needs role admin; token \"ops\" has role operate")
        )
    );
    q
}

async fn check_the_openapi_document_carries_each_role(dci: &Dci, q: &str) {
    // The OpenAPI document carries each route's role.
    let (_, _, doc) = call(dci, Method::GET, "/openapi.json", Some(READ), None).await;
    assert_eq!(doc["paths"]["/queues"]["get"]["x-disbatch-role"], "read");
    assert_eq!(doc["paths"]["/queues"]["post"]["x-disbatch-role"], "admin");
    assert_eq!(doc["paths"]["/tasks"]["post"]["x-disbatch-role"], "operate");
    assert_eq!(doc["paths"]["/"]["get"]["x-disbatch-role"], "public");
    // Every guarded operation documents the refusals a token can get, and the fields that
    // need more than the route's role are listed and refused as listed.
    for (path, ops) in doc["paths"].as_object().expect("paths") {
        for (method, op) in ops.as_object().expect("operations") {
            if op["x-disbatch-role"] != "public" {
                for code in ["401", "403"] {
                    assert!(
                        op["responses"][code].is_object(),
                        "{method} {path} lacks {code}"
                    );
                }
            }
        }
    }
    let update = &doc["paths"]["/queues/{queue}"]["post"];
    assert_eq!(update["x-disbatch-role"], "operate");
    let admin_fields: Vec<&str> = update["x-disbatch-admin-fields"]
        .as_array()
        .expect("admin fields")
        .iter()
        .filter_map(|f| f.as_str())
        .collect();
    assert!(
        ["name", "plugin", "worker"]
            .iter()
            .all(|f| admin_fields.contains(f)),
        "{admin_fields:?}"
    );
    assert!(
        update["responses"]["403"]["description"]
            .as_str()
            .is_some_and(|d| d.contains("below admin for name, plugin")),
        "{update}"
    );
    for field in admin_fields {
        let (status, _, body) = call(
            dci,
            Method::POST,
            q,
            Some(OPERATE),
            Some(json!({ field: "x" })),
        )
        .await;
        assert_eq!(status, 403, "{field} with an operate token: {body}");
    }
}

#[tokio::test]
async fn no_tokens_keeps_the_api_open() {
    let db = TestDb::new("access_open").await;
    db.insert_queue("work", "echo", 0).await;
    let dci = Dci::start(&write_config(&db, "web.json", json!({})));
    let (status, _, body) = call(
        &dci,
        Method::POST,
        "/tasks",
        None,
        Some(json!({"queue": "work", "params": [{"n": 1}]})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    // A token sent to an open server is ignored, not refused.
    let (status, _, _) = call(&dci, Method::GET, "/queues", Some(WRONG), None).await;
    assert_eq!(status, 200);
    drop(dci);
    db.drop().await;
}

#[tokio::test]
async fn tokens_never_reach_the_log_but_their_names_do() {
    let db = TestDb::new("access_log").await;
    db.insert_queue("work", "echo", 0).await;
    let log = db.path("dci.log");
    let dci = Dci::launch(
        &tokens_config(&db, "web.json", json!({})),
        Launch {
            log_file: Some(log.clone()),
            rust_log: Some("debug".into()),
            ..Launch::default()
        },
    );
    for token in [READ, OPERATE, ADMIN, WRONG] {
        call(&dci, Method::GET, "/queues", Some(token), None).await;
        call(
            &dci,
            Method::POST,
            "/queues",
            Some(token),
            Some(json!({"name": format!("q-{}", &token[..4]), "plugin": "echo"})),
        )
        .await;
    }
    let status = dci.terminate();
    assert!(
        status.success(),
        "disbatch-web exit after SIGTERM: {status}"
    );
    let text = std::fs::read_to_string(&log).expect("DCI log");
    assert!(
        !text.contains("WARNING"),
        "loopback needs no warning: {text}"
    );
    // The log did capture the requests (so the checks below can fail).
    for name in ["viewer", "ops", "boss"] {
        assert!(
            text.contains(&format!("token={name}")),
            "no debug line names {name}: {text}"
        );
    }
    for secret in [READ, OPERATE, ADMIN, WRONG] {
        assert!(!text.contains(secret), "a token is in the log: {text}");
    }
    db.drop().await;
}

#[tokio::test]
async fn an_open_api_on_a_reachable_address_is_warned_about() {
    use std::io::{BufRead, BufReader};
    let db = TestDb::new("access_warn").await;
    let config = write_config(&db, "web.json", json!({}));
    let log = db.path("dci.log");
    // 0.0.0.0 listens on every interface (nothing is sent anywhere); the server is stopped
    // as soon as it has started.
    let mut child = Command::new(bin_path("disbatch-web"))
        .arg("--config")
        .arg(&config)
        .args(["--listen", "0.0.0.0:0"])
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).expect("log"))
        .spawn()
        .expect("spawn disbatch-web");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("listen line");
    let _ = child.kill();
    let _ = child.wait();
    assert!(line.starts_with("listening on http://0.0.0.0:"), "{line}");
    let text = std::fs::read_to_string(&log).expect("log");
    assert!(
        text.contains("WARNING") && text.contains("no web.tokens"),
        "{text}"
    );
    db.drop().await;
}

#[tokio::test]
async fn the_console_asks_for_a_token_and_explains_a_low_role() {
    let db = TestDb::new("access_console").await;
    db.insert_queue("guarded", "echo", 2).await;
    let dci = Dci::start(&tokens_config(&db, "web.json", json!({})));
    let b = Browser::start(1280, 800).await;
    b.client
        .goto(&format!("{}/", dci.url))
        .await
        .expect("navigate");

    // The API answers 401, so the page shows the prompt, with a label for its input.
    let input = b.find("#token-input").await;
    let shown = &input;
    wait_for("the token prompt", Duration::from_secs(20), || async move {
        shown.is_displayed().await.unwrap_or(false)
    })
    .await;
    let label = b
        .find("label[for=\"token-input\"]")
        .await
        .text()
        .await
        .expect("label");
    assert_eq!(label, "Access token");
    b.screenshot("access-token-prompt").await;

    // A wrong token is refused and the prompt says so.
    input.send_keys(WRONG).await.expect("type");
    b.find("#token-save").await.click().await.expect("save");
    b.wait_text("#token-msg", "refusal", |t| t.contains("refused"))
        .await;

    // The read token loads the console.
    input.send_keys(READ).await.expect("type");
    b.find("#token-save").await.click().await.expect("save");
    b.wait_loaded("queues").await;
    b.find("tr[data-queue=\"guarded\"]").await;
    let hidden = b
        .client
        .execute(
            "return [document.getElementById('token-form').hidden, sessionStorage.getItem('disbatch.token')]",
            vec![],
        )
        .await
        .expect("script");
    assert_eq!(hidden, json!([true, READ]));

    // Pausing needs operate: the page says the role is too low, and nothing changes.
    b.find("tr[data-queue=\"guarded\"] button.pause")
        .await
        .click()
        .await
        .expect("pause");
    let msg = b
        .wait_text("#queues-msg", "role message", |t| !t.is_empty())
        .await;
    assert!(msg.contains("role cannot do this"), "{msg}");
    b.screenshot("access-role-too-low").await;
    let queue = db
        .db
        .collection::<bson::Document>("queues")
        .find_one(doc! {"name": "guarded"})
        .await
        .expect("find")
        .expect("queue");
    assert!(!queue.contains_key("paused_threads"), "{queue}");

    // "Forget token" drops it and the prompt comes back.
    b.find("#token-clear").await.click().await.expect("forget");
    wait_for("the prompt again", Duration::from_secs(20), || async move {
        shown.is_displayed().await.unwrap_or(false)
    })
    .await;
    b.close().await;
    drop(dci);
    db.drop().await;
}
