use std::path::Path;
use std::time::Duration;

use super::*;

fn parse(text: &str) -> Result<Loaded> {
    Config::parse(Path::new("/etc/disbatch/config.json"), text)
}

fn error_of(text: &str) -> String {
    parse(text).expect_err("config must be refused").to_string()
}

#[test]
fn minimal_disbatch_config_gets_disbatch_defaults() {
    let loaded =
        parse(r#"{"mongohost": "mongodb://db:27017", "database": "disbatch"}"#).expect("ok");
    let c = loaded.config;
    assert_eq!(c.database, "disbatch");
    assert_eq!(c.gfs, GfsMode::Auto);
    assert_eq!(c.loop_interval, Duration::from_secs(1));
    assert_eq!(c.plugins.names().count(), 0);
    assert!(!c.tls.enabled);
    assert!(loaded.warnings.is_empty());
}

#[test]
fn relaxed_json_with_comments_and_trailing_commas_is_accepted() {
    let text = r#"{
        // Disbatch configs carry comments
        "mongohost": "mongodb://db:27017", /* and block comments */
        "database": "disbatch",
        "plugins": ["Disbatch::Plugin::Demo",],
        "gfs": false,
    }"#;
    let c = parse(text).expect("ok").config;
    assert_eq!(c.gfs, GfsMode::Off);
    assert!(c.plugins.is_listed("Disbatch::Plugin::Demo"));
}

#[test]
fn every_error_names_the_file_and_the_key() {
    let e = error_of(r#"{"database": "d"}"#);
    assert!(
        e.contains("/etc/disbatch/config.json") && e.contains("`mongohost`"),
        "{e}"
    );
    let e = error_of(r#"{"mongohost": "mongodb://h", "database": "d", "gfs": "maybe"}"#);
    assert!(e.contains("`gfs`") && e.contains("maybe"), "{e}");
    let e = error_of(r#"{"mongohost": "mongodb://h", "database": "d", "plugins": [1]}"#);
    assert!(e.contains("`plugins`"), "{e}");
    let e = error_of(r#"{"mongohost": "mongodb://h", "database": 5}"#);
    assert!(e.contains("database") && e.contains("integer"), "{e}");
    let e = error_of(r#"{"mongohost": "mongodb://h", "database": "d", "activequeues": ["demo"]}"#);
    assert!(
        e.contains("`activequeues`") && e.contains("queue id"),
        "{e}"
    );
    let e = error_of(r#"{"mongohost": "mongodb://h", "database": "d", "loop_interval_ms": 5}"#);
    assert!(e.contains("`loop_interval_ms`"), "{e}");
    let e =
        error_of(r#"{"mongohost": "mongodb://h", "database": "d", "balance": {"enabled": "yes"}}"#);
    assert!(e.contains("balance.enabled"), "{e}");
    let e = error_of(r#"{"mongohost": "http://localhost", "database": "d"}"#);
    assert!(e.contains("`mongohost`") && e.contains("URI"), "{e}");
    let e = error_of(r#"{"mongohost": "mongodb://h", "database": "a.b"}"#);
    assert!(e.contains("`database`"), "{e}");
}

#[test]
fn syntax_errors_and_wrong_top_level_are_refused_clearly() {
    assert!(error_of(r#"{"mongohost": "#).contains("not valid JSON"));
    assert!(error_of("").contains("empty"));
    assert!(error_of("[1, 2]").contains("JSON object"));
}

#[test]
fn unknown_keys_are_warned_about_and_disbatch_keys_we_do_not_use_are_not() {
    let text = r#"{"mongohost": "mongodb://h", "database": "d", "threads": 4,
                   "log4perl": {"level": "DEBUG"}, "views_dir": "/x", "balance": {"enabled": true, "colour": 1}}"#;
    let loaded = parse(text).expect("ok");
    assert_eq!(
        loaded.warnings,
        vec![
            "unknown key `threads` is ignored".to_string(),
            "unknown key `balance.colour` is ignored".to_string()
        ]
    );
    assert!(loaded.config.balance.enabled);
}

#[test]
fn perl_ssl_attributes_map_onto_tls_settings() {
    let text = r#"{"mongohost": "mongodb://h", "database": "d",
                   "attributes": {"ssl": {"SSL_ca_file": "ca.pem", "SSL_verify_mode": 0}, "timeout": 5}}"#;
    let loaded = parse(text).expect("ok");
    let tls = loaded.config.tls;
    assert!(tls.enabled);
    assert_eq!(
        tls.ca_file.as_deref(),
        Some(Path::new("/etc/disbatch/ca.pem"))
    );
    assert!(tls.allow_invalid_certificates);
    assert_eq!(loaded.warnings.len(), 1, "{:?}", loaded.warnings);
    let plain = parse(r#"{"mongohost": "mongodb://h", "database": "d", "attributes": {"ssl": 1}}"#)
        .expect("ok");
    assert!(plain.config.tls.enabled);
    assert!(error_of(
        r#"{"mongohost": "mongodb://h", "database": "d", "attributes": {"ssl": "x"}}"#
    )
    .contains("attributes.ssl"));
}

#[test]
fn relative_paths_resolve_against_the_config_directory() {
    let text = r#"{"mongohost": "mongodb://h", "database": "d", "task_runner": "bin/dtr",
                   "web_root": "htdocs", "plugin_dirs": ["plugins"]}"#;
    let c = parse(text).expect("ok").config;
    assert_eq!(
        c.task_runner.as_deref(),
        Some(Path::new("/etc/disbatch/bin/dtr"))
    );
    assert_eq!(
        c.web_root.as_deref(),
        Some(Path::new("/etc/disbatch/htdocs"))
    );
    let bare = parse(
        r#"{"mongohost": "mongodb://h", "database": "d", "task_runner": "disbatch-task-runner"}"#,
    )
    .expect("ok")
    .config;
    assert_eq!(
        bare.task_runner.as_deref(),
        Some(Path::new("disbatch-task-runner"))
    );
}

#[test]
fn node_names_are_validated() {
    assert!(validate_node_name("mig01.example.com").is_ok());
    assert!(validate_node_name("").is_err());
    assert!(validate_node_name("a/b").is_err());
    assert!(
        error_of(r#"{"mongohost": "mongodb://h", "database": "d", "node": "bad name"}"#)
            .contains("`node`")
    );
}

fn web(web: &str) -> String {
    format!(r#"{{"mongohost": "mongodb://h", "database": "d", "web": {web}}}"#)
}

const SECRET: &str = "s3cret-s3cret-s3cret";

#[test]
fn web_tokens_and_tls_are_read_with_paths_resolved() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("admin.token"), "admin-token-from-a-file\n").expect("write");
    let text = web(&format!(
        r#"{{"tokens": [{{"name": "ops", "role": "operate", "token": "{SECRET}"}},
                        {{"name": "boss", "role": "admin", "token_file": "admin.token", "note": 1}}],
            "tls": {{"cert_file": "cert.pem", "key_file": "/abs/key.pem"}}}}"#
    ));
    let loaded = Config::parse(&dir.path().join("config.json"), &text).expect("ok");
    assert_eq!(
        loaded.warnings,
        ["unknown key `web.tokens[1].note` is ignored"]
    );
    let w = loaded.config.web;
    assert_eq!(w.tokens.len(), 2);
    assert_eq!(
        (
            w.tokens[0].name.as_str(),
            w.tokens[0].role,
            w.tokens[0].secret()
        ),
        ("ops", Role::Operate, SECRET)
    );
    assert_eq!(
        (
            w.tokens[1].name.as_str(),
            w.tokens[1].role,
            w.tokens[1].secret()
        ),
        ("boss", Role::Admin, "admin-token-from-a-file")
    );
    let tls = w.tls.expect("tls");
    assert_eq!(tls.cert_file, dir.path().join("cert.pem"));
    assert_eq!(tls.key_file, Path::new("/abs/key.pem"));
}

#[test]
fn no_tokens_leaves_the_api_open_and_roles_are_ordered() {
    let c = parse(r#"{"mongohost": "mongodb://h", "database": "d"}"#)
        .expect("ok")
        .config;
    assert!(c.web.tokens.is_empty() && c.web.tls.is_none());
    assert!(parse(&web(r#"{"tokens": []}"#))
        .expect("ok")
        .config
        .web
        .tokens
        .is_empty());
    assert!(Role::Read < Role::Operate && Role::Operate < Role::Admin);
    assert_eq!(Role::parse("operate"), Some(Role::Operate));
    assert_eq!(Role::parse("Admin"), None);
}

#[test]
fn bad_web_tokens_are_refused_naming_the_key_and_never_the_token() {
    let entry = |fields: &str| web(&format!(r#"{{"tokens": [{fields}]}}"#));
    let cases = [
        (
            entry(&format!(
                r#"{{"name": "a", "role": "root", "token": "{SECRET}"}}"#
            )),
            "web.tokens[0].role",
            "unknown role",
        ),
        (
            entry(r#"{"name": "a", "role": "read", "token": ""}"#),
            "web.tokens[0].token",
            "empty",
        ),
        (
            entry(r#"{"name": "a", "role": "read", "token": "short-secret"}"#),
            "web.tokens[0].token",
            "shorter than 16",
        ),
        (
            entry(r#"{"name": "a", "role": "read", "token": "has a space inside it"}"#),
            "web.tokens[0].token",
            "printable ASCII",
        ),
        (
            entry(&format!(
                r#"{{"name": "a", "role": "read", "token": "{SECRET}"}},
                   {{"name": "a", "role": "admin", "token": "another-long-secret"}}"#
            )),
            "web.tokens[1].name",
            "unique",
        ),
        (
            entry(&format!(
                r#"{{"name": "a", "role": "read", "token": "{SECRET}"}},
                   {{"name": "b", "role": "admin", "token": "{SECRET}"}}"#
            )),
            "web.tokens[1]",
            "same token",
        ),
        (
            entry(r#"{"name": "a", "role": "read", "token_file": "/nonexistent/disbatch.token"}"#),
            "web.tokens[0].token_file",
            "/nonexistent/disbatch.token",
        ),
        (
            entry(&format!(
                r#"{{"name": "a", "role": "read", "token": "{SECRET}", "token_file": "f"}}"#
            )),
            "web.tokens[0]",
            "not both",
        ),
        (
            entry(r#"{"name": "a", "role": "read"}"#),
            "web.tokens[0]",
            "required",
        ),
        (
            entry(&format!(r#"{{"role": "read", "token": "{SECRET}"}}"#)),
            "web.tokens[0].name",
            "required",
        ),
        (
            entry(&format!(r#"{{"name": "a", "token": "{SECRET}"}}"#)),
            "web.tokens[0].role",
            "required",
        ),
        (entry(&format!(r#""{SECRET}""#)), "web.tokens[0]", "object"),
        (
            web(&format!(r#"{{"tokens": "{SECRET}"}}"#)),
            "web.tokens",
            "array",
        ),
        (
            entry(r#"{"name": "a", "role": "read", "token": 12345678901234567890}"#),
            "web.tokens[0].token",
            "string",
        ),
    ];
    for (text, key, problem) in cases {
        let e = error_of(&text);
        assert!(
            e.contains(&format!("`{key}")) && e.contains(problem),
            "{key}: {e}"
        );
        for secret in [SECRET, "short-secret", "12345678901234567890"] {
            assert!(!e.contains(secret), "the token leaked into: {e}");
        }
    }
}

#[test]
fn token_debug_output_hides_the_secret() {
    let text = web(&format!(
        r#"{{"tokens": [{{"name": "ops", "role": "read", "token": "{SECRET}"}}]}}"#
    ));
    let c = parse(&text).expect("ok").config;
    let shown = format!("{c:?}");
    assert!(shown.contains("ops") && !shown.contains(SECRET), "{shown}");
}

#[test]
fn web_tls_needs_both_files() {
    let e = error_of(&web(r#"{"tls": {"cert_file": "c.pem"}}"#));
    assert!(e.contains("web.tls") && e.contains("key_file"), "{e}");
    let e = error_of(&web(r#"{"tls": {"cert_file": "", "key_file": "k.pem"}}"#));
    assert!(e.contains("`web.tls.cert_file`"), "{e}");
}

#[test]
fn metrics_listen_is_a_socket_address_and_off_by_default() {
    let base = r#""mongohost": "mongodb://h", "database": "d""#;
    let c = parse(&format!("{{{base}}}")).expect("ok").config;
    assert_eq!(c.metrics_listen, None);
    let c = parse(&format!(
        r#"{{{base}, "metrics_listen": "127.0.0.1:9101"}}"#
    ))
    .expect("ok")
    .config;
    assert_eq!(
        c.metrics_listen,
        Some("127.0.0.1:9101".parse().expect("addr"))
    );
    let c = parse(&format!(r#"{{{base}, "metrics_listen": "[::1]:0"}}"#))
        .expect("ok")
        .config;
    assert_eq!(c.metrics_listen, Some("[::1]:0".parse().expect("addr")));
    for bad in [
        r#""localhost:9101""#,
        r#""127.0.0.1""#,
        r#""127.0.0.1:99999""#,
        r#""""#,
    ] {
        let e = error_of(&format!(r#"{{{base}, "metrics_listen": {bad}}}"#));
        assert!(
            e.contains("`metrics_listen`") && e.contains("socket address"),
            "{bad}: {e}"
        );
    }
    let e = error_of(&format!(r#"{{{base}, "metrics_listen": 9101}}"#));
    assert!(e.contains("`metrics_listen`"), "{e}");
}

#[test]
fn deep_nesting_and_arrays_for_objects_are_refused() {
    let base = r#""mongohost": "mongodb://h", "database": "d""#;
    let deep = format!(
        r#"{{{base}, "x": {}1{}}}"#,
        "[".repeat(10_000),
        "]".repeat(10_000)
    );
    let e = error_of(&deep);
    assert!(e.contains("nested deeper than 128"), "{e}");
    // Brackets inside strings do not count.
    let quoted = format!(r#"{{{base}, "web_root": "{}"}}"#, "[".repeat(500));
    assert!(parse(&quoted).is_ok());
    for (json, key) in [
        (r#""balance": [true, true]"#, "`balance`"),
        (r#""web": []"#, "`web`"),
        (r#""web": {"tls": ["c", "k"]}"#, "`web.tls`"),
    ] {
        let e = error_of(&format!("{{{base}, {json}}}"));
        assert!(
            e.contains(key) && e.contains("must be an object"),
            "{json}: {e}"
        );
    }
}

#[test]
fn change_streams_are_on_unless_turned_off() {
    let base = r#""mongohost": "mongodb://h", "database": "d""#;
    assert!(
        parse(&format!("{{{base}}}"))
            .expect("ok")
            .config
            .change_streams
    );
    let off = parse(&format!(r#"{{{base}, "change_streams": false}}"#)).expect("ok");
    assert!(!off.config.change_streams);
    let e = error_of(&format!(r#"{{{base}, "change_streams": "no"}}"#));
    assert!(e.contains("change_streams"), "{e}");
}

#[test]
fn a_missing_comma_between_members_is_refused_with_line_and_column() {
    let e = error_of("{\"mongohost\": \"mongodb://h\"\n \"database\": \"d\"}");
    assert!(
        e.contains("/etc/disbatch/config.json")
            && e.contains("not valid JSON")
            && e.contains("comma")
            && e.contains("line 2 column 2"),
        "{e}"
    );
    let e = error_of(r#"{"mongohost": "mongodb://h", "database": "d", "plugins": ["a" "b"]}"#);
    assert!(e.contains("comma") && e.contains("line 1 column 63"), "{e}");
    // Comments and trailing commas stay allowed around the check.
    let ok = "{\"mongohost\": \"mongodb://h\", // c\n \"database\": \"d\", /* x */ \"plugins\": [\"a\",],}";
    assert!(parse(ok).is_ok());
}

#[test]
fn debug_output_hides_the_mongohost_and_auth_passwords() {
    let text = r#"{"mongohost": "mongodb://user:Uri-Pass%40word@db:27017/?tls=true",
                   "database": "d", "auth": {"disbatchd": "Auth-Pass-1"}}"#;
    let c = parse(text).expect("ok").config;
    let shown = format!("{c:?}");
    for secret in ["Uri-Pass", "word@db", "Auth-Pass-1"] {
        assert!(!shown.contains(secret), "{secret} in {shown}");
    }
    assert!(
        shown.contains("mongodb://user:***@db:27017/?tls=true") && shown.contains("disbatchd"),
        "{shown}"
    );
    let loaded = format!("{:?}", parse(text).expect("ok"));
    assert!(!loaded.contains("Auth-Pass-1"), "{loaded}");
}

#[test]
fn a_mongohost_with_a_password_and_a_bad_scheme_is_refused_without_it() {
    let e = error_of(r#"{"mongohost": "mongodbx://user:Scheme-Secret@host/", "database": "d"}"#);
    assert!(
        e.contains("`mongohost`") && e.contains("mongodbx://user:***@host/"),
        "{e}"
    );
    assert!(!e.contains("Scheme-Secret"), "{e}");
}

#[test]
fn a_password_of_the_wrong_type_is_refused_without_quoting_it() {
    for password in ["12345678", "1234.5678", "true", r#"["Listed-Pw-77"]"#] {
        let text = format!(
            r#"{{"mongohost": "mongodb://h", "database": "d", "auth": {{"disbatchd": {password}}}}}"#
        );
        let e = error_of(&text);
        assert!(e.contains("`auth.disbatchd`"), "{e}");
        for shown in ["12345678", "1234.5678", "true", "Listed-Pw-77"] {
            assert!(!e.contains(shown), "{shown} in {e}");
        }
        let problems = Config::check_value(
            Path::new("/c.json"),
            serde_json::from_str(&text).expect("json"),
        )
        .expect_err("refused")
        .join("; ");
        assert!(
            !problems.contains("12345678") && !problems.contains("Listed-Pw-77"),
            "{problems}"
        );
    }
    let e = error_of(r#"{"mongohost": 12345678, "database": "d"}"#);
    assert!(e.contains("`mongohost`") && !e.contains("12345678"), "{e}");
}

#[test]
fn a_token_read_from_its_file_is_masked_in_any_later_text() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("t.token"), "File-Token-0123456789abcdef\n").expect("write");
    let text = r#"{"mongohost": "mongodb://h", "database": "d",
        "web": {"tokens": [{"name": "f", "role": "read", "token_file": "t.token"}]}}"#;
    Config::parse(&dir.path().join("c.json"), text).expect("ok");
    assert_eq!(
        disbatch_model::text::redact::redact("Bearer File-Token-0123456789abcdef"),
        "Bearer ***"
    );
}

#[test]
fn passwords_of_a_parsed_config_are_masked_in_any_later_text() {
    parse(
        r#"{"mongohost": "mongodb://u:Remembered-Uri-Pw@h/", "database": "d",
            "auth": {"task_runner": "Remembered-Auth-Pw"}}"#,
    )
    .expect("ok");
    assert_eq!(
        disbatch_model::text::redact::redact("pw Remembered-Uri-Pw, Remembered-Auth-Pw"),
        "pw ***, ***"
    );
}

#[test]
fn web_connection_limits_have_defaults_and_refuse_zero_or_absurd_values() {
    let w = parse(&web("{}")).expect("ok").config.web;
    assert_eq!(w.max_connections, 512);
    assert_eq!(w.header_timeout, Duration::from_secs(10));
    assert_eq!(w.idle_timeout, Duration::from_secs(30));
    assert!(w.allowed_hosts.is_empty() && w.allowed_origins.is_empty());
    let w = parse(&web(
        r#"{"max_connections": 64, "header_timeout_ms": 2000, "idle_timeout_ms": 500}"#,
    ))
    .expect("ok")
    .config
    .web;
    assert_eq!(
        (w.max_connections, w.header_timeout, w.idle_timeout),
        (64, Duration::from_secs(2), Duration::from_millis(500))
    );
    for (json, key) in [
        (r#"{"max_connections": 0}"#, "`web.max_connections`"),
        (r#"{"max_connections": 1000000}"#, "`web.max_connections`"),
        (r#"{"header_timeout_ms": 0}"#, "`web.header_timeout_ms`"),
        (
            r#"{"header_timeout_ms": 86400000}"#,
            "`web.header_timeout_ms`",
        ),
        (r#"{"idle_timeout_ms": 0}"#, "`web.idle_timeout_ms`"),
        (r#"{"idle_timeout_ms": 99999999}"#, "`web.idle_timeout_ms`"),
    ] {
        let e = error_of(&web(json));
        assert!(e.contains(key) && e.contains("out of range"), "{json}: {e}");
    }
    for (json, key) in [
        (r#"{"max_connections": -1}"#, "web.max_connections"),
        (r#"{"header_timeout_ms": "10s"}"#, "web.header_timeout_ms"),
        (
            r#"{"allowed_hosts": "dci.example.com"}"#,
            "web.allowed_hosts",
        ),
    ] {
        let e = error_of(&web(json));
        assert!(e.contains(key), "{json}: {e}");
    }
}

#[test]
fn allowed_hosts_and_origins_are_normalised_and_bad_entries_named() {
    let w = parse(&web(r#"{"allowed_hosts": ["DCI.example.com.", "*"],
            "allowed_origins": ["https://Dash.example.com/", "http://10.0.0.5:8080"]}"#))
    .expect("ok")
    .config
    .web;
    assert_eq!(w.allowed_hosts, ["dci.example.com", "*"]);
    let origins: Vec<String> = w.allowed_origins.iter().map(|o| o.to_string()).collect();
    assert_eq!(
        origins,
        ["https://dash.example.com", "http://10.0.0.5:8080"]
    );
    let e = error_of(&web(
        r#"{"allowed_hosts": ["ok.example", "dci.example.com:8080"]}"#,
    ));
    assert!(
        e.contains("`web.allowed_hosts[1]`") && e.contains("port"),
        "{e}"
    );
    for bad in [
        "null",
        "*",
        "dash.example.com",
        "https://dash.example.com/app",
    ] {
        let e = error_of(&web(&format!(r#"{{"allowed_origins": ["{bad}"]}}"#)));
        assert!(e.contains("`web.allowed_origins[0]`"), "{bad}: {e}");
    }
}

#[test]
fn stats_interval_defaults_to_a_minute_and_must_divide_one() {
    let base = r#"{"mongohost": "mongodb://h", "database": "d""#;
    let c = parse(&format!("{base}}}")).expect("ok").config;
    assert_eq!(c.stats_interval, Duration::from_secs(60));
    let c = parse(&format!(r#"{base}, "stats_interval_s": 2}}"#))
        .expect("ok")
        .config;
    assert_eq!(c.stats_interval, Duration::from_secs(2));
    for bad in ["0", "7", "61", "120", "-1", "\"1\""] {
        let e = error_of(&format!(r#"{base}, "stats_interval_s": {bad}}}"#));
        assert!(e.contains("`stats_interval_s`"), "{bad}: {e}");
    }
}
