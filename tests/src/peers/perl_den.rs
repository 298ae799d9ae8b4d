//! The real Disbatch 4.103 Perl DEN (`shared/peers/disbatch4-perl`), run beside ours on one
//! database: an outside system to test against, never part of the project.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::json;

use crate::harness::TestDb;

/// Where the Perl peer is: `DISBATCH_PERL_PEER`, else `shared/peers/disbatch4-perl` beside
/// the clone or any folder above it. None when it is not there.
pub fn find_peer() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("DISBATCH_PERL_PEER").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(dir));
    }
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .map(|a| a.join("shared/peers/disbatch4-perl"))
        .find(|dir| dir.join("run-den").is_file())
}

/// Whether the Perl peer's tests must run: CI sets `DISBATCH_REQUIRE_PERL_PEER=1`, so there a
/// missing peer fails the test instead of skipping it.
fn peer_required() -> bool {
    std::env::var("DISBATCH_REQUIRE_PERL_PEER").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// True when the peer is here. Otherwise the test `test` skips: it prints one line saying so
/// and returns false, unless the peer is required, when it fails.
pub fn available(test: &str) -> bool {
    if find_peer().is_some() {
        return true;
    }
    assert!(
        !peer_required(),
        "{test}: the Perl Disbatch 4 peer was not found and DISBATCH_REQUIRE_PERL_PEER is set: set DISBATCH_PERL_PEER to its folder (the one with run-den and run-cli)"
    );
    eprintln!(
        "SKIPPED {test}: the Perl Disbatch 4 peer is not here (set DISBATCH_PERL_PEER to its folder; DISBATCH_REQUIRE_PERL_PEER=1 makes this a failure)"
    );
    false
}

/// The peer's folder; the caller has checked `available`.
pub fn peer_dir() -> PathBuf {
    find_peer().unwrap_or_else(|| {
        panic!("the Perl Disbatch 4 peer was not found: set DISBATCH_PERL_PEER to its folder (the one with run-den and run-cli)")
    })
}

/// A Perl DEN in its own UTS namespace, so its node name (its host name) is the test's.
pub struct PerlDen {
    child: Option<Child>,
    pub node: String,
    pub config: PathBuf,
    pub log: PathBuf,
}

impl PerlDen {
    /// Starts a Perl DEN for `db` named `node`, serving `Disbatch::Plugin::Demo` queues.
    pub fn start(db: &TestDb, node: &str) -> PerlDen {
        let peer = peer_dir();
        // The Perl driver refuses `directConnection`; a single host is direct there anyway.
        let host = db.uri.split('?').next().unwrap_or(&db.uri).to_string();
        let config = json!({
            "mongohost": host,
            "database": db.name,
            "plugins": ["Disbatch::Plugin::Demo"],
            "task_runner": peer.join("bin/task_runner"),
            "gfs": "auto",
            "testing": 1,
            "quiet": 1,
            "log4perl": {"level": "INFO", "appenders": {"screenlog": {
                "type": "Log::Log4perl::Appender::Screen",
                "layout": "[%p] %d %m %n", "args": {}}}},
        });
        let path = db.path(&format!("perl-{node}.json"));
        std::fs::write(&path, config.to_string()).expect("write the Perl config");
        let log = db.path(&format!("perl-{node}.log"));
        let out = std::fs::File::create(&log).expect("Perl DEN log");
        let err = out.try_clone().expect("Perl DEN log");
        let child = Command::new(peer.join("run-den"))
            .arg(&path)
            .arg(node)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            // Its own process group: killing the node kills unshare, sh and perl together.
            .process_group(0)
            .spawn()
            .expect("start the Perl DEN (run-den)");
        PerlDen {
            child: Some(child),
            node: node.to_string(),
            config: path,
            log,
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The host dies: the DEN and every task runner it started (each in a session of its
    /// own) are killed at once, and the host is dead once several scans find none of them.
    pub fn kill_host(&mut self) {
        // Every process of the host shares its UTS namespace (run-den unshares it; a runner's
        // fork, setsid and exec keep it), which reads the same at every moment of an exec.
        let host = self
            .child
            .as_ref()
            .and_then(|c| uts_namespace(&c.id().to_string()))
            .filter(|ns| Some(ns) != uts_namespace("self").as_ref());
        // All at once: a runner left running while its DEN dies could still finish its task.
        if let Some(host) = &host {
            for pid in processes_in(host) {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
        }
        self.kill_den();
        // run-den hands the DEN its config by real path, and the DEN passes it on: without a
        // namespace of its own (no node name), that is how its runners are found. While a
        // runner execs its command line reads empty, so one scan can miss it (CI saw such a
        // runner finish its task after the kill).
        let real = std::fs::canonicalize(&self.config).unwrap_or_else(|_| self.config.clone());
        let config = real.to_string_lossy().to_string();
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut empty_scans = 0;
        while empty_scans < 5 {
            let mut pids = processes_with_arg(&config);
            if let Some(host) = &host {
                pids.extend(processes_in(host));
            }
            if pids.is_empty() {
                empty_scans += 1;
            } else {
                empty_scans = 0;
            }
            for pid in pids {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
            assert!(
                Instant::now() < deadline,
                "the Perl host's processes outlived 10 s of SIGKILL"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn kill_den(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = kill(Pid::from_raw(-(child.id() as i32)), Signal::SIGKILL);
            let _ = child.wait();
        }
    }
}

impl Drop for PerlDen {
    fn drop(&mut self) {
        self.kill_den();
    }
}

/// Pids of processes whose command line has `arg` as one of its arguments.
fn processes_with_arg(arg: &str) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()))
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| c.split(|b| *b == 0).any(|a| a == arg.as_bytes()))
                .unwrap_or(false)
        })
        .collect()
}

/// The UTS namespace of process `pid` ("self" for this one), as `uts:[inode]`.
fn uts_namespace(pid: &str) -> Option<String> {
    std::fs::read_link(format!("/proc/{pid}/ns/uts"))
        .ok()
        .map(|l| l.to_string_lossy().to_string())
}

/// Pids of the live processes in UTS namespace `ns` (a zombie's namespace reads as none).
fn processes_in(ns: &str) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()))
        .filter(|pid| uts_namespace(&pid.to_string()).as_deref() == Some(ns))
        .collect()
}
