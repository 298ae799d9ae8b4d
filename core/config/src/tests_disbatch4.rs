//! Disbatch 4 config files as sites have them: `#` comments, Perl booleans, bare host lists
//! and Perl MongoClient `attributes`.

use std::path::{Path, PathBuf};

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
        disbatch_model::output::GfsMode::Auto,
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
    // What only the driver can judge ("db1:port", "db1:27017,,db2:1/x/y") is the store's
    // check (`store/conn/driver_options_tests.rs`).
    for bad in ["db1 db2", "http://db1"] {
        let e = error_of(&format!(r#"{{"mongohost": "{bad}", "database": "d"}}"#));
        assert!(e.contains("`mongohost`"), "{bad}: {e}");
    }
}

#[test]
fn a_bare_mongohost_password_is_masked_everywhere() {
    let text = r#"{"mongohost": "u:Bare-Host-Pw1@db1:27017,db2", "database": "d"}"#;
    let c = parse(text).expect("ok").config;
    assert!(!format!("{c:?}").contains("Bare-Host-Pw1"));
    assert_eq!(
        disbatch_model::text::redact::redact("x Bare-Host-Pw1 y"),
        "x *** y"
    );
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
