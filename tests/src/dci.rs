//! Running `disbatch-web` as a child process on a free port, with an HTTP client for it.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::bin_path;

/// A running `disbatch-web`; killed when dropped.
pub struct Dci {
    child: Child,
    pub url: String,
    pub http: reqwest::Client,
}

impl Dci {
    /// Starts the server on 127.0.0.1 with an OS-chosen port and waits until it listens.
    pub fn start(config: &Path) -> Dci {
        let mut child = Command::new(bin_path("disbatch-web"))
            .arg("--config")
            .arg(config)
            .args(["--listen", "127.0.0.1:0"])
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
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
            .unwrap_or_else(|| panic!("unexpected first line from disbatch-web: {line:?}"))
            .to_string();
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .expect("http client");
        Dci { child, url, http }
    }

    pub fn at(&self, path: &str) -> String {
        format!("{}{path}", self.url)
    }

    /// GET returning (status, JSON body).
    pub async fn get(&self, path: &str) -> (u16, serde_json::Value) {
        response(self.http.get(self.at(path)).send().await).await
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
