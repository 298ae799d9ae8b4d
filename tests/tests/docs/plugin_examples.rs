//! The example plugins the book shows (docs/src/plugins/examples/, included by
//! docs/src/plugins/examples.md), each run through a real node as an operator would install
//! it: two tasks greet and warn, two with bad params fail with the plugin's reason.

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use bson::{doc, Bson};
use disbatch_model::status;
use disbatch_tests::{write_config, Den, TestDb};
use serde_json::json;

/// What every example prints on stderr for bad params, before it exits 3.
const REFUSAL: &str =
    "hello: params.name must be 1 to 64 letters, digits, spaces, '.', '_' or '-'\n";

fn example(file: &str) -> PathBuf {
    disbatch_tests::docs::repo_root()
        .join("docs/src/plugins/examples")
        .join(file)
}

/// Copies an example script into the test's directory, executable, as an operator installs
/// a plugin (the checkout's file mode is not the test's to rely on).
fn install(db: &TestDb, file: &str) -> PathBuf {
    let path = db.path(file);
    std::fs::copy(example(file), &path).expect("copy the example");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    path
}

/// Whether `program` runs here; says so when it does not, for a test that then skips.
fn runs(program: &str, args: &[&str], test: &str) -> bool {
    let ok = Command::new(program)
        .args(args)
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!("SKIPPED {test}: {program} is not installed");
    }
    ok
}

/// Runs the plugin `plugin` through a node and checks what the book says each example does.
async fn greets_and_refuses(db: TestDb, plugin: PathBuf) {
    let config = write_config(&db, "node.json", json!({"plugins": {"hello": plugin}}));
    let queue = db.insert_queue("greetings", "hello", 2).await;
    let names = ["Ada", "Grace Hopper"];
    let good = db
        .insert_tasks(
            queue,
            names.iter().map(|n| doc! {"name": *n}.into()).collect(),
        )
        .await;
    let bad = db
        .insert_tasks(
            queue,
            vec![
                doc! {"nom": "Ada"}.into(),
                doc! {"name": "Ada; rm -rf /"}.into(),
            ],
        )
        .await;
    let den = Den::start(&config, "n1");
    let all: Vec<_> = good.iter().chain(&bad).copied().collect();
    db.wait_complete(&all, Duration::from_secs(60)).await;

    for (id, name) in good.iter().zip(names) {
        let task = db.task(*id).await;
        assert_eq!(
            task.get_i32("status").ok(),
            Some(status::SUCCEEDED),
            "{task}"
        );
        assert_eq!(
            task.get_str("stdout").ok(),
            Some(format!("Hello, {name}!\n").as_str()),
            "{task}"
        );
        assert_eq!(
            task.get_str("stderr").ok(),
            Some(format!("warning: an example greeting for task {}\n", id.to_hex()).as_str()),
            "a warning on stderr does not fail the task: {task}"
        );
        let attempt = &db.closed_attempts(*id, 1).await[0];
        assert_eq!(attempt.get_i32("exit_code").ok(), Some(0), "{attempt}");
        assert_eq!(
            attempt.get_document("result").ok(),
            Some(&doc! {"output": {"greeted": name}}),
            "the result file is kept on the attempt record: {attempt}"
        );
    }
    for id in &bad {
        let task = db.task(*id).await;
        assert_eq!(task.get_i32("status").ok(), Some(status::FAILED), "{task}");
        assert_eq!(task.get("stdout"), Some(&Bson::Null), "no output: {task}");
        assert_eq!(
            task.get_str("stderr").ok(),
            Some(format!("{REFUSAL}[disbatch] plugin exited with code 3\n").as_str()),
            "{task}"
        );
        let attempt = &db.closed_attempts(*id, 1).await[0];
        assert_eq!(attempt.get_str("outcome").ok(), Some("failed"), "{attempt}");
        assert_eq!(attempt.get_i32("exit_code").ok(), Some(3), "{attempt}");
    }
    drop(den);
    db.drop().await;
}

#[tokio::test]
async fn the_shell_example_greets_and_refuses_bad_params() {
    let db = TestDb::new("docs_hello_sh").await;
    let plugin = install(&db, "hello.sh");
    greets_and_refuses(db, plugin).await;
}

#[tokio::test]
async fn the_python_example_greets_and_refuses_bad_params() {
    if !runs("python3", &["--version"], "the Python example") {
        return;
    }
    let db = TestDb::new("docs_hello_py").await;
    let plugin = install(&db, "hello.py");
    greets_and_refuses(db, plugin).await;
}

#[tokio::test]
async fn the_perl_example_greets_and_refuses_bad_params() {
    if !runs("perl", &["-e1"], "the Perl example") {
        return;
    }
    // JSON::PP is a core module: a perl without it is a broken install, not a skip.
    let check = Command::new("perl")
        .args(["-MJSON::PP", "-e1"])
        .output()
        .expect("run perl");
    assert!(
        check.status.success(),
        "perl lacks its core module JSON::PP: {}",
        String::from_utf8_lossy(&check.stderr)
    );
    let db = TestDb::new("docs_hello_pl").await;
    let plugin = install(&db, "hello.pl");
    greets_and_refuses(db, plugin).await;
}

#[tokio::test]
async fn the_rust_example_builds_with_rustc_alone_greets_and_refuses_bad_params() {
    let db = TestDb::new("docs_hello_rs").await;
    let plugin = db.path("hello");
    // std only: rustc alone builds it, as the page says.
    let built = Command::new("rustc")
        .args(["--edition", "2021", "-D", "warnings", "-o"])
        .arg(&plugin)
        .arg(example("hello.rs"))
        .output()
        .expect("run rustc (every machine that builds this project has it)");
    assert!(
        built.status.success(),
        "rustc could not build hello.rs:\n{}",
        String::from_utf8_lossy(&built.stderr)
    );
    greets_and_refuses(db, plugin).await;
}
