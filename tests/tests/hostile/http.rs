//! Cross-site requests and foreign hosts against the DCI: exact 403s, nothing changed, and
//! the clients that must keep working (same origin, allowed origins, curl, Perl's LWP).
//! Also the security headers and JSON for undecodable paths.

use std::net::SocketAddr;
use std::time::Duration;

use bson::oid::ObjectId;
use bson::{doc, DateTime, Document};
use disbatch_tests::hostile::snapshot;
use disbatch_tests::hostile::{fill, openapi_routes, raw_http, LoggedDci, RawResponse};
use disbatch_tests::{write_config, TestDb};
use serde_json::{json, Value};

const CHROME: &str =
    "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0 Safari/537.36";
const LWP: &str = "libwww-perl/6.72";
const CURL: &str = "curl/8.5.0";
const FORM: &str = "application/x-www-form-urlencoded";
const JSON: &str = "application/json";

/// Raw HTTP/1.1 with `Connection: close`; `headers` go in as given (Host included).
fn raw(method: &str, target: &str, headers: &[(&str, &str)], body: &str) -> Vec<u8> {
    let mut r = format!("{method} {target} HTTP/1.1\r\nConnection: close\r\n");
    for (k, v) in headers {
        r.push_str(&format!("{k}: {v}\r\n"));
    }
    r.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    r.into_bytes()
}

async fn send(addr: SocketAddr, request: Vec<u8>) -> RawResponse {
    raw_http(addr, &request, Duration::from_secs(30))
        .await
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&request)))
}

fn error_of(r: &RawResponse) -> String {
    assert_eq!(
        r.header("content-type"),
        Some("application/json"),
        "{} {}",
        r.status,
        r.text()
    );
    let v: Value = serde_json::from_slice(&r.body).expect("JSON body");
    v["error"].as_str().unwrap_or_default().to_string()
}

struct Site {
    db: TestDb,
    dci: LoggedDci,
    queue: ObjectId,
    task: ObjectId,
    /// `127.0.0.1:PORT`: the Host a same-origin page sends.
    host: String,
}

async fn site(test: &str, web: Value) -> Site {
    let db = TestDb::new(test).await;
    let queue = db.insert_queue("target-queue", "echo", 2).await;
    let task = ObjectId::new();
    let now = DateTime::now();
    db.tasks()
        .insert_one(
            doc! {"_id": task, "queue": queue, "status": 2, "node": "target-node",
            "params": {"a": 1}, "ctime": now, "mtime": now, "stdout": "out", "stderr": "err",
            "complete": true},
        )
        .await
        .expect("task");
    db.insert_node("target-node", Duration::ZERO).await;
    let config = write_config(
        &db,
        "web.json",
        json!({"web_extensions": {"Disbatch::Web::Tasks": null}, "web": web}),
    );
    let dci = LoggedDci::start(&config, &db.path("dci.log"));
    let host = dci.addr.to_string();
    Site {
        db,
        dci,
        queue,
        task,
        host,
    }
}

/// A body that the route accepts (so the same request with a good Origin changes data).
fn body_for(method: &str, template: &str, queue: ObjectId) -> Value {
    match (method, template) {
        ("POST", "/nodes/{node}") => json!({"maxthreads": 3}),
        ("POST", "/queues") => json!({"name": "evil-queue", "plugin": "echo"}),
        ("POST", "/specs") => json!({"specs": [{"name": "evil-spec", "plugin": "echo"}]}),
        ("POST", "/queues/{queue}/units") => json!({"units": [{"key": "evil-unit"}]}),
        ("POST", "/queues/{queue}") => json!({"threads": 7}),
        ("POST", "/tasks") => json!({"queue": queue.to_hex(), "params": [{"evil": 1}]}),
        ("POST", "/balance") => json!({"max_tasks": {"0 00:00": 5}, "queues": [["target-queue"]]}),
        ("POST", "/tasks/search") => json!({"filter": {}}),
        ("POST", "/tasks/{id}") => json!([{"evil": 2}]),
        ("POST", "/tasks/{id}/{collection}") => json!({"filter": {}, "params": {}}),
        _ => json!({}),
    }
}

/// The same object as a form body (what an HTML form on another site would post).
fn as_form(v: &Value) -> String {
    match v.as_object() {
        Some(map) => map
            .iter()
            .map(|(k, v)| match v {
                Value::String(s) => format!("{k}={s}"),
                other => format!("{k}={other}"),
            })
            .collect::<Vec<_>>()
            .join("&"),
        None => String::new(),
    }
}

#[tokio::test]
async fn every_state_changing_route_refuses_foreign_and_null_origins_and_changes_nothing() {
    let s = site("hostile_http_origin", json!({})).await;
    let routes = openapi_routes(s.dci.addr).await;
    let changing: Vec<(String, String)> = routes
        .into_iter()
        .filter(|(m, _)| m != "GET" && m != "HEAD")
        .collect();
    assert!(changing.len() >= 15, "{changing:?}");
    let before = snapshot(&s.db).await;
    let target = |template: &str| {
        let legacy_queue = template == "/tasks/{id}" || template == "/tasks/{id}/{collection}";
        fill(template, |p| match p {
            "queue" => s.queue.to_hex(),
            "id" if legacy_queue => s.queue.to_hex(),
            "id" => s.task.to_hex(),
            "node" => "target-node".into(),
            _ => "tasks".into(),
        })
    };
    let mut probes = 0;
    for (method, template) in &changing {
        let path = target(template);
        let body = body_for(method, template, s.queue);
        for (origin, ct, text) in [
            ("http://evil.example", FORM, as_form(&body)),
            ("http://evil.example", JSON, body.to_string()),
            ("null", FORM, as_form(&body)),
            ("http://127.0.0.1:1", JSON, body.to_string()),
        ] {
            let headers = [
                ("Host", s.host.as_str()),
                ("Origin", origin),
                ("Content-Type", ct),
                ("User-Agent", CHROME),
            ];
            let r = send(s.dci.addr, raw(method, &path, &headers, &text)).await;
            assert_eq!(r.status, 403, "{method} {path} from {origin}: {}", r.text());
            let e = error_of(&r);
            assert!(
                e.starts_with(&format!("origin '{origin}' may not send {method} requests")),
                "{method} {path}: {e}"
            );
            probes += 1;
        }
    }
    assert_eq!(
        snapshot(&s.db).await,
        before,
        "a refused request changed the database"
    );

    // The very same requests from the DCI's own origin are not refused: the probes above
    // would have changed data.
    let own = format!("http://{}", s.host);
    for (method, template) in &changing {
        let path = target(template);
        let body = body_for(method, template, s.queue).to_string();
        let headers = [
            ("Host", s.host.as_str()),
            ("Origin", own.as_str()),
            ("Content-Type", JSON),
            ("User-Agent", CHROME),
        ];
        let r = send(s.dci.addr, raw(method, &path, &headers, &body)).await;
        assert!(
            r.status != 403 && r.status < 500,
            "{method} {path}: {} {}",
            r.status,
            r.text()
        );
    }
    assert_ne!(
        snapshot(&s.db).await,
        before,
        "the same-origin requests changed nothing"
    );
    println!(
        "{probes} cross-site probes on {} routes refused",
        changing.len()
    );
    s.db.drop().await;
}

#[tokio::test]
async fn browser_forms_without_origin_are_refused_and_curl_and_lwp_forms_are_not() {
    let s = site("hostile_http_forms", json!({})).await;
    let queues = s.db.db.collection::<Document>("queues");
    let exists = |name: &'static str| {
        let queues = queues.clone();
        async move {
            queues
                .find_one(doc! {"name": name})
                .await
                .expect("find")
                .is_some()
        }
    };
    let post = |headers: Vec<(&'static str, String)>, body: &'static str| {
        let mut all: Vec<(&str, String)> = vec![("Host", s.host.clone())];
        all.extend(headers);
        let pairs: Vec<(&str, &str)> = all.iter().map(|(k, v)| (*k, v.as_str())).collect();
        raw("POST", "/queues", &pairs, body)
    };
    for (headers, why) in [
        (
            vec![
                ("Content-Type", FORM.to_string()),
                ("User-Agent", CHROME.to_string()),
            ],
            "browser form",
        ),
        (
            vec![
                ("Content-Type", "text/plain".to_string()),
                ("Sec-Fetch-Site", "same-site".to_string()),
            ],
            "fetch metadata",
        ),
        (
            vec![
                ("Content-Type", FORM.to_string()),
                ("Referer", "http://evil.example/x".to_string()),
            ],
            "foreign referer",
        ),
        (
            vec![
                ("Content-Type", JSON.to_string()),
                ("Sec-Fetch-Site", "cross-site".to_string()),
            ],
            "cross-site JSON",
        ),
    ] {
        let body = if headers[0].1 == JSON {
            r#"{"name":"formq","plugin":"echo"}"#
        } else {
            "name=formq&plugin=echo"
        };
        let r = send(s.dci.addr, post(headers, body)).await;
        assert_eq!(r.status, 403, "{why}: {}", r.text());
        let e = error_of(&r);
        assert!(e.contains("refused"), "{why}: {e}");
    }
    assert!(!exists("formq").await, "a refused form created the queue");
    for (ua, name) in [(LWP, "lwpq"), (CURL, "curlq"), ("", "bareq")] {
        let mut headers = vec![("Content-Type", FORM.to_string())];
        if !ua.is_empty() {
            headers.push(("User-Agent", ua.to_string()));
        }
        let body: &'static str = match name {
            "lwpq" => "name=lwpq&plugin=echo",
            "curlq" => "name=curlq&plugin=echo",
            _ => "name=bareq&plugin=echo",
        };
        let r = send(s.dci.addr, post(headers, body)).await;
        assert_eq!(r.status, 200, "{ua:?}: {}", r.text());
        assert!(exists(name).await, "{ua:?} did not create {name}");
    }
    s.db.drop().await;
}

#[tokio::test]
async fn same_origin_and_allowed_origins_change_data_with_or_without_tokens() {
    const ADMIN: &str = "admin-token-0123456789";
    for tokens in [false, true] {
        let mut web = json!({"allowed_origins": ["https://dash.example.com"]});
        if tokens {
            web["tokens"] = json!([{"name": "boss", "role": "admin", "token": ADMIN}]);
        }
        let s = site(&format!("hostile_http_allowed_{tokens}"), web).await;
        let localhost = format!("localhost:{}", s.dci.addr.port());
        let auth = format!("Bearer {ADMIN}");
        let cases = [
            (s.host.clone(), format!("http://{}", s.host), 200),
            (localhost.clone(), format!("http://{localhost}"), 200),
            (s.host.clone(), "https://dash.example.com".to_string(), 200),
            (
                s.host.clone(),
                "https://dash.example.com:8443".to_string(),
                403,
            ),
            (s.host.clone(), format!("http://{localhost}"), 403),
            (s.host.clone(), "http://evil.example".to_string(), 403),
        ];
        for (i, (host, origin, want)) in cases.iter().enumerate() {
            let body = json!({"name": format!("q{i}"), "plugin": "echo"}).to_string();
            let mut headers = vec![
                ("Host", host.as_str()),
                ("Origin", origin.as_str()),
                ("Content-Type", JSON),
                ("User-Agent", CHROME),
            ];
            if tokens {
                headers.push(("Authorization", auth.as_str()));
            }
            let r = send(s.dci.addr, raw("POST", "/queues", &headers, &body)).await;
            assert_eq!(
                r.status,
                *want,
                "tokens {tokens}: Host {host}, Origin {origin}: {}",
                r.text()
            );
        }
        if tokens {
            // Refused before the token gate: no token is needed to be told so.
            let headers = [("Host", s.host.as_str()), ("Origin", "http://evil.example")];
            let r = send(
                s.dci.addr,
                raw("DELETE", &format!("/queues/{}", s.queue), &headers, ""),
            )
            .await;
            assert_eq!(r.status, 403, "{}", r.text());
            assert!(error_of(&r).starts_with("origin 'http://evil.example'"));
        }
        s.db.drop().await;
    }
}

#[tokio::test]
async fn foreign_hosts_are_refused_and_ips_localhost_and_configured_hosts_are_served() {
    let s = site(
        "hostile_http_hosts",
        json!({"allowed_hosts": ["dci.example.com"]}),
    )
    .await;
    let port = s.dci.addr.port();
    for host in [
        "evil.example",
        &format!("rebind.evil.example:{port}"),
        "dci.example.com.evil",
    ] {
        for (method, body) in [
            ("GET", ""),
            ("POST", r#"{"name":"rebound","plugin":"echo"}"#),
        ] {
            let headers = [("Host", host), ("Content-Type", JSON)];
            let r = send(s.dci.addr, raw(method, "/queues", &headers, body)).await;
            assert_eq!(r.status, 403, "{method} Host {host}: {}", r.text());
            assert_eq!(
                error_of(&r),
                format!("host '{host}' is not allowed: add it to web.allowed_hosts")
            );
        }
    }
    let queues = s.db.db.collection::<Document>("queues");
    assert_eq!(
        queues
            .count_documents(doc! {"name": "rebound"})
            .await
            .expect("count"),
        0
    );
    for host in [
        s.host.clone(),
        "127.0.0.1".into(),
        format!("[::1]:{port}"),
        format!("localhost:{port}"),
        "LOCALHOST".into(),
        "dci.example.com".into(),
        format!("DCI.Example.com.:{port}"),
    ] {
        let r = send(s.dci.addr, raw("GET", "/queues", &[("Host", &host)], "")).await;
        assert_eq!(r.status, 200, "Host {host}: {}", r.text());
    }
    // No Host at all (HTTP/1.0, or HTTP/1.1 as hyper takes it): nothing to rebind, served.
    let r = send(s.dci.addr, b"GET /queues HTTP/1.0\r\n\r\n".to_vec()).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = send(
        s.dci.addr,
        b"GET /queues HTTP/1.1\r\nConnection: close\r\n\r\n".to_vec(),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    // An absolute target names its host too.
    let r = send(
        s.dci.addr,
        raw(
            "GET",
            "http://evil.example/queues",
            &[("Host", &s.host)],
            "",
        ),
    )
    .await;
    assert_eq!(r.status, 403, "{}", r.text());
    s.db.drop().await;

    let any = site("hostile_http_any_host", json!({"allowed_hosts": ["*"]})).await;
    let r = send(
        any.dci.addr,
        raw("GET", "/queues", &[("Host", "evil.example")], ""),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    any.db.drop().await;
}

/// A Host or an Origin given twice is refused, whichever copy would pass: a proxy in front
/// may read the other one than we do.
#[tokio::test]
async fn a_host_or_origin_given_twice_is_refused() {
    let s = site("hostile_http_repeated", json!({})).await;
    let good_origin = format!("http://{}", s.host);
    for (headers, name) in [
        (
            vec![("Host", s.host.as_str()), ("Host", "evil.example")],
            "Host",
        ),
        (
            vec![("Host", "evil.example"), ("Host", s.host.as_str())],
            "Host",
        ),
        (
            vec![
                ("Host", s.host.as_str()),
                ("Origin", good_origin.as_str()),
                ("Origin", "http://evil.example"),
            ],
            "Origin",
        ),
    ] {
        let mut all = headers.clone();
        all.push(("Content-Type", JSON));
        for (method, body) in [("GET", ""), ("POST", r#"{"name":"twice","plugin":"echo"}"#)] {
            let r = send(s.dci.addr, raw(method, "/queues", &all, body)).await;
            assert_eq!(r.status, 403, "{method} {headers:?}: {}", r.text());
            assert_eq!(
                error_of(&r),
                format!("the {name} header is given more than once; send it once")
            );
        }
    }
    let queues = s.db.db.collection::<Document>("queues");
    assert_eq!(
        queues
            .count_documents(doc! {"name": "twice"})
            .await
            .expect("count"),
        0
    );
    // Once each, the same request is served.
    let once = [
        ("Host", s.host.as_str()),
        ("Origin", good_origin.as_str()),
        ("Content-Type", JSON),
    ];
    let r = send(
        s.dci.addr,
        raw(
            "POST",
            "/queues",
            &once,
            r#"{"name":"twice","plugin":"echo"}"#,
        ),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
}

#[tokio::test]
async fn answers_carry_security_headers_and_html_a_content_security_policy() {
    let s = site("hostile_http_headers", json!({})).await;
    let task = s.task.to_hex();
    let get = |target: String, accept: &'static str| {
        let host = s.host.clone();
        async move {
            let r = send(
                s.dci.addr,
                raw("GET", &target, &[("Host", &host), ("Accept", accept)], ""),
            )
            .await;
            (target, r)
        }
    };
    let cases = [
        (get("/queues".into(), "application/json").await, false),
        (get("/".into(), "text/html").await, true),
        (get("/ui/app.js".into(), "*/*").await, false),
        (get(format!("/tasks/{task}"), "text/html").await, true),
        (
            get(format!("/tasks/{}", ObjectId::new()), "text/html").await,
            true,
        ),
        (get("/no/such/route".into(), "*/*").await, false),
    ];
    for ((target, r), html) in &cases {
        assert_eq!(
            r.header("x-content-type-options"),
            Some("nosniff"),
            "{target}"
        );
        assert_eq!(r.header("x-frame-options"), Some("DENY"), "{target}");
        let csp = r.header("content-security-policy");
        if *html {
            assert!(
                r.header("content-type")
                    .is_some_and(|c| c.starts_with("text/html")),
                "{target}"
            );
            let csp = csp.unwrap_or_else(|| panic!("{target}: no CSP"));
            for part in [
                "default-src 'self'",
                "frame-ancestors 'none'",
                "base-uri 'none'",
                "form-action 'self'",
            ] {
                assert!(csp.contains(part), "{target}: {csp}");
            }
            assert!(
                !csp.contains("unsafe-inline") && !csp.contains("unsafe-eval"),
                "{csp}"
            );
        } else {
            assert_eq!(csp, None, "{target}");
        }
    }
    let refused = send(
        s.dci.addr,
        raw("GET", "/queues", &[("Host", "evil.example")], ""),
    )
    .await;
    assert_eq!(refused.status, 403);
    assert_eq!(refused.header("x-content-type-options"), Some("nosniff"));
    assert_eq!(refused.header("x-frame-options"), Some("DENY"));
    // The console page loads nothing inline, so the policy blocks nothing of its own.
    let page = cases[1].0 .1.text();
    assert!(
        !page.contains("<script>") && !page.contains("style="),
        "{page}"
    );
    s.db.drop().await;
}

#[tokio::test]
async fn undecodable_path_parameters_answer_400_json() {
    let s = site("hostile_http_paths", json!({})).await;
    for target in [
        "/queues/%ff%fe",
        "/nodes/%ff",
        "/tasks/%c3%28",
        "/tasks/%ff%fe/stdout",
        "/ui/%ff",
    ] {
        let r = send(s.dci.addr, raw("GET", target, &[("Host", &s.host)], "")).await;
        assert_eq!(r.status, 400, "{target}: {}", r.text());
        let e = error_of(&r);
        assert!(e.starts_with("invalid path"), "{target}: {e}");
    }
    let r = send(
        s.dci.addr,
        raw("DELETE", "/queues/%ff%fe", &[("Host", &s.host)], ""),
    )
    .await;
    assert_eq!(r.status, 400, "{}", r.text());
    error_of(&r);
    s.db.drop().await;
}
