//! `disbatch-web`: argument parsing, wiring and signals for the REST API server.

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use disbatch_core::config::{Component, Config};
use disbatch_core::store::Store;
use disbatch_dci::{router, AppState};
use tokio::signal::unix::{signal, SignalKind};

/// Disbatch command interface: the JSON REST API.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    #[arg(long, default_value = "/etc/disbatch/config.json")]
    config: PathBuf,
    /// Address to listen on; default: the config's `web.listen`, then 127.0.0.1:8080.
    #[arg(long)]
    listen: Option<String>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    disbatch_core::logging::init_logging("info");
    let args = Args::parse();
    let loaded = Config::load(&args.config)?;
    for warning in &loaded.warnings {
        tracing::warn!(config = %args.config.display(), "{warning}");
    }
    let config = loaded.config;
    let listen = args
        .listen
        .or_else(|| config.web.listen.clone())
        .unwrap_or_else(|| "127.0.0.1:8080".to_string());
    let store = Store::connect(&config, Component::Web).await?;
    // Disbatch's DCI relied on a DEN having created the unique indexes; without them
    // duplicate queue names were accepted. Create them here too, but serve regardless.
    if let Err(e) = store.ensure_indexes().await {
        tracing::warn!(error = %e, "could not ensure indexes; serving anyway");
    }
    let listener = tokio::net::TcpListener::bind(&listen)
        .await
        .with_context(|| format!("listening on {listen}"))?;
    let local = listener
        .local_addr()
        .context("reading the listen address")?;
    tracing::info!(address = %local, database = %config.database, "disbatch-web listening");
    println!("listening on http://{local}");
    let app = router(AppState::new(store, config));
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            tracing::info!("stopping");
        })
        .await
        .context("serving")?;
    Ok(())
}
