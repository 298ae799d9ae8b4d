//! The worker protocol end to end (plugins/PROTOCOL.md): the noop and echo plugins and the
//! Python helper as persistent workers under the test supervisor, and the echo plugin's
//! process mode unchanged.

mod support;

use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{json, Value};
use support::{task, Ended, Worker};

fn command(path: &str) -> Command {
    let mut cmd = Command::new(path);
    cmd.env_clear().env("PATH", "/usr/bin:/bin");
    cmd
}

fn done(ended: &Ended) -> (i64, &Value) {
    match ended {
        Ended::Done { exit, result, .. } => (*exit, result),
        Ended::Died { status, stderr, .. } => panic!("worker died: {status:?} {stderr}"),
    }
}

#[test]
fn noop_serves_many_tasks_and_stops_when_asked() {
    let dir = tempfile::tempdir().expect("dir");
    let mut worker = Worker::start(
        command(env!("CARGO_BIN_EXE_disbatch-plugin-noop")),
        dir.path(),
    );
    assert_eq!(worker.ready["type"], "ready");
    assert_eq!(worker.ready["protocol"], 1);
    assert_eq!(worker.ready["pid"], worker.id());
    for n in 0..5 {
        let (doc, env, attempt) = task(n, json!({}));
        let ended = worker.run(&doc, &env, &attempt);
        assert_eq!(done(&ended), (0, &Value::Null));
        assert_eq!(ended.stdout(), "");
    }
    assert_eq!(worker.stop().code(), Some(0));
}

#[test]
fn a_closed_channel_stops_a_worker_cleanly() {
    let dir = tempfile::tempdir().expect("dir");
    let worker = Worker::start(
        command(env!("CARGO_BIN_EXE_disbatch-plugin-noop")),
        dir.path(),
    );
    assert_eq!(worker.close().code(), Some(0));
}

#[test]
fn a_wrong_version_or_a_missing_channel_is_refused() {
    let out = command(env!("CARGO_BIN_EXE_disbatch-plugin-noop"))
        .env("DISBATCH_WORKER_PROTOCOL", "2")
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a version"));
    let out = command(env!("CARGO_BIN_EXE_disbatch-plugin-noop"))
        .env("DISBATCH_WORKER_PROTOCOL", "1")
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("descriptor 3 is not open"),
        "{out:?}"
    );
}

#[test]
fn echo_keeps_each_tasks_output_facts_and_result_apart() {
    let dir = tempfile::tempdir().expect("dir");
    let runs = dir.path().join("runs.txt");
    let mut worker = Worker::start(
        command(env!("CARGO_BIN_EXE_disbatch-plugin-echo")),
        dir.path(),
    );
    let (doc, env, attempt) = task(
        1,
        json!({"print_env": ["DISBATCH_TASK_ID", "DISBATCH_RESULT"], "stderr": "oops\n",
               "result": {"status": 5, "output": {"k": 1}}, "exit_code": 3,
               "append_to": runs.to_string_lossy()}),
    );
    let first = worker.run(&doc, &env, &attempt);
    assert_eq!(done(&first), (3, &json!({"status": 5, "output": {"k": 1}})));
    let id = format!("{:024x}", 1);
    assert!(
        first.stdout().contains(&format!("DISBATCH_TASK_ID={id}\n")),
        "{first:?}"
    );
    assert!(
        first.stdout().contains("DISBATCH_RESULT unset\n"),
        "{first:?}"
    );
    assert_eq!(first.stderr(), "oops\n");
    assert_eq!(
        std::fs::read_to_string(&runs).expect("runs"),
        format!("{id}\n")
    );

    let (doc, env, attempt) = task(2, json!({"n": 2}));
    let second = worker.run(&doc, &env, &attempt);
    assert_eq!(done(&second), (0, &Value::Null));
    assert_eq!(second.stdout(), "{\"n\":2}\n", "only this task's output");
    assert_eq!(second.stderr(), "");

    let (doc, env, attempt) = task(3, json!({"sleep_ms": "soon"}));
    let bad = worker.run(&doc, &env, &attempt);
    assert_eq!(done(&bad).0, 2, "bad params fail the task, not the worker");
    assert!(bad.stderr().contains("params.sleep_ms must be"), "{bad:?}");
    assert_eq!(worker.stop().code(), Some(0));
}

#[test]
fn output_larger_than_a_pipe_cannot_block_a_worker() {
    let dir = tempfile::tempdir().expect("dir");
    let mut worker = Worker::start(
        command(env!("CARGO_BIN_EXE_disbatch-plugin-echo")),
        dir.path(),
    );
    // 4 000 lines of ~120 bytes: over 7 pipe buffers (64 KiB), written while nobody reads.
    let (doc, env, attempt) = task(1, json!({"lines": 4000, "line_pad": 100}));
    let big = worker.run(&doc, &env, &attempt);
    assert_eq!(done(&big).0, 0);
    assert_eq!(big.stdout().lines().count(), 4001, "params line + 4000");
    assert!(big.stdout().len() > 7 * 65536, "{}", big.stdout().len());
    let (doc, env, attempt) = task(2, json!({}));
    assert_eq!(worker.run(&doc, &env, &attempt).stdout(), "{}\n");
    assert_eq!(worker.stop().code(), Some(0));
}

#[test]
fn a_worker_dying_mid_task_is_seen_as_such() {
    let dir = tempfile::tempdir().expect("dir");
    let mut worker = Worker::start(
        command(env!("CARGO_BIN_EXE_disbatch-plugin-echo")),
        dir.path(),
    );
    let (doc, env, attempt) = task(1, json!({"abort": true, "result": {"status": 1}}));
    match worker.run(&doc, &env, &attempt) {
        Ended::Died { status, stdout, .. } => {
            assert_eq!(status.signal(), Some(6), "SIGABRT");
            assert!(
                stdout.contains("\"abort\":true"),
                "output up to the death is kept"
            );
        }
        other => panic!("expected a death: {other:?}"),
    }
}

#[test]
fn a_malformed_line_gets_an_error_and_exit_2() {
    let dir = tempfile::tempdir().expect("dir");
    let mut worker = Worker::start(
        command(env!("CARGO_BIN_EXE_disbatch-plugin-echo")),
        dir.path(),
    );
    worker.send_raw(b"{\"type\":\"task\"}\n");
    let error = worker.read_message().expect("error message");
    assert_eq!(error["type"], "error");
    assert!(
        error["message"]
            .as_str()
            .is_some_and(|m| m.contains("`task`")),
        "{error}"
    );
    assert_eq!(worker.wait().code(), Some(2));
}

#[test]
fn echo_process_mode_is_unchanged() {
    let dir = tempfile::tempdir().expect("dir");
    let result = dir.path().join("result.json");
    let mut child = command(env!("CARGO_BIN_EXE_disbatch-plugin-echo"))
        .env("DISBATCH_TASK_ID", "abc")
        .env("DISBATCH_RESULT", &result)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn");
    let task = json!({"params": {"print_env": ["DISBATCH_TASK_ID"], "result": {"status": 4}, "exit_code": 7}});
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(task.to_string().as_bytes())
        .expect("write");
    let out = child.wait_with_output().expect("wait");
    assert_eq!(out.status.code(), Some(7));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.ends_with("DISBATCH_TASK_ID=abc\n"), "{stdout}");
    assert_eq!(
        std::fs::read_to_string(&result).expect("result"),
        "{\"status\":4}"
    );
}

fn python() -> Option<PathBuf> {
    ["/usr/bin/python3", "/usr/local/bin/python3", "/bin/python3"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .or_else(|| {
            let out = Command::new("sh")
                .args(["-c", "command -v python3"])
                .output()
                .ok()?;
            let path = String::from_utf8(out.stdout).ok()?;
            let path = path.trim();
            (!path.is_empty()).then(|| PathBuf::from(path))
        })
}

fn example_py() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("python/example_worker.py")
}

#[test]
fn the_python_helper_speaks_the_protocol() {
    let Some(python) = python() else {
        eprintln!("no python3: skipped");
        return;
    };
    let dir = tempfile::tempdir().expect("dir");
    let mut cmd = Command::new(&python);
    cmd.env_clear()
        .env("PATH", "/usr/bin:/bin")
        .arg(example_py());
    let mut worker = Worker::start(cmd, dir.path());
    assert_eq!(worker.ready["protocol"], 1);

    let (doc, env, attempt) = task(1, json!({"a": 1}));
    let ok = worker.run(&doc, &env, &attempt);
    assert_eq!(done(&ok), (0, &json!({"output": {"echo": {"a": 1}}})));
    assert_eq!(
        ok.stdout(),
        format!("{:024x} {{\"a\": 1}}\n", 1),
        "facts in os.environ"
    );

    let (doc, env, attempt) = task(2, json!({"raise": true}));
    let raised = worker.run(&doc, &env, &attempt);
    assert_eq!(done(&raised), (1, &Value::Null));
    assert!(
        raised.stderr().contains("RuntimeError: asked to raise"),
        "{raised:?}"
    );

    let (doc, env, attempt) = task(3, json!({"fail": true}));
    let failed = worker.run(&doc, &env, &attempt);
    assert_eq!(done(&failed), (3, &Value::Null));
    assert_eq!(failed.stderr(), "asked to fail\n");

    let (doc, env, attempt) = task(4, json!({"retry": 2.5}));
    let retry = worker.run(&doc, &env, &attempt);
    assert_eq!(done(&retry), (0, &json!({"retry": true, "delay": 2.5})));

    worker.send_raw(b"nonsense\n");
    let error = worker.read_message().expect("error");
    assert_eq!(error["type"], "error");
    assert_eq!(worker.wait().code(), Some(2));
}

#[test]
fn the_channel_is_not_inherited_by_what_a_worker_starts() {
    let Some(python) = python() else {
        eprintln!("no python3: skipped");
        return;
    };
    let dir = tempfile::tempdir().expect("dir");
    let script = dir.path().join("spawner.py");
    std::fs::write(
        &script,
        format!(
            "import os, sys\nsys.path.insert(0, {:?})\nimport disbatch_worker\n\
             def handle(task):\n    sys.stdout.flush()\n    \
             os.system('test -e /proc/$$/fd/3 && echo fd3 open || echo fd3 closed')\n\
             disbatch_worker.run(handle)\n",
            example_py().parent().expect("dir")
        ),
    )
    .expect("script");
    let mut cmd = Command::new(&python);
    cmd.env_clear().env("PATH", "/usr/bin:/bin").arg(&script);
    let mut worker = Worker::start(cmd, dir.path());
    let (doc, env, attempt) = task(1, json!({}));
    let ended = worker.run(&doc, &env, &attempt);
    assert_eq!(done(&ended).0, 0);
    assert_eq!(ended.stdout(), "fd3 closed\n");
    assert_eq!(worker.stop().code(), Some(0));
}

#[test]
fn the_python_example_still_runs_as_a_process_plugin() {
    let Some(python) = python() else {
        eprintln!("no python3: skipped");
        return;
    };
    let dir = tempfile::tempdir().expect("dir");
    let result = dir.path().join("result.json");
    let mut child = Command::new(&python)
        .env_clear()
        .env("DISBATCH_TASK_ID", "t1")
        .env("DISBATCH_RESULT", &result)
        .arg(example_py())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(b"{\"params\": {\"b\": 2}}")
        .expect("write");
    let out = child.wait_with_output().expect("wait");
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "t1 {\"b\": 2}\n");
    let written: Value =
        serde_json::from_slice(&std::fs::read(&result).expect("result")).expect("json");
    assert_eq!(written, json!({"output": {"echo": {"b": 2}}}));
}
