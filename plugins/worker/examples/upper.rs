//! A worker plugin in a few lines: upper-cases `params.text`, prints it as the task's stdout
//! and hands `{"text": …}` to the next queue. Run by a supervisor with
//! `DISBATCH_WORKER_PROTOCOL=1` and the channel on descriptor 3 (plugins/PROTOCOL.md).

use disbatch_worker::{Outcome, Task};
use serde_json::json;

fn main() -> std::process::ExitCode {
    disbatch_worker::run(|task: &Task| {
        let Some(text) = task.params().get("text").and_then(|t| t.as_str()) else {
            eprintln!("params.text must be a string");
            return Outcome::exit(2);
        };
        let upper = text.to_uppercase();
        println!("{upper}");
        Outcome::success().output(json!({"text": upper}))
    })
}
