//! Enqueue Disbatch tasks from Rust: [`Client`] over a DCI's REST API, [`enqueue_in`] straight
//! into Disbatch's database inside the app's own MongoDB session (and so its transaction).

mod direct;
mod error;
mod rest;
pub mod status;

pub use direct::{enqueue_in, new_task_document, server_now, DirectOptions};
pub use error::{Error, Result};
pub use rest::{Batch, Client, Duplicate, EnqueueResult, Graph, GraphTask, NewTask, Task, Timing};
