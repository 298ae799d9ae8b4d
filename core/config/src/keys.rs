//! Every key the config reader accepts, as dotted paths, read off the reader's own types so the
//! book's config reference can be checked against it (tests/tests/docs/reference.rs).

use std::cell::RefCell;
use std::fmt;

use serde::de::{self, DeserializeSeed, IntoDeserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use super::raw::RawConfig;

/// Every accepted key: `mongohost`, `web.tls.cert_file`, `attributes.w`,
/// `attributes.ssl.SSL_ca_file`, `web.tokens[].role`, and Disbatch 4's accepted unused keys.
/// Free-form maps (`plugins`, `auth`, `web_extensions`) are one key each.
pub fn accepted_keys() -> Vec<String> {
    let found = RefCell::new(Vec::new());
    // The walk visits every field of every struct and builds a value from nothing; it cannot
    // fail on data, only if a field's type refuses every stand-in, which the tests would show.
    let _ = RawConfig::deserialize(Walk {
        prefix: String::new(),
        found: &found,
    });
    let mut keys = found.into_inner();
    // Objects the reader checks by hand: their own keys are listed below instead.
    keys.retain(|k| k != "attributes" && k != "web.tokens");
    keys.extend(super::raw::ACCEPTED_UNUSED.iter().map(|k| k.to_string()));
    keys.extend(super::attributes::accepted_keys());
    keys.extend(
        super::tokens::TOKEN_KEYS
            .iter()
            .map(|k| format!("web.tokens[].{k}")),
    );
    keys.sort();
    keys.dedup();
    keys
}

/// A deserializer that answers every struct with all its fields (recording their paths) and
/// every other value with an empty stand-in.
struct Walk<'a> {
    prefix: String,
    found: &'a RefCell<Vec<String>>,
}

#[derive(Debug)]
struct WalkError(String);

impl fmt::Display for WalkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for WalkError {}

impl de::Error for WalkError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        WalkError(msg.to_string())
    }
}

impl<'de> de::Deserializer<'de> for Walk<'_> {
    type Error = WalkError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, WalkError> {
        // A leaf (a JSON value, a Perl boolean): every such type takes a boolean.
        visitor.visit_bool(false)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, WalkError> {
        visitor.visit_some(self)
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, WalkError> {
        // A struct is a table of keys, not a key of its own.
        if let Some(table) = self.prefix.strip_suffix('.') {
            self.found.borrow_mut().retain(|k| k != table);
        }
        visitor.visit_map(Fields {
            prefix: self.prefix,
            fields,
            at: 0,
            found: self.found,
        })
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, WalkError> {
        visitor.visit_map(Empty)
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, WalkError> {
        visitor.visit_seq(Empty)
    }

    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, WalkError> {
        visitor.visit_str("")
    }

    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, WalkError> {
        visitor.visit_str("")
    }

    fn deserialize_u64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, WalkError> {
        visitor.visit_u64(0)
    }

    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, WalkError> {
        visitor.visit_bool(false)
    }

    serde::forward_to_deserialize_any! {
        i8 i16 i32 i64 i128 u8 u16 u32 u128 f32 f64 char bytes byte_buf unit unit_struct
        newtype_struct tuple tuple_struct enum identifier ignored_any
    }
}

/// A struct's fields, each key followed by a walk of its value.
struct Fields<'a> {
    prefix: String,
    fields: &'static [&'static str],
    at: usize,
    found: &'a RefCell<Vec<String>>,
}

impl<'de> MapAccess<'de> for Fields<'_> {
    type Error = WalkError;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, WalkError> {
        let Some(field) = self.fields.get(self.at) else {
            return Ok(None);
        };
        let path = format!("{}{field}", self.prefix);
        self.found.borrow_mut().push(path);
        seed.deserialize(field.into_deserializer()).map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, WalkError> {
        let field = self.fields.get(self.at).copied().unwrap_or_default();
        self.at += 1;
        seed.deserialize(Walk {
            prefix: format!("{}{field}.", self.prefix),
            found: self.found,
        })
    }
}

/// An empty map or sequence.
struct Empty;

impl<'de> MapAccess<'de> for Empty {
    type Error = WalkError;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        _: K,
    ) -> Result<Option<K::Value>, WalkError> {
        Ok(None)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, _: V) -> Result<V::Value, WalkError> {
        Err(WalkError("no value".into()))
    }
}

impl<'de> SeqAccess<'de> for Empty {
    type Error = WalkError;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        _: T,
    ) -> Result<Option<T::Value>, WalkError> {
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::accepted_keys;

    #[test]
    fn the_walk_finds_nested_keys_and_leaves_out_the_tables_themselves() {
        let keys = accepted_keys();
        for key in [
            "mongohost",
            "database",
            "plugins",
            "web.listen",
            "web.tls.cert_file",
            "web.tls.key_file",
            "web.allowed_origins",
            "balance.pretend",
            "log_level",
            "views_dir",
            "attributes.w",
            "attributes.tls_ca_file",
            "attributes.ssl.SSL_verify_mode",
            "web.tokens[].token_file",
        ] {
            assert!(keys.iter().any(|k| k == key), "{key} missing from {keys:?}");
        }
        for table in ["web", "web.tls", "balance", "attributes", "web.tokens"] {
            assert!(
                !keys.iter().any(|k| k == table),
                "{table} is a table, not a key"
            );
        }
    }
}
