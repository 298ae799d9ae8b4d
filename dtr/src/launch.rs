//! The attempt's one path from start to end: launches its plugin (a process of its own, or
//! a persistent worker a worker host lends), supervises it, and concludes how it ended.

use std::future::Future;

use bson::{Bson, Document};
use disbatch_store::{Error, Result};

use crate::attempt::{Ending, Ran, Run};
use crate::conclude::{conclude, lease_lost, unable_to_start};
use crate::plugin_process::{start_plugin, PluginCall, PluginProcess};
use crate::prepare::Prepared;
use crate::record::Spool;
use crate::spool::{read_result, ResultFile, SpoolPaths};
use crate::supervisor::{supervise, Stopped, Supervised, Wake};

/// What starts an attempt's plugin.
pub(crate) trait Launch {
    type Started: Started;
    /// Starts the plugin on `task`. `Ok(Err(reason))`: it could not start, and the task
    /// fails with the reason as its stderr.
    fn launch(
        self,
        task: &Document,
        prepared: &Prepared,
        run: &Run<'_>,
    ) -> impl Future<Output = Result<std::result::Result<Self::Started, String>>>;
}

/// A plugin started on the attempt, as its supervisor and `conclude` see it.
pub(crate) trait Started: Supervised {
    /// What the supervisor waits for, as an error names it.
    const WAITING: &'static str;
    /// Where its output goes.
    fn paths(&self) -> &SpoolPaths;
    /// What it said of its end (a result, a protocol error), once the supervisor saw it stop.
    fn ending(
        &mut self,
        stopped: Stopped,
        prepared: &Prepared,
        run: &Run<'_>,
    ) -> impl Future<Output = Ending>;
    /// What holds its output until the result is written.
    fn into_spool(self) -> Spool;
}

/// Runs the attempt's plugin to its end: started by `launch`, supervised (lease, timeout,
/// cancel) with its output copied live beside it, and concluded into the task's end.
pub(crate) async fn run_plugin<L: Launch>(
    launch: L,
    doc: &Document,
    prepared: Prepared,
    run: &Run<'_>,
    wake: Option<Wake>,
) -> Result<Ran> {
    let Run {
        store,
        task,
        attempt,
        ..
    } = *run;
    let mut started = match launch.launch(doc, &prepared, run).await? {
        Ok(started) => started,
        Err(reason) => return Ok(unable_to_start(run, reason)),
    };
    let paths = started.paths().clone();
    // The output so far, for watching, beside the plugin; stopped before the result is
    // recorded (whose write unsets the copy), so it never outlives the run.
    let doc_len = bson::to_vec(doc).map_or(u64::MAX, |v| v.len() as u64);
    let live = crate::live::has_room(doc_len).then(|| {
        let relay = run.live_relay.cloned();
        let paths = paths.clone();
        tokio::spawn(crate::live::keep_live(
            store.clone(),
            relay,
            task,
            attempt,
            paths,
        ))
    });
    let stopped = supervise(store, task, attempt, prepared.run, &mut started, wake).await;
    if let Some(live) = live {
        live.abort();
    }
    let stopped = stopped.map_err(|e| Error::io(L::Started::WAITING, e))?;
    if let Stopped::LeaseLost(e) = stopped {
        return Ok(Ran::LeaseLost(lease_lost(e, stopped)));
    }
    let ending = started.ending(stopped, &prepared, run).await;
    conclude(run, &prepared, ending, &paths, started.into_spool()).await
}

/// The `DISBATCH_*` variables that tell a plugin which attempt it runs, of which task and
/// queue, on which node; a process plugin also gets `DISBATCH_RESULT`, its result file.
pub(crate) fn plugin_env(run: &Run<'_>, prepared: &Prepared) -> Vec<(&'static str, String)> {
    let mut vars = vec![
        ("DISBATCH_TASK_ID", run.task.to_hex()),
        ("DISBATCH_ATTEMPT", run.attempt.to_hex()),
        ("DISBATCH_QUEUE", prepared.queue_name.clone()),
        ("DISBATCH_QUEUE_ID", prepared.queue_id.to_hex()),
        ("DISBATCH_NODE", run.node.to_string()),
    ];
    if let Some(config) = &prepared.config_json {
        vars.push(("DISBATCH_QUEUE_CONFIG", config.clone()));
    }
    vars
}

/// Starts the plugin as a process of its own, in a spool directory of its own.
pub(crate) struct NewProcess;

/// A plugin process running the attempt, and the directory its output is spooled to.
pub(crate) struct ProcessRun {
    plugin: PluginProcess,
    spool: tempfile::TempDir,
}

impl Launch for NewProcess {
    type Started = ProcessRun;

    async fn launch(
        self,
        task: &Document,
        prepared: &Prepared,
        run: &Run<'_>,
    ) -> Result<std::result::Result<ProcessRun, String>> {
        let spool = tempfile::Builder::new()
            .prefix(&format!("disbatch-task-{}-", run.task))
            .tempdir()
            .map_err(|e| Error::io("creating the output spool directory", e))?;
        let task_json = serde_json::to_vec(&Bson::Document(task.clone()).into_relaxed_extjson())
            .map_err(|e| Error::Invalid(format!("encoding task {} as JSON: {e}", run.task)))?;
        let call = PluginCall {
            executable: &prepared.executable,
            task_json,
            vars: plugin_env(run, prepared),
            env: &run.config.plugin_env,
            user: run.config.plugin_user.as_ref(),
        };
        Ok(match start_plugin(call, spool.path()) {
            Ok(plugin) => Ok(ProcessRun { plugin, spool }),
            Err(e) => Err(format!(
                "could not start plugin {}: {e}",
                prepared.executable.display()
            )),
        })
    }
}

impl Supervised for ProcessRun {
    async fn wait(&mut self) -> std::io::Result<crate::outcome::Exit> {
        self.plugin.wait().await
    }

    async fn stop(&mut self, grace: std::time::Duration) -> std::io::Result<crate::outcome::Exit> {
        self.plugin.stop(grace).await
    }
}

impl Started for ProcessRun {
    const WAITING: &'static str = "waiting for the plugin";

    fn paths(&self) -> &SpoolPaths {
        &self.plugin.paths
    }

    async fn ending(&mut self, stopped: Stopped, _: &Prepared, _: &Run<'_>) -> Ending {
        let (result, refused) = match read_result(&self.plugin.paths.result).await {
            ResultFile::Missing => (None, None),
            ResultFile::Written(bytes) => (Some(bytes), None),
            ResultFile::Refused(why) => (None, Some(why)),
        };
        Ending {
            stopped,
            result,
            refused,
            lead: None,
            requeue: false,
        }
    }

    fn into_spool(self) -> Spool {
        Spool::Dir(self.spool)
    }
}
