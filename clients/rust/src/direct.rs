//! The direct path: a task inserted by the app into Disbatch's database, inside its own session.
//
// The document is the one the API writes for a new task (core/store/src/tasks/mod.rs,
// `create_labelled`); the integration tests compare the two field by field. The names are
// core/model/src/schema.rs's: this crate does not depend on disbatch-core, whose store pulls
// the whole server in.

use std::time::Duration;

use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Document};
use mongodb::options::IndexOptions;
use mongodb::{ClientSession, Database, IndexModel};

use crate::error::{Error, Result};
use crate::status;

const QUEUES: &str = "queues";
const TASKS: &str = "tasks";
/// The unique tasks' index, as core/store/src/conn/indexes.rs `limit_indexes` makes it.
const UNIQUE_INDEX: &str = "queue_1_unique_key_1_unique_gen_1";
/// The longest delay the API takes.
const MAX_DELAY_S: f64 = 100.0 * 365.0 * 86_400.0;

/// When a directly inserted task may first run, and its rank.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct DirectOptions {
    /// Seconds from now on the database server's clock; not with `not_before`.
    pub delay_s: Option<f64>,
    pub not_before: Option<DateTime>,
    pub priority: Option<i64>,
}

/// A new queued task's document, as the API writes it (without the unique key fields, which
/// depend on the tasks stored).
pub fn new_task_document(
    queue: ObjectId,
    params: Document,
    now: DateTime,
    options: &DirectOptions,
) -> Result<Document> {
    let mut d = doc! {
        "_id": ObjectId::new(), "queue": queue, "status": status::QUEUED, "node": Bson::Null,
        "params": params, "ctime": now, "mtime": now,
        "stdout": Bson::Null, "stderr": Bson::Null,
    };
    match (options.delay_s, options.not_before) {
        (Some(_), Some(_)) => {
            return Err(Error::Invalid(
                "give delay_s or not_before, not both: each says when the task may first run"
                    .into(),
            ))
        }
        (Some(s), None) => {
            if !(s.is_finite() && (0.0..=MAX_DELAY_S).contains(&s)) {
                return Err(Error::Invalid(format!(
                    "delay_s must be a number of seconds from 0 to a century, not {s}"
                )));
            }
            let at = now.saturating_add_duration(Duration::from_secs_f64(s));
            d.insert("not_before", at);
        }
        (None, Some(t)) => {
            d.insert("not_before", t);
        }
        (None, None) => {}
    }
    if let Some(p) = options.priority {
        d.insert("priority", p);
    }
    Ok(d)
}

/// The database server's clock (`hello`'s `localTime`): the fleet's time, which every node
/// judges `ctime` and `not_before` by, not this host's.
pub async fn server_now(db: &Database) -> Result<DateTime> {
    let reply = db
        .run_command(doc! {"hello": 1})
        .await
        .map_err(|e| Error::mongo("reading the server's clock (hello)", e))?;
    reply
        .get_datetime("localTime")
        .copied()
        .map_err(|_| Error::Unexpected("the server's hello answer has no localTime".into()))
}

/// Inserts one queued task into `db` (Disbatch's database) within `session`, and returns its
/// id. Inside a transaction the task exists only once the transaction commits. A unique
/// queue's duplicate is `Error::DuplicateTask`; the server then has aborted the transaction
/// (a duplicate-key error does), so the caller's must be aborted too.
pub async fn enqueue_in(
    db: &Database,
    session: &mut ClientSession,
    queue: &str,
    params: Document,
    options: DirectOptions,
) -> Result<ObjectId> {
    let found = db
        .collection::<Document>(QUEUES)
        .find_one(doc! {"name": queue})
        .projection(doc! {"_id": 1, "unique": 1})
        .session(&mut *session)
        .await
        .map_err(|e| Error::mongo(format!("reading queue {queue:?}"), e))?
        .ok_or_else(|| Error::QueueNotFound(queue.to_string()))?;
    let queue_id = found
        .get_object_id("_id")
        .map_err(|_| Error::Unexpected(format!("queue {queue:?} has no ObjectId _id")))?;
    let unique =
        Unique::of(&found).map_err(|why| Error::Invalid(format!("queue {queue:?}: {why}")))?;
    if unique.is_some() {
        // Outside the session and before the insert: an index cannot be built inside a
        // transaction, and without it two creators could both insert one key.
        ensure_unique_index(db).await?;
    }
    let now = server_now(db).await?;
    let mut task = new_task_document(queue_id, params, now, &options)?;
    if let Some(unique) = unique {
        if let Some(holder) = place_unique(db, session, queue_id, &unique, &mut task, now).await? {
            return Err(Error::DuplicateTask {
                queue: queue.to_string(),
                matched: Some(holder),
            });
        }
    }
    let id = task
        .get_object_id("_id")
        .map_err(|_| Error::Unexpected("the new task has no id".into()))?;
    match db
        .collection::<Document>(TASKS)
        .insert_one(task)
        .session(&mut *session)
        .await
    {
        Ok(_) => Ok(id),
        // Another creator wrote this key's generation since it was read: that task holds it.
        Err(e) if is_duplicate_key(&e) => Err(Error::DuplicateTask {
            queue: queue.to_string(),
            matched: None,
        }),
        Err(e) => Err(Error::mongo(
            format!("inserting a task into queue {queue:?}"),
            e,
        )),
    }
}

/// A queue's `unique`, as core/model/src/limits.rs reads it.
#[derive(Debug, Clone, PartialEq)]
struct Unique {
    key: String,
    states: Vec<i32>,
    for_s: f64,
}

impl Unique {
    fn of(queue: &Document) -> std::result::Result<Option<Unique>, String> {
        let u = match queue.get("unique") {
            None | Some(Bson::Null) => return Ok(None),
            Some(Bson::Document(u)) => u,
            Some(other) => return Err(format!("unique must be an object, found {other}")),
        };
        let key = match u.get("key") {
            Some(Bson::String(k)) if !k.is_empty() => k.clone(),
            _ => return Err("unique.key is required (a task field)".into()),
        };
        let mut states = Vec::new();
        match u.get("states") {
            None | Some(Bson::Null) => {
                states.extend([status::QUEUED, status::CLAIMED, status::RUNNING])
            }
            Some(Bson::Array(names)) => {
                for n in names {
                    let found = n.as_str().and_then(status::state_name);
                    states.extend(found.ok_or_else(|| format!("unknown unique state {n}"))?);
                }
            }
            Some(other) => {
                return Err(format!(
                    "unique.states must be a list of names, found {other}"
                ))
            }
        }
        let for_s = match u.get("for_s") {
            None | Some(Bson::Null) => 0.0,
            Some(Bson::Int32(n)) => f64::from(*n),
            Some(Bson::Int64(n)) => *n as f64,
            Some(Bson::Double(f)) => *f,
            Some(other) => return Err(format!("unique.for_s must be seconds, found {other}")),
        };
        Ok(Some(Unique { key, states, for_s }))
    }

    /// Whether a task of `status` created at `ctime` still holds its key at `now`.
    fn holds(&self, task: &Document, now: DateTime) -> bool {
        let status = match task.get("status") {
            Some(Bson::Int32(s)) => Some(i64::from(*s)),
            Some(Bson::Int64(s)) => Some(*s),
            Some(Bson::Double(s)) if s.fract() == 0.0 => Some(*s as i64),
            _ => None,
        };
        if status.is_some_and(|s| self.states.iter().any(|&h| i64::from(h) == s)) {
            return true;
        }
        match task.get("ctime") {
            Some(Bson::DateTime(t)) if self.for_s > 0.0 => {
                let age_ms = now.timestamp_millis().saturating_sub(t.timestamp_millis());
                (age_ms as f64) < self.for_s * 1000.0
            }
            _ => false,
        }
    }
}

/// The value at a dotted path of the task, Null when absent; a list is refused.
fn key_value(task: &Document, path: &str) -> std::result::Result<Bson, String> {
    let mut at = Some(task);
    let mut value = Bson::Null;
    for name in path.split('.') {
        let Some(d) = at else { return Ok(Bson::Null) };
        value = d.get(name).cloned().unwrap_or(Bson::Null);
        at = match &value {
            Bson::Document(d) => Some(d),
            Bson::Array(_) => return Err(format!("the task's {path} is a list, not one key")),
            _ => None,
        };
    }
    Ok(value)
}

async fn ensure_unique_index(db: &Database) -> Result<()> {
    let tasks = db.collection::<Document>(TASKS);
    let names = tasks
        .list_index_names()
        .await
        .map_err(|e| Error::mongo("listing the tasks' indexes", e))?;
    if names.iter().any(|n| n == UNIQUE_INDEX) {
        return Ok(());
    }
    let model = IndexModel::builder()
        .keys(doc! {"queue": 1, "unique_key": 1, "unique_gen": 1})
        .options(
            IndexOptions::builder()
                .name(UNIQUE_INDEX.to_string())
                .unique(true)
                .partial_filter_expression(doc! {"unique_key": {"$exists": true}})
                .build(),
        )
        .build();
    tasks
        .create_index(model)
        .await
        .map_err(|e| Error::mongo("creating the unique tasks' index", e))?;
    Ok(())
}

/// Stamps `unique_key` and the key's next `unique_gen` on `task`, or returns the task that
/// holds the key.
async fn place_unique(
    db: &Database,
    session: &mut ClientSession,
    queue: ObjectId,
    unique: &Unique,
    task: &mut Document,
    now: DateTime,
) -> Result<Option<ObjectId>> {
    let value = key_value(task, &unique.key)
        .map_err(|why| Error::Invalid(format!("{why} (the queue's unique.key names it)")))?;
    if value == Bson::Null {
        return Ok(None);
    }
    let newest = db
        .collection::<Document>(TASKS)
        .find_one(doc! {"queue": queue, "unique_key": value.clone()})
        .sort(doc! {"unique_gen": -1})
        .projection(doc! {"_id": 1, "status": 1, "ctime": 1, "unique_gen": 1})
        .session(&mut *session)
        .await
        .map_err(|e| Error::mongo("reading the unique key's newest task", e))?;
    task.insert("unique_key", value);
    let gen = match newest {
        None => 0_i64,
        Some(n) if unique.holds(&n, now) => {
            let holder = n
                .get_object_id("_id")
                .map_err(|_| Error::Unexpected("the key's task has no ObjectId _id".into()))?;
            return Ok(Some(holder));
        }
        Some(n) => match n.get("unique_gen") {
            Some(Bson::Int64(g)) => g.saturating_add(1),
            Some(Bson::Int32(g)) => i64::from(*g) + 1,
            _ => 1,
        },
    };
    task.insert("unique_gen", gen);
    Ok(None)
}

fn is_duplicate_key(e: &mongodb::error::Error) -> bool {
    use mongodb::error::{ErrorKind, WriteFailure};
    match e.kind.as_ref() {
        ErrorKind::Write(WriteFailure::WriteError(w)) => w.code == 11000,
        ErrorKind::Command(c) => c.code == 11000,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_task_has_the_apis_fields() {
        let q = ObjectId::new();
        let now = DateTime::from_millis(1_000_000);
        let d = new_task_document(q, doc! {"n": 1}, now, &DirectOptions::default()).unwrap();
        let keys: Vec<&str> = d.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            ["_id", "queue", "status", "node", "params", "ctime", "mtime", "stdout", "stderr"]
        );
        let delayed = DirectOptions {
            delay_s: Some(2.5),
            priority: Some(7),
            ..DirectOptions::default()
        };
        let d = new_task_document(q, doc! {}, now, &delayed).unwrap();
        assert_eq!(
            d.get_datetime("not_before").unwrap().timestamp_millis(),
            1_002_500
        );
        assert_eq!(d.get_i64("priority").unwrap(), 7);
        let both = DirectOptions {
            delay_s: Some(1.0),
            not_before: Some(now),
            ..DirectOptions::default()
        };
        assert!(matches!(
            new_task_document(q, doc! {}, now, &both),
            Err(Error::Invalid(_))
        ));
    }

    #[test]
    fn unique_settings_and_holders_read_as_the_fleet_reads_them() {
        let u = Unique::of(&doc! {"unique": {"key": "params.id"}})
            .unwrap()
            .unwrap();
        assert_eq!(u.states, vec![-2, -1, 0]);
        let now = DateTime::from_millis(10_000);
        assert!(u.holds(&doc! {"status": -2, "ctime": now}, now));
        assert!(!u.holds(&doc! {"status": 1, "ctime": now}, now));
        let w = Unique::of(&doc! {"unique": {"key": "k", "states": [], "for_s": 5}})
            .unwrap()
            .unwrap();
        assert!(w.holds(
            &doc! {"status": 1, "ctime": DateTime::from_millis(6_000)},
            now
        ));
        assert!(!w.holds(
            &doc! {"status": 1, "ctime": DateTime::from_millis(4_000)},
            now
        ));
        assert!(Unique::of(&doc! {"unique": {"key": "k", "states": ["done"]}}).is_err());
        assert_eq!(Unique::of(&doc! {"name": "q"}), Ok(None));
        assert_eq!(
            key_value(&doc! {"params": {"id": 3}}, "params.id"),
            Ok(Bson::Int32(3))
        );
        assert!(key_value(&doc! {"params": {"id": [1]}}, "params.id").is_err());
    }
}
