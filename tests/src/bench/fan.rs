//! The workflow bench's backlog: one task fanning out to the rest, which fan in to one.

use bson::oid::ObjectId;
use bson::Document;
use disbatch_store::GraphTask;

use crate::harness::TestDb;

/// Stores a graph of `n` tasks (at least 3) on `queue` through the DCI's own path: a root,
/// `n - 2` tasks waiting on it, and a merge waiting on all of those.
pub async fn enqueue_fan(db: &TestDb, queue: ObjectId, n: usize) -> anyhow::Result<()> {
    let n = n.max(3);
    let store = db.den_store().await;
    let task = |name: String, waits_for: Vec<usize>| GraphTask {
        name,
        queue,
        params: Document::new(),
        waits_for,
        existing: Vec::new(),
        on_failure: None,
    };
    let mut tasks = vec![task("root".into(), vec![])];
    tasks.extend((1..n - 1).map(|i| task(format!("t{i}"), vec![0])));
    tasks.push(task("merge".into(), (1..n - 1).collect()));
    store.workflows().create_graph(&tasks).await?;
    Ok(())
}
