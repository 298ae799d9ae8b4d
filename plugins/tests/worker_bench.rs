//! Measurement spike for issue 22 (ignored; run alone, in release, on a quiet machine):
//!
//! ```text
//! cargo test --release -p disbatch-plugins --test worker_bench -- --ignored --nocapture
//! ```
//!
//! Runs N no-op tasks (`DISBATCH_BENCH_N`, default 2000) (a) as N process starts of
//! `disbatch-plugin-noop`, done as the runner does it (a spool directory with fresh output
//! files, a cleared environment with the `DISBATCH_*` facts, the task JSON on stdin, its own
//! process group, the output read back), and (b) over the worker protocol to one persistent
//! noop worker (output files truncated before and read after each task). With
//! `DISBATCH_BENCH_RUNNER=path/to/disbatch-task-runner` it also times (c) a start of that
//! binary (`--version`) plus a noop start per task: a floor for today's two starts per task.
//! The Python helper is timed the same two ways when python3 is there. Prints tasks/s and CPU
//! per task (this process and its children, user + system).

mod support;

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::resource::{getrusage, UsageWho};
use serde_json::Value;
use support::{task, Ended, Worker};

/// CPU time used so far by this process and its waited-for children.
fn cpu() -> Duration {
    let total = |who| {
        let u = getrusage(who).expect("getrusage");
        let tv = |t: nix::sys::time::TimeVal| {
            Duration::new(t.tv_sec() as u64, t.tv_usec() as u32 * 1000)
        };
        tv(u.user_time()) + tv(u.system_time())
    };
    total(UsageWho::RUSAGE_SELF) + total(UsageWho::RUSAGE_CHILDREN)
}

fn report(what: &str, n: u32, wall: Duration, cpu: Duration) -> f64 {
    let rate = f64::from(n) / wall.as_secs_f64();
    println!(
        "{what:<44} n={n:<5} {rate:>8.0} tasks/s  {:>6.3} ms wall/task  {:>6.3} ms CPU/task",
        wall.as_secs_f64() * 1e3 / f64::from(n),
        cpu.as_secs_f64() * 1e3 / f64::from(n),
    );
    rate
}

/// One process-mode run of `program args` for task `n`, as the runner starts a plugin.
fn run_process(program: &Path, args: &[PathBuf], spool: &Path, n: u32) {
    let (doc, env, attempt) = task(n, serde_json::json!({}));
    let dir = spool.join(&attempt);
    std::fs::create_dir(&dir).expect("spool dir");
    let file = |name: &str| {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(dir.join(name))
            .expect("output file")
    };
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("DISBATCH_RESULT", dir.join("result.json"));
    if let Value::Object(env) = &env {
        for (k, v) in env {
            cmd.env(k, v.as_str().unwrap_or_default());
        }
    }
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(file("stdout"))
        .stderr(file("stderr"))
        .process_group(0)
        .spawn()
        .expect("spawn");
    if let Some(mut stdin) = child.stdin.take() {
        // A plugin that exits without reading its stdin closes the pipe: not an error here.
        let _ = stdin.write_all(doc.to_string().as_bytes());
    }
    let status = child.wait().expect("wait");
    assert!(status.success(), "{status:?}");
    let _ = std::fs::read(dir.join("stdout"));
    let _ = std::fs::read(dir.join("stderr"));
    let _ = std::fs::read(dir.join("result.json"));
    std::fs::remove_dir_all(&dir).expect("clean");
}

fn bench_process(what: &str, cmds: &[(PathBuf, Vec<PathBuf>)], n: u32) -> f64 {
    let spool = tempfile::tempdir().expect("dir");
    let (t0, c0) = (Instant::now(), cpu());
    for i in 0..n {
        for (program, args) in cmds {
            run_process(program, args, spool.path(), i);
        }
    }
    report(what, n, t0.elapsed(), cpu() - c0)
}

fn bench_worker(what: &str, cmd: Command, n: u32) -> f64 {
    let dir = tempfile::tempdir().expect("dir");
    let (t0, c0) = (Instant::now(), cpu());
    let mut worker = Worker::start(cmd, dir.path());
    for i in 0..n {
        let (doc, env, attempt) = task(i, serde_json::json!({}));
        match worker.run(&doc, &env, &attempt) {
            Ended::Done { exit: 0, .. } => {}
            other => panic!("{other:?}"),
        }
    }
    // The worker's CPU is counted once it has been waited for.
    assert!(worker.stop().success());
    report(what, n, t0.elapsed(), cpu() - c0)
}

#[test]
#[ignore = "a measurement: run alone with --ignored --nocapture"]
fn process_starts_against_one_persistent_worker() {
    let n: u32 = std::env::var("DISBATCH_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let noop = PathBuf::from(env!("CARGO_BIN_EXE_disbatch-plugin-noop"));
    let process = bench_process(
        "(a) noop, one process start per task",
        &[(noop.clone(), vec![])],
        n,
    );
    let mut cmd = Command::new(&noop);
    cmd.env_clear().env("PATH", "/usr/bin:/bin");
    let worker = bench_worker("(b) noop, one persistent worker", cmd, n);
    println!("    worker / process: {:.1}x", worker / process);
    if let Some(runner) = std::env::var_os("DISBATCH_BENCH_RUNNER") {
        let runner = PathBuf::from(runner);
        let pair = [(runner, vec![PathBuf::from("--version")]), (noop, vec![])];
        let both = bench_process("(c) runner --version + noop start per task", &pair, n);
        println!(
            "    worker / (runner + plugin starts): {:.1}x",
            worker / both
        );
    }
    let python = PathBuf::from("/usr/bin/env");
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/example_worker.py");
    let has_python = Command::new("python3")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if has_python {
        let py_n = (n / 10).max(1);
        let args = vec![PathBuf::from("python3"), example.clone()];
        let py_process = bench_process(
            "(d) python example, process per task",
            &[(python, args)],
            py_n,
        );
        let mut cmd = Command::new("python3");
        cmd.env_clear()
            .env("PATH", "/usr/bin:/bin:/usr/local/bin")
            .arg(&example);
        let py_worker = bench_worker("(e) python example, one persistent worker", cmd, n);
        println!(
            "    worker / process (python): {:.1}x",
            py_worker / py_process
        );
    }
}
