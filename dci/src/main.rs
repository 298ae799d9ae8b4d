//! `disbatch-web`: argument parsing, wiring and signals for the REST API server.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use disbatch_config::{Component, Config};
use disbatch_dci::origin::Policy;
use disbatch_dci::{router, tls, AppState};
use disbatch_serve::{serve_counted, Limits};
use disbatch_store::Store;
use tokio::signal::unix::{signal, SignalKind};

/// Disbatch command interface: the JSON REST API.
#[derive(Parser, Debug)]
#[command(name = "disbatch-web", version = disbatch_model::LONG_VERSION, about)]
struct Args {
    #[arg(long, default_value = "/etc/disbatch/config.json")]
    config: PathBuf,
    /// Address to listen on; default: the config's `web.listen`, then 127.0.0.1:8080.
    #[arg(long)]
    listen: Option<String>,
    /// Check this config file (every problem, by key) and exit, connecting to nothing.
    #[arg(long, value_name = "PATH")]
    check_config: Option<PathBuf>,
    /// Log lines as `text` or `json` (one object per line); wins over `log_format`.
    #[arg(long, value_name = "FORMAT")]
    log_format: Option<disbatch_config::process::logging::LogFormat>,
}

fn main() -> std::process::ExitCode {
    // The error is printed redacted, never as Rust's default Debug report with the URI in it.
    disbatch_config::process::logging::exit_status(run())
}

fn run() -> anyhow::Result<()> {
    // Documents may nest as deep as the server allows (about 180 levels); reading and
    // rendering them recurses, which 2 MiB worker stacks cannot always hold.
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_stack_size(16 * 1024 * 1024)
        .build()
        .context("starting the async runtime")?
        .block_on(serve())
}

async fn serve() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Some(path) = &args.check_config {
        return disbatch_dci::check_config::check_config(path);
    }
    let started = disbatch_config::startup::start_with_config(&args.config, args.log_format)?;
    // Now, before anything slow: SIGHUP's default action would end the server.
    let hangups = signal(SignalKind::hangup()).context("installing the SIGHUP handler")?;
    for warning in &started.loaded.warnings {
        tracing::warn!(config = %args.config.display(), "{warning}");
    }
    for warning in disbatch_config::exposed_secret_files(&args.config, &started.value) {
        tracing::warn!("{warning}");
    }
    let config = started.loaded.config;
    // Every connection holds a descriptor: 512 of them (web.max_connections' default) would
    // leave a 1024 soft limit little for the database pool, GridFS reads and the rest.
    match disbatch_config::process::open_files::raise_open_file_limit() {
        Ok(limit) => tracing::debug!(limit, "open-file limit"),
        Err(e) => tracing::warn!(error = %e, "could not raise the open-file limit"),
    }
    let listen = args
        .listen
        .or_else(|| config.web.listen.clone())
        .unwrap_or_else(|| "127.0.0.1:8080".to_string());
    // Certificates are checked before anything else, so a bad file fails the start at once.
    let tls = config
        .web
        .tls
        .as_ref()
        .map(tls::server_config)
        .transpose()?;
    let names = match &config.web.tls {
        Some(files) => tls::certificate_names(files)?,
        None => Vec::new(),
    };
    let machine = hostname::get()
        .ok()
        .map(|h| h.to_string_lossy().into_owned());
    let policy = Policy::new(&config.web, &listen, machine, &names);
    let store = Store::connect(&config, Component::Web).await?;
    // Disbatch's DCI relied on a DEN having created the unique indexes; without them
    // duplicate queue names were accepted. Create them here too, but serve regardless.
    if let Err(e) = store.ensure_indexes().await {
        tracing::warn!(error = %e, "could not ensure indexes; serving anyway");
    }
    let listener = disbatch_serve::bind(&listen)
        .await
        .with_context(|| format!("listening on {listen}"))?;
    let local = listener
        .local_addr()
        .context("reading the listen address")?;
    warn_if_exposed(local, &config);
    let scheme = if tls.is_some() { "https" } else { "http" };
    tracing::info!(address = %local, database = %config.database, tls = tls.is_some(),
        tokens = config.web.tokens.len(), "disbatch-web listening");
    println!("listening on {scheme}://{local}");
    let limits = Limits {
        max_connections: config.web.max_connections,
        header_timeout: config.web.header_timeout,
        idle_timeout: config.web.idle_timeout,
        shutdown_grace: SHUTDOWN_GRACE,
    };
    tokio::spawn(keep_clock(store.clone()));
    let closing = store.clone();
    let tokens = config.web.tokens.clone();
    let served = disbatch_dci::routes::served(&config);
    let state = AppState::new(store, config, &served);
    let connections = state.web_metrics.connections();
    let reloader = disbatch_dci::reload::Reloader::new(
        args.config.clone(),
        started.value,
        tokens,
        state.access.clone(),
        started.logging,
    );
    tokio::spawn(reloader.run(hangups));
    let app = router(state, policy);
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let stop = async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        tracing::info!("stopping");
    };
    serve_counted(listener, app, limits, tls, Some(connections), stop).await;
    closing.shutdown().await;
    Ok(())
}

/// How long open requests may run on after a stop signal before they are cut.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);

/// An open API on a reachable address lets anyone change queues and tasks; say so loudly.
fn warn_if_exposed(local: SocketAddr, config: &Config) {
    if local.ip().is_loopback() {
        return;
    }
    if config.web.tokens.is_empty() {
        tracing::warn!(
            address = %local,
            "WARNING: listening on a non-loopback address with no web.tokens: anyone who can \
             reach it can read and change queues and tasks"
        );
    } else if config.web.tls.is_none() {
        tracing::warn!(
            address = %local,
            "WARNING: listening on a non-loopback address without web.tls: bearer tokens \
             cross the network in clear text"
        );
    }
}

/// How often the DCI reads the server's clock (`fleet_time`): for the node liveness and task
/// ages it shows, and its `disbatch_clock_offset_seconds`.
const CLOCK_READING_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

async fn keep_clock(store: Store) {
    let mut every = tokio::time::interval(CLOCK_READING_EVERY);
    loop {
        every.tick().await;
        if let Err(e) = store.keep_clock(std::time::Duration::ZERO).await {
            tracing::debug!(error = %e, "could not read the server's clock");
        }
    }
}
