//! The config's `attributes` and `mongohost` as the driver takes them.

use std::path::Path;
use std::time::Duration;

use disbatch_config::{Config, DriverOptions, Loaded};
use mongodb::options::{Acknowledgment, ClientOptions, ReadPreference, SelectionCriteria};

use super::*;

fn parse(text: &str) -> Loaded {
    Config::parse(Path::new("/etc/disbatch/config.json"), text).expect("config")
}

fn with(extra: &str) -> String {
    format!("{{\"mongohost\": \"mongodb://h\", \"database\": \"d\", {extra}}}")
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
    let loaded = parse(&with(ALL_ATTRIBUTES));
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
    apply(&loaded.config.driver, &mut o).expect("applied");
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
    assert_eq!(disbatch_model::text::redact::redact("Attr-Pass-123"), "***");
}

#[tokio::test]
async fn options_in_the_uri_win_over_attributes() {
    let loaded = parse(&with(
        r#""attributes": {"connect_timeout_ms": 1, "w": 2, "j": true, "replica_set_name": "a"}"#,
    ));
    let mut o = ClientOptions::parse("mongodb://h/?connectTimeoutMS=9&w=3&replicaSet=b")
        .await
        .expect("uri");
    apply(&loaded.config.driver, &mut o).expect("applied");
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
    apply(&DriverOptions::default(), &mut plain).expect("applied");
    assert_eq!(format!("{plain:?}"), before);
}

/// What only the driver can judge of `mongohost` is refused by `mongohost_problem` (a config
/// check) and at connection, naming the key, without the password.
#[tokio::test]
async fn a_mongohost_the_driver_refuses_is_a_config_problem_without_its_password() {
    for (bad, says) in [
        ("h:notaport", "not usable"),
        ("h:99999", "not usable"),
        ("u:Bare-Pw-123@h:1,", "not usable"),
        ("u:Bare-Host-Pw2@db1:x", "not usable"),
        ("mongodb://h/?tls=maybe", "tls"),
        ("db1:port", "not usable"),
        ("db1:27017,,db2:1/x/y", "not usable"),
    ] {
        let text = format!("{{\"mongohost\": {bad:?}, \"database\": \"d\"}}");
        let loaded = parse(&text);
        let e = mongohost_problem(&loaded.config).expect(bad);
        assert!(
            e.starts_with("key `mongohost`: ") && e.contains(says),
            "{bad}: {e}"
        );
        assert!(!e.contains("-Pw"), "{e}");
        let refused = crate::Store::connect(&loaded.config, disbatch_config::Component::Den)
            .await
            .expect_err(bad)
            .to_string();
        assert!(
            refused.starts_with("config file /etc/disbatch/config.json: key `mongohost`: ")
                && refused.contains(says)
                && !refused.contains("-Pw"),
            "{bad}: {refused}"
        );
    }
    let fine = parse(r#"{"mongohost": "mongodb://h", "database": "d"}"#);
    assert_eq!(mongohost_problem(&fine.config), None);
}
