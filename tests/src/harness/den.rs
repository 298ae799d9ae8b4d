//! Running `disbatchd` as a child process with a config written for one test.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::{json, Value};

use super::{bin_path, demo_plugin, echo_plugin, TestDb};

/// Writes a node config for `db` into the test's directory. `extra` keys override defaults.
pub fn write_config(db: &TestDb, file: &str, extra: Value) -> PathBuf {
    let mut config = json!({
        "mongohost": db.uri,
        "database": db.name,
        "plugins": {
            "Disbatch::Plugin::Demo": demo_plugin(),
            "echo": echo_plugin(),
        },
        "task_runner": bin_path("disbatch-task-runner"),
        "loop_interval_ms": 100,
        // Every node serves its metrics, so a test can wait for passes instead of time.
        "metrics_listen": "127.0.0.1:0",
    });
    if let (Some(base), Value::Object(extra)) = (config.as_object_mut(), extra) {
        for (k, v) in extra {
            base.insert(k, v);
        }
    }
    let path = db.path(file);
    let text = serde_json::to_string_pretty(&config).expect("config json");
    std::fs::write(&path, text).expect("write config");
    path
}

/// A running `disbatchd`; stopped with SIGTERM when dropped.
pub struct Den {
    child: Option<Child>,
    pub node: String,
    pub log: PathBuf,
    log_from: u64,
}

/// What a node logs once, after its first pass (den/src/node.rs).
const READY_LINE: &str = "first pass done";

impl Den {
    /// Starts a node and returns once it is ready (see `wait_ready`), or has exited.
    pub fn start(config: &Path, node: &str) -> Den {
        Den::start_with_env(config, node, &[])
    }

    /// Starts a node with extra environment variables (which its runners inherit), and
    /// returns once it is ready or has exited.
    pub fn start_with_env(config: &Path, node: &str, env: &[(&str, &str)]) -> Den {
        Den::start_adjusted(&bin_path("disbatchd"), config, node, env, |_| {})
    }

    /// Starts a node and returns at once, for a test of what a node does before its first
    /// pass (a server that is not there yet, say).
    pub fn spawn(config: &Path, node: &str) -> Den {
        Den::spawn_adjusted(&bin_path("disbatchd"), config, node, &[], |_| {})
    }

    /// Starts `program` (a `disbatchd`, perhaps a copy) as a node whose command the test
    /// adjusts first: its user, the descriptors it inherits. Returns once it is ready or has
    /// exited.
    pub fn start_adjusted(
        program: &Path,
        config: &Path,
        node: &str,
        env: &[(&str, &str)],
        adjust: impl FnOnce(&mut Command),
    ) -> Den {
        let mut den = Den::spawn_adjusted(program, config, node, env, adjust);
        den.wait_ready();
        den
    }

    /// `start_adjusted` without the wait.
    pub fn spawn_adjusted(
        program: &Path,
        config: &Path,
        node: &str,
        env: &[(&str, &str)],
        adjust: impl FnOnce(&mut Command),
    ) -> Den {
        let log = config.with_file_name(format!("den-{node}-{}.log", std::process::id()));
        // A node started again on the same config appends to the same log: its own lines are
        // those after this offset.
        let log_from = std::fs::metadata(&log).map_or(0, |m| m.len());
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .expect("den log");
        let err = out.try_clone().expect("den log");
        let mut cmd = Command::new(program);
        cmd.arg("--config")
            .arg(config)
            .arg("--node")
            .arg(node)
            .env("RUST_LOG", "info")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        adjust(&mut cmd);
        let child = cmd.spawn().expect("spawn disbatchd");
        Den {
            child: Some(child),
            node: node.to_string(),
            log,
            log_from,
        }
    }

    /// Blocks until the node logs that its first pass is done (heartbeat written, queues
    /// read), or its process has exited (a test of a node that refuses to start). Panics
    /// with the log if neither happens within 60 s (scaled by `DISBATCH_TEST_SLOWDOWN`).
    pub fn wait_ready(&mut self) {
        let timeout = super::scaled(Duration::from_secs(60));
        let deadline = Instant::now() + timeout;
        let mut pause = Duration::from_millis(5);
        loop {
            if self.own_log().contains(READY_LINE) || !self.is_running() {
                return;
            }
            if Instant::now() > deadline {
                panic!(
                    "node {} not ready {timeout:?} after its start; its log:\n{}",
                    self.node,
                    self.own_log()
                );
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(100));
        }
    }

    /// This run's part of the log (a restarted node appends to the same file).
    fn own_log(&self) -> String {
        let text = self.log_text();
        text.get(self.log_from as usize..).unwrap_or("").to_string()
    }

    pub fn pid(&self) -> Pid {
        Pid::from_raw(self.child.as_ref().map(|c| c.id() as i32).unwrap_or(0))
    }

    /// SIGHUP: the node reloads its config.
    pub fn hangup(&self) {
        kill(self.pid(), Signal::SIGHUP).expect("SIGHUP disbatchd");
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The address of its metrics listener (it prints `metrics on http://ADDR`), once it has.
    pub async fn metrics_url(&self) -> String {
        let mut url = String::new();
        super::wait_for("the metrics line", Duration::from_secs(30), || {
            // This run's line: a restarted node appends a new address to the same log.
            let found = self
                .own_log()
                .lines()
                .find_map(|l| l.strip_prefix("metrics on ").map(str::to_string));
            if let Some(found) = &found {
                url = found.clone();
            }
            async move { found.is_some() }
        })
        .await;
        url
    }

    /// Its metrics as exposed (`GET /metrics`).
    pub async fn scrape(&self) -> String {
        super::scrape(&self.metrics_url().await).await
    }

    /// The value of one sample of its metrics (`name{labels}` exactly as exposed), 0 when absent.
    pub async fn metric(&self, sample: &str) -> f64 {
        self.scrape()
            .await
            .lines()
            .find_map(|l| l.strip_prefix(sample).and_then(|v| v.strip_prefix(' ')))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0)
    }

    /// Passes the node has run (`disbatch_den_passes_total`).
    pub async fn passes(&self) -> f64 {
        self.metric("disbatch_den_passes_total").await
    }

    /// Passes that read every queue the node serves (`disbatch_den_queue_reads_total`).
    pub async fn queue_reads(&self) -> f64 {
        self.metric("disbatch_den_queue_reads_total").await
    }

    /// Waits until the node has read its queues `n` more times from now: whatever it could
    /// claim, it has had `n` chances to. The proof that something does *not* happen, without
    /// betting on a stretch of time that load can make too short.
    pub async fn wait_queue_reads(&self, n: u32) {
        let from = self.queue_reads().await;
        let want = from + f64::from(n);
        super::wait_for(
            &format!("{n} more queue reads by node {}", self.node),
            Duration::from_secs(60),
            || {
                let reads = self.queue_reads();
                async move { reads.await >= want }
            },
        )
        .await;
    }

    /// SIGKILL: the node dies without any cleanup.
    pub fn kill_hard(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM and wait for a clean exit; returns the exit code.
    pub fn stop(&mut self) -> Option<i32> {
        let mut child = self.child.take()?;
        let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
        // Above the node's own 10 s grace for a pass in flight (STOPPING_PASS_GRACE).
        let deadline = Instant::now() + super::scaled(Duration::from_secs(30));
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return status.code();
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("disbatchd did not exit within 30 s of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// True while the process runs.
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }
}

/// How much of a node's log a failing test prints: the end, where the failure is.
const LOG_TAIL_ON_PANIC: usize = 40_000;

impl Drop for Den {
    fn drop(&mut self) {
        // A failing test's message says what it waited for; the node's log says why it never
        // came, and the test's directory is gone once the test ends.
        if std::thread::panicking() {
            let log = self.own_log();
            let mut from = log.len().saturating_sub(LOG_TAIL_ON_PANIC);
            while !log.is_char_boundary(from) {
                from += 1;
            }
            eprintln!(
                "--- log of node {} (its last {} bytes) ---\n{}",
                self.node,
                log.len() - from,
                &log[from..]
            );
        }
        if let Some(mut child) = self.child.take() {
            let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
            std::thread::sleep(Duration::from_millis(100));
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
