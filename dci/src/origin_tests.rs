//! The Host and Origin rules, request by request, without a server.

use super::*;
use axum::http::HeaderValue;

fn web(allowed_hosts: &[&str], allowed_origins: &[&str]) -> WebSettings {
    let text = serde_json::json!({
        "mongohost": "mongodb://h", "database": "d",
        "web": {"allowed_hosts": allowed_hosts, "allowed_origins": allowed_origins},
    })
    .to_string();
    disbatch_config::Config::parse(std::path::Path::new("/c.json"), &text)
        .expect("config")
        .config
        .web
}

fn policy() -> Policy {
    Policy::new(
        &web(
            &["ops.example.com", "*.dci.example.com"],
            &["https://dash.example.com"],
        ),
        "dci-listen.example.com:8080",
        Some("Build-Host".into()),
        &["cert.example.com".to_string()],
    )
}

fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.append(
            axum::http::HeaderName::from_bytes(k.as_bytes()).expect("name"),
            HeaderValue::from_str(v).expect("value"),
        );
    }
    h
}

fn check(method: Method, pairs: &[(&str, &str)]) -> Result<(), Refusal> {
    policy().check(&method, &Uri::from_static("/queues"), &headers(pairs))
}

#[test]
fn hosts_are_allowed_by_ip_name_listen_address_certificate_and_setting() {
    for host in [
        "127.0.0.1:8080",
        "10.1.2.3",
        "[::1]:8080",
        "localhost:8080",
        "LOCALHOST.",
        "build-host",
        "dci-listen.example.com:8080",
        "cert.example.com",
        "ops.example.com:443",
        "a.dci.example.com",
    ] {
        assert_eq!(check(Method::GET, &[("host", host)]), Ok(()), "{host}");
    }
    for host in [
        "evil.example",
        "rebind.attacker.example:8080",
        "dci.example.com",
        "a.b.dci.example.com",
        "localhost.evil.example",
        "",
        "h:port",
    ] {
        for method in [Method::GET, Method::POST] {
            let r = check(method.clone(), &[("host", host)]);
            assert_eq!(r, Err(Refusal::Host(host.into())), "{method} {host}");
        }
    }
    let msg = Refusal::Host("evil.example".into()).message();
    assert_eq!(
        msg,
        "host 'evil.example' is not allowed: add it to web.allowed_hosts"
    );
}

#[test]
fn no_host_is_allowed_and_an_absolute_target_must_name_an_allowed_host_too() {
    let p = policy();
    assert_eq!(
        p.check(&Method::GET, &Uri::from_static("/"), &HeaderMap::new()),
        Ok(())
    );
    let absolute = Uri::from_static("http://evil.example/queues");
    let r = p.check(&Method::GET, &absolute, &headers(&[("host", "localhost")]));
    assert_eq!(r, Err(Refusal::Host("evil.example".into())));
    let star = Policy::new(&web(&["*"], &[]), "127.0.0.1:8080", None, &[]);
    let h = headers(&[("host", "anything.example")]);
    assert_eq!(star.check(&Method::POST, &absolute, &h), Ok(()));
}

#[test]
fn changes_from_foreign_or_null_origins_are_refused_and_reads_are_not() {
    let foreign = [
        ("host", "localhost:8080"),
        ("origin", "http://evil.example"),
    ];
    for method in [Method::POST, Method::DELETE, Method::PUT, Method::PATCH] {
        assert_eq!(
            check(method.clone(), &foreign),
            Err(Refusal::Origin {
                origin: "http://evil.example".into(),
                method: method.clone()
            })
        );
    }
    for method in [Method::GET, Method::HEAD, Method::OPTIONS] {
        assert_eq!(check(method, &foreign), Ok(()));
    }
    let null = check(Method::POST, &[("host", "localhost"), ("origin", "null")]);
    let Err(refusal) = null else {
        panic!("null origin allowed")
    };
    assert!(
        refusal
            .message()
            .starts_with("origin 'null' may not send POST"),
        "{refusal:?}"
    );
    // Same host, another port: another origin.
    let other_port = [
        ("host", "localhost:8080"),
        ("origin", "http://localhost:9999"),
    ];
    assert!(check(Method::POST, &other_port).is_err());
    assert!(check(
        Method::POST,
        &[("host", "localhost"), ("origin", "garbage")]
    )
    .is_err());
}

#[test]
fn same_origin_and_listed_origins_may_change_data() {
    for (host, origin) in [
        ("localhost:8080", "http://localhost:8080"),
        ("LocalHost:8080", "http://localhost:8080"),
        ("127.0.0.1:8080", "http://127.0.0.1:8080"),
        ("cert.example.com", "https://cert.example.com"),
        ("cert.example.com", "http://cert.example.com:80"),
        ("localhost:8080", "https://dash.example.com"),
        ("localhost:8080", "https://dash.example.com:443"),
    ] {
        let r = check(
            Method::POST,
            &[
                ("host", host),
                ("origin", origin),
                ("sec-fetch-site", "cross-site"),
            ],
        );
        assert_eq!(r, Ok(()), "{host} {origin}");
    }
    assert!(check(
        Method::POST,
        &[("host", "localhost"), ("origin", "http://dash.example.com")]
    )
    .is_err());
}

#[test]
fn browser_form_posts_without_origin_are_refused_and_other_clients_are_not() {
    let form = "application/x-www-form-urlencoded";
    let chrome = "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 Chrome/120.0 Safari/537.36";
    let refused = |pairs: &[(&str, &str)]| {
        let mut all = vec![("host", "localhost:8080")];
        all.extend_from_slice(pairs);
        check(Method::POST, &all)
    };
    assert_eq!(
        refused(&[("content-type", form), ("user-agent", chrome)]),
        Err(Refusal::BrowserForm {
            method: Method::POST,
            content_type: form.into()
        })
    );
    assert!(refused(&[
        ("content-type", "text/plain"),
        ("sec-fetch-site", "same-site")
    ])
    .is_err());
    assert!(refused(&[
        ("content-type", form),
        ("referer", "http://evil.example/page")
    ])
    .is_err());
    assert!(refused(&[
        ("sec-fetch-site", "cross-site"),
        ("content-type", "application/json")
    ])
    .is_err());
    assert!(
        refused(&[("user-agent", chrome)]).is_err(),
        "a browser POST without a body"
    );
    // Non-browsers, JSON, and the console's own pages.
    for pairs in [
        vec![("content-type", form), ("user-agent", "curl/8.5.0")],
        vec![("content-type", form), ("user-agent", "libwww-perl/6.72")],
        vec![("content-type", form)],
        vec![],
        vec![
            ("content-type", "Application/JSON; charset=utf-8"),
            ("user-agent", chrome),
        ],
        vec![
            ("content-type", form),
            ("referer", "http://localhost:8080/#/queues"),
        ],
        vec![("content-type", form), ("sec-fetch-site", "same-origin")],
        vec![("content-type", form), ("sec-fetch-site", "none")],
    ] {
        assert_eq!(refused(&pairs), Ok(()), "{pairs:?}");
    }
}

#[test]
fn echoed_values_are_cut() {
    let long = "h".repeat(1000);
    let Err(Refusal::Host(shown)) = check(Method::GET, &[("host", &long)]) else {
        panic!("long host allowed")
    };
    assert_eq!(shown.chars().count(), 201);
}
