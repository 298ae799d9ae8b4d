//! Running `disbatch-web` as a child process on a free port, with an HTTP client for it.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::bin_path;

/// A running `disbatch-web`; killed when dropped.
pub struct Dci {
    child: Child,
    pub url: String,
    pub http: reqwest::Client,
}

/// How to start a `disbatch-web` beyond its config; `Default` is what `Dci::start` does.
#[derive(Default)]
pub struct Launch {
    /// PEM of a CA the client trusts (for a DCI with `web.tls`).
    pub ca_pem: Option<Vec<u8>>,
    /// Where the server's log (stderr) goes; inherited when unset.
    pub log_file: Option<PathBuf>,
    /// `RUST_LOG` for the server; `warn` when unset.
    pub rust_log: Option<String>,
    /// Another `disbatch-web` than this build's (a benchmark comparing builds).
    pub binary: Option<PathBuf>,
}

impl Dci {
    /// Starts the server on 127.0.0.1 with an OS-chosen port and waits until it listens.
    ///
    /// The wait is a blocking read of its first line, on the caller's thread: in a
    /// current-thread test runtime nothing else of the test runs meanwhile (a fraction of a
    /// second). A test whose runtime serves the DCI something it needs before it listens (a
    /// proxy in front of the database) must run on a multi-thread runtime.
    pub fn start(config: &Path) -> Dci {
        Dci::launch(config, Launch::default())
    }

    /// `start` with a trusted CA, a log file or a log level.
    pub fn launch(config: &Path, launch: Launch) -> Dci {
        let stderr = match &launch.log_file {
            Some(path) => Stdio::from(std::fs::File::create(path).expect("create the DCI log")),
            None => Stdio::inherit(),
        };
        let program = launch
            .binary
            .clone()
            .unwrap_or_else(|| bin_path("disbatch-web"));
        let mut child = Command::new(program)
            .arg("--config")
            .arg(config)
            .args(["--listen", "127.0.0.1:0"])
            .env("RUST_LOG", launch.rust_log.as_deref().unwrap_or("warn"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("spawn disbatch-web");
        let stdout = child.stdout.take().expect("stdout");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("read listen line");
        let url = line
            .trim()
            .strip_prefix("listening on ")
            .filter(|url| url.starts_with("http://") || url.starts_with("https://"))
            .unwrap_or_else(|| panic!("unexpected first line from disbatch-web: {line:?}"))
            .to_string();
        let mut http = reqwest::Client::builder().timeout(Duration::from_secs(60));
        if let Some(pem) = &launch.ca_pem {
            http = http.add_root_certificate(reqwest::Certificate::from_pem(pem).expect("CA PEM"));
        }
        let http = http.build().expect("http client");
        Dci { child, url, http }
    }

    /// Sends SIGTERM and waits (at most 20 s) for the exit, as a service manager would.
    pub fn terminate(mut self) -> std::process::ExitStatus {
        use nix::sys::signal::{kill, Signal};
        use nix::unistd::Pid;
        let pid = Pid::from_raw(i32::try_from(self.child.id()).expect("pid"));
        kill(pid, Signal::SIGTERM).expect("SIGTERM disbatch-web");
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.child.try_wait().expect("wait for disbatch-web") {
                return status;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "disbatch-web did not stop within 20 s of SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGHUP: the server reloads its config.
    pub fn hangup(&self) {
        use nix::sys::signal::{kill, Signal};
        use nix::unistd::Pid;
        let pid = Pid::from_raw(i32::try_from(self.child.id()).expect("pid"));
        kill(pid, Signal::SIGHUP).expect("SIGHUP disbatch-web");
    }

    /// Its process id (to read its memory in /proc).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// True while the process runs.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    pub fn at(&self, path: &str) -> String {
        format!("{}{path}", self.url)
    }

    /// GET returning (status, JSON body).
    pub async fn get(&self, path: &str) -> (u16, serde_json::Value) {
        response(self.http.get(self.at(path)).send().await).await
    }

    /// The HTTP status of `GET path` with a bearer token.
    pub async fn status_with_token(&self, path: &str, token: &str) -> u16 {
        let sent = self.http.get(self.at(path)).bearer_auth(token).send().await;
        sent.expect("request").status().as_u16()
    }

    /// A request with a JSON body, returning (status, JSON body).
    pub async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        body: serde_json::Value,
    ) -> (u16, serde_json::Value) {
        response(
            self.http
                .request(method, self.at(path))
                .json(&body)
                .send()
                .await,
        )
        .await
    }

    pub async fn post(&self, path: &str, body: serde_json::Value) -> (u16, serde_json::Value) {
        self.send(reqwest::Method::POST, path, body).await
    }

    /// Runs the `disbatch` CLI against this server and waits for it.
    pub fn cli(&self, args: &[&str]) -> std::process::Output {
        Command::new(bin_path("disbatch"))
            .arg("--url")
            .arg(&self.url)
            .args(args)
            .output()
            .expect("run disbatch")
    }
}

async fn response(r: reqwest::Result<reqwest::Response>) -> (u16, serde_json::Value) {
    let r = r.expect("request");
    let status = r.status().as_u16();
    let text = r.text().await.expect("body");
    let json = serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text));
    (status, json)
}

impl Drop for Dci {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
