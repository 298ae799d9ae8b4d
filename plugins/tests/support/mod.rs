//! A minimal, blocking supervisor for the worker protocol (plugins/PROTOCOL.md), for tests
//! and the measurement spike only: the real one is the worker host, dtr/src/worker/. It
//! does what the protocol asks of a supervisor: the channel on descriptor 3, stdin from
//! /dev/null, stdout and stderr in O_APPEND files truncated before each task, its own
//! process group.

#![allow(dead_code)]

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};

use nix::libc;
use serde_json::{json, Value};

/// A running worker and the supervisor's ends of its channel and output files.
pub struct Worker {
    child: Child,
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    stdout: (PathBuf, File),
    stderr: (PathBuf, File),
    pub ready: Value,
}

/// How one task ended, as the supervisor saw it.
#[derive(Debug)]
pub enum Ended {
    /// The worker answered `done`.
    Done {
        exit: i64,
        result: Value,
        stdout: String,
        stderr: String,
    },
    /// The worker died (or closed its channel) before answering.
    Died {
        status: ExitStatus,
        stdout: String,
        stderr: String,
    },
}

impl Ended {
    pub fn stdout(&self) -> &str {
        match self {
            Ended::Done { stdout, .. } | Ended::Died { stdout, .. } => stdout,
        }
    }
    pub fn stderr(&self) -> &str {
        match self {
            Ended::Done { stderr, .. } | Ended::Died { stderr, .. } => stderr,
        }
    }
}

fn output_file(path: &Path) -> File {
    OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .open(path)
        .expect("output file")
}

impl Worker {
    /// Starts `cmd` as a worker with its output files in `dir`, and waits for `ready`.
    pub fn start(mut cmd: Command, dir: &Path) -> Worker {
        let (ours, theirs) = UnixStream::pair().expect("socketpair");
        let out_path = dir.join("worker.stdout");
        let err_path = dir.join("worker.stderr");
        let fd = theirs.as_raw_fd();
        cmd.env("DISBATCH_WORKER_PROTOCOL", "1")
            .stdin(Stdio::null())
            .stdout(output_file(&out_path))
            .stderr(output_file(&err_path))
            .process_group(0);
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                if fd != 3 && libc::dup2(fd, 3) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if libc::fcntl(3, libc::F_SETFD, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().expect("spawn worker");
        drop(theirs);
        let writer = ours.try_clone().expect("clone");
        let mut worker = Worker {
            child,
            reader: BufReader::new(ours),
            writer,
            stdout: (out_path.clone(), output_file(&out_path)),
            stderr: (err_path.clone(), output_file(&err_path)),
            ready: Value::Null,
        };
        worker.ready = worker.read_message().expect("ready line");
        worker
    }

    /// One line from the worker, None at end of input.
    pub fn read_message(&mut self) -> Option<Value> {
        let mut line = String::new();
        match self.reader.read_line(&mut line) {
            Ok(0) | Err(_) => None,
            Ok(_) => Some(serde_json::from_str(&line).expect("worker wrote JSON")),
        }
    }

    /// Sends a raw line.
    pub fn send_raw(&mut self, line: &[u8]) {
        let _ = self.writer.write_all(line);
    }

    /// Runs one task: output files emptied, the task sent, the answer read.
    pub fn run(&mut self, task: &Value, env: &Value, attempt: &str) -> Ended {
        self.stdout.1.set_len(0).expect("truncate");
        self.stderr.1.set_len(0).expect("truncate");
        let msg = json!({"type": "task", "task": task, "env": env, "attempt": attempt});
        let mut line = msg.to_string().into_bytes();
        line.push(b'\n');
        self.send_raw(&line);
        let answer = self.read_message();
        let stdout = std::fs::read_to_string(&self.stdout.0).unwrap_or_default();
        let stderr = std::fs::read_to_string(&self.stderr.0).unwrap_or_default();
        match answer {
            Some(msg) => {
                assert_eq!(msg["type"], "done", "{msg}");
                assert_eq!(msg["attempt"], attempt, "{msg}");
                Ended::Done {
                    exit: msg["exit"].as_i64().expect("exit"),
                    result: msg["result"].clone(),
                    stdout,
                    stderr,
                }
            }
            None => Ended::Died {
                status: self.child.wait().expect("wait"),
                stdout,
                stderr,
            },
        }
    }

    /// Asks the worker to stop and waits for it.
    pub fn stop(mut self) -> ExitStatus {
        self.send_raw(b"{\"type\":\"stop\"}\n");
        self.child.wait().expect("wait")
    }

    /// Closes the channel (no `stop`) and waits.
    pub fn close(self) -> ExitStatus {
        let Worker {
            mut child,
            reader,
            writer,
            ..
        } = self;
        drop(writer);
        drop(reader);
        child.wait().expect("wait")
    }

    /// Waits for the worker to exit on its own.
    pub fn wait(mut self) -> ExitStatus {
        self.child.wait().expect("wait")
    }

    pub fn id(&self) -> u32 {
        self.child.id()
    }
}

/// The task document and `DISBATCH_*` facts for a test task number `n`.
pub fn task(n: u32, params: Value) -> (Value, Value, String) {
    let id = format!("{n:024x}");
    let attempt = format!("{:024x}", n + 1_000_000);
    let doc = json!({"_id": {"$oid": id}, "queue": {"$oid": "00000000000000000000beef"},
                     "status": 0, "attempts": 1, "params": params});
    let env = json!({"DISBATCH_TASK_ID": id, "DISBATCH_ATTEMPT": attempt,
                     "DISBATCH_QUEUE": "q", "DISBATCH_QUEUE_ID": "00000000000000000000beef",
                     "DISBATCH_NODE": "n1"});
    (doc, env, attempt)
}
