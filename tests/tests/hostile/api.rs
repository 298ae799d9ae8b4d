//! Seeded malformed requests against every OpenAPI route: no 500, no crash, nothing else changed.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Document};
use disbatch_tests::hostile::requests::{
    framing_requests, junk_body, junk_headers, junk_value, request, BAD_QUERIES, JUNK_PATH, KEYS,
    TEN_MB,
};
use disbatch_tests::hostile::{
    crashes, enc, fill, nested_json, openapi_responses, openapi_routes, path_params, raw_http,
    raw_http_then_eof, LoggedDci,
};
use disbatch_tests::{write_config, TestDb};
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use serde_json::json;

/// Fixed so a failure can be replayed; `HOSTILE_SEED` overrides it to explore further.
const DEFAULT_SEED: u64 = 0x00D1_5BA7_C4F0_0D5E;
/// Generated requests on top of the systematic ones.
const RANDOM_REQUESTS: usize = 2400;
const IN_FLIGHT: usize = 8;

/// One request to send, and a short description to report it by.
struct Probe {
    what: String,
    bytes: Vec<u8>,
    /// Broken framing: close the sending side after the bytes, so the server stops waiting.
    eof: bool,
    /// The documented operation (METHOD, path template) it calls, when it uses the route's
    /// own method: its answer's status must be one the document lists for it.
    operation: Option<(String, String)>,
}

/// The documents requests may address by id or name; restored before every batch, since
/// requests may legitimately delete or change them.
struct Targets {
    queue: ObjectId,
    task: ObjectId,
    node: ObjectId,
}

impl Targets {
    fn docs(&self) -> [(&'static str, Document); 3] {
        let now = DateTime::now();
        [
            (
                "queues",
                doc! {"_id": self.queue, "name": "target-queue", "plugin": "echo", "threads": 1},
            ),
            (
                "tasks",
                doc! {"_id": self.task, "queue": self.queue, "status": 2, "node": "target-node",
                "params": {"a": 1}, "ctime": now, "mtime": now, "stdout": "out", "stderr": "err",
                "complete": true},
            ),
            (
                "nodes",
                doc! {"_id": self.node, "node": "target-node", "timestamp": now},
            ),
        ]
    }

    async fn restore(&self, db: &TestDb) {
        for (collection, d) in self.docs() {
            let id = d.get("_id").cloned().unwrap_or(Bson::Null);
            db.db
                .collection::<Document>(collection)
                .replace_one(doc! {"_id": id}, d)
                .upsert(true)
                .await
                .expect("restore target");
        }
    }

    /// Path parameter values naming real documents, by id and by name.
    fn valid(&self, param: &str) -> Vec<String> {
        match param {
            "queue" => vec![self.queue.to_hex(), "target-queue".into()],
            "id" => vec![self.task.to_hex(), self.queue.to_hex()],
            "node" => vec![self.node.to_hex(), "target-node".into()],
            "collection" => vec!["tasks".into(), "queues".into()],
            _ => vec!["app.js".into(), "index.html".into()],
        }
    }
}

fn probe(what: String, bytes: Vec<u8>) -> Probe {
    Probe {
        what,
        bytes,
        eof: false,
        operation: None,
    }
}

fn probe_of(method: &str, template: &str, what: String, bytes: Vec<u8>) -> Probe {
    Probe {
        operation: Some((method.to_string(), template.to_string())),
        ..probe(what, bytes)
    }
}

/// A description, the content type claimed (None: no header) and the body.
type LabelledBody = (&'static str, Option<&'static [u8]>, Vec<u8>);

/// Every route once with each kind of broken input, path ids junk and real.
fn systematic(routes: &[(String, String)], targets: &Targets) -> Vec<Probe> {
    let wrong_types = r#"{"name":5,"plugin":[],"threads":"abc","sort":7,"queue":{"$gt":""},"params":"x","units":{},"status":[{}],"maxthreads":-1,"filter":[],"options":5,"max_tasks":"x","queues":{},"collection":{"a":1},"on_conflict":1,".limit":"x"}"#;
    let bodies: Vec<LabelledBody> = vec![
        ("no body", None, Vec::new()),
        ("empty JSON", Some(b"application/json"), Vec::new()),
        (
            "invalid JSON",
            Some(b"application/json"),
            b"{\"a\":".to_vec(),
        ),
        ("wrong types", Some(b"application/json"), wrong_types.into()),
        (
            "array of junk",
            Some(b"application/json"),
            b"[1,\"x\",null,{}]".to_vec(),
        ),
        (
            "deep arrays",
            Some(b"application/json"),
            nested_json(100_000, false).into(),
        ),
        (
            "deep objects",
            Some(b"application/json"),
            nested_json(127, true).into(),
        ),
        (
            "binary",
            Some(b"application/json"),
            vec![0xff, 0x00, 0xfe, 0x80, b'{'],
        ),
        (
            "junk form",
            Some(b"application/x-www-form-urlencoded"),
            b"a=%ZZ&&=&threads=x".to_vec(),
        ),
        ("text", Some(b"text/plain"), wrong_types.into()),
        // BSON keys are C strings: a NUL in a name cannot be stored.
        (
            "NUL in JSON names",
            Some(b"application/json"),
            br#"{"queue":"target-queue","params":[{"k\u0000":1}],"units":[{"key":"k","params":{"\u0000":1}}],"specs":[{"name":"s","x\u0000":1}]}"#.to_vec(),
        ),
        (
            "NUL in form names",
            Some(b"application/x-www-form-urlencoded"),
            b"queue=target-queue&params%00=1&a\x00b=2".to_vec(),
        ),
    ];
    let mut out = Vec::new();
    for (method, template) in routes {
        let params = path_params(template);
        let fills: Vec<String> = vec![
            fill(template, |p| targets.valid(p)[0].clone()),
            fill(template, |_| "%ZZ".into()),
        ];
        for path in &fills {
            for (what, ct, body) in &bodies {
                out.push(probe_of(
                    method,
                    template,
                    format!("{method} {path} [{what}]"),
                    request(method.as_bytes(), path, *ct, b"", body),
                ));
            }
            if params.is_empty() {
                break;
            }
        }
        let path = &fills[0];
        for q in BAD_QUERIES {
            let target = format!("{path}?{q}");
            out.push(probe_of(
                method,
                template,
                format!("{method} {target}"),
                request(method.as_bytes(), &target, None, b"", b""),
            ));
        }
    }
    let mut paths: Vec<&String> = routes.iter().map(|(_, p)| p).collect();
    paths.dedup();
    for template in paths {
        let path = fill(template, |p| targets.valid(p)[0].clone());
        for method in [
            "PUT", "PATCH", "OPTIONS", "HEAD", "TRACE", "FOO", "get", "DELETE", "POST",
        ] {
            out.push(probe(
                format!("{method} {path}"),
                request(
                    method.as_bytes(),
                    &path,
                    Some(b"application/json"),
                    b"",
                    b"{}",
                ),
            ));
        }
    }
    out
}

/// Seeded random combinations of route, method, path ids, query, body and headers.
fn generated(
    routes: &[(String, String)],
    targets: &Targets,
    rng: &mut StdRng,
    n: usize,
) -> Vec<Probe> {
    let mut huge_left = 8;
    (0..n)
        .map(|_| {
            let (route_method, template) = routes.choose(rng).expect("routes");
            let method = if rng.random_bool(0.85) {
                route_method.clone()
            } else {
                [
                    "PUT", "PATCH", "OPTIONS", "HEAD", "GET", "POST", "DELETE", "X-NOPE",
                ]
                .choose(rng)
                .copied()
                .unwrap_or("PUT")
                .to_string()
            };
            let path = fill(template, |p| {
                if rng.random_bool(0.5) {
                    targets.valid(p).choose(rng).cloned().unwrap_or_default()
                } else {
                    JUNK_PATH.choose(rng).copied().unwrap_or("x").to_string()
                }
            });
            let target = match rng.random_range(0..5) {
                0 | 1 => path,
                2 => format!("{path}?{}", BAD_QUERIES.choose(rng).copied().unwrap_or("")),
                _ => {
                    let key = enc(KEYS.choose(rng).copied().unwrap_or("x"));
                    format!("{path}?{key}={}", enc(&junk_value(rng, 2)))
                }
            };
            let (body, ct, body_what) = junk_body(rng, huge_left > 0);
            if body.len() >= TEN_MB {
                huge_left -= 1;
            }
            let (headers, header_what) = junk_headers(rng);
            let shown: String = target.chars().take(120).collect();
            let what = format!(
                "{method} {shown} [{body_what}] [{header_what}] ({} bytes)",
                body.len()
            );
            let bytes = request(method.as_bytes(), &target, ct.as_deref(), &headers, &body);
            if method == *route_method {
                probe_of(route_method, template, what, bytes)
            } else {
                probe(what, bytes)
            }
        })
        .collect()
}

/// Broken HTTP framing: the server may refuse with 4xx or close, but must survive.
fn framing() -> Vec<Probe> {
    framing_requests()
        .into_iter()
        .map(|(what, bytes)| Probe {
            eof: true,
            ..probe(format!("framing: {what}"), bytes)
        })
        .collect()
}

/// Sends probes `IN_FLIGHT` at a time; returns each one's outcome in order.
async fn send_all(addr: SocketAddr, probes: &[Probe]) -> Vec<Result<u16, String>> {
    let mut out = Vec::with_capacity(probes.len());
    for batch in probes.chunks(IN_FLIGHT) {
        let mut set = tokio::task::JoinSet::new();
        for (i, p) in batch.iter().enumerate() {
            let bytes = p.bytes.clone();
            let eof = p.eof;
            set.spawn(async move {
                let r = if eof {
                    raw_http_then_eof(addr, &bytes, Duration::from_secs(10)).await
                } else {
                    raw_http(addr, &bytes, Duration::from_secs(30)).await
                };
                (i, r.map(|r| r.status))
            });
        }
        let mut results: Vec<Option<Result<u16, String>>> = vec![None; batch.len()];
        while let Some(joined) = set.join_next().await {
            let (i, r) = joined.expect("request task");
            results[i] = Some(r);
        }
        out.extend(results.into_iter().map(|r| r.unwrap_or(Err("lost".into()))));
    }
    out
}

#[tokio::test]
async fn a_generated_corpus_of_malformed_requests_gets_no_500_and_changes_nothing_else() {
    let seed = std::env::var("HOSTILE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(DEFAULT_SEED);
    println!("hostile API corpus seed: {seed} (set HOSTILE_SEED to replay another)");
    let mut rng = StdRng::seed_from_u64(seed);
    let db = TestDb::new("hostile_api").await;
    let targets = Targets {
        queue: ObjectId::new(),
        task: ObjectId::new(),
        node: ObjectId::new(),
    };
    targets.restore(&db).await;
    let (canary_queue, canary_task) = insert_a_canary_queue_and_task(&db).await;

    let config = write_config(
        &db,
        "web.json",
        json!({"web_extensions": {"Disbatch::Web::Tasks": null}, "monitoring": true}),
    );
    let mut dci = LoggedDci::start(&config, &db.path("dci.log"));
    let routes = openapi_routes(dci.addr).await;
    let documented = openapi_responses(dci.addr).await;

    let mut probes = systematic(&routes, &targets);
    let systematic_n = probes.len();
    probes.extend(generated(&routes, &targets, &mut rng, RANDOM_REQUESTS));
    let framing_probes = framing();

    let started = Instant::now();
    let mut statuses: BTreeMap<u16, usize> = BTreeMap::new();
    let mut failures = Vec::new();
    // Answers the document does not list for their operation, by operation and status.
    let mut undocumented: BTreeMap<(String, String, u16), String> = BTreeMap::new();
    for chunk in probes.chunks(96) {
        targets.restore(&db).await;
        for (p, r) in chunk.iter().zip(send_all(dci.addr, chunk).await) {
            match r {
                Ok(status) => {
                    *statuses.entry(status).or_default() += 1;
                    if status >= 500 {
                        failures.push(format!("{status}: {}", p.what));
                    }
                    if let Some((method, template)) = &p.operation {
                        let listed = documented
                            .get(&(method.clone(), template.clone()))
                            .is_some_and(|codes| codes.contains(&status));
                        if !listed {
                            undocumented
                                .entry((method.clone(), template.clone(), status))
                                .or_insert_with(|| p.what.chars().take(160).collect());
                        }
                    }
                }
                Err(e) => failures.push(format!("{e}: {}", p.what)),
            }
        }
    }
    let mut closed = 0;
    for (p, r) in framing_probes
        .iter()
        .zip(send_all(dci.addr, &framing_probes).await)
    {
        match r {
            Ok(status) if status >= 500 => failures.push(format!("{status}: {}", p.what)),
            Ok(status) => *statuses.entry(status).or_default() += 1,
            Err(_) => closed += 1,
        }
    }
    // How long the corpus took is a figure to read, not a property: speed is the benches'.
    let elapsed = started.elapsed();
    let total = probes.len() + framing_probes.len();
    println!(
        "{total} requests ({systematic_n} systematic, {RANDOM_REQUESTS} generated, {} framing) in {elapsed:?}; statuses {statuses:?}; {closed} framing probes closed without an answer",
        framing_probes.len()
    );

    check_no_request_got_a_5xx_and_every_answer_is_documented(
        &mut dci,
        &failures,
        &undocumented,
        total,
        seed,
    )
    .await;

    check_the_canaries_are_unchanged(&db, &canary_queue, &canary_task).await;
    db.drop().await;
}

async fn insert_a_canary_queue_and_task(db: &TestDb) -> (Document, Document) {
    let canary_queue = doc! {"_id": ObjectId::new(), "name": "canary-9f2c41", "plugin": "echo",
    "threads": 3, "sort": "fifo"};
    let canary_task = doc! {"_id": ObjectId::new(), "queue": canary_queue.get_object_id("_id").expect("id"),
    "status": -2, "node": Bson::Null, "params": {"keep": "me"}, "ctime": DateTime::now(),
    "mtime": DateTime::now(), "stdout": Bson::Null, "stderr": Bson::Null};
    db.db
        .collection::<Document>("queues")
        .insert_one(canary_queue.clone())
        .await
        .expect("canary queue");
    db.tasks()
        .insert_one(canary_task.clone())
        .await
        .expect("canary task");
    (canary_queue, canary_task)
}

async fn check_no_request_got_a_5xx_and_every_answer_is_documented(
    dci: &mut LoggedDci,
    failures: &[String],
    undocumented: &BTreeMap<(String, String, u16), String>,
    total: usize,
    seed: u64,
) {
    let log = dci.log_text();
    let shown: Vec<&String> = failures.iter().take(50).collect();
    assert!(
        failures.is_empty(),
        "{} of {total} requests got a 5xx or no answer (seed {seed}):\n{}\nDCI log (errors):\n{}",
        failures.len(),
        shown
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        log.lines()
            .filter(|l| !l.contains(" INFO "))
            .take(40)
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(dci.is_running(), "the DCI exited:\n{log}");
    assert!(
        undocumented.is_empty(),
        "{} answers are not in /openapi.json's responses for their operation:\n{}",
        undocumented.len(),
        undocumented
            .iter()
            .map(|((m, t, s), what)| format!("{m} {t}: {s} (e.g. {what})"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert_eq!(crashes(&log), Vec::<String>::new(), "DCI log:\n{log}");
}

async fn check_the_canaries_are_unchanged(
    db: &TestDb,
    canary_queue: &Document,
    canary_task: &Document,
) {
    let now_queue = db
        .db
        .collection::<Document>("queues")
        .find_one(doc! {"_id": canary_queue.get("_id")})
        .await
        .expect("find");
    let now_task = db
        .tasks()
        .find_one(doc! {"_id": canary_task.get("_id")})
        .await
        .expect("find");
    assert_eq!(
        now_queue.as_ref(),
        Some(canary_queue),
        "the canary queue changed"
    );
    assert_eq!(
        now_task.as_ref(),
        Some(canary_task),
        "the canary task changed"
    );
}

/// JSON bodies nest as deep as serde_json allows (128), and MongoDB-wire servers may store
/// more than MongoDB's 100 levels: what a client stores through the API must read back
/// without exhausting the DCI's stack.
#[tokio::test]
async fn deeply_nested_params_sent_through_the_api_cannot_crash_the_dci() {
    let db = TestDb::new("hostile_api_deep").await;
    let queue = db.insert_queue("deep", "echo", 0).await;
    let config = write_config(&db, "web.json", json!({}));
    let mut dci = LoggedDci::start(&config, &db.path("dci.log"));
    let mut outcomes = Vec::new();
    for depth in [90usize, 100, 110, 120, 125] {
        let body = format!(
            "{{\"queue\":\"{queue}\",\"params\":[{}]}}",
            nested_json(depth, true)
        );
        let post = request(
            b"POST",
            "/tasks",
            Some(b"application/json"),
            b"",
            body.as_bytes(),
        );
        let r = raw_http(dci.addr, &post, Duration::from_secs(30)).await;
        let (status, text) = match &r {
            Ok(r) => (r.status, r.text()),
            Err(e) => (0, e.clone()),
        };
        outcomes.push(format!("depth {depth}: POST {status}"));
        assert!(
            (200..500).contains(&status),
            "POST at depth {depth}: {status} {text}"
        );
        if status != 200 {
            assert!(text.contains("deep"), "refusal should say why: {text}");
            continue;
        }
        let v: serde_json::Value = serde_json::from_str(&text).expect("JSON");
        let id = v["MongoDB::InsertManyResult"]["inserted"][0]["_id"]["$oid"]
            .as_str()
            .expect("inserted id")
            .to_string();
        for target in [
            format!("/tasks/{id}"),
            format!("/tasks?queue={queue}&.limit=10"),
        ] {
            let get = request(b"GET", &target, None, b"", b"");
            let r = raw_http(dci.addr, &get, Duration::from_secs(30)).await;
            let status = r.as_ref().map_or(0, |r| r.status);
            outcomes.push(format!("depth {depth}: GET {target} {status}"));
            assert!(
                (200..500).contains(&status),
                "GET {target} after storing params {depth} deep: {r:?}\n{outcomes:?}\nDCI log:\n{}",
                dci.log_text()
            );
        }
    }
    println!("{outcomes:#?}");
    let log = dci.log_text();
    assert!(dci.is_running(), "the DCI exited:\n{log}");
    assert_eq!(crashes(&log), Vec::<String>::new(), "DCI log:\n{log}");
    db.drop().await;
}
