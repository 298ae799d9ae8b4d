//! Process logging for the binaries: `RUST_LOG`-filtered, to stderr, colour only on a terminal,
//! every line and the final error passed through the credential redactor.

use std::io::Write;
use std::process::ExitCode;

use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::{EnvFilter, Registry};

use disbatch_model::text::redact::redact;

/// How log lines are written: human-readable text (the default) or one JSON object per line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

impl LogFormat {
    pub fn as_str(self) -> &'static str {
        match self {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        }
    }
}

impl std::str::FromStr for LogFormat {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        match text.trim().to_ascii_lowercase().as_str() {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            _ => Err(format!(
                "{text:?} is not a log format; use \"text\" or \"json\""
            )),
        }
    }
}

/// The variable a DEN sets for its task runners, so their lines (on the node's stderr) are
/// written in the node's format.
pub const LOG_FORMAT_ENV: &str = "DISBATCH_LOG_FORMAT";

/// The format chosen at start, for the final error line (`exit_status`).
static FORMAT: std::sync::OnceLock<LogFormat> = std::sync::OnceLock::new();

/// Whether `RUST_LOG` is set: it then wins over any configured level, now and on reloads.
fn rust_log() -> Option<String> {
    std::env::var("RUST_LOG")
        .ok()
        .filter(|v| !v.trim().is_empty())
}

/// Checks a `log_level` value (a level such as `info`, or any `RUST_LOG`-style filter).
pub fn check_level(level: &str) -> Result<(), String> {
    tracing_subscriber::EnvFilter::builder()
        .parse(level)
        .map(|_| ())
        .map_err(|e| format!("{level:?} is not a log level or filter: {e}"))
}

/// The handle on the installed subscriber: its level can change while the process runs.
#[derive(Clone)]
pub struct Logging {
    filter: Option<tracing_subscriber::reload::Handle<EnvFilter, Registry>>,
}

impl Logging {
    /// Applies a configured level (None: `default`); `RUST_LOG`, when set, wins. Returns the
    /// filter now in force.
    pub fn set_level(&self, level: Option<&str>, default: &str) -> Result<String, String> {
        let wanted = rust_log().unwrap_or_else(|| level.unwrap_or(default).to_string());
        let filter = EnvFilter::builder()
            .parse(&wanted)
            .map_err(|e| format!("{wanted:?} is not a log level or filter: {e}"))?;
        if let Some(handle) = &self.filter {
            handle
                .reload(filter)
                .map_err(|e| format!("could not change the log level: {e}"))?;
        }
        Ok(wanted)
    }

    /// True when `RUST_LOG` decides the level, so a configured `log_level` is not used.
    pub fn level_from_env(&self) -> bool {
        rust_log().is_some()
    }
}

/// Installs the global subscriber writing in `format`; the level is `RUST_LOG` when set,
/// else `level`, and can be changed later through the returned handle.
pub fn init(format: LogFormat, level: &str) -> Logging {
    use std::io::IsTerminal;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let wanted = rust_log().unwrap_or_else(|| level.to_string());
    // A bad RUST_LOG falls back to the default, as before; configured levels are checked
    // with the config.
    let filter = EnvFilter::builder()
        .parse(&wanted)
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let (filter, handle) = tracing_subscriber::reload::Layer::new(filter);
    let registry = tracing_subscriber::registry().with(filter);
    // Text or JSON is chosen once: the JSON formatter expects every span to have been
    // recorded by it, so it cannot replace the text one while the process runs.
    let installed = match format {
        LogFormat::Text => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .with_writer(RedactedStderr)
                    .with_ansi(std::io::stderr().is_terminal()),
            )
            .try_init(),
        LogFormat::Json => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .flatten_event(true)
                    .with_writer(RedactedStderr),
            )
            .try_init(),
    };
    let _ = FORMAT.set(format);
    Logging {
        // Another subscriber was installed first (a test): this handle would change nothing.
        filter: installed.is_ok().then_some(handle),
    }
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
    if FORMAT.get() == Some(&LogFormat::Json) {
        // Through the subscriber: one JSON object like every other line, redacted there.
        tracing::error!("{}", redact(message));
        return;
    }
    let text = error_line(message);
    let _ = writeln!(std::io::stderr(), "Error: {text}");
}

fn error_line(message: &str) -> String {
    disbatch_model::text::printable::escape(&redact(message)).into_owned()
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
