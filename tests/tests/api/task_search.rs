//! `disbatch-web` black-box: searching tasks (`/tasks/search`): indexed prefixes, value
//! conversion, count, paging, projection, rendering, and where parameters come from.

use bson::doc;
use bson::oid::ObjectId;
use disbatch_tests::api::error;
use disbatch_tests::api_calls::{oid, parse, raw, six_tasks, SixTasks};
use disbatch_tests::{write_config, Dci, TestDb};
use reqwest::Method;
use serde_json::{json, Value};

fn ids_of(v: &Value) -> Vec<String> {
    let mut ids: Vec<String> = v
        .as_array()
        .unwrap_or_else(|| panic!("expected an array: {v}"))
        .iter()
        .map(|t| t["_id"]["$oid"].as_str().expect("_id").to_string())
        .collect();
    ids.sort();
    ids
}

fn hexes(ids: &[ObjectId]) -> Vec<String> {
    let mut out: Vec<String> = ids.iter().map(|id| id.to_hex()).collect();
    out.sort();
    out
}

#[tokio::test]
async fn searches_allow_only_indexed_prefixes_and_convert_values() {
    let db = TestDb::new("api_tasks_search").await;
    let config = write_config(&db, "web.json", json!({}));
    let other = db.insert_queue("other", "echo", 0).await;
    let foreign = db.insert_tasks(other, vec![doc! {"x": 1}.into()]).await[0];
    db.set_task(foreign, doc! {"status": 1, "node": "n1"}).await;
    let f = six_tasks(&db).await;
    let dci = Dci::start(&config);
    let q = f.queue.to_hex();
    let ids = &f.ids;

    check_indexed_filters_resolve_convert_and_combine(&dci, &q, ids, foreign).await;

    check_non_indexed_searches_are_refused_with_the_indexes(&dci, &q).await;

    check_bad_ids_and_unbounded_searches_are_refused(&dci, ids).await;
    drop(dci);
    db.drop().await;
}

async fn check_indexed_filters_resolve_convert_and_combine(
    dci: &Dci,
    q: &str,
    ids: &[ObjectId],
    foreign: ObjectId,
) {
    let (status, body) = dci.get(&format!("/tasks?queue={q}")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(ids_of(&body), hexes(ids));
    let (status, body) = dci.get("/tasks?queue=work").await;
    assert_eq!(status, 200, "a queue name is resolved: {body}");
    assert_eq!(ids_of(&body), hexes(ids));
    let (status, body) = dci.get("/tasks?queue=nosuch").await;
    assert_eq!((status, body), (400, error("queue not found")));

    // Numeric strings become numbers: "1" finds status 1.
    let (status, body) = dci.get(&format!("/tasks?queue={q}&status=1")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(ids_of(&body), hexes(&[ids[1], ids[3]]));
    let (status, body) = dci.get(&format!("/tasks?queue={q}&status=-2")).await;
    assert_eq!(ids_of(&body), hexes(&[ids[0], ids[5]]), "{status}");
    // Repeated keys and arrays become alternatives.
    let (status, body) = dci
        .get(&format!("/tasks?queue={q}&status=2&status=0"))
        .await;
    assert_eq!(ids_of(&body), hexes(&[ids[2], ids[4]]), "{status}");
    let (status, body) = dci
        .send(
            Method::GET,
            "/tasks",
            json!({"queue": q, "status": [1, "2"]}),
        )
        .await;
    assert_eq!(ids_of(&body), hexes(&[ids[1], ids[2], ids[3]]), "{status}");
    let (status, body) = dci
        .send(
            Method::GET,
            "/tasks",
            json!({"id": [ids[0].to_hex(), oid(ids[4])]}),
        )
        .await;
    assert_eq!(ids_of(&body), hexes(&[ids[0], ids[4]]), "{status}");

    let (status, body) = dci.get("/tasks?node=n1").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(ids_of(&body), hexes(&[ids[1], ids[2], foreign]));
    let (status, body) = dci.get(&format!("/tasks?node=n2&status=1&queue={q}")).await;
    assert_eq!(ids_of(&body), hexes(&[ids[3]]), "{status}");
    let (status, body) = dci.get(&format!("/tasks?id={}", ids[2].to_hex())).await;
    assert_eq!(ids_of(&body), hexes(&[ids[2]]), "{status}");
    // Empty values are skipped.
    let (status, body) = dci.get(&format!("/tasks?queue={q}&status=")).await;
    assert_eq!(ids_of(&body), hexes(ids), "{status}");
}

async fn check_non_indexed_searches_are_refused_with_the_indexes(dci: &Dci, q: &str) {
    let (status, body) = dci.get("/tasks?status=1").await;
    assert_eq!(status, 400, "{body}");
    let keys: Vec<&String> = body.as_object().expect("object").keys().collect();
    assert_eq!(
        keys,
        [
            "error",
            "hint",
            "indexes",
            "invalid_params",
            "path",
            "title"
        ],
        "{body}"
    );
    assert_eq!(body["error"], "non-indexed params given");
    assert_eq!(body["path"], "/tasks");
    assert!(body["title"].is_string(), "{body}");
    assert_eq!(body["invalid_params"], json!(["status"]));
    let indexes = body["indexes"].as_array().expect("indexes");
    for set in [
        json!(["id"]),
        json!(["queue", "status"]),
        json!(["node", "status", "queue", "id"]),
    ] {
        assert!(indexes.contains(&set), "{set} in {body}");
    }
    let (status, body) = dci
        .get(&format!("/tasks?queue={q}&params.i=1&stdout=x"))
        .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["invalid_params"], json!(["params.i", "stdout"]));
    let (status, body) = dci.get("/tasks?status=1&queue=").await;
    assert_eq!(status, 400, "a blank queue does not unlock status: {body}");
}

async fn check_bad_ids_and_unbounded_searches_are_refused(dci: &Dci, ids: &[ObjectId]) {
    // Bad ObjectIds are 400, never 500.
    for path in [
        "/tasks?id=nothex".to_string(),
        "/tasks?id=zzzzzzzzzzzzzzzzzzzzzzzz".to_string(),
        format!("/tasks?id={}&id=123", ids[0].to_hex()),
    ] {
        let (status, body) = dci.get(&path).await;
        assert_eq!(status, 400, "{path}: {body}");
        assert!(body["error"].is_string(), "{path}: {body}");
    }
    let (status, body) = dci
        .send(Method::GET, "/tasks", json!({"queue": ["nothex"]}))
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(body["error"].is_string(), "{body}");

    let (status, body) = dci.get("/tasks").await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(
        body["error"],
        "refusing to return everything - include one or more indexed search restrictions"
    );
    let (status, body) = dci.get("/tasks?.limit=3").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body.as_array().map(Vec::len), Some(3), "{body}");
    let (status, body) = dci.get("/tasks?.limit=0").await;
    assert_eq!(status, 400, "limit 0 is no limit: {body}");
}

#[tokio::test]
async fn search_options_count_page_project_and_render() {
    let db = TestDb::new("api_tasks_options").await;
    let config = write_config(&db, "web.json", json!({}));
    let f = six_tasks(&db).await;
    let dci = Dci::start(&config);
    let q = f.queue.to_hex();
    let ids = &f.ids;

    check_counts_pages_a_single_object_and_plain_rendering(&db, &dci, &f, &q, ids).await;

    check_fields_project_each_task(&dci, &q).await;

    check_terse_full_epoch_and_pretty_renderings(&db, &dci, &f, &q, ids).await;

    // No match is an empty array.
    let (status, body) = dci
        .get(&format!("/tasks?queue={}", f.empty_queue.to_hex()))
        .await;
    assert_eq!((status, body), (200, json!([])));
    let (status, body) = dci
        .get(&format!("/tasks?queue={q}&status=3&.limit=1"))
        .await;
    assert_eq!((status, body), (200, json!([])));
    let (status, body) = dci
        .get(&format!("/tasks?queue={q}&status=3&.count=1"))
        .await;
    assert_eq!((status, body), (200, json!({"count": 0})));

    for bad in [".limit=-1", ".limit=x", ".skip=-3", ".nosuch=1"] {
        let (status, body) = dci.get(&format!("/tasks?queue={q}&{bad}")).await;
        assert_eq!(status, 400, "{bad}: {body}");
        assert!(body["error"].is_string(), "{bad}: {body}");
    }
    drop(dci);

    // Disbatch's `{}` for no match, when the config asks for it.
    let config = write_config(
        &db,
        "web-compat.json",
        json!({"web": {"empty_tasks_object": true}}),
    );
    let dci = Dci::start(&config);
    let (status, body) = dci
        .get(&format!("/tasks?queue={}", f.empty_queue.to_hex()))
        .await;
    assert_eq!((status, body), (200, json!({})));
    let (status, body) = dci.get(&format!("/tasks?queue={q}&status=1")).await;
    assert_eq!(ids_of(&body), hexes(&[ids[1], ids[3]]), "{status}");
    drop(dci);
    db.drop().await;
}

async fn check_counts_pages_a_single_object_and_plain_rendering(
    db: &TestDb,
    dci: &Dci,
    f: &SixTasks,
    q: &str,
    ids: &[ObjectId],
) {
    let (status, body) = dci.get(&format!("/tasks?queue={q}&.count=1")).await;
    assert_eq!((status, body), (200, json!({"count": 6})));
    let (status, body) = dci
        .get(&format!("/tasks?queue={q}&status=1&.count=true"))
        .await;
    assert_eq!((status, body), (200, json!({"count": 2})));
    let (status, body) = dci
        .send(Method::GET, "/tasks", json!({"node": "n2", ".count": 1}))
        .await;
    assert_eq!((status, body), (200, json!({"count": 2})));

    let (_, all) = dci.get(&format!("/tasks?queue={q}")).await;
    let all = all.as_array().expect("array").clone();
    assert_eq!(all.len(), 6);
    let (status, page) = dci.get(&format!("/tasks?queue={q}&.limit=2&.skip=1")).await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(page, Value::Array(all[1..3].to_vec()));
    let (_, rest) = dci.get(&format!("/tasks?queue={q}&.skip=4")).await;
    assert_eq!(rest, Value::Array(all[4..].to_vec()));

    // .limit 1 gives the object itself, as Disbatch did.
    let (status, single) = dci
        .get(&format!("/tasks?id={}&.limit=1", ids[1].to_hex()))
        .await;
    assert_eq!(status, 200, "{single}");
    assert_eq!(single["_id"], oid(ids[1]), "{single}");
    assert_eq!(single["stdout"], "hello\n");

    // Plain rendering: ObjectIds as {"$oid"}, dates as YYYY-MM-DDTHH:MM:SS.
    let (_, one) = dci.get(&format!("/tasks?id={}", ids[3].to_hex())).await;
    let one = &one[0];
    assert_eq!(one["queue"], oid(f.queue));
    assert_eq!(one["stdout"], oid(f.gridfs_out));
    let ctime = one["ctime"].as_str().expect("ctime text");
    assert_eq!(ctime.len(), 19, "{ctime}");
    assert_eq!(&ctime[4..5], "-");
    assert_eq!(&ctime[10..11], "T");
    assert_eq!(&ctime[16..17], ":");
    let t = db.task(ids[3]).await;
    let expected = t
        .get_datetime("ctime")
        .expect("ctime")
        .try_to_rfc3339_string()
        .expect("rfc3339");
    assert_eq!(ctime, &expected[..19]);
}

async fn check_fields_project_each_task(dci: &Dci, q: &str) {
    let (_, projected) = dci
        .send(
            Method::GET,
            "/tasks",
            json!({"queue": q, ".fields": {"status": 1, "node": 1}}),
        )
        .await;
    for t in projected.as_array().expect("array") {
        let keys: Vec<&String> = t.as_object().expect("object").keys().collect();
        assert_eq!(keys, ["_id", "node", "status"], "{t}");
    }
    let (_, projected) = dci
        .send(
            Method::GET,
            "/tasks",
            json!({"queue": q, ".fields": ["params"]}),
        )
        .await;
    for t in projected.as_array().expect("array") {
        let keys: Vec<&String> = t.as_object().expect("object").keys().collect();
        assert_eq!(keys, ["_id", "params"], "{t}");
    }
    let fields = "%5B%22status%22%5D"; // ["status"] as a JSON string in the query
    let (status, projected) = dci.get(&format!("/tasks?queue={q}&.fields={fields}")).await;
    assert_eq!(status, 200, "{projected}");
    for t in projected.as_array().expect("array") {
        let keys: Vec<&String> = t.as_object().expect("object").keys().collect();
        assert_eq!(keys, ["_id", "status"], "{t}");
    }
    let (status, body) = dci.get(&format!("/tasks?queue={q}&.fields=notjson")).await;
    assert_eq!(status, 400, "{body}");
}

async fn check_terse_full_epoch_and_pretty_renderings(
    db: &TestDb,
    dci: &Dci,
    f: &SixTasks,
    q: &str,
    ids: &[ObjectId],
) {
    let by_id = |v: &Value, id: ObjectId| -> Value {
        v.as_array()
            .expect("array")
            .iter()
            .find(|t| t["_id"] == oid(id))
            .cloned()
            .expect("task present")
    };
    let (_, terse) = dci.get(&format!("/tasks?queue={q}&.terse=1")).await;
    assert_eq!(by_id(&terse, ids[1])["stdout"], "[terse mode]");
    assert_eq!(by_id(&terse, ids[1])["stderr"], "", "empty strings stay");
    assert_eq!(by_id(&terse, ids[2])["stderr"], "[terse mode]");
    assert_eq!(
        by_id(&terse, ids[3])["stdout"],
        oid(f.gridfs_out),
        "ids stay"
    );
    assert_eq!(by_id(&terse, ids[0])["stdout"], Value::Null, "null stays");

    let (_, full) = dci.get(&format!("/tasks?queue={q}&.full=1")).await;
    assert_eq!(by_id(&full, ids[3])["stdout"], "from gridfs");
    assert_eq!(by_id(&full, ids[1])["stdout"], "hello\n");

    let (_, epoch) = dci.get(&format!("/tasks?queue={q}&.epoch=1")).await;
    let task = by_id(&epoch, ids[1]);
    let ctime = task["ctime"].as_f64().expect("float ctime");
    let stored = db
        .task(ids[1])
        .await
        .get_datetime("ctime")
        .expect("ctime")
        .timestamp_millis();
    assert!(
        (ctime - stored as f64 / 1000.0).abs() < 0.0015,
        "{ctime} vs {stored}"
    );
    assert!(task["mtime"].is_f64(), "{task}");

    let (status, _, text) = raw(
        dci,
        Method::GET,
        &format!("/tasks?queue={q}&.pretty=1"),
        &[],
        "",
    )
    .await;
    assert_eq!(status, 200);
    assert!(text.contains("\n  "), "pretty output is indented: {text}");
    assert_eq!(ids_of(&parse(&text)), hexes(ids));
    let (_, ct, text) = raw(dci, Method::GET, &format!("/tasks?queue={q}"), &[], "").await;
    assert!(!text.contains('\n'), "compact by default");
    assert_eq!(ct, "application/json");
}

#[tokio::test]
async fn search_parameters_come_from_json_bodies_forms_or_the_query() {
    let db = TestDb::new("api_tasks_inputs").await;
    let config = write_config(&db, "web.json", json!({}));
    let f = six_tasks(&db).await;
    let dci = Dci::start(&config);
    let q = f.queue.to_hex();
    let count = json!({"count": 2});

    let body = json!({"queue": q, "status": "1", ".count": 1}).to_string();
    for ct in [
        "application/json",
        "application/json; charset=utf-8",
        "Application/JSON;charset=UTF-8",
    ] {
        let (status, _, text) =
            raw(&dci, Method::GET, "/tasks", &[("content-type", ct)], &body).await;
        assert_eq!(
            (status, parse(&text)),
            (200, count.clone()),
            "GET with a {ct} body"
        );
    }
    let form = format!("queue={q}&status=1&.count=1");
    let (status, _, text) = raw(
        &dci,
        Method::GET,
        "/tasks",
        &[("content-type", "application/x-www-form-urlencoded")],
        &form,
    )
    .await;
    assert_eq!((status, parse(&text)), (200, count.clone()), "form body");
    let (status, _, text) = raw(&dci, Method::GET, &format!("/tasks?{form}"), &[], "").await;
    assert_eq!((status, parse(&text)), (200, count.clone()), "query string");
    // A body of another type is ignored in favour of the query string.
    let (status, _, text) = raw(
        &dci,
        Method::GET,
        &format!("/tasks?{form}"),
        &[("content-type", "text/plain")],
        "queue=nonsense",
    )
    .await;
    assert_eq!(
        (status, parse(&text)),
        (200, count),
        "text/plain body ignored"
    );

    let (status, _, text) = raw(
        &dci,
        Method::GET,
        "/tasks",
        &[("content-type", "application/json")],
        "{\"queue\": ",
    )
    .await;
    assert_eq!(status, 400, "{text}");
    let body = parse(&text);
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|e| e.starts_with("invalid JSON body")),
        "{body}"
    );
    drop(dci);
    db.drop().await;
}

/// A regular expression holding a NUL byte cannot be sent to the database at all (BSON keeps
/// patterns as C strings): the legacy search's filter is refused as bad input, 400 naming
/// where, in each form a client can write one; a regex without one still searches.
#[tokio::test]
async fn a_regex_with_a_nul_byte_is_bad_input() {
    let db = TestDb::new("api_tasks_search_nul_regex").await;
    let config = write_config(
        &db,
        "web.json",
        json!({"web_extensions": {"Disbatch::Web::Tasks": null}}),
    );
    let queue = db.insert_queue("q", "echo", 0).await;
    db.insert_tasks(queue, vec![doc! {"name": "alpha"}.into()])
        .await;
    let dci = Dci::start(&config);
    for (filter, at) in [
        (
            json!({"params.name": {"$regex": "al\u{0}"}}),
            "filter.params.name.$regex",
        ),
        (
            json!({"params.name": {"$regex": "al", "$options": "i\u{0}"}}),
            "filter.params.name.$options",
        ),
        (
            json!({"params.name": {"$regularExpression": {"pattern": "a\u{0}", "options": ""}}}),
            "filter.params.name",
        ),
    ] {
        let (status, body) = dci.post("/tasks/search", json!({"filter": filter})).await;
        assert_eq!(
            (status, body),
            (
                400,
                error(&format!(
                    "{at}: a regular expression cannot contain a NUL byte"
                ))
            ),
            "{filter}"
        );
    }
    let (status, body) = dci
        .post(
            "/tasks/search",
            json!({"filter": {"params.name": {"$regex": "^al"}}}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body.as_array().map(Vec::len), Some(1), "{body}");
    drop(dci);
    db.drop().await;
}
