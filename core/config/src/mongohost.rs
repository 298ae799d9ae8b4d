//! `mongohost` in the forms Disbatch sites write it: a `mongodb://` or `mongodb+srv://` URI,
//! or, as the Perl driver takes it, a bare `host[:port]` or comma-separated host list.

use std::borrow::Cow;

use disbatch_model::text::redact::{redact, redact_uri};

const SCHEMES: [&str; 2] = ["mongodb://", "mongodb+srv://"];

/// The value as a URI: bare host lists get `mongodb://` in front, as the Perl driver does.
pub(super) fn with_scheme(value: &str) -> Cow<'_, str> {
    if value.contains("://") {
        Cow::Borrowed(value)
    } else {
        Cow::Owned(format!("mongodb://{value}"))
    }
}

/// The URI the driver is given, its form checked now so a bad one is refused at start, naming
/// the key, with any password masked. What only the driver can judge (its options) is checked
/// by the store (`unusable`), at `--check-config` and when it connects.
pub(super) fn normalise(value: &str) -> Result<String, String> {
    let uri = with_scheme(value);
    let bare = !value.contains("://");
    if !SCHEMES.iter().any(|s| uri.starts_with(s)) {
        return Err(format!(
            "key `mongohost`: {} is not a MongoDB URI; use mongodb://…, mongodb+srv://… or host:port[,host:port…]",
            shown(value)
        ));
    }
    if bare && value.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!(
            "key `mongohost`: {} holds a space or control character; give host:port[,host:port…]",
            shown(value)
        ));
    }
    Ok(uri.into_owned())
}

/// The problem with `mongohost` (as written, or as `normalise` made it) that the driver
/// refused for `reason` (its words, which may quote the URI: redacted).
pub fn unusable(value: &str, reason: &str) -> String {
    format!(
        "key `mongohost`: {} is not usable: {}",
        shown(value),
        redact(reason)
    )
}

/// The value as a message shows it: quoted, any password masked, without the `mongodb://`
/// that `with_scheme` put in front of a bare host list.
fn shown(value: &str) -> String {
    let uri = with_scheme(value);
    let masked = redact_uri(&uri).into_owned();
    let masked = match masked.strip_prefix(SCHEMES[0]) {
        Some(rest) if !value.contains("://") => rest.to_string(),
        _ => masked,
    };
    format!("{masked:?}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_stay_and_bare_hosts_become_uris() {
        for uri in [
            "mongodb://127.0.0.1:27017",
            "mongodb://u:p@h1:1,h2:2/admin?replicaSet=rs0",
            "mongodb+srv://cluster.example.com",
        ] {
            assert_eq!(normalise(uri).as_deref(), Ok(uri));
        }
        for (bare, uri) in [
            ("localhost", "mongodb://localhost"),
            ("db.example.com:27017", "mongodb://db.example.com:27017"),
            ("h1:27017,h2:27018", "mongodb://h1:27017,h2:27018"),
            ("[::1]:27017", "mongodb://[::1]:27017"),
            ("h1,h2/?replicaSet=rs0", "mongodb://h1,h2/?replicaSet=rs0"),
        ] {
            assert_eq!(normalise(bare).as_deref(), Ok(uri), "{bare}");
        }
    }

    #[test]
    fn bad_forms_are_refused_naming_the_key_without_the_password() {
        for (bad, says) in [
            ("http://h", "not a MongoDB URI"),
            ("mongodbx://u:Scheme-Pw1@h/", "not a MongoDB URI"),
            ("h1 h2", "space"),
            ("h\u{0}", "control"),
        ] {
            let e = normalise(bad).expect_err(bad);
            assert!(
                e.starts_with("key `mongohost`: ") && e.contains(says),
                "{bad}: {e}"
            );
            assert!(!e.contains("-Pw"), "{e}");
        }
        let e = unusable("u:Bare-Pw-123@h:1,", "an empty host");
        assert!(
            e.contains("\"u:***@h:1,\"") && e.contains("is not usable"),
            "{e}"
        );
        assert!(!e.contains("-Pw"), "{e}");
    }
}
