//! What the fleet's shared documents say: the maintenance leader's lease, and the runners a
//! node's heartbeat lists.

use std::time::Duration;

use bson::oid::ObjectId;
use bson::{doc, DateTime, Document};
use nix::unistd::Pid;

use super::{wait_for, TestDb};

/// The maintenance leader while its lease runs (by this host's clock), and when that lease
/// ends (ms).
pub async fn leader_lease(db: &TestDb) -> Option<(String, i64)> {
    let lease = db
        .db
        .collection::<Document>("leases")
        .find_one(doc! {"_id": "maintenance"})
        .await
        .expect("lease")?;
    let until = lease.get_datetime("until").ok()?.timestamp_millis();
    let owner = lease.get_str("owner").ok()?.to_string();
    (until > DateTime::now().timestamp_millis()).then_some((owner, until))
}

/// The maintenance leader while its lease runs.
pub async fn leader(db: &TestDb) -> Option<String> {
    leader_lease(db).await.map(|(owner, _)| owner)
}

/// The maintenance leader once there is one other than `not`, waiting up to `timeout`.
pub async fn wait_leader(db: &TestDb, not: Option<&str>, timeout: Duration) -> String {
    let what = if not.is_some() {
        "a new maintenance leader"
    } else {
        "a maintenance leader"
    };
    let found = std::cell::RefCell::new(None);
    wait_for(what, timeout, || async {
        let l = leader(db).await.filter(|l| Some(l.as_str()) != not);
        let some = l.is_some();
        *found.borrow_mut() = l;
        some
    })
    .await;
    found.into_inner().expect("a leader")
}

/// The pid of the runner `node`'s heartbeat lists for `task`, if it lists one now.
pub async fn runner_of(db: &TestDb, node: &str, task: ObjectId) -> Option<Pid> {
    let node = db
        .db
        .collection::<Document>("nodes")
        .find_one(doc! {"node": node})
        .await
        .ok()??;
    node.get_array("runners").ok()?.iter().find_map(|r| {
        let r = r.as_document()?;
        let pid = r.get_i64("pid").ok()?;
        (r.get_object_id("task").ok()? == task).then(|| Pid::from_raw(pid as i32))
    })
}

/// The pid of `node`'s runner of `task` once its heartbeat lists one (a positive pid), waiting
/// up to 60 s; `node`'s document must exist.
pub async fn wait_runner_of(db: &TestDb, node: &str, task: ObjectId) -> Pid {
    let found = || async {
        let n = db.node(node).await;
        n.get_array("runners").ok().and_then(|runners| {
            runners.iter().find_map(|r| {
                let r = r.as_document()?;
                let pid = r.get_i64("pid").ok().and_then(|p| i32::try_from(p).ok())?;
                (r.get_object_id("task").ok() == Some(task) && pid > 0).then_some(pid)
            })
        })
    };
    wait_for(
        "the runner on the heartbeat",
        Duration::from_secs(60),
        || async { found().await.is_some() },
    )
    .await;
    Pid::from_raw(found().await.expect("a runner's pid"))
}
