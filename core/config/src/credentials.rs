//! Where the MongoDB credentials come from: the config itself (Disbatch 4's `mongohost` and
//! `auth`), files beside it (`mongohost_file`, `auth_files`) that config management can keep at
//! mode 0600 while the config stays readable, or the environment (a service manager's
//! credentials), which wins.

use std::collections::BTreeMap;
use std::path::Path;

use disbatch_model::text::redact::{remember_secret, uri_passwords};

/// The connection string: `DISBATCH_MONGOHOST`, else `mongohost` or the file `mongohost_file`
/// names (one of the two), trimmed of the file's trailing newline.
pub(super) fn mongohost(
    base: &Path,
    inline: Option<String>,
    file: Option<String>,
    env: impl Fn(&str) -> Option<String>,
) -> Result<String, String> {
    if let Some(uri) = env("DISBATCH_MONGOHOST").filter(|v| !v.trim().is_empty()) {
        remember_uri(&uri);
        return Ok(uri);
    }
    match (inline, file) {
        (Some(_), Some(_)) => Err("give `mongohost` or `mongohost_file`, not both".into()),
        (Some(uri), None) => Ok(uri),
        (None, Some(path)) => {
            let uri = read_secret("mongohost_file", base, &path)?;
            remember_uri(&uri);
            Ok(uri)
        }
        (None, None) => Err(
            "key `mongohost` is required (or `mongohost_file`, or DISBATCH_MONGOHOST in the environment)"
                .into(),
        ),
    }
}

/// Passwords by MongoDB user: `auth`, then `auth_files` (user → password file; a user in both
/// is a mistake), then `DISBATCH_AUTH_<USER>` for each component user (upper case, `-` as `_`).
pub(super) fn auth(
    base: &Path,
    inline: Option<BTreeMap<String, String>>,
    files: Option<BTreeMap<String, String>>,
    users: &[&str],
    env: impl Fn(&str) -> Option<String>,
) -> Result<BTreeMap<String, String>, String> {
    let mut auth = inline.unwrap_or_default();
    for (user, path) in files.unwrap_or_default() {
        if auth.contains_key(&user) {
            return Err(format!(
                "key `auth_files.{user}`: user {user} already has a password in `auth`; give one of the two"
            ));
        }
        let password = read_secret(&format!("auth_files.{user}"), base, &path)?;
        remember_secret(&password);
        auth.insert(user, password);
    }
    for user in users {
        if let Some(password) = env(&env_name(user)).filter(|p| !p.is_empty()) {
            remember_secret(&password);
            auth.insert((*user).to_string(), password);
        }
    }
    Ok(auth)
}

/// `DISBATCH_AUTH_` and the user name in upper case, other characters than letters and digits
/// as `_`.
pub fn env_name(user: &str) -> String {
    let upper: String = user
        .chars()
        .map(|c| match c.is_ascii_alphanumeric() {
            true => c.to_ascii_uppercase(),
            false => '_',
        })
        .collect();
    format!("DISBATCH_AUTH_{upper}")
}

fn remember_uri(uri: &str) {
    for password in uri_passwords(&super::mongohost::with_scheme(uri)) {
        remember_secret(&password);
    }
}

/// A secret file's text, trimmed; never quoted in an error.
fn read_secret(key: &str, base: &Path, path: &str) -> Result<String, String> {
    let full = base.join(path);
    let text = super::read_capped(&full, super::MAX_SECRET_BYTES)
        .map_err(|e| format!("key `{key}`: cannot read {}: {e}", full.display()))?;
    let text = text.trim();
    if text.is_empty() {
        return Err(format!("key `{key}`: {} is empty", full.display()));
    }
    Ok(text.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn the_uri_comes_from_the_config_a_file_or_the_environment() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("uri"), "mongodb://u:File-Pw-9@h/\n").expect("write");
        let base = dir.path();
        let inline = Some("mongodb://h/".to_string());
        assert_eq!(
            mongohost(base, inline.clone(), None, no_env).as_deref(),
            Ok("mongodb://h/")
        );
        assert_eq!(
            mongohost(base, None, Some("uri".into()), no_env).as_deref(),
            Ok("mongodb://u:File-Pw-9@h/")
        );
        assert!(disbatch_model::text::redact::redact("x File-Pw-9 y").contains("x "));
        assert!(!disbatch_model::text::redact::redact("x File-Pw-9 y").contains("File-Pw-9"));
        let both = mongohost(base, inline.clone(), Some("uri".into()), no_env);
        assert!(both.is_err_and(|e| e.contains("not both")));
        let missing = mongohost(base, None, Some("nope".into()), no_env);
        assert!(missing.is_err_and(|e| e.contains("`mongohost_file`") && e.contains("nope")));
        let env = |k: &str| (k == "DISBATCH_MONGOHOST").then(|| "mongodb://env/".to_string());
        assert_eq!(
            mongohost(base, inline, None, env).as_deref(),
            Ok("mongodb://env/")
        );
        let none = mongohost(base, None, None, no_env);
        assert!(none.is_err_and(|e| e.contains("DISBATCH_MONGOHOST")));
    }

    #[test]
    fn passwords_come_from_auth_files_and_the_environment() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("den.pw"), "Den-File-Pw-7\n").expect("write");
        std::fs::write(dir.path().join("empty.pw"), "\n").expect("write");
        let base = dir.path();
        let map = |pairs: &[(&str, &str)]| {
            Some(
                pairs
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect::<BTreeMap<_, _>>(),
            )
        };
        let users = ["disbatchd", "disbatch_web"];
        let got = auth(
            base,
            map(&[("disbatch_web", "inline")]),
            map(&[("disbatchd", "den.pw")]),
            &users,
            no_env,
        )
        .expect("auth");
        assert_eq!(
            got.get("disbatchd").map(String::as_str),
            Some("Den-File-Pw-7")
        );
        assert_eq!(got.get("disbatch_web").map(String::as_str), Some("inline"));
        assert!(!disbatch_model::text::redact::redact("Den-File-Pw-7").contains("Den-File-Pw-7"));
        let twice = auth(
            base,
            map(&[("disbatchd", "a")]),
            map(&[("disbatchd", "den.pw")]),
            &users,
            no_env,
        );
        assert!(twice.is_err_and(|e| e.contains("auth_files.disbatchd")));
        let empty = auth(
            base,
            None,
            map(&[("disbatchd", "empty.pw")]),
            &users,
            no_env,
        );
        assert!(empty.is_err_and(|e| e.contains("is empty")));
        assert_eq!(env_name("disbatch_web"), "DISBATCH_AUTH_DISBATCH_WEB");
        let env = |k: &str| (k == "DISBATCH_AUTH_DISBATCHD").then(|| "Env-Pw-3".to_string());
        let got = auth(base, map(&[("disbatchd", "inline")]), None, &users, env).expect("auth");
        assert_eq!(got.get("disbatchd").map(String::as_str), Some("Env-Pw-3"));
    }
}
