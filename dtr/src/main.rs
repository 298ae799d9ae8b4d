//! `disbatch-task-runner`: argument parsing and wiring for running one claimed task.

use std::path::PathBuf;

use anyhow::Context;
use bson::oid::ObjectId;
use clap::Parser;
use disbatch_config::Config;
use disbatch_dtr::connection::LazyStore;
use disbatch_dtr::node_link::{read_handoff, NodeLink};
use disbatch_dtr::runner::{run_handed_off, run_task};
use disbatch_dtr::sink::ResultSink;
use disbatch_dtr::supervisor::Wake;
use disbatch_model::output::GfsMode;
use tokio::signal::unix::{signal, SignalKind};

/// Runs one task claimed by a Disbatch node and records its result.
#[derive(Parser, Debug)]
#[command(name = "disbatch-task-runner", version = disbatch_model::LONG_VERSION, about)]
struct Args {
    #[arg(long)]
    config: PathBuf,
    /// The task's id (24 hex digits).
    #[arg(long, required_unless_present = "worker_host")]
    task: Option<String>,
    /// The node that claimed the task; default: the config's `node`, then the hostname.
    #[arg(long)]
    node: Option<String>,
    /// Overrides the config's `gfs` (Disbatch passes `--gfs auto` or `--gfs 1`).
    #[arg(long)]
    gfs: Option<String>,
    /// The node already claimed the task as a running attempt and writes it, its attempt and
    /// its queue to stdin (BSON); the runner then reads nothing from the database first.
    #[arg(long)]
    handoff: bool,
    /// Serve the node's persistent-queue tasks in long-lived workers (plugins/PROTOCOL.md):
    /// handoffs stream in on stdin until it closes; ended tasks are reported on stdout.
    #[arg(long, conflicts_with_all = ["task", "handoff"])]
    worker_host: bool,
}

// One thread: the plugin's parent-death signal is tied to the thread that spawned it.
#[tokio::main(flavor = "current_thread")]
async fn main() {
    // First: the plugin this runner starts (often of the same user) must not read its
    // environment or memory through /proc, nor inherit what the node left open. The answer
    // pipe is marked too: the runner still takes it (close-on-exec acts only at exec).
    let hardened = disbatch_config::process::isolation::harden_process();
    // The node's format: the runner's lines go to the node's stderr, among its own.
    let format = std::env::var(disbatch_config::process::logging::LOG_FORMAT_ENV)
        .ok()
        .and_then(|f| f.parse().ok())
        .unwrap_or_default();
    let logging = disbatch_config::process::logging::init(format, "info");
    if let Err(e) = hardened {
        tracing::warn!("{e}");
    }
    let code = match run(Args::parse(), logging).await {
        Ok(()) => 0,
        Err(e) => {
            tracing::error!("task runner failed: {e:#}");
            1
        }
    };
    // Exit here: a read of the node's pipe that timed out still waits on a blocking thread,
    // and the runtime would wait for it on the way out.
    std::process::exit(code)
}

async fn run(
    args: Args,
    logging: disbatch_config::process::logging::Logging,
) -> anyhow::Result<()> {
    // First, before the task starts: SIGUSR1's default action would kill the runner, and the
    // node sends it to point out a cancel request.
    let wake = signal(SignalKind::user_defined1()).context("installing the SIGUSR1 handler")?;
    let loaded = load_config(&args.config)?;
    let mut config = loaded.config;
    if let Some(level) = &config.log_level {
        // Checked with the config; RUST_LOG, passed on by the node, still wins.
        let _ = logging.set_level(Some(level), "info");
    }
    if let Some(gfs) = &args.gfs {
        config.gfs = GfsMode::from_config(&serde_json::Value::String(gfs.clone()))
            .map_err(|e| anyhow::anyhow!("--gfs: {e}"))?;
    }
    let node = config.node_name(args.node.as_deref())?;
    // Connected only when something needs the database: a relayed result needs none.
    let store = LazyStore::new(&config);
    if args.worker_host {
        disbatch_dtr::worker::host::serve(config, store, node).await;
        return Ok(());
    }
    let given = args.task.unwrap_or_default();
    let task = ObjectId::parse_str(&given)
        .map_err(|_| anyhow::anyhow!("--task {given:?} is not a task id (24 hex digits)"))?;
    let report = if args.handoff {
        let handoff = read_handoff().await.map_err(anyhow::Error::msg)?;
        // The node's reading of the server's clock: this runner's times are the fleet's.
        if let Some(anchor) = handoff.clock {
            disbatch_model::fleet_time::adopt(anchor);
        }
        anyhow::ensure!(
            handoff.task_id() == task,
            "the handoff on stdin is for another task than --task {given}"
        );
        let mut link = if handoff.relay {
            NodeLink::open()
        } else {
            None
        };
        let sink = match link.as_mut() {
            Some(link) => ResultSink::Node(link),
            None => ResultSink::Direct,
        };
        let wake = Some(Wake::Signal(wake));
        run_handed_off(&config, &store, handoff, &node, wake, sink, None).await?
    } else {
        run_task(&config, &store, task, &node, Some(Wake::Signal(wake))).await?
    };
    tracing::debug!(task = %task, ?report, "done");
    Ok(())
}

/// The config the node accepted when it says where its copy is (an edit of the file that a
/// reload refused must not reach new tasks), else the `--config` file. Relative paths in
/// either resolve against the `--config` file's directory.
fn load_config(path: &std::path::Path) -> anyhow::Result<disbatch_config::Loaded> {
    if let Some(copy) = std::env::var_os(disbatch_config::ACCEPTED_CONFIG_ENV) {
        match std::fs::read_to_string(&copy) {
            Ok(text) => return Ok(Config::parse(path, &text)?),
            // The node stopped and removed it: the file is the best there is.
            Err(e) => {
                tracing::debug!(copy = ?copy, error = %e, "the node's config copy is gone; reading --config")
            }
        }
    }
    Ok(Config::load(path)?)
}
