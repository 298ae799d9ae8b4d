//! `POST /graphs`'s body read straight from its bytes into compact tasks: each dependency is
//! kept once (an id in 12 bytes), and a list past the cap is counted, not kept. A body of
//! 20 000 tasks naming 100 dependencies each never becomes a tree of 2 million JSON values.

use std::collections::HashSet;
use std::fmt;

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use bson::oid::ObjectId;
use serde::de::{self, Deserializer, IgnoredAny, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::Value;

use crate::error::ApiError;
use disbatch_model::workflow::MAX_WORKFLOW_TASKS;

/// A dependency as the client wrote it: a string that may be a name of the graph or an id, or
/// `{"$oid": …}`, always an id.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Dependency {
    /// 24 hex digits: an id, unless the graph has a task of that name.
    Hex(ObjectId),
    Text(Box<str>),
    Oid(ObjectId),
}

/// The `depends_on` of one task: each dependency once, in the order first named.
#[derive(Debug, Default)]
pub struct Dependencies {
    pub distinct: Vec<Dependency>,
    /// How many the list named, repeats included.
    pub named: usize,
    /// The first entry that is no name or id, with its position.
    pub bad: Option<(usize, String)>,
}

/// One task of the body, its fields checked later with their paths.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BodyTask {
    #[serde(default)]
    pub name: Option<Value>,
    #[serde(default)]
    pub queue: Option<Value>,
    #[serde(default)]
    pub params: Option<Value>,
    #[serde(default)]
    pub depends_on: Option<Dependencies>,
    #[serde(default)]
    pub on_dependency_failure: Option<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Body {
    tasks: Option<Vec<BodyTask>>,
}

/// The graph request's tasks.
pub struct GraphBody(pub Vec<BodyTask>);

impl<S: Send + Sync> FromRequest<S> for GraphBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let bytes = crate::request::body_bytes(Bytes::from_request(req, state).await)?;
        parse(&bytes)
    }
}

fn parse(bytes: &[u8]) -> Result<GraphBody, ApiError> {
    let body: Body = serde_json::from_slice(bytes).map_err(|e| {
        let text = e.to_string();
        // serde names a field it does not know as "unknown field `x`, expected …".
        ApiError::bad_request(match text.strip_prefix("unknown field ") {
            Some(rest) => format!("unknown field {}", rest.replace('`', "\"")),
            None => format!("a graph must be a JSON object {{\"tasks\": […]}}: {text}"),
        })
    })?;
    match body.tasks {
        Some(tasks) if !tasks.is_empty() && tasks.len() <= MAX_WORKFLOW_TASKS => {
            Ok(GraphBody(tasks))
        }
        Some(tasks) if !tasks.is_empty() => Err(ApiError::bad_request(format!(
            "a graph holds at most {MAX_WORKFLOW_TASKS} tasks, not {}",
            tasks.len()
        ))),
        _ => Err(ApiError::bad_request(
            "'tasks' must be a non-empty array of the graph's tasks",
        )),
    }
}

impl<'de> Deserialize<'de> for Dependencies {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(DependenciesVisitor)
    }
}

struct DependenciesVisitor;

impl<'de> Visitor<'de> for DependenciesVisitor {
    type Value = Dependencies;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an array of names or task ids")
    }

    fn visit_unit<E: de::Error>(self) -> Result<Dependencies, E> {
        Ok(Dependencies::default())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Dependencies, A::Error> {
        let mut out = Dependencies::default();
        let mut seen = HashSet::new();
        while out.named < MAX_WORKFLOW_TASKS {
            let Some(entry) = seq.next_element::<Entry>()? else {
                return Ok(out);
            };
            let at = out.named;
            out.named += 1;
            match entry {
                Entry::Dep(d) => {
                    if seen.insert(d.clone()) {
                        out.distinct.push(d);
                    }
                }
                Entry::Bad(text) => {
                    out.bad.get_or_insert((at, text));
                }
            }
        }
        // Past the cap: only counted, for the refusal to say how many.
        while seq.next_element::<IgnoredAny>()?.is_some() {
            out.named += 1;
        }
        Ok(out)
    }
}

/// One entry of a `depends_on` list.
enum Entry {
    Dep(Dependency),
    /// Neither a string nor `{"$oid": …}`: what it was, for the refusal.
    Bad(String),
}

impl<'de> Deserialize<'de> for Entry {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = Value::deserialize(d)?;
        Ok(match &v {
            Value::String(s) => match ObjectId::parse_str(s) {
                Ok(id) if s.len() == 24 => Entry::Dep(Dependency::Hex(id)),
                _ => Entry::Dep(Dependency::Text(s.as_str().into())),
            },
            Value::Object(m) if m.len() == 1 => match m.get("$oid").and_then(Value::as_str) {
                Some(hex) => match ObjectId::parse_str(hex) {
                    Ok(id) => Entry::Dep(Dependency::Oid(id)),
                    Err(_) => Entry::Bad(v.to_string()),
                },
                None => Entry::Bad(v.to_string()),
            },
            other => Entry::Bad(other.to_string()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deps(json: &str) -> Dependencies {
        serde_json::from_str(json).expect("depends_on")
    }

    #[test]
    fn each_dependency_is_kept_once_and_a_long_list_only_counted() {
        let id = ObjectId::new().to_hex();
        let d = deps(&format!(
            r#"["a", "{id}", {{"$oid": "{id}"}}, "a", "{id}", 7]"#
        ));
        assert_eq!(d.named, 6);
        assert_eq!(d.distinct.len(), 3, "{:?}", d.distinct);
        assert_eq!(d.bad, Some((5, "7".to_string())));
        let many = format!("[{}]", vec![format!("\"{id}\""); 30_000].join(","));
        let d = deps(&many);
        assert_eq!((d.named, d.distinct.len()), (30_000, 1));
        assert_eq!(deps("null").named, 0);
    }

    #[test]
    fn a_body_is_refused_with_what_is_wrong() {
        let e = |body: &str| match parse(body.as_bytes()) {
            Err(e) => e.body["error"].as_str().unwrap_or_default().to_string(),
            Ok(_) => "accepted".into(),
        };
        assert!(e(r#"{"tasks": [], "x": 1}"#)
            .starts_with("unknown field \"x\", expected \"tasks\" at line 1"));
        assert_eq!(
            e(r#"{"tasks": []}"#),
            "'tasks' must be a non-empty array of the graph's tasks"
        );
        assert!(e(r#"{"tasks": [{"colour": 1}]}"#).starts_with("unknown field \"colour\""));
        assert!(e("[1]").starts_with("a graph must be a JSON object"));
        assert_eq!(e(r#"{"tasks": [{"name": "a"}]}"#), "accepted");
    }
}
