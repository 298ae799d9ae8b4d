//! The worker side of the Disbatch persistent-worker protocol (`plugins/PROTOCOL.md`): a
//! plugin started with `DISBATCH_WORKER_PROTOCOL=1` serves one task at a time, for as long as
//! its supervisor keeps it, over JSON lines on descriptor 3; its stdout and stderr stay the
//! task's output.
//!
//! ```no_run
//! use disbatch_worker::{Outcome, Task};
//!
//! fn main() -> std::process::ExitCode {
//!     disbatch_worker::run(|task: &Task| {
//!         println!("hello {}", task.params());
//!         Outcome::success()
//!     })
//! }
//! ```
//!
//! A binary that also runs as a process plugin checks [`requested`] first and keeps its
//! process-mode path as it was. A panic in the handler ends the worker (exit 101): the
//! supervisor fails that task, as for a process plugin that crashed, and starts another worker.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::fd::{FromRawFd, RawFd};
use std::process::ExitCode;

use nix::libc;
use serde_json::{json, Map, Value};

/// The protocol version this crate speaks.
pub const PROTOCOL: u64 = 1;
/// Set by the supervisor to the version it speaks; its presence asks for worker mode.
pub const PROTOCOL_ENV: &str = "DISBATCH_WORKER_PROTOCOL";
/// The descriptor that carries the protocol, both ways (a Unix stream socket).
pub const CHANNEL_FD: RawFd = 3;
/// The longest message line either side accepts, newline included: a task document is at
/// most 16 MiB of BSON, and its JSON (escapes, Extended JSON wrappers) can be larger.
pub const MAX_LINE: usize = 32 << 20;
/// The exit code of a worker that stops on a protocol error.
pub const PROTOCOL_ERROR_EXIT: u8 = 2;

/// Whether the supervisor asked for worker mode (the variable is set, whatever its value:
/// [`run`] checks the version).
pub fn requested() -> bool {
    std::env::var_os(PROTOCOL_ENV).is_some()
}

/// One task as the supervisor handed it over.
#[derive(Debug, Clone, PartialEq)]
pub struct Task {
    /// The task document, exactly what a process plugin reads on stdin.
    pub doc: Value,
    /// The `DISBATCH_*` facts a process plugin gets in its environment (`DISBATCH_TASK_ID`,
    /// `DISBATCH_ATTEMPT`, …), for this task only; the process environment is not changed.
    pub env: Map<String, Value>,
    /// This run's id, the fencing token (also `env["DISBATCH_ATTEMPT"]`).
    pub attempt: String,
}

impl Task {
    /// The task's `params` (null when absent).
    pub fn params(&self) -> &Value {
        self.doc.get("params").unwrap_or(&Value::Null)
    }

    /// A `DISBATCH_*` fact of this task, such as `DISBATCH_TASK_ID`.
    pub fn env(&self, name: &str) -> Option<&str> {
        self.env.get(name).and_then(Value::as_str)
    }

    /// How many attempts the task has started, this one included (0 when missing).
    pub fn attempts(&self) -> u64 {
        self.doc
            .get("attempts")
            .and_then(Value::as_u64)
            .unwrap_or(0)
    }
}

/// How a task ended: what a process plugin says with its exit code and result file.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// 0: succeeded; anything else: failed, with the code noted in the task's stderr.
    pub exit: i32,
    /// What a process plugin would write to `DISBATCH_RESULT`: an object with `status`,
    /// `retry`, `delay`, `output` (chaining) and anything else kept on the attempt record.
    /// The supervisor judges it as it judges a result file, so anything but an object fails
    /// the task, saying why.
    pub result: Option<Value>,
}

impl Outcome {
    /// Succeeded (exit 0, no result).
    pub fn success() -> Outcome {
        Outcome::exit(0)
    }

    /// Ended as a process plugin exiting with `code` would.
    pub fn exit(code: i32) -> Outcome {
        Outcome {
            exit: code,
            result: None,
        }
    }

    /// Sets one key of the result object (making the result an object if it was not one).
    pub fn with(mut self, key: &str, value: Value) -> Outcome {
        let mut map = match self.result.take() {
            Some(Value::Object(map)) => map,
            _ => Map::new(),
        };
        map.insert(key.to_string(), value);
        self.result = Some(Value::Object(map));
        self
    }

    /// The task's status (a positive integer wins over the exit code).
    pub fn status(self, status: i32) -> Outcome {
        self.with("status", json!(status))
    }

    /// Ask for another attempt after `delay_s` seconds.
    pub fn retry(self, delay_s: f64) -> Outcome {
        self.with("retry", json!(true))
            .with("delay", json!(delay_s))
    }

    /// The output handed to the queue's `then` queue (chaining).
    pub fn output(self, output: Value) -> Outcome {
        self.with("output", output)
    }
}

/// Why the worker stops without being asked to.
#[derive(Debug)]
pub enum Error {
    /// The channel failed (the supervisor went away mid-line, a write failed).
    Io(io::Error),
    /// The supervisor sent something this version does not understand.
    Protocol(String),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Io(e) => write!(f, "worker channel: {e}"),
            Error::Protocol(m) => write!(f, "worker protocol error: {m}"),
        }
    }
}

impl From<io::Error> for Error {
    fn from(e: io::Error) -> Error {
        Error::Io(e)
    }
}

/// Runs as a persistent worker on descriptor 3 until told to stop: the whole `main` of a
/// worker plugin. Exit 0 on `stop` or end of input, [`PROTOCOL_ERROR_EXIT`] otherwise (the
/// reason on stderr).
pub fn run<F: FnMut(&Task) -> Outcome>(handler: F) -> ExitCode {
    match open_channel().and_then(|(reader, writer)| serve(reader, writer, handler)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let _ = writeln!(io::stderr(), "disbatch worker: {e}");
            ExitCode::from(PROTOCOL_ERROR_EXIT)
        }
    }
}

/// Checks the version asked for and takes descriptor 3, so no child of the worker inherits it.
fn open_channel() -> Result<(BufReader<File>, File), Error> {
    let asked = std::env::var(PROTOCOL_ENV).unwrap_or_default();
    if asked.trim().parse::<u64>().ok() != Some(PROTOCOL) {
        return Err(Error::Protocol(format!(
            "{PROTOCOL_ENV}={asked:?} is not a version this worker speaks ({PROTOCOL})"
        )));
    }
    // SAFETY: fcntl on a descriptor number only reads or sets its flags.
    let flags = unsafe { libc::fcntl(CHANNEL_FD, libc::F_GETFD) };
    if flags < 0 {
        return Err(Error::Protocol(format!(
            "{PROTOCOL_ENV} is set but descriptor {CHANNEL_FD} is not open"
        )));
    }
    // SAFETY: as above; close-on-exec keeps the channel out of the plugin's own children.
    if unsafe { libc::fcntl(CHANNEL_FD, libc::F_SETFD, flags | libc::FD_CLOEXEC) } < 0 {
        return Err(Error::Io(io::Error::last_os_error()));
    }
    // SAFETY: descriptor 3 is open (checked above) and given to this worker for the protocol
    // alone; nothing else in the process owns it.
    let channel = unsafe { File::from_raw_fd(CHANNEL_FD) };
    let writer = channel.try_clone()?;
    Ok((BufReader::new(channel), writer))
}

/// The protocol loop on any reader and writer (in-memory in tests): says `ready`, then runs
/// each `task` through `handler` and answers `done`, until `stop` or end of input. On a
/// protocol error it sends an `error` message (best effort) and returns the error.
pub fn serve<R: BufRead, W: Write, F: FnMut(&Task) -> Outcome>(
    mut reader: R,
    mut writer: W,
    mut handler: F,
) -> Result<(), Error> {
    let ready = json!({"type": "ready", "protocol": PROTOCOL, "pid": std::process::id()});
    send(&mut writer, &ready)?;
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = (&mut reader)
            .take(MAX_LINE as u64)
            .read_until(b'\n', &mut line)?;
        if n == 0 {
            return Ok(());
        }
        let task = match parse_message(&line) {
            Ok(Some(task)) => task,
            Ok(None) => return Ok(()),
            Err(e) => {
                let _ = send(
                    &mut writer,
                    &json!({"type": "error", "message": e.to_string()}),
                );
                return Err(e);
            }
        };
        let outcome = handler(&task);
        // What the task printed is in its output before the supervisor learns it is done.
        let _ = io::stdout().flush();
        let _ = io::stderr().flush();
        let result = outcome.result.unwrap_or(Value::Null);
        let done = json!({"type": "done", "attempt": task.attempt, "exit": outcome.exit, "result": result});
        send(&mut writer, &done)?;
    }
}

/// One line from the supervisor: Some(task), None for `stop`.
fn parse_message(line: &[u8]) -> Result<Option<Task>, Error> {
    let bad = |m: String| Err(Error::Protocol(m));
    if line.last() != Some(&b'\n') {
        return if line.len() >= MAX_LINE {
            bad(format!("a line is longer than {MAX_LINE} bytes"))
        } else {
            bad("the channel closed in the middle of a line".into())
        };
    }
    let mut msg = match serde_json::from_slice::<Value>(line) {
        Ok(Value::Object(msg)) => msg,
        Ok(_) => return bad("a message must be a JSON object".into()),
        Err(e) => return bad(format!("a message is not valid JSON ({e})")),
    };
    match msg.get("type").and_then(Value::as_str) {
        Some("stop") => Ok(None),
        Some("task") => {
            let doc = match msg.remove("task") {
                Some(doc @ Value::Object(_)) => doc,
                _ => return bad("`task` must be the task document, an object".into()),
            };
            let env = match msg.remove("env") {
                Some(Value::Object(env)) if env.values().all(Value::is_string) => env,
                _ => return bad("`env` must be an object of strings".into()),
            };
            let attempt = match msg.remove("attempt") {
                Some(Value::String(a)) => a,
                _ => return bad("`attempt` must be a string".into()),
            };
            Ok(Some(Task { doc, env, attempt }))
        }
        Some(other) => bad(format!("unknown message type {other:?}")),
        None => bad("a message needs a string `type`".into()),
    }
}

/// Writes one message as a line and flushes it.
fn send<W: Write>(writer: &mut W, msg: &Value) -> io::Result<()> {
    let mut line = msg.to_string().into_bytes();
    line.push(b'\n');
    writer.write_all(&line)?;
    writer.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(out: &[u8]) -> Vec<Value> {
        out.split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_slice(l).expect("worker wrote JSON"))
            .collect()
    }

    fn task_line(params: Value, attempt: &str) -> String {
        let msg = json!({
            "type": "task",
            "task": {"_id": {"$oid": "0123456789abcdef01234567"}, "params": params, "attempts": 2},
            "env": {"DISBATCH_TASK_ID": "0123456789abcdef01234567", "DISBATCH_ATTEMPT": attempt},
            "attempt": attempt,
        });
        format!("{msg}\n")
    }

    #[test]
    fn says_ready_runs_each_task_and_stops_when_asked() {
        let input = format!(
            "{}{}{{\"type\":\"stop\"}}\n{}",
            task_line(json!({"n": 1}), "a1"),
            task_line(json!({"n": 2}), "a2"),
            task_line(json!({"n": 3}), "never"),
        );
        let mut out = Vec::new();
        let mut seen = Vec::new();
        serve(input.as_bytes(), &mut out, |task: &Task| {
            seen.push((
                task.params()["n"].clone(),
                task.env("DISBATCH_ATTEMPT").map(str::to_string),
            ));
            assert_eq!(task.attempts(), 2);
            if task.params()["n"] == 2 {
                Outcome::exit(3)
                    .status(7)
                    .retry(1.5)
                    .output(json!({"k": "v"}))
            } else {
                Outcome::success()
            }
        })
        .expect("clean stop");
        assert_eq!(seen.len(), 2, "nothing runs after stop: {seen:?}");
        assert_eq!(seen[1], (json!(2), Some("a2".to_string())));
        let msgs = lines(&out);
        assert_eq!(msgs[0]["type"], "ready");
        assert_eq!(msgs[0]["protocol"], 1);
        assert_eq!(
            msgs[1],
            json!({"type": "done", "attempt": "a1", "exit": 0, "result": null})
        );
        assert_eq!(
            msgs[2],
            json!({"type": "done", "attempt": "a2", "exit": 3,
                   "result": {"status": 7, "retry": true, "delay": 1.5, "output": {"k": "v"}}})
        );
        assert_eq!(msgs.len(), 3);
    }

    #[test]
    fn end_of_input_between_tasks_is_a_clean_stop() {
        let mut out = Vec::new();
        serve(
            task_line(json!({}), "a").as_bytes(),
            &mut out,
            |_: &Task| Outcome::success(),
        )
        .expect("clean");
        assert_eq!(lines(&out).len(), 2);
    }

    #[test]
    fn malformed_input_is_a_protocol_error_reported_on_the_channel() {
        let cases = [
            ("not json\n", "not valid JSON"),
            ("[1]\n", "JSON object"),
            ("{\"type\":\"dance\"}\n", "unknown message type"),
            (
                "{\"type\":\"task\",\"task\":{},\"env\":{\"A\":1},\"attempt\":\"x\"}\n",
                "`env`",
            ),
            (
                "{\"type\":\"task\",\"task\":[],\"env\":{},\"attempt\":\"x\"}\n",
                "`task`",
            ),
            ("{\"type\":\"task\",\"task\":{},\"env\":{}}\n", "`attempt`"),
            ("{\"type\":\"stop\"", "middle of a line"),
        ];
        for (input, want) in cases {
            let mut out = Vec::new();
            let mut ran = false;
            let err = serve(input.as_bytes(), &mut out, |_: &Task| {
                ran = true;
                Outcome::success()
            })
            .expect_err(input);
            assert!(err.to_string().contains(want), "{input}: {err}");
            assert!(!ran, "{input}");
            let msgs = lines(&out);
            assert_eq!(msgs[1]["type"], "error", "{input}");
            assert!(msgs[1]["message"]
                .as_str()
                .is_some_and(|m| m.contains(want)));
        }
    }

    #[test]
    fn a_line_over_the_limit_is_refused_without_reading_it_all() {
        let long = vec![b' '; MAX_LINE + 10];
        let mut out = Vec::new();
        let err =
            serve(long.as_slice(), &mut out, |_: &Task| Outcome::success()).expect_err("too long");
        assert!(err.to_string().contains("longer than"), "{err}");
    }
}
