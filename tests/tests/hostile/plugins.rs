//! Plugins that spy on their runner and node: environments, command lines, the config file,
//! inherited descriptors and the spool must give a plugin none of the node's secrets.

use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bson::oid::ObjectId;
use bson::{doc, Document};
use disbatch_config::plugin_env::PluginEnv;
use disbatch_model::status;
use disbatch_tests::running_process;
use disbatch_tests::{bin_path, write_config, Den, TestDb};
use serde_json::{json, Value};

const NOBODY: u32 = 65534;
/// Where the node hands a test its own inherited secret: fd 3 is also the runner's answer
/// pipe, so the node must neither pass its copy on nor trip over it.
const INHERITED_FDS: [i32; 2] = [3, 9];

/// Marker values a plugin must never see, each named for the report.
struct Secrets {
    aws: String,
    mongo: String,
    fd: String,
    config: String,
}

impl Secrets {
    fn new() -> Secrets {
        let tag = ObjectId::new().to_hex();
        Secrets {
            aws: format!("aws-s3cr3t-{tag}"),
            mongo: format!("mongo-s3cr3t-{tag}"),
            fd: format!("fd-s3cr3t-{tag}"),
            config: format!("config-s3cr3t-{tag}"),
        }
    }

    /// The node's environment: what an operator's shell or unit file might hold.
    fn env(&self) -> Vec<(&str, &str)> {
        vec![
            ("AWS_SECRET_ACCESS_KEY", self.aws.as_str()),
            ("MONGO_PASSWORD", self.mongo.as_str()),
            ("TMPDIR", "/tmp"),
        ]
    }

    /// The markers found in `text`, by name.
    fn found_in(&self, text: &str, with_config: bool) -> Vec<&'static str> {
        let mut all = vec![
            ("env AWS_SECRET_ACCESS_KEY", &self.aws),
            ("env MONGO_PASSWORD", &self.mongo),
            ("inherited descriptor", &self.fd),
        ];
        if with_config {
            all.push(("config file", &self.config));
        }
        all.into_iter()
            .filter(|(_, m)| text.contains(m.as_str()))
            .map(|(n, _)| n)
            .collect()
    }
}

/// The test's directory, traversable by `nobody` (tempdirs are 0700).
fn open_dir(db: &TestDb) -> PathBuf {
    let dir = db.dir.path().to_path_buf();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod dir");
    dir
}

/// Whether `nobody` can execute `path` (every directory above it must let it through).
fn nobody_can_run(path: &Path) -> bool {
    Command::new("/bin/sh")
        .args(["-c", "test -x \"$1\"", "sh"])
        .arg(path)
        .uid(NOBODY)
        .gid(NOBODY)
        .status()
        .is_ok_and(|s| s.success())
}

/// A workspace binary `nobody` can run: in place when the target directory lets it through,
/// else a copy in the test's directory.
fn runnable_by_nobody(dir: &Path, name: &str) -> PathBuf {
    let built = bin_path(name);
    if nobody_can_run(&built) {
        return built;
    }
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).expect("mkdir bin");
    let copy = bin.join(name);
    std::fs::copy(&built, &copy).expect("copy binary");
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    assert!(
        nobody_can_run(&copy),
        "nobody cannot run {}",
        copy.display()
    );
    copy
}

/// A file holding the descriptor secret, readable only by root: a plugin can see it only
/// through a descriptor it inherited.
fn secret_file(dir: &Path, secrets: &Secrets) -> std::fs::File {
    let path = dir.join("inherited-secret");
    std::fs::write(&path, &secrets.fd).expect("write secret");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    std::fs::File::open(&path).expect("open secret")
}

/// Makes the node inherit `file` at INHERITED_FDS without close-on-exec, as a shell's stray
/// descriptor would be.
fn inherit(cmd: &mut Command, file: &std::fs::File) {
    let fd = file.as_raw_fd();
    // SAFETY: dup2 is async-signal-safe; `file` stays open until the node has started.
    unsafe {
        cmd.pre_exec(move || {
            for to in INHERITED_FDS {
                if nix::libc::dup2(fd, to) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
}

/// The config every case shares: the spy and echo plugins, a web token as the config's
/// secret, runner and plugins as given.
fn node_config(db: &TestDb, runner: &Path, spy: &Path, secrets: &Secrets, extra: Value) -> PathBuf {
    let mut config = json!({
        "plugins": {"spy": spy, "echo": bin_path("disbatch-plugin-echo")},
        "task_runner": runner,
        "web": {"tokens": [{"name": "ops", "role": "read", "token": secrets.config}]},
    });
    if let (Some(base), Value::Object(extra)) = (config.as_object_mut(), extra) {
        base.extend(extra);
    }
    write_config(db, "node.json", config)
}

/// Runs one spy task; returns its task document and the spy's report (its stdout).
async fn run_spy(db: &TestDb, den: &Den, queue: ObjectId, params: Document) -> (Document, Value) {
    let mut params = params;
    params.insert("den_pid", den.pid().as_raw());
    let id = db.insert_tasks(queue, vec![params.into()]).await[0];
    db.wait_complete(&[id], Duration::from_secs(60)).await;
    let task = db.task(id).await;
    let stdout = task.get_str("stdout").unwrap_or_default();
    let report: Value = serde_json::from_str(stdout.trim()).unwrap_or(Value::Null);
    // The spy looked at the right processes: its parent is the runner, and the node's pid.
    let runner_cmdline = report["runner"]["cmdline"].to_string();
    if report.is_object() {
        assert!(
            runner_cmdline.contains("disbatch-task-runner"),
            "the spy's parent is not a runner: {runner_cmdline}"
        );
        assert_eq!(report["den"]["pid"], den.pid().as_raw(), "{report}");
    }
    (task, report)
}

/// What the spy got, in numbers, for the log and the assertions.
#[derive(Debug)]
struct Findings {
    secrets: Vec<&'static str>,
    own_fds: usize,
    runner_environ: bool,
    den_environ: bool,
    runner_fds: bool,
    den_fds: bool,
    config_read: bool,
    /// Environment names outside the allow-list and DISBATCH_*.
    extra_env: Vec<String>,
}

/// No secret, descriptor, foreign `/proc` file or unlisted variable reached the plugin.
fn assert_nothing_leaked(found: &Findings, report: &Value) {
    assert_eq!(
        found.secrets,
        Vec::<&str>::new(),
        "secrets reached the plugin: {report:#}"
    );
    assert_eq!(
        found.own_fds, 0,
        "the plugin inherited descriptors: {}",
        report["own_fds"]
    );
    assert!(
        !found.runner_environ,
        "runner environ: {}",
        report["runner"]["environ"]
    );
    assert!(
        !found.den_environ,
        "node environ: {}",
        report["den"]["environ"]
    );
    assert!(!found.runner_fds, "runner fds: {}", report["runner"]["fds"]);
    assert!(!found.den_fds, "node fds: {}", report["den"]["fds"]);
    assert_eq!(found.extra_env, Vec::<String>::new(), "{}", report["env"]);
}

fn findings(report: &Value, stdout: &str, secrets: &Secrets, with_config: bool) -> Findings {
    // Only a refusal counts as unread: a missing file or a wrong pid proves nothing.
    let readable = |v: &Value| {
        !v["error"]
            .as_str()
            .is_some_and(|e| e.contains("Permission denied"))
    };
    let env = PluginEnv::default();
    Findings {
        secrets: secrets.found_in(stdout, with_config),
        own_fds: report["own_fds"].as_array().map_or(usize::MAX, Vec::len),
        runner_environ: readable(&report["runner"]["environ"]),
        den_environ: readable(&report["den"]["environ"]),
        runner_fds: readable(&report["runner"]["fds"]),
        den_fds: readable(&report["den"]["fds"]),
        config_read: readable(&report["runner"]["config"]["read"]),
        extra_env: report["env"]
            .as_object()
            .map(|m| {
                m.keys()
                    .filter(|k| !k.starts_with("DISBATCH_") && !env.allows(k))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default(),
    }
}

/// Case A: a node running as `nobody`, its plugins as the same user. The plugin may read the
/// config (documented), but no environment of its runner or node, no descriptor beyond
/// 0-2 and no variable outside the allow-list.
#[tokio::test]
async fn a_plugin_of_a_same_user_node_reads_no_environment_and_inherits_no_descriptor() {
    let db = TestDb::new("spy_same_user").await;
    let secrets = Secrets::new();
    let dir = open_dir(&db);
    let den_bin = runnable_by_nobody(&dir, "disbatchd");
    let runner = runnable_by_nobody(&dir, "disbatch-task-runner");
    let spy = runnable_by_nobody(&dir, "disbatch-spy-plugin");
    let config = node_config(&db, &runner, &spy, &secrets, json!({}));
    let queue = db.insert_queue("spy", "spy", 1).await;
    let secret = secret_file(&dir, &secrets);
    let den = Den::start_adjusted(&den_bin, &config, "spy-node", &secrets.env(), |cmd| {
        cmd.uid(NOBODY).gid(NOBODY);
        inherit(cmd, &secret);
    });
    drop(secret);
    let (task, report) = run_spy(&db, &den, queue, doc! {}).await;
    let stdout = task.get_str("stdout").unwrap_or_default();
    let found = findings(&report, stdout, &secrets, false);
    println!("same-user node, spy findings: {found:#?}");
    assert_eq!(
        task.get_i32("status"),
        Ok(status::SUCCEEDED),
        "{task}\nDEN log:\n{}",
        den.log_text()
    );
    assert!(report.is_object(), "the spy's report is not JSON: {stdout}");
    assert_eq!(
        report["status"]["uid"], "65534 65534 65534 65534",
        "{report}"
    );
    assert_nothing_leaked(&found, &report);
    assert_eq!(
        spy_result(&db, &task).await.as_deref(),
        Some("wrote-result")
    );
    drop(den);
    db.drop().await;
}

/// What the spy's result file said, as the attempt record keeps it.
async fn spy_result(db: &TestDb, task: &Document) -> Option<String> {
    let id = task.get_object_id("_id").ok()?;
    let attempt = db.closed_attempts(id, 1).await.pop()?;
    let result = attempt.get_document("result").ok()?;
    result.get_str("spy").ok().map(str::to_string)
}

/// Case B: a root node with `plugin_user: "nobody"` and its config 0600. The plugin runs as
/// nobody, reads neither the config nor any environment, inherits nothing, and still
/// delivers its output and result file; links it puts in the spool are never followed.
#[tokio::test]
async fn a_plugin_run_as_plugin_user_reads_no_config_and_follows_no_link_into_the_spool() {
    let db = TestDb::new("spy_plugin_user").await;
    let secrets = Secrets::new();
    let dir = open_dir(&db);
    let spy = runnable_by_nobody(&dir, "disbatch-spy-plugin");
    let runner = bin_path("disbatch-task-runner");
    let config = node_config(
        &db,
        &runner,
        &spy,
        &secrets,
        json!({"plugin_user": "nobody"}),
    );
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let queue = db.insert_queue("spy", "spy", 2).await;
    let secret = secret_file(&dir, &secrets);
    let shadow = std::fs::read("/etc/shadow").expect("read /etc/shadow as root");
    let den = Den::start_adjusted(
        &bin_path("disbatchd"),
        &config,
        "spy-root",
        &secrets.env(),
        |cmd| inherit(cmd, &secret),
    );
    drop(secret);

    let (task, report) = run_spy(&db, &den, queue, doc! {}).await;
    let stdout = task.get_str("stdout").unwrap_or_default();
    let found = findings(&report, stdout, &secrets, true);
    println!("plugin_user node, spy findings: {found:#?}");
    assert_eq!(
        task.get_i32("status"),
        Ok(status::SUCCEEDED),
        "{task}\nDEN log:\n{}",
        den.log_text()
    );
    assert!(report.is_object(), "the spy's report is not JSON: {stdout}");
    assert_eq!(
        report["status"]["uid"], "65534 65534 65534 65534",
        "{report}"
    );
    assert_eq!(
        report["status"]["gid"], "65534 65534 65534 65534",
        "{report}"
    );
    assert_eq!(report["status"]["groups"], "65534", "{report}");
    let nobody = nix::unistd::User::from_name("nobody")
        .expect("passwd")
        .expect("nobody");
    assert_eq!(report["env"]["HOME"], nobody.dir.to_string_lossy().as_ref());
    assert_eq!(report["env"]["USER"], "nobody");
    assert_eq!(report["env"]["LOGNAME"], "nobody");
    assert_nothing_leaked(&found, &report);
    assert!(!found.config_read, "config: {}", report["runner"]["config"]);
    assert_eq!(report["wrote_result"], true, "{report}");
    assert_eq!(
        spy_result(&db, &task).await.as_deref(),
        Some("wrote-result")
    );

    let (task, report) = run_spy(&db, &den, queue, doc! {"attack_spool": true}).await;
    println!("spool attack: {}", report["attack"]);
    let (stdout, stderr) = (
        task.get_str("stdout").unwrap_or_default(),
        task.get_str("stderr").unwrap_or_default(),
    );
    assert_eq!(task.get_i32("status"), Ok(status::FAILED), "{task}");
    assert!(
        stderr.contains("DISBATCH_RESULT file ignored: it is a symbolic link"),
        "{stderr}"
    );
    let result = report["env"]["DISBATCH_RESULT"]
        .as_str()
        .unwrap_or_default();
    let spool = Path::new(result)
        .ancestors()
        .nth(2)
        .expect("spool directory");
    for name in ["stdout", "stderr"] {
        let key = spool.join(name).display().to_string();
        assert!(
            report["attack"][&key]["error"].is_string(),
            "the plugin replaced {key}: {}",
            report["attack"]
        );
    }
    let shadow_text = String::from_utf8_lossy(&shadow);
    for line in shadow_text.lines().filter(|l| !l.trim().is_empty()) {
        assert!(
            !stdout.contains(line) && !stderr.contains(line),
            "/etc/shadow reached the task"
        );
    }
    assert_eq!(
        std::fs::read("/etc/shadow").expect("read"),
        shadow,
        "/etc/shadow changed"
    );
    drop(den);
    db.drop().await;
}

/// Case C: `plugin_user` needs root. A node that is not root refuses to start, naming the key
/// and the file; a runner started by hand as another user fails its task saying why.
#[tokio::test]
async fn plugin_user_without_root_is_refused_by_the_node_and_the_runner() {
    let db = TestDb::new("plugin_user_not_root").await;
    let secrets = Secrets::new();
    let dir = open_dir(&db);
    let den_bin = runnable_by_nobody(&dir, "disbatchd");
    let runner = runnable_by_nobody(&dir, "disbatch-task-runner");
    let spy = runnable_by_nobody(&dir, "disbatch-spy-plugin");
    let config = node_config(
        &db,
        &runner,
        &spy,
        &secrets,
        json!({"plugin_user": "nobody"}),
    );

    let out = run_as_nobody(
        &den_bin,
        &["--config", &config.display().to_string(), "--node", "n1"],
    )
    .await;
    let (code, text) = out.expect("disbatchd should refuse at once");
    assert_ne!(code, Some(0), "{text}");
    assert!(
        text.contains("`plugin_user`")
            && text.contains("root")
            && text.contains(&config.display().to_string()),
        "the refusal should name `plugin_user`, root and {}: {text}",
        config.display()
    );

    let queue = db.insert_queue("spy", "spy", 1).await;
    let task = db.insert_tasks(queue, vec![doc! {}.into()]).await[0];
    db.set_task(
        task,
        doc! {"status": -1, "node": "n1", "mtime": bson::DateTime::now()},
    )
    .await;
    let args = [
        "--config",
        &config.display().to_string(),
        "--task",
        &task.to_hex(),
        "--node",
        "n1",
    ];
    let (code, text) = run_as_nobody(&runner, &args)
        .await
        .expect("the runner finishes");
    let t = db.task(task).await;
    assert_eq!(t.get_i32("status"), Ok(status::FAILED), "{t}\n{text}");
    assert_eq!(t.get_str("stdout"), Ok("Unable to start"), "{t}");
    let stderr = t.get_str("stderr").unwrap_or_default();
    assert!(
        stderr.contains("`plugin_user`") && stderr.contains("root"),
        "{stderr}"
    );
    assert_eq!(code, Some(0), "{text}");
    db.drop().await;
}

/// Runs `program` as nobody; its exit code and output, or Err when it is still running 60 s
/// (scaled) after its start: a refusal is an exit, however long a loaded machine takes to it.
/// Awaits the exit, so the test's runtime (its database client) keeps running meanwhile.
async fn run_as_nobody(program: &Path, args: &[&str]) -> Result<(Option<i32>, String), String> {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("out");
    let out = std::fs::File::create(&log).expect("log");
    let err = out.try_clone().expect("log");
    let mut child = Command::new(program)
        .args(args)
        .env("RUST_LOG", "info")
        .env("TMPDIR", "/tmp")
        .uid(NOBODY)
        .gid(NOBODY)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .expect("spawn");
    let deadline = Instant::now() + disbatch_tests::scaled(Duration::from_secs(60));
    let mut backoff = disbatch_tests::Backoff::new();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(std::fs::read_to_string(&log).unwrap_or_default());
        }
        backoff.wait().await;
    };
    Ok((
        status.code(),
        std::fs::read_to_string(&log).unwrap_or_default(),
    ))
}

/// What a plugin leaves running when it exits normally dies with its run: a background job
/// in its process group, and a daemon in a session of its own, which would otherwise write
/// into files and outputs that are no longer its own.
#[tokio::test]
async fn what_a_plugin_leaves_running_dies_with_its_run() {
    let db = TestDb::new("leftovers").await;
    let dir = db.path("pids");
    std::fs::create_dir_all(&dir).expect("pids dir");
    let plugin = db.script(
        "leaves.sh",
        &format!(
            r#"d={dir}
sh -c 'echo $$ > "$1.tmp"; mv "$1.tmp" "$1"; exec sleep 600' sh "$d/job" &
setsid sh -c 'echo $$ > "$1.tmp"; mv "$1.tmp" "$1"; exec sleep 600' sh "$d/daemon" &
while [ ! -s "$d/job" ] || [ ! -s "$d/daemon" ]; do sleep 0.05; done
exit 0"#,
            dir = dir.display()
        ),
    );
    let config = write_config(&db, "node.json", json!({"plugins": {"leaves": plugin}}));
    let queue = db.insert_queue("leaves", "leaves", 1).await;
    let task = db.insert_tasks(queue, vec![doc! {}.into()]).await[0];
    let den = Den::start(&config, "n1");
    db.wait_complete(&[task], Duration::from_secs(60)).await;
    assert_eq!(
        db.task(task).await.get_i32("status").ok(),
        Some(status::SUCCEEDED)
    );
    let pid = |name: &str| -> u32 {
        std::fs::read_to_string(dir.join(name))
            .expect("the pid file")
            .trim()
            .parse()
            .expect("a pid")
    };
    let (job, daemon) = (pid("job"), pid("daemon"));
    disbatch_tests::wait_for("the leftovers gone", Duration::from_secs(30), || async {
        !running_process(job) && !running_process(daemon)
    })
    .await;
    drop(den);
    db.drop().await;
}
