//! Disbatch echo plugin: prints the task's `params` as JSON and honours test-oriented options.
//!
//! Options (keys of `params`, applied in this order; `null` means absent except for `result`):
//! `stderr` (string) is written to stderr; `append_to` (path) gets `$DISBATCH_TASK_ID` and a
//! newline appended; `sleep_ms` (integer) sleeps; `invalid_utf8` (bool) writes non-UTF-8 bytes
//! to stdout; `result` (any JSON) is written to `$DISBATCH_RESULT`; `abort` (bool) dies by
//! SIGABRT; `exit_code` (0..=255) is the exit code. For the reliability tests: `ignore_term`
//! (bool) ignores SIGTERM (applied first); `print_env` (array of names) prints `NAME=value` or
//! `NAME unset` lines after the params; `sleep_first_ms` (integer) sleeps only on the task's
//! first attempt (the task document's `attempts` is 1 or missing), after `sleep_ms`. For live
//! output: `lines` (integer) prints that many lines `line I UNIX_MS` (I from 1, the time it
//! was printed in milliseconds), `line_ms` (integer) apart, each padded with `line_pad`
//! (integer) `x`s, after `print_env`. `print_pid` (bool) prints `pid N` (its process id) after
//! the params, so tests can tell which worker ran a task. `leak_mb` (integer) allocates that
//! many MiB and never frees them: a leaking worker, for `worker_max_rss_mb`. `hold_until`
//! (path) is a gate a test opens: after `append_to` (which tells the test the task has
//! started) the plugin waits until that path exists, so a test acts while the task provably
//! runs instead of guessing a `sleep_ms` window; it gives up with exit code 4 after 10 minutes
//! so that a forgotten gate cannot hold a process for ever. `hold_until` may also be an array
//! of paths, gates opened in turn: after each gate but the last, `lines` more lines (numbered
//! on) are printed before the next, so a test releases output step by step and sees each step
//! arrive while the task still runs.
//!
//! Exit codes besides `exit_code`: 2 bad input, 3 output write error, 4 file/env error.
//!
//! Started with `DISBATCH_WORKER_PROTOCOL` it is a persistent worker (plugins/PROTOCOL.md)
//! doing the same per task: the `DISBATCH_*` facts come from the task message instead of the
//! environment, `result` goes back in the `done` message, the exit code is the `done`'s
//! `exit`; `abort` kills the worker (the supervisor fails the task and starts another) and
//! `ignore_term` lasts for the rest of the worker's life.

use serde_json::{Map, Value};
use std::fs::OpenOptions;
use std::io::{self, Read, Write};
use std::process::ExitCode;
use std::time::Duration;

/// A fatal error: the exit code and the message printed on stderr.
struct Fail {
    code: u8,
    msg: String,
}

impl Fail {
    fn new(code: u8, msg: impl Into<String>) -> Self {
        Fail {
            code,
            msg: msg.into(),
        }
    }
}

/// The options read from `params`, validated before any side effect.
#[derive(Default)]
struct Options {
    stderr: Option<String>,
    append_to: Option<String>,
    sleep_ms: Option<u64>,
    hold_until: Vec<String>,
    invalid_utf8: bool,
    result: Option<Value>,
    abort: bool,
    exit_code: u8,
    ignore_term: bool,
    print_env: Vec<String>,
    print_pid: bool,
    leak_mb: u64,
    sleep_first_ms: Option<u64>,
    lines: u64,
    line_ms: u64,
    line_pad: usize,
}

/// What one run of the plugin is told, wherever it came from (stdin and the environment, or
/// a worker's task message).
struct Input<'a> {
    params: Value,
    attempts: u64,
    env: &'a dyn Fn(&str) -> Option<String>,
}

fn main() -> ExitCode {
    if disbatch_worker::requested() {
        return disbatch_worker::run(serve_task);
    }
    let outcome = read_params().and_then(|(params, attempts)| {
        let env = |name: &str| std::env::var(name).ok();
        let input = Input {
            params,
            attempts,
            env: &env,
        };
        run(&input, write_result)
    });
    match outcome {
        Ok(code) => ExitCode::from(code),
        Err(fail) => {
            let _ = writeln!(io::stderr(), "disbatch-plugin-echo: {}", fail.msg);
            ExitCode::from(fail.code)
        }
    }
}

/// One task in worker mode: the same as a process run, the result kept for the `done` message.
fn serve_task(task: &disbatch_worker::Task) -> disbatch_worker::Outcome {
    let env = |name: &str| task.env(name).map(str::to_string);
    let input = Input {
        params: task.params().clone(),
        attempts: task.attempts(),
        env: &env,
    };
    let mut kept = None;
    let code = match run(&input, |result| {
        kept = Some(result.clone());
        Ok(())
    }) {
        Ok(code) => i32::from(code),
        Err(fail) => {
            let _ = writeln!(io::stderr(), "disbatch-plugin-echo: {}", fail.msg);
            i32::from(fail.code)
        }
    };
    disbatch_worker::Outcome {
        exit: code,
        result: kept,
    }
}

fn run(
    input: &Input<'_>,
    write_result: impl FnOnce(&Value) -> Result<(), Fail>,
) -> Result<u8, Fail> {
    let (params, attempts) = (&input.params, input.attempts);
    let opts = match params {
        Value::Object(map) => parse_options(map)?,
        _ => Options::default(),
    };
    if opts.ignore_term {
        // SAFETY: installs SIG_IGN, no handler code runs.
        unsafe {
            nix::sys::signal::signal(
                nix::sys::signal::SIGTERM,
                nix::sys::signal::SigHandler::SigIgn,
            )
        }
        .map_err(|e| Fail::new(4, format!("cannot ignore SIGTERM: {e}")))?;
    }
    let line = format!("{params}\n");
    write_stdout(line.as_bytes())?;
    if opts.print_pid {
        write_stdout(format!("pid {}\n", std::process::id()).as_bytes())?;
    }
    if opts.leak_mb > 0 {
        // Touched, so it is resident, and leaked on purpose.
        let leaked = vec![1u8; (opts.leak_mb as usize).saturating_mul(1024 * 1024)];
        std::mem::forget(leaked);
    }
    for name in &opts.print_env {
        let line = match (input.env)(name) {
            Some(v) => format!("{name}={v}\n"),
            None => format!("{name} unset\n"),
        };
        write_stdout(line.as_bytes())?;
    }
    print_lines(&opts, 1)?;
    if let Some(text) = &opts.stderr {
        io::stderr()
            .write_all(text.as_bytes())
            .and_then(|()| io::stderr().flush())
            .map_err(|e| Fail::new(3, format!("cannot write to stderr: {e}")))?;
    }
    if let Some(path) = &opts.append_to {
        append_task_id(path, input.env)?;
    }
    for (k, path) in opts.hold_until.iter().enumerate() {
        if k > 0 {
            print_lines(&opts, k as u64 * opts.lines + 1)?;
        }
        wait_for_gate(path)?;
    }
    if let Some(ms) = opts.sleep_ms {
        std::thread::sleep(Duration::from_millis(ms));
    }
    if let Some(ms) = opts.sleep_first_ms.filter(|_| attempts <= 1) {
        std::thread::sleep(Duration::from_millis(ms));
    }
    if opts.invalid_utf8 {
        write_stdout(b"bad:\xff\xfe:end\n")?;
    }
    if let Some(result) = &opts.result {
        write_result(result)?;
    }
    if opts.abort {
        std::process::abort();
    }
    Ok(opts.exit_code)
}

/// Reads the task document from stdin and returns its `params` (null if missing) and how
/// many attempts it has started (0 if missing).
fn read_params() -> Result<(Value, u64), Fail> {
    let mut input = Vec::new();
    io::stdin()
        .read_to_end(&mut input)
        .map_err(|e| Fail::new(2, format!("cannot read the task document from stdin: {e}")))?;
    let task: Value = serde_json::from_slice(&input)
        .map_err(|e| Fail::new(2, format!("stdin is not a valid JSON task document: {e}")))?;
    match task {
        Value::Object(mut task) => {
            let attempts = task.get("attempts").and_then(Value::as_u64).unwrap_or(0);
            Ok((task.remove("params").unwrap_or(Value::Null), attempts))
        }
        _ => Err(Fail::new(
            2,
            "stdin is not a JSON object (expected the task document)",
        )),
    }
}

/// Validates the option keys of `params`.
fn parse_options(params: &Map<String, Value>) -> Result<Options, Fail> {
    let get = |key: &str| params.get(key).filter(|v| !v.is_null());
    let bad = |key: &str, want: &str| Fail::new(2, format!("params.{key} must be {want}"));
    let string = |key: &str| match get(key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(bad(key, "a string")),
    };
    let flag = |key: &str| match get(key) {
        None => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(bad(key, "a boolean")),
    };
    let sleep_ms = match get("sleep_ms") {
        None => None,
        Some(v) => Some(
            v.as_u64()
                .ok_or_else(|| bad("sleep_ms", "a non-negative integer"))?,
        ),
    };
    let count = |key: &str| match get(key) {
        None => Ok(0),
        Some(v) => v.as_u64().ok_or_else(|| bad(key, "a non-negative integer")),
    };
    let sleep_first_ms = match get("sleep_first_ms") {
        None => None,
        Some(v) => Some(
            v.as_u64()
                .ok_or_else(|| bad("sleep_first_ms", "a non-negative integer"))?,
        ),
    };
    // A list of strings; `one` also takes a single string as a list of one.
    let strings = |key: &str, want: &str, one: bool| match get(key) {
        None => Ok(Vec::new()),
        Some(Value::String(s)) if one => Ok(vec![s.clone()]),
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| v.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| bad(key, want)),
        Some(_) => Err(bad(key, want)),
    };
    let print_env = strings("print_env", "an array of strings", false)?;
    let exit_code = match get("exit_code") {
        None => 0,
        Some(v) => v
            .as_u64()
            .and_then(|n| u8::try_from(n).ok())
            .ok_or_else(|| bad("exit_code", "an integer in 0..=255"))?,
    };
    Ok(Options {
        stderr: string("stderr")?,
        append_to: string("append_to")?,
        sleep_ms,
        hold_until: strings("hold_until", "a path or an array of paths", true)?,
        invalid_utf8: flag("invalid_utf8")?,
        result: params.get("result").cloned(),
        abort: flag("abort")?,
        exit_code,
        ignore_term: flag("ignore_term")?,
        print_env,
        print_pid: flag("print_pid")?,
        leak_mb: count("leak_mb")?.min(4096),
        sleep_first_ms,
        lines: count("lines")?,
        line_ms: count("line_ms")?,
        line_pad: count("line_pad")? as usize,
    })
}

/// Prints `opts.lines` lines `line I UNIX_MS`, I from `first`, `line_ms` apart.
fn print_lines(opts: &Options, first: u64) -> Result<(), Fail> {
    for i in first..first + opts.lines {
        if i > first && opts.line_ms > 0 {
            std::thread::sleep(Duration::from_millis(opts.line_ms));
        }
        let ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        let line = format!("line {i} {ms}{}\n", "x".repeat(opts.line_pad));
        write_stdout(line.as_bytes())?;
    }
    Ok(())
}

/// Writes bytes to stdout and flushes, so output survives a later abort.
fn write_stdout(bytes: &[u8]) -> Result<(), Fail> {
    let mut out = io::stdout().lock();
    out.write_all(bytes)
        .and_then(|()| out.flush())
        .map_err(|e| Fail::new(3, format!("cannot write to stdout: {e}")))
}

/// Appends `$DISBATCH_TASK_ID\n` to `path` in a single write.
fn append_task_id(path: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<(), Fail> {
    let id = env("DISBATCH_TASK_ID").ok_or_else(|| {
        Fail::new(
            4,
            "cannot use DISBATCH_TASK_ID for append_to: environment variable not found",
        )
    })?;
    let line = format!("{id}\n");
    OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
        .and_then(|mut file| file.write_all(line.as_bytes()))
        .map_err(|e| Fail::new(4, format!("cannot append to {path}: {e}")))
}

/// Blocks until `path` exists: the test's gate. Polled, because the gate is a plain file a
/// test creates (no inotify dependency for a test plugin); 10 ms costs nothing beside a task.
fn wait_for_gate(path: &str) -> Result<(), Fail> {
    const GIVE_UP: Duration = Duration::from_secs(600);
    let start = std::time::Instant::now();
    while !std::path::Path::new(path).exists() {
        if start.elapsed() > GIVE_UP {
            return Err(Fail::new(
                4,
                format!("hold_until: {path} did not appear in 600 s"),
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

/// Writes `result` as JSON to the `$DISBATCH_RESULT` file.
fn write_result(result: &Value) -> Result<(), Fail> {
    let path = std::env::var_os("DISBATCH_RESULT")
        .ok_or_else(|| Fail::new(4, "params.result given but DISBATCH_RESULT is not set"))?;
    std::fs::write(&path, result.to_string()).map_err(|e| {
        let shown = path.to_string_lossy();
        Fail::new(4, format!("cannot write result file {shown}: {e}"))
    })
}
