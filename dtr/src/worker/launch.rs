//! Lends one attempt a persistent worker of its queue (an idle one, or one started for it),
//! sends it the task, and reads how the task ended from `done` or from how the worker died.

use std::time::Duration;

use bson::{Bson, Document};
use disbatch_model::run_policy::OnLost;
use disbatch_store::{Error, Result};
use serde_json::{Map, Value};

use super::message::TaskEnd;
use super::pool::{Key, Lent, Pool};
use super::process::{describe, Worker};
use crate::attempt::{Ending, Run};
use crate::launch::{plugin_env, Launch, Started};
use crate::outcome::Exit;
use crate::prepare::Prepared;
use crate::record::Spool;
use crate::spool::SpoolPaths;
use crate::supervisor::{Stopped, Supervised};

/// Lends the attempt a worker of this worker host's pool.
pub(crate) struct LendWorker<'a>(pub &'a Pool);

/// A lent worker running the attempt's task.
pub(crate) struct InWorker {
    lent: Lent,
    paths: SpoolPaths,
    grace: Duration,
}

impl InWorker {
    fn worker(&mut self) -> std::io::Result<&mut Worker> {
        self.lent
            .worker()
            .ok_or_else(|| std::io::Error::other("a lent worker is missing"))
    }
}

impl Launch for LendWorker<'_> {
    type Started = InWorker;

    async fn launch(
        self,
        task: &Document,
        prepared: &Prepared,
        run: &Run<'_>,
    ) -> Result<std::result::Result<InWorker, String>> {
        let pool = self.0;
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
                match Worker::start(&prepared.executable, run.config, start, grace).await {
                    Ok(w) => pool.lend_new(&key, w, prepared.worker, grace),
                    Err(reason) => return Ok(Err(reason)),
                }
            }
        };
        let Some(worker) = lent.worker() else {
            return Err(Error::Invalid("a lent worker is missing".into()));
        };
        let task_json = Bson::Document(task.clone()).into_relaxed_extjson();
        let env: Map<String, Value> = plugin_env(run, prepared)
            .into_iter()
            .map(|(name, value)| (name.to_string(), Value::String(value)))
            .collect();
        worker
            .begin(task_json, env, &run.attempt.to_hex())
            .await
            .map_err(|e| Error::io("emptying the worker's output files", e))?;
        let paths = worker.paths.clone();
        Ok(Ok(InWorker { lent, paths, grace }))
    }
}

impl Supervised for InWorker {
    async fn wait(&mut self) -> std::io::Result<Exit> {
        let grace = self.grace;
        self.worker()?.wait_task(grace).await
    }

    async fn stop(&mut self, grace: Duration) -> std::io::Result<Exit> {
        self.worker()?.stop(grace).await
    }
}

impl Started for InWorker {
    const WAITING: &'static str = "waiting for the worker";

    fn paths(&self) -> &SpoolPaths {
        &self.paths
    }

    async fn ending(&mut self, stopped: Stopped, prepared: &Prepared, run: &Run<'_>) -> Ending {
        let task = run.task;
        let mut ending = Ending {
            stopped,
            result: None,
            refused: None,
            lead: None,
            requeue: false,
        };
        match self.lent.worker().and_then(|w| w.ended.clone()) {
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
        ending
    }

    fn into_spool(self) -> Spool {
        Spool::Worker(Box::new(self.lent))
    }
}
