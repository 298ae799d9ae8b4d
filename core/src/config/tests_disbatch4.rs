//! Disbatch 4 config files as sites have them: `#` comments, Perl booleans, bare host lists
//! and Perl MongoClient `attributes`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use mongodb::options::{Acknowledgment, ClientOptions, ReadPreference, SelectionCriteria};
use serde_json::json;

use super::*;

fn parse(text: &str) -> Result<Loaded> {
    Config::parse(Path::new("/etc/disbatch/config.json"), text)
}

fn error_of(text: &str) -> String {
    parse(text).expect_err("config must be refused").to_string()
}

const BASE: &str = r#""mongohost": "mongodb://h", "database": "d""#;

fn with(extra: &str) -> String {
    format!("{{{BASE}, {extra}}}")
}

#[test]
fn disbatchs_own_example_parses_as_it_is() {
    let text = include_str!("../../../tests/fixtures/disbatch4-config.json-example");
    let loaded = parse(text).expect("Disbatch's config.json-example");
    assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
    let c = loaded.config;
    assert_eq!(c.mongohost, "mongodb://127.0.0.1:27017");
    assert_eq!(c.database, "disbatch_test");
    assert!(c.tls.enabled);
    assert_eq!(
        c.tls.ca_file.as_deref(),
        Some(Path::new("/etc/ssl/certs/ca-bundle.crt"))
    );
    assert!(
        !c.tls.allow_invalid_certificates,
        "SSL_verify_mode is commented out"
    );
    assert_eq!(
        c.auth.get("queuebalance").map(String::as_str),
        Some("qwerty4")
    );
    assert!(c.plugins.is_listed("Disbatch::Plugin::Demo"));
    assert!(c.monitoring);
    assert!(c.balance.log && !c.balance.enabled);
    assert_eq!(c.web_extensions, Vec::<String>::new());
    assert!(c.activequeues.is_empty() && c.ignorequeues.is_empty());
    assert_eq!(
        c.gfs,
        crate::model::output::GfsMode::Auto,
        "gfs is commented out"
    );
    assert_eq!(
        c.web_root,
        Some(PathBuf::from("/etc/disbatch/etc/disbatch/htdocs/"))
    );
}

#[test]
fn hash_comments_whole_line_and_after_values_are_skipped() {
    let text = "{\n  # whole line\n  \"mongohost\": \"mongodb://h\",\t# after a value\n  \
                \"database\": \"d\", #\n  \"plugins\": [ # after a bracket\n    \"a\", # x\n  ],\n  \
                #\"quiet\": true,\n}\n# last line, no newline after it";
    let c = parse(text).expect("ok").config;
    assert!(c.plugins.is_listed("a"));
    assert!(!c.quiet, "a commented-out key stays out");
}

#[test]
fn a_hash_inside_a_string_is_text() {
    let c = parse(&with(
        "\"web_root\": \"/srv/#1\", \"node\": \"n1\" # \"node\": \"n2\"\n",
    ))
    .expect("ok")
    .config;
    assert_eq!(c.web_root, Some(PathBuf::from("/srv/#1")));
    assert_eq!(c.node.as_deref(), Some("n1"));
    let c = parse(&with(r##""web_root": "a\"#b""##)).expect("ok").config;
    assert_eq!(c.web_root, Some(PathBuf::from("/etc/disbatch/a\"#b")));
}

#[test]
fn trailing_commas_before_braces_and_brackets_are_accepted() {
    let c = parse(&with(r#""balance": {"log": 1,}, "plugins": ["a", "b",],"#))
        .expect("ok")
        .config;
    assert!(c.balance.log);
    assert!(c.plugins.is_listed("b"));
}

#[test]
fn errors_after_hash_comments_keep_their_line_and_column() {
    // A comment with multi-byte text before the error must not shift it.
    let e = error_of("{ # é ü 🙂\n  \"mongohost\": \"mongodb://h\",\n  \"database\": ,\n}");
    assert!(
        e.contains("not valid JSON") && e.contains("line 3 column 15"),
        "{e}"
    );
    let e = error_of("{\"mongohost\": \"mongodb://h\" # no comma\n \"database\": \"d\"}");
    assert!(e.contains("comma") && e.contains("line 2 column 2"), "{e}");
    let e = error_of("# only a comment\n");
    assert!(e.contains("empty"), "{e}");
    // An unterminated string is not ended by a `#` in it.
    let e = error_of("{\"mongohost\": \"mongodb://h # \n}");
    assert!(e.contains("not valid JSON") && e.contains("line 1"), "{e}");
}

/// Every boolean Disbatch reads, as a `with` fragment for a value, and how to read it back.
type Reader = fn(&Config) -> bool;
const BOOLEANS: &[(&str, &str, Reader)] = &[
    ("monitoring", r#""monitoring": V"#, |c| c.monitoring),
    ("quiet", r#""quiet": V"#, |c| c.quiet),
    ("change_streams", r#""change_streams": V"#, |c| {
        c.change_streams
    }),
    ("balance.enabled", r#""balance": {"enabled": V}"#, |c| {
        c.balance.enabled
    }),
    ("balance.log", r#""balance": {"log": V}"#, |c| c.balance.log),
    ("balance.verbose", r#""balance": {"verbose": V}"#, |c| {
        c.balance.verbose
    }),
    ("balance.pretend", r#""balance": {"pretend": V}"#, |c| {
        c.balance.pretend
    }),
    (
        "web.empty_tasks_object",
        r#""web": {"empty_tasks_object": V}"#,
        |c| c.web.empty_tasks_object,
    ),
    ("attributes.ssl", r#""attributes": {"ssl": V}"#, |c| {
        c.tls.enabled
    }),
    (
        "attributes.tls_allow_invalid_certificates",
        r#""attributes": {"tls_allow_invalid_certificates": V}"#,
        |c| c.tls.allow_invalid_certificates,
    ),
    ("attributes.j", r#""attributes": {"j": V}"#, |c| {
        c.driver.journal == Some(true)
    }),
    (
        "attributes.retry_reads",
        r#""attributes": {"retry_reads": V}"#,
        |c| c.driver.retry_reads == Some(true),
    ),
    (
        "attributes.retry_writes",
        r#""attributes": {"retry_writes": V}"#,
        |c| c.driver.retry_writes == Some(true),
    ),
];

#[test]
fn every_boolean_takes_perl_spellings() {
    for (key, fragment, read) in BOOLEANS {
        for (written, expected) in [
            ("1", true),
            ("0", false),
            ("\"1\"", true),
            ("\"0\"", false),
            ("true", true),
            ("false", false),
        ] {
            let text = with(&fragment.replace('V', written));
            let c = parse(&text)
                .unwrap_or_else(|e| panic!("{key}: {written}: {e}"))
                .config;
            assert_eq!(read(&c), expected, "{key}: {written}");
        }
    }
}

#[test]
fn every_boolean_refuses_other_values_naming_the_key() {
    for (key, fragment, _) in BOOLEANS {
        // `ssl` takes Perl's truth for any number, and an object of SSL options.
        let refused: &[&str] = if *key == "attributes.ssl" {
            &["\"yes\"", "\"true\"", "[1]"]
        } else {
            &["\"yes\"", "\"true\"", "2", "-1", "[1]", "{}"]
        };
        for written in refused {
            let e = error_of(&with(&fragment.replace('V', written)));
            assert!(e.contains(&format!("`{key}`")), "{key}: {written}: {e}");
            assert!(
                e.contains("true") && e.contains("false"),
                "says what is allowed: {e}"
            );
        }
    }
}

#[test]
fn balance_settings_are_kept_as_written() {
    let c = parse(&with(
        r#""balance": {"enabled": 0, "log": 1, "verbose": "0", "pretend": false}"#,
    ))
    .expect("ok")
    .config;
    let b = &c.balance;
    assert_eq!(
        (b.enabled, b.log, b.verbose, b.pretend),
        (false, true, false, false)
    );
    assert_eq!(
        serde_json::Value::Object(b.written.clone()),
        json!({"enabled": 0, "log": 1, "verbose": "0", "pretend": false})
    );
    let none = parse(&with(r#""balance": {"log": true}"#))
        .expect("ok")
        .config;
    assert_eq!(
        serde_json::Value::Object(none.balance.written),
        json!({"log": true})
    );
}

#[test]
fn mongohost_takes_bare_hosts_and_host_lists() {
    for (written, uri) in [
        ("db1:27017", "mongodb://db1:27017"),
        ("db1:27017,db2:27018", "mongodb://db1:27017,db2:27018"),
        ("localhost", "mongodb://localhost"),
        (
            "mongodb://db1:27017/?replicaSet=rs0",
            "mongodb://db1:27017/?replicaSet=rs0",
        ),
        (
            "mongodb+srv://cluster.example.com",
            "mongodb+srv://cluster.example.com",
        ),
    ] {
        let c = parse(&format!(r#"{{"mongohost": "{written}", "database": "d"}}"#))
            .unwrap_or_else(|e| panic!("{written}: {e}"))
            .config;
        assert_eq!(c.mongohost, uri);
    }
    for bad in ["db1:port", "db1 db2", "http://db1", "db1:27017,,db2:1/x/y"] {
        let e = error_of(&format!(r#"{{"mongohost": "{bad}", "database": "d"}}"#));
        assert!(e.contains("`mongohost`"), "{bad}: {e}");
    }
}

#[test]
fn a_bare_mongohost_password_is_masked_everywhere() {
    let text = r#"{"mongohost": "u:Bare-Host-Pw1@db1:27017,db2", "database": "d"}"#;
    let c = parse(text).expect("ok").config;
    assert!(!format!("{c:?}").contains("Bare-Host-Pw1"));
    assert_eq!(crate::text::redact::redact("x Bare-Host-Pw1 y"), "x *** y");
    let e = error_of(r#"{"mongohost": "u:Bare-Host-Pw2@db1:x", "database": "d"}"#);
    assert!(
        e.contains("`mongohost`") && !e.contains("Bare-Host-Pw2"),
        "{e}"
    );
}

const ALL_ATTRIBUTES: &str = r#""attributes": {
    "connect_timeout_ms": 2500, "server_selection_timeout_ms": "7000",
    "heartbeat_frequency_ms": 600, "local_threshold_ms": 20,
    "w": "majority", "j": 1, "wtimeout": 3000,
    "read_pref_mode": "secondaryPreferred", "read_pref_tag_sets": [{"dc": "east"}, {}],
    "max_staleness_seconds": 120, "read_concern_level": "majority",
    "replica_set_name": "rs0", "app_name": "site-disbatch",
    "retry_reads": 0, "retry_writes": "1",
    "username": "site-user", "password": "Attr-Pass-123", "db_name": "admin",
    "auth_mechanism": "SCRAM-SHA-256",
    "socket_timeout_ms": 30000, "max_time_ms": 1000, "compressors": ["zlib"], "timeout": 5
}"#;

#[tokio::test]
async fn attributes_map_onto_the_drivers_options() {
    let loaded = parse(&with(ALL_ATTRIBUTES)).expect("ok");
    assert_eq!(loaded.warnings.len(), 1, "{:?}", loaded.warnings);
    let warning = &loaded.warnings[0];
    for key in [
        "socket_timeout_ms",
        "max_time_ms",
        "compressors",
        "timeout",
        "no socket timeout",
    ] {
        assert!(warning.contains(key), "{key}: {warning}");
    }
    assert!(!format!("{:?}", loaded.config).contains("Attr-Pass-123"));
    let mut o = ClientOptions::parse("mongodb://h").await.expect("uri");
    loaded.config.driver.apply(&mut o);
    assert_eq!(o.connect_timeout, Some(Duration::from_millis(2500)));
    assert_eq!(o.server_selection_timeout, Some(Duration::from_secs(7)));
    assert_eq!(o.heartbeat_freq, Some(Duration::from_millis(600)));
    assert_eq!(o.local_threshold, Some(Duration::from_millis(20)));
    let wc = o.write_concern.expect("write concern");
    assert_eq!(wc.w, Some(Acknowledgment::Majority));
    assert_eq!(
        (wc.journal, wc.w_timeout),
        (Some(true), Some(Duration::from_secs(3)))
    );
    match o.selection_criteria {
        Some(SelectionCriteria::ReadPreference(ReadPreference::SecondaryPreferred {
            options: Some(p),
        })) => {
            assert_eq!(p.max_staleness, Some(Duration::from_secs(120)));
            assert_eq!(p.tag_sets.map(|t| t.len()), Some(2));
        }
        other => panic!("read preference: {other:?}"),
    }
    assert_eq!(
        o.read_concern,
        Some(mongodb::options::ReadConcern::majority())
    );
    assert_eq!(o.repl_set_name.as_deref(), Some("rs0"));
    assert_eq!(o.app_name.as_deref(), Some("site-disbatch"));
    assert_eq!((o.retry_reads, o.retry_writes), (Some(false), Some(true)));
    let cred = o.credential.expect("credential");
    assert_eq!(cred.username.as_deref(), Some("site-user"));
    assert_eq!(cred.password.as_deref(), Some("Attr-Pass-123"));
    assert_eq!(cred.source.as_deref(), Some("admin"));
    assert_eq!(
        cred.mechanism,
        Some(mongodb::options::AuthMechanism::ScramSha256)
    );
    assert_eq!(crate::text::redact::redact("Attr-Pass-123"), "***");
}

#[tokio::test]
async fn options_in_the_uri_win_over_attributes() {
    let loaded = parse(&with(
        r#""attributes": {"connect_timeout_ms": 1, "w": 2, "j": true, "replica_set_name": "a"}"#,
    ))
    .expect("ok");
    let mut o = ClientOptions::parse("mongodb://h/?connectTimeoutMS=9&w=3&replicaSet=b")
        .await
        .expect("uri");
    loaded.config.driver.apply(&mut o);
    assert_eq!(o.connect_timeout, Some(Duration::from_millis(9)));
    assert_eq!(o.repl_set_name.as_deref(), Some("b"));
    let wc = o.write_concern.expect("write concern");
    assert_eq!(
        (wc.w, wc.journal),
        (Some(Acknowledgment::Nodes(3)), Some(true))
    );
    // Nothing given: nothing changed.
    let mut plain = ClientOptions::parse("mongodb://h").await.expect("uri");
    let before = format!("{plain:?}");
    DriverOptions::default().apply(&mut plain);
    assert_eq!(format!("{plain:?}"), before);
}

#[test]
fn bad_attribute_values_are_refused_naming_the_key() {
    for (attrs, key) in [
        (
            r#"{"connect_timeout_ms": "soon"}"#,
            "attributes.connect_timeout_ms",
        ),
        (
            r#"{"connect_timeout_ms": -5}"#,
            "attributes.connect_timeout_ms",
        ),
        (r#"{"wtimeout": 1.5}"#, "attributes.wtimeout"),
        (
            r#"{"heartbeat_frequency_ms": 10}"#,
            "attributes.heartbeat_frequency_ms",
        ),
        (r#"{"w": -1}"#, "attributes.w"),
        (r#"{"w": ""}"#, "attributes.w"),
        (r#"{"j": "yes"}"#, "attributes.j"),
        (
            r#"{"read_pref_mode": "fastest"}"#,
            "attributes.read_pref_mode",
        ),
        (
            r#"{"read_pref_mode": "primary", "read_pref_tag_sets": [{"a": "b"}]}"#,
            "attributes.read_pref_mode",
        ),
        (
            r#"{"read_pref_tag_sets": [{"a": "b"}]}"#,
            "attributes.read_pref_mode",
        ),
        (
            r#"{"read_pref_mode": "nearest", "read_pref_tag_sets": [{"a": 1}]}"#,
            "attributes.read_pref_tag_sets",
        ),
        (
            r#"{"read_pref_mode": "nearest", "max_staleness_seconds": 5}"#,
            "attributes.max_staleness_seconds",
        ),
        (
            r#"{"read_concern_level": "strong"}"#,
            "attributes.read_concern_level",
        ),
        (r#"{"replica_set_name": 5}"#, "attributes.replica_set_name"),
        (
            r#"{"auth_mechanism": "MAGIC"}"#,
            "attributes.auth_mechanism",
        ),
        (r#"{"username": ["x"]}"#, "attributes.username"),
        (
            r#"{"ssl": {"SSL_verify_mode": "x"}}"#,
            "attributes.ssl.SSL_verify_mode",
        ),
    ] {
        let e = error_of(&with(&format!(r#""attributes": {attrs}"#)));
        assert!(e.contains(&format!("`{key}`")), "{attrs}: {e}");
    }
}
