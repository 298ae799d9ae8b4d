//! The process itself: logging, isolation of plugins, open-file limits, backoff.

pub mod backoff;
pub mod isolation;
pub mod logging;
pub mod open_files;
