//! `disbatchd --check-config`: every problem of a config file, without connecting to anything.

use std::path::Path;

use disbatch_config::Config;

use crate::runners::executor::{check_runner, default_runner};

/// Prints `config OK: PATH` (and any warnings), or every problem, each naming its key; the
/// error says how many there were.
pub fn check_config(path: &Path) -> anyhow::Result<()> {
    let (problems, warnings) = match Config::check(path) {
        Ok(loaded) => node_checks(&loaded.config, loaded.warnings),
        Err(problems) => (problems, Vec::new()),
    };
    disbatch_config::reload::report_check(path, &problems, &warnings).map_err(anyhow::Error::msg)
}

/// What disbatchd itself refuses at start (a `mongohost` the driver cannot use, a runner it
/// cannot execute), and what it only warns about (plugins not installed, `plugin_user`
/// without root).
fn node_checks(config: &Config, mut warnings: Vec<String>) -> (Vec<String>, Vec<String>) {
    let mut problems: Vec<String> = disbatch_store::mongohost_problem(config)
        .into_iter()
        .collect();
    if let Err(e) = check_runner(&default_runner(config.task_runner.as_deref())) {
        let key = if config.task_runner.is_some() {
            "key `task_runner`"
        } else {
            "the default task runner (no `task_runner`)"
        };
        problems.push(format!("{key}: {e}"));
    }
    for name in config.plugins.names() {
        if let Err(e) = config.plugins.resolve(name) {
            warnings.push(format!("key `plugins`: {e}"));
        }
    }
    if config.plugin_user.is_some() && !nix::unistd::geteuid().is_root() {
        warnings.push(
            "key `plugin_user`: disbatchd must run as root to use it (this check does not)"
                .to_string(),
        );
    }
    (problems, warnings)
}
