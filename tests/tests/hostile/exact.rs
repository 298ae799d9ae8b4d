//! Known bad requests, a few per defect class, each answered with exactly its status and a
//! reason that says what is wrong (never a server dump), and nothing stored or changed.

use std::time::Duration;

use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Document};
use disbatch_tests::hostile::requests::request;
use disbatch_tests::hostile::snapshot_of_work;
use disbatch_tests::hostile::{crashes, raw_http, LoggedDci};
use disbatch_tests::{write_config, TestDb};
use serde_json::{json, Value};

/// A request, the status it must get, and words its `error` must contain.
struct Case {
    what: String,
    method: &'static str,
    path: String,
    body: Value,
    status: u16,
    says: &'static str,
}

fn case(
    what: impl Into<String>,
    method: &'static str,
    path: impl Into<String>,
    body: Value,
    status: u16,
    says: &'static str,
) -> Case {
    Case {
        what: what.into(),
        method,
        path: path.into(),
        body,
        status,
        says,
    }
}

fn cases(queue: ObjectId) -> Vec<Case> {
    let q = queue.to_hex();
    let mut out = extended_json_cases(&q);
    out.extend(refused_value_cases(&q));
    out.extend(server_refused_cases(&q));
    out.extend(name_cases(&q));
    out
}

/// BSON-only and malformed Extended JSON values (item 2).
fn extended_json_cases(q: &str) -> Vec<Case> {
    vec![
        case(
            "undefined in params",
            "POST",
            "/tasks",
            json!({"queue": q, "params": [{"a": {"$undefined": true}}]}),
            400,
            "params.a: BSON type undefined",
        ),
        case(
            "bad $numberLong in the 2nd params",
            "POST",
            "/tasks",
            json!({"queue": q, "params": [{"ok": 1}, {"b": {"$numberLong": "x"}}]}),
            400,
            "params[1].b is not a valid Extended JSON value",
        ),
        case(
            "bad $oid",
            "POST",
            "/tasks",
            json!({"queue": q, "params": [{"b": {"$oid": "x"}}]}),
            400,
            "params.b is not a valid Extended JSON value",
        ),
        case(
            "bad $date deep down",
            "POST",
            "/tasks",
            json!({"queue": q, "params": [{"a": [{"c": {"$date": "x"}}]}]}),
            400,
            "params.a[0].c",
        ),
        case(
            "JavaScript code",
            "POST",
            "/tasks",
            json!({"queue": q, "params": [{"f": {"$code": "f()"}}]}),
            400,
            "JavaScript",
        ),
        case(
            "symbol",
            "POST",
            "/tasks",
            json!({"queue": q, "params": [{"s": {"$symbol": "s"}}]}),
            400,
            "symbol",
        ),
        case(
            "maxKey",
            "POST",
            "/tasks",
            json!({"queue": q, "params": [{"k": {"$maxKey": 1}}]}),
            400,
            "maxKey",
        ),
        case(
            "a $ field name",
            "POST",
            "/tasks",
            json!({"queue": q, "params": [{"x": {"$where": "1"}}]}),
            400,
            "starts with '$'",
        ),
        case(
            "undefined in a unit",
            "POST",
            format!("/queues/{q}/units"),
            json!({"units": [{"key": "k", "params": {"u": {"$undefined": true}}}]}),
            400,
            "params.u: BSON type undefined",
        ),
        case(
            "undefined in a template",
            "POST",
            "/tasks",
            json!({"queue": q, "collection": "queues", "filter": {}, "params": {"u": {"$undefined": true}}}),
            400,
            "BSON type undefined",
        ),
        case(
            "undefined in a spec",
            "POST",
            "/specs",
            json!({"plugin": "echo", "specs": [{"name": "s", "x": {"$undefined": true}}]}),
            400,
            "spec.x: BSON type undefined",
        ),
    ]
}

/// Values the DEN would refuse (item 10).
fn refused_value_cases(q: &str) -> Vec<Case> {
    vec![
        case(
            "threads beyond 2^53",
            "POST",
            "/queues",
            json!({"name": "huge", "plugin": "echo", "threads": 9_007_199_254_740_993_u64}),
            400,
            "too large",
        ),
        case(
            "threads beyond u32",
            "POST",
            "/queues",
            json!({"name": "huge", "plugin": "echo", "threads": 4_294_967_296_u64}),
            400,
            "too large",
        ),
        case(
            "threads update beyond u32",
            "POST",
            format!("/queues/{q}"),
            json!({"threads": 9_007_199_254_740_993_u64}),
            400,
            "too large",
        ),
        case(
            "maxthreads beyond u32",
            "POST",
            "/nodes/target-node",
            json!({"maxthreads": 9_007_199_254_740_993_u64}),
            400,
            "too large",
        ),
        case(
            "spec threads beyond u32",
            "POST",
            "/specs",
            json!({"plugin": "echo", "specs": [{"name": "s", "threads": 9_007_199_254_740_993_u64}]}),
            400,
            "too large",
        ),
        case(
            "spec lease below 3 s",
            "POST",
            "/specs",
            json!({"plugin": "echo", "specs": [{"name": "s", "lease": 1}]}),
            400,
            "lease",
        ),
    ]
}

/// The server refuses or would run JavaScript; a command namespace (item 7).
fn server_refused_cases(q: &str) -> Vec<Case> {
    vec![
        case(
            "$where filter",
            "POST",
            "/tasks/search",
            json!({"filter": {"$where": "sleep(100)"}}),
            400,
            "runs JavaScript",
        ),
        case(
            "$function filter",
            "POST",
            "/tasks/search",
            json!({"filter": {"$expr": {"$function": {"body": "function() {return true}", "args": [], "lang": "js"}}}}),
            400,
            "$function",
        ),
        case(
            "$accumulator filter",
            "POST",
            "/tasks",
            json!({"queue": q, "collection": "queues", "filter": {"$expr": {"$accumulator": {}}}, "params": {"a": 1}}),
            400,
            "$accumulator",
        ),
        case(
            "$cmd collection",
            "POST",
            "/tasks",
            json!({"queue": q, "collection": "$cmd", "filter": {}, "params": {"a": 1}}),
            400,
            "'$'",
        ),
        case(
            "system collection",
            "POST",
            "/tasks",
            json!({"queue": q, "collection": "system.users", "filter": {}, "params": {"a": 1}}),
            400,
            "not a collection",
        ),
        case(
            "unknown operator",
            "POST",
            "/tasks/search",
            json!({"filter": {"status": {"$bogus": 1}}}),
            400,
            "$bogus",
        ),
    ]
}

/// Names with control and direction characters, absurd lengths, surrounding spaces (item 11).
fn name_cases(q: &str) -> Vec<Case> {
    let mut out = Vec::new();
    let names = [
        ("ESC", "red\u{1b}[31mq".to_string(), "U+001B"),
        ("NUL", "a\u{0}b".to_string(), "U+0000"),
        ("newline", "two\nlines".to_string(), "U+000A"),
        ("RTL override", "evil\u{202e}txt.exe".to_string(), "U+202E"),
        ("100 KB", "x".repeat(100_000), "characters long"),
        ("trailing space", "name ".to_string(), "whitespace"),
        ("leading space", " name".to_string(), "whitespace"),
    ];
    for (label, name, says) in names {
        out.push(case(
            format!("create, name with {label}"),
            "POST",
            "/queues",
            json!({"name": name, "plugin": "echo"}),
            400,
            says,
        ));
        out.push(case(
            format!("rename, name with {label}"),
            "POST",
            format!("/queues/{q}"),
            json!({"name": name}),
            400,
            says,
        ));
        out.push(case(
            format!("spec, name with {label}"),
            "POST",
            "/specs",
            json!({"plugin": "echo", "specs": [{"name": name}]}),
            400,
            says,
        ));
        out.push(case(
            format!("then with {label}"),
            "POST",
            "/specs",
            json!({"plugin": "echo", "specs": [{"name": "s", "then": name}]}),
            400,
            says,
        ));
    }
    out
}

#[tokio::test]
async fn known_bad_requests_get_exactly_their_status_and_change_nothing() {
    let db = TestDb::new("hostile_exact").await;
    let queue = db.insert_queue("target-queue", "echo", 1).await;
    db.db
        .collection::<Document>("nodes")
        .insert_one(
            doc! {"_id": ObjectId::new(), "node": "target-node", "timestamp": DateTime::now()},
        )
        .await
        .expect("node");
    db.insert_tasks(queue, vec![Bson::from(doc! {"keep": 1})])
        .await;
    let config = write_config(
        &db,
        "web.json",
        json!({"web_extensions": {"Disbatch::Web::Tasks": null}, "web": {"max_body_bytes": 200_000}}),
    );
    let mut dci = LoggedDci::start(&config, &db.path("dci.log"));
    let before = snapshot_of_work(&db).await;

    let mut all = cases(queue);
    all.push(case(
        "a body over web.max_body_bytes",
        "POST",
        "/tasks",
        json!({"queue": queue.to_hex(), "params": [{"big": "x".repeat(300_000)}]}),
        413,
        "max_body_bytes",
    ));
    let mut failures = Vec::new();
    for c in &all {
        let body = serde_json::to_vec(&c.body).expect("body");
        let r = raw_http(
            dci.addr,
            &request(
                c.method.as_bytes(),
                &c.path,
                Some(b"application/json"),
                b"",
                &body,
            ),
            Duration::from_secs(30),
        )
        .await;
        let r = match r {
            Ok(r) => r,
            Err(e) => {
                failures.push(format!("{}: no answer: {e}", c.what));
                continue;
            }
        };
        let error = serde_json::from_slice::<Value>(&r.body)
            .ok()
            .and_then(|v| v["error"].as_str().map(str::to_string))
            .unwrap_or_default();
        if r.status != c.status || !error.contains(c.says) {
            failures.push(format!(
                "{}: {} {:?}, wanted {} with {:?}",
                c.what,
                r.status,
                r.text().chars().take(300).collect::<String>(),
                c.status,
                c.says
            ));
        }
        // Bodies never carry the server's raw reply, nor a raw control character.
        if r.text().contains("RawDocumentBuf") || error.chars().any(|c| c == '\u{1b}' || c == '\0')
        {
            failures.push(format!("{}: body {:?}", c.what, r.text()));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} requests:\n{}",
        failures.len(),
        all.len(),
        failures.join("\n")
    );
    assert_eq!(
        snapshot_of_work(&db).await,
        before,
        "a refused request changed the database"
    );
    let log = dci.log_text();
    assert!(dci.is_running(), "the DCI exited:\n{log}");
    assert_eq!(crashes(&log), Vec::<String>::new(), "DCI log:\n{log}");
    println!(
        "{} known bad requests, each with its exact status",
        all.len()
    );
    db.drop().await;
}
