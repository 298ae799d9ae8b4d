//! `disbatch-web` black-box: info, plugins, request parsing, limits and failures (balance and
//! monitoring: `balance.rs`; legacy routes and the OpenAPI document: `routes.rs`).

use bson::doc;
use bson::oid::ObjectId;
use disbatch_tests::api::{assert_sorted_keys, error};
use disbatch_tests::api_calls::raw_json;
use disbatch_tests::{write_config, Dci, TestDb};
use reqwest::Method;
use serde_json::{json, Value};

const LEGACY: &str = "Disbatch::Web::Tasks";

#[tokio::test]
async fn info_and_plugins_describe_this_server() {
    let db = TestDb::new("api_info").await;
    let config = write_config(&db, "web.json", json!({}));
    let dci = Dci::start(&config);
    let (status, ct, info) = raw_json(&dci, Method::GET, "/info", None, "").await;
    assert_eq!((status, ct.as_str()), (200, "application/json"));
    assert_sorted_keys(&info);
    let keys: Vec<&String> = info.as_object().expect("object").keys().collect();
    assert_eq!(keys, ["database", "routes", "web_extensions"]);
    assert_eq!(info["database"], db.name.as_str());
    assert_eq!(info["web_extensions"], json!([]));
    let routes = |method: &str| -> Vec<String> {
        info["routes"][method]
            .as_array()
            .unwrap_or_else(|| panic!("no {method} routes: {info}"))
            .iter()
            .map(|r| r.as_str().expect("route").to_string())
            .collect()
    };
    let (get, post, delete) = (routes("GET"), routes("POST"), routes("DELETE"));
    for r in [
        "/info",
        "/nodes",
        "/nodes/:node",
        "/plugins",
        "/queues",
        "/queues/:queue",
        "/tasks",
        "/tasks/:id",
        "/balance",
        "/monitoring",
    ] {
        assert!(get.contains(&r.to_string()), "GET {r} in {get:?}");
    }
    for r in [
        "/nodes/:node",
        "/queues",
        "/queues/:queue",
        "/tasks",
        "/balance",
        "/tasks/:id/cancel",
    ] {
        assert!(post.contains(&r.to_string()), "POST {r} in {post:?}");
    }
    assert!(delete.contains(&"/queues/:queue".to_string()), "{delete:?}");
    assert!(
        !post.contains(&"/tasks/search".to_string()),
        "legacy routes are not loaded: {post:?}"
    );

    let (status, plugins) = dci.get("/plugins").await;
    assert_eq!(status, 200);
    let mut names: Vec<String> = plugins
        .as_array()
        .expect("array")
        .iter()
        .map(|p| p.as_str().expect("name").to_string())
        .collect();
    names.sort();
    assert_eq!(names, ["Disbatch::Plugin::Demo", "echo"]);
    drop(dci);

    let config = write_config(&db, "legacy.json", json!({"web_extensions": {LEGACY: {}}}));
    let dci = Dci::start(&config);
    let (_, info) = dci.get("/info").await;
    assert_eq!(info["web_extensions"], json!([LEGACY]));
    let post = info["routes"]["POST"].as_array().expect("POST routes");
    assert!(post.contains(&json!("/tasks/search")), "{info}");
    drop(dci);
    db.drop().await;
}

#[tokio::test]
async fn parameters_are_read_from_json_forms_or_the_query_string() {
    let db = TestDb::new("api_inputs").await;
    let dci = Dci::start(&write_config(&db, "web.json", json!({})));
    let post = |path: &'static str, ct: Option<&'static str>, body: &'static str| {
        let dci = &dci;
        async move { raw_json(dci, Method::POST, path, ct, body).await }
    };

    let (status, ct, body) = post(
        "/queues",
        Some("application/json; charset=utf-8"),
        r#"{"name": "j", "plugin": "echo"}"#,
    )
    .await;
    assert_eq!((status, ct.as_str()), (200, "application/json"), "{body}");
    let (status, _, body) = post(
        "/queues",
        Some("application/x-www-form-urlencoded"),
        "name=f&plugin=echo",
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (status, _, body) = post("/queues?name=qs&plugin=echo", None, "").await;
    assert_eq!(status, 200, "{body}");
    // Another content type: the body is ignored and the (empty) query string is read.
    let (status, _, body) = post(
        "/queues",
        Some("text/plain"),
        r#"{"name": "t", "plugin": "echo"}"#,
    )
    .await;
    assert_eq!((status, body), (400, error("name and plugin required")));
    let mut names: Vec<String> = dci
        .get("/queues")
        .await
        .1
        .as_array()
        .expect("queues")
        .iter()
        .map(|q| q["name"].as_str().expect("name").to_string())
        .collect();
    names.sort();
    assert_eq!(names, ["f", "j", "qs"]);

    // Invalid JSON is a 400 with a JSON body, never a 500.
    let routes = [
        (Method::POST, "/queues"),
        (Method::POST, "/queues/j"),
        (Method::POST, "/queues/j/retry"),
        (Method::POST, "/nodes/n0"),
        (Method::POST, "/tasks"),
        (Method::GET, "/tasks"),
        (Method::POST, "/balance"),
    ];
    for (method, path) in routes {
        let (status, ct, body) = raw_json(
            &dci,
            method.clone(),
            path,
            Some("application/json"),
            "{\"name\": \"x\",",
        )
        .await;
        assert_eq!(
            (status, ct.as_str()),
            (400, "application/json"),
            "{method} {path}: {body}"
        );
        assert!(
            body["error"]
                .as_str()
                .is_some_and(|e| e.starts_with("invalid JSON body")),
            "{method} {path}: {body}"
        );
    }
    drop(dci);
    db.drop().await;
}

#[tokio::test]
async fn bodies_over_the_limit_unknown_routes_and_wrong_methods_get_json_errors() {
    let db = TestDb::new("api_limits").await;
    db.insert_queue("echo", "echo", 0).await;
    let dci = Dci::start(&write_config(
        &db,
        "web.json",
        json!({"web": {"max_body_bytes": 4096}}),
    ));

    let small = json!({"queue": "echo", "params": {"pad": "x".repeat(3000)}});
    let (status, body) = dci.post("/tasks", small).await;
    assert_eq!(status, 200, "under the limit: {body}");
    let big = json!({"queue": "echo", "params": {"pad": "x".repeat(10_000)}});
    for (method, path) in [
        (Method::POST, "/tasks"),
        (Method::GET, "/tasks"),
        (Method::POST, "/queues"),
    ] {
        let (status, body) = dci.send(method.clone(), path, big.clone()).await;
        assert_eq!(status, 413, "{method} {path}: {body}");
        assert!(body["error"].is_string(), "{method} {path}: {body}");
    }
    assert_eq!(db.count(doc! {}).await, 1, "the big body created nothing");

    for path in ["/nope", "/tasks/a/b/c/d", "/queues/echo/nope"] {
        let (status, ct, body) = raw_json(&dci, Method::GET, path, None, "").await;
        assert_eq!(
            (status, ct.as_str()),
            (404, "application/json"),
            "{path}: {body}"
        );
        assert_eq!(body, error(&format!("no route for GET {path}")));
    }
    for (method, path) in [
        (Method::DELETE, "/nodes"),
        (Method::PUT, "/queues"),
        (Method::GET, "/tasks/search"),
    ] {
        let (status, ct, body) = raw_json(&dci, method.clone(), path, None, "").await;
        assert_eq!(
            (status, ct.as_str()),
            (405, "application/json"),
            "{method} {path}: {body}"
        );
        assert!(body["error"].is_string(), "{method} {path}: {body}");
    }
    drop(dci);
    db.drop().await;
}

#[tokio::test]
async fn bad_filters_and_projections_are_400_not_503() {
    let db = TestDb::new("api_bad_queries").await;
    let queue = db.insert_queue("echo", "echo", 0).await;
    db.insert_tasks(queue, vec![doc! {"a": 1}.into()]).await;
    let dci = Dci::start(&write_config(&db, "web.json", json!({})));
    let (status, body) = dci
        .post(
            "/tasks",
            json!({"queue": "echo", "collection": "users", "filter": {"$bogus": 1}, "params": {"u": "document.email"}}),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"].as_str().is_some_and(|e| e.contains("$bogus")),
        "{body}"
    );
    let (status, body) = dci
        .send(
            Method::GET,
            "/tasks",
            json!({"queue": "echo", ".fields": {"a": 1, "b": 0}}),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(body["error"].is_string(), "{body}");
    assert_eq!(db.count(doc! {}).await, 1);
    drop(dci);
    db.drop().await;
}

#[tokio::test]
async fn a_database_outage_is_503_json() {
    let db = TestDb::new("api_outage").await;
    let config = write_config(
        &db,
        "down.json",
        json!({"mongohost": "mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=500&directConnection=true", "monitoring": true}),
    );
    let dci = Dci::start(&config);
    let task = ObjectId::new().to_hex();
    let requests: Vec<(Method, String, Value)> = vec![
        (Method::GET, "/queues".into(), json!({})),
        (Method::GET, "/queues/q".into(), json!({})),
        (
            Method::POST,
            "/queues".into(),
            json!({"name": "q", "plugin": "echo"}),
        ),
        (Method::GET, "/nodes".into(), json!({})),
        (
            Method::POST,
            "/tasks".into(),
            json!({"queue": "q", "params": {"a": 1}}),
        ),
        (Method::GET, "/tasks".into(), json!({".limit": 1})),
        (Method::GET, format!("/tasks/{task}"), json!({})),
        (Method::POST, format!("/tasks/{task}/cancel"), json!({})),
        (Method::GET, "/balance".into(), json!({})),
    ];
    let mut handles = Vec::new();
    for (method, path, body) in requests {
        let req = dci.http.request(method.clone(), dci.at(&path)).json(&body);
        handles.push(tokio::spawn(async move {
            let r = req.send().await.expect("request");
            let status = r.status().as_u16();
            let text = r.text().await.expect("body");
            (method, path, status, text)
        }));
    }
    for h in handles {
        let (method, path, status, text) = h.await.expect("join");
        assert_eq!(status, 503, "{method} {path}: {text}");
        let body: Value = serde_json::from_str(&text)
            .unwrap_or_else(|_| panic!("{method} {path}: not JSON: {text}"));
        assert!(
            body["error"]
                .as_str()
                .is_some_and(|e| e.starts_with("database unavailable: ")),
            "{method} {path}: {body}"
        );
        // Open mode: a client learns that the database is down, not where it is.
        assert!(
            !text.contains("127.0.0.1") && !text.contains("RawDocumentBuf"),
            "{method} {path}: {text}"
        );
    }
    // Routes that need no database still answer; monitoring reports the failure with 200.
    let (status, info) = dci.get("/info").await;
    assert_eq!(status, 200, "{info}");
    let (status, body) = dci.get("/monitoring").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["disbatch"]["status"], "CRITICAL", "{body}");
    assert!(
        body["disbatch"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("Could not get current Disbatch nodes")),
        "{body}"
    );
    drop(dci);
    db.drop().await;
}
