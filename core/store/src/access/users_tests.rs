//! Tests of `users.rs`.

use super::*;

fn set(actions: &[&str]) -> BTreeSet<String> {
    actions.iter().map(|a| a.to_string()).collect()
}

fn role<'a>(roles: &'a [RoleSpec], name: &str) -> &'a RoleSpec {
    roles.iter().find(|r| r.name == name).expect("role exists")
}

#[test]
fn five_roles_named_like_the_users() {
    let roles = roles(&Perms::new(), &BTreeMap::new()).expect("roles");
    let names: Vec<&str> = roles.iter().map(|r| r.name).collect();
    assert_eq!(
        names,
        [
            "disbatchd",
            "disbatch_web",
            "task_runner",
            "queuebalance",
            "plugin"
        ]
    );
}

#[test]
fn disbatchd_has_disbatch_table_plus_ours_and_nothing_else() {
    let roles = roles(&Perms::new(), &BTreeMap::new()).expect("roles");
    let den = &role(&roles, "disbatchd").privileges;
    let expected: Perms = [
        ("", set(&["find", "changeStream", "listIndexes"])),
        ("nodes", set(&["insert", "update", "createIndex"])),
        ("queues", set(&["update", "createIndex", "changeStream"])),
        ("tasks", set(&["insert", "update", "remove", "createIndex"])),
        ("tasks.chunks", set(&["remove", "createIndex"])),
        ("tasks.files", set(&["remove", "createIndex"])),
        (
            "attempts",
            set(&["insert", "update", "remove", "createIndex"]),
        ),
        ("leases", set(&["insert", "update"])),
        ("balance", set(&["insert", "update"])),
        ("task_counts", set(&["insert", "update"])),
        ("stats_minutely", set(&["insert", "update", "createIndex"])),
        (
            "rate_limits",
            set(&["insert", "update", "remove", "createIndex"]),
        ),
        ("batches", set(&["update"])),
    ]
    .into_iter()
    .map(|(c, a)| (c.to_string(), a))
    .collect();
    assert_eq!(den, &expected);
}

#[test]
fn least_privilege_where_it_matters() {
    let roles = roles(&Perms::new(), &BTreeMap::new()).expect("roles");
    let has = |r: &str, c: &str, a: &str| {
        role(&roles, r)
            .privileges
            .get(c)
            .is_some_and(|s| s.contains(a))
    };
    // Nobody may drop collections or the database.
    for r in &roles {
        for actions in r.privileges.values() {
            assert!(!actions.contains("dropCollection") && !actions.contains("dropDatabase"));
        }
    }
    // The runner reads everything but never removes tasks or touches nodes.
    assert!(has("task_runner", "", "find"));
    assert!(!has("task_runner", "tasks", "remove"));
    assert!(!has("task_runner", "nodes", "update"));
    assert!(has("task_runner", "attempts", "insert"));
    // The DCI removes tasks and their output (DELETE), and so does the DEN, for retention
    // only; neither removes queues or nodes besides that.
    assert!(has("disbatch_web", "tasks", "remove"));
    assert!(has("disbatch_web", "tasks.files", "remove"));
    assert!(has("disbatchd", "tasks", "remove"));
    assert!(!has("disbatchd", "queues", "remove") && !has("disbatchd", "nodes", "remove"));
    // QueueBalance keeps Disbatch's narrow set: no blanket find.
    assert!(!role(&roles, "queuebalance").privileges.contains_key(""));
    assert!(role(&roles, "plugin").privileges.is_empty());
}

#[test]
fn plugin_and_additional_perms_merge() {
    let plugin = parse_perms(
        r#"{"reports": ["insert"], // a comment
        }"#,
    )
    .expect("plugin perms");
    let additional =
        parse_additional(r#"{"disbatch_web": {"tasks": ["update", "find"], "reports": ["find"]}}"#)
            .expect("additional");
    let roles = roles(&plugin, &additional).expect("roles");
    assert_eq!(
        role(&roles, "plugin").privileges,
        [("reports".to_string(), set(&["insert"]))]
            .into_iter()
            .collect()
    );
    let web = &role(&roles, "disbatch_web").privileges;
    assert_eq!(
        web["tasks"],
        set(&["insert", "update", "remove", "createIndex", "find"])
    );
    assert_eq!(web["reports"], set(&["find"]));
}

#[test]
fn bad_perms_are_clear_errors() {
    let unknown = parse_additional(r#"{"root": {"tasks": ["update"]}}"#).expect("parses");
    let err = roles(&Perms::new(), &unknown).expect_err("unknown role");
    assert!(err.to_string().contains("\"root\""), "{err}");
    for (text, needle) in [
        (r#"{"reports": "insert"}"#, "collection \"reports\""),
        (r#"{"reports": [1]}"#, "collection \"reports\""),
        (r#"{"reports": [""]}"#, "collection \"reports\""),
        ("[1]", "top level"),
        ("{", "not valid JSON"),
    ] {
        let err = parse_perms(text).expect_err(text);
        assert!(err.to_string().contains(needle), "{text}: {err}");
    }
    let err = parse_additional(r#"{"plugin": ["insert"]}"#).expect_err("not an object");
    assert!(err.to_string().contains("role \"plugin\""), "{err}");
    // Disbatch's shipped example is comments only.
    assert!(parse_perms("// {\"reports\": [\"insert\"]}\n")
        .expect("empty")
        .is_empty());
}

#[test]
fn create_role_command_shape() {
    let spec = RoleSpec {
        name: "plugin",
        privileges: [
            ("".to_string(), set(&["find"])),
            ("reports".to_string(), set(&["update", "insert"])),
        ]
        .into_iter()
        .collect(),
    };
    let cmd = create_role_command("db1", &spec);
    assert_eq!(
        cmd,
        doc! {
            "createRole": "plugin",
            "privileges": [
                {"resource": {"db": "db1", "collection": ""}, "actions": ["find"]},
                {"resource": {"db": "db1", "collection": "reports"}, "actions": ["insert", "update"]},
            ],
            "roles": [],
        }
    );
    assert_eq!(spec.describe(), "\"\": find; \"reports\": insert, update");
}

#[test]
fn missing_password_names_the_user() {
    let text = r#"{"mongohost": "mongodb://localhost", "database": "d",
        "auth": {"disbatchd": "a", "disbatch_web": "b", "task_runner": "c", "queuebalance": "d"}}"#;
    let loaded = Config::parse(std::path::Path::new("/x/c.json"), text).expect("config");
    let err = passwords(&loaded.config).expect_err("plugin missing");
    assert!(err.to_string().contains("\"plugin\""), "{err}");
}
