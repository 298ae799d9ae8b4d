//! Config reloads on SIGHUP: new web tokens and log level without a restart; the rest waits.

use std::path::PathBuf;
use std::sync::Arc;

use disbatch_config::process::logging::Logging;
use disbatch_config::reload::reread;
use disbatch_config::{keep_keys, read_capped, token_files, WebToken, MAX_SECRET_BYTES};

use crate::access::Access;

/// Keys a running disbatch-web applies: the others it uses are set up once (the listener,
/// the connection, what each route was built with) and wait for a restart.
pub const RELOADED: &[&str] = &["web.tokens", "log_level"];

/// Top-level keys disbatch-web uses; changes to other keys (a DEN's) are not its concern.
const USED: &[&str] = &[
    "mongohost",
    "mongohost_file",
    "database",
    "attributes",
    "auth",
    "auth_files",
    "plugins",
    "plugin_dirs",
    "monitoring",
    "balance",
    "web_extensions",
    "web_root",
    "log_format",
];

/// Re-reads the config file on request: tokens (token files too) and the log level.
pub struct Reloader {
    path: PathBuf,
    /// The config in force, as read (restart-only keys as they were at start).
    accepted: serde_json::Value,
    /// The tokens in force, as read from their files too: a token file can change alone.
    tokens: Vec<WebToken>,
    access: Arc<Access>,
    logging: Logging,
    /// Tokens were revoked since the last reload applied: the next one sets them all anew.
    revoked: bool,
}

impl Reloader {
    pub fn new(
        path: PathBuf,
        accepted: serde_json::Value,
        tokens: Vec<WebToken>,
        access: Arc<Access>,
        logging: Logging,
    ) -> Reloader {
        Reloader {
            path,
            accepted,
            tokens,
            access,
            logging,
            revoked: false,
        }
    }

    /// Reloads on every SIGHUP until the process ends.
    pub async fn run(mut self, hangups: tokio::signal::unix::Signal) {
        let path = self.path.clone();
        disbatch_config::reload::reload_on_hangup(&path, hangups, || self.reload()).await;
    }

    /// Reads the file again; applies it whole or, when it is not valid, not at all. Either
    /// way a token whose `token_file` is gone or holds another token no longer opens the API:
    /// deleting the file revokes the token even while the config is refused for it.
    pub fn reload(&mut self) -> Result<(), String> {
        let outcome = self.apply();
        if outcome.is_err() {
            self.revoke_lost_token_files();
        }
        outcome
    }

    fn revoke_lost_token_files(&mut self) {
        let mut lost: Vec<String> = Vec::new();
        for (name, file) in token_files(&self.path, &self.accepted) {
            let Some(token) = self.tokens.iter().find(|t| t.name == name) else {
                continue;
            };
            let problem = match read_capped(&file, MAX_SECRET_BYTES) {
                Err(e) => format!("cannot be read: {e}"),
                Ok(text) if text.trim() != token.secret() => "holds another token".to_string(),
                Ok(_) => continue,
            };
            tracing::warn!(
                token = %name,
                file = %file.display(),
                "web token {name:?} revoked: its token_file {} {problem}",
                file.display()
            );
            lost.push(name);
        }
        if lost.is_empty() {
            return;
        }
        let names: Vec<&str> = lost.iter().map(String::as_str).collect();
        self.access.revoke(&names);
        self.tokens.retain(|t| !lost.contains(&t.name));
        self.revoked = true;
    }

    fn apply(&mut self) -> Result<(), String> {
        let (value, written, mut changed) = reread(&self.path, &self.accepted)?;
        let tokens_differ = written.config.web.tokens != self.tokens || self.revoked;
        if tokens_differ && !changed.iter().any(|k| k == "web.tokens") {
            changed.push("web.tokens".to_string());
        }
        let (applied, other): (Vec<String>, Vec<String>) = changed
            .into_iter()
            .partition(|k| RELOADED.contains(&k.as_str()));
        let restart: Vec<String> = other
            .into_iter()
            .filter(|k| k.starts_with("web.") || USED.contains(&k.as_str()))
            .collect();
        let config = written.config;
        if applied.iter().any(|k| k == "log_level") {
            let level = self
                .logging
                .set_level(config.log_level.as_deref(), "info")?;
            if self.logging.level_from_env() {
                tracing::warn!("`log_level` changed, but RUST_LOG is set and wins: {level}");
            }
        }
        if applied.iter().any(|k| k == "web.tokens") {
            self.access.replace(&config.web.tokens);
            if config.web.tokens.is_empty() {
                tracing::warn!("the reloaded config has no web.tokens: the API is now open to anyone who can reach it");
            }
            self.tokens = config.web.tokens;
            self.revoked = false;
        }
        self.accepted = keep_keys(&self.accepted, value, &restart);
        for warning in &written.warnings {
            tracing::warn!(config = %self.path.display(), "{warning}");
        }
        if !restart.is_empty() {
            tracing::warn!(
                keys = %restart.join(", "),
                "config keys changed that take effect only when disbatch-web restarts: {}",
                restart.join(", ")
            );
        }
        tracing::info!(changed = %applied.join(", "), tokens = self.tokens.len(), "config reloaded");
        Ok(())
    }
}
