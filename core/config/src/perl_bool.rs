//! Booleans as Disbatch's Perl read them: configs written for it say `1` and `0` as often as
//! `true` and `false`.

use serde::{Deserialize, Deserializer};
use serde_json::Value;

/// What a boolean key accepts, for messages.
pub const EXPECTED: &str = "expected true, false, 1, 0, \"1\" or \"0\"";

/// `true`/`false`, `1`/`0` and `"1"`/`"0"`; None for anything else. Perl would take any
/// scalar, but `"no"` or `"false"` are true to Perl and surely not what was meant: refused.
pub fn perl_bool(value: &Value) -> Option<bool> {
    match value {
        Value::Bool(b) => Some(*b),
        Value::Number(n) if n.as_f64() == Some(1.0) => Some(true),
        Value::Number(n) if n.as_f64() == Some(0.0) => Some(false),
        Value::String(s) if s == "1" => Some(true),
        Value::String(s) if s == "0" => Some(false),
        _ => None,
    }
}

/// A boolean config value and how the file wrote it, which the DCI shows back unchanged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PerlBool {
    pub value: bool,
    pub written: Value,
}

impl<'de> Deserialize<'de> for PerlBool {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let written = Value::deserialize(deserializer)?;
        match perl_bool(&written) {
            Some(value) => Ok(PerlBool { value, written }),
            None => Err(serde::de::Error::custom(format!(
                "{EXPECTED}, got {}",
                shown(&written)
            ))),
        }
    }
}

/// A refused value, short: a whole object or a long string would drown the message.
fn shown(value: &Value) -> String {
    match value {
        Value::Object(_) => "an object".into(),
        Value::Array(_) => "an array".into(),
        Value::String(s) if s.chars().count() > 20 => "a string".into(),
        other => other.to_string(),
    }
}

/// The value of an optional boolean key, `default` when absent or null.
pub(super) fn or(value: Option<PerlBool>, default: bool) -> bool {
    value.map_or(default, |b| b.value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn perl_spellings_are_booleans_and_nothing_else_is() {
        for (v, b) in [
            (json!(true), true),
            (json!(false), false),
            (json!(1), true),
            (json!(0), false),
            (json!("1"), true),
            (json!("0"), false),
        ] {
            assert_eq!(perl_bool(&v), Some(b), "{v}");
        }
        for v in [
            json!(2),
            json!(-1),
            json!(1.5),
            json!("yes"),
            json!("true"),
            json!(""),
            json!([1]),
            json!({}),
        ] {
            assert_eq!(perl_bool(&v), None, "{v}");
        }
    }

    #[test]
    fn a_refused_value_is_named_briefly() {
        let e = serde_json::from_value::<PerlBool>(json!("yes")).expect_err("refused");
        assert_eq!(e.to_string(), format!("{EXPECTED}, got \"yes\""));
        let e = serde_json::from_value::<PerlBool>(json!({"a": 1})).expect_err("refused");
        assert!(e.to_string().ends_with("got an object"), "{e}");
        let kept = serde_json::from_value::<PerlBool>(json!(1)).expect("ok");
        assert_eq!((kept.value, kept.written), (true, json!(1)));
    }
}
