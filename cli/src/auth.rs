//! Credentials: Basic (user + DISBATCH_PASSWORD) or Bearer (token file or DISBATCH_TOKEN), never shown.

use std::path::Path;

use anyhow::{bail, Context};
use reqwest::header::HeaderValue;

pub const PASSWORD_ENV: &str = "DISBATCH_PASSWORD";
pub const TOKEN_ENV: &str = "DISBATCH_TOKEN";

/// How requests authenticate. Deliberately not `Debug`, so secrets cannot reach a log line.
pub enum Auth {
    None,
    /// HTTP Basic, as Disbatch's proxy setup (realm `disbatch`) expects.
    Basic {
        username: String,
        password: String,
    },
    /// A ready `Bearer …` header, marked sensitive.
    Bearer(HeaderValue),
}

impl Auth {
    /// Picks the credentials from the options and environment. Secrets come only from the
    /// environment or a file: a command-line value would be visible to every user via `ps`.
    pub fn from_options(username: Option<&str>, token_file: Option<&Path>) -> anyhow::Result<Auth> {
        if let Some(username) = username {
            let Some(password) = std::env::var_os(PASSWORD_ENV) else {
                bail!("--username needs the password in the {PASSWORD_ENV} environment variable");
            };
            let Some(password) = password.to_str() else {
                bail!("{PASSWORD_ENV} is not valid UTF-8");
            };
            return Ok(Auth::Basic {
                username: username.to_string(),
                password: password.to_string(),
            });
        }
        if let Some(path) = token_file {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading the token file {}", path.display()))?;
            return bearer(&text).with_context(|| format!("token file {}", path.display()));
        }
        match std::env::var_os(TOKEN_ENV) {
            None => Ok(Auth::None),
            Some(token) => match token.to_str() {
                Some(token) => bearer(token).context(TOKEN_ENV),
                None => bail!("{TOKEN_ENV} is not valid UTF-8"),
            },
        }
    }
}

/// A Bearer header from token text; surrounding whitespace (a file's final newline) is dropped.
fn bearer(token: &str) -> anyhow::Result<Auth> {
    let token = token.trim();
    if token.is_empty() {
        bail!("the token is empty");
    }
    // The token itself stays out of the message: the error may be pasted into a ticket.
    let mut header = HeaderValue::from_str(&format!("Bearer {token}"))
        .map_err(|_| anyhow::anyhow!("the token has characters not allowed in an HTTP header"))?;
    header.set_sensitive(true);
    Ok(Auth::Bearer(header))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_tokens_are_trimmed_and_checked() {
        match bearer(" abc.def\n").unwrap() {
            Auth::Bearer(h) => {
                assert_eq!(h.to_str().unwrap(), "Bearer abc.def");
                assert!(h.is_sensitive());
            }
            _ => panic!("not a bearer"),
        }
        assert!(bearer("  \n").is_err());
        let err = bearer("se\u{1}cret").err().unwrap().to_string();
        assert!(!err.contains("cret"), "{err}");
    }
}
