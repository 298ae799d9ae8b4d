//! Generators of malformed REST requests (ids, queries, bodies, headers, framing) as raw bytes.

use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::Rng;
use serde_json::json;

use super::nested_json;

/// The size of the largest bodies sent.
pub const TEN_MB: usize = 10 * 1024 * 1024;

/// Path parameter values that name nothing sensible (already URL-encoded).
pub const JUNK_PATH: &[&str] = &[
    "x",
    "0",
    "-1",
    "%00",
    "%ZZ",
    "..",
    "%2e%2e",
    "a%2Fb",
    "000000000000000000000000",
    "ffffffffffffffffffffffffff",
    "6b02626f79f4bc22b2fe713",
    "%F0%9F%92%A9",
    "%FF%FE",
    "%24where",
    "%7B%22%24gt%22%3A%22%22%7D",
    "null",
    "undefined",
    "system.indexes",
    "%20",
];

/// Query strings Disbatch's parsers must refuse or ignore.
pub const BAD_QUERIES: &[&str] = &[
    "limit=abc",
    ".limit=abc",
    ".limit=-1",
    ".limit=99999999999999999999999",
    ".skip=-5",
    ".skip=9223372036854775807",
    ".fields=%7B",
    ".fields=%5B1%2C2%5D",
    ".fields=%7B%22a%22%3A%7B%22%24slice%22%3A%22x%22%7D%7D",
    ".bogus=1",
    "x=%ZZ",
    "%ZZ=1",
    "&&&",
    "=",
    "queue[$gt]=",
    "queue=%7B%22%24ne%22%3Anull%7D",
    "id=zz",
    "status=abc&status=1",
    "node=%00",
    "offset=-1&length=abc",
    "offset=18446744073709551616",
    "length=99999999999999999999",
    ".count=1&.limit=1&.skip=1&.terse=1&.full=1&.epoch=1&.pretty=1",
];

/// Keys that some route reads, to give wrong-typed values to.
pub const KEYS: &[&str] = &[
    "name",
    "plugin",
    "threads",
    "sort",
    "queue",
    "params",
    "collection",
    "filter",
    "options",
    "units",
    "on_conflict",
    "key",
    "priority",
    "not_before",
    "status",
    "maxthreads",
    "max_tasks",
    "queues",
    "disabled",
    "count",
    "terse",
    "pretty",
    "specs",
    ".limit",
    ".skip",
    ".fields",
    ".count",
    "$where",
    "",
];

pub fn junk_value(rng: &mut StdRng, depth: u32) -> String {
    let scalars = [
        "null",
        "true",
        "0",
        "-0.0",
        "-1",
        "1.5",
        "9223372036854775807",
        "-9223372036854775808",
        "18446744073709551616",
        "1e308",
        "-1e308",
        "1e-320",
        "\"\"",
        "\"5\"",
        "\"-2\"",
        "\"abc\"",
        "\"\\u0000\"",
        "\"\\ufffd\\u202e\"",
        "\"../x\"",
        "\"a/b\"",
        "\"echo\"",
        "\"fifo\"",
        "\"6b02626f79f4bc22b2fe7135\"",
        "{\"$oid\": \"zz\"}",
        "{\"$gt\": \"\"}",
        "{\"$where\": \"sleep(1000)\"}",
        "{\"$date\": \"never\"}",
        "{}",
        "[]",
    ];
    match rng.random_range(0..10) {
        0 if depth < 3 => {
            let n = rng.random_range(0..4);
            let items: Vec<String> = (0..n).map(|_| junk_value(rng, depth + 1)).collect();
            format!("[{}]", items.join(","))
        }
        1 if depth < 3 => junk_object(rng, depth + 1),
        2 => format!("\"{}\"", "x".repeat(rng.random_range(1000..100_000))),
        _ => scalars.choose(rng).copied().unwrap_or("null").to_string(),
    }
}

pub fn junk_object(rng: &mut StdRng, depth: u32) -> String {
    let n = rng.random_range(1..5);
    let fields: Vec<String> = (0..n)
        .map(|_| {
            let key = KEYS.choose(rng).copied().unwrap_or("x");
            format!("{}:{}", json!(key), junk_value(rng, depth))
        })
        .collect();
    format!("{{{}}}", fields.join(","))
}

/// A body and the content type it claims (None: no header).
pub fn junk_body(rng: &mut StdRng, allow_huge: bool) -> (Vec<u8>, Option<Vec<u8>>, String) {
    let json_ct = Some(b"application/json".to_vec());
    let kind = rng.random_range(0..16);
    let (body, ct, what): (Vec<u8>, Option<Vec<u8>>, &str) = match kind {
        0 => (Vec::new(), json_ct, "empty JSON"),
        1 => {
            let bad = [
                "{",
                "{\"a\":}",
                "[1,2",
                "nul",
                "\"open",
                "{'a':1}",
                "{\"a\":1,}",
                "NaN",
                "Infinity",
                "01",
                "{\"a\":1}{",
                "\u{feff}{}",
                "  ",
            ];
            let text = bad.choose(rng).copied().unwrap_or("{");
            (text.into(), json_ct, "invalid JSON")
        }
        2..=6 => (junk_object(rng, 0).into_bytes(), json_ct, "wrong types"),
        7 => {
            let depth = *[64usize, 100, 126, 127, 128, 129, 1000, 100_000]
                .choose(rng)
                .unwrap_or(&128);
            let objects = rng.random_bool(0.5);
            let inner = nested_json(depth, objects);
            let body = if rng.random_bool(0.5) {
                format!("{{\"params\":[{inner}],\"queue\":\"target-queue\",\"units\":[{{\"key\":\"k\",\"params\":{inner}}}]}}")
            } else {
                inner
            };
            (body.into_bytes(), json_ct, "deep nesting")
        }
        8 => {
            let n: Vec<u8> = (0..rng.random_range(1..4096))
                .map(|_| rng.random())
                .collect();
            (n, json_ct, "binary garbage as JSON")
        }
        9 => {
            let n: Vec<u8> = (0..rng.random_range(1..4096))
                .map(|_| rng.random())
                .collect();
            let ct = Some(b"application/x-www-form-urlencoded".to_vec());
            (n, ct, "binary garbage as a form")
        }
        10 => {
            let form = "name=%ZZ&threads=abc&threads=1&plugin=..%2Fx&.limit=-1&params=%7B&queue=";
            let ct = Some(b"application/x-www-form-urlencoded".to_vec());
            (form.into(), ct, "junk form")
        }
        11 => (
            junk_object(rng, 0).into_bytes(),
            None,
            "JSON without a content type",
        ),
        12 => {
            let cts: [&[u8]; 8] = [
                b"text/plain",
                b"multipart/form-data; boundary=",
                b"application/json; charset=utf-16",
                b"APPLICATION/JSON",
                b"application/json, text/html",
                b"application/\xff\xfe",
                b";;;",
                b"application/x-www-form-urlencoded; charset=\"",
            ];
            let ct = cts.choose(rng).map(|c| c.to_vec());
            (junk_object(rng, 0).into_bytes(), ct, "odd content type")
        }
        13 if allow_huge => {
            let body = if rng.random_bool(0.5) {
                format!(
                    "{{\"queue\":\"target-queue\",\"params\":[{{\"big\":\"{}\"}}]}}",
                    "x".repeat(TEN_MB)
                )
                .into_bytes()
            } else {
                (0..TEN_MB).map(|i| (i % 251) as u8).collect()
            };
            (body, json_ct, "10 MB body")
        }
        _ => {
            let numbers = [
                "{\"threads\": 1e400}",
                "{\"maxthreads\": 18446744073709551616}",
                "{\"threads\": -9223372036854775809}",
                "{\"priority\": 1e308, \"not_before\": -1e308}",
                "{\"status\": [1e999]}",
                "{\"max_tasks\": {\"*\": 1e308}, \"queues\": [[\"x\"]]}",
            ];
            let text = numbers.choose(rng).copied().unwrap_or("{}");
            (text.into(), json_ct, "huge numbers")
        }
    };
    (body, ct, what.to_string())
}

/// Extra headers: duplicates, overlong values, odd namespaces and encodings.
pub fn junk_headers(rng: &mut StdRng) -> (Vec<u8>, String) {
    let mut out = Vec::new();
    let mut what = Vec::new();
    let n = rng.random_range(0..3);
    for _ in 0..n {
        let (h, w): (Vec<u8>, &str) = match rng.random_range(0..10) {
            0 => (
                b"X-Disbatch-Namespace: admin\r\n".to_vec(),
                "namespace admin",
            ),
            1 => (
                b"X-Disbatch-Namespace: \xff\xfe\r\n".to_vec(),
                "namespace bytes",
            ),
            2 => (
                format!("X-Disbatch-Namespace: {}\r\n", "n".repeat(2000)).into_bytes(),
                "namespace long",
            ),
            3 => (
                format!("X-Junk: {}\r\n", "j".repeat(64 * 1024)).into_bytes(),
                "64 KiB header",
            ),
            4 => (
                (0..150)
                    .flat_map(|i| format!("X-Dup: {i}\r\n").into_bytes())
                    .collect(),
                "150 headers",
            ),
            5 => (
                b"Accept: text/html;q=abc, application/json;q=-1\r\n".to_vec(),
                "odd accept",
            ),
            6 => (
                b"Content-Type: text/plain\r\n".to_vec(),
                "second content type",
            ),
            7 => (
                b"Authorization: Bearer \x00\xff\r\n".to_vec(),
                "odd authorization",
            ),
            8 => (b"Content-Encoding: gzip\r\n".to_vec(), "claims gzip"),
            _ => (b"Expect: 100-continue\r\n".to_vec(), "expect continue"),
        };
        out.extend(h);
        what.push(w);
    }
    (out, what.join("+"))
}

pub fn request(
    method: &[u8],
    target: &str,
    ct: Option<&[u8]>,
    headers: &[u8],
    body: &[u8],
) -> Vec<u8> {
    let mut r = Vec::with_capacity(body.len() + 512);
    r.extend_from_slice(method);
    r.extend_from_slice(
        format!(" {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n").as_bytes(),
    );
    if let Some(ct) = ct {
        r.extend_from_slice(b"Content-Type: ");
        r.extend_from_slice(ct);
        r.extend_from_slice(b"\r\n");
    }
    r.extend_from_slice(headers);
    r.extend_from_slice(format!("Content-Length: {}\r\n\r\n", body.len()).as_bytes());
    r.extend_from_slice(body);
    r
}

/// Requests with broken HTTP framing: the server may refuse them or close, but must survive.
pub fn framing_requests() -> Vec<(&'static str, Vec<u8>)> {
    let raw: Vec<(&str, Vec<u8>)> = vec![
        ("no Host", b"GET /queues HTTP/1.1\r\nConnection: close\r\n\r\n".to_vec()),
        ("HTTP/1.0", b"GET /queues HTTP/1.0\r\n\r\n".to_vec()),
        ("TLS hello", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03".to_vec()),
        ("garbage line", b"\x00\x01\x02 / HTTP/1.1\r\n\r\n".to_vec()),
        ("two lengths", b"POST /queues HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Length: 2\r\nContent-Length: 5\r\n\r\n{}".to_vec()),
        ("negative length", b"POST /queues HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Length: -1\r\n\r\n{}".to_vec()),
        ("word length", b"POST /queues HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Length: abc\r\n\r\n{}".to_vec()),
        ("chunked and length", b"POST /queues HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n2\r\n{}\r\n0\r\n\r\n".to_vec()),
        ("bad chunk size", b"POST /queues HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n".to_vec()),
        ("good chunks", b"POST /queues HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n1\r\n{\r\n1\r\n}\r\n0\r\n\r\n".to_vec()),
        ("header without colon", b"GET /queues HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nNoColonHere\r\n\r\n".to_vec()),
        ("space in target", b"GET /que ues HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".to_vec()),
        ("bytes in target", b"GET /queues/\xff\xfe HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".to_vec()),
        ("absolute target", b"GET http://evil/queues HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".to_vec()),
        ("asterisk target", b"OPTIONS * HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".to_vec()),
        ("CONNECT", b"CONNECT /queues HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".to_vec()),
        ("HTTP/2 preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec()),
        ("100 KB target", format!("GET /queues/{} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", "q".repeat(100_000)).into_bytes()),
        ("1 MB of headers", format!("GET /queues HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nX-Big: {}\r\n\r\n", "h".repeat(1 << 20)).into_bytes()),
        ("short body", b"POST /queues HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{}".to_vec()),
    ];
    raw
}
