//! The server under test: `DISBATCH_TEST_MONGODB_URI`, or one this process starts and owns.

use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

static URI: OnceLock<String> = OnceLock::new();

/// The URI of the MongoDB-wire server for tests. Starting our own server is the fallback for
/// a bare `cargo test`; scripts/test starts one for the whole run and sets the variable.
pub fn server_uri() -> String {
    URI.get_or_init(|| match std::env::var("DISBATCH_TEST_MONGODB_URI") {
        Ok(uri) if !uri.is_empty() => uri,
        _ => start_private_server(false, None),
    })
    .clone()
}

/// A new server of this process's own with access control on: every command but the
/// handshake needs a login, and the first user can only be made through the localhost
/// exception. Each call starts another server.
pub fn start_auth_server() -> String {
    start_private_server(true, None)
}

/// Server-side TLS: a certificate chain and its key, PEM files.
pub struct ServerTls<'a> {
    pub cert_file: &'a std::path::Path,
    pub key_file: &'a std::path::Path,
}

/// `start_auth_server` that speaks only TLS, with the given certificate. The URI returned
/// says nothing of TLS: clients add what they trust.
pub fn start_tls_auth_server(tls: ServerTls<'_>) -> String {
    start_private_server(true, Some(tls))
}

/// The server executable: mongod on PATH, else SecantusDB's, built once by the script.
pub fn server_binary() -> String {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/local-mongodb");
    let out = Command::new(script)
        .arg("--binary")
        .stderr(Stdio::inherit())
        .output()
        .expect("run scripts/local-mongodb --binary");
    assert!(
        out.status.success(),
        "scripts/local-mongodb --binary failed"
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn start_private_server(auth: bool, tls: Option<ServerTls<'_>>) -> String {
    let bin = server_binary();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("free port");
    let port = listener.local_addr().expect("addr").port();
    drop(listener);
    let data = tempfile::tempdir().expect("data dir").keep();
    let mut cmd = Command::new(&bin);
    if bin.ends_with("mongod") {
        cmd.args([
            "--bind_ip",
            "127.0.0.1",
            "--port",
            &port.to_string(),
            "--dbpath",
        ])
        .arg(&data);
    } else {
        cmd.args([
            "--host",
            "127.0.0.1",
            "--port",
            &port.to_string(),
            "--storage-path",
        ])
        .arg(&data)
        .args(["--log-file-max", "16MB", "--cache-size", "256M"]);
    }
    if auth {
        cmd.arg("--auth");
    }
    if let Some(tls) = tls {
        if bin.ends_with("mongod") {
            // mongod wants the chain and the key in one file.
            let both = data.join("server-cert-and-key.pem");
            let pem = [tls.cert_file, tls.key_file]
                .iter()
                .map(|p| std::fs::read_to_string(p).expect("read TLS PEM"))
                .collect::<Vec<_>>()
                .join("\n");
            std::fs::write(&both, pem).expect("write TLS PEM");
            cmd.args(["--tlsMode", "requireTLS", "--tlsCertificateKeyFile"])
                .arg(both);
        } else {
            cmd.arg("--tls-cert-file")
                .arg(tls.cert_file)
                .arg("--tls-key-file")
                .arg(tls.key_file);
        }
    }
    cmd.stdout(Stdio::null()).stderr(Stdio::null());
    // The server must not outlive this test process: it gets SIGTERM when the thread that
    // spawned it ends, so it is spawned from a thread that lives as long as the process.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::os::unix::process::CommandExt;
        unsafe {
            cmd.pre_exec(|| {
                nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGTERM)
                    .map_err(std::io::Error::from)
            });
        }
        let child = cmd.spawn();
        let ok = child.is_ok();
        let _ = tx.send(child.map(|_| ()).map_err(|e| e.to_string()));
        if ok {
            loop {
                std::thread::park();
            }
        }
    });
    rx.recv()
        .expect("server thread")
        .expect("spawn test server");
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "test server did not start on port {port}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    format!("mongodb://127.0.0.1:{port}/?directConnection=true")
}
