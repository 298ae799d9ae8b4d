//! JSON from clients and plugins to BSON: Extended JSON (`{"$oid": …}`, `{"$date": …}`) read as
//! the types a task may carry, and nothing the database cannot store and query safely; a
//! refusal names the path of the first value at fault. The API and chaining share it.

use bson::{Bson, Document};
use serde_json::{Map, Value};

/// Operators that run JavaScript on the server: never from a client's filter.
const JS_OPERATORS: &[&str] = &["$where", "$function", "$accumulator"];

/// A JSON object as a document to store (task params, a unit's params, a spec's config).
/// `path` names the object in messages (e.g. `params[2]`).
pub fn storable_document(v: &Value, path: &str) -> Result<Document, String> {
    match storable(v, path)? {
        Bson::Document(d) => Ok(d),
        _ => Err(format!("{path} must be an object")),
    }
}

/// Most BSON bytes a task's params may hold: a task document is at most 16 MiB, and the
/// rest is room for what claims, ends and a batch's report add to it. A task refused for
/// this at its creation is better than one no claim or settle can ever write.
pub const MAX_PARAMS_BYTES: usize = 15 * 1024 * 1024;

/// A task's params: a storable document (`storable_document`) of at most
/// `MAX_PARAMS_BYTES`.
pub fn task_params(v: &Value, path: &str) -> Result<Document, String> {
    let d = storable_document(v, path)?;
    check_params_size(&d, path)?;
    Ok(d)
}

/// Refuses params over `MAX_PARAMS_BYTES` of BSON, naming their size.
pub fn check_params_size(d: &Document, path: &str) -> Result<(), String> {
    let bytes = bson_size(d);
    if bytes > MAX_PARAMS_BYTES {
        return Err(format!(
            "{path} is {bytes} bytes as BSON; a task's params hold at most {MAX_PARAMS_BYTES} (15 MiB), the rest of its 16 MiB document being room for its claims and results"
        ));
    }
    Ok(())
}

/// A document's BSON size, counted without a copy.
pub fn bson_size(d: &Document) -> usize {
    struct Counter(usize);
    impl std::io::Write for Counter {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut c = Counter(0);
    // Writing to a counter fails only on a document no server would take either.
    match d.to_writer(&mut c) {
        Ok(()) => c.0,
        Err(_) => usize::MAX,
    }
}

/// MongoDB's nesting limit: nothing deeper is stored.
pub const MAX_DEPTH: usize = 100;

/// How many values a JSON text holds (at least: every array, object and scalar counts once;
/// commas count what they separate) and how deep it nests, read without building anything.
/// Counting stops once `max_values` is passed. For valid JSON only: the caller parses it
/// after, and the parse says what is wrong with any other.
pub fn json_shape(text: &[u8], max_values: usize) -> JsonShape {
    let mut shape = JsonShape::default();
    let (mut depth, mut in_string, mut escaped, mut any) = (0usize, false, false, false);
    for &b in text {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => {
                in_string = true;
                any = true;
            }
            b'[' | b'{' => {
                depth += 1;
                shape.depth = shape.depth.max(depth);
                shape.values += 1;
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            b',' => shape.values += 1,
            b' ' | b'\t' | b'\n' | b'\r' | b':' => {}
            _ => any = true,
        }
        if shape.values > max_values {
            return shape;
        }
    }
    // A lone scalar, or the first member of each container, comes without a comma.
    if any && shape.values == 0 {
        shape.values = 1;
    }
    shape
}

/// What `json_shape` read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct JsonShape {
    pub values: usize,
    pub depth: usize,
}

/// Any JSON value as BSON to store; see `storable_document`.
pub fn storable(v: &Value, path: &str) -> Result<Bson, String> {
    match v {
        Value::Object(m) if m.keys().any(|k| k.starts_with('$')) => typed(m, path),
        Value::Object(m) => {
            let mut d = Document::new();
            for (k, item) in m {
                check_key(k, path)?;
                d.insert(k.clone(), storable(item, &format!("{path}.{k}"))?);
            }
            Ok(Bson::Document(d))
        }
        Value::Array(items) => items
            .iter()
            .enumerate()
            .map(|(i, item)| storable(item, &format!("{path}[{i}]")))
            .collect::<Result<Vec<_>, _>>()
            .map(Bson::Array),
        scalar => Bson::try_from(scalar.clone()).map_err(|e| format!("{path}: {e}")),
    }
}

/// An object with a `$` key: one Extended JSON value, or refused.
fn typed(m: &Map<String, Value>, path: &str) -> Result<Bson, String> {
    let value = Bson::try_from(Value::Object(m.clone()))
        .map_err(|e| format!("{path} is not a valid Extended JSON value: {e}"))?;
    match &value {
        // Not a type the reader knows: a document with a `$` name, which MongoDB stores
        // only in places no query can address.
        Bson::Document(_) => {
            let key = m
                .keys()
                .find(|k| k.starts_with('$'))
                .map_or("", String::as_str);
            Err(format!(
                "{path}: field name {key:?} starts with '$', which cannot be stored and queried safely"
            ))
        }
        other => check_type(other, path).map(|()| value),
    }
}

/// BSON types that are deprecated, JavaScript, or for queries only.
fn check_type(b: &Bson, path: &str) -> Result<(), String> {
    let name = match b {
        Bson::Undefined => "undefined",
        Bson::DbPointer(_) => "dbPointer",
        Bson::Symbol(_) => "symbol",
        Bson::JavaScriptCode(_) | Bson::JavaScriptCodeWithScope(_) => "JavaScript code",
        Bson::MinKey => "minKey",
        Bson::MaxKey => "maxKey",
        _ => return Ok(()),
    };
    Err(format!(
        "{path}: BSON type {name} cannot be stored through the API (deprecated, JavaScript or query-only)"
    ))
}

/// Whether JSON can be encoded as BSON as it stands, read literally (a plugin's result, kept
/// as written): it can unless a field name holds a NUL byte, which `storable` refuses too.
/// The path of the first such name is given.
pub fn check_encodable_keys(v: &Value, path: &str) -> Result<(), String> {
    match v {
        Value::Object(m) => m.iter().try_for_each(|(k, item)| {
            check_key(k, path)?;
            check_encodable_keys(item, &format!("{path}.{k}"))
        }),
        Value::Array(items) => items
            .iter()
            .enumerate()
            .try_for_each(|(i, item)| check_encodable_keys(item, &format!("{path}[{i}]"))),
        _ => Ok(()),
    }
}

fn check_key(k: &str, path: &str) -> Result<(), String> {
    if k.contains('\0') {
        return Err(format!(
            "{path}: field name {k:?} contains a NUL byte, which MongoDB cannot store"
        ));
    }
    Ok(())
}

/// A client's query filter: operators allowed, but none that runs JavaScript and no value of
/// a type `storable` refuses. Extended JSON is read as types, as for stored values.
pub fn query_filter(v: &Value, path: &str) -> Result<Document, String> {
    let filter = match Bson::try_from(v.clone()) {
        Ok(Bson::Document(d)) => d,
        Ok(_) => return Err(format!("{path} must be an object")),
        Err(e) => return Err(format!("{path} is not valid Extended JSON: {e}")),
    };
    check_filter(&Bson::Document(filter.clone()), path)?;
    Ok(filter)
}

fn check_filter(b: &Bson, path: &str) -> Result<(), String> {
    match b {
        Bson::Document(d) => {
            for (k, v) in d {
                if JS_OPERATORS.contains(&k.as_str()) {
                    return Err(format!(
                        "{path}: operator {k} runs JavaScript on the server and is not allowed"
                    ));
                }
                check_key(k, path)?;
                // A regular expression is a C string in BSON: a NUL cannot be sent at all.
                if matches!((k.as_str(), v), ("$regex" | "$options", Bson::String(s)) if s.contains('\0'))
                {
                    return Err(nul_in_regex(&format!("{path}.{k}")));
                }
                check_filter(v, &format!("{path}.{k}"))?;
            }
            Ok(())
        }
        Bson::Array(items) => items
            .iter()
            .enumerate()
            .try_for_each(|(i, item)| check_filter(item, &format!("{path}[{i}]"))),
        Bson::RegularExpression(r) if r.pattern.contains('\0') || r.options.contains('\0') => {
            Err(nul_in_regex(path))
        }
        other => check_type(other, path),
    }
}

fn nul_in_regex(path: &str) -> String {
    format!("{path}: a regular expression cannot contain a NUL byte")
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_texts_shape_is_counted_without_building_it() {
        let shape = |t: &str| json_shape(t.as_bytes(), usize::MAX);
        assert_eq!(shape(r#"{"a": [1, 2, {"b": "x,[{"}], "c": null}"#).depth, 3);
        assert!(shape(r#"{"a": [1, 2, {"b": "x,[{"}], "c": null}"#).values >= 6);
        assert_eq!(
            shape(r#""a\"[,""#),
            JsonShape {
                values: 1,
                depth: 0
            }
        );
        assert_eq!(shape("7").values, 1);
        let many = format!("[{}]", vec!["[]"; 1000].join(","));
        assert!(shape(&many).values >= 1000);
        assert!(
            json_shape(many.as_bytes(), 10).values == 11,
            "stops past the cap"
        );
    }

    #[test]
    fn params_past_15_mib_are_refused_with_their_size_and_those_under_taken() {
        let under = serde_json::json!({"pad": "x".repeat(MAX_PARAMS_BYTES - 100)});
        assert!(task_params(&under, "params").is_ok());
        let over = serde_json::json!({"pad": "x".repeat(MAX_PARAMS_BYTES)});
        let e = task_params(&over, "callback.params").expect_err("over");
        assert!(
            e.starts_with("callback.params is 15728655 bytes as BSON"),
            "{e}"
        );
        assert_eq!(bson_size(&bson::doc! {}), 5);
    }

    use super::*;
    use serde_json::json;

    #[test]
    fn extended_json_types_are_read() {
        let d = storable_document(
            &json!({"id": {"$oid": "0123456789abcdef01234567"}, "n": {"$numberLong": "5"},
                "when": {"$date": "2020-01-01T00:00:00Z"}, "list": [1, {"x": 2.5}]}),
            "params",
        )
        .expect("storable");
        assert!(matches!(d.get("id"), Some(Bson::ObjectId(_))));
        assert_eq!(d.get("n"), Some(&Bson::Int64(5)));
        assert!(matches!(d.get("when"), Some(Bson::DateTime(_))));
    }

    #[test]
    fn bson_only_and_bad_shapes_are_refused_with_their_path() {
        for (value, path, words) in [
            (json!({"a": {"$undefined": true}}), "params.a", "undefined"),
            (
                json!({"a": [1, {"$numberLong": "x"}]}),
                "params.a[1]",
                "Extended JSON",
            ),
            (json!({"b": {"$oid": "x"}}), "params.b", "Extended JSON"),
            (json!({"c": {"$date": "x"}}), "params.c", "Extended JSON"),
            (json!({"d": {"$code": "f()"}}), "params.d", "JavaScript"),
            (json!({"e": {"$symbol": "s"}}), "params.e", "symbol"),
            (json!({"f": {"$minKey": 1}}), "params.f", "minKey"),
            (json!({"g": {"$where": "1"}}), "params.g", "starts with '$'"),
            (json!({"h\u{0}": 1}), "params", "NUL"),
        ] {
            let e = storable_document(&value, "params").expect_err(&value.to_string());
            assert!(e.starts_with(path), "{value}: {e}");
            assert!(e.contains(words), "{value}: {e}");
        }
    }

    #[test]
    fn only_nul_bytes_in_names_make_json_unencodable() {
        let plain = json!({"a": [{"$where": 1}, {"n": {"$numberLong": "x"}}], "": 2});
        assert_eq!(check_encodable_keys(&plain, "result"), Ok(()));
        let e = check_encodable_keys(&json!({"a": [1, {"b\u{0}": 1}]}), "result").unwrap_err();
        assert!(
            e.starts_with("result.a[1]: field name") && e.contains("NUL"),
            "{e}"
        );
    }

    #[test]
    fn filters_keep_operators_but_not_javascript() {
        let f = query_filter(&json!({"status": {"$in": [1, 2]}, "mtime": {"$gt": {"$date": "2020-01-01T00:00:00Z"}}}), "filter")
            .expect("a filter");
        assert!(f.get_document("status").is_ok());
        for bad in [
            json!({"$where": "sleep(1000)"}),
            json!({"$expr": {"$function": {"body": "x", "args": [], "lang": "js"}}}),
            json!({"a": {"$undefined": true}}),
            json!({"$or": [{"a": {"$accumulator": {}}}]}),
            json!({"a": {"$regex": "x\0"}}),
            json!({"a": {"$regex": "x", "$options": "i\0"}}),
            json!({"a": {"$regularExpression": {"pattern": "x\0", "options": ""}}}),
        ] {
            assert!(query_filter(&bad, "filter").is_err(), "{bad}");
        }
    }
}
