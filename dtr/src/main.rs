//! `disbatch-task-runner`: argument parsing and wiring for running one claimed task.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use bson::oid::ObjectId;
use clap::Parser;
use disbatch_core::config::{Component, Config};
use disbatch_core::handoff::Handoff;
use disbatch_core::output::GfsMode;
use disbatch_core::store::Store;
use disbatch_dtr::runner::{run_handed_off, run_task};
use tokio::signal::unix::{signal, SignalKind};

/// Runs one task claimed by a Disbatch node and records its result.
#[derive(Parser, Debug)]
#[command(version, about)]
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
async fn main() -> ExitCode {
    disbatch_core::logging::init_logging("info");
    match run(Args::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("task runner failed: {e:#}");
            ExitCode::FAILURE
        }
    }
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
    let store = Store::connect(&config, Component::TaskRunner).await?;
    let report = if args.handoff {
        let handoff = read_handoff().await?;
        anyhow::ensure!(
            handoff.task_id() == Some(task),
            "the handoff on stdin is for another task than --task {}",
            args.task
        );
        run_handed_off(&config, &store, handoff, &node, Some(wake)).await?
    } else {
        run_task(&config, &store, task, &node, Some(wake)).await?
    };
    tracing::debug!(task = %task, ?report, "done");
    Ok(())
}

async fn read_handoff() -> anyhow::Result<Handoff> {
    use std::io::Read;
    // Nothing else runs yet, so a blocking read of the node's pipe is fine.
    let mut bytes = Vec::new();
    std::io::stdin()
        .read_to_end(&mut bytes)
        .context("reading the handoff from stdin")?;
    Handoff::decode(&bytes).map_err(anyhow::Error::msg)
}
