//! A private MongoDB-wire server that a test can kill and start again on the same port and
//! data directory, for outage tests.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Killed when dropped, also when the test panics.
pub struct RestartableServer {
    bin: String,
    port: u16,
    data: PathBuf,
    child: Option<Child>,
}

impl RestartableServer {
    pub fn start() -> RestartableServer {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("free port");
        let port = listener.local_addr().expect("addr").port();
        drop(listener);
        let mut server = RestartableServer {
            bin: crate::server::server_binary(),
            port,
            data: tempfile::tempdir().expect("data dir").keep(),
            child: None,
        };
        server.restart();
        server
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
    }
}
