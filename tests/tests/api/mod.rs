//! `disbatch-web`'s REST API black-box: tasks, queues, nodes, searches and the client libraries.

mod balance;
mod bounded_answers;
mod clients;
mod console;
mod console_actions;
mod control;
mod enqueue;
mod enqueue_cli;
mod finding_failures;
mod finding_tasks;
mod misc;
mod namespaces;
mod nodes;
mod queue_retry;
mod queue_settings;
mod queues;
mod routes;
mod summary;
mod task_output;
mod task_search;
mod tasks;
mod unique_tasks;
mod units;
