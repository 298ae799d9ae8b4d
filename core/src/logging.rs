//! Process logging for the binaries: `RUST_LOG`-filtered, to stderr, colour only on a terminal,
//! every line and the final error passed through the credential redactor.

use std::io::Write;
use std::process::ExitCode;

use tracing_subscriber::fmt::MakeWriter;

use crate::redact::redact;

/// Installs the global subscriber; `default_filter` applies when `RUST_LOG` is unset.
pub fn init_logging(default_filter: &str) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(RedactedStderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

/// The exit status of a binary's `main` for `result`; an error is printed on stderr as
/// `Error: ` and its causes on one line (`{:#}`), redacted, with control characters escaped.
/// Rust's default for `main() -> Result` prints the Debug form instead, unredacted and with a
/// backtrace when `RUST_BACKTRACE` is set.
pub fn exit_status<E: std::fmt::Display>(result: Result<(), E>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            print_error(&format!("{e:#}"));
            ExitCode::FAILURE
        }
    }
}

/// Prints `Error: {message}` on stderr, redacted and with control characters escaped.
pub fn print_error(message: &str) {
    let text = error_line(message);
    let _ = writeln!(std::io::stderr(), "Error: {text}");
}

fn error_line(message: &str) -> String {
    crate::printable::escape(&redact(message)).into_owned()
}

/// Hands tracing a fresh buffer per event; the buffer is redacted and written whole when the
/// event is done (tracing formats one event into one buffer, so a secret is never split).
struct RedactedStderr;

impl<'a> MakeWriter<'a> for RedactedStderr {
    type Writer = RedactedLine;

    fn make_writer(&'a self) -> RedactedLine {
        RedactedLine(Vec::new())
    }
}

struct RedactedLine(Vec<u8>);

impl Write for RedactedLine {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for RedactedLine {
    fn drop(&mut self) {
        if self.0.is_empty() {
            return;
        }
        let text = String::from_utf8_lossy(&self.0);
        // Nowhere to report a failed write to stderr: the line is lost either way.
        let _ = std::io::stderr().write_all(redact(&text).as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_written_in_pieces_is_redacted_whole() {
        let mut line = RedactedLine(Vec::new());
        line.write_all(b"error=parsing mongodb://u:pa")
            .expect("write");
        line.write_all(b"ss-word@h/ failed\n").expect("write");
        assert_eq!(
            redact(&String::from_utf8_lossy(&line.0)),
            "error=parsing mongodb://u:***@h/ failed\n"
        );
        line.0.clear();
    }

    #[test]
    fn the_final_error_is_redacted_and_on_one_visible_line() {
        assert_eq!(
            error_line("config file c.json: key `mongohost`: \"mongodbx://u:s3cret@h/\"\x1b[2J"),
            "config file c.json: key `mongohost`: \"mongodbx://u:***@h/\"\\u{1b}[2J"
        );
    }
}
