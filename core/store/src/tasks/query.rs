//! Task search for the API: Disbatch's "indexed prefixes only" rule, read from live indexes.

use crate::TaskStore;
use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Document};
use futures::TryStreamExt;
use serde_json::Value;

use crate::error::{Error, Result};
use crate::failures::{mtime_range, StatusWord};
use disbatch_model::schema::{task, TASKS};

/// The field lists of the `tasks` indexes, `_id` spelled `id`, prefixes of others dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexSets(pub Vec<Vec<String>>);

/// Why a search was refused.
#[derive(Debug, Clone, PartialEq)]
pub enum QueryError {
    /// Fields not allowed by any index prefix.
    NonIndexed { invalid: Vec<String> },
    /// An `id` or `queue` value that is not an ObjectId.
    BadObjectId { field: String, value: String },
    /// A value that cannot be matched (an object, say).
    BadValue { field: String, message: String },
}

/// A validated search: the filter to run.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskQuery {
    pub filter: Document,
    /// True when no search term was given (Disbatch refuses that without a limit).
    pub is_empty: bool,
}

impl IndexSets {
    /// Builds the sets from index key documents, as Disbatch does from index names.
    pub fn from_keys(keys: &[Document]) -> IndexSets {
        let mut sets: Vec<Vec<String>> = keys
            .iter()
            .map(|k| {
                k.keys()
                    .map(|f| {
                        if f == task::ID {
                            "id".to_string()
                        } else {
                            f.clone()
                        }
                    })
                    .collect()
            })
            .collect();
        sets.sort();
        sets.dedup();
        let all = sets.clone();
        sets.retain(|s| !all.iter().any(|o| o.len() > s.len() && o.starts_with(s)));
        IndexSets(sets)
    }

    /// A field may be searched when some index has it and every field before it is given.
    pub fn allows(&self, field: &str, given: &[&str]) -> bool {
        self.0
            .iter()
            .any(|set| match set.iter().position(|f| f == field) {
                Some(i) => set[..i].iter().all(|f| given.contains(&f.as_str())),
                None => false,
            })
    }

    /// The given fields no index serves, sorted.
    pub fn non_indexed(&self, params: &serde_json::Map<String, Value>) -> Vec<String> {
        let given: Vec<&str> = params
            .iter()
            .filter(|(_, v)| !is_blank(v))
            .map(|(k, _)| k.as_str())
            .collect();
        let mut invalid: Vec<String> = given
            .iter()
            .filter(|f| !self.allows(f, &given))
            .map(|f| f.to_string())
            .collect();
        invalid.sort();
        invalid
    }

    /// Turns API parameters into a filter, or says which fields no index serves.
    pub fn build_query(
        &self,
        params: &serde_json::Map<String, Value>,
    ) -> Result<TaskQuery, QueryError> {
        let invalid = self.non_indexed(params);
        if !invalid.is_empty() {
            return Err(QueryError::NonIndexed { invalid });
        }
        build_filter(params)
    }
}

/// What a task search filters on beside Disbatch's field equality: a status word, an `mtime`
/// range and a creation range, each bound optional.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SearchTerms {
    pub status: Option<StatusWord>,
    pub since: Option<DateTime>,
    pub until: Option<DateTime>,
    pub created_since: Option<DateTime>,
    pub created_until: Option<DateTime>,
}

impl SearchTerms {
    pub fn is_empty(&self) -> bool {
        *self == SearchTerms::default()
    }

    /// A time range (of change or of creation) bounds the search.
    pub fn ranged(&self) -> bool {
        self.since.is_some()
            || self.until.is_some()
            || self.created_since.is_some()
            || self.created_until.is_some()
    }

    /// Nothing but creation time, which the `_id` index serves newest first whatever the
    /// size of the history.
    pub fn creation_range_only(&self) -> bool {
        self.status.is_none() && self.since.is_none() && self.until.is_none()
    }

    fn terms(&self) -> Vec<Document> {
        let mut terms: Vec<Document> = self.status.map(StatusWord::term).into_iter().collect();
        terms.extend(mtime_range(self.since, self.until));
        // Creation time is in the `_id` itself: a range on it is read through the `_id` index.
        let mut created = Document::new();
        if let Some(t) = self.created_since {
            created.insert("$gte", first_id_at(t));
        }
        if let Some(t) = self.created_until {
            created.insert("$lt", first_id_at(t));
        }
        if !created.is_empty() {
            terms.push(doc! {task::ID: created});
        }
        terms
    }
}

/// The smallest ObjectId made at `t` (its first four bytes are the creation second).
fn first_id_at(t: DateTime) -> ObjectId {
    let secs = u32::try_from(t.timestamp_millis().div_euclid(1000).max(0)).unwrap_or(u32::MAX);
    let mut bytes = [0u8; 12];
    bytes[..4].copy_from_slice(&secs.to_be_bytes());
    ObjectId::from_bytes(bytes)
}

/// The filter of a search: the fields' equality (`build_filter`) and every term of `terms`.
pub fn search_filter(
    params: &serde_json::Map<String, Value>,
    terms: &SearchTerms,
) -> Result<TaskQuery, QueryError> {
    let q = build_filter(params)?;
    let mut all = terms.terms();
    if all.is_empty() {
        return Ok(q);
    }
    if !q.is_empty {
        all.push(q.filter);
    }
    Ok(TaskQuery {
        filter: doc! {"$and": all},
        is_empty: false,
    })
}

/// The filter of API parameters, whether or not an index serves it: the caller bounds it.
pub fn build_filter(params: &serde_json::Map<String, Value>) -> Result<TaskQuery, QueryError> {
    {
        let mut terms = Vec::new();
        for (field, value) in params.iter().filter(|(_, v)| !is_blank(v)) {
            let name = if field == "id" {
                task::ID
            } else {
                field.as_str()
            };
            let term = match value {
                Value::Array(items) => {
                    let alternatives = items
                        .iter()
                        .map(|v| to_bson(field, v).map(|b| doc! {name: b}))
                        .collect::<Result<Vec<_>, _>>()?;
                    doc! {"$or": alternatives}
                }
                v => doc! {name: to_bson(field, v)?},
            };
            terms.push(term);
        }
        let is_empty = terms.is_empty();
        let filter = match terms.len() {
            0 => doc! {},
            1 => terms.remove(0),
            _ => doc! {"$and": terms},
        };
        Ok(TaskQuery { filter, is_empty })
    }
}

fn is_blank(v: &Value) -> bool {
    matches!(v, Value::String(s) if s.is_empty())
}

/// Disbatch's value rules: ids and queues are ObjectIds, numeric strings are numbers.
fn to_bson(field: &str, v: &Value) -> Result<Bson, QueryError> {
    if field == "id" || field == task::QUEUE {
        let text = match v {
            Value::String(s) => s.clone(),
            Value::Object(o) => match o.get("$oid") {
                Some(Value::String(s)) => s.clone(),
                _ => v.to_string(),
            },
            other => other.to_string(),
        };
        return ObjectId::parse_str(&text).map(Bson::ObjectId).map_err(|_| {
            QueryError::BadObjectId {
                field: field.to_string(),
                value: text,
            }
        });
    }
    match v {
        Value::Null => Ok(Bson::Null),
        Value::Bool(b) => Ok(Bson::Boolean(*b)),
        Value::Number(n) => Ok(number_to_bson(n)),
        Value::String(s) => Ok(numeric_string(s).unwrap_or_else(|| Bson::String(s.clone()))),
        Value::Array(_) | Value::Object(_) => Err(QueryError::BadValue {
            field: field.to_string(),
            message: "must be a string, a number, null or an array of those".into(),
        }),
    }
}

fn number_to_bson(n: &serde_json::Number) -> Bson {
    match (n.as_i64(), n.as_f64()) {
        (Some(i), _) if i32::try_from(i).is_ok() => Bson::Int32(i as i32),
        (Some(i), _) => Bson::Int64(i),
        (None, Some(f)) => Bson::Double(f),
        _ => Bson::String(n.to_string()),
    }
}

/// `"-2"` → -2, `"1.5"` → 1.5; anything else is text.
fn numeric_string(s: &str) -> Option<Bson> {
    let t = s.trim();
    let looks_numeric = !t.is_empty()
        && t.trim_start_matches('-')
            .chars()
            .all(|c| c.is_ascii_digit() || c == '.')
        && t.chars().filter(|c| *c == '.').count() <= 1
        && t.trim_start_matches('-')
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_digit());
    if !looks_numeric {
        return None;
    }
    if let Ok(i) = t.parse::<i64>() {
        return Some(i32::try_from(i).map(Bson::Int32).unwrap_or(Bson::Int64(i)));
    }
    t.parse::<f64>().ok().map(Bson::Double)
}

/// Documents per batch of a streamed search. Measured with eight unlimited searches over
/// 100 000 small tasks at once: the DCI peaked at 27 MiB with 256, at 269 MiB with the
/// server's own batches (up to 16 MiB each), and answered no faster.
const STREAM_BATCH: u32 = 256;

/// Tasks one at a time, as a search reads them.
pub type TaskStream =
    std::pin::Pin<Box<dyn futures::Stream<Item = Result<Document>> + Send + 'static>>;

impl TaskStore<'_> {
    /// The live index sets of `tasks`, which decide what the API may search.
    pub async fn task_index_sets(self) -> Result<IndexSets> {
        let indexes: Vec<mongodb::IndexModel> = self
            .collection(TASKS)
            .list_indexes()
            .await
            .map_err(|e| Error::mongo("listing task indexes", e))?
            .try_collect()
            .await
            .map_err(|e| Error::mongo("listing task indexes", e))?;
        // The failures index holds failed tasks alone: an `mtime` equality it cannot serve
        // must not pass for indexed (its words, `failed` and `discarded`, are served anyway).
        let keys: Vec<Document> = indexes
            .into_iter()
            .filter(|i| {
                i.options.as_ref().and_then(|o| o.name.as_deref())
                    != Some(crate::conn::indexes::FAILURES_INDEX)
            })
            .map(|i| i.keys)
            .collect();
        Ok(IndexSets::from_keys(&keys))
    }

    pub async fn find_tasks(
        self,
        filter: Document,
        projection: Option<Document>,
        skip: u64,
        limit: i64,
    ) -> Result<Vec<Document>> {
        let tasks = self.raw(TASKS);
        let mut action = tasks
            .find(filter)
            .skip(skip)
            .limit(limit)
            .batch_size(STREAM_BATCH);
        if let Some(p) = projection {
            action = action.projection(p);
        }
        let cursor = action
            .await
            .map_err(|e| Error::mongo("searching tasks", e))?;
        self.read_all(TASKS, cursor, "searching tasks").await
    }

    /// Like `find_tasks`, one document at a time as the client takes them: memory stays
    /// bounded by the driver's batch (at most 16 MiB, the server's cap on a reply) however
    /// many tasks match. An undecodable document is
    /// left out and reported, as in every read.
    pub async fn stream_tasks(
        self,
        filter: Document,
        projection: Option<Document>,
        skip: u64,
        limit: i64,
        newest_first: bool,
    ) -> Result<TaskStream> {
        let tasks = self.raw(TASKS);
        let mut action = tasks.find(filter).skip(skip).limit(limit);
        if newest_first {
            // Creation order is `_id` order: the `_id` index walked backwards.
            action = action.sort(doc! {task::ID: -1});
        }
        if let Some(p) = projection {
            action = action.projection(p);
        }
        let cursor = action
            .await
            .map_err(|e| Error::mongo("searching tasks", e))?;
        let store = self.store.clone();
        let docs = futures::StreamExt::filter_map(cursor, move |raw| {
            let decoded = match raw {
                Ok(raw) => store.decode_or_skip(TASKS, &raw).map(Ok),
                Err(e) => Some(Err(Error::mongo("searching tasks", e))),
            };
            std::future::ready(decoded)
        });
        Ok(Box::pin(docs))
    }

    pub async fn count_tasks(self, filter: Document) -> Result<u64> {
        self.collection(TASKS)
            .count_documents(filter)
            .await
            .map_err(|e| Error::mongo("counting tasks", e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn disbatch_sets() -> IndexSets {
        IndexSets::from_keys(&[
            doc! {"_id": 1},
            doc! {"node": 1, "status": 1, "queue": 1},
            doc! {"node": 1, "status": 1, "queue": 1, "_id": 1},
            doc! {"node": 1, "status": 1, "queue": 1, "_id": -1},
            doc! {"queue": 1, "status": 1},
        ])
    }

    fn params(v: Value) -> serde_json::Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn default_indexes_give_disbatch_sets() {
        let expected: Vec<Vec<String>> = vec![
            vec!["id".into()],
            vec!["node".into(), "status".into(), "queue".into(), "id".into()],
            vec!["queue".into(), "status".into()],
        ];
        assert_eq!(disbatch_sets().0, expected);
    }

    #[test]
    fn only_indexed_prefixes_may_be_searched() {
        let sets = disbatch_sets();
        let q = "6b02626f79f4bc22b2fe7135";
        assert!(sets.build_query(&params(json!({"queue": q}))).is_ok());
        assert!(sets
            .build_query(&params(json!({"queue": q, "status": 1})))
            .is_ok());
        assert!(sets.build_query(&params(json!({"node": "n1"}))).is_ok());
        let err = sets
            .build_query(&params(json!({"status": 1})))
            .expect_err("status alone");
        assert_eq!(
            err,
            QueryError::NonIndexed {
                invalid: vec!["status".into()]
            }
        );
        let err = sets
            .build_query(&params(json!({"queue": q, "params.commands": "a"})))
            .expect_err("params");
        assert_eq!(
            err,
            QueryError::NonIndexed {
                invalid: vec!["params.commands".into()]
            }
        );
    }

    #[test]
    fn values_become_object_ids_numbers_and_alternatives() {
        let sets = disbatch_sets();
        let q = "6b02626f79f4bc22b2fe7135";
        let query = sets
            .build_query(&params(
                json!({"queue": q, "status": ["-2", "1"], "node": ""}),
            ))
            .expect("ok");
        let oid = ObjectId::parse_str(q).expect("oid");
        assert_eq!(
            query.filter,
            doc! {"$and": [{"queue": oid}, {"$or": [{"status": -2}, {"status": 1}]}]}
        );
        let err = sets
            .build_query(&params(json!({"id": "nothex"})))
            .expect_err("bad id");
        assert!(matches!(err, QueryError::BadObjectId { .. }));
        assert!(
            sets.build_query(&params(json!({})))
                .expect("empty")
                .is_empty
        );
    }
}
