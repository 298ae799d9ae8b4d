//! Running `disbatchd` as a child process with a config written for one test.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::{json, Value};

use crate::{bin_path, demo_plugin, echo_plugin, TestDb};

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
}

impl Den {
    pub fn start(config: &Path, node: &str) -> Den {
        Den::start_with_env(config, node, &[])
    }

    /// Starts a node with extra environment variables (which its runners inherit).
    pub fn start_with_env(config: &Path, node: &str, env: &[(&str, &str)]) -> Den {
        Den::start_adjusted(&bin_path("disbatchd"), config, node, env, |_| {})
    }

    /// Starts `program` (a `disbatchd`, perhaps a copy) as a node whose command the test
    /// adjusts first: its user, the descriptors it inherits.
    pub fn start_adjusted(
        program: &Path,
        config: &Path,
        node: &str,
        env: &[(&str, &str)],
        adjust: impl FnOnce(&mut Command),
    ) -> Den {
        let log = config.with_file_name(format!("den-{node}-{}.log", std::process::id()));
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
        }
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
        crate::wait_for("the metrics line", Duration::from_secs(30), || {
            let found = self
                .log_text()
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
        let url = self.metrics_url().await;
        reqwest::get(format!("{url}/metrics"))
            .await
            .expect("GET /metrics")
            .text()
            .await
            .expect("metrics text")
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
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return status.code();
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("disbatchd did not exit within 10 s of SIGTERM");
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

impl Drop for Den {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
            std::thread::sleep(Duration::from_millis(100));
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
