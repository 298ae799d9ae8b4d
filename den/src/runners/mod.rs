//! Running claimed tasks: spawning task runners or lending persistent workers, taking their results, and what follows a run's end.

pub mod completer;
pub mod executor;
pub mod live;
pub mod releaser;
pub mod runner_config;
pub mod runner_deaths;
pub mod runner_env;
pub mod worker_host;
