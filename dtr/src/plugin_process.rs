//! Runs a plugin executable without a shell, spooling its output to files, never to memory.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use tokio::io::AsyncWriteExt;
use tokio::process::Command;

use crate::outcome::Exit;

/// What the plugin is told about its task.
#[derive(Debug, Clone)]
pub struct PluginCall<'a> {
    pub executable: &'a Path,
    pub task_json: Vec<u8>,
    pub task_id: String,
    pub queue_name: String,
    pub queue_id: String,
    /// The queue's `config` as JSON, when it has one.
    pub queue_config: Option<String>,
    pub node: String,
}

/// Where a finished plugin left its output.
#[derive(Debug)]
pub struct Spooled {
    pub exit: Exit,
    pub stdout: PathBuf,
    pub stderr: PathBuf,
    pub result: PathBuf,
}

/// Runs the plugin to completion in `spool`, with the task document on stdin.
pub async fn run_plugin(call: PluginCall<'_>, spool: &Path) -> std::io::Result<Spooled> {
    let stdout = spool.join("stdout");
    let stderr = spool.join("stderr");
    let result = spool.join("result.json");
    let mut cmd = Command::new(call.executable);
    cmd.env("DISBATCH_TASK_ID", &call.task_id)
        .env("DISBATCH_QUEUE", &call.queue_name)
        .env("DISBATCH_QUEUE_ID", &call.queue_id)
        .env("DISBATCH_NODE", &call.node)
        .env("DISBATCH_RESULT", &result)
        .stdin(Stdio::piped())
        .stdout(std::fs::File::create(&stdout)?)
        .stderr(std::fs::File::create(&stderr)?)
        // Its own process group, so the whole tree can be signalled (timeouts, cancel).
        .process_group(0)
        .kill_on_drop(true);
    if let Some(config) = &call.queue_config {
        cmd.env("DISBATCH_QUEUE_CONFIG", config);
    }
    let mut child = cmd.spawn()?;
    if let Some(mut stdin) = child.stdin.take() {
        let json = call.task_json;
        // A plugin need not read its stdin; a closed pipe is not an error.
        tokio::spawn(async move {
            let _ = stdin.write_all(&json).await;
            let _ = stdin.shutdown().await;
        });
    }
    let status = child.wait().await?;
    Ok(Spooled {
        exit: status.into(),
        stdout,
        stderr,
        result,
    })
}
