//! `disbatchd`: argument parsing, wiring and signals for the execution node.

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::Parser;
use disbatch_config::process::logging::LogFormat;
use disbatch_config::{Component, Config};
use disbatch_den::claimer::plugin_check::PluginCheck;
use disbatch_den::claimer::Claimer;
use disbatch_den::maintenance::chores::{Chores, Settings as ChoreSettings};
use disbatch_den::metrics::http::serve_metrics;
use disbatch_den::metrics::DenMetrics;
use disbatch_den::reload::{runner_setup, Reloader, Settings};
use disbatch_den::runners::completer::Completer;
use disbatch_den::runners::executor::{check_runner, default_runner, Executor};
use disbatch_den::runners::runner_deaths::RunnerDeaths;
use disbatch_den::wake::notifier::Notifier;
use disbatch_den::Node;
use disbatch_serve::readiness::Readiness;
use disbatch_store::Store;
use tokio::signal::unix::{signal, SignalKind};

/// Disbatch execution node: claims tasks from MongoDB and runs them through task runners.
#[derive(Parser, Debug)]
#[command(name = "disbatchd", version = disbatch_model::LONG_VERSION, about)]
struct Args {
    /// Node config file (Disbatch 4 JSON; comments and trailing commas allowed).
    #[arg(long, default_value = "/etc/disbatch/config.json")]
    config: PathBuf,
    /// Node name; default: the config's `node`, then the hostname.
    #[arg(long)]
    node: Option<String>,
    /// Check this config file (every problem, by key) and exit, connecting to nothing.
    #[arg(long, value_name = "PATH")]
    check_config: Option<PathBuf>,
    /// Log lines as `text` or `json` (one object per line); wins over `log_format`.
    #[arg(long, value_name = "FORMAT")]
    log_format: Option<LogFormat>,
}

fn main() -> std::process::ExitCode {
    // Before any thread exists: plugins (often this user's processes) must not read this
    // node's environment or memory through /proc, nor inherit what our parent left open.
    let hardened = disbatch_config::process::isolation::harden_process();
    // The error is printed redacted, never as Rust's default Debug report with the URI in it.
    disbatch_config::process::logging::exit_status(run(hardened))
}

fn run(hardened: Result<(), String>) -> anyhow::Result<()> {
    // Documents may nest as deep as the server allows (about 180 levels); reading and
    // rendering them recurses, which 2 MiB worker stacks cannot always hold.
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_stack_size(16 * 1024 * 1024)
        .build()
        .context("starting the async runtime")?
        .block_on(serve(hardened))
}

async fn serve(hardened: Result<(), String>) -> anyhow::Result<()> {
    let args = Args::parse();
    if let Some(path) = &args.check_config {
        return disbatch_den::check_config::check_config(path);
    }
    let config_path = std::path::absolute(&args.config)
        .with_context(|| format!("config path {}", args.config.display()))?;
    let started = disbatch_config::startup::start_with_config(&config_path, args.log_format)?;
    // Now, before anything slow: SIGHUP's default action would end the node.
    let hangups = signal(SignalKind::hangup()).context("installing the SIGHUP handler")?;
    if let Err(e) = hardened {
        tracing::warn!("{e}");
    }
    for warning in &started.loaded.warnings {
        tracing::warn!(config = %config_path.display(), "{warning}");
    }
    for warning in disbatch_config::exposed_secret_files(&config_path, &started.value) {
        tracing::warn!("{warning}");
    }
    let config = started.loaded.config;
    let name = config.node_name(args.node.as_deref())?;
    check_plugin_user(&config, &config_path)?;
    match disbatch_config::process::open_files::raise_open_file_limit() {
        Ok(limit) => tracing::debug!(limit, "open-file limit"),
        Err(e) => tracing::warn!(error = %e, "could not raise the open-file limit"),
    }
    let runner = runner_of(&config, &config_path)?;
    tracing::info!(node = %name, database = %config.database, runner = %runner.display(), "starting Disbatch execution node");
    let metrics = DenMetrics::new();
    // Unready until the store below is connected and its indexes are ensured.
    let readiness = Readiness::new();
    // Bound before anything else starts, so a taken port stops the node at once.
    let (stopping, stop_seen) = tokio::sync::watch::channel(false);
    if let Some(addr) = config.metrics_listen {
        serve_metrics_on(addr, &metrics, &readiness, stop_seen).await?;
    }

    let store = connect(&config, &metrics).await?;
    readiness.attach(store.clone());
    disbatch_den::durability::report(&store).await;
    let (runner_config, runner_extra) = runner_setup(&started.value, started.format);
    let settings = Settings::new(&config, &runner_extra);
    let mut plugins = settings.plugins();
    check_plugins(&config, &mut plugins);

    let (filter, runner_env) = (settings.filter(), settings.env());
    let (reloader, reloads) = Reloader::new(
        config_path.clone(),
        started.value,
        settings,
        started.logging,
        runner_config,
        runner_extra,
    );
    tokio::spawn(reloader.run(hangups));
    let node = Node {
        claimer: Claimer::new(
            store.clone(),
            name.clone(),
            filter,
            plugins,
            metrics.clone(),
        )
        .with_contest_window(config.loop_interval * 3)
        .with_empty_queue_age(config.loop_interval * 10),
        executor: Executor::new(
            runner,
            config_path.clone(),
            name.clone(),
            runner_env,
            Some(Completer::start(store.clone(), metrics.clone())),
            Some(RunnerDeaths::new(store.clone(), metrics.clone())),
        )
        .with_releaser(disbatch_den::runners::releaser::Releaser::start(
            store.clone(),
            metrics.clone(),
        )),
        chores: Chores::standard(ChoreSettings {
            name: name.clone(),
            interval: config.loop_interval,
            dead_node_after: config.dead_node_after,
            counts_reconcile: config.counts_reconcile,
            stats_interval: config.stats_interval,
            pruner: disbatch_den::maintenance::pruner::Pruner::new(config.retain),
            balancer: disbatch_den::maintenance::balancer::Balancer::new(&config.balance),
        }),
        runtimes: config.runtimes.clone(),
        notifier: if config.change_streams {
            // Ten passes: an idle node's streams cost 0.2 requests/s at the default interval.
            Some(Notifier::start(
                store.clone(),
                metrics.clone(),
                config.loop_interval * 10,
            ))
        } else {
            tracing::info!("change streams are off (`change_streams`): claiming on the timer and on runner exits");
            None
        },
        store,
        name,
        interval: config.loop_interval,
        metrics,
        reloads: Some(reloads),
    };
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let shutdown = async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM received"),
            _ = int.recv() => tracing::info!("SIGINT received"),
        }
        let _ = stopping.send(true);
    };
    if let Err(e) = node.run(shutdown).await {
        bail!("node stopped: {e}");
    }
    tracing::info!("stopped");
    Ok(())
}

/// Refuses to start when `plugin_user` needs root and this process is not; warns when it runs
/// plugins as root.
fn check_plugin_user(config: &Config, config_path: &std::path::Path) -> anyhow::Result<()> {
    if config.plugin_user.is_none() && nix::unistd::geteuid().is_root() {
        tracing::warn!("disbatchd runs as root and `plugin_user` is not set: plugins run as root; set `plugin_user` to run them as an unprivileged account");
    }
    if let Some(user) = &config.plugin_user {
        let euid = nix::unistd::geteuid();
        if !euid.is_root() {
            bail!(
                "refusing to start: key `plugin_user` of {} runs plugins as {} (uid {}), which needs disbatchd to run as root, and it runs as uid {euid}; start it as root, or remove `plugin_user` to run plugins as this user",
                config_path.display(),
                user.name,
                user.uid
            );
        }
        tracing::info!(user = %user.name, uid = user.uid, gid = user.gid, "plugins run as `plugin_user`");
    }
    Ok(())
}

/// Serves the metrics (and the probes) on `addr` until `stop_seen` says the node stops: bound
/// before anything else starts, so a taken port stops the node at once.
async fn serve_metrics_on(
    addr: std::net::SocketAddr,
    metrics: &DenMetrics,
    readiness: &Readiness,
    stop_seen: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let listener = disbatch_serve::bind(&addr.to_string())
        .await
        .with_context(|| format!("binding `metrics_listen` {addr}"))?;
    let bound = listener
        .local_addr()
        .context("reading the metrics listener's address")?;
    tracing::info!(address = %bound, "serving metrics");
    println!("metrics on http://{bound}");
    let mut stop_seen = stop_seen;
    let stopped = async move {
        // A dropped sender (main returning) stops the listener as well.
        let _ = stop_seen.wait_for(|stop| *stop).await;
    };
    let served = metrics.clone();
    tokio::spawn(serve_metrics(listener, served, readiness.clone(), stopped));
    Ok(())
}

/// The store as the DEN's user, counting the documents it skips, with its indexes ensured.
async fn connect(config: &Config, metrics: &DenMetrics) -> anyhow::Result<Store> {
    let skipped = metrics.clone();
    let store = Store::connect(config, Component::Den)
        .await?
        .on_skipped(std::sync::Arc::new(move |collection, reason| {
            skipped.document_skipped(collection, reason.label())
        }));
    store
        .ensure_indexes()
        .await
        .context("ensuring indexes (is the MongoDB server reachable?)")?;
    Ok(store)
}

/// Warns, at start, about plugins the config names that this host cannot run.
fn check_plugins(config: &Config, plugins: &mut PluginCheck) {
    let names: Vec<String> = config.plugins.names().map(str::to_string).collect();
    if names.is_empty() {
        tracing::warn!("no plugins are configured: this node will run no tasks");
    }
    for plugin in names {
        if let Err(e) = plugins.check(&plugin) {
            tracing::warn!("{e}");
        }
    }
}

/// The task runner this node starts: `task_runner`, else the one beside disbatchd; refused
/// when it cannot be executed.
fn runner_of(config: &Config, config_path: &std::path::Path) -> anyhow::Result<PathBuf> {
    check_runner(&default_runner(config.task_runner.as_deref())).map_err(|e| {
        let from = if config.task_runner.is_some() {
            format!("key `task_runner` of {}", config_path.display())
        } else {
            format!(
                "the default (no `task_runner` in {})",
                config_path.display()
            )
        };
        anyhow::anyhow!("refusing to start: {from}: {e}")
    })
}
