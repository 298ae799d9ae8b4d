//! Runs one task in a persistent worker of its queue: lends an idle worker (or starts one),
//! sends the task, supervises it as a process task is (lease, timeout, cancel), and reads the
//! outcome from `done` or from how the worker died.

use std::time::Duration;

use bson::{Bson, Document};
use disbatch_model::run_policy::OnLost;
use disbatch_store::{Error, Result};
use serde_json::{Map, Value};

use super::message::TaskEnd;
use super::pool::{Key, Lent, Pool};
use super::process::{describe, Worker};
use crate::attempt::{Ran, Run};
use crate::capture::{conclude, lease_lost, unable_to_start, Ending};
use crate::outcome::Exit;
use crate::prepare::Prepared;
use crate::record::Spool;
use crate::supervisor::{supervise, Stopped, Supervised, Wake};

/// A worker running one task, as the supervisor sees it.
struct InWorker<'a> {
    worker: &'a mut Worker,
    grace: Duration,
}

impl Supervised for InWorker<'_> {
    async fn wait(&mut self) -> std::io::Result<Exit> {
        self.worker.wait_task(self.grace).await
    }

    async fn stop(&mut self, grace: Duration) -> std::io::Result<Exit> {
        self.worker.stop(grace).await
    }
}

pub(crate) async fn run_in_worker(
    doc: &Document,
    prepared: Prepared,
    run: &Run<'_>,
    pool: &Pool,
    wake: Option<Wake>,
) -> Result<Ran> {
    let Run {
        store,
        config,
        task,
        attempt,
        node,
        ..
    } = *run;
    let grace = prepared.run.kill_grace;
    let key = Key {
        queue: prepared.queue_id,
        executable: prepared.executable.clone(),
    };
    let mut lent: Lent = match pool.take_idle(&key, prepared.worker, grace) {
        Some(lent) => lent,
        None => {
            // Never longer than the task may run in all.
            let start = prepared
                .run
                .timeout
                .map_or(prepared.worker.start, |t| t.min(prepared.worker.start));
            match Worker::start(&prepared.executable, config, start, grace).await {
                Ok(w) => pool.lend_new(&key, w, prepared.worker, grace),
                Err(reason) => return Ok(unable_to_start(run, reason)),
            }
        }
    };
    let Some(worker) = lent.worker() else {
        return Err(Error::Invalid("a lent worker is missing".into()));
    };
    let task_json = Bson::Document(doc.clone()).into_relaxed_extjson();
    let mut env = Map::new();
    let mut fact = |k: &str, v: String| {
        env.insert(k.to_string(), Value::String(v));
    };
    fact("DISBATCH_TASK_ID", task.to_hex());
    fact("DISBATCH_ATTEMPT", attempt.to_hex());
    fact("DISBATCH_QUEUE", prepared.queue_name.clone());
    fact("DISBATCH_QUEUE_ID", prepared.queue_id.to_hex());
    fact("DISBATCH_NODE", node.to_string());
    if let Some(c) = &prepared.config_json {
        fact("DISBATCH_QUEUE_CONFIG", c.clone());
    }
    worker
        .begin(task_json, env, &attempt.to_hex())
        .await
        .map_err(|e| Error::io("emptying the worker's output files", e))?;
    let paths = worker.paths.clone();
    let doc_len = bson::to_vec(doc).map_or(u64::MAX, |v| v.len() as u64);
    let live = crate::live::has_room(doc_len).then(|| {
        let paths = paths.clone();
        // The host is connected (it stores results): it writes copies itself.
        tokio::spawn(crate::live::keep_live(
            store.clone(),
            None,
            task,
            attempt,
            paths,
        ))
    });
    let stopped = {
        let mut in_worker = InWorker { worker, grace };
        supervise(store, task, attempt, prepared.run, &mut in_worker, wake).await
    };
    if let Some(live) = live {
        live.abort();
    }
    let stopped = stopped.map_err(|e| Error::io("waiting for the worker", e))?;
    if let Stopped::LeaseLost(e) = stopped {
        return Ok(Ran::LeaseLost(lease_lost(e, stopped)));
    }
    let ended = lent.worker().and_then(|w| w.ended.clone());
    let mut ending = Ending {
        stopped,
        result: None,
        refused: None,
        lead: None,
        requeue: false,
    };
    match ended {
        Some(TaskEnd::Done { result, .. }) => ending.result = result,
        Some(TaskEnd::Died(exit)) => {
            let requeue = prepared.run.on_lost == OnLost::Requeue;
            tracing::warn!(task = %task, "the worker died while running the task ({})", describe(Ok(exit)));
            ending.lead = Some(format!(
                "the worker running this task died{}",
                if requeue {
                    "; requeued (on_lost: requeue)"
                } else {
                    ""
                }
            ));
            ending.requeue = requeue;
        }
        Some(TaskEnd::ProtocolError(why, _)) => {
            tracing::warn!(task = %task, "worker protocol error: {}", disbatch_model::text::printable::escape(&why));
            ending.lead = Some(format!("worker protocol error: {why}"));
        }
        // Stopped by the supervisor (timeout, cancel): the stop says why.
        None => {}
    }
    conclude(
        run,
        &prepared,
        ending,
        &paths,
        Spool::Worker(Box::new(lent)),
    )
    .await
}
