//! Credentials kept out of messages: the password of any `scheme://user:password@host` in a text,
//! and the secrets a config named (its `auth` passwords, its URI's password, its web tokens).

use std::borrow::Cow;
use std::sync::RwLock;

/// What a password is replaced with.
pub const MASK: &str = "***";

/// Shorter known secrets are not searched for in free text: masking every "abc" in a log would
/// ruin it. Passwords inside URIs are masked whatever their length.
pub const MIN_SECRET_CHARS: usize = 6;

/// Secrets from the configs this process read, longest first.
static SECRETS: RwLock<Vec<String>> = RwLock::new(Vec::new());

/// Masks URI passwords (see [`redact_uris`]) and then every secret this process was told about.
pub fn redact(text: &str) -> Cow<'_, str> {
    let mut out = redact_uris(text);
    let secrets = SECRETS
        .read()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    for secret in secrets.iter() {
        if out.contains(secret.as_str()) {
            out = Cow::Owned(out.replace(secret.as_str(), MASK));
        }
    }
    out
}

/// Masks the password of every `scheme://user:password@…` in `text`; the scheme, the user
/// and the hosts stay, so the message still says what was wrong.
///
/// The rules, for any scheme (so a mistyped `mongodbx://` is covered too):
/// - a URI runs from `scheme://` to the next whitespace (passwords may hold quotes, `/`, `?`);
/// - its user information ends at the **last** `@` in that run, as MongoDB reads URIs, so a
///   password holding an unescaped `@` is masked whole;
/// - the password is what follows the first `:` of the user information (a user name cannot
///   hold a raw `:`), percent-encoded or not; a URI with no `@`, or no `:` before it, is left
///   as it is (`http://host:8080/`).
///
/// Safety wins over precision: an `@` later in the same run (`http://h:1/@x`) masks the text
/// before it.
pub fn redact_uris(text: &str) -> Cow<'_, str> {
    let mut out = String::new();
    let mut copied = 0;
    let mut search = 0;
    while let Some(found) = text[search..].find("://") {
        let separator = search + found;
        let start = separator + 3;
        let end = text[start..]
            .find(char::is_whitespace)
            .map_or(text.len(), |i| start + i);
        search = end.max(start);
        if scheme_start(text, separator).is_none() {
            continue;
        }
        if let Some((from, to)) = password_span(&text[start..end]) {
            out.push_str(&text[copied..start + from]);
            out.push_str(MASK);
            copied = start + to;
        }
    }
    if copied == 0 {
        return Cow::Borrowed(text);
    }
    out.push_str(&text[copied..]);
    Cow::Owned(out)
}

/// A value that is one URI (a config's `mongohost`) with its password masked. Unlike
/// [`redact_uris`], the user information runs to the value's last `@` even across whitespace.
pub fn redact_uri(uri: &str) -> Cow<'_, str> {
    match value_password_span(uri) {
        Some((from, to)) => Cow::Owned(format!("{}{MASK}{}", &uri[..from], &uri[to..])),
        None => Cow::Borrowed(uri),
    }
}

/// The password of a value that is one URI, as written and, when it is percent-encoded,
/// decoded: what a message might quote.
pub fn uri_passwords(uri: &str) -> Vec<String> {
    let Some((from, to)) = value_password_span(uri) else {
        return Vec::new();
    };
    let raw = &uri[from..to];
    let mut found = vec![raw.to_string()];
    if let Some(decoded) = percent_decoded(raw).filter(|d| d != raw) {
        found.push(decoded);
    }
    found
}

/// Adds a secret for [`redact`] to mask from now on (too short ones are ignored).
pub fn remember_secret(secret: &str) {
    if secret.chars().count() < MIN_SECRET_CHARS {
        return;
    }
    let mut secrets = SECRETS
        .write()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if !secrets.iter().any(|s| s == secret) {
        secrets.push(secret.to_string());
        // A secret that contains another must be masked before it, or half of it would show.
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    }
}

fn value_password_span(uri: &str) -> Option<(usize, usize)> {
    let start = uri.find("://")? + 3;
    password_span(&uri[start..]).map(|(from, to)| (start + from, start + to))
}

/// Where the password lies in `authority_and_rest` (what follows `scheme://`): from after the
/// user's `:` to the last `@`. None when there is no `@`, no `:` before it, or no password.
fn password_span(authority_and_rest: &str) -> Option<(usize, usize)> {
    let at = authority_and_rest.rfind('@')?;
    let colon = authority_and_rest[..at].find(':')?;
    (colon + 1 < at).then_some((colon + 1, at))
}

/// The start of the scheme ending at `separator` (the `://`): a letter, then letters, digits,
/// `+`, `-` or `.`, as RFC 3986 says. None when there is none (`://` alone is no URI).
fn scheme_start(text: &str, separator: usize) -> Option<usize> {
    let before = &text.as_bytes()[..separator];
    let length = before
        .iter()
        .rev()
        .take_while(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'))
        .count();
    let start = separator - length;
    // Skip leading digits and signs: `1http://` is `http://` after a digit.
    let first_letter = before[start..].iter().position(u8::is_ascii_alphabetic)?;
    Some(start + first_letter)
}

/// `%XX` sequences decoded; None when they do not decode to UTF-8 text.
fn percent_decoded(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (bytes[i], bytes.get(i + 1), bytes.get(i + 2)) {
            (b'%', Some(&h), Some(&l)) if hex(h).is_some() && hex(l).is_some() => {
                let value = hex(h).unwrap_or(0) * 16 + hex(l).unwrap_or(0);
                out.push(value as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(text: &str) -> String {
        redact_uris(text).into_owned()
    }

    #[test]
    fn the_password_goes_and_scheme_user_and_host_stay() {
        assert_eq!(
            r("mongodb://user:s3cret@db.example.com:27017/x"),
            "mongodb://user:***@db.example.com:27017/x"
        );
        assert_eq!(
            r("mongodbx://user:s3cret@host/"),
            "mongodbx://user:***@host/"
        );
        assert_eq!(
            r("mongodb+srv://u:p4ss@cluster0.example.net/?retryWrites=true"),
            "mongodb+srv://u:***@cluster0.example.net/?retryWrites=true"
        );
        assert_eq!(r("postgres://:onlypw@h"), "postgres://:***@h");
    }

    #[test]
    fn uris_inside_longer_text_several_per_message() {
        assert_eq!(
            r("key `mongohost`: \"mongodbx://a:one1@h1/\" is not a MongoDB URI; was mongodb://b:two2@h2/ before"),
            "key `mongohost`: \"mongodbx://a:***@h1/\" is not a MongoDB URI; was mongodb://b:***@h2/ before"
        );
        assert_eq!(
            r("error=parse(mongodb://u:x@h) again=(http://v:y@k:1/)"),
            "error=parse(mongodb://u:***@h) again=(http://v:***@k:1/)"
        );
    }

    #[test]
    fn percent_encoded_and_unescaped_at_and_colon_are_masked_whole() {
        assert_eq!(
            r("mongodb://user:s3c%40ret%3APW@127.0.0.1:1/?tls=maybe"),
            "mongodb://user:***@127.0.0.1:1/?tls=maybe"
        );
        // MongoDB splits at the last @: the password holds the first @ and a second colon.
        assert_eq!(
            r("mongodb://user:s3c@r:etPW@127.0.0.1:1/"),
            "mongodb://user:***@127.0.0.1:1/"
        );
        assert_eq!(
            r("mongodb://user:a/b?c#d@host/db"),
            "mongodb://user:***@host/db"
        );
        assert_eq!(r("\"mongodb://u:q\\\"uote@h/\""), "\"mongodb://u:***@h/\"");
    }

    #[test]
    fn urls_without_a_password_are_left_alone() {
        for text in [
            "http://host:8080/",
            "listening on http://127.0.0.1:8080",
            "https://medium.com/@someone",
            "mongodb://user@host/?authMechanism=MONGODB-X509",
            "mongodb://h1:27017,h2:27017/?replicaSet=rs0",
            "a :// b with no scheme user:pw@host",
            "://x:y@z",
            "plain text: with colons @ and ats",
            "",
        ] {
            assert_eq!(r(text), text);
            assert!(matches!(redact_uris(text), Cow::Borrowed(_)), "{text}");
        }
    }

    #[test]
    fn an_at_later_in_the_same_url_masks_before_it_rather_than_risk_a_leak() {
        assert_eq!(r("http://h:1/@x"), "http://h:***@x");
    }

    #[test]
    fn a_configured_uri_is_masked_across_whitespace() {
        assert_eq!(redact_uri("mongodb://u:pass word@h/"), "mongodb://u:***@h/");
        assert_eq!(redact_uri("mongodb://h:27017/"), "mongodb://h:27017/");
    }

    #[test]
    fn passwords_of_a_configured_uri_raw_and_decoded() {
        assert_eq!(
            uri_passwords("mongodb://user:s3c%40ret%3APW@h/"),
            ["s3c%40ret%3APW", "s3c@ret:PW"]
        );
        assert_eq!(uri_passwords("mongodb://u:pass word@h/"), ["pass word"]);
        assert_eq!(uri_passwords("mongodb://u:a@b@h/"), ["a@b"]);
        assert!(uri_passwords("mongodb://h/").is_empty());
        assert!(uri_passwords("not a uri").is_empty());
        assert_eq!(percent_decoded("%ff"), None);
        assert_eq!(percent_decoded("100%"), Some("100%".into()));
    }

    #[test]
    fn remembered_secrets_are_masked_anywhere_and_short_ones_ignored() {
        remember_secret("Zq8-known-secret");
        remember_secret("Zq8-known-secret-longer");
        remember_secret("abc");
        assert_eq!(
            redact("auth failed for Zq8-known-secret-longer and Zq8-known-secret; abc stays"),
            "auth failed for *** and ***; abc stays"
        );
    }
}
