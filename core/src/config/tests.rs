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
    let e = error_of(r#"{"mongohost": "localhost", "database": "d"}"#);
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
