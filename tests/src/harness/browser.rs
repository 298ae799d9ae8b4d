//! Headless Chromium driven over WebDriver (chromedriver), with screenshots kept as test output.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{json, Value};

use super::bin_path;

/// A browser session; chromedriver is stopped when dropped.
pub struct Browser {
    pub client: Client,
    driver: Child,
    port: u16,
    _profile: tempfile::TempDir,
}

/// Where screenshots go: `<target>/ui-screenshots/`.
pub fn screenshot_dir() -> PathBuf {
    let profile_dir = bin_path("disbatch-web")
        .parent()
        .map(PathBuf::from)
        .unwrap_or_default();
    profile_dir
        .parent()
        .map(|t| t.join("ui-screenshots"))
        .unwrap_or(profile_dir)
}

impl Browser {
    /// Starts chromedriver and a headless Chromium window of `width`×`height`.
    pub async fn start(width: u32, height: u32) -> Browser {
        let chromedriver = which("chromedriver").unwrap_or_else(|| {
            panic!("chromedriver is not installed: apt-get install chromium chromium-driver (scripts/test does)")
        });
        let chromium = which("chromium")
            .or_else(|| which("chromium-browser"))
            .expect("chromium is not installed");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        let driver = Command::new(chromedriver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "chromedriver did not listen on {port}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let profile = tempfile::tempdir().expect("profile dir");
        // The machine has no outside network: background fetches only add noise and delay.
        let args = vec![
            "--headless=new".to_string(),
            "--no-sandbox".into(),
            "--disable-gpu".into(),
            "--disable-dev-shm-usage".into(),
            "--disable-quic".into(),
            "--no-first-run".into(),
            "--disable-background-networking".into(),
            "--disable-component-update".into(),
            "--disable-sync".into(),
            format!("--window-size={width},{height}"),
            format!("--user-data-dir={}", profile.path().display()),
        ];
        let mut caps = serde_json::Map::new();
        caps.insert("browserName".into(), json!("chrome"));
        caps.insert(
            "goog:chromeOptions".into(),
            json!({"binary": chromium, "args": args}),
        );
        // chromedriver speaks plain HTTP on loopback: no TLS stack is needed.
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        let client = ClientBuilder::new(connector)
            .capabilities(caps)
            .connect(&format!("http://127.0.0.1:{port}"))
            .await
            .expect("connect to chromedriver");
        Browser {
            client,
            driver,
            port,
            _profile: profile,
        }
    }

    /// Lays pages out as a phone of `width`×`height` would (a window cannot be narrower
    /// than 500 px), through Chrome's device emulation.
    pub async fn emulate_phone(&self, width: u32, height: u32) {
        self.cdp(
            "Emulation.setDeviceMetricsOverride",
            json!({"width": width, "height": height, "deviceScaleFactor": 1, "mobile": true}),
        )
        .await;
    }

    /// From the next page on, notes every Content-Security-Policy violation (from the very
    /// start of each page: the listener is installed before the page's own scripts run).
    pub async fn record_csp_violations(&self) {
        let source = "window.__cspViolations = []; document.addEventListener(\
            'securitypolicyviolation', (e) => window.__cspViolations.push(\
            `${e.violatedDirective} blocked ${e.blockedURI} in ${e.sourceFile}:${e.lineNumber}`));";
        self.cdp(
            "Page.addScriptToEvaluateOnNewDocument",
            json!({"source": source}),
        )
        .await;
    }

    /// The violations noted on the current page since `record_csp_violations`.
    pub async fn csp_violations(&self) -> Vec<String> {
        let v = self
            .client
            .execute("return window.__cspViolations || null", vec![])
            .await
            .expect("read CSP violations");
        serde_json::from_value::<Option<Vec<String>>>(v)
            .expect("violation list")
            .expect("record_csp_violations was called before the page loaded")
    }

    /// One Chrome DevTools command through chromedriver.
    async fn cdp(&self, cmd: &str, params: Value) {
        let session = self
            .client
            .session_id()
            .await
            .ok()
            .flatten()
            .expect("session id");
        let url = format!(
            "http://127.0.0.1:{}/session/{session}/goog/cdp/execute",
            self.port
        );
        let r = reqwest::Client::new()
            .post(url)
            .json(&json!({"cmd": cmd, "params": params}))
            .send()
            .await
            .expect("CDP command");
        let status = r.status();
        let body = r.text().await.unwrap_or_default();
        assert!(status.is_success(), "{cmd} refused: {status} {body}");
    }

    /// Opens `url` and waits until the console has rendered `page`.
    pub async fn open(&self, url: &str, page: &str) {
        self.client.goto(url).await.expect("navigate");
        self.wait_loaded(page).await;
    }

    pub async fn wait_loaded(&self, page: &str) {
        let css = format!("body[data-page=\"{page}\"][data-loaded=\"1\"]");
        let found = self
            .client
            .wait()
            .at_most(Duration::from_secs(20))
            .for_element(Locator::Css(&css))
            .await;
        if let Err(e) = found {
            let shot = self.screenshot(&format!("failed-{page}")).await;
            let state = self
                .client
                .execute(
                    "return [location.href, JSON.stringify(document.body.dataset), document.body.innerText.slice(0, 2000)]",
                    vec![],
                )
                .await
                .map(|v| v.to_string())
                .unwrap_or_default();
            panic!(
                "page {page} did not load ({e}); screenshot {}; page state: {state}",
                shot.display()
            );
        }
    }

    /// Picks the option of the `<select>` at `select` whose text is `text`.
    pub async fn select_option(&self, select: &str, text: &str) {
        let css = format!("{select} option");
        for option in self
            .client
            .find_all(Locator::Css(&css))
            .await
            .expect("options")
        {
            if option.text().await.unwrap_or_default().trim() == text {
                option.click().await.expect("select option");
                return;
            }
        }
        panic!("no option {text:?} in {select}");
    }

    /// Waits for an element matching `css` and returns it.
    pub async fn find(&self, css: &str) -> fantoccini::elements::Element {
        self.client
            .wait()
            .at_most(Duration::from_secs(20))
            .for_element(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("no element {css}: {e}"))
    }

    /// Polls the text of `css` until `check` accepts it.
    pub async fn wait_text(
        &self,
        css: &str,
        what: &str,
        mut check: impl FnMut(&str) -> bool,
    ) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let text = match self.client.find(Locator::Css(css)).await {
                Ok(e) => e.text().await.unwrap_or_default(),
                Err(_) => String::new(),
            };
            if check(&text) {
                return text;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: {css} still shows {text:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Saves a PNG of the window as `<target>/ui-screenshots/<name>.png`.
    pub async fn screenshot(&self, name: &str) -> PathBuf {
        let png = self.client.screenshot().await.expect("screenshot");
        let dir = screenshot_dir();
        std::fs::create_dir_all(&dir).expect("screenshot dir");
        let path = dir.join(format!("{name}.png"));
        std::fs::write(&path, png).expect("write screenshot");
        path
    }

    pub async fn close(mut self) {
        let _ = self.client.clone().close().await;
        self.kill_all();
    }

    /// Kills chromedriver and the Chromium it started: after a panic no session was closed,
    /// and Chromium's processes would outlive the test.
    fn kill_all(&mut self) {
        for pid in super::cleanup::descendants_of(self.driver.id() as i32) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        self.kill_all();
    }
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}
