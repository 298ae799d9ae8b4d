//! The environment a node gives its task runners: what a runner or its plugins may use, and
//! none of the node's other variables (a runner's environment is one more place to leak from).

use std::ffi::OsString;

use disbatch_config::plugin_env::PluginEnv;

/// What the runner itself reads: its log filter, backtraces, and where it spools output.
/// Plugins get these only if `plugin_env` names them.
/// The credentials a runner may take from the environment (its own user's password and the
/// connection string) pass to it; the runner never hands `DISBATCH_*` variables to plugins.
const RUNNER_OWN: &[&str] = &[
    "RUST_LOG",
    "RUST_BACKTRACE",
    "RUST_LIB_BACKTRACE",
    "TMPDIR",
    "DISBATCH_MONGOHOST",
    "DISBATCH_AUTH_TASK_RUNNER",
];

/// The node's variables a runner starts with: its own, plus whatever the plugin allow-list
/// lets through (the runner filters again for each plugin). Inherited `DISBATCH_*` variables
/// stay behind: the runner sets its plugins' own.
pub fn runner_env(
    node_env: impl IntoIterator<Item = (OsString, OsString)>,
    plugins: &PluginEnv,
) -> Vec<(OsString, OsString)> {
    node_env
        .into_iter()
        .filter(|(name, _)| {
            name.to_str()
                .is_some_and(|n| RUNNER_OWN.contains(&n) || plugins.allows(n))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(env: &[(&str, &str)], plugins: &PluginEnv) -> Vec<String> {
        let given = env
            .iter()
            .map(|(k, v)| (OsString::from(k), OsString::from(v)));
        runner_env(given, plugins)
            .into_iter()
            .map(|(k, _)| k.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn a_runner_gets_its_own_variables_and_the_allow_list_only() {
        let env = [
            ("PATH", "/usr/bin"),
            ("HOME", "/root"),
            ("LC_ALL", "C"),
            ("RUST_LOG", "debug"),
            ("RUST_BACKTRACE", "1"),
            ("TMPDIR", "/var/tmp"),
            ("AWS_SECRET_ACCESS_KEY", "s3cr3t"),
            ("MONGO_PASSWORD", "s3cr3t"),
            ("DISBATCH_PASSWORD", "s3cr3t"),
            ("DISBATCH_TOKEN", "s3cr3t"),
            ("APP_MODE", "blue"),
        ];
        assert_eq!(
            names(&env, &PluginEnv::default()),
            [
                "PATH",
                "HOME",
                "LC_ALL",
                "RUST_LOG",
                "RUST_BACKTRACE",
                "TMPDIR"
            ]
        );
        let with_app = PluginEnv::with_extra(&["APP_*".into()]).expect("allow-list");
        assert!(names(&env, &with_app).contains(&"APP_MODE".to_string()));
    }

    #[test]
    fn names_that_are_not_unicode_are_withheld() {
        use std::os::unix::ffi::OsStringExt;
        let odd = OsString::from_vec(b"PATH\xff".to_vec());
        let kept = runner_env([(odd, OsString::from("x"))], &PluginEnv::default());
        assert!(kept.is_empty());
    }
}
