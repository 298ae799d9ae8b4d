//! The config file as written: relaxed JSON decoded into loosely typed fields, then validated.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

use super::files::resolve;
use super::periods::{dead_node_after, loop_interval, retain, stats_interval};
use super::perl_bool::{self, PerlBool};
use super::tokens::RawWebTls;
use super::{BalanceSettings, Config, WebSettings, DEFAULT_COUNTS_RECONCILE};
use crate::plugins::PluginTable;
use crate::PluginUser;
use disbatch_model::output::GfsMode;

/// Settings that must be JSON objects: serde would also take an array for them, by position.
const OBJECT_KEYS: &[&[&str]] = &[
    &["balance"],
    &["web"],
    &["web", "tls"],
    &["auth"],
    &["auth_files"],
];

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
pub(super) const ACCEPTED_UNUSED: &[&str] = &["views_dir", "log4perl", "testing"];

#[derive(Debug, Deserialize)]
pub(super) struct RawConfig {
    mongohost: Option<String>,
    #[serde(default)]
    mongohost_file: Option<String>,
    database: Option<String>,
    #[serde(default)]
    attributes: Option<Value>,
    #[serde(default)]
    auth: Option<BTreeMap<String, String>>,
    #[serde(default)]
    auth_files: Option<BTreeMap<String, String>>,
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
    #[serde(default)]
    stats_interval_s: Option<u64>,
    #[serde(default)]
    retain: Option<Value>,
    #[serde(default)]
    log_format: Option<String>,
    #[serde(default)]
    log_level: Option<String>,
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
        super::secrets::check_types(&value)?;
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

    /// Validates every key; the problems come in the order checked, so the first is the one
    /// a failed `load` reports.
    pub(super) fn validate(
        self,
        path: &Path,
        base: &Path,
        warnings: &mut Vec<String>,
    ) -> Result<Config, Vec<String>> {
        let mut p = Problems::default();
        let (mongohost, auth, database, attributes) = check_connection(
            (self.mongohost, self.mongohost_file),
            (self.auth, self.auth_files),
            self.database,
            self.attributes,
            (base, warnings),
            &mut p,
        );
        let plugins = check_plugins(
            self.plugins.as_ref(),
            self.plugin_dirs.unwrap_or_default(),
            self.plugin_env.as_deref().unwrap_or_default(),
            (self.plugin_user.as_ref(), self.plugin_group.as_ref()),
            base,
            &mut p,
        );
        let (gfs, activequeues, ignorequeues) = check_task_keys(
            self.gfs,
            (self.activequeues, self.ignorequeues),
            warnings,
            &mut p,
        );
        if let Some(node) = &self.node {
            p.take(super::validate_node_name(node).map_err(|e| format!("key `node`: {e}")));
        }
        let timing = check_timing(
            (self.loop_interval_ms, self.dead_node_after_s),
            (self.counts_reconcile_s, self.stats_interval_s),
            self.retain.as_ref(),
            &mut p,
        );
        let balance = self.balance.unwrap_or_default();
        let web = check_web(
            self.web.unwrap_or_default(),
            self.metrics_listen.as_deref(),
            base,
            warnings,
            &mut p,
        );
        let logging = check_logging(self.log_format.as_deref(), self.log_level, &mut p);
        let (
            Some(mongohost),
            Some(database),
            Some((tls, driver)),
            Some((plugins, plugin_env, plugin_user)),
            Some(gfs),
            Some(activequeues),
            Some(ignorequeues),
            Some((loop_interval, dead_node_after, counts_reconcile, stats_interval, retain)),
            Some((web, metrics_listen)),
            Some((log_format, log_level)),
        ) = (
            mongohost,
            database,
            attributes,
            plugins,
            gfs,
            activequeues,
            ignorequeues,
            timing,
            web,
            logging,
        )
        else {
            return Err(p.0);
        };
        if !p.0.is_empty() {
            return Err(p.0);
        }
        Ok(Config {
            path: path.to_path_buf(),
            mongohost,
            database,
            tls,
            driver,
            auth,
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
            stats_interval,
            retain,
            log_format,
            log_level,
        })
    }
}

/// `gfs`, `activequeues` and `ignorequeues`: how output is stored and which queues a node
/// serves; each None when unreadable (the problem is in `p`).
#[allow(clippy::type_complexity)]
fn check_task_keys(
    gfs: Option<Value>,
    (active, ignore): (Option<Vec<String>>, Option<Vec<String>>),
    warnings: &mut Vec<String>,
    p: &mut Problems,
) -> (Option<GfsMode>, Option<Vec<String>>, Option<Vec<String>>) {
    let gfs = p.take(match gfs {
        None | Some(Value::Null) => Ok(GfsMode::Auto),
        Some(v) => GfsMode::from_config(&v).map_err(|e| format!("key `gfs`: {e}")),
    });
    let activequeues = p.take(queue_ids("activequeues", active));
    let ignorequeues = p.take(queue_ids("ignorequeues", ignore));
    if let (Some(active), Some(ignore)) = (&activequeues, &ignorequeues) {
        if !active.is_empty() && !ignore.is_empty() {
            warnings.push(
                "both `activequeues` and `ignorequeues` are set: only `activequeues` is used"
                    .into(),
            );
        }
    }
    (gfs, activequeues, ignorequeues)
}

/// Names and their secrets (`auth`), or the files that hold them (`auth_files`).
type Named = Option<BTreeMap<String, String>>;
/// `mongohost`, `auth`, `database`, and TLS and the driver's options from `attributes`.
type Connection = (
    Option<String>,
    BTreeMap<String, String>,
    Option<String>,
    Option<Attributes>,
);
type Attributes = (super::TlsSettings, super::DriverOptions);

/// `mongohost` (or `mongohost_file`), `auth` (or `auth_files`), `database` and `attributes`,
/// in that order; each None when wrong (its problem is in `p`), `auth` empty.
fn check_connection(
    mongohost: (Option<String>, Option<String>),
    auth: (Named, Named),
    database: Option<String>,
    attributes: Option<Value>,
    (base, warnings): (&Path, &mut Vec<String>),
    p: &mut Problems,
) -> Connection {
    let env = |name: &str| std::env::var(name).ok();
    let mongohost = p.take(
        super::credentials::mongohost(base, mongohost.0, mongohost.1, env).and_then(|m| {
            required_string("mongohost", Some(m)).and_then(|m| super::mongohost::normalise(&m))
        }),
    );
    let users = super::Component::ALL.map(super::Component::user);
    let auth = p
        .take(super::credentials::auth(base, auth.0, auth.1, &users, env))
        .unwrap_or_default();
    let database = p.take(
        required_string("database", database).and_then(|d| validate_database_name(&d).map(|()| d)),
    );
    let attributes = p.take(match attributes {
        None | Some(Value::Null) => Ok(Default::default()),
        Some(v) => super::attributes::read(&v, base, warnings),
    });
    (mongohost, auth, database, attributes)
}

/// The loop interval, `dead_node_after_s`, the keepers' periods and `retain`, in that order;
/// None when any is wrong (each problem is in `p`).
fn check_timing(
    node_ms: (Option<u64>, Option<u64>),
    keepers_s: (Option<u64>, Option<u64>),
    retain_value: Option<&Value>,
    p: &mut Problems,
) -> Option<(
    Duration,
    Duration,
    Duration,
    Duration,
    disbatch_model::retention::Retention,
)> {
    let loop_interval = p.take(loop_interval(node_ms.0));
    let dead_node_after = p.take(dead_node_after(node_ms.1));
    let counts_reconcile = p.take(match keepers_s.0 {
        None => Ok(DEFAULT_COUNTS_RECONCILE),
        Some(0) => Err("key `counts_reconcile_s`: must be at least 1 s".to_string()),
        Some(s) => Ok(Duration::from_secs(s.min(7 * 24 * 3600))),
    });
    let stats_interval = p.take(stats_interval(keepers_s.1));
    let retain = p.take(retain(retain_value));
    Some((
        loop_interval?,
        dead_node_after?,
        counts_reconcile?,
        stats_interval?,
        retain?,
    ))
}

/// `plugins` (with `plugin_dirs`), `plugin_env`, and `plugin_user` with `plugin_group`, in
/// that order; None when any is wrong (each problem is in `p`).
fn check_plugins(
    table: Option<&Value>,
    dirs: Vec<String>,
    extra_env: &[String],
    user: (Option<&Value>, Option<&Value>),
    base: &Path,
    p: &mut Problems,
) -> Option<(
    PluginTable,
    crate::plugin_env::PluginEnv,
    Option<PluginUser>,
)> {
    let plugin_dirs: Vec<PathBuf> = dirs.iter().map(|d| resolve(base, d)).collect();
    let plugins = p.take(
        PluginTable::from_config(table, plugin_dirs, base)
            .map_err(|e| format!("key `plugins`: {e}")),
    );
    let plugin_env = p.take(
        crate::plugin_env::PluginEnv::with_extra(extra_env)
            .map_err(|e| format!("key `plugin_env`: {e}")),
    );
    let plugin_user = p.take(super::plugin_user::from_config(user.0, user.1));
    Some((plugins?, plugin_env?, plugin_user?))
}

/// `log_format` and `log_level`; None when either is wrong (each problem is in `p`).
fn check_logging(
    format: Option<&str>,
    level: Option<String>,
    p: &mut Problems,
) -> Option<(Option<crate::process::logging::LogFormat>, Option<String>)> {
    let log_format = p.take(
        format
            .map(|f| f.parse().map_err(|e| format!("key `log_format`: {e}")))
            .transpose(),
    );
    let log_level = p.take(match level {
        Some(l) if l.trim().is_empty() => Err("key `log_level` must not be empty".into()),
        Some(l) => crate::process::logging::check_level(&l)
            .map(|()| Some(l))
            .map_err(|e| format!("key `log_level`: {e}")),
        None => Ok(None),
    });
    Some((log_format?, log_level?))
}

/// The `web` keys and `metrics_listen`, checked in this order: `web.tokens`, `web.tls`, the
/// HTTP limits and origins, `web.namespaces`, `metrics_listen`, `web.max_body_bytes`. None
/// when any is wrong (each problem is in `p`).
fn check_web(
    web: RawWeb,
    metrics_listen: Option<&str>,
    base: &Path,
    warnings: &mut Vec<String>,
    p: &mut Problems,
) -> Option<(WebSettings, Option<std::net::SocketAddr>)> {
    let tokens = p.take(super::tokens::web_tokens(web.tokens, base, warnings));
    let web_tls = p.take(web.tls.map(|t| super::tokens::web_tls(t, base)).transpose());
    let http = p.take(super::web_http::validate(super::web_http::RawHttp {
        max_connections: web.max_connections,
        header_timeout_ms: web.header_timeout_ms,
        idle_timeout_ms: web.idle_timeout_ms,
        allowed_hosts: web.allowed_hosts,
        allowed_origins: web.allowed_origins,
    }));
    for ns in &web.namespaces {
        p.take(
            validate_database_name(ns)
                .map_err(|e| e.replace("key `database`", "key `web.namespaces`")),
        );
    }
    let metrics_listen = p.take(
            metrics_listen
                .map(|a| {
                    a.trim().parse::<std::net::SocketAddr>().map_err(|_| {
                        format!(
                            "key `metrics_listen`: {a:?} is not a socket address; use IP:PORT, e.g. \"127.0.0.1:9101\""
                        )
                    })
                })
                .transpose(),
        );
    let max_body_bytes = web.max_body_bytes.unwrap_or(WebSettings::DEFAULT_MAX_BODY);
    if max_body_bytes < 1024 {
        p.take::<()>(Err("key `web.max_body_bytes`: must be at least 1024".into()));
    }
    let (tokens, web_tls, http, metrics_listen) = (tokens?, web_tls?, http?, metrics_listen?);
    let web = WebSettings {
        listen: web.listen,
        max_body_bytes,
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
    Some((web, metrics_listen))
}

/// Problems found so far; `take` keeps checking past one.
#[derive(Default)]
struct Problems(Vec<String>);

impl Problems {
    fn take<T>(&mut self, result: Result<T, String>) -> Option<T> {
        result.map_err(|e| self.0.push(e)).ok()
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

/// A bare command name (no `/`) is looked up on PATH when spawned, like a shell would.
fn resolve_command(base: &Path, p: &str) -> PathBuf {
    if p.contains('/') {
        resolve(base, p)
    } else {
        PathBuf::from(p)
    }
}
