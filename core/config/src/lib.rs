//! disbatch-config: the node config file (Disbatch 4's JSON keys plus ours, parsed leniently
//! and validated strictly), the plugin allow-list and the plugins' environment, and the
//! process itself (`process`: logging, isolation, open files, backoff). Above disbatch-model;
//! no database.

pub mod error;
pub mod process;

mod attributes;
mod changes;
mod check;
mod commas;
mod credentials;
mod driver_options;
mod files;
mod keys;
pub use keys::accepted_keys;
mod mongohost;
pub use credentials::env_name as auth_env_name;
pub use mongohost::unusable as mongohost_unusable;
mod periods;
mod perl_bool;
pub mod plugin_env;
mod plugin_user;
pub mod plugins;
mod raw;
mod relaxed;
pub mod reload;
mod web_http;
pub(crate) use files::resolve as resolve_path;
mod secrets;
pub mod startup;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_check;
#[cfg(test)]
mod tests_disbatch4;
mod tokens;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use attributes::TlsSettings;
pub use changes::{changed_keys, keep_keys};
pub use driver_options::{DriverOptions, ReadMode, ReadOptions, ReadPreference, WriteAck};
pub use files::{
    exposed_secret_files, read_capped, token_files, MAX_CONFIG_BYTES, MAX_SECRET_BYTES,
};
pub use perl_bool::{perl_bool, PerlBool};
pub use plugin_user::PluginUser;
pub use web_http::{is_ip_literal, normal_host, split_host_port, WebOrigin};

use crate::error::{Error, Result};
use crate::plugins::PluginTable;
use disbatch_model::output::GfsMode;

/// The shortest pass interval a DEN accepts: faster passes only load the database.
pub const MIN_LOOP_INTERVAL: Duration = Duration::from_millis(100);
pub const DEFAULT_LOOP_INTERVAL: Duration = Duration::from_secs(1);
pub const MAX_LOOP_INTERVAL: Duration = Duration::from_secs(60);
/// A node silent this long is taken for dead: its lease-less (Perl) claims are recovered.
pub const DEFAULT_DEAD_NODE_AFTER: Duration = Duration::from_secs(5 * 60);
pub const MIN_DEAD_NODE_AFTER: Duration = Duration::from_secs(10);
pub const DEFAULT_COUNTS_RECONCILE: Duration = Duration::from_secs(600);
/// Per-minute statistics are kept per minute.
pub const DEFAULT_STATS_INTERVAL: Duration = Duration::from_secs(60);

/// Set by a DEN for its task runners: a copy of the config the node accepted, which a runner
/// reads in place of its `--config` file (whose path still resolves relative paths), so an
/// edit a reload refused never reaches new tasks.
pub const ACCEPTED_CONFIG_ENV: &str = "DISBATCH_ACCEPTED_CONFIG";

/// Which process is connecting: Disbatch gives each its own MongoDB user (`auth` keys).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Component {
    Den,
    TaskRunner,
    Web,
    QueueBalance,
    Plugin,
}

impl Component {
    pub const ALL: [Component; 5] = [
        Component::Den,
        Component::TaskRunner,
        Component::Web,
        Component::QueueBalance,
        Component::Plugin,
    ];

    /// The Disbatch 4 user name for this component, the key under `auth`.
    pub fn user(self) -> &'static str {
        match self {
            Component::Den => "disbatchd",
            Component::TaskRunner => "task_runner",
            Component::Web => "disbatch_web",
            Component::QueueBalance => "queuebalance",
            Component::Plugin => "plugin",
        }
    }
}

/// QueueBalance switches (`balance`), all booleans as in Disbatch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BalanceSettings {
    pub enabled: bool,
    pub log: bool,
    pub verbose: bool,
    pub pretend: bool,
    /// The switches the file set, as it wrote them (`1` or `true`): `GET /balance` shows
    /// them back as Disbatch did.
    pub written: serde_json::Map<String, serde_json::Value>,
}

/// A validated node config. Its `Debug` (in `secrets`) leaves out passwords.
#[derive(Clone)]
pub struct Config {
    /// The file it came from; relative paths in it are resolved against its directory.
    pub path: PathBuf,
    pub mongohost: String,
    pub database: String,
    pub tls: TlsSettings,
    /// The other MongoDB client options from `attributes` (timeouts, concerns, credentials).
    pub driver: DriverOptions,
    /// Passwords by Disbatch user name (`disbatchd`, `task_runner`, …).
    pub auth: BTreeMap<String, String>,
    pub plugins: PluginTable,
    /// The node's environment variables its plugins may see (`plugin_env` adds to a base set).
    pub plugin_env: crate::plugin_env::PluginEnv,
    /// The account plugins run as (`plugin_user`, `plugin_group`); None: the runner's own.
    pub plugin_user: Option<PluginUser>,
    pub task_runner: Option<PathBuf>,
    pub gfs: GfsMode,
    /// Queue ids (hex) this node serves exclusively; wins over `ignorequeues`.
    pub activequeues: Vec<String>,
    pub ignorequeues: Vec<String>,
    pub monitoring: bool,
    pub balance: BalanceSettings,
    pub web_root: Option<PathBuf>,
    /// The node name from the file; `--node` and then the hostname are the fallbacks.
    pub node: Option<String>,
    pub loop_interval: Duration,
    pub quiet: bool,
    pub web: WebSettings,
    /// Coordinate runtimes this node serves (a queue's `runtime`, "" when unset); None serves all.
    pub runtimes: Option<Vec<String>>,
    /// Names of Disbatch web extensions (`web_extensions` keys); `Disbatch::Web::Tasks`
    /// turns on the legacy 4.0 task routes.
    pub web_extensions: Vec<String>,
    /// Where a DEN serves `GET /metrics` (`metrics_listen`); none: no listener.
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// Whether the DEN, when it leads maintenance, watches the database for work (queue changes,
    /// task inserts) and marks the other nodes (`change_streams`, default true); false: it claims
    /// on its timer and on runner exits only.
    pub change_streams: bool,
    /// After how long without a heartbeat a node's lease-less claims (a Perl node's; ours
    /// carry leases) are recovered by their queue's `on_lost`.
    pub dead_node_after: Duration,
    /// How often the maintenance leader checks each queue's kept task counts against its
    /// tasks (`counts_reconcile_s`, default 600).
    pub counts_reconcile: Duration,
    /// The width of a statistics bucket (`stats_interval_s`, default 60); shorter only in tests.
    pub stats_interval: Duration,
    /// How long ended tasks of queues without their own `retain` are kept (`retain`; unset:
    /// for ever). The maintenance leader's applies.
    pub retain: disbatch_model::retention::Retention,
    /// `log_format`: text or JSON lines; None leaves it to `--log-format`, then text.
    pub log_format: Option<crate::process::logging::LogFormat>,
    /// `log_level`: a level or a `RUST_LOG`-style filter; `RUST_LOG` wins when set.
    pub log_level: Option<String>,
}

/// The DCI's own settings (`web`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebSettings {
    /// Listen address; `--listen` overrides; default 127.0.0.1:8080.
    pub listen: Option<String>,
    /// Larger request bodies are refused with 413.
    pub max_body_bytes: u64,
    /// A node whose heartbeat is older than this is shown as not live.
    pub live_window: Duration,
    /// Disbatch returned `{}` for a search with no match; `[]` unless this is set.
    pub empty_tasks_object: bool,
    /// Databases besides `database` that requests may name as their namespace.
    pub namespaces: Vec<String>,
    /// Bearer tokens (`web.tokens`); none leaves the API open, as Disbatch 4 was.
    pub tokens: Vec<WebToken>,
    /// HTTPS instead of HTTP when set (`web.tls`).
    pub tls: Option<WebTls>,
    /// Connections served at once; more wait for one to go idle (`web.max_connections`).
    pub max_connections: usize,
    /// Time a client has to send a request's head (`web.header_timeout_ms`).
    pub header_timeout: Duration,
    /// Time a connection may stay open with no request (`web.idle_timeout_ms`).
    pub idle_timeout: Duration,
    /// Host names requests may name besides the defaults (`web.allowed_hosts`, lowercase;
    /// `"*"`: any).
    pub allowed_hosts: Vec<String>,
    /// Other sites whose pages may send changes (`web.allowed_origins`).
    pub allowed_origins: Vec<WebOrigin>,
}

impl WebSettings {
    pub const DEFAULT_MAX_BODY: u64 = 64 * 1024 * 1024;
    pub const DEFAULT_MAX_CONNECTIONS: usize = web_http::DEFAULT_MAX_CONNECTIONS;
    pub const DEFAULT_HEADER_TIMEOUT: Duration = web_http::DEFAULT_HEADER_TIMEOUT;
    pub const DEFAULT_IDLE_TIMEOUT: Duration = web_http::DEFAULT_IDLE_TIMEOUT;
    /// Shorter tokens are refused: they could be guessed.
    pub const MIN_TOKEN_CHARS: usize = 16;
}

/// What a web token may do; each role includes the ones before it (`Ord` follows that).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    Read,
    Operate,
    Admin,
}

impl Role {
    pub const ALL: [Role; 3] = [Role::Read, Role::Operate, Role::Admin];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Read => "read",
            Role::Operate => "operate",
            Role::Admin => "admin",
        }
    }

    pub fn parse(text: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|r| r.as_str() == text)
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One `web.tokens` entry. The secret is private and left out of `Debug`, so printing a
/// config can never leak it.
#[derive(Clone, PartialEq, Eq)]
pub struct WebToken {
    pub name: String,
    pub role: Role,
    secret: String,
}

impl WebToken {
    pub fn new(name: impl Into<String>, role: Role, secret: impl Into<String>) -> Self {
        WebToken {
            name: name.into(),
            role,
            secret: secret.into(),
        }
    }

    /// The token text a client must send; compare it in constant time, never log it.
    pub fn secret(&self) -> &str {
        &self.secret
    }
}

impl std::fmt::Debug for WebToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebToken")
            .field("name", &self.name)
            .field("role", &self.role)
            .field("secret", &"<redacted>")
            .finish()
    }
}

/// The DCI's certificate chain and private key (PEM), resolved against the config's directory.
/// They are read when the DCI starts, not here: other components share the config file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebTls {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

/// A config and the non-fatal findings (unknown keys, ignored attributes) to log at start.
#[derive(Debug)]
pub struct Loaded {
    pub config: Config,
    pub warnings: Vec<String>,
}

impl Config {
    /// Reads and validates a config file. Errors name the file, the key and the problem.
    pub fn load(path: impl AsRef<Path>) -> Result<Loaded> {
        let path = path.as_ref();
        let text = read_capped(path, MAX_CONFIG_BYTES).map_err(|e| Error::Config {
            path: path.to_path_buf(),
            message: format!("cannot read it: {e}"),
        })?;
        Self::parse(path, &text)
    }

    /// Parses config text as if read from `path` (used for relative paths and messages).
    pub fn parse(path: &Path, text: &str) -> Result<Loaded> {
        let value = relaxed::parse_relaxed_json(text).map_err(|message| Error::Config {
            path: path.to_path_buf(),
            message,
        })?;
        Self::from_value(path, value)
    }

    /// Reads a config file into its JSON value, unvalidated (comments and trailing commas
    /// gone): what a reload compares key by key.
    pub fn read_value(path: &Path) -> Result<serde_json::Value> {
        let fail = |message: String| Error::Config {
            path: path.to_path_buf(),
            message,
        };
        let text = read_capped(path, MAX_CONFIG_BYTES)
            .map_err(|e| fail(format!("cannot read it: {e}")))?;
        relaxed::parse_relaxed_json(&text).map_err(fail)
    }

    /// Validates a config's JSON value as if read from `path`.
    pub fn from_value(path: &Path, value: serde_json::Value) -> Result<Loaded> {
        let fail = |message: String| Error::Config {
            path: path.to_path_buf(),
            message,
        };
        secrets::remember(&value);
        let mut warnings = Vec::new();
        let raw = raw::RawConfig::from_value(value, &mut warnings).map_err(fail)?;
        let base = path.parent().unwrap_or(Path::new("."));
        let config = raw
            .validate(path, base, &mut warnings)
            .map_err(|problems| fail(problems.into_iter().next().unwrap_or_default()))?;
        Ok(Loaded { config, warnings })
    }

    /// Reads and validates like [`Config::load`], but reports every problem found, each
    /// naming its key, rather than stopping at the first (`--check-config`).
    pub fn check(path: &Path) -> std::result::Result<Loaded, Vec<String>> {
        let value = Self::read_value(path).map_err(|e| vec![e.to_string()])?;
        Self::check_value(path, value)
    }

    /// [`Config::check`] of a config's JSON value as if read from `path`.
    pub fn check_value(
        path: &Path,
        value: serde_json::Value,
    ) -> std::result::Result<Loaded, Vec<String>> {
        secrets::remember(&value);
        check::all_problems(path, value)
    }

    /// The node name: `--node`, then the config's `node`, then the hostname.
    pub fn node_name(&self, cli_override: Option<&str>) -> Result<String> {
        if let Some(name) = cli_override.or(self.node.as_deref()) {
            return validate_node_name(name).map(|()| name.to_string());
        }
        let host = hostname::get().map_err(|e| {
            Error::Invalid(format!("cannot read the hostname for the node name: {e}"))
        })?;
        let host = host.to_string_lossy().into_owned();
        validate_node_name(&host).map(|()| host)
    }
}

/// Node names end up in documents, logs and file names: keep them printable and bounded.
pub fn validate_node_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 255
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':'));
    if ok {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "node name {name:?} is not valid: use 1-255 characters of letters, digits, '.', '-', '_' or ':'"
        )))
    }
}
