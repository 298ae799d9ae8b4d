//! The REST client: tasks, graphs and batches through a DCI's API.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bson::oid::ObjectId;
use bson::DateTime;
use serde_json::{json, Map, Value};

use crate::error::{Error, Result};
use crate::status;

/// When a task may first run and its rank in a queue sorted by priority.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Timing {
    /// Seconds from now on the fleet's clock (the database server's); not with `not_before`.
    pub delay_s: Option<f64>,
    /// Not claimed before this time.
    pub not_before: Option<DateTime>,
    /// Higher is claimed first in a queue with `sort: "priority"`.
    pub priority: Option<i64>,
}

impl Timing {
    pub(crate) fn check(&self) -> Result<()> {
        if self.delay_s.is_some() && self.not_before.is_some() {
            return Err(Error::Invalid(
                "give delay_s or not_before, not both: each says when the task may first run"
                    .into(),
            ));
        }
        if let Some(d) = self.delay_s {
            if !(d.is_finite() && (0.0..=100.0 * 365.0 * 86_400.0).contains(&d)) {
                return Err(Error::Invalid(format!(
                    "delay_s must be a number of seconds from 0 to a century, not {d}"
                )));
            }
        }
        Ok(())
    }

    fn write(&self, out: &mut Map<String, Value>) -> Result<()> {
        self.check()?;
        if let Some(d) = self.delay_s {
            out.insert("delay_s".into(), json!(d));
        }
        if let Some(t) = self.not_before {
            let iso = t.try_to_rfc3339_string().map_err(|e| {
                Error::Invalid(format!("not_before {t} cannot be written as a time: {e}"))
            })?;
            out.insert("not_before".into(), json!(iso));
        }
        if let Some(p) = self.priority {
            out.insert("priority".into(), json!(p));
        }
        Ok(())
    }
}

/// One task of `enqueue_many`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NewTask {
    /// The task's params: a JSON object.
    pub params: Value,
    pub timing: Timing,
}

impl NewTask {
    pub fn new(params: Value) -> NewTask {
        NewTask {
            params,
            timing: Timing::default(),
        }
    }
}

/// Input `index` of a unique queue duplicates the live task `matched`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Duplicate {
    pub index: usize,
    pub matched: ObjectId,
}

/// Per input its task's id (the matched task's for a duplicate), and which were duplicates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnqueueResult {
    pub ids: Vec<ObjectId>,
    pub created: u64,
    pub duplicates: Vec<Duplicate>,
}

/// A task of a graph, named so others can depend on it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GraphTask {
    pub name: String,
    pub queue: String,
    pub params: Value,
    /// Names of this graph's tasks, or ids of existing tasks.
    pub depends_on: Vec<String>,
    /// `"cancel"` or `"run"`; the queue's when None.
    pub on_dependency_failure: Option<String>,
}

/// A stored graph: its id and its tasks' ids by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Graph {
    pub id: ObjectId,
    pub ids: BTreeMap<String, ObjectId>,
}

/// A stored batch: its id, its members' ids in order, and its callback's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    pub id: ObjectId,
    pub ids: Vec<ObjectId>,
    pub callback: Option<ObjectId>,
}

/// A task as `GET /tasks/:id` answers it; `raw` is the whole answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Task {
    pub id: ObjectId,
    pub status: Option<i64>,
    pub raw: Value,
}

impl Task {
    /// Whether the task has ended (see [`status::is_final`]).
    pub fn is_final(&self) -> bool {
        self.status.is_some_and(status::is_final)
    }

    pub fn succeeded(&self) -> bool {
        self.status == Some(i64::from(status::SUCCEEDED))
    }

    /// A failure no retry follows.
    pub fn discarded(&self) -> bool {
        !self
            .raw
            .get("discarded_at")
            .unwrap_or(&Value::Null)
            .is_null()
    }
}

/// A DCI's REST API.
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    url: String,
    token: Option<String>,
}

impl Client {
    /// The API at `url` (e.g. `http://127.0.0.1:8080`), with a bearer `token` when the DCI has
    /// `web.tokens`.
    pub fn new(url: &str, token: Option<String>) -> Result<Client> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .map_err(|source| Error::Http {
                context: "building the HTTP client".into(),
                source,
            })?;
        Ok(Client::with_http(http, url, token))
    }

    /// The API at `url` through an HTTP client the app configured (TLS roots, proxies).
    pub fn with_http(http: reqwest::Client, url: &str, token: Option<String>) -> Client {
        Client {
            http,
            url: url.trim_end_matches('/').to_string(),
            token,
        }
    }

    async fn request(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value> {
        let context = format!("{method} {}{path}", self.url);
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.url))
            .header("Accept", "application/json");
        if let Some(token) = &self.token {
            req = req.bearer_auth(token);
        }
        if let Some(body) = body {
            req = req
                .header("Content-Type", "application/json")
                .body(body.to_string());
        }
        let http = |source| Error::Http {
            context: context.clone(),
            source,
        };
        let answer = req.send().await.map_err(http)?;
        let code = answer.status();
        let text = answer.text().await.map_err(http)?;
        let value: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        if code.is_client_error() || code.is_server_error() {
            let message = match value.get("error") {
                Some(Value::String(s)) => s.clone(),
                Some(other) => other.to_string(),
                None => value.to_string(),
            };
            return Err(Error::Api {
                status: code.as_u16(),
                message,
            });
        }
        Ok(value)
    }

    /// Creates one task and returns its id; `Error::DuplicateTask` when a unique queue has a
    /// live task with its key.
    pub async fn enqueue(&self, queue: &str, params: Value, timing: Timing) -> Result<ObjectId> {
        let made = self
            .enqueue_many(queue, vec![NewTask { params, timing }])
            .await?;
        if let Some(d) = made.duplicates.first() {
            return Err(Error::DuplicateTask {
                queue: queue.to_string(),
                matched: Some(d.matched),
            });
        }
        made.ids
            .first()
            .copied()
            .ok_or_else(|| Error::Unexpected("POST /tasks answered no id".into()))
    }

    /// Creates tasks in one request; duplicates of a unique queue are reported, not errors.
    pub async fn enqueue_many(&self, queue: &str, tasks: Vec<NewTask>) -> Result<EnqueueResult> {
        if tasks.is_empty() {
            return Err(Error::Invalid(
                "enqueue_many needs at least one task".into(),
            ));
        }
        let mut items = Vec::with_capacity(tasks.len());
        for t in tasks {
            if !t.params.is_object() {
                return Err(Error::Invalid(format!(
                    "a task's params must be a JSON object, not {}",
                    t.params
                )));
            }
            let mut item = Map::new();
            item.insert("params".into(), t.params);
            t.timing.write(&mut item)?;
            items.push(Value::Object(item));
        }
        let answer = self
            .request(
                reqwest::Method::POST,
                "/tasks",
                Some(json!({"queue": queue, "tasks": items, "answer": "ids"})),
            )
            .await?;
        let ids = id_list(answer.get("ids"), "POST /tasks ids")?;
        let mut duplicates = Vec::new();
        for d in answer
            .get("duplicates")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let index = d
                .get("index")
                .and_then(Value::as_u64)
                .and_then(|i| usize::try_from(i).ok());
            let matched = d.get("matched").and_then(oid);
            match (index, matched) {
                (Some(index), Some(matched)) => duplicates.push(Duplicate { index, matched }),
                _ => {
                    return Err(Error::Unexpected(format!(
                        "POST /tasks: a duplicate this client cannot read: {d}"
                    )))
                }
            }
        }
        let created = answer
            .get("created")
            .and_then(Value::as_u64)
            .unwrap_or((ids.len() - duplicates.len().min(ids.len())) as u64);
        Ok(EnqueueResult {
            ids,
            created,
            duplicates,
        })
    }

    /// Stores a graph, all or nothing; its tasks start as their dependencies end.
    pub async fn create_graph(&self, tasks: Vec<GraphTask>) -> Result<Graph> {
        let tasks: Vec<Value> = tasks
            .into_iter()
            .map(|t| {
                let mut o = json!({"name": t.name, "queue": t.queue, "params": if t.params.is_null() { json!({}) } else { t.params }});
                if !t.depends_on.is_empty() {
                    o["depends_on"] = json!(t.depends_on);
                }
                if let Some(p) = t.on_dependency_failure {
                    o["on_dependency_failure"] = json!(p);
                }
                o
            })
            .collect();
        let answer = self
            .request(
                reqwest::Method::POST,
                "/graphs",
                Some(json!({"tasks": tasks})),
            )
            .await?;
        let id = answer.get("graph").and_then(oid).ok_or_else(|| {
            Error::Unexpected(format!("POST /graphs answered no graph id: {answer}"))
        })?;
        let mut ids = BTreeMap::new();
        for (name, v) in answer
            .get("ids")
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
        {
            let task = oid(v).ok_or_else(|| {
                Error::Unexpected(format!("POST /graphs: task {name:?} has no id: {v}"))
            })?;
            ids.insert(name.clone(), task);
        }
        Ok(Graph { id, ids })
    }

    /// Stores a batch of `(queue, params)` members and an optional callback, queued once every
    /// member has ended.
    pub async fn create_batch(
        &self,
        tasks: Vec<(String, Value)>,
        callback: Option<(String, Value)>,
    ) -> Result<Batch> {
        let members: Vec<Value> = tasks
            .into_iter()
            .map(|(queue, params)| json!({"queue": queue, "params": params}))
            .collect();
        let mut body = json!({"tasks": members});
        if let Some((queue, params)) = callback {
            body["callback"] = json!({"queue": queue, "params": params});
        }
        let answer = self
            .request(reqwest::Method::POST, "/batches", Some(body))
            .await?;
        let id = answer.get("batch").and_then(oid).ok_or_else(|| {
            Error::Unexpected(format!("POST /batches answered no batch id: {answer}"))
        })?;
        Ok(Batch {
            id,
            ids: id_list(answer.get("ids"), "POST /batches ids")?,
            callback: answer.get("callback").and_then(oid),
        })
    }

    /// The task as stored now.
    pub async fn task(&self, id: ObjectId) -> Result<Task> {
        let raw = self
            .request(reqwest::Method::GET, &format!("/tasks/{id}"), None)
            .await?;
        let status = raw.get("status").and_then(int);
        Ok(Task { id, status, raw })
    }

    /// Polls every `poll` until the task has ended, and returns it; `Error::TimedOut` after
    /// `timeout`.
    pub async fn wait(&self, id: ObjectId, timeout: Duration, poll: Duration) -> Result<Task> {
        let deadline = Instant::now() + timeout;
        loop {
            let task = self.task(id).await?;
            if task.is_final() {
                return Ok(task);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::TimedOut {
                    id,
                    status: task.status,
                });
            }
            tokio::time::sleep(poll.min(deadline - now)).await;
        }
    }

    /// The output of the task's last successful attempt (`Error::Api` 404 when none).
    pub async fn result(&self, id: ObjectId) -> Result<Value> {
        self.request(reqwest::Method::GET, &format!("/tasks/{id}/result"), None)
            .await
    }
}

/// An id from `"hex"` or extended JSON `{"$oid": "hex"}`.
fn oid(v: &Value) -> Option<ObjectId> {
    let hex = match v {
        Value::String(s) => s.as_str(),
        Value::Object(o) => o.get("$oid")?.as_str()?,
        _ => return None,
    };
    ObjectId::parse_str(hex).ok()
}

/// An integer from a JSON number or extended JSON `{"$numberInt"|"$numberLong": "n"}`.
fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64().or_else(|| {
            n.as_f64()
                .filter(|f| f.fract() == 0.0 && f.abs() < 9.0e15)
                .map(|f| f as i64)
        }),
        Value::Object(o) => o
            .get("$numberInt")
            .or_else(|| o.get("$numberLong"))?
            .as_str()?
            .parse()
            .ok(),
        _ => None,
    }
}

fn id_list(v: Option<&Value>, what: &str) -> Result<Vec<ObjectId>> {
    let list = v
        .and_then(Value::as_array)
        .ok_or_else(|| Error::Unexpected(format!("{what}: not a list")))?;
    list.iter()
        .map(|i| oid(i).ok_or_else(|| Error::Unexpected(format!("{what}: not an id: {i}"))))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_statuses_are_read_in_either_json_form() {
        let id = ObjectId::new();
        assert_eq!(oid(&json!(id.to_hex())), Some(id));
        assert_eq!(oid(&json!({"$oid": id.to_hex()})), Some(id));
        assert_eq!(oid(&json!("nope")), None);
        assert_eq!(int(&json!(-2)), Some(-2));
        assert_eq!(int(&json!({"$numberLong": "3"})), Some(3));
        assert_eq!(int(&json!("3")), None);
    }

    #[test]
    fn a_delay_and_a_time_together_are_refused() {
        let t = Timing {
            delay_s: Some(1.0),
            not_before: Some(DateTime::now()),
            priority: None,
        };
        assert!(matches!(t.check(), Err(Error::Invalid(_))));
        let t = Timing {
            delay_s: Some(f64::NAN),
            ..Timing::default()
        };
        assert!(matches!(t.check(), Err(Error::Invalid(_))));
    }
}
