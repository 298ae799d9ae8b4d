//! The once-a-second running reading against a real server: per-queue counts, held slots and
//! nodes, and everything the node holds, whichever queue it is in.

use bson::{doc, Bson};
use disbatch_tests::TestDb;

#[tokio::test]
async fn the_running_snapshot_counts_listed_queues_and_all_of_this_nodes_tasks() {
    let db = TestDb::new("store_running").await;
    let store = db.den_store().await;
    let listed = db.insert_queue("listed", "echo", 10).await;
    let other = db.insert_queue("other", "echo", 10).await;
    let params = |n: usize| (0..n).map(|i| Bson::from(doc! {"n": i as i32})).collect();
    let a = db.insert_tasks(listed, params(7)).await;
    let b = db.insert_tasks(other, params(3)).await;
    // listed: claimed by n1 (slot 1), running on n2 (slot 2), running on a Perl node (no
    // slot), done on n1, failed, queued; other: running on n1, running on n2, queued.
    let states = [
        (a[0], doc! {"status": -1, "node": "n1", "slot": 1_i64}),
        (a[1], doc! {"status": 0, "node": "n2", "slot": 2_i64}),
        (a[2], doc! {"status": 0, "node": "perl"}),
        (a[3], doc! {"status": 1, "node": "n1", "slot": 3_i64}),
        (a[4], doc! {"status": 2, "node": "n2"}),
        (b[0], doc! {"status": 0, "node": "n1", "slot": 1_i64}),
        (b[1], doc! {"status": 0, "node": "n2", "slot": 2_i64}),
    ];
    for (id, fields) in states {
        db.set_task(id, fields).await;
    }

    let snap = store
        .claims()
        .running_snapshot("n1", &[listed])
        .await
        .expect("snapshot");
    assert_eq!(
        snap.per_queue.get(&listed),
        Some(&3),
        "claimed and running, any node"
    );
    assert_eq!(
        snap.slots
            .get(&listed)
            .map(|s| s.iter().copied().collect::<Vec<_>>()),
        Some(vec![1, 2]),
        "slots held by claimed and running tasks only"
    );
    let mut nodes = snap.nodes.get(&listed).cloned().unwrap_or_default();
    nodes.sort();
    assert_eq!(nodes, ["n1", "n2", "perl"]);
    assert_eq!(
        snap.on_node, 2,
        "n1's claimed task in listed and running task in other"
    );
    // The unlisted queue shows up only through n1's own task there.
    assert_eq!(snap.per_queue.get(&other), Some(&1));

    let none = store
        .claims()
        .running_snapshot("n3", &[])
        .await
        .expect("snapshot");
    assert_eq!(none.on_node, 0);
    assert!(none.per_queue.is_empty(), "{none:?}");

    let all = store
        .claims()
        .running_snapshot("n3", &[listed, other])
        .await
        .expect("snapshot");
    assert_eq!(all.per_queue.get(&other), Some(&2));
    assert_eq!(all.on_node, 0);
    db.drop().await;
}
