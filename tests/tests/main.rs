//! Every integration test file, as one test binary: one link instead of one per file. Each
//! folder is an area and each file a module in it, so a test's name begins with both
//! (`den::scheduler::max_getwork_…`), and nextest still runs each test in a process of its own
//! (tests/src/harness/cleanup.rs relies on that).

mod api;
mod cli;
mod compat;
mod console;
mod den;
mod docs;
mod hostile;
mod limits;
mod ops;
mod runner;
mod store;
mod workflows;
