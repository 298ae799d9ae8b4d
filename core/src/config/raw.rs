//! The config file as written: relaxed JSON decoded into loosely typed fields, then validated.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

use super::perl_bool::{self, PerlBool};
use super::{
    BalanceSettings, Config, Role, WebSettings, WebTls, WebToken, DEFAULT_COUNTS_RECONCILE,
    DEFAULT_DEAD_NODE_AFTER, DEFAULT_LOOP_INTERVAL, MIN_DEAD_NODE_AFTER, MIN_LOOP_INTERVAL,
};
use crate::output::GfsMode;
use crate::plugin::PluginTable;

/// Settings that must be JSON objects: serde would also take an array for them, by position.
const OBJECT_KEYS: &[&[&str]] = &[&["balance"], &["web"], &["web", "tls"], &["auth"]];

fn check_objects(value: &Value) -> Result<(), String> {
    for path in OBJECT_KEYS {
        let mut at = Some(value);
        for key in *path {
            at = at.and_then(|v| v.get(*key));
        }
        match at {
            None | Some(Value::Null) | Some(Value::Object(_)) => {}
            Some(_) => return Err(format!("key `{}`: must be an object", path.join("."))),
        }
    }
    Ok(())
}

/// Keys Disbatch 4 defines that this implementation accepts but does not use.
const ACCEPTED_UNUSED: &[&str] = &["views_dir", "log4perl", "testing"];

#[derive(Debug, Deserialize)]
pub(super) struct RawConfig {
    mongohost: Option<String>,
    database: Option<String>,
    #[serde(default)]
    attributes: Option<Value>,
    #[serde(default)]
    auth: Option<BTreeMap<String, String>>,
    #[serde(default)]
    plugins: Option<Value>,
    #[serde(default)]
    plugin_dirs: Option<Vec<String>>,
    #[serde(default)]
    plugin_env: Option<Vec<String>>,
    #[serde(default)]
    plugin_user: Option<Value>,
    #[serde(default)]
    plugin_group: Option<Value>,
    #[serde(default)]
    task_runner: Option<String>,
    #[serde(default)]
    gfs: Option<Value>,
    #[serde(default)]
    activequeues: Option<Vec<String>>,
    #[serde(default)]
    ignorequeues: Option<Vec<String>>,
    #[serde(default)]
    monitoring: Option<PerlBool>,
    #[serde(default)]
    balance: Option<RawBalance>,
    #[serde(default)]
    web_root: Option<String>,
    #[serde(default)]
    node: Option<String>,
    #[serde(default)]
    loop_interval_ms: Option<u64>,
    #[serde(default)]
    quiet: Option<PerlBool>,
    #[serde(default)]
    web: Option<RawWeb>,
    #[serde(default)]
    runtimes: Option<Vec<String>>,
    #[serde(default)]
    web_extensions: Option<serde_json::Map<String, Value>>,
    #[serde(default)]
    metrics_listen: Option<String>,
    #[serde(default)]
    change_streams: Option<PerlBool>,
    #[serde(default)]
    dead_node_after_s: Option<u64>,
    #[serde(default)]
    counts_reconcile_s: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
struct RawWeb {
    listen: Option<String>,
    max_body_bytes: Option<u64>,
    live_window_ms: Option<u64>,
    #[serde(default)]
    empty_tasks_object: Option<PerlBool>,
    #[serde(default)]
    namespaces: Vec<String>,
    #[serde(default)]
    tls: Option<RawWebTls>,
    /// Checked by hand, not by serde: serde's type errors quote the value, which may be a secret.
    #[serde(default)]
    tokens: Option<Value>,
    max_connections: Option<u64>,
    header_timeout_ms: Option<u64>,
    idle_timeout_ms: Option<u64>,
    allowed_hosts: Option<Vec<String>>,
    allowed_origins: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
struct RawWebTls {
    cert_file: String,
    key_file: String,
}

#[derive(Debug, Default, Deserialize)]
struct RawBalance {
    #[serde(default)]
    enabled: Option<PerlBool>,
    #[serde(default)]
    log: Option<PerlBool>,
    #[serde(default)]
    verbose: Option<PerlBool>,
    #[serde(default)]
    pretend: Option<PerlBool>,
}

impl RawBalance {
    fn settings(self) -> BalanceSettings {
        let mut written = serde_json::Map::new();
        let mut flag = |key: &str, b: Option<PerlBool>| match b {
            Some(b) => {
                written.insert(key.into(), b.written);
                b.value
            }
            None => false,
        };
        BalanceSettings {
            enabled: flag("enabled", self.enabled),
            log: flag("log", self.log),
            verbose: flag("verbose", self.verbose),
            pretend: flag("pretend", self.pretend),
            written,
        }
    }
}

impl RawConfig {
    /// Type-checks every key, naming the key on failure and collecting unknown keys as warnings.
    pub(super) fn from_value(value: Value, warnings: &mut Vec<String>) -> Result<Self, String> {
        check_objects(&value)?;
        let mut unknown = Vec::new();
        let raw: RawConfig = {
            // serde_ignored marks `Option` layers as `?`; operators know keys, not layers.
            let mut note_unknown =
                |path: serde_ignored::Path<'_>| unknown.push(path.to_string().replace(".?", ""));
            let tracked = serde_ignored::Deserializer::new(&value, &mut note_unknown);
            serde_path_to_error::deserialize(tracked).map_err(|e| {
                let key = e.path().to_string();
                let inner = e.into_inner().to_string();
                if key == "." {
                    inner
                } else {
                    format!("key `{key}`: {inner}")
                }
            })?
        };
        for key in unknown {
            let top = key.split('.').next().unwrap_or(&key);
            if !ACCEPTED_UNUSED.contains(&top) {
                warnings.push(format!("unknown key `{key}` is ignored"));
            }
        }
        Ok(raw)
    }

    pub(super) fn validate(
        self,
        path: &Path,
        base: &Path,
        warnings: &mut Vec<String>,
    ) -> Result<Config, String> {
        let mongohost = required_string("mongohost", self.mongohost)?;
        let mongohost = super::mongohost::normalise(&mongohost)?;
        let database = required_string("database", self.database)?;
        validate_database_name(&database)?;
        let (tls, driver) = match self.attributes {
            None | Some(Value::Null) => Default::default(),
            Some(v) => super::attributes::read(&v, base, warnings)?,
        };
        let plugin_dirs: Vec<PathBuf> = self
            .plugin_dirs
            .unwrap_or_default()
            .iter()
            .map(|d| resolve(base, d))
            .collect();
        let plugins = PluginTable::from_config(self.plugins.as_ref(), plugin_dirs, base)
            .map_err(|e| format!("key `plugins`: {e}"))?;
        let plugin_env = crate::plugin_env::PluginEnv::with_extra(
            self.plugin_env.as_deref().unwrap_or_default(),
        )
        .map_err(|e| format!("key `plugin_env`: {e}"))?;
        let plugin_user =
            super::plugin_user::from_config(self.plugin_user.as_ref(), self.plugin_group.as_ref())?;
        let gfs = match self.gfs {
            None | Some(Value::Null) => GfsMode::Auto,
            Some(v) => GfsMode::from_config(&v).map_err(|e| format!("key `gfs`: {e}"))?,
        };
        let activequeues = queue_ids("activequeues", self.activequeues)?;
        let ignorequeues = queue_ids("ignorequeues", self.ignorequeues)?;
        if !activequeues.is_empty() && !ignorequeues.is_empty() {
            warnings.push(
                "both `activequeues` and `ignorequeues` are set: only `activequeues` is used"
                    .into(),
            );
        }
        if let Some(node) = &self.node {
            super::validate_node_name(node).map_err(|e| format!("key `node`: {e}"))?;
        }
        let loop_interval = match self.loop_interval_ms {
            None => DEFAULT_LOOP_INTERVAL,
            Some(ms) if ms < MIN_LOOP_INTERVAL.as_millis() as u64 => {
                return Err(format!(
                    "key `loop_interval_ms`: {ms} is below the minimum of {} ms",
                    MIN_LOOP_INTERVAL.as_millis()
                ))
            }
            Some(ms) if ms > 60_000 => {
                return Err(format!(
                    "key `loop_interval_ms`: {ms} is above the maximum of 60000 ms"
                ))
            }
            Some(ms) => Duration::from_millis(ms),
        };
        let dead_node_after = match self.dead_node_after_s {
            None => DEFAULT_DEAD_NODE_AFTER,
            Some(s) if s < MIN_DEAD_NODE_AFTER.as_secs() => {
                return Err(format!(
                    "key `dead_node_after_s`: {s} is below the minimum of {} s (a live node heartbeats every second; a busy one may be late)",
                    MIN_DEAD_NODE_AFTER.as_secs()
                ))
            }
            Some(s) => Duration::from_secs(s.min(365 * 24 * 3600)),
        };
        let counts_reconcile = match self.counts_reconcile_s {
            None => DEFAULT_COUNTS_RECONCILE,
            Some(0) => {
                return Err("key `counts_reconcile_s`: must be at least 1 s".to_string());
            }
            Some(s) => Duration::from_secs(s.min(7 * 24 * 3600)),
        };
        let balance = self.balance.unwrap_or_default();
        let web = self.web.unwrap_or_default();
        let tokens = web_tokens(web.tokens, base, warnings)?;
        let web_tls = web.tls.map(|t| web_tls(t, base)).transpose()?;
        let http = super::web_http::validate(super::web_http::RawHttp {
            max_connections: web.max_connections,
            header_timeout_ms: web.header_timeout_ms,
            idle_timeout_ms: web.idle_timeout_ms,
            allowed_hosts: web.allowed_hosts,
            allowed_origins: web.allowed_origins,
        })?;
        let web = WebSettings {
            listen: web.listen,
            max_body_bytes: web.max_body_bytes.unwrap_or(WebSettings::DEFAULT_MAX_BODY),
            live_window: Duration::from_millis(web.live_window_ms.unwrap_or(15_000)),
            empty_tasks_object: perl_bool::or(web.empty_tasks_object, false),
            namespaces: web.namespaces,
            tokens,
            tls: web_tls,
            max_connections: http.max_connections,
            header_timeout: http.header_timeout,
            idle_timeout: http.idle_timeout,
            allowed_hosts: http.allowed_hosts,
            allowed_origins: http.allowed_origins,
        };
        for ns in &web.namespaces {
            validate_database_name(ns)
                .map_err(|e| e.replace("key `database`", "key `web.namespaces`"))?;
        }
        let metrics_listen = self
            .metrics_listen
            .as_deref()
            .map(|a| {
                a.trim().parse::<std::net::SocketAddr>().map_err(|_| {
                    format!(
                        "key `metrics_listen`: {a:?} is not a socket address; use IP:PORT, e.g. \"127.0.0.1:9101\""
                    )
                })
            })
            .transpose()?;
        if web.max_body_bytes < 1024 {
            return Err("key `web.max_body_bytes`: must be at least 1024".into());
        }
        Ok(Config {
            path: path.to_path_buf(),
            mongohost,
            database,
            tls,
            driver,
            auth: self.auth.unwrap_or_default(),
            plugins,
            plugin_env,
            plugin_user,
            task_runner: self
                .task_runner
                .as_deref()
                .map(|p| resolve_command(base, p)),
            gfs,
            activequeues,
            ignorequeues,
            monitoring: perl_bool::or(self.monitoring, false),
            balance: balance.settings(),
            web_root: self.web_root.as_deref().map(|p| resolve(base, p)),
            node: self.node,
            loop_interval,
            quiet: perl_bool::or(self.quiet, false),
            web,
            runtimes: self.runtimes,
            web_extensions: self
                .web_extensions
                .map(|m| m.keys().cloned().collect())
                .unwrap_or_default(),
            metrics_listen,
            change_streams: perl_bool::or(self.change_streams, true),
            dead_node_after,
            counts_reconcile,
        })
    }
}

fn required_string(key: &str, value: Option<String>) -> Result<String, String> {
    match value {
        Some(s) if !s.trim().is_empty() => Ok(s),
        Some(_) => Err(format!("key `{key}` must not be empty")),
        None => Err(format!("key `{key}` is required")),
    }
}

/// MongoDB's own rules for database names, checked here so the error names the config key.
fn validate_database_name(name: &str) -> Result<(), String> {
    const FORBIDDEN: &[char] = &[
        '/', '\\', '.', ' ', '"', '$', '*', '<', '>', ':', '|', '?', '\0',
    ];
    if name.len() > 63 {
        return Err(format!("key `database`: {name:?} is longer than 63 bytes"));
    }
    if let Some(c) = name.chars().find(|c| FORBIDDEN.contains(c)) {
        return Err(format!(
            "key `database`: {name:?} contains {c:?}, which MongoDB does not allow in a database name"
        ));
    }
    Ok(())
}

fn queue_ids(key: &str, ids: Option<Vec<String>>) -> Result<Vec<String>, String> {
    let ids = ids.unwrap_or_default();
    for id in &ids {
        if bson::oid::ObjectId::parse_str(id).is_err() {
            return Err(format!(
                "key `{key}`: {id:?} is not a queue id (24 hex digits); Disbatch lists queue ids here, not names"
            ));
        }
    }
    Ok(ids.into_iter().map(|s| s.to_ascii_lowercase()).collect())
}

fn web_tls(raw: RawWebTls, base: &Path) -> Result<WebTls, String> {
    let file = |key: &str, value: &str| {
        if value.trim().is_empty() {
            Err(format!("key `web.tls.{key}` must not be empty"))
        } else {
            Ok(resolve(base, value))
        }
    };
    Ok(WebTls {
        cert_file: file("cert_file", &raw.cert_file)?,
        key_file: file("key_file", &raw.key_file)?,
    })
}

/// `web.tokens`: `[{"name", "role", "token" | "token_file"}]`. No message here may contain
/// a token's text, only the key that holds it.
fn web_tokens(
    value: Option<Value>,
    base: &Path,
    warnings: &mut Vec<String>,
) -> Result<Vec<WebToken>, String> {
    let entries = match value {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(entries)) => entries,
        Some(_) => {
            return Err(
                "key `web.tokens` must be an array of {\"name\", \"role\", \"token\" or \"token_file\"} objects"
                    .into(),
            )
        }
    };
    let mut tokens: Vec<WebToken> = Vec::with_capacity(entries.len());
    for (i, entry) in entries.into_iter().enumerate() {
        let at = format!("web.tokens[{i}]");
        let token = web_token(&at, entry, base, warnings)?;
        if tokens.iter().any(|t| t.name == token.name) {
            return Err(format!(
                "key `{at}.name`: {:?} is used by an earlier token; names must be unique",
                token.name
            ));
        }
        if let Some(j) = tokens.iter().position(|t| t.secret() == token.secret()) {
            return Err(format!(
                "key `{at}`: the same token as `web.tokens[{j}]`; each name needs its own token"
            ));
        }
        tokens.push(token);
    }
    Ok(tokens)
}

fn web_token(
    at: &str,
    entry: Value,
    base: &Path,
    warnings: &mut Vec<String>,
) -> Result<WebToken, String> {
    let Value::Object(map) = entry else {
        return Err(format!(
            "key `{at}` must be an object with \"name\", \"role\" and \"token\" or \"token_file\""
        ));
    };
    let text = |key: &str| -> Result<Option<&str>, String> {
        match map.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.as_str())),
            Some(_) => Err(format!("key `{at}.{key}` must be a string")),
        }
    };
    let name = match text("name")? {
        Some(n) if !n.trim().is_empty() => n.to_string(),
        Some(_) => return Err(format!("key `{at}.name` must not be empty")),
        None => return Err(format!("key `{at}.name` is required")),
    };
    let role = match text("role")? {
        Some(r) => Role::parse(r).ok_or_else(|| {
            format!("key `{at}.role`: unknown role {r:?}; use read, operate or admin")
        })?,
        None => return Err(format!("key `{at}.role` is required")),
    };
    let secret = match (text("token")?, text("token_file")?) {
        (Some(_), Some(_)) => {
            return Err(format!(
                "key `{at}`: give `token` or `token_file`, not both"
            ))
        }
        (None, None) => return Err(format!("key `{at}`: `token` or `token_file` is required")),
        (Some(token), None) => checked_secret(&format!("{at}.token"), token)?,
        (None, Some(file)) => {
            let path = resolve(base, file);
            let text = std::fs::read_to_string(&path).map_err(|e| {
                format!("key `{at}.token_file`: cannot read {}: {e}", path.display())
            })?;
            // A file's final newline is not part of the token.
            checked_secret(&format!("{at}.token_file"), text.trim())?
        }
    };
    for key in map.keys() {
        if !matches!(key.as_str(), "name" | "role" | "token" | "token_file") {
            warnings.push(format!("unknown key `{at}.{key}` is ignored"));
        }
    }
    Ok(WebToken::new(name, role, secret))
}

/// A token must fit in an `Authorization: Bearer` header and be long enough not to be guessed.
fn checked_secret(key: &str, token: &str) -> Result<String, String> {
    if token.is_empty() {
        return Err(format!("key `{key}`: the token is empty"));
    }
    if !token.chars().all(|c| c.is_ascii_graphic()) {
        return Err(format!(
            "key `{key}`: the token may hold only printable ASCII without spaces"
        ));
    }
    if token.len() < WebSettings::MIN_TOKEN_CHARS {
        return Err(format!(
            "key `{key}`: the token is shorter than {} characters",
            WebSettings::MIN_TOKEN_CHARS
        ));
    }
    Ok(token.to_string())
}

/// Paths in the config are relative to the config file, so a checkout can carry its own config.
pub(crate) fn resolve(base: &Path, p: &str) -> PathBuf {
    let p = Path::new(p);
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        base.join(p)
    }
}

/// A bare command name (no `/`) is looked up on PATH when spawned, like a shell would.
fn resolve_command(base: &Path, p: &str) -> PathBuf {
    if p.contains('/') {
        resolve(base, p)
    } else {
        PathBuf::from(p)
    }
}
