//! `disbatch-web --check-config`: every problem of a config file, without connecting or listening.

use std::path::Path;

use disbatch_config::Config;

/// Prints `config OK: PATH` (and any warnings), or every problem, each naming its key; the
/// error says how many there were.
pub fn check_config(path: &Path) -> anyhow::Result<()> {
    let (problems, warnings) = match Config::check(path) {
        Ok(loaded) => (web_checks(&loaded.config), loaded.warnings),
        Err(problems) => (problems, Vec::new()),
    };
    disbatch_config::reload::report_check(path, &problems, &warnings).map_err(anyhow::Error::msg)
}

/// What disbatch-web refuses at start besides the config itself: a `mongohost` the driver
/// cannot use, certificates it cannot use.
fn web_checks(config: &Config) -> Vec<String> {
    let mut problems: Vec<String> = disbatch_store::mongohost_problem(config)
        .into_iter()
        .collect();
    let Some(files) = &config.web.tls else {
        return problems;
    };
    if let Err(e) = crate::tls::server_config(files) {
        problems.push(format!("key `web.tls`: {e:#}"));
    } else if let Err(e) = crate::tls::certificate_names(files) {
        problems.push(format!("key `web.tls.cert_file`: {e:#}"));
    }
    problems
}
