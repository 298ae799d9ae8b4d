//! The malformed queue, task and node documents of the hostile tests, with what each should cause.

use bson::oid::ObjectId;
use bson::spec::BinarySubtype;
use bson::{doc, Binary, Bson, DateTime, Document};
use disbatch_model::status;

use super::nested;
use crate::harness::TestDb;

/// What a DEN should make of a malformed queue.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum QueueExpect {
    /// Logged as skipped, with this text in the reason; its task is never run.
    Skip(&'static str),
    /// Served despite the odd value: its task runs to completion.
    Runs,
    /// Served, but `threads` reads as 0 (paused): its task waits, and nothing is logged.
    Paused,
}

pub struct QueueCase {
    pub label: &'static str,
    /// Fields besides `_id`, over `name`, `plugin: echo` and `threads: 1`; `Undefined` removes.
    pub fields: Document,
    pub expect: QueueExpect,
}

fn q(label: &'static str, fields: Document, expect: QueueExpect) -> QueueCase {
    QueueCase {
        label,
        fields,
        expect,
    }
}

pub fn binary(bytes: &[u8]) -> Bson {
    Bson::Binary(Binary {
        subtype: BinarySubtype::Generic,
        bytes: bytes.to_vec(),
    })
}

/// A wrong value for every queue field the DEN reads. Each queue gets one task.
#[rustfmt::skip]
pub fn queue_corpus() -> Vec<QueueCase> {
    use QueueExpect::*;
    let dt = DateTime::from_millis(0);
    vec![
        q("plugin-int", doc! {"plugin": 5}, Skip("plugin must be a string")),
        q("plugin-missing", doc! {"plugin": Bson::Null}, Skip("no plugin is set")),
        q("plugin-empty", doc! {"plugin": ""}, Skip("no plugin is set")),
        q("plugin-array", doc! {"plugin": ["echo"]}, Skip("plugin must be a string")),
        q("plugin-binary", doc! {"plugin": binary(b"echo")}, Skip("plugin must be a string")),
        q("plugin-slash", doc! {"plugin": "/bin/echo"}, Skip("is not valid")),
        q("plugin-dotdot", doc! {"plugin": "../echo"}, Skip("is not valid")),
        q("plugin-nul", doc! {"plugin": "echo\0"}, Skip("is not valid")),
        q("plugin-fffd", doc! {"plugin": "ech\u{fffd}"}, Skip("is not valid")),
        q("plugin-unlisted", doc! {"plugin": "Nope::Plugin"}, Skip("not listed")),
        q("threads-word", doc! {"threads": "abc"}, Skip("threads:")),
        q("threads-negative", doc! {"threads": -1}, Skip("threads:")),
        q("threads-i64max", doc! {"threads": i64::MAX}, Skip("threads:")),
        q("threads-fraction", doc! {"threads": 1.5}, Skip("threads:")),
        q("threads-nan", doc! {"threads": f64::NAN}, Skip("threads:")),
        q("threads-inf", doc! {"threads": f64::INFINITY}, Skip("threads:")),
        q("threads-1e308", doc! {"threads": 1e308}, Skip("threads:")),
        q("threads-bool", doc! {"threads": true}, Skip("threads:")),
        q("threads-object", doc! {"threads": {"n": 1}}, Skip("threads:")),
        q("threads-array", doc! {"threads": [1]}, Skip("threads:")),
        q("threads-date", doc! {"threads": dt}, Skip("threads:")),
        q("threads-oid", doc! {"threads": ObjectId::new()}, Skip("threads:")),
        q("threads-neg-string", doc! {"threads": "-1"}, Skip("threads:")),
        q("threads-huge-string", doc! {"threads": "99999999999"}, Skip("threads:")),
        q("max-running-word", doc! {"threads": Bson::Undefined, "max_running": "x"}, Skip("threads:")),
        q("priority-word", doc! {"priority": "high"}, Skip("priority:")),
        q("priority-nan", doc! {"priority": f64::NAN}, Skip("priority:")),
        q("priority-1e308", doc! {"priority": 1e308}, Skip("priority:")),
        q("weight-array", doc! {"weight": []}, Skip("weight:")),
        q("nice-word", doc! {"nice": "nice"}, Skip("nice:")),
        q("max-getwork-negative", doc! {"max_getwork": -1}, Skip("max_getwork:")),
        q("max-retries-word", doc! {"max_retries": "abc"}, Skip("max_retries:")),
        q("max-retries-i64max", doc! {"max_retries": i64::MAX}, Skip("max_retries:")),
        q("then-int", doc! {"then": 5}, Skip("then must be a queue name")),
        q("interval-negative", doc! {"interval": -1}, Skip("interval must be")),
        q("interval-string", doc! {"interval": "5"}, Skip("interval must be")),
        q("interval-nan", doc! {"interval": f64::NAN}, Skip("interval must be")),
        q("runtime-int", doc! {"runtime": 5}, Skip("runtime must be a string")),
        q("min-gb-string", doc! {"min_gb": "1"}, Skip("min_gb must be a number")),
        q("min-gb-nan", doc! {"min_gb": f64::NAN}, Skip("min_gb must be a number")),
        q("lease-word", doc! {"lease": "abc"}, Skip("lease must be")),
        q("lease-tiny", doc! {"lease": 0.5}, Skip("lease must be at least")),
        q("lease-1e308", doc! {"lease": 1e308}, Skip("lease must be")),
        q("on-lost-int", doc! {"on_lost": 5}, Skip("on_lost must be a string")),
        q("on-lost-word", doc! {"on_lost": "retry"}, Skip("on_lost must be")),
        q("timeout-nan", doc! {"timeout": f64::NAN}, Skip("timeout must be")),
        q("timeout-negative", doc! {"timeout": -1}, Skip("timeout must be")),
        q("kill-grace-array", doc! {"kill_grace": [5]}, Skip("kill_grace must be")),
        q("runs-threads-string", doc! {"threads": "2"}, Runs),
        q("runs-threads-double", doc! {"threads": 2.0}, Runs),
        q("runs-threads-int64", doc! {"threads": Bson::Int64(2)}, Runs),
        q("runs-sort-int", doc! {"sort": 5}, Runs),
        q("runs-sort-word", doc! {"sort": "random"}, Runs),
        q("runs-priority-string", doc! {"priority": "-3"}, Runs),
        q("runs-weight-huge", doc! {"weight": i64::MAX, "priority": i64::MIN}, Runs),
        q("runs-paused-array", doc! {"paused": []}, Runs),
        q("runs-then-missing-queue", doc! {"then": "no-such-queue"}, Runs),
        q("runs-config-odd", doc! {"config": {"nan": f64::NAN, "neg0": -0.0, "big": 1e308, "max": i64::MAX, "s": "\u{fffd}\u{202e}\0", "deep": nested(40), "bin": binary(&[0xff, 0xfe])}}, Runs),
        q("runs-config-scalar", doc! {"config": "not an object"}, Runs),
        q("runs-name-int", doc! {"name": 5}, Runs),
        q("runs-name-missing", doc! {"name": Bson::Null}, Runs),
        q("runs-name-binary", doc! {"name": binary(&[0xff, 0xfe, 0xfd])}, Runs),
        q("runs-name-unicode", doc! {"name": "q-\u{fffd}\u{202e}\u{1f4a9}-\u{0301}"}, Runs),
        q("runs-legacy-constructor", doc! {"plugin": Bson::Undefined, "constructor": "echo"}, Runs),
        q("plugin-null-beside-constructor", doc! {"plugin": Bson::Null, "constructor": "echo"}, Skip("no plugin is set")),
        q("plugin-absent", doc! {"plugin": Bson::Undefined}, Skip("no plugin is set")),
        q("paused-neg-zero", doc! {"threads": -0.0}, Paused),
        q("paused-threads-empty-string", doc! {"threads": ""}, Paused),
        q("paused-disabled-yes", doc! {"disabled": "yes"}, Paused),
        // Sub-documents shaped like Extended JSON, as another tool or a hand edit leaves them:
        // data, not typed values, and never a reason to stop reading the other queues.
        q("runs-extra-numberlong", doc! {"extra": {"$numberLong": "x"}}, Runs),
        q("runs-extra-oid", doc! {"extra": {"$oid": "x"}, "more": [{"$undefined": true}]}, Runs),
        q("runs-extra-date", doc! {"extra": {"$date": "x"}, "bin": {"$binary": {"base64": "!", "subType": "zz"}}}, Runs),
        q("runs-name-oid-shape", doc! {"name": {"$oid": "x"}}, Runs),
        q("runs-config-extjson", doc! {"config": {"$date": "x", "n": {"$numberLong": "x"}}}, Runs),
        q("runs-extra-bson-undefined", doc! {"extra": {"u": Bson::Undefined}}, Runs),
        q("plugin-numberlong-shape", doc! {"plugin": {"$numberLong": "x"}}, Skip("plugin must be a string")),
        q("threads-numberlong-shape", doc! {"threads": {"$numberLong": "2"}}, Skip("threads:")),
        q("threads-operator-shape", doc! {"threads": {"$gt": 0}}, Skip("threads:")),
    ]
}

/// What should become of a malformed task.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TaskExpect {
    /// Run and recorded with this status, and this text in stderr (when given).
    Ends(i32, Option<&'static str>),
    /// Never claimed: its status, node or queue does not match a claim.
    Untouched,
    /// Runs (status 1), unless the server refuses to update a document holding it (SecantusDB
    /// refuses any update of a document with a BSON `undefined`): then it stays queued, and
    /// the DEN reports it once as skipped, without slowing the rest.
    RunsOrRefused,
}

pub struct TaskCase {
    pub label: &'static str,
    pub doc: Document,
    pub expect: TaskExpect,
}

/// Malformed tasks of one valid queue: every field the DEN and the runner read.
#[rustfmt::skip]
pub fn task_corpus(queue: ObjectId) -> Vec<TaskCase> {
    use TaskExpect::*;
    let now = DateTime::now();
    let base = |fields: Document| {
        let mut d = doc! {"_id": ObjectId::new(), "queue": queue, "status": -2, "node": Bson::Null,
        "params": {"ok": 1}, "ctime": now, "mtime": now, "stdout": Bson::Null, "stderr": Bson::Null};
        for (k, v) in fields {
            if v == Bson::Undefined {
                d.remove(&k);
            } else {
                d.insert(k, v);
            }
        }
        d
    };
    let gone = Bson::Undefined;
    let t = |label, fields, expect| TaskCase {
        label,
        doc: base(fields),
        expect,
    };
    vec![
        t("params-missing", doc! {"params": gone.clone()}, Ends(2, Some("no params object"))),
        t("params-null", doc! {"params": Bson::Null}, Ends(2, Some("params must be an object"))),
        t("params-string", doc! {"params": "x"}, Ends(2, Some("params must be an object"))),
        t("params-array", doc! {"params": [1, 2]}, Ends(2, Some("params must be an object"))),
        t("params-int", doc! {"params": 5}, Ends(2, Some("params must be an object"))),
        t("params-15mib", doc! {"params": {"big": "x".repeat(15 * 1024 * 1024)}}, Ends(1, None)),
        t("params-deep-90", doc! {"params": nested(90)}, Ends(1, None)),
        t("params-odd-numbers", doc! {"params": {"nan": f64::NAN, "inf": f64::INFINITY, "neg0": -0.0, "big": 1e308, "max": i64::MAX, "min": i64::MIN}}, Ends(1, None)),
        t("params-odd-unicode", doc! {"params": {"s": "\u{fffd}\u{202e}\0\u{1f4a9}", "\u{fffd}": "key", "bin": binary(&[0xff, 0xfe]), "date": DateTime::MAX}}, Ends(1, None)),
        t("params-legacy-name", doc! {"params": gone.clone(), "parameters": {"a": 1}}, Ends(1, None)),
        t("status-int64", doc! {"status": Bson::Int64(-2)}, Ends(1, None)),
        t("status-double", doc! {"status": -2.0}, Ends(1, None)),
        t("status-string", doc! {"status": "-2"}, Untouched),
        t("status-nan", doc! {"status": f64::NAN}, Untouched),
        t("status-missing", doc! {"status": gone.clone()}, Untouched),
        t("node-minus-one", doc! {"node": -1}, Ends(1, None)),
        t("node-missing", doc! {"node": gone.clone()}, Ends(1, None)),
        t("node-int", doc! {"node": 5}, Untouched),
        t("queue-as-string", doc! {"queue": queue.to_hex()}, Untouched),
        t("queue-missing", doc! {"queue": gone.clone()}, Untouched),
        t("queue-unknown", doc! {"queue": ObjectId::new()}, Untouched),
        t("times-odd", doc! {"ctime": "yesterday", "mtime": gone.clone()}, Ends(1, None)),
        t("times-extreme", doc! {"ctime": DateTime::MIN, "mtime": DateTime::MAX}, Ends(1, None)),
        t("attempts-negative", doc! {"attempts": -1}, Ends(1, None)),
        t("slot-word", doc! {"slot": "x"}, Ends(1, None)),
        t("priority-word", doc! {"priority": "high", "key": 5}, Ends(1, None)),
        t("outputs-odd", doc! {"stdout": 5, "stderr": [1]}, Ends(1, None)),
        t("not-before-word", doc! {"not_before": "tomorrow"}, Untouched),
        t("lease-word", doc! {"lease_until": "soon"}, Ends(1, None)),
        t("times-extjson", doc! {"ctime": {"$date": "x"}, "mtime": {"$numberLong": "x"}}, Ends(1, None)),
        // Matched as read: as a filter this would be an operator matching other documents.
        t("mtime-operator-shape", doc! {"mtime": {"$gt": 0}}, Ends(1, None)),
        t("params-extjson", doc! {"params": {"a": {"$numberLong": "x"}, "b": {"$oid": "x"}, "c": {"$date": "x"}, "d": [{"$undefined": true}], "$where": "1"}}, Ends(1, None)),
        t("node-extjson", doc! {"node": {"$numberLong": "x"}}, Untouched),
        t("params-bson-undefined", doc! {"params": {"a": Bson::Undefined}}, RunsOrRefused),
    ]
}

/// Malformed node documents (not the DEN's own).
#[rustfmt::skip]
pub fn node_corpus() -> Vec<(&'static str, Document)> {
    vec![
        ("node-int", doc! {"node": 5, "timestamp": DateTime::now()}),
        ("node-missing", doc! {"timestamp": DateTime::now()}),
        ("timestamp-word", doc! {"node": "n-ts-word", "timestamp": "yesterday"}),
        ("timestamp-min", doc! {"node": "n-ts-min", "timestamp": DateTime::MIN}),
        ("timestamp-max", doc! {"node": "n-ts-max", "timestamp": DateTime::MAX}),
        ("timestamp-int", doc! {"node": "n-ts-int", "timestamp": i64::MIN}),
        ("maxthreads-word", doc! {"node": "n-mt-word", "maxthreads": "abc"}),
        ("maxthreads-odd", doc! {"node": "n-mt-odd", "maxthreads": f64::NAN, "running": "x", "runners": "x", "pid": -1}),
        ("name-unicode", doc! {"node": "n-\u{fffd}\u{202e}", "timestamp": DateTime::MIN}),
        ("name-binary", doc! {"node": binary(&[0xff]), "timestamp": DateTime::now()}),
        ("extjson-shapes", doc! {"node": "n-extjson", "timestamp": {"$date": "x"}, "maxthreads": {"$numberLong": "x"}, "runners": [{"$oid": "x"}]}),
        ("name-extjson", doc! {"node": {"$oid": "x"}, "timestamp": DateTime::now()}),
    ]
}

/// The corpus as inserted: each queue case with its id, document and one task.
pub struct Inserted {
    pub queues: Vec<(QueueCase, ObjectId, Document, ObjectId)>,
    pub taskbox: ObjectId,
    pub tasks: Vec<TaskCase>,
    pub nodes: Vec<(ObjectId, Document)>,
}

/// Inserts every malformed queue (each with one task), the malformed tasks of one valid
/// queue, the malformed nodes and a malformed balance document, past the API.
pub async fn insert_corpus(db: &TestDb) -> Inserted {
    let queues = db.db.collection::<Document>("queues");
    let mut queue_cases = Vec::new();
    for case in queue_corpus() {
        let id = ObjectId::new();
        let mut d =
            doc! {"_id": id, "name": format!("hq-{}", case.label), "plugin": "echo", "threads": 1};
        for (k, v) in case.fields.clone() {
            if v == Bson::Undefined {
                d.remove(&k);
            } else {
                d.insert(k, v);
            }
        }
        queues
            .insert_one(d.clone())
            .await
            .unwrap_or_else(|e| panic!("insert queue {}: {e}", case.label));
        let task = db
            .insert_tasks(id, vec![Bson::from(doc! {"q": case.label})])
            .await[0];
        queue_cases.push((case, id, d, task));
    }
    // Queues whose `_id` is not an ObjectId cannot be addressed by tasks at all.
    for bad_id in [
        Bson::String("queue-string-id".into()),
        Bson::Int32(42),
        Bson::Null,
    ] {
        let name = format!("hq-id-{bad_id}");
        queues
            .insert_one(doc! {"_id": bad_id, "name": name, "plugin": "echo", "threads": 1})
            .await
            .expect("insert queue with odd _id");
    }
    let taskbox = db.insert_queue("taskbox", "echo", 3).await;
    let tasks = task_corpus(taskbox);
    for case in &tasks {
        db.tasks()
            .insert_one(case.doc.clone())
            .await
            .unwrap_or_else(|e| panic!("insert task {}: {e}", case.label));
    }
    let node_coll = db.db.collection::<Document>("nodes");
    let mut nodes = Vec::new();
    for (label, fields) in node_corpus() {
        let id = ObjectId::new();
        let mut d = doc! {"_id": id};
        d.extend(fields);
        node_coll
            .insert_one(d.clone())
            .await
            .unwrap_or_else(|e| panic!("insert node {label}: {e}"));
        nodes.push((id, d));
    }
    node_coll
        .insert_one(
            doc! {"_id": "node-string-id", "node": "n-string-id", "timestamp": DateTime::now()},
        )
        .await
        .expect("insert node with string _id");
    db.db
        .collection::<Document>("balance")
        .insert_one(
            doc! {"timestamp": i64::MIN, "status": 5, "message": ["x"], "queues": "x",
            "max_tasks": {"a": "b"}},
        )
        .await
        .expect("insert balance");
    Inserted {
        queues: queue_cases,
        taskbox,
        tasks,
        nodes,
    }
}

/// How each malformed task ended, against what was expected; `log` is the DEN's.
pub async fn task_problems(db: &TestDb, c: &Inserted, log: &str) -> Vec<String> {
    let mut problems = Vec::new();
    for case in &c.tasks {
        let id = case.doc.get_object_id("_id").expect("task id");
        let t = db.task(id).await;
        match case.expect {
            TaskExpect::Ends(status, reason) => {
                let got = t.get("status").cloned().unwrap_or(Bson::Null);
                if got != Bson::Int32(status) {
                    problems.push(format!("task {}: status {got}, not {status}", case.label));
                }
                let stderr = t.get_str("stderr").unwrap_or_default();
                if reason.is_some_and(|r| !stderr.contains(r)) {
                    problems.push(format!(
                        "task {}: stderr {stderr:?}, not {reason:?}",
                        case.label
                    ));
                }
            }
            TaskExpect::RunsOrRefused => {
                let status = t.get("status").cloned().unwrap_or(Bson::Null);
                let reported = log.lines().any(|l| {
                    l.contains("document skipped")
                        && l.contains("update_refused")
                        && l.contains(&id.to_hex())
                });
                let ok = status == Bson::Int32(status::SUCCEEDED)
                    || (status == Bson::Int32(status::QUEUED) && reported);
                if !ok {
                    problems.push(format!(
                        "task {}: status {status}, reported as refused: {reported}",
                        case.label
                    ));
                }
            }
            TaskExpect::Untouched => {
                // Compared as text: NaN is not equal to itself.
                let text = |d: &Document, k: &str| format!("{:?}", d.get(k));
                if text(&t, "node") != text(&case.doc, "node")
                    || text(&t, "status") != text(&case.doc, "status")
                {
                    problems.push(format!("task {} was touched: {t}", case.label));
                }
            }
        }
    }
    problems
}

/// What became of each malformed queue's task, and whether the DEN logged its skip.
pub async fn queue_problems(db: &TestDb, c: &Inserted, log: &str) -> Vec<String> {
    let mut problems = Vec::new();
    for (case, id, d, task) in &c.queues {
        let status = db.task(*task).await.get_i32("status").unwrap_or(99);
        let skips: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("queue skipped") && l.contains(&id.to_hex()))
            .collect();
        let name = d.get_str("name").unwrap_or_default();
        let wrong = match case.expect {
            QueueExpect::Skip(reason) => {
                status != status::QUEUED
                    || !skips.iter().any(|l| l.contains(reason) && l.contains(name))
            }
            QueueExpect::Runs => status != status::SUCCEEDED,
            QueueExpect::Paused => status != status::QUEUED || !skips.is_empty(),
        };
        if wrong {
            problems.push(format!(
                "queue {} ({:?}): its task has status {status}; skip lines {skips:?}",
                case.label, case.expect
            ));
        }
    }
    for odd in ["queue-string-id", "Int32(42)", "Null"] {
        if !log
            .lines()
            .any(|l| l.contains("_id is not an ObjectId") && l.contains(odd))
        {
            problems.push(format!("no log line about the queue with _id {odd}"));
        }
    }
    problems
}
