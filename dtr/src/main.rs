//! `disbatch-task-runner`: argument parsing and wiring for running one claimed task.

use std::path::PathBuf;

use anyhow::Context;
use bson::oid::ObjectId;
use clap::Parser;
use disbatch_core::config::Config;
use disbatch_core::output::GfsMode;
use disbatch_dtr::connection::LazyStore;
use disbatch_dtr::node_link::{read_handoff, NodeLink};
use disbatch_dtr::runner::{run_handed_off, run_task};
use tokio::signal::unix::{signal, SignalKind};

/// Runs one task claimed by a Disbatch node and records its result.
#[derive(Parser, Debug)]
#[command(name = "disbatch-task-runner", version, about)]
struct Args {
    #[arg(long)]
    config: PathBuf,
    /// The task's id (24 hex digits).
    #[arg(long)]
    task: String,
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
}

// One thread: the plugin's parent-death signal is tied to the thread that spawned it.
#[tokio::main(flavor = "current_thread")]
async fn main() {
    // First: the plugin this runner starts (often of the same user) must not read its
    // environment or memory through /proc, nor inherit what the node left open. The answer
    // pipe is marked too: the runner still takes it (close-on-exec acts only at exec).
    let hardened = disbatch_core::isolation::harden_process();
    disbatch_core::logging::init_logging("info");
    if let Err(e) = hardened {
        tracing::warn!("{e}");
    }
    let code = match run(Args::parse()).await {
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

async fn run(args: Args) -> anyhow::Result<()> {
    // First, before the task starts: SIGUSR1's default action would kill the runner, and the
    // node sends it to point out a cancel request.
    let wake = signal(SignalKind::user_defined1()).context("installing the SIGUSR1 handler")?;
    let task = ObjectId::parse_str(&args.task)
        .map_err(|_| anyhow::anyhow!("--task {:?} is not a task id (24 hex digits)", args.task))?;
    let loaded = Config::load(&args.config)?;
    let mut config = loaded.config;
    if let Some(gfs) = &args.gfs {
        config.gfs = GfsMode::from_config(&serde_json::Value::String(gfs.clone()))
            .map_err(|e| anyhow::anyhow!("--gfs: {e}"))?;
    }
    let node = config.node_name(args.node.as_deref())?;
    // Connected only when something needs the database: a relayed result needs none.
    let store = LazyStore::new(&config);
    let report = if args.handoff {
        let handoff = read_handoff().await.map_err(anyhow::Error::msg)?;
        anyhow::ensure!(
            handoff.task_id() == Some(task),
            "the handoff on stdin is for another task than --task {}",
            args.task
        );
        let mut link = if handoff.relay {
            NodeLink::open()
        } else {
            None
        };
        run_handed_off(&config, &store, handoff, &node, Some(wake), link.as_mut()).await?
    } else {
        run_task(&config, &store, task, &node, Some(wake)).await?
    };
    tracing::debug!(task = %task, ?report, "done");
    Ok(())
}
