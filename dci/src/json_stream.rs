//! A JSON array sent element by element as its values arrive: the same bytes as the whole
//! array rendered at once (compact, or Disbatch's pretty), with memory bounded by one element.

use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use futures::{Stream, StreamExt};
use serde_json::{Map, Value};

use crate::error::ApiError;
use crate::render::{canonical, pretty_text};

/// The response for a stream of array elements; an error after the first byte ends the body
/// early (the client sees a cut response, never a wrong complete one) and is logged.
pub fn array_response(
    items: impl Stream<Item = Result<Value, ApiError>> + Send + 'static,
    pretty: bool,
) -> Response {
    let fragments = items
        .enumerate()
        .map(move |(i, item)| match item {
            Ok(mut value) => {
                canonical(&mut value);
                Ok(Bytes::from(element(i, &value, pretty)))
            }
            Err(e) => {
                tracing::error!(status = %e.status, error = %e.body, "a streamed response was cut short");
                Err(std::io::Error::other(e.body.to_string()))
            }
        })
        .chain(futures::stream::once(async move {
            Ok::<_, std::io::Error>(Bytes::from_static(if pretty { b"\n]\n" } else { b"]" }))
        }));
    (
        [(header::CONTENT_TYPE, "application/json")],
        Body::from_stream(fragments),
    )
        .into_response()
}

/// The compact response for the object `head` with one more member, `key`, last: an array
/// sent element by element. The same bytes as the whole object rendered at once when `key`
/// sorts after `head`'s keys; memory bounded by one element.
pub fn object_with_array_response(
    head: Map<String, Value>,
    key: &str,
    items: impl Stream<Item = Result<Value, ApiError>> + Send + 'static,
) -> Response {
    let mut head = Value::Object(head);
    canonical(&mut head);
    let mut opening = serde_json::to_string(&head).unwrap_or_else(|_| "{}".into());
    opening.pop();
    if opening.len() > 1 {
        opening.push(',');
    }
    opening.push_str(&serde_json::to_string(key).unwrap_or_else(|_| "\"\"".into()));
    opening.push_str(":[");
    let elements = items.enumerate().map(|(i, item)| match item {
        Ok(mut value) => {
            canonical(&mut value);
            let text = serde_json::to_string(&value).unwrap_or_else(|_| "null".into());
            Ok(Bytes::from(if i == 0 { text } else { format!(",{text}") }))
        }
        Err(e) => {
            tracing::error!(status = %e.status, error = %e.body, "a streamed response was cut short");
            Err(std::io::Error::other(e.body.to_string()))
        }
    });
    let body = futures::stream::once(async move { Ok::<_, std::io::Error>(Bytes::from(opening)) })
        .chain(elements)
        .chain(futures::stream::once(async move {
            Ok::<_, std::io::Error>(Bytes::from_static(b"]}"))
        }));
    (
        [(header::CONTENT_TYPE, "application/json")],
        Body::from_stream(body),
    )
        .into_response()
}

/// Element `i` with what goes before it: the opening bracket or a separator. Only used for
/// non-empty arrays (an empty one is `[]` in both forms, which the caller sends whole).
fn element(i: usize, value: &Value, pretty: bool) -> String {
    let lead = match (i, pretty) {
        (0, false) => "[",
        (_, false) => ",",
        (0, true) => "[\n",
        (_, true) => ",\n",
    };
    let text = if pretty {
        pretty_text(value)
            .lines()
            .map(|l| format!("   {l}"))
            .collect::<Vec<_>>()
            .join("\n")
    } else {
        serde_json::to_string(value).unwrap_or_else(|_| "null".into())
    };
    format!("{lead}{text}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn whole(values: &[Value], pretty: bool) -> String {
        let mut out: String = values
            .iter()
            .enumerate()
            .map(|(i, v)| element(i, v, pretty))
            .collect();
        out.push_str(if pretty { "\n]\n" } else { "]" });
        out
    }

    #[test]
    fn the_bytes_are_those_of_the_whole_array() {
        let values = vec![
            json!({"a": 1, "b": [1, 2, {"c": null}], "d": "x\ny"}),
            json!([]),
            json!({}),
            json!("s"),
        ];
        for pretty in [false, true] {
            let expected = if pretty {
                pretty_text(&Value::Array(values.clone()))
            } else {
                serde_json::to_string(&Value::Array(values.clone())).expect("json")
            };
            assert_eq!(whole(&values, pretty), expected, "pretty: {pretty}");
        }
    }

    async fn body_of(r: Response) -> String {
        let bytes = axum::body::to_bytes(r.into_body(), usize::MAX)
            .await
            .expect("body");
        String::from_utf8(bytes.to_vec()).expect("utf-8")
    }

    #[tokio::test]
    async fn an_object_with_a_streamed_array_is_the_whole_object() {
        let head = json!({"b": {"y": 1, "x": 2}, "a": null});
        let items = [json!({"z": 1, "c": [2]}), json!("s")];
        for n in [0, 1, 2] {
            let mut whole = head.clone();
            whole["tasks"] = Value::Array(items[..n].to_vec());
            canonical(&mut whole);
            let Value::Object(m) = head.clone() else {
                unreachable!()
            };
            let stream = futures::stream::iter(Vec::from(&items[..n]).into_iter().map(Ok));
            let got = body_of(object_with_array_response(m, "tasks", stream)).await;
            assert_eq!(
                got,
                serde_json::to_string(&whole).expect("json"),
                "{n} items"
            );
        }
        let got = body_of(object_with_array_response(
            Map::new(),
            "t",
            futures::stream::empty(),
        ))
        .await;
        assert_eq!(got, r#"{"t":[]}"#);
    }
}
