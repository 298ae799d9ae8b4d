//! Request parameters as Disbatch reads them: JSON body, form body or query string, with
//! `.`-prefixed keys split off as options.

use axum::http::{header, HeaderMap};
use bson::Document;
use serde_json::{Map, Value};

use crate::error::{ApiError, ApiResult};

/// Dot options (`.limit`, `.count`, …).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Options {
    pub count: bool,
    pub limit: Option<i64>,
    pub skip: u64,
    pub fields: Option<Document>,
    pub terse: bool,
    pub full: bool,
    pub epoch: bool,
    pub pretty: bool,
    /// `.newest` (ours): newest created first, through the `_id` index; only for a search
    /// with no filter but a creation-time range, which that index serves in that order.
    pub newest: bool,
}

/// Decoded parameters. `body` is the whole JSON body when it was not an object (a bare
/// array is a legacy shape).
///
/// The top-level fields are reached only through `given` (a null is the key not given) or
/// `data` (nulls kept), so every route decides which it reads: Perl clients send an unset
/// option as `null` (the CLI's `".fields": null`, `"options": null`), and a route that read
/// the map directly would answer them with a 400.
#[derive(Debug, Clone, Default)]
pub struct Params {
    fields: Map<String, Value>,
    pub options: Options,
    pub body: Option<Value>,
}

impl Params {
    /// The fields of a route whose keys are settings: a null is the same as the key absent.
    pub fn given(self) -> Map<String, Value> {
        without_nulls(self.fields)
    }

    /// `given`, except for keys whose null is a setting of its own (`maxthreads: null` lifts
    /// a node's limit, `threads: null` pauses a queue).
    pub fn given_keeping_null(self, null_is_a_value: &[&str]) -> Map<String, Value> {
        self.fields
            .into_iter()
            .filter(|(k, v)| !v.is_null() || null_is_a_value.contains(&k.as_str()))
            .collect()
    }

    /// The fields as sent, nulls included: for bodies that are data, such as a search
    /// filter (`{"node": null}` means "node is null") or task params.
    pub fn data(self) -> Map<String, Value> {
        self.fields
    }
}

/// Drops the null members of an object of settings (also for nested option objects, such as
/// the legacy search's `options`).
pub fn without_nulls(map: Map<String, Value>) -> Map<String, Value> {
    map.into_iter().filter(|(_, v)| !v.is_null()).collect()
}

fn content_type(headers: &HeaderMap) -> String {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(|v| v.trim().to_ascii_lowercase())
        .unwrap_or_default()
}

/// Disbatch matched `Content-Type` exactly; any parameters (`; charset=utf-8`) are allowed here.
pub fn parse(headers: &HeaderMap, query: Option<&str>, body: &[u8]) -> ApiResult<Params> {
    let ct = content_type(headers);
    let has_body = !body.iter().all(u8::is_ascii_whitespace);
    let value = if ct == "application/json" && has_body {
        serde_json::from_slice::<Value>(body)
            .map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}")))?
    } else if ct == "application/x-www-form-urlencoded" && has_body {
        form(body)
    } else {
        form(query.unwrap_or("").as_bytes())
    };
    check_storable(&value)?;
    let mut params = Params::default();
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                if let Some(opt) = k.strip_prefix('.') {
                    apply_option(&mut params.options, opt, &v)?;
                } else {
                    params.fields.insert(k, v);
                }
            }
        }
        other => params.body = Some(other),
    }
    Ok(params)
}

/// MongoDB's own nesting limit. serde_json accepts 128 levels and some MongoDB-wire servers
/// store more than 100, but a document that deep exhausts a worker thread's stack when it is
/// read back, so the API stores nothing deeper than MongoDB would.
pub const MAX_DEPTH: usize = 100;

/// Refuses what no BSON document can hold, before it reaches the database as a driver
/// error: nesting beyond MAX_DEPTH, and names with a NUL byte (BSON keys are C strings).
/// Walks without recursion, so the check itself cannot exhaust the stack.
fn check_storable(value: &Value) -> ApiResult<()> {
    let mut stack = vec![(value, 0usize)];
    while let Some((v, depth)) = stack.pop() {
        let children: Box<dyn Iterator<Item = &Value>> = match v {
            Value::Array(items) => Box::new(items.iter()),
            Value::Object(map) => {
                if let Some(key) = map.keys().find(|k| k.contains('\0')) {
                    return Err(ApiError::bad_request(format!(
                        "parameter name {key:?} contains a NUL byte, which MongoDB cannot store"
                    )));
                }
                Box::new(map.values())
            }
            _ => continue,
        };
        if depth + 1 > MAX_DEPTH {
            return Err(ApiError::bad_request(format!(
                "parameters are nested too deep: more than {MAX_DEPTH} levels (MongoDB's limit)"
            )));
        }
        stack.extend(children.map(|c| (c, depth + 1)));
    }
    Ok(())
}

/// Form decoding; repeated keys become arrays, as in Perl's parser.
fn form(bytes: &[u8]) -> Value {
    let mut map = Map::new();
    for (k, v) in form_urlencoded::parse(bytes) {
        let v = Value::String(v.into_owned());
        match map.get_mut(k.as_ref()) {
            Some(Value::Array(items)) => items.push(v),
            Some(existing) => {
                let first = existing.take();
                *existing = Value::Array(vec![first, v]);
            }
            None => {
                map.insert(k.into_owned(), v);
            }
        }
    }
    Value::Object(map)
}

fn truthy(v: &Value) -> bool {
    match v {
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Value::String(s) => !matches!(s.as_str(), "" | "0" | "false"),
        Value::Null => false,
        _ => true,
    }
}

fn number(name: &str, v: &Value) -> ApiResult<i64> {
    let n = match v {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    };
    n.filter(|n| *n >= 0)
        .ok_or_else(|| ApiError::bad_request(format!(".{name} must be a non-negative integer")))
}

fn apply_option(o: &mut Options, name: &str, v: &Value) -> ApiResult<()> {
    // An option sent as null is an option not given (Perl clients send undef as null), but
    // its name must still be one we know.
    let known = matches!(
        name,
        "count" | "limit" | "skip" | "terse" | "full" | "epoch" | "pretty" | "fields" | "newest"
    );
    if v.is_null() && known {
        return Ok(());
    }
    match name {
        "count" => o.count = truthy(v),
        "limit" => o.limit = Some(number(name, v)?),
        "skip" => o.skip = number(name, v)? as u64,
        "terse" => o.terse = truthy(v),
        "full" => o.full = truthy(v),
        "epoch" => o.epoch = truthy(v),
        "pretty" => o.pretty = truthy(v),
        "newest" => o.newest = truthy(v),
        "fields" => o.fields = Some(projection(v)?),
        other => return Err(ApiError::bad_request(format!("unknown option .{other}"))),
    }
    Ok(())
}

/// `.fields`: an object, an array of names, or either as a JSON string.
fn projection(v: &Value) -> ApiResult<Document> {
    let bad = || {
        ApiError::bad_request(
            ".fields must be an object, an array of field names, or one of those as JSON",
        )
    };
    match v {
        Value::String(s) => {
            let parsed: Value = serde_json::from_str(s).map_err(|_| bad())?;
            projection(&parsed)
        }
        Value::Array(names) => names
            .iter()
            .map(|n| {
                n.as_str()
                    .map(|n| (n.to_string(), bson::Bson::Int32(1)))
                    .ok_or_else(bad)
            })
            .collect(),
        Value::Object(_) => bson::to_document(v).map_err(|_| bad()),
        _ => Err(bad()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(ct: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_str(ct).expect("header"),
        );
        h
    }

    #[test]
    fn json_with_charset_is_json_and_dot_keys_are_options() {
        let p = parse(
            &headers("application/json; charset=utf-8"),
            None,
            br#"{"queue": "q", ".limit": "5", ".count": 1, ".fields": ["status"]}"#,
        )
        .expect("ok");
        assert_eq!(p.fields.get("queue"), Some(&Value::String("q".into())));
        assert_eq!(p.options.limit, Some(5));
        assert!(p.options.count);
        assert_eq!(p.options.fields, Some(bson::doc! {"status": 1}));
    }

    #[test]
    fn forms_and_query_strings_repeat_keys_into_arrays() {
        let p = parse(&HeaderMap::new(), Some("status=1&status=2&.limit=3"), b"").expect("ok");
        assert_eq!(p.fields.get("status"), Some(&serde_json::json!(["1", "2"])));
        assert_eq!(p.options.limit, Some(3));
        let p = parse(
            &headers("application/x-www-form-urlencoded"),
            None,
            b"name=a%20b",
        )
        .expect("ok");
        assert_eq!(p.fields.get("name"), Some(&Value::String("a b".into())));
    }

    #[test]
    fn bad_json_and_bad_options_are_400() {
        assert!(parse(&headers("application/json"), None, b"{nope").is_err());
        assert!(parse(&HeaderMap::new(), Some(".limit=-1"), b"").is_err());
        assert!(parse(&HeaderMap::new(), Some(".fields=notjson"), b"").is_err());
        assert!(parse(&HeaderMap::new(), Some(".bogus=1"), b"").is_err());
    }

    #[test]
    fn bodies_nested_deeper_than_mongodb_allows_are_400() {
        let nested = |n: usize| format!("{}1{}", "[".repeat(n), "]".repeat(n));
        let ok = parse(
            &headers("application/json"),
            None,
            nested(MAX_DEPTH).as_bytes(),
        );
        assert!(ok.is_ok());
        let deep = format!("{{\"params\": {}}}", nested(MAX_DEPTH));
        let err = parse(&headers("application/json"), None, deep.as_bytes()).expect_err("deep");
        assert_eq!(err.status, axum::http::StatusCode::BAD_REQUEST);
        assert!(err.body["error"]
            .as_str()
            .is_some_and(|e| e.contains("nested too deep")));
    }

    #[test]
    fn names_with_nul_bytes_are_400_from_json_forms_and_queries() {
        let json = parse(
            &headers("application/json"),
            None,
            br#"{"a": [{"b\u0000": 1}]}"#,
        );
        let form = parse(
            &headers("application/x-www-form-urlencoded"),
            None,
            b"a%00=1",
        );
        let query = parse(&HeaderMap::new(), Some("x%00y=1"), b"");
        for result in [json, form, query] {
            let err = result.expect_err("NUL in a name");
            assert!(err.body["error"]
                .as_str()
                .is_some_and(|e| e.contains("NUL")));
        }
        assert!(
            parse(&HeaderMap::new(), Some("x=a%00b"), b"").is_ok(),
            "NUL in a value is data"
        );
    }

    #[test]
    fn null_options_are_options_not_given() {
        // What Disbatch's CLI sends for `disbatch tasks` without --fields.
        let p = parse(
            &headers("application/json"),
            None,
            br#"{"queue": "q", ".fields": null, ".limit": null, ".skip": null, ".terse": null,
                ".count": null, ".full": null, ".epoch": null, ".pretty": null}"#,
        )
        .expect("nulls are options not given");
        assert_eq!(p.options, Options::default());
        // A null does not make an unknown option known.
        assert!(parse(&headers("application/json"), None, br#"{".bogus": null}"#).is_err());
        // Wrong types are still refused, naming the option.
        for (body, name) in [
            (r#"{".limit": "x"}"#, ".limit"),
            (r#"{".skip": [1]}"#, ".skip"),
            (r#"{".fields": 3}"#, ".fields"),
        ] {
            let err = parse(&headers("application/json"), None, body.as_bytes()).expect_err(body);
            assert!(
                err.body["error"].as_str().is_some_and(|e| e.contains(name)),
                "{body}: {}",
                err.body
            );
        }
    }

    #[test]
    fn given_drops_null_fields_and_data_keeps_them() {
        let body = br#"{"name": "a", "plugin": null, "threads": null, "params": {"x": null}}"#;
        let p = parse(&headers("application/json"), None, body).expect("ok");
        let sorted = |m: &Map<String, Value>| {
            let mut keys: Vec<String> = m.keys().cloned().collect();
            keys.sort();
            keys
        };
        let given = p.clone().given();
        assert_eq!(
            sorted(&given),
            ["name", "params"],
            "top-level nulls dropped"
        );
        assert_eq!(
            given["params"],
            serde_json::json!({"x": null}),
            "nested data kept"
        );
        let kept = p.clone().given_keeping_null(&["threads"]);
        assert_eq!(sorted(&kept), ["name", "params", "threads"]);
        assert_eq!(p.data().len(), 4);
    }

    #[test]
    fn a_bare_array_body_is_kept_whole() {
        let p = parse(&headers("application/json"), None, b"[{\"a\":1}]").expect("ok");
        assert_eq!(p.body, Some(serde_json::json!([{"a": 1}])));
    }
}
