//! Mixed versions of the `disbatchd` role: one made before the maintenance leader's stream
//! on the database still runs a fleet, with a stream on `queues` and the insert probe.

use std::time::Duration;

use bson::doc;
use disbatch_tests::{wait_for, write_config, Den};
use serde_json::json;

use super::mongo_users::{auth_db, create_users, has, passwords, privileges, text, ROOT_PASSWORD};

/// A `disbatchd` role made before the leader's stream on the database (`changeStream` on
/// `queues` alone): the leader says so, watches queues, its probe signals a task another
/// writer inserts, and such a task still starts.
#[tokio::test]
async fn a_den_role_without_the_database_stream_watches_queues_and_probes_for_inserts() {
    let db = auth_db("oldrole").await;
    let config = write_config(
        &db,
        "node.json",
        json!({"auth": passwords("oldrole"), "loop_interval_ms": 500}),
    );
    let out = create_users(&config, &[], ROOT_PASSWORD);
    assert!(out.status.success(), "{}", text(&out));
    db.db
        .run_command(doc! {
            "revokePrivilegesFromRole": "disbatchd",
            "privileges": [{"resource": {"db": &db.name, "collection": ""}, "actions": ["changeStream"]}],
        })
        .await
        .expect("revoke the database stream");
    let den_role = privileges(&db, "disbatchd").await;
    assert!(!has(&den_role, "", "changeStream") && has(&den_role, "queues", "changeStream"));
    let queue = db.insert_queue("q", "echo", 2).await;
    // Open, but for a plugin only other nodes have: its task stays queued until the probe
    // reads it, whatever this node's own passes do, so the signal is the probe's.
    let elsewhere = db.insert_queue("elsewhere", "not-on-this-node", 2).await;
    let den = Den::start(&config, "n1");
    wait_for(
        "the queues-only stream",
        Duration::from_secs(60),
        || async {
            den.log_text().contains("watching queues only")
                && den.metric("disbatch_den_change_streams_open").await == 1.0
        },
    )
    .await;
    db.insert_tasks(elsewhere, vec![doc! {}.into()]).await;
    wait_for(
        "the probe to signal the inserted task",
        Duration::from_secs(60),
        || async {
            den.metric("disbatch_den_outside_inserts_signalled_total")
                .await
                >= 1.0
        },
    )
    .await;
    // A task this node can run starts, found by the probe or by the node's own reading.
    let id = db.insert_tasks(queue, vec![doc! {}.into()]).await[0];
    db.wait_complete(&[id], Duration::from_secs(60)).await;
    drop(den);
    db.drop().await;
}
