//! Process logging for the binaries: `RUST_LOG`-filtered, to stderr, colour only on a terminal.

/// Installs the global subscriber; `default_filter` applies when `RUST_LOG` is unset.
pub fn init_logging(default_filter: &str) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}
