//! Disbatch demo plugin: a port of Perl `Disbatch::Plugin::Demo` driven by `params.commands`.
//!
//! Each character of `params.commands` is a command (`*` stands for `abc`):
//! `a` prints a line to stdout, `b` prints a harmless error line to stderr, `c` prints an
//! error line to stderr and fails the task, `1`/`7`/`8`/`e` write 1/7/8/15 MiB of that
//! character to stdout and `A`/`B`/`C`/`E` do the same on stderr. Anything else is ignored.
//!
//! Exit codes: 0 success, 1 task failed (`c`), 2 bad task document, 3 output write error.

use serde_json::Value;
use std::io::{self, BufWriter, Read, Write};
use std::process::ExitCode;

const MIB: usize = 1024 * 1024;
const CHUNK: usize = 64 * 1024;

const APPLE: &str = "This is command 'a' for apple.\n";
const BANANA: &str = "This is command 'b' for banana: an error that does not fail the task.\n";
const CHERRY: &str = "This is command 'c' for cherry: this error fails the task.\n";

/// An output write failure, naming the stream that failed.
struct WriteError {
    stream: &'static str,
    source: io::Error,
}

fn main() -> ExitCode {
    let commands = match read_commands() {
        Ok(commands) => commands,
        Err(msg) => {
            note(&msg);
            return ExitCode::from(2);
        }
    };
    let status = match run_and_flush(&commands) {
        Ok(status) => status,
        Err(e) => {
            note(&format!("cannot write to {}: {}", e.stream, e.source));
            return ExitCode::from(3);
        }
    };
    write_result(status);
    ExitCode::from(if status == 1 { 0 } else { 1 })
}

/// Prints a diagnostic on stderr, ignoring failures (there is nowhere else to report them).
fn note(msg: &str) {
    let _ = writeln!(io::stderr(), "disbatch-plugin-demo: {msg}");
}

/// Reads the task document from stdin and returns `params.commands` with `*` expanded.
fn read_commands() -> Result<String, String> {
    let mut input = Vec::new();
    io::stdin()
        .read_to_end(&mut input)
        .map_err(|e| format!("cannot read the task document from stdin: {e}"))?;
    let task: Value = serde_json::from_slice(&input)
        .map_err(|e| format!("stdin is not a valid JSON task document: {e}"))?;
    let Value::Object(task) = task else {
        return Err("stdin is not a JSON object (expected the task document)".to_string());
    };
    match task.get("params").and_then(|params| params.get("commands")) {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(commands)) => Ok(commands.replace('*', "abc")),
        Some(other) => Err(format!("params.commands must be a string, got {other}")),
    }
}

/// Runs the commands on locked, buffered stdout/stderr and flushes both.
/// Returns the task status: 1 (success) or 2 (failed).
fn run_and_flush(commands: &str) -> Result<u8, WriteError> {
    let stdout = io::stdout();
    let stderr = io::stderr();
    let mut out = BufWriter::with_capacity(CHUNK, stdout.lock());
    let mut err = BufWriter::with_capacity(CHUNK, stderr.lock());
    let result = run(commands, &mut out, &mut err);
    // Flush both streams even if one of them failed, then report the first failure.
    let flushed_out = out.flush().map_err(on("stdout"));
    let flushed_err = err.flush().map_err(on("stderr"));
    let status = result?;
    flushed_out?;
    flushed_err?;
    Ok(status)
}

/// Executes each command character in order.
fn run(commands: &str, out: &mut impl Write, err: &mut impl Write) -> Result<u8, WriteError> {
    let mut status = 1;
    for ch in commands.chars() {
        match ch {
            'a' => out.write_all(APPLE.as_bytes()).map_err(on("stdout"))?,
            'b' => err.write_all(BANANA.as_bytes()).map_err(on("stderr"))?,
            'c' => {
                err.write_all(CHERRY.as_bytes()).map_err(on("stderr"))?;
                status = 2;
            }
            '1' | '7' | '8' | 'e' => fill(out, ch, "stdout")?,
            'A' | 'B' | 'C' | 'E' => fill(err, ch, "stderr")?,
            _ => {}
        }
    }
    Ok(status)
}

/// Number of MiB a bulk-output command writes.
fn mebibytes(ch: char) -> usize {
    match ch {
        '1' | 'A' => 1,
        '7' | 'B' => 7,
        '8' | 'C' => 8,
        'e' | 'E' => 15,
        _ => 0,
    }
}

/// Writes `mebibytes(ch)` MiB of the ASCII character `ch` in fixed-size chunks.
fn fill(w: &mut impl Write, ch: char, stream: &'static str) -> Result<(), WriteError> {
    let byte = u8::try_from(ch).unwrap_or(b'?');
    let chunk = [byte; CHUNK];
    let mut remaining = mebibytes(ch) * MIB;
    while remaining > 0 {
        let n = remaining.min(CHUNK);
        w.write_all(&chunk[..n]).map_err(on(stream))?;
        remaining -= n;
    }
    Ok(())
}

/// Builds a `map_err` adapter that tags an I/O error with its stream name.
fn on(stream: &'static str) -> impl Fn(io::Error) -> WriteError {
    move |source| WriteError { stream, source }
}

/// Writes `{"status": N}` to `$DISBATCH_RESULT` if set; failures are only noted on stderr.
fn write_result(status: u8) {
    let Some(path) = std::env::var_os("DISBATCH_RESULT") else {
        return;
    };
    let body = format!("{{\"status\": {status}}}");
    if let Err(e) = std::fs::write(&path, body) {
        note(&format!(
            "cannot write result file {}: {e}",
            path.to_string_lossy()
        ));
    }
}
