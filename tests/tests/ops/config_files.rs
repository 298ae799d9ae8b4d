//! The files around a config: a FIFO or a device where a config or token file should be, a
//! deleted token file, the runners' config copies a killed node leaves, and the warnings
//! about secrets others can read and plugins run as root.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use disbatch_tests::bench::procfs;
use disbatch_tests::wait_for_log;
use disbatch_tests::{wait_for, write_config, Dci, Den, Launch, TestDb};
use serde_json::json;

const TOKEN: &str = "file-token-0123456789abcdef";

fn mkfifo(path: &Path) {
    let made = Command::new("mkfifo").arg(path).status().expect("mkfifo");
    assert!(made.success(), "mkfifo {}", path.display());
}

fn log_of(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

fn web_config(db: &TestDb, tokens: serde_json::Value) -> PathBuf {
    write_config(db, "web.json", json!({"web": {"tokens": tokens}}))
}

fn launch_dci(config: &Path, log: &Path) -> Dci {
    Dci::launch(
        config,
        Launch {
            log_file: Some(log.to_path_buf()),
            rust_log: Some("info".into()),
            ..Launch::default()
        },
    )
}

#[tokio::test]
async fn a_fifo_token_file_is_refused_on_reload_and_healthz_still_answers() {
    let db = TestDb::new("files_fifo_token").await;
    let inline = json!([{"name": "inline", "role": "read", "token": TOKEN}]);
    let config = web_config(&db, inline.clone());
    let log = db.path("dci.log");
    let mut dci = launch_dci(&config, &log);
    let fifo = db.path("fifo.token");
    mkfifo(&fifo);
    let with_fifo = json!([{"name": "inline", "role": "read", "token": TOKEN},
        {"name": "fifo", "role": "read", "token_file": "fifo.token"}]);
    web_config(&db, with_fifo);
    dci.hangup();
    wait_for_log("the refusal", || log_of(&log), "config reload refused", 1).await;
    let text = log_of(&log);
    assert!(
        text.contains("web.tokens[1].token_file") && text.contains("not a regular file but a FIFO"),
        "the refusal names the key and why: {text}"
    );
    assert_eq!(dci.status_with_token("/healthz", TOKEN).await, 200);
    assert_eq!(
        dci.status_with_token("/queues", TOKEN).await,
        200,
        "the old tokens stay"
    );
    assert!(dci.is_running());
    drop(dci);
    db.drop().await;
}

async fn heartbeat(db: &TestDb, node: &str) -> bson::DateTime {
    let doc = db.node(node).await;
    doc.get_datetime("timestamp")
        .copied()
        .unwrap_or_else(|e| panic!("no heartbeat time ({e}): {doc}"))
}

async fn wait_heartbeat_after(db: &TestDb, node: &str, after: bson::DateTime) {
    wait_for("a later heartbeat", Duration::from_secs(30), || async {
        heartbeat(db, node).await > after
    })
    .await;
}

#[tokio::test]
async fn a_fifo_or_dev_zero_as_the_config_is_refused_on_reload_and_heartbeats_go_on() {
    let db = TestDb::new("files_fifo_config").await;
    let config = write_config(&db, "node.json", json!({}));
    let den = Den::start(&config, "n1");
    for (kind, replace, said) in [
        (
            "a FIFO",
            mkfifo as fn(&Path),
            "not a regular file but a FIFO",
        ),
        (
            "/dev/zero",
            |at: &Path| std::os::unix::fs::symlink("/dev/zero", at).expect("symlink"),
            "not a regular file but a character device",
        ),
    ] {
        std::fs::remove_file(&config).expect("remove the config");
        replace(&config);
        let refusals = den.log_text().matches("config reload refused").count();
        den.hangup();
        wait_for_log(
            kind,
            || den.log_text(),
            "config reload refused",
            refusals + 1,
        )
        .await;
        let text = den.log_text();
        assert!(text.contains(said), "{kind}: the refusal says why: {text}");
        let before = heartbeat(&db, "n1").await;
        wait_heartbeat_after(&db, "n1", before).await;
    }
    let peak = procfs::peak_rss_kib(den.pid().as_raw() as u32);
    println!("disbatchd peak RSS after the reloads: {peak:?} KiB");
    drop(den);
    db.drop().await;
}

#[tokio::test]
async fn deleting_a_token_file_revokes_its_token_on_reload() {
    let db = TestDb::new("files_revoke").await;
    let file = db.path("only.token");
    std::fs::write(&file, format!("{TOKEN}\n")).expect("token file");
    let only = json!([{"name": "only", "role": "read", "token_file": "only.token"}]);
    let config = web_config(&db, only);
    let log = db.path("dci.log");
    let mut dci = launch_dci(&config, &log);
    assert_eq!(dci.status_with_token("/queues", TOKEN).await, 200);
    std::fs::remove_file(&file).expect("delete the token file");
    dci.hangup();
    wait_for_log("the refusal", || log_of(&log), "config reload refused", 1).await;
    assert_eq!(
        dci.status_with_token("/queues", TOKEN).await,
        401,
        "the token of the deleted file is refused"
    );
    let text = log_of(&log);
    assert!(text.contains("\"only\" revoked"), "says so: {text}");
    let none = dci
        .http
        .get(dci.at("/queues"))
        .send()
        .await
        .expect("request");
    assert_eq!(
        none.status().as_u16(),
        401,
        "no token left does not open the API"
    );
    assert!(dci.is_running());
    drop(dci);
    db.drop().await;
}

/// The runners' config copy of the node with this pid, under the runtime directory `run`.
fn copy_of(run: &Path, pid: nix::unistd::Pid) -> PathBuf {
    run.join(format!("den-{pid}")).join("config.json")
}

#[tokio::test]
async fn a_killed_nodes_config_copy_is_removed_by_the_next_start_and_a_live_ones_kept() {
    let db = TestDb::new("files_copies").await;
    let config = write_config(&db, "node.json", json!({}));
    let run = db.path("run");
    std::fs::create_dir(&run).expect("runtime dir");
    let env = [("RUNTIME_DIRECTORY", run.to_str().expect("utf-8 path"))];
    let live = Den::start_with_env(&config, "live", &env);
    let mut killed = Den::start_with_env(&config, "killed", &env);
    let (live_copy, killed_copy) = (copy_of(&run, live.pid()), copy_of(&run, killed.pid()));
    for copy in [&live_copy, &killed_copy] {
        assert!(copy.exists(), "{} is there", copy.display());
    }
    killed.kill_hard();
    assert!(killed_copy.exists(), "SIGKILL leaves the copy");
    let next = Den::start_with_env(&config, "next", &env);
    assert!(
        !killed_copy.exists(),
        "the killed node's copy is removed: {}",
        next.log_text()
    );
    assert!(live_copy.exists(), "the live node's copy is kept");
    assert!(copy_of(&run, next.pid()).exists());
    drop((live, next));
    db.drop().await;
}

#[tokio::test]
async fn readable_secret_files_and_root_without_plugin_user_are_warned_about() {
    let db = TestDb::new("files_warnings").await;
    let uri = db.path("uri");
    std::fs::write(&uri, format!("{}\n", db.uri)).expect("uri file");
    let token = db.path("web.token");
    std::fs::write(&token, format!("{TOKEN}\n")).expect("token file");
    for file in [&uri, &token] {
        let mode = std::os::unix::fs::PermissionsExt::from_mode(0o644);
        std::fs::set_permissions(file, mode).expect("chmod");
    }
    let extra = json!({"mongohost_file": "uri",
        "web": {"tokens": [{"name": "w", "role": "read", "token_file": "web.token"}]}});
    let config = write_config(&db, "node.json", json!({}));
    let mut value: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&config).expect("config")).expect("json");
    value.as_object_mut().expect("object").remove("mongohost");
    for (k, v) in extra.as_object().expect("object") {
        value[k] = v.clone();
    }
    std::fs::write(&config, value.to_string()).expect("config");
    let den = Den::start(&config, "n1");
    let text = den.log_text();
    assert!(
        text.contains("`mongohost_file`") && text.contains("readable by every user (mode 0644)"),
        "{text}"
    );
    if nix::unistd::geteuid().is_root() {
        assert!(text.contains("plugins run as root"), "{text}");
    }
    drop(den);
    let log = db.path("dci.log");
    let dci = launch_dci(&config, &log);
    let text = log_of(&log);
    assert!(
        text.contains("web token \"w\"") && text.contains("readable by every user"),
        "{text}"
    );
    drop(dci);
    db.drop().await;
}

#[tokio::test]
async fn a_fifo_as_the_config_stops_the_start_with_a_clear_error() {
    let db = TestDb::new("files_fifo_start").await;
    let config = db.path("node.json");
    mkfifo(&config);
    let mut den = Den::start(&config, "n1");
    assert!(!den.is_running(), "{}", den.log_text());
    let text = den.log_text();
    assert!(text.contains("not a regular file but a FIFO"), "{text}");
    drop(den);
    db.drop().await;
}
