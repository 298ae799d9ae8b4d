//! `disbatch create-users` on a server with access control, and every component running as its
//! own least-privilege MongoDB user (what it refuses: `mongo_users_refused.rs`).

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use bson::{doc, Document};
use disbatch_model::status;
use disbatch_tests::{bin_path, start_auth_server, wait_for, write_config, Dci, Den, TestDb};
use mongodb::options::{ClientOptions, Credential};
use mongodb::{Client, Database};
use serde_json::{json, Value};

const ROOT: &str = "root";
pub(crate) const ROOT_PASSWORD: &str = "root-secret";
pub(super) const USERS: [&str; 5] = [
    "disbatchd",
    "disbatch_web",
    "task_runner",
    "queuebalance",
    "plugin",
];

/// MongoDB's "not authorized" code.
const UNAUTHORIZED: i32 = 13;

pub(crate) fn passwords(suffix: &str) -> Value {
    let map: serde_json::Map<String, Value> = USERS
        .iter()
        .map(|u| (u.to_string(), json!(format!("{u}-{suffix}"))))
        .collect();
    Value::Object(map)
}

/// `disbatch create-users` with the root password on stdin, as a script would run it.
pub(crate) fn create_users(config: &Path, extra: &[&str], root_password: &str) -> Output {
    let mut child = Command::new(bin_path("disbatch"))
        .arg("create-users")
        .arg("--config")
        .arg(config)
        .args(["--root-user", ROOT])
        .args(extra)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn disbatch");
    let mut stdin = child.stdin.take().expect("stdin");
    // A command that refuses its input before asking for the password (an unreadable
    // `--additional-perms`) may exit before this write: its output says why, not the pipe.
    if let Err(e) = writeln!(stdin, "{root_password}") {
        assert_eq!(
            e.kind(),
            std::io::ErrorKind::BrokenPipe,
            "write password: {e}"
        );
    }
    drop(stdin);
    child.wait_with_output().expect("disbatch output")
}

pub(crate) fn text(out: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// One `--auth` server for this test binary. Its root user is made by the first
/// `create-users --create-root` run (the localhost exception), which is itself checked here.
fn auth_server() -> &'static str {
    static SERVER: OnceLock<String> = OnceLock::new();
    SERVER.get_or_init(|| {
        let uri = start_auth_server();
        let dir = tempfile::tempdir().expect("tempdir");
        let config = dir.path().join("bootstrap.json");
        let body = json!({"mongohost": uri, "database": "users_bootstrap", "auth": passwords("b")});
        std::fs::write(&config, body.to_string()).expect("write config");
        let out = create_users(&config, &["--create-root"], ROOT_PASSWORD);
        assert!(out.status.success(), "bootstrap: {}", text(&out));
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            stdout.contains("created root user root in admin"),
            "{stdout}"
        );
        uri
    })
}

async fn login(uri: &str, user: &str, password: &str, source: &str) -> Client {
    let mut options = ClientOptions::parse(uri).await.expect("parse uri");
    options.credential = Some(
        Credential::builder()
            .username(user.to_string())
            .password(password.to_string())
            .source(source.to_string())
            .build(),
    );
    Client::with_options(options).expect("client")
}

/// A database of its own on the auth server, reached as root for setup and checks.
pub(crate) async fn auth_db(test: &str) -> TestDb {
    static N: AtomicU32 = AtomicU32::new(0);
    let uri = auth_server().to_string();
    let client = login(&uri, ROOT, ROOT_PASSWORD, "admin").await;
    let name = format!("u_{test}_{}", N.fetch_add(1, Ordering::SeqCst));
    TestDb::with_client(uri, name, client)
}

/// The database as one component's user sees it.
pub(super) async fn as_user(db: &TestDb, user: &str, suffix: &str) -> Database {
    login(&db.uri, user, &format!("{user}-{suffix}"), &db.name)
        .await
        .database(&db.name)
}

fn code(result: Result<impl std::fmt::Debug, mongodb::error::Error>) -> Option<i32> {
    match result {
        Ok(_) => None,
        Err(e) => match *e.kind {
            mongodb::error::ErrorKind::Command(ref c) => Some(c.code),
            mongodb::error::ErrorKind::Write(mongodb::error::WriteFailure::WriteError(ref w)) => {
                Some(w.code)
            }
            _ => panic!("expected a refusal from the server, got {e}"),
        },
    }
}

pub(super) async fn user_names(db: &TestDb) -> Vec<String> {
    let reply = db
        .db
        .run_command(doc! {"usersInfo": 1})
        .await
        .expect("usersInfo");
    let mut names: Vec<String> = reply
        .get_array("users")
        .expect("users")
        .iter()
        .filter_map(|u| Some(u.as_document()?.get_str("user").ok()?.to_string()))
        .collect();
    names.sort();
    names
}

/// The role's privileges as the server holds them: collection → sorted actions.
pub(crate) async fn privileges(db: &TestDb, role: &str) -> Vec<(String, Vec<String>)> {
    let reply = db
        .db
        .run_command(doc! {"rolesInfo": role, "showPrivileges": true})
        .await
        .expect("rolesInfo");
    let roles = reply.get_array("roles").expect("roles");
    let role = roles
        .first()
        .and_then(|r| r.as_document())
        .expect("role exists");
    let mut out: Vec<(String, Vec<String>)> = role
        .get_array("privileges")
        .expect("privileges")
        .iter()
        .filter_map(|p| {
            let p = p.as_document()?;
            let collection = p
                .get_document("resource")
                .ok()?
                .get_str("collection")
                .ok()?;
            let mut actions: Vec<String> = p
                .get_array("actions")
                .ok()?
                .iter()
                .filter_map(|a| a.as_str().map(str::to_string))
                .collect();
            actions.sort();
            Some((collection.to_string(), actions))
        })
        .collect();
    out.sort();
    out
}

async fn queue_id(db: &TestDb, name: &str) -> bson::oid::ObjectId {
    db.db
        .collection::<Document>("queues")
        .find_one(doc! {"name": name})
        .await
        .expect("find queue")
        .unwrap_or_else(|| panic!("queue {name} exists"))
        .get_object_id("_id")
        .expect("queue id")
}

/// An operation on a collection.
type Probe = (Op, &'static str);

#[derive(Clone, Copy, Debug)]
enum Op {
    Find,
    Insert,
    Update,
    Remove,
    Drop,
    ListIndexes,
}

/// Runs `op` on `collection` as `db`'s user: None when allowed, else the server's code.
async fn probe(db: &Database, op: Op, collection: &str) -> Option<i32> {
    let c = db.collection::<Document>(collection);
    let nothing = doc! {"_id": "matches-nothing"};
    match op {
        Op::Find => code(c.find_one(nothing).await),
        Op::Insert => code(c.insert_one(doc! {"probe": true}).await),
        Op::Update => code(c.update_many(nothing, doc! {"$set": {"probe": true}}).await),
        Op::Remove => code(c.delete_many(nothing).await),
        Op::Drop => code(c.drop().await),
        Op::ListIndexes => code(c.list_index_names().await),
    }
}

pub(crate) fn has(privileges: &[(String, Vec<String>)], collection: &str, action: &str) -> bool {
    privileges
        .iter()
        .any(|(c, a)| c == collection && a.iter().any(|x| x == action))
}

#[tokio::test]
async fn components_run_end_to_end_as_their_own_least_privilege_users() {
    let db = auth_db("e2e").await;
    let config = write_config(
        &db,
        "node.json",
        json!({"auth": passwords("e2e"), "gfs": true, "balance": {"enabled": true}}),
    );
    check_create_users_makes_each_role(&db, &config).await;

    // Everything below runs with the config's passwords only: no root.
    let den = Den::start(&config, "n1");
    let dci = Dci::start(&config);
    check_a_task_runs_with_its_output_in_gridfs(&db, &dci).await;

    let chained = check_the_chained_unit_the_continuous_task_and_the_balance_lease(&db).await;

    check_the_dcis_writes_as_its_own_user(&db, &dci, chained).await;

    let log = den.log_text();
    for refusal in ["not authorized", "Unauthorized", "requires authentication"] {
        assert!(!log.contains(refusal), "the DEN was refused: {log}");
    }
    // As its own user the node stored its runners' results, in one bulkWrite a batch.
    for fallback in [
        "recording the result here",
        "no bulkWrite",
        "they will store them",
    ] {
        assert!(!log.contains(fallback), "{fallback}: {log}");
    }

    // Our additions that the run above does not reach: the DCI's index creation (it only
    // warns when refused), lease recovery closing an attempt, a failed upload's cleanup.
    let loaded = disbatch_config::Config::load(&config).expect("config");
    disbatch_store::Store::connect(&loaded.config, disbatch_config::Component::Web)
        .await
        .expect("connect as disbatch_web")
        .ensure_indexes()
        .await
        .expect("disbatch_web may create the indexes");

    check_least_privilege_against_the_server(&db).await;

    drop(dci);
    drop(den);
    db.drop().await;
}

async fn check_create_users_makes_each_role(db: &TestDb, config: &Path) {
    let plugin_perms = db.path("plugin-perms.json");
    std::fs::write(&plugin_perms, r#"{"reports": ["insert"]}"#).expect("write perms");
    let out = create_users(
        config,
        &["--plugin-perms", plugin_perms.to_str().expect("utf-8 path")],
        ROOT_PASSWORD,
    );
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    for user in USERS {
        assert!(
            stdout.contains(&format!("created role and user {user} in {}", db.name)),
            "{user}: {stdout}"
        );
    }
    assert_eq!(user_names(db).await, {
        let mut u: Vec<String> = USERS.iter().map(|s| s.to_string()).collect();
        u.sort();
        u
    });
    let den_role = privileges(db, "disbatchd").await;
    assert!(has(&den_role, "leases", "insert") && has(&den_role, "attempts", "update"));
    // Retention: the maintenance leader deletes ended tasks with their attempts and output.
    for collection in ["tasks", "attempts", "tasks.files", "tasks.chunks"] {
        assert!(has(&den_role, collection, "remove"), "{collection}");
    }
    assert!(!has(&den_role, "queues", "remove") && !has(&den_role, "tasks", "dropCollection"));
    assert_eq!(
        privileges(db, "plugin").await,
        vec![("reports".to_string(), vec!["insert".to_string()])]
    );
}

async fn check_a_task_runs_with_its_output_in_gridfs(db: &TestDb, dci: &Dci) {
    let specs = json!({"plugin": "echo", "specs": [
        {"name": "first", "then": "next", "max_running": 2},
        {"name": "next", "max_running": 1},
        {"name": "cont", "continuous": true, "interval": 1, "max_running": 1},
    ]});
    let (status, body) = dci.post("/specs", specs).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = dci
        .post(
            "/queues",
            json!({"name": "held", "plugin": "echo", "threads": 0}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let (status, queues) = dci.get("/queues").await;
    assert_eq!(status, 200, "{queues}");
    assert_eq!(queues.as_array().map(Vec::len), Some(4), "{queues}");

    let (status, body) = dci
        .post(
            "/tasks",
            json!({"queue": "first", "params": [{"result": {"output": ["chained"]}}]}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let first = db
        .tasks()
        .find_one(doc! {"params.result.output": "chained"})
        .await
        .expect("find")
        .expect("the DCI created the task")
        .get_object_id("_id")
        .expect("id");
    db.wait_complete(&[first], Duration::from_secs(30)).await;
    let done = db.task(first).await;
    assert_eq!(
        done.get_i32("status").ok(),
        Some(status::SUCCEEDED),
        "{done}"
    );
    // The runner wrote the output to GridFS and an attempt record.
    assert!(
        done.get_object_id("stdout").is_ok(),
        "stdout in GridFS: {done}"
    );
    // The runner closes its attempt record just after finishing the task.
    wait_for(
        "the attempt record to close",
        Duration::from_secs(10),
        || async {
            let attempts = db.attempts(first).await;
            assert_eq!(attempts.len(), 1, "{attempts:?}");
            attempts[0].get_str("outcome").ok() == Some("succeeded")
        },
    )
    .await;
    let (status, stdout) = dci.get(&format!("/tasks/{first}/stdout")).await;
    assert_eq!(status, 200);
    assert!(stdout.to_string().contains("chained"), "{stdout}");
}

async fn check_the_chained_unit_the_continuous_task_and_the_balance_lease(db: &TestDb) -> Document {
    // The runner inserted the chained unit; the DEN made the continuous queue's task.
    let next = queue_id(db, "next").await;
    // With `queue`: SecantusDB finds nothing by `key` alone (see the report).
    let chained = doc! {"queue": next, "key": "chained"};
    wait_for(
        "the chained unit to finish",
        Duration::from_secs(30),
        || {
            let mut filter = chained.clone();
            filter.insert("status", 1);
            let db = &db;
            async move { db.count(filter).await == 1 }
        },
    )
    .await;
    let cont = queue_id(db, "cont").await;
    wait_for(
        "a continuous task made by the DEN to finish",
        Duration::from_secs(30),
        || async { db.count(doc! {"queue": cont, "status": 1}).await >= 1 },
    )
    .await;
    // QueueBalance inside the DEN took its lease and recorded a status.
    wait_for(
        "the QueueBalance lease",
        Duration::from_secs(20),
        || async {
            db.db
                .collection::<Document>("leases")
                .find_one(doc! {"owner": "n1"})
                .await
                .expect("find")
                .is_some()
        },
    )
    .await;
    chained
}

async fn check_the_dcis_writes_as_its_own_user(db: &TestDb, dci: &Dci, chained: Document) {
    // The DCI's writes: delete (with GridFS output), cancel, node and balance updates.
    let chained_id = db
        .tasks()
        .find_one(chained)
        .await
        .expect("find")
        .expect("chained unit")
        .get_object_id("_id")
        .expect("id");
    let files = db.db.collection::<Document>("tasks.files");
    let output = doc! {"metadata.task_id": chained_id};
    assert_eq!(
        files.count_documents(output.clone()).await.expect("count"),
        2,
        "the runner wrote stdout and stderr to GridFS"
    );
    let (status, body) = dci
        .send(
            reqwest::Method::DELETE,
            &format!("/tasks/{chained_id}"),
            json!({}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let files = files.count_documents(output).await.expect("count");
    assert_eq!(files, 0, "the DCI removed the deleted task's output");
    let (status, body) = dci
        .post("/tasks", json!({"queue": "held", "params": [{"n": 1}]}))
        .await;
    assert_eq!(status, 200, "{body}");
    let held = db
        .tasks()
        .find_one(doc! {"queue": queue_id(db, "held").await})
        .await
        .expect("find")
        .expect("held task")
        .get_object_id("_id")
        .expect("id");
    let (status, body) = dci.post(&format!("/tasks/{held}/cancel"), json!({})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        db.task(held).await.get_i32("status").ok(),
        Some(status::CANCELLED)
    );
    let (status, body) = dci.post("/nodes/n1", json!({"maxthreads": 5})).await;
    assert_eq!(status, 200, "{body}");
    // A dead node is forgotten by the DCI as its own user.
    let dead = db.insert_node("dead", Duration::from_secs(600)).await;
    let (status, body) = dci
        .send(
            reqwest::Method::DELETE,
            &format!("/nodes/{}", dead.to_hex()),
            json!({}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = dci
        .post(
            "/balance",
            json!({"max_tasks": {"* 00:00": 2}, "queues": [["first", "next"]]}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
}

async fn check_least_privilege_against_the_server(db: &TestDb) {
    // Least privilege, checked against the server. Each user first does what it may, so a
    // refusal after is its role's doing, not a failed login. Filters match nothing, so the
    // probes change no data.
    use Op::*;
    let table: [(&str, &[Probe], &[Probe]); 5] = [
        (
            "plugin",
            &[(Insert, "reports")],
            &[(Update, "tasks"), (Find, "tasks")],
        ),
        (
            "disbatch_web",
            &[
                (Find, "tasks"),
                (Update, "tasks"),
                (Remove, "tasks.chunks"),
                (Remove, "nodes"),
            ],
            &[(Drop, "tasks"), (Insert, "leases"), (Update, "attempts")],
        ),
        (
            "task_runner",
            &[
                (Find, "tasks"),
                (Update, "attempts"),
                (Remove, "tasks.chunks"),
            ],
            &[(Remove, "tasks"), (Update, "nodes"), (Drop, "attempts")],
        ),
        (
            "disbatchd",
            &[
                (Find, "tasks"),
                (Update, "attempts"),
                (ListIndexes, "tasks"),
                (Remove, "tasks"),
                (Remove, "attempts"),
            ],
            &[
                (Drop, "tasks"),
                (Insert, "queues"),
                (Remove, "queues"),
                (Remove, "nodes"),
            ],
        ),
        (
            "queuebalance",
            &[(Find, "queues"), (Update, "balance")],
            &[(Find, "nodes"), (Update, "tasks")],
        ),
    ];
    for (user, may, must_not) in table {
        let as_it = as_user(db, user, "e2e").await;
        for &(op, collection) in may {
            let got = probe(&as_it, op, collection).await;
            assert_eq!(got, None, "{user} may {op:?} {collection}");
        }
        for &(op, collection) in must_not {
            let got = probe(&as_it, op, collection).await;
            assert_eq!(
                got,
                Some(UNAUTHORIZED),
                "{user} must not {op:?} {collection}"
            );
        }
    }
    let web = as_user(db, "disbatch_web", "e2e").await;
    assert_eq!(
        code(web.drop().await),
        Some(UNAUTHORIZED),
        "disbatch_web must not drop the database"
    );
}
