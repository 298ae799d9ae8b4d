//! Turns a plugin's exit and result file into the task's final status (pure decisions).

use std::process::ExitStatus;

use disbatch_core::model::status;
use serde_json::Value;

/// How the plugin process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Code(i32),
    Signal(i32),
}

impl From<ExitStatus> for Exit {
    fn from(s: ExitStatus) -> Exit {
        use std::os::unix::process::ExitStatusExt;
        match (s.code(), s.signal()) {
            (Some(code), _) => Exit::Code(code),
            (None, Some(sig)) => Exit::Signal(sig),
            (None, None) => Exit::Code(-1),
        }
    }
}

/// The final status and any note the runner adds to stderr.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub status: i32,
    pub note: Option<String>,
}

/// Exit 0 → succeeded, non-zero or a signal → failed; a positive integer `status` in the
/// result file wins. A result file that is not a JSON object fails the task, with the reason.
pub fn decide(exit: Exit, result_file: Option<&[u8]>) -> Outcome {
    let mut notes = Vec::new();
    let mut status = match exit {
        Exit::Code(0) => status::SUCCEEDED,
        Exit::Code(code) => {
            notes.push(format!("plugin exited with code {code}"));
            status::FAILED
        }
        Exit::Signal(sig) => {
            notes.push(format!(
                "plugin was killed by signal {sig} ({})",
                signal_name(sig)
            ));
            status::FAILED
        }
    };
    match result_file.map(parse_result) {
        None => {}
        Some(Ok(Some(from_result))) => status = from_result,
        Some(Ok(None)) => {}
        Some(Err(reason)) => {
            notes.push(format!("DISBATCH_RESULT file ignored: {reason}"));
            status = status::FAILED;
        }
    }
    // A plugin that exited non-zero but reported its own status only gets its exit noted
    // when that status is a failure; a signal is always worth saying.
    let note = (!notes.is_empty()).then(|| notes.join("; "));
    Outcome { status, note }
}

/// The `status` the plugin asked for: Ok(None) when absent or not a positive integer.
fn parse_result(bytes: &[u8]) -> Result<Option<i32>, String> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    let value: Value =
        serde_json::from_slice(bytes).map_err(|e| format!("it is not valid JSON ({e})"))?;
    let Value::Object(map) = value else {
        return Err("it must hold a JSON object such as {\"status\": 1}".into());
    };
    Ok(map
        .get("status")
        .and_then(Value::as_i64)
        .filter(|s| *s >= 1 && *s <= i32::MAX as i64)
        .map(|s| s as i32))
}

fn signal_name(sig: i32) -> String {
    nix::sys::signal::Signal::try_from(sig)
        .map(|s| s.as_str().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_map_to_disbatch_statuses() {
        assert_eq!(
            decide(Exit::Code(0), None),
            Outcome {
                status: 1,
                note: None
            }
        );
        let failed = decide(Exit::Code(3), None);
        assert_eq!(failed.status, 2);
        assert!(failed.note.as_deref().is_some_and(|n| n.contains("code 3")));
    }

    #[test]
    fn death_by_signal_fails_and_names_the_signal() {
        let o = decide(Exit::Signal(9), None);
        assert_eq!(o.status, 2);
        assert!(
            o.note.as_deref().is_some_and(|n| n.contains("SIGKILL")),
            "{o:?}"
        );
    }

    #[test]
    fn a_positive_status_in_the_result_file_wins() {
        assert_eq!(decide(Exit::Code(1), Some(br#"{"status": 1}"#)).status, 1);
        assert_eq!(
            decide(Exit::Code(0), Some(br#"{"status": 7, "output": {}}"#)).status,
            7
        );
        // Zero, negative or non-integer statuses are not positive: the exit code decides.
        assert_eq!(decide(Exit::Code(0), Some(br#"{"status": 0}"#)).status, 1);
        assert_eq!(decide(Exit::Code(0), Some(br#"{"status": -2}"#)).status, 1);
        assert_eq!(decide(Exit::Code(0), Some(br#"{"status": "1"}"#)).status, 1);
        assert_eq!(decide(Exit::Code(0), Some(b"  \n")).status, 1);
    }

    #[test]
    fn a_malformed_result_file_fails_the_task_with_the_reason() {
        let o = decide(Exit::Code(0), Some(b"{not json"));
        assert_eq!(o.status, 2);
        assert!(o
            .note
            .as_deref()
            .is_some_and(|n| n.contains("not valid JSON")));
        let o = decide(Exit::Code(0), Some(b"[1]"));
        assert_eq!(o.status, 2);
        assert!(o.note.as_deref().is_some_and(|n| n.contains("JSON object")));
    }
}
