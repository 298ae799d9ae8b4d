//! Our claims beside Disbatch 4's count-then-claim, raced hard: clients running Perl's claim
//! loop without its second of sleep share a capped queue with two of our nodes. In the
//! server's order of writes, no claim of ours that ran landed with the queue already at its
//! `threads`: those that could have are given back before their runner starts.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bson::oid::ObjectId;
use bson::{doc, Bson, Document};
use disbatch_model::status;
use disbatch_tests::claim_order::{claim_like_perl, record_changes, replay};
use disbatch_tests::{read_lines, wait_for, write_config, Den, TestDb};
use futures::TryStreamExt;
use serde_json::json;

#[tokio::test]
async fn our_claims_that_land_past_a_perl_claim_are_given_back_unrun() {
    let db = TestDb::new("beside_perl_claims").await;
    let runs = db.path("runs.txt").to_string_lossy().to_string();
    let config = write_config(
        &db,
        "node.json",
        json!({"plugins": {"echo": disbatch_tests::echo_plugin()}}),
    );
    let threads = 6;
    let queue = db.insert_queue("raced", "echo", threads).await;
    let stop = Arc::new(AtomicBool::new(false));
    let stream = db.tasks().watch().await.expect("watch the tasks");
    let recorder = tokio::spawn(record_changes(stream, stop.clone()));
    let batch = |n: usize| -> Vec<Bson> {
        (0..n)
            .map(|_| Bson::from(doc! {"sleep_ms": 40_i64, "append_to": &runs}))
            .collect()
    };
    let mut ids = db.insert_tasks(queue, batch(480)).await;
    // The Perl-like nodes heartbeat before ours starts, as a Perl node already in the fleet
    // does; ours starts claiming before they do, so the race is with a node already claiming.
    for w in 0..2 {
        db.db
            .collection::<Document>("nodes")
            .insert_one(doc! {"node": format!("perl-sim-{w}"), "timestamp": bson::DateTime::now()})
            .await
            .expect("heartbeat");
    }
    let ours = [Den::start(&config, "rust-a"), Den::start(&config, "rust-b")];
    wait_for("a claim by our nodes", Duration::from_secs(60), || async {
        db.count(doc! {"queue": queue, "node": {"$in": ["rust-a", "rust-b"]}})
            .await
            > 0
    })
    .await;
    let perl_stop = Arc::new(AtomicBool::new(false));
    let perl = claim_like_perl(
        db.db.clone(),
        queue,
        threads as u64,
        2,
        Duration::from_millis(40),
        Duration::from_millis(100),
        perl_stop.clone(),
    );
    let batches =
        race_until_a_claim_of_ours_is_given_back(&db, queue, &mut ids, &ours, batch).await;
    println!("{batches} batch(es) of {} tasks in all", ids.len());
    perl_stop.store(true, Ordering::Relaxed);
    let mut perl_claimed = 0;
    for p in perl {
        perl_claimed += p.await.expect("perl-like claimer");
    }
    stop.store(true, Ordering::Relaxed);
    let changes = recorder.await.expect("recorder");

    check_every_task_ran_once_and_ours_succeeded_first_time(&db, queue, &runs, &ids, perl_claimed)
        .await;
    let seen = replay(&changes, &ids.iter().copied().collect(), threads as usize);
    println!("raced beside Perl's claim loop, threads {threads}: {seen:?}");
    assert!(seen.claims_ours > 0 && seen.claims_perl > 0, "{seen:?}");
    assert!(
        seen.claims_ours + seen.claims_perl >= ids.len(),
        "the change stream saw every claim: {seen:?}"
    );
    assert!(
        seen.given_back > 0,
        "the race was run: some claims of ours landed past a Perl claim ({seen:?})"
    );
    assert_eq!(
        seen.ours_past_cap, 0,
        "no claim of ours that ran landed with the queue at its threads: {seen:?}"
    );
    assert!(
        ours.iter()
            .any(|den| den.log_text().contains("gave claims back")),
        "the node says what it gave back"
    );
    drop(ours);
    db.drop().await;
}

async fn race_until_a_claim_of_ours_is_given_back(
    db: &TestDb,
    queue: ObjectId,
    ids: &mut Vec<ObjectId>,
    ours: &[Den],
    batch: impl Fn(usize) -> Vec<Bson>,
) -> usize {
    // How often the race comes up depends on the machine's speed; that it comes up must not:
    // a batch that ends with no claim of ours given back is followed by another, until one
    // is (the replay below then judges every claim of every batch).
    const MAX_BATCHES: usize = 10;
    let mut batches = 1;
    loop {
        db.wait_complete(ids, Duration::from_secs(180)).await;
        let mut given_back = 0.0;
        for den in ours {
            given_back += den
                .metric(r#"disbatch_den_claims_given_back_total{queue="raced"}"#)
                .await;
        }
        if given_back > 0.0 {
            break;
        }
        assert!(
            batches < MAX_BATCHES,
            "{batches} batches of racing gave no claim of ours back"
        );
        ids.extend(db.insert_tasks(queue, batch(120)).await);
        batches += 1;
    }
    batches
}

async fn check_every_task_ran_once_and_ours_succeeded_first_time(
    db: &TestDb,
    queue: ObjectId,
    runs: &str,
    ids: &[ObjectId],
    perl_claimed: usize,
) {
    let tasks: Vec<Document> = db
        .tasks()
        .find(doc! {"queue": queue})
        .await
        .expect("find")
        .try_collect()
        .await
        .expect("tasks");
    let ran_by_ours = read_lines(std::path::Path::new(&runs));
    let distinct: std::collections::BTreeSet<&String> = ran_by_ours.iter().collect();
    assert_eq!(distinct.len(), ran_by_ours.len(), "no task ran twice");
    assert_eq!(ran_by_ours.len() + perl_claimed, ids.len());
    for t in tasks
        .iter()
        .filter(|t| t.get_str("node").is_ok_and(|n| n.starts_with("rust-")))
    {
        assert_eq!(t.get_i32("status").ok(), Some(status::SUCCEEDED), "{t}");
        assert_eq!(
            t.get_i32("attempts").ok(),
            Some(1),
            "a give-back is no attempt: {t}"
        );
    }
}
