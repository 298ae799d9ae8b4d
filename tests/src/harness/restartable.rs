//! A private MongoDB-wire server that a test can kill and start again on the same port and
//! data directory, for outage tests, or whose clock a test sets (libfaketime), for the
//! schedule tests that need a given day.
//!
//! A start is done when this server's own process says it listens on its port and a `hello`
//! sent there is answered: not when something, anything, accepts on that port. Its output
//! goes to a file beside its data directory, whose end every failure to start shows.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use bson::{doc, Bson, Document};

/// Ports and data directories a first start tries before giving up: a port can be taken
/// between the check that it is free and the server's bind, by a process of another test.
const FIRST_START_TRIES: usize = 4;
/// Starts on the same port a restart tries: its clients (a DCI, a node, the test) know only
/// that port, so a restart cannot move; a port held for a moment may be free again.
const RESTART_TRIES: usize = 3;
/// How much of the server's output a failure to start shows.
const LOG_TAIL: usize = 4000;

/// Killed when dropped, also when the test panics.
pub struct RestartableServer {
    bin: String,
    port: u16,
    data: PathBuf,
    /// The server's stdout and stderr, of every start, beside `data`.
    log: PathBuf,
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
        server.first_start();
        server
    }

    /// A server whose wall clock reads `at` now, and runs on from there. Its monotonic
    /// clocks run true, as a real host's do after its clock is set.
    pub fn start_at(at: bson::DateTime) -> RestartableServer {
        let mut server = RestartableServer::unstarted();
        let file = server.data.with_extension("faketime.rc");
        server.clock_file = Some(file);
        server.set_clock(at);
        server.first_start();
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
        let data = tempfile::tempdir().expect("data dir").keep();
        RestartableServer {
            bin: super::server::server_binary(),
            port: free_port(),
            log: data.with_extension("server.log"),
            data,
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

    /// Starts the server (again) on the same port and data; returns once it answers there.
    /// Panics with its exit and the end of its output if it cannot: its clients know this
    /// port, so a port taken while the server was down fails the test, and says so.
    pub fn restart(&mut self) {
        let mut failures = Vec::new();
        let mut tries = 0;
        while tries < RESTART_TRIES {
            tries += 1;
            match self.try_start() {
                Ok(()) => return,
                Err(why) => failures.push(why),
            }
            if tries < RESTART_TRIES && !self.wait_port_free() {
                failures.push(format!("port {} stayed taken", self.port));
                break;
            }
        }
        panic!(
            "the test's server did not start again on port {} (a restart must keep its port: \
             its clients know no other) after {tries} tries:\n{}\n{}",
            self.port,
            failures.join("\n"),
            self.log_tail()
        );
    }

    /// The first start: a port taken before the server could bind it, or a server that
    /// never answers, is left for a fresh port and data directory, a few times.
    fn first_start(&mut self) {
        let mut failures = Vec::new();
        for tried in 1..=FIRST_START_TRIES {
            match self.try_start() {
                Ok(()) => return,
                Err(why) => failures.push(why),
            }
            if tried < FIRST_START_TRIES {
                // What a failed start made of its store is not what a first start expects.
                let _ = std::fs::remove_dir_all(&self.data);
                std::fs::create_dir_all(&self.data).expect("data dir");
                self.port = free_port();
            }
        }
        panic!(
            "the test's server did not start in {FIRST_START_TRIES} tries, each on a port of its own:\n{}\n{}",
            failures.join("\n"),
            self.log_tail()
        );
    }

    /// One start on `self.port`: Ok once this process listens there and answers a `hello`,
    /// Err saying why not (its exit status, or what it never did) with it stopped.
    fn try_start(&mut self) -> Result<(), String> {
        self.kill();
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("open the server's log");
        let _ = writeln!(log, "--- test harness: starting on port {} ---", self.port);
        let from = std::fs::metadata(&self.log).map_or(0, |m| m.len());
        let err = log.try_clone().expect("the server's log");
        let mut cmd = Command::new(&self.bin);
        let port = self.port.to_string();
        let ready_line = if self.bin.ends_with("mongod") {
            cmd.args(["--bind_ip", "127.0.0.1", "--port", &port, "--dbpath"])
                .arg(&self.data);
            "Waiting for connections".to_string()
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
            format!("listening on 127.0.0.1:{port}")
        };
        if let Some(file) = &self.clock_file {
            cmd.env("LD_PRELOAD", libfaketime())
                .env("FAKETIME_TIMESTAMP_FILE", file)
                .env("FAKETIME_NO_CACHE", "1")
                .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("port {port}: could not spawn {}: {e}", self.bin))?;
        self.child = Some(child);
        let timeout = super::scaled(Duration::from_secs(60));
        let deadline = Instant::now() + timeout;
        let mut pause = Duration::from_millis(10);
        loop {
            if let Some(status) = self.exited() {
                self.child = None;
                return Err(format!(
                    "port {port}: the server exited ({status}) before it answered"
                ));
            }
            // Its own line first: something else that answers on the port is not this server.
            let last = if log_since(&self.log, from).contains(&ready_line) {
                match hello(self.port) {
                    Ok(()) => {
                        // And it is still this process that runs there, not one that died since.
                        if let Some(status) = self.exited() {
                            self.child = None;
                            return Err(format!(
                                "port {port}: the server exited ({status}) as it answered"
                            ));
                        }
                        return Ok(());
                    }
                    Err(e) => e,
                }
            } else {
                format!("it has not logged {ready_line:?}")
            };
            if Instant::now() > deadline {
                self.kill();
                return Err(format!(
                    "port {port}: no answer to hello within {timeout:?} ({last})"
                ));
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(100));
        }
    }

    /// Waits until nothing listens on or holds `self.port` (as a bind proves), for a
    /// restart to try it again; false if it stays taken.
    fn wait_port_free(&self) -> bool {
        let deadline = Instant::now() + super::scaled(Duration::from_secs(30));
        let mut pause = Duration::from_millis(10);
        while TcpListener::bind((Ipv4Addr::LOCALHOST, self.port)).is_err() {
            if Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(200));
        }
        true
    }

    /// Its exit status, once its process has ended.
    fn exited(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// The end of the server's output, for a failure's message.
    fn log_tail(&self) -> String {
        let text = std::fs::read(&self.log).unwrap_or_default();
        let start = text.len().saturating_sub(LOG_TAIL);
        format!(
            "--- the server's output ({}), its last {} bytes ---\n{}",
            self.log.display(),
            text.len() - start,
            String::from_utf8_lossy(&text[start..])
        )
    }
}

impl Drop for RestartableServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.data);
        // Kept after a failure, for the whole of what the server said.
        if !std::thread::panicking() {
            let _ = std::fs::remove_file(&self.log);
        }
        if let Some(file) = &self.clock_file {
            let _ = std::fs::remove_file(file);
        }
    }
}

/// What `log` holds past `from` (this start's part).
fn log_since(log: &Path, from: u64) -> String {
    let text = std::fs::read(log).unwrap_or_default();
    let from = usize::try_from(from).unwrap_or(usize::MAX).min(text.len());
    String::from_utf8_lossy(&text[from..]).into_owned()
}

/// A free port below the kernel's ephemeral range when there is room there: the ports that
/// `bind(…:0)` gives (every DCI, node metrics listener and proxy of the tests running beside
/// this one) and that outgoing connections take come from that range, so such a port stays
/// free between this check and the server's bind, and while the server is down for an
/// outage. Otherwise, one the kernel gives.
fn free_port() -> u16 {
    use rand::Rng;
    const LOWEST: u16 = 10_000;
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768);
    if ephemeral_low > LOWEST + 1_000 {
        let mut rng = rand::rng();
        for _ in 0..100 {
            let port = rng.random_range(LOWEST..ephemeral_low);
            if TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok() {
                return port;
            }
        }
    }
    let listener = TcpListener::bind("127.0.0.1:0").expect("free port");
    listener.local_addr().expect("addr").port()
}

/// Sends `hello` to the server on `port` and reads its answer: Ok when it is an answer to
/// that request with `ok: 1`. A connection that only opened (to another kind of listener,
/// or a socket connected to itself) is not an answer.
fn hello(port: u16) -> Result<(), String> {
    const OP_MSG: i32 = 2013;
    const REQUEST_ID: i32 = 0x5e1f;
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .map_err(|e| format!("connecting: {e}"))?;
    if stream.local_addr().ok() == stream.peer_addr().ok() {
        return Err("the connection went to itself".into());
    }
    let io = |e: std::io::Error| format!("hello: {e}");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(io)?;
    stream
        .set_write_timeout(Some(Duration::from_secs(10)))
        .map_err(io)?;
    let mut body = Vec::new();
    doc! {"hello": 1, "$db": "admin"}
        .to_writer(&mut body)
        .map_err(|e| format!("encoding hello: {e}"))?;
    let length = i32::try_from(16 + 4 + 1 + body.len()).expect("a small message");
    let mut message = Vec::with_capacity(length as usize);
    for n in [length, REQUEST_ID, 0, OP_MSG] {
        message.extend_from_slice(&n.to_le_bytes());
    }
    message.extend_from_slice(&0u32.to_le_bytes()); // flag bits
    message.push(0); // one body section
    message.extend_from_slice(&body);
    stream.write_all(&message).map_err(io)?;
    let mut header = [0u8; 16];
    stream.read_exact(&mut header).map_err(io)?;
    let field =
        |i: usize| i32::from_le_bytes(header[i * 4..i * 4 + 4].try_into().expect("4 bytes"));
    let (length, response_to, op) = (field(0), field(2), field(3));
    if response_to != REQUEST_ID || op != OP_MSG || !(21..=48_000_000).contains(&length) {
        return Err(format!(
            "not an answer to hello (length {length}, responseTo {response_to}, opCode {op})"
        ));
    }
    let mut rest = vec![0u8; length as usize - 16];
    stream.read_exact(&mut rest).map_err(io)?;
    let reply = Document::from_reader(&rest[5..]).map_err(|e| format!("hello's answer: {e}"))?;
    match reply.get("ok") {
        Some(Bson::Double(ok)) if *ok == 1.0 => Ok(()),
        Some(Bson::Int32(1) | Bson::Int64(1)) => Ok(()),
        _ => Err(format!("hello was answered {reply}")),
    }
}
