//! `mongohost` in the forms Disbatch sites write it: a `mongodb://` or `mongodb+srv://` URI,
//! or, as the Perl driver takes it, a bare `host[:port]` or comma-separated host list.

use std::borrow::Cow;

use crate::text::redact::{redact, redact_uri};

const SCHEMES: [&str; 2] = ["mongodb://", "mongodb+srv://"];

/// The value as a URI: bare host lists get `mongodb://` in front, as the Perl driver does.
pub(super) fn with_scheme(value: &str) -> Cow<'_, str> {
    if value.contains("://") {
        Cow::Borrowed(value)
    } else {
        Cow::Owned(format!("mongodb://{value}"))
    }
}

/// The URI the driver is given, checked now so a bad one is refused at start, naming the key,
/// with any password masked.
pub(super) fn normalise(value: &str) -> Result<String, String> {
    let uri = with_scheme(value);
    let bare = !value.contains("://");
    let shown = || {
        let masked = redact_uri(&uri).into_owned();
        let masked = match masked.strip_prefix(SCHEMES[0]) {
            Some(rest) if bare => rest.to_string(),
            _ => masked,
        };
        format!("{masked:?}")
    };
    if !SCHEMES.iter().any(|s| uri.starts_with(s)) {
        return Err(format!(
            "key `mongohost`: {} is not a MongoDB URI; use mongodb://…, mongodb+srv://… or host:port[,host:port…]",
            shown()
        ));
    }
    if bare && value.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!(
            "key `mongohost`: {} holds a space or control character; give host:port[,host:port…]",
            shown()
        ));
    }
    mongodb::options::ConnectionString::parse(uri.as_ref()).map_err(|e| {
        format!(
            "key `mongohost`: {} is not usable: {}",
            shown(),
            redact(&e.kind.to_string())
        )
    })?;
    Ok(uri.into_owned())
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
            ("h:notaport", "not usable"),
            ("h:99999", "not usable"),
            ("u:Bare-Pw-123@h:1,", "not usable"),
            ("mongodb://h/?tls=maybe", "tls"),
        ] {
            let e = normalise(bad).expect_err(bad);
            assert!(
                e.starts_with("key `mongohost`: ") && e.contains(says),
                "{bad}: {e}"
            );
            assert!(!e.contains("-Pw"), "{e}");
        }
        let e = normalise("u:Bare-Pw-123@h:1,").expect_err("empty host");
        assert!(e.contains("\"u:***@h:1,\""), "{e}");
    }
}
