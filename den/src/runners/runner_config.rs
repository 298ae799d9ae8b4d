//! The config file a node's runners read: a private copy of the config the node accepted.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Each node's copy lies in `den-<pid>` of this user's runtime directory. A node removes its
/// own when it stops; one killed (SIGKILL, the OOM killer) cannot, so each node removes at
/// its start the copies of nodes no longer running. The copy holds passwords: a runtime
/// directory is memory-backed and private, not the shared temp directory.
pub struct RunnerConfig {
    dir: PathBuf,
    file: PathBuf,
}

/// The directory prefix of a node's copy; the rest of the name is the node's pid.
const DEN_DIR_PREFIX: &str = "den-";

impl RunnerConfig {
    /// A copy of `value` (passwords included, hence mode 0600 in a 0700 directory).
    pub fn create(value: &serde_json::Value) -> std::io::Result<RunnerConfig> {
        let runtime = runtime_dir()?;
        remove_stale_copies(&runtime);
        let dir = runtime.join(format!("{DEN_DIR_PREFIX}{}", std::process::id()));
        // A node that had this pid before and was killed may have left it: not ours to keep.
        match std::fs::remove_dir_all(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
        let file = dir.join("config.json");
        let copy = RunnerConfig { dir, file };
        copy.write(value)?;
        Ok(copy)
    }

    /// Replaces the copy whole (written aside, then renamed): a runner starting meanwhile
    /// reads the old config or the new one, never half of one.
    pub fn write(&self, value: &serde_json::Value) -> std::io::Result<()> {
        let text = serde_json::to_vec_pretty(value).map_err(std::io::Error::other)?;
        let aside = self.dir.join("config.json.new");
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

impl Drop for RunnerConfig {
    fn drop(&mut self) {
        // A runner that starts after this falls back to `--config`.
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// systemd's `RuntimeDirectory` (`$RUNTIME_DIRECTORY`), else `$XDG_RUNTIME_DIR/disbatchd`,
/// else `/tmp/disbatchd-<uid>`; the last two are made 0700. A directory of another owner, or a
/// symlink, is refused: someone else could then read the copies, or choose where they go.
fn runtime_dir() -> std::io::Result<PathBuf> {
    let from_systemd = std::env::var_os("RUNTIME_DIRECTORY")
        .and_then(|dirs| std::env::split_paths(&dirs).next())
        .filter(|dir| !dir.as_os_str().is_empty());
    let dir = match from_systemd {
        Some(dir) => dir,
        None => {
            let dir = match std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
                Some(base) => PathBuf::from(base).join("disbatchd"),
                None => std::env::temp_dir()
                    .join(format!("disbatchd-{}", nix::unistd::geteuid().as_raw())),
            };
            match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
                Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(e),
                _ => {}
            }
            dir
        }
    };
    let meta = std::fs::symlink_metadata(&dir)?;
    let euid = nix::unistd::geteuid().as_raw();
    if !meta.is_dir() || meta.uid() != euid {
        return Err(std::io::Error::other(format!(
            "{} is not a directory of uid {euid}",
            dir.display()
        )));
    }
    Ok(dir)
}

/// Removes the copies of nodes whose process is gone. A live node's copy is left alone; so is
/// a dead one's whose pid a new process took meanwhile (removed once that one ends).
fn remove_stale_copies(runtime: &Path) {
    let Ok(entries) = std::fs::read_dir(runtime) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(DEN_DIR_PREFIX))
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if Path::new("/proc").join(pid.to_string()).exists() {
            continue;
        }
        match std::fs::remove_dir_all(entry.path()) {
            Ok(()) => {
                tracing::info!(path = %entry.path().display(), "removed the runners' config copy of a node no longer running")
            }
            Err(e) => {
                tracing::warn!(path = %entry.path().display(), error = %e, "could not remove the runners' config copy of a node no longer running")
            }
        }
    }
}
