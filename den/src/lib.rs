//! The Disbatch execution node: heartbeat, orphan reaping, claiming and runner spawning.

pub mod balancer;
pub mod check_config;
pub mod chore;
pub mod claimer;
pub mod completer;
pub mod continuous;
pub mod count_keeper;
pub mod count_writer;
pub mod durability;
pub mod elector;
pub mod executor;
pub mod fanout;
pub mod host;
pub mod metrics;
pub mod metrics_http;
pub mod node;
pub mod notifier;
pub mod outside_inserts;
pub mod plugin_check;
pub mod pruner;
pub mod reaper;
pub mod releaser;
pub mod reload;
pub mod runner_config;
pub mod runner_deaths;
pub mod runner_env;
pub mod running_view;
pub mod schedules;
pub mod skip_log;
pub mod stats_keeper;
pub mod worker_host;

pub use node::Node;
