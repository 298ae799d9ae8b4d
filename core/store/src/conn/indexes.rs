//! The indexes the store makes: Disbatch 4's, ours, and those made when a feature is first
//! used.

use bson::doc;
use mongodb::options::IndexOptions;
use mongodb::IndexModel;

use disbatch_model::schema::*;

/// Disbatch 4's indexes, exactly (its `ensure_indexes`), by collection.
pub fn disbatch_indexes() -> Vec<(&'static str, IndexModel)> {
    let plain = |keys| IndexModel::builder().keys(keys).build();
    let unique = |keys| {
        IndexModel::builder()
            .keys(keys)
            .options(IndexOptions::builder().unique(true).build())
            .build()
    };
    vec![
        (TASKS, plain(doc! {"node": 1, "status": 1, "queue": 1})),
        (
            TASKS,
            plain(doc! {"node": 1, "status": 1, "queue": 1, "_id": 1}),
        ),
        (
            TASKS,
            plain(doc! {"node": 1, "status": 1, "queue": 1, "_id": -1}),
        ),
        (TASKS, plain(doc! {"queue": 1, "status": 1})),
        (QUEUES, unique(doc! {"name": 1})),
        (NODES, unique(doc! {"node": 1})),
        (CHUNKS, unique(doc! {"files_id": 1, "n": 1})),
        (FILES, plain(doc! {"filename": 1, "metadata.task_id": 1})),
    ]
}

/// Workflows' indexes on tasks, made with the first task that waits or the first graph or
/// batch (`LimitIndex::Workflows`), not at start, for the same reason as the limits' below:
/// a task's dependents by what they still wait for, tasks whose end is still to settle, a
/// graph's and a batch's tasks. Each read touches only its own tasks.
pub fn workflow_indexes() -> Vec<IndexModel> {
    [
        task::WAITING_ON,
        task::HAS_DEPENDENTS,
        task::GRAPH,
        task::BATCH,
    ]
    .into_iter()
    .map(|field| {
        IndexModel::builder()
            .keys(doc! {field: 1})
            .options(IndexOptions::builder().sparse(true).build())
            .build()
    })
    .collect()
}

/// The name the server gives the index that shows workflows are in use (`has_dependents_1`).
pub fn workflows_index_name() -> String {
    format!("{}_1", task::HAS_DEPENDENTS)
}

/// The flow limits' unique indexes on tasks, each made when a queue first uses its limit
/// (`Store::ensure_limit_index`), not at start: SecantusDB keeps every index on every write,
/// and a fleet that sets no limit pays nothing for them. The unique tasks' index first (over a key's
/// generations, never freed by an update: SecantusDB 0.5.3 keeps an inserted document's entry
/// after `$unset`), then the key slots' (two running tasks of one key never hold one slot).
pub fn limit_indexes() -> [IndexModel; 2] {
    let unique = IndexModel::builder()
        .keys(doc! {task::QUEUE: 1, task::UNIQUE_KEY: 1, task::UNIQUE_GEN: 1})
        .options(
            IndexOptions::builder()
                .name("queue_1_unique_key_1_unique_gen_1".to_string())
                .unique(true)
                .partial_filter_expression(doc! {task::UNIQUE_KEY: {"$exists": true}})
                .build(),
        )
        .build();
    let key_slots = IndexModel::builder()
        .keys(doc! {task::QUEUE: 1, task::CONCURRENCY_KEY: 1, task::CONCURRENCY_SLOT: 1})
        .options(
            IndexOptions::builder()
                .name("queue_1_concurrency_key_1_concurrency_slot_1".to_string())
                .unique(true)
                .partial_filter_expression(doc! {task::CONCURRENCY_SLOT: {"$exists": true}})
                .build(),
        )
        .build();
    [unique, key_slots]
}

/// The cron schedules' index: a tick is enqueued once per queue, whichever leader tries.
/// Made by the leader before its first scheduled task (`Store::ensure_schedule_index`), not at
/// start, so a fleet without schedules pays nothing for it on every task write.
pub fn schedule_index() -> IndexModel {
    IndexModel::builder()
        .keys(doc! {task::QUEUE: 1, task::SCHEDULE_TICK: 1})
        .options(
            IndexOptions::builder()
                .name("queue_1_schedule_tick_1".to_string())
                .unique(true)
                .partial_filter_expression(doc! {task::SCHEDULE_TICK: {"$exists": true}})
                .build(),
        )
        .build()
}

/// Our additional indexes, both unique among the tasks that carry the field: the slot index
/// makes a queue's `threads` hold across nodes (two claims never hold one slot), the key index
/// makes a work unit's key unique within its queue.
pub fn our_indexes() -> Vec<(&'static str, IndexModel)> {
    let unrecorded_key = unrecorded_field(unrecorded::ATTEMPT);
    let unique_where_present = |field: &str| {
        IndexModel::builder()
            .keys(doc! {task::QUEUE: 1, field: 1})
            .options(
                IndexOptions::builder()
                    .name(format!("queue_1_{field}_1"))
                    .unique(true)
                    .partial_filter_expression(doc! {field: {"$exists": true}})
                    .build(),
            )
            .build()
    };
    vec![
        (TASKS, unique_where_present(task::SLOT)),
        (TASKS, unique_where_present(task::KEY)),
        (
            RATE_LIMITS,
            IndexModel::builder()
                .keys(doc! {rate::QUEUE: 1, rate::UNTIL: 1})
                .build(),
        ),
        // Only delayed (and once-delayed) tasks carry `not_before`: counting the delayed ones
        // of a queue reads just those, not its backlog.
        (
            TASKS,
            IndexModel::builder()
                .keys(doc! {task::QUEUE: 1, task::NOT_BEFORE: 1})
                .options(
                    IndexOptions::builder()
                        .name("queue_1_not_before_1".to_string())
                        .partial_filter_expression(doc! {task::NOT_BEFORE: {"$exists": true}})
                        .build(),
                )
                .build(),
        ),
        // Only discarded tasks carry `discarded_at`: a queue's discards are counted and listed
        // without reading its other ended tasks.
        (
            TASKS,
            IndexModel::builder()
                .keys(doc! {task::QUEUE: 1, task::DISCARDED_AT: 1})
                .options(
                    IndexOptions::builder()
                        .name("queue_1_discarded_at_1".to_string())
                        .partial_filter_expression(doc! {task::DISCARDED_AT: {"$exists": true}})
                        .build(),
                )
                .build(),
        ),
        // Only failed tasks (status >= 2) are in it: the fleet's newest failures are listed,
        // and `status: "failed"` searched, without reading the succeeded ones.
        (
            TASKS,
            IndexModel::builder()
                .keys(doc! {task::MTIME: -1})
                .options(
                    IndexOptions::builder()
                        .name(FAILURES_INDEX.to_string())
                        .partial_filter_expression(
                            doc! {task::STATUS: {"$gte": disbatch_model::status::FAILED}},
                        )
                        .build(),
                )
                .build(),
        ),
        // Only claimed and running tasks carry a lease, so recovery scans just those.
        (
            TASKS,
            IndexModel::builder()
                .keys(doc! {task::LEASE_UNTIL: 1})
                .options(IndexOptions::builder().sparse(true).build())
                .build(),
        ),
        (
            ATTEMPTS,
            IndexModel::builder()
                .keys(doc! {attempt::TASK: 1, attempt::START: 1})
                .build(),
        ),
        // Only a task whose lost attempt's record is still to be written carries the field,
        // for the moment between two writes (or after a crash between them): the leader's
        // look for such tasks each pass reads just those.
        (
            TASKS,
            IndexModel::builder()
                .keys(doc! {unrecorded_key: 1})
                .options(IndexOptions::builder().sparse(true).build())
                .build(),
        ),
    ]
}

/// The failures index: `{mtime: -1}` over failed tasks alone.
pub(crate) const FAILURES_INDEX: &str = "mtime_-1_failed";

/// The statistics' indexes: one document per minute and queue, whoever writes it (a leader
/// change never writes a minute twice), and the TTL that bounds the collection.
pub fn stats_indexes() -> Vec<(&'static str, IndexModel)> {
    vec![
        (
            STATS_MINUTELY,
            IndexModel::builder()
                .keys(doc! {stats::MINUTE: 1, stats::QUEUE: 1})
                .options(IndexOptions::builder().unique(true).build())
                .build(),
        ),
        (
            STATS_MINUTELY,
            IndexModel::builder()
                .keys(doc! {stats::MINUTE: 1})
                .options(
                    IndexOptions::builder()
                        .expire_after(STATS_RETENTION)
                        .build(),
                )
                .build(),
        ),
        // The keeper reads the attempts that ended in a minute; records are written when an
        // attempt ends, so every record carries `end` and the index costs one key each.
        (
            ATTEMPTS,
            IndexModel::builder().keys(doc! {attempt::END: 1}).build(),
        ),
    ]
}
