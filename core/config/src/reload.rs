//! What the DEN's and the DCI's SIGHUP reload and `--check-config` share: reading the file
//! again, the keys that changed, the signal loop, and the check's report.

use std::path::Path;

use serde_json::Value;

use super::{changed_keys, Config, Loaded};

/// The config file read again: its value, the checked config, and the keys that differ from
/// `accepted`; every problem in one line when it is not valid (then nothing is applied).
pub fn reread(path: &Path, accepted: &Value) -> Result<(Value, Loaded, Vec<String>), String> {
    let value = Config::read_value(path).map_err(|e| e.to_string())?;
    let written = Config::check_value(path, value.clone())
        .map_err(|problems| format!("{} problem(s): {}", problems.len(), problems.join("; ")))?;
    let changed = changed_keys(accepted, &value);
    Ok((value, written, changed))
}

/// Calls `reload` on every SIGHUP until the process ends; a refused reload keeps the running
/// config and says why. Files are read off the async workers (a file on a hung mount would
/// otherwise stall the heartbeats or `/healthz`); no file can block for long anyway, as
/// [`super::read_capped`] refuses FIFOs and devices.
pub async fn reload_on_hangup(
    path: &Path,
    mut hangups: tokio::signal::unix::Signal,
    mut reload: impl FnMut() -> Result<(), String>,
) {
    while hangups.recv().await.is_some() {
        tracing::info!(config = %path.display(), "SIGHUP received: reloading the config");
        let multi_thread = tokio::runtime::Handle::current().runtime_flavor()
            == tokio::runtime::RuntimeFlavor::MultiThread;
        let outcome = if multi_thread {
            tokio::task::block_in_place(&mut reload)
        } else {
            reload()
        };
        if let Err(reason) = outcome {
            tracing::error!(
                config = %path.display(),
                "config reload refused, the running config is kept: {reason}"
            );
        }
    }
}

/// `--check-config`'s output: `config OK: PATH` and any warnings on success, else every
/// problem, one per line (redacted, escaped); the error says how many there were.
pub fn report_check(path: &Path, problems: &[String], warnings: &[String]) -> Result<(), String> {
    for warning in warnings {
        eprintln!("warning: {}", shown(warning));
    }
    if problems.is_empty() {
        println!("config OK: {}", path.display());
        return Ok(());
    }
    for problem in problems {
        eprintln!("problem: {}", shown(problem));
    }
    Err(format!(
        "config {} has {} problem(s)",
        path.display(),
        problems.len()
    ))
}

fn shown(message: &str) -> String {
    let redacted = disbatch_model::text::redact::redact(message);
    disbatch_model::text::printable::escape(&redacted).into_owned()
}
