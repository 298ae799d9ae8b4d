//! Config reloads on SIGHUP: what a running node takes from an edited config, and what waits.

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;

use disbatch_config::plugins::PluginTable;
use disbatch_config::process::logging::Logging;
use disbatch_config::reload::reread;
use disbatch_config::{keep_keys, Config};
use tokio::sync::watch;

use crate::claimer::plugin_check::PluginCheck;
use crate::claimer::{Claimer, QueueFilter};
use crate::runners::executor::Executor;
use crate::runners::runner_config::RunnerConfig;
use crate::runners::runner_env::runner_env;

/// Keys a running node keeps as they were at its start: its connection, identity, timers
/// and listeners are set up once. A reload that changes them says so.
pub const NEEDS_RESTART: &[&str] = &[
    "mongohost",
    "mongohost_file",
    "database",
    "attributes",
    "auth",
    "auth_files",
    "node",
    "task_runner",
    "plugin_user",
    "plugin_group",
    "loop_interval_ms",
    "metrics_listen",
    "change_streams",
    "dead_node_after_s",
    "counts_reconcile_s",
    "stats_interval_s",
    "balance",
    "log_format",
];

/// The settings the node loop takes on at its next pass.
pub type Receiver = watch::Receiver<Arc<Settings>>;

pub struct Settings {
    filter: QueueFilter,
    plugins: PluginTable,
    /// Every runner's environment (`plugin_env` decides what passes).
    env: Vec<(OsString, OsString)>,
}

impl Settings {
    /// `extra_env`: variables the node adds for its runners (the accepted config, the format).
    pub fn new(config: &Config, extra_env: &[(OsString, OsString)]) -> Settings {
        let mut env = runner_env(std::env::vars_os(), &config.plugin_env);
        env.extend(extra_env.iter().cloned());
        Settings {
            filter: QueueFilter {
                active: config.activequeues.clone(),
                ignore: config.ignorequeues.clone(),
                runtimes: config.runtimes.clone(),
            },
            plugins: config.plugins.clone(),
            env,
        }
    }

    pub fn filter(&self) -> QueueFilter {
        self.filter.clone()
    }

    pub fn plugins(&self) -> PluginCheck {
        PluginCheck::new(self.plugins.clone())
    }

    pub fn env(&self) -> Vec<(OsString, OsString)> {
        self.env.clone()
    }

    /// Serves the new queues and plugins from the next claim on; started runners keep theirs.
    pub fn apply(
        &self,
        claimer: &mut Claimer,
        executor: &mut Executor,
        runtimes: &mut Option<Vec<String>>,
    ) {
        claimer.reconfigure(self.filter(), self.plugins());
        executor.set_env(self.env());
        *runtimes = self.filter.runtimes.clone();
    }
}

/// New settings since the node last looked, if any.
pub fn take_new(reloads: &mut Receiver) -> Option<Arc<Settings>> {
    if reloads.has_changed().unwrap_or(false) {
        Some(reloads.borrow_and_update().clone())
    } else {
        None
    }
}

/// Resolves when new settings arrive; never when there are no reloads.
pub async fn changed(reloads: Option<Receiver>) {
    if let Some(mut reloads) = reloads {
        if reloads.changed().await.is_ok() {
            return;
        }
    }
    std::future::pending().await
}

/// Re-reads the config file on request and hands what changed to the node loop.
pub struct Reloader {
    path: PathBuf,
    /// The config in force, as read (with restart-only keys as they were at start).
    accepted: serde_json::Value,
    logging: Logging,
    runner_config: Option<RunnerConfig>,
    extra_env: Vec<(OsString, OsString)>,
    sender: watch::Sender<Arc<Settings>>,
}

impl Reloader {
    pub fn new(
        path: PathBuf,
        accepted: serde_json::Value,
        settings: Settings,
        logging: Logging,
        runner_config: Option<RunnerConfig>,
        extra_env: Vec<(OsString, OsString)>,
    ) -> (Reloader, Receiver) {
        let (sender, receiver) = watch::channel(Arc::new(settings));
        let reloader = Reloader {
            path,
            accepted,
            logging,
            runner_config,
            extra_env,
            sender,
        };
        (reloader, receiver)
    }

    /// Reloads on every SIGHUP until the process ends.
    pub async fn run(mut self, hangups: tokio::signal::unix::Signal) {
        let path = self.path.clone();
        disbatch_config::reload::reload_on_hangup(&path, hangups, || self.reload()).await;
    }

    /// Reads the file again; applies it whole or, when it is not valid, not at all.
    pub fn reload(&mut self) -> Result<(), String> {
        let (value, written, changed) = reread(&self.path, &self.accepted)?;
        let (restart, applied): (Vec<String>, Vec<String>) = changed
            .into_iter()
            .partition(|k| NEEDS_RESTART.contains(&k.as_str()));
        let kept = keep_keys(&self.accepted, value, &restart);
        let config = Config::from_value(&self.path, kept.clone())
            .map_err(|e| e.to_string())?
            .config;
        if let Some(copy) = &self.runner_config {
            copy.write(&kept).map_err(|e| {
                format!(
                    "could not write the runners' copy {}: {e}",
                    copy.path().display()
                )
            })?;
        }
        if applied.iter().any(|k| k == "log_level") {
            let level = self
                .logging
                .set_level(config.log_level.as_deref(), "info")?;
            if self.logging.level_from_env() {
                tracing::warn!("`log_level` changed, but RUST_LOG is set and wins: {level}");
            }
        }
        self.sender
            .send_replace(Arc::new(Settings::new(&config, &self.extra_env)));
        self.accepted = kept;
        for warning in &written.warnings {
            tracing::warn!(config = %self.path.display(), "{warning}");
        }
        if applied.iter().any(|k| k == "plugins" || k == "plugin_dirs") {
            for name in config.plugins.names() {
                if let Err(e) = config.plugins.resolve(name) {
                    tracing::warn!("{e}");
                }
            }
        }
        if !restart.is_empty() {
            tracing::warn!(
                keys = %restart.join(", "),
                "config keys changed that take effect only when disbatchd restarts: {}",
                restart.join(", ")
            );
        }
        tracing::info!(changed = %applied.join(", "), "config reloaded");
        Ok(())
    }
}

/// What the node adds to its runners' environment: its log format, and where its copy of
/// the accepted config is (None when the copy cannot be made: runners then read the file).
pub fn runner_setup(
    accepted: &serde_json::Value,
    format: disbatch_config::process::logging::LogFormat,
) -> (Option<RunnerConfig>, Vec<(OsString, OsString)>) {
    use disbatch_config::process::logging::LOG_FORMAT_ENV;
    use disbatch_config::ACCEPTED_CONFIG_ENV;
    let mut env = vec![(LOG_FORMAT_ENV.into(), format.as_str().into())];
    let copy = match RunnerConfig::create(accepted) {
        Ok(copy) => {
            env.push((
                ACCEPTED_CONFIG_ENV.into(),
                copy.path().as_os_str().to_owned(),
            ));
            Some(copy)
        }
        Err(e) => {
            tracing::warn!(error = %e, "could not write the runners' copy of the config: runners read the config file itself, edits a reload refused included");
            None
        }
    };
    (copy, env)
}
