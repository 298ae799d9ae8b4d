//! The config file a node's runners read: a private copy of the config the node accepted.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// A directory only this user can enter, removed when the node stops (a runner reads its
/// config within moments of starting, and falls back to `--config` if the copy is gone).
pub struct RunnerConfig {
    dir: tempfile::TempDir,
    file: PathBuf,
}

impl RunnerConfig {
    /// A copy of `value` (passwords included, hence mode 0600 in a 0700 directory).
    pub fn create(value: &serde_json::Value) -> std::io::Result<RunnerConfig> {
        let dir = tempfile::Builder::new().prefix("disbatchd-").tempdir()?;
        let file = dir.path().join("config.json");
        let copy = RunnerConfig { dir, file };
        copy.write(value)?;
        Ok(copy)
    }

    /// Replaces the copy whole (written aside, then renamed): a runner starting meanwhile
    /// reads the old config or the new one, never half of one.
    pub fn write(&self, value: &serde_json::Value) -> std::io::Result<()> {
        let text = serde_json::to_vec_pretty(value).map_err(std::io::Error::other)?;
        let aside = self.dir.path().join("config.json.new");
        let mut out = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&aside)?;
        out.write_all(&text)?;
        out.sync_all()?;
        std::fs::rename(&aside, &self.file)
    }

    pub fn path(&self) -> &Path {
        &self.file
    }
}
