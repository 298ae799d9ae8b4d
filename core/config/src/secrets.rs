//! A config's secrets kept out of output: handed to the redactor as soon as the file is read,
//! and left out of `Config`'s `Debug`.

use serde_json::Value;

use super::Config;
use disbatch_model::text::redact::{redact_uri, remember_secret, uri_passwords};

/// Tells the redactor the `mongohost` password (as written and decoded), the `auth` and
/// `attributes` passwords and the web tokens, before validation, so even an error about this file cannot show them.
pub(super) fn remember(value: &Value) {
    if let Some(Value::String(uri)) = value.get("mongohost") {
        for password in uri_passwords(&super::mongohost::with_scheme(uri)) {
            remember_secret(&password);
        }
    }
    if let Some(Value::Object(auth)) = value.get("auth") {
        for password in auth.values().filter_map(Value::as_str) {
            remember_secret(password);
        }
    }
    let attribute_password = value.get("attributes").and_then(|a| a.get("password"));
    if let Some(Value::String(password)) = attribute_password {
        remember_secret(password);
    }
    let tokens = value
        .get("web")
        .and_then(|w| w.get("tokens"))
        .and_then(Value::as_array);
    for token in tokens.into_iter().flatten() {
        if let Some(Value::String(secret)) = token.get("token") {
            remember_secret(secret);
        }
    }
}

/// Refuses a password of another type than a string before the decoder sees it: its message
/// would quote the value ("invalid type: integer `12345678`").
pub(super) fn check_types(value: &Value) -> Result<(), String> {
    if let Some(Value::Object(auth)) = value.get("auth") {
        for (user, password) in auth {
            if !password.is_string() {
                return Err(format!(
                    "key `auth.{user}`: must be a string (a password; its value is not shown)"
                ));
            }
        }
    }
    match value.get("mongohost") {
        None | Some(Value::Null) | Some(Value::String(_)) => Ok(()),
        Some(_) => Err("key `mongohost`: must be a string (a URI that may hold a password; its value is not shown)".into()),
    }
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Every field named, none skipped with `..`: a new field must be placed here on purpose.
        let Config {
            path,
            mongohost,
            database,
            tls,
            driver,
            auth,
            plugins,
            plugin_env,
            plugin_user,
            task_runner,
            gfs,
            activequeues,
            ignorequeues,
            monitoring,
            balance,
            web_root,
            node,
            loop_interval,
            quiet,
            web,
            runtimes,
            web_extensions,
            metrics_listen,
            change_streams,
            dead_node_after,
            counts_reconcile,
            stats_interval,
            retain,
            log_format,
            log_level,
        } = self;
        let users: Vec<(&str, &str)> = auth.keys().map(|u| (u.as_str(), "<redacted>")).collect();
        f.debug_struct("Config")
            .field("path", path)
            .field("mongohost", &redact_uri(mongohost))
            .field("database", database)
            .field("tls", tls)
            .field("driver", driver)
            .field("auth", &users)
            .field("plugins", plugins)
            .field("plugin_env", plugin_env)
            .field("plugin_user", plugin_user)
            .field("task_runner", task_runner)
            .field("gfs", gfs)
            .field("activequeues", activequeues)
            .field("ignorequeues", ignorequeues)
            .field("monitoring", monitoring)
            .field("balance", balance)
            .field("web_root", web_root)
            .field("node", node)
            .field("loop_interval", loop_interval)
            .field("quiet", quiet)
            .field("web", web)
            .field("runtimes", runtimes)
            .field("web_extensions", web_extensions)
            .field("metrics_listen", metrics_listen)
            .field("change_streams", change_streams)
            .field("dead_node_after", dead_node_after)
            .field("counts_reconcile", counts_reconcile)
            .field("stats_interval", stats_interval)
            .field("retain", retain)
            .field("log_format", log_format)
            .field("log_level", log_level)
            .finish()
    }
}
