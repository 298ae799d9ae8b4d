//! `web.tls` and `web.tokens`: files and secrets, checked without ever quoting a token.

use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

use super::files::resolve;
use super::{Role, WebSettings, WebTls, WebToken};

#[derive(Debug, Deserialize)]
pub(super) struct RawWebTls {
    pub(super) cert_file: String,
    pub(super) key_file: String,
}

/// The keys of one `web.tokens` entry.
pub(super) const TOKEN_KEYS: &[&str] = &["name", "role", "token", "token_file"];

pub(super) fn web_tls(raw: RawWebTls, base: &Path) -> Result<WebTls, String> {
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
pub(super) fn web_tokens(
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
            let text = super::read_capped(&path, super::MAX_SECRET_BYTES).map_err(|e| {
                format!("key `{at}.token_file`: cannot read {}: {e}", path.display())
            })?;
            // A file's final newline is not part of the token.
            let secret = text.trim();
            // Inline tokens are known to the redactor from the start; this one only now.
            disbatch_model::text::redact::remember_secret(secret);
            checked_secret(&format!("{at}.token_file"), secret)?
        }
    };
    for key in map.keys() {
        if !TOKEN_KEYS.contains(&key.as_str()) {
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
