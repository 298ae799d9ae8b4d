use std::path::Path;

use super::*;

fn check(text: &str) -> std::result::Result<Loaded, Vec<String>> {
    let value = relaxed::parse_relaxed_json(text).expect("relaxed JSON");
    check::all_problems(Path::new("/etc/disbatch/config.json"), value)
}

#[test]
fn a_good_config_checks_like_it_loads() {
    let text = r#"{"mongohost": "mongodb://db", "database": "d", "log_format": "json",
        "log_level": "info,disbatch_den=debug"}"#;
    let c = check(text).expect("good config").config;
    assert_eq!(c.log_format, Some(crate::process::logging::LogFormat::Json));
    assert_eq!(c.log_level.as_deref(), Some("info,disbatch_den=debug"));
    let loaded = Config::parse(Path::new("/c.json"), text).expect("loads");
    assert_eq!(loaded.config.log_format, c.log_format);
}

#[test]
fn every_problem_is_listed_by_its_key() {
    let text = r#"{"mongohost": "mongodb://db", "loop_interval_ms": 5,
        "activequeues": ["not-a-queue"], "log_format": "xml", "log_level": "info,[",
        "dead_node_after_s": "soon", "web": {"max_body_bytes": "big", "live_window_ms": -1}}"#;
    let problems = check(text).expect_err("bad config");
    for key in [
        "database",
        "loop_interval_ms",
        "activequeues",
        "log_format",
        "log_level",
        "dead_node_after_s",
        "web.max_body_bytes",
        "web.live_window_ms",
    ] {
        assert!(
            problems.iter().any(|p| p.contains(&format!("key `{key}`"))),
            "{key} missing from {problems:#?}"
        );
    }
    let about_dead = problems
        .iter()
        .filter(|p| p.contains("dead_node_after_s"))
        .count();
    assert_eq!(about_dead, 1, "{problems:#?}");
}

#[test]
fn load_still_reports_the_first_problem_only() {
    let text = r#"{"mongohost": "mongodb://db", "loop_interval_ms": 5, "log_format": "xml"}"#;
    let e = Config::parse(Path::new("/c.json"), text)
        .expect_err("refused")
        .to_string();
    assert!(e.contains("key `database` is required"), "{e}");
    assert!(!e.contains("log_format"), "{e}");
}
