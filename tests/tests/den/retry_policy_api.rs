//! A queue's retry policy through the API: shown on a queue the API made, and changed there.

use bson::{doc, Bson, Document};
use disbatch_tests::{write_config, Dci, TestDb};
use reqwest::Method;
use serde_json::json;

const ADMIN: &str = "admin-token-0123456789abcdef";
const OPS: &str = "operate-token-0123456789abcdef";
const READ: &str = "read-token-0123456789abcdef";

async fn call(
    dci: &Dci,
    method: reqwest::Method,
    path: &str,
    token: &str,
    body: serde_json::Value,
) -> (u16, serde_json::Value) {
    let request = dci
        .http
        .request(method, dci.at(path))
        .bearer_auth(token)
        .json(&body);
    let r = request.send().await.expect("request");
    let status = r.status().as_u16();
    let v: serde_json::Value = r.json().await.unwrap_or(serde_json::Value::Null);
    (status, v)
}

async fn queue_retry(db: &TestDb, name: &str) -> Option<Bson> {
    db.db
        .collection::<Document>("queues")
        .find_one(doc! {"name": name})
        .await
        .expect("find queue")
        .and_then(|q| q.get("retry").cloned())
}

/// Queues made by the API get the default policy, written out; `null` makes a Disbatch-style
/// queue; a bad policy is refused naming the field; `update-queue` changes and removes it, for
/// the role that changes a queue's limits and not below; `GET /queues/:q` shows it.
#[tokio::test]
async fn a_queue_made_by_the_api_shows_its_retry_policy_and_it_can_be_changed() {
    let db = TestDb::new("retry_api").await;
    let web = json!({"tokens": [
        {"name": "viewer", "role": "read", "token": "read-token-0123456789abcdef"},
        {"name": "ops", "role": "operate", "token": "operate-token-0123456789abcdef"},
        {"name": "boss", "role": "admin", "token": "admin-token-0123456789abcdef"},
    ]});
    let config = write_config(&db, "web.json", json!({"web": web}));
    let dci = disbatch_tests::Dci::start(&config);

    check_a_new_queue_gets_the_default_policy_and_bad_ones_are_refused(&db, &dci).await;

    check_the_operate_role_changes_the_policy_and_read_may_not(&db, &dci).await;

    check_the_cli_sets_and_clears_the_policy(&db, &dci).await;
    drop(dci);
    db.drop().await;
}

async fn check_a_new_queue_gets_the_default_policy_and_bad_ones_are_refused(
    db: &TestDb,
    dci: &Dci,
) {
    let (status, _) = call(
        dci,
        Method::POST,
        "/queues",
        ADMIN,
        json!({"name": "words", "plugin": "echo"}),
    )
    .await;
    assert_eq!(status, 200);
    let stored = queue_retry(db, "words").await;
    assert_eq!(
        stored,
        Some(Bson::Document(doc! {
            "max_attempts": 20, "backoff": "exponential", "base_s": 15.0, "max_s": 21600.0,
            "jitter": 0.1, "on": ["failed", "crashed", "timeout", "lost"],
        })),
        "the default policy, written out"
    );
    let (status, _) = call(
        dci,
        Method::POST,
        "/queues",
        ADMIN,
        json!({"name": "plain", "plugin": "echo", "retry": null}),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(queue_retry(db, "plain").await, None, "null: no policy");
    for (bad, field) in [
        (
            json!({"max_attempt": 3}),
            "retry.max_attempt is not a retry field",
        ),
        (
            json!({"max_attempts": 0}),
            "retry.max_attempts must be from 1",
        ),
        (json!({"backoff": "linear"}), "retry.backoff must be"),
        (json!({"on": ["failed", "oops"]}), "is not one of"),
        (json!("often"), "retry must be an object or null"),
    ] {
        let (status, body) = call(
            dci,
            Method::POST,
            "/queues",
            ADMIN,
            json!({"name": "bad", "plugin": "echo", "retry": bad}),
        )
        .await;
        assert_eq!(status, 400, "{body}");
        assert!(body.to_string().contains(field), "{field}: {body}");
    }
    assert!(queue_retry(db, "bad").await.is_none());
}

async fn check_the_operate_role_changes_the_policy_and_read_may_not(db: &TestDb, dci: &Dci) {
    // The operate role changes it (as it does flow limits); read may not.
    let (status, body) = call(
        dci,
        Method::POST,
        "/queues/words",
        READ,
        json!({"retry": {"max_attempts": 3}}),
    )
    .await;
    assert_eq!(status, 403, "{body}");
    let (status, body) = call(
        dci,
        Method::POST,
        "/queues/words",
        OPS,
        json!({"retry": {"max_attempts": 3, "base_s": 1}}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        queue_retry(db, "words").await,
        Some(Bson::Document(doc! {"max_attempts": 3, "base_s": 1}))
    );
    let (_, shown) = call(dci, Method::GET, "/queues/words", READ, json!(null)).await;
    assert_eq!(
        shown["retry"],
        json!({"max_attempts": 3, "base_s": 1}),
        "{shown}"
    );
    let (status, body) = call(
        dci,
        Method::POST,
        "/queues/words",
        OPS,
        json!({"retry": {"jitter": 2}}),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(body.to_string().contains("retry.jitter"), "{body}");
}

async fn check_the_cli_sets_and_clears_the_policy(db: &TestDb, dci: &Dci) {
    // The CLI: --retry on create-queue, `retry JSON` and `retry null` on update-queue.
    let cli = |args: &[&str]| {
        let out = std::process::Command::new(disbatch_tests::bin_path("disbatch"))
            .arg("--url")
            .arg(&dci.url)
            .env("DISBATCH_TOKEN", ADMIN)
            .args(args)
            .output()
            .expect("run disbatch");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).to_string()
                + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let (ok, text) = cli(&[
        "create-queue",
        "cliq",
        "echo",
        "--retry",
        r#"{"max_attempts": 2}"#,
    ]);
    assert!(ok, "{text}");
    assert_eq!(
        queue_retry(db, "cliq").await,
        Some(Bson::Document(doc! {"max_attempts": 2}))
    );
    let (ok, text) = cli(&[
        "update-queue",
        "cliq",
        "retry",
        r#"{"backoff": "constant", "base_s": 5}"#,
    ]);
    assert!(ok, "{text}");
    assert_eq!(
        queue_retry(db, "cliq").await,
        Some(Bson::Document(doc! {"backoff": "constant", "base_s": 5}))
    );
    let (ok, text) = cli(&["update-queue", "cliq", "retry", "null"]);
    assert!(ok, "{text}");
    assert_eq!(queue_retry(db, "cliq").await, None);
    let (ok, text) = cli(&["update-queue", "cliq", "retry", r#"{"on": ["sometimes"]}"#]);
    assert!(!ok && text.contains("retry.on"), "{text}");
}
