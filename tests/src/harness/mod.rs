//! The fixtures every test stands on: a real MongoDB-wire server, one database per test, and
//! the real binaries (DEN, DCI, browser) started for it and cleaned up after it.

pub mod api;
pub mod api_calls;
mod browser;
pub mod claim_order;
pub mod cleanup;
mod dci;
mod den;
pub mod docs;
pub mod fleet;
pub mod procs;
pub mod restartable;
mod server;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Document};
use mongodb::{Client, Collection, Database};

pub use browser::{screenshot_dir, Browser};
pub use dci::{Dci, Launch};
pub use den::{write_config, Den};
pub use fleet::{leader, leader_lease, runner_of, wait_leader, wait_runner_of};
pub use procs::{alive, pid_of, processes_of_attempt, running_process};
pub use server::{server_uri, start_auth_server, start_tls_auth_server, ServerTls};

/// The statuses of a task that has not ended, in code order: blocked, queued, claimed, running.
pub const NOT_ENDED: [i32; 4] = [
    disbatch_model::status::BLOCKED,
    disbatch_model::status::QUEUED,
    disbatch_model::status::CLAIMED,
    disbatch_model::status::RUNNING,
];

/// Where cargo put the workspace binaries: beside this executable, or one level up from
/// `deps/` for test executables.
pub fn bin_path(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let mut dir = exe.parent().expect("executable directory");
    if dir.ends_with("deps") {
        dir = dir.parent().expect("target profile directory");
    }
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is missing: build the workspace first (`cargo build --workspace`, which scripts/test does)",
        path.display()
    );
    path
}

/// A database of its own for one test, dropped when the test passes.
pub struct TestDb {
    pub uri: String,
    pub name: String,
    pub client: Client,
    pub db: Database,
    pub dir: tempfile::TempDir,
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

impl TestDb {
    pub async fn new(test: &str) -> TestDb {
        TestDb::on(server_uri(), test).await
    }

    /// A test database on a given server (a test's own, e.g. one it restarts).
    pub async fn on(uri: String, test: &str) -> TestDb {
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let mut name: String = format!("t_{}_{}_{n}", test, std::process::id())
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        name.truncate(60);
        let client = Client::with_uri_str(&uri).await.expect("client");
        TestDb::with_client(uri, name, client)
    }

    /// A test database reached through a client the test made (a user's login, say).
    pub fn with_client(uri: String, name: String, client: Client) -> TestDb {
        cleanup::test_started();
        let db = client.database(&name);
        let dir = tempfile::tempdir().expect("tempdir");
        TestDb {
            uri,
            name,
            client,
            db,
            dir,
        }
    }

    pub fn tasks(&self) -> Collection<Document> {
        self.db.collection("tasks")
    }

    /// Inserts a queue document the way ops do, straight into MongoDB.
    pub async fn insert_queue(
        &self,
        name: &str,
        plugin: &str,
        threads: impl Into<Bson>,
    ) -> ObjectId {
        let id = ObjectId::new();
        self.db
            .collection::<Document>("queues")
            .insert_one(doc! {"_id": id, "name": name, "plugin": plugin, "threads": threads.into()})
            .await
            .expect("insert queue");
        id
    }

    /// Sets a queue's `threads` the way ops do (opening, resizing or pausing it).
    pub async fn set_threads(&self, queue: ObjectId, threads: i32) {
        self.db
            .collection::<Document>("queues")
            .update_one(doc! {"_id": queue}, doc! {"$set": {"threads": threads}})
            .await
            .expect("set the queue's threads");
    }

    /// Inserts tasks with the Disbatch 4 creation shape.
    pub async fn insert_tasks(&self, queue: ObjectId, params: Vec<Bson>) -> Vec<ObjectId> {
        let now = DateTime::now();
        let docs: Vec<Document> = params
            .into_iter()
            .map(|p| {
                doc! {"_id": ObjectId::new(), "queue": queue, "status": -2, "node": Bson::Null,
                "params": p, "ctime": now, "mtime": now, "stdout": Bson::Null, "stderr": Bson::Null}
            })
            .collect();
        let ids = docs
            .iter()
            .map(|d| d.get_object_id("_id").expect("id"))
            .collect();
        self.tasks().insert_many(docs).await.expect("insert tasks");
        ids
    }

    /// A store on this database as a DEN connects (indexes ensured), for tests of the store
    /// itself.
    pub async fn den_store(&self) -> disbatch_store::Store {
        let path = write_config(self, "store.json", serde_json::json!({}));
        let loaded = disbatch_config::Config::load(&path).expect("config");
        let store = disbatch_store::Store::connect(&loaded.config, disbatch_config::Component::Den)
            .await
            .expect("connect");
        store.ensure_indexes().await.expect("indexes");
        store
    }

    /// A task's status code (`disbatch_model::status`), None when it has none.
    pub async fn task_status(&self, id: ObjectId) -> Option<i32> {
        self.task(id).await.get_i32("status").ok()
    }

    /// A task as stored, decoded byte for byte (Extended-JSON-shaped values stay documents).
    pub async fn task(&self, id: ObjectId) -> Document {
        let raw = self
            .db
            .collection::<bson::RawDocumentBuf>("tasks")
            .find_one(doc! {"_id": id})
            .await
            .expect("find task")
            .expect("task exists");
        disbatch_model::text::raw_doc::from_raw(&raw).expect("decode task")
    }

    /// A task's attempt records, oldest first.
    pub async fn attempts(&self, task: ObjectId) -> Vec<Document> {
        let mut cursor = self
            .db
            .collection::<Document>("attempts")
            .find(doc! {"task": task})
            .sort(doc! {"start": 1})
            .await
            .expect("find attempts");
        let mut out = Vec::new();
        while cursor.advance().await.expect("advance attempts") {
            out.push(cursor.deserialize_current().expect("attempt"));
        }
        out
    }

    /// A task's attempt records, oldest first, once there are at least `count` and none is
    /// still `running`. A result's record is written before the task's result, but a lost
    /// attempt's record after the task moved (recovery moves it only while it still runs as
    /// that attempt, then writes the record), so a reader that has just seen a task recovered
    /// may find its record missing for one write. Panics after 30 s (scaled).
    pub async fn closed_attempts(&self, task: ObjectId, count: usize) -> Vec<Document> {
        let deadline = Instant::now() + scaled(Duration::from_secs(30));
        let mut backoff = Backoff::new();
        loop {
            let records = self.attempts(task).await;
            let closed = records
                .iter()
                .all(|a| a.get_str("outcome").is_ok_and(|o| o != "running"));
            if records.len() >= count && closed {
                return records;
            }
            assert!(
                Instant::now() < deadline,
                "{count} closed attempt records expected, have {records:?}"
            );
            backoff.wait().await;
        }
    }

    /// `$set`s fields on a task, the way ops edit documents by hand.
    pub async fn set_task(&self, id: ObjectId, fields: Document) {
        self.tasks()
            .update_one(doc! {"_id": id}, doc! {"$set": fields})
            .await
            .expect("update task");
    }

    /// A node document whose last heartbeat was `age` ago, as a node that stopped would leave.
    pub async fn insert_node(&self, name: &str, age: Duration) -> ObjectId {
        let id = ObjectId::new();
        let ts = DateTime::from_millis(DateTime::now().timestamp_millis() - age.as_millis() as i64);
        self.db
            .collection::<Document>("nodes")
            .insert_one(doc! {"_id": id, "node": name, "timestamp": ts})
            .await
            .expect("insert node");
        id
    }

    /// A node's document, which the DEN upserts on every heartbeat.
    pub async fn node(&self, name: &str) -> Document {
        self.db
            .collection::<Document>("nodes")
            .find_one(doc! {"node": name})
            .await
            .expect("find node")
            .expect("node document exists")
    }

    /// The work unit (a task with a `key`) of a queue, if there is one.
    pub async fn unit(&self, queue: ObjectId, key: &str) -> Option<Document> {
        self.tasks()
            .find_one(doc! {"queue": queue, "key": key})
            .await
            .expect("find unit")
    }

    pub async fn count(&self, filter: Document) -> u64 {
        self.tasks().count_documents(filter).await.expect("count")
    }

    /// Waits until every given task is complete, or panics with their states.
    pub async fn wait_complete(&self, ids: &[ObjectId], timeout: Duration) {
        let filter = doc! {"_id": {"$in": ids.to_vec()}, "complete": true};
        let timeout = scaled(timeout);
        let deadline = Instant::now() + timeout;
        let mut backoff = Backoff::new();
        loop {
            let done = self
                .tasks()
                .count_documents(filter.clone())
                .await
                .expect("count");
            if done as usize == ids.len() {
                return;
            }
            if Instant::now() > deadline {
                let states = self.status_histogram().await;
                panic!(
                    "{done} of {} tasks complete after {timeout:?}; statuses: {states:?}",
                    ids.len()
                );
            }
            backoff.wait().await;
        }
    }

    pub async fn status_histogram(&self) -> Vec<(i32, u64)> {
        let mut out = Vec::new();
        for s in -6..=3 {
            let n = self.count(doc! {"status": s}).await;
            if n > 0 {
                out.push((s, n));
            }
        }
        out
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// An executable `/bin/sh` script in the test's directory, for a plugin or a worker.
    pub fn script(&self, name: &str, body: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let path = self.path(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).expect("script");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        path
    }

    /// Sets fields of a queue document directly, as an operator would.
    pub async fn set_queue(&self, queue: ObjectId, set: Document) {
        self.db
            .collection::<Document>("queues")
            .update_one(doc! {"_id": queue}, doc! {"$set": set})
            .await
            .expect("queue");
    }

    /// Writes a rate-limit window of `queue`'s `partition` by hand: `starts` as `(t, n)` (server
    /// ms), live until `until` (ms).
    pub async fn insert_rate_window(
        &self,
        queue: ObjectId,
        partition: Bson,
        starts: Vec<(i64, i64)>,
        until: i64,
    ) {
        let entries: Vec<Bson> = starts
            .iter()
            .map(|(t, n)| Bson::from(doc! {"t": *t, "n": *n}))
            .collect();
        self.db
            .collection::<Document>("rate_limits")
            .insert_one(doc! {
                "_id": {"queue": queue, "partition": partition}, "queue": queue,
                "starts": entries, "until": DateTime::from_millis(until),
            })
            .await
            .expect("insert window");
    }

    pub async fn drop(self) {
        let _ = self.db.drop().await;
    }
}

impl Drop for TestDb {
    /// Pass or panic, every process the test started goes with it (see `cleanup`).
    fn drop(&mut self) {
        cleanup::test_ended(self.dir.path());
    }
}

/// Polls `check` until it returns true, panicking with `what` after `timeout`.
pub async fn wait_for<F, Fut>(what: &str, timeout: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let timeout = scaled(timeout);
    let deadline = Instant::now() + timeout;
    let mut backoff = Backoff::new();
    while !check().await {
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        backoff.wait().await;
    }
}

/// Waits up to 30 s until `log` holds `needle` at least `times` times.
pub async fn wait_for_log(what: &str, log: impl Fn() -> String, needle: &str, times: usize) {
    wait_for(what, Duration::from_secs(30), || {
        let found = log().matches(needle).count() >= times;
        async move { found }
    })
    .await;
}

/// The text of `GET {base}/metrics`.
pub async fn scrape(base: &str) -> String {
    reqwest::get(format!("{base}/metrics"))
        .await
        .expect("GET /metrics")
        .text()
        .await
        .expect("metrics text")
}

/// A wait's deadline, stretched by `DISBATCH_TEST_SLOWDOWN` (a factor, default 1) for slow
/// machines. Only deadlines, the time after which a wait gives up, are scaled: never a bound
/// a test asserts as the product's behaviour.
pub fn scaled(timeout: Duration) -> Duration {
    let factor = std::env::var("DISBATCH_TEST_SLOWDOWN")
        .ok()
        .and_then(|f| f.parse::<f64>().ok())
        .filter(|f| f.is_finite() && *f >= 1.0)
        .unwrap_or(1.0);
    timeout.mul_f64(factor)
}

/// The pause between two polls of a wait: 10 ms at first, so a quick event is seen quickly,
/// doubling to 200 ms, so a long wait does not load the shared server with queries.
pub struct Backoff(Duration);

impl Backoff {
    pub fn new() -> Backoff {
        Backoff(Duration::from_millis(10))
    }

    pub async fn wait(&mut self) {
        tokio::time::sleep(self.0).await;
        self.0 = (self.0 * 2).min(Duration::from_millis(200));
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff::new()
    }
}

/// Plugin executables built from `plugins/`.
pub fn demo_plugin() -> PathBuf {
    bin_path("disbatch-plugin-demo")
}

pub fn echo_plugin() -> PathBuf {
    bin_path("disbatch-plugin-echo")
}

pub fn read_lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}
