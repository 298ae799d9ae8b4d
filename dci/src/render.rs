//! BSON to Disbatch's JSON: sorted keys, `{"$oid"}` ids, dates as `YYYY-MM-DDTHH:MM:SS`.

use axum::http::header;
use axum::response::{IntoResponse, Response};
use bson::{Bson, Document};
use serde_json::{Map, Value};

/// How dates are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Dates {
    /// Disbatch's default: the UTC date-time without zone or fraction.
    #[default]
    Text,
    /// `.epoch`: float seconds.
    Epoch,
    /// Integer milliseconds (how `GET /nodes` reports `timestamp`).
    Millis,
}

pub fn document(d: &Document, dates: Dates) -> Value {
    bson(&Bson::Document(d.clone()), dates)
}

/// Converts a value. Keys are sorted (Disbatch encodes canonically), whatever order the
/// document or serde_json's map keeps.
pub fn bson(b: &Bson, dates: Dates) -> Value {
    match b {
        Bson::Document(d) => {
            let mut keys: Vec<&String> = d.keys().collect();
            keys.sort();
            let mut map = Map::new();
            for k in keys {
                if let Some(v) = d.get(k) {
                    map.insert(k.clone(), bson(v, dates));
                }
            }
            Value::Object(map)
        }
        Bson::Array(items) => Value::Array(items.iter().map(|i| bson(i, dates)).collect()),
        Bson::ObjectId(id) => serde_json::json!({"$oid": id.to_hex()}),
        Bson::DateTime(dt) => date(*dt, dates),
        Bson::Int32(n) => Value::from(*n),
        Bson::Int64(n) => Value::from(*n),
        Bson::Double(f) => serde_json::Number::from_f64(*f).map_or(Value::Null, Value::Number),
        Bson::String(s) => Value::String(s.clone()),
        Bson::Boolean(v) => Value::Bool(*v),
        Bson::Null | Bson::Undefined => Value::Null,
        other => other.clone().into_relaxed_extjson(),
    }
}

pub fn date(dt: bson::DateTime, dates: Dates) -> Value {
    match dates {
        Dates::Text => {
            let text = dt.try_to_rfc3339_string().unwrap_or_default();
            Value::String(text.chars().take(19).collect())
        }
        Dates::Epoch => serde_json::Number::from_f64(dt.timestamp_millis() as f64 / 1000.0)
            .map_or(Value::Null, Value::Number),
        Dates::Millis => Value::from(dt.timestamp_millis()),
    }
}

/// Sorts object keys at every depth: Disbatch encoded canonically, and clients diff output.
pub fn canonical(value: &mut Value) {
    match value {
        Value::Object(map) => {
            map.sort_keys();
            map.values_mut().for_each(canonical);
        }
        Value::Array(items) => items.iter_mut().for_each(canonical),
        _ => {}
    }
}

/// A JSON response with sorted keys, pretty-printed when asked.
pub fn json_response(value: &Value, pretty: bool) -> Response {
    let mut value = value.clone();
    canonical(&mut value);
    let text = if pretty {
        pretty_text(&value)
    } else {
        serde_json::to_string(&value).unwrap_or_else(|_| "null".into())
    };
    ([(header::CONTENT_TYPE, "application/json")], text).into_response()
}

/// Disbatch's pretty JSON, byte for byte: Cpanel::JSON::XS's `pretty` indents by three
/// spaces, writes `"key" : value` and ends with a newline. Clients print it as it comes
/// (`disbatch tasks --pretty`), so the layout is part of what they show.
pub fn pretty_text(value: &Value) -> String {
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(&mut out, PerlPretty::default());
    if serde::Serialize::serialize(value, &mut ser).is_err() {
        return "null\n".into();
    }
    out.push(b'\n');
    String::from_utf8(out).unwrap_or_else(|_| "null\n".into())
}

/// serde_json's PrettyFormatter with Cpanel::JSON::XS's indent and key separator.
#[derive(Default)]
struct PerlPretty {
    depth: usize,
    has_value: bool,
}

impl PerlPretty {
    fn newline<W: ?Sized + std::io::Write>(&self, w: &mut W) -> std::io::Result<()> {
        w.write_all(b"\n")?;
        (0..self.depth).try_for_each(|_| w.write_all(b"   "))
    }

    fn open<W: ?Sized + std::io::Write>(&mut self, w: &mut W, b: &[u8]) -> std::io::Result<()> {
        self.depth += 1;
        self.has_value = false;
        w.write_all(b)
    }

    fn close<W: ?Sized + std::io::Write>(&mut self, w: &mut W, b: &[u8]) -> std::io::Result<()> {
        self.depth -= 1;
        if self.has_value {
            self.newline(w)?;
        }
        w.write_all(b)
    }

    fn item<W: ?Sized + std::io::Write>(&mut self, w: &mut W, first: bool) -> std::io::Result<()> {
        if !first {
            w.write_all(b",")?;
        }
        self.newline(w)
    }
}

impl serde_json::ser::Formatter for PerlPretty {
    fn begin_array<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.open(w, b"[")
    }
    fn end_array<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.close(w, b"]")
    }
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        self.item(w, first)
    }
    fn end_array_value<W: ?Sized + std::io::Write>(&mut self, _: &mut W) -> std::io::Result<()> {
        self.has_value = true;
        Ok(())
    }
    fn begin_object<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.open(w, b"{")
    }
    fn end_object<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.close(w, b"}")
    }
    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        self.item(w, first)
    }
    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        w.write_all(b" : ")
    }
    fn end_object_value<W: ?Sized + std::io::Write>(&mut self, _: &mut W) -> std::io::Result<()> {
        self.has_value = true;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;
    use bson::oid::ObjectId;

    #[test]
    fn renders_like_disbatch() {
        let id = ObjectId::parse_str("571fac85ee63413233049fbd").expect("oid");
        let when = bson::DateTime::from_millis(1_461_693_573_649);
        let v = document(
            &doc! {"z": 1, "_id": id, "ctime": when, "a": [Bson::Null, 2.5]},
            Dates::Text,
        );
        assert_eq!(
            serde_json::to_string(&v).expect("json"),
            r#"{"_id":{"$oid":"571fac85ee63413233049fbd"},"a":[null,2.5],"ctime":"2016-04-26T17:59:33","z":1}"#
        );
        assert_eq!(
            date(when, Dates::Epoch),
            serde_json::json!(1_461_693_573.649)
        );
        assert_eq!(
            date(when, Dates::Millis),
            serde_json::json!(1_461_693_573_649_i64)
        );
    }

    #[test]
    fn pretty_is_cpanel_json_xs_pretty() {
        // What `Cpanel::JSON::XS->new->pretty->canonical->encode(...)` prints.
        let v = serde_json::json!({"a": [1, {}], "b": {"c": null, "e": 1.5}, "d": [], "u": -2});
        assert_eq!(
            pretty_text(&v),
            "{\n   \"a\" : [\n      1,\n      {}\n   ],\n   \"b\" : {\n      \"c\" : null,\n      \"e\" : 1.5\n   },\n   \"d\" : [],\n   \"u\" : -2\n}\n"
        );
        assert_eq!(pretty_text(&serde_json::json!([])), "[]\n");
    }
}
