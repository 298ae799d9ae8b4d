//! Operations on the real binaries: `/healthz` and `/readyz` on the DCI and the DEN (with the
//! database up and down), `--version`, build and process metrics, the DEN's task outcome
//! counter, and the DCI's request metrics and access log.

use std::path::Path;
use std::time::{Duration, Instant};

use bson::doc;
use bson::oid::ObjectId;
use disbatch_tests::restartable::RestartableServer;
use disbatch_tests::{bin_path, exposition, wait_for, write_config, Dci, Den, Launch, TestDb};
use serde_json::json;

const READ: &str = "health-read-token-0123456789abcdef";

/// The most a probe may take to answer. This bound is the property: a probe answers within
/// a prober's usual timeout (1–10 s) even while the database is down, because its ping gives
/// up after 1.5 s (`readiness::PING_TIMEOUT`) instead of waiting out server selection (10 s,
/// core/store/src/lib.rs). 7 s leaves over 5 s for load on top of the ping's limit and
/// still fails a probe that waits for server selection.
const PROBE_ANSWERS_WITHIN: Duration = Duration::from_secs(7);

/// GET `url` without a token: status and body.
async fn get(url: &str) -> (u16, String) {
    let r = reqwest::Client::new()
        .get(url)
        .timeout(PROBE_ANSWERS_WITHIN)
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {url}: no answer within {PROBE_ANSWERS_WITHIN:?}: {e}"));
    let status = r.status().as_u16();
    (status, r.text().await.unwrap_or_default())
}

/// Waits (at most `within`) for `/readyz` to answer `want`; each answer must come within
/// `PROBE_ANSWERS_WITHIN`. Prints the slowest answer, a figure.
async fn readyz_becomes(base: &str, want: u16, within: Duration) -> String {
    let deadline = Instant::now() + disbatch_tests::scaled(within);
    let mut backoff = disbatch_tests::Backoff::new();
    let mut slowest = Duration::ZERO;
    loop {
        let asked = Instant::now();
        let (status, body) = get(&format!("{base}/readyz")).await;
        slowest = slowest.max(asked.elapsed());
        if status == want {
            println!("/readyz answered {want}; slowest answer {slowest:?}");
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "/readyz still {status} ({body}), not {want}"
        );
        backoff.wait().await;
    }
}

#[tokio::test]
async fn dci_probes_need_no_token_and_follow_the_database() {
    let mut server = RestartableServer::start();
    let db = TestDb::on(server.uri(), "health_dci").await;
    let config = write_config(
        &db,
        "web.json",
        json!({"web": {"tokens": [{"name": "probe-reader", "role": "read", "token": READ}]}}),
    );
    let dci = Dci::start(&config);
    let (status, _) = get(&dci.at("/queues")).await;
    assert_eq!(status, 401, "the API itself still needs a token");
    let (status, body) = get(&dci.at("/healthz")).await;
    assert_eq!((status, body.trim()), (200, r#"{"status":"ok"}"#));
    let body = readyz_becomes(&dci.url, 200, Duration::from_secs(30)).await;
    assert_eq!(body.trim(), r#"{"status":"ready"}"#);

    server.kill();
    let started = Instant::now();
    let body = readyz_becomes(&dci.url, 503, Duration::from_secs(60)).await;
    println!("/readyz unready {:?} after the kill", started.elapsed());
    assert!(body.contains("\"unready\""), "{body}");
    // Nothing about the database: not its address, name or the driver's error text.
    for secret in [&db.name, "127.0.0.1", "mongodb", "Server selection"] {
        assert!(!body.contains(secret), "{secret} in {body}");
    }
    let (status, _) = get(&dci.at("/healthz")).await;
    assert_eq!(status, 200, "alive while the database is down");

    server.restart();
    readyz_becomes(&dci.url, 200, Duration::from_secs(60)).await;
    db.drop().await;
}

#[tokio::test]
async fn den_probes_follow_the_database() {
    let mut server = RestartableServer::start();
    let db = TestDb::on(server.uri(), "health_den").await;
    let config = write_config(&db, "node.json", json!({"metrics_listen": "127.0.0.1:0"}));
    let den = Den::start(&config, "h1");
    let base = den.metrics_url().await;
    let (status, _) = get(&format!("{base}/healthz")).await;
    assert_eq!(status, 200);
    readyz_becomes(&base, 200, Duration::from_secs(30)).await;

    server.kill();
    let body = readyz_becomes(&base, 503, Duration::from_secs(60)).await;
    assert!(!body.contains("127.0.0.1"), "{body}");
    let (status, _) = get(&format!("{base}/healthz")).await;
    assert_eq!(status, 200, "alive while the database is down");
    server.restart();
    readyz_becomes(&base, 200, Duration::from_secs(60)).await;
    drop(den);
    db.drop().await;
}

#[test]
fn every_program_prints_its_version_and_git_sha() {
    let sha = disbatch_model::GIT_SHA;
    for program in [
        "disbatchd",
        "disbatch-web",
        "disbatch-task-runner",
        "disbatch",
    ] {
        let out = std::process::Command::new(bin_path(program))
            .arg("--version")
            .output()
            .expect("run --version");
        assert!(out.status.success(), "{program}: {out:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            text.trim(),
            format!("{program} {} (git {sha})", disbatch_model::VERSION)
        );
    }
    // Built from this checkout: the sha is its HEAD's (a tarball build says "unknown").
    let head = std::process::Command::new("git")
        .args(["rev-parse", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success());
    if let Some(head) = head {
        let head = String::from_utf8_lossy(&head.stdout);
        assert!(
            sha != "unknown" && head.trim().starts_with(sha),
            "{sha} vs HEAD {head}"
        );
    }
}

fn assert_build_and_process(text: &str, who: &str) {
    let e = exposition::check(text).unwrap_or_else(|err| panic!("{who}: {err}\n{text}"));
    assert_eq!(
        e.value(
            "disbatch_build_info",
            &[
                ("version", disbatch_model::VERSION),
                ("git_sha", disbatch_model::GIT_SHA)
            ]
        ),
        Some(1.0),
        "{who}: {text}"
    );
    for family in [
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_max_fds",
        "process_start_time_seconds",
    ] {
        let v = e
            .value(family, &[])
            .unwrap_or_else(|| panic!("{who}: no {family} in\n{text}"));
        if family != "process_cpu_seconds_total" {
            assert!(v > 0.0, "{who}: {family} {v}");
        }
    }
}

#[tokio::test]
async fn den_counts_task_outcomes_by_recorded_status_and_serves_build_info() {
    let db = TestDb::new("health_outcomes").await;
    let config = write_config(&db, "node.json", json!({"metrics_listen": "127.0.0.1:0"}));
    let echoes = db.insert_queue("echoes", "echo", 2).await;
    let demo = db.insert_queue("big", "Disbatch::Plugin::Demo", 2).await;
    let den = Den::start(&config, "o1");
    let text = den.scrape().await;
    assert_build_and_process(&text, "DEN");

    let mut ids = db
        .insert_tasks(
            echoes,
            vec![doc! {}.into(), doc! {}.into(), doc! {"exit_code": 3}.into()],
        )
        .await;
    // 7 MiB of output is more than a runner relays: it records its own result, and the node
    // reads the attempt's outcome.
    ids.extend(
        db.insert_tasks(demo, vec![doc! {"commands": "7c"}.into()])
            .await,
    );
    db.wait_complete(&ids, Duration::from_secs(120)).await;
    let sample = |queue: &str, outcome: &str| {
        format!("disbatch_den_tasks_finished_total{{outcome=\"{outcome}\",queue=\"{queue}\"}}")
    };
    wait_for("the outcomes counted", Duration::from_secs(60), || async {
        den.metric(&sample("echoes", "failed")).await == 1.0
            && den.metric(&sample("big", "failed")).await == 1.0
    })
    .await;
    let text = den.scrape().await;
    let e = exposition::check(&text).unwrap_or_else(|err| panic!("{err}\n{text}"));
    let value = |queue: &str, outcome: &str| {
        e.value(
            "disbatch_den_tasks_finished_total",
            &[("queue", queue), ("outcome", outcome)],
        )
    };
    assert_eq!(value("echoes", "succeeded"), Some(2.0), "{text}");
    assert_eq!(value("echoes", "failed"), Some(1.0), "{text}");
    assert_eq!(value("big", "failed"), Some(1.0), "{text}");
    // Known outcomes start at 0 with the queue's first runner.
    for outcome in ["lost", "retry", "unknown"] {
        assert_eq!(value("echoes", outcome), Some(0.0), "{outcome}: {text}");
    }
    assert_eq!(value("big", "succeeded"), Some(0.0), "{text}");
    // The runner exit family still counts by exit status: the failed task's runner exited 0.
    assert_eq!(
        e.value(
            "disbatch_den_runner_exits_total",
            &[("queue", "echoes"), ("result", "success")]
        ),
        Some(3.0),
        "{text}"
    );
    drop(den);
    db.drop().await;
}

#[tokio::test]
async fn dci_request_metrics_use_route_templates_and_the_log_names_tokens_only() {
    let db = TestDb::new("health_requests").await;
    let config = write_config(
        &db,
        "web.json",
        json!({"web": {"tokens": [{"name": "scrape-bot", "role": "read", "token": READ}]}}),
    );
    let log = db.path("dci.log");
    let dci = Dci::launch(
        &config,
        Launch {
            log_file: Some(log.clone()),
            rust_log: Some("warn,disbatch_web::access=info".into()),
            ..Launch::default()
        },
    );
    let scrape = || async {
        let r = dci
            .http
            .get(dci.at("/metrics"))
            .bearer_auth(READ)
            .send()
            .await
            .expect("scrape");
        assert_eq!(r.status().as_u16(), 200);
        r.text().await.expect("body")
    };
    // From the first scrape, every route's counters exist at 0.
    let first = scrape().await;
    let e = exposition::check(&first).unwrap_or_else(|err| panic!("{err}\n{first}"));
    assert_eq!(
        e.value(
            "disbatch_web_http_requests_total",
            &[("method", "POST"), ("route", "/tasks"), ("status", "5xx")]
        ),
        Some(0.0),
        "{first}"
    );
    assert_build_and_process(&first, "DCI");

    let ids = [ObjectId::new().to_hex(), ObjectId::new().to_hex()];
    for id in &ids {
        let r = dci
            .http
            .get(dci.at(&format!("/tasks/{id}")))
            .bearer_auth(READ)
            .send()
            .await
            .expect("task");
        assert_eq!(r.status().as_u16(), 404);
    }
    let stray = format!("/no/such/{}", ObjectId::new().to_hex());
    let (status, _) = get(&dci.at(&stray)).await;
    assert_eq!(status, 404);
    let text = scrape().await;
    let e = exposition::check(&text).unwrap_or_else(|err| panic!("{err}\n{text}"));
    assert_eq!(
        e.value(
            "disbatch_web_http_requests_total",
            &[
                ("method", "GET"),
                ("route", "/tasks/{id}"),
                ("status", "4xx")
            ]
        ),
        Some(2.0),
        "{text}"
    );
    assert_eq!(
        e.value(
            "disbatch_web_http_request_duration_seconds_count",
            &[("method", "GET"), ("route", "/tasks/{id}")]
        ),
        Some(2.0),
        "{text}"
    );
    assert_eq!(
        e.value(
            "disbatch_web_http_requests_total",
            &[("method", "GET"), ("route", "unmatched"), ("status", "4xx")]
        ),
        Some(1.0),
        "{text}"
    );
    for id in &ids {
        assert!(!text.contains(id.as_str()), "raw path in labels: {text}");
    }
    assert!(!text.contains("/no/such"), "{text}");

    check_the_access_log_names_the_token_never_the_token_itself(&log, &ids).await;
    drop(dci);
    db.drop().await;
}

async fn check_the_access_log_names_the_token_never_the_token_itself(log: &Path, ids: &[String]) {
    // The access log: one line per request with the token's name, never the token.
    let mut logged = String::new();
    wait_for("the access log", Duration::from_secs(30), || {
        logged = std::fs::read_to_string(log).unwrap_or_default();
        let done = logged.contains(&ids[1]) && logged.contains("/no/such");
        async move { done }
    })
    .await;
    let line = logged
        .lines()
        .find(|l| l.contains(&ids[0]))
        .unwrap_or_else(|| panic!("no line for {} in\n{logged}", ids[0]));
    for part in [
        "disbatch_web::access",
        "GET",
        "status=404",
        "token=scrape-bot",
        "duration_ms=",
    ] {
        assert!(line.contains(part), "{part} in {line}");
    }
    assert!(
        logged
            .lines()
            .any(|l| l.contains("/no/such") && l.contains("token=-")),
        "{logged}"
    );
    assert!(
        !logged.contains(READ),
        "the token itself in the log:\n{logged}"
    );
}
