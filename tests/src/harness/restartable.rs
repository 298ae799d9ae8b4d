//! A private MongoDB-wire server that a test can kill and start again on the same port and
//! data directory, for outage tests, or whose clock a test sets (libfaketime), for the
//! schedule tests that need a given day.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Killed when dropped, also when the test panics.
pub struct RestartableServer {
    bin: String,
    port: u16,
    data: PathBuf,
    child: Option<Child>,
    /// Set when the server runs on a clock the test sets: the file libfaketime reads its
    /// offset from, at every reading of the time.
    clock_file: Option<PathBuf>,
}

/// Debian's libfaketime (package `faketime`, installed by scripts/test).
pub fn libfaketime() -> PathBuf {
    let found = std::fs::read_dir("/usr/lib")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("faketime/libfaketimeMT.so.1"))
        .find(|p| p.exists());
    found.expect("libfaketimeMT.so.1 under /usr/lib/*/faketime: install Debian's faketime package (scripts/test does)")
}

impl RestartableServer {
    pub fn start() -> RestartableServer {
        let mut server = RestartableServer::unstarted();
        server.restart();
        server
    }

    /// A server whose wall clock reads `at` now, and runs on from there. Its monotonic
    /// clocks run true, as a real host's do after its clock is set.
    pub fn start_at(at: bson::DateTime) -> RestartableServer {
        let mut server = RestartableServer::unstarted();
        let file = server.data.with_extension("faketime.rc");
        server.clock_file = Some(file);
        server.set_clock(at);
        server.restart();
        server
    }

    /// Sets the clock of a server started with `start_at` (a step, as `date -s` makes): it
    /// reads `at` now. Its next reading of the time sees it.
    pub fn set_clock(&self, at: bson::DateTime) {
        let file = self
            .clock_file
            .as_ref()
            .expect("set_clock needs a server started with start_at");
        let shift_ms = at.timestamp_millis() - bson::DateTime::now().timestamp_millis();
        // libfaketime reads seconds with a fraction; a new file replaces the old at once.
        let next = file.with_extension("next");
        std::fs::write(&next, format!("{:+.3}\n", shift_ms as f64 / 1000.0))
            .expect("write the clock's offset");
        std::fs::rename(&next, file).expect("set the clock's offset");
    }

    fn unstarted() -> RestartableServer {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("free port");
        let port = listener.local_addr().expect("addr").port();
        drop(listener);
        RestartableServer {
            bin: super::server::server_binary(),
            port,
            data: tempfile::tempdir().expect("data dir").keep(),
            child: None,
            clock_file: None,
        }
    }

    pub fn uri(&self) -> String {
        format!("mongodb://127.0.0.1:{}/?directConnection=true", self.port)
    }

    /// SIGKILL: the server vanishes mid-operation, as in a crash or a lost host.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server (again) on the same port and data; waits until it accepts.
    pub fn restart(&mut self) {
        self.kill();
        let mut cmd = Command::new(&self.bin);
        let port = self.port.to_string();
        if self.bin.ends_with("mongod") {
            cmd.args(["--bind_ip", "127.0.0.1", "--port", &port, "--dbpath"])
                .arg(&self.data);
        } else {
            // Every commit reaches the disk: a kill must not take acknowledged writes with it.
            cmd.args(["--host", "127.0.0.1", "--port", &port, "--storage-path"])
                .arg(&self.data)
                .args([
                    "--log-file-max",
                    "16MB",
                    "--cache-size",
                    "256M",
                    "--sync-on-commit",
                ]);
        }
        if let Some(file) = &self.clock_file {
            cmd.env("LD_PRELOAD", libfaketime())
                .env("FAKETIME_TIMESTAMP_FILE", file)
                .env("FAKETIME_NO_CACHE", "1")
                .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
        }
        let child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn the server");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "server did not start on port {port}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for RestartableServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.data);
        if let Some(file) = &self.clock_file {
            let _ = std::fs::remove_file(file);
        }
    }
}
